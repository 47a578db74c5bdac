/* Reply errors: the connection's failure or the server's error text. */
#include "redis/reply.h"

int kiq__reply_error(kiq_redis_t *r, const redisReply *rep, const char *what, char *err)
{
    if (!rep)
        return kiq_seterr(err, KIQ_EREDIS, "%s: %s", what, kiq_redis_error(r));
    if (rep->type == REDIS_REPLY_ERROR)
        return kiq_seterr(err, KIQ_EREPLY, "%s: %s", what, rep->str);
    return kiq_seterr(err, KIQ_EREPLY, "%s: unexpected reply type %d", what, rep->type);
}
