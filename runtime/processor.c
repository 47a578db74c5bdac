/* Processor threads: each owns its Redis connections and loops
 * take -> run the server chain (server_chain.c) -> settle, until the
 * process goes quiet, its job marked in its slot (slot.c) from start to
 * ack. Jobs come from the runtime's source (source.h), which says how
 * they are fetched and when their acks are written. */
#include "runtime/source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe/prometheus.h"
#include "runtime/crash.h"
#include "runtime/shards.h"
#include "runtime/slot.h"
#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"

static void fail_invalid(capstan_slot_t *s, capstan_redis_t *r, const char *queue, const char *raw,
                         size_t len, const char *why)
{
    capstan_runtime_t *rt = s->rt;
    capstan_failure_t f;
    double now = capstan__now();
    if (capstan__retry_invalid(raw, len, queue, why, &rt->classes.retry, now, &f)) {
        capstan_error("out of memory handling an invalid payload from queue:%s; it stays in the working list",
                      queue);
        return;
    }
    capstan_ack_t ack = { .kind = CAPSTAN_ACK_DEAD, .score = f.score, .payload = f.payload, .len = f.len,
                      .dead_cutoff = now - (double)rt->cfg->dead_timeout,
                      .dead_max = rt->cfg->dead_max_jobs };
    capstan__slot_ack(s, r, raw, len, &ack);
    capstan_error("invalid payload from queue:%s moved to the dead set: %s", queue, why);
    capstan__failure_clear(&f);
}

/* What run_ahead keeps for a run of jobs (capstan_slot_t.run). */
struct capstan_run {
    capstan_prelock_t pre[CAPSTAN_RUN_MAX];
    capstan_job_t jobs[CAPSTAN_RUN_MAX];
};

/* A job of a run (run_ahead): its runtime lock asked for already, its
 * payload parsed (got's until it starts, or payload NULL when it did not
 * parse), and whether it was taken ahead of its turn. */
typedef struct run_job {
    capstan_prelock_t *pre;
    capstan_job_t *parsed;
    int ahead;
} run_job_t;

/* Parses the fetched job into job (or takes rj's parse) and marks the slot
 * busy. Returns 0 when it may run; otherwise the slot is free again and
 * the job was dealt with: 1 when an invalid payload went to the dead set
 * or it must not start (see capstan__slot_connected), 2 when the give-back
 * at a hard stop took a copy of a job taken ahead (see capstan__slot_set). */
static int take_job(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *got, capstan_job_t *job,
                    const run_job_t *rj)
{
    char err[CAPSTAN_ERRLEN] = "";
    int rc = 0;
    if (rj && rj->parsed->payload && rj->parsed->payload == got->payload) {
        capstan__job_move(job, rj->parsed);
    } else {
        rc = capstan__job_init(job, got->payload, got->len, capstan__rt_job_queue(s->rt, got), err);
    }
    got->payload = NULL; /* the job owns it now */
    if (capstan__slot_set(s, job, rj && rj->ahead)) {
        capstan__job_clear(job);
        return 2;
    }
    if (rc)
        fail_invalid(s, r, got->queue, job->payload, job->len, err);
    if (rc || capstan__slot_connected(s, r)) {
        capstan__slot_clear(s);
        capstan__job_clear(job);
        return 1;
    }
    return 0;
}

/* The ack that writes the outcome the chain left in o for job. */
static capstan_ack_t ack_of(const capstan_runtime_t *rt, const capstan_outcome_t *o, const capstan_job_t *job)
{
    static const capstan_ack_kind_t kinds[] = {
        [CAPSTAN_DISPOSE_DEFAULT] = CAPSTAN_ACK_OK, [CAPSTAN_DISPOSE_DONE] = CAPSTAN_ACK_OK,
        [CAPSTAN_DISPOSE_RETRY] = CAPSTAN_ACK_RETRY, [CAPSTAN_DISPOSE_DEAD] = CAPSTAN_ACK_DEAD,
        [CAPSTAN_DISPOSE_DROP] = CAPSTAN_ACK_DROP, [CAPSTAN_DISPOSE_SCHEDULE] = CAPSTAN_ACK_SCHEDULE,
        [CAPSTAN_DISPOSE_KEEP] = CAPSTAN_ACK_OK, [CAPSTAN_DISPOSE_REQUEUE] = CAPSTAN_ACK_REQUEUE,
    };
    int stores = o->disp == CAPSTAN_DISPOSE_RETRY || o->disp == CAPSTAN_DISPOSE_DEAD ||
                 o->disp == CAPSTAN_DISPOSE_SCHEDULE || o->disp == CAPSTAN_DISPOSE_REQUEUE;
    capstan_ack_kind_t kind = kinds[o->disp];
    return (capstan_ack_t){ .kind = kind, .score = o->score,
                        .payload = stores ? (o->dpayload ? o->dpayload : job->payload) : NULL,
                        .len = stores ? (o->dpayload ? o->dlen : job->len) : 0,
                        /* Read only by a move to the dead set: no clock
                         * read for every job. */
                        .dead_cutoff = kind == CAPSTAN_ACK_DEAD ? capstan__now() - (double)rt->cfg->dead_timeout
                                                                : 0,
                        .dead_max = rt->cfg->dead_max_jobs,
                        .lock_key = capstan__outcome_release_key(o), .lock_jid = job->jid,
                        .lock_quiet = o->release_quiet,
                        .bid = job->bid, .queue = job->queue };
}

/* Runs the fetched job into d: d->active when its ack is still to be
 * written (the source owes it: see its settle). rj: the job is part of a
 * run (run_ahead), or NULL. */
static void run_one(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *got, capstan_done_t *d,
                    const run_job_t *rj)
{
    capstan_runtime_t *rt = s->rt;
    capstan_job_t *job = &d->job;
    capstan_prelock_t *pre = rj ? rj->pre : NULL;
    d->hash = got->hash;
    size_t len = got->len;
    int taken = take_job(s, r, got, job, rj);
    if (taken) {
        if (pre)
            capstan__unique_prelock_drop(r, pre);
        if (taken == 1) /* a copy the give-back took is let go as that copy */
            rt->source->let_go(rt, d->hash, len);
        return;
    }
    d->era = capstan__redis_era(r);
    /* The fetch saw this job's lock held by this jid: the server need not
     * look again (checked against our own parse of the payload). */
    int held = got->held_jid && strcmp(got->held_jid, job->jid) == 0;
    /* The run slot is the handler's only: an ack waiting out its shard's
     * outage must not hold one the other shards' jobs could run in. */
    capstan__shards_run_begin(rt);
    capstan__server_run(s, r, job, &d->out, held ? got->held_digest : NULL, pre);
    capstan__shards_run_end(rt);
    if (pre)
        capstan__unique_prelock_drop(r, pre); /* a lock the job did not use */
    if (d->out.disp == CAPSTAN_DISPOSE_KEEP) {
        rt->source->let_go(rt, d->hash, job->len); /* for the stray check */
        capstan__slot_clear(s);
        capstan__done_clear(d);
        return;
    }
    d->ack = ack_of(rt, &d->out, job);
    d->prompt = d->out.release_runtime && d->ack.lock_key;
    d->active = 1;
    rt->source->settle(s, r, d);
    capstan__slot_clear(s);
}

/* Runs the fetched job (rj as run_one has it). Returns the finished job
 * whose ack the source owes, or NULL. */
static capstan_done_t *run_fetched(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job,
                                   const run_job_t *rj)
{
    capstan_done_t *d = capstan__done_new(s->dones);
    if (!d) {
        capstan_error("out of memory starting a job from queue:%s; it stays in the working list",
                      job->queue);
        if (rj) {
            rj->parsed->payload = NULL; /* job's */
            capstan__job_clear(rj->parsed);
        }
        if (rj && rj->ahead) {
            capstan__feed_put_back(s->seat, r, job, rj->pre, 1); /* listed in the slot */
        } else {
            if (rj)
                capstan__unique_prelock_drop(r, rj->pre);
            s->rt->source->let_go(s->rt, job->hash, job->len); /* for the stray check */
            capstan__fetched_clear(job);
        }
        return NULL;
    }
    run_one(s, r, job, d, rj);
    capstan__fetched_clear(job);
    if (d->active)
        return d;
    capstan__done_free(d);
    return NULL;
}

/* Runs *first and the short jobs with runtime locks that follow it in the
 * source (its take_ahead: only the feed takes any), their locks asked for
 * in one round trip (capstan__server_prelock). The acks of all but the last go to the feed as
 * each finishes; the last is returned as run_fetched returns it. When the
 * process goes quiet, the jobs not started go back to the feed. */
static capstan_done_t *run_ahead(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *first)
{
    capstan_fetched_t got[CAPSTAN_RUN_MAX];
    got[0] = *first;
    memset(first, 0, sizeof(*first));
    /* A broken connection is mended by the job's own start (take_job). */
    size_t n = 1 + (capstan_redis_ok(r) ? s->rt->source->take_ahead(s, &got[0], got + 1, CAPSTAN_RUN_MAX - 1)
                                    : 0);
    /* Made once: most jobs run alone, and their stack stays small. */
    if (n > 1 && !s->run)
        s->run = malloc(sizeof(*s->run));
    struct capstan_run *run = n > 1 ? s->run : NULL;
    capstan_done_t *done = NULL;
    if (!run) {
        if (n > 1) { /* taken ahead from the feed */
            capstan__feed_put_back(s->seat, r, got + 1, NULL, n - 1);
            capstan__feed_run_end(s->seat);
        }
        return run_fetched(s, r, &got[0], NULL);
    }
    size_t keep = capstan__server_prelock(s, r, got, n, run->pre, run->jobs);
    capstan__feed_ahead_locks(s->seat, got + 1, run->pre + 1, keep - 1);
    if (keep < n)
        capstan__feed_put_back(s->seat, r, got + keep, NULL, n - keep);
    size_t i = 0;
    for (; i < keep && !(i && atomic_load(&s->rt->quiet)); i++) {
        if (done)
            s->rt->source->ack(s, r, done);
        run_job_t rj = { .pre = &run->pre[i], .parsed = &run->jobs[i], .ahead = i > 0 };
        done = run_fetched(s, r, &got[i], &rj);
    }
    /* The process went quiet: the jobs not started go back, their locks
     * released first. */
    for (size_t j = i; j < keep; j++) {
        run->jobs[j].payload = NULL; /* got[j]'s */
        capstan__job_clear(&run->jobs[j]);
    }
    if (i < keep)
        capstan__feed_put_back(s->seat, r, got + i, run->pre + i, keep - i);
    capstan__feed_run_end(s->seat);
    return done;
}

/* An error reply to a fetch: retrying at once would only spin. Each is
 * counted for the next beat and /metrics: one that repeats must not look
 * healthy. *failed: this thread's last fetch got one. answered: this
 * thread's fetch got a reply that was no error (capstan__fetch_answered
 * moved). Fetching works again when a thread whose fetch failed has one
 * answered: a job taken from the feed, a wait for another thread's fetch,
 * or another thread's blocking move while the sweeps still fail, is no
 * sign of it. */
static int fetch_refused(capstan_runtime_t *rt, capstan_redis_t *r, int rc, int answered, int *failed)
{
    if (rc < 0 && capstan_redis_ok(r)) {
        /* A reply of the wrong shape leaves no Redis error text: say what
         * the code says rather than nothing. */
        const char *why = *capstan_redis_error(r) ? capstan_redis_error(r) : capstan_strerror(rc);
        pthread_mutex_lock(&rt->wake_mu);
        snprintf(rt->health.fetch_error, sizeof(rt->health.fetch_error), "%s", why);
        pthread_mutex_unlock(&rt->wake_mu);
        atomic_fetch_add(&rt->health.fetch_errors, 1);
        capstan__metrics_add(capstan__rt_metrics(rt), CAPSTAN_METRIC_FETCH_ERRORS, 1);
        if (!atomic_exchange(&rt->health.fetch_failing, 1))
            capstan_error("fetch failed: %s; retrying every second", why);
        *failed = 1;
        capstan__rt_wait(rt, 1.0);
        return 1;
    }
    if (*failed && answered) {
        *failed = 0;
        if (atomic_exchange(&rt->health.fetch_failing, 0))
            capstan_info("fetching works again");
    }
    return 0;
}

/* Whether the suspect *job went to the quarantine (see feed/gate.c)
 * rather than run here: only under a supervisor, and only a job of a class
 * with a handler here (any other is no threat to this process, and the
 * quarantine worker would only hand it back). */
static int quarantined(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job)
{
    capstan_runtime_t *rt = s->rt;
    if (!rt->link.quarantine)
        return 0;
    char *copy = malloc(job->len + 1), err[CAPSTAN_ERRLEN];
    if (!copy)
        return 0; /* it runs here alone, as without a supervisor */
    memcpy(copy, job->payload, job->len);
    copy[job->len] = '\0';
    capstan_job_t parsed;
    int handled = capstan__job_init(&parsed, copy, job->len, job->queue, err) == 0
                  && capstan__class_find(rt, parsed.cls)->h;
    capstan__job_clear(&parsed);
    if (!handled)
        return 0;
    capstan__board_quarantined(rt);
    capstan__feed_quarantine(s->seat, r, job, rt->link.quarantine);
    return 1;
}

/* Take, run, settle, until the process goes quiet; then the source is
 * left (what this processor owes is written, what it holds given back). */
static void loop(capstan_slot_t *s, capstan_redis_t *r)
{
    capstan_runtime_t *rt = s->rt;
    const capstan_source_t *src = rt->source;
    int inside = 0, failed = 0;
    capstan_done_t *done = NULL; /* the last job, its ack owed */
    while (!atomic_load(&rt->quiet)) {
        if (!capstan_redis_ok(r) && capstan__rt_connect(rt, r, &rt->quiet))
            break;
        capstan_fetched_t job = {0};
        unsigned long answered = capstan__fetch_answered(s->fetch);
        /* The source hands out no job once the process is quiet (the feed
         * decides under its lock, so that every job not taken is in the
         * feed when the first thread leaves and gives them back, in
         * order). */
        int rc = src->take(s, r, done, &job, &inside);
        done = NULL;
        if (fetch_refused(rt, r, rc, capstan__fetch_answered(s->fetch) != answered, &failed) || rc <= 0)
            continue; /* nothing came, or the connection broke (reconnect above) */
        int solo = src->suspect(&job);
        if (solo && quarantined(s, r, &job))
            continue;
        if (solo && !src->solo_begin(s, r, &job))
            continue;
        done = solo ? run_fetched(s, r, &job, NULL) : run_ahead(s, r, &job);
        if (solo && done) {
            src->ack(s, r, done); /* written before the gate opens */
            done = NULL;
        }
        if (solo)
            src->solo_end(s, r);
    }
    if (done)
        src->ack(s, r, done);
    src->leave(s, r, &inside);
}

void *capstan__processor_main(void *arg)
{
    capstan_slot_t *s = arg;
    capstan_runtime_t *rt = s->rt;
    capstan__member_log(rt);
    char err[CAPSTAN_ERRLEN];
    capstan__crash_thread_begin();
    pthread_mutex_lock(&s->mu);
    snprintf(s->tid, sizeof(s->tid), "%s", capstan__log_tid());
    pthread_mutex_unlock(&s->mu);
    s->dones = capstan__done_pool_new(); /* without one, records are malloc'd */
    capstan_redis_t *r = capstan_redis_new(rt->cfg->redis_url, 15, err);
    if (!r)
        capstan_error("processor %d: %s", s->index, err);
    else
        loop(s, r);
    capstan_redis_free(r);
    free(s->run);
    s->run = NULL;
    capstan__crash_thread_end();
    pthread_mutex_lock(&s->mu);
    s->exited = 1;
    pthread_mutex_unlock(&s->mu);
    capstan__rt_wake(rt);
    return NULL;
}
