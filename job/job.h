/* The job as the modules see it (struct capstan_job, behind the public
 * capstan_job_t), ActiveJob unwrapping, and the retry rules for a failed job
 * (retry.c); not part of the public API. */
#ifndef CAPSTAN_JOB_JOB_H
#define CAPSTAN_JOB_JOB_H

#include <stdatomic.h>
#include <stddef.h>

#include "support/json.h"
#include "support/payload.h"
#include "capstan/job.h"

/* Room in the job for a payload's members and its class and jid: most
 * payloads need no allocation for them. A job holding them there is moved
 * only by capstan__job_move. */
enum { CAPSTAN_JOB_MEMBERS = 12, CAPSTAN_JOB_NAMES = 64 };

struct capstan_job {
    char *payload;          /* owned, byte-exact as fetched */
    size_t len;
    capstan_jobject_t obj;  /* member spans of payload (in members, unless
                               there are more) */
    char *bid;              /* owned: the batch it belongs to ("bid"), or NULL */
    char *names;            /* owned: the payload's "class" and "jid", decoded
                               one after the other, when they do not fit in
                               names_room; else NULL */
    char *cls, *jid;        /* decoded, in names or names_room (or NULL); cls
                               is the class capstan runs: an ActiveJob
                               payload's wrapped class, then owned on its own */
    char *wrapper;          /* the payload's "class" (in names) when it is
                               ActiveJob's wrapper (then cls differs), else NULL */
    const char *queue;      /* the queue it was fetched from (borrowed), or
                               own_queue */
    char *own_queue;        /* owned: the payload's "queue", for a job not
                               fetched from its own (the quarantine's) */
    char *traceparent;      /* owned: valid W3C "traceparent", or NULL */
    char *tracestate;       /* owned: its "tracestate", or NULL */
    char trace_id[33];      /* the traceparent's trace id, "" without one */
    long retry_count;       /* -1 when absent */
    json_t *wrapper_args;   /* the payload's own "args", parsed on demand */
    int wrapper_args_tried;
    json_t *aj_args;        /* ActiveJob's arguments, deserialized on demand */
    int aj_tried;
    size_t aj_raw, aj_rawlen; /* ActiveJob: where args[0]["arguments"] lies in
                               payload (aj_rawlen 0: not found) */
    redisContext *redis;    /* the processor's connection (borrowed) */
    char *err_class, *err_msg; /* set by capstan_job_fail */
    char **backtrace;       /* set by capstan_job_set_backtrace, owned */
    size_t nbacktrace;
    const atomic_int *stopping;
    const atomic_int *quiet;      /* the process goes quiet: iterations stop */
    double max_iteration_runtime; /* seconds a run may iterate; 0: no limit */
    struct capstan_iter *iter;    /* iterate.c: the iteration state, once read */
    const struct capstan_sandbox *sandbox; /* the testing kit's, or NULL */
    capstan_jmember_t members[CAPSTAN_JOB_MEMBERS];
    char names_room[CAPSTAN_JOB_NAMES];
};

/* What stands in for Redis when the testing kit (testing/, capstan/testing.h)
 * runs a job; NULL in production. The kit keeps a job's iteration state
 * (it-<jid>) in memory, and hears of a handler that asks for a connection
 * the test did not give. */
typedef struct capstan_sandbox {
    /* capstan_job_redis found no connection. */
    void (*no_redis)(void *ud, const capstan_job_t *job);
    /* it-<jid>: read as a run starts (*cursor a new reference or NULL),
     * written at each flush, dropped when the job is done with it. */
    void (*iter_read)(void *ud, const char *jid, json_t **cursor, long *executions, int *cancelled);
    void (*iter_write)(void *ud, const char *jid, const json_t *cursor, long executions);
    void (*iter_drop)(void *ud, const char *jid);
    /* At each checkpoint: nonzero interrupts the run there, as a stopping
     * process does. */
    int (*iter_stop)(void *ud, const char *jid);
    void *ud;
} capstan_sandbox_t;

/* Parses payload (ownership moves to job, even on failure) fetched from
 * queue, or, queue NULL, from another than its own: the payload's "queue"
 * then is its queue ("default" without one). Returns 0; CAPSTAN_EPARSE
 * when the payload is not a JSON object; CAPSTAN_EINVAL when class or jid
 * is missing or not a string, or args is not an array. err says which. */
int capstan__job_init(capstan_job_t *job, char *payload, size_t len, const char *queue, char *err);
void capstan__job_clear(capstan_job_t *job);
/* Moves the job in src to dst (whose own is cleared already) and zeroes
 * src: a plain copy would leave dst's members and names in src's room. */
void capstan__job_move(capstan_job_t *dst, capstan_job_t *src);

/* The time after which the job is not to start: its top-level
 * "expires_at" (epoch seconds, as Sidekiq Pro's expiry and the
 * sidekiq-expiring-jobs gem write it; a value too large for seconds is
 * read as milliseconds). 0 when it has none, or not a positive number. */
double capstan__job_expires_at(const capstan_job_t *job);

/* activejob.c: when job's payload class is ActiveJob's Sidekiq wrapper
 * (Rails' ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper or Sidekiq
 * 7+'s Sidekiq::ActiveJob::Wrapper), moves it to job->wrapper, sets
 * job->cls to the wrapped class ("wrapped", else args[0]["job_class"], as
 * Sidekiq's display_class reads it) and finds the text of
 * args[0]["arguments"] (job->aj_raw). Out of memory it leaves the job as it
 * is: it then fails with NameError and is retried, as a Ruby process
 * without the class would. */
void capstan__aj_unwrap(capstan_job_t *job);

/* iterate.c: what became of a run that iterated (capstan/job.h). */
typedef enum {
    CAPSTAN_ITERATED_NOT = 0,   /* it did not iterate */
    CAPSTAN_ITERATED_ALL,       /* it walked everything */
    CAPSTAN_ITERATED_STOPPED,   /* interrupted: back to its queue */
    CAPSTAN_ITERATED_CANCELLED, /* cancelled: done */
} capstan_iterated_t;

/* After the handler returned: a run that iterated and failed flushes its
 * state (a retry resumes from the cursor); one that walked everything or
 * was cancelled deletes it-<jid>. Returns what became of the run. */
capstan_iterated_t capstan__job_iter_end(capstan_job_t *job);
/* Writes the state again when the run's last write did not land (job->redis
 * is then a new connection): 0 when it is saved (or was), CAPSTAN_EREDIS. */
int capstan__job_iter_save(capstan_job_t *job);
/* Frees the iteration state (capstan__job_clear calls it). */
void capstan__job_iter_free(capstan_job_t *job);

/* What happens to a failed job. */
typedef enum { CAPSTAN_FATE_RETRY = 0, CAPSTAN_FATE_DEAD, CAPSTAN_FATE_DROP } capstan_fate_t;

typedef struct capstan_failure {
    capstan_fate_t fate;
    double score;     /* retry: when to run again; dead: time of death */
    char *payload;    /* owned: the payload to store (NULL for drop) */
    size_t len;
} capstan_failure_t;

/* What the retry rules read of the configuration. */
typedef struct capstan_retry_conf {
    long max_retries;                /* for a job whose retry is true */
    capstan_ts_format_t timestamps;  /* for a payload without timestamps of its own */
} capstan_retry_conf_t;

/* Applies Sidekiq's retry rules to a failed job: error fields, retry_count,
 * failed_at/retried_at (in the unit of the payload's own timestamps,
 * conf->timestamps for one without: support/payload.h), the backoff
 * count^4 + 15 + rand(10)*(count+1), and exhaustion to the dead set (or
 * nowhere for retry: false / dead: false).
 * "recovery_count" goes: only a job that crashes its process keeps it.
 * class_retry is the class option (CAPSTAN_RETRY_*), used when the payload has
 * no "retry". Returns 0 or CAPSTAN_ENOMEM. */
int capstan__retry_decide(const capstan_job_t *job, const char *err_class, const char *err_msg,
                          int class_retry, const capstan_retry_conf_t *conf, double now,
                          capstan_failure_t *out);

/* A payload that cannot be run (not JSON, no class or jid): a dead-set entry
 * that keeps the original text and says why, its failed_at in the unit of
 * the payload's timestamps as capstan__retry_decide. Returns 0 or
 * CAPSTAN_ENOMEM. */
int capstan__retry_invalid(const char *raw, size_t len, const char *queue, const char *why,
                           const capstan_retry_conf_t *conf, double now, capstan_failure_t *out);

/* Delay in seconds before retry number count (0-based), with jitter. */
double capstan__retry_delay(long count);

void capstan__failure_clear(capstan_failure_t *f);

#endif
