/* The fetch's keys at a clean stop (leave.h). */
#include "fetch/leave.h"

#include <hiredis/hiredis.h>

#include "fetch/fetch.h"
#include "redis/keys.h"
#include "support/log.h"

int capstan__fetch_leave(capstan_redis_t *r, const char *identity)
{
    char wkey[512], lkey[512];
    capstan__fetch_working_key(identity, wkey, sizeof(wkey));
    capstan__fetch_liveness_key(identity, lkey, sizeof(lkey));
    int rc = 1;
    redisReply *len = capstan_redis_cmdf(r, "LLEN %s", wkey);
    if (len && len->type == REDIS_REPLY_INTEGER && len->integer == 0) {
        redisReply *del = capstan_redis_cmdf(r, "DEL %s", lkey);
        rc = del && del->type == REDIS_REPLY_INTEGER ? 0 : 1;
        freeReplyObject(del);
        /* Nothing left for the recovery passes to look at. */
        if (rc == 0)
            freeReplyObject(capstan_redis_cmdf(r, "SREM %s %s", CAPSTAN_KEY_WORKING_SET, identity));
    } else if (len && len->type == REDIS_REPLY_INTEGER) {
        capstan_warn("%lld jobs remain in %s; they are recovered once this process is gone",
                     len->integer, wkey);
    }
    freeReplyObject(len);
    return rc;
}
