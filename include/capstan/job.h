/* A job as a handler sees it.
 *
 * capstan keeps the payload exactly as the client wrote it (unknown fields and big
 * integers survive byte for byte); the accessors below read the few fields a
 * handler needs. A capstan_job_t is owned by the runtime and valid only for the
 * duration of the handler call. */
#ifndef CAPSTAN_JOB_H
#define CAPSTAN_JOB_H

#include <stddef.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

#include "error.h"

typedef struct capstan_job capstan_job_t;

/* Handler for one job class. Return 0 on success. On failure call
 * capstan_job_fail() (or not: a plain nonzero return fails with RuntimeError) and
 * return nonzero. udata is what was given at registration. */
typedef int (*capstan_handler_fn)(capstan_job_t *job, void *udata);

/* The class whose handler runs the job. For a job enqueued through Rails'
 * ActiveJob (payload class ActiveJob::QueueAdapters::SidekiqAdapter::
 * JobWrapper, or Sidekiq::ActiveJob::Wrapper since Sidekiq 7) it is the
 * wrapped class ("wrapped", e.g. HelloJob), which also names the job in the
 * log lines and metrics; the payload's own "class" stays readable with
 * capstan_job_field_raw(job, "class", &len). Borrowed from the job (valid
 * until the handler returns), as are the jid, bid and queue below. */
CAPSTAN_API const char *capstan_job_class(const capstan_job_t *job);
CAPSTAN_API const char *capstan_job_jid(const capstan_job_t *job);
/* The batch the job belongs to (its "bid", see capstan/batch.h), or NULL. */
CAPSTAN_API const char *capstan_job_bid(const capstan_job_t *job);
/* The queue the job was fetched from (without the "queue:" prefix). */
CAPSTAN_API const char *capstan_job_queue(const capstan_job_t *job);

/* The W3C trace context the job was pushed with: the payload's top-level
 * "traceparent" and "tracestate", where OpenTelemetry's Sidekiq
 * instrumentation puts them (and capstan's client, for the jobs a handler
 * pushes: see doc/handlers.md). capstan_job_traceparent is NULL when the
 * payload has none or one that is not "00-<32 hex>-<16 hex>-<2 hex>" in
 * lowercase with non-zero ids (an invalid one counts as absent, as W3C
 * says); capstan_job_tracestate is NULL without a valid traceparent, or
 * when the payload has none (or not a string of at most 512 printable
 * characters). The trace id (characters 3 to 34 of the traceparent) is in
 * every log line of the job. Borrowed from the job. */
CAPSTAN_API const char *capstan_job_traceparent(const capstan_job_t *job);
CAPSTAN_API const char *capstan_job_tracestate(const capstan_job_t *job);

/* The arguments the job's perform method receives, parsed by jansson. For
 * most jobs that is the payload's "args". For a job enqueued through
 * ActiveJob it is args[0]["arguments"] with ActiveJob's serialization
 * undone, as JSON: a symbol ({"_aj_serialized": "...SymbolSerializer",
 * "value": "sym"}) becomes its name "sym"; any other serializer with a
 * "value" (Time, Date, DateTime, TimeWithZone, Duration, BigDecimal,
 * Module) becomes that value (an ISO 8601 string, seconds, a decimal
 * string, a name); one without (Range, custom serializers) stays an object,
 * "_aj_serialized" included; a GlobalID ({"_aj_globalid": ...}) becomes its
 * "gid://app/Model/1" string; the markers "_aj_symbol_keys",
 * "_aj_ruby2_keywords" and "_aj_hash_with_indifferent_access" are removed
 * from hashes. So one handler reads its arguments the same way whether
 * Ruby pushed the job with perform_async or perform_later.
 * NULL when jansson cannot represent the arguments (for example an integer
 * wider than 64 bits: then use capstan_job_args_raw), or when an ActiveJob
 * payload carries no "arguments" array in args[0].
 * Borrowed from the job (valid until the handler returns); do not decref
 * it. */
CAPSTAN_API json_t *capstan_job_args(capstan_job_t *job);

/* The same arguments as JSON text, byte-exact as the client wrote them
 * (big integers included), for when capstan_job_args is NULL. For an
 * ActiveJob job that is args[0]["arguments"], still in ActiveJob's
 * serialized form (text cannot be deserialized); "[]" when the payload has
 * no "args" or an ActiveJob payload no "arguments". Borrowed from the job
 * (it points into the payload) and not NUL-terminated: *len (may be NULL)
 * receives its length. */
CAPSTAN_API const char *capstan_job_args_raw(const capstan_job_t *job, size_t *len);

/* The payload's own "args", parsed by jansson: for an ActiveJob job the
 * adapter's one-element array [{"job_class": ..., "job_id": ...,
 * "arguments": [...], "executions": ..., "locale": ..., ...}], ActiveJob's
 * serialized job, for a handler that needs more of it than the arguments;
 * for any other job the same array as capstan_job_args. NULL when jansson
 * cannot represent it. Its text is capstan_job_field_raw(job, "args", &len).
 * Borrowed from the job; do not decref it. */
CAPSTAN_API json_t *capstan_job_wrapper_args(capstan_job_t *job);

/* retry_count from the payload, or -1 when the job has never failed. */
CAPSTAN_API long capstan_job_retry_count(const capstan_job_t *job);

/* The whole payload, byte-exact as fetched; *len (may be NULL) receives its
 * length. Borrowed from the job. */
CAPSTAN_API const char *capstan_job_payload(const capstan_job_t *job, size_t *len);

/* The value text of any top-level payload field (for example "tags"), or
 * NULL when absent. Strings are returned with their quotes. Borrowed from
 * the job (it points into the payload) and not NUL-terminated: *len (may
 * be NULL) receives its length. */
CAPSTAN_API const char *capstan_job_field_raw(const capstan_job_t *job, const char *key,
                                              size_t *len);

/* The Redis connection owned by the thread running this job (borrowed:
 * never free it or keep it past the handler call). Never NULL
 * inside a handler: the runtime reconnects before the handler starts (a job
 * never starts without a connection; it waits in the working list). A
 * command can still fail when the connection breaks under it; check its
 * reply. Handlers may issue commands on it; they must leave it without
 * pending replies. */
CAPSTAN_API redisContext *capstan_job_redis(capstan_job_t *job);

/* Marks the job failed with an error class (e.g. "RuntimeError") and a
 * printf-style message, both copied. Returns CAPSTAN_EJOB so a handler can
 * `return capstan_job_fail(job, "ArgumentError", "need %d args", 2);`. */
CAPSTAN_API int capstan_job_fail(capstan_job_t *job, const char *error_class,
                                 const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Gives the failure a backtrace: n lines (copied), stored in the retry and
 * dead entries as Sidekiq's "error_backtrace", which the Web UI shows under
 * the error. A payload's "backtrace" option keeps the first N lines when it
 * is an integer N, and none when it is false. Call it before or after
 * capstan_job_fail; it replaces an earlier one. Returns 0, CAPSTAN_EINVAL or
 * CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_job_set_backtrace(capstan_job_t *job, const char *const *lines,
                                          size_t n);

/* What capstan_job_fail recorded: the error class and the message, or NULL
 * while the job has not failed (so far). Borrowed from the job. */
CAPSTAN_API const char *capstan_job_error_class(const capstan_job_t *job);
CAPSTAN_API const char *capstan_job_error_message(const capstan_job_t *job);

/* True once the process is shutting down: long handlers may check it and
 * return early (failing the job makes it retry later). */
CAPSTAN_API int capstan_job_stopping(const capstan_job_t *job);

/* ---- Iterable jobs (Sidekiq 7.3+'s Sidekiq::IterableJob) ----------------
 * A handler that walks many items keeps a cursor in Sidekiq's own hash
 * it-<jid>, so a deploy, a quiet process or max_iteration_runtime stops it
 * between two steps and the next run (here or on a Ruby process with the
 * class) resumes there:
 *
 *     const json_t *c = capstan_job_cursor(job);     // NULL the first time
 *     for (long i = c ? json_integer_value(c) : 0; i < n; i += 100) {
 *         json_t *at = json_integer(i);
 *         int go = capstan_job_checkpoint(job, at);  // before each step
 *         json_decref(at);
 *         if (go != CAPSTAN_ITER_NEXT)
 *             return 0;                             // capstan does the rest
 *         process(i, i + 100);
 *     }
 *     return 0;                                     // done: the state goes
 *
 * The cursor is the position of the next step (what a resumed run starts
 * from), any JSON value. Returning 0 after CAPSTAN_ITER_STOP puts the same
 * payload (same jid) back at the end of its queue, not through retry;
 * after CAPSTAN_ITER_CANCELLED, or when the handler returns 0 having walked
 * everything, the job is done and it-<jid> is deleted. A failure keeps the
 * cursor, so a retry resumes too. */
enum {
    CAPSTAN_ITER_NEXT = 0,      /* go on with the step */
    CAPSTAN_ITER_STOP = 1,      /* return now: the job is interrupted */
    CAPSTAN_ITER_CANCELLED = 2, /* return now: the job was cancelled */
};

/* The saved cursor (borrowed from the job, valid until the next
 * capstan_job_checkpoint: copy what you keep), or NULL on the first run.
 * The first call of this or capstan_job_checkpoint in a run reads the job's
 * iteration state from Redis and counts this run as one more execution;
 * when Redis cannot be read, or it-<jid> is not a hash or its cursor does
 * not parse (Capstan::IterationStateError), the job fails (its retry
 * resumes from the saved state, left as it was) and
 * capstan_job_checkpoint says CAPSTAN_ITER_STOP. */
CAPSTAN_API const json_t *capstan_job_cursor(capstan_job_t *job);
/* Records cursor (the job takes a reference of its own, so the caller
 * still decrefs its own; do not change it afterwards; NULL means JSON
 * null) as where
 * the step about to run starts, and says whether to run it: the process is
 * going quiet or stopping, or this run passed max_iteration_runtime
 * (CAPSTAN_ITER_STOP: the state is flushed first), the job was cancelled
 * (CAPSTAN_ITER_CANCELLED; seen at the first call, then at each flush), or
 * neither. The state is flushed every 5 seconds, as Sidekiq does. */
CAPSTAN_API int capstan_job_checkpoint(capstan_job_t *job, json_t *cursor);
/* How many runs this job has had, this one included (Sidekiq's "ex"); 0
 * before capstan_job_cursor or capstan_job_checkpoint was called. */
CAPSTAN_API long capstan_job_executions(const capstan_job_t *job);
/* Whether someone cancelled this job (Sidekiq::Client#cancel!, `capstan
 * cancel`, capstan_client_cancel): any handler may poll it between its own
 * steps. Reads Redis at most once a second. */
CAPSTAN_API int capstan_job_cancelled(capstan_job_t *job);

#endif
