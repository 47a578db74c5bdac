/* Error and death hooks (capstan_on_error, capstan_on_death), Sidekiq's
 * error_handlers and death_handlers, seen from a program embedding the
 * runtime. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "capstan/client.h"
#include "capstan/runtime.h"
#include "observe/prometheus.h"
#include "support/buf.h"

TestSuite(hooks, .timeout = 60, .fini = kt_kill_children);

/* What the hooks saw; they run on the runtime's threads. */
static struct {
    pthread_mutex_t mu;
    int errors, deaths;
    char error[256], death[256]; /* "class: message jid" */
    int dead_at_death;           /* the job was in the dead set already */
    int redis_in_error, redis_in_death;
    char host[64];
    int port, db;
} seen = { .mu = PTHREAD_MUTEX_INITIALIZER };

static int failing(capstan_job_t *job, void *udata)
{
    (void)udata;
    return capstan_job_fail(job, "ArgumentError", "bad input %d", 7);
}

static void on_error(capstan_job_t *job, const char *cls, const char *msg, void *udata)
{
    pthread_mutex_lock(&seen.mu);
    seen.errors += udata == &seen; /* the udata registered */
    seen.redis_in_error = capstan_job_redis(job) != NULL;
    snprintf(seen.error, sizeof(seen.error), "%s: %s %s", cls, msg, capstan_job_jid(job));
    pthread_mutex_unlock(&seen.mu);
}

/* Whether the dead set holds jid, asked on a connection of the hook's own. */
static int in_dead_set(const char *jid)
{
    redisContext *c = redisConnect(seen.host, seen.port);
    int found = 0;
    redisReply *sel = c && !c->err ? redisCommand(c, "SELECT %d", seen.db) : NULL;
    redisReply *r = sel ? redisCommand(c, "ZRANGE dead 0 -1") : NULL;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        found |= strstr(r->element[i]->str, jid) != NULL;
    freeReplyObject(r);
    freeReplyObject(sel);
    redisFree(c);
    return found;
}

static void on_death(capstan_job_t *job, const char *cls, const char *msg, void *udata)
{
    int dead = in_dead_set(capstan_job_jid(job));
    pthread_mutex_lock(&seen.mu);
    seen.deaths += udata == &seen;
    seen.dead_at_death = dead;
    seen.redis_in_death = capstan_job_redis(job) != NULL;
    snprintf(seen.death, sizeof(seen.death), "%s: %s %s", cls, msg, capstan_job_jid(job));
    pthread_mutex_unlock(&seen.mu);
}

static int count(const int *v)
{
    pthread_mutex_lock(&seen.mu);
    int n = *v;
    pthread_mutex_unlock(&seen.mu);
    return n;
}

Test(hooks, error_hooks_see_every_failure_death_hooks_the_dead_job_after_it_is_stored)
{
    cr_assert_eq(sscanf(kt_url(), "redis://%63[^:]:%d/%d", seen.host, &seen.port, &seen.db), 3);
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = kt_config(2);
    cfg->heartbeat_interval = 1;
    cfg->poll_interval_average = 1;
    capstan_runtime_t *rt = capstan_runtime_new(cfg, err);
    cr_assert(rt, "%s", err);
    capstan_class_opts_t once = CAPSTAN_CLASS_OPTS_INIT, never = CAPSTAN_CLASS_OPTS_INIT;
    once.retry = 1;
    never.retry = 0;
    cr_assert_eq(capstan_register(rt, "RetriedJob", failing, NULL, &once), 0);
    cr_assert_eq(capstan_register(rt, "DyingJob", failing, NULL, &never), 0);
    cr_assert_eq(capstan_on_error(rt, on_error, &seen), 0);
    cr_assert_eq(capstan_on_death(rt, on_death, &seen), 0);
    cr_assert_eq(capstan_on_error(rt, NULL, NULL), CAPSTAN_EINVAL);

    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    cr_assert_eq(capstan_client_use_runtime(c, rt), 0);
    char retried[25], dying[25];
    cr_assert_eq(capstan_client_push(c, "RetriedJob", "[]", NULL, retried), 0, "%s", capstan_client_error(c));
    kt_runtime_start(rt);

    cr_assert(KT_WAIT_UNTIL(count(&seen.errors) == 1, 15), "the error hook ran");
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 10));
    pthread_mutex_lock(&seen.mu);
    char want[256];
    snprintf(want, sizeof(want), "ArgumentError: bad input 7 %s", retried);
    cr_assert_str_eq(seen.error, want);
    cr_assert(seen.redis_in_error, "an error hook may use the thread's connection");
    pthread_mutex_unlock(&seen.mu);
    cr_assert_eq(count(&seen.deaths), 0, "a job with a retry left is not dead");

    cr_assert_eq(capstan_client_push(c, "DyingJob", "[]", NULL, dying), 0, "%s", capstan_client_error(c));
    cr_assert(KT_WAIT_UNTIL(count(&seen.deaths) == 1, 15), "the death hook ran");
    pthread_mutex_lock(&seen.mu);
    snprintf(want, sizeof(want), "ArgumentError: bad input 7 %s", dying);
    cr_assert_str_eq(seen.death, want);
    cr_assert_str_eq(seen.error, want, "the error hooks ran for it too");
    cr_assert(seen.dead_at_death, "the job was in the dead set when the death hook ran");
    cr_assert(!seen.redis_in_death);
    pthread_mutex_unlock(&seen.mu);
    cr_assert_eq(count(&seen.errors), 2);

    capstan_client_free(c); /* before the runtime it may use */
    kt_runtime_end(rt);
}

static atomic_int runs;

static int counting(capstan_job_t *job, void *udata)
{
    (void)job;
    (void)udata;
    atomic_fetch_add(&runs, 1);
    return 0;
}

/* A duplicate rejected to the dead set (its runtime lock held by another
 * jid): the death hooks get why, the error hooks nothing (it did not run),
 * its dead-set entry says why, and it is counted apart from the processed
 * jobs, in Redis (stat:processed and the day's) and in Prometheus. */
Test(hooks, a_rejected_duplicate_reaches_death_hooks_with_its_reason_and_is_not_processed)
{
    cr_assert_eq(sscanf(kt_url(), "redis://%63[^:]:%d/%d", seen.host, &seen.port, &seen.db), 3);
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = kt_config(2);
    cfg->heartbeat_interval = 1;
    capstan_runtime_t *rt = capstan_runtime_new(cfg, err);
    cr_assert(rt, "%s", err);
    cr_assert_eq(capstan_register(rt, "LockedJob", counting, NULL, NULL), 0);
    cr_assert_eq(capstan_on_error(rt, on_error, &seen), 0);
    cr_assert_eq(capstan_on_death(rt, on_death, &seen), 0);
    freeReplyObject(kt_cmd("HSET uniquejobs:rj:RUN:LOCKED 000000000000000000000001 {}"));
    char dup[25], free_one[25];
    kt_make_jid(dup, 71, 0);
    kt_make_jid(free_one, 71, 1);
    char *p1 = kt_payload_locked("LockedJob", "[1]", dup, "default", "while_executing_reject", "rj");
    char *p2 = kt_payload_locked("LockedJob", "[2]", free_one, "default", "while_executing_reject", "rf");
    freeReplyObject(kt_cmd("LPUSH queue:default %s %s", p1, p2));
    freeReplyObject(kt_cmd("SADD queues default"));
    kt_runtime_start(rt);

    cr_assert(KT_WAIT_UNTIL(count(&seen.deaths) == 1 && atomic_load(&runs) == 1, 15), "the death hook ran");
    cr_assert(KT_WAIT_UNTIL(kt_int("GET stat:processed") == 1, 10), "the job that ran is counted");
    pthread_mutex_lock(&seen.mu);
    char want[256];
    snprintf(want, sizeof(want), "Capstan::UniqueJobRejected: while_executing_reject lock_digest "
             "uniquejobs:rj is running (on_conflict: reject) %s", dup);
    cr_assert_str_eq(seen.death, want);
    cr_assert(seen.dead_at_death);
    pthread_mutex_unlock(&seen.mu);
    cr_assert_eq(count(&seen.errors), 0, "a rejected job did not fail: no error hook");
    redisReply *r = kt_cmd("ZRANGE dead 0 0");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 1);
    char *dead = strdup(r->element[0]->str);
    freeReplyObject(r);
    cr_assert(dead && strstr(dead, dup) && strstr(dead, "\"error_class\":\"Capstan::UniqueJobRejected\"")
              && strstr(dead, "\"error_message\":\"while_executing_reject lock_digest uniquejobs:rj is running")
              && strstr(dead, "\"failed_at\":"), "%s", dead);

    kt_runtime_end(rt); /* flushes the counts left */
    char day[16], key[48];
    time_t t = time(NULL);
    strftime(day, sizeof(day), "%Y-%m-%d", gmtime(&t));
    snprintf(key, sizeof(key), "stat:processed:%s", day);
    cr_assert_eq(kt_int("GET stat:processed"), 1, "the rejected job is not processed");
    cr_assert_eq(kt_int("GET %s", key), 1);
    cr_assert_eq(kt_int("GET stat:failed"), 0, "nor failed");
    capstan_buf_t b = {0};
    cr_assert_eq(capstan__metrics_render(capstan__metrics_default(), &b), 0);
    cr_assert(strstr(b.p, "capstan_jobs_skipped_total{class=\"LockedJob\",reason=\"rejected\"} 1\n")
              && strstr(b.p, "capstan_jobs_processed_total{class=\"LockedJob\",queue=\"default\"} 1\n"),
              "%s", b.p);
    capstan__buf_free(&b);
    free(dead);
    free(p1);
    free(p2);
}
