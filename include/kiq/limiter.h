/* Rate limiters: named limits shared by every process that uses the same
 * Redis, in the spirit of Sidekiq Enterprise's Sidekiq::Limiter.
 *
 *   concurrent  at most `count` holders at once. A slot is a lease: the
 *               zset limiter:NAME:held maps holder ids to lease expiry, so
 *               a holder killed with -9 frees its slot when its lease
 *               (lock_timeout, default 30 s) lapses; a live holder extends
 *               it (kiq's middleware does, every lock_timeout / 3).
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
 *               each acquisition spends its cost (kiq_limiter_acquire_points),
 *               as GraphQL APIs with query costs do (limiter:NAME:points).
 *
 * Each attempt is one Lua step on the Redis server's clock. A refusal tells
 * how long until a slot may be free, so a waiter sleeps exactly that (a
 * concurrent waiter rechecks at least every 50 ms, as a holder may release
 * early). The first use of a name records its type and parameters in
 * limiter:NAME:meta; using the name with others is an error (KIQ_ECONFIG),
 * never a silent mix.
 *
 * Threads: a kiq_limiter_t is read-only once made and may be shared; each
 * thread passes its own kiq_redis_t. */
#ifndef KIQ_LIMITER_H
#define KIQ_LIMITER_H

#include "error.h"
#include "redis.h"

typedef enum kiq_limit_type {
    KIQ_LIMIT_CONCURRENT = 1,
    KIQ_LIMIT_WINDOW,
    KIQ_LIMIT_BUCKET,
    KIQ_LIMIT_SLIDING,
    KIQ_LIMIT_LEAKY,
    KIQ_LIMIT_POINTS,
} kiq_limit_type_t;

typedef struct kiq_limiter kiq_limiter_t;

#define KIQ_LIMIT_NAME_MAX 200 /* bytes of a limiter name */
#define KIQ_LIMIT_TOKEN_MAX 64

/* What an acquisition holds (concurrent: the holder id of the slot); pass
 * it back to kiq_limiter_release. Other types need no release. */
typedef struct kiq_limit_token {
    char id[KIQ_LIMIT_TOKEN_MAX];
} kiq_limit_token_t;

/* A job class's limit, applied around its handler by kiq's server
 * middleware: given in C as kiq_class_opts_t.limit, or in YAML as the
 * class's `limit:` (which fills this same structure, and wins over the C
 * one). Start from KIQ_LIMIT_OPTS_INIT.
 *
 * A job over the limit waits up to wait_timeout in its processor, then is
 * rescheduled for when a slot may be free; past max_reschedules of those it
 * fails with Kiq::OverLimit into the retry rules. A job's payload may carry
 * "limiter_cost": N (an integer >= 1), the points it spends instead of
 * cost. */
typedef struct kiq_limit_opts {
    kiq_limit_type_t type; /* 0 = no limit */
    const char *name;      /* the limiter's name; NULL = the class name */
    long count;            /* size (concurrent, leaky), count (window, bucket,
                              sliding) or points per interval */
    double seconds;        /* the interval; concurrent: lock_timeout (0 = 30) */
    double wait_timeout;   /* seconds a job waits before it is rescheduled */
    long cost;             /* points a job spends (points type only) */
    int max_reschedules;   /* then the job goes through retry */
} kiq_limit_opts_t;

#define KIQ_LIMIT_RESCHEDULES_DEFAULT 20
#define KIQ_LIMIT_OPTS_INIT { 0, NULL, 0, 0, 0, 1, KIQ_LIMIT_RESCHEDULES_DEFAULT }
#define KIQ_LIMIT_COST_FIELD "limiter_cost" /* a job's own cost, in its payload */

/* Whether o describes a limit kiq can apply: 0, or KIQ_EINVAL with err
 * saying what is wrong. cls stands for a NULL name. */
KIQ_API int kiq_limit_opts_check(const kiq_limit_opts_t *o, const char *cls, char *err);

/* A limiter handle owned by the caller (kiq_limiter_free), or NULL with err
 * filled. count: holders (concurrent), or acquisitions per interval.
 * seconds: the interval (window, bucket; > 0), or the lease of a
 * concurrent slot (0 = 30 s). */
KIQ_API kiq_limiter_t *kiq_limiter_new(kiq_limit_type_t type, const char *name, long count,
                                       double seconds, char *err);
KIQ_API void kiq_limiter_free(kiq_limiter_t *lim);

/* "concurrent", "window", "bucket", "sliding", "leaky", "points" <->
 * the type; parse returns 0 or
 * KIQ_EINVAL. */
KIQ_API const char *kiq_limit_type_name(kiq_limit_type_t t);
KIQ_API int kiq_limit_type_parse(const char *s, kiq_limit_type_t *out);

/* Takes the limiter, waiting at most wait_timeout seconds (0: one attempt).
 * Returns 0 (token filled), KIQ_EDENIED when over the limit for the whole
 * budget (*retry_in, if not NULL, then holds the seconds until a slot may
 * be free), KIQ_ECONFIG when the name is in use with another type or
 * parameters, or a Redis error; err says why. */
KIQ_API int kiq_limiter_acquire(kiq_limiter_t *lim, kiq_redis_t *r, double wait_timeout,
                                kiq_limit_token_t *token, double *retry_in, char *err);
/* kiq_limiter_acquire spending points (points limiters; 1 for the others'
 * sake, which ignore it). points above the limiter's count can never fit:
 * KIQ_EINVAL. */
KIQ_API int kiq_limiter_acquire_points(kiq_limiter_t *lim, kiq_redis_t *r, long points,
                                       double wait_timeout, kiq_limit_token_t *token,
                                       double *retry_in, char *err);
/* Gives a concurrent slot back; only its holder can. Returns 0, or
 * KIQ_ENOTFOUND when the token no longer held a slot (its lease lapsed),
 * or a Redis error. A no-op for the other types. */
KIQ_API int kiq_limiter_release(kiq_limiter_t *lim, kiq_redis_t *r,
                                const kiq_limit_token_t *token, char *err);
/* Extends a concurrent slot's lease by the limiter's lease from now.
 * Returns 0, KIQ_ENOTFOUND (lapsed) or a Redis error. */
KIQ_API int kiq_limiter_extend(kiq_limiter_t *lim, kiq_redis_t *r,
                               const kiq_limit_token_t *token, char *err);

/* Acquires (as kiq_limiter_acquire), runs fn(udata), releases. Returns
 * fn's return value, or the acquire's error without calling fn. fn should
 * finish within a concurrent limiter's lease: nothing extends it here. */
KIQ_API int kiq_limiter_within(kiq_limiter_t *lim, kiq_redis_t *r, double wait_timeout,
                               int (*fn)(void *udata), void *udata, char *err);

#endif
