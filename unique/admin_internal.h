/* Internal: the uniqueness housekeeping beside unique/admin.h that the lock
 * code and the runtime's heartbeat use (counting lock events into v9's
 * metrics hashes, giving up the reaper's role), and reading a digest from
 * the command line. */
#ifndef CAPSTAN_UNIQUE_ADMIN_INTERNAL_H
#define CAPSTAN_UNIQUE_ADMIN_INTERNAL_H

#include <stddef.h>
#include <time.h>

#include "unique/admin.h"

/* Counts one lock event as v9's LockMetrics.record does: HINCRBY of
 * "<lock_type>|<event>" and "total|<event>" in the hash of the current UTC
 * minute, then EXPIRE 28800. lock_type NULL or "" counts as "unknown".
 * v9's events: locked, lock_failed, unlocked, unlock_failed,
 * execution_failed. Returns 0, CAPSTAN_EINVAL (event NULL or empty),
 * CAPSTAN_EREDIS or CAPSTAN_EREPLY. */
int capstan__unique_metric(capstan_redis_t *r, const char *lock_type, const char *event);

/* A running worker counts lock events in memory and writes them once per
 * heartbeat (one pipeline for the lot), so taking or releasing a lock costs
 * no extra round trip: capstan__unique_metrics_buffer(1) turns that on, and
 * capstan__unique_metric_record() then buffers (or, when off or the buffer is
 * full, writes at once on r). capstan__unique_metrics_flush() writes what is
 * buffered, to the minute bucket each event happened in; on an error the
 * counts are kept for the next flush. With shards, a flush writes only the
 * counts of its thread's shard (observe/prometheus.h's
 * capstan__metrics_here), so each reaches its own shard's Redis; those
 * counted outside every shard (the default registry's: a program's own
 * thread) go out with every flush of first's threads, the first shard's,
 * which capstan__unique_metrics_home(first) names (NULL: none). Without
 * shards every count is the default registry's. Thread-safe. */
struct capstan_metrics;
void capstan__unique_metrics_buffer(int on);
void capstan__unique_metrics_home(const struct capstan_metrics *first);
int capstan__unique_metric_record(capstan_redis_t *r, const char *lock_type, const char *event);
int capstan__unique_metrics_flush(capstan_redis_t *r);
/* The same for the minute holding t (tests, and replays of buffered counts). */
int capstan__unique_metric_at(capstan_redis_t *r, const char *lock_type, const char *event,
                              time_t t);
/* Writes "uniquejobs:metrics|yymmdd|H:MM" for the UTC minute of t into out
 * (hour not zero-padded, minute padded, as v9). */
void capstan__unique_metrics_key(time_t t, char *out, size_t n);

/* Gives up v9's fleet role uniquejobs:reaper if owner holds it (at shutdown,
 * so another process takes over at once). Returns 0 or CAPSTAN_EREDIS. */
int capstan__unique_reaper_release(capstan_redis_t *r, const char *owner);

/* Checks a digest given by a person: printable ASCII without spaces or glob
 * characters, at most 512 bytes. A trailing ":LOCKED" is accepted and
 * stripped. Writes the digest into out (n bytes). Returns 0 or CAPSTAN_EINVAL
 * with err saying what is wrong. */
int capstan__unique_digest_parse(const char *arg, char *out, size_t n, char *err);

#endif
