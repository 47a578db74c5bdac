/* Processor threads: each owns one Redis connection and loops
 * fetch -> run the server chain (server_chain.c) -> acknowledge, until the
 * process goes quiet. With the reliable fetch the processors share what
 * they fetch and the acks they owe through the feed (feed.c). */
#include "runtime/feed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/crash.h"
#include "support/fmt.h"
#include "support/log.h"
#include "support/time.h"

/* Marks the slot busy with job. A job taken ahead (see kiq_feed_take_ahead)
 * leaves the slot's list in the same step, unless the give-back at shutdown
 * took it: then the slot stays free and 1 is returned. */
static int slot_set(kiq_slot_t *s, const kiq_job_t *job, int ahead)
{
    pthread_mutex_lock(&s->mu);
    if (ahead && kiq_feed_ahead_start(s, job->payload)) {
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    s->busy = 1;
    s->abandoned = 0;
    s->queue = (char *)job->queue;
    s->payload = job->payload;
    s->len = job->len;
    s->run_at = (long)kiq__now();
    kiq__fmt_cat(s->cls, sizeof(s->cls), job->cls ? job->cls : "", NULL);
    kiq__fmt_cat(s->jid, sizeof(s->jid), job->jid ? job->jid : "", NULL);
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->rt->busy, 1);
    return 0;
}

static void slot_clear(kiq_slot_t *s)
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

/* Acknowledges until it is written (0), unless shutdown gave the job back
 * meanwhile (KIQ_EDENIED). The slot lock is held across each attempt so the shutdown's
 * requeue and this ack never both happen. */
static int ack_job(kiq_slot_t *s, kiq_redis_t *r, const char *raw, size_t len,
                   const kiq_ack_t *ack)
{
    kiq_runtime_t *rt = s->rt;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int abandoned = s->abandoned;
        int rc = abandoned ? KIQ_EDENIED
                           : (kiq_redis_ok(r) ? kiq__fetch_ack(s->fetch, r, raw, len, ack)
                                              : KIQ_EREDIS);
        pthread_mutex_unlock(&s->mu);
        if (rc != KIQ_EREDIS || atomic_load(&rt->housekeeper_stop))
            return rc;
        if (kiq_rt_connect(rt, r, &rt->housekeeper_stop))
            return rc;
    }
}

static void fail_invalid(kiq_slot_t *s, kiq_redis_t *r, const char *queue, const char *raw,
                         size_t len, const char *why)
{
    kiq_runtime_t *rt = s->rt;
    kiq_failure_t f;
    double now = kiq__now();
    if (kiq_retry_invalid(raw, len, queue, why, rt->cfg, now, &f)) {
        kiq_error("out of memory handling an invalid payload from queue:%s; it stays in the working list",
                  queue);
        return;
    }
    kiq_ack_t ack = { .kind = KIQ_ACK_DEAD, .score = f.score, .payload = f.payload, .len = f.len,
                      .dead_cutoff = now - (double)rt->cfg->dead_timeout,
                      .dead_max = rt->cfg->dead_max_jobs };
    ack_job(s, r, raw, len, &ack);
    kiq_error("invalid payload from queue:%s moved to the dead set: %s", queue, why);
    kiq_failure_clear(&f);
}

/* The connection may have broken in the round trip that wrote the acks
 * just before this job was taken from the feed. The job is in its slot
 * meanwhile: a shutdown gives it back as it does a running job. A job that
 * must not start stays where it is, in the working list or back in its
 * queue. */
int kiq_processor_connected(kiq_slot_t *s, kiq_redis_t *r)
{
    kiq_runtime_t *rt = s->rt;
    if (kiq_redis_ok(r))
        return 0;
    if (kiq_rt_connect(rt, r, &rt->housekeeper_stop))
        return KIQ_EREDIS;
    pthread_mutex_lock(&s->mu);
    int abandoned = s->abandoned;
    pthread_mutex_unlock(&s->mu);
    return abandoned ? KIQ_EDENIED : 0;
}

/* What run_ahead keeps for a run of jobs (kiq_slot_t.run). */
struct kiq_run {
    kiq_prelock_t pre[KIQ_RUN_MAX];
    kiq_job_t jobs[KIQ_RUN_MAX];
};

/* A job of a run (run_ahead): its runtime lock asked for already, its
 * payload parsed (got's until it starts, or payload NULL when it did not
 * parse), and whether it was taken ahead of its turn. */
typedef struct run_job {
    kiq_prelock_t *pre;
    kiq_job_t *parsed;
    int ahead;
} run_job_t;

/* Parses the fetched job into job (or takes rj's parse) and marks the slot
 * busy. Returns 0 when it may run; otherwise the slot is free again and
 * the job was dealt with: 1 when an invalid payload went to the dead set
 * or it must not start (see kiq_processor_connected), 2 when the give-back
 * at a hard stop took a copy of a job taken ahead (see slot_set). */
static int take_job(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *got, kiq_job_t *job,
                    const run_job_t *rj)
{
    char err[KIQ_ERRLEN] = "";
    int rc = 0;
    if (rj && rj->parsed->payload && rj->parsed->payload == got->payload) {
        *job = *rj->parsed;
        memset(rj->parsed, 0, sizeof(*rj->parsed));
    } else {
        rc = kiq_job_init(job, got->payload, got->len, got->queue, err);
    }
    got->payload = NULL; /* the job owns it now */
    if (slot_set(s, job, rj && rj->ahead)) {
        kiq_job_clear(job);
        return 2;
    }
    if (rc)
        fail_invalid(s, r, got->queue, job->payload, job->len, err);
    if (rc || kiq_processor_connected(s, r)) {
        slot_clear(s);
        kiq_job_clear(job);
        return 1;
    }
    return 0;
}

/* The ack that writes the outcome the chain left in mw for job. */
static kiq_ack_t ack_of(const kiq_runtime_t *rt, const kiq_mw_t *mw, const kiq_job_t *job)
{
    static const kiq_ack_kind_t kinds[] = {
        [KIQ_DISPOSE_DEFAULT] = KIQ_ACK_OK, [KIQ_DISPOSE_DONE] = KIQ_ACK_OK,
        [KIQ_DISPOSE_RETRY] = KIQ_ACK_RETRY, [KIQ_DISPOSE_DEAD] = KIQ_ACK_DEAD,
        [KIQ_DISPOSE_DROP] = KIQ_ACK_DROP, [KIQ_DISPOSE_SCHEDULE] = KIQ_ACK_SCHEDULE,
        [KIQ_DISPOSE_KEEP] = KIQ_ACK_OK,
    };
    int stores = mw->disp == KIQ_DISPOSE_RETRY || mw->disp == KIQ_DISPOSE_DEAD ||
                 mw->disp == KIQ_DISPOSE_SCHEDULE;
    return (kiq_ack_t){ .kind = kinds[mw->disp], .score = mw->score,
                        .payload = stores ? (mw->dpayload ? mw->dpayload : job->payload) : NULL,
                        .len = stores ? (mw->dpayload ? mw->dlen : job->len) : 0,
                        .dead_cutoff = kiq__now() - (double)rt->cfg->dead_timeout,
                        .dead_max = rt->cfg->dead_max_jobs,
                        .lock_key = kiq__mw_release_key(mw, mw->disp), .lock_jid = job->jid,
                        .bid = job->bid };
}

/* Runs the fetched job into d: d->active when its ack is still to be
 * written (the reliable fetch sends it with a later round trip). rj: the
 * job is part of a run (run_ahead), or NULL. */
static void run_one(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *got, kiq_done_t *d,
                    const run_job_t *rj)
{
    kiq_runtime_t *rt = s->rt;
    kiq_job_t *job = &d->job;
    kiq_prelock_t *pre = rj ? rj->pre : NULL;
    d->hash = got->hash;
    size_t len = got->len;
    int taken = take_job(s, r, got, job, rj);
    if (taken) {
        if (pre)
            kiq_unique_prelock_drop(r, pre);
        if (taken == 1) /* a copy the give-back took is let go as that copy */
            kiq_feed_let_go(rt, d->hash, len);
        return;
    }
    d->era = kiq_redis_era(r);
    /* The fetch saw this job's lock held by this jid: the server need not
     * look again (checked against our own parse of the payload). */
    int held = got->held_jid && strcmp(got->held_jid, job->jid) == 0;
    kiq_server_run(s, r, job, &d->mw, held ? got->held_digest : NULL, pre);
    if (pre)
        kiq_unique_prelock_drop(r, pre); /* a lock the job did not use */
    if (d->mw.disp == KIQ_DISPOSE_KEEP) {
        kiq_feed_let_go(rt, d->hash, job->len); /* for the stray check */
        slot_clear(s);
        kiq_done_clear(d);
        return;
    }
    d->ack = ack_of(rt, &d->mw, job);
    d->prompt = d->mw.release_runtime && d->ack.lock_key;
    d->active = 1;
    if (rt->cfg->fetch == KIQ_FETCH_RELIABLE) {
        slot_clear(s); /* the ack goes out with a later round trip */
        return;
    }
    /* The basic fetch has no working list to guard the ack against the
     * shutdown's requeue: the slot lock does. */
    if (ack_job(s, r, job->payload, job->len, &d->ack) == 0)
        kiq_done_acked(s->rt, d, r);
    else
        kiq_done_clear(d);
    slot_clear(s);
}

/* Runs the fetched job (rj as run_one has it). Returns the finished job
 * whose ack is still to be written (the reliable fetch leaves it in the
 * feed), or NULL. */
static kiq_done_t *run_fetched(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *job,
                               const run_job_t *rj)
{
    /* malloc and memset, not calloc: glibc's calloc skips the per-thread
     * cache, and this runs for every job. */
    kiq_done_t *d = malloc(sizeof(*d));
    if (!d) {
        kiq_error("out of memory starting a job from queue:%s; it stays in the working list",
                  job->queue);
        if (rj) {
            rj->parsed->payload = NULL; /* job's */
            kiq_job_clear(rj->parsed);
        }
        if (rj && rj->ahead) {
            kiq_feed_put_back(s, r, job, rj->pre, 1); /* listed in the slot */
        } else {
            if (rj)
                kiq_unique_prelock_drop(r, rj->pre);
            kiq_feed_let_go(s->rt, job->hash, job->len); /* for the stray check */
            kiq__fetched_clear(job);
        }
        return NULL;
    }
    memset(d, 0, sizeof(*d));
    run_one(s, r, job, d, rj);
    kiq__fetched_clear(job);
    if (d->active)
        return d;
    kiq_done_free(d);
    return NULL;
}

/* Runs *first and the short jobs with runtime locks that follow it in the
 * feed (kiq_feed_take_ahead), their locks asked for in one round trip
 * (kiq_server_prelock). The acks of all but the last go to the feed as
 * each finishes; the last is returned as run_fetched returns it. When the
 * process goes quiet, the jobs not started go back to the feed. */
static kiq_done_t *run_ahead(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *first)
{
    kiq_fetched_t got[KIQ_RUN_MAX];
    got[0] = *first;
    memset(first, 0, sizeof(*first));
    /* A broken connection is mended by the job's own start (take_job). */
    size_t n = 1 + (kiq_redis_ok(r) ? kiq_feed_take_ahead(s, &got[0], got + 1, KIQ_RUN_MAX - 1)
                                    : 0);
    /* Made once: most jobs run alone, and their stack stays small. */
    if (n > 1 && !s->run)
        s->run = malloc(sizeof(*s->run));
    struct kiq_run *run = n > 1 ? s->run : NULL;
    kiq_done_t *done = NULL;
    if (!run) {
        if (n > 1)
            kiq_feed_put_back(s, r, got + 1, NULL, n - 1);
        kiq_feed_run_end(s);
        return run_fetched(s, r, &got[0], NULL);
    }
    size_t keep = kiq_server_prelock(s, r, got, n, run->pre, run->jobs);
    kiq_feed_ahead_locks(s, got + 1, run->pre + 1, keep - 1);
    if (keep < n)
        kiq_feed_put_back(s, r, got + keep, NULL, n - keep);
    size_t i = 0;
    for (; i < keep && !(i && atomic_load(&s->rt->quiet)); i++) {
        if (done)
            kiq_feed_ack(s, r, done);
        run_job_t rj = { .pre = &run->pre[i], .parsed = &run->jobs[i], .ahead = i > 0 };
        done = run_fetched(s, r, &got[i], &rj);
    }
    /* The process went quiet: the jobs not started go back, their locks
     * released first. */
    for (size_t j = i; j < keep; j++) {
        run->jobs[j].payload = NULL; /* got[j]'s */
        kiq_job_clear(&run->jobs[j]);
    }
    if (i < keep)
        kiq_feed_put_back(s, r, got + i, run->pre + i, keep - i);
    kiq_feed_run_end(s);
    return done;
}

/* An error reply to a fetch: retrying at once would only spin. */
static int fetch_refused(kiq_runtime_t *rt, kiq_redis_t *r, int rc)
{
    if (rc < 0 && kiq_redis_ok(r)) {
        /* A reply of the wrong shape leaves no Redis error text: say what
         * the code says rather than nothing. */
        const char *why = kiq_redis_error(r);
        if (!atomic_exchange(&rt->fetch_failing, 1))
            kiq_error("fetch failed: %s; retrying every second", *why ? why : kiq_strerror(rc));
        kiq_rt_wait(rt, 1.0);
        return 1;
    }
    if (rc >= 0 && atomic_load(&rt->fetch_failing) && atomic_exchange(&rt->fetch_failing, 0))
        kiq_info("fetching works again");
    return 0;
}

/* Fetch, run, until the process goes quiet. The reliable fetch then writes
 * the acks still waiting and gives back what the feed holds. */
static void loop(kiq_slot_t *s, kiq_redis_t *r)
{
    kiq_runtime_t *rt = s->rt;
    int reliable = rt->feed != NULL, inside = 0;
    kiq_done_t *done = NULL; /* the last job, its ack owed (reliable fetch) */
    while (!atomic_load(&rt->quiet)) {
        if (!kiq_redis_ok(r) && kiq_rt_connect(rt, r, &rt->quiet))
            break;
        kiq_fetched_t job = {0};
        int rc = reliable ? kiq_feed_next(s, r, done, &job, &inside)
                          : kiq__fetch_next(s->fetch, r, &job);
        done = NULL;
        if (fetch_refused(rt, r, rc) || rc <= 0)
            continue; /* nothing came, or the connection broke (reconnect above) */
        /* The feed hands out no job once the process is quiet (it decides
         * under its lock, so that every job not taken is in the feed when
         * the first thread leaves and gives them back, in order). */
        if (!reliable && atomic_load(&rt->quiet)) {
            kiq_give_back(s->fetch, rt, r, &job, 1);
            break;
        }
        /* Only the reliable fetch recovers jobs, so only it has suspects. */
        int solo = reliable && kiq_feed_suspect(&job);
        if (solo && !kiq_feed_solo_begin(s, r, &job))
            continue;
        done = solo || !reliable ? run_fetched(s, r, &job, NULL) : run_ahead(s, r, &job);
        if (solo && done) {
            kiq_feed_ack(s, r, done); /* written before the gate opens */
            done = NULL;
        }
        if (solo)
            kiq_feed_solo_end(s, r);
    }
    if (done)
        kiq_feed_ack(s, r, done);
    if (reliable)
        kiq_feed_leave(s, r, &inside);
}

void *kiq_processor_main(void *arg)
{
    kiq_slot_t *s = arg;
    kiq_runtime_t *rt = s->rt;
    char err[KIQ_ERRLEN];
    kiq_crash_thread_begin();
    pthread_mutex_lock(&s->mu);
    snprintf(s->tid, sizeof(s->tid), "%s", kiq__log_tid());
    pthread_mutex_unlock(&s->mu);
    kiq_redis_t *r = kiq_redis_new(rt->cfg->redis_url, 15, err);
    if (!r)
        kiq_error("processor %d: %s", s->index, err);
    else
        loop(s, r);
    kiq_redis_free(r);
    kiq_redis_free(s->aux);
    s->aux = NULL;
    free(s->run);
    s->run = NULL;
    kiq_crash_thread_end();
    pthread_mutex_lock(&s->mu);
    s->exited = 1;
    pthread_mutex_unlock(&s->mu);
    kiq_rt_wake(rt);
    return NULL;
}

int kiq_processor_requeue_busy(kiq_runtime_t *rt, kiq_redis_t *r)
{
    int n = 0;
    for (int i = 0; i < rt->nslots; i++) {
        kiq_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        if (s->busy && !s->abandoned) {
            s->abandoned = 1;
            if (kiq__fetch_requeue(s->fetch, r, s->queue, s->payload, s->len) == 0) {
                n++;
                kiq_warn("requeued %s jid=%s from thread TID-%s", s->cls, s->jid, s->tid);
            } else {
                kiq_error("could not requeue %s jid=%s from TID-%s: %s; it stays in the working "
                          "list and is recovered after this process is gone",
                          s->cls, s->jid, s->tid, kiq_redis_error(r));
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (rt->feed && rt->nslots)
        n += kiq_feed_give_back(rt, rt->slots[0].fetch, r, 0);
    return n;
}
