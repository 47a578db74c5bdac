/* Processor threads: each owns one Redis connection and loops
 * fetch -> run the handler -> acknowledge, until the process goes quiet. */
#include "rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "log.h"
#include "metrics.h"
#include "timeutil.h"
#include "kiq/middleware.h"
#include "../middleware/mw.h"

/* Joins the "tags" array of a payload with ',' for the log line. */
static char *tags_of(kiq_job_t *job)
{
    size_t len;
    const char *v = kiq_job_field_raw(job, "tags", &len);
    if (!v)
        return NULL;
    json_t *arr = json_loadb(v, len, 0, NULL);
    kiq_buf_t b = {0};
    size_t i;
    json_t *e;
    if (json_is_array(arr))
        json_array_foreach(arr, i, e) {
            if (json_is_string(e)) {
                if (b.len)
                    kiq_buf_put(&b, ",", 1);
                kiq_buf_puts(&b, json_string_value(e));
            }
        }
    json_decref(arr);
    return kiq_buf_take(&b, NULL);
}

static void slot_set(kiq_slot_t *s, const kiq_fetched_t *got, const char *cls)
{
    pthread_mutex_lock(&s->mu);
    s->busy = 1;
    s->abandoned = 0;
    s->queue = (char *)got->queue;
    s->payload = got->payload;
    s->len = got->len;
    s->run_at = (long)kiq_now();
    snprintf(s->cls, sizeof(s->cls), "%s", cls ? cls : "");
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->rt->busy, 1);
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
                           : (kiq_redis_ok(r) ? kiq_fetch_ack(s->fetch, r, raw, len, ack)
                                              : KIQ_EREDIS);
        pthread_mutex_unlock(&s->mu);
        if (rc != KIQ_EREDIS || atomic_load(&rt->housekeeper_stop))
            return rc;
        if (kiq_rt_connect(rt, r, &rt->housekeeper_stop))
            return rc;
    }
}

static int class_retry(kiq_runtime_t *rt, const kiq_handler_entry_t *h, const char *cls)
{
    const kiq_class_conf_t *cc = kiq_config_class(rt->cfg, cls);
    if (cc && cc->retry != KIQ_RETRY_UNSET)
        return cc->retry;
    return h ? h->retry : KIQ_RETRY_UNSET;
}

static void fail_invalid(kiq_slot_t *s, kiq_redis_t *r, const kiq_fetched_t *got, const char *why)
{
    kiq_runtime_t *rt = s->rt;
    kiq_failure_t f;
    double now = kiq_now();
    if (kiq_retry_invalid(got->payload, got->len, got->queue, why, rt->cfg, now, &f)) {
        kiq_error("out of memory handling an invalid payload from queue:%s; it stays in the working list",
                  got->queue);
        return;
    }
    kiq_ack_t ack = { .kind = KIQ_ACK_DEAD, .score = f.score, .payload = f.payload, .len = f.len,
                      .dead_cutoff = now - (double)rt->cfg->dead_timeout,
                      .dead_max = rt->cfg->dead_max_jobs };
    ack_job(s, r, got->payload, got->len, &ack);
    kiq_error("invalid payload from queue:%s moved to the dead set: %s", got->queue, why);
    kiq_failure_clear(&f);
}

/* Per-job state of the built-in server middleware. */
typedef struct run {
    kiq_slot_t *slot;
    const kiq_handler_entry_t *h;
    kiq_logctx_t ctx;
    char *tags;
} run_t;

/* "stats": the start/done/fail log lines and the processed/failed counts,
 * around everything else so they see the final outcome. */
static int stats_mw(kiq_mw_t *mw, void *udata)
{
    kiq_runtime_t *rt = udata;
    run_t *run = mw->priv;
    kiq_job_t *job = mw->job;
    kiq_log(KIQ_INFO, &run->ctx, "start");
    double t0 = kiq_mono();
    int rc = kiq_mw_next(mw);
    run->ctx.elapsed = kiq_mono() - t0;
    if (job->err_class) {
        kiq_log(KIQ_INFO, &run->ctx, "fail");
        kiq_log(KIQ_WARN, &run->ctx, "%s: %s", job->err_class, job->err_msg ? job->err_msg : "");
        if (mw->disp == KIQ_DISPOSE_DEAD)
            kiq_log(KIQ_INFO, &run->ctx, "Adding dead %s job %s", job->cls, job->jid);
        atomic_fetch_add(&rt->failed, 1);
    } else {
        kiq_log(KIQ_INFO, &run->ctx, "done");
    }
    atomic_fetch_add(&rt->processed, 1);
    kiq_metrics_job(kiq_metrics_default(), job->cls, job->queue, run->ctx.elapsed,
                    job->err_class != NULL);
    return rc;
}

/* "retry": Sidekiq's retry rules for a job that failed inside it, unless
 * an inner middleware already decided its fate. */
static int retry_mw(kiq_mw_t *mw, void *udata)
{
    kiq_runtime_t *rt = udata;
    run_t *run = mw->priv;
    kiq_job_t *job = mw->job;
    int rc = kiq_mw_next(mw);
    if (!job->err_class || mw->disp != KIQ_DISPOSE_DEFAULT)
        return rc;
    kiq_failure_t f = {0};
    double now = kiq_now();
    if (kiq_retry_decide(job, job->err_class, job->err_msg, class_retry(rt, run->h, job->cls),
                         rt->cfg, now, &f) == 0) {
        kiq_dispose_t d = f.fate == KIQ_FATE_RETRY ? KIQ_DISPOSE_RETRY
                        : f.fate == KIQ_FATE_DEAD ? KIQ_DISPOSE_DEAD : KIQ_DISPOSE_DROP;
        if (kiq_mw_dispose(mw, d, f.score, f.payload, f.len))
            kiq_mw_dispose(mw, KIQ_DISPOSE_KEEP, 0, NULL, 0);
    } else {
        /* No memory to write the failure: leave it in the working list. */
        kiq_mw_dispose(mw, KIQ_DISPOSE_KEEP, 0, NULL, 0);
    }
    kiq_failure_clear(&f);
    return rc;
}

/* The end of the server chain: the handler. */
static int call_handler(kiq_mw_t *mw, void *udata)
{
    (void)udata;
    run_t *run = mw->priv;
    kiq_job_t *job = mw->job;
    if (!run->h) {
        kiq_job_fail(job, "NameError", "uninitialized constant %s", job->cls);
    } else {
        int hrc = run->h->fn(job, run->h->udata);
        if (hrc != 0 && !job->err_class)
            kiq_job_fail(job, "RuntimeError", "%s returned %d", job->cls, hrc);
    }
    /* A handler may leave replies unread or break the connection; the next
     * fetch notices and reconnects. */
    return 0;
}

kiq_chain_t *kiq_runtime_server_chain(kiq_runtime_t *rt)
{
    if (!rt)
        return NULL;
    if (rt->server_chain)
        return rt->server_chain;
    kiq_chain_t *c = kiq_chain_new();
    if (!c || kiq_chain_add(c, "stats", stats_mw, rt) || kiq_chain_add(c, "retry", retry_mw, rt) ||
        kiq_chain_add(c, "unique", kiq_unique_server_mw, NULL)) {
        kiq_chain_free(c);
        return NULL;
    }
    rt->server_chain = c;
    return c;
}

/* A finished job whose ack goes out with the next fetch (reliable fetch:
 * the ack script and LREM are guarded by the working list, so a requeue or
 * recovery meanwhile cannot make it count twice). */
typedef struct done {
    int active;
    kiq_job_t job;   /* owns the payload the ack removes */
    kiq_mw_t mw;     /* owns the payload the ack stores */
    kiq_ack_t ack;
} done_t;

static void done_clear(done_t *d)
{
    kiq_mw_clear(&d->mw);
    kiq_job_clear(&d->job);
    d->active = 0;
}

static void done_acked(done_t *d, kiq_redis_t *r)
{
    if (d->ack.lock_key)
        kiq_mw_note_released(&d->mw, r);
    done_clear(d);
}

/* Sends a pending ack on its own, reconnecting until it is written or the
 * process is about to exit (then the job stays in the working list and is
 * recovered once this process is gone). */
static void flush_done(kiq_slot_t *s, kiq_redis_t *r, done_t *d)
{
    kiq_runtime_t *rt = s->rt;
    while (d->active) {
        if (kiq_redis_ok(r) && kiq_fetch_ack(s->fetch, r, d->job.payload, d->job.len, &d->ack) == 0)
            done_acked(d, r);
        else if (atomic_load(&rt->housekeeper_stop) || kiq_rt_connect(rt, r, &rt->housekeeper_stop))
            done_clear(d);
    }
}

static void run_one(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *got, done_t *d)
{
    kiq_runtime_t *rt = s->rt;
    char err[KIQ_ERRLEN] = "";
    kiq_job_t *job = &d->job;
    int rc = kiq_job_init(job, got->payload, got->len, got->queue, err);
    slot_set(s, got, job->cls);
    if (rc) {
        fail_invalid(s, r, got, err);
        slot_clear(s);
        kiq_job_clear(job);
        return;
    }
    job->redis = kiq_redis_ctx(r);
    job->stopping = &rt->stopping;
    run_t run = { .slot = s, .h = kiq_registry_find(rt, job->cls) };
    run.tags = tags_of(job);
    run.ctx = (kiq_logctx_t){ .cls = job->cls, .jid = job->jid, .tags = run.tags, .elapsed = -1 };
    kiq_mw_t *mw = &d->mw;
    *mw = (kiq_mw_t){ .server = 1, .r = r, .cfg = rt->cfg, .cc = kiq_config_class(rt->cfg, job->cls),
                      .unique = run.h ? run.h->unique : NULL, .job = job, .cls = job->cls,
                      .jid = job->jid, .queue = job->queue, .priv = &run };
    kiq_mw_run(rt->server_chain, mw, call_handler, NULL);
    free(run.tags);
    mw->priv = NULL;

    static const kiq_ack_kind_t kinds[] = {
        [KIQ_DISPOSE_DEFAULT] = KIQ_ACK_OK, [KIQ_DISPOSE_DONE] = KIQ_ACK_OK,
        [KIQ_DISPOSE_RETRY] = KIQ_ACK_RETRY, [KIQ_DISPOSE_DEAD] = KIQ_ACK_DEAD,
        [KIQ_DISPOSE_DROP] = KIQ_ACK_DROP, [KIQ_DISPOSE_SCHEDULE] = KIQ_ACK_SCHEDULE,
        [KIQ_DISPOSE_KEEP] = KIQ_ACK_OK,
    };
    if (mw->disp == KIQ_DISPOSE_KEEP) {
        slot_clear(s);
        done_clear(d);
        return;
    }
    int stores = mw->disp == KIQ_DISPOSE_RETRY || mw->disp == KIQ_DISPOSE_DEAD ||
                 mw->disp == KIQ_DISPOSE_SCHEDULE;
    d->ack = (kiq_ack_t){ .kind = kinds[mw->disp], .score = mw->score,
                          .payload = stores ? (mw->dpayload ? mw->dpayload : job->payload) : NULL,
                          .len = stores ? (mw->dpayload ? mw->dlen : job->len) : 0,
                          .dead_cutoff = kiq_now() - (double)rt->cfg->dead_timeout,
                          .dead_max = rt->cfg->dead_max_jobs,
                          .lock_key = kiq_mw_release_key(mw, mw->disp), .lock_jid = job->jid };
    d->active = 1;
    if (rt->cfg->fetch == KIQ_FETCH_RELIABLE) {
        slot_clear(s); /* the ack rides with the next fetch */
        return;
    }
    /* The basic fetch has no working list to guard the ack against the
     * shutdown's requeue: the slot lock does. */
    int arc = ack_job(s, r, job->payload, job->len, &d->ack);
    if (arc == 0)
        done_acked(d, r);
    else
        done_clear(d);
    slot_clear(s);
}

void *kiq_processor_main(void *arg)
{
    kiq_slot_t *s = arg;
    kiq_runtime_t *rt = s->rt;
    char err[KIQ_ERRLEN];
    done_t d = {0};
    pthread_mutex_lock(&s->mu);
    snprintf(s->tid, sizeof(s->tid), "%s", kiq_log_tid());
    pthread_mutex_unlock(&s->mu);
    kiq_redis_t *r = kiq_redis_new(rt->cfg->redis_url, 15, err);
    if (!r) {
        kiq_error("processor %d: %s", s->index, err);
        goto out;
    }
    while (!atomic_load(&rt->quiet)) {
        if (!kiq_redis_ok(r) && kiq_rt_connect(rt, r, &rt->quiet))
            break;
        kiq_fetched_t got;
        int rc, ack_rc = 0;
        if (d.active) {
            rc = kiq_fetch_ack_next(s->fetch, r, d.job.payload, d.job.len, &d.ack, &ack_rc, &got);
            if (ack_rc == 0)
                done_acked(&d, r);
            else if (rc == 1)
                flush_done(s, r, &d); /* a job came behind a refused ack */
        } else {
            rc = kiq_fetch_next(s->fetch, r, &got);
        }
        if (rc < 0 && kiq_redis_ok(r)) {
            /* Redis answered with an error (a queue key that is not a list,
             * a script it refuses): retrying at once would only spin. */
            if (!atomic_exchange(&rt->fetch_failing, 1))
                kiq_error("fetch failed: %s; retrying every second", kiq_redis_error(r));
            kiq_rt_wait(rt, 1.0);
            continue;
        }
        if (rc >= 0 && atomic_load(&rt->fetch_failing) && atomic_exchange(&rt->fetch_failing, 0))
            kiq_info("fetching works again");
        if (rc <= 0)
            continue; /* nothing came, or the connection broke (reconnect above) */
        if (atomic_load(&rt->quiet)) {
            /* Fetched as the process went quiet: give it back at once. */
            int back;
            while ((back = kiq_fetch_requeue(s->fetch, r, got.queue, got.payload, got.len)) != 0)
                if (kiq_rt_connect(rt, r, &rt->housekeeper_stop))
                    break;
            if (back == 0)
                kiq_info("a job fetched as the process went quiet went back to queue:%s",
                         got.queue);
            free(got.payload);
            break;
        }
        run_one(s, r, &got, &d);
    }
    flush_done(s, r, &d);
out:
    kiq_redis_free(r);
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
            if (kiq_fetch_requeue(s->fetch, r, s->queue, s->payload, s->len) == 0) {
                n++;
                kiq_warn("requeued %s from thread TID-%s", s->cls, s->tid);
            } else {
                kiq_error("could not requeue %s from TID-%s: %s; it stays in the working list "
                          "and is recovered after this process is gone",
                          s->cls, s->tid, kiq_redis_error(r));
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    return n;
}
