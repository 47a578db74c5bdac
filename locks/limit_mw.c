/* The "limit" server middleware, and "queue_limit", which keeps the caps
 * of a job's queue (locks/queue_limit.h) the same way.
 *
 * "limit" runs a job whose class has a limit (YAML
 * `limit:` or capstan_class_opts_t.limit, capstan/limiter.h) only within its rate
 * limiter, spending the job's "limiter_cost" or the class's cost.
 *
 * Over the limit, the job first waits in its processor, up to the limit's
 * wait_timeout: a concurrent waiter blocks on its own connection (one per
 * processor thread, made when first needed, so the processor's own never
 * blocks) until a release wakes it. Still over, the job neither runs nor
 * fails: it goes to the schedule set for when the limiter says a slot may
 * be free (a concurrent limiter only knows when the oldest lease lapses,
 * so its jobs back off from 0.5 s, doubling, up to that), counting its
 * reschedules in the payload's "limiter_reschedules". Past
 * max_limiter_reschedules it fails with Capstan::OverLimit and the retry
 * rules take over; a concurrent limit's reschedules do not count, as its
 * slots come back whenever its jobs end.
 *
 * A concurrent slot is a lease of lock_timeout, so that a killed process's
 * slots free themselves when their leases lapse. While the handler runs,
 * one thread per process (the extender, running only while some job holds
 * a slot) renews the lease every lock_timeout / 3 on its own connection.
 * That keeps a running job's slot only while the extender gets through:
 * a process frozen (SIGSTOP, a paused VM, a host stalled in swap) or cut
 * off from Redis for longer than lock_timeout loses its slots while its
 * jobs still run, other processes take them, and the limit is exceeded
 * until those jobs end. A lapsed lease cannot be renewed: the extender
 * stops trying and the job's release finds it gone. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/limiter.h"
#include "middleware/mw.h"
#include "support/log.h"
#include "support/payload.h"
#include "support/time.h"
#include "locks/limit_mw.h"
#include "locks/limiter_internal.h"
#include "locks/queue_limit.h"

/* A slot being held by a running job; lives on that job's stack. */
typedef struct hold {
    struct hold *next;
    capstan_limiter_t *lim;
    capstan_limit_token_t tok;
    const char *name;
    const char *url; /* the Redis of the limiter's state */
    double every, next_at; /* epoch s */
} hold_t;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hold_t *list;
    int running;
} ext = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0 };

/* A connection to one Redis, made when first needed: the extender's, and
 * each processor thread's (thread_conn). A sharded process's limiters live
 * in several Redis servers, so each keeps one a server. */
typedef struct conn {
    struct conn *next;
    capstan_redis_t *r;
    char url[];
} conn_t;

static void conns_free(void *list)
{
    for (conn_t *c = list, *next; c; c = next) {
        next = c->next;
        capstan_redis_free(c->r);
        free(c);
    }
}

/* The connection of *list to url, connected; NULL when none can be had
 * now. Its timeout outlasts the longest BLPOP of a waiter. */
static capstan_redis_t *conn_get(conn_t **list, const char *url)
{
    conn_t *c = *list;
    while (c && strcmp(c->url, url))
        c = c->next;
    if (!c) {
        char err[CAPSTAN_ERRLEN];
        size_t n = strlen(url) + 1;
        if (!(c = malloc(sizeof(*c) + n)))
            return NULL;
        memcpy(c->url, url, n);
        if (!(c->r = capstan_redis_new(url, 10, err))) {
            free(c);
            return NULL;
        }
        c->next = *list;
        *list = c;
    }
    return capstan_redis_ok(c->r) || capstan_redis_connect(c->r) == 0 ? c->r : NULL;
}

/* Renews due leases until no job holds a slot, then exits. The mutex is
 * held across each renewal so that a hold is never unlinked (and its stack
 * frame gone) while in use. */
static void *extender(void *arg)
{
    (void)arg;
    char err[CAPSTAN_ERRLEN];
    conn_t *conns = NULL;
    pthread_mutex_lock(&ext.mu);
    while (ext.list) {
        double now = capstan__now(), soonest = now + 60;
        for (hold_t *h = ext.list; h; h = h->next) {
            if (h->next_at <= now) {
                capstan_redis_t *r = conn_get(&conns, h->url);
                int rc = r ? capstan_limiter_extend(h->lim, r, &h->tok, err) : CAPSTAN_EREDIS;
                if (rc)
                    capstan_warn("limiter %s: could not extend the lease of %s: %s", h->name,
                                 h->tok.id, r ? err : "no connection");
                /* A lapsed lease cannot come back; a Redis error may pass. */
                h->next_at = rc == CAPSTAN_ENOTFOUND ? now + 86400 : now + h->every;
            }
            if (h->next_at < soonest)
                soonest = h->next_at;
        }
        double in = soonest - capstan__now();
        struct timespec ts = capstan__timespec(in > 0 ? in : 0);
        pthread_cond_timedwait(&ext.cv, &ext.mu, &ts);
    }
    ext.running = 0;
    pthread_mutex_unlock(&ext.mu);
    conns_free(conns);
    return NULL;
}

static void hold_start(hold_t *h)
{
    pthread_mutex_lock(&ext.mu);
    h->next = ext.list;
    ext.list = h;
    /* Its lease may be shorter than any the extender is waiting on. */
    pthread_cond_signal(&ext.cv);
    if (!ext.running) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, extender, NULL) == 0)
            ext.running = 1;
        else
            capstan_warn("limiter %s: no thread to extend leases; a job longer than its "
                         "lock_timeout loses its slot", h->name);
        pthread_attr_destroy(&a);
    }
    pthread_mutex_unlock(&ext.mu);
}

static void hold_end(hold_t *h)
{
    pthread_mutex_lock(&ext.mu);
    for (hold_t **p = &ext.list; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            break;
        }
    pthread_cond_signal(&ext.cv);
    pthread_mutex_unlock(&ext.mu);
}

/* ---- a processor thread's own connections ------------------------------ */

static pthread_key_t conns_key;
static pthread_once_t conns_once = PTHREAD_ONCE_INIT;
static int conns_key_ok;

static void conns_init(void)
{
    conns_key_ok = pthread_key_create(&conns_key, conns_free) == 0;
}

/* This thread's connection to url (freed when the thread ends), connected,
 * or NULL when none can be had now: a concurrent waiter blocks on it, so
 * that the processor's own never blocks, and a limiter homed in another
 * shard is used on it. */
static capstan_redis_t *thread_conn(const char *url)
{
    pthread_once(&conns_once, conns_init);
    if (!conns_key_ok)
        return NULL;
    conn_t *was = pthread_getspecific(conns_key), *list = was;
    capstan_redis_t *r = conn_get(&list, url);
    if (list != was && pthread_setspecific(conns_key, list)) {
        list->next = NULL; /* the new one alone: the others stay the key's */
        conns_free(list);
        return NULL;
    }
    return r;
}

/* The payload's integer field name, or 0 when absent or not > 0. */
static long job_count(capstan_job_t *job, const char *name)
{
    size_t len;
    const char *v = capstan_job_field_raw(job, name, &len);
    char buf[24];
    if (!v || len >= sizeof(buf))
        return 0;
    memcpy(buf, v, len);
    buf[len] = '\0';
    long n = strtol(buf, NULL, 10);
    return n > 0 ? n : 0;
}

/* The payload's own cost into *cost (0 when it gives none, or null).
 * Returns -1 when it gives one that is not an integer >= 1. */
static int job_cost(capstan_job_t *job, long *cost)
{
    size_t len;
    const char *v = capstan_job_field_raw(job, CAPSTAN_LIMIT_COST_FIELD, &len);
    *cost = 0;
    if (!v || (len == 4 && memcmp(v, "null", 4) == 0))
        return 0;
    char buf[24], *end;
    if (len == 0 || len >= sizeof(buf))
        return -1;
    memcpy(buf, v, len);
    buf[len] = '\0';
    long n = strtol(buf, &end, 10);
    if (*end || n < 1 || buf[0] == '-' || buf[0] == '+')
        return -1;
    *cost = n;
    return 0;
}

static int over_limit(capstan_mw_t *mw, const capstan_limit_opts_t *lo, const char *name, double in)
{
    capstan_job_t *job = mw->job;
    long n = job_count(job, "limiter_reschedules");
    /* The file's max_limiter_reschedules, even for a limit declared in C. */
    int max = mw->cc && mw->cc->has_max_limiter_reschedules ? mw->cc->max_limiter_reschedules
                                                            : lo->max_reschedules;
    /* Busy concurrent slots free as their jobs end: a job that found them
     * so waits its turn however long the backlog, rather than failing. */
    if (n >= max && lo->type != CAPSTAN_LIMIT_CONCURRENT) {
        capstan_job_fail(job, "Capstan::OverLimit",
                         "limiter %s stayed over its limit through %ld reschedules", name, n);
        return 0;
    }
    if (lo->type == CAPSTAN_LIMIT_CONCURRENT) {
        double backoff = 0.5 * (double)(1L << (n < 6 ? n : 6));
        if (in > backoff)
            in = backoff;
    }
    /* Spread the jobs a little so that they do not all come back at once. */
    in += capstan__rand() * (in < 1 ? in : 1) * 0.1;
    char count[24], *out = NULL;
    size_t len;
    snprintf(count, sizeof(count), "%ld", n + 1);
    capstan_field_t set[] = { { "limiter_reschedules", count, 0 } };
    size_t plen;
    const char *payload = capstan_mw_payload(mw, &plen);
    capstan_jobject_t obj = {0};
    int bad = capstan__json_scan_object(payload, plen, &obj, NULL) ||
              capstan__payload_edit(payload, &obj, set, 1, &out, &len);
    capstan__jobject_free(&obj);
    if (bad) /* no memory: leave it for recovery */
        return capstan_mw_dispose(mw, CAPSTAN_DISPOSE_KEEP, 0, NULL, 0);
    /* Routine under a backlog, so not at info: a busy limit would flood
     * the log with it. */
    if (lo->type == CAPSTAN_LIMIT_CONCURRENT)
        capstan_debug("%s %s: limiter %s is over its limit; rescheduled in %.2f s (%ld so far)",
                      mw->cls, mw->jid, name, in, n + 1);
    else
        capstan_debug("%s %s: limiter %s is over its limit; rescheduled in %.2f s (%ld of %d)",
                      mw->cls, mw->jid, name, in, n + 1, max);
    int rc = capstan_mw_dispose(mw, CAPSTAN_DISPOSE_SCHEDULE, capstan__now() + in, out, len);
    free(out);
    return rc;
}

/* What runs within a limit: the rest of the chain, or another limit. */
typedef struct inner {
    int (*fn)(capstan_mw_t *mw, const struct inner *in);
    capstan_limiter_t *const *lims; /* the caps still to take (within_caps) */
    int n;
} inner_t;

static int run_inner(capstan_mw_t *mw, const inner_t *in)
{
    return in ? in->fn(mw, in) : capstan_mw_next(mw);
}

/* Runs inner (NULL: the rest of the chain) within lim (of options lo, named
 * name, its state in the Redis at home, or NULL: the job's own), as tok's
 * holder when tok's id is set (a slot the fetch took), else a new one. */
static int within(capstan_mw_t *mw, capstan_limiter_t *lim, const capstan_limit_opts_t *lo,
                  const char *name, const char *home, capstan_limit_token_t *tok, const inner_t *inner)
{
    char err[CAPSTAN_ERRLEN];
    long cost = 0;
    if (lo->type == CAPSTAN_LIMIT_POINTS && job_cost(mw->job, &cost)) {
        /* Spending some other cost could break the limit the cost is for. */
        capstan_job_fail(mw->job, "Capstan::LimiterError", "limiter %s: %s must be an integer >= 1",
                         name, CAPSTAN_LIMIT_COST_FIELD);
        return 0;
    }
    double in = 0;
    /* The testing kit's limiters (capstan__limit_store) neither wait nor
     * need their leases extended. */
    int here = capstan__limit_store() != NULL;
    const char *url = home && !here ? home : mw->cfg->redis_url;
    /* At home elsewhere, the thread's connection there both waits and
     * takes; at the job's own Redis, the processor's connection takes. */
    capstan_redis_t *r = url == home ? thread_conn(home) : mw->r;
    if (!r) {
        capstan_job_fail(mw->job, "Capstan::LimiterError", "limiter %s: no connection to its home shard",
                         name);
        return 0;
    }
    capstan_redis_t *w = lo->type != CAPSTAN_LIMIT_CONCURRENT || lo->wait_timeout <= 0 || here ? NULL
                         : r == mw->r ? thread_conn(url) : r;
    int rc = capstan__limiter_acquire_wait(lim, r, w, cost ? cost : lo->cost, lo->wait_timeout,
                                           tok, &in, capstan__mw_waiting, mw, err);
    if (rc == CAPSTAN_EDENIED)
        return over_limit(mw, lo, name, in);
    if (rc < 0) {
        /* The name is in use with other parameters, the job's cost does
         * not fit, or Redis failed: the job cannot run within its limit,
         * so it fails and is retried. */
        capstan_job_fail(mw->job, rc == CAPSTAN_ECONFIG ? "Capstan::LimiterConfigError" : "Capstan::LimiterError",
                         "%s", err);
        return 0;
    }
    if (lo->type != CAPSTAN_LIMIT_CONCURRENT)
        return run_inner(mw, inner);
    double lease = lo->seconds > 0 ? lo->seconds : 30;
    hold_t h = { .lim = lim, .tok = *tok, .name = name, .url = url, .every = lease / 3,
                 .next_at = capstan__now() + lease / 3 };
    if (!here)
        hold_start(&h);
    rc = run_inner(mw, inner);
    if (!here)
        hold_end(&h);
    /* The connection home may have broken while the job ran (the job's
     * own shard failing does not touch it). */
    if (r != mw->r && !capstan_redis_ok(r))
        r = thread_conn(url);
    if (!r)
        capstan_warn("%s %s: limiter %s: no connection to its home shard; its slot frees when its "
                     "lease lapses", mw->cls, mw->jid, name);
    else if (capstan_limiter_release(lim, r, tok, err))
        capstan_warn("%s %s: limiter %s: %s", mw->cls, mw->jid, name, err);
    return rc;
}

int capstan__limit_mw(capstan_mw_t *mw, capstan__limit_home_fn home, void *ud)
{
    const capstan_limit_opts_t *lo = mw->limit;
    if (!lo || !lo->type)
        return capstan_mw_next(mw);
    char err[CAPSTAN_ERRLEN];
    const char *name = lo->name ? lo->name : mw->cc ? mw->cc->name : capstan_job_class(mw->job);
    capstan_limiter_t *lim = capstan_limiter_new(lo->type, name, lo->count, lo->seconds, err);
    if (!lim) {
        capstan_job_fail(mw->job, "Capstan::LimiterError", "%s", err);
        return 0;
    }
    capstan_limit_token_t tok = { { 0 } };
    int rc = within(mw, lim, lo, name, home ? home(ud, mw->cc, name) : NULL, &tok, NULL);
    capstan_limiter_free(lim);
    return rc;
}

/* ---- the caps of queues (locks/queue_limit.h) --------------------------- */

void capstan__qlimits_free(capstan__qlimits_t *q)
{
    if (!q)
        return;
    for (size_t i = 0; i < q->n; i++) {
        capstan_limiter_free(q->q[i].lim[0]);
        capstan_limiter_free(q->q[i].lim[1]);
    }
    free(q->q);
    free(q);
}

int capstan__qlimits_new(const capstan_config_t *cfg, capstan__qlimits_t **out, char *err)
{
    *out = NULL;
    size_t n = 0;
    for (size_t i = 0; i < cfg->nqueue_limits; i++)
        n += cfg->queue_limits[i].limit > 0 || cfg->queue_limits[i].process_limit > 0;
    if (!n)
        return 0;
    capstan__qlimits_t *q = calloc(1, sizeof(*q));
    if (!q || !(q->q = calloc(n, sizeof(*q->q)))) {
        free(q);
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    }
    /* A process's own cap is a name no other process uses. */
    char own[32], name[CAPSTAN_LIMIT_NAME_MAX + 1];
    capstan__random_hex(own, 4);
    for (size_t i = 0; i < cfg->nqueue_limits; i++) {
        const capstan_queue_limit_t *ql = &cfg->queue_limits[i];
        if (ql->limit <= 0 && ql->process_limit <= 0)
            continue;
        capstan__qlimit_t *e = &q->q[q->n++];
        e->queue = ql->queue;
        for (int k = 0; k < 2; k++) {
            int size = k ? ql->process_limit : ql->limit;
            if (size <= 0)
                continue;
            if (k)
                snprintf(name, sizeof(name), "queue:%s@%ld:%s", ql->queue, (long)getpid(), own);
            else
                snprintf(name, sizeof(name), "queue:%s", ql->queue);
            if (!(e->lim[k] = capstan_limiter_new(CAPSTAN_LIMIT_CONCURRENT, name, size,
                                                  CAPSTAN__QLIMIT_LEASE, err))) {
                capstan__qlimits_free(q);
                return CAPSTAN_EINVAL;
            }
        }
    }
    *out = q;
    return 0;
}

const capstan__qlimit_t *capstan__qlimits_find(const capstan__qlimits_t *q, const char *queue)
{
    for (size_t i = 0; q && queue && i < q->n; i++)
        if (!strcmp(q->q[i].queue, queue))
            return &q->q[i];
    return NULL;
}

/* Within in->lims[0..n) in turn (NULL: no cap), each as the job's
 * holder, then the rest of the chain. */
static int within_caps(capstan_mw_t *mw, const inner_t *in)
{
    if (in->n == 0)
        return capstan_mw_next(mw);
    const inner_t rest = { within_caps, in->lims + 1, in->n - 1 };
    capstan_limiter_t *lim = in->lims[0];
    if (!lim)
        return within_caps(mw, &rest);
    /* A cap's job waits in its processor only when the fetch did not take
     * its slot (the basic fetch, a lapsed lease): rarely, and as long as a
     * class's concurrent limit would. */
    static const capstan_limit_opts_t lo = { .type = CAPSTAN_LIMIT_CONCURRENT,
                                             .seconds = CAPSTAN__QLIMIT_LEASE,
                                             .wait_timeout = CAPSTAN_LIMIT_WAIT_DEFAULT,
                                             .count = 1, .cost = 1 };
    capstan_limit_token_t tok = { { 0 } };
    if (mw->jid && strlen(CAPSTAN__QLIMIT_HOLDER) + strlen(mw->jid) < sizeof(tok.id))
        snprintf(tok.id, sizeof(tok.id), "%s%s", CAPSTAN__QLIMIT_HOLDER, mw->jid);
    /* A queue's caps are its shard's, as the fetch takes them there. */
    return within(mw, lim, &lo, capstan__limiter_name(lim), NULL, &tok, &rest);
}

int capstan__queue_limit_mw(capstan_mw_t *mw, void *udata)
{
    const capstan__qlimit_t *q = capstan__qlimits_find(udata, mw->queue);
    if (!q)
        return capstan_mw_next(mw);
    const inner_t caps = { within_caps, q->lim, 2 };
    return within_caps(mw, &caps);
}
