/* A testing kit for handler authors: runs jobs through the handlers a
 * program or plugin registers, and the server middleware chain production
 * runs them through, with no Redis, from any C test framework (Criterion,
 * cmocka, Unity, plain assert). Link with the capstan library, as the
 * program does; include <capstan/testing.h>.
 *
 *     capstan_test_t *t = capstan_test_new();
 *     capstan_plugin_init(capstan_test_runtime(t));   // production's registration
 *     capstan_test_run(t, "FailJob", "[\"boom\"]");
 *     assert(capstan_test_result_fate(t) == CAPSTAN_DISPOSE_RETRY);
 *     assert(strcmp(capstan_test_result_error_class(t), "RuntimeError") == 0);
 *     capstan_test_free(t);
 *
 * What runs is production's: the built-in server middleware ("stats",
 * "retry" with Sidekiq's retry rules and backoff, "expiry", "unique",
 * "limit"), whatever middleware the test adds to capstan_runtime_server_chain
 * of capstan_test_runtime, the error hooks after a failure and the death
 * hooks once a job is dead. What Redis would hold is kept in the kit's
 * memory instead:
 *   - uniqueness locks (taken and released by the real middleware, client
 *     and server; a lock's ttl is not counted down, and nothing waits for
 *     a lock: a lock_timeout is one attempt);
 *   - the jobs pushed through a capstan_client_t made during a run, or
 *     with capstan_test_client (captured, not sent; see "Pushed jobs");
 *   - the iteration state of iterable jobs (it-<jid>);
 *   - rate limiters (capstan/limiter.h, the "limit" middleware): a
 *     concurrent limit counts the jobs holding a slot, the other types the
 *     points spent in the current period (a bucket's steady refill comes
 *     as whole periods); nothing waits (wait_timeout is one attempt), so a
 *     job over its limit is rescheduled at once, as production does once
 *     its wait is over.
 *
 * capstan_job_redis() returns NULL in a handler the kit runs, unless the
 * test gave the kit a connection (capstan_test_set_redis); the kit then
 * records why (capstan_test_result_redis_error), so a test sees at once
 * which handler needs Redis. A handler must cope with NULL there (fail
 * the job, as with a broken connection), or be tested with a connection.
 *
 * A capstan_test_t is not thread-safe; use one per thread. Jobs run on the
 * calling thread. Every string the kit returns is owned by it and valid
 * until the next capstan_test_run* (or capstan_test_free). */
#ifndef CAPSTAN_TESTING_H
#define CAPSTAN_TESTING_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "client.h"
#include "config.h"
#include "error.h"
#include "middleware.h"
#include "runtime.h"

typedef struct capstan_test capstan_test_t;

/* A new kit with a runtime of the default configuration (max_retries 25,
 * float timestamps), or NULL out of memory. Free with capstan_test_free. */
CAPSTAN_API capstan_test_t *capstan_test_new(void);
/* Frees the kit, its runtime and everything it captured. NULL is a no-op. */
CAPSTAN_API void capstan_test_free(capstan_test_t *t);

/* The kit's runtime, owned by the kit: register handlers on it with
 * capstan_register (or a plugin's capstan_plugin_init), hooks with
 * capstan_on_error and capstan_on_death, middleware with
 * capstan_runtime_server_chain, exactly as for production. Do not run or
 * free it. */
CAPSTAN_API capstan_runtime_t *capstan_test_runtime(capstan_test_t *t);
/* The runtime's configuration, for what production reads from
 * capstan.yml (max_retries, timestamps, max_iteration_runtime, classes:),
 * read at each run; its Redis settings are not used. Owned by the kit. */
CAPSTAN_API capstan_config_t *capstan_test_config(capstan_test_t *t);

/* Gives the handlers this connection as capstan_job_redis() (borrowed: it
 * must outlive the runs; NULL takes it back). The kit itself never uses
 * it: locks, pushes and iteration state stay in its memory. */
CAPSTAN_API void capstan_test_set_redis(capstan_test_t *t, redisContext *c);

/* Why the last call on t that returned an error failed, in one English
 * line ("" when none did). */
CAPSTAN_API const char *capstan_test_error(const capstan_test_t *t);

/* ---- Running a job --------------------------------------------------- */

/* Runs one job, given as its payload (JSON text, as a client or Ruby's
 * Sidekiq writes it, borrowed for the call), as a processor would run it
 * from queue "queue" (NULL: the payload's "queue", else "default"): the
 * server chain, the handler, then the death hooks when the job is dead.
 * Returns 0 when the job went through the chain, whatever its outcome
 * (read it with capstan_test_result_*); CAPSTAN_EPARSE or CAPSTAN_EINVAL
 * when the payload is not a job (not JSON, no class or jid, args not an
 * array), CAPSTAN_ENOTFOUND when no handler is registered for its class
 * (production would fail it with NameError: a test has registered the
 * wrong name), CAPSTAN_ENOMEM; capstan_test_error says why. */
CAPSTAN_API int capstan_test_run_json(capstan_test_t *t, const char *payload, const char *queue);

/* Builds the job production's client would push for class cls with args
 * (a JSON array text, NULL = "[]"): a new jid, created_at and enqueued_at
 * now, the class's registered options (queue, retry, uniqueness, taking
 * its lock as a push does), then runs it as capstan_test_run_json. opts
 * as for capstan_client_push (may be NULL); a schedule time (opts->at)
 * is written into the payload, but the job runs now. Returns what
 * capstan_test_run_json returns, or CAPSTAN_EDENIED when the client chain
 * refused the push (a uniqueness lock held by another job:
 * capstan_test_error says so, and the job did not run). */
CAPSTAN_API int capstan_test_run(capstan_test_t *t, const char *cls, const char *args,
                                 const capstan_push_opts_t *opts);

/* Runs the last job again from the payload its outcome stored: a retry
 * (CAPSTAN_DISPOSE_RETRY, as the scheduler moves it back when due,
 * retry_count and error fields included), a rescheduled or requeued job
 * (SCHEDULE, REQUEUE). Returns as capstan_test_run_json, or CAPSTAN_EINVAL
 * when the last outcome stored nothing to run. */
CAPSTAN_API int capstan_test_run_again(capstan_test_t *t);

/* ---- The outcome of the last run ------------------------------------- */

/* What production does with the job now: CAPSTAN_DISPOSE_DONE (succeeded,
 * or finished without running: see capstan_test_result_skipped),
 * CAPSTAN_DISPOSE_RETRY (in the retry set until capstan_test_result_at),
 * CAPSTAN_DISPOSE_DEAD (in the dead set: retries exhausted, retry: 0, or
 * a rejected duplicate), CAPSTAN_DISPOSE_DROP (failed with retry: false or
 * dead: false, kept nowhere), CAPSTAN_DISPOSE_SCHEDULE (in the schedule
 * set until capstan_test_result_at: a reschedule conflict strategy),
 * CAPSTAN_DISPOSE_REQUEUE (back at the end of its queue: an interrupted
 * iterable job), CAPSTAN_DISPOSE_KEEP (left in the working list, as when
 * memory ran out). CAPSTAN_DISPOSE_DEFAULT before any run. */
CAPSTAN_API capstan_dispose_t capstan_test_result_fate(const capstan_test_t *t);
/* 1 when the handler ran and succeeded, else 0. */
CAPSTAN_API int capstan_test_result_ok(const capstan_test_t *t);
/* 1 when the handler was called (a job can end without it: a uniqueness
 * conflict, an expired job). */
CAPSTAN_API int capstan_test_result_ran(const capstan_test_t *t);
/* Why the job finished without its handler running ("skipped",
 * "rejected", "rescheduled", "expired", as production's log line says),
 * or NULL. */
CAPSTAN_API const char *capstan_test_result_skipped(const capstan_test_t *t);
/* The failure's error class and message (capstan_job_fail's, or the
 * runtime's such as "RuntimeError" for a bare nonzero return), or NULL
 * when the job did not fail. */
CAPSTAN_API const char *capstan_test_result_error_class(const capstan_test_t *t);
CAPSTAN_API const char *capstan_test_result_error_message(const capstan_test_t *t);
/* The backtrace the handler gave (capstan_job_set_backtrace): its number
 * of lines, and line i, or NULL past the end. */
CAPSTAN_API size_t capstan_test_result_backtrace_len(const capstan_test_t *t);
CAPSTAN_API const char *capstan_test_result_backtrace(const capstan_test_t *t, size_t i);
/* When: for RETRY and SCHEDULE the epoch second the job comes back (the
 * retry's backoff, Sidekiq's count**4 + 15 + jitter), for DEAD its time
 * of death; 0 otherwise. */
CAPSTAN_API double capstan_test_result_at(const capstan_test_t *t);
/* The payload the outcome stores (the retry or dead entry, with
 * retry_count, error_class, failed_at..., byte for byte as production
 * writes it), or NULL for DONE and DROP; *len (may be NULL) its length. */
CAPSTAN_API const char *capstan_test_result_payload(const capstan_test_t *t, size_t *len);
/* The stored payload's retry_count (0 for the first retry), or -1. */
CAPSTAN_API long capstan_test_result_retry_count(const capstan_test_t *t);
/* The job's jid. */
CAPSTAN_API const char *capstan_test_result_jid(const capstan_test_t *t);
/* Why capstan_job_redis() returned NULL to the handler, the first time it
 * did in the run ("capstan_job_redis: the testing kit has no Redis
 * connection (give one with capstan_test_set_redis); CLASS JID"), or NULL
 * when it never did. */
CAPSTAN_API const char *capstan_test_result_redis_error(const capstan_test_t *t);

/* ---- Pushed jobs ----------------------------------------------------- */
/* A capstan_client_t made while the kit runs a job (by a handler, a
 * middleware or a hook), or with capstan_test_client, connects nowhere:
 * what its pushes would write is captured here, after its client chain
 * (uniqueness included: a push whose lock another job holds is denied).
 * In a client transaction a push is captured when made. As
 * Sidekiq::Testing.fake!: they wait to be inspected or run
 * (capstan_test_drain); as inline!, with capstan_test_set_inline, each
 * runs at once, inside the push. */

/* The number of jobs captured (run or not) since the kit was made or
 * last cleared. */
CAPSTAN_API size_t capstan_test_pushed_count(const capstan_test_t *t);
/* Job i's payload as pushed (NUL-terminated; *len may be NULL), or NULL
 * past the end. */
CAPSTAN_API const char *capstan_test_pushed_at(const capstan_test_t *t, size_t i, size_t *len);
/* Job i's queue, or NULL past the end. */
CAPSTAN_API const char *capstan_test_pushed_queue(const capstan_test_t *t, size_t i);
/* Job i's schedule time (epoch seconds; 0: due now). */
CAPSTAN_API double capstan_test_pushed_when(const capstan_test_t *t, size_t i);
/* What became of job i once run (inline or drained): its fate, as
 * capstan_test_result_fate; CAPSTAN_DISPOSE_DEFAULT while not run. */
CAPSTAN_API capstan_dispose_t capstan_test_pushed_fate(const capstan_test_t *t, size_t i);
/* Forgets the jobs captured. */
CAPSTAN_API void capstan_test_clear_pushed(capstan_test_t *t);
/* on: every later push runs its job at once, inside the push, whatever
 * its schedule time (its outcome in capstan_test_pushed_fate; the last
 * run's outcome stays that of the job that pushed). 0: captured only. */
CAPSTAN_API void capstan_test_set_inline(capstan_test_t *t, int on);
/* Runs the captured jobs not run yet, in push order, including those
 * they push meanwhile (as Sidekiq's drain_all), at most max runs (0: no
 * bound). The last run's outcome is that of the last job drained.
 * Returns the number run, or a negative CAPSTAN_E* code from
 * capstan_test_run_json. */
CAPSTAN_API long capstan_test_drain(capstan_test_t *t, long max);
/* A client whose pushes are captured, for a test's own pushes (owned by
 * the caller: capstan_client_free, before capstan_test_free), with the
 * runtime's class options (capstan_client_use_runtime); NULL out of
 * memory. From this call until capstan_test_free, every client the
 * calling thread makes is captured and its locks are the kit's. */
CAPSTAN_API capstan_client_t *capstan_test_client(capstan_test_t *t);

/* ---- Iterable jobs --------------------------------------------------- */

/* Saves cursor (JSON text, copied; NULL removes the state) as job jid's
 * it-<jid> cursor, as an earlier interrupted run would have left it, with
 * executions runs so far. Returns 0, CAPSTAN_EPARSE, CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_test_set_cursor(capstan_test_t *t, const char *jid, const char *cursor,
                                        long executions);
/* The cursor saved for jid (compact JSON text, "null" for a state without
 * one), or NULL when jid has no state: never iterated, or done with
 * (walked everything or cancelled: production deletes it-<jid>). */
CAPSTAN_API const char *capstan_test_cursor(capstan_test_t *t, const char *jid);
/* jid's saved executions ("ex"), 0 without state. */
CAPSTAN_API long capstan_test_executions(const capstan_test_t *t, const char *jid);
/* Interrupts every later run at its n-th capstan_job_checkpoint (counted
 * from 1 within each run) as a stopping process would: the checkpoint
 * says CAPSTAN_ITER_STOP and the job goes back to its queue
 * (CAPSTAN_DISPOSE_REQUEUE). 0: never. */
CAPSTAN_API void capstan_test_interrupt_at(capstan_test_t *t, long n);
/* Marks jid cancelled, as capstan_client_cancel does. Returns 0 or
 * CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_test_cancel(capstan_test_t *t, const char *jid);

/* ---- Uniqueness locks ------------------------------------------------ */

/* Takes, for the job of payload (its jid), the lock it holds while it
 * waits in its queue (until_executed, until_expired, until_executing,
 * until_and_while_executing) or while it runs (while_executing): as if
 * that job were pushed, or running, elsewhere. Returns 0, CAPSTAN_EDENIED
 * (another job holds it), CAPSTAN_EINVAL (the job is not unique, or not a
 * job), CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_test_hold_lock(capstan_test_t *t, const char *payload);
/* The number of locks held now (each digest a job holds, until-lock and
 * runtime lock counted apart). */
CAPSTAN_API size_t capstan_test_locks_held(const capstan_test_t *t);

/* ---- Rate limiters --------------------------------------------------- */

/* Has other jobs take n slots of limiter name (copied) when it is
 * concurrent, or spend n points of its current period for any other type,
 * as jobs elsewhere would: a job of its class then finds it so much
 * fuller. The slots are held until capstan_test_free. Returns 0,
 * CAPSTAN_EINVAL (no name, n < 1) or CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_test_limit_take(capstan_test_t *t, const char *name, long n);

#endif
