/* Processor threads: each owns one Redis connection and loops
 * fetch -> run the handler -> acknowledge, until the process goes quiet. */
#include "runtime/rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/log.h"
#include "observe/prometheus.h"
#include "support/time.h"
#include "kiq/middleware.h"
#include "middleware/mw.h"

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
    /* No string among the tags: the log line shows no tags at all. */
    if (!b.len) {
        kiq_buf_free(&b);
        return NULL;
    }
    return kiq_buf_take(&b, NULL);
}

static void slot_set(kiq_slot_t *s, const kiq_job_t *job, const char *cls)
{
    pthread_mutex_lock(&s->mu);
    s->busy = 1;
    s->abandoned = 0;
    s->queue = (char *)job->queue;
    s->payload = job->payload;
    s->len = job->len;
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

static void fail_invalid(kiq_slot_t *s, kiq_redis_t *r, const char *queue, const char *raw,
                         size_t len, const char *why)
{
    kiq_runtime_t *rt = s->rt;
    kiq_failure_t f;
    double now = kiq_now();
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

/* Reconnects r when it broke (say in the round trip that wrote the acks
 * just before this job was taken from the feed), so that a handler always
 * gets a connected context. The job is in its slot meanwhile: a shutdown
 * gives it back as it does a running job. Returns 0 when the job may start,
 * nonzero when it must not (the process exits, or the job was given back):
 * it then stays where it is, in the working list or back in its queue. */
static int connected(kiq_slot_t *s, kiq_redis_t *r)
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

/* The end of the server chain: the handler. */
static int call_handler(kiq_mw_t *mw, void *udata)
{
    (void)udata;
    run_t *run = mw->priv;
    kiq_job_t *job = mw->job;
    /* A middleware's command may have broken the connection. */
    if (connected(run->slot, mw->r))
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

/* A finished job whose ack has not been written yet (reliable fetch: the
 * ack script and LREM are guarded by the working list, so a requeue or
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

static void run_one(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *got, done_t *d)
{
    kiq_runtime_t *rt = s->rt;
    char err[KIQ_ERRLEN] = "";
    kiq_job_t *job = &d->job;
    int rc = kiq_job_init(job, got->payload, got->len, got->queue, err);
    got->payload = NULL; /* the job owns it now */
    slot_set(s, job, job->cls);
    if (rc) {
        fail_invalid(s, r, got->queue, job->payload, job->len, err);
        slot_clear(s);
        kiq_job_clear(job);
        return;
    }
    if (connected(s, r)) {
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
    /* The fetch saw this job's lock held by this jid: the server need not
     * look again (checked against our own parse of the payload). */
    int held = got->held_jid && strcmp(got->held_jid, job->jid) == 0;
    *mw = (kiq_mw_t){ .server = 1, .r = r, .cfg = rt->cfg, .cc = kiq_config_class(rt->cfg, job->cls),
                      .unique = run.h ? run.h->unique : NULL, .job = job, .cls = job->cls,
                      .jid = job->jid, .queue = job->queue, .priv = &run,
                      .held_digest = held ? got->held_digest : NULL };
    kiq_mw_run(rt->server_chain, mw, call_handler, NULL);
    free(run.tags);
    mw->priv = NULL;
    mw->held_digest = NULL;

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
        slot_clear(s); /* the ack goes out with a later round trip */
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

/* ---- The reliable fetch's local buffer ------------------------------
 *
 * Processors fetch in batches and share what they fetched: a thread that
 * finds the feed empty fetches for itself and for the threads that will
 * look next (at most BATCH_MAX jobs, and no more than the threads not
 * running a job can take), keeps one and leaves the rest in the feed. Acks
 * of finished jobs wait in the feed too and go out with the next round trip
 * any processor makes. Every job in the feed, fetched or finished, is in
 * the working list meanwhile, so a crash loses none of them. */
enum { BATCH_MAX = 8, ACKS_MAX = 16, SPARE_MAX = 64 };

struct kiq_feed {
    pthread_mutex_t mu;
    pthread_cond_t came;   /* a sweep came back */
    kiq_fetched_t *jobs;   /* ring, oldest at head */
    size_t head, n, cap;
    done_t **acks;         /* finished, ack not written */
    size_t nacks, cap_acks;
    done_t *spare[SPARE_MAX]; /* released, for reuse: a job's memory is */
    size_t nspare;            /*   freed by whichever thread acks it */
    int sweeping;          /* sweeps on their way */
    int sweepers_max;      /* at most this many at once */
    size_t waiting;        /* threads waiting for one to come back */
    int inside;            /* threads past the gate in next_job: holding a
                              job, or fetching, until they look again */
    int solo;              /* a suspect runs alone: the gate is shut */
    kiq_fetched_t suspect; /* the suspect waiting for the others (its
                              thread owns the payload) */
};

kiq_feed_t *kiq_feed_new(int nslots)
{
    kiq_feed_t *fd = calloc(1, sizeof(*fd));
    if (!fd)
        return NULL;
    /* Enough sweeps on their way to bring a job for every processor (when
     * Redis is far away, each waits a whole round trip), and at least two
     * (so one is on its way while another's jobs are being taken). */
    fd->sweepers_max = (nslots + BATCH_MAX - 1) / BATCH_MAX;
    if (fd->sweepers_max < 2)
        fd->sweepers_max = 2;
    /* A sweep starts only when the feed is empty and leaves at most
     * BATCH_MAX - 1 jobs in it, so this is room enough. */
    fd->cap = (size_t)fd->sweepers_max * BATCH_MAX;
    fd->jobs = calloc(fd->cap, sizeof(kiq_fetched_t));
    if (!fd->jobs) {
        free(fd);
        return NULL;
    }
    pthread_mutex_init(&fd->mu, NULL);
    pthread_cond_init(&fd->came, NULL);
    return fd;
}

void kiq_feed_free(kiq_feed_t *fd)
{
    if (!fd)
        return;
    for (size_t i = 0; i < fd->n; i++)
        kiq_fetched_clear(&fd->jobs[(fd->head + i) % fd->cap]);
    for (size_t i = 0; i < fd->nacks; i++) {
        done_clear(fd->acks[i]);
        free(fd->acks[i]);
    }
    for (size_t i = 0; i < fd->nspare; i++)
        free(fd->spare[i]);
    free(fd->acks);
    free(fd->jobs);
    pthread_cond_destroy(&fd->came);
    pthread_mutex_destroy(&fd->mu);
    free(fd);
}

/* Under fd->mu. The ring has room for every batch in flight. */
static void feed_push(kiq_feed_t *fd, kiq_fetched_t *job)
{
    fd->jobs[(fd->head + fd->n) % fd->cap] = *job;
    fd->n++;
    memset(job, 0, sizeof(*job));
}

static kiq_fetched_t feed_pop(kiq_feed_t *fd)
{
    kiq_fetched_t j = fd->jobs[fd->head];
    fd->head = (fd->head + 1) % fd->cap;
    fd->n--;
    return j;
}

/* A cleared done_t, reused when one is spare. */
static done_t *done_new(kiq_runtime_t *rt)
{
    kiq_feed_t *fd = rt->feed;
    done_t *d = NULL;
    if (fd) {
        pthread_mutex_lock(&fd->mu);
        if (fd->nspare)
            d = fd->spare[--fd->nspare];
        pthread_mutex_unlock(&fd->mu);
    }
    if (d) {
        memset(d, 0, sizeof(*d));
        return d;
    }
    return calloc(1, sizeof(done_t));
}

/* Clears d and frees it or keeps it for reuse. */
static void done_free(kiq_runtime_t *rt, done_t *d)
{
    kiq_feed_t *fd = rt->feed;
    done_clear(d);
    if (fd) {
        pthread_mutex_lock(&fd->mu);
        if (fd->nspare < SPARE_MAX) {
            fd->spare[fd->nspare++] = d;
            d = NULL;
        }
        pthread_mutex_unlock(&fd->mu);
    }
    free(d);
}

/* Queues a finished job's ack; on no memory, writes it at once instead. */
static void feed_ack(kiq_slot_t *s, kiq_redis_t *r, done_t *d)
{
    kiq_feed_t *fd = s->rt->feed;
    pthread_mutex_lock(&fd->mu);
    if (fd->nacks == fd->cap_acks) {
        size_t cap = fd->cap_acks ? fd->cap_acks * 2 : 64;
        done_t **a = realloc(fd->acks, cap * sizeof(*a));
        if (a) {
            fd->acks = a;
            fd->cap_acks = cap;
        }
    }
    if (fd->nacks < fd->cap_acks) {
        fd->acks[fd->nacks++] = d;
        d = NULL;
    }
    pthread_mutex_unlock(&fd->mu);
    if (d) {
        if (kiq_fetch_ack(s->fetch, r, d->job.payload, d->job.len, &d->ack) == 0)
            done_acked(d, r);
        done_free(s->rt, d);
    }
}

/* Under fd->mu: takes every waiting ack, to be written by the caller. */
static done_t **feed_take_acks(kiq_feed_t *fd, size_t *n)
{
    *n = 0;
    if (!fd->nacks)
        return NULL;
    done_t **a = malloc(fd->nacks * sizeof(*a));
    if (!a)
        return NULL; /* they wait for the next taker */
    memcpy(a, fd->acks, fd->nacks * sizeof(*a));
    *n = fd->nacks;
    fd->nacks = 0;
    return a;
}

/* Writes the acks taken (and fetches up to max jobs into got, in the same
 * round trip). Acks written are released; the others go back to the feed
 * for the next round trip, and *unwritten (when not NULL) counts them.
 * Returns kiq_fetch_exchange's result. */
static int exchange(kiq_slot_t *s, kiq_redis_t *r, done_t **acks, size_t nacks,
                    kiq_fetched_t *got, size_t max, int block, size_t *unwritten)
{
    kiq_ack_item_t items[nacks ? nacks : 1];
    for (size_t i = 0; i < nacks; i++)
        items[i] = (kiq_ack_item_t){ .raw = acks[i]->job.payload, .len = acks[i]->job.len,
                                     .ack = acks[i]->ack, .rc = KIQ_EREDIS };
    int rc = kiq_redis_ok(r) ? kiq_fetch_exchange(s->fetch, r, items, nacks, got, max, block)
                             : KIQ_EREDIS;
    size_t failed = 0;
    for (size_t i = 0; i < nacks; i++) {
        if (items[i].rc == 0) {
            done_acked(acks[i], r);
            done_free(s->rt, acks[i]);
        } else {
            feed_ack(s, r, acks[i]);
            failed++;
        }
    }
    free(acks);
    if (unwritten)
        *unwritten = failed;
    return rc;
}

/* Gives a job back to its queue (fetched as the process went quiet, or
 * left in the feed), reconnecting until done or the process exits. */
static void give_back(kiq_fetch_t *f, kiq_runtime_t *rt, kiq_redis_t *r, kiq_fetched_t *job,
                      int connect)
{
    int back;
    while ((back = kiq_fetch_requeue(f, r, job->queue, job->payload, job->len)) != 0)
        if (!connect || kiq_rt_connect(rt, r, &rt->housekeeper_stop))
            break;
    if (back == 0)
        kiq_info("a fetched job that had not started went back to queue:%s", job->queue);
    else
        kiq_error("could not give a fetched job back to queue:%s: %s; it stays in the working "
                  "list and is recovered after this process is gone", job->queue,
                  kiq_redis_error(r));
    kiq_fetched_clear(job);
}

/* Gives back every job waiting in the feed, newest first so that each
 * queue's oldest ends up fetched first again. */
static int feed_give_back(kiq_fetch_t *f, kiq_runtime_t *rt, kiq_redis_t *r, int connect)
{
    kiq_feed_t *fd = rt->feed;
    int n = 0;
    for (;;) {
        pthread_mutex_lock(&fd->mu);
        kiq_fetched_t job = {0};
        if (fd->n) {
            fd->n--;
            job = fd->jobs[(fd->head + fd->n) % fd->cap];
        }
        pthread_mutex_unlock(&fd->mu);
        if (!job.payload)
            return n;
        give_back(f, rt, r, &job, connect);
        n++;
    }
}

/* Writes every waiting ack, reconnecting until they are written or the
 * process is about to exit (then their jobs stay in the working list and
 * are recovered once this process is gone). */
static void flush_acks(kiq_slot_t *s, kiq_redis_t *r)
{
    kiq_runtime_t *rt = s->rt;
    kiq_feed_t *fd = rt->feed;
    for (;;) {
        size_t n;
        pthread_mutex_lock(&fd->mu);
        done_t **acks = feed_take_acks(fd, &n);
        pthread_mutex_unlock(&fd->mu);
        if (!n)
            return;
        size_t failed;
        exchange(s, r, acks, n, NULL, 0, 0, &failed);
        /* Acks other threads queued meanwhile simply go in the next turn;
         * only a failure of these calls for a new connection. */
        if (failed && (atomic_load(&rt->housekeeper_stop)
                       || kiq_rt_connect(rt, r, &rt->housekeeper_stop))) {
            pthread_mutex_lock(&fd->mu);
            acks = feed_take_acks(fd, &n);
            pthread_mutex_unlock(&fd->mu);
            for (size_t i = 0; i < n; i++)
                done_free(rt, acks[i]);
            free(acks);
            return;
        }
    }
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

static void run_fetched(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *job)
{
    done_t *d = done_new(s->rt);
    if (!d) {
        kiq_error("out of memory starting a job from queue:%s; it stays in the working list",
                  job->queue);
        kiq_fetched_clear(job);
        return;
    }
    run_one(s, r, job, d);
    kiq_fetched_clear(job);
    if (d->active)
        feed_ack(s, r, d);
    else
        done_free(s->rt, d);
}

/* How many jobs a sweep asks for: one for each thread not running a job,
 * this one included. Under fd->mu. */
static size_t batch_size(kiq_runtime_t *rt)
{
    long idle = (long)rt->nslots - (long)atomic_load(&rt->busy);
    return idle < 1 ? 1 : idle > BATCH_MAX ? BATCH_MAX : (size_t)idle;
}

/* Under fd->mu: waits for a sweep to come back, or a little while (a job
 * left in the feed behind a long one is then taken by a waiter). */
static void feed_wait(kiq_feed_t *fd)
{
    struct timespec until = kiq_timespec(kiq_now() + 0.1);
    fd->waiting++;
    pthread_cond_timedwait(&fd->came, &fd->mu, &until);
    fd->waiting--;
}

/* ---- Suspects ---------------------------------------------------------
 *
 * A job recovered from a crashed process carries "recovery_count", and so
 * does every job that was in that process's working list with it: fetched
 * in its batch, running beside it, or finished with its ack still waiting
 * in the feed. Had such a suspect run beside others and crashed the
 * process again, they all would be recovered again, and after
 * max_recoveries innocent jobs would go to the dead set as poison pills.
 * So a suspect runs alone: the jobs other threads hold finish first, the
 * acks waiting are written, the jobs waiting in the feed go back to the
 * head of their queues, and no thread fetches until the suspect is done
 * and acked. A crash then leaves only the suspect in the working list, and
 * only the job at fault counts recoveries. Suspects are rare (only after a
 * crash); otherwise this costs a memmem per job and a counter kept under
 * the lock next_job takes anyway. */

/* Under fd->mu: this thread looks for a job again, so it holds none. */
static void gate_leave(kiq_feed_t *fd, int *inside)
{
    if (!*inside)
        return;
    *inside = 0;
    fd->inside--;
    if (fd->solo)
        pthread_cond_broadcast(&fd->came); /* the suspect waits for this */
}

static int suspect(const kiq_fetched_t *job)
{
    /* A plain search: a nested field of that name only costs a solo run. */
    static const char key[] = "\"recovery_count\"";
    return memmem(job->payload, job->len, key, sizeof(key) - 1) != NULL;
}

/* Takes the process for the suspect *job: waits until no other thread holds
 * a job, writes the acks waiting and gives back the jobs waiting in the
 * feed. Returns 1 when the suspect may run (then solo_end after it), 0 when
 * it went back to its queue: another suspect runs (this one runs after
 * it), or the process goes quiet. */
static int solo_begin(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *job)
{
    kiq_runtime_t *rt = s->rt;
    kiq_feed_t *fd = rt->feed;
    pthread_mutex_lock(&fd->mu);
    int mine = !fd->solo;
    if (mine) {
        fd->solo = 1;
        fd->suspect = *job; /* kiq_processor_holds sees it while it waits */
        while (fd->inside > 1 && !atomic_load(&rt->quiet))
            feed_wait(fd);
    }
    pthread_mutex_unlock(&fd->mu);
    int quiet = atomic_load(&rt->quiet);
    if (mine && !quiet) {
        flush_acks(s, r);
        feed_give_back(s->fetch, rt, r, 1);
    }
    pthread_mutex_lock(&fd->mu);
    memset(&fd->suspect, 0, sizeof(fd->suspect)); /* *job still owns it */
    if (mine && quiet)
        fd->solo = 0;
    pthread_mutex_unlock(&fd->mu);
    if (mine && !quiet)
        return 1;
    give_back(s->fetch, rt, r, job, 1);
    return 0;
}

/* The suspect is done: its ack is written before any other job is
 * fetched, then the gate opens. */
static void solo_end(kiq_slot_t *s, kiq_redis_t *r)
{
    kiq_feed_t *fd = s->rt->feed;
    flush_acks(s, r);
    pthread_mutex_lock(&fd->mu);
    fd->solo = 0;
    pthread_cond_broadcast(&fd->came);
    pthread_mutex_unlock(&fd->mu);
}

/* One job for this thread into *job. A job waiting in the feed comes
 * first. Otherwise this thread sweeps the queues for itself and for the
 * threads that will look next, unless sweepers_max sweeps are on their way
 * already: then it waits for them (one waiter is woken per sweep that came
 * back, to take a job or sweep next; so under load a few threads do the
 * round trips and the others are not woken for each job). When the queues
 * are empty every thread blocks on one of them. Acks waiting go out with
 * any round trip. Returns 1 with a job, 0 without (look again), or
 * kiq_fetch_exchange's error. */
static int next_job(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *job, int *inside)
{
    kiq_runtime_t *rt = s->rt;
    kiq_feed_t *fd = rt->feed;
    kiq_fetched_t got[BATCH_MAX];
    size_t nacks = 0, want;
    done_t **acks;
    pthread_mutex_lock(&fd->mu);
    gate_leave(fd, inside);
    while ((fd->solo || (!fd->n && fd->sweeping >= fd->sweepers_max))
           && !atomic_load(&rt->quiet))
        feed_wait(fd);
    if (atomic_load(&rt->quiet)) {
        pthread_mutex_unlock(&fd->mu);
        return 0;
    }
    *inside = 1;
    fd->inside++;
    if (fd->n) {
        *job = feed_pop(fd);
        /* The acks waiting go out now when the feed ran dry, too many
         * wait, or this thread is the last one free: nobody else would
         * send them soon. */
        acks = !fd->n || fd->nacks >= ACKS_MAX || atomic_load(&rt->busy) + 1 >= rt->nslots
                   ? feed_take_acks(fd, &nacks) : NULL;
        pthread_mutex_unlock(&fd->mu);
        if (nacks)
            exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
        return 1;
    }
    acks = feed_take_acks(fd, &nacks);
    want = batch_size(rt);
    fd->sweeping++;
    pthread_mutex_unlock(&fd->mu);

    int rc = exchange(s, r, acks, nacks, got, want, 0, NULL);
    pthread_mutex_lock(&fd->mu);
    fd->sweeping--;
    for (int i = 1; i < rc && !atomic_load(&rt->quiet); i++)
        feed_push(fd, &got[i]);
    if (rc == 0) {
        pthread_cond_broadcast(&fd->came); /* all go and wait on the queues */
        acks = feed_take_acks(fd, &nacks);
    } else if (fd->waiting) {
        pthread_cond_signal(&fd->came);
    }
    pthread_mutex_unlock(&fd->mu);
    if (rc > 0) {
        /* Fetched as the process went quiet: all of it goes back. */
        for (int i = rc - 1; i >= 1; i--)
            if (got[i].payload)
                give_back(s->fetch, rt, r, &got[i], 1);
        *job = got[0];
        return 1;
    }
    if (rc < 0)
        return rc;
    /* Every queue was empty: wait on them (see kiq_fetch_exchange). */
    return exchange(s, r, acks, nacks, job, 1, 1, NULL);
}

/* Fetch, run, until the process goes quiet. The reliable fetch then writes
 * the acks still waiting and gives back what the feed holds. */
static void loop(kiq_slot_t *s, kiq_redis_t *r)
{
    kiq_runtime_t *rt = s->rt;
    int reliable = rt->feed != NULL, inside = 0;
    while (!atomic_load(&rt->quiet)) {
        if (!kiq_redis_ok(r) && kiq_rt_connect(rt, r, &rt->quiet))
            break;
        kiq_fetched_t job = {0};
        int rc = reliable ? next_job(s, r, &job, &inside) : kiq_fetch_next(s->fetch, r, &job);
        if (fetch_refused(rt, r, rc) || rc <= 0)
            continue; /* nothing came, or the connection broke (reconnect above) */
        if (atomic_load(&rt->quiet)) {
            give_back(s->fetch, rt, r, &job, 1);
            break;
        }
        /* Only the reliable fetch recovers jobs, so only it has suspects. */
        int solo = reliable && suspect(&job);
        if (solo && !solo_begin(s, r, &job))
            continue;
        run_fetched(s, r, &job);
        if (solo)
            solo_end(s, r);
    }
    if (reliable) {
        pthread_mutex_lock(&rt->feed->mu);
        gate_leave(rt->feed, &inside);
        pthread_mutex_unlock(&rt->feed->mu);
        flush_acks(s, r);
        feed_give_back(s->fetch, rt, r, 1);
    }
}

void *kiq_processor_main(void *arg)
{
    kiq_slot_t *s = arg;
    kiq_runtime_t *rt = s->rt;
    char err[KIQ_ERRLEN];
    pthread_mutex_lock(&s->mu);
    snprintf(s->tid, sizeof(s->tid), "%s", kiq_log_tid());
    pthread_mutex_unlock(&s->mu);
    kiq_redis_t *r = kiq_redis_new(rt->cfg->redis_url, 15, err);
    if (!r)
        kiq_error("processor %d: %s", s->index, err);
    else
        loop(s, r);
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
    if (rt->feed && rt->nslots)
        n += feed_give_back(rt->slots[0].fetch, rt, r, 0);
    return n;
}

int kiq_processor_holds(kiq_runtime_t *rt, const char *payload, size_t len)
{
    int held = 0;
    for (int i = 0; i < rt->nslots && !held; i++) {
        kiq_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        held = s->busy && !s->abandoned && s->len == len && memcmp(s->payload, payload, len) == 0;
        pthread_mutex_unlock(&s->mu);
    }
    kiq_feed_t *fd = rt->feed;
    if (held || !fd)
        return held;
    pthread_mutex_lock(&fd->mu);
    for (size_t i = 0; i < fd->n && !held; i++) {
        const kiq_fetched_t *j = &fd->jobs[(fd->head + i) % fd->cap];
        held = j->len == len && memcmp(j->payload, payload, len) == 0;
    }
    held = held || (fd->suspect.payload && fd->suspect.len == len
                    && memcmp(fd->suspect.payload, payload, len) == 0);
    for (size_t i = 0; i < fd->nacks && !held; i++)
        held = fd->acks[i]->job.len == len && memcmp(fd->acks[i]->job.payload, payload, len) == 0;
    pthread_mutex_unlock(&fd->mu);
    return held;
}
