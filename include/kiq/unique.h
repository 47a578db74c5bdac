/* Uniqueness locks, wire-compatible with sidekiq-unique-jobs v9.
 *
 * A lock is the hash "<digest>:LOCKED" (holder jid -> metadata JSON), with
 * the digest indexed in the zset "uniquejobs:digests"; runtime locks use
 * "<digest>:RUN:LOCKED". Digests are computed exactly as v9 does, so a lock
 * taken by a Ruby client is released by kiq and the reverse.
 *
 * The client and server middleware (kiq_unique_client_mw,
 * kiq_unique_server_mw) are installed in kiq's chains by default; the
 * functions below are the pieces they are made of, for tools and tests. */
#ifndef KIQ_UNIQUE_H
#define KIQ_UNIQUE_H

#include <stddef.h>

#include "error.h"
#include "redis.h"

typedef enum kiq_lock_type {
    KIQ_LOCK_NONE = 0,
    KIQ_LOCK_UNTIL_EXECUTING,
    KIQ_LOCK_UNTIL_EXECUTED,
    KIQ_LOCK_UNTIL_EXPIRED,
    KIQ_LOCK_WHILE_EXECUTING,
    KIQ_LOCK_WHILE_EXECUTING_REJECT,
    KIQ_LOCK_UNTIL_AND_WHILE_EXECUTING,
} kiq_lock_type_t;

typedef enum kiq_on_conflict {
    KIQ_CONFLICT_DEFAULT = 0, /* not set: log */
    KIQ_CONFLICT_LOG,
    KIQ_CONFLICT_RAISE,
    KIQ_CONFLICT_REJECT,
    KIQ_CONFLICT_REPLACE,
    KIQ_CONFLICT_RESCHEDULE,
} kiq_on_conflict_t;

typedef enum kiq_digest_alg {
    KIQ_DIGEST_MD5 = 0,  /* v9 :legacy, the default */
    KIQ_DIGEST_SHA3_256, /* v9 :modern */
} kiq_digest_alg_t;

/* The options of a unique job class. Start from KIQ_UNIQUE_OPTS_INIT. */
typedef struct kiq_unique_opts {
    kiq_lock_type_t lock;
    long lock_ttl;                   /* seconds; <= 0 = no expiry (JSON null) */
    long lock_timeout;               /* seconds a runtime lock is waited for */
    int lock_limit;                  /* holders sharing a digest; <= 0 = 1 */
    const char *lock_prefix;         /* NULL = "uniquejobs" */
    const int *lock_args;            /* indexes of args that make lock_args, */
    size_t nlock_args;               /*   or NULL: all of args */
    kiq_on_conflict_t on_conflict_client;
    kiq_on_conflict_t on_conflict_server;
    int unique_across_queues;
    int unique_across_workers;
    kiq_digest_alg_t digest_alg;
    double schedule_in;              /* reschedule delay; <= 0 = 5 s */
} kiq_unique_opts_t;

#define KIQ_UNIQUE_OPTS_INIT { KIQ_LOCK_NONE, 0, 0, 0, NULL, NULL, 0, \
    KIQ_CONFLICT_DEFAULT, KIQ_CONFLICT_DEFAULT, 0, 0, KIQ_DIGEST_MD5, 0 }

#define KIQ_DIGEST_MAX 320 /* room for "<prefix>:<64 hex>:RUN" */

/* Reads a lock type or one of v9's aliases (until_completed, while_busy,
 * ...). Returns 0 with *out set, or KIQ_EINVAL for an unknown name. */
KIQ_API int kiq_lock_type_parse(const char *name, kiq_lock_type_t *out);
/* The canonical v9 name ("until_executed"), or "" for KIQ_LOCK_NONE. */
KIQ_API const char *kiq_lock_type_name(kiq_lock_type_t t);

/* Reads log, raise, reject, replace or reschedule. Returns 0 or KIQ_EINVAL. */
KIQ_API int kiq_on_conflict_parse(const char *name, kiq_on_conflict_t *out);
KIQ_API const char *kiq_on_conflict_name(kiq_on_conflict_t s);

/* Maps Sidekiq Enterprise's `unique_for: S, unique_until: start|success`
 * onto opts: until_executing (start) or until_executed (success, the
 * default when until is NULL), with lock_ttl S. Returns 0 or KIQ_EINVAL. */
KIQ_API int kiq_unique_for(kiq_unique_opts_t *opts, long seconds, const char *until);

/* What the digest is computed over. */
typedef struct kiq_digest_input {
    const char *cls;
    const char *queue;
    const char *lock_args;       /* JSON array text (any spacing) */
    size_t lock_args_len;        /* 0 = strlen */
    const char *apartment;       /* raw JSON value of "apartment", or NULL */
    size_t apartment_len;
    const char *lock_prefix;     /* NULL = "uniquejobs" */
    int unique_across_queues;
    int unique_across_workers;
    kiq_digest_alg_t alg;
} kiq_digest_input_t;

/* Computes v9's lock_digest "<prefix>:<hex>" into out (KIQ_DIGEST_MAX
 * bytes). When canon is not NULL it receives the hashed JSON (owned by the
 * caller). Returns 0, or KIQ_EINVAL / KIQ_EPARSE with err filled. */
KIQ_API int kiq_unique_digest(const kiq_digest_input_t *in, char out[KIQ_DIGEST_MAX],
                              char **canon, char *err);

/* One lock attempt. */
typedef struct kiq_lock_req {
    const char *digest;     /* base digest, without :RUN or :LOCKED */
    int runtime;            /* 1: "<digest>:RUN:LOCKED" */
    const char *jid;
    kiq_lock_type_t type;
    long ttl;               /* seconds, <= 0 = none */
    int limit;              /* <= 0 = 1 */
    const char *metadata;   /* v9 metadata JSON; NULL = built from fields */
    const char *cls, *queue, *lock_args; /* for built metadata */
    long timeout;
    double at;              /* job's "at", 0 = none */
} kiq_lock_req_t;

typedef enum {
    KIQ_LOCK_ACQUIRED = 1,  /* newly taken by jid */
    KIQ_LOCK_REENTERED = 2, /* jid already held it */
} kiq_lock_result_t;

/* Takes the lock for jid, without waiting. Returns KIQ_LOCK_ACQUIRED,
 * KIQ_LOCK_REENTERED, KIQ_EDENIED when the limit is reached by other jids,
 * or KIQ_EREDIS / KIQ_EREPLY with err filled. */
KIQ_API int kiq_unique_lock(kiq_redis_t *r, const kiq_lock_req_t *req, char *err);

/* Releases jid's hold (v9's unlock: until_expired is left alone unless
 * force). Returns 0 when released or already free, KIQ_EDENIED when other
 * jids hold it, KIQ_EREDIS / KIQ_EREPLY with err filled. */
KIQ_API int kiq_unique_unlock(kiq_redis_t *r, const char *digest, int runtime,
                              const char *jid, kiq_lock_type_t type, int force, char *err);

/* Waiting for a lock (lock_timeout). The default waiter queues the jid in
 * arrival order ("<key>:WAITING" zset, entries older than the timeout are
 * dropped as abandoned) and retries until its turn comes and the lock is
 * free, or the timeout passes. Another implementation (for example FIFO
 * queued locks) can replace it with kiq_unique_set_waiter. wait returns
 * what kiq_unique_lock returns (KIQ_EDENIED on timeout). */
typedef struct kiq_lock_waiter {
    int (*wait)(void *self, kiq_redis_t *r, const kiq_lock_req_t *req,
                double timeout, char *err);
    void *self;
} kiq_lock_waiter_t;

/* Installs w process-wide (NULL restores the default). Call before the
 * runtime starts; w must outlive it. */
KIQ_API void kiq_unique_set_waiter(const kiq_lock_waiter_t *w);
KIQ_API int kiq_unique_lock_wait(kiq_redis_t *r, const kiq_lock_req_t *req,
                                 double timeout, char *err);

#endif
