/* Payload edits and Sidekiq's retry rules on the payload text. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "feed/feed.h"
#include "job/job.h"
#include "support/payload.h"
#include "support/trace.h"
#include "capstan/config.h"

/* The retry rules' settings of configuration c. */
#define RETRY_CONF(c) (&(capstan_retry_conf_t){ .max_retries = (c)->max_retries, .timestamps = (c)->timestamps })

static char *edit(const char *s, const capstan_field_t *set, size_t n)
{
    capstan_jobject_t o = {0};
    cr_assert_eq(capstan__json_scan_object(s, strlen(s), &o, NULL), 0);
    char *out;
    size_t len;
    cr_assert_eq(capstan__payload_edit(s, &o, set, n, &out, &len), 0);
    cr_assert_eq(len, strlen(out));
    capstan__jobject_free(&o);
    return out;
}

Test(payload, edit_replaces_in_place_and_appends_new_fields)
{
    capstan_field_t set[] = { { "retry_count", "1", 0 }, { "error_class", "\"E\"", 0 },
                          { "at", NULL, 0 } };
    char *out = edit("{\"a\":[1, 2],\"retry_count\":0,\"at\":1.5,\"z\":{\"k\":99999999999999999999999}}", set, 3);
    cr_assert_str_eq(out, "{\"a\":[1, 2],\"retry_count\":1,\"z\":{\"k\":99999999999999999999999},\"error_class\":\"E\"}");
    free(out);
}

Test(payload, timestamps_in_both_formats)
{
    char buf[32];
    capstan__ts_json(buf, 1700000000.0, CAPSTAN_TS_FLOAT);
    cr_assert(strchr(buf, '.'), "float seconds always carry a point: %s", buf);
    capstan__ts_json(buf, 1700000000.25, CAPSTAN_TS_MILLIS);
    cr_assert_str_eq(buf, "1700000000250");
    cr_assert_float_eq(capstan__ts_parse("1700000000250", 13), 1700000000.25, 1e-6);
    cr_assert_float_eq(capstan__ts_parse("1700000000.5", 12), 1700000000.5, 1e-6);
    cr_assert_float_eq(capstan__ts_parse("1.7e9", 5), 1.7e9, 1e-6);
}

Test(payload, jids_are_24_hex_and_distinct)
{
    char a[25], b[25];
    capstan__new_jid(a);
    capstan__new_jid(b);
    cr_assert_eq(strlen(a), 24);
    cr_assert_eq(strspn(a, "0123456789abcdef"), 24);
    cr_assert_str_neq(a, b);
}

/* Fills job in place: a job keeps its members in its own room, so it is
 * not returned by value. */
static void job_of(capstan_job_t *job, const char *s)
{
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__job_init(job, strdup(s), strlen(s), "default", err), 0, "%s", err);
}

Test(payload, job_init_reports_missing_class_or_jid)
{
    capstan_job_t job;
    char err[CAPSTAN_ERRLEN];
    const char *s = "{\"jid\":\"abc\",\"args\":[]}";
    cr_assert_eq(capstan__job_init(&job, strdup(s), strlen(s), "q", err), CAPSTAN_EINVAL);
    cr_assert(strstr(err, "class"));
    capstan__job_clear(&job);
    s = "not json";
    cr_assert_eq(capstan__job_init(&job, strdup(s), strlen(s), "q", err), CAPSTAN_EPARSE);
    capstan__job_clear(&job);
}

Test(payload, the_error_a_handler_gave_is_readable)
{
    capstan_job_t job;
    job_of(&job, "{\"class\":\"A\",\"jid\":\"j\",\"args\":[]}");
    cr_assert_null(capstan_job_error_class(&job));
    cr_assert_null(capstan_job_error_message(&job));
    cr_assert_eq(capstan_job_fail(&job, "ArgumentError", "need %d args", 2), CAPSTAN_EJOB);
    cr_assert_str_eq(capstan_job_error_class(&job), "ArgumentError");
    cr_assert_str_eq(capstan_job_error_message(&job), "need 2 args");
    capstan_job_fail(&job, NULL, "again");
    cr_assert_str_eq(capstan_job_error_class(&job), "RuntimeError");
    capstan__job_clear(&job);
}

static void assert_raw(const char *got, size_t len, const char *want)
{
    cr_assert(len == strlen(want) && memcmp(got, want, len) == 0, "got %.*s, want %s", (int)len, got,
              want);
}

/* The job holds a payload's members and its class and jid in its own
 * room: a payload with more, or longer ones, is read in full all the
 * same, and a job moved keeps every field (its copy must not point into
 * the room it was moved from). */
Test(payload, a_payload_larger_than_the_jobs_room_reads_in_full_and_moves)
{
    char cls[101], *p = NULL;
    memset(cls, 'C', 100);
    cls[100] = '\0';
    cr_assert(asprintf(&p, "{\"class\":\"%s\",\"jid\":\"j1\",\"args\":[1],\"k1\":1,\"k2\":2,\"k3\":3,"
                           "\"k4\":4,\"k5\":5,\"k6\":6,\"k7\":7,\"k8\":8,\"k9\":9,\"k10\":10,\"k11\":11,"
                           "\"k12\":12,\"last\":\"x\"}", cls) > 0);
    const char *small = "{\"class\":\"A\",\"jid\":\"j2\",\"args\":[2],\"last\":\"y\"}";
    const char *texts[] = { p, small }, *want_cls[] = { cls, "A" }, *want_jid[] = { "j1", "j2" };
    const char *want_args[] = { "[1]", "[2]" }, *want_last[] = { "\"x\"", "\"y\"" };
    for (int i = 0; i < 2; i++) {
        capstan_job_t a, b;
        job_of(&a, texts[i]);
        capstan__job_move(&b, &a);
        cr_assert_null(a.payload, "the job moved from is empty");
        size_t len;
        cr_assert_str_eq(capstan_job_class(&b), want_cls[i]);
        cr_assert_str_eq(capstan_job_jid(&b), want_jid[i]);
        const char *args = capstan_job_args_raw(&b, &len);
        assert_raw(args, len, want_args[i]);
        const char *last = capstan_job_field_raw(&b, "last", &len);
        cr_assert_not_null(last);
        assert_raw(last, len, want_last[i]);
        capstan__job_clear(&a);
        capstan__job_clear(&b);
    }
    free(p);
}

static void assert_json_is(json_t *got, const char *want_text)
{
    json_t *want = json_loads(want_text, 0, NULL);
    cr_assert(want, "%s parses", want_text);
    char *g = got ? json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    cr_assert(json_equal(got, want), "got %s, want %s", g ? g : "NULL", want_text);
    free(g);
    json_decref(want);
}

/* A handler reads the arguments perform receives with capstan_job_args and
 * capstan_job_args_raw, for a plain job and an ActiveJob one alike; the
 * wrapper's own array is capstan_job_wrapper_args. */
Test(payload, job_args_are_performs_arguments_for_activejob_too)
{
    const char *aj_args = "[{\"_aj_serialized\":\"ActiveJob::Serializers::SymbolSerializer\","
                          "\"value\":\"s\"}, 1,{\"a\":1,\"_aj_symbol_keys\":[\"a\"]}]";
    char *p = NULL;
    cr_assert(asprintf(&p, "{\"class\":\"ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper\","
                           "\"wrapped\":\"HelloJob\",\"args\":[ {\"job_class\":\"HelloJob\","
                           "\"job_id\":\"x\",\"arguments\":%s} ],\"jid\":\"j\"}", aj_args) > 0);
    capstan_job_t job;
    job_of(&job, p);
    cr_assert_str_eq(capstan_job_class(&job), "HelloJob");
    assert_json_is(capstan_job_args(&job), "[\"s\",1,{\"a\":1}]");
    size_t len;
    const char *raw = capstan_job_args_raw(&job, &len);
    assert_raw(raw, len, aj_args);
    json_t *w = capstan_job_wrapper_args(&job);
    cr_assert_eq(json_array_size(w), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(w, 0), "job_id")), "x");
    raw = capstan_job_field_raw(&job, "args", &len);
    cr_assert(len > 2 && strncmp(raw, "[ {\"job_class\"", 14) == 0, "the payload's own args");
    capstan__job_clear(&job);
    free(p);

    /* Too wide for jansson: the class and the text still come from the
     * payload; only the parsed forms are NULL. */
    job_of(&job, "{\"class\":\"Sidekiq::ActiveJob::Wrapper\",\"args\":[{\"job_class\":\"BigJob\","
                 "\"arguments\":[18446744073709551616,\"x\"]}],\"jid\":\"j\"}");
    cr_assert_str_eq(capstan_job_class(&job), "BigJob", "args[0][\"job_class\"] without \"wrapped\"");
    cr_assert_null(capstan_job_args(&job));
    cr_assert_null(capstan_job_wrapper_args(&job));
    raw = capstan_job_args_raw(&job, &len);
    assert_raw(raw, len, "[18446744073709551616,\"x\"]");
    capstan__job_clear(&job);

    /* No arguments to give: NULL, and no text either. */
    job_of(&job, "{\"class\":\"Sidekiq::ActiveJob::Wrapper\",\"wrapped\":\"X\","
                 "\"args\":[{\"job_class\":\"X\"}],\"jid\":\"j\"}");
    cr_assert_str_eq(capstan_job_class(&job), "X");
    cr_assert_null(capstan_job_args(&job));
    raw = capstan_job_args_raw(&job, &len);
    assert_raw(raw, len, "[]");
    capstan__job_clear(&job);

    /* Any other job: the payload's args, through every accessor. */
    job_of(&job, "{\"class\":\"A\",\"args\":[{\"job_class\":\"B\",\"arguments\":[1]}],\"jid\":\"j\"}");
    cr_assert_str_eq(capstan_job_class(&job), "A");
    assert_json_is(capstan_job_args(&job), "[{\"job_class\":\"B\",\"arguments\":[1]}]");
    cr_assert_eq(capstan_job_args(&job), capstan_job_wrapper_args(&job));
    raw = capstan_job_args_raw(&job, &len);
    assert_raw(raw, len, "[{\"job_class\":\"B\",\"arguments\":[1]}]");
    capstan__job_clear(&job);
    job_of(&job, "{\"class\":\"A\",\"jid\":\"j\"}");
    assert_json_is(capstan_job_args(&job), "[]");
    raw = capstan_job_args_raw(&job, &len);
    assert_raw(raw, len, "[]");
    capstan__job_clear(&job);
}

/* A wrapper payload that is not as the adapter writes it (one serialized
 * job in args) still runs under "wrapped", with no arguments to give. */
Test(payload, activejob_payloads_of_other_shapes_have_no_arguments)
{
    static const char *const args[] = { "[]", "[ ]", "[1]", "[{}]", "[{\"arguments\":[1]},{\"b\":2}]",
                                        "[{\"arguments\":{\"a\":1}}]", "[ {\"arguments\":\"x\"} ]" };
    for (size_t i = 0; i < sizeof(args) / sizeof(args[0]); i++) {
        char *p = NULL;
        cr_assert(asprintf(&p, "{\"class\":\"Sidekiq::ActiveJob::Wrapper\",\"wrapped\":\"W\","
                               "\"args\":%s,\"jid\":\"j\"}", args[i]) > 0);
        capstan_job_t job;
        job_of(&job, p);
        cr_assert_str_eq(capstan_job_class(&job), "W", "%s", p);
        cr_assert_null(capstan_job_args(&job), "%s", p);
        size_t len;
        const char *raw = capstan_job_args_raw(&job, &len);
        assert_raw(raw, len, "[]");
        capstan__job_clear(&job);
        free(p);
    }
    /* Without "wrapped" nor a readable job_class it is no ActiveJob job. */
    capstan_job_t job;
    job_of(&job, "{\"class\":\"Sidekiq::ActiveJob::Wrapper\",\"args\":[{\"arguments\":[1]}],"
                               "\"jid\":\"j\"}");
    cr_assert_str_eq(capstan_job_class(&job), "Sidekiq::ActiveJob::Wrapper");
    assert_json_is(capstan_job_args(&job), "[{\"arguments\":[1]}]");
    capstan__job_clear(&job);
}

Test(payload, first_failure_sets_failed_at_and_count_zero)
{
    capstan_config_t *cfg = capstan_config_new();
    capstan_job_t job;
    job_of(&job, "{\"retry\":true,\"queue\":\"q\",\"args\":[18446744073709551616],\"class\":\"A\",\"jid\":\"j\",\"custom\":{\"x\":1}}");
    capstan_failure_t f;
    cr_assert_eq(capstan__retry_decide(&job, "RuntimeError", "boom \"quoted\"", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1000.0, &f), 0);
    cr_assert_eq(f.fate, CAPSTAN_FATE_RETRY);
    cr_assert(f.score >= 1015.0 && f.score < 1025.0, "15 + rand(10)*(0+1): %f", f.score);
    cr_assert(strstr(f.payload, "\"args\":[18446744073709551616]"), "%s", f.payload);
    cr_assert(strstr(f.payload, "\"custom\":{\"x\":1}"));
    cr_assert(strstr(f.payload, "\"retry_count\":0"));
    cr_assert(strstr(f.payload, "\"failed_at\":1000.000000"));
    cr_assert(strstr(f.payload, "\"error_message\":\"boom \\\"quoted\\\"\""));
    cr_assert(strstr(f.payload, "\"error_class\":\"RuntimeError\""));
    cr_assert_null(strstr(f.payload, "retried_at"));
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    capstan_config_free(cfg);
}

Test(payload, later_failures_count_up_and_exhaust_to_dead)
{
    capstan_config_t *cfg = capstan_config_new();
    capstan_job_t job;
    job_of(&job, "{\"retry\":2,\"queue\":\"q\",\"args\":[],\"class\":\"A\",\"jid\":\"j\",\"retry_count\":0,\"failed_at\":5.0}");
    capstan_failure_t f;
    cr_assert_eq(capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1000.0, &f), 0);
    cr_assert_eq(f.fate, CAPSTAN_FATE_RETRY);
    cr_assert(f.score >= 1000.0 + 16 && f.score < 1000.0 + 16 + 20);
    cr_assert(strstr(f.payload, "\"retry_count\":1") && strstr(f.payload, "\"retried_at\":"));
    cr_assert(strstr(f.payload, "\"failed_at\":5.0"), "failed_at is kept");
    capstan__failure_clear(&f);
    capstan__job_clear(&job);

    job_of(&job, "{\"retry\":2,\"queue\":\"q\",\"args\":[],\"class\":\"A\",\"jid\":\"j\",\"retry_count\":1}");
    cr_assert_eq(capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1000.0, &f), 0);
    cr_assert_eq(f.fate, CAPSTAN_FATE_DEAD, "retry: 2 allows two retries");
    cr_assert_float_eq(f.score, 1000.0, 1e-9);
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    capstan_config_free(cfg);
}

/* Ruby's Integer does not overflow: a retry_count at the top of the range
 * is past every retry limit, so the job is dead, not retried in 10^23
 * years. A negative one counts as absent (a first failure). */
Test(payload, absurd_retry_counts_are_exhausted_or_restart)
{
    capstan_config_t *cfg = capstan_config_new();
    capstan_job_t job;
    job_of(&job, "{\"retry\":true,\"queue\":\"q\",\"args\":[],\"class\":\"A\",\"jid\":\"j\","
                               "\"retry_count\":9223372036854775807}");
    capstan_failure_t f;
    cr_assert_eq(capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1000.0, &f), 0);
    cr_assert_eq(f.fate, CAPSTAN_FATE_DEAD, "fate %d score %g: %s", f.fate, f.score, f.payload);
    cr_assert_float_eq(f.score, 1000.0, 1e-9);
    cr_assert(strstr(f.payload, "\"retry_count\":9223372036854775807"), "%s", f.payload);
    capstan__failure_clear(&f);
    capstan__job_clear(&job);

    job_of(&job, "{\"retry\":3,\"queue\":\"q\",\"args\":[],\"class\":\"A\",\"jid\":\"j\","
                 "\"retry_count\":-9223372036854775808}");
    cr_assert_eq(capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1000.0, &f), 0);
    cr_assert_eq(f.fate, CAPSTAN_FATE_RETRY);
    cr_assert(f.score >= 1015.0 && f.score < 1025.0, "a first retry's delay: %f", f.score);
    cr_assert(strstr(f.payload, "\"retry_count\":0") && strstr(f.payload, "\"failed_at\":"),
              "%s", f.payload);
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    capstan_config_free(cfg);
}

Test(payload, retry_zero_false_and_dead_false)
{
    capstan_config_t *cfg = capstan_config_new();
    capstan_failure_t f;
    capstan_job_t job;
    job_of(&job, "{\"retry\":0,\"class\":\"A\",\"jid\":\"j\"}");
    capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1.0, &f);
    cr_assert_eq(f.fate, CAPSTAN_FATE_DEAD, "retry: 0 goes straight to dead");
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    job_of(&job, "{\"retry\":false,\"class\":\"A\",\"jid\":\"j\"}");
    capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1.0, &f);
    cr_assert_eq(f.fate, CAPSTAN_FATE_DROP);
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    job_of(&job, "{\"retry\":0,\"dead\":false,\"class\":\"A\",\"jid\":\"j\"}");
    capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1.0, &f);
    cr_assert_eq(f.fate, CAPSTAN_FATE_DROP, "dead: false keeps it out of the morgue");
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    job_of(&job, "{\"class\":\"A\",\"jid\":\"j\"}");
    capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_NONE, RETRY_CONF(cfg), 1.0, &f);
    cr_assert_eq(f.fate, CAPSTAN_FATE_DROP, "the class option applies when the payload has no retry");
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    capstan_config_free(cfg);
}

Test(payload, retry_queue_and_millis_timestamps)
{
    capstan_config_t *cfg = capstan_config_new();
    cfg->timestamps = CAPSTAN_TS_MILLIS;
    capstan_failure_t f;
    capstan_job_t job;
    job_of(&job, "{\"queue\":\"a\",\"retry_queue\":\"slow\",\"class\":\"A\",\"jid\":\"j\"}");
    capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), 1000.5, &f);
    cr_assert(strstr(f.payload, "\"queue\":\"slow\""), "%s", f.payload);
    cr_assert(strstr(f.payload, "\"failed_at\":1000500"), "%s", f.payload);
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    capstan_config_free(cfg);
}

/* The value text of key in payload s (malloc'd), or NULL. */
static char *literal(const char *s, const char *key)
{
    capstan_jobject_t o = {0};
    cr_assert_eq(capstan__json_scan_object(s, strlen(s), &o, NULL), 0, "%s", s);
    const capstan_jmember_t *m = capstan__jobject_get(&o, s, key);
    char *v = m ? strndup(s + m->vstart, m->vlen) : NULL;
    capstan__jobject_free(&o);
    return v;
}

static void assert_literal(const char *payload, const char *key, const char *want)
{
    char *v = literal(payload, key);
    cr_assert(v && strcmp(v, want) == 0, "%s is %s, want %s: %s", key, v ? v : "absent", want, payload);
    free(v);
}

/* Fails the job in payload at now under cfg; returns the payload stored. */
static char *fail_once(const char *payload, const capstan_config_t *cfg, double now)
{
    capstan_job_t job;
    job_of(&job, payload);
    capstan_failure_t f;
    cr_assert_eq(capstan__retry_decide(&job, "E", "m", CAPSTAN_RETRY_UNSET, RETRY_CONF(cfg), now, &f), 0);
    cr_assert_eq(f.fate, CAPSTAN_FATE_RETRY);
    char *out = f.payload;
    f.payload = NULL;
    capstan__failure_clear(&f);
    capstan__job_clear(&job);
    return out;
}

/* Sidekiq 8 writes integer milliseconds, 6.x and 7.x float seconds: a
 * failure is written in the unit the payload already carries, whatever the
 * setting, which decides only for a payload without timestamps. */
Test(payload, failure_timestamps_follow_the_payloads_unit)
{
    capstan_config_t *cfg = capstan_config_new();
    cr_assert_eq(cfg->timestamps, CAPSTAN_TS_FLOAT, "float is the default");
    char *first = fail_once("{\"class\":\"A\",\"jid\":\"j\",\"args\":[],"
                            "\"created_at\":1700000000000,\"enqueued_at\":1700000000100}",
                            cfg, 1700000001.25);
    assert_literal(first, "failed_at", "1700000001250");
    assert_literal(first, "created_at", "1700000000000");
    char *second = fail_once(first, cfg, 1700000030.5);
    assert_literal(second, "retried_at", "1700000030500");
    assert_literal(second, "failed_at", "1700000001250");
    assert_literal(second, "retry_count", "1");
    free(first);
    free(second);

    cfg->timestamps = CAPSTAN_TS_MILLIS;
    first = fail_once("{\"class\":\"A\",\"jid\":\"j\",\"created_at\":1700000000.1234,"
                      "\"enqueued_at\":1700000000.5}", cfg, 1700000001.25);
    assert_literal(first, "failed_at", "1700000001.250000");
    second = fail_once(first, cfg, 1700000030.5);
    assert_literal(second, "retried_at", "1700000030.500000");
    free(first);
    free(second);

    /* Only a failed_at (an entry from elsewhere) still names the unit. */
    cfg->timestamps = CAPSTAN_TS_FLOAT;
    first = fail_once("{\"class\":\"A\",\"jid\":\"j\",\"retry_count\":0,\"failed_at\":1700000000000}",
                      cfg, 1700000001.25);
    assert_literal(first, "retried_at", "1700000001250");
    free(first);

    /* None: the setting. */
    first = fail_once("{\"class\":\"A\",\"jid\":\"j\"}", cfg, 1700000001.25);
    assert_literal(first, "failed_at", "1700000001.250000");
    free(first);
    cfg->timestamps = CAPSTAN_TS_MILLIS;
    first = fail_once("{\"class\":\"A\",\"jid\":\"j\"}", cfg, 1700000001.25);
    assert_literal(first, "failed_at", "1700000001250");
    free(first);
    capstan_config_free(cfg);
}

Test(payload, the_unit_is_read_from_the_first_timestamp_that_is_a_number)
{
    static const struct {
        const char *payload;
        capstan_ts_format_t fallback, want;
    } cases[] = {
        { "{\"created_at\":1700000000000,\"enqueued_at\":1700000000.5}", CAPSTAN_TS_FLOAT, CAPSTAN_TS_MILLIS },
        { "{\"created_at\":1700000000.0,\"enqueued_at\":1700000000500}", CAPSTAN_TS_MILLIS, CAPSTAN_TS_FLOAT },
        { "{\"created_at\":1.7e9}", CAPSTAN_TS_MILLIS, CAPSTAN_TS_FLOAT },
        { "{\"created_at\":\"2026-01-01\",\"enqueued_at\":1700000000500}", CAPSTAN_TS_FLOAT, CAPSTAN_TS_MILLIS },
        { "{\"created_at\":null,\"retried_at\":17.5}", CAPSTAN_TS_MILLIS, CAPSTAN_TS_FLOAT },
        { "{\"at\":1700000000.5,\"args\":[1700000000000]}", CAPSTAN_TS_MILLIS, CAPSTAN_TS_MILLIS },
        { "{}", CAPSTAN_TS_FLOAT, CAPSTAN_TS_FLOAT },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        capstan_jobject_t o = {0};
        const char *p = cases[i].payload;
        cr_assert_eq(capstan__json_scan_object(p, strlen(p), &o, NULL), 0);
        cr_assert_eq(capstan__ts_format_of(p, &o, cases[i].fallback), cases[i].want, "%s", p);
        capstan__jobject_free(&o);
    }
}

Test(payload, invalid_payloads_become_readable_dead_entries)
{
    capstan_config_t *cfg = capstan_config_new();
    capstan_failure_t f;
    cr_assert_eq(capstan__retry_invalid("{oops", 5, "q", "invalid JSON at byte 1", RETRY_CONF(cfg), 1.0, &f), 0);
    cr_assert_eq(f.fate, CAPSTAN_FATE_DEAD);
    cr_assert(strstr(f.payload, "\"args\":[\"{oops\"]"), "%s", f.payload);
    cr_assert(strstr(f.payload, "\"error_class\":\"Capstan::InvalidPayload\""));
    cr_assert_eq(capstan__json_validate(f.payload, f.len, NULL), 0);
    capstan__failure_clear(&f);

    cr_assert_eq(capstan__retry_invalid("\xff\xfe", 2, "q", "bad", RETRY_CONF(cfg), 1.0, &f), 0);
    cr_assert(strstr(f.payload, "\"payload_base64\":\"//4=\""), "%s", f.payload);
    capstan__failure_clear(&f);

    const char *noclass = "{\"jid\":\"abc\",\"args\":[1]}";
    cr_assert_eq(capstan__retry_invalid(noclass, strlen(noclass), "q", "no class", RETRY_CONF(cfg), 1.0, &f), 0);
    cr_assert(strncmp(f.payload, "{\"jid\":\"abc\",\"args\":[1],", 24) == 0, "%s", f.payload);
    assert_literal(f.payload, "failed_at", "1.000000");
    capstan__failure_clear(&f);

    /* A Sidekiq 8 payload keeps its milliseconds. */
    noclass = "{\"jid\":\"abc\",\"created_at\":1700000000000}";
    cr_assert_eq(capstan__retry_invalid(noclass, strlen(noclass), "q", "no class", RETRY_CONF(cfg), 1700000001.5, &f), 0);
    assert_literal(f.payload, "failed_at", "1700000001500");
    capstan__failure_clear(&f);
    capstan_config_free(cfg);
}

/* W3C's rules for a version-00 traceparent: what capstan_job_traceparent
 * keeps, and what it treats as absent; and the job reads both fields. */
Test(payload, traceparent_is_kept_only_when_w3c_valid)
{
    static const char *ok[] = {
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    };
    static const char *bad[] = {
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", /* zero parent id */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", /* upper case */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* another version */
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  /* short */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", /* long */
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
        "",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        cr_assert(capstan__traceparent_valid(ok[i], strlen(ok[i])), "%s", ok[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_not(capstan__traceparent_valid(bad[i], strlen(bad[i])), "%s", bad[i]);

    const char *text = "{\"class\":\"X\",\"jid\":\"j\",\"args\":[],"
                       "\"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\","
                       "\"tracestate\":\"rojo=1\"}";
    capstan_job_t job;
    cr_assert_eq(capstan__job_init(&job, strdup(text), strlen(text), "q", NULL), 0);
    cr_assert_str_eq(capstan_job_traceparent(&job), ok[0]);
    cr_assert_str_eq(capstan_job_tracestate(&job), "rojo=1");
    cr_assert_str_eq(job.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    capstan__job_clear(&job);
    text = "{\"class\":\"X\",\"jid\":\"j\",\"args\":[],\"traceparent\":7,\"tracestate\":\"rojo=1\"}";
    cr_assert_eq(capstan__job_init(&job, strdup(text), strlen(text), "q", NULL), 0);
    cr_assert_null(capstan_job_traceparent(&job));
    cr_assert_null(capstan_job_tracestate(&job), "no tracestate without a traceparent");
    cr_assert_eq(job.trace_id[0], '\0');
    capstan__job_clear(&job);
}

/* The search by a rare byte that tells a payload carrying a lock_digest
 * finds what memmem finds, in every payload and at every length of it:
 * keys with that byte elsewhere, near misses, the key at either end. */
Test(payload, the_lock_digest_search_finds_what_memmem_finds)
{
    static const char key[] = "\"lock_digest\"";
    const size_t k = sizeof(key) - 1;
    static const char *const payloads[] = {
        "{\"class\":\"NoopJob\",\"args\":[],\"jid\":\"0123456789abcdef01234567\",\"queue\":\"default\"}",
        "{\"class\":\"HardWorker\",\"lock\":\"until_executed\",\"lock_digest\":\"uniquejobs:d\",\"jid\":\"a\"}",
        "\"lock_digest\"",
        "\"lock_digest\":1,\"kk\":\"k\"",
        "{\"lock_ttl\":5,\"lock_digest_x\":1,\"lockdigest\":2,\"lock_diges\":3}",
        "{\"args\":[\"\\\"lock_digest\\\"\"],\"k\":\"kkkk\"}",
        "{\"k\":\"\"lock_digest\"\"lock_digest\"\"}",
        "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
        "\"lock_digestlock_digest\"",
        "{\"a\":\"x\",\"lock_digest\"",
        "",
    };
    for (size_t i = 0; i < sizeof(payloads) / sizeof(*payloads); i++) {
        const char *s = payloads[i];
        for (size_t len = 0; len <= strlen(s); len++)
            for (size_t from = 0; from <= len; from++)
                cr_assert_eq(capstan__feed_find(s + from, len - from, key, k, 4),
                             memmem(s + from, len - from, key, k), "payload %zu [%zu, %zu)", i, from, len);
    }
}
