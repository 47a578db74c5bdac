/* The testing kit (capstan/testing.h) beyond what examples/test_jobs.c
 * shows: a connection given to the handlers (a real redis-server, which
 * the kit's own state never touches), the server conflict strategies
 * reject and reschedule, a lock released after a success, expiry,
 * cancellation, and inline jobs that fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/capstan.h"
#include "capstan/testing.h"
#include "helpers.h"

TestSuite(testing, .timeout = 60);

static int runs;

/* Counts its runs; SADDs its jid to its first arg when capstan_job_redis
 * gives a connection. */
static int counted(capstan_job_t *job, void *ud)
{
    (void)ud;
    runs++;
    redisContext *c = capstan_job_redis(job);
    json_t *key = json_array_get(capstan_job_args(job), 0);
    if (c && json_is_string(key))
        freeReplyObject(redisCommand(c, "SADD %s %s", json_string_value(key), capstan_job_jid(job)));
    return 0;
}

static int failing(capstan_job_t *job, void *ud)
{
    (void)ud;
    return capstan_job_fail(job, "ArgumentError", "no");
}

/* Pushes one FailingJob (inline under capstan_test_set_inline). */
static int pusher(capstan_job_t *job, void *ud)
{
    (void)ud;
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(NULL, err);
    int rc = c ? capstan_client_push(c, "FailingJob", "[]", NULL, NULL) : CAPSTAN_EREDIS;
    capstan_client_free(c);
    return rc < 0 ? capstan_job_fail(job, "RuntimeError", "push: %d", rc) : 0;
}

/* Iterates until cancelled. */
static int endless(capstan_job_t *job, void *ud)
{
    (void)ud;
    for (long i = 0;; i++) {
        json_t *at = json_integer(i);
        int go = capstan_job_checkpoint(job, at);
        json_decref(at);
        if (go != CAPSTAN_ITER_NEXT)
            return 0;
    }
}

static capstan_limit_opts_t two_at_once = CAPSTAN_LIMIT_OPTS_INIT, three_a_minute = CAPSTAN_LIMIT_OPTS_INIT;

static capstan_unique_opts_t until_executed = CAPSTAN_UNIQUE_OPTS_INIT, rejecting = CAPSTAN_UNIQUE_OPTS_INIT,
                             rescheduling = CAPSTAN_UNIQUE_OPTS_INIT;

static capstan_test_t *kit(void)
{
    capstan_test_t *t = capstan_test_new();
    cr_assert(t);
    capstan_runtime_t *rt = capstan_test_runtime(t);
    capstan_class_opts_t o = CAPSTAN_CLASS_OPTS_INIT;
    until_executed.lock = CAPSTAN_LOCK_UNTIL_EXECUTED;
    rejecting.lock = rescheduling.lock = CAPSTAN_LOCK_WHILE_EXECUTING;
    rejecting.on_conflict_server = CAPSTAN_CONFLICT_REJECT;
    rescheduling.on_conflict_server = CAPSTAN_CONFLICT_RESCHEDULE;
    rescheduling.schedule_in = 30;
    cr_assert_eq(capstan_register(rt, "CountedJob", counted, NULL, &o), 0);
    cr_assert_eq(capstan_register(rt, "FailingJob", failing, NULL, &o), 0);
    cr_assert_eq(capstan_register(rt, "PusherJob", pusher, NULL, &o), 0);
    cr_assert_eq(capstan_register(rt, "EndlessJob", endless, NULL, &o), 0);
    o.unique = &until_executed;
    cr_assert_eq(capstan_register(rt, "OnceJob", counted, NULL, &o), 0);
    o.unique = &rejecting;
    cr_assert_eq(capstan_register(rt, "RejectJob", counted, NULL, &o), 0);
    o.unique = &rescheduling;
    cr_assert_eq(capstan_register(rt, "LaterJob", counted, NULL, &o), 0);
    two_at_once.type = CAPSTAN_LIMIT_CONCURRENT;
    two_at_once.count = 2;
    two_at_once.name = "two";
    three_a_minute.type = CAPSTAN_LIMIT_WINDOW;
    three_a_minute.count = 3;
    three_a_minute.seconds = 60;
    three_a_minute.name = "three";
    o.unique = NULL;
    o.limit = &two_at_once;
    cr_assert_eq(capstan_register(rt, "TwoJob", counted, NULL, &o), 0);
    o.limit = &three_a_minute;
    cr_assert_eq(capstan_register(rt, "ThreeJob", counted, NULL, &o), 0);
    runs = 0;
    return t;
}

/* A payload of cls with args ["k"] and jid "<c> x 24". */
static char *job_of(const char *cls, char c)
{
    char jid[25], *p = malloc(256);
    memset(jid, c, 24);
    jid[24] = '\0';
    cr_assert(p);
    snprintf(p, 256, "{\"class\":\"%s\",\"jid\":\"%s\",\"args\":[\"k\"],\"queue\":\"default\",\"retry\":true}",
             cls, jid);
    return p;
}

Test(testing, handlers_get_the_connection_given)
{
    capstan_test_t *t = kit();
    capstan_test_set_redis(t, kt_redis());
    cr_assert_eq(capstan_test_run(t, "OnceJob", "[\"kit:seen\"]", NULL), 0);
    cr_assert(capstan_test_result_ok(t));
    cr_assert_null(capstan_test_result_redis_error(t));
    cr_assert_eq(kt_int("SISMEMBER kit:seen %s", capstan_test_result_jid(t)), 1);
    /* The kit's own state (the lock, the push) stayed out of Redis. */
    cr_assert_eq(kt_int("DBSIZE"), 1);
    capstan_test_free(t);
}

Test(testing, lock_released_after_success)
{
    capstan_test_t *t = kit();
    cr_assert_eq(capstan_test_run(t, "OnceJob", "[\"k\"]", NULL), 0);
    cr_assert(capstan_test_result_ok(t));
    cr_assert_eq(capstan_test_locks_held(t), 0);
    cr_assert_eq(capstan_test_run(t, "OnceJob", "[\"k\"]", NULL), 0); /* not a duplicate now */
    cr_assert_eq(runs, 2);
    capstan_test_free(t);
}

static int deaths;

static void on_death(capstan_job_t *job, const char *cls, const char *msg, void *ud)
{
    (void)job, (void)msg, (void)ud;
    cr_assert_str_eq(cls, CAPSTAN_UNIQUE_REJECTED);
    deaths++;
}

Test(testing, reject_conflict_goes_dead)
{
    capstan_test_t *t = kit();
    deaths = 0;
    cr_assert_eq(capstan_on_death(capstan_test_runtime(t), on_death, NULL), 0);
    char *other = job_of("RejectJob", 'a'), *mine = job_of("RejectJob", 'b');
    cr_assert_eq(capstan_test_hold_lock(t, other), 0);
    cr_assert_eq(capstan_test_hold_lock(t, mine), CAPSTAN_EDENIED);
    cr_assert_eq(capstan_test_run_json(t, mine, NULL), 0);
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_DEAD);
    cr_assert_str_eq(capstan_test_result_skipped(t), "rejected");
    cr_assert_str_eq(capstan_test_result_error_class(t), CAPSTAN_UNIQUE_REJECTED);
    cr_assert(strstr(capstan_test_result_payload(t, NULL), "\"error_class\":\"" CAPSTAN_UNIQUE_REJECTED "\""));
    cr_assert_eq(deaths, 1);
    cr_assert_eq(runs, 0);
    free(other);
    free(mine);
    capstan_test_free(t);
}

Test(testing, reschedule_conflict_is_scheduled)
{
    capstan_test_t *t = kit();
    char *other = job_of("LaterJob", 'a'), *mine = job_of("LaterJob", 'b');
    cr_assert_eq(capstan_test_hold_lock(t, other), 0);
    double before = kt_wall();
    cr_assert_eq(capstan_test_run_json(t, mine, NULL), 0);
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_SCHEDULE);
    cr_assert_str_eq(capstan_test_result_skipped(t), "rescheduled");
    cr_assert(capstan_test_result_at(t) >= before + 29 && capstan_test_result_at(t) < before + 60);
    /* Still held: it is rescheduled again. */
    cr_assert_eq(capstan_test_run_again(t), 0);
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_SCHEDULE);
    cr_assert_eq(runs, 0);
    free(other);
    free(mine);
    capstan_test_free(t);
}

Test(testing, expired_job_is_not_run)
{
    capstan_test_t *t = kit();
    cr_assert_eq(capstan_test_run_json(t, "{\"class\":\"CountedJob\",\"jid\":\"cccccccccccccccccccccccc\","
                                          "\"args\":[],\"expires_at\":1000.0}", NULL), 0);
    cr_assert_str_eq(capstan_test_result_skipped(t), "expired");
    cr_assert(!capstan_test_result_ran(t));
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_DONE);
    capstan_test_free(t);
}

Test(testing, cancelled_iteration_ends)
{
    capstan_test_t *t = kit();
    const char *jid = "dddddddddddddddddddddddd";
    cr_assert_eq(capstan_test_cancel(t, jid), 0);
    cr_assert_eq(capstan_test_run_json(t, "{\"class\":\"EndlessJob\",\"jid\":\"dddddddddddddddddddddddd\","
                                          "\"args\":[]}", NULL), 0);
    cr_assert(capstan_test_result_ok(t));
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_DONE);
    cr_assert_null(capstan_test_cursor(t, jid)); /* the state goes with the job */
    capstan_test_free(t);
}

Test(testing, inline_failure_stays_with_the_pushed_job)
{
    capstan_test_t *t = kit();
    capstan_test_set_inline(t, 1);
    cr_assert_eq(capstan_test_run(t, "PusherJob", NULL, NULL), 0);
    cr_assert(capstan_test_result_ok(t));
    cr_assert_eq(capstan_test_pushed_count(t), 1);
    cr_assert_eq(capstan_test_pushed_fate(t, 0), CAPSTAN_DISPOSE_RETRY);
    capstan_test_free(t);
}

Test(testing, concurrent_limit_full_reschedules)
{
    capstan_test_t *t = kit();
    cr_assert_eq(capstan_test_run(t, "TwoJob", NULL, NULL), 0);
    cr_assert(capstan_test_result_ok(t)); /* its slot is given back after */
    cr_assert_eq(capstan_test_limit_take(t, "two", 2), 0);
    cr_assert_eq(capstan_test_run(t, "TwoJob", NULL, NULL), 0);
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_SCHEDULE);
    cr_assert(!capstan_test_result_ran(t));
    cr_assert(strstr(capstan_test_result_payload(t, NULL), "\"limiter_reschedules\":1"));
    cr_assert_eq(runs, 1);
    capstan_test_free(t);
}

Test(testing, window_limit_spent_until_over_limit)
{
    capstan_test_t *t = kit();
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(capstan_test_run(t, "ThreeJob", NULL, NULL), 0);
        cr_assert(capstan_test_result_ok(t));
    }
    cr_assert_eq(capstan_test_run(t, "ThreeJob", NULL, NULL), 0);
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_SCHEDULE);
    /* Rescheduled about when the minute is over. */
    cr_assert(capstan_test_result_at(t) > kt_wall() + 50);
    /* Past max_limiter_reschedules (20), it fails instead. */
    for (int i = 0; i < 20; i++)
        cr_assert_eq(capstan_test_run_again(t), 0);
    cr_assert_str_eq(capstan_test_result_error_class(t), "Capstan::OverLimit");
    cr_assert_eq(capstan_test_result_fate(t), CAPSTAN_DISPOSE_RETRY);
    cr_assert_eq(runs, 3);
    capstan_test_free(t);
}
