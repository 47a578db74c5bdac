/* Rate limiters: named limits shared by every process that uses the same
 * Redis, in the spirit of Sidekiq Enterprise's Sidekiq::Limiter.
 *
 *   concurrent  at most `count` holders at once, while every holder
 *               renews its lease. A slot is a lease: the zset
 *               limiter:NAME:held maps holder ids to lease expiry, so a
 *               holder killed with -9 frees its slot when its lease
 *               (lock_timeout, default 30 s) lapses. A holder extends it
 *               while it runs (capstan's middleware does, every
 *               lock_timeout / 3); one that cannot for longer than the
 *               lease (frozen, or cut off from Redis) loses its slot while
 *               it still runs, and others may take it.
 *   window      at most `count` acquisitions per calendar window of
 *               `interval` seconds (1 = each second, 60 = each minute...,
 *               aligned on the epoch, in UTC): limiter:NAME:w:<start ms>.
 *   bucket      `count` tokens, all refilled at the start of each interval:
 *               the hash limiter:NAME:bucket (tokens, refill_at).
 *   sliding     at most `count` acquisitions in any `interval` seconds
 *               (the zset limiter:NAME:sliding of acquisition times).
 *   leaky       bursts of up to `count`, drained at `count` per interval,
 *               so acquisitions flow evenly (limiter:NAME:leaky: level, at).
 *   points      a budget of `count` points restored at `count` per interval;
 *               each acquisition spends its cost (capstan_limiter_acquire_points),
 *               as GraphQL APIs with query costs do (limiter:NAME:points).
 *
 * Each attempt is one Lua step on the Redis server's clock. A refusal tells
 * how long until a slot may be free, so a waiter sleeps exactly that. A
 * concurrent slot is usually given back long before its lease ends, so a
 * waiter there does not sleep: each release pushes to limiter:NAME:free
 * (a short list, trimmed to `count`, expiring with the lease) and a waiter
 * blocks on it (BLPOP, at most a second at a time, which stays as the
 * recheck should a wake-up be lost) and tries again at once. The first use of a name records its type and parameters in
 * limiter:NAME:meta; using the name with others is an error (CAPSTAN_ECONFIG),
 * never a silent mix.
 *
 * Threads: a capstan_limiter_t is read-only once made and may be shared; each
 * thread passes its own capstan_redis_t.
 *
 * Shards: the functions below use the limiter in the Redis of the
 * connection they are given. In a fleet with shards (the file's shards:,
 * doc/sharding.md) a limiter lives in one shard, its home: the shard its
 * limit's shard: names, else the placing rule's pick of its name among
 * every shard. The server middleware takes a class's limit there; a
 * program calling these functions must pass a connection to that shard
 * for its slots to count with the fleet's: capstan_limiter_home gives its
 * URL. */
#ifndef CAPSTAN_LIMITER_H
#define CAPSTAN_LIMITER_H

#include "error.h"
#include "redis.h"

typedef enum capstan_limit_type {
    CAPSTAN_LIMIT_CONCURRENT = 1,
    CAPSTAN_LIMIT_WINDOW,
    CAPSTAN_LIMIT_BUCKET,
    CAPSTAN_LIMIT_SLIDING,
    CAPSTAN_LIMIT_LEAKY,
    CAPSTAN_LIMIT_POINTS,
} capstan_limit_type_t;

typedef struct capstan_limiter capstan_limiter_t;

#define CAPSTAN_LIMIT_NAME_MAX 200 /* bytes of a limiter name */
#define CAPSTAN_LIMIT_TOKEN_MAX 64

/* What an acquisition holds (concurrent: the holder id of the slot); pass
 * it back to capstan_limiter_release. Other types need no release. */
typedef struct capstan_limit_token {
    char id[CAPSTAN_LIMIT_TOKEN_MAX];
} capstan_limit_token_t;

/* A job class's limit, applied around its handler by capstan's server
 * middleware: given in C as capstan_class_opts_t.limit, or in YAML as the
 * class's `limit:` (which fills this same structure, and wins over the C
 * one). Start from CAPSTAN_LIMIT_OPTS_INIT.
 *
 * A job over the limit waits up to wait_timeout (default 5 s) in its
 * processor, then is rescheduled for when a slot may be free; past
 * max_reschedules of those it fails with Capstan::OverLimit into the retry
 * rules. A concurrent limit's reschedules do not count towards
 * max_reschedules: its slots come back as its jobs end, so a job that
 * found them busy is only waiting its turn behind a backlog. A job's payload may carry
 * "limiter_cost": N (an integer >= 1), the points it spends instead of
 * cost. */
typedef struct capstan_limit_opts {
    capstan_limit_type_t type; /* 0 = no limit */
    const char *name;      /* the limiter's name; NULL = the class name */
    long count;            /* size (concurrent, leaky), count (window, bucket,
                              sliding) or points per interval */
    double seconds;        /* the interval; concurrent: lock_timeout (0 = 30) */
    double wait_timeout;   /* seconds a job waits before it is rescheduled */
    long cost;             /* points a job spends (points type only) */
    int max_reschedules;   /* then the job goes through retry */
} capstan_limit_opts_t;

#define CAPSTAN_LIMIT_RESCHEDULES_DEFAULT 20
#define CAPSTAN_LIMIT_WAIT_DEFAULT 5.0 /* s, as Sidekiq Enterprise's wait_timeout */
#define CAPSTAN_LIMIT_OPTS_INIT { 0, NULL, 0, 0, CAPSTAN_LIMIT_WAIT_DEFAULT, 1, \
                                  CAPSTAN_LIMIT_RESCHEDULES_DEFAULT }
#define CAPSTAN_LIMIT_COST_FIELD "limiter_cost" /* a job's own cost, in its payload */

/* Whether o describes a limit capstan can apply: 0, or CAPSTAN_EINVAL with err
 * saying what is wrong. cls stands for a NULL name. */
CAPSTAN_API int capstan_limit_opts_check(const capstan_limit_opts_t *o, const char *cls, char *err);

/* A limiter handle owned by the caller (capstan_limiter_free), or NULL with err
 * filled. name is copied. count: holders (concurrent), or acquisitions per interval.
 * seconds: the interval (window, bucket; > 0), or the lease of a
 * concurrent slot (0 = 30 s). */
CAPSTAN_API capstan_limiter_t *capstan_limiter_new(capstan_limit_type_t type, const char *name, long count,
                                                   double seconds, char *err);
CAPSTAN_API void capstan_limiter_free(capstan_limiter_t *lim);

/* A type's name: "concurrent", "window", "bucket", "sliding", "leaky" or
 * "points", the word of YAML's limit: type and of limiter:NAME:meta
 * (static; "unknown" for any other value). parse reads one back into
 * *out: 0, or CAPSTAN_EINVAL for another word. */
CAPSTAN_API const char *capstan_limit_type_name(capstan_limit_type_t t);
CAPSTAN_API int capstan_limit_type_parse(const char *s, capstan_limit_type_t *out);

/* Takes the limiter, waiting at most wait_timeout seconds (0: one attempt).
 * A concurrent waiter blocks on r itself (BLPOP for up to a second at a
 * time), so r's timeout must be longer than that. Returns 0 (token filled), CAPSTAN_EDENIED when over the limit for the whole
 * budget (*retry_in, if not NULL, then holds the seconds until a slot may
 * be free), CAPSTAN_ECONFIG when the name is in use with another type or
 * parameters, or a Redis error; err says why. */
CAPSTAN_API int capstan_limiter_acquire(capstan_limiter_t *lim, capstan_redis_t *r, double wait_timeout,
                                        capstan_limit_token_t *token, double *retry_in, char *err);
/* capstan_limiter_acquire spending points (points limiters; 1 for the others'
 * sake, which ignore it). points above the limiter's count can never fit:
 * CAPSTAN_EINVAL. */
CAPSTAN_API int capstan_limiter_acquire_points(capstan_limiter_t *lim, capstan_redis_t *r, long points,
                                               double wait_timeout, capstan_limit_token_t *token,
                                               double *retry_in, char *err);
/* Gives a concurrent slot back; only its holder can. Returns 0, or
 * CAPSTAN_ENOTFOUND when the token no longer held a slot (its lease lapsed),
 * or a Redis error. A no-op for the other types. */
CAPSTAN_API int capstan_limiter_release(capstan_limiter_t *lim, capstan_redis_t *r,
                                        const capstan_limit_token_t *token, char *err);
/* Extends a concurrent slot's lease by the limiter's lease from now.
 * Returns 0, CAPSTAN_ENOTFOUND (lapsed) or a Redis error. */
CAPSTAN_API int capstan_limiter_extend(capstan_limiter_t *lim, capstan_redis_t *r,
                                       const capstan_limit_token_t *token, char *err);

struct capstan_config;
/* The Redis URL of limiter name's home in cfg's fleet (cfg's, borrowed):
 * with shards, the one called shard (a limit's shard:; NULL: none), else
 * the placing rule's pick of name among every shard, its name in *home
 * (when home is not NULL); without shards, cfg's redis_url, *home NULL.
 * NULL when shard names no shard of cfg. The same rule as the server
 * middleware's for a class's limit:, so a connection made to this URL
 * (capstan_redis_new) shares the slots of that class's jobs. */
CAPSTAN_API const char *capstan_limiter_home(const struct capstan_config *cfg, const char *name,
                                             const char *shard, const char **home);

/* Acquires (as capstan_limiter_acquire), runs fn(udata), releases. Returns
 * fn's return value, or the acquire's error without calling fn. fn should
 * finish within a concurrent limiter's lease: nothing extends it here. */
CAPSTAN_API int capstan_limiter_within(capstan_limiter_t *lim, capstan_redis_t *r, double wait_timeout,
                                       int (*fn)(void *udata), void *udata, char *err);

#endif
