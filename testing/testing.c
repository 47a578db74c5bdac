/* The testing kit (capstan/testing.h): a runtime whose jobs run through
 * production's server chain on the caller's thread
 * (capstan__server_run_bare), with the state Redis would hold kept in the
 * kit's memory instead (stores.c, pushed.c, iterate.c). This file holds
 * the kit's making and freeing, a run and its result. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt.h"
#include "testing/testing_internal.h"

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
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
    capstan__test_stores_init(t);
    capstan__test_sink_init(t);
    capstan__test_sandbox_init(t);
    return t;
}

void capstan__test_result_clear(result_t *r)
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

void capstan_test_free(capstan_test_t *t)
{
    if (!t)
        return;
    if (t->standing) {
        capstan__lock_store_set(NULL);
        capstan__limit_store_set(NULL);
        capstan__push_sink_set(NULL);
    }
    capstan__test_result_clear(&t->last);
    free(t->redis_error);
    capstan__test_stores_free(t);
    capstan_test_clear_pushed(t);
    capstan__test_iters_free(t);
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
int capstan__test_prepare(capstan_test_t *t)
{
    capstan_runtime_t *rt = t->rt;
    if (capstan__classes_resolve(rt))
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    rt->classes.retry = (capstan_retry_conf_t){ .max_retries = rt->cfg->max_retries, .timestamps = rt->cfg->timestamps };
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
    int rc = capstan__test_prepare(t);
    if (rc) {
        t->depth--;
        return rc;
    }
    wrapped_t *w = rt->classes.nhandlers ? calloc(rt->classes.nhandlers, sizeof(*w)) : NULL;
    if (rt->classes.nhandlers && !w) {
        t->depth--;
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < rt->classes.nhandlers; i++) {
        w[i] = (wrapped_t){ t, rt->classes.handlers[i].fn, rt->classes.handlers[i].udata };
        rt->classes.handlers[i].fn = trampoline;
        rt->classes.handlers[i].udata = &w[i];
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
    for (size_t i = 0; i < rt->classes.nhandlers; i++) {
        rt->classes.handlers[i].fn = t->wrapped[i].fn;
        rt->classes.handlers[i].udata = t->wrapped[i].udata;
    }
    free(t->wrapped);
    t->wrapped = NULL;
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
    capstan__test_ack_release(t, &out, job.jid);
    /* After the ack, as production: the job is in the dead set. */
    if (d == CAPSTAN_DISPOSE_DEAD) {
        t->in_death = 1;
        capstan__hooks_death(t->rt, &job, job.err_class, job.err_msg);
        t->in_death = 0;
    }
    int ran = t->called;
    t->called = called;
    leave(t);
    capstan__test_result_clear(&t->last);
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
