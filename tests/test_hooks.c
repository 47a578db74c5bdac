/* Error and death hooks (capstan_on_error, capstan_on_death), Sidekiq's
 * error_handlers and death_handlers, and the server and client middleware
 * chains, seen from a program embedding the runtime. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "capstan/client.h"
#include "capstan/middleware.h"
#include "capstan/runtime.h"
#include "capstan/unique.h"
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

/* ---- middleware chains ------------------------------------------------ */

static void assert_names(const capstan_chain_t *c, const char *const *want, size_t n)
{
    cr_assert_eq(capstan_chain_len(c), n);
    for (size_t i = 0; i < n; i++)
        cr_assert_str_eq(capstan_chain_name(c, i), want[i], "entry %zu", i);
    cr_assert_null(capstan_chain_name(c, n));
}

/* Records, once the rest of the chain has run, the job's queue and the
 * fate chosen for it, in the hash seen:JID, on the invocation's own
 * connection. */
static int fate_mw(capstan_mw_t *mw, void *udata)
{
    (void)udata;
    int rc = capstan_mw_next(mw);
    freeReplyObject(capstan_redis_cmdf(capstan_mw_redis(mw), "HSET seen:%s queue %s disposition %d",
                                       capstan_mw_jid(mw), capstan_mw_queue(mw),
                                       (int)capstan_mw_disposition(mw)));
    return rc;
}

static int pass_mw(capstan_mw_t *mw, void *udata)
{
    (void)udata;
    return capstan_mw_next(mw);
}

/* The server chain's built-ins in their documented order; a middleware
 * inserted before "retry" runs around it and sees the fate it chose for a
 * failed job (and none chosen for a job that succeeded, which is done). */
Test(hooks, a_middleware_inserted_before_retry_sees_the_fate_retry_chose)
{
    char err[CAPSTAN_ERRLEN];
    capstan_runtime_t *rt = capstan_runtime_new(kt_config(1), err);
    cr_assert(rt, "%s", err);
    capstan_class_opts_t once = CAPSTAN_CLASS_OPTS_INIT;
    once.retry = 1;
    cr_assert_eq(capstan_register(rt, "RetriedJob", failing, NULL, &once), 0);
    cr_assert_eq(capstan_register(rt, "OkJob", counting, NULL, NULL), 0);
    capstan_chain_t *chain = capstan_runtime_server_chain(rt);
    assert_names(chain, (const char *[]){ "stats", "retry", "queue_limit", "expiry", "unique",
                                          "limit" }, 6);

    cr_assert_eq(capstan_chain_insert_before(chain, "retry", "fate", fate_mw, NULL), 0);
    cr_assert_eq(capstan_chain_insert_before(chain, "retry", "fate", fate_mw, NULL), CAPSTAN_EINVAL,
                 "a name is taken once");
    cr_assert_eq(capstan_chain_insert_before(chain, "absent", "other", pass_mw, NULL), CAPSTAN_ENOTFOUND);
    cr_assert_eq(capstan_chain_insert_before(chain, NULL, "first", pass_mw, NULL), 0);
    assert_names(chain, (const char *[]){ "first", "stats", "fate", "retry", "queue_limit",
                                          "expiry", "unique", "limit" }, 8);
    cr_assert_eq(capstan_chain_remove(chain, "first"), 0);
    cr_assert_eq(capstan_chain_remove(chain, "first"), CAPSTAN_ENOTFOUND);
    assert_names(chain, (const char *[]){ "stats", "fate", "retry", "queue_limit", "expiry",
                                          "unique", "limit" }, 7);

    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    char retried[25], ok[25];
    cr_assert_eq(capstan_client_push(c, "RetriedJob", "[]", NULL, retried), 0, "%s", capstan_client_error(c));
    cr_assert_eq(capstan_client_push(c, "OkJob", "[]", NULL, ok), 0, "%s", capstan_client_error(c));
    capstan_client_free(c);
    kt_runtime_start(rt);

    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS seen:%s", retried) && kt_int("EXISTS seen:%s", ok), 15),
              "the middleware saw both jobs");
    char *q = kt_str("HGET seen:%s queue", retried);
    char *d = kt_str("HGET seen:%s disposition", retried);
    char *dok = kt_str("HGET seen:%s disposition", ok);
    char want[8];
    snprintf(want, sizeof(want), "%d", (int)CAPSTAN_DISPOSE_RETRY);
    cr_assert_str_eq(q, "default");
    cr_assert_str_eq(d, want, "retry chose the retry set for the failed job");
    snprintf(want, sizeof(want), "%d", (int)CAPSTAN_DISPOSE_DEFAULT);
    cr_assert_str_eq(dok, want, "nothing was decided for the job that succeeded");
    free(q);
    free(d);
    free(dok);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 10));
    kt_runtime_end(rt);
}

/* What a client middleware saw of its pushes. */
static struct {
    char jid[2][25], queue[2][32];
    double at[2];
    int job_null, n;
} pushed;

/* Records each push and sends one due now an hour later; counts the
 * pushes per queue on the client's own connection. */
static int later_mw(capstan_mw_t *mw, void *udata)
{
    double *later = udata;
    int i = pushed.n++ % 2;
    snprintf(pushed.jid[i], sizeof(pushed.jid[i]), "%s", capstan_mw_jid(mw));
    snprintf(pushed.queue[i], sizeof(pushed.queue[i]), "%s", capstan_mw_queue(mw));
    pushed.at[i] = capstan_mw_at(mw);
    pushed.job_null += capstan_mw_job(mw) == NULL;
    if (capstan_mw_at(mw) == 0)
        capstan_mw_set_at(mw, *later);
    freeReplyObject(capstan_redis_cmdf(capstan_mw_redis(mw), "INCR pushes:%s", capstan_mw_queue(mw)));
    return capstan_mw_next(mw);
}

static double schedule_score(const char *jid)
{
    redisReply *r = kt_cmd("ZRANGE schedule 0 -1 WITHSCORES");
    double score = -1;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2)
        if (strstr(r->element[i]->str, jid))
            score = strtod(r->element[i + 1]->str, NULL);
    freeReplyObject(r);
    return score;
}

/* A client middleware reads each push's jid, queue and time, and moves a
 * push due now to later: the job lands in the schedule at that time. */
Test(hooks, a_client_middleware_reads_jid_queue_and_time_and_can_move_the_push)
{
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    capstan_chain_t *chain = capstan_client_chain(c);
    assert_names(chain, (const char *[]){ "unique" }, 1);
    double later = (double)(long long)kt_wall() + 3600;
    cr_assert_eq(capstan_chain_add(chain, "later", later_mw, &later), 0);

    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = "low";
    char now_jid[25], at_jid[25];
    cr_assert_eq(capstan_client_push(c, "LaterJob", "[1]", &o, now_jid), 0, "%s", capstan_client_error(c));
    o.at = (double)(long long)kt_wall() + 60;
    cr_assert_eq(capstan_client_push(c, "LaterJob", "[2]", &o, at_jid), 0, "%s", capstan_client_error(c));

    cr_assert_eq(pushed.n, 2);
    cr_assert_eq(pushed.job_null, 2, "a client middleware has no job");
    cr_assert_str_eq(pushed.jid[0], now_jid);
    cr_assert_str_eq(pushed.jid[1], at_jid);
    cr_assert_str_eq(pushed.queue[0], "low");
    cr_assert_str_eq(pushed.queue[1], "low");
    cr_assert_eq(pushed.at[0], 0, "a push due now has no time");
    cr_assert_eq(pushed.at[1], o.at);
    cr_assert_eq(kt_int("LLEN queue:low"), 0, "the push due now was moved");
    cr_assert_eq(kt_int("ZCARD schedule"), 2);
    cr_assert_float_eq(schedule_score(now_jid), later, 0.001);
    cr_assert_float_eq(schedule_score(at_jid), o.at, 0.001);
    cr_assert_eq(kt_int("GET pushes:low"), 2, "the middleware wrote on the client's connection");
    capstan_client_free(c);
}

/* Removing the client chain's "unique" turns uniqueness off for that
 * client's pushes: a duplicate it denied goes in. */
Test(hooks, removing_unique_from_a_client_chain_lets_duplicates_in)
{
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    capstan_unique_opts_t u = CAPSTAN_UNIQUE_OPTS_INIT;
    u.lock = CAPSTAN_LOCK_UNTIL_EXECUTED;
    u.lock_ttl = 600;
    capstan_push_opts_t o = capstan_push_opts_default();
    o.unique = &u;
    cr_assert_eq(capstan_client_push(c, "OnceJob", "[1]", &o, NULL), 0, "%s", capstan_client_error(c));
    cr_assert_eq(capstan_client_push(c, "OnceJob", "[1]", &o, NULL), CAPSTAN_EDENIED);

    capstan_chain_t *chain = capstan_client_chain(c);
    cr_assert_eq(capstan_chain_remove(chain, "unique"), 0);
    cr_assert_eq(capstan_chain_len(chain), 0);
    cr_assert_eq(capstan_client_push(c, "OnceJob", "[1]", &o, NULL), 0, "%s", capstan_client_error(c));
    cr_assert_eq(kt_int("LLEN queue:default"), 2);
    capstan_client_free(c);
}
