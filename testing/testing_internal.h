/* What the testing kit's files share (not installed): the kit's struct,
 * which keeps the state Redis would hold, and the functions that cross
 * files. testing.c runs jobs, stores.c keeps locks and limiters, pushed.c
 * the pushed jobs, iterate.c iteration state. */
#ifndef CAPSTAN_TESTING_INTERNAL_H
#define CAPSTAN_TESTING_INTERNAL_H

#include "capstan/testing.h"

#include "client/txn.h"
#include "job/job.h"
#include "locks/limiter_internal.h"
#include "middleware/outcome.h"
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

/* testing.c */
int capstan__test_prepare(capstan_test_t *t);
void capstan__test_result_clear(result_t *r);

/* stores.c: t->store and t->limits; what they hold freed; the lock the
 * ack of out would release, released. */
void capstan__test_stores_init(capstan_test_t *t);
void capstan__test_stores_free(capstan_test_t *t);
void capstan__test_ack_release(capstan_test_t *t, const capstan_outcome_t *out, const char *jid);

/* pushed.c: t->sink. */
void capstan__test_sink_init(capstan_test_t *t);

/* iterate.c: t->sandbox; the iteration state freed. */
void capstan__test_sandbox_init(capstan_test_t *t);
void capstan__test_iters_free(capstan_test_t *t);

#endif
