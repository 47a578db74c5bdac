/* Queued locks: named distributed locks whose waiters line up in request
 * order (FIFO), in the key layout of the Ruby gem redis_queued_locks, so C
 * and Ruby processes contend for the same lock.
 *
 * Keys (NAME is the lock name as given):
 *   rql:lock:NAME          hash: acq_id, hst_id, ts, ini_ttl, the caller's
 *                          metadata fields, and capstan_fence; expires after ttl
 *   rql:lock_queue:NAME    zset: acquirer id -> request time (epoch seconds)
 *   rql:capstan:seen:NAME      hash: acquirer id -> deadline of its place (ms);
 *                          capstan's own, outside every pattern the gem scans
 *   rql:fence:NAME         the fencing counter; never expires, so tokens only
 *                          grow (the gem neither reads nor scans it)
 *
 * Differences from the gem, on purpose: one Lua step per attempt; times from
 * the Redis server's clock; release and extend check the holder; a place in
 * the queue lasts queue_ttl after the waiter's last attempt (a live waiter
 * keeps its place, a dead one stops blocking after its own queue_ttl).
 *
 * Threads: a capstan_qlock_client_t is read-only once set up and may be shared
 * by every thread; each thread passes its own capstan_redis_t (hiredis contexts
 * are not thread-safe). An acquirer id names process, thread and client, so
 * two threads of one process are two acquirers. */
#ifndef CAPSTAN_QLOCK_H
#define CAPSTAN_QLOCK_H

#include <stddef.h>
#include <jansson.h>

#include "error.h"
#include "redis.h"

typedef struct capstan_qlock_client capstan_qlock_client_t;

#define CAPSTAN_QLOCK_NAME_MAX 400 /* bytes of a lock name */
#define CAPSTAN_QLOCK_ID_MAX 128 /* bytes of an acquirer or host id, with NUL */
#define CAPSTAN_QLOCK_UNLIMITED (-1) /* retry_count: no limit; timeout: wait forever */

/* Why capstan_qlock_lock returned. Names in comments are the gem's results. */
typedef enum capstan_qlock_status {
    CAPSTAN_QLOCK_OBTAINED = 0,
    CAPSTAN_QLOCK_TIMEOUT,         /* timeout_reached */
    CAPSTAN_QLOCK_RETRY_LIMIT,     /* retry_limit_reached */
    CAPSTAN_QLOCK_FAIL_FAST_NO_TRY, /* held when asked; never queued */
    CAPSTAN_QLOCK_FAIL_FAST_AFTER_TRY, /* queued, not first or held; left the queue */
} capstan_qlock_status_t;

/* Per-call options; start from capstan_qlock_opts_default() (the gem's
 * defaults) and change what you need. */
typedef struct capstan_qlock_opts {
    long long ttl;           /* ms the lock lives unless released (5000) */
    double queue_ttl;        /* s a place in the queue survives without an attempt (15) */
    double timeout;          /* s to wait in all (10); CAPSTAN_QLOCK_UNLIMITED = forever */
    int retry_count;         /* attempts in all, not retries (3); CAPSTAN_QLOCK_UNLIMITED */
    long retry_delay;        /* ms between attempts (200) */
    long retry_jitter;       /* plus a uniform [0, jitter) ms (25) */
    int fail_fast;           /* give up at once when the lock is held (0) */
    int timed;               /* capstan_qlock_run: stop waiting on fn when the ttl ends (0) */
    const char *const *meta; /* NULL, or field, value, field, value, ..., NULL;
                              * stored in the lock hash (borrowed for the call) */
    const char *instrument;  /* passed through to events as-is (borrowed), or NULL */
} capstan_qlock_opts_t;

CAPSTAN_API capstan_qlock_opts_t capstan_qlock_opts_default(void);

/* What one lock call got. The caller owns it (no heap memory inside);
 * capstan_qlock_release and capstan_qlock_extend take it back to prove ownership. */
typedef struct capstan_qlock_result {
    capstan_qlock_status_t status;
    int tries;                        /* attempts made */
    char name[CAPSTAN_QLOCK_NAME_MAX + 1];
    char lock_key[CAPSTAN_QLOCK_NAME_MAX + 16];
    char acq_id[CAPSTAN_QLOCK_ID_MAX];
    char hst_id[CAPSTAN_QLOCK_ID_MAX];
    long long fence;                  /* fencing token: larger than every earlier grant of this lock */
    double ts;                        /* server epoch s when granted */
    double requested_at;              /* server epoch s of the request's place in the queue */
    long long ttl;                    /* ms, as asked */
    double acq_time;                  /* ms spent acquiring */
    double acquired;                  /* CLOCK_MONOTONIC s when obtained */
    double deadline;                  /* CLOCK_MONOTONIC s until which the lease surely lasts
                                       * (it was set after the attempt began) */
    int lost;                         /* capstan_qlock_run: the lease had ended before fn returned */
} capstan_qlock_result_t;

/* An instrumentation event, as the gem's instrumenter receives it. Fields an
 * event does not carry are NULL / 0. Valid during the callback only. */
typedef struct capstan_qlock_event {
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
} capstan_qlock_event_t;

typedef void (*capstan_qlock_event_fn)(const capstan_qlock_event_t *ev, void *udata);
/* One debug line (no newline), e.g. "try_lock.not_first lock_key=... rank=3";
 * valid during the callback only. */
typedef void (*capstan_qlock_log_fn)(const char *line, void *udata);

/* Returns a client owned by the caller (capstan_qlock_client_free), or NULL with
 * err filled. identity (copied; 1 to 39 bytes without '/') ends its
 * acquirer and host ids; NULL draws 16 random hex digits, as the gem does
 * per client. */
CAPSTAN_API capstan_qlock_client_t *capstan_qlock_client_new(const char *identity, char *err);
CAPSTAN_API void capstan_qlock_client_free(capstan_qlock_client_t *c);
/* Set these before sharing the client between threads; udata must outlive
 * c. fn is called on the thread that caused the event and must not block
 * for long. */
CAPSTAN_API void capstan_qlock_client_on_event(capstan_qlock_client_t *c, capstan_qlock_event_fn fn, void *udata);
/* Debug lines go to fn (NULL: capstan's log at debug level). With log_lock_try,
 * every attempt is logged too. */
CAPSTAN_API void capstan_qlock_client_on_log(capstan_qlock_client_t *c, capstan_qlock_log_fn fn, void *udata,
                                             int log_lock_try);
/* The ids the calling thread's lock calls on c carry, in the gem's formats
 * (its current_acquirer_id and current_host_id):
 *   acq_id  rql:acq:PID/TID/0/0/IDENTITY, the acquirer: the holder in the
 *           lock hash's acq_id field, a waiter's member in the queue zset;
 *   hst_id  rql:hst:PID/TID/0/IDENTITY, the host it runs on: the lock hash's
 *           hst_id field (the gem's swarm mode tells live hosts by it;
 *           capstan only stores it).
 * PID and TID are the process and its kernel thread id, IDENTITY the
 * client's (capstan_qlock_client_new); the gem's fiber and ractor ids are
 * 0, as C has neither. So one thread compares acq_id with
 * capstan_qlock_info's to know it holds a lock, or finds its place in
 * capstan_qlock_queue_info, before or without a capstan_qlock_result_t.
 * out is the caller's buffer of CAPSTAN_QLOCK_ID_MAX bytes, NUL-ended. */
CAPSTAN_API void capstan_qlock_acq_id(const capstan_qlock_client_t *c, char *out);
CAPSTAN_API void capstan_qlock_hst_id(const capstan_qlock_client_t *c, char *out);

/* Waits for the lock NAME in request order. Returns 0 when obtained (res
 * filled; the lock lives until released or its ttl ends); CAPSTAN_EDENIED when
 * not obtained, res->status saying why (the request has left the queue);
 * CAPSTAN_EINVAL for a bad name, option or reserved metadata field; CAPSTAN_EREDIS /
 * CAPSTAN_EREPLY on Redis failure. err is filled on every failure. */
CAPSTAN_API int capstan_qlock_lock(capstan_qlock_client_t *c, capstan_redis_t *r, const char *name,
                                   const capstan_qlock_opts_t *opts, capstan_qlock_result_t *res, char *err);

/* Releases a lock res obtained, only if it still holds it. Returns 0; or
 * CAPSTAN_EDENIED when the lease had ended (the lock may be someone else's now;
 * it is left alone). Emits lock_hold_and_release when released. */
CAPSTAN_API int capstan_qlock_release(capstan_qlock_client_t *c, capstan_redis_t *r, const capstan_qlock_result_t *res,
                                      char *err);
/* Adds ms to the lease (the gem's extend_lock_ttl), or with refresh sets it
 * to ms from now; only while res still holds the lock. Returns 0 with the
 * new remaining ms in *pttl (may be NULL), or CAPSTAN_EDENIED. Moves
 * res->deadline accordingly. */
CAPSTAN_API int capstan_qlock_extend(capstan_redis_t *r, capstan_qlock_result_t *res, long long ms, int refresh,
                                     long long *pttl, char *err);

/* Runs fn(res, udata) under the lock, then releases it (owner-checked).
 * Returns what capstan_qlock_lock returns when the lock was not obtained (fn not
 * run); else 0 with fn's return value in *fn_rc (may be NULL) and res->lost
 * set when the lease had ended before fn returned.
 * With opts->timed, fn runs on its own thread and the caller stops waiting
 * when the lease ends: then the result is CAPSTAN_EJOB with err saying so, and
 * fn keeps running detached; udata must stay valid until fn returns, and fn
 * must not use r. */
typedef int (*capstan_qlock_fn)(const capstan_qlock_result_t *res, void *udata);
CAPSTAN_API int capstan_qlock_run(capstan_qlock_client_t *c, capstan_redis_t *r, const char *name,
                                  const capstan_qlock_opts_t *opts, capstan_qlock_fn fn, void *udata,
                                  capstan_qlock_result_t *res, int *fn_rc, char *err);

/* --- Inspection and administration (any client, including the gem's). -- */

/* *out = a new JSON object (caller decrefs) with the lock hash's fields plus
 * "lock_key" and "rem_ttl" (ms; -1 when the key has no expiry), ts as a
 * number, ini_ttl and capstan_fence as integers, other values as strings; or NULL
 * when the lock is free. Returns 0 or a CAPSTAN_E* code. */
CAPSTAN_API int capstan_qlock_info(capstan_redis_t *r, const char *name, json_t **out, char *err);
/* *out = a new JSON object (caller decrefs), {"lock_queue": key, "queue":
 * [{"acq_id", "score"}, ...]} in request order, or NULL when nobody waits. */
CAPSTAN_API int capstan_qlock_queue_info(capstan_redis_t *r, const char *name, json_t **out, char *err);
/* 1 / 0, or a negative CAPSTAN_E* code. */
CAPSTAN_API int capstan_qlock_locked(capstan_redis_t *r, const char *name, char *err);
CAPSTAN_API int capstan_qlock_queued(capstan_redis_t *r, const char *name, char *err);

/* SCANs (scan_size per step, 0 = 500): *out = a new JSON array (caller
 * decrefs) of key names: lock keys, queue keys, or both. */
CAPSTAN_API int capstan_qlock_locks(capstan_redis_t *r, size_t scan_size, json_t **out, char *err);
CAPSTAN_API int capstan_qlock_queues(capstan_redis_t *r, size_t scan_size, json_t **out, char *err);
CAPSTAN_API int capstan_qlock_keys(capstan_redis_t *r, size_t scan_size, json_t **out, char *err);
/* *out = a new JSON array (caller decrefs): [{"lock": key, "status":
 * "alive"|"released", "info": {...}}, ...] and [{"queue": key, "requests":
 * [{"acq_id", "score"}, ...]}, ...]. */
CAPSTAN_API int capstan_qlock_locks_info(capstan_redis_t *r, size_t scan_size, json_t **out, char *err);
CAPSTAN_API int capstan_qlock_queues_info(capstan_redis_t *r, size_t scan_size, json_t **out, char *err);

/* Deletes the lock NAME and its whole queue, whoever holds it (an admin
 * step, as the gem's unlock). *lock_released / *queue_released (may be
 * NULL) say whether there was anything. Emits explicit_lock_release. c may
 * be NULL (no events). */
CAPSTAN_API int capstan_qlock_force_unlock(capstan_qlock_client_t *c, capstan_redis_t *r, const char *name,
                                           int *lock_released, int *queue_released, char *err);
/* Deletes every lock and queue (not the fencing counters, so tokens keep
 * growing). *count (may be NULL) = keys deleted. Emits
 * explicit_all_locks_release. */
CAPSTAN_API int capstan_qlock_clear_locks(capstan_qlock_client_t *c, capstan_redis_t *r, size_t batch,
                                          long long *count, char *err);
/* Drops requests older than dead_ttl ms (negative: the gem's default, one
 * day) whose waiter is no longer trying, from every queue. *processed (may be
 * NULL) = a new JSON array (caller decrefs) of the queue keys that had some; *dropped (may
 * be NULL) = how many requests went. */
CAPSTAN_API int capstan_qlock_clear_dead_requests(capstan_redis_t *r, long long dead_ttl, size_t scan_size,
                                                  json_t **processed, long long *dropped, char *err);

/* Short names of statuses, as the gem's result symbols ("timeout_reached");
 * static. */
CAPSTAN_API const char *capstan_qlock_status_name(capstan_qlock_status_t s);

#endif
