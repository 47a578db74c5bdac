/* The scheduler thread: moves due jobs from "retry" and "schedule" to their
 * queues, each in one script whose ZREM decides, so two processes never
 * enqueue the same job twice. Polls at Sidekiq's randomised interval, and
 * wakes besides when a job this process rescheduled (a limiter's or a
 * lock's reschedule: often a fraction of a second) falls due. */
#include "runtime/rt.h"
#include "runtime/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/keys.h"
#include "redis/scripts.h"
#include "support/log.h"
#include "support/payload.h"
#include "support/time.h"

#define BATCH 100

/* Prepares the payload pushed for a due member: enqueued_at = now and no
 * "at" (it would schedule the job again). enqueued_at takes the unit the
 * payload already carries (ts only decides for one that carries none), so a
 * Sidekiq 8 job back from retry or schedule keeps integer milliseconds. */
static int prepare(const char *raw, size_t len, capstan_ts_format_t ts, double now,
                   char **out, size_t *outlen, char **queue)
{
    capstan_jobject_t obj = {0};
    *queue = NULL;
    if (capstan__json_scan_object(raw, len, &obj, NULL) != 0) {
        /* Unreadable: push it unchanged; the processor dead-letters it. */
        *out = malloc(len ? len : 1);
        if (!*out)
            return CAPSTAN_ENOMEM;
        memcpy(*out, raw, len);
        *outlen = len;
        *queue = strdup("default");
        return *queue ? 0 : CAPSTAN_ENOMEM;
    }
    const capstan_jmember_t *q = capstan__jobject_get(&obj, raw, "queue");
    *queue = q ? capstan__json_string_dup(raw + q->vstart, q->vlen) : NULL;
    if (!*queue || !**queue) {
        free(*queue);
        *queue = strdup("default");
    }
    char when[32];
    capstan__ts_json(when, now, capstan__ts_format_of(raw, &obj, ts));
    capstan_field_t set[] = { { "enqueued_at", when, 0 }, { "at", NULL, 0 } };
    int rc = capstan__payload_edit(raw, &obj, set, 2, out, outlen);
    capstan__jobject_free(&obj);
    return rc;
}

/* Moves up to BATCH due members of key, skipping the first st->blocked
 * (left there by earlier batches); returns how many moved, or CAPSTAN_EREDIS.
 * *more is set when the batch was full. A member whose queue key holds
 * another type than a list stays (schedule.lua) and is counted in st. */
static long move_batch(capstan_redis_t *r, const char *key, capstan_ts_format_t ts, double now, int *more,
                       capstan_sched_blocked_t *st)
{
    char nows[32];
    snprintf(nows, sizeof(nows), "%.6f", now);
    redisReply *due = capstan_redis_cmdf(r, "ZRANGEBYSCORE %s -inf %s LIMIT %ld %d", key, nows,
                                         st->n, BATCH);
    *more = 0;
    if (!due)
        return CAPSTAN_EREDIS;
    if (due->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(due);
        return 0;
    }
    *more = due->elements == BATCH;
    size_t n = due->elements, sent = 0;
    char **qkeys = calloc(n ? n : 1, sizeof(char *));
    long moved = 0;
    int rc = qkeys ? 0 : CAPSTAN_ENOMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        redisReply *m = due->element[i];
        char *payload = NULL, *queue = NULL;
        size_t plen = 0;
        if (prepare(m->str, m->len, ts, now, &payload, &plen, &queue) == 0
            && (qkeys[sent] = capstan__key_dup(CAPSTAN_KEY_QUEUE, queue)) != NULL) {
            const char *argv[] = { key, qkeys[sent], CAPSTAN_KEY_QUEUES, m->str, payload, queue };
            size_t lens[] = { strlen(key), strlen(qkeys[sent]), strlen(CAPSTAN_KEY_QUEUES), m->len,
                              plen, strlen(queue) };
            rc = capstan__redis_append_script(r, CAPSTAN_SCRIPT_SCHEDULE, 3, 6, argv, lens);
            if (!rc)
                sent++;
        }
        free(payload);
        free(queue);
    }
    for (size_t i = 0; i < sent; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep) {
            rc = CAPSTAN_EREDIS;
            break;
        }
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer >= 0) {
            moved += rep->integer;
        } else if (rep->type == REDIS_REPLY_INTEGER) {
            if (!st->n++)
                snprintf(st->key, sizeof(st->key), "%.200s", qkeys[i]);
        } else if (rep->type == REDIS_REPLY_ERROR) {
            capstan_warn("scheduler: %s", rep->str);
        }
        freeReplyObject(rep);
    }
    for (size_t i = 0; qkeys && i < sent; i++)
        free(qkeys[i]);
    free(qkeys);
    freeReplyObject(due);
    return rc ? CAPSTAN_EREDIS : moved;
}

long capstan__scheduler_enqueue_due(capstan_redis_t *r, capstan_ts_format_t ts, double now,
                                    capstan_sched_blocked_t *blocked)
{
    static const char *sets[] = { CAPSTAN_KEY_RETRY, CAPSTAN_KEY_SCHEDULE };
    long total = 0;
    blocked->n = 0;
    blocked->key[0] = '\0';
    for (int s = 0; s < 2; s++) {
        int more = 1;
        capstan_sched_blocked_t st = { 0 };
        while (more) {
            long n = move_batch(r, sets[s], ts, now, &more, &st);
            if (n < 0)
                return n;
            total += n;
        }
        if (st.n && !blocked->n)
            memcpy(blocked->key, st.key, sizeof(st.key));
        blocked->n += st.n;
    }
    return total;
}

/* Merged with a due time this close to it: the scheduler then wakes at
 * the later of the two, a job at most this late. */
#define DUE_MERGE 0.02

void capstan__scheduler_wake_at(capstan_runtime_t *rt, double at)
{
    capstan_sched_wake_t *sw = &rt->sched_wake;
    pthread_mutex_lock(&rt->wake_mu);
    int i, late = 0;
    for (i = 0; i < sw->n; i++)
        if (at > sw->due[i] - DUE_MERGE && at < sw->due[i] + DUE_MERGE)
            break;
    if (i < sw->n) {
        if (at > sw->due[i])
            sw->due[i] = at;
    } else if (sw->n < CAPSTAN_SCHED_DUES) {
        sw->due[sw->n++] = at;
    } else {
        /* Full: the latest due is left to the polls. */
        for (int j = 1; j < sw->n; j++)
            if (sw->due[j] > sw->due[late])
                late = j;
        if (at < sw->due[late])
            sw->due[late] = at;
    }
    if (sw->until > 0 && at < sw->until)
        pthread_cond_signal(&sw->cv);
    pthread_mutex_unlock(&rt->wake_mu);
}

/* Sleeps s seconds, or less: until the first due time asked for, or until
 * capstan__rt_wake (quiet, stop). The due times that have come are then
 * forgotten, as the poll that follows moves their jobs. */
static void sched_sleep(capstan_runtime_t *rt, double s)
{
    capstan_sched_wake_t *sw = &rt->sched_wake;
    double until = capstan__now() + s;
    pthread_mutex_lock(&rt->wake_mu);
    for (;;) {
        double at = until, now = capstan__now();
        for (int i = 0; i < sw->n; i++)
            if (sw->due[i] < at)
                at = sw->due[i];
        if (at <= now || atomic_load(&rt->quiet))
            break;
        sw->until = at;
        struct timespec ts = capstan__timespec(at);
        pthread_cond_timedwait(&sw->cv, &rt->wake_mu, &ts);
        /* Woken for a sooner due, the loop sleeps again until it; a
         * capstan__rt_wake ends the sleep, as it ends every thread's. */
        if (atomic_load(&rt->quiet) || atomic_load(&rt->ctl.stop_req))
            break;
    }
    sw->until = 0;
    double now = capstan__now();
    for (int i = 0; i < sw->n;)
        if (sw->due[i] <= now)
            sw->due[i] = sw->due[--sw->n];
        else
            i++;
    pthread_mutex_unlock(&rt->wake_mu);
}

static double poll_average(capstan_runtime_t *rt, capstan_redis_t *r, long *procs)
{
    if (rt->cfg->poll_interval_average > 0) {
        *procs = 1;
        return rt->cfg->poll_interval_average;
    }
    redisReply *rep = capstan_redis_cmdf(r, "SCARD " CAPSTAN_KEY_PROCESSES);
    long n = rep && rep->type == REDIS_REPLY_INTEGER ? (long)rep->integer : 1;
    freeReplyObject(rep);
    *procs = n < 1 ? 1 : n;
    return (double)*procs * rt->cfg->average_scheduled_poll_interval;
}

void *capstan__scheduler_main(void *arg)
{
    capstan_runtime_t *rt = arg;
    capstan__member_log(rt);
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(rt->cfg->redis_url, 10, err);
    if (!r) {
        capstan_error("scheduler: %s", err);
        return NULL;
    }
    /* Sidekiq waits before its first poll so a fleet that starts together
     * does not poll together; an explicit average skips that. */
    if (rt->cfg->poll_interval_average <= 0)
        sched_sleep(rt, 5 + 5 * capstan__rand());
    long last_blocked = 0;
    while (!atomic_load(&rt->quiet)) {
        if (!capstan_redis_ok(r) && capstan__rt_connect(rt, r, &rt->quiet))
            break;
        capstan_sched_blocked_t blocked;
        if (capstan__scheduler_enqueue_due(r, rt->cfg->timestamps, capstan__now(), &blocked) == CAPSTAN_EREDIS)
            continue;
        /* Said when it changes, not at every poll. */
        if (blocked.n && blocked.n != last_blocked)
            capstan_error("scheduler: %ld due jobs stay in retry/schedule: their queue key holds "
                          "another type than a list (the first: %s); they move once it is fixed",
                          blocked.n, blocked.key);
        else if (!blocked.n && last_blocked)
            capstan_info("scheduler: the due jobs held back by a queue key of another type moved");
        last_blocked = blocked.n;
        long procs;
        double avg = poll_average(rt, r, &procs);
        double wait = procs < 10 ? avg * capstan__rand() + avg / 2 : avg * capstan__rand();
        sched_sleep(rt, wait);
    }
    capstan_info("Scheduler exiting...");
    capstan_redis_free(r);
    return NULL;
}
