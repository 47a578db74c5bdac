/* In-memory metrics of this process for the Prometheus endpoint: job
 * counters by class and queue, a job duration histogram by class, lock
 * event counters by lock type, rate limiter series by limiter name (for
 * the limiters this process used), periodic ticks by schedule, and a few
 * counters without labels (orphans recovered, poison pills, Redis
 * reconnects). A sharded process keeps one registry per shard beside the
 * process's (see capstan__metrics_use).
 *
 * They count what this process did since it started, as Prometheus
 * counters should: a fleet is summed in PromQL, and values read from
 * Redis (queue sizes, the v9 per-minute lock hashes) are not counters
 * because every process would export the same fleet-wide numbers.
 *
 * Every function is thread-safe: processor threads update under one short
 * mutex, the HTTP thread copies the series out under it and formats them
 * outside it. */
#ifndef CAPSTAN_OBSERVE_PROMETHEUS_H
#define CAPSTAN_OBSERVE_PROMETHEUS_H

#include <stdatomic.h>
#include <stddef.h>

#include "observe/execution.h"
#include "support/buf.h"

typedef struct capstan_metrics capstan_metrics_t;

/* Counters without labels of their own (with shards, one per shard). */
typedef enum capstan_metric_counter {
    CAPSTAN_METRIC_ORPHANS_RECOVERED = 0, /* jobs put back from dead processes' lists */
    CAPSTAN_METRIC_POISON_PILLS,      /* jobs sent to dead after max_recoveries */
    CAPSTAN_METRIC_REDIS_RECONNECTS,  /* connections re-established after a break */
    CAPSTAN_METRIC_BATCHES_COMPLETED, /* batch callbacks fired by this process's acks */
    CAPSTAN_METRIC_BATCHES_SUCCEEDED,
    CAPSTAN_METRIC_BATCHES_DIED,
    CAPSTAN_METRIC_LATE_ACKS,         /* finished jobs no longer in the working
                                         list when acked (taken meanwhile) */
    CAPSTAN_METRIC_ITERATIONS_INTERRUPTED, /* iterating runs stopped and re-queued */
    CAPSTAN_METRIC_ITERATIONS_RESUMED, /* iterating runs that went on from a cursor */
    CAPSTAN_METRIC_ITERATIONS_CANCELLED, /* iterating runs that saw a cancel */
    CAPSTAN_METRIC_FETCH_ERRORS,      /* fetches answered with an error reply */
    CAPSTAN_METRIC_COUNTER_COUNT
} capstan_metric_counter_t;

/* Distinct label sets kept per registry; jobs of further classes without
 * a handler are counted under class "_other" so a stream of bad payloads
 * with made-up class names cannot grow the process without bound. */
#define CAPSTAN_METRICS_MAX_SERIES 2000

/* A new empty registry owned by the caller (capstan__metrics_free), or NULL. */
capstan_metrics_t *capstan__metrics_new(void);
void capstan__metrics_free(capstan_metrics_t *m);

/* The process's registry (created on first use, lives until the process
 * exits; never NULL unless out of memory at first use): what is recorded
 * outside any shard, and everything without shards. */
capstan_metrics_t *capstan__metrics_default(void);

/* Which registry a series goes to, the one rule: a series recorded for one
 * shard of a sharded process goes to that shard's registry, served with
 * its shard label. Code of the runtime takes it from its runtime
 * (capstan__rt_metrics); code below the runtime, which has none, from the
 * thread it runs on: each thread of a shard's runtime names its registry
 * once, as it starts (capstan__metrics_use), and capstan__metrics_here
 * gives that, or the process's for any other thread (and without shards).
 * capstan__metrics_use returns the thread's registry before (NULL: the
 * process's), for a thread that acts for one shard for a while. */
capstan_metrics_t *capstan__metrics_use(capstan_metrics_t *m);
capstan_metrics_t *capstan__metrics_here(void);

/* Counts one finished job: processed (and failed when failed != 0) for
 * (cls, queue), and seconds into the duration histogram of cls. handler
 * is the registered name of cls's handler, or NULL when it has none: only
 * such jobs count in Sidekiq's execution metrics, as Ruby Sidekiq counts
 * only the classes it can run. NULL strings count as "". A no-op when m is
 * NULL or memory runs out. */
void capstan__metrics_job(capstan_metrics_t *m, const char *cls, const char *queue, double seconds,
                          int failed, const char *handler);

/* Counts one job finished without its handler running, by class and
 * reason (a static word: "rejected", "skipped", "rescheduled",
 * "expired"); such a job is not counted by capstan__metrics_job. */
void capstan__metrics_skipped(capstan_metrics_t *m, const char *cls, const char *reason);

/* Counts one uniqueness lock event as v9 names it (locked, lock_failed,
 * unlocked, unlock_failed, execution_failed), folded into the exported
 * events acquired / denied / released / failures. Unknown events are
 * ignored. */
void capstan__metrics_lock_event(capstan_metrics_t *m, const char *lock_type, const char *event);

/* What a process did with a rate limiter (capstan/limiter.h). */
typedef enum capstan_metric_limiter {
    CAPSTAN_LIMITER_ACQUIRED = 0, /* an acquisition took a slot after waiting seconds */
    CAPSTAN_LIMITER_OVER_LIMIT, /* an acquisition gave up after waiting seconds */
    CAPSTAN_LIMITER_RELEASED, /* a concurrent slot taken was given back */
} capstan_metric_limiter_t;

/* Counts ev for the limiter name: acquired and over_limit observe seconds
 * in the wait histogram; a concurrent slot taken (held != 0) or released
 * moves the gauge of slots this process holds. */
void capstan__metrics_limiter(capstan_metrics_t *m, const char *name, capstan_metric_limiter_t ev,
                              double seconds, int held);

/* Observes the latency of a batch callback this process starts: seconds
 * from its batch being done (the callback's enqueued_at) to now. */
void capstan__metrics_batch_callback(capstan_metrics_t *m, const char *event, double seconds);

/* Counts what a batch step fired: lua/lib/batch_done.lua's counts of
 * completes, successes and deaths, in 10-bit fields from bit 2, 12, 22. */
void capstan__metrics_batch_fired(capstan_metrics_t *m, long long flags);

/* Counts what this process did for the periodic schedule named
 * schedule: ticks it enqueued, and missed ticks it let go. */
void capstan__metrics_periodic(capstan_metrics_t *m, const char *schedule, long enqueued, long missed);

/* Records how far this process's clock is from its Redis's, in seconds
 * (positive: ahead), as last measured: the gauge
 * capstan_clock_offset_seconds, absent until the first measure. */
void capstan__metrics_clock_offset(capstan_metrics_t *m, double seconds);

/* Adds n to one of m's counters. */
void capstan__metrics_add(capstan_metrics_t *m, capstan_metric_counter_t c, long n);
/* Takes what every class did since the last take, as Sidekiq's execution
 * metrics count it, and starts counting again from zero. *out is an array
 * of the returned count, owned by the caller (capstan__exec_free), NULL
 * when none ran (or no memory: those counts are then kept for the next). */
size_t capstan__metrics_exec_take(capstan_metrics_t *m, capstan_exec_t **out);
/* The counter's value since the process started (0 for a NULL m). */
long capstan__metrics_get(capstan_metrics_t *m, capstan_metric_counter_t c);
/* Renders capstan_worker_restarts_total{slot,cause} from counts[slot *
 * ncauses + cause] (nslots rows), read at each scrape: the supervisor's
 * table in memory it shares with its workers, which must outlive m. Set
 * once, before the metrics are served. */
void capstan__metrics_restarts(capstan_metrics_t *m, const atomic_long *counts, int nslots,
                               const char *const *causes, int ncauses);

/* Appends the counters and histograms, with HELP and TYPE lines, in the
 * Prometheus text format 0.0.4 to b; series sorted by label values.
 * Returns 0 or CAPSTAN_ENOMEM (b may then hold part of the text). */
int capstan__metrics_render(capstan_metrics_t *m, capstan_buf_t *b);
/* The same for a process with shards: m's series, and those of each
 * shards[i] (NULL: none) with the label shard="names[i]" first, each
 * family once. The counters and the clock offset are each shard's; m's
 * own counter lines are left out then unless non-zero (counted by a
 * thread of no shard). */
int capstan__metrics_render_shards(capstan_metrics_t *m, capstan_metrics_t *const *shards,
                                   const char *const *names, size_t nshards, capstan_buf_t *b);

/* Appends s as a label value: backslash, double quote and newline
 * escaped as the format requires, and every byte that does not begin a
 * valid UTF-8 sequence replaced by U+FFFD, since one such byte makes
 * Prometheus reject the whole scrape. Every label value (class, queue,
 * lock type) goes through it. Returns 0 or CAPSTAN_ENOMEM. */
int capstan__metrics_escape(capstan_buf_t *b, const char *s);

/* The upper bounds of the duration histogram (seconds), +Inf excluded. */
extern const double capstan__metrics_buckets[];
extern const size_t capstan__metrics_nbuckets;

#endif
