/* Queued (FIFO) locks: the gem's key layout, one-step attempts, owner-checked
 * release and extend, fencing tokens, dead waiters, interop with the Ruby
 * gem's layout, and `capstan lock` from the shell. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/qlock.h"
#include "capstan/redis.h"

TestSuite(qlock, .timeout = 120, .fini = kt_kill_children);

static capstan_redis_t *conn_new(const char *url)
{
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(url, 10, err);
    if (!r || capstan_redis_connect(r)) {
        capstan_redis_free(r);
        return NULL;
    }
    return r;
}

static capstan_qlock_client_t *client(const char *identity)
{
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_client_t *c = capstan_qlock_client_new(identity, err);
    cr_assert_not_null(c, "%s", err);
    return c;
}

/* The first member of a zset (malloc'd), or NULL. */
static char *zhead(const char *key)
{
    redisReply *rep = kt_cmd("ZRANGE %s 0 0", key);
    char *s = rep->type == REDIS_REPLY_ARRAY && rep->elements ? strdup(rep->element[0]->str) : NULL;
    freeReplyObject(rep);
    return s;
}

/* Events seen by a client, for the instrumentation checks. */
struct events {
    pthread_mutex_t mu;
    char names[16][64];
    double acq_time, hold_time, rel_time;
    long long rel_key_cnt, fence;
    char instrument[64];
    int n;
};

static void on_event(const capstan_qlock_event_t *ev, void *udata)
{
    struct events *e = udata;
    pthread_mutex_lock(&e->mu);
    if (e->n < 16)
        snprintf(e->names[e->n++], 64, "%s", ev->name);
    if (strstr(ev->name, "lock_obtained")) {
        e->acq_time = ev->acq_time;
        e->fence = ev->fence;
        snprintf(e->instrument, sizeof(e->instrument), "%s", ev->instrument ? ev->instrument : "");
    }
    if (strstr(ev->name, "hold_and_release"))
        e->hold_time = ev->hold_time;
    if (strstr(ev->name, "explicit"))
        e->rel_time = ev->rel_time;
    if (strstr(ev->name, "explicit_all"))
        e->rel_key_cnt = ev->rel_key_cnt;
    pthread_mutex_unlock(&e->mu);
}

Test(qlock, lock_writes_the_gems_layout_with_a_fencing_token)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    struct events ev = { .mu = PTHREAD_MUTEX_INITIALIZER };
    capstan_qlock_client_on_event(c, on_event, &ev);
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 3000;
    o.meta = (const char *[]){ "job", "ReportJob", "shard", "7", NULL };
    o.instrument = "{\"x\":1}";
    capstan_qlock_result_t res;
    char err[CAPSTAN_ERRLEN];
    double before = kt_wall();
    cr_assert_eq(capstan_qlock_lock(c, r, "report", &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.status, CAPSTAN_QLOCK_OBTAINED);
    cr_assert_eq(res.fence, 1);
    cr_assert_eq(res.tries, 1);
    cr_assert_str_eq(res.lock_key, "rql:lock:report");

    /* Acquirer and host ids in the gem's format: pid/thread/fiber/ractor/identity. */
    regex_t re;
    regcomp(&re, "^rql:acq:[0-9]+/[0-9]+/0/0/[0-9a-f]{16}$", REG_EXTENDED);
    cr_assert_eq(regexec(&re, res.acq_id, 0, NULL, 0), 0, "%s", res.acq_id);
    regfree(&re);
    regcomp(&re, "^rql:hst:[0-9]+/[0-9]+/0/[0-9a-f]{16}$", REG_EXTENDED);
    cr_assert_eq(regexec(&re, res.hst_id, 0, NULL, 0), 0, "%s", res.hst_id);
    regfree(&re);
    char pidpart[32];
    snprintf(pidpart, sizeof(pidpart), "rql:acq:%d/", (int)getpid());
    cr_assert(strncmp(res.acq_id, pidpart, strlen(pidpart)) == 0);

    char *s = kt_str("HGET rql:lock:report acq_id");
    cr_assert_str_eq(s, res.acq_id);
    free(s);
    s = kt_str("HGET rql:lock:report hst_id");
    cr_assert_str_eq(s, res.hst_id);
    free(s);
    s = kt_str("HGET rql:lock:report ts");
    cr_assert(atof(s) > before - 2 && atof(s) < kt_wall() + 2, "ts %s", s);
    free(s);
    cr_assert_eq(kt_int("HGET rql:lock:report ini_ttl"), 3000);
    cr_assert_eq(kt_int("HGET rql:lock:report capstan_fence"), 1);
    s = kt_str("HGET rql:lock:report job");
    cr_assert_str_eq(s, "ReportJob");
    free(s);
    long long pttl = kt_int("PTTL rql:lock:report");
    cr_assert(pttl > 2000 && pttl <= 3000, "pttl %lld", pttl);
    cr_assert_eq(kt_int("EXISTS rql:lock_queue:report"), 0, "the holder left the queue");
    cr_assert_eq(kt_int("GET rql:fence:report"), 1);
    cr_assert_eq(kt_int("TTL rql:fence:report"), -1, "the counter never expires");

    cr_assert_eq(capstan_qlock_release(c, r, &res, err), 0, "%s", err);
    cr_assert_eq(kt_int("EXISTS rql:lock:report"), 0);
    capstan_qlock_result_t res2;
    cr_assert_eq(capstan_qlock_lock(c, r, "report", &o, &res2, err), 0, "%s", err);
    cr_assert_eq(res2.fence, 2, "tokens grow with each grant");
    cr_assert(res2.ts >= res.ts);
    cr_assert_eq(capstan_qlock_release(c, r, &res2, err), 0);

    cr_assert_eq(ev.n, 4);
    cr_assert_str_eq(ev.names[0], "redis_queued_locks.lock_obtained");
    cr_assert_str_eq(ev.names[1], "redis_queued_locks.lock_hold_and_release");
    cr_assert(ev.acq_time >= 0 && ev.hold_time >= 0);
    cr_assert_eq(ev.fence, 2);
    cr_assert_str_eq(ev.instrument, "{\"x\":1}");

    /* The gem's reserved fields cannot be metadata. */
    o.meta = (const char *[]){ "ts", "1", NULL };
    cr_assert_eq(capstan_qlock_lock(c, r, "report", &o, &res, err), CAPSTAN_EINVAL);
    cr_assert(strstr(err, "reserved"), "%s", err);
    o.meta = (const char *[]){ "lonely", NULL };
    cr_assert_eq(capstan_qlock_lock(c, r, "report", &o, &res, err), CAPSTAN_EINVAL);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

Test(qlock, results_say_why_the_lock_was_not_obtained)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *holder = client("aaaaaaaaaaaaaaaa"), *other = client("bbbbbbbbbbbbbbbb");
    capstan_qlock_result_t held, res;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 20000;
    cr_assert_eq(capstan_qlock_lock(holder, r, "busy", &o, &held, err), 0, "%s", err);

    capstan_qlock_opts_t ff = o;
    ff.fail_fast = 1;
    cr_assert_eq(capstan_qlock_lock(other, r, "busy", &ff, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(res.status, CAPSTAN_QLOCK_FAIL_FAST_NO_TRY);
    cr_assert_str_eq(capstan_qlock_status_name(res.status), "fail_fast_no_try");
    cr_assert_eq(kt_int("EXISTS rql:lock_queue:busy"), 0, "never queued");

    capstan_qlock_opts_t rl = o;
    rl.retry_count = 2;
    rl.retry_delay = 10;
    rl.retry_jitter = 0;
    cr_assert_eq(capstan_qlock_lock(other, r, "busy", &rl, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(res.status, CAPSTAN_QLOCK_RETRY_LIMIT);
    cr_assert_eq(res.tries, 2, "retry_count counts attempts in all");
    cr_assert_eq(kt_int("EXISTS rql:lock_queue:busy"), 0, "left the queue on giving up");

    capstan_qlock_opts_t to = o;
    to.retry_count = CAPSTAN_QLOCK_UNLIMITED;
    to.timeout = 0.3;
    to.retry_delay = 20;
    double t0 = kt_now();
    cr_assert_eq(capstan_qlock_lock(other, r, "busy", &to, &res, err), CAPSTAN_EDENIED);
    double took = kt_now() - t0;
    cr_assert_eq(res.status, CAPSTAN_QLOCK_TIMEOUT);
    cr_assert_str_eq(capstan_qlock_status_name(res.status), "timeout_reached");
    cr_assert(took >= 0.29 && took < 2, "took %f", took);
    cr_assert(res.tries > 3, "tries %d", res.tries);
    cr_assert_eq(kt_int("EXISTS rql:lock_queue:busy"), 0);

    /* fail_fast after a try: the lock is free but someone is ahead. */
    cr_assert_eq(capstan_qlock_release(holder, r, &held, err), 0);
    kt_cmd("ZADD rql:lock_queue:busy %f rql:acq:1/2/0/0/cccccccccccccccc", kt_wall());
    cr_assert_eq(capstan_qlock_lock(other, r, "busy", &ff, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(res.status, CAPSTAN_QLOCK_FAIL_FAST_AFTER_TRY);
    cr_assert_eq(kt_int("ZCARD rql:lock_queue:busy"), 1, "only the other waiter is left");
    capstan_qlock_client_free(holder);
    capstan_qlock_client_free(other);
    capstan_redis_free(r);
}

Test(qlock, an_expired_holder_cannot_release_or_extend_the_next_holders_lock)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *a = client("aaaaaaaaaaaaaaaa"), *b = client("bbbbbbbbbbbbbbbb");
    capstan_qlock_result_t ra, rb, ra2;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 150;
    cr_assert_eq(capstan_qlock_lock(a, r, "lease", &o, &ra, err), 0, "%s", err);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS rql:lock:lease") == 0, 3));
    o.ttl = 5000;
    cr_assert_eq(capstan_qlock_lock(b, r, "lease", &o, &rb, err), 0, "%s", err);
    cr_assert_gt(rb.fence, ra.fence);

    cr_assert_eq(capstan_qlock_release(a, r, &ra, err), CAPSTAN_EDENIED);
    cr_assert(strstr(err, "no longer held"), "%s", err);
    cr_assert_eq(capstan_qlock_extend(r, &ra, 60000, 0, NULL, err), CAPSTAN_EDENIED);
    char *holder = kt_str("HGET rql:lock:lease acq_id");
    cr_assert_str_eq(holder, rb.acq_id, "b still holds it");
    free(holder);
    long long pttl = kt_int("PTTL rql:lock:lease");
    cr_assert(pttl > 0 && pttl <= 5000, "a's extend did not touch it: %lld", pttl);

    /* The holder itself extends (adding, as the gem) and refreshes. */
    long long left = 0;
    cr_assert_eq(capstan_qlock_extend(r, &rb, 10000, 0, &left, err), 0, "%s", err);
    cr_assert(left > 10000 && left <= 15000, "%lld", left);
    cr_assert_eq(capstan_qlock_extend(r, &rb, 2000, 1, &left, err), 0, "%s", err);
    cr_assert_eq(left, 2000);
    cr_assert(kt_int("PTTL rql:lock:lease") <= 2000);
    cr_assert_eq(capstan_qlock_release(b, r, &rb, err), 0, "%s", err);

    /* Same acquirer, later grant: the stale result's token no longer fits. */
    o.ttl = 150;
    cr_assert_eq(capstan_qlock_lock(a, r, "lease", &o, &ra, err), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS rql:lock:lease") == 0, 3));
    o.ttl = 5000;
    cr_assert_eq(capstan_qlock_lock(a, r, "lease", &o, &ra2, err), 0);
    cr_assert_str_eq(ra.acq_id, ra2.acq_id);
    cr_assert_eq(capstan_qlock_release(a, r, &ra, err), CAPSTAN_EDENIED, "an old grant cannot release a new one");
    cr_assert_eq(capstan_qlock_extend(r, &ra, 1000, 0, NULL, err), CAPSTAN_EDENIED);
    cr_assert_eq(kt_int("EXISTS rql:lock:lease"), 1);
    cr_assert_eq(capstan_qlock_release(a, r, &ra2, err), 0);
    capstan_qlock_client_free(a);
    capstan_qlock_client_free(b);
    capstan_redis_free(r);
}

static int check_held(const capstan_qlock_result_t *res, void *udata)
{
    char *holder = kt_str("HGET %s acq_id", res->lock_key);
    int ok = holder && strcmp(holder, res->acq_id) == 0;
    free(holder);
    *(int *)udata = ok;
    return 42;
}

static atomic_int slow_done;

static int slow(const capstan_qlock_result_t *res, void *udata)
{
    (void)res;
    (void)udata;
    kt_sleep(0.6);
    atomic_store(&slow_done, 1);
    return 0;
}

Test(qlock, run_holds_the_lock_around_the_function_and_timed_stops_waiting)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    capstan_qlock_result_t res;
    char err[CAPSTAN_ERRLEN];
    int held = 0, rc = 0;
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    cr_assert_eq(capstan_qlock_run(c, r, "job", &o, check_held, &held, &res, &rc, err), 0, "%s", err);
    cr_assert_eq(held, 1, "the function ran under the lock");
    cr_assert_eq(rc, 42);
    cr_assert_eq(res.lost, 0);
    cr_assert_eq(kt_int("EXISTS rql:lock:job"), 0, "released after");

    o.timed = 1;
    o.ttl = 200;
    double t0 = kt_now();
    cr_assert_eq(capstan_qlock_run(c, r, "job", &o, slow, NULL, &res, &rc, err), CAPSTAN_EJOB);
    double took = kt_now() - t0;
    cr_assert(took < 0.45, "stopped waiting at the ttl, not the function's end: %f", took);
    cr_assert(strstr(err, "still running"), "%s", err);
    cr_assert_eq(kt_int("EXISTS rql:lock:job"), 0);
    cr_assert(KT_WAIT_UNTIL(atomic_load(&slow_done), 3));
    kt_sleep(0.02);

    /* Timed, finishing in time. */
    o.ttl = 2000;
    cr_assert_eq(capstan_qlock_run(c, r, "job", &o, check_held, &held, &res, &rc, err), 0, "%s", err);
    cr_assert_eq(rc, 42);
    cr_assert_eq(held, 1);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

/* --- FIFO and exclusion ------------------------------------------------ */

struct waiter {
    const char *url;
    capstan_qlock_client_t *c;
    capstan_qlock_opts_t o;
    const char *name;
    int n;                 /* acquisitions to make */
    int failures;
    double obtained_at;    /* kt_now() of the last grant */
    capstan_qlock_result_t res;
    char err[CAPSTAN_ERRLEN];
};

/* Takes the lock w->n times; inside, checks on Redis that nobody else is
 * inside and logs "fence requested_at" in critical-section order. */
static void *hammer(void *arg)
{
    struct waiter *w = arg;
    capstan_redis_t *r = conn_new(w->url);
    if (!r) {
        w->failures = w->n;
        return NULL;
    }
    for (int i = 0; i < w->n; i++) {
        if (capstan_qlock_lock(w->c, r, w->name, &w->o, &w->res, w->err)) {
            w->failures++;
            continue;
        }
        w->obtained_at = kt_now();
        redisReply *rep = capstan_redis_cmdf(r, "INCR ql:inside");
        if (!rep || rep->integer != 1)
            freeReplyObject(capstan_redis_cmdf(r, "INCR ql:overlap"));
        freeReplyObject(rep);
        freeReplyObject(capstan_redis_cmdf(r, "RPUSH ql:log %lld:%.6f", w->res.fence, w->res.requested_at));
        freeReplyObject(capstan_redis_cmdf(r, "DECR ql:inside"));
        if (capstan_qlock_release(w->c, r, &w->res, w->err))
            w->failures++;
    }
    capstan_redis_free(r);
    return NULL;
}

/* Reads ql:log and checks tokens grow and requests were served in order. */
static void check_log(long long expect)
{
    cr_assert_eq(kt_int("GET ql:overlap"), 0, "two holders at once");
    redisReply *log = kt_cmd("LRANGE ql:log 0 -1");
    cr_assert_eq((long long)log->elements, expect);
    long long last_fence = 0;
    double last_req = 0;
    for (size_t i = 0; i < log->elements; i++) {
        long long fence = atoll(log->element[i]->str);
        double req = atof(strchr(log->element[i]->str, ':') + 1);
        cr_assert_gt(fence, last_fence, "entry %zu: token %lld after %lld", i, fence, last_fence);
        cr_assert_geq(req, last_req, "entry %zu: request %.6f served after the later %.6f", i, req, last_req);
        last_fence = fence;
        last_req = req;
    }
    freeReplyObject(log);
}

Test(qlock, waiters_get_the_lock_in_the_order_they_asked)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    capstan_qlock_result_t held;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 10000;
    cr_assert_eq(capstan_qlock_lock(c, r, "line", &o, &held, err), 0);
    enum { N = 5 };
    struct waiter w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        /* Shorter delays for later waiters: polling faster must not jump the line. */
        w[i] = (struct waiter){ .url = kt_url(), .c = c, .o = o, .name = "line", .n = 1 };
        w[i].o.timeout = 20;
        w[i].o.retry_count = CAPSTAN_QLOCK_UNLIMITED;
        w[i].o.retry_delay = 60 - 10 * i;
        w[i].o.retry_jitter = 5;
        pthread_create(&th[i], NULL, hammer, &w[i]);
        cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD rql:lock_queue:line") == i + 1, 5));
    }
    redisReply *q = kt_cmd("ZRANGE rql:lock_queue:line 0 -1");
    cr_assert_eq(q->elements, N);
    freeReplyObject(q);
    cr_assert_eq(capstan_qlock_release(c, r, &held, err), 0);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(w[i].failures, 0, "%s", w[i].err);
        cr_assert_eq(w[i].res.fence, held.fence + 1 + i, "waiter %d got token %lld", i, w[i].res.fence);
        if (i)
            cr_assert_lt(w[i - 1].obtained_at, w[i].obtained_at);
    }
    check_log(N);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

/* A thread that names itself before it waits for the lock "ids". */
struct self_waiter {
    const char *url;
    capstan_qlock_client_t *c;
    char acq_id[CAPSTAN_QLOCK_ID_MAX], hst_id[CAPSTAN_QLOCK_ID_MAX];
    atomic_int named;
    int rc;
    capstan_qlock_result_t res;
};

static void *wait_named(void *arg)
{
    struct self_waiter *w = arg;
    capstan_qlock_acq_id(w->c, w->acq_id);
    capstan_qlock_hst_id(w->c, w->hst_id);
    atomic_store(&w->named, 1);
    capstan_redis_t *r = conn_new(w->url);
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.timeout = 20;
    o.retry_count = CAPSTAN_QLOCK_UNLIMITED;
    o.retry_delay = 50;
    char err[CAPSTAN_ERRLEN];
    w->rc = r ? capstan_qlock_lock(w->c, r, "ids", &o, &w->res, err) : CAPSTAN_EREDIS;
    if (!w->rc)
        w->rc = capstan_qlock_release(w->c, r, &w->res, err);
    capstan_redis_free(r);
    return NULL;
}

/* capstan_qlock_acq_id and _hst_id name the calling thread before it locks:
 * the ids its lock then carries (in res, the lock hash, the queue), one
 * pair per thread and per client identity, so a thread finds itself in
 * capstan_qlock_info and capstan_qlock_queue_info. */
Test(qlock, a_thread_knows_its_acquirer_and_host_ids_before_it_locks)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    char acq[CAPSTAN_QLOCK_ID_MAX], hst[CAPSTAN_QLOCK_ID_MAX], err[CAPSTAN_ERRLEN];
    capstan_qlock_acq_id(c, acq);
    capstan_qlock_hst_id(c, hst);
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 20000;
    capstan_qlock_result_t held;
    cr_assert_eq(capstan_qlock_lock(c, r, "ids", &o, &held, err), 0, "%s", err);
    cr_assert_str_eq(held.acq_id, acq);
    cr_assert_str_eq(held.hst_id, hst);
    json_t *info = NULL;
    cr_assert_eq(capstan_qlock_info(r, "ids", &info, err), 0, "%s", err);
    cr_assert_str_eq(json_string_value(json_object_get(info, "acq_id")), acq, "this thread holds it");
    cr_assert_str_eq(json_string_value(json_object_get(info, "hst_id")), hst);
    json_decref(info);

    struct self_waiter w = { .url = kt_url(), .c = c };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, wait_named, &w), 0);
    cr_assert(KT_WAIT_UNTIL(atomic_load(&w.named) && kt_int("ZCARD rql:lock_queue:ids") == 1, 10));
    cr_assert_str_neq(w.acq_id, acq, "another thread is another acquirer");
    cr_assert_str_neq(w.hst_id, hst);
    json_t *q = NULL;
    cr_assert_eq(capstan_qlock_queue_info(r, "ids", &q, err), 0, "%s", err);
    json_t *first = json_array_get(json_object_get(q, "queue"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(first, "acq_id")), w.acq_id, "the waiter is in line");
    json_decref(q);
    cr_assert_eq(capstan_qlock_release(c, r, &held, err), 0, "%s", err);
    pthread_join(th, NULL);
    cr_assert_eq(w.rc, 0, "the waiter got the lock and released it");
    cr_assert_str_eq(w.res.acq_id, w.acq_id);
    cr_assert_str_eq(w.res.hst_id, w.hst_id);

    /* The identity given to the client ends both ids. */
    capstan_qlock_client_t *named = client("0123456789abcdef");
    capstan_qlock_acq_id(named, acq);
    capstan_qlock_hst_id(named, hst);
    char want[64];
    snprintf(want, sizeof(want), "rql:acq:%d/", (int)getpid());
    cr_assert(strncmp(acq, want, strlen(want)) == 0 && strstr(acq, "/0/0/0123456789abcdef"), "%s", acq);
    snprintf(want, sizeof(want), "rql:hst:%d/", (int)getpid());
    cr_assert(strncmp(hst, want, strlen(want)) == 0 && strstr(hst, "/0/0123456789abcdef")
              && !strstr(hst, "/0/0/0123456789abcdef"), "%s", hst);
    capstan_qlock_client_free(named);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

Test(qlock, five_processes_of_four_threads_never_overlap_and_keep_fifo_order)
{
    enum { PROCS = 5, THREADS = 4, TIMES = 50 };
    const char *url = kt_url();
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        cr_assert_geq(pids[p], 0);
        if (pids[p] == 0) {
            char err[CAPSTAN_ERRLEN];
            capstan_qlock_client_t *c = capstan_qlock_client_new(NULL, err);
            struct waiter w[THREADS];
            pthread_t th[THREADS];
            for (int i = 0; i < THREADS; i++) {
                w[i] = (struct waiter){ .url = url, .c = c, .name = "shared", .n = TIMES };
                w[i].o = capstan_qlock_opts_default();
                w[i].o.ttl = 10000;
                w[i].o.queue_ttl = 60;
                w[i].o.timeout = 80;
                w[i].o.retry_count = CAPSTAN_QLOCK_UNLIMITED;
                w[i].o.retry_delay = 2;
                w[i].o.retry_jitter = 3;
                pthread_create(&th[i], NULL, hammer, &w[i]);
            }
            int failures = 0;
            for (int i = 0; i < THREADS; i++) {
                pthread_join(th[i], NULL);
                failures += w[i].failures;
                if (w[i].failures)
                    fprintf(stderr, "child %d thread %d: %s\n", (int)getpid(), i, w[i].err);
            }
            capstan_qlock_client_free(c);
            _exit(failures ? 1 : 0);
        }
    }
    for (int p = 0; p < PROCS; p++)
        cr_assert_eq(kt_wait_exit(pids[p], 90), 0, "worker process %d failed", p);
    check_log(PROCS * THREADS * TIMES);
    cr_assert_eq(kt_int("GET rql:fence:shared"), PROCS * THREADS * TIMES);
    cr_assert_eq(kt_int("EXISTS rql:lock:shared"), 0);
    cr_assert_eq(kt_int("EXISTS rql:lock_queue:shared"), 0);
    cr_assert_eq(kt_int("EXISTS rql:capstan:seen:shared"), 0, "capstan's side hash goes with the queue");
}

Test(qlock, a_waiter_killed_in_the_queue_stops_blocking_after_its_queue_ttl)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    capstan_qlock_result_t held;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 20000;
    cr_assert_eq(capstan_qlock_lock(c, r, "door", &o, &held, err), 0);
    const char *url = kt_url();
    pid_t dead = fork();
    cr_assert_geq(dead, 0);
    if (dead == 0) {
        capstan_redis_t *cr = conn_new(url);
        capstan_qlock_client_t *cc = capstan_qlock_client_new(NULL, err);
        capstan_qlock_opts_t wo = capstan_qlock_opts_default();
        wo.queue_ttl = 1;
        wo.timeout = 60;
        wo.retry_count = CAPSTAN_QLOCK_UNLIMITED;
        wo.retry_delay = 50;
        capstan_qlock_result_t res;
        capstan_qlock_lock(cc, cr, "door", &wo, &res, err);
        _exit(0);
    }
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD rql:lock_queue:door") == 1, 5));
    kt_sleep(0.2); /* a few attempts in */
    kill(dead, SIGKILL);
    double killed = kt_now();
    cr_assert_eq(kt_wait_exit(dead, 5), 128 + SIGKILL);
    char *dead_id = zhead("rql:lock_queue:door");
    cr_assert_not_null(dead_id);

    struct waiter w = { .url = url, .c = c, .o = o, .name = "door", .n = 1 };
    w.o.timeout = 10;
    w.o.retry_count = CAPSTAN_QLOCK_UNLIMITED;
    w.o.retry_delay = 20;
    w.o.queue_ttl = 10;
    pthread_t th;
    pthread_create(&th, NULL, hammer, &w);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD rql:lock_queue:door") == 2, 5));
    cr_assert_eq(capstan_qlock_release(c, r, &held, err), 0);
    pthread_join(th, NULL);
    cr_assert_eq(w.failures, 0, "%s", w.err);
    double waited = w.obtained_at - killed;
    /* The dead waiter's place lasted queue_ttl (1 s) after its last try
     * (at most 75 ms before the kill), then stopped blocking. */
    cr_assert(waited > 0.8 && waited < 3, "obtained %.3f s after the kill", waited);
    cr_assert_eq(kt_int("ZSCORE rql:lock_queue:door %s", dead_id), 0);
    cr_assert_eq(kt_int("HEXISTS rql:capstan:seen:door %s", dead_id), 0);
    free(dead_id);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

Test(qlock, a_short_queue_ttl_does_not_evict_live_waiters)
{
    /* The gem purges every place older than the caller's queue_ttl; here a
     * caller with 50 ms must not evict a live waiter that asked earlier. */
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    capstan_qlock_result_t held, res;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 20000;
    cr_assert_eq(capstan_qlock_lock(c, r, "pier", &o, &held, err), 0);
    struct waiter w = { .url = kt_url(), .c = c, .o = o, .name = "pier", .n = 1 };
    w.o.queue_ttl = 5;
    w.o.retry_delay = 100;
    w.o.timeout = 20;
    w.o.retry_count = CAPSTAN_QLOCK_UNLIMITED;
    pthread_t th;
    pthread_create(&th, NULL, hammer, &w);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD rql:lock_queue:pier") == 1, 5));
    char *first = zhead("rql:lock_queue:pier");
    char *score = kt_str("ZSCORE rql:lock_queue:pier %s", first);
    capstan_qlock_client_t *hasty = client(NULL);
    capstan_qlock_opts_t ho = o;
    ho.queue_ttl = 0.05;
    ho.retry_count = 6;
    ho.retry_delay = 100;
    cr_assert_eq(capstan_qlock_lock(hasty, r, "pier", &ho, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(res.status, CAPSTAN_QLOCK_RETRY_LIMIT);
    char *score2 = kt_str("ZSCORE rql:lock_queue:pier %s", first);
    cr_assert_not_null(score2, "the live waiter kept its place");
    cr_assert_str_eq(score, score2, "and its request time");
    cr_assert_eq(capstan_qlock_release(c, r, &held, err), 0);
    pthread_join(th, NULL);
    cr_assert_eq(w.failures, 0, "%s", w.err);
    cr_assert_str_eq(w.res.acq_id, first);
    free(first);
    free(score);
    free(score2);
    capstan_qlock_client_free(hasty);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

/* --- inspection, admin, logging ---------------------------------------- */

Test(qlock, info_listings_and_admin_calls)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    struct events ev = { .mu = PTHREAD_MUTEX_INITIALIZER };
    capstan_qlock_client_on_event(c, on_event, &ev);
    capstan_qlock_result_t a, b;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 30000;
    o.meta = (const char *[]){ "who", "me", NULL };
    cr_assert_eq(capstan_qlock_lock(c, r, "alpha", &o, &a, err), 0);
    cr_assert_eq(capstan_qlock_lock(c, r, "beta", &o, &b, err), 0);
    double now = kt_wall();
    kt_cmd("ZADD rql:lock_queue:alpha %f rql:acq:9/9/0/0/dddddddddddddddd", now);
    kt_cmd("ZADD rql:lock_queue:gamma %f rql:acq:9/8/0/0/dddddddddddddddd", now - 200000);

    json_t *info = NULL, *q = NULL;
    cr_assert_eq(capstan_qlock_info(r, "alpha", &info, err), 0, "%s", err);
    cr_assert_not_null(info);
    cr_assert_str_eq(json_string_value(json_object_get(info, "acq_id")), a.acq_id);
    cr_assert_str_eq(json_string_value(json_object_get(info, "lock_key")), "rql:lock:alpha");
    cr_assert_str_eq(json_string_value(json_object_get(info, "who")), "me");
    cr_assert(json_is_real(json_object_get(info, "ts")));
    cr_assert_eq(json_integer_value(json_object_get(info, "ini_ttl")), 30000);
    cr_assert_eq(json_integer_value(json_object_get(info, "capstan_fence")), a.fence);
    cr_assert(json_integer_value(json_object_get(info, "rem_ttl")) > 25000);
    json_decref(info);
    cr_assert_eq(capstan_qlock_info(r, "nope", &info, err), 0);
    cr_assert_null(info);

    cr_assert_eq(capstan_qlock_queue_info(r, "alpha", &q, err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(q, "lock_queue")), "rql:lock_queue:alpha");
    json_t *first = json_array_get(json_object_get(q, "queue"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(first, "acq_id")), "rql:acq:9/9/0/0/dddddddddddddddd");
    cr_assert_float_eq(json_real_value(json_object_get(first, "score")), now, 0.001);
    json_decref(q);
    cr_assert_eq(capstan_qlock_queue_info(r, "beta", &q, err), 0);
    cr_assert_null(q);

    cr_assert_eq(capstan_qlock_locked(r, "alpha", err), 1);
    cr_assert_eq(capstan_qlock_locked(r, "gamma", err), 0);
    cr_assert_eq(capstan_qlock_queued(r, "alpha", err), 1);
    cr_assert_eq(capstan_qlock_queued(r, "beta", err), 0);

    json_t *l = NULL;
    cr_assert_eq(capstan_qlock_locks(r, 10, &l, err), 0);
    cr_assert_eq(json_array_size(l), 2);
    json_decref(l);
    cr_assert_eq(capstan_qlock_queues(r, 10, &l, err), 0);
    cr_assert_eq(json_array_size(l), 2);
    json_decref(l);
    cr_assert_eq(capstan_qlock_keys(r, 10, &l, err), 0);
    cr_assert_eq(json_array_size(l), 4, "locks and queues, not capstan's side keys or counters");
    json_decref(l);
    cr_assert_eq(capstan_qlock_locks_info(r, 0, &l, err), 0);
    cr_assert_eq(json_array_size(l), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(l, 0), "status")), "alive");
    cr_assert_not_null(json_object_get(json_object_get(json_array_get(l, 0), "info"), "acq_id"));
    json_decref(l);
    cr_assert_eq(capstan_qlock_queues_info(r, 0, &l, err), 0);
    cr_assert_eq(json_array_size(l), 2);
    cr_assert_eq(json_array_size(json_object_get(json_array_get(l, 0), "requests")), 1);
    json_decref(l);

    /* Old requests whose waiter no longer tries: gamma's goes, alpha's
     * (recent) stays. */
    json_t *done = NULL;
    long long dropped = 0;
    cr_assert_eq(capstan_qlock_clear_dead_requests(r, 100000, 0, &done, &dropped, err), 0, "%s", err);
    cr_assert_eq(dropped, 1);
    cr_assert_str_eq(json_string_value(json_array_get(done, 0)), "rql:lock_queue:gamma");
    json_decref(done);
    cr_assert_eq(kt_int("EXISTS rql:lock_queue:gamma"), 0);
    cr_assert_eq(kt_int("ZCARD rql:lock_queue:alpha"), 1);

    int lr = 0, qr = 0;
    cr_assert_eq(capstan_qlock_force_unlock(c, r, "alpha", &lr, &qr, err), 0, "%s", err);
    cr_assert(lr && qr);
    cr_assert_eq(capstan_qlock_force_unlock(c, r, "alpha", &lr, &qr, err), 0);
    cr_assert(!lr && !qr);
    long long n = 0;
    kt_cmd("ZADD rql:lock_queue:delta %f x", now);
    cr_assert_eq(capstan_qlock_clear_locks(c, r, 1, &n, err), 0, "%s", err);
    cr_assert_eq(n, 2, "beta's lock and delta's queue");
    cr_assert_eq(kt_int("EXISTS rql:lock:beta rql:lock_queue:delta"), 0);
    cr_assert_eq(kt_int("GET rql:fence:beta"), b.fence, "counters survive, so tokens keep growing");
    cr_assert_str_eq(ev.names[2], "redis_queued_locks.explicit_lock_release");
    cr_assert_str_eq(ev.names[4], "redis_queued_locks.explicit_all_locks_release");
    cr_assert_eq(ev.rel_key_cnt, 2);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

struct lines {
    char buf[8192];
    size_t len;
};

static void collect(const char *line, void *udata)
{
    struct lines *l = udata;
    l->len += (size_t)snprintf(l->buf + l->len, sizeof(l->buf) - l->len, "%s\n", line);
    if (l->len >= sizeof(l->buf))
        l->len = sizeof(l->buf) - 1;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

Test(qlock, debug_log_shows_each_try_when_asked)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *holder = client(NULL), *c = client(NULL);
    struct lines l = { .len = 0 };
    capstan_qlock_client_on_log(c, collect, &l, 1);
    capstan_qlock_result_t held, res;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    cr_assert_eq(capstan_qlock_lock(holder, r, "noisy", &o, &held, err), 0);
    o.retry_delay = 5;
    cr_assert_eq(capstan_qlock_lock(c, r, "noisy", &o, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(count(l.buf, "start_lock_obtaining"), 1, "%s", l.buf);
    cr_assert_eq(count(l.buf, "try_lock.held"), 3, "%s", l.buf);
    cr_assert_eq(count(l.buf, "fail_fast_or_limits_reached__dequeue"), 1, "%s", l.buf);
    cr_assert(strstr(l.buf, "rql:lock:noisy"));
    /* Without log_lock_try, only the milestones. */
    l.len = 0;
    l.buf[0] = '\0';
    capstan_qlock_client_on_log(c, collect, &l, 0);
    cr_assert_eq(capstan_qlock_lock(c, r, "noisy", &o, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(count(l.buf, "try_lock."), 0, "%s", l.buf);
    cr_assert_eq(count(l.buf, "start_lock_obtaining"), 1);
    capstan_qlock_client_free(holder);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

/* --- interop with the Ruby gem's layout -------------------------------- */

static json_t *ruby_json(const char *const *args)
{
    char *out = NULL;
    int st = kt_ruby("qlock.rb", args, &out);
    cr_assert_eq(st, 0, "ruby qlock.rb %s: %s", args[0], out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", out);
    free(out);
    return j;
}

Test(qlock, a_lock_held_in_the_gems_layout_blocks_capstan_and_the_reverse)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    capstan_qlock_result_t res;
    char err[CAPSTAN_ERRLEN];

    /* Ruby takes it as the gem does; capstan waits. */
    json_t *j = ruby_json((const char *[]){ "try", "bridge", "20000", NULL });
    cr_assert(json_is_true(json_object_get(j, "ok")), "%s", json_dumps(j, 0));
    char *ruby_acq = strdup(json_string_value(json_object_get(j, "acq_id")));
    json_decref(j);
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.fail_fast = 1;
    cr_assert_eq(capstan_qlock_lock(c, r, "bridge", &o, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(res.status, CAPSTAN_QLOCK_FAIL_FAST_NO_TRY);
    o.fail_fast = 0;
    o.timeout = 0.3;
    o.retry_count = CAPSTAN_QLOCK_UNLIMITED;
    o.retry_delay = 20;
    cr_assert_eq(capstan_qlock_lock(c, r, "bridge", &o, &res, err), CAPSTAN_EDENIED);
    cr_assert_eq(res.status, CAPSTAN_QLOCK_TIMEOUT);
    json_t *info = NULL;
    cr_assert_eq(capstan_qlock_info(r, "bridge", &info, err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(info, "acq_id")), ruby_acq);
    cr_assert_str_eq(json_string_value(json_object_get(info, "owner")), "ruby");
    json_decref(info);
    /* capstan cannot release what Ruby holds... */
    res.fence = 0;
    snprintf(res.lock_key, sizeof(res.lock_key), "rql:lock:bridge");
    cr_assert_eq(capstan_qlock_release(c, r, &res, err), CAPSTAN_EDENIED);
    /* ...and gets it once the gem lets go. */
    json_decref(ruby_json((const char *[]){ "unlock", "bridge", NULL }));
    o.timeout = 5;
    cr_assert_eq(capstan_qlock_lock(c, r, "bridge", &o, &res, err), 0, "%s", err);

    /* capstan holds it; the gem's check sees capstan's holder and cannot take it. */
    j = ruby_json((const char *[]){ "info", "bridge", NULL });
    cr_assert(json_is_true(json_object_get(j, "locked")));
    json_t *ri = json_object_get(j, "info");
    cr_assert_str_eq(json_string_value(json_object_get(ri, "acq_id")), res.acq_id);
    cr_assert_str_eq(json_string_value(json_object_get(ri, "hst_id")), res.hst_id);
    cr_assert_eq(json_integer_value(json_object_get(ri, "ini_ttl")), o.ttl);
    cr_assert_float_eq(json_real_value(json_object_get(ri, "ts")), res.ts, 0.001);
    cr_assert(json_integer_value(json_object_get(ri, "rem_ttl")) > 0);
    json_decref(j);
    j = ruby_json((const char *[]){ "try", "bridge", "5000", NULL });
    cr_assert(json_is_false(json_object_get(j, "ok")));
    cr_assert_str_eq(json_string_value(json_object_get(j, "result")), "lock_is_still_acquired");
    json_decref(j);
    cr_assert_eq(capstan_qlock_release(c, r, &res, err), 0);
    j = ruby_json((const char *[]){ "try", "bridge", "5000", NULL });
    cr_assert(json_is_true(json_object_get(j, "ok")), "the gem takes it after capstan's release");
    json_decref(j);

    /* A gem waiter's place (no capstan deadline) lasts queue_ttl from its request. */
    json_decref(ruby_json((const char *[]){ "unlock", "bridge", NULL }));
    kt_cmd("ZADD rql:lock_queue:bridge %f rql:acq:1/2/3/4/eeeeeeeeeeeeeeee", kt_wall() - 60);
    o.timeout = 1;
    cr_assert_eq(capstan_qlock_lock(c, r, "bridge", &o, &res, err), 0, "a stale gem place does not block: %s", err);
    cr_assert_eq(res.tries, 1);
    cr_assert_eq(kt_int("EXISTS rql:lock_queue:bridge"), 0);
    free(ruby_acq);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

/* --- capstan lock ---------------------------------------------------------- */

static pid_t spawn_capstan(const char *const *args, const char *out_path)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        const char *argv[32];
        int n = 0;
        argv[n++] = getenv("CAPSTAN_BIN");
        for (int i = 0; args[i] && n < 31; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        int fd = open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setenv("REDIS_URL", kt_url(), 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

Test(qlock, capstan_lock_runs_the_command_and_passes_its_status)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", "--", "sh", "-c",
                                             "echo \"$CAPSTAN_LOCK_NAME $CAPSTAN_LOCK_FENCE\"; exit 7", NULL },
                                &out), 7, "%s", out);
    cr_assert(strstr(out, "cron 1"), "%s", out);
    free(out);
    cr_assert_eq(kt_int("EXISTS rql:lock:cron"), 0, "released after the command");
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", "--", "true", NULL }, &out), 0);
    free(out);
    cr_assert_eq(kt_int("GET rql:fence:cron"), 2);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", "--", "/no/such/cmd", NULL }, &out), 127);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", NULL }, &out), 64);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", "--ttl", "x", "--", "true", NULL }, &out), 64);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "--help", NULL }, &out), 0);
    cr_assert(strstr(out, "Exit status"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", "--redis-url", "redis://127.0.0.1:1/0",
                                             "--", "true", NULL }, &out), 69, "%s", out);
    free(out);

    /* Held elsewhere: 75, and the command never runs. */
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    capstan_qlock_result_t held;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 20000;
    o.meta = (const char *[]){ "purpose", "test", NULL };
    cr_assert_eq(capstan_qlock_lock(c, r, "cron", &o, &held, err), 0);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", "--fail-fast", "--", "sh", "-c", "echo RAN", NULL },
                                &out), 75, "%s", out);
    cr_assert(strstr(out, "fail_fast_no_try") && !strstr(out, "RAN"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "cron", "--timeout", "0.3", "--retry-delay", "20", "--",
                                             "true", NULL }, &out), 75, "%s", out);
    cr_assert(strstr(out, "timeout_reached"), "%s", out);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "info", "cron", NULL }, &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "lock"), "acq_id")), held.acq_id);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "lock"), "purpose")), "test");
    json_decref(j);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "list", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "cron\t") && strstr(out, held.acq_id), "%s", out);
    free(out);
    kt_cmd("ZADD rql:lock_queue:old %f rql:acq:1/1/0/0/ffffffffffffffff", kt_wall() - 200000);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "clear-dead", "--dead-ttl", "100000", NULL }, &out), 0);
    cr_assert(strstr(out, "dropped 1 dead requests from 1 queues"), "%s", out);
    free(out);
    cr_assert_eq(capstan_qlock_release(c, r, &held, err), 0);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
}

Test(qlock, capstan_lock_keeps_the_lease_while_a_long_command_runs)
{
    char *log = kt_tmp("long.out");
    pid_t p = spawn_capstan((const char *[]){ "lock", "slow", "--ttl", "300", "--", "sleep", "1.2", NULL }, log);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS rql:lock:slow") == 1, 5));
    kt_sleep(0.8); /* well past the 300 ms ttl */
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "slow", "--fail-fast", "--", "true", NULL }, &out), 75,
                 "%s", out);
    free(out);
    cr_assert_eq(kt_wait_exit(p, 10), 0);
    cr_assert_eq(kt_int("EXISTS rql:lock:slow"), 0);
    free(log);
}

Test(qlock, capstan_lock_from_ten_shells_never_overlaps)
{
    enum { N = 10 };
    char *marks = kt_tmp("marks.txt");
    char *log = kt_tmp("shells.out");
    char script[1024];
    snprintf(script, sizeof(script),
             "echo \"start $$ $CAPSTAN_LOCK_FENCE\" >> '%s'; sleep 0.05; echo \"end $$\" >> '%s'", marks, marks);
    pid_t pids[N];
    for (int i = 0; i < N; i++)
        pids[i] = spawn_capstan((const char *[]){ "lock", "shell", "--retry-delay", "20", "--timeout", "60",
                                              "--", "sh", "-c", script, NULL }, log);
    for (int i = 0; i < N; i++)
        cr_assert_eq(kt_wait_exit(pids[i], 80), 0, "capstan lock %d failed: %s", i, kt_read_file(log));
    char *s = kt_read_file(marks);
    char *save = NULL, *line = strtok_r(s, "\n", &save);
    int starts = 0;
    long long last_fence = 0;
    while (line) {
        char pid1[32], pid2[32];
        long long fence = 0;
        cr_assert_eq(sscanf(line, "start %31s %lld", pid1, &fence), 2, "expected a start: %s", line);
        cr_assert_gt(fence, last_fence);
        last_fence = fence;
        line = strtok_r(NULL, "\n", &save);
        cr_assert_not_null(line, "a start without an end");
        cr_assert_eq(sscanf(line, "end %31s", pid2), 1, "another start before the end: %s", line);
        cr_assert_str_eq(pid1, pid2, "interleaved");
        starts++;
        line = strtok_r(NULL, "\n", &save);
    }
    cr_assert_eq(starts, N);
    free(s);
    free(marks);
    free(log);
}

/* Whether pid still runs (a zombie waiting for its reaper does not). */
static bool running(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return false;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    char *st = kt_read_file(path);
    char *paren = strrchr(st, ')');
    bool zombie = paren && paren[1] == ' ' && paren[2] == 'Z';
    free(st);
    return !zombie;
}

static pid_t read_pid(const char *path)
{
    char *s = kt_read_file(path);
    pid_t pid = (pid_t)atoi(s);
    free(s);
    return pid;
}

Test(qlock, capstan_lock_killed_outright_takes_its_command_with_it)
{
    char *pidfile = kt_tmp("child.pid");
    char *log = kt_tmp("killed.out");
    char script[512];
    snprintf(script, sizeof(script), "echo $$ > '%s'; exec sleep 30", pidfile);
    pid_t p = kt_track(spawn_capstan((const char *[]){ "lock", "killed", "--ttl", "500", "--", "sh", "-c",
                                                   script, NULL }, log));
    pid_t child = 0;
    cr_assert(KT_WAIT_UNTIL((child = read_pid(pidfile)) > 0, 10), "%s",
              kt_read_file(log));
    cr_assert(running(child));
    cr_assert_eq(kt_capstan_stop(p, SIGKILL, 5), 128 + SIGKILL);
    bool gone = KT_WAIT_UNTIL(!running(child), 3);
    if (!gone)
        kill(child, SIGKILL);
    cr_assert(gone, "the command outlived capstan lock, and so its lock");
    /* The next caller gets in once the dead holder's lease ran out, and
     * by then nothing runs under the old holding. */
    char check[256];
    snprintf(check, sizeof(check), "if kill -0 %d 2>/dev/null; then echo OVERLAP; else echo ALONE; fi",
             (int)child);
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "killed", "--timeout", "10", "--", "sh", "-c", check,
                                              NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "ALONE"), "%s", out);
    free(out);
    free(pidfile);
    free(log);
}

/* A command that ignores SIGTERM must not run on beside the next holder
 * once the lease is lost: capstan lock, frozen past its lease (as a paused VM
 * or a long stop would), finds the lock gone when it wakes, and the
 * SIGKILL after --kill-after ends the command even though it traps TERM. */
Test(qlock, capstan_lock_kills_a_command_that_ignores_sigterm_after_the_grace)
{
    char *pidfile = kt_tmp("stubborn.pid");
    char *log = kt_tmp("stubborn.out");
    char script[512];
    /* exec keeps the pid and the ignored TERM (an ignored signal stays
     * ignored across exec), so the pid in the file is what must die. */
    snprintf(script, sizeof(script), "trap '' TERM; echo $$ > '%s'; exec sleep 60", pidfile);
    pid_t p = kt_track(spawn_capstan((const char *[]){ "lock", "stubborn", "--ttl", "600", "--kill-after", "1",
                                                   "--", "sh", "-c", script, NULL }, log));
    pid_t child = 0;
    cr_assert(KT_WAIT_UNTIL((child = read_pid(pidfile)) > 0, 10), "%s", kt_read_file(log));
    cr_assert(running(child));

    /* Frozen until the lease ran out in Redis and another caller holds the
     * lock: the overlap the fencing token is for. */
    cr_assert_eq(kill(p, SIGSTOP), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS rql:lock:stubborn") == 0, 10), "the lease never lapsed");
    capstan_redis_t *r = kt_lib_redis();
    capstan_qlock_client_t *c = client(NULL);
    capstan_qlock_result_t next;
    char err[CAPSTAN_ERRLEN];
    capstan_qlock_opts_t o = capstan_qlock_opts_default();
    o.ttl = 30000;
    cr_assert_eq(capstan_qlock_lock(c, r, "stubborn", &o, &next, err), 0, "%s", err);
    cr_assert_eq(kill(p, SIGCONT), 0);
    double woke = kt_now();

    /* It notices within a refresh period (ttl/3), sends SIGTERM, which the
     * command ignores, then SIGKILL a second later: 1 s grace plus 3 s of
     * margin for a loaded machine, where the old code never killed it. */
    bool gone = KT_WAIT_UNTIL(!running(child), 4);
    double took = kt_now() - woke;
    int st = kt_wait_exit(p, 5);
    char *out = kt_read_file(log);
    if (!gone)
        kill(child, SIGKILL); /* not ours to reap: capstan lock's child */
    cr_assert(gone, "the command ignoring SIGTERM still ran %.1f s after the lock was lost: %s", took, out);
    cr_assert_geq(took, 0.9, "killed before its grace (%.2f s): %s", took, out);
    cr_assert_eq(st, 70, "%s", out);
    cr_assert(strstr(out, "lost the lock stubborn") && strstr(out, "SIGKILL"), "%s", out);
    free(out);
    cr_assert_eq(capstan_qlock_release(c, r, &next, err), 0, "%s", err);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
    free(pidfile);
    free(log);
}

Test(qlock, capstan_lock_checks_kill_after)
{
    const char *bad[] = { "-1", "x", "5s", "301", "inf", "", NULL };
    for (int i = 0; bad[i]; i++) {
        char *out = NULL;
        cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "ka", "--kill-after", bad[i], "--", "true", NULL },
                                    &out), 64, "--kill-after '%s': %s", bad[i], out);
        cr_assert(strstr(out, "--kill-after"), "%s", out);
        free(out);
    }
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "ka", "--kill-after", "0", "--", "true", NULL }, &out), 0,
                 "%s", out);
    free(out);
}
