/* Sidekiq's execution metrics (see execution.h): counting, and the write
 * of each layout. */
#include "observe/execution.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/error.h"
#include "redis/keys.h"

/* Upper bounds (ms, exclusive) of the first 25 buckets; the 26th takes the
 * rest. Sidekiq's Histogram::BUCKET_INTERVALS. */
static const unsigned long bounds[CAPSTAN_EXEC_BUCKETS - 1] = {
    20,    30,    45,    65,    100,   150,   225,    335,    500,    750,    1100,   1700,  2500,
    3800,  5750,  8500,  13000, 20000, 30000, 45000,  65000,  100000, 150000, 225000, 335000,
};

int capstan__exec_class_ok(const char *cls)
{
    for (const unsigned char *p = (const unsigned char *)cls; *p; p++)
        if (*p == '|' || *p < 0x20 || *p == 0x7f)
            return 0;
    return *cls != '\0';
}

void capstan__exec_count(capstan_exec_t *e, double seconds, int failed)
{
    e->processed++;
    if (failed) {
        e->failed++;
        return;
    }
    unsigned long long ms = seconds > 0 ? (unsigned long long)(seconds * 1000.0) : 0;
    size_t i = 0;
    while (i < CAPSTAN_EXEC_BUCKETS - 1 && ms >= bounds[i])
        i++;
    e->ms += ms;
    e->hist[i]++;
}

void capstan__exec_free(capstan_exec_t *e, size_t n)
{
    for (size_t i = 0; e && i < n; i++)
        free(e[i].cls);
    free(e);
}

/* Appends HINCRBY key CLASS|field n for each non-zero field of each class,
 * then EXPIRE key ttl, counting each command appended in *cmds. Returns 0
 * or -1. */
static int append_jobs(capstan_redis_t *r, const capstan_exec_t *e, size_t n, const char *key,
                       const char *ttl, int *cmds)
{
    for (size_t i = 0; i < n; i++) {
        const struct { const char *suffix; unsigned long long v; } f[] = {
            { "|p", e[i].processed }, { "|f", e[i].failed }, { "|ms", e[i].ms },
        };
        for (size_t k = 0; k < 3; k++) {
            if (!f[k].v)
                continue;
            size_t len = strlen(e[i].cls) + strlen(f[k].suffix) + 1;
            char *field = malloc(len), num[24];
            if (!field)
                return -1;
            snprintf(field, len, "%s%s", e[i].cls, f[k].suffix);
            snprintf(num, sizeof(num), "%llu", f[k].v);
            const char *argv[] = { "HINCRBY", key, field, num };
            int rc = capstan_redis_append(r, 4, argv, NULL);
            free(field);
            if (rc)
                return -1;
            (*cmds)++;
        }
    }
    const char *argv[] = { "EXPIRE", key, ttl };
    if (capstan_redis_append(r, 3, argv, NULL))
        return -1;
    (*cmds)++;
    return 0;
}

/* Appends BITFIELD key OVERFLOW SAT INCRBY u16 #i n... for e's histogram
 * and EXPIRE key ttl (nothing without successes), counting them in *cmds.
 * Returns 0 or -1. */
static int append_hist(capstan_redis_t *r, const capstan_exec_t *e, const char *key,
                       const char *ttl, int *cmds)
{
    const char *argv[2 + 2 + 4 * CAPSTAN_EXEC_BUCKETS];
    char idx[CAPSTAN_EXEC_BUCKETS][8], val[CAPSTAN_EXEC_BUCKETS][24];
    int argc = 0;
    argv[argc++] = "BITFIELD";
    argv[argc++] = key;
    argv[argc++] = "OVERFLOW";
    argv[argc++] = "SAT";
    for (int i = 0; i < CAPSTAN_EXEC_BUCKETS; i++) {
        if (!e->hist[i])
            continue;
        snprintf(idx[i], sizeof(idx[i]), "#%d", i);
        snprintf(val[i], sizeof(val[i]), "%llu", e->hist[i] > 65535 ? 65535ULL : e->hist[i]);
        argv[argc++] = "INCRBY";
        argv[argc++] = "u16";
        argv[argc++] = idx[i];
        argv[argc++] = val[i];
    }
    if (argc == 4)
        return 0;
    const char *ex[] = { "EXPIRE", key, ttl };
    if (capstan_redis_append(r, argc, argv, NULL))
        return -1;
    (*cmds)++;
    if (capstan_redis_append(r, 3, ex, NULL))
        return -1;
    (*cmds)++;
    return 0;
}

#define SHORT_TERM "28800"  /* 8 hours */
#define MID_TERM "259200"   /* 3 days: Sidekiq 8's 10-minute rollup */

int capstan__exec_flush(capstan_redis_t *r, const capstan_exec_t *e, size_t n, int layouts,
                        time_t now, char *err)
{
    if (!n || !layouts)
        return 0;
    struct tm t;
    gmtime_r(&now, &t);
    char k7[64], k8[64], k8mid[64];
    snprintf(k7, sizeof(k7), "j|%04d%02d%02d|%d:%d", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
             t.tm_hour, t.tm_min);
    snprintf(k8, sizeof(k8), "j|%02d%02d%02d|%d:%02d", t.tm_year % 100, t.tm_mon + 1, t.tm_mday,
             t.tm_hour, t.tm_min);
    snprintf(k8mid, sizeof(k8mid), "%.*s", (int)strlen(k8) - 1, k8);
    int cmds = 0, bad = 0;
    if (layouts & CAPSTAN_EXEC_LAYOUT_7)
        bad = append_jobs(r, e, n, k7, SHORT_TERM, &cmds);
    if (!bad && (layouts & CAPSTAN_EXEC_LAYOUT_8))
        bad = append_jobs(r, e, n, k8, SHORT_TERM, &cmds)
              || append_jobs(r, e, n, k8mid, MID_TERM, &cmds);
    for (size_t i = 0; i < n && !bad; i++) {
        size_t len = strlen(e[i].cls) + 32;
        char *key = malloc(len);
        if (!key) {
            bad = 1;
            break;
        }
        if (layouts & CAPSTAN_EXEC_LAYOUT_7) {
            snprintf(key, len, "%s-%02d-%02d:%d", e[i].cls, t.tm_mday, t.tm_hour, t.tm_min);
            bad = append_hist(r, &e[i], key, SHORT_TERM, &cmds);
        }
        if (!bad && (layouts & CAPSTAN_EXEC_LAYOUT_8)) {
            snprintf(key, len, "h|%s-%d-%d:%d", e[i].cls, t.tm_mday, t.tm_hour, t.tm_min);
            bad = append_hist(r, &e[i], key, SHORT_TERM, &cmds);
        }
        free(key);
    }
    int rc = bad ? capstan_seterr(err, CAPSTAN_ENOMEM, "execution metrics: out of memory") : 0;
    /* Every reply of what was appended is read, even after an error, so
     * the connection stays in step; a broken one fails them all. */
    for (int i = 0; i < cmds; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep) {
            rc = CAPSTAN_EREDIS;
            break;
        }
        if (rep->type == REDIS_REPLY_ERROR && !rc)
            rc = capstan_seterr(err, CAPSTAN_EREPLY, "execution metrics: %s", rep->str);
        freeReplyObject(rep);
    }
    if (rc == CAPSTAN_EREDIS)
        capstan_seterr(err, rc, "execution metrics: %s", capstan_redis_error(r));
    return rc;
}

#define STATS_TTL "157680000" /* 5 years, as Sidekiq */

int capstan__stats_incr(capstan_redis_t *r, long processed, long failed, time_t now, char *err)
{
    char day[16], kp[40], kf[40], np[24], nf[24];
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(day, sizeof(day), "%Y-%m-%d", &tm);
    snprintf(kp, sizeof(kp), "%s:%s", CAPSTAN_KEY_PROCESSED, day);
    snprintf(kf, sizeof(kf), "%s:%s", CAPSTAN_KEY_FAILED, day);
    snprintf(np, sizeof(np), "%ld", processed);
    snprintf(nf, sizeof(nf), "%ld", failed);
    const char *cmds[][3] = {
        { "INCRBY", CAPSTAN_KEY_PROCESSED, np }, { "INCRBY", kp, np }, { "EXPIRE", kp, STATS_TTL },
        { "INCRBY", CAPSTAN_KEY_FAILED, nf },    { "INCRBY", kf, nf }, { "EXPIRE", kf, STATS_TTL },
    };
    int n = 0, rc = 0;
    for (; n < 6 && !rc; n++)
        rc = capstan_redis_append(r, 3, cmds[n], NULL) ? CAPSTAN_EREDIS : 0;
    for (int i = 0; i < n && rc != CAPSTAN_EREDIS; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep)
            rc = CAPSTAN_EREDIS;
        else if (rep->type == REDIS_REPLY_ERROR && !rc)
            rc = capstan_seterr(err, CAPSTAN_EREPLY, "stat counters: %s", rep->str);
        freeReplyObject(rep);
    }
    if (rc == CAPSTAN_EREDIS)
        capstan_seterr(err, rc, "stat counters: %s", capstan_redis_error(r));
    return rc;
}
