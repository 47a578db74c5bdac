/* The client half of uniqueness: on push, write v9's lock fields into the
 * payload (lock, lock_timeout, lock_ttl, lock_prefix, lock_args,
 * lock_digest) and take the lock for the until_* types; on a conflict, run
 * the client strategy. A denied push is never silent: the caller gets
 * KIQ_EDENIED and the reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/time.h"
#include "middleware/mw.h"
#include "middleware/unique_internal.h"
#include "redis/scripts.h"

#define REPLACE_SCAN_LIMIT "10000"

static int write_fields(kiq_mw_t *mw, const kiq_unique_spec_t *s, long ttl)
{
    char num[32], digest[KIQ_DIGEST_MAX + 8];
    kiq_buf_t q = {0};
    int rc = 0;
    snprintf(num, sizeof(num), "\"%s\"", kiq_lock_type_name(s->type));
    rc = kiq_mw_set_field(mw, "lock", num);
    snprintf(num, sizeof(num), "%ld", s->timeout);
    if (!rc) rc = kiq_mw_set_field(mw, "lock_timeout", num);
    snprintf(num, sizeof(num), "%ld", ttl);
    if (!rc) rc = kiq_mw_set_field(mw, "lock_ttl", ttl > 0 ? num : "null");
    if (!rc) rc = kiq__json_quote(&q, s->prefix, strlen(s->prefix)) ? KIQ_ENOMEM : 0;
    if (!rc) rc = kiq_mw_set_field(mw, "lock_prefix", q.p);
    if (!rc) rc = kiq_mw_set_field(mw, "lock_args", s->lock_args);
    /* As v9: the while-executing family carries the runtime digest. */
    int run = s->type == KIQ_LOCK_WHILE_EXECUTING || s->type == KIQ_LOCK_WHILE_EXECUTING_REJECT;
    snprintf(digest, sizeof(digest), "\"%s%s\"", s->digest, run ? KIQ_KEY_RUN : "");
    if (!rc) rc = kiq_mw_set_field(mw, "lock_digest", digest);
    if (!rc && s->limit > 1) {
        snprintf(num, sizeof(num), "%d", s->limit);
        rc = kiq_mw_set_field(mw, "lock_limit", num);
    }
    if (!rc && (s->client || s->server)) {
        kiq_buf_t oc = {0};
        rc = kiq__buf_printf(&oc, "{\"client\":\"%s\",\"server\":\"%s\"}",
                            kiq_on_conflict_name(s->client), kiq_on_conflict_name(s->server));
        if (!rc) rc = kiq_mw_set_field(mw, "on_conflict", oc.p);
        kiq__buf_free(&oc);
    }
    kiq__buf_free(&q);
    return rc;
}

static int reject_to_dead(kiq_mw_t *mw)
{
    char score[32], cutoff[32];
    double now = kiq__now();
    snprintf(score, sizeof(score), "%.6f", now);
    /* Sidekiq's defaults: a client does not know the server's settings. */
    snprintf(cutoff, sizeof(cutoff), "(%.6f", now - 180.0 * 24 * 3600);
    const char *multi[] = { "MULTI" }, *exec[] = { "EXEC" };
    const char *zadd[] = { "ZADD", KIQ_KEY_DEAD, score, mw->payload };
    size_t zl[] = { 4, strlen(KIQ_KEY_DEAD), strlen(score), mw->len };
    const char *trim1[] = { "ZREMRANGEBYSCORE", KIQ_KEY_DEAD, "-inf", cutoff };
    const char *trim2[] = { "ZREMRANGEBYRANK", KIQ_KEY_DEAD, "0", "-10001" };
    int rc = kiq_redis_append(mw->r, 1, multi, NULL);
    if (!rc) rc = kiq_redis_append(mw->r, 4, zadd, zl);
    if (!rc) rc = kiq_redis_append(mw->r, 4, trim1, NULL);
    if (!rc) rc = kiq_redis_append(mw->r, 4, trim2, NULL);
    if (!rc) rc = kiq_redis_append(mw->r, 1, exec, NULL);
    for (int i = 0; i < 5 && !rc; i++) {
        redisReply *rep = kiq_redis_get_reply(mw->r);
        if (!rep)
            rc = KIQ_EREDIS;
        freeReplyObject(rep);
    }
    return rc;
}

/* Removes the job holding the digest and its lock. Returns 1 when one was
 * found, 0 when none, or a KIQ_E* code. */
static int replace_holder(kiq_mw_t *mw, const kiq_unique_spec_t *s)
{
    char locked[KIQ_DIGEST_MAX + 16];
    char *qkey = kiq__key_dup(KIQ_KEY_QUEUE, mw->queue); /* a name of any length */
    if (!qkey)
        return KIQ_ENOMEM;
    kiq_unique__key(locked, sizeof(locked), s->digest, 0, KIQ_KEY_LOCKED);
    const char *argv[] = { qkey, KIQ_KEY_SCHEDULE, KIQ_KEY_RETRY, locked, KIQ_UNIQUE_DIGESTS,
                           s->digest, REPLACE_SCAN_LIMIT };
    redisReply *rep = kiq__redis_script(mw->r, KIQ_SCRIPT_REPLACE, 5, 7, argv, NULL);
    free(qkey);
    if (!rep)
        return KIQ_EREDIS;
    int rc = rep->type == REDIS_REPLY_STRING ? 1 : rep->type == REDIS_REPLY_ERROR ? KIQ_EREPLY : 0;
    freeReplyObject(rep);
    return rc;
}

static int conflict(kiq_mw_t *mw, const kiq_unique_spec_t *s, kiq_lock_req_t *q)
{
    char err[KIQ_ERRLEN] = "";
    int rc;
    switch (s->client) {
    case KIQ_CONFLICT_RAISE:
        kiq_mw_deny(mw, "SidekiqUniqueJobs::Conflict: lock_digest %s is held by another job",
                    s->digest);
        return KIQ_EDENIED;
    case KIQ_CONFLICT_REJECT:
        rc = reject_to_dead(mw);
        kiq_mw_deny(mw, "lock_digest %s is held by another job; %s", s->digest,
                    rc ? "rejecting it to the dead set failed" : "the job went to the dead set");
        return KIQ_EDENIED;
    case KIQ_CONFLICT_REPLACE:
        rc = replace_holder(mw, s);
        if (rc == 1 && kiq_unique_lock(mw->r, q, err) > 0)
            return 0;
        kiq_mw_deny(mw, "lock_digest %s is held by a job that could not be replaced%s%s",
                    s->digest, rc < 0 ? ": " : "", rc < 0 ? kiq_redis_error(mw->r) : "");
        return KIQ_EDENIED;
    case KIQ_CONFLICT_RESCHEDULE: {
        double in = s->schedule_in > 0 ? s->schedule_in : 5;
        kiq_mw_set_at(mw, kiq__now() + in);
        (void)kiq_mw_set_field(mw, "enqueued_at", NULL); /* not enqueued yet */
        return 1; /* pushed, scheduled, without the lock: checked when it runs */
    }
    default:
        /* The caller gets the reason; a library does not write to stderr. */
        kiq_mw_deny(mw, "lock_digest %s is held by another job", s->digest);
        return KIQ_EDENIED;
    }
}

int kiq_unique_client_mw(kiq_mw_t *mw, void *udata)
{
    (void)udata;
    char err[KIQ_ERRLEN] = "";
    kiq_unique_spec_t s;
    int rc = kiq_unique__resolve(mw, &s, 1, err);
    if (rc) {
        kiq_mw_deny(mw, "uniqueness: %s", err);
        return rc;
    }
    if (s.type == KIQ_LOCK_NONE) {
        kiq_unique__spec_clear(&s);
        return kiq_mw_next(mw);
    }
    /* v9: the lock outlives the scheduling delay. */
    double now = kiq__now();
    long ttl = s.ttl;
    if (ttl > 0 && mw->at > now)
        ttl = mw->at - now < (double)(KIQ_UNIQUE_MAX_SECONDS - ttl)
                  ? ttl + ((long)mw->at - (long)now) : KIQ_UNIQUE_MAX_SECONDS;
    rc = write_fields(mw, &s, ttl);
    if (rc) {
        kiq_mw_deny(mw, "uniqueness: out of memory");
        goto out;
    }
    if (s.type == KIQ_LOCK_WHILE_EXECUTING || s.type == KIQ_LOCK_WHILE_EXECUTING_REJECT) {
        rc = kiq_mw_next(mw); /* locked only while it runs */
        goto out;
    }
    kiq_lock_req_t q = {
        .digest = s.digest, .jid = mw->jid, .type = s.type, .ttl = ttl, .limit = s.limit,
        .cls = mw->cls, .queue = mw->queue, .lock_args = s.lock_args, .timeout = s.timeout,
        .at = mw->at > now ? mw->at : 0,
    };
    int lr = kiq_unique_lock(mw->r, &q, err);
    if (lr == KIQ_EDENIED) {
        rc = conflict(mw, &s, &q);
        if (rc == 1) {
            rc = kiq_mw_next(mw);
            goto out;
        }
        if (rc)
            goto out;
        lr = KIQ_LOCK_ACQUIRED; /* replaced */
    }
    if (lr < 0) {
        kiq_mw_deny(mw, "uniqueness lock: %s", err);
        rc = lr;
        goto out;
    }
    rc = kiq_mw_next(mw);
    if (!mw->accepted && lr == KIQ_LOCK_ACQUIRED)
        (void)kiq_unique_unlock(mw->r, s.digest, 0, mw->jid, s.type, 1, err);
out:
    kiq_unique__spec_clear(&s);
    return rc;
}
