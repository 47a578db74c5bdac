/* Queued (FIFO) locks: the client, the acquire loop, release, extend and
 * running a function under a lock. Each attempt is one Lua step
 * (lua/qlock_acquire.lua); between attempts a waiter sleeps retry_delay plus
 * jitter, as the gem does. Inspection and admin calls are in qlock_info.c. */
#include "capstan/qlock.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "locks/qlock_internal.h"
#include "redis/reply.h"
#include "redis/scripts.h"
#include "support/log.h"
#include "support/number.h"
#include "support/time.h"

#define EV_PREFIX "redis_queued_locks."
/* The gem's margin for the time between the server setting the expiry and
 * the client starting its clock; a timed function is abandoned this much
 * before the lease surely ends. */
#define TIMESHIFT_MARGIN 0.002

struct capstan_qlock_client {
    char identity[40];
    capstan_qlock_event_fn on_event;
    void *event_udata;
    capstan_qlock_log_fn on_log;
    void *log_udata;
    int log_lock_try;
};

/* Field names the gem keeps for itself, and capstan's token field. */
static const char *const reserved_meta[] = {
    "acq_id", "hst_id", "ts", "ini_ttl", "lock_key", "rem_ttl", "spc_cnt", "spc_ext_ttl",
    "l_spc_ext_ini_ttl", "l_spc_ext_ts", "l_spc_ts", "capstan_fence", NULL,
};

capstan_qlock_opts_t capstan_qlock_opts_default(void)
{
    capstan_qlock_opts_t o = {
        .ttl = 5000, .queue_ttl = 15, .timeout = 10, .retry_count = 3,
        .retry_delay = 200, .retry_jitter = 25,
    };
    return o;
}

const char *capstan_qlock_status_name(capstan_qlock_status_t s)
{
    switch (s) {
    case CAPSTAN_QLOCK_OBTAINED: return "obtained";
    case CAPSTAN_QLOCK_TIMEOUT: return "timeout_reached";
    case CAPSTAN_QLOCK_RETRY_LIMIT: return "retry_limit_reached";
    case CAPSTAN_QLOCK_FAIL_FAST_NO_TRY: return "fail_fast_no_try";
    case CAPSTAN_QLOCK_FAIL_FAST_AFTER_TRY: return "fail_fast_after_try";
    }
    return "unknown";
}

int capstan__qlock_keys(const char *name, ql_keys_t *k, char *err)
{
    if (!name || !*name)
        return capstan_seterr(err, CAPSTAN_EINVAL, "a lock needs a name");
    if (strlen(name) > CAPSTAN_QLOCK_NAME_MAX)
        return capstan_seterr(err, CAPSTAN_EINVAL, "lock name longer than %d bytes", CAPSTAN_QLOCK_NAME_MAX);
    snprintf(k->lock, sizeof(k->lock), CAPSTAN_KEY_QLOCK "%s", name);
    snprintf(k->queue, sizeof(k->queue), CAPSTAN_KEY_QLOCK_QUEUE "%s", name);
    snprintf(k->seen, sizeof(k->seen), CAPSTAN_KEY_QLOCK_SEEN "%s", name);
    snprintf(k->fence, sizeof(k->fence), CAPSTAN_KEY_QLOCK_FENCE "%s", name);
    return 0;
}

capstan_qlock_client_t *capstan_qlock_client_new(const char *identity, char *err)
{
    capstan_qlock_client_t *c = calloc(1, sizeof(*c));
    if (!c) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    if (identity) {
        if (!*identity || strlen(identity) >= sizeof(c->identity) || strchr(identity, '/')) {
            capstan_seterr(err, CAPSTAN_EINVAL, "identity must be 1-39 bytes without '/'");
            free(c);
            return NULL;
        }
        snprintf(c->identity, sizeof(c->identity), "%s", identity);
    } else {
        /* 8 random bytes in hex, as the gem's SecureRandom.hex(8): keeps two
         * hosts whose pids and thread ids collide apart. */
        capstan__random_hex(c->identity, 8);
    }
    return c;
}

void capstan_qlock_client_free(capstan_qlock_client_t *c)
{
    free(c);
}

void capstan_qlock_client_on_event(capstan_qlock_client_t *c, capstan_qlock_event_fn fn, void *udata)
{
    c->on_event = fn;
    c->event_udata = udata;
}

void capstan_qlock_client_on_log(capstan_qlock_client_t *c, capstan_qlock_log_fn fn, void *udata, int log_lock_try)
{
    c->on_log = fn;
    c->log_udata = udata;
    c->log_lock_try = log_lock_try;
}

static long thread_id(void)
{
    return (long)syscall(SYS_gettid);
}

void capstan_qlock_acq_id(const capstan_qlock_client_t *c, char *out)
{
    snprintf(out, CAPSTAN_QLOCK_ID_MAX, CAPSTAN_QLOCK_ACQ_ID "%d/%ld/0/0/%s", (int)getpid(), thread_id(),
             c->identity);
}

void capstan_qlock_hst_id(const capstan_qlock_client_t *c, char *out)
{
    snprintf(out, CAPSTAN_QLOCK_ID_MAX, CAPSTAN_QLOCK_HST_ID "%d/%ld/0/%s", (int)getpid(), thread_id(),
             c->identity);
}

static void ql_log(const capstan_qlock_client_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void ql_log(const capstan_qlock_client_t *c, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (c && c->on_log)
        c->on_log(line, c->log_udata);
    else
        capstan_debug("[redis_queued_locks] %s", line);
}

void capstan__qlock_emit(const capstan_qlock_client_t *c, capstan_qlock_event_t *ev)
{
    if (c && c->on_event)
        c->on_event(ev, c->event_udata);
}

static void emit_held(const capstan_qlock_client_t *c, const char *event, const capstan_qlock_result_t *res,
                      const char *instrument, double hold_time)
{
    capstan_qlock_event_t ev = {
        .name = event, .lock_key = res->lock_key, .acq_id = res->acq_id, .hst_id = res->hst_id,
        .ts = res->ts, .ttl = res->ttl, .fence = res->fence, .acq_time = res->acq_time,
        .hold_time = hold_time, .instrument = instrument,
    };
    capstan__qlock_emit(c, &ev);
}

static int check_opts(const capstan_qlock_opts_t *o, size_t *nmeta, char *err)
{
    if (o->ttl <= 0)
        return capstan_seterr(err, CAPSTAN_EINVAL, "ttl must be a positive number of ms");
    if (!(o->queue_ttl > 0))
        return capstan_seterr(err, CAPSTAN_EINVAL, "queue_ttl must be a positive number of seconds");
    if (o->retry_delay < 0 || o->retry_jitter < 0)
        return capstan_seterr(err, CAPSTAN_EINVAL, "retry_delay and retry_jitter must not be negative");
    if (o->timeout < 0 && o->timeout != CAPSTAN_QLOCK_UNLIMITED)
        return capstan_seterr(err, CAPSTAN_EINVAL, "timeout must be >= 0 or CAPSTAN_QLOCK_UNLIMITED");
    size_t n = 0;
    for (; o->meta && o->meta[n]; n++) {
        if (n % 2)
            continue;
        for (size_t k = 0; reserved_meta[k]; k++)
            if (strcmp(o->meta[n], reserved_meta[k]) == 0)
                return capstan_seterr(err, CAPSTAN_EINVAL, "meta: \"%s\" is a reserved field", o->meta[n]);
    }
    if (n % 2)
        return capstan_seterr(err, CAPSTAN_EINVAL, "meta: field \"%s\" has no value", o->meta[n - 1]);
    *nmeta = n;
    return 0;
}

/* Leaves the queue after giving up, so nobody behind waits for us. */
static void dequeue(capstan_qlock_client_t *c, capstan_redis_t *r, const ql_keys_t *k, const char *me)
{
    const char *zrem[] = { "ZREM", k->queue, me };
    const char *hdel[] = { "HDEL", k->seen, me };
    freeReplyObject(capstan_redis_cmd(r, 3, zrem, NULL));
    freeReplyObject(capstan_redis_cmd(r, 3, hdel, NULL));
    ql_log(c, "fail_fast_or_limits_reached__dequeue lock_key=%s queue_key=%s acq_id=%s",
           k->lock, k->queue, me);
}

/* One capstan_qlock_lock call. */
typedef struct acquire {
    capstan_qlock_client_t *c;
    capstan_redis_t *r;
    capstan_qlock_opts_t o;
    capstan_qlock_result_t *res;
    ql_keys_t k;
    char ttl[32], queue_ttl[32];
    const char **argv; /* qlock_acquire.lua's keys, then its arguments */
    int argc;
    double start, deadline;
    int max_tries;     /* 0: unlimited */
    int queued;        /* in the queue: leave it when giving up */
} acquire_t;

/* What attempt() answers when the lock is held or someone is first. */
enum { IN_LINE = 1 };

/* Checks the options, fills res's identity and builds the script's
 * arguments. */
static int acquire_init(acquire_t *a, const char *name, char *err)
{
    capstan_qlock_result_t *res = a->res;
    size_t nmeta = 0;
    int rc;
    memset(res, 0, sizeof(*res));
    if ((rc = capstan__qlock_keys(name, &a->k, err)) || (rc = check_opts(&a->o, &nmeta, err)))
        return rc;
    snprintf(res->name, sizeof(res->name), "%s", name);
    snprintf(res->lock_key, sizeof(res->lock_key), "%s", a->k.lock);
    capstan_qlock_acq_id(a->c, res->acq_id);
    capstan_qlock_hst_id(a->c, res->hst_id);
    res->ttl = a->o.ttl;

    snprintf(a->ttl, sizeof(a->ttl), "%lld", a->o.ttl);
    snprintf(a->queue_ttl, sizeof(a->queue_ttl), "%lld", (long long)capstan__ceil(a->o.queue_ttl * 1000));
    a->argc = 10 + (int)nmeta;
    if (!(a->argv = malloc((size_t)a->argc * sizeof(*a->argv))))
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    a->argv[0] = a->k.lock;
    a->argv[1] = a->k.queue;
    a->argv[2] = a->k.seen;
    a->argv[3] = a->k.fence;
    a->argv[4] = res->acq_id;
    a->argv[5] = res->hst_id;
    a->argv[6] = a->ttl;
    a->argv[7] = a->queue_ttl;
    a->argv[8] = "0"; /* "1" once we have a place in the queue */
    a->argv[9] = a->o.fail_fast ? "1" : "0";
    for (size_t i = 0; i < nmeta; i++)
        a->argv[10 + i] = a->o.meta[i];

    a->start = capstan__mono();
    a->deadline = a->o.timeout == CAPSTAN_QLOCK_UNLIMITED ? INFINITY : a->start + a->o.timeout;
    a->max_tries = a->o.retry_count == CAPSTAN_QLOCK_UNLIMITED
                       ? 0 : (a->o.retry_count < 1 ? 1 : a->o.retry_count);
    return 0;
}

/* The lock is ours: fills res from the script's reply and tells the
 * client. t0 is when the attempt started, which bounds the lease. */
static void obtained(acquire_t *a, const redisReply *rep, double t0)
{
    capstan_qlock_result_t *res = a->res;
    double now = capstan__mono();
    res->status = CAPSTAN_QLOCK_OBTAINED;
    res->fence = rep->element[1]->integer;
    res->ts = atof(rep->element[2]->str);
    res->requested_at = atof(rep->element[3]->str);
    res->deadline = t0 + (double)a->o.ttl / 1000.0;
    res->acquired = now;
    res->acq_time = (now - a->start) * 1000.0;
    a->queued = 0;
    ql_log(a->c, "lock_obtained lock_key=%s acq_id=%s fence=%lld acq_time=%.3f", a->k.lock,
           res->acq_id, res->fence, res->acq_time);
    emit_held(a->c, EV_PREFIX "lock_obtained", res, a->o.instrument, 0);
}

/* Not obtained, and now in the queue (st is the script's status). */
static void in_line(acquire_t *a, const char *st, const redisReply *rep)
{
    a->queued = 1;
    a->argv[8] = "1";
    if (strcmp(st, "requeued") == 0)
        ql_log(a->c, "dead_score_reached__reset_acquirer_position lock_key=%s acq_id=%s",
               a->k.lock, a->res->acq_id);
    if (a->c->log_lock_try && rep->elements >= 3)
        ql_log(a->c, "try_lock.%s lock_key=%s acq_id=%s other=%s rank=%lld try=%d", st, a->k.lock,
               a->res->acq_id,
               rep->element[1]->type == REDIS_REPLY_STRING ? rep->element[1]->str : "",
               rep->element[2]->integer, a->res->tries);
}

/* One step of lua/qlock_acquire.lua. Returns 0 (obtained), IN_LINE, or a
 * CAPSTAN_E* code with err filled (CAPSTAN_EDENIED: held and fail_fast). */
static int attempt(acquire_t *a, char *err)
{
    double t0 = capstan__mono();
    redisReply *rep = capstan__redis_script(a->r, CAPSTAN_SCRIPT_QLOCK_ACQUIRE, 4, a->argc, a->argv, NULL);
    int rc = IN_LINE;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING) {
        rc = capstan__reply_error(a->r, rep, "queued lock attempt", err);
        freeReplyObject(rep);
        return rc;
    }
    a->res->tries++;
    const char *st = rep->element[0]->str;
    if (strcmp(st, "ok") == 0 && rep->elements >= 4) {
        obtained(a, rep, t0);
        rc = 0;
    } else if (strcmp(st, "fail_fast_no_try") == 0) {
        a->res->status = CAPSTAN_QLOCK_FAIL_FAST_NO_TRY;
        rc = capstan_seterr(err, CAPSTAN_EDENIED, "%s is held by %s (fail_fast)", a->k.lock,
                            rep->element[1]->str);
    } else {
        in_line(a, st, rep);
    }
    freeReplyObject(rep);
    return rc;
}

/* After an attempt that left us in line: gives up with CAPSTAN_EDENIED when
 * fail_fast, the retry limit or the timeout says so, else sleeps the
 * retry delay plus jitter and returns 0 for the next attempt. */
static int wait_turn(acquire_t *a, char *err)
{
    capstan_qlock_result_t *res = a->res;
    if (a->o.fail_fast) {
        res->status = CAPSTAN_QLOCK_FAIL_FAST_AFTER_TRY;
        return capstan_seterr(err, CAPSTAN_EDENIED, "%s: not first in line or held (fail_fast)",
                              a->k.lock);
    }
    if (a->max_tries && res->tries >= a->max_tries) {
        res->status = CAPSTAN_QLOCK_RETRY_LIMIT;
        return capstan_seterr(err, CAPSTAN_EDENIED, "%s: not obtained in %d attempts", a->k.lock,
                              res->tries);
    }
    double delay =
        ((double)a->o.retry_delay + capstan__floor(capstan__rand() * (double)a->o.retry_jitter)) / 1000.0;
    double now = capstan__mono();
    if (now + delay >= a->deadline) {
        capstan__sleep(a->deadline - now);
        res->status = CAPSTAN_QLOCK_TIMEOUT;
        return capstan_seterr(err, CAPSTAN_EDENIED, "%s: not obtained within %g s", a->k.lock,
                              a->o.timeout);
    }
    capstan__sleep(delay);
    return 0;
}

int capstan_qlock_lock(capstan_qlock_client_t *c, capstan_redis_t *r, const char *name,
                       const capstan_qlock_opts_t *opts, capstan_qlock_result_t *res, char *err)
{
    acquire_t a = { .c = c, .r = r, .o = opts ? *opts : capstan_qlock_opts_default(), .res = res };
    int rc = acquire_init(&a, name, err);
    if (rc)
        return rc;
    ql_log(c, "start_lock_obtaining lock_key=%s queue_ttl=%g acq_id=%s hst_id=%s", a.k.lock,
           a.o.queue_ttl, res->acq_id, res->hst_id);
    while ((rc = attempt(&a, err)) == IN_LINE && (rc = wait_turn(&a, err)) == 0)
        ;
    if (rc && a.queued)
        dequeue(c, r, &a.k, res->acq_id);
    if (rc == CAPSTAN_EDENIED)
        res->acq_time = (capstan__mono() - a.start) * 1000.0;
    free(a.argv);
    return rc;
}

static int owner_call(capstan_redis_t *r, capstan_script_t s, const capstan_qlock_result_t *res,
                      const char *ms, const char *mode, long long *out, char *err)
{
    char fence[32];
    snprintf(fence, sizeof(fence), "%lld", res->fence);
    const char *argv[] = { res->lock_key, res->acq_id, fence, ms, mode };
    int argc = s == CAPSTAN_SCRIPT_QLOCK_EXTEND ? 5 : 3;
    redisReply *rep = capstan__redis_script(r, s, 1, argc, argv, NULL);
    int rc = 0;
    if (!rep || rep->type != REDIS_REPLY_INTEGER)
        rc = capstan__reply_error(r, rep, s == CAPSTAN_SCRIPT_QLOCK_EXTEND ? "extend" : "release", err);
    else
        *out = rep->integer;
    freeReplyObject(rep);
    return rc;
}

int capstan_qlock_release(capstan_qlock_client_t *c, capstan_redis_t *r, const capstan_qlock_result_t *res, char *err)
{
    long long released = 0;
    int rc = owner_call(r, CAPSTAN_SCRIPT_QLOCK_RELEASE, res, NULL, NULL, &released, err);
    if (rc)
        return rc;
    if (!released) {
        ql_log(c, "expire_lock.not_owner lock_key=%s acq_id=%s fence=%lld", res->lock_key,
               res->acq_id, res->fence);
        return capstan_seterr(err, CAPSTAN_EDENIED, "%s: no longer held by %s (its ttl ended)",
                              res->lock_key, res->acq_id);
    }
    ql_log(c, "expire_lock lock_key=%s acq_id=%s fence=%lld", res->lock_key, res->acq_id, res->fence);
    emit_held(c, EV_PREFIX "lock_hold_and_release", res, NULL, (capstan__mono() - res->acquired) * 1000.0);
    return 0;
}

int capstan_qlock_extend(capstan_redis_t *r, capstan_qlock_result_t *res, long long ms, int refresh,
                         long long *pttl, char *err)
{
    if (ms <= 0)
        return capstan_seterr(err, CAPSTAN_EINVAL, "extend: ms must be positive");
    char ms_s[32];
    snprintf(ms_s, sizeof(ms_s), "%lld", ms);
    long long left = 0;
    double t0 = capstan__mono();
    int rc = owner_call(r, CAPSTAN_SCRIPT_QLOCK_EXTEND, res, ms_s, refresh ? "set" : "add", &left, err);
    if (rc)
        return rc;
    if (left <= 0)
        return capstan_seterr(err, CAPSTAN_EDENIED, "%s: no longer held by %s (its ttl ended)",
                              res->lock_key, res->acq_id);
    res->deadline = t0 + (double)left / 1000.0;
    if (pttl)
        *pttl = left;
    return 0;
}

/* A function running under a timed lock on its own thread. Whoever of the
 * caller and the thread finishes last frees it, so the caller can stop
 * waiting without leaving the thread a dangling pointer. */
struct timed_call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done, rc;
    capstan_qlock_fn fn;
    void *udata;
    capstan_qlock_result_t res; /* a copy: the caller's may be gone */
};

static void timed_unref(struct timed_call *tc)
{
    pthread_mutex_lock(&tc->mu);
    int last = --tc->refs == 0;
    pthread_mutex_unlock(&tc->mu);
    if (last) {
        pthread_cond_destroy(&tc->cv);
        pthread_mutex_destroy(&tc->mu);
        free(tc);
    }
}

static void *timed_main(void *arg)
{
    struct timed_call *tc = arg;
    int v = tc->fn(&tc->res, tc->udata);
    pthread_mutex_lock(&tc->mu);
    tc->rc = v;
    tc->done = 1;
    pthread_cond_signal(&tc->cv);
    pthread_mutex_unlock(&tc->mu);
    timed_unref(tc);
    return NULL;
}

/* Runs fn on a thread and waits for it until the lease's end. Returns 0
 * with *v set, CAPSTAN_EJOB when it overran, CAPSTAN_ESYS/ENOMEM on setup failure. */
static int run_timed(capstan_qlock_fn fn, void *udata, const capstan_qlock_result_t *res, int *v, char *err)
{
    struct timed_call *tc = calloc(1, sizeof(*tc));
    if (!tc)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&tc->mu, NULL);
    pthread_cond_init(&tc->cv, &ca);
    pthread_condattr_destroy(&ca);
    tc->refs = 2;
    tc->fn = fn;
    tc->udata = udata;
    tc->res = *res;

    pthread_t th;
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&th, &ta, timed_main, tc);
    pthread_attr_destroy(&ta);
    if (e) {
        tc->refs = 1;
        timed_unref(tc);
        return capstan_seterr(err, CAPSTAN_ESYS, "timed lock: cannot start a thread: %s", strerror(e));
    }
    double until = res->deadline - TIMESHIFT_MARGIN;
    struct timespec ts = capstan__timespec(until);
    pthread_mutex_lock(&tc->mu);
    while (!tc->done && pthread_cond_timedwait(&tc->cv, &tc->mu, &ts) != ETIMEDOUT)
        ;
    int done = tc->done;
    *v = tc->rc;
    pthread_mutex_unlock(&tc->mu);
    timed_unref(tc);
    if (!done)
        return capstan_seterr(err, CAPSTAN_EJOB, "%s: the function was still running when the lock's ttl "
                              "(%lld ms) ended", res->lock_key, res->ttl);
    return 0;
}

int capstan_qlock_run(capstan_qlock_client_t *c, capstan_redis_t *r, const char *name,
                      const capstan_qlock_opts_t *opts, capstan_qlock_fn fn, void *udata,
                      capstan_qlock_result_t *res, int *fn_rc, char *err)
{
    if (!fn)
        return capstan_seterr(err, CAPSTAN_EINVAL, "capstan_qlock_run needs a function");
    int rc = capstan_qlock_lock(c, r, name, opts, res, err);
    if (rc)
        return rc;
    int v = 0;
    if (opts && opts->timed)
        rc = run_timed(fn, udata, res, &v, err);
    else
        v = fn(res, udata);
    if (fn_rc)
        *fn_rc = v;
    /* Released whatever happened to fn; the owner check makes this safe
     * even when the lease has passed to someone else meanwhile. */
    char rerr[CAPSTAN_ERRLEN];
    int rel = capstan_qlock_release(c, r, res, rerr);
    if (rel == CAPSTAN_EDENIED)
        res->lost = 1;
    if (!rc && rel && rel != CAPSTAN_EDENIED) {
        if (err)
            snprintf(err, CAPSTAN_ERRLEN, "%s", rerr);
        rc = rel;
    }
    return rc;
}
