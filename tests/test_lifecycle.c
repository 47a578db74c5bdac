/* The process lifecycle as an operator sees it: graceful stop (TERM), a
 * second TERM, quiet (TSTP, or capstan_runtime_quiet from an embedding
 * program), thread dumps (TTIN), log reopening (USR2), the
 * JSON log format, Redis going away and coming back, at start and while
 * jobs flow, and the report a crashing handler leaves. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/runtime.h"

TestSuite(lifecycle, .timeout = 120, .fini = kt_kill_children);

/* ---- small helpers ---------------------------------------------------- */

/* True while pid runs; otherwise reaps it and says how it ended. */
static int alive(pid_t pid, char *how, size_t n)
{
    int st;
    if (waitpid(pid, &st, WNOHANG) == 0)
        return 1;
    snprintf(how, n, WIFSIGNALED(st) ? "killed by signal %d" : "exited with %d",
             WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    return 0;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static int file_has(const char *path, const char *needle)
{
    char *s = kt_read_file(path);
    int yes = strstr(s, needle) != NULL;
    free(s);
    return yes;
}

static char *payload_of(const char *cls, const char *jid, const char *args)
{
    char *p = malloc(512);
    snprintf(p, 512,
             "{\"class\":\"%s\",\"args\":%s,\"retry\":true,\"queue\":\"default\",\"jid\":\"%s\","
             "\"created_at\":1700000000.25,\"enqueued_at\":1700000000.25,\"big\":123456789012345678901234567890}",
             cls, args, jid);
    return p;
}

static void push(const char *cls, const char *jid, const char *args)
{
    char *p = payload_of(cls, jid, args);
    freeReplyObject(kt_cmd("LPUSH queue:default %s", p));
    free(p);
}

static long long working_len(const char *identity)
{
    return kt_int("LLEN uniquejobs:working:%s", identity);
}

/* True when the list holds exactly the n payloads (in any order). */
static int list_holds_exactly(const char *key, char **want, size_t n)
{
    redisReply *r = kt_cmd("LRANGE %s 0 -1", key);
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements == n;
    for (size_t i = 0; ok && i < n; i++) {
        int found = 0;
        for (size_t j = 0; j < r->elements && !found; j++)
            found = r->element[j]->len == strlen(want[i])
                 && memcmp(r->element[j]->str, want[i], r->element[j]->len) == 0;
        ok = found;
    }
    freeReplyObject(r);
    return ok;
}

/* ---- stop ------------------------------------------------------------- */

Test(lifecycle, term_requeues_unfinished_jobs_byte_identical)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "4", "-t", "2", NULL });
    char *id = kt_wait_identity(pid);
    push("NoopJob", "10000000000000000000000a", "[]");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "jid=10000000000000000000000a elapsed=") == 1, 20),
              "NoopJob did not finish: %s", kt_capstan_log(pid));
    char *sleeps[4];
    for (int i = 0; i < 4; i++) {
        char jid[32];
        snprintf(jid, sizeof(jid), "2000000000000000000000%02d", i);
        sleeps[i] = payload_of("SleepJob", jid, "[20000]");
        freeReplyObject(kt_cmd("LPUSH queue:default %s", sleeps[i]));
    }
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob") == 4 && working_len(id) == 4, 20),
              "the SleepJobs did not start: %s", kt_capstan_log(pid));

    double t0 = kt_now();
    int st = kt_capstan_stop(pid, SIGTERM, 15);
    double took = kt_now() - t0;
    cr_assert_eq(st, 0, "exit status %d: %s", st, kt_capstan_log(pid));
    cr_assert(took >= 1.5, "it should wait for the timeout (took %.2fs)", took);
    cr_assert(took < 2 + 4, "exit within timeout + a few seconds (took %.2fs)", took);

    char wkey[400];
    snprintf(wkey, sizeof(wkey), "uniquejobs:working:%s", id);
    cr_assert(list_holds_exactly("queue:default", sleeps, 4),
              "the 4 unfinished jobs are back, byte-identical, and nothing else");
    cr_assert_eq(kt_int("LLEN %s", wkey), 0, "working list left non-empty");
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 0, "the process is still listed");
    cr_assert_eq(kt_int("EXISTS %s:work", id), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "Pushed 4 jobs back to Redis"), "%s", log);
    cr_assert(strstr(log, "Bye!"), "%s", log);
    free(log);
    for (int i = 0; i < 4; i++)
        free(sleeps[i]);
    free(id);
}

Test(lifecycle, second_term_skips_the_wait)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", "-t", "20", NULL });
    char *id = kt_wait_identity(pid);
    push("SleepJob", "30000000000000000000000a", "[20000]");
    push("SleepJob", "30000000000000000000000b", "[20000]");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob") == 2, 20), "%s", kt_capstan_log(pid));

    double t0 = kt_now();
    kill(pid, SIGTERM);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "Pausing to allow workers to finish") == 1, 10),
              "%s", kt_capstan_log(pid));
    int st = kt_capstan_stop(pid, SIGTERM, 15);
    double took = kt_now() - t0;
    cr_assert_eq(st, 0, "exit status %d: %s", st, kt_capstan_log(pid));
    cr_assert(took < 8, "the second TERM should end the 20 s wait (took %.2fs)", took);
    cr_assert_eq(kt_log_count(pid, "Second TERM: not waiting any longer"), 1, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN queue:default"), 2, "both jobs requeued");
    cr_assert_eq(working_len(id), 0);
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 0);
    free(id);
}

Test(lifecycle, term_when_idle_exits_at_once)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "4", NULL });
    char *id = kt_wait_identity(pid);
    double t0 = kt_now();
    int st = kt_capstan_stop(pid, SIGTERM, 10);
    double took = kt_now() - t0;
    cr_assert_eq(st, 0, "exit status %d: %s", st, kt_capstan_log(pid));
    cr_assert(took < 3.5, "an idle worker stops within ~3 s (took %.2fs)", took);
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 0);
    cr_assert_eq(kt_int("EXISTS uniquejobs:heartbeat:%s", id), 0,
                 "a clean stop with nothing in flight drops the liveness key");
    free(id);
}

/* ---- quiet ------------------------------------------------------------ */

Test(lifecycle, tstp_makes_it_quiet)
{
    char *cfg = kt_write_file("quiet.yml", "heartbeat_interval: 1\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", "-C", cfg, NULL });
    char *id = kt_wait_identity(pid);
    char *q = kt_str("HGET %s quiet", id);
    cr_assert_str_eq(q, "false");
    free(q);

    kill(pid, SIGTSTP);
    cr_assert(KT_WAIT_UNTIL(({ char *v = kt_str("HGET %s quiet", id);
                               int t = v && !strcmp(v, "true"); free(v); t; }), 10),
              "the process hash should say quiet=true: %s", kt_capstan_log(pid));
    push("RecordJob", "40000000000000000000000a", "[\"rec\"]");
    /* A quiet process fetches nothing: give it a few beats to prove it. */
    kt_sleep(2.5);
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "a quiet process took a job: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD rec"), 0);
    cr_assert_eq(working_len(id), 0);
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 1, "quiet is not stopped");
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "Received TSTP, no longer accepting new work"), "%s", log);
    free(log);

    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "the job waits for another worker");
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 0);
    free(id);
    free(cfg);
}

static atomic_int embedded_runs;

static int count_run(capstan_job_t *job, void *udata)
{
    (void)job;
    (void)udata;
    atomic_fetch_add(&embedded_runs, 1);
    return 0;
}

static int hash_says_quiet(const char *id, const char *want)
{
    char *v = kt_str("HGET %s quiet", id);
    int same = v && !strcmp(v, want);
    free(v);
    return same;
}

/* A program embedding the runtime knows its process identity before it
 * runs (the one its heartbeat shows in "processes"), and quiets it from
 * another thread as TSTP does: it stays in "processes" and takes no new
 * job, until stopped. */
Test(lifecycle, an_embedded_runtime_goes_quiet_on_request_under_its_identity)
{
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = kt_config(2);
    cfg->heartbeat_interval = 1;
    capstan_runtime_t *rt = capstan_runtime_new(cfg, err);
    cr_assert(rt, "%s", err);
    cr_assert_eq(capstan_register(rt, "RecordJob", count_run, NULL, NULL), 0);
    char *id = strdup(capstan_runtime_identity(rt));
    regex_t re;
    char pattern[64];
    snprintf(pattern, sizeof(pattern), "^[^:]+:%d:[0-9a-f]{12}$", (int)getpid());
    cr_assert_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    cr_assert_eq(regexec(&re, id, 0, NULL, 0), 0, "identity %s", id);
    regfree(&re);

    kt_runtime_start(rt);
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER processes %s", id) == 1 && hash_says_quiet(id, "false"), 20),
              "the heartbeat is under the identity given");
    push("RecordJob", "40000000000000000000000b", "[1]");
    cr_assert(KT_WAIT_UNTIL(atomic_load(&embedded_runs) == 1, 15), "a running runtime takes jobs");

    capstan_runtime_quiet(rt);
    cr_assert(KT_WAIT_UNTIL(hash_says_quiet(id, "true"), 10), "the process hash should say quiet=true");
    push("RecordJob", "40000000000000000000000c", "[2]");
    /* A quiet process fetches nothing: give it a few beats to prove it. */
    kt_sleep(2.5);
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "a quiet runtime took a job");
    cr_assert_eq(atomic_load(&embedded_runs), 1);
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 1, "quiet is not stopped");

    kt_runtime_end(rt);
    cr_assert_eq(kt_int("SISMEMBER processes %s", id), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "the job waits for another worker");
    free(id);
}

/* ---- diagnostics ------------------------------------------------------ */

Test(lifecycle, ttin_dumps_every_thread)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "3", "-t", "1", NULL });
    char *id = kt_wait_identity(pid);
    push("SleepJob", "50000000000000000000000a", "[20000]");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob") == 1, 20), "%s", kt_capstan_log(pid));
    kill(pid, SIGTTIN);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "Thread TID-") >= 3, 10),
              "one line per processor thread: %s", kt_capstan_log(pid));
    char *log = kt_capstan_log(pid);
    cr_assert_eq(count_of(log, "Thread TID-"), 3, "%s", log);
    const char *line = strstr(log, "Thread TID-");
    cr_assert(strstr(line, "SleepJob"), "the running job's class is named: %s", log);
    cr_assert(strstr(log, "WARN: Thread TID-"), "%s", log);
    free(log);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    free(id);
}

Test(lifecycle, usr2_reopens_the_log_file)
{
    char *path = kt_tmp("worker.log");
    char old[600];
    snprintf(old, sizeof(old), "%s.1", path);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", "-L", path, NULL });
    free(kt_wait_identity(pid));
    cr_assert(KT_WAIT_UNTIL(file_has(path, "Starting processing"), 10));
    cr_assert_eq(rename(path, old), 0);
    kill(pid, SIGUSR2);
    struct stat st;
    cr_assert(KT_WAIT_UNTIL(stat(path, &st) == 0, 10), "USR2 did not reopen %s", path);
    push("NoopJob", "60000000000000000000000a", "[]");
    cr_assert(KT_WAIT_UNTIL(file_has(path, "jid=60000000000000000000000a elapsed="), 10),
              "the job's done line is not in the new file: %s", kt_read_file(path));
    cr_assert(file_has(path, "INFO: done"));
    cr_assert(!file_has(old, "60000000000000000000000a"), "written to the renamed file");
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0);
    cr_assert(file_has(path, "Bye!"));
    free(path);
}

Test(lifecycle, json_log_lines_are_objects)
{
    /* One process, so every line carries its pid. */
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-c", "2", "--log-format", "json", NULL });
    free(kt_wait_identity(pid));
    push("NoopJob", "70000000000000000000000a", "[]");
    push("FailJob", "70000000000000000000000b", "[\"said \\\"no\\\"\\n twice\"]");
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1
                            && kt_log_count(pid, "70000000000000000000000a") >= 2, 20),
              "%s", kt_capstan_log(pid));
    kill(pid, SIGTTIN);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "Thread TID-") >= 2, 10));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0, "%s", kt_capstan_log(pid));

    char *log = kt_capstan_log(pid);
    int lines = 0, job_lines = 0;
    for (char *save = NULL, *line = strtok_r(log, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), lines++) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert(json_is_object(o), "not a JSON object (%s): %s", e.text, line);
        cr_assert(json_is_string(json_object_get(o, "ts")), "%s", line);
        cr_assert(json_is_integer(json_object_get(o, "pid")), "%s", line);
        cr_assert_eq(json_integer_value(json_object_get(o, "pid")), pid, "%s", line);
        cr_assert(json_is_string(json_object_get(o, "tid")), "%s", line);
        cr_assert(json_is_string(json_object_get(o, "lvl")), "%s", line);
        cr_assert(json_is_string(json_object_get(o, "msg")), "%s", line);
        json_t *ctx = json_object_get(o, "ctx");
        cr_assert(json_is_object(ctx), "%s", line);
        const char *msg = json_string_value(json_object_get(o, "msg"));
        if (!strcmp(msg, "start") || !strcmp(msg, "done") || !strcmp(msg, "fail")) {
            job_lines++;
            cr_assert(json_is_string(json_object_get(ctx, "class")), "%s", line);
            cr_assert(json_is_string(json_object_get(ctx, "jid")), "%s", line);
            if (strcmp(msg, "start"))
                cr_assert(json_is_number(json_object_get(ctx, "elapsed")), "%s", line);
        }
        if (strstr(msg, "RuntimeError"))
            cr_assert(strstr(msg, "said \"no\"\n twice"), "message kept exactly: %s", line);
        json_decref(o);
    }
    cr_assert_eq(job_lines, 4, "start+done and start+fail");
    cr_assert(lines >= 8, "only %d lines", lines);
    free(log);
}

/* ---- Redis going away ------------------------------------------------- */

Test(lifecycle, redis_restart_while_jobs_flow_loses_nothing)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "priv-redis");
    kt_aof_start(&srv);
    char *cfg = kt_write_file("restart.yml", "heartbeat_interval: 1\npoll_interval_average: 1\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "4", "-C", cfg, "--redis-url", srv.url, NULL });
    redisContext *c = kt_aof_connect(&srv);
    cr_assert(c);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD processes") == 1, 20), "%s", kt_capstan_log(pid));
    redisReply *idr = redisCommand(c, "SRANDMEMBER processes");
    char *id = strdup(idr->str);
    freeReplyObject(idr);

    enum { N = 300 };
    static char jids[N][25];
    int pushed = 0;
    /* Jobs flow: push steadily, and kill the server in the middle of it. */
    for (int i = 0; i < N / 2; i++) {
        snprintf(jids[pushed], 25, "8%023d", i);
        char *p = payload_of("RecordJob", jids[pushed], "[\"rec\"]");
        redisReply *r = redisCommand(c, "LPUSH queue:default %s", p);
        free(p);
        cr_assert(r && r->type == REDIS_REPLY_INTEGER);
        freeReplyObject(r);
        pushed++;
        kt_sleep(0.003);
    }
    cr_assert(kt_int_on(c, "SCARD rec") > 0, "jobs were flowing: %s", kt_capstan_log(pid));
    kt_aof_kill(&srv);
    redisFree(c);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "retrying with backoff") >= 1, 10),
              "the outage is not logged: %s", kt_capstan_log(pid));
    kt_sleep(1);
    char how[64];
    cr_assert(alive(pid, how, sizeof(how)), "the worker %s: %s", how, kt_capstan_log(pid));

    kt_aof_start(&srv);
    c = kt_aof_connect(&srv);
    cr_assert(c);
    for (int i = N / 2; i < N; i++) {
        snprintf(jids[pushed], 25, "8%023d", i);
        char *p = payload_of("RecordJob", jids[pushed], "[\"rec\"]");
        redisReply *r = redisCommand(c, "LPUSH queue:default %s", p);
        free(p);
        cr_assert(r && r->type == REDIS_REPLY_INTEGER);
        freeReplyObject(r);
        pushed++;
        kt_sleep(0.002);
    }
    /* A RecordJob cut off mid-way by the outage failed and is retried after
     * its backoff (15-24 s): then it takes that long. */
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD rec") == pushed, 45),
              "%lld of %d recorded; queue %lld, retry %lld, working %lld: %s",
              kt_int_on(c, "SCARD rec"), pushed, kt_int_on(c, "LLEN queue:default"),
              kt_int_on(c, "ZCARD retry"), kt_int_on(c, "LLEN uniquejobs:working:%s", id),
              kt_capstan_log(pid));
    for (int i = 0; i < pushed; i++)
        cr_assert_eq(kt_int_on(c, "SISMEMBER rec %s", jids[i]), 1, "%s lost", jids[i]);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "LLEN queue:default") == 0
                            && kt_int_on(c, "LLEN uniquejobs:working:%s", id) == 0, 10));
    cr_assert_eq(kt_int_on(c, "ZCARD dead"), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SISMEMBER processes %s", id) == 1, 10),
              "the heartbeat resumes after the restart");

    char *log = kt_capstan_log(pid);
    cr_assert_eq(count_of(log, "retrying with backoff"), 1, "the outage is logged once: %s", log);
    cr_assert(strstr(log, "Redis is online"), "%s", log);
    cr_assert_eq(count_of(log, "Redis is online"), 1, "%s", log);
    free(log);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int_on(c, "SISMEMBER processes %s", id), 0);
    redisFree(c);
    kt_aof_kill(&srv);
    free(id);
    free(cfg);
}

Test(lifecycle, starts_when_redis_comes_up)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "priv-redis");
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", "--redis-url", srv.url, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "waiting for Redis") >= 1, 10), "%s", kt_capstan_log(pid));
    kt_sleep(0.5);
    char how[64];
    cr_assert(alive(pid, how, sizeof(how)), "capstan gave up (%s): %s", how, kt_capstan_log(pid));
    kt_aof_start(&srv);
    redisContext *c = kt_aof_connect(&srv);
    cr_assert(c);
    char *p = payload_of("RecordJob", "90000000000000000000000a", "[\"rec\"]");
    freeReplyObject(redisCommand(c, "LPUSH queue:default %s", p));
    free(p);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SISMEMBER rec 90000000000000000000000a") == 1, 20),
              "the job did not run once Redis came up: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int_on(c, "SCARD processes"), 1);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int_on(c, "SCARD processes"), 0);
    redisFree(c);
    kt_aof_kill(&srv);
}

Test(lifecycle, term_while_waiting_for_redis_exits_0)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "priv-redis"); /* never started */
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", srv.url, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "waiting for Redis") >= 1, 10), "%s", kt_capstan_log(pid));
    double t0 = kt_now();
    int st = kt_capstan_stop(pid, SIGTERM, 10);
    cr_assert_eq(st, 0, "exit status %d: %s", st, kt_capstan_log(pid));
    cr_assert(kt_now() - t0 < 3, "TERM should not wait for Redis");
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "Bye!"), "%s", log);
    free(log);
}

/* A handler finishing after Redis restarted acknowledges on a connection
 * whose server is gone: a big write there must fail, not kill the process
 * (SIGPIPE). */
Test(lifecycle, big_ack_after_redis_restart_does_not_kill_the_worker)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "priv-redis");
    kt_aof_start(&srv);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", "--redis-url", srv.url, NULL });
    redisContext *c = kt_aof_connect(&srv);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD processes") == 1, 20), "%s", kt_capstan_log(pid));
    size_t big = 4u << 20;
    char *pad = malloc(big + 1);
    memset(pad, 'x', big);
    pad[big] = '\0';
    char *p = malloc(big + 256);
    int n = snprintf(p, big + 256, "{\"class\":\"SleepJob\",\"args\":[2000,\"%s\"],"
                     "\"jid\":\"a1000000000000000000000a\",\"queue\":\"default\"}", pad);
    freeReplyObject(redisCommand(c, "LPUSH queue:default %b", p, (size_t)n));
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob jid=a1000000000000000000000a INFO: start") == 1, 20),
              "%s", kt_capstan_log(pid));
    redisFree(c);
    kt_aof_kill(&srv);
    kt_aof_start(&srv);
    c = kt_aof_connect(&srv);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "jid=a1000000000000000000000a elapsed=") == 1, 20),
              "%s", kt_capstan_log(pid));
    kt_sleep(0.5);
    char how[64];
    cr_assert(alive(pid, how, sizeof(how)), "the worker %s: %s", how, kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(({ redisReply *r = redisCommand(c, "KEYS uniquejobs:working:*");
                               int e = r && r->type == REDIS_REPLY_ARRAY && r->elements == 0;
                               freeReplyObject(r); e; }), 15),
              "the job stayed in the working list: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int_on(c, "LLEN queue:default"), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0, "%s", kt_capstan_log(pid));
    redisFree(c);
    kt_aof_kill(&srv);
    free(pad);
    free(p);
}

/* The shutdown's own connection was idle through a Redis restart: the
 * requeue and leaving the process set must still happen at once, not wait
 * for orphan recovery or key expiry. */
Test(lifecycle, term_after_redis_restart_still_requeues)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "priv-redis");
    kt_aof_start(&srv);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", "-t", "1", "--redis-url", srv.url, NULL });
    redisContext *c = kt_aof_connect(&srv);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD processes") == 1, 20), "%s", kt_capstan_log(pid));
    char *jobs[2] = { payload_of("SleepJob", "b1000000000000000000000a", "[20000]"),
                      payload_of("SleepJob", "b1000000000000000000000b", "[20000]") };
    for (int i = 0; i < 2; i++)
        freeReplyObject(redisCommand(c, "LPUSH queue:default %s", jobs[i]));
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob") == 2, 20), "%s", kt_capstan_log(pid));
    redisFree(c);
    kt_aof_kill(&srv);
    kt_aof_start(&srv);
    c = kt_aof_connect(&srv);
    int st = kt_capstan_stop(pid, SIGTERM, 15);
    cr_assert_eq(st, 0, "exit status %d: %s", st, kt_capstan_log(pid));
    redisReply *r = redisCommand(c, "LRANGE queue:default 0 -1");
    cr_assert(r && r->elements == 2, "jobs not requeued: %s", kt_capstan_log(pid));
    for (size_t i = 0; i < 2; i++)
        cr_assert(!strcmp(r->element[i]->str, jobs[0]) || !strcmp(r->element[i]->str, jobs[1]));
    freeReplyObject(r);
    r = redisCommand(c, "KEYS uniquejobs:working:*");
    cr_assert(r && r->elements == 0, "left in the working list");
    freeReplyObject(r);
    cr_assert_eq(kt_int_on(c, "SCARD processes"), 0, "still in the process set");
    redisFree(c);
    kt_aof_kill(&srv);
    free(jobs[0]);
    free(jobs[1]);
}

/* ---- what the log says ------------------------------------------------- */

Test(lifecycle, each_signal_is_named_in_the_log)
{
    const int sigs[] = { SIGTERM, SIGINT };
    const char *names[] = { "Received TERM", "Received INT" };
    for (int i = 0; i < 2; i++) {
        pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
        free(kt_wait_identity(pid));
        cr_assert_eq(kt_capstan_stop(pid, sigs[i], 10), 0, "%s", kt_capstan_log(pid));
        char *log = kt_capstan_log(pid);
        cr_assert(strstr(log, names[i]), "%s", log);
        cr_assert_null(strstr(log, "TSTP"), "a stop is not a quiet: %s", log);
        free(log);
    }
}

Test(lifecycle, double_int_logs_a_line_per_requeued_job)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "3", "-t", "20", NULL });
    char *id = kt_wait_identity(pid);
    push("SleepJob", "a0000000000000000000000a", "[20000]");
    push("SleepJob", "a0000000000000000000000b", "[20000]");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob") == 2, 20), "%s", kt_capstan_log(pid));
    kill(pid, SIGINT);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "Pausing to allow workers to finish") == 1, 10),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGINT, 15), 0, "%s", kt_capstan_log(pid));
    char *log = kt_capstan_log(pid);
    cr_assert_eq(count_of(log, "Second INT: not waiting any longer"), 1, "%s", log);
    cr_assert_eq(count_of(log, "requeued SleepJob"), 2, "one line per job: %s", log);
    cr_assert(strstr(log, "requeued SleepJob jid=a0000000000000000000000a"), "%s", log);
    cr_assert(strstr(log, "requeued SleepJob jid=a0000000000000000000000b"), "%s", log);
    /* The idle processor's blocking move may catch a job the requeue just
     * put back; it then goes back again, counted twice: each job is in the
     * queue once either way. */
    cr_assert(strstr(log, "Pushed 2 jobs back to Redis")
                  || (strstr(log, "Pushed 3 jobs back to Redis")
                      && strstr(log, "a fetched job that had not started went back to queue:default")),
              "%s", log);
    cr_assert_eq(kt_int("LLEN queue:default"), 2);
    redisReply *q = kt_cmd("LRANGE queue:default 0 -1");
    int a = 0, b = 0;
    for (size_t k = 0; q && k < q->elements; k++) {
        a += strstr(q->element[k]->str, "a0000000000000000000000a") != NULL;
        b += strstr(q->element[k]->str, "a0000000000000000000000b") != NULL;
    }
    freeReplyObject(q);
    cr_assert(a == 1 && b == 1, "each job once in the queue: %d and %d", a, b);
    free(log);
    free(id);
}

Test(lifecycle, verbose_logs_debug_lines)
{
    pid_t quiet = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    free(kt_wait_identity(quiet));
    cr_assert_eq(kt_capstan_stop(quiet, SIGTERM, 10), 0);
    cr_assert_eq(kt_log_count(quiet, " DEBUG: "), 0, "%s", kt_capstan_log(quiet));
    freeReplyObject(kt_cmd("DEL processes"));

    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", "-v", NULL });
    free(kt_wait_identity(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "DEBUG: connected to "), "%s", log);
    cr_assert(strstr(log, "DEBUG: Got TERM signal"), "%s", log);
    free(log);
}

Test(lifecycle, startup_line_names_queues_environment_classes_and_fetch)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", "-q", "critical,3", "-q", "default,1",
                                               "-e", "staging", "--fetch", "basic", NULL });
    char *id = kt_wait_identity(pid);
    /* The capsule's mode as Sidekiq names it from the same weights. */
    char *info = kt_str("HGET %s info", id);
    cr_assert(info && strstr(info, "\"mode\":\"weighted\""), "%s", info);
    free(info);
    free(id);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 10), 0);
    pid_t ones = kt_capstan_start((const char *[]){ "-c", "1", "-q", "critical,1", "-q", "default,1", NULL });
    id = kt_wait_identity(ones);
    info = kt_str("HGET %s info", id);
    cr_assert(info && strstr(info, "\"mode\":\"random\""), "every weight 1 is Sidekiq's random: %s", info);
    free(info);
    free(id);
    cr_assert_eq(kt_capstan_stop(ones, SIGTERM, 10), 0);
    char *log = kt_capstan_log(pid);
    const char *line = strstr(log, "starting: ");
    cr_assert(line, "%s", log);
    char *end = strchr(line, '\n');
    cr_assert(end);
    *end = '\0';
    cr_assert(strstr(line, "queues [critical:3, default:1] (weighted)"), "%s", line);
    cr_assert(strstr(line, "environment staging"), "%s", line);
    cr_assert(strstr(line, "basic fetch"), "%s", line);
    cr_assert(strstr(line, "classes [") && strstr(line, "NoopJob"), "%s", line);
    free(log);
}

/* ---- crash report ----------------------------------------------------- */

/* Runs SegfaultJob with args next to two SleepJobs and returns the log
 * once the worker died (within 20 s), with its exit status in *st. */
static char *crash_log(const char *args, int *st)
{
    /* No core file in the test directory; and a sanitizer's SEGV handler
     * would report instead of capstan's (and exit 1, not die of the signal). */
    setrlimit(RLIMIT_CORE, &(struct rlimit){ 0, 0 });
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof(opts), "%s%shandle_segv=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    /* The worker's own death: without a supervisor, which would replace
     * it (test_supervisor.c has that). */
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-c", "3", NULL });
    free(kt_wait_identity(pid));
    push("SleepJob", "c0000000000000000000000a", "[20000]");
    push("SleepJob", "c0000000000000000000000c", "[20000]");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob") == 2, 20), "%s", kt_capstan_log(pid));
    push("SegfaultJob", "c0000000000000000000000b", args);
    *st = kt_wait_exit(pid, 20);
    return kt_capstan_log(pid);
}

/* The report's first job line names the job whose thread took the
 * signal, marked as such, whichever processor ran it; the others follow. */
static void assert_faulting_job_first(const char *log)
{
    const char *first = strstr(log, "FATAL: running ");
    cr_assert(first, "no job line: %s", log);
    const char *eol = strchr(first, '\n');
    cr_assert(eol && !strncmp(first, "FATAL: running SegfaultJob jid=c0000000000000000000000b", 55)
                  && strstr(first, "(its thread took the signal)") < eol,
              "the first job line does not name the crashing job: %.*s\n%s",
              eol ? (int)(eol - first) : 0, first, log);
    cr_assert(strstr(first, "FATAL: running SleepJob jid=c0000000000000000000000a")
                  && strstr(first, "FATAL: running SleepJob jid=c0000000000000000000000c"),
              "the other jobs running, after it: %s", log);
}

static void assert_crash_report(const char *log, int st)
{
    cr_assert_eq(st, 128 + SIGSEGV, "died with %d, not of SIGSEGV: %s", st, log);
    cr_assert(strstr(log, "FATAL: received SIGSEGV"), "the signal: %s", log);
    assert_faulting_job_first(log);
    const char *bt = strstr(log, "FATAL: backtrace:\n");
    cr_assert(bt, "%s", log);
    cr_assert(strstr(bt, "[0x"), "a backtrace line: %s", bt);
}

Test(lifecycle, segfault_in_a_handler_is_reported_then_kills_the_process)
{
    int st;
    char *log = crash_log("[]", &st);
    assert_crash_report(log, st);
    free(log);
}

Test(lifecycle, stack_overflow_in_a_handler_is_reported)
{
    int st;
    char *log = crash_log("[\"overflow\"]", &st);
    assert_crash_report(log, st);
    free(log);
}

/* A double free aborts inside malloc, which may hold its lock then. The
 * report's backtrace, its one step that allocates (it loads libgcc), must
 * not leave the process hanging: it dies of the abort all the same (the
 * alarm that guards the backtrace raises it). */
Test(lifecycle, a_crash_inside_malloc_still_ends_the_process)
{
#ifdef __SANITIZE_ADDRESS__
    cr_skip_test("AddressSanitizer reports a double free itself");
#endif
    int st;
    char *log = crash_log("[\"double_free\"]", &st);
    cr_assert_eq(st, 128 + SIGABRT, "died with %d: %s", st, log);
    cr_assert(strstr(log, "FATAL: received SIGABRT"), "the signal: %s", log);
    assert_faulting_job_first(log);
    cr_assert(strstr(log, "FATAL: backtrace:\n"), "%s", log);
    free(log);
}

/* A stop that kills the process before timeout is up (a Kubernetes grace
 * period shorter than it) kills jobs mid-run: said at start when the
 * grace is known (CAPSTAN_GRACE), and not when timeout is below it. */
Test(lifecycle, a_timeout_not_below_the_known_grace_is_warned_about)
{
    setenv("CAPSTAN_GRACE", "10", 1);
    pid_t over = kt_capstan_start((const char *[]){ "-t", "25", NULL });
    pid_t under = kt_capstan_start((const char *[]){ "-t", "5", NULL });
    unsetenv("CAPSTAN_GRACE");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(over, "Starting processing") >= 1 &&
                            kt_log_count(under, "Starting processing") >= 1, 30));
    cr_assert_eq(kt_log_count(over, "timeout (25 s) is not below CAPSTAN_GRACE (10 s)"), 1, "%s",
                 kt_capstan_log(over));
    cr_assert_eq(kt_log_count(under, "CAPSTAN_GRACE"), 0, "%s", kt_capstan_log(under));
    cr_assert_eq(kt_capstan_stop(over, SIGTERM, 30), 0);
    cr_assert_eq(kt_capstan_stop(under, SIGTERM, 30), 0);
}
