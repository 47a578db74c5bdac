/* Internal: one way to turn a failed command into a CAPSTAN_E* code. */
#ifndef CAPSTAN_REDIS_REPLY_H
#define CAPSTAN_REDIS_REPLY_H

#include "capstan/redis.h"

/* For a command whose reply was not what the caller wanted: a NULL reply
 * (the connection failed; pass NULL too when capstan_redis_append failed) gives
 * CAPSTAN_EREDIS with capstan_redis_error's text, an error reply CAPSTAN_EREPLY with its
 * text, any other reply CAPSTAN_EREPLY "unexpected reply type N". err (may be
 * NULL) reads "what: why". Does not free rep. */
int capstan__reply_error(capstan_redis_t *r, const redisReply *rep, const char *what, char *err);

#endif
