/* A Redis connection that knows its URL, reconnects, and runs capstan's Lua
 * scripts by EVALSHA (loading them again after NOSCRIPT).
 *
 * Not thread-safe: each thread owns its own capstan_redis_t. */
#ifndef CAPSTAN_REDIS_H
#define CAPSTAN_REDIS_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "error.h"

typedef struct capstan_redis capstan_redis_t;

/* Returns a connection handle for url (copied; not yet connected), owned by
 * the caller (capstan_redis_free), or NULL with err filled when the URL is bad.
 * timeout is the socket timeout in seconds for every command. */
CAPSTAN_API capstan_redis_t *capstan_redis_new(const char *url, double timeout, char *err);
CAPSTAN_API void capstan_redis_free(capstan_redis_t *r);

/* Connects (or reconnects) now: TCP or unix socket (to the master the
 * sentinels name, for a sentinel URL), the TLS handshake of rediss://,
 * AUTH, SELECT, and loads capstan's scripts. Returns 0, CAPSTAN_EREDIS when
 * it may work later (no answer, refused, LOADING), or CAPSTAN_ECONFIG when
 * it cannot as configured: the server refused the URL's password, user,
 * ACL rights (SCRIPT LOAD or EVALSHA) or database, it is a Redis Cluster
 * node, the TLS settings or the server's certificate are wrong, or the
 * sentinels know no master of that name. capstan_redis_error()
 * says why (never with the password). */
CAPSTAN_API int capstan_redis_connect(capstan_redis_t *r);
/* True while the connection is believed usable. An I/O error on any command
 * marks it broken; the owner then calls capstan_redis_connect again. */
CAPSTAN_API int capstan_redis_ok(const capstan_redis_t *r);
/* The last failure: an I/O error, or the last error reply (NOSCRIPT aside).
 * Borrowed; valid until the next call on r. */
CAPSTAN_API const char *capstan_redis_error(const capstan_redis_t *r);
/* The URL with the password redacted, for logs. Borrowed from r. */
CAPSTAN_API const char *capstan_redis_name(const capstan_redis_t *r);
/* The underlying hiredis context (NULL when not connected). Owned by r:
 * never free it; a reconnect replaces it. */
CAPSTAN_API redisContext *capstan_redis_ctx(capstan_redis_t *r);

/* Runs one command. Returns the reply (the caller frees it with
 * freeReplyObject) or NULL on a connection error. A Redis error reply is
 * returned as a reply of type REDIS_REPLY_ERROR. lens may be NULL (strlen). */
CAPSTAN_API redisReply *capstan_redis_cmd(capstan_redis_t *r, int argc, const char **argv,
                                          const size_t *lens);
/* printf-style, as hiredis' redisCommand. */
CAPSTAN_API redisReply *capstan_redis_cmdf(capstan_redis_t *r, const char *fmt, ...);

/* Pipelining: append commands, then read their replies in order. Append
 * returns 0 or CAPSTAN_EREDIS; get_reply returns NULL on a connection error. */
CAPSTAN_API int capstan_redis_append(capstan_redis_t *r, int argc, const char **argv,
                                     const size_t *lens);
CAPSTAN_API redisReply *capstan_redis_get_reply(capstan_redis_t *r);

#endif
