/* The admin operations on single locks behind `capstan locks` (and v9's web
 * UI): checking a digest a person typed, and deleting a lock with all its
 * holders. */
#include "unique/admin_internal.h"

#include <stdio.h>
#include <string.h>

#include "redis/keys.h"
#include "redis/reply.h"

int capstan__unique_digest_parse(const char *arg, char *out, size_t n, char *err)
{
    if (!arg || !*arg)
        return capstan_seterr(err, CAPSTAN_EINVAL, "the digest is empty");
    size_t len = capstan__key_base(arg, CAPSTAN_KEY_LOCKED);
    if (!len)
        len = strlen(arg);
    if (len > 512 || len + 1 > n)
        return capstan_seterr(err, CAPSTAN_EINVAL, "the digest is too long (%zu bytes)", len);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)arg[i];
        if (ch <= ' ' || ch >= 0x7f || strchr("*?[]\\\"'", ch))
            return capstan_seterr(err, CAPSTAN_EINVAL,
                                  "\"%s\" is not a digest: character %zu is not allowed", arg,
                                  i + 1);
    }
    const char *colon = memchr(arg, ':', len);
    if (!colon || colon == arg || colon == arg + len - 1)
        return capstan_seterr(err, CAPSTAN_EINVAL,
                              "\"%s\" is not a digest (expected PREFIX:HEX, e.g. uniquejobs:0f3a...)",
                              arg);
    memcpy(out, arg, len);
    out[len] = '\0';
    return 0;
}

int capstan__unique_lock_delete(capstan_redis_t *r, const char *digest, long *removed, char *err)
{
    char locked[600], run[600], run_locked[600];
    int is_run = capstan__key_base(digest, CAPSTAN_KEY_RUN) > 0;
    int rc = 0;
    long total = 0;
    if (strlen(digest) > 512)
        return capstan_seterr(err, CAPSTAN_EINVAL, "the digest is too long");
    capstan__key(locked, sizeof(locked), digest, CAPSTAN_KEY_LOCKED);
    capstan__key(run, sizeof(run), digest, CAPSTAN_KEY_RUN);
    capstan__key(run_locked, sizeof(run_locked), run, CAPSTAN_KEY_LOCKED);
    const char *unl[] = { "UNLINK", locked, run_locked };
    const char *zrem[] = { "ZREM", CAPSTAN_UNIQUE_DIGESTS, digest, run };
    /* A :RUN digest is one runtime lock; a base digest takes its runtime
     * lock with it, as deleting "the lock" of a job means both. */
    int nargs = is_run ? 2 : 3;
    int zargs = is_run ? 3 : 4;
    if (capstan_redis_append(r, nargs, unl, NULL) || capstan_redis_append(r, zargs, zrem, NULL))
        return capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
    for (int i = 0; i < 2; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep || rep->type != REDIS_REPLY_INTEGER) {
            if (!rc)
                rc = capstan__reply_error(r, rep, i ? "ZREM" : "UNLINK", err);
            freeReplyObject(rep);
            if (!rep)
                return rc;
            continue;
        }
        total += (long)rep->integer;
        freeReplyObject(rep);
    }
    if (removed)
        *removed = total;
    if (!rc && total == 0)
        rc = capstan_seterr(err, CAPSTAN_ENOTFOUND, "no lock with digest %s", digest);
    return rc;
}
