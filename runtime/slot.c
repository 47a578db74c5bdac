/* The processors' slots: made at start, marked busy from a job's start to
 * its ack, and read by shutdown, which gives back what still runs. Every
 * change is made under the slot's lock, so that a job is either acked by
 * its processor or given back by shutdown, never both. */
#include "runtime/slot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/source.h"
#include "runtime/rt.h"
#include "runtime/board.h"
#include "observe/prometheus.h"
#include "support/fmt.h"
#include "support/log.h"
#include "support/time.h"

static int slot_init(capstan_runtime_t *rt, capstan_slot_t *s, int i, char *err)
{
    capstan_config_t *c = rt->cfg;
    pthread_mutex_init(&s->mu, NULL);
    s->rt = rt;
    s->index = i;
    s->run_time = 0.002; /* not short until measured (see capstan__feed_take_ahead) */
    capstan_fetch_conf_t fc = { .ops = rt->source->fetch, .identity = rt->self.identity, .queues = c->queues,
                            .nqueues = c->nqueues, .strict = c->strict, .index = i,
                            .block_timeout = 1.0, .min_replicas = c->min_replicas_ack,
                            .min_replicas_timeout = c->min_replicas_timeout,
                            .paused = rt->view.paused, .liveness = rt->view.liveness,
                            .limits = rt->view.qlimits };
    return (s->fetch = capstan__fetch_new(&fc, err)) ? 0 : CAPSTAN_ENOMEM;
}

static void slot_fini(capstan_slot_t *s)
{
    capstan__fetch_free(s->fetch);
    capstan__done_pool_free(s->dones);
    s->dones = NULL;
    pthread_mutex_destroy(&s->mu);
}

int capstan__slots_new(capstan_runtime_t *rt, char *err)
{
    capstan_config_t *c = rt->cfg;
    /* nslots only once they exist: shutdown and free walk them. */
    rt->slots = calloc((size_t)c->concurrency, sizeof(capstan_slot_t));
    rt->keeper.slot = calloc(1, sizeof(capstan_slot_t));
    if (!rt->slots || !rt->keeper.slot)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    if (slot_init(rt, rt->keeper.slot, c->concurrency, err))
        return CAPSTAN_ENOMEM;
    rt->nslots = c->concurrency;
    for (int i = 0; i < rt->nslots; i++)
        if (slot_init(rt, &rt->slots[i], i, err))
            return CAPSTAN_ENOMEM;
    for (int i = 0; i <= rt->nslots; i++)
        rt->source->bind(rt, i < rt->nslots ? &rt->slots[i] : rt->keeper.slot, i);
    return 0;
}

void capstan__slots_free(capstan_runtime_t *rt)
{
    for (int i = 0; i < rt->nslots; i++)
        slot_fini(&rt->slots[i]);
    free(rt->slots);
    if (rt->keeper.slot && rt->keeper.slot->rt)
        slot_fini(rt->keeper.slot);
    free(rt->keeper.slot);
}

int capstan__slot_set(capstan_slot_t *s, const capstan_job_t *job, int ahead)
{
    pthread_mutex_lock(&s->mu);
    if (ahead && capstan__feed_ahead_start(s->seat, job->payload)) {
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
    s->deadline = 0;
    s->row = NULL;
    if (s->rt->link.board) {
        s->row = capstan__class_find(s->rt, job->cls);
        s->deadline = s->row->timeout > 0 ? capstan__mono() + s->row->timeout : 0;
        capstan__board_run(s->rt, s->index, s->jid);
    }
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
    s->lock_key[0] = '\0';
    s->deadline = 0;
    s->row = NULL;
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
    n += rt->source->give_back(rt, r);
    return n;
}

/* Fails s's job, past its deadline, with Capstan::Timeout (under s->mu). */
static int fail_timeout(capstan_slot_t *s, capstan_redis_t *r, double limit)
{
    capstan_runtime_t *rt = s->rt;
    char err[CAPSTAN_ERRLEN], msg[128], *copy = malloc(s->len ? s->len : 1);
    capstan_job_t job = {0};
    capstan_failure_t f = {0};
    double now = capstan__now();
    int rc = CAPSTAN_ENOMEM;
    if (!copy)
        goto out;
    memcpy(copy, s->payload, s->len);
    if ((rc = capstan__job_init(&job, copy, s->len, s->queue, err)) != 0)
        goto out;
    snprintf(msg, sizeof(msg), "ran longer than its timeout of %.0f s; its worker process is replaced", limit);
    if ((rc = capstan__retry_decide(&job, "Capstan::Timeout", msg, s->row->retry, &rt->classes.retry, now,
                                    &f)) != 0)
        goto out;
    capstan_ack_t ack = { .kind = f.fate == CAPSTAN_FATE_RETRY ? CAPSTAN_ACK_RETRY
                                  : f.fate == CAPSTAN_FATE_DEAD ? CAPSTAN_ACK_DEAD : CAPSTAN_ACK_DROP,
                          .score = f.score, .payload = f.payload, .len = f.len,
                          .dead_cutoff = now - (double)rt->cfg->dead_timeout,
                          .dead_max = rt->cfg->dead_max_jobs,
                          /* Its runtime lock goes with it: the hung handler
                           * never returns to let it go. */
                          .lock_key = s->lock_key[0] ? s->lock_key : NULL, .lock_jid = job.jid };
    rc = capstan__fetch_ack(s->fetch, r, s->payload, s->len, &ack);
    /* Counted as a job that raised: its handler never returns to the
     * stats middleware that counts those (server_chain.c). */
    if (rc == 0) {
        atomic_fetch_add(&rt->processed, 1);
        atomic_fetch_add(&rt->failed, 1);
        capstan__rt_job_metrics(rt, s->cls, s->queue, capstan__mono() - (s->deadline - limit), 1,
                                s->row->h ? s->row->h->cls : NULL);
    }
out:
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    return rc;
}

int capstan__slots_timeouts(capstan_runtime_t *rt, capstan_redis_t *r)
{
    int n = 0;
    double now = capstan__mono();
    for (int i = 0; i < rt->nslots; i++) {
        capstan_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        if (s->busy && !s->abandoned && s->deadline > 0 && now > s->deadline) {
            double limit = s->row->timeout;
            /* Its processor's own ack, should the handler ever return, is
             * refused: the failure below is the job's end. */
            s->abandoned = 1;
            int rc = fail_timeout(s, r, limit);
            if (rc == 0)
                capstan_warn("%s jid=%s on TID-%s ran over its timeout of %.0f s: failed with "
                             "Capstan::Timeout", s->cls, s->jid, s->tid, limit);
            else
                capstan_error("%s jid=%s on TID-%s ran over its timeout of %.0f s; its failure could not "
                              "be written, it is recovered once this worker is gone", s->cls, s->jid,
                              s->tid, limit);
            n++;
        }
        pthread_mutex_unlock(&s->mu);
    }
    return n;
}

int capstan__slots_overdue(capstan_runtime_t *rt)
{
    int n = 0;
    double now = capstan__mono();
    for (int i = 0; i < rt->nslots; i++) {
        capstan_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        n += s->busy && !s->abandoned && s->deadline > 0 && now > s->deadline;
        pthread_mutex_unlock(&s->mu);
    }
    return n;
}
