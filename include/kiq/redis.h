/* A Redis connection that knows its URL, reconnects, and runs kiq's Lua
 * scripts by EVALSHA (loading them again after NOSCRIPT).
 *
 * Not thread-safe: each thread owns its own kiq_redis_t. */
#ifndef KIQ_REDIS_H
#define KIQ_REDIS_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "error.h"

typedef struct kiq_redis kiq_redis_t;

/* Returns a connection handle for url (not yet connected), owned by the
 * caller (kiq_redis_free), or NULL with err filled when the URL is bad.
 * timeout is the socket timeout in seconds for every command. */
KIQ_API kiq_redis_t *kiq_redis_new(const char *url, double timeout, char *err);
KIQ_API void kiq_redis_free(kiq_redis_t *r);

/* Connects (or reconnects) now: TCP/unix connect, AUTH, SELECT. Returns 0,
 * KIQ_EREDIS when it may work later (no answer, refused, LOADING), or
 * KIQ_ECONFIG when the server refused the URL's password, user, ACL
 * rights or database; kiq_redis_error() says why (never with the
 * password). */
KIQ_API int kiq_redis_connect(kiq_redis_t *r);
/* True while the connection is believed usable. An I/O error on any command
 * marks it broken; the owner then calls kiq_redis_connect again. */
KIQ_API int kiq_redis_ok(const kiq_redis_t *r);
/* The last failure: an I/O error, or the last error reply (NOSCRIPT aside).
 * Borrowed; valid until the next call on r. */
KIQ_API const char *kiq_redis_error(const kiq_redis_t *r);
/* The URL with the password redacted, for logs. */
KIQ_API const char *kiq_redis_name(const kiq_redis_t *r);
/* The underlying hiredis context (NULL when not connected). */
KIQ_API redisContext *kiq_redis_ctx(kiq_redis_t *r);

/* Runs one command. Returns the reply (the caller frees it with
 * freeReplyObject) or NULL on a connection error. A Redis error reply is
 * returned as a reply of type REDIS_REPLY_ERROR. lens may be NULL (strlen). */
KIQ_API redisReply *kiq_redis_cmd(kiq_redis_t *r, int argc, const char **argv,
                                  const size_t *lens);
/* printf-style, as hiredis' redisCommand. */
KIQ_API redisReply *kiq_redis_cmdf(kiq_redis_t *r, const char *fmt, ...);

/* Pipelining: append commands, then read their replies in order. Append
 * returns 0 or KIQ_EREDIS; get_reply returns NULL on a connection error. */
KIQ_API int kiq_redis_append(kiq_redis_t *r, int argc, const char **argv,
                             const size_t *lens);
KIQ_API redisReply *kiq_redis_get_reply(kiq_redis_t *r);

#endif
