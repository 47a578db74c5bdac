/* Bad input never crashes the worker or loses a job: payloads pushed by hand
 * that are not JSON, lack class or jid, are huge, carry bytes that are not
 * UTF-8, or have the wrong shape; and `capstan run` given a bad flag, config
 * file, Redis URL or plugin. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

TestSuite(badinput, .timeout = 90, .fini = kt_kill_children);

#define REC "rec"

typedef struct worker {
    pid_t pid;
    char *identity;
} worker_t;

/* Starts `capstan run -c 2` and waits for its first heartbeat, which names the
 * process (and so its working list). */
static worker_t start_worker(void)
{
    /* An unknown class fails at once (the default holds it for the first
     * minute, while Ruby processes may boot: fleet/fleet.c). */
    worker_t w = { .pid = kt_capstan_start((const char *[]){ "-c", "2", "--unknown-class", "fail", NULL }) };
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 20), "capstan did not start: %s",
              kt_capstan_log(w.pid));
    w.identity = kt_str("SRANDMEMBER processes");
    cr_assert(w.identity);
    return w;
}

static void push_raw(const char *payload, size_t len)
{
    freeReplyObject(kt_cmd("LPUSH queue:default %b", payload, len));
}

static void push_job(const char *cls, const char *jid, const char *args_json)
{
    char p[512];
    snprintf(p, sizeof(p),
             "{\"class\":\"%s\",\"args\":%s,\"retry\":true,\"queue\":\"default\","
             "\"jid\":\"%s\",\"created_at\":1700000000.5,\"enqueued_at\":1700000000.5}",
             cls, args_json, jid);
    push_raw(p, strlen(p));
}

static long long working_len(const worker_t *w)
{
    return kt_int("LLEN uniquejobs:working:%s", w->identity);
}

/* What every bad payload test ends with: a RecordJob pushed after the bad
 * payload was handled still runs, nothing is left in the queue or the
 * working list, and the worker still stops cleanly. */
static void still_works_then_stop(worker_t *w, const char *jid)
{
    cr_assert_eq(kill(w->pid, 0), 0, "the worker died: %s", kt_capstan_log(w->pid));
    push_job("RecordJob", jid, "[\"" REC "\"]");
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER " REC " %s", jid) == 1, 20),
              "a job pushed after the bad one did not run: %s", kt_capstan_log(w->pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0 && working_len(w) == 0, 10),
              "queue %lld, working list %lld", kt_int("LLEN queue:default"), working_len(w));
    cr_assert_eq(kt_capstan_stop(w->pid, SIGTERM, 30), 0, "graceful stop: %s", kt_capstan_log(w->pid));
    cr_assert_eq(working_len(w), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    free(w->identity);
}

/* The only dead-set entry, parsed, once it has arrived. */
static json_t *the_dead_entry(const worker_t *w)
{
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 20), "dead set has %lld entries: %s",
              kt_int("ZCARD dead"), kt_capstan_log(w->pid));
    redisReply *r = kt_cmd("ZRANGE dead 0 0");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 1);
    json_error_t e;
    json_t *o = json_loadb(r->element[0]->str, r->element[0]->len, JSON_DECODE_INT_AS_REAL, &e);
    cr_assert(json_is_object(o), "dead entry is not a JSON object (%s): %s", e.text,
              r->element[0]->str);
    freeReplyObject(r);
    return o;
}

static const char *str_field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    cr_assert(json_is_string(v), "\"%s\" is not a string in %s", k,
              json_dumps(o, JSON_COMPACT));
    return json_string_value(v);
}

static void assert_invalid_entry(json_t *o, const char *why_part)
{
    cr_assert_str_eq(str_field(o, "error_class"), "Capstan::InvalidPayload");
    const char *msg = str_field(o, "error_message");
    cr_assert(strstr(msg, why_part), "error_message \"%s\" should mention \"%s\"", msg, why_part);
    cr_assert(json_is_string(json_object_get(o, "jid")), "the dead entry needs a jid for the Web UI");
    cr_assert(json_object_get(o, "failed_at"), "the dead entry needs failed_at");
    cr_assert_eq(kt_int("ZCARD retry"), 0, "an invalid payload is never retried");
}

/* An entry built around text that is not a JSON object keeps it whole as
 * its one argument. */
static void assert_kept_as_arg(json_t *o, const char *raw)
{
    cr_assert_str_eq(str_field(o, "class"), "Capstan::InvalidPayload");
    json_t *args = json_object_get(o, "args");
    cr_assert(json_is_array(args) && json_array_size(args) == 1);
    cr_assert_str_eq(json_string_value(json_array_get(args, 0)), raw);
}

Test(badinput, malformed_json_goes_to_dead_with_its_text)
{
    worker_t w = start_worker();
    const char *raw = "{\"class\":";
    push_raw(raw, strlen(raw));
    json_t *o = the_dead_entry(&w);
    assert_invalid_entry(o, "invalid JSON");
    assert_kept_as_arg(o, raw);
    json_decref(o);
    /* The dead entry is written first, then the line. */
    cr_assert(KT_WAIT_UNTIL(kt_log_count(w.pid, "invalid payload from queue:default") >= 1, 10),
              "not logged: %s", kt_capstan_log(w.pid));
    kt_sleep(0.2);
    cr_assert_eq(kt_log_count(w.pid, "invalid payload from queue:default"), 1, "logged once");
    still_works_then_stop(&w, "b0000000000000000000000a");
}

Test(badinput, json_array_instead_of_object_goes_to_dead)
{
    worker_t w = start_worker();
    const char *raw = "[\"NoopJob\",1,2]";
    push_raw(raw, strlen(raw));
    json_t *o = the_dead_entry(&w);
    assert_invalid_entry(o, "JSON");
    assert_kept_as_arg(o, raw);
    json_decref(o);
    still_works_then_stop(&w, "b0000000000000000000000b");
}

/* Valid JSON objects that cannot run keep every byte they had and gain the
 * error fields. */
Test(badinput, payload_without_class_goes_to_dead_unchanged)
{
    worker_t w = start_worker();
    const char *raw = "{\"args\":[1,123456789012345678901234567890],\"jid\":\"0123456789abcdef01234567\",\"x\":\"keep\"}";
    push_raw(raw, strlen(raw));
    json_t *o = the_dead_entry(&w);
    assert_invalid_entry(o, "\"class\"");
    cr_assert_str_eq(str_field(o, "jid"), "0123456789abcdef01234567");
    cr_assert_str_eq(str_field(o, "x"), "keep");
    json_decref(o);
    redisReply *r = kt_cmd("ZRANGE dead 0 0");
    cr_assert(strstr(r->element[0]->str, "\"args\":[1,123456789012345678901234567890]"),
              "the original bytes are kept: %s", r->element[0]->str);
    freeReplyObject(r);
    still_works_then_stop(&w, "b0000000000000000000000c");
}

Test(badinput, payload_without_jid_goes_to_dead_with_a_new_jid)
{
    worker_t w = start_worker();
    const char *raw = "{\"class\":\"NoopJob\",\"args\":[],\"queue\":\"default\"}";
    push_raw(raw, strlen(raw));
    json_t *o = the_dead_entry(&w);
    assert_invalid_entry(o, "\"jid\"");
    cr_assert_str_eq(str_field(o, "class"), "NoopJob");
    cr_assert_eq(strlen(str_field(o, "jid")), 24, "a jid the Web UI can address");
    json_decref(o);
    char *log = kt_capstan_log(w.pid);
    cr_assert_null(strstr(log, "class=NoopJob"), "the job must not run: %s", log);
    free(log);
    still_works_then_stop(&w, "b0000000000000000000000d");
}

Test(badinput, args_not_an_array_goes_to_dead)
{
    worker_t w = start_worker();
    const char *raw = "{\"class\":\"RecordJob\",\"args\":{\"key\":\"" REC "\"},"
                      "\"jid\":\"a0000000000000000000000f\",\"queue\":\"default\"}";
    push_raw(raw, strlen(raw));
    json_t *o = the_dead_entry(&w);
    assert_invalid_entry(o, "\"args\"");
    cr_assert_str_eq(str_field(o, "jid"), "a0000000000000000000000f");
    cr_assert(json_is_object(json_object_get(o, "args")), "args kept as they were");
    json_decref(o);
    cr_assert_eq(kt_int("SISMEMBER " REC " a0000000000000000000000f"), 0, "it must not run");
    still_works_then_stop(&w, "b0000000000000000000000e");
}

Test(badinput, five_megabyte_payload_runs_and_fails_byte_exact)
{
    size_t big = 5u << 20;
    char *s = malloc(big + 1);
    for (size_t i = 0; i < big; i++)
        s[i] = (char)('a' + (i * 7 + i / 26) % 26);
    s[big] = '\0';
    size_t cap = big + 512;
    char *rec = malloc(cap), *fail = malloc(cap);
    int nr = snprintf(rec, cap, "{\"class\":\"RecordJob\",\"args\":[\"" REC "\",\"%s\"],"
                      "\"jid\":\"c0000000000000000000000a\",\"retry\":true,\"queue\":\"default\"}", s);
    /* FailJob's first argument is its message: a 5 MB error_message is cut,
     * the args must not be. */
    int nf = snprintf(fail, cap, "{\"class\":\"FailJob\",\"args\":[\"%s\"],"
                      "\"jid\":\"c0000000000000000000000b\",\"retry\":true,\"queue\":\"default\"}", s);

    worker_t w = start_worker();
    push_raw(rec, (size_t)nr);
    push_raw(fail, (size_t)nf);
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER " REC " c0000000000000000000000a") == 1, 30),
              "the 5 MB RecordJob did not run: %.2000s", kt_capstan_log(w.pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 30), "the 5 MB FailJob was not retried");
    redisReply *r = kt_cmd("ZRANGE retry 0 0");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 1);
    const redisReply *e = r->element[0];
    /* Every original field, byte for byte, is still in the stored entry. */
    const char *args = strstr(fail, "\"args\":");
    size_t args_len = (size_t)(strstr(fail, ",\"jid\"") - args);
    cr_assert(memmem(e->str, e->len, args, args_len), "args changed in the retry entry");
    cr_assert(memmem(e->str, e->len, "\"error_class\":\"RuntimeError\"", 28));
    cr_assert(e->len < (size_t)nf + 20000, "the error message is bounded (entry is %zu bytes)", e->len);
    freeReplyObject(r);
    cr_assert_eq(kt_int("ZCARD dead"), 0);
    still_works_then_stop(&w, "b0000000000000000000000f");
    free(s);
    free(rec);
    free(fail);
}

Test(badinput, non_utf8_args_are_kept_exactly_in_the_retry_entry)
{
    /* A Latin-1 "café", a lone continuation byte, an overlong '/', an
     * invalid 4-byte lead: a Ruby client writing binary strings can do this. */
    const char raw[] = "{\"class\":\"FailJob\",\"args\":[\"caf\xe9 \x80 \xc0\xaf \xf8\x88\x80\x80\x80\",7],"
                       "\"jid\":\"d0000000000000000000000a\",\"retry\":true,\"queue\":\"default\"}";
    const char args[] = "\"args\":[\"caf\xe9 \x80 \xc0\xaf \xf8\x88\x80\x80\x80\",7]";
    worker_t w = start_worker();
    push_raw(raw, sizeof(raw) - 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 20), "no retry entry: %s (dead %lld)",
              kt_capstan_log(w.pid), kt_int("ZCARD dead"));
    redisReply *r = kt_cmd("ZRANGE retry 0 0");
    const redisReply *e = r->element[0];
    cr_assert(memmem(e->str, e->len, args, sizeof(args) - 1), "bytes changed: %.*s", (int)e->len, e->str);
    cr_assert(memmem(e->str, e->len, "\"jid\":\"d0000000000000000000000a\"", 32));
    cr_assert(memmem(e->str, e->len, "\"retry_count\":0", 15));
    freeReplyObject(r);
    cr_assert_eq(kt_int("ZCARD dead"), 0);
    still_works_then_stop(&w, "b00000000000000000000010");
}

/* All the kinds at once, mixed with good jobs: each one ends up exactly
 * where it should, and none is lost. */
Test(badinput, every_payload_is_accounted_for)
{
    worker_t w = start_worker();
    const char *bad[] = {
        "{\"class\":",
        "[1,2,3]",
        "{\"args\":[],\"jid\":\"e0000000000000000000000a\"}",
        "{\"class\":\"NoopJob\",\"args\":[]}",
        "{\"class\":\"NoopJob\",\"args\":\"x\",\"jid\":\"e0000000000000000000000b\"}",
        "",
        "not json at all \xff\xfe",
    };
    size_t nbad = sizeof(bad) / sizeof(bad[0]);
    char jid[32];
    for (size_t i = 0; i < nbad; i++) {
        push_raw(bad[i], strlen(bad[i]));
        snprintf(jid, sizeof(jid), "f00000000000000000000%03zu", i);
        push_job("RecordJob", jid, "[\"" REC "\"]");
    }
    push_job("FailJob", "f0000000000000000000fa11", "[\"on purpose\"]");
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == (long long)nbad && kt_int("ZCARD retry") == 1
                            && kt_int("SCARD " REC) == (long long)nbad, 30),
              "dead %lld (want %zu), retry %lld, records %lld: %s", kt_int("ZCARD dead"), nbad,
              kt_int("ZCARD retry"), kt_int("SCARD " REC), kt_capstan_log(w.pid));
    /* The not-UTF-8 text is kept in base64, the rest as the argument. */
    redisReply *r = kt_cmd("ZRANGE dead 0 -1");
    int b64 = 0;
    for (size_t i = 0; i < r->elements; i++)
        b64 += strstr(r->element[i]->str, "\"payload_base64\":\"bm90IGpzb24gYXQgYWxsIP/+\"") != NULL;
    freeReplyObject(r);
    cr_assert_eq(b64, 1, "non-UTF-8 text kept as base64");
    still_works_then_stop(&w, "b00000000000000000000011");
}

/* `capstan run` refuses bad settings before it starts: one line, exit 78. */
static void assert_config_error(const char *const *args, const char *want1, const char *want2)
{
    const char *argv[16] = { "run", "-r", getenv("CAPSTAN_PLUGIN") };
    int n = 3;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *out = NULL;
    int st = kt_capstan_run(argv, &out);
    cr_assert_eq(st, 78, "exit status %d: %s", st, out);
    size_t len = strlen(out);
    cr_assert(len > 0 && out[len - 1] == '\n' && !memchr(out, '\n', len - 1),
              "one line expected: %s", out);
    cr_assert(strstr(out, want1), "\"%s\" not in: %s", want1, out);
    if (want2)
        cr_assert(strstr(out, want2), "\"%s\" not in: %s", want2, out);
    free(out);
}

Test(badinput, unknown_flag_exits_78)
{
    assert_config_error((const char *[]){ "--no-such-flag", NULL }, "--no-such-flag", NULL);
    assert_config_error((const char *[]){ "-c", "many", NULL }, "--concurrency", "many");
}

Test(badinput, unknown_config_key_names_file_line_key)
{
    char *path = kt_write_file("bad.yml",
                               "concurrency: 2\n:queues:\n  - default\nheartbeat_intreval: 3\n");
    char want[600];
    snprintf(want, sizeof(want), "%s:4", path);
    assert_config_error((const char *[]){ "-C", path, NULL }, want, "heartbeat_intreval");
    free(path);
}

Test(badinput, bad_redis_url_exits_78)
{
    assert_config_error((const char *[]){ "--redis-url", "http://127.0.0.1:6379", NULL },
                        "redis", NULL);
    assert_config_error((const char *[]){ "--redis-url", "redis://127.0.0.1:notaport/0", NULL },
                        "port", NULL);
}

Test(badinput, missing_plugin_exits_78_naming_it)
{
    char *path = kt_tmp("no-such-plugin.so");
    assert_config_error((const char *[]){ "-r", path, NULL }, path, NULL);
    free(path);
}

/* CPU seconds the process has used so far (user + system). */
static double cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Fields 14 and 15, counted after the ")" that ends the command name. */
    const char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    cr_assert(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

Test(badinput, queue_key_of_wrong_type_is_reported_not_spun_on)
{
    freeReplyObject(kt_cmd("SET queue:default not-a-list"));
    worker_t w = start_worker();
    cr_assert(KT_WAIT_UNTIL(kt_log_count(w.pid, "WRONGTYPE") >= 1, 10), "not reported: %s",
              kt_capstan_log(w.pid));
    /* The worker process, the supervisor's child, as its identity names it. */
    pid_t wpid = (pid_t)atoi(strchr(w.identity, ':') + 1);
    cr_assert_eq(kt_parent_pid(wpid), w.pid);
    double c0 = cpu_seconds(wpid);
    kt_sleep(2);
    double used = cpu_seconds(wpid) - c0;
    cr_assert(used < 0.5, "the worker spins on the error (%.2f CPU s in 2 s)", used);
    cr_assert_eq(kt_log_count(w.pid, "WRONGTYPE"), 1, "reported once: %s", kt_capstan_log(w.pid));
    freeReplyObject(kt_cmd("DEL queue:default"));
    still_works_then_stop(&w, "b00000000000000000000012");
}

/* The log line of job jid, malloc'd, or NULL when there is none. */
static char *log_line_of(const char *log, const char *jid)
{
    char needle[64];
    snprintf(needle, sizeof(needle), " jid=%s ", jid);
    const char *p = strstr(log, needle);
    if (!p)
        return NULL;
    while (p > log && p[-1] != '\n')
        p--;
    return strndup(p, strcspn(p, "\n"));
}

/* Tags without a single string once printed memory past a buffer into the
 * log (and aborted a sanitized build). */
Test(badinput, tags_without_strings_log_no_tags)
{
    worker_t w = start_worker();
    const char *tags[] = { "[]", "[1,2]", "[null]", "[\"a\",1]" };
    const char *want[] = { NULL, NULL, NULL, " tags=a " };
    char jid[32], p[256];
    for (size_t i = 0; i < 4; i++) {
        snprintf(p, sizeof(p), "{\"class\":\"RecordJob\",\"args\":[\"" REC "\"],"
                 "\"jid\":\"a000000000000000000000%02zu\",\"tags\":%s}", i, tags[i]);
        push_raw(p, strlen(p));
    }
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD " REC) == 4, 20), "ran %lld of 4: %s",
              kt_int("SCARD " REC), kt_capstan_log(w.pid));
    still_works_then_stop(&w, "b00000000000000000000012");
    char *log = kt_capstan_log(w.pid);
    for (const unsigned char *c = (const unsigned char *)log; *c; c++)
        cr_assert(*c == '\n' || (*c >= 0x20 && *c < 0x7f), "byte 0x%02x at %zu in the log: %s",
                  *c, (size_t)(c - (const unsigned char *)log), log);
    for (size_t i = 0; i < 4; i++) {
        snprintf(jid, sizeof(jid), "a000000000000000000000%02zu", i);
        char *line = log_line_of(log, jid);
        cr_assert(line, "no log line for %s: %s", jid, log);
        if (want[i])
            cr_assert(strstr(line, want[i]), "tags %s: %s", tags[i], line);
        else
            cr_assert(!strstr(line, "tags="), "tags %s: %s", tags[i], line);
        free(line);
    }
    free(log);
}

/* Control characters in a class name, jid, tag or error message once split
 * a text log line in two (or forged a line): they are escaped, so each
 * line of the log starts with its timestamp. */
Test(badinput, control_characters_in_a_payload_cannot_split_a_log_line)
{
    worker_t w = start_worker();
    const char *p = "{\"class\":\"Evil\\nClass\\u0001\",\"args\":[],\"retry\":true,"
                    "\"queue\":\"default\",\"jid\":\"e0000000000000000000000a\\r\","
                    "\"tags\":[\"t\\n2026-01-01T00:00:00.000Z pid=1 tid=x INFO: forged\"]}";
    push_raw(p, strlen(p));
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 20), "not failed: %s", kt_capstan_log(w.pid));
    still_works_then_stop(&w, "b00000000000000000000013");
    char *log = kt_capstan_log(w.pid);
    for (const char *line = log; *line; line = strchr(line, '\n') + 1) {
        cr_assert(strncmp(line, "20", 2) == 0 && line[4] == '-' && line[10] == 'T',
                  "a line that is not a log line: %.80s\nin %s", line, log);
        if (!strchr(line, '\n'))
            break;
    }
    cr_assert(strstr(log, " class=Evil\\nClass\\x01 jid=e0000000000000000000000a\\r tags=t\\n2026"),
              "%s", log);
    cr_assert_null(strstr(log, "\nClass"), "%s", log);
    cr_assert_null(strstr(log, "\n2026-01-01"), "%s", log);
    free(log);
}
