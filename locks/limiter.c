/* Rate limiters (include/capstan/limiter.h): the C side of lua/limit_*.lua. */
#include "capstan/limiter.h"
#include "locks/limiter_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/config.h"
#include "config/shards.h"
#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/reply.h"
#include "redis/scripts.h"
#include "support/time.h"
#include "redis/wake.h"

#define LEASE_DEFAULT 30.0 /* s: a concurrent slot's lease */
#define POLL_MAX 0.05      /* s: a concurrent waiter with no connection to
                              block on rechecks this often */
#define RECHECK 1.0        /* s: the longest a concurrent waiter blocks for
                              a release before it looks again, in case a
                              wake-up was lost (or was taken by a waiter
                              that then lost the slot to a newcomer) */
#define KEY_MAX (CAPSTAN_LIMIT_NAME_MAX + 32)

struct capstan_limiter {
    capstan_limit_type_t type;
    long count;
    long long ms;           /* interval or lease */
    char name[CAPSTAN_LIMIT_NAME_MAX + 1];
    char meta[96];          /* what limiter:NAME:meta holds */
    char nonce[13];         /* random hex: holder ids of this handle */
    char meta_key[KEY_MAX];
    char state_key[KEY_MAX];
    char free_key[KEY_MAX]; /* concurrent: what releases push to wake waiters */
};

static const char *const type_names[] = {
    [CAPSTAN_LIMIT_CONCURRENT] = "concurrent",
    [CAPSTAN_LIMIT_WINDOW] = "window",
    [CAPSTAN_LIMIT_BUCKET] = "bucket",
    [CAPSTAN_LIMIT_SLIDING] = "sliding",
    [CAPSTAN_LIMIT_LEAKY] = "leaky",
    [CAPSTAN_LIMIT_POINTS] = "points",
};
#define TYPE_LAST CAPSTAN_LIMIT_POINTS

const char *capstan_limit_type_name(capstan_limit_type_t t)
{
    return t >= CAPSTAN_LIMIT_CONCURRENT && t <= TYPE_LAST ? type_names[t] : "unknown";
}

int capstan_limit_type_parse(const char *s, capstan_limit_type_t *out)
{
    for (int t = CAPSTAN_LIMIT_CONCURRENT; s && t <= TYPE_LAST; t++)
        if (strcmp(s, type_names[t]) == 0) {
            *out = (capstan_limit_type_t)t;
            return 0;
        }
    return CAPSTAN_EINVAL;
}

capstan_limiter_t *capstan_limiter_new(capstan_limit_type_t type, const char *name, long count,
                                       double seconds, char *err)
{
    if (strcmp(capstan_limit_type_name(type), "unknown") == 0) {
        capstan_seterr(err, CAPSTAN_EINVAL, "unknown limiter type %d", (int)type);
        return NULL;
    }
    if (!name || !*name || strlen(name) > CAPSTAN_LIMIT_NAME_MAX) {
        capstan_seterr(err, CAPSTAN_EINVAL, "a limiter name must have 1 to %d bytes", CAPSTAN_LIMIT_NAME_MAX);
        return NULL;
    }
    if (count < 1) {
        capstan_seterr(err, CAPSTAN_EINVAL, "limiter %s: %s must be >= 1", name,
                       type == CAPSTAN_LIMIT_CONCURRENT ? "size" : "count");
        return NULL;
    }
    if (type == CAPSTAN_LIMIT_CONCURRENT && seconds == 0)
        seconds = LEASE_DEFAULT;
    /* At least a millisecond, at most a year. */
    if (!(seconds >= 0.001 && seconds <= 366 * 86400.0)) {
        capstan_seterr(err, CAPSTAN_EINVAL, "limiter %s: %s must be between 0.001 and 31622400 seconds",
                       name, type == CAPSTAN_LIMIT_CONCURRENT ? "lock_timeout" : "interval");
        return NULL;
    }
    capstan_limiter_t *lim = calloc(1, sizeof(*lim));
    if (!lim) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "no memory for limiter %s", name);
        return NULL;
    }
    lim->type = type;
    strcpy(lim->name, name);
    lim->count = count;
    lim->ms = (long long)(seconds * 1000 + 0.5);
    capstan__random_hex(lim->nonce, 6);
    /* The lease is not part of the meta: it is each holder's own business,
     * while size, count and interval define the limit. */
    if (type == CAPSTAN_LIMIT_CONCURRENT)
        snprintf(lim->meta, sizeof(lim->meta), "concurrent size=%ld", count);
    else
        snprintf(lim->meta, sizeof(lim->meta), "%s count=%ld interval_ms=%lld",
                 type_names[type], count, lim->ms);
    snprintf(lim->meta_key, sizeof(lim->meta_key), "%s%s:meta", CAPSTAN_KEY_LIMITER, name);
    snprintf(lim->state_key, sizeof(lim->state_key), "%s%s:%s", CAPSTAN_KEY_LIMITER, name,
             type == CAPSTAN_LIMIT_CONCURRENT ? "held" : type == CAPSTAN_LIMIT_WINDOW ? "w:"
                                                                               : type_names[type]);
    snprintf(lim->free_key, sizeof(lim->free_key), "%s%s:free", CAPSTAN_KEY_LIMITER, name);
    return lim;
}

int capstan_limit_opts_check(const capstan_limit_opts_t *o, const char *cls, char *err)
{
    if (!o)
        return capstan_seterr(err, CAPSTAN_EINVAL, "no limit options");
    if (!o->type)
        return 0;
    /* The limiter itself checks the type, name, size and interval. */
    capstan_limiter_t *l = capstan_limiter_new(o->type, o->name ? o->name : cls, o->count, o->seconds, err);
    if (!l)
        return CAPSTAN_EINVAL;
    capstan_limiter_free(l);
    if (o->type == CAPSTAN_LIMIT_POINTS && (o->cost < 1 || o->cost > o->count))
        return capstan_seterr(err, CAPSTAN_EINVAL, "limiter %s: cost must be between 1 and its %ld points",
                              o->name ? o->name : cls, o->count);
    if (o->wait_timeout < 0 || o->max_reschedules < 0)
        return capstan_seterr(err, CAPSTAN_EINVAL, "limiter %s: wait_timeout and max_reschedules must "
                              "be >= 0", o->name ? o->name : cls);
    return 0;
}

void capstan_limiter_free(capstan_limiter_t *lim)
{
    free(lim);
}

/* A holder id no other acquisition shares: pid, the handle's random
 * nonce (drawn once, not per acquisition: a system call saved on every
 * one) and a process-wide counter. */
static void new_holder(const capstan_limiter_t *lim, capstan_limit_token_t *t)
{
    static _Atomic unsigned long seq;
    snprintf(t->id, sizeof(t->id), "%ld:%s:%lu", (long)getpid(), lim->nonce, ++seq);
}

static _Thread_local const capstan_limit_store_t *store;

void capstan__limit_store_set(const capstan_limit_store_t *s)
{
    store = s;
}

const capstan_limit_store_t *capstan__limit_store(void)
{
    return store;
}

static int owner_call(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                      int extend, char *err);

/* One attempt. Returns 1 taken, 0 refused (*wait_ms set), or an error. */
static int attempt(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *t, long points,
                   long long *wait_ms, char *err)
{
    if (store)
        return store->attempt(store->ud, lim->name, lim->type, lim->count, lim->ms, t->id, points, wait_ms);
    char count[24], ms[24], cost[24];
    snprintf(count, sizeof(count), "%ld", lim->count);
    snprintf(ms, sizeof(ms), "%lld", lim->ms);
    snprintf(cost, sizeof(cost), "%ld", points);
    const char *argv[] = { lim->meta_key, lim->state_key, type_names[lim->type], lim->meta,
                           count, ms, t->id, cost };
    redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_LIMIT_ACQUIRE, 2, 8, argv, NULL);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER) {
        int rc = capstan__reply_error(r, rep, "limiter", err);
        freeReplyObject(rep);
        return rc;
    }
    long long st = rep->element[0]->integer;
    int rc = st == 1 ? 1 : 0;
    if (st == -1)
        rc = capstan_seterr(err, CAPSTAN_ECONFIG,
                            "limiter %s is in use as \"%s\", not \"%s\" (to redefine it, stop its "
                            "users and DEL %s)", lim->name,
                            rep->element[1]->type == REDIS_REPLY_STRING ? rep->element[1]->str : "?",
                            lim->meta, lim->meta_key);
    else if (st == 0)
        *wait_ms = rep->element[1]->type == REDIS_REPLY_INTEGER ? rep->element[1]->integer : 0;
    freeReplyObject(rep);
    return rc;
}

int capstan__limiter_take(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                          char *err)
{
    long long wait_ms;
    return attempt(lim, r, token, 1, &wait_ms, err);
}

int capstan__limiter_untake(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                            char *err)
{
    return owner_call(lim, r, token, 0, err);
}

int capstan_limiter_acquire(capstan_limiter_t *lim, capstan_redis_t *r, double wait_timeout,
                            capstan_limit_token_t *token, double *retry_in, char *err)
{
    if (token)
        memset(token, 0, sizeof(*token));
    return capstan__limiter_acquire_wait(lim, r, r, 1, wait_timeout, token, retry_in, NULL, NULL, err);
}

int capstan_limiter_acquire_points(capstan_limiter_t *lim, capstan_redis_t *r, long points,
                                   double wait_timeout, capstan_limit_token_t *token, double *retry_in,
                                   char *err)
{
    if (token)
        memset(token, 0, sizeof(*token));
    return capstan__limiter_acquire_wait(lim, r, r, points, wait_timeout, token, retry_in, NULL, NULL, err);
}

int capstan__limiter_acquire_wait(capstan_limiter_t *lim, capstan_redis_t *r, capstan_redis_t *w,
                                  long points, double wait_timeout, capstan_limit_token_t *token,
                                  double *retry_in, void (*waiting)(void *), void *ud, char *err)
{
    if (!lim || !r || !token)
        return capstan_seterr(err, CAPSTAN_EINVAL, "capstan_limiter_acquire: NULL argument");
    if (lim->type != CAPSTAN_LIMIT_POINTS)
        points = 1;
    if (points < 1 || points > lim->count)
        return capstan_seterr(err, CAPSTAN_EINVAL, "limiter %s: a cost of %ld points does not fit in "
                              "its budget of %ld", lim->name, points, lim->count);
    if (!token->id[0] && (lim->type == CAPSTAN_LIMIT_CONCURRENT || lim->type == CAPSTAN_LIMIT_SLIDING))
        new_holder(lim, token);
    double start = capstan__mono(), end = start + (wait_timeout > 0 && !store ? wait_timeout : 0);
    for (;;) {
        long long wait_ms = 0;
        int rc = attempt(lim, r, token, points, &wait_ms, err);
        if (rc == 1) {
            capstan__metrics_limiter(capstan__metrics_here(), lim->name, CAPSTAN_LIMITER_ACQUIRED,
                                     capstan__mono() - start, lim->type == CAPSTAN_LIMIT_CONCURRENT);
            return 0;
        }
        if (rc < 0)
            return rc;
        double wait = wait_ms > 0 ? (double)wait_ms / 1000 : 0.001;
        double left = end - capstan__mono();
        if (retry_in)
            *retry_in = wait;
        /* A concurrent slot frees when its holder releases, usually long
         * before its lease ends: the waiter blocks until a release wakes
         * it, or the oldest lease lapses, for as long as it may wait. The
         * others know when the next slot comes. */
        int concurrent = lim->type == CAPSTAN_LIMIT_CONCURRENT;
        if (concurrent ? left <= 0 : wait > left) {
            capstan__metrics_limiter(capstan__metrics_here(), lim->name, CAPSTAN_LIMITER_OVER_LIMIT,
                                     capstan__mono() - start, 0);
            return capstan_seterr(err, CAPSTAN_EDENIED, "limiter %s is over its limit for %.3f s more",
                                  lim->name, wait);
        }
        if (waiting) {
            waiting(ud);
            waiting = NULL;
        }
        if (concurrent) {
            double s = wait < left ? wait : left;
            /* Until a holder releases a slot (limit_release.lua). */
            capstan__redis_wait_wake(w, lim->free_key, s < RECHECK ? s : RECHECK, POLL_MAX);
        } else {
            capstan__sleep(wait);
        }
    }
}

const char *capstan__limiter_name(const capstan_limiter_t *lim) { return lim->name; }
const char *capstan__limiter_held_key(const capstan_limiter_t *lim) { return lim->state_key; }
const char *capstan__limiter_free_key(const capstan_limiter_t *lim) { return lim->free_key; }
long capstan__limiter_size(const capstan_limiter_t *lim) { return lim->count; }
long long capstan__limiter_lease_ms(const capstan_limiter_t *lim) { return lim->ms; }

static int owner_call(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                      int extend, char *err)
{
    if (!lim || !r || !token)
        return capstan_seterr(err, CAPSTAN_EINVAL, "limiter: NULL argument");
    if (lim->type != CAPSTAN_LIMIT_CONCURRENT)
        return 0;
    if (store) {
        if (!extend)
            store->release(store->ud, lim->name, token->id);
        return 0;
    }
    char ms[24], size[24];
    snprintf(ms, sizeof(ms), "%lld", lim->ms);
    snprintf(size, sizeof(size), "%ld", lim->count);
    const char *argv[] = { lim->state_key, lim->meta_key, lim->free_key, token->id,
                           extend ? "extend" : "release", ms, size };
    redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_LIMIT_RELEASE, 3, 7, argv, NULL);
    int rc;
    if (!rep || rep->type != REDIS_REPLY_INTEGER)
        rc = capstan__reply_error(r, rep, extend ? "limiter extend" : "limiter release", err);
    else if (rep->integer == 1)
        rc = 0;
    else
        rc = capstan_seterr(err, CAPSTAN_ENOTFOUND, "%s does not hold %s (its lease lapsed)", token->id,
                            lim->state_key);
    freeReplyObject(rep);
    return rc;
}

int capstan_limiter_release(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                            char *err)
{
    int rc = owner_call(lim, r, token, 0, err);
    /* Given back, or lapsed: either way this process holds it no more. */
    if ((rc == 0 || rc == CAPSTAN_ENOTFOUND) && lim->type == CAPSTAN_LIMIT_CONCURRENT)
        capstan__metrics_limiter(capstan__metrics_here(), lim->name, CAPSTAN_LIMITER_RELEASED, 0, 1);
    return rc;
}

int capstan_limiter_extend(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                           char *err)
{
    return owner_call(lim, r, token, 1, err);
}

int capstan_limiter_within(capstan_limiter_t *lim, capstan_redis_t *r, double wait_timeout,
                           int (*fn)(void *udata), void *udata, char *err)
{
    capstan_limit_token_t t;
    if (!fn)
        return capstan_seterr(err, CAPSTAN_EINVAL, "capstan_limiter_within: NULL fn");
    int rc = capstan_limiter_acquire(lim, r, wait_timeout, &t, NULL, err);
    if (rc)
        return rc;
    rc = fn(udata);
    /* A lapsed lease is fn's overrun, not a failure of fn. */
    capstan_limiter_release(lim, r, &t, NULL);
    return rc;
}

const char *capstan_limiter_home(const capstan_config_t *cfg, const char *name, const char *shard,
                                 const char **home)
{
    if (home)
        *home = NULL;
    if (!cfg->nshards)
        return cfg->redis_url;
    long h = shard ? -1 : capstan__config_shard_of(cfg, name, 0);
    for (size_t i = 0; shard && i < cfg->nshards; i++)
        if (!strcmp(cfg->shards[i].name, shard))
            h = (long)i;
    if (h < 0)
        return NULL;
    if (home)
        *home = cfg->shards[h].name;
    return cfg->shards[h].redis_url;
}
