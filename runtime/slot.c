/* The processors' slots: made at start, marked busy from a job's start to
 * its ack, and read by shutdown, which gives back what still runs. Every
 * change is made under the slot's lock, so that a job is either acked by
 * its processor or given back by shutdown, never both. */
#include "runtime/slot.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/feed.h"
#include "runtime/rt.h"
#include "support/fmt.h"
#include "support/log.h"
#include "support/time.h"

int capstan__slots_new(capstan_runtime_t *rt, char *err)
{
    capstan_config_t *c = rt->cfg;
    /* nslots only once they exist: shutdown and free walk them. */
    rt->slots = calloc((size_t)c->concurrency, sizeof(capstan_slot_t));
    if (!rt->slots)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    rt->nslots = c->concurrency;
    for (int i = 0; i < rt->nslots; i++) {
        capstan_slot_t *s = &rt->slots[i];
        pthread_mutex_init(&s->mu, NULL);
        s->rt = rt;
        s->index = i;
        s->run_time = 0.002; /* not short until measured (see capstan__feed_take_ahead) */
        capstan_fetch_conf_t fc = { .mode = c->fetch, .identity = rt->identity, .queues = c->queues,
                                .nqueues = c->nqueues, .strict = c->strict, .index = i,
                                .block_timeout = 1.0, .min_replicas = c->min_replicas_ack,
                                .min_replicas_timeout = c->min_replicas_timeout,
                                .paused = rt->paused };
        if (!(s->fetch = capstan__fetch_new(&fc, err)))
            return CAPSTAN_ENOMEM;
    }
    return 0;
}

void capstan__slots_free(capstan_runtime_t *rt)
{
    for (int i = 0; i < rt->nslots; i++) {
        capstan__fetch_free(rt->slots[i].fetch);
        pthread_mutex_destroy(&rt->slots[i].mu);
    }
    free(rt->slots);
}

int capstan__slot_set(capstan_slot_t *s, const capstan_job_t *job, int ahead)
{
    pthread_mutex_lock(&s->mu);
    if (ahead && capstan__feed_ahead_start(s, job->payload)) {
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    s->busy = 1;
    s->abandoned = 0;
    s->queue = (char *)job->queue;
    s->payload = job->payload;
    s->len = job->len;
    s->run_at = (long)capstan__now();
    capstan__fmt_cat(s->cls, sizeof(s->cls), job->cls ? job->cls : "", NULL);
    capstan__fmt_cat(s->jid, sizeof(s->jid), job->jid ? job->jid : "", NULL);
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->rt->busy, 1);
    return 0;
}

void capstan__slot_clear(capstan_slot_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    s->abandoned = 0;
    s->queue = NULL;
    s->payload = NULL;
    s->len = 0;
    s->cls[0] = '\0';
    s->jid[0] = '\0';
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_sub(&s->rt->busy, 1);
}

/* The slot lock is held across each attempt so the shutdown's requeue and
 * this ack never both happen. */
int capstan__slot_ack(capstan_slot_t *s, capstan_redis_t *r, const char *raw, size_t len,
                      const capstan_ack_t *ack)
{
    capstan_runtime_t *rt = s->rt;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int abandoned = s->abandoned;
        int rc = abandoned ? CAPSTAN_EDENIED
                           : (capstan_redis_ok(r) ? capstan__fetch_ack(s->fetch, r, raw, len, ack)
                                              : CAPSTAN_EREDIS);
        pthread_mutex_unlock(&s->mu);
        if (rc != CAPSTAN_EREDIS || atomic_load(&rt->housekeeper_stop))
            return rc;
        if (capstan__rt_connect(rt, r, &rt->housekeeper_stop))
            return rc;
    }
}

/* The connection may have broken in the round trip that wrote the acks
 * just before this job was taken from the feed. The job is in its slot
 * meanwhile: a shutdown gives it back as it does a running job. A job that
 * must not start stays where it is, in the working list or back in its
 * queue. */
int capstan__slot_connected(capstan_slot_t *s, capstan_redis_t *r)
{
    capstan_runtime_t *rt = s->rt;
    if (capstan_redis_ok(r))
        return 0;
    if (capstan__rt_connect(rt, r, &rt->housekeeper_stop))
        return CAPSTAN_EREDIS;
    pthread_mutex_lock(&s->mu);
    int abandoned = s->abandoned;
    pthread_mutex_unlock(&s->mu);
    return abandoned ? CAPSTAN_EDENIED : 0;
}

int capstan__slots_busy(capstan_runtime_t *rt)
{
    int n = 0;
    for (int i = 0; i < rt->nslots; i++) {
        pthread_mutex_lock(&rt->slots[i].mu);
        n += rt->slots[i].busy && !rt->slots[i].abandoned;
        pthread_mutex_unlock(&rt->slots[i].mu);
    }
    return n;
}

int capstan__slots_requeue_busy(capstan_runtime_t *rt, capstan_redis_t *r)
{
    int n = 0;
    for (int i = 0; i < rt->nslots; i++) {
        capstan_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        if (s->busy && !s->abandoned) {
            s->abandoned = 1;
            if (capstan__fetch_requeue(s->fetch, r, s->queue, s->payload, s->len) == 0) {
                n++;
                capstan_warn("requeued %s jid=%s from thread TID-%s", s->cls, s->jid, s->tid);
            } else {
                capstan_error("could not requeue %s jid=%s from TID-%s: %s; it stays in the working "
                              "list and is recovered after this process is gone",
                              s->cls, s->jid, s->tid, capstan_redis_error(r));
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (rt->feed && rt->nslots)
        n += capstan__feed_give_back(rt, rt->slots[0].fetch, r, 0);
    return n;
}
