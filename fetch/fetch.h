/* Internal: fetch strategies behind one interface.
 *
 * reliable (default): a job moves atomically from queue:NAME into this
 *   process's working list uniquejobs:working:<identity> and leaves it only
 *   when acknowledged, so a crash never loses it (sidekiq-unique-jobs v9's
 *   key names, so mixed Ruby/C fleets recover each other's orphans).
 * basic: BRPOP, as Sidekiq OSS; a job lives only in memory while it runs.
 *
 * One kiq_fetch_t per processor thread; not thread-safe. */
#ifndef KIQ_FETCH_FETCH_H
#define KIQ_FETCH_FETCH_H

#include <stddef.h>

#include "kiq/config.h"
#include "kiq/redis.h"
#include "redis/scripts.h"

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
    int min_replicas;              /* reliable: WAIT for this many replicas after acks */
    long min_replicas_timeout;     /* ms */
} kiq_fetch_conf_t;

typedef enum {
    KIQ_ACK_OK = 0,   /* finished: forget the job */
    KIQ_ACK_RETRY,    /* store payload in "retry" at score */
    KIQ_ACK_DEAD,     /* store payload in "dead" at score, trimmed */
    KIQ_ACK_DROP,     /* failed, kept nowhere (retry: false) */
    KIQ_ACK_SCHEDULE, /* store payload in "schedule" at score (rescheduled) */
} kiq_ack_kind_t;

typedef struct kiq_ack {
    kiq_ack_kind_t kind;
    double score;
    const char *payload;  /* what to store for RETRY/DEAD */
    size_t len;
    double dead_cutoff;   /* dead entries scored below this are trimmed */
    long dead_max;        /* dead set keeps at most this many */
    const char *lock_key; /* "<digest>:LOCKED" whose hold by lock_jid is */
    const char *lock_jid; /*   released with the ack, or NULL; the job's jid */
    const char *bid;      /* the job's batch, moved in the ack's step, or NULL */
} kiq_ack_t;

/* A fetched job: payload owned by the caller, queue borrowed from the
 * fetcher (valid until kiq__fetch_free). When the fetch checked the job's
 * uniqueness lock on the way (the reliable fetch's script does for payloads
 * with a lock_digest), held_digest and held_jid are the "lock_digest" and
 * "jid" it found in the payload by plain search (not parsed) holding
 * "<held_digest>:LOCKED"; trust them only where they equal the caller's own
 * parse of the payload. Owned; NULL otherwise. kiq__fetched_clear frees all
 * three. */
typedef struct kiq_fetched {
    char *payload;
    size_t len;
    const char *queue;
    char *held_digest;
    char *held_jid;
    unsigned long long seq; /* the order Redis ran the fetches in (Redis's
                               clock at the fetch script or the move) */
    unsigned long long hash; /* the caller's, to count what it holds by */
} kiq_fetched_t;

void kiq__fetched_clear(kiq_fetched_t *job);

/* One acknowledgement of a batch (kiq__fetch_exchange): the payload as
 * fetched, the ack, and its result (0 written; KIQ_EREDIS not known to be
 * written: ack again, which is harmless since an ack only acts on a job
 * still in the working list). */
typedef struct kiq_ack_item {
    const char *raw;
    size_t len;
    kiq_ack_t ack;
    int rc;
} kiq_ack_item_t;

/* Writes nacks acks, then fetches up to max jobs into out[0..max): with the
 * reliable fetch all in one round trip, the jobs moved from the first
 * non-empty queues in order by one script, and, when block is set and all
 * were empty, one blocking move for one job (up to the block timeout). The
 * basic fetch does the acks one by one and fetches one job at most,
 * blocking. Returns the number of jobs fetched (0 when none came or max is
 * 0), or KIQ_EREDIS (a broken connection or an error reply: see
 * kiq_redis_ok) or KIQ_ENOMEM; each ack's rc says whether it was written
 * either way. */
int kiq__fetch_exchange(kiq_fetch_t *f, kiq_redis_t *r, kiq_ack_item_t *acks,
                       size_t nacks, kiq_fetched_t *out, size_t max, int block);
/* kiq__fetch_exchange with ncalls script calls sent after the acks and
 * before the fetch, in the same round trip; each call's reply is left in
 * it (NULL when the connection failed first). A NOSCRIPT reply is retried
 * on its own once the connection has loaded the scripts again. */
int kiq__fetch_exchange_calls(kiq_fetch_t *f, kiq_redis_t *r, kiq_ack_item_t *acks,
                             size_t nacks, kiq_script_call_t *calls, size_t ncalls,
                             kiq_fetched_t *out, size_t max, int block);

/* The two halves of a reliable fetch's kiq__fetch_exchange, for a caller
 * that does something else while the round trip is on its way: send writes
 * the acks and a fetch of up to max jobs (not blocking) and returns what
 * reading the replies needs, or NULL with *rc set (KIQ_EINVAL with the
 * basic fetch); recv reads them (acks' rc and out as kiq__fetch_exchange
 * sets them, out with room for max) and frees x. Between the two, r is
 * used for nothing else. */
typedef struct kiq_exchange kiq_exchange_t;
kiq_exchange_t *kiq__fetch_send(kiq_fetch_t *f, kiq_redis_t *r, kiq_ack_item_t *acks,
                               size_t nacks, size_t max, int *rc);
int kiq__fetch_recv(kiq_fetch_t *f, kiq_redis_t *r, kiq_exchange_t *x, kiq_ack_item_t *acks,
                    kiq_fetched_t *out);

/* Returns a fetcher owned by the caller, or NULL with err filled. */
kiq_fetch_t *kiq__fetch_new(const kiq_fetch_conf_t *conf, char *err);
void kiq__fetch_free(kiq_fetch_t *f);

/* Waits up to block_timeout for a job. Returns 1 with *out filled, 0 when
 * no job came, or KIQ_EREDIS when the connection failed. */
int kiq__fetch_next(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out);

/* Finishes a job fetched by f (raw is the payload as fetched). With the
 * reliable fetch the failure is written and the job leaves the working list
 * in one script, and only if it was still there (a job recovered or requeued
 * meanwhile is not written twice). Returns 0, or KIQ_EREDIS: the job stays in
 * the working list; call again after reconnecting. */
int kiq__fetch_ack(kiq_fetch_t *f, kiq_redis_t *r, const char *raw, size_t len,
                  const kiq_ack_t *ack);

/* kiq__fetch_ack then kiq__fetch_next in one round trip: the reliable fetch
 * sends the ack and the next fetch together (the basic fetch does them one
 * after the other). *ack_rc receives the ack's result (0, or KIQ_EREDIS:
 * ack again); the return value is kiq__fetch_next's. */
int kiq_fetch_ack_next(kiq_fetch_t *f, kiq_redis_t *r, const char *raw, size_t len,
                       const kiq_ack_t *ack, int *ack_rc, kiq_fetched_t *out);

/* Puts an unfinished job back at the end of queue that is fetched next.
 * Returns 0, KIQ_EREDIS, or KIQ_EREPLY when queue:NAME holds another type
 * than a list (the job then stays in the working list). */
int kiq__fetch_requeue(kiq_fetch_t *f, kiq_redis_t *r, const char *queue,
                      const char *raw, size_t len);
/* The same for n jobs of one queue in one call, newest first (the last
 * ends at the head). */
int kiq__fetch_requeue_n(kiq_fetch_t *f, kiq_redis_t *r, const char *queue,
                        const char *const *raws, const size_t *lens, size_t n);

/* The working list and liveness key names for an identity, into out. */
void kiq__fetch_working_key(const char *identity, char *out, size_t n);
void kiq__fetch_liveness_key(const char *identity, char *out, size_t n);

/* Marks identity alive for ttl seconds (v9 uses 60; refresh at least every
 * ttl/3). Until the key lapses no recovery touches identity's working list.
 * Extends the key with PEXPIRE (which Redis at maxmemory still takes) and
 * creates it only when it is gone, then clears recovery's suspect marker.
 * Returns 0 (extended), 1 (it was gone and is created again), KIQ_EREDIS or
 * KIQ_EREPLY (refused, e.g. at maxmemory while the key is gone). */
int kiq__fetch_heartbeat(kiq_redis_t *r, const char *identity, double ttl);

/* Orphan recovery: for every working list whose owner's liveness key is
 * gone, puts its jobs back at the fetched end of their queues, keeping their
 * locks, and counts the recovery in the payload ("recovery_count"). A job
 * recovered max_recoveries times goes to the dead set instead (a poison pill:
 * it kills whatever runs it). Never touches a live owner's list.
 *
 * A missing key is not proof of death: the owner's refresh may have been
 * refused (maxmemory) or lost (a Redis restart or failover). So the first
 * pass that sees it missing only marks the list a suspect
 * (uniquejobs:orphan:<identity>, holding Redis's time), and a later pass
 * takes it once the key is still missing liveness_ttl / 2 after that by
 * Redis's clock: longer than the owners' refresh interval, so a live owner
 * that reaches Redis has re-created its key (and deleted the marker) by
 * then. Where the marker cannot be written nothing is taken. liveness_ttl 0
 * takes lists at first sight. A job whose queue key holds another type than
 * a list stays in the working list (counted in left). */
typedef struct kiq_recovery {
    long lists;      /* dead processes' lists emptied */
    long recovered;  /* jobs put back */
    long killed;     /* poison pills sent to dead */
    long suspects;   /* lists without a liveness key, not taken yet */
    long left;       /* jobs left: their destination holds another type */
} kiq_recovery_t;

int kiq__fetch_recover(kiq_redis_t *r, const char *own_identity, int max_recoveries,
                      double liveness_ttl, kiq_ts_format_t ts, kiq_recovery_t *out,
                      char *err);

/* Same, for one identity's list only, at once (no suspect marker; used by
 * tests and tools on a list known to be dead). */
int kiq_fetch_recover_one(kiq_redis_t *r, const char *identity, int max_recoveries,
                          kiq_ts_format_t ts, kiq_recovery_t *out, char *err);

/* Strays: jobs in this process's own working list that no processor holds,
 * such as a job moved by a fetch whose reply was lost with the connection.
 * Recovery never looks at a live process's list, so without this such a job
 * would wait there until the process exits. A stray seen at two passes at
 * least min_age seconds apart goes back to the fetched end of its queue
 * (not counted as a recovery: it never ran).
 *
 * held(payload, len, since, udata) says whether this process holds that
 * job: 1 it does, 0 it does not, 2 it cannot tell yet (a fetch whose reply
 * is not read may have moved it: the job stays a suspect, not judged this
 * pass). since is kiq__mono() before the list was read at the pass that
 * first saw it unheld, or -1 for a job not seen before. It is called from
 * the caller's thread. st carries suspects between passes: one
 * per process, from kiq__strays_new (NULL when out of memory), freed with
 * kiq__strays_free (NULL is fine). Not thread-safe. Returns 0 with
 * *reclaimed set, or KIQ_EREDIS / KIQ_EREPLY / KIQ_ENOMEM with err filled. */
typedef int (*kiq_fetch_held_fn)(const char *payload, size_t len, double since, void *udata);
typedef struct kiq_strays kiq_strays_t;

kiq_strays_t *kiq__strays_new(void);
void kiq__strays_free(kiq_strays_t *st);
int kiq__fetch_reclaim(kiq_redis_t *r, const char *identity, kiq_strays_t *st,
                      double min_age, kiq_fetch_held_fn held, void *udata,
                      long *reclaimed, char *err);

/* One working list, as `kiq stats` shows it. */
typedef struct kiq_working_info {
    char *identity;          /* owner: hostname:pid:12hex (owned by the array) */
    long long length;        /* jobs in the list (> 0) */
    int alive;               /* 1 while the owner's liveness key exists */
    long long liveness_ms;   /* ms left on the liveness key; -1 no expiry, 0 gone */
} kiq_working_info_t;

/* Lists every non-empty working list in the database (including this
 * process's own), sorted by identity. On success *out is an array of *n
 * entries owned by the caller (free with kiq__fetch_working_info_free; NULL
 * when there are none). Returns 0, or KIQ_EREDIS / KIQ_EREPLY / KIQ_ENOMEM
 * with err filled and *out, *n unchanged. Reads only: safe to call at any
 * time. */
int kiq__fetch_list_working(kiq_redis_t *r, kiq_working_info_t **out, size_t *n,
                           char *err);
/* Frees what kiq__fetch_list_working returned; NULL is fine. */
void kiq__fetch_working_info_free(kiq_working_info_t *info, size_t n);

#endif
