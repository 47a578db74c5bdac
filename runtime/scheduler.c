/* The scheduler thread: moves due jobs from "retry" and "schedule" to their
 * queues, each in one script whose ZREM decides, so two processes never
 * enqueue the same job twice. Polls at Sidekiq's randomised interval. */
#include "runtime/rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/payload.h"
#include "support/time.h"

#define BATCH 100

/* Prepares the payload pushed for a due member: enqueued_at = now and no
 * "at" (it would schedule the job again). */
static int prepare(const char *raw, size_t len, kiq_ts_format_t ts, double now,
                   char **out, size_t *outlen, char **queue)
{
    kiq_jobject_t obj = {0};
    *queue = NULL;
    if (kiq_json_scan_object(raw, len, &obj, NULL) != 0) {
        /* Unreadable: push it unchanged; the processor dead-letters it. */
        *out = malloc(len ? len : 1);
        if (!*out)
            return KIQ_ENOMEM;
        memcpy(*out, raw, len);
        *outlen = len;
        *queue = strdup("default");
        return *queue ? 0 : KIQ_ENOMEM;
    }
    const kiq_jmember_t *q = kiq_jobject_get(&obj, raw, "queue");
    *queue = q ? kiq_json_string_dup(raw + q->vstart, q->vlen) : NULL;
    if (!*queue || !**queue) {
        free(*queue);
        *queue = strdup("default");
    }
    char when[32];
    kiq_ts_json(when, now, ts);
    kiq_field_t set[] = { { "enqueued_at", when, 0 }, { "at", NULL, 0 } };
    int rc = kiq_payload_edit(raw, &obj, set, 2, out, outlen);
    kiq_jobject_free(&obj);
    return rc;
}

/* Moves up to BATCH due members of key; returns how many moved, or
 * KIQ_EREDIS. *more is set when the batch was full. */
static long move_batch(kiq_redis_t *r, const char *key, kiq_ts_format_t ts, double now, int *more)
{
    char nows[32];
    snprintf(nows, sizeof(nows), "%.6f", now);
    redisReply *due = kiq_redis_cmdf(r, "ZRANGEBYSCORE %s -inf %s LIMIT 0 %d", key, nows, BATCH);
    *more = 0;
    if (!due)
        return KIQ_EREDIS;
    if (due->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(due);
        return 0;
    }
    *more = due->elements == BATCH;
    size_t n = due->elements, sent = 0;
    long moved = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        redisReply *m = due->element[i];
        char *payload = NULL, *queue = NULL, qkey[512];
        size_t plen = 0;
        if (prepare(m->str, m->len, ts, now, &payload, &plen, &queue) == 0) {
            snprintf(qkey, sizeof(qkey), "queue:%s", queue);
            const char *argv[] = { key, qkey, "queues", m->str, payload, queue };
            size_t lens[] = { strlen(key), strlen(qkey), 6, m->len, plen, strlen(queue) };
            rc = kiq_redis_append_script(r, KIQ_SCRIPT_SCHEDULE, 3, 6, argv, lens);
            if (!rc)
                sent++;
        }
        free(payload);
        free(queue);
    }
    for (size_t i = 0; i < sent; i++) {
        redisReply *rep = kiq_redis_get_reply(r);
        if (!rep) {
            rc = KIQ_EREDIS;
            break;
        }
        if (rep->type == REDIS_REPLY_INTEGER)
            moved += rep->integer;
        else if (rep->type == REDIS_REPLY_ERROR)
            kiq_warn("scheduler: %s", rep->str);
        freeReplyObject(rep);
    }
    freeReplyObject(due);
    return rc ? KIQ_EREDIS : moved;
}

long kiq_scheduler_enqueue_due(kiq_redis_t *r, kiq_ts_format_t ts, double now)
{
    static const char *sets[] = { "retry", "schedule" };
    long total = 0;
    for (int s = 0; s < 2; s++) {
        int more = 1;
        while (more) {
            long n = move_batch(r, sets[s], ts, now, &more);
            if (n < 0)
                return n;
            total += n;
        }
    }
    return total;
}

static double poll_average(kiq_runtime_t *rt, kiq_redis_t *r, long *procs)
{
    if (rt->cfg->poll_interval_average > 0) {
        *procs = 1;
        return rt->cfg->poll_interval_average;
    }
    redisReply *rep = kiq_redis_cmdf(r, "SCARD processes");
    long n = rep && rep->type == REDIS_REPLY_INTEGER ? (long)rep->integer : 1;
    freeReplyObject(rep);
    *procs = n < 1 ? 1 : n;
    return (double)*procs * rt->cfg->average_scheduled_poll_interval;
}

void *kiq_scheduler_main(void *arg)
{
    kiq_runtime_t *rt = arg;
    char err[KIQ_ERRLEN];
    kiq_redis_t *r = kiq_redis_new(rt->cfg->redis_url, 10, err);
    if (!r) {
        kiq_error("scheduler: %s", err);
        return NULL;
    }
    /* Sidekiq waits before its first poll so a fleet that starts together
     * does not poll together; an explicit average skips that. */
    if (rt->cfg->poll_interval_average <= 0)
        kiq_rt_wait(rt, 5 + 5 * kiq_rand());
    while (!atomic_load(&rt->quiet)) {
        if (!kiq_redis_ok(r) && kiq_rt_connect(rt, r, &rt->quiet))
            break;
        if (kiq_scheduler_enqueue_due(r, rt->cfg->timestamps, kiq_now()) == KIQ_EREDIS)
            continue;
        long procs;
        double avg = poll_average(rt, r, &procs);
        double wait = procs < 10 ? avg * kiq_rand() + avg / 2 : avg * kiq_rand();
        kiq_rt_wait(rt, wait);
    }
    kiq_info("Scheduler exiting...");
    kiq_redis_free(r);
    return NULL;
}
