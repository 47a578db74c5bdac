/* Pushing jobs from C, in the payload format every Sidekiq version reads. */
#ifndef KIQ_CLIENT_H
#define KIQ_CLIENT_H

#include <stddef.h>

#include "config.h"
#include "error.h"

typedef struct kiq_client kiq_client_t;

typedef struct kiq_push_opts {
    const char *queue;   /* NULL = "default" */
    int retry;           /* KIQ_RETRY_UNSET (omit, i.e. true), KIQ_RETRY_DEFAULT
                            (true), KIQ_RETRY_NONE (false) or a count */
    double at;           /* run at this epoch time (seconds); 0 = now */
    kiq_ts_format_t timestamps; /* created_at/enqueued_at format */
    const char *extra;   /* raw JSON object whose members are added to the
                            payload (e.g. "{\"tags\":[\"a\"]}"), or NULL */
    const struct kiq_unique_opts *unique; /* uniqueness lock to take on push
                            (kiq/unique.h), or NULL; must outlive the call */
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

/* The last error's text; valid until the next call. */
KIQ_API const char *kiq_client_error(const kiq_client_t *c);

#endif
