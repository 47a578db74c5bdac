/* Sidekiq's execution metrics: what the Web UI's Metrics tab and
 * Sidekiq::Metrics::Query read, written in the layouts of Sidekiq 7.x and
 * 8.x so that the classes a team runs in C show there beside its Ruby
 * ones. The counts are kept per class beside the Prometheus series (one
 * lock a job, which that registry takes anyway) and written once a
 * heartbeat: a few commands per class every few seconds, never one a job.
 *
 * The formats, in UTC (Sidekiq's lib/sidekiq/metrics/):
 *   7.x  hash j|YYYYMMDD|H:M (hour and minute not padded), fields CLASS|p
 *        (jobs), CLASS|f (failures), CLASS|ms (milliseconds of the jobs
 *        that succeeded); histogram CLASS-DD-HH:M (day and hour padded);
 *        both kept 8 hours.
 *   8.x  the same fields in j|YYMMDD|H:MM (kept 8 hours) and in the
 *        10-minute rollup j|YYMMDD|H:M, that key less its last character
 *        (kept 3 days); histogram h|CLASS-D-H:M (nothing padded), 8 hours.
 * A histogram is 26 unsigned 16-bit counters (BITFIELD, saturating) of the
 * successful jobs' durations, by the upper bounds in capstan__exec_count.
 * Like Sidekiq, a failure counts in p and f, not in ms or the histogram;
 * and counts a write could not deliver (Redis down) are dropped, not
 * retried: they are a chart, not a ledger. */
#ifndef CAPSTAN_OBSERVE_EXECUTION_H
#define CAPSTAN_OBSERVE_EXECUTION_H

#include <stddef.h>
#include <time.h>

#include "capstan/redis.h"

#define CAPSTAN_EXEC_BUCKETS 26

/* Which layouts to write (config's sidekiq_metrics). */
enum { CAPSTAN_EXEC_LAYOUT_7 = 1, CAPSTAN_EXEC_LAYOUT_8 = 2 };

typedef struct capstan_exec {
    char *cls;                     /* owned by the array it is in */
    unsigned long long processed, failed, ms;
    unsigned long long hist[CAPSTAN_EXEC_BUCKETS];
} capstan_exec_t;

/* Whether cls can be written into these keys: Sidekiq's Metrics page
 * splits each field on '|', and a control character is no class name. */
int capstan__exec_class_ok(const char *cls);
/* Counts one job that ran for seconds into e (cls untouched). */
void capstan__exec_count(capstan_exec_t *e, double seconds, int failed);
/* Frees an array of n taken by capstan__metrics_exec_take; NULL is fine. */
void capstan__exec_free(capstan_exec_t *e, size_t n);
/* Writes e[0..n) into the minute of now in the layouts asked for (a mask
 * of CAPSTAN_EXEC_LAYOUT_*), in one pipelined round trip. Returns 0, or
 * CAPSTAN_EREDIS / CAPSTAN_ENOMEM with err filled. */
int capstan__exec_flush(capstan_redis_t *r, const capstan_exec_t *e, size_t n, int layouts,
                        time_t now, char *err);

/* Adds processed and failed to Sidekiq's stat:processed and stat:failed
 * and to the day's keys of now (UTC, kept 5 years), in one round trip.
 * Returns 0, or CAPSTAN_EREDIS (nothing may have been counted, or some)
 * / CAPSTAN_EREPLY with err filled. */
int capstan__stats_incr(capstan_redis_t *r, long processed, long failed, time_t now, char *err);

#endif
