/* Middleware chains: ordered lists of functions that run around every job
 * (server chain) and around every push from capstan's client and CLI (client
 * chain), as Sidekiq's middleware does.
 *
 * Server chain, outermost first: "stats" (log lines and counters), "retry"
 * (Sidekiq's retry rules), "queue_limit" (the caps of the job's queue, a
 * sidekiq.yml's limits:), "expiry" (drops a job whose "expires_at" has
 * passed, unrun), "unique" (uniqueness locks), "limit" (the rate
 * limiter of a class that has one, capstan/limiter.h), then whatever users
 * add, then the handler. Client chain: "unique", then user middleware, then
 * the push itself.
 *
 * A middleware is a function that receives the invocation and calls
 * capstan_mw_next() to run the rest of the chain (or does not, to stop the job
 * or the push here). Each one returns 0 or a CAPSTAN_E* code.
 *
 * Chains are edited before the runtime starts (or, for a client, between
 * pushes); they are read concurrently by processor threads afterwards and
 * must not change then. */
#ifndef CAPSTAN_MIDDLEWARE_H
#define CAPSTAN_MIDDLEWARE_H

#include <stddef.h>

#include "client.h"
#include "config.h"
#include "error.h"
#include "job.h"
#include "redis.h"
#include "runtime.h"

typedef struct capstan_chain capstan_chain_t;
typedef struct capstan_mw capstan_mw_t;

typedef int (*capstan_mw_fn)(capstan_mw_t *mw, void *udata);

/* A new empty chain owned by the caller (capstan_chain_free), or NULL. */
CAPSTAN_API capstan_chain_t *capstan_chain_new(void);
/* Frees a chain from capstan_chain_new (never the runtime's or a client's). */
CAPSTAN_API void capstan_chain_free(capstan_chain_t *c);

/* Appends fn under name (copied) as the innermost middleware, just before
 * the handler or the push. udata must outlive the chain. Returns 0,
 * CAPSTAN_EINVAL (no name or fn, or the name is taken) or CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_chain_add(capstan_chain_t *c, const char *name, capstan_mw_fn fn, void *udata);
/* Inserts fn under name (copied) just outside (before) the middleware
 * named before; a NULL before means outermost. udata must outlive the
 * chain. Returns 0, CAPSTAN_ENOTFOUND (no middleware named before),
 * CAPSTAN_EINVAL (as for capstan_chain_add) or CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_chain_insert_before(capstan_chain_t *c, const char *before, const char *name,
                                            capstan_mw_fn fn, void *udata);
/* Removes the middleware named name, a built-in one too (its feature is
 * then off for that runtime or client). Returns 0 or CAPSTAN_ENOTFOUND. */
CAPSTAN_API int capstan_chain_remove(capstan_chain_t *c, const char *name);
/* The number of entries. */
CAPSTAN_API size_t capstan_chain_len(const capstan_chain_t *c);
/* The name of entry i (outermost is 0), or NULL past the end. Borrowed:
 * valid until that entry is removed. */
CAPSTAN_API const char *capstan_chain_name(const capstan_chain_t *c, size_t i);

/* The runtime's server chain (built with the defaults on first call),
 * owned by the runtime. Edit it before capstan_runtime_run. */
CAPSTAN_API capstan_chain_t *capstan_runtime_server_chain(capstan_runtime_t *rt);
/* The client's chain (defaults included), owned by the client. */
CAPSTAN_API capstan_chain_t *capstan_client_chain(capstan_client_t *c);

/* Runs the rest of the chain and returns what it returns. */
CAPSTAN_API int capstan_mw_next(capstan_mw_t *mw);

/* The job being run (server chain only; NULL in the client chain, which is
 * how a middleware installed in both tells them apart). Borrowed for the
 * call. */
CAPSTAN_API capstan_job_t *capstan_mw_job(capstan_mw_t *mw);
/* The job's class, jid and queue, in both chains. Borrowed for the call. */
CAPSTAN_API const char *capstan_mw_class(const capstan_mw_t *mw);
CAPSTAN_API const char *capstan_mw_jid(const capstan_mw_t *mw);
CAPSTAN_API const char *capstan_mw_queue(const capstan_mw_t *mw);
/* The payload as it stands (server: as fetched; client: as it will be
 * pushed), *len its length. Borrowed; valid until the payload is edited. */
CAPSTAN_API const char *capstan_mw_payload(const capstan_mw_t *mw, size_t *len);
/* The raw JSON of a top-level payload field, or NULL; *len (may be NULL)
 * its length. Borrowed, as capstan_mw_payload. */
CAPSTAN_API const char *capstan_mw_field_raw(const capstan_mw_t *mw, const char *key, size_t *len);
/* Client chain only: sets top-level field key to the raw JSON value (NULL
 * removes it), keeping every other byte. Returns 0, CAPSTAN_EINVAL (server
 * chain, or value is not JSON) or CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_mw_set_field(capstan_mw_t *mw, const char *key, const char *value);
/* Client chain only: when the job runs (epoch seconds; 0 = now), as the
 * push asked or a middleware set it; set_at changes it (a time in the
 * future puts the job in the schedule), a no-op in the server chain. */
CAPSTAN_API double capstan_mw_at(const capstan_mw_t *mw);
CAPSTAN_API void capstan_mw_set_at(capstan_mw_t *mw, double at);
/* This invocation's Redis connection (the processor thread's or the
 * client's), for a middleware's own commands. Borrowed for the call: not
 * to be freed, kept, or used from another thread. */
CAPSTAN_API capstan_redis_t *capstan_mw_redis(capstan_mw_t *mw);
/* The configuration (server chain; NULL in the client chain). Borrowed. */
CAPSTAN_API const capstan_config_t *capstan_mw_config(const capstan_mw_t *mw);

/* What happens to the job once the chain returns (server chain). The
 * default is what the retry middleware decides, or DONE. */
typedef enum capstan_dispose {
    CAPSTAN_DISPOSE_DEFAULT = 0, /* nothing decided yet */
    CAPSTAN_DISPOSE_DONE,    /* forget it */
    CAPSTAN_DISPOSE_RETRY,   /* "retry" zset at score */
    CAPSTAN_DISPOSE_DEAD,    /* "dead" zset at score */
    CAPSTAN_DISPOSE_DROP,    /* failed, kept nowhere */
    CAPSTAN_DISPOSE_SCHEDULE, /* "schedule" zset at score */
    CAPSTAN_DISPOSE_KEEP,    /* leave it in the working list (recovered later) */
    CAPSTAN_DISPOSE_REQUEUE, /* back to the end of its queue (an interrupted
                                iterable job), as payload */
} capstan_dispose_t;

/* Decides the job's fate. payload (copied; NULL = as fetched) is what is
 * stored for RETRY, DEAD, SCHEDULE and REQUEUE. Returns 0, CAPSTAN_EINVAL, CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_mw_dispose(capstan_mw_t *mw, capstan_dispose_t d, double score,
                                   const char *payload, size_t len);
/* The fate decided so far (server chain): after capstan_mw_next, a
 * middleware outside "retry" reads what retry chose for a failed job.
 * CAPSTAN_DISPOSE_DEFAULT once the chain has returned means done. */
CAPSTAN_API capstan_dispose_t capstan_mw_disposition(const capstan_mw_t *mw);

/* A client middleware that does not call capstan_mw_next denies the push;
 * it may say why (printf-style), which capstan_client_error then returns. */
CAPSTAN_API void capstan_mw_deny(capstan_mw_t *mw, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The built-in uniqueness middleware, installed as "unique" in both
 * default chains (see unique.h). */
CAPSTAN_API int capstan_unique_server_mw(capstan_mw_t *mw, void *udata);
CAPSTAN_API int capstan_unique_client_mw(capstan_mw_t *mw, void *udata);

#endif
