/* Internal: one way to turn a failed command into a KIQ_E* code. */
#ifndef KIQ_REDIS_REPLY_H
#define KIQ_REDIS_REPLY_H

#include "kiq/redis.h"

/* For a command whose reply was not what the caller wanted: a NULL reply
 * (the connection failed; pass NULL too when kiq_redis_append failed) gives
 * KIQ_EREDIS with kiq_redis_error's text, an error reply KIQ_EREPLY with its
 * text, any other reply KIQ_EREPLY "unexpected reply type N". err (may be
 * NULL) reads "what: why". Does not free rep. */
int kiq__reply_error(kiq_redis_t *r, const redisReply *rep, const char *what, char *err);

#endif
