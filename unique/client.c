/* The client half of uniqueness: on push, write v9's lock fields into the
 * payload (lock, lock_timeout, lock_ttl, lock_prefix, lock_args,
 * lock_digest) and take the lock for the until_* types; on a conflict, run
 * the client strategy. A denied push is never silent: the caller gets
 * CAPSTAN_EDENIED and the reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/time.h"
#include "middleware/mw.h"
#include "unique/internal.h"
#include "redis/scripts.h"

#define REPLACE_SCAN_LIMIT "10000"

static int write_fields(capstan_mw_t *mw, const capstan_unique_spec_t *s, long ttl)
{
    char num[32], digest[CAPSTAN_DIGEST_MAX + 8];
    capstan_buf_t q = {0};
    int rc = 0;
    snprintf(num, sizeof(num), "\"%s\"", capstan_lock_type_name(s->type));
    rc = capstan_mw_set_field(mw, "lock", num);
    snprintf(num, sizeof(num), "%ld", s->timeout);
    if (!rc) rc = capstan_mw_set_field(mw, "lock_timeout", num);
    snprintf(num, sizeof(num), "%ld", ttl);
    if (!rc) rc = capstan_mw_set_field(mw, "lock_ttl", ttl > 0 ? num : "null");
    if (!rc) rc = capstan__json_quote(&q, s->prefix, strlen(s->prefix)) ? CAPSTAN_ENOMEM : 0;
    if (!rc) rc = capstan_mw_set_field(mw, "lock_prefix", q.p);
    if (!rc) rc = capstan_mw_set_field(mw, "lock_args", s->lock_args);
    /* As v9: the while-executing family carries the runtime digest. */
    int run = s->type == CAPSTAN_LOCK_WHILE_EXECUTING || s->type == CAPSTAN_LOCK_WHILE_EXECUTING_REJECT;
    snprintf(digest, sizeof(digest), "\"%s%s\"", s->digest, run ? CAPSTAN_KEY_RUN : "");
    if (!rc) rc = capstan_mw_set_field(mw, "lock_digest", digest);
    if (!rc && s->limit > 1) {
        snprintf(num, sizeof(num), "%d", s->limit);
        rc = capstan_mw_set_field(mw, "lock_limit", num);
    }
    if (!rc && (s->client || s->server)) {
        capstan_buf_t oc = {0};
        rc = capstan__buf_printf(&oc, "{\"client\":\"%s\",\"server\":\"%s\"}",
                                 capstan_on_conflict_name(s->client), capstan_on_conflict_name(s->server));
        if (!rc) rc = capstan_mw_set_field(mw, "on_conflict", oc.p);
        capstan__buf_free(&oc);
    }
    capstan__buf_free(&q);
    return rc;
}

static int reject_to_dead(capstan_mw_t *mw)
{
    char score[32], cutoff[32];
    double now = capstan__now();
    snprintf(score, sizeof(score), "%.6f", now);
    /* Sidekiq's defaults: a client does not know the server's settings. */
    snprintf(cutoff, sizeof(cutoff), "(%.6f", now - 180.0 * 24 * 3600);
    const char *multi[] = { "MULTI" }, *exec[] = { "EXEC" };
    const char *zadd[] = { "ZADD", CAPSTAN_KEY_DEAD, score, mw->payload };
    size_t zl[] = { 4, strlen(CAPSTAN_KEY_DEAD), strlen(score), mw->len };
    const char *trim1[] = { "ZREMRANGEBYSCORE", CAPSTAN_KEY_DEAD, "-inf", cutoff };
    const char *trim2[] = { "ZREMRANGEBYRANK", CAPSTAN_KEY_DEAD, "0", "-10001" };
    int rc = capstan_redis_append(mw->r, 1, multi, NULL);
    if (!rc) rc = capstan_redis_append(mw->r, 4, zadd, zl);
    if (!rc) rc = capstan_redis_append(mw->r, 4, trim1, NULL);
    if (!rc) rc = capstan_redis_append(mw->r, 4, trim2, NULL);
    if (!rc) rc = capstan_redis_append(mw->r, 1, exec, NULL);
    for (int i = 0; i < 5 && !rc; i++) {
        redisReply *rep = capstan_redis_get_reply(mw->r);
        if (!rep)
            rc = CAPSTAN_EREDIS;
        freeReplyObject(rep);
    }
    return rc;
}

/* Removes the job holding the digest and its lock. Returns 1 when one was
 * found, 0 when none, or a CAPSTAN_E* code. */
static int replace_holder(capstan_mw_t *mw, const capstan_unique_spec_t *s)
{
    char locked[CAPSTAN_DIGEST_MAX + 16];
    char *qkey = capstan__key_dup(CAPSTAN_KEY_QUEUE, mw->queue); /* a name of any length */
    if (!qkey)
        return CAPSTAN_ENOMEM;
    capstan_unique__key(locked, sizeof(locked), s->digest, 0, CAPSTAN_KEY_LOCKED);
    const char *argv[] = { qkey, CAPSTAN_KEY_SCHEDULE, CAPSTAN_KEY_RETRY, locked, CAPSTAN_UNIQUE_DIGESTS,
                           s->digest, REPLACE_SCAN_LIMIT };
    redisReply *rep = capstan__redis_script(mw->r, CAPSTAN_SCRIPT_REPLACE, 5, 7, argv, NULL);
    free(qkey);
    if (!rep)
        return CAPSTAN_EREDIS;
    int rc = rep->type == REDIS_REPLY_STRING ? 1 : rep->type == REDIS_REPLY_ERROR ? CAPSTAN_EREPLY : 0;
    freeReplyObject(rep);
    return rc;
}

static int conflict(capstan_mw_t *mw, const capstan_unique_spec_t *s, capstan_lock_req_t *q)
{
    char err[CAPSTAN_ERRLEN] = "";
    int rc;
    switch (s->client) {
    case CAPSTAN_CONFLICT_RAISE:
        capstan_mw_deny(mw, "SidekiqUniqueJobs::Conflict: lock_digest %s is held by another job",
                        s->digest);
        return CAPSTAN_EDENIED;
    case CAPSTAN_CONFLICT_REJECT:
        rc = reject_to_dead(mw);
        capstan_mw_deny(mw, "lock_digest %s is held by another job; %s", s->digest,
                        rc ? "rejecting it to the dead set failed" : "the job went to the dead set");
        return CAPSTAN_EDENIED;
    case CAPSTAN_CONFLICT_REPLACE:
        rc = replace_holder(mw, s);
        if (rc == 1 && capstan_unique_lock(mw->r, q, err) > 0)
            return 0;
        capstan_mw_deny(mw, "lock_digest %s is held by a job that could not be replaced%s%s",
                        s->digest, rc < 0 ? ": " : "", rc < 0 ? capstan_redis_error(mw->r) : "");
        return CAPSTAN_EDENIED;
    case CAPSTAN_CONFLICT_RESCHEDULE: {
        double in = s->schedule_in > 0 ? s->schedule_in : 5;
        capstan_mw_set_at(mw, capstan__now() + in);
        (void)capstan_mw_set_field(mw, "enqueued_at", NULL); /* not enqueued yet */
        return 1; /* pushed, scheduled, without the lock: checked when it runs */
    }
    default:
        /* The caller gets the reason; a library does not write to stderr. */
        capstan_mw_deny(mw, "lock_digest %s is held by another job", s->digest);
        return CAPSTAN_EDENIED;
    }
}

int capstan_unique_client_mw(capstan_mw_t *mw, void *udata)
{
    (void)udata;
    char err[CAPSTAN_ERRLEN] = "";
    capstan_unique_spec_t s;
    int rc = capstan_unique__resolve(mw, &s, 1, err);
    if (rc) {
        capstan_mw_deny(mw, "uniqueness: %s", err);
        return rc;
    }
    if (s.type == CAPSTAN_LOCK_NONE) {
        capstan_unique__spec_clear(&s);
        return capstan_mw_next(mw);
    }
    /* v9: the lock outlives the scheduling delay. */
    double now = capstan__now();
    long ttl = s.ttl;
    if (ttl > 0 && mw->at > now)
        ttl = mw->at - now < (double)(CAPSTAN_UNIQUE_MAX_SECONDS - ttl)
                  ? ttl + ((long)mw->at - (long)now) : CAPSTAN_UNIQUE_MAX_SECONDS;
    rc = write_fields(mw, &s, ttl);
    if (rc) {
        capstan_mw_deny(mw, "uniqueness: out of memory");
        goto out;
    }
    if (s.type == CAPSTAN_LOCK_WHILE_EXECUTING || s.type == CAPSTAN_LOCK_WHILE_EXECUTING_REJECT) {
        rc = capstan_mw_next(mw); /* locked only while it runs */
        goto out;
    }
    capstan_lock_req_t q = {
        .digest = s.digest, .jid = mw->jid, .type = s.type, .ttl = ttl, .limit = s.limit,
        .cls = mw->cls, .queue = mw->queue, .lock_args = s.lock_args, .timeout = s.timeout,
        .at = mw->at > now ? mw->at : 0,
    };
    int lr = capstan_unique_lock(mw->r, &q, err);
    if (lr == CAPSTAN_EDENIED) {
        rc = conflict(mw, &s, &q);
        if (rc == 1) {
            rc = capstan_mw_next(mw);
            goto out;
        }
        if (rc)
            goto out;
        lr = CAPSTAN_LOCK_ACQUIRED; /* replaced */
    }
    if (lr < 0) {
        capstan_mw_deny(mw, "uniqueness lock: %s", err);
        rc = lr;
        goto out;
    }
    rc = capstan_mw_next(mw);
    if (!mw->accepted && lr == CAPSTAN_LOCK_ACQUIRED)
        (void)capstan_unique_unlock(mw->r, s.digest, 0, mw->jid, s.type, 1, err);
out:
    capstan_unique__spec_clear(&s);
    return rc;
}
