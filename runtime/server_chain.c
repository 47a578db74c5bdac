/* The server chain a job runs through: the built-in middleware ("stats",
 * "retry", "queue_limit", "expiry", "unique", "limit"), those a plugin adds, and at its end
 * the handler. */
#include "runtime/rt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/keys.h"
#include "redis/scripts.h"
#include "support/buf.h"
#include "support/log.h"
#include "support/payload.h"
#include "support/time.h"
#include "support/trace.h"
#include "observe/prometheus.h"
#include "capstan/middleware.h"
#include "middleware/mw.h"
#include "runtime/shards.h"
#include "runtime/source.h"
#include "runtime/shards.h"
#include "runtime/slot.h"
#include "unique/prelock.h"
#include "unique/server.h"
#include "locks/limit_mw.h"
#include "locks/queue_limit.h"

/* Per-job state of the built-in server middleware. */
typedef struct run {
    capstan_slot_t *slot;
    const capstan_class_row_t *row;
    const capstan_handler_entry_t *h; /* row->h */
    capstan_unknown_class_t policy; /* for a job without a handler */
    capstan_logctx_t ctx;
    char *tags;
} run_t;

/* Joins the "tags" array of a payload with ',' for the log line. */
static char *tags_of(capstan_job_t *job)
{
    size_t len;
    const char *v = capstan_job_field_raw(job, "tags", &len);
    if (!v)
        return NULL;
    json_t *arr = json_loadb(v, len, 0, NULL);
    capstan_buf_t b = {0};
    size_t i;
    json_t *e;
    if (json_is_array(arr))
        json_array_foreach(arr, i, e) {
            if (json_is_string(e)) {
                if (b.len)
                    capstan__buf_put(&b, ",", 1);
                capstan__buf_puts(&b, json_string_value(e));
            }
        }
    json_decref(arr);
    /* No string among the tags: the log line shows no tags at all. */
    if (!b.len) {
        capstan__buf_free(&b);
        return NULL;
    }
    return capstan__buf_take(&b, NULL);
}

/* A batch callback (lua/lib/batch_done.lua marks it "batch_event") at its
 * first run: how long after its batch was done (its enqueued_at) it
 * starts. */
static void batch_callback_latency(capstan_runtime_t *rt, const capstan_job_t *job)
{
    size_t elen = 0, tlen = 0;
    const char *ev = job->retry_count < 0 ? capstan_job_field_raw(job, "batch_event", &elen) : NULL;
    const char *at = ev ? capstan_job_field_raw(job, "enqueued_at", &tlen) : NULL;
    if (!at || elen < 3 || elen > 18 || ev[0] != '"')
        return;
    char event[16];
    memcpy(event, ev + 1, elen - 2);
    event[elen - 2] = '\0';
    capstan__metrics_batch_callback(capstan__rt_metrics(rt), event, capstan__now() - capstan__ts_parse(at, tlen));
}

/* "stats": the start/done/fail log lines and the processed/failed counts,
 * around everything else so they see the final outcome. A job finished
 * without its handler running (mw->out->skipped: a uniqueness conflict, or
 * expired) is logged by what happened to it and counted apart, neither
 * processed nor failed. */
static int stats_mw(capstan_mw_t *mw, void *udata)
{
    capstan_runtime_t *rt = udata;
    run_t *run = mw->priv;
    capstan_job_t *job = mw->job;
    capstan__log(CAPSTAN_INFO, &run->ctx, "start");
    batch_callback_latency(rt, job);
    double t0 = capstan__mono();
    int rc = capstan_mw_next(mw);
    run->ctx.elapsed = capstan__mono() - t0;
    if (mw->out->skipped) {
        capstan__log(CAPSTAN_INFO, &run->ctx, "%s", mw->out->skipped);
        capstan__metrics_skipped(capstan__rt_metrics(rt), job->cls, mw->out->skipped);
        return rc;
    }
    if (job->err_class) {
        capstan__log(CAPSTAN_INFO, &run->ctx, "fail");
        capstan__log(CAPSTAN_WARN, &run->ctx, "%s: %s", job->err_class, job->err_msg ? job->err_msg : "");
        if (mw->out->disp == CAPSTAN_DISPOSE_DEAD)
            capstan__log(CAPSTAN_INFO, &run->ctx, "Adding dead %s job %s", job->cls, job->jid);
        atomic_fetch_add(&rt->failed, 1);
    } else {
        capstan__log(CAPSTAN_INFO, &run->ctx, "done");
    }
    atomic_fetch_add(&rt->processed, 1);
    capstan__rt_job_metrics(rt, job->cls, job->queue, run->ctx.elapsed, job->err_class != NULL,
                            run->h ? run->h->cls : NULL);
    return rc;
}

/* Sends a job that failed with job->err_class to the dead set at once,
 * not retried (unknown_class: skip, a rejected duplicate), every byte
 * kept, with the error fields the Web UI shows. Out of memory the
 * disposition stays as it was: the retry middleware then applies the
 * retry rules (as unknown_class: fail), or a DEAD already chosen stores
 * the payload as fetched. */
static void bury(capstan_mw_t *mw, capstan_job_t *job)
{
    double now = capstan__now();
    char ts[32], *out = NULL;
    size_t len;
    /* A Sidekiq 8 job keeps its milliseconds under timestamps: float. */
    capstan__ts_json(ts, now, capstan__ts_format_of(job->payload, &job->obj, mw->cfg->timestamps));
    capstan_buf_t cls = {0}, msg = {0};
    const char *m = job->err_msg ? job->err_msg : "";
    int rc = capstan__json_quote(&cls, job->err_class, strlen(job->err_class));
    if (!rc)
        rc = capstan__json_quote(&msg, m, strlen(m));
    capstan_field_t set[] = {
        { "error_class", cls.p, cls.len },
        { "error_message", msg.p, msg.len },
        { "failed_at", ts, 0 },
    };
    if (!rc && capstan__payload_edit(job->payload, &job->obj, set, 3, &out, &len) == 0)
        capstan_mw_dispose(mw, CAPSTAN_DISPOSE_DEAD, now, out, len);
    free(out);
    capstan__buf_free(&cls);
    capstan__buf_free(&msg);
}

/* "retry": Sidekiq's retry rules for a job that failed inside it, unless
 * an inner middleware already decided its fate. */
static int retry_mw(capstan_mw_t *mw, void *udata)
{
    capstan_runtime_t *rt = udata;
    run_t *run = mw->priv;
    capstan_job_t *job = mw->job;
    int rc = capstan_mw_next(mw);
    /* A job sent to the dead set with an error but no payload of its own
     * (a rejected duplicate): the entry says why, as a failure's does. */
    if (job->err_class && mw->out->disp == CAPSTAN_DISPOSE_DEAD && !mw->out->dpayload)
        bury(mw, job);
    /* A job that did not run (mw->out->skipped) did not fail: its error, if
     * any, is for its dead-set entry and the death hooks. */
    if (job->err_class && !mw->out->skipped)
        capstan__hooks_error(rt, job, job->err_class, job->err_msg);
    if (!job->err_class || mw->out->disp != CAPSTAN_DISPOSE_DEFAULT)
        return rc;
    capstan_failure_t f = {0};
    double now = capstan__now();
    if (capstan__retry_decide(job, job->err_class, job->err_msg, run->row->retry,
                              &rt->classes.retry, now, &f) == 0) {
        capstan_dispose_t d = f.fate == CAPSTAN_FATE_RETRY ? CAPSTAN_DISPOSE_RETRY
                        : f.fate == CAPSTAN_FATE_DEAD ? CAPSTAN_DISPOSE_DEAD : CAPSTAN_DISPOSE_DROP;
        if (capstan_mw_dispose(mw, d, f.score, f.payload, f.len))
            capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    } else {
        /* No memory to write the failure: leave it in the working list. */
        capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    }
    capstan__failure_clear(&f);
    return rc;
}

/* "expiry": a job whose expires_at (capstan__job_expires_at) has passed
 * is done with, its handler not run: no retry, not dead, a success to its
 * batch (the ack moves it as one), its uniqueness lock released as after
 * a run. Before "unique" and "limit", so it takes no lock or slot. */
static int expiry_mw(capstan_mw_t *mw, void *udata)
{
    (void)udata;
    run_t *run = mw->priv;
    capstan_job_t *job = mw->job;
    double at = capstan__job_expires_at(job), late = at > 0 ? capstan__now() - at : 0;
    if (!(late > 0))
        return capstan_mw_next(mw);
    capstan__log(CAPSTAN_INFO, run ? &run->ctx : NULL, "expired %.3fs ago (expires_at %.3f): dropped, not run",
                 late, at);
    mw->out->skipped = "expired";
    capstan__unique_server_skip(mw);
    return capstan_mw_dispose(mw, CAPSTAN_DISPOSE_DONE, 0, NULL, 0);
}

/* Seconds an interrupted run tries again to save its cursor. */
#define SAVE_FOR 5.0

/* An interrupted run's cursor must be in Redis before the job goes back to
 * its queue, or the next run repeats the steps since the last save (up to
 * the seconds between two): a write a Redis fault lost (a restart, CLIENT
 * KILL, maxmemory) is tried again, on a new connection where the old one
 * broke, for SAVE_FOR seconds. */
static void save_iteration(capstan_mw_t *mw, run_t *run, capstan_job_t *job)
{
    if (!capstan__job_iter_save(job))
        return;
    capstan__log(CAPSTAN_WARN, &run->ctx, "its cursor was not saved (%s); trying again before it goes "
                 "back to its queue", capstan_redis_ok(mw->r) ? "Redis refused the write" : "connection lost");
    for (double until = capstan__mono() + SAVE_FOR; run->slot && capstan__mono() < until; capstan__sleep(0.1)) {
        if (capstan__slot_connected(run->slot, mw->r))
            break;
        job->redis = capstan_redis_ctx(mw->r);
        if (!capstan__job_iter_save(job)) {
            capstan__log(CAPSTAN_INFO, &run->ctx, "its cursor is saved");
            return;
        }
    }
    capstan__log(CAPSTAN_WARN, &run->ctx, "its cursor could not be saved: the next run repeats the steps "
                 "since the last save");
}

/* After an iterating handler (capstan/job.h): an interrupted run goes back
 * to the end of its queue, same jid, enqueued_at now, as Sidekiq's
 * re-push does (not through retry: it did not fail); a cancelled or
 * complete one is done, its state deleted. */
static void iterated(capstan_mw_t *mw, run_t *run, capstan_job_t *job)
{
    capstan_metrics_t *m = run->slot ? capstan__rt_metrics(run->slot->rt) : capstan__metrics_default();
    long ex = capstan_job_executions(job);
    capstan_iterated_t how = capstan__job_iter_end(job);
    if (how != CAPSTAN_ITERATED_NOT && ex > 1)
        capstan__metrics_add(m, CAPSTAN_METRIC_ITERATIONS_RESUMED, 1);
    if (how == CAPSTAN_ITERATED_CANCELLED) {
        capstan__metrics_add(m, CAPSTAN_METRIC_ITERATIONS_CANCELLED, 1);
        capstan__log(CAPSTAN_INFO, &run->ctx, "cancelled after %ld executions", ex);
    }
    if (how != CAPSTAN_ITERATED_STOPPED)
        return;
    capstan__metrics_add(m, CAPSTAN_METRIC_ITERATIONS_INTERRUPTED, 1);
    save_iteration(mw, run, job);
    char ts[32], *out = NULL;
    size_t len = 0;
    capstan__ts_json(ts, capstan__now(), capstan__ts_format_of(job->payload, &job->obj, mw->cfg->timestamps));
    capstan_field_t set[] = { { "enqueued_at", ts, 0 } };
    if (capstan__payload_edit(job->payload, &job->obj, set, 1, &out, &len) == 0
        && capstan_mw_dispose(mw, CAPSTAN_DISPOSE_REQUEUE, 0, out, len) == 0)
        capstan__log(CAPSTAN_INFO, &run->ctx, "interrupted after %ld executions: back to queue:%s",
                     ex, job->queue);
    else /* no memory: it stays in the working list, recovered later */
        capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    free(out);
}

/* The end of the server chain: the handler. */
static int call_handler(capstan_mw_t *mw, void *udata)
{
    (void)udata;
    run_t *run = mw->priv;
    capstan_job_t *job = mw->job;
    /* A middleware's command may have broken the connection. */
    if (run->slot && capstan__slot_connected(run->slot, mw->r))
        return capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    /* No runtime lock of a finished job is held while this one runs;
     * unless it runs in a run of short jobs whose locks were asked for at
     * once: those acks then ride the next round trip. */
    const capstan_source_t *src = run->slot ? run->slot->rt->source : NULL;
    if (src && src->prompt && !(mw->held.prelock && mw->held.prelock->asked)) {
        src->prompt(run->slot, mw->r, 0);
        /* Writing them may have broken it too: a handler is promised a
         * connection (capstan_job_redis). */
        if (capstan__slot_connected(run->slot, mw->r))
            return capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    }
    /* Without a slot (capstan__server_run_bare) the caller gave the job
     * its connection, if any. */
    if (run->slot)
        job->redis = capstan_redis_ctx(mw->r);
    if (!run->h && run->policy == CAPSTAN_UNKNOWN_SKIP) {
        capstan_job_fail(job, "NameError", "uninitialized constant %s (capstan has no handler; "
                         "unknown_class: skip)", job->cls);
        bury(mw, job);
    } else if (!run->h) {
        capstan_job_fail(job, "NameError", "uninitialized constant %s", job->cls);
    } else {
        if (mw->held.runtime[0] && run->slot) {
            pthread_mutex_lock(&run->slot->mu);
            snprintf(run->slot->lock_key, sizeof(run->slot->lock_key), "%s", mw->held.runtime);
            pthread_mutex_unlock(&run->slot->mu);
        }
        double t0 = capstan__mono();
        int hrc = run->h->fn(job, run->h->udata);
        if (run->slot)
            run->slot->run_time = 0.9 * run->slot->run_time + 0.1 * (capstan__mono() - t0);
        if (hrc != 0 && !job->err_class)
            capstan_job_fail(job, "RuntimeError", "%s returned %d", job->cls, hrc);
        iterated(mw, run, job);
    }
    /* A handler may leave replies unread or break the connection; the next
     * fetch notices and reconnects. */
    return 0;
}

/* The caps of the job's queue; rt->view.qlimits is made at start, and a plugin
 * may make the chain before. */
static int queue_limit_mw(capstan_mw_t *mw, void *ud)
{
    return capstan__queue_limit_mw(mw, ((capstan_runtime_t *)ud)->view.qlimits);
}

/* A sharded process keeps each limiter in one shard, its home, so that
 * its size holds across the fleet. */
static const char *limit_home(void *ud, const capstan_class_conf_t *cc, const char *name)
{
    return capstan__shards_home(ud, cc ? cc->limit_shard : NULL, name);
}

static int limit_mw(capstan_mw_t *mw, void *ud)
{
    return capstan__limit_mw(mw, limit_home, ud);
}

capstan_chain_t *capstan_runtime_server_chain(capstan_runtime_t *rt)
{
    if (!rt)
        return NULL;
    if (rt->server_chain)
        return rt->server_chain;
    capstan_chain_t *c = capstan_chain_new();
    if (!c || capstan_chain_add(c, "stats", stats_mw, rt) || capstan_chain_add(c, "retry", retry_mw, rt) ||
        capstan_chain_add(c, "queue_limit", queue_limit_mw, rt) ||
        capstan_chain_add(c, "expiry", expiry_mw, NULL) ||
        capstan_chain_add(c, "unique", capstan_unique_server_mw, NULL) ||
        capstan_chain_add(c, "limit", limit_mw, rt)) {
        capstan_chain_free(c);
        return NULL;
    }
    rt->server_chain = c;
    return c;
}

/* Logs, once per class and process (with shards, per class and shard,
 * named: each shard decides on its own fleet), what the unknown_class
 * policy does with cls's jobs, and why when the config did not choose it. */
static void note_unknown(capstan_runtime_t *rt, const char *cls, const char *queue,
                         capstan_unknown_class_t policy, const char *why)
{
    static const char *const what[] = {
        [CAPSTAN_UNKNOWN_FAIL] = "they fail with NameError and are retried",
        [CAPSTAN_UNKNOWN_REQUEUE] = "they go back to the end of their queue for a Ruby process",
        [CAPSTAN_UNKNOWN_SKIP] = "they go to the dead set, not retried",
    };
    pthread_mutex_lock(&rt->view.unknown_mu);
    int first = 1;
    for (size_t i = 0; i < rt->view.nunknown && first; i++)
        first = strcmp(rt->view.unknown[i], cls) != 0;
    char **p = first ? realloc(rt->view.unknown, (rt->view.nunknown + 1) * sizeof(*p)) : NULL;
    if (p) {
        rt->view.unknown = p;
        if ((p[rt->view.nunknown] = strdup(cls)))
            rt->view.nunknown++;
    }
    pthread_mutex_unlock(&rt->view.unknown_mu);
    const char *near = first ? capstan__registry_nearest(rt, cls) : NULL;
    const char *shard = capstan__shard_name(rt);
    if (first)
        capstan_warn("%s%s%sno handler for %s (queue:%s); unknown_class: %s%s%s%s: %s%s%s%s",
                     shard ? "shard " : "", shard ? shard : "", shard ? ": " : "", cls, queue,
                     capstan_config_unknown_class_name(policy), why ? " (" : "", why ? why : "", why ? ")" : "",
                     what[policy], near ? "; did you mean " : "", near ? near : "", near ? "?" : "");
}

/* Gives a job without a handler back untouched: to its queue (at < 0), or
 * to the retry set at score at. The slot lock keeps shutdown from giving
 * the job back too (as the ack does); once moved, the slot is marked given
 * back. Returns 1 when it moved. */
static int requeue_unknown(capstan_slot_t *s, capstan_redis_t *r, capstan_job_t *job, double at)
{
    capstan_runtime_t *rt = s->rt;
    char working[512] = "", key[512], score[32] = "";
    if (rt->source->working_list)
        capstan__fetch_working_key(rt->self.identity, working, sizeof(working));
    if (at < 0)
        capstan__key(key, sizeof(key), CAPSTAN_KEY_QUEUE, job->queue);
    else {
        snprintf(key, sizeof(key), "%s", CAPSTAN_KEY_RETRY);
        snprintf(score, sizeof(score), "%.6f", at);
    }
    /* KEYS working, key; ARGV payload, score (lua/unknown_requeue.lua). */
    const char *argv[] = { working, key, job->payload, score };
    size_t lens[] = { strlen(working), strlen(key), job->len, strlen(score) };
    /* -2: the connection broke (once reconnected, try again: with the
     * basic fetch the job exists nowhere else); -3: an error reply. */
    long long moved = -2;
    for (int tries = 0; moved == -2 && tries < 2; tries++) {
        if (tries && capstan__slot_connected(s, r))
            break;
        pthread_mutex_lock(&s->mu);
        redisReply *rep = s->abandoned ? NULL
                                       : capstan__redis_script(r, CAPSTAN_SCRIPT_UNKNOWN_REQUEUE, 2, 4, argv, lens);
        moved = s->abandoned ? 0 : !rep ? -2 : rep->type == REDIS_REPLY_INTEGER ? rep->integer : -3;
        s->abandoned = s->abandoned || moved == 1;
        pthread_mutex_unlock(&s->mu);
        freeReplyObject(rep);
    }
    if (moved < 0)
        capstan_error("could not put %s %s back in %s: %s; %s", job->cls, job->jid, key,
                      moved == -1 ? (at < 0 ? "it holds another type than a list" : "it is not a sorted set")
                                  : capstan_redis_error(r),
                      working[0] ? "it stays in the working list" : "it is lost (basic fetch)");
    if (moved != 1 || at >= 0 || ++s->requeue_streak < 2)
        return moved == 1;
    /* 50 ms, doubling up to 1 s; shutdown wakes it. */
    double pause = 0.05 * (double)(1 << (s->requeue_streak < 7 ? s->requeue_streak - 2 : 5));
    capstan__rt_wait(rt, pause < 1.0 ? pause : 1.0);
    return 1;
}

/* Whether the job carries an error of its own that a NameError from here
 * would overwrite: it failed before, elsewhere, under a real error (Ruby's,
 * retried by the scheduler or from the Web UI). Not the NameError that a
 * process without the class wrote, capstan or Ruby: failing it again loses
 * nothing, and under unknown_class: fail it then dies as Sidekiq's would. */
static int earlier_error(const capstan_job_t *job)
{
    size_t clen = 0, mlen = 0;
    const char *cls = capstan_job_field_raw(job, "error_class", &clen);
    if (!cls || clen < 2 || cls[0] != '"')
        return 0;
    if (clen != 11 || memcmp(cls, "\"NameError\"", 11) != 0)
        return 1;
    const char *msg = capstan_job_field_raw(job, "error_message", &mlen);
    char want[300];
    int n = snprintf(want, sizeof(want), "\"uninitialized constant %s", job->cls);
    if (!msg || n <= 0 || (size_t)n >= sizeof(want) || mlen <= (size_t)n || memcmp(msg, want, (size_t)n) != 0)
        return 1;
    /* Ruby may add "Did you mean?" on a new line; capstan's skip adds why. */
    return !(msg[n] == '"' || msg[n] == ' ' || msg[n] == '\\');
}

/* Where a job that already carries a real error goes when it has no
 * handler here, whatever the policy: untouched, to its queue when a Ruby
 * process reads it, else to the retry set, as far ahead as its last retry
 * was (retry_count**4 + 15 s, Sidekiq's delay without the jitter), so that
 * it waits for a process that knows its class, its error shown in the
 * Retries tab, instead of going round a queue only capstan reads. */
static void hand_back(capstan_slot_t *s, capstan_redis_t *r, capstan_job_t *job)
{
    int to_queue = capstan__fleet_shared(s->rt->view.fleet, job->queue);
    double c = job->retry_count > 0 ? (double)job->retry_count : 0;
    double at = to_queue ? -1 : capstan__now() + c * c * c * c + 15;
    size_t len = 0;
    const char *ec = capstan_job_field_raw(job, "error_class", &len);
    if (requeue_unknown(s, r, job, at))
        capstan_info("%s %s has no handler here and already failed with %.*s: back %s untouched, its "
                     "error kept", job->cls, job->jid, (int)(len > 2 ? len - 2 : 0), ec + 1,
                     to_queue ? "in its queue for Ruby" : "in the retry set");
}

static int ride(void *ud, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    capstan_slot_t *s = ud;
    return s->rt->source->ride(s, r, calls, ncalls);
}

static void prompt(void *ud, capstan_redis_t *r, int all)
{
    capstan_slot_t *s = ud;
    s->rt->source->prompt(s, r, all);
}

/* The middleware state a job's server chain starts with. */
static capstan_mw_t server_mw(capstan_runtime_t *rt, capstan_slot_t *s, capstan_redis_t *r,
                              capstan_job_t *job, const capstan_class_row_t *row)
{
    /* Middleware see the payload's own class (the uniqueness digest is made
     * of it, as Ruby makes it); the class options are the handler's. Without
     * a slot (capstan__server_run_bare), no ack rides a round trip. */
    return (capstan_mw_t){ .server = 1, .r = r, .cfg = rt->cfg, .cc = row->cc,
                       .unique = row->h ? row->h->unique : NULL, .limit = row->limit, .job = job,
                       .cls = job->wrapper ? job->wrapper : job->cls,
                       .jid = job->jid, .queue = job->queue,
                       .trip = { s && rt->source->ride ? ride : NULL,
                                 s && rt->source->prompt ? prompt : NULL, s } };
}

/* A job's run on slot s (NULL: the testing kit's, capstan__server_run_bare):
 * its class's row, tags and log context, and what the job sees of the
 * process. The caller frees run.tags. */
static run_t run_begin(capstan_runtime_t *rt, capstan_slot_t *s, capstan_job_t *job)
{
    job->stopping = &rt->stopping;
    job->quiet = &rt->quiet;
    run_t run = { .slot = s, .row = capstan__class_find(rt, job->cls) };
    run.h = run.row->h;
    job->max_iteration_runtime = run.row->max_iteration_runtime;
    run.tags = tags_of(job);
    run.ctx = (capstan_logctx_t){ .cls = job->cls, .jid = job->jid, .tags = run.tags,
                                  .trace_id = job->trace_id[0] ? job->trace_id : NULL, .elapsed = -1 };
    return run;
}

/* Runs the server chain on mw, the handler at its end. The jobs the
 * handler (or a middleware) pushes carry its trace. */
static void run_chain(capstan_runtime_t *rt, capstan_mw_t *mw, const capstan_job_t *job)
{
    capstan__trace_enter(job->traceparent, job->tracestate);
    capstan__mw_run(rt->server_chain, mw, call_handler, NULL);
    capstan__trace_leave();
}

void capstan__server_run(capstan_slot_t *s, capstan_redis_t *r, capstan_job_t *job, capstan_outcome_t *out,
                         const char *held_digest, capstan_prelock_t *prelock)
{
    capstan_runtime_t *rt = s->rt;
    job->redis = capstan_redis_ctx(r);
    run_t run = run_begin(rt, s, job);
    capstan_mw_t chain = server_mw(rt, s, r, job, run.row), *mw = &chain;
    mw->out = out;
    mw->priv = &run;
    mw->held.digest = held_digest;
    mw->held.prelock = prelock;
    if (run.h) {
        s->requeue_streak = 0;
    } else {
        const char *why;
        run.policy = capstan__unknown_policy(rt->view.fleet, rt->cfg, r, job->queue, &why);
        note_unknown(rt, job->cls, job->queue, run.policy, why);
    }
    /* A job that carries an error of its own goes back whatever the policy
     * (hand_back); the others as it says. */
    if (!run.h && earlier_error(job)) {
        hand_back(s, r, job);
        capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    } else if (!run.h && run.policy == CAPSTAN_UNKNOWN_REQUEUE) {
        requeue_unknown(s, r, job, -1);
        capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    } else {
        run_chain(rt, mw, job);
    }
    free(run.tags);
    capstan__mw_clear(mw);
}

void capstan__server_run_bare(capstan_runtime_t *rt, capstan_redis_t *r, capstan_job_t *job,
                              capstan_outcome_t *out)
{
    run_t run = run_begin(rt, NULL, job);
    capstan_mw_t mw = server_mw(rt, NULL, r, job, run.row);
    mw.out = out;
    mw.priv = &run;
    run_chain(rt, &mw, job);
    free(run.tags);
    capstan__mw_clear(&mw);
}

size_t capstan__server_prelock(capstan_slot_t *s, capstan_redis_t *r, const capstan_fetched_t *got, size_t n,
                               capstan_prelock_t *pre, capstan_job_t *jobs)
{
    capstan_mw_t mws[n];
    capstan_mw_t *pm[n];
    size_t m = 0;
    memset(jobs, 0, n * sizeof(*jobs));
    /* A job that does not parse, has no handler, or has expired (or will
     * within the second the run may take) ends the run: an expired job
     * must take no lock. */
    for (; m < n; m++) {
        char err[CAPSTAN_ERRLEN];
        int bad = capstan__job_init(&jobs[m], got[m].payload, got[m].len, capstan__rt_job_queue(s->rt, &got[m]), err);
        const capstan_class_row_t *row = bad ? NULL : capstan__class_find(s->rt, jobs[m].cls);
        double exp = row && row->h ? capstan__job_expires_at(&jobs[m]) : 0;
        if (!row || !row->h || (exp > 0 && exp < capstan__now() + 1)) {
            jobs[m].payload = NULL; /* the caller's */
            capstan__job_clear(&jobs[m]);
            break;
        }
        mws[m] = server_mw(s->rt, s, r, &jobs[m], row);
        pm[m] = &mws[m];
    }
    size_t keep = m ? capstan__unique_prelock(pm, m, pre) : 0;
    if (!keep) {
        memset(pre, 0, sizeof(*pre));
        keep = 1;
    }
    for (size_t i = keep; i < m; i++) {
        jobs[i].payload = NULL;
        capstan__job_clear(&jobs[i]);
    }
    return keep;
}
