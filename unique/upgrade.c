/* The one-time migration of sidekiq-unique-jobs v8 lock keys to v9's
 * two-key layout (reference/unique-jobs.md §9), so a fleet moving from v8
 * to capstan (or to v9 and capstan) does not keep thirteen keys per lock forever.
 * It writes v9's own marker, so neither capstan nor a v9 process runs it twice. */
#include "unique/admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/keys.h"
#include "redis/reply.h"
#include "redis/scan.h"
#include "support/time.h"

/* v8 keys beside <digest>:LOCKED that v9 no longer uses. Unlike v9 this
 * keeps <digest>:RUN:LOCKED: the runtime lock of a job running while the
 * fleet rolls over (reference §14, item 11). */
static const char *const v8_suffixes[] = {
    ":QUEUED", ":PRIMED", ":INFO", ":RUN", ":RUN:QUEUED", ":RUN:PRIMED", ":RUN:INFO",
};
#define NSUFFIXES (sizeof(v8_suffixes) / sizeof(v8_suffixes[0]))

/* Cleans the v8 keys around one <digest>:LOCKED key. */
static int upgrade_one(capstan_redis_t *r, const char *locked_key, capstan_upgrade_result_t *out,
                       char *err)
{
    char digest[1024], keys[NSUFFIXES][1100], run_locked[1100], run[1100];
    size_t len = capstan__key_base(locked_key, CAPSTAN_KEY_LOCKED);
    if (!len || len >= sizeof(digest))
        return 0;
    snprintf(digest, sizeof(digest), "%.*s", (int)len, locked_key);
    int rc = 0;

    /* The v8 digest itself was a string (holding the jid); a v9 lock never
     * has a key at the bare digest, but check the type to be sure. */
    const char *type[] = { "TYPE", digest };
    redisReply *t = capstan_redis_cmd(r, 2, type, NULL);
    if (!t || t->type != REDIS_REPLY_STATUS) {
        rc = capstan__reply_error(r, t, "TYPE", err);
        freeReplyObject(t);
        return rc;
    }
    int is_string = strcmp(t->str, "string") == 0;
    freeReplyObject(t);

    const char *argv[NSUFFIXES + 2];
    int argc = 0;
    argv[argc++] = "UNLINK";
    if (is_string)
        argv[argc++] = digest;
    for (size_t i = 0; i < NSUFFIXES; i++) {
        snprintf(keys[i], sizeof(keys[i]), "%s%s", digest, v8_suffixes[i]);
        argv[argc++] = keys[i];
    }
    redisReply *u = capstan_redis_cmd(r, argc, argv, NULL);
    if (!u || u->type != REDIS_REPLY_INTEGER) {
        rc = capstan__reply_error(r, u, "UNLINK", err);
        freeReplyObject(u);
        return rc;
    }
    out->deleted += (long)u->integer;
    freeReplyObject(u);

    /* The runtime lock we keep must be in the index, or nothing would ever
     * free it once its job is gone. NX: never move an existing score. */
    capstan__key(run, sizeof(run), digest, CAPSTAN_KEY_RUN);
    capstan__key(run_locked, sizeof(run_locked), run, CAPSTAN_KEY_LOCKED);
    const char *ex[] = { "EXISTS", run_locked };
    redisReply *e = capstan_redis_cmd(r, 2, ex, NULL);
    int has_run = e && e->type == REDIS_REPLY_INTEGER && e->integer == 1;
    if (!e) {
        rc = capstan__reply_error(r, e, "EXISTS", err);
        return rc;
    }
    freeReplyObject(e);
    if (has_run) {
        char now[64];
        snprintf(now, sizeof(now), "%.6f", capstan__now());
        const char *za[] = { "ZADD", CAPSTAN_UNIQUE_DIGESTS, "NX", now, run };
        redisReply *z = capstan_redis_cmd(r, 5, za, NULL);
        if (!z || z->type != REDIS_REPLY_INTEGER)
            rc = capstan__reply_error(r, z, "ZADD", err);
        else
            out->indexed += (long)z->integer;
        freeReplyObject(z);
    }
    return rc;
}

static int merge_expiring(capstan_redis_t *r, capstan_upgrade_result_t *out, char *err)
{
    const redisReply *items;
    capstan_scan_t s;
    int rc = 0, more = 0;
    capstan__scan_init(&s, r, CAPSTAN_KEY_EXPIRING_DIGESTS, NULL, 100);
    while (!rc && (more = capstan__scan_next(&s, &items, err)) > 0) {
        for (size_t i = 0; i + 1 < items->elements && !rc; i += 2) {
            const char *za[] = { "ZADD", CAPSTAN_UNIQUE_DIGESTS, items->element[i + 1]->str,
                                 items->element[i]->str };
            redisReply *z = capstan_redis_cmd(r, 4, za, NULL);
            if (!z || z->type != REDIS_REPLY_INTEGER)
                rc = capstan__reply_error(r, z, "ZADD", err);
            else
                out->merged++;
            freeReplyObject(z);
        }
    }
    capstan__scan_close(&s);
    if (!rc)
        rc = more;
    if (!rc) {
        const char *unlink[] = { "UNLINK", CAPSTAN_KEY_EXPIRING_DIGESTS };
        redisReply *u = capstan_redis_cmd(r, 2, unlink, NULL);
        if (!u || u->type == REDIS_REPLY_ERROR)
            rc = capstan__reply_error(r, u, "UNLINK", err);
        freeReplyObject(u);
    }
    return rc;
}

int capstan__unique_upgrade(capstan_redis_t *r, capstan_upgrade_result_t *out, char *err)
{
    memset(out, 0, sizeof(*out));
    int rc = 0;
    redisReply *rep = capstan_redis_cmdf(r, "HEXISTS %s %s", CAPSTAN_UNIQUE_UPGRADED_KEY,
                                         CAPSTAN_UNIQUE_UPGRADE_VERSION);
    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        rc = capstan__reply_error(r, rep, "HEXISTS " CAPSTAN_UNIQUE_UPGRADED_KEY, err);
        goto out;
    }
    out->already = rep->integer == 1;
    freeReplyObject(rep);
    rep = NULL;
    if (out->already)
        goto out;
    rep = capstan_redis_cmdf(r, "EXISTS %s", CAPSTAN_KEY_UNIQUE_V8_DEAD);
    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        rc = capstan__reply_error(r, rep, "EXISTS " CAPSTAN_KEY_UNIQUE_V8_DEAD, err);
        goto out;
    }
    out->legacy = rep->integer == 1;
    freeReplyObject(rep);
    rep = NULL;
    if (out->legacy)
        goto out; /* v9 skips the upgrade and writes no marker either */

    const redisReply *keys;
    capstan_scan_t s;
    int more = 0;
    capstan__scan_init(&s, r, NULL, CAPSTAN_KEY_UNIQUE_PREFIX ":*" CAPSTAN_KEY_LOCKED, 100);
    while (!rc && (more = capstan__scan_next(&s, &keys, err)) > 0) {
        for (size_t i = 0; i < keys->elements && !rc; i++) {
            const char *k = keys->element[i]->str;
            size_t len = capstan__key_base(k, CAPSTAN_KEY_RUN CAPSTAN_KEY_LOCKED);
            char base[1100];
            /* A runtime lock is cleaned as part of its base digest, which a
             * while_executing job never locks itself. Twice is harmless. */
            if (len && len + 11 < sizeof(base)) {
                snprintf(base, sizeof(base), "%.*s" CAPSTAN_KEY_LOCKED, (int)len, k);
                k = base;
            }
            out->locks++;
            rc = upgrade_one(r, k, out, err);
        }
    }
    capstan__scan_close(&s);
    if (!rc)
        rc = more;
    if (!rc)
        rc = merge_expiring(r, out, err);
    if (!rc) {
        char now[64];
        snprintf(now, sizeof(now), "%.6f", capstan__now());
        const char *hset[] = { "HSET", CAPSTAN_UNIQUE_UPGRADED_KEY, CAPSTAN_UNIQUE_UPGRADE_VERSION, now };
        rep = capstan_redis_cmd(r, 4, hset, NULL);
        if (!rep || rep->type != REDIS_REPLY_INTEGER)
            rc = capstan__reply_error(r, rep, "HSET " CAPSTAN_UNIQUE_UPGRADED_KEY, err);
    }
out:
    freeReplyObject(rep);
    return rc;
}
