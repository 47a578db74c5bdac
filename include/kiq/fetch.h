/* Fetch strategies behind one interface.
 *
 * reliable (default): a job moves atomically from queue:NAME into this
 *   process's working list uniquejobs:working:<identity> and leaves it only
 *   when acknowledged, so a crash never loses it (sidekiq-unique-jobs v9's
 *   key names, so mixed Ruby/C fleets recover each other's orphans).
 * basic: BRPOP, as Sidekiq OSS; a job lives only in memory while it runs.
 *
 * One kiq_fetch_t per processor thread; not thread-safe. */
#ifndef KIQ_FETCH_H
#define KIQ_FETCH_H

#include <stddef.h>

#include "config.h"
#include "redis.h"

typedef struct kiq_fetch kiq_fetch_t;

typedef struct kiq_fetch_conf {
    kiq_fetch_mode_t mode;
    const char *identity;          /* process identity (working list name) */
    const kiq_queue_conf_t *queues;
    size_t nqueues;
    int strict;                    /* 1: fixed order; 0: weighted shuffle */
    int index;                     /* processor index: spreads idle waiters
                                      over the queues */
    double block_timeout;          /* seconds to block when all are empty */
} kiq_fetch_conf_t;

typedef enum {
    KIQ_ACK_OK = 0,   /* finished: forget the job */
    KIQ_ACK_RETRY,    /* store payload in "retry" at score */
    KIQ_ACK_DEAD,     /* store payload in "dead" at score, trimmed */
    KIQ_ACK_DROP,     /* failed, kept nowhere (retry: false) */
} kiq_ack_kind_t;

typedef struct kiq_ack {
    kiq_ack_kind_t kind;
    double score;
    const char *payload;  /* what to store for RETRY/DEAD */
    size_t len;
    double dead_cutoff;   /* dead entries scored below this are trimmed */
    long dead_max;        /* dead set keeps at most this many */
} kiq_ack_t;

/* A fetched job: payload owned by the caller (free()), queue borrowed from
 * the fetcher (valid until kiq_fetch_free). */
typedef struct kiq_fetched {
    char *payload;
    size_t len;
    const char *queue;
} kiq_fetched_t;

/* Returns a fetcher owned by the caller, or NULL with err filled. */
KIQ_API kiq_fetch_t *kiq_fetch_new(const kiq_fetch_conf_t *conf, char *err);
KIQ_API void kiq_fetch_free(kiq_fetch_t *f);

/* Waits up to block_timeout for a job. Returns 1 with *out filled, 0 when
 * no job came, or KIQ_EREDIS when the connection failed. */
KIQ_API int kiq_fetch_next(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out);

/* Finishes a job fetched by f (raw is the payload as fetched). With the
 * reliable fetch the failure is written and the job leaves the working list
 * in one script, and only if it was still there (a job recovered or requeued
 * meanwhile is not written twice). Returns 0, or KIQ_EREDIS: the job stays in
 * the working list; call again after reconnecting. */
KIQ_API int kiq_fetch_ack(kiq_fetch_t *f, kiq_redis_t *r, const char *raw, size_t len,
                          const kiq_ack_t *ack);

/* Puts an unfinished job back at the end of queue that is fetched next.
 * Returns 0 or KIQ_EREDIS. */
KIQ_API int kiq_fetch_requeue(kiq_fetch_t *f, kiq_redis_t *r, const char *queue,
                              const char *raw, size_t len);

/* The working list and liveness key names for an identity, into out. */
KIQ_API void kiq_fetch_working_key(const char *identity, char *out, size_t n);
KIQ_API void kiq_fetch_liveness_key(const char *identity, char *out, size_t n);

/* Marks identity alive for 60 s (refresh at least every 20 s). */
KIQ_API int kiq_fetch_heartbeat(kiq_redis_t *r, const char *identity);

/* Orphan recovery: for every working list whose owner's liveness key is
 * gone, puts its jobs back at the fetched end of their queues, keeping their
 * locks, and counts the recovery in the payload ("recovery_count"). A job
 * recovered max_recoveries times goes to the dead set instead (a poison pill:
 * it kills whatever runs it). Never touches a live owner's list. */
typedef struct kiq_recovery {
    long lists;      /* dead processes' lists emptied */
    long recovered;  /* jobs put back */
    long killed;     /* poison pills sent to dead */
} kiq_recovery_t;

KIQ_API int kiq_fetch_recover(kiq_redis_t *r, const char *own_identity, int max_recoveries,
                              kiq_ts_format_t ts, kiq_recovery_t *out, char *err);

/* Same, for one identity's list only (used at shutdown on our own list when
 * nothing is running any more, and by tests). */
KIQ_API int kiq_fetch_recover_one(kiq_redis_t *r, const char *identity, int max_recoveries,
                                  kiq_ts_format_t ts, kiq_recovery_t *out, char *err);

#endif
