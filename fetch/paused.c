/* Sidekiq Pro's paused queues (see fetch/fetch.h): the flags every fetcher
 * of a process reads, the read of the "paused" set that sets them, and the
 * writes of `capstan pause` and `capstan unpause`. */
#include "fetch/fetch.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "redis/keys.h"

struct capstan_paused {
    size_t n;
    char **names;        /* the process's queues, configured order */
    atomic_uchar *on;    /* queue i is paused; written by the reader only */
};

void capstan__paused_free(capstan_paused_t *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        free(p->names[i]);
    free(p->names);
    free((void *)p->on);
    free(p);
}

capstan_paused_t *capstan__paused_new(const capstan_queue_conf_t *queues, size_t n)
{
    capstan_paused_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->names = calloc(n ? n : 1, sizeof(*p->names));
    p->on = calloc(n ? n : 1, sizeof(*p->on));
    if (!p->names || !p->on) {
        capstan__paused_free(p);
        return NULL;
    }
    for (size_t i = 0; i < n; i++, p->n++) {
        atomic_init(&p->on[i], 0);
        if (!(p->names[i] = strdup(queues[i].name))) {
            capstan__paused_free(p);
            return NULL;
        }
    }
    return p;
}

int capstan__paused_is(const capstan_paused_t *p, size_t i)
{
    return p && i < p->n && atomic_load_explicit(&p->on[i], memory_order_relaxed);
}

int capstan__paused_read(capstan_paused_t *p, capstan_redis_t *r, unsigned char *changed, char *err)
{
    if (!p->n)
        return 0;
    /* SMISMEMBER: one command for just our queues, whatever else the set
     * holds (Redis 6.2+, which Sidekiq 7 requires too). */
    const char **argv = calloc(p->n + 2, sizeof(*argv));
    if (!argv)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    argv[0] = "SMISMEMBER";
    argv[1] = CAPSTAN_KEY_PAUSED;
    memcpy(argv + 2, p->names, p->n * sizeof(*argv));
    redisReply *rep = capstan_redis_cmd(r, (int)p->n + 2, argv, NULL);
    free(argv);
    if (!rep)
        return capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR)
        rc = capstan_seterr(err, CAPSTAN_EREPLY, "reading \"%s\": %s", CAPSTAN_KEY_PAUSED, rep->str);
    else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != p->n)
        rc = capstan_seterr(err, CAPSTAN_EREPLY, "reading \"%s\": unexpected reply", CAPSTAN_KEY_PAUSED);
    for (size_t i = 0; i < p->n && !rc; i++) {
        unsigned char on = rep->element[i]->type == REDIS_REPLY_INTEGER && rep->element[i]->integer == 1;
        unsigned char was = atomic_exchange(&p->on[i], on);
        if (changed)
            changed[i] = was != on;
    }
    freeReplyObject(rep);
    return rc;
}

int capstan__paused_set(capstan_redis_t *r, const char *const *queues, size_t n, int pause,
                        long long *count, char *err)
{
    const char **argv = calloc(n + 2, sizeof(*argv));
    if (!argv)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    argv[0] = pause ? "SADD" : "SREM";
    argv[1] = CAPSTAN_KEY_PAUSED;
    memcpy(argv + 2, queues, n * sizeof(*argv));
    redisReply *rep = capstan_redis_cmd(r, (int)n + 2, argv, NULL);
    free(argv);
    if (!rep)
        return capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
    int rc = 0;
    if (rep->type == REDIS_REPLY_INTEGER)
        *count = rep->integer;
    else
        rc = capstan_seterr(err, CAPSTAN_EREPLY, "%s", rep->type == REDIS_REPLY_ERROR ? rep->str
                                                                                : "unexpected reply");
    freeReplyObject(rep);
    return rc;
}
