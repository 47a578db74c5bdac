/* Tests of the example plugin's handlers (jobs.c) written with capstan's
 * testing kit (capstan/testing.h): no Redis, plain assert, one program.
 * Each case makes its own kit, registers the plugin as production does
 * (capstan_plugin_init) and runs jobs through production's server chain. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <capstan/capstan.h>
#include <capstan/testing.h>

int capstan_plugin_init(capstan_runtime_t *rt);

static capstan_test_t *kit(void)
{
    capstan_test_t *t = capstan_test_new();
    assert(t);
    assert(capstan_plugin_init(capstan_test_runtime(t)) == 0);
    return t;
}

static int has(const char *s, const char *part)
{
    return s && strstr(s, part) != NULL;
}

static void noop_succeeds(void)
{
    capstan_test_t *t = kit();
    assert(capstan_test_run(t, "NoopJob", "[]", NULL) == 0);
    assert(capstan_test_result_ok(t));
    assert(capstan_test_result_ran(t));
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_DONE);
    assert(capstan_test_result_error_class(t) == NULL);
    assert(strlen(capstan_test_result_jid(t)) == 24);
    capstan_test_free(t);
}

static void failure_is_retried(void)
{
    capstan_test_t *t = kit();
    double before = (double)time(NULL);
    assert(capstan_test_run(t, "FailJob", "[\"boom\", [\"a.c:1\", \"b.c:2\"]]", NULL) == 0);
    assert(!capstan_test_result_ok(t));
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_RETRY);
    assert(strcmp(capstan_test_result_error_class(t), "RuntimeError") == 0);
    assert(strcmp(capstan_test_result_error_message(t), "boom") == 0);
    assert(capstan_test_result_backtrace_len(t) == 2);
    assert(strcmp(capstan_test_result_backtrace(t, 1), "b.c:2") == 0);
    /* Sidekiq's first backoff: 0**4 + 15 + rand(10) * 1 seconds. */
    assert(capstan_test_result_at(t) >= before + 15 && capstan_test_result_at(t) < before + 27);
    assert(capstan_test_result_retry_count(t) == 0);
    assert(has(capstan_test_result_payload(t, NULL), "\"error_class\":\"RuntimeError\""));
    capstan_test_free(t);
}

static int deaths, errors;

static void on_death(capstan_job_t *job, const char *cls, const char *msg, void *ud)
{
    (void)job, (void)cls, (void)msg, (void)ud;
    deaths++;
}

static void on_error(capstan_job_t *job, const char *cls, const char *msg, void *ud)
{
    (void)job, (void)cls, (void)msg, (void)ud;
    errors++;
}

static void dead_after_retries(void)
{
    capstan_test_t *t = kit();
    deaths = errors = 0;
    assert(capstan_on_death(capstan_test_runtime(t), on_death, NULL) == 0);
    assert(capstan_on_error(capstan_test_runtime(t), on_error, NULL) == 0);
    capstan_push_opts_t o = capstan_push_opts_default();
    o.retry = 2;
    assert(capstan_test_run(t, "FailJob", "[]", &o) == 0);
    for (long i = 0; i < 2; i++) {
        assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_RETRY);
        assert(capstan_test_result_retry_count(t) == i);
        assert(capstan_test_run_again(t) == 0);
    }
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_DEAD);
    assert(deaths == 1 && errors == 3);
    assert(capstan_test_run_again(t) == CAPSTAN_EINVAL);
    capstan_test_free(t);
}

static void pushes_are_captured(void)
{
    capstan_test_t *t = kit();
    assert(capstan_test_run(t, "FanoutJob", "[3, \"low\"]", NULL) == 0);
    assert(capstan_test_result_ok(t));
    assert(capstan_test_pushed_count(t) == 3);
    for (size_t i = 0; i < 3; i++) {
        assert(strcmp(capstan_test_pushed_queue(t, i), "low") == 0);
        assert(has(capstan_test_pushed_at(t, i, NULL), "\"class\":\"NoopJob\""));
        assert(capstan_test_pushed_fate(t, i) == CAPSTAN_DISPOSE_DEFAULT); /* not run */
    }
    assert(has(capstan_test_pushed_at(t, 2, NULL), "\"args\":[2]"));
    assert(capstan_test_drain(t, 0) == 3);
    assert(capstan_test_pushed_fate(t, 0) == CAPSTAN_DISPOSE_DONE);
    assert(capstan_test_drain(t, 0) == 0);
    capstan_test_free(t);
}

static void pushes_run_inline(void)
{
    capstan_test_t *t = kit();
    capstan_test_set_inline(t, 1);
    assert(capstan_test_run(t, "FanoutJob", "[2]", NULL) == 0);
    assert(capstan_test_result_ok(t));
    /* The outcome is still the pushing job's. */
    assert(capstan_test_result_payload(t, NULL) == NULL);
    assert(capstan_test_pushed_count(t) == 2);
    assert(capstan_test_pushed_fate(t, 0) == CAPSTAN_DISPOSE_DONE);
    assert(capstan_test_pushed_fate(t, 1) == CAPSTAN_DISPOSE_DONE);
    assert(capstan_test_drain(t, 0) == 0); /* they ran already */
    capstan_test_free(t);
}

static void iteration_interrupted_and_resumed(void)
{
    capstan_test_t *t = kit();
    capstan_test_interrupt_at(t, 4);
    assert(capstan_test_run(t, "WalkJob", "[10]", NULL) == 0);
    const char *jid = strdup(capstan_test_result_jid(t));
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_REQUEUE);
    assert(capstan_test_result_error_class(t) == NULL);
    /* The 4th checkpoint stopped before item 3: the next run starts there. */
    assert(strcmp(capstan_test_cursor(t, jid), "3") == 0);
    assert(capstan_test_executions(t, jid) == 1);
    capstan_test_interrupt_at(t, 0);
    assert(capstan_test_run_again(t) == 0);
    assert(capstan_test_result_ok(t));
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_DONE);
    assert(capstan_test_cursor(t, jid) == NULL); /* done with: it-<jid> goes */
    free((void *)jid);
    capstan_test_free(t);
}

static void iteration_failure_keeps_cursor(void)
{
    capstan_test_t *t = kit();
    const char *payload = "{\"class\":\"WalkJob\",\"jid\":\"0123456789abcdef01234567\",\"args\":[-20],"
                          "\"retry\":true,\"queue\":\"default\"}";
    assert(capstan_test_set_cursor(t, "0123456789abcdef01234567", "10", 2) == 0);
    int rc = capstan_test_run_json(t, payload, NULL);
    if (rc)
        fprintf(stderr, "%s\n", capstan_test_error(t));
    assert(rc == 0);
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_RETRY);
    assert(strcmp(capstan_test_result_error_message(t), "item 13 is broken") == 0);
    assert(strcmp(capstan_test_cursor(t, "0123456789abcdef01234567"), "13") == 0);
    assert(capstan_test_executions(t, "0123456789abcdef01234567") == 3);
    capstan_test_free(t);
}

static void unique_lock_held_by_another_job(void)
{
    capstan_test_t *t = kit();
    /* Another DigestJob with the same args holds the until_executed lock. */
    const char *other = "{\"class\":\"DigestJob\",\"jid\":\"aaaaaaaaaaaaaaaaaaaaaaaa\",\"args\":[\"k\"],"
                        "\"queue\":\"digests\"}";
    const char *mine = "{\"class\":\"DigestJob\",\"jid\":\"bbbbbbbbbbbbbbbbbbbbbbbb\",\"args\":[\"k\"],"
                       "\"queue\":\"digests\"}";
    assert(capstan_test_hold_lock(t, other) == 0);
    assert(capstan_test_locks_held(t) == 1);
    assert(capstan_test_run_json(t, mine, NULL) == 0);
    /* The server's default strategy: logged and dropped, never run. */
    assert(!capstan_test_result_ran(t));
    assert(strcmp(capstan_test_result_skipped(t), "skipped") == 0);
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_DONE);
    /* A push of the same args is refused while the lock is held. */
    assert(capstan_test_run(t, "DigestJob", "[\"k\"]", NULL) == CAPSTAN_EDENIED);
    assert(has(capstan_test_error(t), "held by another job"));
    capstan_test_free(t);
}

static void unique_push_takes_lock(void)
{
    capstan_test_t *t = kit();
    capstan_client_t *c = capstan_test_client(t);
    assert(c);
    assert(capstan_client_push(c, "DigestJob", "[\"x\"]", NULL, NULL) == 0);
    assert(capstan_test_locks_held(t) == 1); /* taken at the push, as production */
    assert(capstan_client_push(c, "DigestJob", "[\"x\"]", NULL, NULL) == CAPSTAN_EDENIED);
    assert(capstan_test_pushed_count(t) == 1);
    assert(strcmp(capstan_test_pushed_queue(t, 0), "digests") == 0); /* the class's queue */
    capstan_client_free(c);
    assert(capstan_test_drain(t, 0) == 1);
    /* RecordJob's work needs Redis: it fails, retried, its lock kept. */
    assert(capstan_test_pushed_fate(t, 0) == CAPSTAN_DISPOSE_RETRY);
    assert(capstan_test_locks_held(t) == 1);
    capstan_test_free(t);
}

static void redis_without_connection(void)
{
    capstan_test_t *t = kit();
    assert(capstan_test_run(t, "RecordJob", "[\"k\"]", NULL) == 0);
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_RETRY);
    assert(strcmp(capstan_test_result_error_class(t), "Redis::CannotConnectError") == 0);
    assert(has(capstan_test_result_redis_error(t), "no Redis connection"));
    assert(has(capstan_test_result_redis_error(t), "RecordJob"));
    capstan_test_free(t);
}

static int seen;

static int count_mw(capstan_mw_t *mw, void *ud)
{
    (void)ud;
    int rc = capstan_mw_next(mw);
    /* Outside the handler, inside "retry": a failure is not decided yet. */
    if (capstan_job_error_class(capstan_mw_job(mw)))
        seen += 100;
    seen++;
    return rc;
}

static void user_middleware_runs(void)
{
    capstan_test_t *t = kit();
    seen = 0;
    assert(capstan_chain_add(capstan_runtime_server_chain(capstan_test_runtime(t)), "count", count_mw, NULL) == 0);
    assert(capstan_test_run(t, "NoopJob", NULL, NULL) == 0);
    assert(capstan_test_run(t, "FailJob", NULL, NULL) == 0);
    assert(seen == 102);
    capstan_test_free(t);
}

static void retry_zero_goes_dead(void)
{
    capstan_test_t *t = kit();
    capstan_push_opts_t o = capstan_push_opts_default();
    o.retry = 0;
    assert(capstan_test_run(t, "FailJob", "[\"once\"]", &o) == 0);
    assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_DEAD);
    capstan_test_free(t);
}

static void bad_input_is_refused(void)
{
    capstan_test_t *t = kit();
    assert(capstan_test_run(t, "NoSuchJob", "[]", NULL) == CAPSTAN_ENOTFOUND);
    assert(has(capstan_test_error(t), "NoSuchJob"));
    assert(capstan_test_run_json(t, "{not json", NULL) == CAPSTAN_EPARSE);
    assert(capstan_test_run_json(t, "{\"class\":\"NoopJob\"}", NULL) == CAPSTAN_EINVAL);
    capstan_test_free(t);
}

int main(void)
{
    static const struct { const char *name; void (*fn)(void); } cases[] = {
        { "noop_succeeds", noop_succeeds },
        { "failure_is_retried", failure_is_retried },
        { "dead_after_retries", dead_after_retries },
        { "retry_zero_goes_dead", retry_zero_goes_dead },
        { "pushes_are_captured", pushes_are_captured },
        { "pushes_run_inline", pushes_run_inline },
        { "iteration_interrupted_and_resumed", iteration_interrupted_and_resumed },
        { "iteration_failure_keeps_cursor", iteration_failure_keeps_cursor },
        { "unique_lock_held_by_another_job", unique_lock_held_by_another_job },
        { "unique_push_takes_lock", unique_push_takes_lock },
        { "redis_without_connection", redis_without_connection },
        { "user_middleware_runs", user_middleware_runs },
        { "bad_input_is_refused", bad_input_is_refused },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cases[i].fn();
        printf("ok %zu %s\n", i + 1, cases[i].name);
        fflush(stdout);
    }
    return 0;
}
