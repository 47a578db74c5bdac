/* Internal: the two fetch strategies, reliable (reliable.c) and basic
 * (basic.c), behind one table of operations that a fetcher is made with,
 * and the ack.
 *
 * reliable (default): a job moves atomically from queue:NAME into this
 *   process's working list uniquejobs:working:<identity> and leaves it only
 *   when acknowledged, so a crash never loses it (sidekiq-unique-jobs v9's
 *   key names, so mixed Ruby/C fleets recover each other's orphans).
 * basic: BRPOP, as Sidekiq OSS; a job lives only in memory while it runs.
 *
 * One capstan_fetch_t per processor thread; not thread-safe. */
#ifndef CAPSTAN_FETCH_FETCH_H
#define CAPSTAN_FETCH_FETCH_H

#include <stddef.h>

#include "capstan/config.h"
#include "capstan/redis.h"
#include "redis/scripts.h"

typedef struct capstan_fetch capstan_fetch_t;
/* A strategy's operations (fetch_internal.h): a fetcher is made with one of
 * these and its callers never ask which. */
typedef struct capstan_fetch_ops capstan_fetch_ops_t;
extern const capstan_fetch_ops_t capstan__fetch_reliable;
extern const capstan_fetch_ops_t capstan__fetch_basic;

/* Sidekiq Pro's paused queues: Pro pauses a queue by adding its name
 * (without "queue:") to the set "paused", and its fetchers skip the queues
 * there until the name leaves it. One capstan_paused_t per process: one
 * thread reads the set (capstan__paused_read, at most once a beat: never
 * per fetch) and every fetcher looks at the flags before each fetch,
 * without a lock. */
typedef struct capstan_liveness capstan_liveness_t; /* below */
typedef struct capstan_paused capstan_paused_t;

/* Flags for queues[0..n) (copied), none paused yet. Owned by the caller
 * (capstan__paused_free, NULL is fine); NULL when out of memory. */
capstan_paused_t *capstan__paused_new(const capstan_queue_conf_t *queues, size_t n);
void capstan__paused_free(capstan_paused_t *p);
/* Whether queue i (configured order) was paused at the last read. Any
 * thread; p may be NULL (nothing paused). */
int capstan__paused_is(const capstan_paused_t *p, size_t i);
/* Reads which of p's queues are in "paused" (one SMISMEMBER) and sets the
 * flags; changed[i] (when changed is not NULL: room for every queue) says
 * whether queue i's flag flipped. Returns 0, or CAPSTAN_EREDIS /
 * CAPSTAN_EREPLY / CAPSTAN_ENOMEM with err filled and the flags as they
 * were. One thread at a time. */
int capstan__paused_read(capstan_paused_t *p, capstan_redis_t *r, unsigned char *changed, char *err);
/* Pauses (SADD) or unpauses (SREM) queues[0..n), n >= 1, as Sidekiq Pro
 * does; *count gets how many names were added or removed. Returns 0, or
 * CAPSTAN_EREDIS / CAPSTAN_EREPLY / CAPSTAN_ENOMEM with err filled. */
int capstan__paused_set(capstan_redis_t *r, const char *const *queues, size_t n, int pause,
                        long long *count, char *err);

typedef struct capstan_fetch_conf {
    const capstan_fetch_ops_t *ops; /* &capstan__fetch_reliable or _basic */
    const char *identity;          /* process identity (working list name) */
    const capstan_queue_conf_t *queues;
    size_t nqueues;
    int strict;                    /* 1: fixed order; 0: weighted shuffle */
    int index;                     /* processor index: spreads idle waiters
                                      over the queues */
    double block_timeout;          /* seconds to block when all are empty */
    int min_replicas;              /* reliable: WAIT for this many replicas after acks */
    long min_replicas_timeout;     /* ms */
    const capstan_paused_t *paused; /* the process's paused queues (same
                                      queues, same order), borrowed; NULL:
                                      none is ever paused */
    capstan_liveness_t *liveness;  /* reliable: the process's liveness key,
                                      borrowed; a round trip refreshes it
                                      when it is due; NULL: never */
    const struct capstan__qlimits *limits; /* reliable: the caps of queues
                                      (locks/queue_limit.h), borrowed; a
                                      queue at one is not fetched from;
                                      NULL: none */
} capstan_fetch_conf_t;

typedef enum {
    CAPSTAN_ACK_OK = 0, /* finished: forget the job */
    CAPSTAN_ACK_RETRY, /* store payload in "retry" at score */
    CAPSTAN_ACK_DEAD, /* store payload in "dead" at score, trimmed */
    CAPSTAN_ACK_DROP, /* failed, kept nowhere (retry: false) */
    CAPSTAN_ACK_SCHEDULE, /* store payload in "schedule" at score (rescheduled) */
    CAPSTAN_ACK_REQUEUE, /* push payload to the end of queue:<queue> (interrupted) */
} capstan_ack_kind_t;

typedef struct capstan_ack {
    capstan_ack_kind_t kind;
    double score;
    const char *payload;  /* what to store for RETRY/DEAD */
    size_t len;
    double dead_cutoff;   /* dead entries scored below this are trimmed */
    long dead_max;        /* dead set keeps at most this many */
    const char *lock_key; /* "<digest>:LOCKED" whose hold by lock_jid is */
    const char *lock_jid; /*   released with the ack, or NULL; the job's jid */
    int lock_quiet;       /* no one waits for that lock (it has no
                             lock_timeout): its waiters' line is not woken */
    const char *bid;      /* the job's batch, moved in the ack's step, or NULL */
    const char *queue;    /* REQUEUE: the queue's name */
} capstan_ack_t;

/* A fetched job: payload owned by the caller, queue borrowed from the
 * fetcher (valid until capstan__fetch_free). When the fetch checked the job's
 * uniqueness lock on the way (the reliable fetch's script does for payloads
 * with a lock_digest), held_digest and held_jid are the "lock_digest" and
 * "jid" it found in the payload by plain search (not parsed) holding
 * "<held_digest>:LOCKED"; trust them only where they equal the caller's own
 * parse of the payload. Owned; NULL otherwise. capstan__fetched_clear frees all
 * three. */
typedef struct capstan_fetched {
    char *payload;
    size_t len;
    const char *queue;
    char *held_digest;
    char *held_jid;
    unsigned long long seq; /* the order Redis ran the fetches in (Redis's
                               clock at the fetch script or the move) */
    unsigned long long hash; /* the caller's, to count what it holds by */
} capstan_fetched_t;

void capstan__fetched_clear(capstan_fetched_t *job);

/* One acknowledgement of a batch (capstan__fetch_exchange): the payload as
 * fetched, the ack, and its result (0 written; CAPSTAN_EREDIS not known to be
 * written: ack again, which is harmless since an ack only acts on a job
 * still in the working list). */
typedef struct capstan_ack_item {
    const char *raw;
    size_t len;
    capstan_ack_t ack;
    int rc;
} capstan_ack_item_t;

/* Paused queues (conf->paused) are left out of every fetch; when all are
 * paused a fetch finds nothing, and a blocking one waits out the block
 * timeout first, as an empty queue would make it.
 *
 * Writes nacks acks, then fetches up to max jobs into out[0..max): with the
 * reliable fetch all in one round trip, the jobs moved from the first
 * non-empty queues in order by one script, and, when block is set and all
 * were empty, one blocking move for one job (up to the block timeout). The
 * basic fetch does the acks one by one and fetches one job at most,
 * blocking. Returns the number of jobs fetched (0 when none came or max is
 * 0), or CAPSTAN_EREDIS (a broken connection or an error reply: see
 * capstan_redis_ok) or CAPSTAN_ENOMEM; each ack's rc says whether it was written
 * either way. */
int capstan__fetch_exchange(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                            size_t nacks, capstan_fetched_t *out, size_t max, int block);
/* capstan__fetch_exchange with ncalls script calls sent after the acks and
 * before the fetch, in the same round trip; each call's reply is left in
 * it (NULL when the connection failed first). A NOSCRIPT reply is retried
 * on its own once the connection has loaded the scripts again. */
int capstan__fetch_exchange_calls(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                  size_t nacks, capstan_script_call_t *calls, size_t ncalls,
                                  capstan_fetched_t *out, size_t max, int block);

/* The two halves of a reliable fetch's capstan__fetch_exchange, for a caller
 * that does something else while the round trip is on its way: send writes
 * the acks and a fetch of up to max jobs (not blocking) and returns what
 * reading the replies needs, or NULL with *rc set (CAPSTAN_EINVAL with the
 * basic fetch); recv reads them (acks' rc and out as capstan__fetch_exchange
 * sets them, out with room for max) and frees x. Between the two, r is
 * used for nothing else. */
typedef struct capstan_exchange capstan_exchange_t;
capstan_exchange_t *capstan__fetch_send(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                        size_t nacks, size_t max, int *rc);
int capstan__fetch_recv(capstan_fetch_t *f, capstan_redis_t *r, capstan_exchange_t *x, capstan_ack_item_t *acks,
                        capstan_fetched_t *out);

/* Returns a fetcher owned by the caller, or NULL with err filled. */
capstan_fetch_t *capstan__fetch_new(const capstan_fetch_conf_t *conf, char *err);
void capstan__fetch_free(capstan_fetch_t *f);

/* How many of f's fetches (the sweep, the move or BRPOP) Redis answered
 * without an error reply, job or none: a fetch that works is one that moved
 * this count. */
unsigned long capstan__fetch_answered(capstan_fetch_t *f);

/* Waits up to block_timeout for a job. Returns 1 with *out filled, 0 when
 * no job came, CAPSTAN_EREDIS when the connection failed or CAPSTAN_ENOMEM. */
int capstan__fetch_next(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *out);

/* Finishes a job fetched by f (raw is the payload as fetched). With the
 * reliable fetch the failure is written and the job leaves the working list
 * in one script, and only if it was still there (a job recovered or requeued
 * meanwhile is not written twice). Returns 0, or CAPSTAN_EREDIS: the job stays in
 * the working list; call again after reconnecting. */
int capstan__fetch_ack(capstan_fetch_t *f, capstan_redis_t *r, const char *raw, size_t len,
                       const capstan_ack_t *ack);

/* Puts an unfinished job back at the end of queue that is fetched next.
 * Returns 0, CAPSTAN_EREDIS, or CAPSTAN_EREPLY when queue:NAME holds another type
 * than a list (the job then stays in the working list). */
int capstan__fetch_requeue(capstan_fetch_t *f, capstan_redis_t *r, const char *queue,
                           const char *raw, size_t len);
/* The same for n jobs of one queue in one call, newest first (the last
 * ends at the head). */
int capstan__fetch_requeue_n(capstan_fetch_t *f, capstan_redis_t *r, const char *queue,
                             const char *const *raws, const size_t *lens, size_t n);

/* The working list and liveness key names for an identity, into out. */
void capstan__fetch_working_key(const char *identity, char *out, size_t n);
void capstan__fetch_liveness_key(const char *identity, char *out, size_t n);

/* A process's liveness key: identity is alive while it exists. v9 uses a
 * TTL of 60 s, refreshed at least every TTL / 3; until the key lapses no
 * recovery touches identity's working list. One per process, shared by its
 * housekeeper and its fetchers (which refresh it too when the housekeeper
 * has not for half the TTL). NULL when out of memory. */
capstan_liveness_t *capstan__liveness_new(const char *identity, double ttl);
void capstan__liveness_free(capstan_liveness_t *l);
/* Extends the key with PEXPIRE (which Redis at maxmemory still takes) and
 * creates it only when it is gone, then clears recovery's suspect marker.
 * Returns 0 (extended), 1 (it was gone and is created again), CAPSTAN_EREDIS or
 * CAPSTAN_EREPLY (refused, e.g. at maxmemory while the key is gone). */
int capstan__liveness_refresh(capstan_liveness_t *l, capstan_redis_t *r);
/* Whether no refresh was taken for half the TTL (l may be NULL: never).
 * Any thread. */
int capstan__liveness_due(const capstan_liveness_t *l);
/* Appends the key's creation and the marker's deletion to r's pipeline
 * (*sent: when), and reads their replies. Return 0 or CAPSTAN_EREDIS; a
 * refused write is not an error here (the housekeeper says it). */
int capstan__liveness_append(capstan_liveness_t *l, capstan_redis_t *r, double *sent);
int capstan__liveness_read(capstan_liveness_t *l, capstan_redis_t *r, double sent);

/* Orphan recovery: for every working list whose owner's liveness key is
 * gone, puts its jobs back at the fetched end of their queues, keeping their
 * locks, and counts the recovery in the payload ("recovery_count"). A job
 * recovered max_recoveries times goes to the dead set instead (a poison pill:
 * it kills whatever runs it), counted as Sidekiq counts a job that raised:
 * stat:processed, stat:failed and, in the layouts (config's
 * sidekiq_metrics, 0 none), the Metrics tab. Never touches a live owner's
 * list.
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
typedef struct capstan_recovery {
    long lists;      /* dead processes' lists emptied */
    long recovered;  /* jobs put back */
    long killed;     /* poison pills sent to dead */
    long suspects;   /* lists without a liveness key, not taken yet */
    long left;       /* jobs left: their destination holds another type */
} capstan_recovery_t;

int capstan__fetch_recover(capstan_redis_t *r, const char *own_identity, int max_recoveries,
                           double liveness_ttl, capstan_ts_format_t ts, int layouts,
                           capstan_recovery_t *out, char *err);

/* The same for the lists of the identities in capstan:working only, which
 * every reliable-fetch process adds itself to with its liveness key: a
 * pass that costs the number of processes, not of keys, where SCAN walks
 * the whole keyspace. Lists it cannot know (Ruby's, or of a process that
 * never reached Redis with its set entry) wait for the next full pass. */
int capstan__fetch_recover_known(capstan_redis_t *r, const char *own_identity, int max_recoveries,
                                 double liveness_ttl, capstan_ts_format_t ts, int layouts,
                                 capstan_recovery_t *out, char *err);

/* Whether the pass-th orphan pass (0 at start) walks the whole keyspace
 * (capstan__fetch_recover) or only the registered lists (_known): every
 * CAPSTAN_FULL_PASS_EVERY-th, the first included (every minute at the
 * default 4-s recovery_interval, as often as before that interval was
 * shortened, so Ruby's lists are found as soon as before), and every pass
 * on a keyspace of at most CAPSTAN_SMALL_KEYSPACE keys, which a SCAN walks
 * for less than the registry would save. */
enum { CAPSTAN_FULL_PASS_EVERY = 15, CAPSTAN_SMALL_KEYSPACE = 10000 };
int capstan__fetch_recover_full_due(capstan_redis_t *r, long pass);

/* Same, for one identity's list only and at once: no suspect marker, so
 * the list is taken at the first call that finds the liveness key gone.
 * Nothing in capstan calls it; tests do, to recover exactly the list they
 * name: capstan__fetch_recover takes every list whose key is gone, and of a
 * worker still running whose key a test deleted it only marks the list a
 * suspect (the worker re-creates its key before a later pass). */
int capstan__fetch_recover_one(capstan_redis_t *r, const char *identity, int max_recoveries,
                               capstan_ts_format_t ts, int layouts, capstan_recovery_t *out, char *err);

/* For a worker known to be dead (its supervisor reaped it), so no lease
 * need lapse: deletes its liveness key and recovers its list at once. Only
 * a job whose jid is in started counts a recovery (and may so become a
 * poison pill); a job it had fetched ahead and not started goes back to
 * the fetched end of its queue untouched. started NULL counts every job,
 * as orphan recovery does. Returns as capstan__fetch_recover. */
typedef struct capstan_started {
    const char *const *jids;
    size_t n;
} capstan_started_t;

int capstan__fetch_recover_dead(capstan_redis_t *r, const char *identity, const capstan_started_t *started,
                                int max_recoveries, capstan_ts_format_t ts, int layouts,
                                capstan_recovery_t *out, char *err);

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
 * pass). since is capstan__mono() before the list was read at the pass that
 * first saw it unheld, or -1 for a job not seen before. It is called from
 * the caller's thread. st carries suspects between passes: one
 * per process, from capstan__strays_new (NULL when out of memory), freed with
 * capstan__strays_free (NULL is fine). Not thread-safe. Returns 0 with
 * *reclaimed set, or CAPSTAN_EREDIS / CAPSTAN_EREPLY / CAPSTAN_ENOMEM with err filled. */
typedef int (*capstan_fetch_held_fn)(const char *payload, size_t len, double since, void *udata);
typedef struct capstan_strays capstan_strays_t;

capstan_strays_t *capstan__strays_new(void);
void capstan__strays_free(capstan_strays_t *st);
int capstan__fetch_reclaim(capstan_redis_t *r, const char *identity, capstan_strays_t *st,
                           double min_age, capstan_fetch_held_fn held, void *udata,
                           long *reclaimed, char *err);

/* One working list, as `capstan stats` shows it. */
typedef struct capstan_working_info {
    char *identity;          /* owner: hostname:pid:12hex (owned by the array) */
    long long length;        /* jobs in the list (> 0) */
    int alive;               /* 1 while the owner's liveness key exists */
    long long liveness_ms;   /* ms left on the liveness key; -1 no expiry, 0 gone */
} capstan_working_info_t;

/* Lists every non-empty working list in the database (including this
 * process's own), sorted by identity. On success *out is an array of *n
 * entries owned by the caller (free with capstan__fetch_working_info_free; NULL
 * when there are none). Returns 0, or CAPSTAN_EREDIS / CAPSTAN_EREPLY / CAPSTAN_ENOMEM
 * with err filled and *out, *n unchanged. Reads only: safe to call at any
 * time. */
int capstan__fetch_list_working(capstan_redis_t *r, capstan_working_info_t **out, size_t *n,
                                char *err);
/* Frees what capstan__fetch_list_working returned; NULL is fine. */
void capstan__fetch_working_info_free(capstan_working_info_t *info, size_t n);

#endif
