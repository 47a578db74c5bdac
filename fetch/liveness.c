/* A process's liveness key (uniquejobs:heartbeat:<identity>, see
 * fetch/fetch.h): refreshed by the housekeeper every beat, and by any
 * round trip of a fetcher that finds it not refreshed for half its TTL, so
 * a process whose jobs move is never taken for dead because one of its
 * connections lags the others (after a network partition heals, a
 * connection with a write in flight can wait seconds for TCP to
 * retransmit while fresh ones get through). */
#include "fetch/fetch.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "redis/keys.h"
#include "support/time.h"

struct capstan_liveness {
    char identity[256];
    char key[512];
    char marker[512];
    char ms[32];
    double stale;             /* seconds after a refresh when a fetcher
                                 refreshes too */
    _Atomic double refreshed; /* capstan__mono() when the last refresh that
                                 Redis took was sent; 0: never */
};

void capstan__fetch_liveness_key(const char *identity, char *out, size_t n)
{
    capstan__key(out, n, CAPSTAN_KEY_HEARTBEAT, identity);
}

capstan_liveness_t *capstan__liveness_new(const char *identity, double ttl)
{
    capstan_liveness_t *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    snprintf(l->identity, sizeof(l->identity), "%s", identity);
    capstan__fetch_liveness_key(identity, l->key, sizeof(l->key));
    capstan__key(l->marker, sizeof(l->marker), CAPSTAN_KEY_ORPHAN, identity);
    /* PX, so a sub-second TTL is not rounded to 0 (an error) or down. */
    long long ms = (long long)(ttl * 1000.0);
    snprintf(l->ms, sizeof(l->ms), "%lld", ms > 0 ? ms : 1);
    l->stale = ttl / 2;
    atomic_init(&l->refreshed, 0.0);
    return l;
}

void capstan__liveness_free(capstan_liveness_t *l)
{
    free(l);
}

/* Records a refresh sent at t that Redis took (the key lives a TTL from
 * when Redis ran it, later than t). */
static void taken(capstan_liveness_t *l, double t)
{
    double was = atomic_load(&l->refreshed);
    while (was < t && !atomic_compare_exchange_weak(&l->refreshed, &was, t))
        ;
}

int capstan__liveness_refresh(capstan_liveness_t *l, capstan_redis_t *r)
{
    double t = capstan__mono();
    /* PEXPIRE first: Redis at maxmemory still takes it, where it refuses
     * SET, so a key that exists stays alive through such an episode. */
    const char *expire[] = { "PEXPIRE", l->key, l->ms };
    redisReply *rep = capstan_redis_cmd(r, 3, expire, NULL);
    if (!rep)
        return CAPSTAN_EREDIS;
    int rc = rep->type == REDIS_REPLY_INTEGER ? (int)(rep->integer == 0) : CAPSTAN_EREPLY;
    freeReplyObject(rep);
    if (rc == 0)
        taken(l, t);
    if (rc != 1)
        return rc;
    /* Gone (lapsed, lost in a restart, or never set): create it, and clear
     * any suspicion a recovery pass recorded meanwhile (lua/recover.lua). */
    const char *set[] = { "SET", l->key, "1", "PX", l->ms };
    rep = capstan_redis_cmd(r, 5, set, NULL);
    if (!rep)
        return CAPSTAN_EREDIS;
    rc = rep->type == REDIS_REPLY_STATUS ? 1 : CAPSTAN_EREPLY;
    freeReplyObject(rep);
    if (rc != 1)
        return rc;
    taken(l, t);
    /* And its list is among those the fast recovery pass looks at again
     * (a pass that found it dead with no list removed it). */
    const char *del[] = { "DEL", l->marker }, *add[] = { "SADD", CAPSTAN_KEY_WORKING_SET, l->identity };
    if (!(rep = capstan_redis_cmd(r, 2, del, NULL)))
        return CAPSTAN_EREDIS;
    freeReplyObject(rep);
    if (!(rep = capstan_redis_cmd(r, 3, add, NULL)))
        return CAPSTAN_EREDIS;
    freeReplyObject(rep);
    return 1;
}

int capstan__liveness_due(const capstan_liveness_t *l)
{
    return l && capstan__mono() - atomic_load(&l->refreshed) > l->stale;
}

int capstan__liveness_append(capstan_liveness_t *l, capstan_redis_t *r, double *sent)
{
    /* SET, not PEXPIRE: the key may have lapsed while this connection got
     * through and the housekeeper's did not. */
    const char *set[] = { "SET", l->key, "1", "PX", l->ms };
    const char *del[] = { "DEL", l->marker }, *add[] = { "SADD", CAPSTAN_KEY_WORKING_SET, l->identity };
    *sent = capstan__mono();
    if (capstan_redis_append(r, 5, set, NULL) || capstan_redis_append(r, 2, del, NULL)
        || capstan_redis_append(r, 3, add, NULL))
        return CAPSTAN_EREDIS;
    return 0;
}

int capstan__liveness_read(capstan_liveness_t *l, capstan_redis_t *r, double sent)
{
    redisReply *set = capstan_redis_get_reply(r);
    redisReply *del = set ? capstan_redis_get_reply(r) : NULL;
    redisReply *add = del ? capstan_redis_get_reply(r) : NULL;
    int rc = add ? 0 : CAPSTAN_EREDIS;
    if (add && set->type == REDIS_REPLY_STATUS)
        taken(l, sent);
    freeReplyObject(set);
    freeReplyObject(del);
    freeReplyObject(add);
    return rc;
}
