/* Reply errors: the connection's failure or the server's error text. */
#include "redis/reply.h"

int capstan__reply_error(capstan_redis_t *r, const redisReply *rep, const char *what, char *err)
{
    if (!rep)
        return capstan_seterr(err, CAPSTAN_EREDIS, "%s: %s", what, capstan_redis_error(r));
    if (rep->type == REDIS_REPLY_ERROR)
        return capstan_seterr(err, CAPSTAN_EREPLY, "%s: %s", what, rep->str);
    return capstan_seterr(err, CAPSTAN_EREPLY, "%s: unexpected reply type %d", what, rep->type);
}
