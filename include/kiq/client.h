/* Pushing jobs from C, in the payload format every Sidekiq version reads. */
#ifndef KIQ_CLIENT_H
#define KIQ_CLIENT_H

#include <stddef.h>

#include "config.h"
#include "error.h"
#include "redis.h"
#include "runtime.h"

typedef struct kiq_client kiq_client_t;

/* A field left unset (NULL, KIQ_RETRY_UNSET) takes the class's option (see
 * kiq_client_use_config and kiq_client_set_class), else the default. */
typedef struct kiq_push_opts {
    const char *queue;   /* NULL = the class's queue, else "default" */
    int retry;           /* KIQ_RETRY_UNSET (the class's, else true),
                            KIQ_RETRY_DEFAULT (true), KIQ_RETRY_NONE (false)
                            or a count */
    double at;           /* run at this epoch time (seconds); 0 = now */
    kiq_ts_format_t timestamps; /* created_at/enqueued_at format */
    const char *extra;   /* raw JSON object whose members are added to the
                            payload (e.g. "{\"tags\":[\"a\"]}"), or NULL */
    const struct kiq_unique_opts *unique; /* uniqueness lock to take on push
                            (kiq/unique.h), or NULL for the class's; must
                            outlive the call. Replaces every lock option of
                            the class. */
} kiq_push_opts_t;

/* The defaults: queue "default", retry unset, now, float timestamps. */
KIQ_API kiq_push_opts_t kiq_push_opts_default(void);

/* Connects to url (NULL = REDIS_URL or redis://127.0.0.1:6379/0). Returns a
 * client owned by the caller (kiq_client_free), or NULL with err filled.
 * A client is not thread-safe: use one per thread. */
KIQ_API kiq_client_t *kiq_client_new(const char *url, char *err);
KIQ_API void kiq_client_free(kiq_client_t *c);

/* Pushes one job of class cls with args (a JSON array text, NULL = "[]"),
 * through the client middleware chain. Writes its jid into jid (25 bytes,
 * may be NULL). Returns 0 or a KIQ_E* code (KIQ_EDENIED when a middleware,
 * such as a uniqueness lock, refused the push); kiq_client_error() then
 * says why. */
KIQ_API int kiq_client_push(kiq_client_t *c, const char *cls, const char *args,
                            const kiq_push_opts_t *opts, char jid[25]);

/* Pushes n jobs of one class in one round trip (one LPUSH, or one ZADD when
 * opts->at is in the future). jids may be NULL or hold n entries. Each job
 * goes through the client chain; a denied job gets an empty jid, the others
 * are pushed, and the call returns KIQ_EDENIED. */
KIQ_API int kiq_client_push_bulk(kiq_client_t *c, const char *cls,
                                 const char *const *args, size_t n,
                                 const kiq_push_opts_t *opts, char (*jids)[25]);

/* Class options, as a worker's sidekiq_options are to Sidekiq's client:
 * every push of cls writes opts->retry, opts->queue and the lock options of
 * opts->unique into the payload, unless the push options give their own.
 * Copied, but opts->unique must outlive c. Setting a class again replaces
 * its options. Returns 0, KIQ_EINVAL or KIQ_ENOMEM. */
KIQ_API int kiq_client_set_class(kiq_client_t *c, const char *cls,
                                 const kiq_class_opts_t *opts);

/* Reads the classes: section of cfg on every push (retry, queue and the
 * lock options), ahead of kiq_client_set_class's options, as the server
 * reads them. cfg is borrowed and must outlive c; NULL stops. */
KIQ_API void kiq_client_use_config(kiq_client_t *c, const kiq_config_t *cfg);

/* Both at once from a runtime: the options its classes were registered
 * with and its configuration's classes: section. rt must outlive c. This
 * is how a handler's own client pushes jobs of the runtime's classes.
 * Returns 0 or KIQ_ENOMEM. */
KIQ_API int kiq_client_use_runtime(kiq_client_t *c, const kiq_runtime_t *rt);

/* The last error's text; valid until the next call. */
KIQ_API const char *kiq_client_error(const kiq_client_t *c);

/* The client's own connection (borrowed), for commands that go with its
 * pushes, such as a batch's (kiq/batch.h). */
KIQ_API kiq_redis_t *kiq_client_redis(kiq_client_t *c);

#endif
