/* A mixed fleet: a real Ruby Sidekiq server (6.4.1, 7.3.10, 8.0.10) reads
 * the queue capstan reads. Jobs of classes only Ruby has run in Ruby, once,
 * and capstan fails none of them with NameError, also when both start
 * together; a job retrying under a real Ruby error keeps that error
 * whoever fetches it; capstan says in one line that Ruby shares its queue;
 * `capstan stats` and `capstan top` tell the Ruby process from capstan's.
 * Without Ruby, a class no process knows still fails as Sidekiq's. */
#include <jansson.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capstan/capstan.h"
#include "capstan/config.h"
#include "helpers.h"

TestSuite(fleet, .timeout = 150, .fini = kt_kill_children);

/* kt_write_conf with a look at the fleet every second (recovery_interval). */
static char *write_conf(const char *extra)
{
    char *body = NULL;
    cr_assert(asprintf(&body, "recovery_interval: 1\n%s", extra ? extra : "") > 0);
    char *path = kt_write_conf(body);
    free(body);
    return path;
}

/* Starts Sidekiq version on queue default with tests/ruby/fleet_jobs.rb and
 * returns its pid once it is in the process set; *identity gets it. */
static pid_t ruby_start(const char *sidekiq, char **identity)
{
    pid_t rb = kt_sidekiq_start_v(sidekiq, "fleet_jobs.rb", "default");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 40), "Sidekiq %s never beat: %s", sidekiq,
              kt_sidekiq_log());
    *identity = kt_str("SRANDMEMBER processes");
    return rb;
}

static void stop_ok(pid_t pid, const char *who)
{
    int st = kt_capstan_stop(pid, SIGTERM, 30);
    kt_untrack(pid);
    cr_assert_eq(st, 0, "%s exits 0 (got %d)", who, st);
}

/* The line of out that names identity (malloc'd), or NULL. */
static char *line_of(const char *out, const char *identity)
{
    const char *at = strstr(out, identity);
    if (!at)
        return NULL;
    const char *start = at, *end = strchr(at, '\n');
    while (start > out && start[-1] != '\n')
        start--;
    return strndup(start, end ? (size_t)(end - start) : strlen(start));
}

/* The one member of retry (malloc'd) and its score. */
static char *retry_member(double *score)
{
    redisReply *r = kt_cmd("ZRANGE retry 0 -1 WITHSCORES");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 2, "retry holds one job (%zu)",
              r->type == REDIS_REPLY_ARRAY ? r->elements / 2 : 0);
    char *m = strndup(r->element[0]->str, r->element[0]->len);
    *score = atof(r->element[1]->str);
    freeReplyObject(r);
    return m;
}

/* Ruby and capstan read queue default, capstan without unknown_class set:
 * capstan logs the Ruby process and the queue in one line, and every job
 * of a class only Ruby has runs in Ruby once; none goes to retry or dead
 * (before, capstan failed those it fetched with NameError). */
KT_SIDEKIQ_TEST(fleet, ruby_only_jobs_on_a_shared_queue_run_in_ruby_once)
{
    char *rid = NULL;
    pid_t rb = ruby_start(sidekiq, &rid);
    char *cfg = write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "4", NULL });
    char *cid = kt_log_identity(pid);

    enum { N = 30 };
    char *p[N], jid[25];
    for (int i = 0; i < N; i++) {
        kt_make_jid(jid, 1, (unsigned)i);
        p[i] = kt_payload("RubyOnlyJob", "[\"f\"]", jid, "default");
    }
    kt_push_all(kt_redis(), "default", p, N);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD f") == N || kt_int("ZCARD retry") + kt_int("ZCARD dead") > 0, 60),
              "Ruby ran %lld of %d: %s", kt_int("SCARD f"), N, kt_capstan_log(pid));
    kt_sleep(1.5); /* a second run, or a late failure, would show by now */
    cr_assert_eq(kt_int("ZCARD retry"), 0, "none failed: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("ZCARD dead"), 0);
    cr_assert_eq(kt_int("SCARD f"), N, "Ruby ran them all");
    cr_assert_eq(kt_int("LLEN f:log"), N, "each once");
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(!strstr(log, "NameError"), "%s", log);
    char *line = line_of(log, " reads queues [");
    cr_assert(line && strstr(line, "Ruby Sidekiq process ") && strstr(line, rid)
                  && strstr(line, "reads queues [default]") && strstr(line, "unknown_class: requeue"),
              "one line names %s and the queue: %s", rid, log);
    cr_assert_eq(kt_log_count(pid, " reads queues ["), 1, "said once: %s", log);
    free(line);
    free(log);

    /* Who is who, for `capstan stats` (text and JSON) and `capstan top`. */
    char *out = NULL, want[64];
    snprintf(want, sizeof(want), "Ruby Sidekiq%s%s", strcmp(sidekiq, KT_SIDEKIQ_DEBIAN) ? " " : "",
             strcmp(sidekiq, KT_SIDEKIQ_DEBIAN) ? sidekiq : "");
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", NULL }, &out), 0, "%s", out);
    char *rl = line_of(out, rid), *cl = line_of(out, cid);
    cr_assert(rl && strstr(rl, want) && strstr(rl, "queues [default]"), "%s is %s:\n%s", rid, want, out);
    cr_assert(cl && strstr(cl, "capstan " CAPSTAN_VERSION) && !strstr(cl, "Ruby"), "%s is capstan:\n%s",
              cid, out);
    free(rl);
    free(cl);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", NULL }, &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    size_t i;
    json_t *e;
    int seen = 0;
    json_array_foreach(json_object_get(j, "processes"), i, e) {
        const char *id = json_string_value(json_object_get(e, "identity"));
        const char *rt = json_string_value(json_object_get(e, "runtime"));
        cr_assert_str_eq(rt, strcmp(id, rid) == 0 ? "sidekiq" : "capstan", "%s", out);
        seen++;
    }
    cr_assert_eq(seen, 2, "%s", out);
    json_decref(j);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", "--redis-url", kt_url(), NULL }, &out), 0, "%s", out);
    rl = line_of(out, rid);
    cl = line_of(out, cid);
    cr_assert(rl && strstr(rl, " ruby"), "%s:\n%s", rid, out);
    cr_assert(cl && strstr(cl, " capstan " CAPSTAN_VERSION), "%s:\n%s", cid, out);
    free(rl);
    free(cl);
    free(out);

    stop_ok(pid, "capstan");
    stop_ok(rb, "sidekiq");
    for (int k = 0; k < N; k++)
        free(p[k]);
    free(cid);
    free(cfg);
    free(rid);
}

/* A job Ruby failed with a real error comes back from the retry set while
 * no Ruby process runs: capstan, under the default unknown_class, puts it
 * back in the retry set untouched (its error, count and failed_at kept) at
 * its retry position, instead of failing it with NameError. Once Ruby is
 * back, the periodic look sees it and the job runs there. */
KT_SIDEKIQ_TEST(fleet, a_job_retrying_under_a_ruby_error_keeps_it)
{
    char *rid = NULL;
    pid_t rb = ruby_start(sidekiq, &rid);
    char jid[25];
    kt_make_jid(jid, 2, 0);
    char *job = kt_payload("RubyFlakyJob", "[\"g\"]", jid, "default");
    kt_push_all(kt_redis(), "default", &job, 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 30), "Ruby failed it once: %s", kt_sidekiq_log());
    double score;
    char *ruby_failed = retry_member(&score);
    cr_assert(strstr(ruby_failed, "\"error_class\":\"RuntimeError\"")
                  && strstr(ruby_failed, "\"error_message\":\"flaky: first try\""),
              "%s", ruby_failed);
    stop_ok(rb, "sidekiq");
    cr_assert_eq(kt_int("SCARD processes"), 0, "Ruby left the process set");

    char *cfg = write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    free(kt_log_identity(pid));
    /* Due now: a scheduler moves it to its queue, capstan fetches it. */
    freeReplyObject(kt_cmd("ZADD retry XX 0 %s", ruby_failed));
    /* Back in the retry set, in the future: fetched, and decided on. */
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1 && kt_int("ZCOUNT retry 1 +inf") == 1, 15), "%s",
              kt_capstan_log(pid));
    char *kept = retry_member(&score);
    cr_assert(strstr(kept, jid) && !strstr(kept, "NameError"), "%s", kept);
    static const char *const same[] = { "\"error_class\":\"RuntimeError\"",
                                        "\"error_message\":\"flaky: first try\"", "\"retry_count\":0" };
    for (size_t i = 0; i < 3; i++)
        cr_assert(strstr(kept, same[i]), "%s kept: %s", same[i], kept);
    /* failed_at as Ruby wrote it, literally. */
    const char *fa = strstr(ruby_failed, "\"failed_at\":");
    cr_assert(fa);
    size_t falen = strcspn(fa, ",}");
    cr_assert(memmem(kept, strlen(kept), fa, falen), "%.*s kept: %s", (int)falen, fa, kept);
    cr_assert(score > kt_wall() + 5, "at its retry position, not going round: %f", score - kt_wall());
    cr_assert_eq(kt_int("ZCARD dead"), 0);
    cr_assert_eq(kt_int("GET g:runs"), 1, "only Ruby ran it");
    /* Logged once the move is made: a moment after the test may see it. */
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "already failed with RuntimeError: back in the retry set untouched"),
                            5), "%s", kt_capstan_log(pid));

    /* Ruby is back: the next look sees it, and the job runs there. */
    rb = kt_sidekiq_start_v(sidekiq, "fleet_jobs.rb", "default");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 2, 40), "%s", kt_sidekiq_log());
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, " reads queues [default]"), 10), "%s", kt_capstan_log(pid));
    freeReplyObject(kt_cmd("ZADD retry XX 0 %s", kept));
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD g") == 1, 30), "Ruby ran it: %s", kt_capstan_log(pid));
    kt_sleep(1);
    cr_assert_eq(kt_int("GET g:runs"), 2, "failed once in Ruby, then ran once there");
    cr_assert_eq(kt_int("ZCARD retry"), 0);
    cr_assert_eq(kt_int("ZCARD dead"), 0);
    stop_ok(pid, "capstan");
    stop_ok(rb, "sidekiq");
    free(kept);
    free(ruby_failed);
    free(cfg);
    free(job);
    free(rid);
}

enum { PER_FLEET = 200 };

/* One of a_cold_start's fleets: a capstan and a Ruby process on a queue of
 * their own, started at offsets from the test's start. */
typedef struct fleet {
    const char *queue;
    double capstan_at, ruby_at; /* seconds */
    int push_late;              /* its jobs are pushed once capstan runs */
    pid_t capstan, ruby;
    char jid[PER_FLEET][25];    /* even i: RubyOnlyJob, odd: RecordJob */
} fleet_t;

static void push_fleet(fleet_t *f, unsigned tag)
{
    char *p[PER_FLEET], key[64];
    for (int i = 0; i < PER_FLEET; i++) {
        kt_make_jid(f->jid[i], tag, (unsigned)i);
        snprintf(key, sizeof(key), "[\"%s:%s\"]", i % 2 ? "c" : "r", f->queue);
        p[i] = kt_payload(i % 2 ? "RecordJob" : "RubyOnlyJob", key, f->jid[i], f->queue);
    }
    kt_push_all(kt_redis(), f->queue, p, PER_FLEET);
    for (int i = 0; i < PER_FLEET; i++)
        free(p[i]);
}

/* Jobs of f's queue in zset (retry or dead) that failed with NameError. */
static int name_errors(const char *zset, const fleet_t *f)
{
    redisReply *r = kt_cmd("ZRANGE %s 0 -1", zset);
    char q[80];
    snprintf(q, sizeof(q), "\"queue\":\"%s\"", f->queue);
    int n = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        n += strstr(r->element[i]->str, q) && strstr(r->element[i]->str, "NameError");
    freeReplyObject(r);
    return n;
}

static long long runs_of(const fleet_t *f, const char *side)
{
    return kt_int("LLEN %s:%s:log", side, f->queue);
}

/* Whether a job of the n fleets failed (a NameError retried would run in
 * Ruby later and hide), or every job ran. */
static int settled(const fleet_t *fl, unsigned n)
{
    if (kt_int("GET stat:failed") + kt_int("ZCARD retry") + kt_int("ZCARD dead") > 0)
        return 1;
    for (unsigned i = 0; i < n; i++)
        if (runs_of(&fl[i], "r") + runs_of(&fl[i], "c") < PER_FLEET)
            return 0;
    return 1;
}

/* A deploy restarts Ruby and capstan (default config: no unknown_class,
 * no recovery_interval) together, 200 jobs waiting on each queue, half of
 * a class only Ruby has, half of one both have: Ruby starts 0 s, 2 s and
 * 10 s after capstan, and capstan 5 s after Ruby (its jobs pushed once it
 * runs). Each Ruby-only jid runs once in Ruby, each other jid once on
 * either side, and none fails with NameError (before, capstan failed the
 * Ruby jobs it fetched before its first look saw Ruby). Four fleets side
 * by side, each on its own queue: a capstan minds only the Ruby processes
 * of its own queues. */
KT_SIDEKIQ_TEST(fleet, a_cold_start_of_a_mixed_fleet_fails_no_ruby_job)
{
    static fleet_t fl[] = {
        { .queue = "default", .capstan_at = 0, .ruby_at = 0 },
        { .queue = "ruby2", .capstan_at = 0, .ruby_at = 2 },
        { .queue = "ruby10", .capstan_at = 0, .ruby_at = 10 },
        { .queue = "capstan5", .capstan_at = 5, .ruby_at = 0, .push_late = 1 },
    };
    enum { NF = sizeof(fl) / sizeof(fl[0]) };
    char *cfg = kt_write_conf(NULL);
    for (unsigned i = 0; i < NF; i++) {
        fl[i].capstan = fl[i].ruby = 0;
        if (!fl[i].push_late)
            push_fleet(&fl[i], 10 + i);
    }
    double t0 = kt_now();
    for (int started = 0; started < 2 * (int)NF; kt_sleep(0.05)) {
        for (unsigned i = 0; i < NF; i++) {
            fleet_t *f = &fl[i];
            if (!f->capstan && kt_now() - t0 >= f->capstan_at) {
                f->capstan = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "4", "-q", f->queue, NULL });
                started++;
                if (f->push_late) {
                    free(kt_log_identity(f->capstan));
                    push_fleet(f, 10 + i);
                }
            }
            if (!f->ruby && kt_now() - t0 >= f->ruby_at) {
                f->ruby = kt_sidekiq_start_v(sidekiq, "fleet_jobs.rb", f->queue);
                started++;
            }
        }
    }
    cr_assert(KT_WAIT_UNTIL(settled(fl, NF), 120), "jobs still waiting: %lld, %lld, %lld, %lld",
              kt_int("LLEN queue:default"), kt_int("LLEN queue:ruby2"), kt_int("LLEN queue:ruby10"),
              kt_int("LLEN queue:capstan5"));
    kt_sleep(1.5); /* a second run, or a late failure, would show by now */
    char what[1024] = "";
    size_t at = 0;
    int bad = 0;
    for (unsigned i = 0; i < NF; i++) {
        fleet_t *f = &fl[i];
        int ne = name_errors("retry", f) + name_errors("dead", f);
        int failed = kt_log_count(f->capstan, "uninitialized constant");
        at += (size_t)snprintf(what + at, sizeof(what) - at,
                               "%s: %d failed with NameError (%d in retry or dead), Ruby-only runs %lld, "
                               "RecordJob runs %lld (%lld in Ruby); ",
                               f->queue, failed, ne, runs_of(f, "r"), runs_of(f, "c"),
                               kt_int("SCARD c:%s:ruby", f->queue));
        bad |= failed > 0 || ne > 0 || runs_of(f, "r") != PER_FLEET / 2 || runs_of(f, "c") != PER_FLEET / 2;
    }
    cr_assert(!bad, "Sidekiq %s: %s", sidekiq, what);
    cr_assert_eq(kt_int("GET stat:failed") + kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0, "none failed at all");
    for (unsigned i = 0; i < NF; i++) {
        fleet_t *f = &fl[i];
        for (int j = 0; j < PER_FLEET; j++)
            cr_assert(kt_int("SISMEMBER %s:%s %s", j % 2 ? "c" : "r", f->queue, f->jid[j]) == 1,
                      "%s ran on %s", f->jid[j], f->queue);
        cr_assert_eq(kt_int("SCARD r:%s", f->queue), PER_FLEET / 2, "each Ruby-only job ran once, in Ruby");
        cr_assert_eq(kt_int("SCARD c:%s", f->queue), PER_FLEET / 2, "each RecordJob ran once");
        cr_assert_eq(kt_int("LLEN queue:%s", f->queue), 0);
    }
    for (unsigned i = 0; i < NF; i++) {
        kill(fl[i].capstan, SIGTERM);
        kill(fl[i].ruby, SIGTERM);
    }
    for (unsigned i = 0; i < NF; i++) {
        cr_assert_eq(kt_wait_exit(fl[i].capstan, 30), 0, "capstan of %s exits 0", fl[i].queue);
        cr_assert_eq(kt_wait_exit(fl[i].ruby, 30), 0, "Sidekiq of %s exits 0", fl[i].queue);
        kt_untrack(fl[i].capstan);
        kt_untrack(fl[i].ruby);
    }
    free(cfg);
}

/* What a capstan saw of Ruby outlives both processes' restart: capstan A
 * sees Ruby read queue default and keeps that in capstan:ruby:default;
 * Ruby and A stop (a clean stop leaves the process set); capstan B, started
 * while no Ruby process runs, knows the queue is shared from its first
 * look, says so, and gives a Ruby job back for Ruby, which runs it once
 * when it is back. */
Test(fleet, what_a_capstan_saw_of_ruby_outlives_a_restart)
{
    char *rid = NULL;
    pid_t rb = ruby_start(KT_SIDEKIQ_DEBIAN, &rid);
    char *cfg = kt_write_conf(NULL);
    pid_t a = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(a, " reads queues [default]"), 15), "%s", kt_capstan_log(a));
    long long ttl = kt_int("TTL capstan:ruby:default");
    cr_assert(ttl > 0 && ttl <= 600, "kept for the 10 minutes a queue stays shared: %lld", ttl);
    stop_ok(rb, "sidekiq");
    stop_ok(a, "capstan");
    cr_assert_eq(kt_int("SCARD processes"), 0);

    pid_t b = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(b, "read queues [default] less than 10 minutes ago"), 15), "%s",
              kt_capstan_log(b));
    char jid[25];
    kt_make_jid(jid, 30, 0);
    char *job = kt_payload("RubyOnlyJob", "[\"o\"]", jid, "default");
    kt_push_all(kt_redis(), "default", &job, 1);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(b, "no handler for RubyOnlyJob (queue:default); unknown_class: requeue "
                                          "(a Ruby Sidekiq process reads the queue)"), 15),
              "%s", kt_capstan_log(b));
    rb = kt_sidekiq_start_v(KT_SIDEKIQ_DEBIAN, "fleet_jobs.rb", "default");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD o") == 1, 40), "Ruby ran it: %s", kt_sidekiq_log());
    kt_sleep(1);
    cr_assert_eq(kt_int("LLEN o:log"), 1, "once");
    cr_assert_eq(kt_int("GET stat:failed") + kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
    stop_ok(b, "capstan");
    stop_ok(rb, "sidekiq");
    free(job);
    free(cfg);
    free(rid);
}

/* CPU seconds process pid has used (/proc/pid/stat: utime + stime). */
static double cpu_of(pid_t pid)
{
    char path[64], st[1024] = "";
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r"); /* its size reads 0: kt_read_file sees nothing */
    cr_assert(f, "%s", path);
    size_t n = fread(st, 1, sizeof(st) - 1, f);
    fclose(f);
    st[n] = '\0';
    char *p = strrchr(st, ')');
    unsigned long ut = 0, stime = 0;
    cr_assert(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stime) == 2,
              "%s", st);
    return (double)(ut + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* No Ruby process, default config: a job of a class no process knows is
 * held in its queue through capstan's first minute (a Ruby process
 * starting with it may not have registered yet), without a busy loop and
 * while known jobs run, then fails with NameError into the retry set as
 * Sidekiq's would. */
Test(fleet, a_class_no_process_knows_fails_after_the_first_minute)
{
    char jid[25];
    kt_make_jid(jid, 20, 0);
    char *job = kt_payload("NoSuchJob", "[]", jid, "default");
    kt_push_all(kt_redis(), "default", &job, 1);
    char *cfg = kt_write_conf(NULL);
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", cfg, "-c", "4", NULL });
    free(kt_log_identity(pid));
    double t0 = kt_now();
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "no handler for NoSuchJob"), 15), "%s", kt_capstan_log(pid));
    kt_push_jobs("RecordJob", "[\"known\"]", 21, 3);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD known") == 3, 15), "known jobs run meanwhile: %s", kt_capstan_log(pid));
    kt_sleep(30 - (kt_now() - t0));
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead") + kt_int("GET stat:failed"), 0,
                 "not failed in the first minute: %s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 75), "then retried: %s", kt_capstan_log(pid));
    double cpu = cpu_of(pid), wall = kt_now() - t0;
    cr_assert(cpu < wall / 4, "no busy loop meanwhile: %.1f s of CPU in %.1f s", cpu, wall);
    stop_ok(pid, "capstan");
    double score;
    char *m = retry_member(&score);
    cr_assert(strstr(m, jid) && strstr(m, "\"error_class\":\"NameError\"")
                  && strstr(m, "\"error_message\":\"uninitialized constant NoSuchJob\"")
                  && strstr(m, "\"retry_count\":0"), "%s", m);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert_eq(kt_int("EXISTS capstan:ruby:default"), 0, "no Ruby was seen");
    free(m);
    free(cfg);
    free(job);
}

/* unknown_class set in the file, even to the default, outweighs the
 * fleet: capstan says so in its line, as a warning. */
Test(fleet, an_explicit_unknown_class_outweighs_the_fleet)
{
    char *rid = NULL;
    pid_t rb = ruby_start(KT_SIDEKIQ_DEBIAN, &rid);
    char *cfg = write_conf("unknown_class: fail\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, " reads queues ["), 10), "%s", kt_capstan_log(pid));
    char *log = kt_capstan_log(pid), *line = line_of(log, " reads queues [");
    cr_assert(line && strstr(line, rid) && strstr(line, "unknown_class: fail is set"), "%s", log);
    free(line);
    free(log);
    stop_ok(pid, "capstan");
    stop_ok(rb, "sidekiq");
    free(cfg);
    free(rid);
}

/* The config tells "not set" from "set to fail". */
Test(fleet, the_config_tells_unset_from_set_to_fail)
{
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = capstan_config_new();
    cr_assert_eq(cfg->unknown_class, CAPSTAN_UNKNOWN_FAIL);
    cr_assert_eq(cfg->unknown_class_explicit, 0);
    char *path = kt_write_file("u.yml", "concurrency: 2\n");
    cr_assert_eq(capstan_config_load_file(cfg, path, err), 0, "%s", err);
    cr_assert_eq(cfg->unknown_class_explicit, 0, "a file without the key leaves it unset");
    free(path);
    path = kt_write_file("u.yml", "unknown_class: fail\n");
    cr_assert_eq(capstan_config_load_file(cfg, path, err), 0, "%s", err);
    cr_assert_eq(cfg->unknown_class, CAPSTAN_UNKNOWN_FAIL);
    cr_assert_eq(cfg->unknown_class_explicit, 1);
    capstan_config_free(cfg);
    cfg = capstan_config_new();
    char *argv[] = { "run", "--unknown-class", "fail", NULL };
    cr_assert_eq(capstan_config_parse_args(cfg, 3, argv, err), 0, "%s", err);
    cr_assert_eq(cfg->unknown_class_explicit, 1);
    capstan_config_free(cfg);
    free(path);
}

/* unknown_class: skip sends a Sidekiq 8 job (integer milliseconds) to the
 * dead set with failed_at in milliseconds too, under the default
 * timestamps: float. */
Test(fleet, skip_writes_failed_at_in_the_unit_of_the_payload)
{
    long long ms = (long long)(kt_wall() * 1000);
    freeReplyObject(kt_cmd("LPUSH queue:default {\"retry\":true,\"queue\":\"default\",\"args\":[],"
                           "\"class\":\"NoSuchJob\",\"jid\":\"5a5a5a5a5a5a5a5a5a5a5a5a\",\"created_at\":%lld,"
                           "\"enqueued_at\":%lld}", ms, ms));
    char *cfg = write_conf("unknown_class: skip\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", cfg, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 15), "%s", kt_capstan_log(pid));
    stop_ok(pid, "capstan");
    double score;
    redisReply *r = kt_cmd("ZRANGE dead 0 0 WITHSCORES");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    char *dead = strdup(r->element[0]->str);
    score = atof(r->element[1]->str);
    freeReplyObject(r);
    cr_assert(score < kt_wall() + 1 && score > kt_wall() - 60, "the score stays in seconds: %f", score);
    const char *fa = strstr(dead, "\"failed_at\":");
    cr_assert(fa, "%s", dead);
    fa += strlen("\"failed_at\":");
    size_t n = strspn(fa, "0123456789");
    cr_assert(n >= 13 && (fa[n] == ',' || fa[n] == '}'), "integer milliseconds: %s", dead);
    cr_assert(atof(fa) >= (double)ms - 1000 && atof(fa) <= (kt_wall() + 1) * 1000, "%s", dead);
    free(dead);
    free(cfg);
}
