/* Taking, releasing and waiting for uniqueness locks: one Lua script each
 * way (lua/lock.lua, lua/unlock.lua), in v9's key and metadata format. */
#include "kiq/unique.h"
#include "kiq/unique_admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/buf.h"
#include "support/json.h"
#include "observe/prometheus.h"
#include "support/time.h"
#include "middleware/unique_admin_internal.h"
#include "middleware/unique_internal.h"
#include "redis/scripts.h"

/* Metrics are recorded where the lock happens, as v9 does; a failure to
 * count never fails the lock. */
void kiq_unique__metric(kiq_redis_t *r, kiq_lock_type_t t, const char *event)
{
    kiq__metrics_lock_event(kiq__metrics_default(), kiq_lock_type_name(t), event);
    (void)kiq_unique_metric_record(r, kiq_lock_type_name(t), event);
}

void kiq_unique__key(char *out, size_t n, const char *digest, int runtime, const char *suffix)
{
    snprintf(out, n, "%s%s%s", digest, runtime ? KIQ_KEY_RUN : "", suffix);
}

/* v9's metadata, keys in its order. */
static char *metadata(const kiq_lock_req_t *q, double now)
{
    kiq_buf_t b = {0};
    int rc = kiq__buf_puts(&b, "{\"worker\":");
    if (!rc) rc = kiq__json_quote(&b, q->cls ? q->cls : "", strlen(q->cls ? q->cls : ""));
    if (!rc) rc = kiq__buf_puts(&b, ",\"queue\":");
    if (!rc) rc = kiq__json_quote(&b, q->queue ? q->queue : "", strlen(q->queue ? q->queue : ""));
    if (!rc) rc = q->limit > 1 ? kiq__buf_printf(&b, ",\"limit\":%d", q->limit)
                               : kiq__buf_puts(&b, ",\"limit\":null");
    if (!rc) rc = kiq__buf_printf(&b, ",\"timeout\":%ld", q->timeout > 0 ? q->timeout : 0);
    if (!rc) rc = q->ttl > 0 ? kiq__buf_printf(&b, ",\"ttl\":%ld", q->ttl)
                             : kiq__buf_puts(&b, ",\"ttl\":null");
    if (!rc) rc = kiq__buf_printf(&b, ",\"type\":\"%s\",\"lock_args\":%s,\"time\":%.6f",
                                 kiq_lock_type_name(q->type),
                                 q->lock_args ? q->lock_args : "[]", now);
    if (!rc) rc = q->at > 0 ? kiq__buf_printf(&b, ",\"at\":%.6f}", q->at)
                            : kiq__buf_puts(&b, ",\"at\":null}");
    if (rc) {
        kiq__buf_free(&b);
        return NULL;
    }
    return kiq__buf_take(&b, NULL);
}

/* One run of lock.lua; waiting (arrival > 0) adds the waiting zset. */
static int lock_once(kiq_redis_t *r, const kiq_lock_req_t *q, double arrival, double cutoff,
                     char *err)
{
    if (!q->digest || !q->jid)
        return kiq_seterr(err, KIQ_EINVAL, "a lock needs a digest and a jid");
    char locked[KIQ_DIGEST_MAX + 16], waiting[KIQ_DIGEST_MAX + 16];
    char pttl[32], limit[16], now_s[32], arr[32], cut[32];
    double now = kiq__now();
    kiq_unique__key(locked, sizeof(locked), q->digest, q->runtime, KIQ_KEY_LOCKED);
    kiq_unique__key(waiting, sizeof(waiting), q->digest, q->runtime, ":WAITING");
    long ttl = q->ttl < KIQ_UNIQUE_MAX_SECONDS ? q->ttl : KIQ_UNIQUE_MAX_SECONDS;
    snprintf(pttl, sizeof(pttl), "%ld", ttl > 0 ? ttl * 1000 : 0);
    snprintf(limit, sizeof(limit), "%d", q->limit > 0 ? q->limit : 1);
    snprintf(now_s, sizeof(now_s), "%.6f", now);
    snprintf(arr, sizeof(arr), "%.6f", arrival);
    snprintf(cut, sizeof(cut), "%.6f", cutoff);
    char *meta = q->metadata ? NULL : metadata(q, now);
    if (!q->metadata && !meta)
        return kiq_seterr(err, KIQ_ENOMEM, "out of memory");
    const char *argv[] = { locked, KIQ_UNIQUE_DIGESTS, waiting, q->jid, pttl,
                           kiq_lock_type_name(q->type), limit, q->metadata ? q->metadata : meta,
                           now_s, arr, cut };
    redisReply *rep;
    if (arrival > 0) {
        rep = kiq__redis_script(r, KIQ_SCRIPT_LOCK, 3, 11, argv, NULL);
    } else {
        const char *a2[] = { argv[0], argv[1], argv[3], argv[4], argv[5], argv[6], argv[7],
                             argv[8] };
        rep = kiq__redis_script(r, KIQ_SCRIPT_LOCK, 2, 8, a2, NULL);
    }
    free(meta);
    if (!rep)
        return kiq_seterr(err, KIQ_EREDIS, "%s", kiq_redis_error(r));
    int rc;
    if (rep->type != REDIS_REPLY_INTEGER)
        rc = kiq_seterr(err, KIQ_EREPLY, "lock.lua: %s",
                        rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    else if (rep->integer == 1)
        rc = KIQ_LOCK_ACQUIRED;
    else if (rep->integer == 2)
        rc = KIQ_LOCK_REENTERED;
    else if (rep->integer == -1)
        rc = KIQ_UNIQUE_NOT_YET;
    else
        rc = KIQ_EDENIED;
    freeReplyObject(rep);
    return rc;
}

int kiq_unique_lock(kiq_redis_t *r, const kiq_lock_req_t *req, char *err)
{
    int rc = lock_once(r, req, 0, 0, err);
    if (rc > 0)
        kiq_unique__metric(r, req->type, "locked");
    else if (rc == KIQ_EDENIED)
        kiq_unique__metric(r, req->type, "lock_failed");
    return rc;
}

int kiq_unique_unlock(kiq_redis_t *r, const char *digest, int runtime, const char *jid,
                      kiq_lock_type_t type, int force, char *err)
{
    if (!digest || !jid)
        return kiq_seterr(err, KIQ_EINVAL, "an unlock needs a digest and a jid");
    char locked[KIQ_DIGEST_MAX + 16];
    kiq_unique__key(locked, sizeof(locked), digest, runtime, KIQ_KEY_LOCKED);
    const char *argv[] = { locked, KIQ_UNIQUE_DIGESTS, jid,
                           force ? "force" : kiq_lock_type_name(type) };
    redisReply *rep = kiq__redis_script(r, KIQ_SCRIPT_UNLOCK, 2, 4, argv, NULL);
    if (!rep)
        return kiq_seterr(err, KIQ_EREDIS, "%s", kiq_redis_error(r));
    int rc;
    if (rep->type != REDIS_REPLY_INTEGER)
        rc = kiq_seterr(err, KIQ_EREPLY, "unlock.lua: %s",
                        rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    else
        rc = rep->integer == 1 ? 0 : KIQ_EDENIED;
    freeReplyObject(rep);
    if (!force)
        kiq_unique__metric(r, type, rc == 0 ? "unlocked" : "unlock_failed");
    return rc;
}

static void sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* The default waiter: in line by arrival time in "<key>:WAITING", polling
 * with a short capped backoff. Entries older than this wait's timeout plus
 * a margin belong to waiters that crashed and are dropped by lock.lua. */
static int poll_wait(void *self, kiq_redis_t *r, const kiq_lock_req_t *req, double timeout,
                     char *err)
{
    (void)self;
    double arrival = kiq__now(), end = kiq__mono() + timeout, pause = 0.01;
    int rc;
    for (;;) {
        rc = lock_once(r, req, arrival, kiq__now() - timeout - 5, err);
        if (rc > 0 || (rc < 0 && rc != KIQ_EDENIED && rc != KIQ_UNIQUE_NOT_YET))
            break;
        if (kiq__mono() >= end) {
            rc = KIQ_EDENIED;
            break;
        }
        sleep_s(pause);
        pause = pause * 2 > 0.1 ? 0.1 : pause * 2;
    }
    if (rc <= 0) {
        /* Leave the line so those behind need not wait out our entry. */
        char waiting[KIQ_DIGEST_MAX + 16];
        kiq_unique__key(waiting, sizeof(waiting), req->digest, req->runtime, ":WAITING");
        redisReply *rep = kiq_redis_cmdf(r, "ZREM %s %s", waiting, req->jid);
        freeReplyObject(rep);
    }
    return rc;
}

static const kiq_lock_waiter_t default_waiter = { poll_wait, NULL };
static const kiq_lock_waiter_t *waiter = &default_waiter;

void kiq_unique_set_waiter(const kiq_lock_waiter_t *w)
{
    waiter = w && w->wait ? w : &default_waiter;
}

int kiq_unique_lock_wait(kiq_redis_t *r, const kiq_lock_req_t *req, double timeout, char *err)
{
    if (timeout <= 0)
        return kiq_unique_lock(r, req, err);
    int rc = waiter->wait(waiter->self, r, req, timeout, err);
    if (rc > 0)
        kiq_unique__metric(r, req->type, "locked");
    else if (rc == KIQ_EDENIED)
        kiq_unique__metric(r, req->type, "lock_failed");
    return rc;
}
