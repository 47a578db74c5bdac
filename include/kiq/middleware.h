/* Middleware chains: ordered lists of functions that run around every job
 * (server chain) and around every push from kiq's client and CLI (client
 * chain), as Sidekiq's middleware does.
 *
 * Server chain, outermost first: "stats" (log lines and counters), "retry"
 * (Sidekiq's retry rules), "unique" (uniqueness locks), then whatever users
 * add, then the handler. Client chain: "unique", then user middleware, then
 * the push itself.
 *
 * A middleware is a function that receives the invocation and calls
 * kiq_mw_next() to run the rest of the chain (or does not, to stop the job
 * or the push here). Each one returns 0 or a KIQ_E* code.
 *
 * Chains are edited before the runtime starts (or, for a client, between
 * pushes); they are read concurrently by processor threads afterwards and
 * must not change then. */
#ifndef KIQ_MIDDLEWARE_H
#define KIQ_MIDDLEWARE_H

#include <stddef.h>

#include "client.h"
#include "config.h"
#include "error.h"
#include "job.h"
#include "redis.h"
#include "runtime.h"

typedef struct kiq_chain kiq_chain_t;
typedef struct kiq_mw kiq_mw_t;

typedef int (*kiq_mw_fn)(kiq_mw_t *mw, void *udata);

/* A new empty chain owned by the caller (kiq_chain_free), or NULL. */
KIQ_API kiq_chain_t *kiq_chain_new(void);
KIQ_API void kiq_chain_free(kiq_chain_t *c);

/* Appends fn under name (copied) as the innermost middleware, just before
 * the handler or the push. udata must outlive the chain. Returns 0,
 * KIQ_EINVAL (no name or fn, or the name is taken) or KIQ_ENOMEM. */
KIQ_API int kiq_chain_add(kiq_chain_t *c, const char *name, kiq_mw_fn fn, void *udata);
/* Inserts fn just outside (before) the middleware named before; a NULL
 * before means outermost. Returns 0, KIQ_ENOTFOUND, KIQ_EINVAL, KIQ_ENOMEM. */
KIQ_API int kiq_chain_insert_before(kiq_chain_t *c, const char *before, const char *name,
                                    kiq_mw_fn fn, void *udata);
/* Removes the middleware named name. Returns 0 or KIQ_ENOTFOUND. */
KIQ_API int kiq_chain_remove(kiq_chain_t *c, const char *name);
KIQ_API size_t kiq_chain_len(const kiq_chain_t *c);
/* The name of entry i (outermost is 0), or NULL past the end. */
KIQ_API const char *kiq_chain_name(const kiq_chain_t *c, size_t i);

/* The runtime's server chain (built with the defaults on first call),
 * owned by the runtime. Edit it before kiq_runtime_run. */
KIQ_API kiq_chain_t *kiq_runtime_server_chain(kiq_runtime_t *rt);
/* The client's chain (defaults included), owned by the client. */
KIQ_API kiq_chain_t *kiq_client_chain(kiq_client_t *c);

/* Runs the rest of the chain and returns what it returns. */
KIQ_API int kiq_mw_next(kiq_mw_t *mw);

/* 1 in the server chain, 0 in the client chain. */
KIQ_API int kiq_mw_is_server(const kiq_mw_t *mw);
/* The job being run (server chain only; NULL in the client chain). */
KIQ_API kiq_job_t *kiq_mw_job(kiq_mw_t *mw);
KIQ_API const char *kiq_mw_class(const kiq_mw_t *mw);
KIQ_API const char *kiq_mw_jid(const kiq_mw_t *mw);
KIQ_API const char *kiq_mw_queue(const kiq_mw_t *mw);
/* The payload as it stands (server: as fetched; client: as it will be
 * pushed), *len its length. Borrowed; valid until the payload is edited. */
KIQ_API const char *kiq_mw_payload(const kiq_mw_t *mw, size_t *len);
/* The raw JSON of a top-level payload field, or NULL. */
KIQ_API const char *kiq_mw_field_raw(const kiq_mw_t *mw, const char *key, size_t *len);
/* Client chain only: sets top-level field key to the raw JSON value (NULL
 * removes it), keeping every other byte. Returns 0, KIQ_EINVAL (server
 * chain, or value is not JSON) or KIQ_ENOMEM. */
KIQ_API int kiq_mw_set_field(kiq_mw_t *mw, const char *key, const char *value);
/* Client chain only: when the job runs (epoch seconds; 0 = now). */
KIQ_API double kiq_mw_at(const kiq_mw_t *mw);
KIQ_API void kiq_mw_set_at(kiq_mw_t *mw, double at);
/* This invocation's Redis connection (the processor's or the client's). */
KIQ_API kiq_redis_t *kiq_mw_redis(kiq_mw_t *mw);
/* The configuration (server chain; NULL in the client chain). */
KIQ_API const kiq_config_t *kiq_mw_config(const kiq_mw_t *mw);

/* What happens to the job once the chain returns (server chain). The
 * default is what the retry middleware decides, or DONE. */
typedef enum kiq_dispose {
    KIQ_DISPOSE_DEFAULT = 0, /* nothing decided yet */
    KIQ_DISPOSE_DONE,        /* forget it */
    KIQ_DISPOSE_RETRY,       /* "retry" zset at score */
    KIQ_DISPOSE_DEAD,        /* "dead" zset at score */
    KIQ_DISPOSE_DROP,        /* failed, kept nowhere */
    KIQ_DISPOSE_SCHEDULE,    /* "schedule" zset at score */
    KIQ_DISPOSE_KEEP,        /* leave it in the working list (recovered later) */
} kiq_dispose_t;

/* Decides the job's fate. payload (copied; NULL = as fetched) is what is
 * stored for RETRY, DEAD and SCHEDULE. Returns 0, KIQ_EINVAL, KIQ_ENOMEM. */
KIQ_API int kiq_mw_dispose(kiq_mw_t *mw, kiq_dispose_t d, double score,
                           const char *payload, size_t len);
KIQ_API kiq_dispose_t kiq_mw_disposition(const kiq_mw_t *mw);

/* A client middleware that does not call kiq_mw_next denies the push;
 * it may say why (printf-style), which kiq_client_error then returns. */
KIQ_API void kiq_mw_deny(kiq_mw_t *mw, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The built-in uniqueness middleware, installed as "unique" in both
 * default chains (see unique.h). */
KIQ_API int kiq_unique_server_mw(kiq_mw_t *mw, void *udata);
KIQ_API int kiq_unique_client_mw(kiq_mw_t *mw, void *udata);

#endif
