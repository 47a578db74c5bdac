/* Uniqueness locks, wire-compatible with sidekiq-unique-jobs v9.
 *
 * A lock is the hash "<digest>:LOCKED" (holder jid -> metadata JSON), with
 * the digest indexed in the zset "uniquejobs:digests"; runtime locks use
 * "<digest>:RUN:LOCKED". Digests are computed exactly as v9 does, so a lock
 * taken by a Ruby client is released by capstan and the reverse.
 *
 * The client and server middleware (capstan_unique_client_mw,
 * capstan_unique_server_mw) are installed in capstan's chains by default; the
 * functions below are the pieces they are made of, for tools and tests. */
#ifndef CAPSTAN_UNIQUE_H
#define CAPSTAN_UNIQUE_H

#include <stddef.h>

#include "error.h"
#include "redis.h"

typedef enum capstan_lock_type {
    CAPSTAN_LOCK_NONE = 0,
    CAPSTAN_LOCK_UNTIL_EXECUTING,
    CAPSTAN_LOCK_UNTIL_EXECUTED,
    CAPSTAN_LOCK_UNTIL_EXPIRED,
    CAPSTAN_LOCK_WHILE_EXECUTING,
    CAPSTAN_LOCK_WHILE_EXECUTING_REJECT,
    CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING,
} capstan_lock_type_t;

typedef enum capstan_on_conflict {
    CAPSTAN_CONFLICT_DEFAULT = 0, /* not set: log */
    CAPSTAN_CONFLICT_LOG,
    CAPSTAN_CONFLICT_RAISE,
    CAPSTAN_CONFLICT_REJECT,
    CAPSTAN_CONFLICT_REPLACE,
    CAPSTAN_CONFLICT_RESCHEDULE,
} capstan_on_conflict_t;

typedef enum capstan_digest_alg {
    CAPSTAN_DIGEST_MD5 = 0, /* v9 :legacy, the default */
    CAPSTAN_DIGEST_SHA3_256, /* v9 :modern */
} capstan_digest_alg_t;

/* The options of a unique job class. Start from CAPSTAN_UNIQUE_OPTS_INIT. */
typedef struct capstan_unique_opts {
    capstan_lock_type_t lock;
    long lock_ttl;                   /* seconds; <= 0 = no expiry (JSON null) */
    long lock_timeout;               /* seconds a runtime lock is waited for */
    int lock_limit;                  /* holders sharing a digest; <= 0 = 1 */
    const char *lock_prefix;         /* NULL = "uniquejobs" */
    const int *lock_args;            /* indexes of args that make lock_args, */
    size_t nlock_args;               /*   or NULL: all of args */
    capstan_on_conflict_t on_conflict_client;
    capstan_on_conflict_t on_conflict_server;
    int unique_across_queues;
    int unique_across_workers;
    capstan_digest_alg_t digest_alg;
    double schedule_in;              /* reschedule delay; <= 0 = 5 s */
} capstan_unique_opts_t;

#define CAPSTAN_UNIQUE_OPTS_INIT { CAPSTAN_LOCK_NONE, 0, 0, 0, NULL, NULL, 0, \
    CAPSTAN_CONFLICT_DEFAULT, CAPSTAN_CONFLICT_DEFAULT, 0, 0, CAPSTAN_DIGEST_MD5, 0 }

#define CAPSTAN_DIGEST_MAX 320 /* room for "<prefix>:<64 hex>:RUN" */

/* Reads a lock type or one of v9's aliases (until_completed, while_busy,
 * ...). Returns 0 with *out set, or CAPSTAN_EINVAL for an unknown name. */
CAPSTAN_API int capstan_lock_type_parse(const char *name, capstan_lock_type_t *out);
/* The error class of a job the server rejected because its lock was held
 * (on_conflict: reject, while_executing_reject): its dead-set entry's
 * error_class and what death hooks (capstan_on_death) get. */
#define CAPSTAN_UNIQUE_REJECTED "Capstan::UniqueJobRejected"

/* The canonical v9 name ("until_executed"), or "" for CAPSTAN_LOCK_NONE;
 * static. */
CAPSTAN_API const char *capstan_lock_type_name(capstan_lock_type_t t);

/* Reads log, raise, reject, replace or reschedule. Returns 0 or CAPSTAN_EINVAL.
 * _name gives the word back (static). */
CAPSTAN_API int capstan_on_conflict_parse(const char *name, capstan_on_conflict_t *out);
CAPSTAN_API const char *capstan_on_conflict_name(capstan_on_conflict_t s);

/* Maps Sidekiq Enterprise's `unique_for: S, unique_until: start|success`
 * onto opts: until_executing (start) or until_executed (success, the
 * default when until is NULL), with lock_ttl S. Returns 0 or CAPSTAN_EINVAL. */
CAPSTAN_API int capstan_unique_for(capstan_unique_opts_t *opts, long seconds, const char *until);

/* What the digest is computed over. */
typedef struct capstan_digest_input {
    const char *cls;
    const char *queue;
    const char *lock_args;       /* JSON array text (any spacing) */
    size_t lock_args_len;        /* 0 = strlen */
    const char *apartment;       /* raw JSON value of "apartment", or NULL */
    size_t apartment_len;
    const char *lock_prefix;     /* NULL = "uniquejobs" */
    int unique_across_queues;
    int unique_across_workers;
    capstan_digest_alg_t alg;
} capstan_digest_input_t;

/* Computes v9's lock_digest "<prefix>:<hex>" into out (CAPSTAN_DIGEST_MAX
 * bytes, the caller's). When canon is not NULL it receives the hashed JSON
 * (malloc'd, owned by the caller: free it). Returns 0, or CAPSTAN_EINVAL / CAPSTAN_EPARSE with err filled. */
CAPSTAN_API int capstan_unique_digest(const capstan_digest_input_t *in, char out[CAPSTAN_DIGEST_MAX],
                                      char **canon, char *err);

/* One lock attempt. */
typedef struct capstan_lock_req {
    const char *digest;     /* base digest, without :RUN or :LOCKED */
    int runtime;            /* 1: "<digest>:RUN:LOCKED" */
    const char *jid;
    capstan_lock_type_t type;
    long ttl;               /* seconds, <= 0 = none */
    int limit;              /* <= 0 = 1 */
    const char *metadata;   /* v9 metadata JSON; NULL = built from fields */
    const char *cls, *queue, *lock_args; /* for built metadata */
    long timeout;
    double at;              /* job's "at", 0 = none */
} capstan_lock_req_t;

typedef enum {
    CAPSTAN_LOCK_ACQUIRED = 1, /* newly taken by jid */
    CAPSTAN_LOCK_REENTERED = 2, /* jid already held it */
} capstan_lock_result_t;

/* Takes the lock for jid, without waiting. Returns CAPSTAN_LOCK_ACQUIRED,
 * CAPSTAN_LOCK_REENTERED, CAPSTAN_EDENIED when the limit is reached by other jids,
 * or CAPSTAN_EREDIS / CAPSTAN_EREPLY with err filled. */
CAPSTAN_API int capstan_unique_lock(capstan_redis_t *r, const capstan_lock_req_t *req, char *err);

/* Releases jid's hold (v9's unlock: until_expired is left alone unless
 * force). Returns 0 when released or already free, CAPSTAN_EDENIED when other
 * jids hold it, CAPSTAN_EREDIS / CAPSTAN_EREPLY with err filled. */
CAPSTAN_API int capstan_unique_unlock(capstan_redis_t *r, const char *digest, int runtime,
                                      const char *jid, capstan_lock_type_t type, int force, char *err);

/* Takes the lock as capstan_unique_lock does, waiting up to timeout seconds
 * (the class's lock_timeout) in line by arrival time ("<key>:WAITING" zset;
 * entries older than the timeout are dropped as abandoned): it tries again
 * at once when a release wakes it (it blocks on "<key>:WAKE", which
 * capstan_unique_unlock and a job's ack push to), and every 0.05 to 0.15 s
 * otherwise. timeout <= 0 is one attempt. Returns what capstan_unique_lock
 * returns (CAPSTAN_EDENIED on timeout). */
CAPSTAN_API int capstan_unique_lock_wait(capstan_redis_t *r, const capstan_lock_req_t *req,
                                         double timeout, char *err);

#endif
