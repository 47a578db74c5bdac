/* Uniqueness housekeeping and visibility against a real redis-server: v9's
 * metrics hashes, the reaper (what it removes, what it keeps, its bounds and
 * leases, the until_expired score leak), `capstan locks` and the v8 -> v9
 * migration. Locks are written directly in v9's key format, as a Ruby
 * process would leave them. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "capstan/client.h"
#include "unique/admin.h"
#include "unique/admin_internal.h"
#include "redis/scripts.h"

TestSuite(unique_admin, .timeout = 60, .fini = kt_kill_children);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A lock as v9's lock.lua leaves it: metadata under the jid, the digest in
 * the index at score, and PEXPIRE when ttl_ms > 0. */
static void lock_v9(const char *digest, const char *jid, const char *type, double score,
                    long ttl_ms)
{
    char meta[512];
    snprintf(meta, sizeof(meta),
             "{\"worker\":\"MyJob\",\"queue\":\"default\",\"limit\":null,\"timeout\":0,"
             "\"ttl\":%s,\"type\":\"%s\",\"lock_args\":[1],\"time\":%.6f,\"at\":null}",
             ttl_ms > 0 ? "3600" : "null", type, score);
    freeReplyObject(kt_cmd("HSET %s:LOCKED %s %s", digest, jid, meta));
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests %.6f %s", score, digest));
    if (ttl_ms > 0)
        freeReplyObject(kt_cmd("PEXPIRE %s:LOCKED %ld", digest, ttl_ms));
}

static char *payload(const char *jid, const char *digest)
{
    char *p = malloc(512);
    snprintf(p, 512,
             "{\"retry\":true,\"queue\":\"x\",\"class\":\"MyJob\",\"args\":[1],\"jid\":\"%s\","
             "\"created_at\":1774912345.1,\"lock\":\"until_executed\",\"lock_digest\":\"%s\"}",
             jid, digest);
    return p;
}

static int in_index(const char *digest)
{
    redisReply *r = kt_cmd("ZSCORE uniquejobs:digests %s", digest);
    int yes = r->type == REDIS_REPLY_STRING;
    freeReplyObject(r);
    return yes;
}

static int has(capstan_reap_result_t *res, const char *digest)
{
    for (size_t i = 0; i < res->ndigests; i++)
        if (!strcmp(res->digests[i], digest))
            return 1;
    return 0;
}

/* ---- metrics ------------------------------------------------------------- */

Test(unique_admin, metrics_key_pads_the_minute_but_not_the_hour)
{
    struct tm tm = { .tm_year = 126, .tm_mon = 2, .tm_mday = 31, .tm_hour = 1, .tm_min = 5 };
    char key[64];
    capstan__unique_metrics_key(timegm(&tm), key, sizeof(key));
    cr_assert_str_eq(key, "uniquejobs:metrics|260331|1:05");
    tm.tm_hour = 13;
    tm.tm_min = 0;
    tm.tm_mon = 0;
    tm.tm_mday = 9;
    capstan__unique_metrics_key(timegm(&tm), key, sizeof(key));
    cr_assert_str_eq(key, "uniquejobs:metrics|260109|13:00");
}

Test(unique_admin, metric_writes_v9_fields_and_ttl)
{
    capstan_redis_t *r = kt_lib_redis();
    time_t t = time(NULL);
    char key[64];
    capstan__unique_metrics_key(t, key, sizeof(key));
    cr_assert_eq(capstan__unique_metric_at(r, "until_executed", "locked", t), 0);
    cr_assert_eq(capstan__unique_metric_at(r, "until_executed", "locked", t), 0);
    cr_assert_eq(capstan__unique_metric_at(r, "until_executed", "lock_failed", t), 0);
    cr_assert_eq(capstan__unique_metric_at(r, NULL, "unlocked", t), 0);
    cr_assert_eq(capstan__unique_metric_at(r, "x", "", t), CAPSTAN_EINVAL);
    cr_assert_eq(kt_int("HGET %s until_executed|locked", key), 2);
    cr_assert_eq(kt_int("HGET %s total|locked", key), 2);
    cr_assert_eq(kt_int("HGET %s until_executed|lock_failed", key), 1);
    cr_assert_eq(kt_int("HGET %s total|lock_failed", key), 1);
    cr_assert_eq(kt_int("HGET %s unknown|unlocked", key), 1);
    cr_assert_eq(kt_int("HLEN %s", key), 6);
    long long ttl = kt_int("TTL %s", key);
    cr_assert(ttl > 28790 && ttl <= 28800, "ttl %lld", ttl);

    /* The current-minute form writes the bucket of now. */
    time_t before = time(NULL);
    cr_assert_eq(capstan__unique_metric(r, "while_executing", "locked"), 0);
    time_t after = time(NULL);
    char k1[64], k2[64];
    capstan__unique_metrics_key(before, k1, sizeof(k1));
    capstan__unique_metrics_key(after, k2, sizeof(k2));
    cr_assert(kt_int("HGET %s while_executing|locked", k1) + (strcmp(k1, k2) ? kt_int("HGET %s while_executing|locked", k2) : 0) == 1);
    capstan_redis_free(r);
}

Test(unique_admin, buffered_metrics_are_written_by_the_flush_in_one_pipeline)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan__unique_metrics_buffer(1);
    time_t t0 = time(NULL);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(capstan__unique_metric_record(r, "until_executed", "locked"), 0);
    cr_assert_eq(capstan__unique_metric_record(r, "while_executing", "lock_failed"), 0);
    time_t t1 = time(NULL);
    char k0[64], k1[64];
    capstan__unique_metrics_key(t0, k0, sizeof(k0));
    capstan__unique_metrics_key(t1, k1, sizeof(k1));
    cr_assert_eq(kt_int("EXISTS %s", k0), 0, "nothing is written before the flush");
    cr_assert_eq(capstan__unique_metrics_flush(r), 0);
    long long locked = kt_int("HGET %s until_executed|locked", k0)
                     + (strcmp(k0, k1) ? kt_int("HGET %s until_executed|locked", k1) : 0);
    long long total = kt_int("HGET %s total|locked", k0)
                    + (strcmp(k0, k1) ? kt_int("HGET %s total|locked", k1) : 0);
    cr_assert_eq(locked, 3);
    cr_assert_eq(total, 3);
    cr_assert_eq(kt_int("HGET %s while_executing|lock_failed", k1)
                 + (strcmp(k0, k1) ? kt_int("HGET %s while_executing|lock_failed", k0) : 0), 1);
    long long ttl = kt_int("TTL %s", k1);
    cr_assert(ttl > 28790 && ttl <= 28800, "ttl %lld", ttl);
    cr_assert_eq(capstan__unique_metrics_flush(r), 0, "an empty flush is fine");
    cr_assert_eq(kt_int("HGET %s total|locked", k0) + (strcmp(k0, k1) ? kt_int("HGET %s total|locked", k1) : 0),
                 3, "and writes nothing twice");
    capstan__unique_metrics_buffer(0);
    capstan_redis_free(r);
}

static json_t *row_of(json_t *types, const char *type)
{
    size_t i;
    json_t *row;
    json_array_foreach(types, i, row)
        if (!strcmp(json_string_value(json_object_get(row, "type")), type))
            return row;
    return NULL;
}

Test(unique_admin, metrics_command_sums_the_last_hour_from_ruby_and_capstan)
{
    capstan_redis_t *r = kt_lib_redis();
    time_t t = time(NULL);
    char k5[64], k90[64];
    /* As a Ruby process writes them: five minutes ago, and an hour and a half
     * ago (outside the window). */
    capstan__unique_metrics_key(t - 5 * 60, k5, sizeof(k5));
    capstan__unique_metrics_key(t - 90 * 60, k90, sizeof(k90));
    freeReplyObject(kt_cmd("HINCRBY %s while_executing|locked 3", k5));
    freeReplyObject(kt_cmd("HINCRBY %s total|locked 3", k5));
    freeReplyObject(kt_cmd("HINCRBY %s until_executed|execution_failed 1", k5));
    freeReplyObject(kt_cmd("HINCRBY %s until_executed|unlock_failed 2", k5));
    freeReplyObject(kt_cmd("HINCRBY %s total|execution_failed 1", k5));
    freeReplyObject(kt_cmd("HINCRBY %s total|unlock_failed 2", k5));
    freeReplyObject(kt_cmd("EXPIRE %s 28800", k5));
    freeReplyObject(kt_cmd("HINCRBY %s until_executed|locked 100", k90));
    freeReplyObject(kt_cmd("HINCRBY %s total|locked 100", k90));
    /* And by capstan, now. */
    cr_assert_eq(capstan__unique_metric_at(r, "until_executed", "locked", t), 0);
    cr_assert_eq(capstan__unique_metric_at(r, "until_executed", "lock_failed", t), 0);
    cr_assert_eq(capstan__unique_metric_at(r, "until_executed", "unlocked", t), 0);

    capstan_unique_metrics_t m;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__unique_metrics_read(r, 60, &m, err), 0, "%s", err);
    cr_assert_eq(m.n, 3);
    cr_assert_str_eq(m.rows[2].type, "total", "total comes last");
    capstan__unique_metrics_clear(&m);
    capstan_redis_free(r);

    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "metrics", "--json", NULL }, &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    json_t *types = json_object_get(j, "types");
    json_t *ue = row_of(types, "until_executed"), *we = row_of(types, "while_executing"),
           *tot = row_of(types, "total");
    cr_assert(ue && we && tot, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(ue, "acquired")), 1, "the 90-minute-old bucket is outside: %s", out);
    cr_assert_eq(json_integer_value(json_object_get(ue, "denied")), 1);
    cr_assert_eq(json_integer_value(json_object_get(ue, "released")), 1);
    cr_assert_eq(json_integer_value(json_object_get(ue, "failures")), 3);
    cr_assert_eq(json_integer_value(json_object_get(we, "acquired")), 3);
    cr_assert_eq(json_integer_value(json_object_get(tot, "acquired")), 4);
    cr_assert_eq(json_integer_value(json_object_get(tot, "failures")), 3);
    json_decref(j);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "metrics", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "ACQUIRED") && strstr(out, "DENIED") && strstr(out, "RELEASED")
              && strstr(out, "FAILURES"), "%s", out);
    cr_assert(strstr(out, "while_executing"), "%s", out);
    free(out);
}

/* ---- reaper --------------------------------------------------------------- */

#define J(n) "aaaaaaaaaaaaaaaaaaaaaa" #n

Test(unique_admin, reaper_removes_orphans_and_keeps_every_live_holder)
{
    double old = now_s() - 300;
    /* Orphans. */
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests %.6f uniquejobs:stale", old));
    lock_v9("uniquejobs:nowhere", J(00), "until_executed", old, 0);
    lock_v9("uniquejobs:deadproc", J(06), "until_executed", old, 0);
    /* Live: queue, schedule, retry, working list, live process's work hash. */
    lock_v9("uniquejobs:queued", J(01), "until_executed", old, 0);
    char *p1 = payload(J(01), "uniquejobs:queued");
    freeReplyObject(kt_cmd("SADD queues x"));
    freeReplyObject(kt_cmd("LPUSH queue:x %s", p1));
    lock_v9("uniquejobs:scheduled", J(02), "until_executed", old, 0);
    char *p2 = payload(J(02), "uniquejobs:scheduled");
    freeReplyObject(kt_cmd("ZADD schedule %.6f %s", now_s() + 3600, p2));
    lock_v9("uniquejobs:retrying", J(03), "until_executed", old, 0);
    char *p3 = payload(J(03), "uniquejobs:retrying");
    freeReplyObject(kt_cmd("ZADD retry %.6f %s", now_s() + 60, p3));
    lock_v9("uniquejobs:inworking", J(04), "until_executed", old, 0);
    char *p4 = payload(J(04), "uniquejobs:inworking");
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:host:1:0123456789ab %s", p4));
    lock_v9("uniquejobs:running:RUN", J(05), "while_executing", old, 0);
    char *p5 = payload(J(05), "uniquejobs:running:RUN");
    json_t *work = json_pack("{s:s, s:s, s:i}", "queue", "x", "payload", p5, "run_at", 1774912345);
    char *w5 = json_dumps(work, JSON_COMPACT);
    freeReplyObject(kt_cmd("SADD processes live:1:abc"));
    freeReplyObject(kt_cmd("HSET live:1:abc beat 1"));
    freeReplyObject(kt_cmd("HSET live:1:abc:work tid1 %s", w5));
    /* A process that is gone (no <identity> hash): its work does not count. */
    char *p6 = payload(J(06), "uniquejobs:deadproc");
    json_t *work6 = json_pack("{s:s, s:s, s:i}", "queue", "x", "payload", p6, "run_at", 1774912345);
    char *w6 = json_dumps(work6, JSON_COMPACT);
    freeReplyObject(kt_cmd("SADD processes gone:2:def"));
    freeReplyObject(kt_cmd("HSET gone:2:def:work tid2 %s", w6));
    /* Young: locked a moment ago, its job maybe not pushed yet. */
    lock_v9("uniquejobs:young", J(07), "until_executed", now_s(), 0);

    capstan_redis_t *r = kt_lib_redis();
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    capstan_reap_result_t res;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.busy, 0);
    cr_assert_eq(res.removed, 3, "removed %ld", res.removed);
    cr_assert_eq(res.stale, 1);
    cr_assert(has(&res, "uniquejobs:stale") && has(&res, "uniquejobs:nowhere")
              && has(&res, "uniquejobs:deadproc"));
    cr_assert_eq(res.wrapped, 1);
    cr_assert_eq(res.examined, 9);
    cr_assert_eq(kt_int("EXISTS uniquejobs:nowhere:LOCKED uniquejobs:deadproc:LOCKED"), 0);
    const char *kept[] = { "uniquejobs:queued", "uniquejobs:scheduled", "uniquejobs:retrying",
                           "uniquejobs:inworking", "uniquejobs:running:RUN", "uniquejobs:young" };
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
        cr_assert(in_index(kept[i]), "%s kept in the index", kept[i]);
        cr_assert_eq(kt_int("EXISTS %s:LOCKED", kept[i]), 1, "%s kept", kept[i]);
    }
    cr_assert_eq(kt_int("EXISTS capstan:reaper:running"), 0, "the run lease is given back");
    capstan__reap_result_clear(&res);

    /* Once the job is finished everywhere, the next run frees its lock. */
    freeReplyObject(kt_cmd("DEL queue:x"));
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.removed, 1);
    cr_assert(has(&res, "uniquejobs:queued"));
    capstan__reap_result_clear(&res);

    json_decref(work);
    json_decref(work6);
    free(w5); free(w6);
    free(p1); free(p2); free(p3); free(p4); free(p5); free(p6);
    capstan_redis_free(r);
}

/* A queue name longer than any fixed key buffer: the push lands in the whole
 * name's queue, and the reaper finds the holder there. */
Test(unique_admin, reaper_keeps_a_lock_whose_job_waits_in_a_long_named_queue)
{
    char name[601];
    memset(name, 'q', 600);
    name[600] = '\0';
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    capstan_push_opts_t po = capstan_push_opts_default();
    po.queue = name;
    char jid[25];
    cr_assert_eq(capstan_client_push(c, "RecordJob", "[\"long\"]", &po, jid), 0, "%s",
                 capstan_client_error(c));
    capstan_client_free(c);
    cr_assert_eq(kt_int("LLEN queue:%s", name), 1, "pushed to the whole name's queue");
    double old = now_s() - 300;
    lock_v9("uniquejobs:longqueue", jid, "until_executed", old, 0);

    capstan_redis_t *r = kt_lib_redis();
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    capstan_reap_result_t res;
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.removed, 0, "removed %ld", res.removed);
    cr_assert(in_index("uniquejobs:longqueue"));
    capstan__reap_result_clear(&res);
    capstan_redis_free(r);
}

Test(unique_admin, reaper_rechecks_a_batch_atomically)
{
    /* The reap script is the last word: a lock whose holder changed, or
     * whose job reached a working list, after the sweep is kept. */
    double old = now_s() - 300;
    lock_v9("uniquejobs:relocked", J(10), "until_executed", old, 0);
    lock_v9("uniquejobs:moved", J(11), "until_executed", old, 0);
    freeReplyObject(kt_cmd("HSET uniquejobs:relocked:LOCKED %s {}", J(12)));
    char *p = payload(J(11), "uniquejobs:moved");
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:h:2:000000000000 %s", p));
    const char *argv[] = { "uniquejobs:digests", "processes", "queues",
                           "uniquejobs:working:h:2:000000000000", "uniquejobs:relocked:LOCKED",
                           "uniquejobs:moved:LOCKED", "100",
                           "uniquejobs:relocked", "1", J(10),
                           "uniquejobs:moved", "1", J(11) };
    capstan_redis_t *r = kt_lib_redis();
    redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_REAP, 6, 13, argv, NULL);
    cr_assert(rep && rep->type == REDIS_REPLY_ARRAY, "%s", rep && rep->str ? rep->str : "");
    cr_assert_eq(rep->elements, 0);
    freeReplyObject(rep);
    cr_assert(in_index("uniquejobs:relocked") && in_index("uniquejobs:moved"));
    free(p);
    capstan_redis_free(r);
}

static void many_orphans(int n, double base)
{
    redisContext *c = kt_redis();
    for (int i = 0; i < n; i++) {
        if (i % 2)
            redisAppendCommand(c, "HSET uniquejobs:o%05d:LOCKED jid%05d {}", i, i);
        else
            redisAppendCommand(c, "PING");
        redisAppendCommand(c, "ZADD uniquejobs:digests %.6f uniquejobs:o%05d", base + i * 0.001, i);
    }
    for (int i = 0; i < 2 * n; i++) {
        redisReply *rep = NULL;
        cr_assert_eq(redisGetReply(c, (void **)&rep), REDIS_OK);
        freeReplyObject(rep);
    }
}

Test(unique_admin, reaper_stops_at_the_count_and_the_next_run_continues)
{
    many_orphans(5000, now_s() - 3600);
    capstan_redis_t *r = kt_lib_redis();
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    capstan_reap_result_t res;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.removed, 1000, "removed %ld", res.removed);
    cr_assert_eq(res.wrapped, 0);
    cr_assert(has(&res, "uniquejobs:o00000") && has(&res, "uniquejobs:o00999"));
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 4000);
    capstan__reap_result_clear(&res);

    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.removed, 1000);
    cr_assert(has(&res, "uniquejobs:o01000") && has(&res, "uniquejobs:o01999"),
              "the second run continues where the first stopped");
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 3000);
    cr_assert_eq(kt_int("EXISTS uniquejobs:o01001:LOCKED"), 0);
    capstan__reap_result_clear(&res);

    /* A tiny time budget stops a run early, without error. */
    o.timeout = 0.000001;
    o.count = 100000;
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.timed_out, 1);
    cr_assert(res.removed < 3000, "removed %ld", res.removed);
    capstan__reap_result_clear(&res);

    /* Unbounded, everything goes and the walk wraps. */
    o.timeout = 20;
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.wrapped, 1);
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 0);
    cr_assert_eq(kt_int("EXISTS capstan:reaper:cursor"), 0);
    capstan__reap_result_clear(&res);
    capstan_redis_free(r);
}

Test(unique_admin, leases_keep_reapers_apart)
{
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests %.6f uniquejobs:stale", now_s() - 300));
    capstan_redis_t *r = kt_lib_redis();
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    capstan_reap_result_t res;
    char err[CAPSTAN_ERRLEN];

    /* Another run in progress. */
    freeReplyObject(kt_cmd("SET capstan:reaper:running other:1 PX 20000"));
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.busy, 1);
    cr_assert_str_eq(res.holder, "other:1");
    cr_assert_eq(res.removed, 0);
    cr_assert(in_index("uniquejobs:stale"));
    capstan__reap_result_clear(&res);
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "reap", NULL }, &out), 3, "%s", out);
    cr_assert(strstr(out, "another reaper is running"), "%s", out);
    free(out);

    /* A Ruby process holds v9's reaper role (its pid). */
    freeReplyObject(kt_cmd("DEL capstan:reaper:running"));
    freeReplyObject(kt_cmd("SET uniquejobs:reaper 4242 EX 612"));
    o.owner = "me:1:abc";
    o.role_ttl = 612;
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.busy, 1);
    cr_assert_str_eq(res.holder, "4242");
    cr_assert(in_index("uniquejobs:stale"));
    capstan__reap_result_clear(&res);

    /* Free: we take the role for interval + 2 %, and keep it next time. */
    freeReplyObject(kt_cmd("DEL uniquejobs:reaper"));
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.busy, 0);
    cr_assert_eq(res.removed, 1);
    capstan__reap_result_clear(&res);
    char *holder = kt_str("GET uniquejobs:reaper");
    cr_assert_str_eq(holder, "me:1:abc");
    free(holder);
    long long ttl = kt_int("TTL uniquejobs:reaper");
    cr_assert(ttl > 600 && ttl <= 612, "ttl %lld", ttl);
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.busy, 0);
    capstan__reap_result_clear(&res);
    /* Someone else's release does nothing; ours frees it. */
    cr_assert_eq(capstan__unique_reaper_release(r, "4242"), 0);
    cr_assert_eq(kt_int("EXISTS uniquejobs:reaper"), 1);
    cr_assert_eq(capstan__unique_reaper_release(r, "me:1:abc"), 0);
    cr_assert_eq(kt_int("EXISTS uniquejobs:reaper"), 0);
    capstan_redis_free(r);
}

Test(unique_admin, reaper_fixes_the_until_expired_score_leak)
{
    double now = now_s();
    /* v9 scores an until_expired lock with a TTL at now + ttl in ms: about
     * 114 years ahead for a day. Its hash has expired; v9 never reaps it. */
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests %.6f uniquejobs:leaked", now + 86400000.0));
    /* Live until_expired: its hash still has a TTL, its job long gone. Kept
     * until Redis expires it, whatever the score. */
    lock_v9("uniquejobs:expiring", J(20), "until_expired", now - 300, 3600000);
    lock_v9("uniquejobs:expiring_future", J(21), "until_expired", now + 3600000.0, 3600000);
    /* until_expired without a TTL: freed once the job is gone, as in v9. */
    lock_v9("uniquejobs:forever", J(22), "until_expired", now - 300, 0);

    capstan_redis_t *r = kt_lib_redis();
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    capstan_reap_result_t res;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.removed, 2, "removed %ld", res.removed);
    cr_assert(has(&res, "uniquejobs:leaked") && has(&res, "uniquejobs:forever"));
    cr_assert(in_index("uniquejobs:expiring") && in_index("uniquejobs:expiring_future"));
    cr_assert_eq(kt_int("EXISTS uniquejobs:expiring:LOCKED"), 1);
    capstan__reap_result_clear(&res);

    /* When Redis expires the hash, the next run frees the entry. */
    freeReplyObject(kt_cmd("PEXPIRE uniquejobs:expiring_future:LOCKED 1"));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS uniquejobs:expiring_future:LOCKED") == 0, 5));
    cr_assert_eq(capstan__unique_reap(r, &o, &res, err), 0, "%s", err);
    cr_assert_eq(res.removed, 1);
    cr_assert(has(&res, "uniquejobs:expiring_future"));
    capstan__reap_result_clear(&res);
    capstan_redis_free(r);
}

Test(unique_admin, housekeeper_runs_the_reaper_on_its_interval)
{
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests %.6f uniquejobs:stale", now_s() - 300));
    char *cfg = kt_tmp("reaper.yml");
    FILE *f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fputs("heartbeat_interval: 1\nliveness_ttl: 10\nreaper_interval: 1\nreaper_count: 10\n"
          "reaper_timeout: 2\n", f);
    fclose(f);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD uniquejobs:digests") == 0, 15),
              "the housekeeper reaped: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    cr_assert_eq(kt_int("EXISTS uniquejobs:reaper"), 0, "the role is given up at exit");
    free(cfg);
}

/* ---- capstan locks ------------------------------------------------------------ */

#define D1 "uniquejobs:0f3a5b6c7d8e9f00112233445566778"

Test(unique_admin, locks_list_info_delete)
{
    double now = now_s();
    lock_v9(D1, J(30), "until_executed", now - 42, 3600000);
    lock_v9(D1 ":RUN", J(30), "until_and_while_executing", now - 40, 0);
    lock_v9("other:abc", J(31), "while_executing", now - 5, 0);

    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "list", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, D1) && strstr(out, "until_executed") && strstr(out, J(30))
              && strstr(out, "other:abc") && strstr(out, "3 locks"), "%s", out);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "list", "--json", "uniquejobs:*", NULL },
                                &out), 0, "%s", out);
    json_t *rows = json_loads(out, 0, NULL);
    cr_assert(json_is_array(rows), "%s", out);
    cr_assert_eq(json_array_size(rows), 2, "the pattern filters: %s", out);
    size_t i;
    json_t *row;
    int seen = 0;
    json_array_foreach(rows, i, row) {
        if (strcmp(json_string_value(json_object_get(row, "digest")), D1))
            continue;
        seen = 1;
        cr_assert_str_eq(json_string_value(json_object_get(row, "type")), "until_executed");
        cr_assert_str_eq(json_string_value(json_array_get(json_object_get(row, "holders"), 0)), J(30));
        double ttl = json_number_value(json_object_get(row, "ttl"));
        double age = json_number_value(json_object_get(row, "age"));
        cr_assert(ttl > 3500 && ttl <= 3600, "ttl %f", ttl);
        cr_assert(age > 40 && age < 100, "age %f", age);
    }
    cr_assert(seen);
    json_decref(rows);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "info", D1, NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, D1 ":LOCKED") && strstr(out, D1 ":RUN:LOCKED") && strstr(out, J(30))
              && strstr(out, "\"worker\":\"MyJob\"") && strstr(out, "until_executed"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "info", "--json", D1 ":LOCKED", NULL }, &out),
                 0, "%s", out);
    json_t *info = json_loads(out, 0, NULL);
    cr_assert_not_null(info, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(info, "digest")), D1, "a :LOCKED suffix is accepted");
    cr_assert_not_null(json_object_get(json_object_get(json_object_get(info, "run_lock"), "holders"), J(30)));
    json_decref(info);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "delete", D1, NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "deleted " D1), "%s", out);
    free(out);
    cr_assert_eq(kt_int("EXISTS " D1 ":LOCKED " D1 ":RUN:LOCKED"), 0);
    cr_assert(!in_index(D1) && !in_index(D1 ":RUN"));
    cr_assert(in_index("other:abc"), "other locks untouched");

    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "delete", D1, NULL }, &out), 1, "%s", out);
    cr_assert(strstr(out, "no lock with digest"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "info", D1, NULL }, &out), 1, "%s", out);
    cr_assert(strstr(out, "no lock with digest"), "%s", out);
    free(out);
}

Test(unique_admin, locks_reap_prints_what_it_removed)
{
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests %.6f uniquejobs:gone1", now_s() - 300));
    lock_v9("uniquejobs:gone2", J(40), "until_executed", now_s() - 300, 0);
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "reap", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "uniquejobs:gone1\n") && strstr(out, "uniquejobs:gone2\n")
              && strstr(out, "removed 2 orphaned locks"), "%s", out);
    free(out);
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 0);
}

Test(unique_admin, locks_rejects_bad_input_clearly)
{
    struct { const char *args[6]; int status; const char *says; } cases[] = {
        { { "locks", "info", "not a digest", NULL }, 64, "not allowed" },
        { { "locks", "delete", "", NULL }, 64, "empty" },
        { { "locks", "delete", "uniquejobs:*", NULL }, 64, "not allowed" },
        { { "locks", "delete", "garbage", NULL }, 64, "not a digest" },
        { { "locks", "delete", "uniquejobs:\x01", NULL }, 64, "not allowed" },
        { { "locks", "delete", NULL }, 64, "missing DIGEST" },
        { { "locks", "frobnicate", NULL }, 64, "unknown command" },
        { { "locks", "list", "--limit", "x", NULL }, 64, "integer" },
        { { "locks", "reap", "--timeout", "-1", NULL }, 64, "seconds" },
        { { "locks", "metrics", "extra", NULL }, 64, "unexpected argument" },
        { { "locks", "info", "uniquejobs:nope", NULL }, 1, "no lock with digest" },
        { { "locks", NULL }, 64, "Usage" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out = NULL;
        int st = kt_capstan_run(cases[i].args, &out);
        cr_assert_eq(st, cases[i].status, "case %zu: status %d: %s", i, st, out);
        cr_assert(strstr(out, cases[i].says), "case %zu: %s", i, out);
        free(out);
    }
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "reap", "--help", NULL }, &out), 0);
    cr_assert(strstr(out, "Usage: capstan locks"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "list", "--redis-url", "redis://127.0.0.1:1/0", NULL }, &out), 1);
    cr_assert(strstr(out, "capstan locks list:"), "%s", out);
    free(out);

    /* The library says the same. */
    char d[600], err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__unique_digest_parse("uniquejobs:abc:LOCKED", d, sizeof(d), err), 0);
    cr_assert_str_eq(d, "uniquejobs:abc");
    cr_assert_eq(capstan__unique_digest_parse(":abc", d, sizeof(d), err), CAPSTAN_EINVAL);
    cr_assert_eq(capstan__unique_digest_parse(NULL, d, sizeof(d), err), CAPSTAN_EINVAL);
}

/* ---- v8 -> v9 ---------------------------------------------------------------- */

Test(unique_admin, upgrade_migrates_a_v8_layout_once)
{
    const char *d = "uniquejobs:8a8a8a";
    freeReplyObject(kt_cmd("SET %s %s", d, J(50)));
    freeReplyObject(kt_cmd("HSET %s:LOCKED %s 1774912345.123", d, J(50)));
    freeReplyObject(kt_cmd("LPUSH %s:QUEUED %s", d, J(50)));
    freeReplyObject(kt_cmd("LPUSH %s:PRIMED %s", d, J(50)));
    freeReplyObject(kt_cmd("SET %s:INFO {\"worker\":\"MyJob\"}", d));
    freeReplyObject(kt_cmd("SET %s:RUN %s", d, J(50)));
    freeReplyObject(kt_cmd("LPUSH %s:RUN:QUEUED %s", d, J(50)));
    freeReplyObject(kt_cmd("LPUSH %s:RUN:PRIMED %s", d, J(50)));
    freeReplyObject(kt_cmd("SET %s:RUN:INFO {}", d));
    freeReplyObject(kt_cmd("HSET %s:RUN:LOCKED %s 1774912345.2", d, J(50)));
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests 1774912345.123 %s", d));
    /* A while_executing job of v8: only a runtime lock. */
    freeReplyObject(kt_cmd("HSET uniquejobs:7b7b:RUN:LOCKED %s 1774912345.3", J(51)));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:7b7b:RUN:QUEUED %s", J(51)));
    /* v8 kept until_expired digests in a set of their own. */
    freeReplyObject(kt_cmd("ZADD uniquejobs:expiring_digests 1774915945.5 uniquejobs:6c6c"));
    freeReplyObject(kt_cmd("HSET uniquejobs:6c6c:LOCKED %s 1774912345.4", J(52)));

    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "upgrade", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "upgraded:"), "%s", out);
    free(out);
    const char *gone[] = { "", ":QUEUED", ":PRIMED", ":INFO", ":RUN", ":RUN:QUEUED", ":RUN:PRIMED",
                           ":RUN:INFO" };
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        cr_assert_eq(kt_int("EXISTS %s%s", d, gone[i]), 0, "%s%s removed", d, gone[i]);
    cr_assert_eq(kt_int("EXISTS uniquejobs:7b7b:RUN:QUEUED"), 0);
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d, J(50)), 1, "the lock is kept");
    cr_assert_eq(kt_int("HEXISTS %s:RUN:LOCKED %s", d, J(50)), 1, "a running job's runtime lock is kept");
    cr_assert(in_index(d) && in_index("uniquejobs:8a8a8a:RUN") && in_index("uniquejobs:7b7b:RUN"),
              "runtime locks are indexed so the reaper can free them");
    redisReply *sc = kt_cmd("ZSCORE uniquejobs:digests uniquejobs:6c6c");
    cr_assert(sc->type == REDIS_REPLY_STRING && atof(sc->str) == 1774915945.5, "expiring merged");
    freeReplyObject(sc);
    cr_assert_eq(kt_int("EXISTS uniquejobs:expiring_digests"), 0);
    char *mark = kt_str("HGET uniquejobs:live:UPGRADED 9.0.0.alpha1");
    cr_assert_not_null(mark);
    cr_assert(atof(mark) > 1.7e9, "%s", mark);
    free(mark);

    /* Idempotent: the marker stops a second pass. */
    freeReplyObject(kt_cmd("LPUSH %s:QUEUED %s", d, J(50)));
    cr_assert_eq(kt_capstan_run((const char *[]){ "locks", "upgrade", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "already upgraded"), "%s", out);
    free(out);
    cr_assert_eq(kt_int("EXISTS %s:QUEUED", d), 1);
}

Test(unique_admin, upgrade_skips_a_legacy_layout_as_v9)
{
    freeReplyObject(kt_cmd("SET uniquejobs:dead 1"));
    freeReplyObject(kt_cmd("HSET uniquejobs:1a:LOCKED %s 1", J(60)));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:1a:QUEUED %s", J(60)));
    capstan_redis_t *r = kt_lib_redis();
    capstan_upgrade_result_t u;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__unique_upgrade(r, &u, err), 0, "%s", err);
    cr_assert_eq(u.legacy, 1);
    cr_assert_eq(kt_int("EXISTS uniquejobs:1a:QUEUED"), 1);
    cr_assert_eq(kt_int("EXISTS uniquejobs:live:UPGRADED"), 0);
    capstan_redis_free(r);
}
