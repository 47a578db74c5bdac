/* Jobs a Rails app enqueues through ActiveJob's Sidekiq adapter, enqueued
 * by real Ruby ActiveJob (tests/ruby/activejob.rb) and run by capstan's C
 * handlers (examples/jobs.c), and jobs of classes capstan has no handler for
 * (the unknown_class policy), as a Sidekiq user would see them. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

TestSuite(activejob, .timeout = 90, .fini = kt_kill_children);

static json_t *ruby_in(const char *script, const char *const *args)
{
    char *out = NULL;
    int st = kt_ruby(script, args, &out);
    cr_assert_eq(st, 0, "%s %s exited %d: %s", script, args[0], st, out);
    json_error_t e;
    json_t *v = json_loads(out, JSON_DECODE_ANY, &e);
    cr_assert(v, "%s %s printed no JSON (%s): %s", script, args[0], e.text, out);
    free(out);
    return v;
}
#define AJ(...) ruby_in("activejob.rb", (const char *[]){ __VA_ARGS__, NULL })
#define SIDEKIQ(...) ruby_in("sidekiq.rb", (const char *[]){ __VA_ARGS__, NULL })

/* The jid an enqueue printed (malloc'd). */
static char *jid_of(json_t *v)
{
    cr_assert(json_is_string(v) && strlen(json_string_value(v)) == 24, "a jid was printed");
    char *jid = strdup(json_string_value(v));
    json_decref(v);
    return jid;
}

static void stop_ok(pid_t pid)
{
    int st = kt_capstan_stop(pid, SIGTERM, 30);
    kt_untrack(pid);
    char *log = kt_capstan_log(pid);
    cr_assert_eq(st, 0, "capstan exits 0 (got %d): %s", st, log);
    free(log);
}

/* The record AjRecordJob left for jid in capstan:aj, or NULL. */
static json_t *record_of(const char *jid)
{
    redisReply *r = kt_cmd("LRANGE capstan:aj 0 -1");
    json_t *found = NULL;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && !found; i++) {
        json_t *v = json_loads(r->element[i]->str, 0, NULL);
        if (v && strcmp(json_string_value(json_object_get(v, "jid")), jid) == 0)
            found = v;
        else
            json_decref(v);
    }
    freeReplyObject(r);
    return found;
}

static void assert_json(json_t *got, const char *want_text, const char *what)
{
    json_t *want = json_loads(want_text, JSON_DECODE_ANY, NULL);
    cr_assert(want, "the expected JSON parses");
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    cr_assert(json_equal(got, want), "%s: got %s, want %s", what, g ? g : "NULL", want_text);
    free(g);
    json_decref(want);
}

Test(activejob, perform_later_runs_the_wrapped_class_with_its_arguments_deserialized)
{
    char *now = jid_of(AJ("enqueue"));
    char *big = jid_of(AJ("bigint"));
    char *later = jid_of(AJ("schedule", "2"));
    cr_assert_eq(kt_int("LLEN queue:default"), 2);
    cr_assert_eq(kt_int("ZCARD schedule"), 1, "set(wait:) lands in the schedule");

    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN capstan:aj") == 3, 20), "the three jobs ran: %s",
              kt_capstan_log(pid));

    json_t *rec = record_of(now);
    cr_assert(rec, "AjRecordJob ran %s", now);
    cr_assert_str_eq(json_string_value(json_object_get(rec, "class")), "AjRecordJob",
                     "capstan_job_class is the wrapped class");
    cr_assert_str_eq(json_string_value(json_object_get(rec, "job_class")), "AjRecordJob",
                     "capstan_job_wrapper_args keeps ActiveJob's serialized job");
    cr_assert_null(json_object_get(rec, "raw"), "no raw text recorded when the arguments parse");
    assert_json(json_object_get(rec, "arguments"),
                "[\"sym\", {\"a\": 1, \"b\": \"c\"}, [1, 2], \"str\", 1.5, null, true,"
                " \"gid://app/Model/7\", {\"x\": 1}, \"2026-01-02T03:04:05.000000000Z\", 259200,"
                " {\"kw\": \"v\"}]",
                "the arguments perform receives");
    json_decref(rec);
    rec = record_of(big);
    cr_assert(rec, "AjRecordJob ran %s", big);
    cr_assert(json_is_null(json_object_get(rec, "arguments")),
              "an integer past 64 bits: capstan_job_args is NULL");
    cr_assert_str_eq(json_string_value(json_object_get(rec, "raw")), "[12345678901234567890,\"str\"]",
                     "capstan_job_args_raw is the arguments' text, not the wrapper's");
    json_decref(rec);
    rec = record_of(later);
    cr_assert(rec, "the scheduled job ran once due");
    assert_json(json_object_get(rec, "arguments"), "[\"later\"]", "scheduled arguments");
    json_decref(rec);

    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "class=AjRecordJob"), 5),
              "the log lines name the wrapped class: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_has(pid, "class=ActiveJob::"), 0, "not the wrapper");
    cr_assert_eq(kt_int("ZCARD retry"), 0);
    stop_ok(pid);
    free(cfg);
    free(now);
    free(big);
    free(later);
}

/* A handler written for plain Sidekiq jobs reads its arguments with
 * capstan_job_args; the same handler gets perform's arguments from an
 * ActiveJob job, not the wrapper's [{"job_class": ...}] (which made the
 * examples' RecordJob record under its default key and report done). */
Test(activejob, a_plain_handler_reads_perform_later_arguments_with_capstan_job_args)
{
    char *jid = jid_of(AJ("record", "aj:records"));
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER aj:records %s", jid) == 1, 20),
              "RecordJob recorded its jid under the key it was given: %s", kt_capstan_log(pid));
    stop_ok(pid);
    cr_assert_eq(kt_int("EXISTS capstan:records"), 0, "not under the handler's default key");
    cr_assert_eq(kt_int("LLEN aj:records:log"), 1, "ran once");
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
    free(cfg);
    free(jid);
}

/* The text of "args":[...] in a payload, up to the next top-level key
 * ActiveJob's adapter writes after it (malloc'd). */
static char *args_text(const char *payload)
{
    const char *a = strstr(payload, "\"args\":");
    const char *e = a ? strstr(a, ",\"jid\":") : NULL;
    cr_assert(a && e, "args then jid in %s", payload);
    return strndup(a, (size_t)(e - a));
}

Test(activejob, a_failing_job_shows_in_the_retry_set_as_sidekiqs_adapter_leaves_it)
{
    char *jid = jid_of(AJ("fail"));
    char *orig = kt_str("LINDEX queue:default 0");
    char *args = args_text(orig);

    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 20), "the job failed: %s", kt_capstan_log(pid));
    stop_ok(pid);

    json_t *all = AJ("retries");
    cr_assert_eq(json_array_size(all), 1);
    json_t *e = json_array_get(all, 0);
    cr_assert_str_eq(json_string_value(json_object_get(e, "display_class")), "FailingAjJob");
    /* Sidekiq 6.4 shows the arguments as ActiveJob serialized them (7.x
     * deserializes them first); either way from the untouched payload. */
    assert_json(json_object_get(e, "display_args"),
                "[{\"_aj_serialized\": \"ActiveJob::Serializers::SymbolSerializer\", \"value\": \"x\"}, 1]",
                "display_args");
    cr_assert_str_eq(json_string_value(json_object_get(e, "error_class")), "ArgumentError");
    cr_assert_str_eq(json_string_value(json_object_get(e, "error_message")),
                     "FailingAjJob failed on purpose");
    cr_assert_eq(json_integer_value(json_object_get(e, "retry_count")), 0);
    json_t *item = json_object_get(e, "item");
    cr_assert_str_eq(json_string_value(json_object_get(item, "class")),
                     "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
                     "the payload keeps its wrapper class");
    cr_assert_str_eq(json_string_value(json_object_get(item, "wrapped")), "FailingAjJob");
    cr_assert_str_eq(json_string_value(json_object_get(item, "jid")), jid);
    const char *stored = json_string_value(json_object_get(e, "value"));
    cr_assert(stored && strstr(stored, args), "args byte-exact: %s in %s", args, stored);
    json_decref(all);

    json_t *stats = SIDEKIQ("stats");
    cr_assert_eq(json_integer_value(json_object_get(stats, "failed")), 1);
    json_decref(stats);
    free(cfg);
    free(args);
    free(orig);
    free(jid);
}

/* A job of a class only Ruby knows, pushed by Sidekiq's client to the
 * default queue, then a RecordJob capstan runs; capstan starts with policy. */
static pid_t start_with_unknown(const char *policy, const char *fetch, char **orig)
{
    json_t *v = SIDEKIQ("push", "{\"class\":\"RubyOnlyJob\",\"args\":[1,\"x\"]}");
    json_decref(v);
    *orig = kt_str("LINDEX queue:default 0");
    v = SIDEKIQ("push", "{\"class\":\"RecordJob\",\"args\":[\"rec\"]}");
    json_decref(v);
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", "--fetch", fetch,
                                               "--unknown-class", policy, NULL });
    free(cfg);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == 1, 20), "the known job ran: %s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "no handler for RubyOnlyJob"), 10),
              "the policy is logged: %s", kt_capstan_log(pid));
    return pid;
}

static int queue_is_only(const char *payload)
{
    redisReply *r = kt_cmd("LRANGE queue:default 0 -1");
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
             r->element[0]->len == strlen(payload) && memcmp(r->element[0]->str, payload, r->element[0]->len) == 0;
    freeReplyObject(r);
    return ok;
}

static void requeue_leaves_the_job_for_ruby(const char *fetch)
{
    char *orig;
    pid_t pid = start_with_unknown("requeue", fetch, &orig);
    /* Fetched and put back several times meanwhile (capstan is the only
     * reader here), never run, retried or changed. */
    cr_assert(KT_WAIT_UNTIL(queue_is_only(orig), 10), "the job is back in its queue, byte for byte: %s",
              kt_capstan_log(pid));
    kt_sleep(0.5);
    cr_assert(KT_WAIT_UNTIL(queue_is_only(orig), 10), "still there: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0, "neither retried nor dead");
    cr_assert_eq(kt_log_count(pid, "no handler for RubyOnlyJob"), 1, "logged once");
    cr_assert_eq(kt_log_has(pid, "unknown_class: requeue"), 1);
    stop_ok(pid);
    cr_assert(queue_is_only(orig), "after shutdown one copy is in the queue, untouched");
    free(orig);
}

Test(activejob, unknown_class_requeue_leaves_the_job_in_its_queue_reliable)
{
    requeue_leaves_the_job_for_ruby("reliable");
}

Test(activejob, unknown_class_requeue_leaves_the_job_in_its_queue_basic)
{
    requeue_leaves_the_job_for_ruby("basic");
}

Test(activejob, unknown_class_fail_retries_with_name_error)
{
    char *orig;
    pid_t pid = start_with_unknown("fail", "reliable", &orig);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 10), "retried: %s", kt_capstan_log(pid));
    stop_ok(pid);
    json_t *all = SIDEKIQ("retries");
    json_t *item = json_object_get(json_array_get(all, 0), "item");
    cr_assert_str_eq(json_string_value(json_object_get(item, "error_class")), "NameError");
    cr_assert_str_eq(json_string_value(json_object_get(item, "error_message")),
                     "uninitialized constant RubyOnlyJob");
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    json_decref(all);
    free(orig);
}

Test(activejob, unknown_class_skip_sends_it_to_the_dead_set_unretried)
{
    char *orig;
    pid_t pid = start_with_unknown("skip", "reliable", &orig);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 10), "dead: %s", kt_capstan_log(pid));
    stop_ok(pid);
    cr_assert_eq(kt_int("ZCARD retry"), 0, "not retried");
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    json_t *all = SIDEKIQ("dead");
    json_t *item = json_object_get(json_array_get(all, 0), "item");
    cr_assert_str_eq(json_string_value(json_object_get(item, "class")), "RubyOnlyJob");
    cr_assert_str_eq(json_string_value(json_object_get(item, "error_class")), "NameError");
    cr_assert(strstr(json_string_value(json_object_get(item, "error_message")),
                     "uninitialized constant RubyOnlyJob"));
    /* Every byte of the payload kept: the entry is it plus the error fields. */
    redisReply *r = kt_cmd("ZRANGE dead 0 -1");
    cr_assert(r->element[0]->len > strlen(orig) - 1);
    cr_assert(strncmp(r->element[0]->str, orig, strlen(orig) - 1) == 0,
              "the entry starts with the payload: %s vs %s", r->element[0]->str, orig);
    freeReplyObject(r);
    json_decref(all);
    free(orig);
}

Test(activejob, unknown_class_takes_only_fail_requeue_or_skip)
{
    char *out = NULL;
    int st = kt_capstan_run((const char *[]){ "run", "--unknown-class", "drop", NULL }, &out);
    cr_assert_eq(st, 78, "a bad value is a config error: %d %s", st, out);
    cr_assert(strstr(out, "--unknown-class: must be fail, requeue or skip"), "%s", out);
    free(out);
    char *cfg = kt_write_conf("unknown_class: maybe\n");
    st = kt_capstan_run((const char *[]){ "run", "-C", cfg, NULL }, &out);
    cr_assert_eq(st, 78, "%d %s", st, out);
    cr_assert(strstr(out, "unknown_class: must be fail, requeue or skip"), "%s", out);
    free(out);
    free(cfg);
}

Test(activejob, sidekiq7_wrapper_and_a_payload_without_wrapped_run_too)
{
    /* Sidekiq 7+'s adapter names the wrapper Sidekiq::ActiveJob::Wrapper;
     * without "wrapped" the class is args[0]["job_class"], as Sidekiq's
     * display_class reads it. */
    char *a = jid_of(SIDEKIQ("push_raw",
        "{\"class\":\"Sidekiq::ActiveJob::Wrapper\",\"wrapped\":\"AjRecordJob\",\"queue\":\"default\","
        "\"args\":[{\"job_class\":\"AjRecordJob\",\"job_id\":\"j1\",\"arguments\":["
        "{\"_aj_serialized\":\"ActiveJob::Serializers::SymbolSerializer\",\"value\":\"s7\"}]}]}"));
    char *b = jid_of(SIDEKIQ("push_raw",
        "{\"class\":\"ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper\",\"queue\":\"default\","
        "\"args\":[{\"job_class\":\"AjRecordJob\",\"job_id\":\"j2\",\"arguments\":[2]}]}"));
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN capstan:aj") == 2, 20), "both ran: %s", kt_capstan_log(pid));
    json_t *ra = record_of(a), *rb = record_of(b);
    cr_assert(ra && rb);
    assert_json(json_object_get(ra, "arguments"), "[\"s7\"]", "Sidekiq 7 wrapper");
    assert_json(json_object_get(rb, "arguments"), "[2]", "no wrapped");
    json_decref(ra);
    json_decref(rb);
    stop_ok(pid);
    free(cfg);
    free(a);
    free(b);
}
