/* The capstan command's small tools: push, stats, version, help. */
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/client.h"

TestSuite(cli, .timeout = 60, .fini = kt_kill_children);

static char *first_line(char *s)
{
    s[strcspn(s, "\n")] = '\0';
    return s;
}

Test(cli, push_prints_the_jid_and_enqueues_a_sidekiq_payload)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"k\", 12345678901234567890123]",
                                             "-q", "critical", "--retry", "3", NULL }, &out), 0, "%s", out);
    char *jid = first_line(out);
    cr_assert_eq(strlen(jid), 24, "a 24-hex jid: %s", jid);
    char *payload = kt_str("LINDEX queue:critical 0");
    cr_assert_not_null(payload);
    json_t *j = json_loads(payload, JSON_DECODE_INT_AS_REAL, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "class")), "RecordJob");
    cr_assert_str_eq(json_string_value(json_object_get(j, "jid")), jid);
    cr_assert_str_eq(json_string_value(json_object_get(j, "queue")), "critical");
    cr_assert_float_eq(json_number_value(json_object_get(j, "retry")), 3.0, 1e-9);
    cr_assert(json_is_real(json_object_get(j, "created_at")));
    cr_assert(json_is_real(json_object_get(j, "enqueued_at")));
    cr_assert(strstr(payload, "\"args\":[\"k\", 12345678901234567890123]"), "args kept as given: %s", payload);
    cr_assert_eq(kt_int("SISMEMBER queues critical"), 1);
    json_decref(j);
    free(payload);
    free(out);
}

Test(cli, push_in_schedules_without_enqueued_at)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "--in", "60", NULL }, &out), 0, "%s", out);
    cr_assert_eq(kt_int("ZCARD schedule"), 1);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    redisReply *r = kt_cmd("ZRANGE schedule 0 -1 WITHSCORES");
    cr_assert_eq(r->elements, 2);
    cr_assert_null(strstr(r->element[0]->str, "enqueued_at"), "%s", r->element[0]->str);
    cr_assert(strstr(r->element[0]->str, first_line(out)));
    double score = atof(r->element[1]->str), now = (double)time(NULL);
    cr_assert(score > now + 55 && score < now + 65, "score %f", score);
    freeReplyObject(r);
    free(out);
}

Test(cli, push_refuses_bad_input)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "{\"not\":\"an array\"}", NULL }, &out), 64);
    cr_assert(strstr(out, "JSON array"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "[1", NULL }, &out), 64);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "--retry", "maybe", NULL }, &out), 64);
    cr_assert(strstr(out, "--retry"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", NULL }, &out), 64);
    free(out);
    const char *bad_times[][2] = { { "--in", "inf" }, { "--in", "nan" }, { "--at", "inf" }, { "--at", "nan" } };
    for (size_t i = 0; i < sizeof(bad_times) / sizeof(bad_times[0]); i++) {
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", bad_times[i][0], bad_times[i][1], NULL },
                                    &out), 64, "%s %s: %s", bad_times[i][0], bad_times[i][1], out);
        cr_assert(strstr(out, bad_times[i][0]), "%s", out);
        free(out);
    }
    cr_assert_eq(kt_int("LLEN queue:default"), 0, "nothing was pushed");
    cr_assert_eq(kt_int("ZCARD schedule"), 0, "nothing was scheduled");
}

/* `queue:` and `queue:a b` are queues no worker can be told to read (the
 * queues: setting and -q refuse those names): push refuses them too, from
 * the flag and from a class's queue: in -C FILE, and writes nothing. */
Test(cli, push_refuses_queue_names_the_config_refuses)
{
    const char *names[] = { "", "a b", "tab\there", " lead" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char *out = NULL;
        int st = kt_capstan_run((const char *[]){ "push", "NoopJob", "--queue", names[i], NULL }, &out);
        cr_assert_eq(st, 64, "--queue '%s': exit %d: %s", names[i], st, out);
        cr_assert(strstr(out, "--queue") && (strstr(out, "empty") || strstr(out, "contains a space")),
                  "%s", out);
        free(out);
    }
    char *conf = kt_write_file("spaced.yml", "classes:\n  NoopJob:\n    queue: a b\n");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "-C", conf, NULL }, &out), 78, "%s", out);
    cr_assert(strstr(out, "spaced.yml:3: classes.NoopJob.queue: queue name \"a b\" contains a space"),
              "%s", out);
    free(out);
    free(conf);
    cr_assert_eq(kt_int("EXISTS queue:"), 0);
    cr_assert_eq(kt_int("EXISTS queue:a b"), 0);
    cr_assert_eq(kt_int("SCARD queues"), 0, "no queue was registered");
    /* A plain name still goes through. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "--queue", "a_b-c.d:e", NULL }, &out), 0,
                 "%s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:a_b-c.d:e"), 1);
}

/* A capstan.yml with fast scheduler polls and beats, plus extra; caller frees. */
static char *fast_conf(const char *name, const char *extra)
{
    char *body = NULL;
    cr_assert(asprintf(&body, "poll_interval_average: 1\nheartbeat_interval: 1\n%s", extra) > 0);
    char *path = kt_write_file(name, body);
    free(body);
    return path;
}

/* Runs the one FailJob waiting in queue:Q on a capstan that has no class
 * options of its own (the payload must carry them), makes its retry due at
 * once, and asserts it is dead after exactly one retry. */
static void dies_after_one_retry(const char *queue, const char *jid)
{
    char *conf = fast_conf("server.yml", "");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", conf, "-q", queue, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15), "first failure retried: %s",
              kt_capstan_log(pid));
    redisReply *r = kt_cmd("ZRANGE retry 0 0");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 1);
    cr_assert(strstr(r->element[0]->str, jid), "%s", r->element[0]->str);
    cr_assert_eq(kt_int("ZADD retry XX CH 1 %b", r->element[0]->str, r->element[0]->len), 1);
    freeReplyObject(r);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 20), "dead after one retry: %s",
              kt_capstan_log(pid));
    cr_assert_eq(kt_int("ZCARD retry"), 0);
    redisReply *dead = kt_cmd("ZRANGE dead 0 0");
    cr_assert(dead->type == REDIS_REPLY_ARRAY && dead->elements == 1);
    const char *item = dead->element[0]->str;
    cr_assert(strstr(item, jid) && strstr(item, "\"retry_count\":1"), "%s", item);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    freeReplyObject(dead);
    free(conf);
}

/* A class's YAML unique_for (Sidekiq Enterprise's) makes `capstan push -C`
 * take v9's lock at the push, for unique_for seconds, as Enterprise's client
 * does: a second push of the same args is denied (exit 3) while the first
 * waits; once it ran, a push is taken again, and runs. */
Test(cli, push_with_a_configs_unique_for_refuses_a_second_push)
{
    char *conf = kt_write_file("uf.yml", "classes:\n  RecordJob:\n    queue: uf\n    unique_for: 60\n");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"puf\"]", "-C", conf, NULL },
                                &out), 0, "%s", out);
    free(out);
    char *p = kt_str("LINDEX queue:uf 0"), *d = strstr(p, "\"lock_digest\":\"");
    cr_assert(d && strstr(p, "\"lock\":\"until_executed\"") && strstr(p, "\"lock_ttl\":60"), "%s", p);
    char digest[128];
    cr_assert_eq(sscanf(d, "\"lock_digest\":\"%127[^\"]", digest), 1, "%s", p);
    long long pttl = kt_int("PTTL %s:LOCKED", digest);
    cr_assert(pttl > 0 && pttl <= 60000, "v9's lock, for unique_for: PTTL %lld", pttl);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"puf\"]", "-C", conf, NULL },
                                &out), 3, "%s", out);
    cr_assert(strstr(out, "denied") && strstr(out, digest), "%s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:uf"), 1);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", conf, "-q", "uf", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD puf") == 1 && kt_int("EXISTS %s:LOCKED", digest) == 0, 20),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"puf\"]", "-C", conf, NULL },
                                &out), 0, "%s", out);
    free(out);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD puf") == 2, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    free(p);
    free(conf);
}

Test(cli, push_with_a_config_file_writes_the_class_options)
{
    char *conf = kt_write_file("push.yml", "classes:\n  FailJob:\n    retry: 1\n    queue: low\n"
                                           "  RecordJob:\n    lock: until_executed\n");
    char *out = NULL;
    int st = kt_capstan_run((const char *[]){ "push", "FailJob", "[\"x\"]", "-C", conf, NULL }, &out);
    cr_assert_eq(st, 0, "%s", out);
    char *jid = first_line(out);
    char *payload = kt_str("LINDEX queue:low 0");
    cr_assert(payload && strstr(payload, "\"retry\":1,") && strstr(payload, "\"queue\":\"low\""),
              "the class's retry and queue are in the payload: %s", payload);
    cr_assert_eq(kt_int("SISMEMBER queues low"), 1);

    /* The flags still win, as a push's own options do in Sidekiq. */
    char *out2 = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "FailJob", "-C", conf, "--retry", "4", "-q",
                                              "other", NULL }, &out2), 0, "%s", out2);
    char *p2 = kt_str("LINDEX queue:other 0");
    cr_assert(p2 && strstr(p2, "\"retry\":4,"), "%s", p2);
    free(out2);

    /* The class's lock: a second push of the same args is refused. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"u\"]", "-C", conf, NULL }, &out2), 0,
                 "%s", out2);
    free(out2);
    char *p3 = kt_str("LINDEX queue:default 0");
    cr_assert(p3 && strstr(p3, "\"lock\":\"until_executed\""), "%s", p3);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"u\"]", "-C", conf, NULL }, &out2), 3,
                 "%s", out2);
    free(out2);

    /* A bad file is a config error naming the file. */
    char *bad = kt_write_file("bad.yml", "classes:\n  FailJob:\n    retry: lots\n");
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "FailJob", "-C", bad, NULL }, &out2), 78, "%s", out2);
    cr_assert(strstr(out2, "bad.yml"), "%s", out2);
    free(out2);

    dies_after_one_retry("low", jid);
    free(bad);
    free(p2);
    free(p3);
    free(payload);
    free(out);
    free(conf);
}

Test(cli, the_c_client_writes_registered_and_configured_class_options)
{
    char err[CAPSTAN_ERRLEN], jid[25], jid2[25];
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    capstan_class_opts_t o = CAPSTAN_CLASS_OPTS_INIT;
    o.retry = 1;
    o.queue = "low";
    cr_assert_eq(capstan_client_set_class(c, "FailJob", &o), 0);
    cr_assert_str_eq(capstan_client_class_queue(c, "FailJob"), "low");
    cr_assert_null(capstan_client_class_queue(c, "NoopJob"), "no queue: a push falls back to default");
    cr_assert_eq(capstan_client_push(c, "FailJob", "[\"x\"]", NULL, jid), 0, "%s", capstan_client_error(c));
    char *payload = kt_str("LINDEX queue:low 0");
    cr_assert(payload && strstr(payload, "\"retry\":1,"), "%s", payload);

    /* A configured classes: section comes first, as on the server. */
    capstan_config_t *cfg = capstan_config_new();
    char *conf = kt_write_file("client.yml", "classes:\n  FailJob:\n    retry: false\n    queue: q2\n");
    cr_assert_eq(capstan_config_load_file(cfg, conf, err), 0, "%s", err);
    capstan_client_use_config(c, cfg);
    cr_assert_str_eq(capstan_client_class_queue(c, "FailJob"), "q2");
    cr_assert_eq(capstan_client_push(c, "FailJob", "[]", NULL, jid2), 0, "%s", capstan_client_error(c));
    char *p2 = kt_str("LINDEX queue:q2 0");
    cr_assert(p2 && strstr(p2, "\"retry\":false,"), "%s", p2);
    capstan_client_free(c);
    capstan_config_free(cfg);

    dies_after_one_retry("low", jid);
    free(p2);
    free(conf);
    free(payload);
}

Test(cli, push_reports_an_unreachable_redis)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "--redis-url", "redis://127.0.0.1:1/0", NULL },
                                &out), 1);
    cr_assert(strstr(out, "127.0.0.1:1"), "%s", out);
    free(out);
}

Test(cli, stats_json_shows_counts_queues_latency_and_working_lists)
{
    kt_cmd("SET stat:processed 42");
    kt_cmd("SET stat:failed 3");
    kt_cmd("SADD queues default low");
    double old = (double)time(NULL) - 30;
    char payload[256];
    snprintf(payload, sizeof(payload),
             "{\"class\":\"NoopJob\",\"jid\":\"aaaaaaaaaaaaaaaaaaaaaaaa\",\"args\":[],\"enqueued_at\":%.3f}", old);
    kt_cmd("LPUSH queue:default %s", payload);
    kt_cmd("ZADD retry 1 x");
    kt_cmd("ZADD dead 1 y 2 z");
    kt_cmd("LPUSH uniquejobs:working:deadhost:1:abcdefabcdef %s", payload);
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", NULL }, &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(j, "processed")), 42);
    cr_assert_eq(json_integer_value(json_object_get(j, "failed")), 3);
    cr_assert_eq(json_integer_value(json_object_get(j, "retries")), 1);
    cr_assert_eq(json_integer_value(json_object_get(j, "dead")), 2);
    json_t *qs = json_object_get(j, "queues");
    cr_assert_eq(json_array_size(qs), 2);
    json_t *def = json_array_get(qs, 0);
    cr_assert_str_eq(json_string_value(json_object_get(def, "name")), "default");
    cr_assert_eq(json_integer_value(json_object_get(def, "size")), 1);
    double lat = json_real_value(json_object_get(def, "latency"));
    cr_assert(lat > 25 && lat < 40, "latency %f", lat);
    json_t *w = json_array_get(json_object_get(j, "working"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(w, "identity")), "deadhost:1:abcdefabcdef");
    cr_assert_eq(json_integer_value(json_object_get(w, "size")), 1);
    cr_assert(json_is_false(json_object_get(w, "alive")));
    json_decref(j);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", NULL }, &out), 0);
    cr_assert(strstr(out, "Processed: 42  Failed: 3"), "%s", out);
    cr_assert(strstr(out, "deadhost:1:abcdefabcdef  1 jobs  owner DEAD"), "%s", out);
    free(out);
}

Test(cli, stats_lists_a_running_process)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "3", "-g", "stat-tag", NULL });
    char *out = NULL;
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 20));
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", NULL }, &out), 0);
    json_t *j = json_loads(out, 0, NULL);
    json_t *p = json_array_get(json_object_get(j, "processes"), 0);
    cr_assert_not_null(p, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(p, "concurrency")), 3);
    cr_assert_str_eq(json_string_value(json_object_get(p, "tag")), "stat-tag");
    cr_assert(json_is_false(json_object_get(p, "quiet")));
    json_decref(j);
    free(out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
}

/* A pid that no process has: a child's, once it has exited and been reaped. */
static pid_t gone_pid(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    cr_assert(pid > 0);
    waitpid(pid, NULL, 0);
    cr_assert(kill(pid, 0) != 0);
    return pid;
}

/* An owner on this host whose pid is gone is shown dead at once, though its
 * liveness key (and its heartbeat) have not lapsed; one whose pid runs, or
 * on another host, is shown by its key as before. */
Test(cli, stats_shows_a_same_host_owner_whose_pid_is_gone_as_dead)
{
    char host[256] = "", dead[400], live[400], payload[] = "{\"class\":\"NoopJob\",\"args\":[]}";
    const char *dyno = getenv("DYNO");
    if (dyno)
        snprintf(host, sizeof(host), "%s", dyno);
    else
        gethostname(host, sizeof(host) - 1);
    pid_t pid = gone_pid();
    snprintf(dead, sizeof(dead), "%s:%d:abcdefabcdef", host, (int)pid);
    snprintf(live, sizeof(live), "%s:%d:123456123456", host, (int)getpid());
    const char *ids[] = { dead, live, "otherhost:1:abcdefabcdef" };
    for (size_t i = 0; i < 3; i++) {
        freeReplyObject(kt_cmd("LPUSH uniquejobs:working:%s %s", ids[i], payload));
        freeReplyObject(kt_cmd("SET uniquejobs:heartbeat:%s 1 EX 60", ids[i]));
        freeReplyObject(kt_cmd("SADD processes %s", ids[i]));
        freeReplyObject(kt_cmd("HSET %s info {\"concurrency\":2} busy 0 beat %ld quiet false rss 1",
                               ids[i], (long)time(NULL)));
    }
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", NULL }, &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    size_t i;
    json_t *e;
    int seen = 0;
    /* The same judgement in both lists. */
    static const char *const lists[] = { "working", "processes" };
    for (size_t l = 0; l < 2; l++) {
        json_array_foreach(json_object_get(j, lists[l]), i, e) {
            const char *id = json_string_value(json_object_get(e, "identity"));
            int is_dead = strcmp(id, dead) == 0;
            cr_assert_eq(json_is_true(json_object_get(e, "alive")), !is_dead, "%s: %s", id, out);
            cr_assert_eq(json_integer_value(json_object_get(e, "pid_gone")), is_dead ? pid : 0,
                         "%s: %s", id, out);
            seen++;
        }
    }
    cr_assert_eq(seen, 6, "%s", out);
    json_decref(j);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", NULL }, &out), 0);
    char want[600];
    snprintf(want, sizeof(want), "%s  1 jobs  owner dead (pid %d gone", dead, (int)pid);
    cr_assert(strstr(out, want), "%s", out);
    snprintf(want, sizeof(want), "%s  busy 0 of 2  dead (pid %d gone)", dead, (int)pid);
    cr_assert(strstr(out, want), "%s", out);
    snprintf(want, sizeof(want), "%s  1 jobs  owner alive", live);
    cr_assert(strstr(out, want), "%s", out);
    cr_assert(strstr(out, "otherhost:1:abcdefabcdef  1 jobs  owner alive"), "%s", out);
    free(out);
    /* Display only: recovery still goes by the liveness key. */
    cr_assert_eq(kt_int("LLEN uniquejobs:working:%s", dead), 1);
}

Test(cli, version_help_and_unknown_commands)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "version", NULL }, &out), 0);
    cr_assert(strncmp(out, "capstan ", 8) == 0, "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "--help", NULL }, &out), 0);
    cr_assert(strstr(out, "push") && strstr(out, "stats"), "%s", out);
    free(out);
    const char *subs[] = { "run", "push", "stats" };
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kt_capstan_run((const char *[]){ subs[i], "--help", NULL }, &out), 0, "%s --help", subs[i]);
        cr_assert(strstr(out, "Usage: capstan"), "%s", out);
        free(out);
    }
    /* An operand version does not take is a usage error, not ignored. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "version", "extra", NULL }, &out), 64, "%s", out);
    cr_assert(strstr(out, "capstan version: unexpected argument \"extra\""), "%s", out);
    cr_assert_null(strstr(out, "capstan 0"), "no version on a usage error: %s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "frobnicate", NULL }, &out), 64);
    cr_assert(strstr(out, "unknown command"), "%s", out);
    free(out);
    /* help COMMAND is COMMAND --help; help of no such command is an error. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "help", "push", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "Usage: capstan push"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "help", "extra", NULL }, &out), 64, "%s", out);
    cr_assert(strstr(out, "capstan help: unknown command \"extra\""), "%s", out);
    free(out);
}

Test(cli, numeric_flags_out_of_range_exit_78_naming_the_flag)
{
    const char *cases[][2] = { { "-t", "inf" }, { "--timeout", "nan" }, { "--timeout", "-3" },
                               { "--timeout", "1e999" }, { "-c", "1e3" }, { "--metrics-port", "99999" } };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out = NULL;
        int st = kt_capstan_run((const char *[]){ "run", cases[i][0], cases[i][1], NULL }, &out);
        cr_assert_eq(st, 78, "%s %s: exit %d: %s", cases[i][0], cases[i][1], st, out);
        const char *flag = cases[i][0][1] == 't' ? "--timeout" : cases[i][0][1] == 'c' ? "--concurrency"
                                                                                        : cases[i][0];
        cr_assert(strstr(out, flag) && strchr(out, '\n') == out + strlen(out) - 1, "%s", out);
        free(out);
    }
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "x", "--ttl", "inf", "--", "true", NULL }, &out), 64,
                 "%s", out);
    cr_assert(strstr(out, "--ttl"), "%s", out);
    free(out);
    /* Every subcommand parses numbers the same strict way. */
    const char *const sub_cases[][5] = { { "locks", "reap", "-t", "inf", NULL },
                                         { "locks", "reap", "-g", "nan", NULL },
                                         { "locks", "list", "-l", "5x", NULL },
                                         { "top", "--interval", "inf", NULL, NULL },
                                         { "push", "NoopJob", "--in", "1e999", NULL } };
    for (size_t i = 0; i < sizeof(sub_cases) / sizeof(sub_cases[0]); i++) {
        out = NULL;
        int st = kt_capstan_run(sub_cases[i], &out);
        cr_assert_eq(st, 64, "%s %s: exit %d: %s", sub_cases[i][0], sub_cases[i][1], st, out);
        free(out);
    }
    /* A number the flag parser takes but no duration should be. */
    out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-t", "1e300", NULL }, &out), 78, "%s", out);
    cr_assert(strstr(out, "timeout: must be at most"), "%s", out);
    free(out);
}

/* The whole of a file, NULs included (so /proc/PID/cmdline reads whole). */
static size_t read_bytes(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

Test(cli, a_password_in_redis_url_is_not_shown_anywhere)
{
    kt_cmd("ACL SETUSER capstanpw on >s3cr3tpw ~* &* +@all");
    const char *plain = kt_url(); /* redis://127.0.0.1:PORT/DB */
    char url[256];
    snprintf(url, sizeof(url), "redis://capstanpw:s3cr3tpw@%s", plain + strlen("redis://"));
    /* A URL given without its flag is refused, and not echoed whole. */
    char *stray = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", url, NULL }, &stray), 78, "%s", stray);
    cr_assert(strstr(stray, "unexpected argument") && !strstr(stray, "s3cr3tpw"), "%s", stray);
    free(stray);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", url, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 20), "%s", kt_capstan_log(pid));

    char path[64], cmdline[8192];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    size_t n = read_bytes(path, cmdline, sizeof(cmdline));
    cr_assert_gt(n, 0);
    cr_assert_null(memmem(cmdline, n, "s3cr3tpw", 8), "the password is in ps");
    cr_assert_not_null(memmem(cmdline, n, "capstanpw:", 10), "the rest of the URL stays");

    char *ident = kt_str("SRANDMEMBER processes");
    char *info = kt_str("HGET %s info", ident);
    cr_assert(info && !strstr(info, "s3cr3tpw"), "%s", info);
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--redis-url", url, NULL }, &out), 0, "%s", out);
    cr_assert(!strstr(out, "s3cr3tpw"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", "--redis-url", url, NULL }, &out), 0, "%s",
                 out);
    cr_assert(!strstr(out, "s3cr3tpw"), "%s", out);
    free(out);

    /* capstan lock runs for as long as its command: it connects with the
     * password, yet its command line (read by the command) lacks it. */
    char flag[300];
    snprintf(flag, sizeof(flag), "--redis-url=%s", url);
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "pw", flag, "--", "sh", "-c",
                                              "tr '\\0' ' ' < /proc/$PPID/cmdline", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "capstanpw:") && strstr(out, "lock pw") && !strstr(out, "s3cr3tpw"), "%s", out);
    free(out);

    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "REDIS_URL or the config file"), "%s", log);
    cr_assert(!strstr(log, "s3cr3tpw"), "%s", log);
    free(log);
    free(info);
    free(ident);
}

/* ---- `capstan run` failures that explain themselves ------------------------ */

/* True when s is exactly one line. */
static int one_line(const char *s)
{
    const char *nl = strchr(s, '\n');
    return nl && nl[1] == '\0';
}

Test(cli, run_with_a_missing_config_file_exits_78_in_one_line)
{
    char *out = NULL;
    int st = kt_capstan_run((const char *[]){ "run", "-C", "/nonexistent/sidekiq.yml", NULL }, &out);
    cr_assert_eq(st, 78, "exit %d: %s", st, out);
    cr_assert(strstr(out, "/nonexistent/sidekiq.yml") && strstr(out, "No such file or directory"),
              "%s", out);
    cr_assert(one_line(out), "%s", out);
    free(out);
}

/* A plugin whose init returns the code of a refused registration (a
 * limiter of size 0) stops run with the reason the library recorded, on
 * the last line: the operator sees what to fix. */
Test(cli, run_with_a_plugin_whose_init_fails_says_why)
{
    const char *plugin = getenv("CAPSTAN_BAD_PLUGIN");
    cr_assert(plugin, "CAPSTAN_BAD_PLUGIN is set by tests/meson.build");
    char *out = NULL;
    int st = kt_capstan_run((const char *[]){ "run", "-r", plugin, "--redis-url", kt_url(), NULL }, &out);
    cr_assert_eq(st, 78, "exit %d: %s", st, out);
    char *last = kt_last_line(out);
    char want[600];
    snprintf(want, sizeof(want), "plugin %s: capstan_plugin_init returned -1: limiter ReportJob: size must be >= 1",
             plugin);
    cr_assert(strstr(last, want), "%s", out);
    free(last);
    free(out);
}

/* A job whose class is a typo of a registered one (Recordjob for the
 * example plugin's RecordJob) is logged once, with the registered name. */
Test(cli, an_unknown_class_near_a_registered_one_suggests_it_once)
{
    kt_push_jobs("Recordjob", "[\"typo\"]", 43, 3);
    char *cfg = kt_write_conf("unknown_class: fail\n");
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 3, 30), "the three fail: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "no handler for Recordjob"), 1, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "did you mean RecordJob?"), 1, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    free(cfg);
}

/* A schedule's zone that would read as another (an empty tz:, a corrupt
 * zone file) stops the command at the config, in one line naming the
 * file, the line and the key. */
Test(cli, empty_tz_exits_78_in_one_line_at_its_line)
{
    char *conf = kt_write_file("emptytz.yml", "periodic:\n  a:\n    class: A\n    cron: \"0 9 * * *\"\n"
                                              "    tz: \"\"\n");
    char *out = NULL, want[600];
    int st = kt_capstan_run((const char *[]){ "periodic", "-C", conf, NULL }, &out);
    cr_assert_eq(st, 78, "exit %d: %s", st, out);
    snprintf(want, sizeof(want), "%s:5: periodic.a: tz: is empty (leave it out for UTC)", conf);
    cr_assert(strstr(out, want) && one_line(out), "%s", out);
    free(out);
    free(conf);
}

/* A private redis-server (the shared one must keep working for the other
 * tests) with a password and an ACL user that may not load scripts. */
static void start_locked_redis(kt_aof_redis_t *srv)
{
    kt_aof_init(srv, "locked-redis");
    kt_aof_start(srv);
    redisContext *c = kt_aof_connect(srv);
    cr_assert(c);
    freeReplyObject(redisCommand(c, "ACL SETUSER noscript on >pw ~* +@all -@scripting"));
    freeReplyObject(redisCommand(c, "ACL SETUSER noevalsha on >pw ~* &* +@all -evalsha"));
    freeReplyObject(redisCommand(c, "CONFIG SET requirepass right"));
    redisFree(c);
}

/* Starts capstan on url and waits up to limit seconds for it to exit by
 * itself; returns its status (-1 if it did not) with its log in *log. */
static int run_until_exit(const char *url, const char *const *extra, double limit, char **log,
                          double *took)
{
    const char *args[16] = { "--redis-url", url };
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 15; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    double t0 = kt_now();
    pid_t pid = kt_capstan_start(args);
    int st = kt_wait_exit(pid, limit);
    if (took)
        *took = kt_now() - t0;
    *log = kt_capstan_log(pid);
    return st;
}

Test(cli, run_with_a_wrong_password_exits_78_at_once)
{
    kt_aof_redis_t srv;
    start_locked_redis(&srv);
    char url[160], *log = NULL;
    double took = 0;
    snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d/0", srv.port);
    int st = run_until_exit(url, NULL, 10, &log, &took);
    cr_assert_eq(st, 78, "exit %d after %.1f s: %s", st, took, log);
    cr_assert(strstr(log, "WRONGPASS") || strstr(log, "invalid password"), "%s", log);
    cr_assert(took < 5, "took %.1f s", took);
    cr_assert_null(strstr(log, "wrong@"), "the password is not logged: %s", log);
    free(log);

    /* No password at all where one is required: NOAUTH. */
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", srv.port);
    st = run_until_exit(url, NULL, 10, &log, NULL);
    cr_assert_eq(st, 78, "exit %d: %s", st, log);
    cr_assert(strstr(log, "NOAUTH"), "%s", log);
    free(log);

    /* An ACL user without the right to load capstan's scripts: NOPERM. */
    snprintf(url, sizeof(url), "redis://noscript:pw@127.0.0.1:%d/0", srv.port);
    st = run_until_exit(url, NULL, 10, &log, NULL);
    cr_assert_eq(st, 78, "exit %d: %s", st, log);
    cr_assert(strstr(log, "NOPERM"), "%s", log);
    free(log);
    kt_aof_kill(&srv);
}

/* A user who may load scripts but not run them (-evalsha) could fetch
 * nothing but the odd job of a plain move: refused at start, in one line
 * naming the command and the user, not run at a job a second. */
Test(cli, run_as_a_user_without_evalsha_exits_78_at_once)
{
    kt_aof_redis_t srv;
    start_locked_redis(&srv);
    char url[160], *log = NULL;
    double took = 0;
    snprintf(url, sizeof(url), "redis://noevalsha:pw@127.0.0.1:%d/0", srv.port);
    int st = run_until_exit(url, NULL, 20, &log, &took);
    cr_assert_eq(st, 78, "exit %d after %.1f s: %s", st, took, log);
    cr_assert(strstr(log, "EVALSHA") && strstr(log, "noevalsha") && strstr(log, "NOPERM"), "%s", log);
    cr_assert_null(strstr(log, "fetch failed"), "%s", log);
    cr_assert_null(strstr(log, "Starting processing"), "%s", log);
    free(log);

    /* The same line from a command that pushes (the URL from a file: one
     * on the command line would add a warning). */
    char yml[256], *out = NULL;
    snprintf(yml, sizeof(yml), "redis_url: %s\n", url);
    char *conf = kt_write_file("noevalsha.yml", yml);
    st = kt_capstan_run((const char *[]){ "push", "-C", conf, "-q", "q", "NoopJob", NULL }, &out);
    free(conf);
    cr_assert_eq(st, 78, "exit %d: %s", st, out);
    cr_assert(strstr(out, "EVALSHA") && strstr(out, "noevalsha") && one_line(out), "%s", out);
    free(out);
    kt_aof_kill(&srv);
}

Test(cli, run_with_a_database_redis_does_not_have_exits_78)
{
    /* The test server has many databases (one per test): ask it for one
     * past the last. */
    redisReply *dbs = kt_cmd("CONFIG GET databases");
    cr_assert(dbs->type == REDIS_REPLY_ARRAY && dbs->elements == 2);
    int n = atoi(dbs->element[1]->str);
    freeReplyObject(dbs);
    const char *colon = strrchr(kt_url(), ':');
    char url[160], *log = NULL, select[32];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/%d", atoi(colon + 1), n);
    snprintf(select, sizeof(select), "SELECT %d", n);
    int st = run_until_exit(url, NULL, 10, &log, NULL);
    cr_assert_eq(st, 78, "exit %d: %s", st, log);
    cr_assert(strstr(log, select) && strstr(log, "DB index"), "%s", log);
    free(log);
}

/* A beat every microsecond floods Redis and a liveness key of ten
 * microseconds lapses between refreshes: refused before the worker starts,
 * not run (the old behaviour, which this bounds in time). */
Test(cli, run_with_periods_below_their_floor_exits_78_naming_file_and_key)
{
    static const struct {
        const char *yaml, *key;
    } cases[] = {
        { "heartbeat_interval: 0.000001\nliveness_ttl: 0.00001\n", "heartbeat_interval" },
        { "liveness_ttl: 0.00001\n", "liveness_ttl" },
        { "average_scheduled_poll_interval: 0.000001\n", "average_scheduled_poll_interval" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *conf = kt_write_file("floor.yml", cases[i].yaml);
        char *log = NULL;
        int st = run_until_exit(kt_url(), (const char *[]){ "-C", conf, NULL }, 10, &log, NULL);
        cr_assert_eq(st, 78, "%s: exit %d: %s", cases[i].yaml, st, log);
        char where[512];
        snprintf(where, sizeof(where), "%s:1: %s: must be", conf, cases[i].key);
        cr_assert(strstr(log, where) && one_line(log), "%s: %s", cases[i].yaml, log);
        free(log);
        free(conf);
    }
}

Test(cli, run_with_a_malformed_url_exits_78)
{
    const char *urls[] = { "redis://no such host/0", "redis//localhost", "redis://h:99999/0" };
    for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        char *log = NULL;
        int st = run_until_exit(urls[i], NULL, 10, &log, NULL);
        cr_assert_eq(st, 78, "%s: exit %d: %s", urls[i], st, log);
        cr_assert(strstr(log, "redis url"), "%s: %s", urls[i], log);
        free(log);
    }
}

Test(cli, run_exits_69_when_redis_stays_unreachable_for_startup_timeout)
{
    char url[64], *log = NULL;
    double took = 0;
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", kt_free_port());
    int st = run_until_exit(url, (const char *[]){ "--startup-timeout", "1", NULL }, 10, &log, &took);
    cr_assert_eq(st, 69, "exit %d after %.1f s: %s", st, took, log);
    cr_assert(took >= 0.9 && took < 5, "gave up after %.1f s", took);
    cr_assert(strstr(log, "startup_timeout"), "the message names the setting: %s", log);
    const char *first = strstr(log, "waiting for Redis");
    cr_assert(first && strstr(first + 1, "waiting for Redis"), "the warning repeats: %s", log);
    free(log);
}

Test(cli, pidfile_is_written_and_removed_and_a_rails_file_warns_in_the_log)
{
    char *pid_path = kt_tmp("capstan.pid"), *log_path = kt_tmp("capstan.log");
    char yml[1024];
    snprintf(yml, sizeof(yml),
             ":concurrency: 2\n:pidfile: %s\n:logfile: %s\n:require: ./app\n:strict: false\n"
             ":schedule:\n  nightly:\n    cron: '0 3 * * *'\n    class: NightlyJob\n    rails_env: production\n",
             pid_path, log_path);
    char *cfg = kt_write_file("sidekiq.yml", yml);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, NULL });
    char want[32];
    snprintf(want, sizeof(want), "%d\n", (int)pid);
    cr_assert(KT_WAIT_UNTIL(({ char *p = kt_read_file(pid_path); int ok = !strcmp(p, want);
                               free(p); ok; }), 20), "no pidfile %s", pid_path);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 20), "%s", kt_read_file(log_path));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0);
    cr_assert_eq(access(pid_path, F_OK), -1, "the pidfile is removed at exit");
    char *log = kt_read_file(log_path);
    cr_assert(strstr(log, "WARN: ") && strstr(log, ":4: require: not used by capstan"), "%s", log);
    cr_assert(strstr(log, ":5: strict: not used by capstan"), "%s", log);
    cr_assert(strstr(log, ":10: schedule.nightly.rails_env: not used by capstan"), "%s", log);
    cr_assert(strstr(log, "Bye!"), "logfile is honoured: %s", log);
    free(log);
    free(cfg);
    free(pid_path);
    free(log_path);
}

/* `capstan stats` against srv: its exit status, its output in *out. */
static int stats_of(const kt_aof_redis_t *srv, char **out)
{
    return kt_capstan_run((const char *[]){ "stats", "--json", "--redis-url", srv->url, NULL }, out);
}

/* EVALSHA taken from a running worker's user: its fetches (two queues: all
 * by script) get NOPERM. That is not healthy while it lasts (stats exits 1
 * naming it, /metrics counts it), and "fetching works again" waits for a
 * fetch that worked, once the right is back. */
Test(cli, a_worker_whose_fetches_get_noperm_is_unhealthy_until_one_works)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "acl-redis");
    kt_aof_start(&srv);
    redisContext *c = kt_aof_connect(&srv);
    cr_assert(c);
    freeReplyObject(redisCommand(c, "ACL SETUSER worker on >pw ~* &* +@all"));
    char yml[512];
    int mport = kt_free_port();
    snprintf(yml, sizeof(yml), "concurrency: 2\nheartbeat_interval: 1\nqueues:\n  - a\n  - b\n");
    char *conf = kt_write_file("revoked.yml", yml), mp[16], url[96];
    snprintf(mp, sizeof(mp), "%d", mport);
    snprintf(url, sizeof(url), "redis://worker:pw@127.0.0.1:%d/0", srv.port);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", conf, "--metrics-port", mp, "--redis-url", url,
                                                   NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD processes") == 1, 30), "%s", kt_capstan_log(pid));
    /* Every thread has connected (its connections keep their rights) once
     * the housekeeper beats again. */
    redisReply *id = redisCommand(c, "SRANDMEMBER processes");
    cr_assert(id && id->type == REDIS_REPLY_STRING);
    long long beat0 = kt_int_on(c, "HGET %s beat", id->str);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "HGET %s beat", id->str) > beat0 + 1, 30), "%s", kt_capstan_log(pid));
    freeReplyObject(id);
    char *out = NULL;
    int st = stats_of(&srv, &out);
    cr_assert_eq(st, 0, "healthy at first: %s", out);
    free(out);
    out = NULL;

    char *log = kt_capstan_log(pid);
    size_t mark = strlen(log);
    free(log);
    freeReplyObject(redisCommand(c, "ACL SETUSER worker -evalsha"));
    for (int i = 0; i < 5; i++) {
        char jid[25];
        kt_make_jid(jid, 77, (unsigned)i);
        char *p = kt_payload("NoopJob", "[]", jid, "a");
        freeReplyObject(redisCommand(c, "LPUSH queue:a %s", p));
        free(p);
    }
    cr_assert(KT_WAIT_UNTIL(({ free(out); out = NULL; stats_of(&srv, &out) == 1; }), 30),
              "stats stays healthy: %s\n%s", out, kt_capstan_log(pid));
    cr_assert(strstr(out, "NOPERM") && strstr(out, "evalsha"), "%s", out);
    free(out);
    out = NULL;
    char *metrics = kt_scrape(mport);
    cr_assert(metrics && strstr(metrics, "capstan_fetch_errors_total "), "%s", metrics);
    cr_assert_null(strstr(metrics, "capstan_fetch_errors_total 0\n"), "%s", metrics);
    free(metrics);
    kt_sleep(2); /* some more retries, each a NOPERM */
    log = kt_capstan_log(pid);
    cr_assert(strstr(log + mark, "fetch failed") && strstr(log + mark, "NOPERM"), "%s", log + mark);
    cr_assert_null(strstr(log + mark, "works again"), "no fetch has worked: %s", log + mark);
    free(log);

    /* Idle processors blocked in a move before the change may have taken
     * a few; the sweeps take the rest once EVALSHA is allowed again. */
    freeReplyObject(redisCommand(c, "ACL SETUSER worker +evalsha"));
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "LLEN queue:a") == 0, 30), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "fetching works again"), 30), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(({ free(out); out = NULL; stats_of(&srv, &out) == 0; }), 30), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0);
    free(conf);
    redisFree(c);
    kt_aof_kill(&srv);
}

/* A Redis Cluster node is refused at start with one clear line, rather than
 * failing later on MOVED or CROSSSLOT. */
Test(cli, run_against_a_cluster_node_exits_78)
{
    /* The cluster bus listens on a port of its own (by default port +
     * 10000, which may not exist): name a free one. */
    int port = kt_free_port(), bus = kt_free_port();
    char portstr[16], busstr[16], *dir = kt_tmp("cluster"), conf[600];
    snprintf(portstr, sizeof(portstr), "%d", port);
    snprintf(busstr, sizeof(busstr), "%d", bus);
    snprintf(conf, sizeof(conf), "%s/nodes.conf", dir);
    cr_assert_eq(mkdir(dir, 0700), 0);
    pid_t srv = fork();
    if (srv == 0) {
        execlp("redis-server", "redis-server", "--port", portstr, "--bind", "127.0.0.1",
               "--cluster-enabled", "yes", "--cluster-port", busstr,
               "--cluster-config-file", conf, "--save", "",
               "--appendonly", "no", "--dir", dir, "--logfile", "", (char *)NULL);
        _exit(127);
    }
    kt_track(srv);
    cr_assert(KT_WAIT_UNTIL(({
        redisContext *c = redisConnect("127.0.0.1", port);
        redisReply *r = c && !c->err ? redisCommand(c, "CLUSTER INFO") : NULL;
        int up = r && r->type == REDIS_REPLY_STRING;
        freeReplyObject(r);
        redisFree(c);
        up; }), 10), "the cluster node did not start");
    char url[64], *log = NULL;
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", port);
    int st = run_until_exit(url, NULL, 10, &log, NULL);
    cr_assert_eq(st, 78, "exit %d: %s", st, log);
    cr_assert(strstr(log, "Redis Cluster"), "%s", log);
    cr_assert_null(strstr(log, "orphan recovery"), "nothing of it was in Redis: %s", log);
    free(log);
    /* Every command that connects says the same, in one line. */
    const char *cmds[][6] = { { "push", "--redis-url", url, "NoopJob", NULL },
                              { "stats", "--redis-url", url, NULL },
                              { "stats", "--json", "--redis-url", url, NULL } };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char *out = NULL;
        st = kt_capstan_run(cmds[i], &out);
        cr_assert_eq(st, 78, "%s: exit %d: %s", cmds[i][0], st, out);
        cr_assert(strstr(out, "is a Redis Cluster node") && one_line(out), "%s: %s", cmds[i][0], out);
        free(out);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    kt_untrack(srv);
    free(dir);
}

/* A Rails sidekiq.yml with ERB runs as it is: the process Sidekiq's API sees
 * has the concurrency the environment gave, and a tag it cannot evaluate
 * stops the start in one line naming the file, line and tag. */
Test(cli, run_renders_the_erb_of_a_sidekiq_yml)
{
    setenv("CAPSTAN_T_THREADS", "3", 1);
    char *yml = kt_write_file("sidekiq.yml",
                              "<%# from the environment, as Rails does %>\n"
                              ":concurrency: <%= ENV.fetch(\"CAPSTAN_T_THREADS\", 5).to_i %>\n"
                              ":queues:\n  - <%= ENV.fetch('CAPSTAN_T_UNSET_QUEUE') { 'erbq' } %>\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", yml, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 20), "%s", kt_capstan_log(pid));
    char *ident = kt_str("SRANDMEMBER processes");
    char *info = kt_str("HGET %s info", ident);
    json_t *j = json_loads(info ? info : "", 0, NULL);
    cr_assert(j, "%s", info);
    cr_assert_eq(json_integer_value(json_object_get(j, "concurrency")), 3, "%s", info);
    json_t *queues = json_object_get(j, "queues");
    cr_assert(json_array_size(queues) == 1 && !strcmp(json_string_value(json_array_get(queues, 0)), "erbq"),
              "%s", info);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0);
    json_decref(j);
    free(info);
    free(ident);

    char *bad = kt_write_file("rails.yml", ":concurrency: 2\n:tag: <%= Rails.application.name %>\n");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-C", bad, NULL }, &out), 78, "%s", out);
    char want[600];
    snprintf(want, sizeof(want), "capstan: %s:2: unsupported ERB <%%= Rails.application.name %%>\n", bad);
    cr_assert_str_eq(out, want);
    free(out);
    free(bad);
    free(yml);
}

/* push -r loads a plugin as run does and takes the options its classes are
 * registered with (the example plugin's DigestJob: queue digests, retry 3,
 * an until_executed lock, taken through the client middleware), quietly. */
Test(cli, push_with_a_plugin_takes_its_registered_class_options)
{
    const char *plugin = getenv("CAPSTAN_PLUGIN");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-r", plugin, "DigestJob", "[1]", NULL }, &out), 0,
                 "%s", out);
    cr_assert_eq(strlen(out), 25, "the jid alone, no warning: %s", out);
    char *payload = kt_str("LINDEX queue:digests 0");
    cr_assert(payload && strstr(payload, "\"retry\":3,") && strstr(payload, "\"queue\":\"digests\"") &&
                  strstr(payload, "\"lock\":\"until_executed\"") && strstr(payload, first_line(out)),
              "%s", payload);
    cr_assert_eq(kt_int("SISMEMBER queues digests"), 1);
    free(out);
    /* The class's lock, through the client middleware: the same args again
     * are denied (exit 3), other args pass. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "DigestJob", "[1]", "--require", plugin, NULL }, &out),
                 3, "%s", out);
    cr_assert(strstr(out, "denied"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-r", plugin, "DigestJob", "[2]", NULL }, &out), 0,
                 "%s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:digests"), 2);
    /* The config's classes: section comes first, as on the server; a
     * plugins: entry in it is loaded as run loads it. */
    char yml[1024];
    snprintf(yml, sizeof(yml), "plugins: [%s]\nclasses:\n  DigestJob:\n    retry: 1\n", plugin);
    char *conf = kt_write_file("plugins.yml", yml);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-C", conf, "DigestJob", "[3]", NULL }, &out), 0,
                 "%s", out);
    free(out);
    free(payload);
    payload = kt_str("LINDEX queue:digests 0");
    cr_assert(payload && strstr(payload, "\"retry\":1,") && strstr(payload, "\"lock\":\"until_executed\""),
              "%s", payload);
    /* A plugin that cannot be loaded is a configuration error, pushing
     * nothing. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-r", "/nonexistent/plugin.so", "DigestJob", "[4]",
                                                  NULL }, &out), 78, "%s", out);
    cr_assert(strstr(out, "cannot load plugin /nonexistent/plugin.so"), "%s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:digests"), 3);
    free(payload);
    free(conf);
}

/* A class without a queue goes to "default", where a Ruby process of a
 * mixed fleet may take it: push says so on stderr, after the jid, naming
 * the class and how to give it one. Not when the queue was chosen. */
Test(cli, push_warns_when_a_class_without_a_queue_falls_back_to_default)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-r", getenv("CAPSTAN_PLUGIN"), "NoopJob", NULL }, &out),
                 0, "%s", out);
    char *warning = strchr(out, '\n');
    cr_assert(warning && strstr(warning, "capstan push: warning: NoopJob has no queue") &&
                  strstr(warning, "\"default\"") && strstr(warning, "-q QUEUE") &&
                  strstr(warning, "plugin") && strstr(warning, "classes:"),
              "%s", out);
    cr_assert_eq(strchr(warning + 1, '\n'), warning + strlen(warning) - 1, "one line: %s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    /* Without the plugin, DigestJob has no queue either. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "DigestJob", "[1]", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "warning: DigestJob has no queue"), "%s", out);
    free(out);
    /* A queue given by -q (even "default") or the config: no warning. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "-q", "default", NULL }, &out), 0, "%s", out);
    cr_assert_eq(strlen(out), 25, "%s", out);
    free(out);
    char *conf = kt_write_file("queued.yml", "classes:\n  NoopJob:\n    queue: noops\n");
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "-C", conf, NULL }, &out), 0, "%s", out);
    cr_assert_eq(strlen(out), 25, "%s", out);
    free(out);
    free(conf);
    cr_assert_eq(kt_int("LLEN queue:default"), 3);
    cr_assert_eq(kt_int("LLEN queue:noops"), 1);
}

/* push -e ENV reads the file's ENV section, as run -e does, and RAILS_ENV
 * chooses it when -e is not given. */
Test(cli, push_reads_the_environment_section_as_run_does)
{
    unsetenv("APP_ENV");
    unsetenv("RAILS_ENV");
    unsetenv("RACK_ENV");
    char *conf = kt_write_file("envs.yml", "classes:\n  FailJob:\n    queue: devq\n"
                                           "production:\n  classes:\n    FailJob:\n      queue: prodq\n"
                                           "      retry: 2\n");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-C", conf, "FailJob", NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:devq"), 1);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-C", conf, "-e", "production", "FailJob", NULL }, &out),
                 0, "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "FailJob", "--environment=production", "-C", conf, NULL },
                                &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:prodq"), 2);
    char *payload = kt_str("LINDEX queue:prodq 0");
    cr_assert(payload && strstr(payload, "\"retry\":2,"), "%s", payload);
    free(payload);
    setenv("RAILS_ENV", "production", 1);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-C", conf, "FailJob", NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int("LLEN queue:prodq"), 3);
    cr_assert_eq(kt_int("LLEN queue:devq"), 1);
    free(conf);
}

/* Sidekiq Pro's paused queues: `capstan pause` adds the bare name to the
 * set "paused", as Pro does; a running capstan reads the set each beat and
 * fetches nothing from a paused queue while it runs the others' jobs;
 * `capstan unpause` (or Pro's own SREM) resumes it; stats and top say
 * which queues are paused (the metrics gauge: test_metrics.c). */
Test(cli, paused_queues_are_not_fetched_until_unpaused)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "pause", "slow", NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int("SISMEMBER paused slow"), 1, "the bare name, as Sidekiq Pro stores it");
    cr_assert_eq(kt_int("EXISTS paused:slow") + kt_int("SISMEMBER paused queue:slow"), 0);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"p:slow\"]", "-q", "slow", NULL },
                                NULL), 0);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"p:fast\"]", "-q", "fast", NULL },
                                NULL), 0);
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "3", "-q", "slow", "-q", "fast", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD p:fast") == 1, 10), "the other queue's job ran: %s",
              kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "queue slow is paused"), "the log says so: %s", kt_capstan_log(pid));
    /* A beat later, and a job of the other queue pushed meanwhile ran. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"p:fast\"]", "-q", "fast", NULL },
                                NULL), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD p:fast") == 2, 10), "%s", kt_capstan_log(pid));
    kt_sleep(1.0);
    cr_assert_eq(kt_int("LLEN queue:slow"), 1, "the paused queue's job stays in it");
    cr_assert_eq(kt_int("EXISTS p:slow"), 0);

    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "{\"name\":\"slow\",\"size\":1,") && strstr(out, "\"paused\":true"), "%s", out);
    cr_assert(strstr(out, "\"paused\":false"), "the other queue is not paused: %s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "paused"), "top marks the paused queue: %s", out);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "unpause", "slow", NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int("EXISTS paused"), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD p:slow") == 1, 5), "unpaused, its job runs: %s",
              kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "queue slow is unpaused"), "%s", kt_capstan_log(pid));

    /* Paused again the way Sidekiq Pro does it, while capstan runs. */
    kt_cmd("SADD paused slow");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "queue slow is paused") == 2, 5), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"p:slow\"]", "-q", "slow", NULL },
                                NULL), 0);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"p:fast\"]", "-q", "fast", NULL },
                                NULL), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD p:fast") == 3, 10), "%s", kt_capstan_log(pid));
    kt_sleep(1.0);
    cr_assert_eq(kt_int("LLEN queue:slow"), 1, "paused again: not fetched");
    kt_cmd("SREM paused slow");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD p:slow") == 2, 5), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0);
    kt_untrack(pid);
    free(cfg);
}

/* The same with the basic fetch (BRPOP): only the queues not paused. */
Test(cli, paused_queues_are_skipped_by_the_basic_fetch_too)
{
    kt_cmd("SADD paused slow");
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"b:slow\"]", "-q", "slow", NULL },
                                NULL), 0);
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", "--fetch", "basic", "-q", "slow",
                                                   "-q", "fast", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "queue slow is paused"), 10), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"b:fast\"]", "-q", "fast", NULL },
                                NULL), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD b:fast") == 1, 10), "%s", kt_capstan_log(pid));
    kt_sleep(1.0);
    cr_assert_eq(kt_int("LLEN queue:slow"), 1, "the paused queue's job stays in it");
    kt_cmd("SREM paused slow");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD b:slow") == 1, 5), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0);
    kt_untrack(pid);
    free(cfg);
}

/* `capstan probe WHAT --port port`'s exit status, its output into *out
 * (malloc'd; the previous one freed). */
static int probe_on(const char *what, const char *port, char **out)
{
    free(*out);
    *out = NULL;
    return kt_capstan_run((const char *[]){ "probe", what, "--port", port, NULL }, out);
}

/* The Dockerfile's health check: `capstan probe` exits as the process's
 * /readyz and /livez answer, 0 on 200 and 1 with the reason on 503 (Redis
 * frozen by SIGSTOP), 2 when no capstan listens on the port, 78 when no
 * port is configured; -C FILE gives it the file's metrics_port. */
Test(cli, probe_exits_as_readyz_and_livez_answer)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "probe-cli-redis");
    kt_aof_start(&srv);
    int port = kt_free_port(), st = -1;
    char portstr[16], extra[64], *out = NULL;
    snprintf(portstr, sizeof(portstr), "%d", port);
    snprintf(extra, sizeof(extra), "metrics_port: %d\n", port);
    char *conf = kt_write_conf("heartbeat_interval: 0.5\n"), *with_port = kt_write_file("probe.yml", extra);

    cr_assert_eq(st = probe_on("ready", portstr, &out), 2, "exit %d: %s", st, out);
    cr_assert(strstr(out, "no capstan probe on 127.0.0.1:"), "%s", out);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", conf, "-c", "2", "--metrics-port", portstr,
                                                   "--redis-url", srv.url, NULL });
    cr_assert(KT_WAIT_UNTIL(probe_on("ready", portstr, &out) == 0, 20), "%s\n%s", out, kt_capstan_log(pid));
    cr_assert_str_eq(out, "ok\n");
    cr_assert_eq(st = kt_capstan_run((const char *[]){ "probe", "-C", with_port, NULL }, NULL), 0,
                 "exit %d with the file's metrics_port", st);

    kill(srv.pid, SIGSTOP);
    int down = KT_WAIT_UNTIL((st = probe_on("ready", portstr, &out)) == 1, 20);
    char *why = strdup(out);
    int live = probe_on("live", portstr, &out);
    kill(srv.pid, SIGCONT);
    cr_assert(down && strstr(why, "/readyz 503: ") && strstr(why, "Redis"), "exit %d: %s", st, why);
    cr_assert_eq(live, 0, "probe live during a Redis stop: %s", out);
    cr_assert(KT_WAIT_UNTIL(probe_on("ready", portstr, &out) == 0, 20), "after SIGCONT: %s", out);

    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(st = probe_on("live", portstr, &out), 2, "exit %d once capstan stopped: %s", st, out);
    free(out);
    out = NULL;
    cr_assert_eq(st = kt_capstan_run((const char *[]){ "probe", "-C", conf, NULL }, &out), 78,
                 "exit %d with no port: %s", st, out);
    cr_assert(strstr(out, "no metrics port configured") && strstr(out, "--port"), "%s", out);
    kt_aof_kill(&srv);
    free(why);
    free(out);
    free(conf);
    free(with_port);
}
