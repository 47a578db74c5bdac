/* The beat: flushes the counters and writes the process record and work
 * hashes exactly as Sidekiq does (so ProcessSet, Workers and the Web UI Busy
 * page see this process), and picks up a signal pushed by the Web UI. The
 * housekeeper thread (housekeeper.c) runs it every heartbeat_interval. At
 * stop the process leaves the set again (capstan__heartbeat_leave). */
#include "runtime/rt.h"
#include "runtime/source.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <math.h>

#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/scripts.h"
#include "runtime/board.h"
#include "support/buf.h"
#include "support/fmt.h"
#include "support/log.h"
#include "support/number.h"
#include "support/time.h"
#include "unique/admin_internal.h"

/* Reads replies for n appended commands; returns 0 when all arrived. */
static int drain(capstan_redis_t *r, int n, redisReply **keep, int keep_index)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep)
            return CAPSTAN_EREDIS;
        if (rep->type == REDIS_REPLY_ERROR) {
            capstan_warn("heartbeat: %s", rep->str);
            rc = CAPSTAN_EREPLY;
        }
        if (keep && i == keep_index)
            *keep = rep;
        else
            freeReplyObject(rep);
    }
    return rc;
}

/* Sidekiq's execution metrics of the jobs run since the last flush
 * (observe/execution.h). A write that fails drops them, as Sidekiq's does:
 * a broken connection is the beat's to report. */
static void exec_flush(capstan_runtime_t *rt, capstan_redis_t *r)
{
    capstan_exec_t *e;
    /* A sharded process's members each tell their own shard. */
    size_t n = capstan__metrics_exec_take(capstan__rt_metrics(rt), &e);
    char err[CAPSTAN_ERRLEN];
    if (n && capstan__exec_flush(r, e, n, rt->cfg->sidekiq_metrics, time(NULL), err) == CAPSTAN_EREPLY)
        capstan_warn("%s", err);
    capstan__exec_free(e, n);
}

/* The host's clock may be off Redis's: periodic ticks follow Redis's
 * (periodic.c), but the times this process writes in jobs and sets, and
 * reads them by, are its own. Said when the offset (seconds, ahead
 * positive) exceeds CLOCK_SKEW, again when it moved by a second since, and
 * once when it is back within; always in the gauge. */
#define CLOCK_SKEW 2.0
static void clock_check(capstan_runtime_t *rt, double offset)
{
    capstan__metrics_clock_offset(capstan__rt_metrics(rt), offset);
    if (fabs(offset) > CLOCK_SKEW && fabs(offset - rt->health.clock_said) >= 1) {
        capstan_warn("this host's clock is %.1f s %s Redis's: periodic ticks follow Redis's clock, but "
                     "the times this process writes (enqueued_at, retries, scheduled jobs, its beat) are "
                     "off by as much; check its time synchronization", fabs(offset),
                     offset > 0 ? "ahead of" : "behind");
        rt->health.clock_said = offset;
    } else if (fabs(offset) <= CLOCK_SKEW && rt->health.clock_said) {
        capstan_info("this host's clock is within %.0f s of Redis's again (%.1f s)", CLOCK_SKEW, offset);
        rt->health.clock_said = 0;
    }
}

int capstan__stats_flush(capstan_runtime_t *rt, capstan_redis_t *r)
{
    exec_flush(rt, r);
    long p = atomic_exchange(&rt->processed, 0);
    long f = atomic_exchange(&rt->failed, 0);
    if (!p && !f)
        return 0;
    char err[CAPSTAN_ERRLEN];
    int rc = capstan__stats_incr(r, p, f, time(NULL), err);
    if (rc == CAPSTAN_EREPLY)
        capstan_warn("heartbeat: %s", err);
    if (rc == CAPSTAN_EREDIS) {
        /* Not written: count them again at the next flush. The replies that
         * did arrive were for INCRBYs that may have run; a lost connection
         * mid-pipeline can at worst count a beat's worth twice or not at all. */
        atomic_fetch_add(&rt->processed, p);
        atomic_fetch_add(&rt->failed, f);
    }
    return rc;
}

static long rss_kb(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    if (!fp)
        return 0;
    while (fgets(line, sizeof(line), fp))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(fp);
    return kb;
}

/* Builds {"queue":…,"payload":"<raw>","run_at":N} for each busy slot. */
static int work_entries(capstan_runtime_t *rt, char ***fields, char ***values, int *n)
{
    *fields = calloc((size_t)rt->nslots, sizeof(char *));
    *values = calloc((size_t)rt->nslots, sizeof(char *));
    *n = 0;
    if (!*fields || !*values)
        return CAPSTAN_ENOMEM;
    for (int i = 0; i < rt->nslots; i++) {
        capstan_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        if (s->busy && !s->abandoned) {
            capstan_buf_t b = {0};
            capstan__buf_puts(&b, "{\"queue\":");
            capstan__json_quote(&b, s->queue, strlen(s->queue));
            capstan__buf_puts(&b, ",\"payload\":");
            capstan__json_quote(&b, s->payload, s->len);
            capstan__buf_printf(&b, ",\"run_at\":%ld}", s->run_at);
            (*fields)[*n] = strdup(s->tid);
            (*values)[*n] = capstan__buf_take(&b, NULL);
            (*n)++;
        }
        pthread_mutex_unlock(&s->mu);
    }
    return 0;
}

static void free_entries(char **fields, char **values, int n)
{
    for (int i = 0; i < n; i++) {
        free(fields[i]);
        free(values[i]);
    }
    free(fields);
    free(values);
}

/* Rewrites one work hash (<identity>:work or :workers for 6.4 readers). */
static int append_work(capstan_redis_t *r, const char *key, char **fields, char **values, int n,
                       int *count)
{
    const char *unlink[] = { "UNLINK", key };
    int rc = capstan_redis_append(r, 2, unlink, NULL);
    (*count)++;
    if (n == 0 || rc)
        return rc;
    const char **argv = calloc((size_t)(2 + 2 * n), sizeof(char *));
    if (!argv)
        return CAPSTAN_ENOMEM;
    argv[0] = "HSET";
    argv[1] = key;
    for (int i = 0; i < n; i++) {
        argv[2 + 2 * i] = fields[i] ? fields[i] : "?";
        argv[3 + 2 * i] = values[i] ? values[i] : "{}";
    }
    rc = capstan_redis_append(r, 2 + 2 * n, argv, NULL);
    free(argv);
    if (rc)
        return rc;
    (*count)++;
    const char *exp[] = { "EXPIRE", key, "60" };
    rc = capstan_redis_append(r, 3, exp, NULL);
    (*count)++;
    return rc;
}

static void deliver(capstan_runtime_t *rt, const char *sig)
{
    capstan_info("received %s from Redis", sig);
    if (strcmp(sig, "TSTP") == 0 || strcmp(sig, "USR1") == 0)
        kill(getpid(), SIGTSTP);
    else if (strcmp(sig, "TERM") == 0 || strcmp(sig, "INT") == 0)
        kill(getpid(), SIGTERM);
    else if (strcmp(sig, "TTIN") == 0)
        kill(getpid(), SIGTTIN);
    else
        capstan_warn("No signal handler registered for %s, ignoring", sig);
    (void)rt;
}
/* The jobs fetched ahead and not started, by queue, as the JSON object the
 * process hash's "prefetched" field holds ({} without the reliable fetch):
 * capstan stats adds them up, since Sidekiq's queue size does not count
 * them. NULL when out of memory. */
static char *prefetched_json(capstan_runtime_t *rt)
{
    size_t n = rt->cfg->nqueues;
    const char **names = calloc(n ? n : 1, sizeof(*names));
    long long *counts = calloc(n ? n : 1, sizeof(*counts));
    json_t *o = json_object();
    char *s = NULL;
    if (names && counts && o) {
        for (size_t i = 0; i < n; i++)
            names[i] = rt->cfg->queues[i].name;
        rt->source->count(rt, names, counts, n);
        for (size_t i = 0; i < n; i++)
            if (counts[i])
                json_object_set_new(o, names[i], json_integer(counts[i]));
        s = json_dumps(o, JSON_COMPACT);
    }
    json_decref(o);
    free(counts);
    free(names);
    return s;
}

/* Reads the paused queues (fetch.h: Sidekiq Pro's "paused" set) so that
 * the fetchers skip them from now on, and says when one is paused or
 * unpaused. Once a beat: a pause takes effect within a heartbeat_interval. */
static void look_paused(capstan_runtime_t *rt, capstan_redis_t *r)
{
    const capstan_config_t *c = rt->cfg;
    unsigned char *changed = calloc(c->nqueues ? c->nqueues : 1, 1);
    char err[CAPSTAN_ERRLEN];
    if (!changed)
        return;
    /* Read one thread at a time (at start, then the housekeeper). */
    static int refused;
    int rc = capstan__paused_read(rt->view.paused, r, changed, err);
    if (rc == CAPSTAN_EREPLY && !refused) {
        /* SMISMEMBER needs Redis 6.2; Sidekiq 7 needs it too. */
        capstan_warn("cannot read which queues are paused (%s); until it can, a pause is not seen", err);
        refused = 1;
    } else if (rc) {
        capstan_debug("paused queues: %s", err);
    } else {
        refused = 0;
    }
    if (!rc)
        for (size_t i = 0; i < c->nqueues; i++) {
            if (!changed[i])
                continue;
            if (capstan__paused_is(rt->view.paused, i))
                capstan_info("queue %s is paused (in the \"" CAPSTAN_KEY_PAUSED "\" set): not fetching "
                             "from it until it is unpaused", c->queues[i].name);
            else
                capstan_info("queue %s is unpaused: fetching from it again", c->queues[i].name);
        }
    free(changed);
}

int capstan__heartbeat_beat(capstan_runtime_t *rt, capstan_redis_t *r, int final)
{
    (void)final;
    int rc = capstan__stats_flush(rt, r);
    if (rc != CAPSTAN_EREDIS)
        rc = capstan__unique_metrics_flush(r);
    if (rc == CAPSTAN_EREDIS)
        return rc;
    char key_work[400], key_workers[400], key_sig[400];
    capstan__key(key_work, sizeof(key_work), rt->self.identity, CAPSTAN_KEY_WORK);
    capstan__key(key_workers, sizeof(key_workers), rt->self.identity, CAPSTAN_KEY_WORKERS);
    capstan__key(key_sig, sizeof(key_sig), rt->self.identity, CAPSTAN_KEY_SIGNALS);

    char **fields = NULL, **values = NULL;
    int n = 0, count = 0;
    rc = work_entries(rt, &fields, &values, &n);
    if (!rc) {
        const char *multi[] = { "MULTI" };
        rc = capstan_redis_append(r, 1, multi, NULL);
        count++;
        if (!rc) rc = append_work(r, key_work, fields, values, n, &count);
        if (!rc) rc = append_work(r, key_workers, fields, values, n, &count);
        const char *exec[] = { "EXEC" };
        if (!rc) { rc = capstan_redis_append(r, 1, exec, NULL); count++; }
    }
    free_entries(fields, values, n);
    int nbusy = n; /* busy as the work hash just written says, not later */
    if (!rc)
        rc = drain(r, count, NULL, 0);
    if (rc == CAPSTAN_EREDIS)
        return rc;

    double t0 = capstan__mono(), local = capstan__now(), redis_now;
    rc = capstan__redis_time(r, &redis_now);
    if (rc == CAPSTAN_EREDIS)
        return rc;
    long rtt_us = (long)((capstan__mono() - t0) * 1e6);
    if (!rc)
        clock_check(rt, local + (capstan__now() - local) / 2 - redis_now);

    char beat[32], conc[16], busy[16], rtt[32], rss[32];
    snprintf(beat, sizeof(beat), "%.6f", capstan__now());
    snprintf(conc, sizeof(conc), "%d", rt->cfg->concurrency);
    snprintf(busy, sizeof(busy), "%d", nbusy);
    snprintf(rtt, sizeof(rtt), "%ld", rtt_us);
    snprintf(rss, sizeof(rss), "%ld", rss_kb());
    const char *quiet = atomic_load(&rt->quiet) ? "true" : "false";
    char *ahead = prefetched_json(rt), none[] = "{}";
    /* The fetches answered with an error since the last beat, and the last
     * error: a process that fetches nothing is not healthy (capstan stats). */
    char nerrors[CAPSTAN_FMT_INT], why[CAPSTAN_ERRLEN] = "";
    long errors = atomic_exchange(&rt->health.fetch_errors, 0);
    capstan__fmt_int(nerrors, errors);
    pthread_mutex_lock(&rt->wake_mu);
    if (errors)
        snprintf(why, sizeof(why), "%s", rt->health.fetch_error);
    pthread_mutex_unlock(&rt->wake_mu);
    const char *hset[] = { "HSET", rt->self.identity, "info", rt->self.info_json, "concurrency", conc,
                           "busy", busy, "beat", beat, "rtt_us", rtt, "quiet", quiet, "rss", rss,
                           "prefetched", ahead ? ahead : none, "fetch_errors", nerrors,
                           "fetch_error", why };
    const char *cmds[][3] = { { "MULTI", NULL, NULL }, { "SADD", CAPSTAN_KEY_PROCESSES, rt->self.identity },
                              { "EXISTS", rt->self.identity, NULL } };
    rc = capstan_redis_append(r, 1, cmds[0], NULL);
    if (!rc) rc = capstan_redis_append(r, 3, cmds[1], NULL);
    if (!rc) rc = capstan_redis_append(r, 2, cmds[2], NULL);
    if (!rc) rc = capstan_redis_append(r, 22, hset, NULL);
    free(ahead);
    /* Sidekiq's readers (the Busy page, ProcessSet) list a process while
     * this hash exists; Sidekiq's own lives 60 s. This one lives as long
     * as the fleet takes the process for alive (a liveness key of
     * liveness_ttl, missing for half that more before its jobs are taken:
     * lua/recover.lua), so a dead process leaves Busy when its jobs go
     * elsewhere, not a minute later. */
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%ld", (long)capstan__ceil(rt->cfg->liveness_ttl * 1.5));
    const char *exp[] = { "EXPIRE", rt->self.identity, ttl };
    const char *rpop[] = { "RPOP", key_sig };
    const char *exec[] = { "EXEC" };
    if (!rc) rc = capstan_redis_append(r, 3, exp, NULL);
    if (!rc) rc = capstan_redis_append(r, 2, rpop, NULL);
    if (!rc) rc = capstan_redis_append(r, 1, exec, NULL);
    redisReply *res = NULL;
    if (!rc)
        rc = drain(r, 7, &res, 6);
    /* EXEC answers the five queued commands; RPOP's reply is the last. */
    if (res && res->type == REDIS_REPLY_ARRAY && res->elements == 5
        && res->element[4]->type == REDIS_REPLY_STRING)
        deliver(rt, res->element[4]->str);
    freeReplyObject(res);
    if (rc != CAPSTAN_EREDIS && rt->view.paused)
        look_paused(rt, r);
    return rc == CAPSTAN_EREDIS ? rc : 0;
}

int capstan__heartbeat_leave(capstan_redis_t *r, const char *identity)
{
    char key_work[400], key_workers[400];
    capstan__key(key_work, sizeof(key_work), identity, CAPSTAN_KEY_WORK);
    capstan__key(key_workers, sizeof(key_workers), identity, CAPSTAN_KEY_WORKERS);
    const char *srem[] = { "SREM", CAPSTAN_KEY_PROCESSES, identity };
    const char *unl[] = { "UNLINK", key_work, key_workers };
    int rc = capstan_redis_append(r, 3, srem, NULL);
    if (!rc)
        rc = capstan_redis_append(r, 3, unl, NULL);
    return rc ? rc : drain(r, 2, NULL, 0);
}
