/* Internal: waiting for a wake-up token that another client's release
 * pushes to a list (a limiter's free slot, a lock's waiters). */
#ifndef CAPSTAN_REDIS_WAKE_H
#define CAPSTAN_REDIS_WAKE_H

#include "capstan/redis.h"

/* Blocks on r until a token arrives on the list key (BLPOP) or s seconds
 * pass. A waiter tries again after either, so a failure only costs the
 * wait: when r is not connected, the command fails or s is under a
 * millisecond (BLPOP 0 would block forever), it sleeps the shorter of s
 * and nap instead. */
void capstan__redis_wait_wake(capstan_redis_t *r, const char *key, double s, double nap);

#endif
