/* Waiting for a wake-up token (wake.h). */
#include "redis/wake.h"

#include <stdio.h>

#include "support/time.h"

void capstan__redis_wait_wake(capstan_redis_t *r, const char *key, double s, double nap)
{
    if (!r || !capstan_redis_ok(r) || s < 0.001) {
        capstan__sleep(s < nap ? s : nap);
        return;
    }
    char secs[32];
    snprintf(secs, sizeof(secs), "%.3f", s);
    const char *argv[] = { "BLPOP", key, secs };
    redisReply *rep = capstan_redis_cmd(r, 3, argv, NULL);
    if (!rep || rep->type == REDIS_REPLY_ERROR)
        capstan__sleep(s < nap ? s : nap);
    freeReplyObject(rep);
}
