/* The server chain a job runs through: the built-in middleware ("stats",
 * "retry", "unique"), those a plugin adds, and at its end the handler. */
#include "runtime/rt.h"

#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/log.h"
#include "support/time.h"
#include "observe/prometheus.h"
#include "kiq/middleware.h"
#include "middleware/mw.h"

/* Per-job state of the built-in server middleware. */
typedef struct run {
    kiq_slot_t *slot;
    const kiq_handler_entry_t *h;
    kiq_logctx_t ctx;
    char *tags;
} run_t;

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
                    kiq__buf_put(&b, ",", 1);
                kiq__buf_puts(&b, json_string_value(e));
            }
        }
    json_decref(arr);
    /* No string among the tags: the log line shows no tags at all. */
    if (!b.len) {
        kiq__buf_free(&b);
        return NULL;
    }
    return kiq__buf_take(&b, NULL);
}

static int class_retry(kiq_runtime_t *rt, const kiq_handler_entry_t *h, const char *cls)
{
    const kiq_class_conf_t *cc = kiq_config_class(rt->cfg, cls);
    if (cc && cc->retry != KIQ_RETRY_UNSET)
        return cc->retry;
    return h ? h->retry : KIQ_RETRY_UNSET;
}

/* "stats": the start/done/fail log lines and the processed/failed counts,
 * around everything else so they see the final outcome. */
static int stats_mw(kiq_mw_t *mw, void *udata)
{
    kiq_runtime_t *rt = udata;
    run_t *run = mw->priv;
    kiq_job_t *job = mw->job;
    kiq__log(KIQ_INFO, &run->ctx, "start");
    double t0 = kiq__mono();
    int rc = kiq_mw_next(mw);
    run->ctx.elapsed = kiq__mono() - t0;
    if (job->err_class) {
        kiq__log(KIQ_INFO, &run->ctx, "fail");
        kiq__log(KIQ_WARN, &run->ctx, "%s: %s", job->err_class, job->err_msg ? job->err_msg : "");
        if (mw->disp == KIQ_DISPOSE_DEAD)
            kiq__log(KIQ_INFO, &run->ctx, "Adding dead %s job %s", job->cls, job->jid);
        atomic_fetch_add(&rt->failed, 1);
    } else {
        kiq__log(KIQ_INFO, &run->ctx, "done");
    }
    atomic_fetch_add(&rt->processed, 1);
    kiq__metrics_job(kiq__metrics_default(), job->cls, job->queue, run->ctx.elapsed,
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
    if (job->err_class)
        kiq_hooks_error(rt, job, job->err_class, job->err_msg);
    if (!job->err_class || mw->disp != KIQ_DISPOSE_DEFAULT)
        return rc;
    kiq_failure_t f = {0};
    double now = kiq__now();
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
    /* A middleware's command may have broken the connection. */
    if (kiq_processor_connected(run->slot, mw->r))
        return kiq_mw_dispose(mw, KIQ_DISPOSE_KEEP, 0, NULL, 0);
    job->redis = kiq_redis_ctx(mw->r);
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

void kiq_server_run(kiq_slot_t *s, kiq_redis_t *r, kiq_job_t *job, struct kiq_mw *mw,
                    const char *held_digest)
{
    kiq_runtime_t *rt = s->rt;
    job->redis = kiq_redis_ctx(r);
    job->stopping = &rt->stopping;
    run_t run = { .slot = s, .h = kiq_registry_find(rt, job->cls) };
    run.tags = tags_of(job);
    run.ctx = (kiq_logctx_t){ .cls = job->cls, .jid = job->jid, .tags = run.tags, .elapsed = -1 };
    *mw = (kiq_mw_t){ .server = 1, .r = r, .cfg = rt->cfg, .cc = kiq_config_class(rt->cfg, job->cls),
                      .unique = run.h ? run.h->unique : NULL, .job = job, .cls = job->cls,
                      .jid = job->jid, .queue = job->queue, .priv = &run,
                      .held_digest = held_digest };
    kiq__mw_run(rt->server_chain, mw, call_handler, NULL);
    free(run.tags);
    /* Both point into this call's state and the fetched job. */
    mw->priv = NULL;
    mw->held_digest = NULL;
}
