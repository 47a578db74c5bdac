/* Internal: housekeeping and visibility for uniqueness locks, the metrics
 * hashes, the reaper, the v8 -> v9 key migration and deleting a lock, for
 * `capstan locks`, `capstan top` and the runtime's housekeeper (which runs
 * the reaper). Not part of the public API: a program using capstan gets all
 * of it from the capstan command and the runtime.
 *
 * Every key here is sidekiq-unique-jobs v9's (reference/unique-jobs.md §1),
 * so a mixed fleet of Ruby and capstan processes shares one set of metrics, one
 * reaper at a time and one migration marker. The few keys v9 has no
 * equivalent for live under "capstan:" (redis/keys.h).
 *
 * No function here is thread-safe on one capstan_redis_t; each thread passes
 * its own connection. */
#ifndef CAPSTAN_UNIQUE_ADMIN_H
#define CAPSTAN_UNIQUE_ADMIN_H

#include <stddef.h>
#include <time.h>

#include "capstan/error.h"
#include "capstan/redis.h"
#include "redis/keys.h"

/* The field v9 writes into the upgrade marker: its VERSION constant, which
 * still reads alpha1 at the alpha2 tag. Writing the same field stops a v9
 * process started later from running the migration again (which would drop
 * live :RUN:LOCKED runtime locks). */
#define CAPSTAN_UNIQUE_UPGRADE_VERSION "9.0.0.alpha1"

/* ---- metrics ------------------------------------------------------------ */

/* One row of v9's metrics table. */
typedef struct capstan_unique_metrics_row {
    char *type;          /* lock type as written, or "total" (always last) */
    long long acquired;  /* locked */
    long long denied;    /* lock_failed */
    long long released;  /* unlocked */
    long long failures;  /* execution_failed + unlock_failed */
} capstan_unique_metrics_row_t;

typedef struct capstan_unique_metrics {
    capstan_unique_metrics_row_t *rows; /* by type name, then "total" */
    size_t n;
} capstan_unique_metrics_t;

/* Sums the metrics hashes of the last `minutes` UTC minutes (<= 0: 60),
 * whoever wrote them, into out (owned by the caller: free with
 * capstan__unique_metrics_clear). The total row is the written total|* fields.
 * Returns 0, or CAPSTAN_EREDIS / CAPSTAN_EREPLY / CAPSTAN_ENOMEM with err filled and out
 * empty. */
int capstan__unique_metrics_read(capstan_redis_t *r, int minutes, capstan_unique_metrics_t *out,
                                 char *err);
void capstan__unique_metrics_clear(capstan_unique_metrics_t *m);

/* ---- reaper --------------------------------------------------------------- */

/* What one run may do. Start from CAPSTAN_REAP_OPTS_INIT. */
typedef struct capstan_reap_opts {
    long count;          /* most digests removed per run; <= 0: 1000 */
    double timeout;      /* seconds of work per run; <= 0: 10 */
    double grace;        /* digests locked less than this many seconds ago keep
                            their holders unchecked (a client locks, then
                            pushes); < 0: timeout + 10, v9's window */
    const char *owner;   /* written into the leases; NULL: "hostname:pid" */
    double role_ttl;     /* > 0: take or keep v9's fleet role uniquejobs:reaper
                            for this many seconds first, and do nothing while
                            another process (Ruby or capstan) holds it; 0: don't */
    int force;           /* 1: skip the per-run lease too (v9's Server.reap) */
} capstan_reap_opts_t;

#define CAPSTAN_REAP_OPTS_INIT { 1000, 10, -1, NULL, 0, 0 }

typedef struct capstan_reap_result {
    long examined;      /* digests looked at */
    long removed;       /* digests removed */
    long stale;         /* of which the LOCKED hash was already gone */
    int busy;           /* 1: another reaper holds a lease; nothing was done */
    char holder[128];   /* that lease's holder, when busy */
    int wrapped;        /* 1: the walk reached the end of uniquejobs:digests */
    int timed_out;      /* 1: stopped by the time budget */
    int incomplete;     /* 1: the job sweep did not finish in time, so digests
                           with holders were kept (fail closed) */
    char **digests;     /* the removed digests, owned by out: free with
                           capstan__reap_result_clear */
    size_t ndigests;
} capstan_reap_result_t;

/* One bounded reaper run. Walks uniquejobs:digests in score order from where
 * the previous run stopped (capstan:reaper:cursor), and removes a digest when its
 * <digest>:LOCKED hash is gone, or when none of its holder jids is in a
 * queue, schedule, retry, a working list uniquejobs:working:*, or the
 * <identity>:work hash of a live process. Never removes an until_expired
 * lock whose hash still has a TTL (Redis expires it; the entry goes once the
 * hash is gone, whatever its score: v9's until_expired score leak).
 *
 * The decision for each batch is re-checked and applied in one Lua script
 * (lua/reap.lua), so a lock re-taken or a job moved meanwhile is kept.
 *
 * At most one run at a time across the fleet (capstan:reaper:running) unless
 * opts->force. out is owned by the caller: capstan__reap_result_clear. Returns 0
 * (out->busy says whether anything ran), CAPSTAN_EINVAL, CAPSTAN_EREDIS or
 * CAPSTAN_EREPLY with err filled; out then holds what was removed so far. */
int capstan__unique_reap(capstan_redis_t *r, const capstan_reap_opts_t *opts,
                         capstan_reap_result_t *out, char *err);
void capstan__reap_result_clear(capstan_reap_result_t *out);

/* ---- admin ---------------------------------------------------------------- */

/* Deletes a lock as v9's web UI does, every holder at once: UNLINK
 * <digest>:LOCKED and ZREM the digest; for a base digest also its runtime
 * lock <digest>:RUN:LOCKED and <digest>:RUN. *removed (may be NULL) gets the
 * number of keys and index entries that existed. Returns 0, CAPSTAN_ENOTFOUND
 * when there was nothing, CAPSTAN_EREDIS or CAPSTAN_EREPLY with err filled. */
int capstan__unique_lock_delete(capstan_redis_t *r, const char *digest, long *removed, char *err);

/* ---- v8 -> v9 migration ------------------------------------------------------ */

typedef struct capstan_upgrade_result {
    int already;        /* 1: the marker says it ran; nothing done */
    int legacy;         /* 1: uniquejobs:dead exists; skipped, as v9 */
    long locks;         /* <digest>:LOCKED hashes visited */
    long deleted;       /* v8 keys removed */
    long merged;        /* uniquejobs:expiring_digests entries merged */
    long indexed;       /* runtime locks added to uniquejobs:digests */
} capstan_upgrade_result_t;

/* v9's UpgradeLocks, once (marker field CAPSTAN_UNIQUE_UPGRADE_VERSION of
 * uniquejobs:live:UPGRADED): for every uniquejobs:*:LOCKED hash removes the
 * v8 digest string and the :QUEUED, :PRIMED, :INFO, :RUN, :RUN:QUEUED,
 * :RUN:PRIMED, :RUN:INFO keys; merges uniquejobs:expiring_digests into
 * uniquejobs:digests; then writes the marker. Unlike v9 it keeps
 * <digest>:RUN:LOCKED (a runtime lock of a job still running during a
 * rolling upgrade) and indexes it so the reaper frees it once that job is
 * gone. Idempotent. Returns 0, CAPSTAN_EREDIS or CAPSTAN_EREPLY with err filled. */
int capstan__unique_upgrade(capstan_redis_t *r, capstan_upgrade_result_t *out, char *err);

#endif
