/* The testing kit (capstan/testing.h): a runtime whose jobs run through
 * production's server chain on the caller's thread
 * (capstan__server_run_bare), with the state Redis would hold kept here
 * instead: uniqueness locks (unique/internal.h's lock store), limiters
 * (locks/limiter_internal.h's limit store), pushed jobs (client/txn.h's
 * push sink) and iteration state (job/job.h's sandbox). */
#include "capstan/testing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/txn.h"
#include "job/job.h"
#include "locks/limiter_internal.h"
#include "middleware/mw.h"
#include "middleware/outcome.h"
#include "redis/keys.h"
#include "support/time.h"
#include "runtime/rt.h"
#include "unique/internal.h"

/* One holder of one lock key ("<digest>[:RUN]:LOCKED"). */
typedef struct hold {
    char *key, *jid;
    capstan_lock_type_t type;
} hold_t;

typedef struct pushed {
    char *payload, *queue;
    size_t len;
    double at;
    int ran;
    capstan_dispose_t fate;
} pushed_t;

/* A limiter's use: a concurrent slot's holder, or (holder NULL) what a
 * rate limiter spent in its period since "since". */
typedef struct spent {
    char *name, *holder;
    long points;
    double since;
} spent_t;

typedef struct iter_state {
    char *jid;
    json_t *cursor;
    long executions;
    int cancelled;
} iter_state_t;

/* The outcome of one run. */
typedef struct result {
    capstan_dispose_t fate;
    int ran, ok;
    const char *skipped; /* static */
    char *jid, *err_class, *err_msg, *payload, *queue, *redis_error;
    size_t len;
    char **backtrace;
    size_t nbacktrace;
    double at;
} result_t;

struct capstan_test {
    capstan_runtime_t *rt;
    capstan_redis_t *r; /* never connected: what the middleware get */
    redisContext *user_redis;
    char err[CAPSTAN_ERRLEN];
    result_t last;
    char *redis_error; /* of the run under way */
    int in_death;      /* death hooks run: capstan_job_redis is NULL there by design */
    hold_t *holds;
    size_t nholds;
    pushed_t *pushed;
    size_t npushed;
    int inline_runs;
    iter_state_t *iters;
    size_t niters;
    long interrupt_at, checkpoints;
    char *cursor_text;
    spent_t *spent;
    size_t nspent;
    capstan_lock_store_t store;
    capstan_limit_store_t limits;
    capstan_push_sink_t sink;
    capstan_sandbox_t sandbox;
    int depth;                /* runs under way (inline ones nest) */
    struct wrapped *wrapped;  /* the handlers as registered, during runs */
    int called;               /* the handler of the run under way was called */
    int standing;             /* a test client was made: the stand-ins stay on
                                 this thread until capstan_test_free */
};

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* ---- locks ----------------------------------------------------------- */

static void lock_key(char *out, size_t n, const char *digest, int runtime)
{
    snprintf(out, n, "%s%s%s", digest, runtime ? CAPSTAN_KEY_RUN : "", CAPSTAN_KEY_LOCKED);
}

static int store_lock(void *ud, const capstan_lock_req_t *q)
{
    capstan_test_t *t = ud;
    char key[CAPSTAN_DIGEST_MAX + 16];
    lock_key(key, sizeof(key), q->digest, q->runtime);
    size_t others = 0;
    for (size_t i = 0; i < t->nholds; i++)
        if (strcmp(t->holds[i].key, key) == 0) {
            if (strcmp(t->holds[i].jid, q->jid) == 0)
                return CAPSTAN_LOCK_REENTERED;
            others++;
        }
    if (others >= (size_t)(q->limit > 1 ? q->limit : 1))
        return CAPSTAN_EDENIED;
    hold_t *h = realloc(t->holds, (t->nholds + 1) * sizeof(*h));
    if (!h)
        return CAPSTAN_ENOMEM;
    t->holds = h;
    h = &t->holds[t->nholds];
    h->key = strdup(key);
    h->jid = strdup(q->jid);
    h->type = q->type;
    if (!h->key || !h->jid) {
        free(h->key);
        free(h->jid);
        return CAPSTAN_ENOMEM;
    }
    t->nholds++;
    return CAPSTAN_LOCK_ACQUIRED;
}

/* Drops jid's hold on key; force: until_expired's too. Returns as
 * capstan_unique_unlock. */
static int drop_hold(capstan_test_t *t, const char *key, const char *jid, int force)
{
    int others = 0;
    for (size_t i = 0; i < t->nholds; i++) {
        hold_t *h = &t->holds[i];
        if (strcmp(h->key, key) != 0)
            continue;
        if (strcmp(h->jid, jid) != 0) {
            others = 1;
            continue;
        }
        if (h->type == CAPSTAN_LOCK_UNTIL_EXPIRED && !force)
            return 0; /* v9: it stays until its ttl */
        free(h->key);
        free(h->jid);
        t->holds[i] = t->holds[--t->nholds];
        return 0;
    }
    return others ? CAPSTAN_EDENIED : 0;
}

static int store_unlock(void *ud, const char *digest, int runtime, const char *jid, capstan_lock_type_t type,
                        int force)
{
    (void)type;
    char key[CAPSTAN_DIGEST_MAX + 16];
    lock_key(key, sizeof(key), digest, runtime);
    return drop_hold(ud, key, jid, force);
}

/* ---- limiters -------------------------------------------------------- */

static spent_t *spent_add(capstan_test_t *t, const char *name, const char *holder)
{
    spent_t *u = realloc(t->spent, (t->nspent + 1) * sizeof(*u));
    if (!u)
        return NULL;
    t->spent = u;
    u = &t->spent[t->nspent];
    *u = (spent_t){ .name = strdup(name), .holder = holder ? strdup(holder) : NULL, .since = capstan__now() };
    if (!u->name || (holder && !u->holder)) {
        free(u->name);
        free(u->holder);
        return NULL;
    }
    t->nspent++;
    return u;
}

static spent_t *rate_of(capstan_test_t *t, const char *name)
{
    for (size_t i = 0; i < t->nspent; i++)
        if (!t->spent[i].holder && strcmp(t->spent[i].name, name) == 0)
            return &t->spent[i];
    return spent_add(t, name, NULL);
}

/* A concurrent limit counts the jobs holding a slot; the others the points
 * spent in the current period of ms, a new period starting once it has
 * passed (a bucket's steady refill comes as whole periods). */
static int limit_attempt(void *ud, const char *name, capstan_limit_type_t type, long count, long long ms,
                         const char *holder, long points, long long *wait_ms)
{
    capstan_test_t *t = ud;
    if (type == CAPSTAN_LIMIT_CONCURRENT) {
        long n = 0;
        for (size_t i = 0; i < t->nspent; i++)
            n += t->spent[i].holder && strcmp(t->spent[i].name, name) == 0;
        if (n < count)
            return spent_add(t, name, holder) ? 1 : CAPSTAN_ENOMEM;
        *wait_ms = ms;
        return 0;
    }
    spent_t *u = rate_of(t, name);
    if (!u)
        return CAPSTAN_ENOMEM;
    double now = capstan__now(), period = (double)ms / 1000;
    if (now - u->since >= period) {
        u->since = now;
        u->points = 0;
    }
    if (u->points + points <= count) {
        u->points += points;
        return 1;
    }
    long long left = (long long)((u->since + period - now) * 1000);
    *wait_ms = left > 0 ? left : 1;
    return 0;
}

static void limit_release(void *ud, const char *name, const char *holder)
{
    capstan_test_t *t = ud;
    for (size_t i = 0; i < t->nspent; i++)
        if (t->spent[i].holder && strcmp(t->spent[i].holder, holder) == 0 && strcmp(t->spent[i].name, name) == 0) {
            free(t->spent[i].name);
            free(t->spent[i].holder);
            t->spent[i] = t->spent[--t->nspent];
            return;
        }
}

int capstan_test_limit_take(capstan_test_t *t, const char *name, long n)
{
    if (!name || n < 1)
        return capstan_seterr(t->err, CAPSTAN_EINVAL, "capstan_test_limit_take: a name and n >= 1");
    char holder[64];
    spent_t *u = rate_of(t, name);
    if (!u)
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    u->points += n;
    for (long i = 0; i < n; i++) {
        snprintf(holder, sizeof(holder), "capstan_test_limit_take:%ld", i);
        if (!spent_add(t, name, holder))
            return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    }
    return 0;
}

/* ---- pushes ---------------------------------------------------------- */

static int sink_take(void *ud, const char *payload, size_t len, const char *queue, double at)
{
    capstan_test_t *t = ud;
    pushed_t *p = realloc(t->pushed, (t->npushed + 1) * sizeof(*p));
    if (!p)
        return CAPSTAN_ENOMEM;
    t->pushed = p;
    p = &t->pushed[t->npushed];
    *p = (pushed_t){ .payload = malloc(len + 1), .queue = strdup(queue), .len = len, .at = at };
    if (!p->payload || !p->queue) {
        free(p->payload);
        free(p->queue);
        return CAPSTAN_ENOMEM;
    }
    memcpy(p->payload, payload, len);
    p->payload[len] = '\0';
    size_t i = t->npushed++;
    if (!t->inline_runs)
        return 0;
    /* Inline: run it now; the outcome of the job that pushed stays the
     * last run's. */
    result_t outer = t->last;
    char *outer_redis = t->redis_error;
    t->last = (result_t){0};
    t->redis_error = NULL;
    t->pushed[i].ran = 1;
    /* Copied as the run starts, before its handler may push (and move
     * t->pushed). */
    int rc = capstan_test_run_json(t, t->pushed[i].payload, t->pushed[i].queue);
    t->pushed[i].fate = t->last.fate;
    result_t inner = t->last;
    t->last = outer;
    free(t->redis_error);
    t->redis_error = outer_redis;
    free(inner.jid);
    free(inner.err_class);
    free(inner.err_msg);
    free(inner.payload);
    free(inner.queue);
    free(inner.redis_error);
    for (size_t k = 0; k < inner.nbacktrace; k++)
        free(inner.backtrace[k]);
    free(inner.backtrace);
    return rc < 0 && rc != CAPSTAN_ENOTFOUND ? rc : 0;
}

/* ---- iteration state ------------------------------------------------- */

static iter_state_t *iter_find(const capstan_test_t *t, const char *jid)
{
    for (size_t i = 0; i < t->niters; i++)
        if (strcmp(t->iters[i].jid, jid) == 0)
            return &t->iters[i];
    return NULL;
}

static iter_state_t *iter_get(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = iter_find(t, jid);
    if (s)
        return s;
    s = realloc(t->iters, (t->niters + 1) * sizeof(*s));
    if (!s)
        return NULL;
    t->iters = s;
    s = &t->iters[t->niters];
    *s = (iter_state_t){ .jid = strdup(jid) };
    if (!s->jid)
        return NULL;
    t->niters++;
    return s;
}

static void iter_remove(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = iter_find(t, jid);
    if (!s)
        return;
    free(s->jid);
    json_decref(s->cursor);
    *s = t->iters[--t->niters];
}

static void sb_iter_read(void *ud, const char *jid, json_t **cursor, long *executions, int *cancelled)
{
    capstan_test_t *t = ud;
    iter_state_t *s = iter_find(t, jid);
    t->checkpoints = 0;
    if (!s)
        return;
    *cursor = s->cursor ? json_deep_copy(s->cursor) : NULL;
    *executions = s->executions;
    *cancelled = s->cancelled;
}

static void sb_iter_write(void *ud, const char *jid, const json_t *cursor, long executions)
{
    iter_state_t *s = iter_get(ud, jid);
    if (!s)
        return;
    json_decref(s->cursor);
    s->cursor = cursor ? json_deep_copy(cursor) : NULL;
    s->executions = executions;
}

static void sb_iter_drop(void *ud, const char *jid)
{
    iter_remove(ud, jid);
}

static int sb_iter_stop(void *ud, const char *jid)
{
    (void)jid;
    capstan_test_t *t = ud;
    return t->interrupt_at > 0 && ++t->checkpoints >= t->interrupt_at;
}

static void sb_no_redis(void *ud, const capstan_job_t *job)
{
    capstan_test_t *t = ud;
    if (t->redis_error || t->in_death)
        return;
    char why[CAPSTAN_ERRLEN];
    snprintf(why, sizeof(why), "capstan_job_redis: the testing kit has no Redis connection (give one "
             "with capstan_test_set_redis); %s %s", job->cls, job->jid);
    t->redis_error = strdup(why);
}

/* ---- the kit --------------------------------------------------------- */

capstan_test_t *capstan_test_new(void)
{
    capstan_test_t *t = calloc(1, sizeof(*t));
    capstan_config_t *cfg = t ? capstan_config_new() : NULL;
    char err[CAPSTAN_ERRLEN];
    if (!cfg) {
        free(t);
        return NULL;
    }
    if (!(t->rt = capstan_runtime_new(cfg, err)))
        capstan_config_free(cfg); /* out of memory: not taken */
    /* A URL parsed, never connected: middleware commands fail at once. */
    t->r = t->rt ? capstan_redis_new(t->rt->cfg->redis_url, 1, err) : NULL;
    if (!t->r || !capstan_runtime_server_chain(t->rt)) {
        capstan_test_free(t);
        return NULL;
    }
    t->store = (capstan_lock_store_t){ store_lock, store_unlock, t };
    t->limits = (capstan_limit_store_t){ limit_attempt, limit_release, t };
    t->sink = (capstan_push_sink_t){ sink_take, t };
    t->sandbox = (capstan_sandbox_t){ sb_no_redis, sb_iter_read, sb_iter_write, sb_iter_drop, sb_iter_stop, t };
    return t;
}

static void result_clear(result_t *r)
{
    free(r->jid);
    free(r->err_class);
    free(r->err_msg);
    free(r->payload);
    free(r->queue);
    free(r->redis_error);
    for (size_t i = 0; i < r->nbacktrace; i++)
        free(r->backtrace[i]);
    free(r->backtrace);
    *r = (result_t){0};
}

void capstan_test_clear_pushed(capstan_test_t *t)
{
    for (size_t i = 0; i < t->npushed; i++) {
        free(t->pushed[i].payload);
        free(t->pushed[i].queue);
    }
    free(t->pushed);
    t->pushed = NULL;
    t->npushed = 0;
}

void capstan_test_free(capstan_test_t *t)
{
    if (!t)
        return;
    if (t->standing) {
        capstan__lock_store_set(NULL);
        capstan__limit_store_set(NULL);
        capstan__push_sink_set(NULL);
    }
    result_clear(&t->last);
    free(t->redis_error);
    for (size_t i = 0; i < t->nholds; i++) {
        free(t->holds[i].key);
        free(t->holds[i].jid);
    }
    free(t->holds);
    for (size_t i = 0; i < t->nspent; i++) {
        free(t->spent[i].name);
        free(t->spent[i].holder);
    }
    free(t->spent);
    capstan_test_clear_pushed(t);
    while (t->niters)
        iter_remove(t, t->iters[0].jid);
    free(t->iters);
    free(t->cursor_text);
    capstan_redis_free(t->r);
    capstan_runtime_free(t->rt);
    free(t);
}

capstan_runtime_t *capstan_test_runtime(capstan_test_t *t) { return t->rt; }
capstan_config_t *capstan_test_config(capstan_test_t *t) { return t->rt->cfg; }
void capstan_test_set_redis(capstan_test_t *t, redisContext *c) { t->user_redis = c; }
const char *capstan_test_error(const capstan_test_t *t) { return t->err; }
void capstan_test_set_inline(capstan_test_t *t, int on) { t->inline_runs = on; }
void capstan_test_interrupt_at(capstan_test_t *t, long n) { t->interrupt_at = n; }

/* The run's class rows and retry settings, as capstan_runtime_run makes
 * them at start, from what was registered and configured so far. */
static int prepare(capstan_test_t *t)
{
    capstan_runtime_t *rt = t->rt;
    if (capstan__classes_resolve(rt))
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    rt->retry = (capstan_retry_conf_t){ .max_retries = rt->cfg->max_retries, .timestamps = rt->cfg->timestamps };
    return 0;
}

/* A handler as registered, while the kit's trampoline stands in its
 * place for a run: the kit sees whether the handler was called. */
typedef struct wrapped {
    capstan_test_t *t;
    capstan_handler_fn fn;
    void *udata;
} wrapped_t;

static int trampoline(capstan_job_t *job, void *ud)
{
    wrapped_t *w = ud;
    w->t->called = 1;
    return w->fn(job, w->udata);
}

/* As a run starts (the outermost, inline runs being inside another):
 * the kit's stand-ins for Redis on this thread, and the trampolines. */
static int enter(capstan_test_t *t)
{
    if (t->depth++)
        return 0;
    capstan_runtime_t *rt = t->rt;
    int rc = prepare(t);
    if (rc) {
        t->depth--;
        return rc;
    }
    wrapped_t *w = rt->nhandlers ? calloc(rt->nhandlers, sizeof(*w)) : NULL;
    if (rt->nhandlers && !w) {
        t->depth--;
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < rt->nhandlers; i++) {
        w[i] = (wrapped_t){ t, rt->handlers[i].fn, rt->handlers[i].udata };
        rt->handlers[i].fn = trampoline;
        rt->handlers[i].udata = &w[i];
    }
    t->wrapped = w;
    capstan__lock_store_set(&t->store);
    capstan__limit_store_set(&t->limits);
    capstan__push_sink_set(&t->sink);
    return 0;
}

static void leave(capstan_test_t *t)
{
    if (--t->depth)
        return;
    if (!t->standing) {
        capstan__lock_store_set(NULL);
        capstan__limit_store_set(NULL);
        capstan__push_sink_set(NULL);
    }
    capstan_runtime_t *rt = t->rt;
    for (size_t i = 0; i < rt->nhandlers; i++) {
        rt->handlers[i].fn = t->wrapped[i].fn;
        rt->handlers[i].udata = t->wrapped[i].udata;
    }
    free(t->wrapped);
    t->wrapped = NULL;
}

/* Releases in the kit's memory the lock the ack would release. */
static void ack_release(capstan_test_t *t, const capstan_outcome_t *out, const char *jid)
{
    const char *key = capstan__outcome_release_key(out);
    if (key)
        (void)drop_hold(t, key, jid, 0);
}

/* What the chain decided, its outcome. */
static void keep_result(capstan_test_t *t, capstan_job_t *job, const capstan_outcome_t *out, int ran,
                        const char *queue)
{
    capstan_dispose_t d = out->disp;
    result_t *r = &t->last;
    *r = (result_t){ .fate = d, .ran = ran, .skipped = out->skipped, .jid = dup_or_null(job->jid),
                     .err_class = dup_or_null(job->err_class), .err_msg = dup_or_null(job->err_msg),
                     .queue = dup_or_null(queue), .redis_error = t->redis_error };
    t->redis_error = NULL;
    r->ok = ran && !job->err_class && (d == CAPSTAN_DISPOSE_DONE || d == CAPSTAN_DISPOSE_REQUEUE);
    if (d == CAPSTAN_DISPOSE_RETRY || d == CAPSTAN_DISPOSE_DEAD || d == CAPSTAN_DISPOSE_SCHEDULE)
        r->at = out->score;
    /* What the ack stores: the chain's payload, else the job as fetched. */
    const char *p = out->dpayload ? out->dpayload : job->payload;
    size_t len = out->dpayload ? out->dlen : job->len;
    if (d != CAPSTAN_DISPOSE_DONE && d != CAPSTAN_DISPOSE_DROP && (r->payload = malloc(len + 1))) {
        memcpy(r->payload, p, len);
        r->payload[len] = '\0';
        r->len = len;
    }
    if (job->nbacktrace && (r->backtrace = calloc(job->nbacktrace, sizeof(char *))))
        for (size_t i = 0; i < job->nbacktrace; i++)
            if ((r->backtrace[r->nbacktrace] = strdup(job->backtrace[i])))
                r->nbacktrace++;
}

int capstan_test_run_json(capstan_test_t *t, const char *payload, const char *queue)
{
    t->err[0] = '\0';
    if (!payload)
        return capstan_seterr(t->err, CAPSTAN_EINVAL, "capstan_test_run_json: no payload");
    int rc;
    size_t len = strlen(payload);
    char *copy = malloc(len + 1);
    if (!copy)
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    memcpy(copy, payload, len + 1);
    /* The queue outlives the job: the result keeps a copy. */
    char qbuf[256] = "";
    capstan_job_t job;
    char err[CAPSTAN_ERRLEN];
    if ((rc = capstan__job_init(&job, copy, len, "default", err))) {
        capstan__job_clear(&job);
        return capstan_seterr(t->err, rc, "not a job: %s", err);
    }
    if (queue) {
        snprintf(qbuf, sizeof(qbuf), "%s", queue);
    } else {
        size_t qlen = 0;
        const char *q = capstan_job_field_raw(&job, "queue", &qlen);
        char *s = q ? capstan__json_string_dup(q, qlen) : NULL;
        snprintf(qbuf, sizeof(qbuf), "%s", s ? s : "default");
        free(s);
    }
    job.queue = qbuf;
    if ((rc = enter(t))) {
        capstan__job_clear(&job);
        return rc;
    }
    if (!capstan__class_find(t->rt, job.cls)->h) {
        rc = capstan_seterr(t->err, CAPSTAN_ENOTFOUND, "no handler is registered for class %s "
                            "(capstan_register on capstan_test_runtime)", job.cls);
        leave(t);
        capstan__job_clear(&job);
        return rc;
    }
    job.redis = t->user_redis;
    job.sandbox = &t->sandbox;
    int called = t->called;
    t->called = 0;
    capstan_outcome_t out = { 0 };
    capstan__server_run_bare(t->rt, t->r, &job, &out);
    if (out.disp == CAPSTAN_DISPOSE_DEFAULT)
        out.disp = CAPSTAN_DISPOSE_DONE; /* the chain returned: done */
    capstan_dispose_t d = out.disp;
    ack_release(t, &out, job.jid);
    /* After the ack, as production: the job is in the dead set. */
    if (d == CAPSTAN_DISPOSE_DEAD) {
        t->in_death = 1;
        capstan__hooks_death(t->rt, &job, job.err_class, job.err_msg);
        t->in_death = 0;
    }
    int ran = t->called;
    t->called = called;
    leave(t);
    result_clear(&t->last);
    keep_result(t, &job, &out, ran, qbuf);
    capstan__outcome_clear(&out);
    capstan__job_clear(&job);
    return 0;
}

int capstan_test_run(capstan_test_t *t, const char *cls, const char *args, const capstan_push_opts_t *opts)
{
    t->err[0] = '\0';
    capstan_client_t *c = capstan_test_client(t);
    if (!c)
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    /* Built and captured as a push, then taken back out to run. */
    int inl = t->inline_runs;
    t->inline_runs = 0;
    size_t n = t->npushed;
    int rc = enter(t);
    if (!rc) {
        if ((rc = capstan_client_push(c, cls, args, opts, NULL)) < 0)
            capstan_seterr(t->err, rc, "%s", capstan_client_error(c));
        leave(t);
    }
    t->inline_runs = inl;
    capstan_client_free(c);
    if (rc < 0)
        return rc;
    if (t->npushed != n + 1)
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    pushed_t p = t->pushed[--t->npushed];
    rc = capstan_test_run_json(t, p.payload, p.queue);
    free(p.payload);
    free(p.queue);
    return rc;
}

int capstan_test_run_again(capstan_test_t *t)
{
    result_t *r = &t->last;
    if (!r->payload || r->fate == CAPSTAN_DISPOSE_DEAD || r->fate == CAPSTAN_DISPOSE_KEEP)
        return capstan_seterr(t->err, CAPSTAN_EINVAL, "the last run left no job to run again (%s)",
                              r->fate == CAPSTAN_DISPOSE_DEAD ? "it is dead" : "nothing stored");
    char *p = r->payload, *q = r->queue;
    r->payload = r->queue = NULL;
    int rc = capstan_test_run_json(t, p, q);
    free(p);
    free(q);
    return rc;
}

capstan_dispose_t capstan_test_result_fate(const capstan_test_t *t) { return t->last.fate; }
int capstan_test_result_ok(const capstan_test_t *t) { return t->last.ok; }
int capstan_test_result_ran(const capstan_test_t *t) { return t->last.ran; }
const char *capstan_test_result_skipped(const capstan_test_t *t) { return t->last.skipped; }
const char *capstan_test_result_error_class(const capstan_test_t *t) { return t->last.err_class; }
const char *capstan_test_result_error_message(const capstan_test_t *t) { return t->last.err_msg; }
size_t capstan_test_result_backtrace_len(const capstan_test_t *t) { return t->last.nbacktrace; }
double capstan_test_result_at(const capstan_test_t *t) { return t->last.at; }
const char *capstan_test_result_jid(const capstan_test_t *t) { return t->last.jid; }
const char *capstan_test_result_redis_error(const capstan_test_t *t) { return t->last.redis_error; }

const char *capstan_test_result_backtrace(const capstan_test_t *t, size_t i)
{
    return i < t->last.nbacktrace ? t->last.backtrace[i] : NULL;
}

const char *capstan_test_result_payload(const capstan_test_t *t, size_t *len)
{
    if (len)
        *len = t->last.payload ? t->last.len : 0;
    return t->last.payload;
}

long capstan_test_result_retry_count(const capstan_test_t *t)
{
    json_t *p = t->last.payload ? json_loads(t->last.payload, 0, NULL) : NULL;
    json_t *n = json_object_get(p, "retry_count");
    long c = json_is_integer(n) ? (long)json_integer_value(n) : -1;
    json_decref(p);
    return c;
}

size_t capstan_test_pushed_count(const capstan_test_t *t) { return t->npushed; }

const char *capstan_test_pushed_at(const capstan_test_t *t, size_t i, size_t *len)
{
    if (len)
        *len = i < t->npushed ? t->pushed[i].len : 0;
    return i < t->npushed ? t->pushed[i].payload : NULL;
}

const char *capstan_test_pushed_queue(const capstan_test_t *t, size_t i)
{
    return i < t->npushed ? t->pushed[i].queue : NULL;
}

double capstan_test_pushed_when(const capstan_test_t *t, size_t i)
{
    return i < t->npushed ? t->pushed[i].at : 0;
}

capstan_dispose_t capstan_test_pushed_fate(const capstan_test_t *t, size_t i)
{
    return i < t->npushed ? t->pushed[i].fate : CAPSTAN_DISPOSE_DEFAULT;
}

long capstan_test_drain(capstan_test_t *t, long max)
{
    long n = 0;
    /* By index: the jobs run may push more, which moves the array. */
    for (size_t i = 0; i < t->npushed && (max <= 0 || n < max); i++) {
        if (t->pushed[i].ran)
            continue;
        t->pushed[i].ran = 1;
        char *p = strdup(t->pushed[i].payload), *q = strdup(t->pushed[i].queue);
        int rc = p && q ? capstan_test_run_json(t, p, q) : capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
        free(p);
        free(q);
        if (rc)
            return rc;
        t->pushed[i].fate = t->last.fate;
        n++;
    }
    return n;
}

capstan_client_t *capstan_test_client(capstan_test_t *t)
{
    char err[CAPSTAN_ERRLEN];
    /* Its pushes take their locks in the kit's memory too, on this
     * thread, until the kit goes. */
    t->standing = 1;
    capstan__lock_store_set(&t->store);
    capstan__limit_store_set(&t->limits);
    capstan__push_sink_set(&t->sink);
    capstan_client_t *c = capstan_client_new(t->rt->cfg->redis_url, err);
    if (c && capstan_client_use_runtime(c, t->rt)) {
        capstan_client_free(c);
        return NULL;
    }
    return c;
}

int capstan_test_set_cursor(capstan_test_t *t, const char *jid, const char *cursor, long executions)
{
    if (!jid)
        return capstan_seterr(t->err, CAPSTAN_EINVAL, "capstan_test_set_cursor: no jid");
    if (!cursor) {
        iter_remove(t, jid);
        return 0;
    }
    json_error_t jerr;
    json_t *c = json_loads(cursor, JSON_DECODE_ANY, &jerr);
    if (!c)
        return capstan_seterr(t->err, CAPSTAN_EPARSE, "cursor %s: %s", cursor, jerr.text);
    iter_state_t *s = iter_get(t, jid);
    if (!s) {
        json_decref(c);
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    }
    json_decref(s->cursor);
    s->cursor = json_is_null(c) ? NULL : c;
    if (json_is_null(c))
        json_decref(c);
    s->executions = executions;
    return 0;
}

const char *capstan_test_cursor(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = jid ? iter_find(t, jid) : NULL;
    free(t->cursor_text);
    t->cursor_text = NULL;
    if (!s)
        return NULL;
    t->cursor_text = s->cursor ? json_dumps(s->cursor, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("null");
    return t->cursor_text;
}

long capstan_test_executions(const capstan_test_t *t, const char *jid)
{
    const iter_state_t *s = jid ? iter_find(t, jid) : NULL;
    return s ? s->executions : 0;
}

int capstan_test_cancel(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = jid ? iter_get(t, jid) : NULL;
    if (!s)
        return capstan_seterr(t->err, jid ? CAPSTAN_ENOMEM : CAPSTAN_EINVAL, jid ? "out of memory" : "no jid");
    s->cancelled = 1;
    return 0;
}

int capstan_test_hold_lock(capstan_test_t *t, const char *payload)
{
    t->err[0] = '\0';
    char err[CAPSTAN_ERRLEN];
    size_t len = payload ? strlen(payload) : 0;
    char *copy = payload ? strdup(payload) : NULL;
    if (!copy)
        return capstan_seterr(t->err, payload ? CAPSTAN_ENOMEM : CAPSTAN_EINVAL, "no payload");
    capstan_job_t job;
    int rc = capstan__job_init(&job, copy, len, "default", err);
    if (rc) {
        capstan__job_clear(&job);
        return capstan_seterr(t->err, rc, "not a job: %s", err);
    }
    /* Inside a run the rows are in use, and resolved already. */
    if (!t->depth && (rc = prepare(t))) {
        capstan__job_clear(&job);
        return rc;
    }
    /* The lock options as the job's server chain resolves them. */
    const capstan_class_row_t *row = capstan__class_find(t->rt, job.cls);
    capstan_mw_t mw = { .server = 1, .r = t->r, .cfg = t->rt->cfg, .cc = row->cc,
                        .unique = row->h ? row->h->unique : NULL, .job = &job,
                        .cls = job.wrapper ? job.wrapper : job.cls, .jid = job.jid, .queue = job.queue };
    capstan_unique_spec_t s;
    if ((rc = capstan_unique__resolve(&mw, &s, 1, err))) {
        capstan__job_clear(&job);
        return capstan_seterr(t->err, rc, "%s", err);
    }
    int runtime = s.type == CAPSTAN_LOCK_WHILE_EXECUTING || s.type == CAPSTAN_LOCK_WHILE_EXECUTING_REJECT;
    capstan_lock_req_t q = { .digest = s.digest, .runtime = runtime, .jid = job.jid, .type = s.type,
                             .limit = s.limit };
    if (s.type == CAPSTAN_LOCK_NONE)
        rc = capstan_seterr(t->err, CAPSTAN_EINVAL, "%s is not unique: it takes no lock", job.cls);
    else if ((rc = store_lock(t, &q)) == CAPSTAN_EDENIED)
        capstan_seterr(t->err, rc, "lock %s is held by another job", s.digest);
    else if (rc < 0)
        capstan_seterr(t->err, rc, "out of memory");
    capstan_unique__spec_clear(&s);
    capstan__job_clear(&job);
    return rc < 0 ? rc : 0;
}

size_t capstan_test_locks_held(const capstan_test_t *t) { return t->nholds; }
