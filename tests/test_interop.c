/* Sidekiq-compatibility acceptance tests of the runtime core: real Ruby
 * Sidekiq (6.4.1, 7.3.10, 8.0.10 and 8.1.7 where KT_SIDEKIQ_TEST runs a test for
 * each) pushes jobs and reads back what capstan wrote (Stats, ProcessSet,
 * WorkSet, RetrySet, DeadSet, the Web UI's Quiet/Stop through the API),
 * and a real Sidekiq server runs jobs pushed by capstan's client. Each test asserts
 * what a Sidekiq user would see, on the exact Redis bytes where Ruby's
 * parsing would hide a difference (big integers, unknown fields,
 * timestamp formats). */
#include <ctype.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fetch/fetch.h"
#include "helpers.h"

#define BIGINT "123456789012345678901234567890"

TestSuite(interop, .timeout = 90, .fini = kt_kill_children);


/* Stops capstan with sig and asserts it exits 0 within timeout. */
static void capstan_stop_ok(pid_t pid, int sig, double timeout)
{
    int st = kt_capstan_stop(pid, sig, timeout);
    kt_untrack(pid);
    char *log = kt_capstan_log(pid);
    cr_assert_eq(st, 0, "capstan exits 0 (got %d): %s", st, log);
    free(log);
}

/* Runs tests/ruby/sidekiq.rb with args and returns its JSON output. */
static json_t *ruby(const char *const *args)
{
    char *out = NULL;
    int st = kt_ruby("sidekiq.rb", args, &out);
    cr_assert_eq(st, 0, "sidekiq.rb %s exited %d: %s", args[0], st, out);
    json_error_t e;
    json_t *v = json_loads(out, JSON_DECODE_ANY, &e);
    cr_assert(v, "sidekiq.rb %s printed no JSON (%s): %s", args[0], e.text, out);
    free(out);
    return v;
}
#define RUBY(...) ruby((const char *[]){ __VA_ARGS__, NULL })

/* Runs tests/ruby/sidekiq.rb under Sidekiq version; returns its JSON. */
static json_t *ruby_v(const char *version, const char *const *args)
{
    char *out = NULL;
    int st = kt_ruby_v(version, "sidekiq.rb", args, &out);
    cr_assert_eq(st, 0, "sidekiq.rb %s under %s exited %d: %s", args[0], version, st, out);
    json_t *v = json_loads(out, JSON_DECODE_ANY, NULL);
    cr_assert(v, "sidekiq.rb %s under %s printed no JSON: %s", args[0], version, out);
    free(out);
    return v;
}
/* RUBY under the Sidekiq version of a KT_SIDEKIQ_TEST (its `sidekiq`). */
#define RUBY_V(...) ruby_v(sidekiq, (const char *[]){ __VA_ARGS__, NULL })

/* Whether Sidekiq version writes and reads integer-millisecond timestamps
 * (8.x) rather than float seconds (6.4, 7.3). */
static int writes_ms(const char *version)
{
    return version[0] >= '8';
}

/* Pushes one job with Sidekiq::Client.push of version; returns its jid
 * (malloc'd). */
static char *ruby_push_v(const char *version, const char *job)
{
    json_t *v = ruby_v(version, (const char *[]){ "push", job, NULL });
    cr_assert(json_is_string(v) && strlen(json_string_value(v)) == 24, "push returned a jid");
    char *jid = strdup(json_string_value(v));
    json_decref(v);
    return jid;
}
#define ruby_push(job) ruby_push_v(KT_SIDEKIQ_DEBIAN, job)

/* Runs `capstan push args...` and returns the printed jid (malloc'd). */
static char *capstan_push(const char *const *args)
{
    char *out = NULL;
    int st = kt_capstan_run(args, &out);
    cr_assert_eq(st, 0, "capstan push exited %d: %s", st, out);
    out[strcspn(out, "\n")] = '\0';
    cr_assert_eq(strlen(out), 24, "capstan push prints a jid: %s", out);
    return out;
}

static int hash_field_is(const char *key, const char *field, const char *want)
{
    char *v = kt_str("HGET %s %s", key, field);
    int eq = v && strcmp(v, want) == 0;
    free(v);
    return eq;
}

/* The raw text of the number after "key": in a payload (malloc'd), or
 * NULL. The keys asked for occur only at the top level of these payloads. */
static char *number_literal(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p)
        return NULL;
    p += strlen(pat);
    size_t n = strspn(p, "0123456789.eE+-");
    return n ? strndup(p, n) : NULL;
}

/* The one member of a sorted set, as stored (malloc'd). */
static char *only_member(const char *key, double *score)
{
    redisReply *r = kt_cmd("ZRANGE %s 0 -1 WITHSCORES", key);
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 2, "%s holds one member (%zu)", key,
              r->type == REDIS_REPLY_ARRAY ? r->elements / 2 : 0);
    char *m = strndup(r->element[0]->str, r->element[0]->len);
    if (score)
        *score = atof(r->element[1]->str);
    freeReplyObject(r);
    return m;
}

/* Whether any member of a sorted set contains needle. */
static int zset_has(const char *key, const char *needle)
{
    redisReply *r = kt_cmd("ZRANGE %s 0 -1", key);
    int found = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        found |= strstr(r->element[i]->str, needle) != NULL;
    freeReplyObject(r);
    return found;
}

static const char *str_of(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static double num_of(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "%s is a number", key);
    return json_number_value(v);
}

/* A timestamp of a RetrySet/DeadSet entry (sidekiq.rb's entries) in
 * seconds, as that Sidekiq's API reads it. */
static double secs_of(json_t *entry, const char *key)
{
    return num_of(json_object_get(entry, "seconds"), key);
}

/* Whether a raw timestamp of a payload is in version's unit: an Integer
 * (ms) for 8.0, a Float (s) before. */
static int in_unit_of(const char *version, json_t *v)
{
    return writes_ms(version) ? json_is_integer(v) : json_is_real(v);
}

/* Sidekiq's client of each version pushes (now, in bulk, in 3 s), capstan
 * runs the jobs, and that version's Stats counts them. */
KT_SIDEKIQ_TEST(interop, ruby_push_bulk_and_scheduled_jobs_run_and_stats_count_them)
{
    char *jid = ruby_push_v(sidekiq, "{\"class\":\"RecordJob\",\"args\":[\"rec\"]}");
    json_t *bulk = RUBY_V("push_bulk", "{\"class\":\"RecordJob\",\"args\":[[\"rec\"],[\"rec\"],[\"rec\"]]}");
    cr_assert_eq(json_array_size(bulk), 3);
    json_t *sched = RUBY_V("push_in", "3", "{\"class\":\"RecordJob\",\"args\":[\"rec\"]}");
    cr_assert(json_is_string(sched));
    double at;
    char *member = only_member("schedule", &at);
    cr_assert(strstr(member, json_string_value(sched)));
    free(member);

    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") >= 4, 20), "the queued jobs ran: %s", kt_capstan_log(pid));
    if (kt_wall() < at - 0.3)
        cr_assert_eq(kt_int("SISMEMBER rec %s", json_string_value(sched)), 0,
                     "the scheduled job does not run before its time");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == 5 && kt_int("LLEN rec:log") >= 5, 20),
              "the scheduled job ran: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SISMEMBER rec %s", jid), 1);
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(kt_int("SISMEMBER rec %s", json_string_value(json_array_get(bulk, i))), 1);
    cr_assert_eq(kt_int("SISMEMBER rec %s", json_string_value(sched)), 1);
    cr_assert_eq(kt_int("LLEN rec:log"), 5, "each job ran once");
    cr_assert_eq(kt_int("ZCARD schedule"), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);

    /* Counters reach Redis with the beats, not only at exit. */
    cr_assert(KT_WAIT_UNTIL(kt_int("GET stat:processed") == 5, 10), "stats flushed while running");
    char day[16], key[48];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(day, sizeof(day), "%Y-%m-%d", &tm);
    snprintf(key, sizeof(key), "stat:processed:%s", day);
    cr_assert_gt(kt_int("TTL %s", key), 157680000 - 60, "daily stats kept 5 years, as Sidekiq");
    capstan_stop_ok(pid, SIGTERM, 30);

    json_t *stats = RUBY_V("stats");
    cr_assert_eq(num_of(stats, "processed"), 5);
    cr_assert_eq(num_of(stats, "failed"), 0);
    cr_assert_eq(num_of(stats, "history_processed"), 5, "Stats::History shows today's count");
    cr_assert_eq(num_of(stats, "history_failed"), 0);
    cr_assert_eq(num_of(stats, "enqueued"), 0);
    cr_assert_eq(num_of(stats, "scheduled_size"), 0);
    cr_assert_eq(num_of(stats, "processes_size"), 0);
    json_decref(stats);
    json_decref(bulk);
    json_decref(sched);
    free(cfg);
    free(jid);
}

/* ProcessSet and WorkSet (Workers in 6.4; a Sidekiq::Work from 7.0) of
 * each version show a running capstan and its busy jobs. */
KT_SIDEKIQ_TEST(interop, process_set_and_workers_show_the_running_process)
{
    char *jc = ruby_push_v(sidekiq, "{\"class\":\"SleepJob\",\"args\":[8000],\"queue\":\"critical\"}");
    char *jd = ruby_push_v(sidekiq, "{\"class\":\"SleepJob\",\"args\":[8000]}");
    char *cfg = kt_write_conf(NULL);
    double t0 = kt_wall();
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "3", "-q", "critical,2", "-q", "default",
                                            "-g", "mytag", "--label", "lbl1", NULL });
    char *id = kt_wait_identity(pid);
    cr_assert(KT_WAIT_UNTIL(hash_field_is(id, "busy", "2"), 15), "both jobs show as busy: %s",
              kt_capstan_log(pid));

    char host[256], want_prefix[300];
    const char *dyno = getenv("DYNO");
    if (dyno && *dyno)
        snprintf(host, sizeof(host), "%s", dyno);
    else
        gethostname(host, sizeof(host));
    /* The worker is the supervisor's child: its own pid names it. */
    pid_t wpid = (pid_t)atoi(strchr(id + strlen(host), ':') + 1);
    cr_assert_eq(kt_parent_pid(wpid), pid, "identity %s names a worker of %d", id, (int)pid);
    snprintf(want_prefix, sizeof(want_prefix), "%s:%d:", host, (int)wpid);
    cr_assert(strncmp(id, want_prefix, strlen(want_prefix)) == 0, "identity %s is host:pid:nonce", id);
    const char *nonce = id + strlen(want_prefix);
    cr_assert_eq(strlen(nonce), 12, "12 hex nonce: %s", id);
    for (int i = 0; i < 12; i++)
        cr_assert(isxdigit((unsigned char)nonce[i]) && !isupper((unsigned char)nonce[i]), "%s", id);

    json_t *procs = RUBY_V("processes");
    cr_assert_eq(json_array_size(procs), 1);
    json_t *p = json_array_get(procs, 0);
    cr_assert_str_eq(str_of(p, "identity"), id);
    cr_assert_str_eq(str_of(p, "hostname"), host);
    cr_assert_eq(num_of(p, "pid"), wpid);
    cr_assert_eq(num_of(p, "concurrency"), 3);
    json_t *q = json_object_get(p, "queues");
    cr_assert_eq(json_array_size(q), 2);
    cr_assert_str_eq(json_string_value(json_array_get(q, 0)), "critical");
    cr_assert_str_eq(json_string_value(json_array_get(q, 1)), "default");
    /* What the Busy page's Queues line and Process#queues/#weights read
     * from 8.0.9 on: the "capsules" element, Sidekiq's own weights (0 for
     * a queue given without one). */
    json_t *caps = json_loads("{\"default\":{\"concurrency\":3,\"mode\":\"weighted\","
                              "\"weights\":{\"critical\":2,\"default\":0}}}", 0, NULL);
    cr_assert(json_equal(json_object_get(p, "capsules"), caps), "capsules as Sidekiq writes them");
    json_decref(caps);
    json_t *aq = json_object_get(p, "api_queues");
    cr_assert(json_array_size(aq) == 2 && !strcmp(json_string_value(json_array_get(aq, 0)), "critical")
                  && !strcmp(json_string_value(json_array_get(aq, 1)), "default"),
              "Sidekiq %s's Process#queues", sidekiq);
    if (sidekiq[0] == '8') {
        json_t *aw = json_object_get(p, "api_weights");
        cr_assert(json_integer_value(json_object_get(aw, "critical")) == 2 && json_object_size(aw) == 2
                      && json_is_integer(json_object_get(aw, "default")),
                  "Sidekiq %s's Process#weights, from the capsules", sidekiq);
    }
    cr_assert_str_eq(str_of(p, "tag"), "mytag");
    json_t *labels = json_object_get(p, "labels");
    cr_assert_eq(json_array_size(labels), 1);
    cr_assert_str_eq(json_string_value(json_array_get(labels, 0)), "lbl1");
    cr_assert_eq(num_of(p, "busy"), 2);
    cr_assert_str_eq(str_of(p, "quiet"), "false");
    cr_assert(num_of(p, "beat") > t0 - 1 && num_of(p, "beat") < kt_wall() + 1, "beat is now, in seconds");
    cr_assert(num_of(p, "started_at") >= t0 - 1 && num_of(p, "started_at") <= num_of(p, "beat"));
    cr_assert_gt(num_of(p, "rss"), 0, "rss in KB");

    json_t *workers = RUBY_V("workers");
    cr_assert_eq(json_array_size(workers), 2, "WorkSet lists both running jobs");
    int seen_c = 0, seen_d = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *w = json_array_get(workers, i);
        cr_assert_str_eq(str_of(w, "process"), id);
        cr_assert_str_eq(str_of(w, "klass"), "SleepJob", "the class Sidekiq shows");
        cr_assert(*str_of(w, "thread"), "a tid");
        json_t *work = json_object_get(w, "work");
        json_t *payload = json_object_get(work, "payload");
        cr_assert(json_is_object(payload), "the payload reads as a job");
        cr_assert_str_eq(str_of(payload, "class"), "SleepJob");
        const char *jid = str_of(payload, "jid");
        cr_assert_str_eq(str_of(w, "jid"), jid);
        if (strcmp(jid, jc) == 0) {
            seen_c++;
            cr_assert_str_eq(str_of(work, "queue"), "critical");
        } else if (strcmp(jid, jd) == 0) {
            seen_d++;
            cr_assert_str_eq(str_of(work, "queue"), "default");
        }
        json_t *run_at = json_object_get(work, "run_at");
        cr_assert(json_is_integer(run_at), "run_at is integer seconds");
        cr_assert(json_integer_value(run_at) >= (long long)t0 - 1
                  && json_integer_value(run_at) <= (long long)kt_wall() + 1);
    }
    cr_assert(seen_c == 1 && seen_d == 1, "both jids appear once");

    /* Once the jobs end, the next beat empties the work hash. */
    cr_assert(KT_WAIT_UNTIL(hash_field_is(id, "busy", "0"), 20), "busy drops to 0");
    json_t *after = RUBY_V("workers");
    cr_assert_eq(json_array_size(after), 0, "WorkSet is empty once the jobs finished");
    capstan_stop_ok(pid, SIGTERM, 30);
    json_decref(after);
    json_decref(workers);
    json_decref(procs);
    free(id);
    free(cfg);
    free(jc);
    free(jd);
}

/* A job each version's client pushed fails in capstan: that version's
 * RetrySet reads Sidekiq's fields, timestamps in the unit it wrote (float
 * seconds before 8.0, integer ms in 8.0) and meaning now. */
KT_SIDEKIQ_TEST(interop, failed_job_lands_in_retry_set_with_sidekiq_fields)
{
    char *jid = ruby_push_v(sidekiq, "{\"class\":\"FailJob\",\"args\":[\"boom\"]}");
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15), "the failure is in retry: %s",
              kt_capstan_log(pid));

    json_t *set = RUBY_V("retries");
    cr_assert_eq(json_array_size(set), 1);
    json_t *e = json_array_get(set, 0), *item = json_object_get(e, "item");
    cr_assert_str_eq(str_of(item, "class"), "FailJob");
    cr_assert_str_eq(str_of(item, "jid"), jid);
    cr_assert_str_eq(str_of(item, "queue"), "default");
    cr_assert_str_eq(str_of(item, "error_class"), "RuntimeError");
    cr_assert_str_eq(str_of(item, "error_message"), "boom");
    json_t *args = json_object_get(item, "args");
    cr_assert(json_array_size(args) == 1 && strcmp(json_string_value(json_array_get(args, 0)), "boom") == 0);
    cr_assert(json_is_integer(json_object_get(item, "retry_count")));
    cr_assert_eq(num_of(item, "retry_count"), 0);
    json_t *fa = json_object_get(item, "failed_at");
    cr_assert(in_unit_of(sidekiq, fa), "failed_at in the unit of Sidekiq %s's created_at", sidekiq);
    cr_assert_null(json_object_get(item, "retried_at"));
    double failed_at = secs_of(e, "failed_at");
    cr_assert(failed_at > kt_wall() - 30 && failed_at <= kt_wall());
    double delay = num_of(e, "score") - failed_at;
    cr_assert(delay >= 15 - 0.01 && delay < 25, "first retry in 15 + rand(10) s, got %.3f", delay);

    /* Make it due; the scheduler re-enqueues it and it fails again. */
    char *raw = only_member("retry", NULL);
    char now[32];
    snprintf(now, sizeof(now), "%.6f", kt_wall() - 1);
    cr_assert_eq(kt_int("ZADD retry XX CH %s %s", now, raw), 1);
    cr_assert(KT_WAIT_UNTIL(zset_has("retry", "\"retry_count\":1"), 20),
              "second failure back in retry: %s", kt_capstan_log(pid));

    json_t *set2 = RUBY_V("retries");
    cr_assert_eq(json_array_size(set2), 1);
    json_t *e2 = json_array_get(set2, 0), *item2 = json_object_get(e2, "item");
    cr_assert_str_eq(str_of(item2, "jid"), jid);
    cr_assert_eq(num_of(item2, "retry_count"), 1);
    cr_assert(json_equal(json_object_get(item2, "failed_at"), fa), "failed_at keeps the first failure");
    cr_assert(in_unit_of(sidekiq, json_object_get(item2, "retried_at")), "retried_at in the same unit");
    double retried_at = secs_of(e2, "retried_at");
    cr_assert_gt(retried_at, failed_at);
    cr_assert(secs_of(e2, "enqueued_at") > failed_at, "the scheduler refreshed enqueued_at");
    double delay2 = num_of(e2, "score") - retried_at;
    cr_assert(delay2 >= 16 - 0.01 && delay2 < 35, "second retry in 16 + rand(10)*2 s, got %.3f", delay2);

    cr_assert(KT_WAIT_UNTIL(kt_int("GET stat:failed") == 2, 10), "two failures counted");
    cr_assert_eq(kt_int("GET stat:processed"), 2);
    capstan_stop_ok(pid, SIGTERM, 30);
    json_decref(set);
    json_decref(set2);
    free(raw);
    free(cfg);
    free(jid);
}

KT_SIDEKIQ_TEST(interop, retry_zero_is_dead_retry_false_is_dropped_unknown_class_is_name_error)
{
    char *dead = ruby_push_v(sidekiq, "{\"class\":\"FailJob\",\"args\":[\"die\"],\"retry\":0}");
    char *gone = ruby_push_v(sidekiq, "{\"class\":\"FailJob\",\"args\":[\"gone\"],\"retry\":false}");
    char *nosuch = ruby_push_v(sidekiq, "{\"class\":\"NoSuchJob\",\"args\":[1]}");
    /* Set, so the unknown class fails at once: the default holds it for
     * capstan's first minute (test_fleet.c checks that). */
    char *cfg = kt_write_conf("unknown_class: fail\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("GET stat:failed") == 3, 15), "three failures counted: %s",
              kt_capstan_log(pid));
    cr_assert_eq(kt_int("GET stat:processed"), 3);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    capstan_stop_ok(pid, SIGTERM, 30);

    json_t *d = RUBY_V("dead");
    cr_assert_eq(json_array_size(d), 1, "only the retry:0 job is dead");
    json_t *de = json_array_get(d, 0), *di = json_object_get(de, "item");
    cr_assert_str_eq(str_of(di, "jid"), dead);
    cr_assert_str_eq(str_of(di, "error_class"), "RuntimeError");
    cr_assert_str_eq(str_of(di, "error_message"), "die");
    cr_assert_eq(num_of(di, "retry_count"), 0);
    cr_assert(in_unit_of(sidekiq, json_object_get(di, "failed_at")), "failed_at in Sidekiq %s's unit",
              sidekiq);
    cr_assert_null(json_object_get(di, "retried_at"), "no retried_at on a first failure");
    double died = num_of(de, "score");
    cr_assert(died >= secs_of(de, "failed_at") - 0.01 && died < secs_of(de, "failed_at") + 5,
              "dead score is the time of death");

    json_t *r = RUBY_V("retries");
    cr_assert_eq(json_array_size(r), 1, "only the unknown class is retried");
    json_t *ri = json_object_get(json_array_get(r, 0), "item");
    cr_assert_str_eq(str_of(ri, "jid"), nosuch);
    cr_assert_str_eq(str_of(ri, "class"), "NoSuchJob");
    cr_assert_str_eq(str_of(ri, "error_class"), "NameError");
    cr_assert_str_eq(str_of(ri, "error_message"), "uninitialized constant NoSuchJob");
    cr_assert_eq(num_of(ri, "retry_count"), 0);

    cr_assert(!zset_has("retry", gone) && !zset_has("dead", gone), "retry:false is in neither set");
    json_t *stats = RUBY_V("stats");
    cr_assert_eq(num_of(stats, "failed"), 3, "retry:false still counts as failed");
    cr_assert_eq(num_of(stats, "processed"), 3);
    cr_assert_eq(num_of(stats, "retry_size"), 1);
    cr_assert_eq(num_of(stats, "dead_size"), 1);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "Adding dead FailJob job"), "%s", log);
    free(log);
    json_decref(stats);
    json_decref(d);
    json_decref(r);
    free(cfg);
    free(dead);
    free(gone);
    free(nosuch);
}

KT_SIDEKIQ_TEST(interop, a_ruby_job_without_retry_gets_the_class_retry_from_the_config)
{
    json_t *v = RUBY_V("push_raw", "{\"class\":\"FailJob\",\"args\":[\"once\"]}");
    char *jid = strdup(json_string_value(v));
    json_decref(v);
    char *raw = kt_str("LINDEX queue:default 0");
    cr_assert(raw && !strstr(raw, "\"retry\""), "pushed without retry: %s", raw);
    char *cfg = kt_write_conf("classes:\n  FailJob:\n    retry: 1\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15), "first failure retried: %s",
              kt_capstan_log(pid));
    char *member = only_member("retry", NULL);
    cr_assert_eq(kt_int("ZADD retry XX CH 1 %s", member), 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 20), "dead after one retry: %s",
              kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 30);
    json_t *d = RUBY_V("dead");
    json_t *item = json_object_get(json_array_get(d, 0), "item");
    cr_assert_str_eq(str_of(item, "jid"), jid);
    cr_assert_eq(num_of(item, "retry_count"), 1);
    cr_assert_eq(kt_int("ZCARD retry"), 0);
    json_decref(d);
    free(member);
    free(cfg);
    free(raw);
    free(jid);
}

KT_SIDEKIQ_TEST(interop, a_handler_backtrace_is_sidekiqs_error_backtrace)
{
    char *all = ruby_push_v(sidekiq, "{\"class\":\"FailJob\",\"args\":[\"bt\",[\"jobs.c:10:in fail\",\"main.c:3\",\"ü\\\"\"]]}");
    char *cut = ruby_push_v(sidekiq, "{\"class\":\"FailJob\",\"backtrace\":1,\"args\":[\"bt\",[\"first\",\"second\"]]}");
    char *none = ruby_push_v(sidekiq, "{\"class\":\"FailJob\",\"backtrace\":false,\"args\":[\"bt\",[\"x\"]]}");
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 3, 15), "three failures: %s", kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 30);

    json_t *set = RUBY_V("retries");
    int checked = 0;
    for (size_t i = 0; i < json_array_size(set); i++) {
        json_t *e = json_array_get(set, i), *bt = json_object_get(e, "error_backtrace");
        const char *jid = str_of(json_object_get(e, "item"), "jid");
        char *got = json_dumps(bt, JSON_ENCODE_ANY | JSON_COMPACT);
        if (strcmp(jid, all) == 0)
            cr_assert_str_eq(got, "[\"jobs.c:10:in fail\",\"main.c:3\",\"ü\\\"\"]", "Ruby decodes: %s", got);
        else if (strcmp(jid, cut) == 0)
            cr_assert_str_eq(got, "[\"first\"]", "backtrace: 1 keeps one line: %s", got);
        else
            cr_assert(strcmp(jid, none) == 0 && json_is_null(bt), "backtrace: false keeps none: %s", got);
        checked++;
        free(got);
    }
    cr_assert_eq(checked, 3);
    json_decref(set);
    free(cfg);
    free(all);
    free(cut);
    free(none);
}

/* Sidekiq::Process#quiet! and #stop! of each version (what the Web UI's
 * buttons call) reach capstan through its signals list. */
KT_SIDEKIQ_TEST(interop, api_quiet_stops_fetching_and_stop_exits)
{
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    char *id = kt_wait_identity(pid);
    json_t *ok = RUBY_V("quiet", id);
    json_decref(ok);
    cr_assert(KT_WAIT_UNTIL(hash_field_is(id, "quiet", "true"), 10), "quiet within a beat: %s",
              kt_capstan_log(pid));
    json_t *procs = RUBY_V("processes");
    cr_assert_eq(json_array_size(procs), 1, "a quiet process stays listed");
    cr_assert_str_eq(str_of(json_array_get(procs, 0), "quiet"), "true");

    char *jid = ruby_push_v(sidekiq, "{\"class\":\"RecordJob\",\"args\":[\"rec\"]}");
    /* Two full beats later the job is still waiting: nothing fetches it. */
    double pushed = kt_wall();
    cr_assert(KT_WAIT_UNTIL(({
        char *b = kt_str("HGET %s beat", id);
        double beat = b ? atof(b) : 0;
        free(b);
        beat > pushed + 2; }), 10), "capstan keeps beating while quiet");
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "a quiet process fetches no new job");
    cr_assert_eq(kt_int("SCARD rec"), 0);

    json_t *ok2 = RUBY_V("stop", id);
    json_decref(ok2);
    int st = kt_wait_exit(pid, 20);
    kt_untrack(pid);
    char *log = kt_capstan_log(pid);
    cr_assert_eq(st, 0, "stop! makes it exit 0 (got %d): %s", st, log);
    cr_assert(strstr(log, "Received TSTP"), "%s", log);
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 0, "it left the process set");
    cr_assert_eq(kt_int("EXISTS %s:workers", id), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "the job waits for another process");
    char *left = kt_str("LINDEX queue:default 0");
    cr_assert(left && strstr(left, jid));
    free(left);
    free(log);
    json_decref(procs);
    free(jid);
    free(id);
    free(cfg);
}


/* A Sidekiq server of each version runs jobs capstan's client pushed. */
KT_SIDEKIQ_TEST(interop, jobs_pushed_by_capstan_run_on_ruby_sidekiq)
{
    char *now = capstan_push((const char *[]){ "push", "RecordJob", "[\"k\"]", NULL });
    char *later = capstan_push((const char *[]){ "push", "RecordJob", "[\"k\"]", "--in", "1", NULL });
    char *big = capstan_push((const char *[]){ "push", "RecordJob", "[\"k\"," BIGINT "]", NULL });
    cr_assert_eq(kt_int("LLEN queue:default"), 2);
    cr_assert_eq(kt_int("ZCARD schedule"), 1, "--in schedules the job");
    cr_assert_eq(kt_int("SISMEMBER queues default"), 1);

    pid_t pid = kt_sidekiq_start_v(sidekiq, "jobs.rb", "default");
    /* RecordJob writes its set, then its log, then its args: wait for all. */
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD k") == 3 && kt_int("LLEN k:log") == 3
                            && kt_int("EXISTS k:args") == 1, 30),
              "Sidekiq %s ran capstan's jobs: %s", sidekiq, kt_sidekiq_log());
    cr_assert_eq(kt_int("SISMEMBER k %s", now), 1);
    cr_assert_eq(kt_int("SISMEMBER k %s", later), 1, "the scheduled one too");
    cr_assert_eq(kt_int("SISMEMBER k %s", big), 1);
    cr_assert_eq(kt_int("LLEN k:log"), 3);
    char *args = kt_str("LINDEX k:args 0");
    cr_assert(args);
    cr_assert_str_eq(args, "[" BIGINT "]", "the big integer reached Ruby unchanged");
    int st = kt_capstan_stop(pid, SIGTERM, 20);
    kt_untrack(pid);
    cr_assert_eq(st, 0, "sidekiq exited %d: %s", st, kt_sidekiq_log());
    cr_assert_eq(kt_int("ZCARD retry"), 0, "no job failed in Ruby");
    free(args);
    free(now);
    free(later);
    free(big);
}

KT_SIDEKIQ_TEST(interop, big_integers_and_unknown_fields_survive_a_failure_byte_exact)
{
    char *jid = ruby_push_v(sidekiq, "{\"class\":\"FailJob\",\"args\":[\"boom\"," BIGINT "],"
                          "\"custom\":{\"nested\":[1,2]}}");
    char *queued = kt_str("LINDEX queue:default 0");
    cr_assert(queued && strstr(queued, BIGINT) && strstr(queued, "\"custom\":{\"nested\":[1,2]}"),
              "Ruby wrote: %s", queued);
    char *created = number_literal(queued, "created_at");
    char *enqueued = number_literal(queued, "enqueued_at");
    cr_assert(created && enqueued);

    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15), "%s", kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 30);

    char *raw = only_member("retry", NULL);
    char want[128];
    cr_assert(strstr(raw, "\"args\":[\"boom\"," BIGINT "]"), "args byte-exact: %s", raw);
    cr_assert(strstr(raw, "\"custom\":{\"nested\":[1,2]}"), "unknown field kept: %s", raw);
    snprintf(want, sizeof(want), "\"created_at\":%s", created);
    cr_assert(strstr(raw, want), "created_at literal kept (%s): %s", want, raw);
    snprintf(want, sizeof(want), "\"enqueued_at\":%s", enqueued);
    cr_assert(strstr(raw, want), "enqueued_at literal kept (%s): %s", want, raw);
    cr_assert(strstr(raw, jid) && strstr(raw, "\"error_class\":\"RuntimeError\""), "%s", raw);

    /* Ruby still reads the entry, big integer included. */
    char *out = NULL;
    cr_assert_eq(kt_ruby_v(sidekiq, "sidekiq.rb", (const char *[]){ "retries", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "[\"boom\"," BIGINT "]") && strstr(out, jid), "%s", out);
    free(out);
    free(raw);
    free(cfg);
    free(created);
    free(enqueued);
    free(queued);
    free(jid);
}

static int is_float_literal(const char *lit)
{
    return lit && strpbrk(lit, ".eE") != NULL;
}

Test(interop, float_timestamps_by_default_all_contain_a_point)
{
    char *now = capstan_push((const char *[]){ "push", "FailJob", "[\"now\"]", NULL });
    char *later = capstan_push((const char *[]){ "push", "FailJob", "[\"later\"]", "--in", "1", NULL });
    char *sched = only_member("schedule", NULL);
    char *lit = number_literal(sched, "created_at");
    cr_assert(is_float_literal(lit), "scheduled created_at %s: %s", lit, sched);
    free(lit);
    free(sched);

    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    char *id = kt_wait_identity(pid);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 2, 20), "%s", kt_capstan_log(pid));

    redisReply *r = kt_cmd("ZRANGE retry 0 -1");
    cr_assert_eq(r->elements, 2);
    for (size_t i = 0; i < 2; i++) {
        const char *m = r->element[i]->str;
        cr_assert(strstr(m, now) || strstr(m, later));
        /* "later" was enqueued by capstan's scheduler, "now" by capstan's client. */
        static const char *keys[] = { "created_at", "enqueued_at", "failed_at" };
        for (size_t k = 0; k < 3; k++) {
            char *v = number_literal(m, keys[k]);
            cr_assert(is_float_literal(v), "%s is float seconds (%s): %s", keys[k], v, m);
            free(v);
        }
    }
    freeReplyObject(r);
    char *beat = kt_str("HGET %s beat", id);
    cr_assert(is_float_literal(beat), "beat %s", beat);
    char *info = kt_str("HGET %s info", id);
    char *started = number_literal(info, "started_at");
    cr_assert(is_float_literal(started), "started_at %s: %s", started, info);
    capstan_stop_ok(pid, SIGTERM, 30);
    free(beat);
    free(info);
    free(started);
    free(id);
    free(cfg);
    free(now);
    free(later);
}

/* The setting decides the unit only for a payload without timestamps, as a
 * client that writes none leaves it (Ruby's client always writes them).
 * Every Sidekiq still loads the entry; 8.0 reads the milliseconds as now. */
KT_SIDEKIQ_TEST(interop, millis_timestamps_are_integers_and_every_sidekiq_still_loads)
{
    const char *jid = "6d5a1b0e4c3f2a1908172635";
    freeReplyObject(kt_cmd("LPUSH queue:default {\"retry\":true,\"queue\":\"default\",\"args\":[\"ms\"],"
                           "\"class\":\"FailJob\",\"jid\":\"%s\"}", jid));
    char *cfg = kt_write_conf(NULL);
    double t0 = kt_wall();
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", "--timestamps", "millis", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15), "%s", kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 30);

    double score;
    char *raw = only_member("retry", &score);
    char *fa = number_literal(raw, "failed_at");
    cr_assert(fa && strspn(fa, "0123456789") == strlen(fa), "failed_at is an integer: %s", raw);
    double ms = atof(fa);
    cr_assert(ms >= (t0 - 1) * 1000 && ms <= (kt_wall() + 1) * 1000, "failed_at in ms: %s", fa);
    cr_assert(score > ms / 1000 + 14 && score < ms / 1000 + 26, "the score stays in seconds: %f", score);

    json_t *stats = RUBY_V("stats");
    cr_assert_eq(num_of(stats, "retry_size"), 1);
    cr_assert_eq(num_of(stats, "failed"), 1);
    json_t *set = RUBY_V("retries");
    cr_assert_eq(json_array_size(set), 1);
    json_t *item = json_object_get(json_array_get(set, 0), "item");
    cr_assert_str_eq(str_of(item, "jid"), jid);
    cr_assert(json_is_integer(json_object_get(item, "failed_at")));
    if (writes_ms(sidekiq)) {
        double at = secs_of(json_array_get(set, 0), "failed_at");
        cr_assert(at >= t0 - 1 && at <= kt_wall() + 1, "Sidekiq 8 reads failed_at as now: %f", at);
    }
    json_decref(stats);
    json_decref(set);
    free(fa);
    free(raw);
    free(cfg);
}

/* Recovery writes failed_at too: a poison pill sent to the dead set keeps
 * the unit of its payload's timestamps, and the setting decides for one
 * without any. */
Test(interop, a_poison_pills_failed_at_keeps_the_payloads_unit)
{
    const char *id = "gone-host:4242:0123456789ab";
    char *wkey = kt_working_key(id);
    char j8[25], j6[25], j0[25];
    kt_make_jid(j8, 96, 0);
    kt_make_jid(j6, 96, 1);
    kt_make_jid(j0, 96, 2);
    freeReplyObject(kt_cmd("LPUSH %s {\"class\":\"CrashJob\",\"args\":[],\"jid\":\"%s\","
                           "\"created_at\":1700000000000,\"enqueued_at\":1700000000000}", wkey, j8));
    freeReplyObject(kt_cmd("LPUSH %s {\"class\":\"CrashJob\",\"args\":[],\"jid\":\"%s\","
                           "\"created_at\":1700000000.5,\"enqueued_at\":1700000000.5}", wkey, j6));
    freeReplyObject(kt_cmd("LPUSH %s {\"class\":\"CrashJob\",\"args\":[],\"jid\":\"%s\"}", wkey, j0));
    capstan_redis_t *r = kt_lib_redis();
    capstan_recovery_t rec = {0};
    char err[CAPSTAN_ERRLEN];
    double t0 = kt_wall();
    /* max_recoveries 1: this recovery is the one too many. */
    cr_assert_eq(capstan__fetch_recover_one(r, id, 1, CAPSTAN_TS_MILLIS, 0, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.killed, 3);
    const char *jids[] = { j8, j6, j0 };
    for (size_t i = 0; i < 3; i++) {
        redisReply *d = kt_cmd("ZRANGE dead 0 -1");
        char *entry = NULL;
        for (size_t k = 0; d->type == REDIS_REPLY_ARRAY && k < d->elements && !entry; k++)
            if (strstr(d->element[k]->str, jids[i]))
                entry = strdup(d->element[k]->str);
        freeReplyObject(d);
        cr_assert(entry, "%s is dead", jids[i]);
        char *fa = number_literal(entry, "failed_at");
        int want_float = i == 1; /* the float payload; the others ms */
        cr_assert(fa && is_float_literal(fa) == want_float, "failed_at %s: %s", fa, entry);
        double at = atof(fa) / (want_float ? 1 : 1000);
        cr_assert(at >= t0 - 1 && at <= kt_wall() + 1, "failed_at %s is now", fa);
        free(fa);
        free(entry);
    }
    capstan_redis_free(r);
    free(wkey);
}

/* A job that the Sidekiq client of each version pushed, failed by capstan
 * under the default setting: its failed_at is in the unit that Sidekiq
 * wrote (float seconds from 6.4 and 7.3, integer milliseconds from 8.0),
 * and that Sidekiq reads the retry back as such. */
KT_SIDEKIQ_TEST(interop, failed_at_takes_the_unit_of_the_sidekiq_that_pushed_the_job)
{
    json_t *v = ruby_v(sidekiq, (const char *[]){ "push", "{\"class\":\"FailJob\",\"args\":[\"v\"]}", NULL });
    cr_assert(json_is_string(v), "push printed a jid");
    char *jid = strdup(json_string_value(v));
    json_decref(v);
    char *queued = kt_str("LINDEX queue:default 0");
    char *ca = number_literal(queued, "created_at");
    int ms = !is_float_literal(ca);
    cr_assert_eq(ms, writes_ms(sidekiq), "Sidekiq %s wrote created_at %s", sidekiq, ca);

    char *cfg = kt_write_conf(NULL);
    double t0 = kt_wall();
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15), "%s", kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 30);

    double score;
    char *raw = only_member("retry", &score);
    char *fa = number_literal(raw, "failed_at");
    cr_assert(fa && is_float_literal(fa) == !ms, "failed_at %s in the unit of created_at %s: %s", fa, ca,
              raw);
    double at = atof(fa) / (ms ? 1000 : 1);
    cr_assert(at >= t0 - 1 && at <= kt_wall() + 1, "failed_at %s is now", fa);
    cr_assert(score > at + 14 && score < at + 26, "the score stays in seconds: %f", score);

    json_t *set = ruby_v(sidekiq, (const char *[]){ "retries", NULL });
    cr_assert_eq(json_array_size(set), 1, "Sidekiq %s lists the retry", sidekiq);
    json_t *item = json_object_get(json_array_get(set, 0), "item");
    cr_assert_str_eq(str_of(item, "jid"), jid);
    json_t *f = json_object_get(item, "failed_at");
    cr_assert(ms ? json_is_integer(f) : json_is_real(f), "Sidekiq %s reads failed_at as %s", sidekiq,
              ms ? "an Integer (ms)" : "a Float (s)");
    json_decref(set);
    free(fa);
    free(raw);
    free(cfg);
    free(ca);
    free(queued);
    free(jid);
}

/* The retry entry of jid, as stored (malloc'd). */
static char *retry_entry(const char *jid)
{
    redisReply *r = kt_cmd("ZRANGE retry 0 -1");
    char *found = NULL;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && !found; i++)
        if (strstr(r->element[i]->str, jid))
            found = strdup(r->element[i]->str);
    freeReplyObject(r);
    cr_assert(found, "%s is in the retry set", jid);
    return found;
}

/* A failure is written in the unit the payload already carries, whatever
 * the setting: a job Sidekiq 8 pushed (integer milliseconds) under the
 * default float setting, one Ruby 6.4 pushed (float seconds) under
 * --timestamps millis. */
Test(interop, failure_timestamps_keep_the_unit_the_payload_carries)
{
    const char *jid8 = "8a8a8a8a8a8a8a8a8a8a8a8a";
    double t0 = kt_wall();
    long long ms0 = (long long)(t0 * 1000);
    freeReplyObject(kt_cmd("LPUSH queue:default {\"retry\":true,\"queue\":\"default\",\"args\":[\"s8\"],"
                           "\"class\":\"FailJob\",\"jid\":\"%s\",\"created_at\":%lld,\"enqueued_at\":%lld}",
                           jid8, ms0, ms0));
    char *jid6 = ruby_push("{\"class\":\"FailJob\",\"args\":[\"s6\"]}");
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 2, 15), "%s", kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 30);

    char *e8 = retry_entry(jid8), *fa = number_literal(e8, "failed_at");
    cr_assert(fa && strspn(fa, "0123456789") == strlen(fa), "Sidekiq 8's job: integer ms: %s", e8);
    cr_assert(atof(fa) >= (t0 - 1) * 1000 && atof(fa) <= (kt_wall() + 1) * 1000, "in ms: %s", fa);
    char *ca = number_literal(e8, "created_at"), want[32];
    snprintf(want, sizeof(want), "%lld", ms0);
    cr_assert_str_eq(ca, want, "created_at untouched");
    free(fa);
    free(ca);
    char *e6 = retry_entry(jid6);
    fa = number_literal(e6, "failed_at");
    cr_assert(is_float_literal(fa), "Ruby 6.4's job: float seconds: %s", e6);
    free(fa);
    free(e6);
    free(jid6);

    /* Under millis, Ruby 6.4's float seconds stay float seconds. */
    freeReplyObject(kt_cmd("DEL retry"));
    jid6 = ruby_push("{\"class\":\"FailJob\",\"args\":[\"s6\"]}");
    pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", "--timestamps", "millis", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15), "%s", kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 30);
    e6 = retry_entry(jid6);
    fa = number_literal(e6, "failed_at");
    cr_assert(is_float_literal(fa), "a float payload stays float under millis: %s", e6);
    json_t *set = RUBY("retries");
    cr_assert_eq(json_array_size(set), 1);
    cr_assert(json_is_real(json_object_get(json_object_get(json_array_get(set, 0), "item"), "failed_at")),
              "Ruby 6.4 reads float seconds");
    json_decref(set);
    free(fa);
    free(e6);
    free(e8);
    free(jid6);
    free(cfg);
}

/* ---- W3C trace context (OpenTelemetry's Sidekiq instrumentation) ---- */

#define TRACE_ID "4bf92f3577b34da6a3ce929d0e0e4736"
#define TRACEPARENT "00-" TRACE_ID "-00f067aa0ba902b7-01"
#define TRACESTATE "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"

/* The records TraceJob left in key, by jid (a JSON object). */
static json_t *trace_records(const char *key)
{
    json_t *all = json_object();
    redisReply *r = kt_cmd("LRANGE %s 0 -1", key);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        json_t *v = json_loads(r->element[i]->str, 0, NULL);
        cr_assert(v, "a record: %s", r->element[i]->str);
        json_object_set_new(all, json_string_value(json_object_get(v, "jid")), v);
    }
    freeReplyObject(r);
    return all;
}

/* A job pushed with a traceparent: its handler sees it (and its
 * tracestate), every log line of the job carries the trace id in the text
 * and the JSON format, and the job its handler pushes carries the same
 * context. An invalid traceparent counts as absent. */
Test(interop, a_traceparent_reaches_the_handler_its_log_lines_and_the_jobs_it_pushes)
{
    const char *fmts[] = { "pretty", "json" };
    for (int f = 0; f < 2; f++) {
        char key[32], args[256], jid[25], bad_jid[25], *p = NULL;
        snprintf(key, sizeof(key), "traces:%d", f);
        snprintf(args, sizeof(args), "[\"%s\",\"%s\",\"default\"]", key, kt_url());
        kt_make_jid(jid, 80, (unsigned)f);
        kt_make_jid(bad_jid, 81, (unsigned)f);
        cr_assert(asprintf(&p, "{\"class\":\"TraceJob\",\"args\":%s,\"jid\":\"%s\",\"queue\":\"default\","
                               "\"traceparent\":\"" TRACEPARENT "\",\"tracestate\":\"" TRACESTATE "\","
                               "\"created_at\":1767225600.1,\"enqueued_at\":1767225600.1}", args, jid) > 0);
        freeReplyObject(kt_cmd("LPUSH queue:default %s", p));
        free(p);
        /* Upper-case hex: not a traceparent W3C allows. */
        cr_assert(asprintf(&p, "{\"class\":\"TraceJob\",\"args\":[\"%s\"],\"jid\":\"%s\",\"queue\":\"default\","
                               "\"traceparent\":\"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01\","
                               "\"tracestate\":\"x=1\",\"created_at\":1767225600.1,"
                               "\"enqueued_at\":1767225600.1}", key, bad_jid) > 0);
        freeReplyObject(kt_cmd("LPUSH queue:default %s", p));
        free(p);
        pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", "--log-format", fmts[f], NULL });
        cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", key) == 3, 15), "parent, child and the bad one ran: %s",
                  kt_capstan_log(pid));
        json_t *recs = trace_records(key);
        json_t *parent = json_object_get(recs, jid), *bad = json_object_get(recs, bad_jid), *child = NULL;
        const char *k;
        json_t *v;
        json_object_foreach(recs, k, v)
            if (strcmp(k, jid) != 0 && strcmp(k, bad_jid) != 0)
                child = v;
        cr_assert(parent && bad && child, "three records");
        cr_assert_str_eq(str_of(parent, "traceparent"), TRACEPARENT, "the handler sees it");
        cr_assert_str_eq(str_of(parent, "tracestate"), TRACESTATE);
        cr_assert_str_eq(str_of(child, "traceparent"), TRACEPARENT,
                         "the pushed job carries the same context");
        cr_assert_str_eq(str_of(child, "tracestate"), TRACESTATE);
        cr_assert(json_is_null(json_object_get(bad, "traceparent")), "invalid counts as absent");
        cr_assert(json_is_null(json_object_get(bad, "tracestate")));
        json_decref(recs);
        /* The start and done lines of parent and child, and none of the
         * bad one's (its lines hold no trace id at all). */
        const char *needle = f ? "\"trace_id\":\"" TRACE_ID "\"" : " trace_id=" TRACE_ID " ";
        cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, needle) == 4, 5), "4 lines with %s: %s", needle,
                  kt_capstan_log(pid));
        cr_assert_eq(kt_log_count(pid, "trace_id"), 4, "%s", kt_capstan_log(pid));
        capstan_stop_ok(pid, SIGTERM, 20);
    }
}

/* A job a Ruby app pushes with OpenTelemetry's context at the top level
 * of the payload (as opentelemetry-instrumentation-sidekiq writes it) is
 * seen with it by the C handler. */
KT_SIDEKIQ_TEST(interop, a_ruby_pushed_traceparent_reaches_the_handler)
{
    char *jid = ruby_push_v(sidekiq, "{\"class\":\"TraceJob\",\"args\":[\"traces\"],"
                                     "\"traceparent\":\"" TRACEPARENT "\",\"tracestate\":\"" TRACESTATE "\"}");
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN traces") == 1, 15), "%s", kt_capstan_log(pid));
    json_t *recs = trace_records("traces");
    json_t *rec = json_object_get(recs, jid);
    cr_assert(rec, "TraceJob ran %s", jid);
    cr_assert_str_eq(str_of(rec, "traceparent"), TRACEPARENT);
    cr_assert_str_eq(str_of(rec, "tracestate"), TRACESTATE);
    json_decref(recs);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "trace_id=" TRACE_ID) == 2, 5), "%s", kt_capstan_log(pid));
    capstan_stop_ok(pid, SIGTERM, 20);
    free(jid);
}
