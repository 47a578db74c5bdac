/* Queued locks: named distributed locks whose waiters line up in request
 * order (FIFO), in the key layout of the Ruby gem redis_queued_locks, so C
 * and Ruby processes contend for the same lock.
 *
 * Keys (NAME is the lock name as given):
 *   rql:lock:NAME          hash: acq_id, hst_id, ts, ini_ttl, the caller's
 *                          metadata fields, and kiq_fence; expires after ttl
 *   rql:lock_queue:NAME    zset: acquirer id -> request time (epoch seconds)
 *   rql:kiq:seen:NAME      hash: acquirer id -> deadline of its place (ms);
 *                          kiq's own, outside every pattern the gem scans
 *   rql:fence:NAME         the fencing counter; never expires, so tokens only
 *                          grow (the gem neither reads nor scans it)
 *
 * Differences from the gem, on purpose: one Lua step per attempt; times from
 * the Redis server's clock; release and extend check the holder; a place in
 * the queue lasts queue_ttl after the waiter's last attempt (a live waiter
 * keeps its place, a dead one stops blocking after its own queue_ttl).
 *
 * Threads: a kiq_qlock_client_t is read-only once set up and may be shared
 * by every thread; each thread passes its own kiq_redis_t (hiredis contexts
 * are not thread-safe). An acquirer id names process, thread and client, so
 * two threads of one process are two acquirers. */
#ifndef KIQ_QLOCK_H
#define KIQ_QLOCK_H

#include <stddef.h>
#include <jansson.h>

#include "error.h"
#include "redis.h"

typedef struct kiq_qlock_client kiq_qlock_client_t;

#define KIQ_QLOCK_NAME_MAX 400   /* bytes of a lock name */
#define KIQ_QLOCK_ID_MAX 128     /* bytes of an acquirer or host id, with NUL */
#define KIQ_QLOCK_UNLIMITED (-1) /* retry_count: no limit; timeout: wait forever */

/* Why kiq_qlock_lock returned. Names in comments are the gem's results. */
typedef enum kiq_qlock_status {
    KIQ_QLOCK_OBTAINED = 0,
    KIQ_QLOCK_TIMEOUT,             /* timeout_reached */
    KIQ_QLOCK_RETRY_LIMIT,         /* retry_limit_reached */
    KIQ_QLOCK_FAIL_FAST_NO_TRY,    /* held when asked; never queued */
    KIQ_QLOCK_FAIL_FAST_AFTER_TRY, /* queued, not first or held; left the queue */
} kiq_qlock_status_t;

/* Per-call options; start from kiq_qlock_opts_default() (the gem's
 * defaults) and change what you need. */
typedef struct kiq_qlock_opts {
    long long ttl;           /* ms the lock lives unless released (5000) */
    double queue_ttl;        /* s a place in the queue survives without an attempt (15) */
    double timeout;          /* s to wait in all (10); KIQ_QLOCK_UNLIMITED = forever */
    int retry_count;         /* attempts in all, not retries (3); KIQ_QLOCK_UNLIMITED */
    long retry_delay;        /* ms between attempts (200) */
    long retry_jitter;       /* plus a uniform [0, jitter) ms (25) */
    int fail_fast;           /* give up at once when the lock is held (0) */
    int timed;               /* kiq_qlock_run: stop waiting on fn when the ttl ends (0) */
    const char *const *meta; /* NULL, or field, value, field, value, ..., NULL;
                              * stored in the lock hash (borrowed for the call) */
    const char *instrument;  /* passed through to events as-is (borrowed), or NULL */
} kiq_qlock_opts_t;

KIQ_API kiq_qlock_opts_t kiq_qlock_opts_default(void);

/* What one lock call got. The caller owns it (no heap memory inside);
 * kiq_qlock_release and kiq_qlock_extend take it back to prove ownership. */
typedef struct kiq_qlock_result {
    kiq_qlock_status_t status;
    int tries;                        /* attempts made */
    char name[KIQ_QLOCK_NAME_MAX + 1];
    char lock_key[KIQ_QLOCK_NAME_MAX + 16];
    char acq_id[KIQ_QLOCK_ID_MAX];
    char hst_id[KIQ_QLOCK_ID_MAX];
    long long fence;                  /* fencing token: larger than every earlier grant of this lock */
    double ts;                        /* server epoch s when granted */
    double requested_at;              /* server epoch s of the request's place in the queue */
    long long ttl;                    /* ms, as asked */
    double acq_time;                  /* ms spent acquiring */
    double acquired;                  /* CLOCK_MONOTONIC s when obtained */
    double deadline;                  /* CLOCK_MONOTONIC s until which the lease surely lasts
                                       * (it was set after the attempt began) */
    int lost;                         /* kiq_qlock_run: the lease had ended before fn returned */
} kiq_qlock_result_t;

/* An instrumentation event, as the gem's instrumenter receives it. Fields an
 * event does not carry are NULL / 0. Valid during the callback only. */
typedef struct kiq_qlock_event {
    const char *name;        /* "redis_queued_locks.lock_obtained",
                              * ".lock_hold_and_release", ".explicit_lock_release",
                              * ".explicit_all_locks_release" */
    const char *lock_key;
    const char *lock_key_queue;
    const char *acq_id;
    const char *hst_id;
    double ts;               /* epoch s the lock was granted */
    long long ttl;           /* ms */
    long long fence;
    double acq_time;         /* ms */
    double hold_time;        /* ms */
    double rel_time;         /* ms */
    double at;               /* epoch s of a release */
    long long rel_key_cnt;
    const char *instrument;
} kiq_qlock_event_t;

typedef void (*kiq_qlock_event_fn)(const kiq_qlock_event_t *ev, void *udata);
/* One debug line (no newline), e.g. "try_lock.not_first lock_key=... rank=3". */
typedef void (*kiq_qlock_log_fn)(const char *line, void *udata);

/* Returns a client owned by the caller (kiq_qlock_client_free), or NULL with
 * err filled. identity is the 16-hex part of acquirer ids; NULL draws a
 * random one, as the gem does per client. */
KIQ_API kiq_qlock_client_t *kiq_qlock_client_new(const char *identity, char *err);
KIQ_API void kiq_qlock_client_free(kiq_qlock_client_t *c);
/* Set these before sharing the client between threads. fn is called on the
 * thread that caused the event and must not block for long. */
KIQ_API void kiq_qlock_client_on_event(kiq_qlock_client_t *c, kiq_qlock_event_fn fn, void *udata);
/* Debug lines go to fn (NULL: kiq's log at debug level). With log_lock_try,
 * every attempt is logged too. */
KIQ_API void kiq_qlock_client_on_log(kiq_qlock_client_t *c, kiq_qlock_log_fn fn, void *udata,
                                     int log_lock_try);
/* The calling thread's acquirer and host ids (gem format:
 * rql:acq:PID/TID/0/0/IDENTITY, rql:hst:PID/TID/0/IDENTITY; C has no fibers
 * or ractors, hence the zeros). out holds KIQ_QLOCK_ID_MAX bytes. */
KIQ_API void kiq_qlock_acq_id(const kiq_qlock_client_t *c, char *out);
KIQ_API void kiq_qlock_hst_id(const kiq_qlock_client_t *c, char *out);

/* Waits for the lock NAME in request order. Returns 0 when obtained (res
 * filled; the lock lives until released or its ttl ends); KIQ_EDENIED when
 * not obtained, res->status saying why (the request has left the queue);
 * KIQ_EINVAL for a bad name, option or reserved metadata field; KIQ_EREDIS /
 * KIQ_EREPLY on Redis failure. err is filled on every failure. */
KIQ_API int kiq_qlock_lock(kiq_qlock_client_t *c, kiq_redis_t *r, const char *name,
                           const kiq_qlock_opts_t *opts, kiq_qlock_result_t *res, char *err);

/* Releases a lock res obtained, only if it still holds it. Returns 0; or
 * KIQ_EDENIED when the lease had ended (the lock may be someone else's now;
 * it is left alone). Emits lock_hold_and_release when released. */
KIQ_API int kiq_qlock_release(kiq_qlock_client_t *c, kiq_redis_t *r, const kiq_qlock_result_t *res,
                              char *err);
/* Adds ms to the lease (the gem's extend_lock_ttl), or with refresh sets it
 * to ms from now; only while res still holds the lock. Returns 0 with the
 * new remaining ms in *pttl (may be NULL), or KIQ_EDENIED. Moves
 * res->deadline accordingly. */
KIQ_API int kiq_qlock_extend(kiq_redis_t *r, kiq_qlock_result_t *res, long long ms, int refresh,
                             long long *pttl, char *err);

/* Runs fn(res, udata) under the lock, then releases it (owner-checked).
 * Returns what kiq_qlock_lock returns when the lock was not obtained (fn not
 * run); else 0 with fn's return value in *fn_rc (may be NULL) and res->lost
 * set when the lease had ended before fn returned.
 * With opts->timed, fn runs on its own thread and the caller stops waiting
 * when the lease ends: then the result is KIQ_EJOB with err saying so, and
 * fn keeps running detached; udata must stay valid until fn returns, and fn
 * must not use r. */
typedef int (*kiq_qlock_fn)(const kiq_qlock_result_t *res, void *udata);
KIQ_API int kiq_qlock_run(kiq_qlock_client_t *c, kiq_redis_t *r, const char *name,
                          const kiq_qlock_opts_t *opts, kiq_qlock_fn fn, void *udata,
                          kiq_qlock_result_t *res, int *fn_rc, char *err);

/* --- Inspection and administration (any client, including the gem's). -- */

/* *out = a new JSON object (caller decrefs) with the lock hash's fields plus
 * "lock_key" and "rem_ttl" (ms; -1 when the key has no expiry), ts as a
 * number, ini_ttl and kiq_fence as integers, other values as strings; or NULL
 * when the lock is free. Returns 0 or a KIQ_E* code. */
KIQ_API int kiq_qlock_info(kiq_redis_t *r, const char *name, json_t **out, char *err);
/* *out = {"lock_queue": key, "queue": [{"acq_id", "score"}, ...]} in request
 * order, or NULL when nobody waits. */
KIQ_API int kiq_qlock_queue_info(kiq_redis_t *r, const char *name, json_t **out, char *err);
/* 1 / 0, or a negative KIQ_E* code. */
KIQ_API int kiq_qlock_locked(kiq_redis_t *r, const char *name, char *err);
KIQ_API int kiq_qlock_queued(kiq_redis_t *r, const char *name, char *err);

/* SCANs (scan_size per step, 0 = 500): *out = a new JSON array of key names:
 * lock keys, queue keys, or both. */
KIQ_API int kiq_qlock_locks(kiq_redis_t *r, size_t scan_size, json_t **out, char *err);
KIQ_API int kiq_qlock_queues(kiq_redis_t *r, size_t scan_size, json_t **out, char *err);
KIQ_API int kiq_qlock_keys(kiq_redis_t *r, size_t scan_size, json_t **out, char *err);
/* *out = [{"lock": key, "status": "alive"|"released", "info": {...}}, ...]
 * and [{"queue": key, "requests": [{"acq_id", "score"}, ...]}, ...]. */
KIQ_API int kiq_qlock_locks_info(kiq_redis_t *r, size_t scan_size, json_t **out, char *err);
KIQ_API int kiq_qlock_queues_info(kiq_redis_t *r, size_t scan_size, json_t **out, char *err);

/* Deletes the lock NAME and its whole queue, whoever holds it (an admin
 * step, as the gem's unlock). *lock_released / *queue_released (may be
 * NULL) say whether there was anything. Emits explicit_lock_release. c may
 * be NULL (no events). */
KIQ_API int kiq_qlock_force_unlock(kiq_qlock_client_t *c, kiq_redis_t *r, const char *name,
                                   int *lock_released, int *queue_released, char *err);
/* Deletes every lock and queue (not the fencing counters, so tokens keep
 * growing). *count (may be NULL) = keys deleted. Emits
 * explicit_all_locks_release. */
KIQ_API int kiq_qlock_clear_locks(kiq_qlock_client_t *c, kiq_redis_t *r, size_t batch,
                                  long long *count, char *err);
/* Drops requests older than dead_ttl ms (negative: the gem's default, one
 * day) whose waiter is no longer trying, from every queue. *processed (may be
 * NULL) = a new JSON array of the queue keys that had some; *dropped (may
 * be NULL) = how many requests went. */
KIQ_API int kiq_qlock_clear_dead_requests(kiq_redis_t *r, long long dead_ttl, size_t scan_size,
                                          json_t **processed, long long *dropped, char *err);

/* Short names of statuses, as the gem's result symbols ("timeout_reached"). */
KIQ_API const char *kiq_qlock_status_name(kiq_qlock_status_t s);

#endif
