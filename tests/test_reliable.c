/* Reliable fetch end to end: the capstan binary against a real redis-server,
 * killed, restarted, deployed over and cut off from Redis, and what a user
 * would check afterwards: every job ran, none ran twice beyond the ones in
 * flight at a crash, nothing is left in a queue or a working list. Also the
 * working-list listing `capstan stats` uses, and systemd's notify protocol. */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include "helpers.h"
#include "fetch/fetch.h"

/* Settings that make liveness lapse and recovery run in seconds, not
 * minutes (the refresh every 0.5 s stays within a third of the TTL). */
#define FAST_YAML "heartbeat_interval: 0.5\nliveness_ttl: 2\nrecovery_interval: 1\n"

TestSuite(reliable, .timeout = 170, .fini = kt_kill_children);

static int alive(pid_t pid)
{
    return waitpid(pid, NULL, WNOHANG) == 0;
}

/* Number of working lists in the database. */
static long working_lists(redisContext *c)
{
    redisReply *r = redisCommand(c, "KEYS uniquejobs:working:*");
    cr_assert(r && r->type == REDIS_REPLY_ARRAY, "KEYS failed");
    long n = (long)r->elements;
    freeReplyObject(r);
    return n;
}

static void push_one(redisContext *c, const char *cls, const char *args, const char *jid)
{
    char *p = kt_payload(cls, args, jid, "default");
    kt_push_all(c, "default", &p, 1);
    free(p);
}


/* Lines of pid's log that contain both a and b. */
static int log_lines_with(pid_t pid, const char *a, const char *b)
{
    char *log = kt_capstan_log(pid), *save = NULL;
    int n = 0;
    for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        n += strstr(line, a) && (!b || strstr(line, b));
    free(log);
    return n;
}

static char *jid_eq(const char *jid)
{
    char *s = NULL;
    cr_assert(asprintf(&s, "jid=%s ", jid) > 0);
    return s;
}

/* (a) kill -9 at several moments of a drain (kills of them, in a drain of
 * records jobs); lock (or NULL) the lock type every recording job has,
 * each its own lock. */
enum { EVERY_SLEEP = 50, KILLS_MAX = 5 };
static void chaos_kill9(long records, int kills, const char *lock)
{
    redisContext *c = kt_redis();
    size_t total = records + records / EVERY_SLEEP, n = 0;
    char **p = calloc(total, sizeof(char *));
    char (*jids)[25] = calloc(records, sizeof(*jids));
    for (unsigned i = 0, r = 0; n < total; n++) {
        char jid[25];
        if (n % (EVERY_SLEEP + 1) == EVERY_SLEEP) {
            kt_make_jid(jid, 2, i++);
            p[n] = kt_payload("SleepJob", "[50]", jid, "default");
        } else {
            kt_make_jid(jids[r], 1, r);
            p[n] = lock ? kt_payload_locked("RecordJob", "[\"rec\"]", jids[r], "default", lock,
                                            jids[r])
                        : kt_payload("RecordJob", "[\"rec\"]", jids[r], "default");
            r++;
        }
    }
    kt_push_all(c, "default", p, total);
    for (size_t i = 0; i < total; i++)
        free(p[i]);
    free(p);

    /* Kill at random points of the drain, measured by jobs done, so every
     * kill lands while it is still draining whatever the machine's speed. */
    unsigned seed = (unsigned)getpid() ^ (unsigned)(kt_now() * 1e3);
    srand(seed);
    long at[KILLS_MAX], span = (records - 3000) / kills;
    for (int k = 0; k < kills; k++)
        at[k] = 1000 + (long)k * span + rand() % (span * 2 / 3);
    char *y = kt_write_file("chaos.yml", FAST_YAML "timeout: 5\n");
    const char *args[] = { "--no-supervisor", "-C", y, "-c", "10", NULL };
    double t0 = kt_now();
    pid_t pid = kt_capstan_start(args), pids[KILLS_MAX + 1];
    pids[0] = pid;
    long inflight = 0;
    for (int k = 0; k < kills; k++) {
        char *id = kt_log_identity(pid);
        cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") >= at[k], 90),
                  "stalled before kill %d at %lld done: %s", k + 1, kt_int("SCARD rec"),
                  kt_capstan_log(pid));
        kt_sleep((double)(rand() % 200) / 1000.0);
        cr_assert_eq(kt_capstan_stop(pid, SIGKILL, 10), 128 + SIGKILL);
        char *w = kt_working_key(id);
        long held = (long)kt_int("LLEN %s", w);
        inflight += held;
        fprintf(stderr, "[chaos] kill %d at %lld done, %ld in its working list\n", k + 1,
                kt_int("SCARD rec"), held);
        free(w);
        free(id);
        pid = pids[k + 1] = kt_capstan_start(args);
    }
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == records && kt_int("LLEN queue:default") == 0
                            && working_lists(c) == 0, 90),
              "not drained: %lld recorded, %lld queued, %ld working lists\n%s",
              kt_int("SCARD rec"), kt_int("LLEN queue:default"), working_lists(c),
              kt_capstan_log(pid));
    double wall = kt_now() - t0;
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));

    /* Every jid, not just the count. */
    long missing = 0;
    for (long done = 0; done < records; done += 1000) {
        const char *argv[1002] = { "SMISMEMBER", "rec" };
        for (size_t i = 0; i < 1000; i++)
            argv[2 + i] = jids[done + i];
        redisReply *r = redisCommandArgv(c, 1002, argv, NULL);
        cr_assert(r && r->type == REDIS_REPLY_ARRAY && r->elements == 1000);
        for (size_t i = 0; i < r->elements; i++)
            missing += r->element[i]->integer == 0;
        freeReplyObject(r);
    }
    long runs = (long)kt_int("LLEN rec:log"), dups = runs - (long)kt_int("SCARD rec");
    fprintf(stderr, "[chaos] seed %u: %ld %s jobs (+%zu SleepJobs), %d kills, %ld in flight at "
            "the kills, %ld duplicate runs, %.1f s\n", seed, records, lock ? lock : "plain",
            total - (size_t)records, kills, inflight, dups, wall);
    cr_assert_eq(missing, 0, "%ld jobs lost", missing);
    /* In flight: whatever was in the working list at the kill, i.e. running,
     * fetched in a batch and not started yet, or finished and not acked. */
    cr_assert_leq(dups, inflight, "only jobs in flight at a kill may run twice");
    cr_assert_eq(kt_int("ZCARD dead"), 0, "nothing was taken for a poison pill");
    cr_assert_eq(kt_int("ZCARD retry"), 0);
    for (int k = 0; k <= kills; k++)
        cr_assert(!kt_log_has(pids[k], "gave back"), "no job a processor held was given back: %s",
                  kt_capstan_log(pids[k]));
    /* A job killed holding its runtime lock ran again under the same jid,
     * which took the lock over and released it. */
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 0, "no lock is left");
    cr_assert(!lock || !kt_log_has(pid, "Skipping job"), "%s", kt_capstan_log(pid));
    free(jids);
    free(y);
}

Test(reliable, chaos_kill9_five_times_loses_nothing)
{
    chaos_kill9(20000, 5, NULL);
}

/* Short while_executing jobs are taken several at a time with their locks
 * (feed/): killed so, their locks are not in the way of the
 * jobs' next run. */
Test(reliable, chaos_kill9_with_runtime_locks_loses_nothing)
{
    chaos_kill9(10000, 3, "while_executing");
}

/* (b) A drains after TERM while B, started meanwhile, takes the new jobs. */
Test(reliable, rolling_deploy_runs_each_job_once)
{
    redisContext *c = kt_redis();
    char *y = kt_write_file("deploy.yml", FAST_YAML "timeout: 30\n");
    const char *args[] = { "-C", y, "-c", "4", NULL };
    pid_t a = kt_capstan_start(args);
    char *ida = kt_log_identity(a), *wa = kt_working_key(ida);
    char sj[4][25];
    /* Longer than liveness_ttl: A must keep its liveness key alive while it
     * drains, or B would take these jobs from it. */
    for (unsigned i = 0; i < 4; i++) {
        kt_make_jid(sj[i], 7, i);
        push_one(c, "SleepJob", "[3000]", sj[i]);
    }
    /* Started, not only fetched: a job fetched as A goes quiet is put back
     * (for B), as Sidekiq does. */
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", wa) == 4 && log_lines_with(a, "SleepJob", "INFO: start") == 4, 10),
              "%s", kt_capstan_log(a));
    kill(a, SIGTERM);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(a, "Pausing to allow workers to finish"), 5));
    pid_t b = kt_capstan_start(args);
    free(kt_log_identity(b));
    char **p = calloc(300, sizeof(char *));
    for (unsigned i = 0; i < 300; i++) {
        char jid[25];
        kt_make_jid(jid, 8, i);
        p[i] = kt_payload("RecordJob", "[\"rec\"]", jid, "default");
    }
    kt_push_all(c, "default", p, 300);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == 300, 20), "%s", kt_capstan_log(b));
    cr_assert(alive(a), "A is still draining while B works");
    cr_assert_eq(kt_wait_exit(a, 20), 0, "A exits 0 once drained: %s", kt_capstan_log(a));
    for (int i = 0; i < 4; i++) {
        char *j = jid_eq(sj[i]);
        int done = log_lines_with(a, j, "INFO: done");
        cr_assert_eq(done, 1, "%s finished in A %d times:\n%s", sj[i], done, kt_capstan_log(a));
        cr_assert_eq(log_lines_with(b, j, NULL), 0, "%s never ran in B", sj[i]);
        free(j);
    }
    cr_assert(!kt_log_has(a, "Pushed"), "nothing was requeued: %s", kt_capstan_log(a));
    cr_assert(!kt_log_has(b, "recovered"), "B never touched A's list: %s", kt_capstan_log(b));
    cr_assert_eq(kt_int("LLEN rec:log"), 300, "no job ran twice");
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert(KT_WAIT_UNTIL(working_lists(c) == 0, 5));
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 15), 0);
    for (unsigned i = 0; i < 300; i++)
        free(p[i]);
    free(p);
    free(ida);
    free(wa);
    free(y);
}

/* (c) B, already running, takes a killed A's jobs without a restart. */
Test(reliable, live_process_recovers_a_dead_ones_jobs)
{
    const double ttl = 3, interval = 2;
    redisContext *c = kt_redis();
    char *y = kt_write_file("recover.yml", "heartbeat_interval: 0.5\nliveness_ttl: 3\n"
                                        "recovery_interval: 2\n");
    const char *args[] = { "--no-supervisor", "-C", y, "-c", "3", NULL };
    pid_t a = kt_capstan_start(args);
    char *ida = kt_log_identity(a), *wa = kt_working_key(ida);
    char sj[3][25];
    for (unsigned i = 0; i < 3; i++) {
        kt_make_jid(sj[i], 9, i);
        push_one(c, "SleepJob", "[2500]", sj[i]);
    }
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", wa) == 3, 10), "%s", kt_capstan_log(a));
    pid_t b = kt_capstan_start(args);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(b, "Starting processing"), 10));
    char lkey[512];
    capstan__fetch_liveness_key(ida, lkey, sizeof(lkey));
    double left = (double)kt_int("PTTL %s", lkey) / 1000.0;
    cr_assert_eq(kt_capstan_stop(a, SIGKILL, 10), 128 + SIGKILL);
    double t0 = kt_now();
    /* A pass first only marks the list a suspect; one at least ttl / 2
     * later takes it (the grace a live owner has to re-create its key). */
    const double grace = ttl / 2;
    cr_assert(KT_WAIT_UNTIL(!kt_int("EXISTS %s", wa), ttl + grace + 2 * interval + 5),
              "not recovered: %s", kt_capstan_log(b));
    double latency = kt_now() - t0;
    fprintf(stderr, "[recovery] jobs back %.2f s after the kill (liveness had %.2f s left; "
            "ttl %.0f s, interval %.0f s)\n", latency, left, ttl, interval);
    cr_assert_geq(latency, left + grace - 0.3, "not taken while the owner counted as alive");
    cr_assert_leq(latency, ttl + grace + 2 * interval, "within about ttl + grace + 2 intervals");
    for (int i = 0; i < 3; i++) {
        char *j = jid_eq(sj[i]);
        cr_assert(KT_WAIT_UNTIL(log_lines_with(b, j, "INFO: done") == 1, 10), "%s", kt_capstan_log(b));
        free(j);
    }
    cr_assert(alive(b), "B was never restarted");
    cr_assert(kt_log_has(b, "recovered 3 orphaned jobs from 1 dead processes"), "%s", kt_capstan_log(b));
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert(KT_WAIT_UNTIL(working_lists(c) == 0, 5));
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 15), 0);
    free(ida);
    free(wa);
    free(y);
}

/* (d) Redis dies (kill -9) and comes back mid-run. */
Test(reliable, redis_restart_mid_run_loses_nothing)
{
    enum { N = 3000, CONC = 5 };
    kt_aof_redis_t s;
    kt_aof_init(&s, "aof");
    kt_aof_start(&s);
    redisContext *c = kt_aof_connect(&s);
    cr_assert(c);
    char **p = calloc(N + N / 50, sizeof(char *));
    size_t n = 0;
    for (unsigned i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 3, i);
        p[n++] = kt_payload("RecordJob", "[\"rec\"]", jid, "default");
        if (i % 50 == 49) {
            kt_make_jid(jid, 4, i);
            p[n++] = kt_payload("SleepJob", "[100]", jid, "default");
        }
    }
    kt_push_all(c, "default", p, n);
    char *y = kt_write_file("restart.yml", FAST_YAML "average_scheduled_poll_interval: 0.5\n");
    const char *args[] = { "-C", y, "-c", "5", "--redis-url", s.url, NULL };
    pid_t pid = kt_capstan_start(args);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD rec") >= N / 4, 30), "%s", kt_capstan_log(pid));
    redisFree(c);
    kt_aof_kill(&s);
    /* An outage of a fixed length: long enough for every thread to notice. */
    kt_sleep(1.0);
    kt_aof_start(&s);
    c = kt_aof_connect(&s);
    cr_assert(c);
    long before = (long)kt_int_on(c, "SCARD rec");
    /* A job whose handler lost Redis fails and is scheduled for a retry in
     * 15 s or more; bring that time forward rather than wait for it. */
    long retried = 0;
    int ok = KT_WAIT_UNTIL(({
        redisReply *r = redisCommand(c, "ZRANGE retry 0 -1");
        if (r && r->type == REDIS_REPLY_ARRAY && (long)r->elements > retried)
            retried = (long)r->elements;
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
            freeReplyObject(redisCommand(c, "ZADD retry XX 0 %b", r->element[i]->str,
                                         r->element[i]->len));
        freeReplyObject(r);
        kt_int_on(c, "SCARD rec") == N && kt_int_on(c, "LLEN queue:default") == 0
            && kt_int_on(c, "ZCARD retry") == 0 && working_lists(c) == 0; }), 60);
    cr_assert(ok, "after the restart: %lld recorded, %lld queued, %lld in retry, %ld working lists\n%s",
              kt_int_on(c, "SCARD rec"), kt_int_on(c, "LLEN queue:default"), kt_int_on(c, "ZCARD retry"),
              working_lists(c), kt_capstan_log(pid));
    long dups = (long)(kt_int_on(c, "LLEN rec:log") - kt_int_on(c, "SCARD rec"));
    fprintf(stderr, "[redis-restart] %d jobs, %ld done before the restart, %ld failed with Redis "
            "gone and retried, %ld duplicates\n", N, before, retried, dups);
    cr_assert(alive(pid), "capstan rode out the outage");
    cr_assert(kt_log_has(pid, "Redis is online"), "%s", kt_capstan_log(pid));
    cr_assert_leq(dups, CONC, "only jobs in flight at the outage may run twice");
    cr_assert_eq(kt_int_on(c, "ZCARD dead"), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    redisFree(c);
    kill(s.pid, SIGTERM);
    waitpid(s.pid, NULL, 0);
    for (size_t i = 0; i < n; i++)
        free(p[i]);
    free(p);
    free(y);
}

/* Starts of each SleepJob jid in the logs of procs[0..n), all of them
 * stopped first (job lines are written in batches, all of them by exit). */
static int starts(const pid_t *procs, int n, const char *jid)
{
    char *j = jid_eq(jid);
    int runs = 0;
    for (int i = 0; i < n; i++)
        runs += log_lines_with(procs[i], j, "INFO: start");
    free(j);
    return runs;
}

/* Two workers A and B (four processors each) on the private server s,
 * running four SleepJobs of ms milliseconds between them (jids into sj; a
 * batched fetch may give all four to one); returns once both have fetched
 * all four. */
static void two_busy_workers(kt_aof_redis_t *s, redisContext *c, const char *const *args,
                             pid_t *a, pid_t *b, char sj[4][25], unsigned tag, const char *ms)
{
    *a = kt_capstan_start(args);
    *b = kt_capstan_start(args);
    char *ida = kt_log_identity(*a), *idb = kt_log_identity(*b), *wa = kt_working_key(ida), *wb = kt_working_key(idb);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(*a, "Starting processing") && kt_log_has(*b, "Starting processing"), 10));
    char *p[4], args_json[32];
    snprintf(args_json, sizeof(args_json), "[%s]", ms);
    for (unsigned i = 0; i < 4; i++) {
        kt_make_jid(sj[i], tag, i);
        p[i] = kt_payload("SleepJob", args_json, sj[i], "default");
    }
    kt_push_all(c, "default", p, 4);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "LLEN %s", wa) + kt_int_on(c, "LLEN %s", wb) == 4, 10),
              "%s\n%s", kt_capstan_log(*a), kt_capstan_log(*b));
    for (int i = 0; i < 4; i++)
        free(p[i]);
    free(ida);
    free(idb);
    free(wa);
    free(wb);
    (void)s;
}

/* Every job of two_busy_workers ran exactly once over procs[0..n). */
static void each_ran_once(redisContext *c, pid_t *procs, int n, char sj[4][25])
{
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "LLEN queue:default") == 0 && working_lists(c) == 0, 30),
              "not drained:\n%s\n%s", kt_capstan_log(procs[0]), kt_capstan_log(procs[n - 1]));
    for (int i = 0; i < n; i++)
        cr_assert_eq(kt_capstan_stop(procs[i], SIGTERM, 20), 0, "%s", kt_capstan_log(procs[i]));
    int twice = 0;
    for (int i = 0; i < 4; i++) {
        int runs = starts(procs, n, sj[i]);
        cr_assert_geq(runs, 1, "%s never ran", sj[i]);
        twice += runs > 1;
    }
    fprintf(stderr, "[liveness] %d of 4 jobs of live workers ran twice\n", twice);
    cr_assert_eq(twice, 0, "jobs of live workers ran twice:\n%s\n%s", kt_capstan_log(procs[0]),
                 kt_capstan_log(procs[n - 1]));
}

/* Redis comes back after an outage longer than liveness_ttl: every liveness
 * key has lapsed meanwhile, yet the processes are alive and still running
 * their jobs; none may take another's. */
Test(reliable, redis_outage_longer_than_liveness_ttl_takes_no_live_jobs)
{
    kt_aof_redis_t s;
    kt_aof_init(&s, "aof2");
    kt_aof_start(&s);
    redisContext *c = kt_aof_connect(&s);
    cr_assert(c);
    char *y = kt_write_file("outage.yml", FAST_YAML);
    const char *args[] = { "-C", y, "-c", "2", "--redis-url", s.url, NULL };
    pid_t procs[2];
    char sj[4][25];
    two_busy_workers(&s, c, args, &procs[0], &procs[1], sj, 16, "5000");
    redisFree(c);
    kt_aof_kill(&s);
    kt_sleep(3.0); /* longer than liveness_ttl (2 s) */
    kt_aof_start(&s);
    c = kt_aof_connect(&s);
    cr_assert(c);
    each_ran_once(c, procs, 2, sj);
    redisFree(c);
    kill(s.pid, SIGTERM);
    waitpid(s.pid, NULL, 0);
    free(y);
}

/* (e) A job that kills every worker that runs it ends in the dead set. */
Test(reliable, poison_pill_goes_dead_after_three_recoveries)
{
    redisContext *c = kt_redis();
    char pill[25];
    kt_make_jid(pill, 5, 0);
    push_one(c, "CrashJob", "[]", pill);
    char *y = kt_write_file("pill.yml", FAST_YAML);
    const char *args[] = { "--no-supervisor", "-C", y, "-c", "2", NULL };
    int crashes = 0;
    pid_t pid = kt_capstan_start(args);
    for (int round = 0; round < 5; round++) {
        int st = -1;
        KT_WAIT_UNTIL(({
            pid_t w = waitpid(pid, &st, WNOHANG);
            w == pid || kt_int("ZCARD dead") == 1; }), 15);
        if (kt_int("ZCARD dead") == 1)
            break;
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "worker %d should have crashed: %s",
                  (int)pid, kt_capstan_log(pid));
        crashes++;
        pid = kt_capstan_start(args);
    }
    cr_assert_eq(crashes, 3, "the pill ran (and crashed a worker) three times");
    redisReply *dr = kt_cmd("ZRANGE dead 0 0");
    cr_assert(dr->type == REDIS_REPLY_ARRAY && dr->elements == 1);
    char *dead = strdup(dr->element[0]->str);
    freeReplyObject(dr);
    json_t *j = json_loads(dead, 0, NULL);
    cr_assert(j, "%s", dead);
    cr_assert_str_eq(json_string_value(json_object_get(j, "error_class")), "Capstan::PoisonPill");
    cr_assert_eq(json_integer_value(json_object_get(j, "recovery_count")), 3, "%s", dead);
    cr_assert_str_eq(json_string_value(json_object_get(j, "jid")), pill);
    cr_assert_str_eq(json_string_value(json_object_get(j, "class")), "CrashJob");
    cr_assert(json_is_string(json_object_get(j, "error_message")));
    json_decref(j);
    free(dead);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    /* The fleet is healthy again. */
    for (unsigned i = 0; i < 20; i++) {
        char jid[25];
        kt_make_jid(jid, 6, i);
        push_one(c, "RecordJob", "[\"rec\"]", jid);
    }
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == 20, 10), "%s", kt_capstan_log(pid));
    cr_assert(alive(pid));
    cr_assert(kt_log_has(pid, "1 poison pills sent to the dead set"), "%s", kt_capstan_log(pid));
    char named[128];
    snprintf(named, sizeof(named), "poison pill CrashJob jid=%s sent to the dead set", pill);
    cr_assert(kt_log_has(pid, named), "the pill is named: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(y);
}

/* (f) Working lists in sidekiq-unique-jobs v9's format, left by a Ruby
 * process: recovered when its owner is gone, untouched while it lives. */
Test(reliable, v9_working_lists_are_recovered_only_when_their_owner_is_gone)
{
    redisContext *c = kt_redis();
    char j[4][25];
    char *p[4];
    for (unsigned i = 0; i < 4; i++) {
        kt_make_jid(j[i], 10, i);
        /* What v9's client middleware and fetch leave: lock fields, Ruby
         * float timestamps, an integer too big for 64 bits. */
        cr_assert(asprintf(&p[i],
                           "{\"class\":\"RecordJob\",\"args\":[\"rec\"],"
                           "\"big\":123456789012345678901234567890,\"retry\":true,\"queue\":\"default\",\"lock\":\"until_executed\","
                           "\"lock_digest\":\"uniquejobs:%s\",\"lock_ttl\":null,"
                           "\"jid\":\"%s\",\"created_at\":1767225600.5,\"enqueued_at\":1767225600.6}",
                           j[i], j[i]) > 0);
    }
    const char *dead1 = "uniquejobs:working:otherhost:123:abcdefabcdef";
    const char *live = "uniquejobs:working:otherhost:456:0123456789ab";
    const char *dead2 = "uniquejobs:working:otherhost:789:fedcbafedcba";
    freeReplyObject(kt_cmd("LPUSH %s %s %s", dead1, p[0], p[1]));
    freeReplyObject(kt_cmd("LPUSH %s %s", live, p[2]));
    freeReplyObject(kt_cmd("SET uniquejobs:heartbeat:otherhost:456:0123456789ab 1 EX 60"));

    char *y = kt_write_file("v9.yml", FAST_YAML);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", j[0]) && kt_int("SISMEMBER rec %s", j[1]), 10),
              "the dead owner's jobs ran: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("EXISTS %s", dead1), 0);
    cr_assert(kt_log_has(pid, "recovered 2 orphaned jobs"), "at startup: %s", kt_capstan_log(pid));

    /* A list orphaned after the start shows a periodic pass has run too. */
    freeReplyObject(kt_cmd("LPUSH %s %s", dead2, p[3]));
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", j[3]), 10), "%s", kt_capstan_log(pid));
    redisReply *r = kt_cmd("LRANGE %s 0 -1", live);
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 1);
    cr_assert_str_eq(r->element[0]->str, p[2], "a live owner's list is left byte for byte");
    freeReplyObject(r);
    cr_assert_eq(kt_int("SISMEMBER rec %s", j[2]), 0);

    /* Its owner dies: now it is capstan's to recover. */
    freeReplyObject(kt_cmd("DEL uniquejobs:heartbeat:otherhost:456:0123456789ab"));
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", j[2]), 10), "%s", kt_capstan_log(pid));
    /* RecordJob adds to the set, then to the log: wait for the log too. */
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN rec:log") >= 4 && working_lists(c) == 0, 5));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    cr_assert_eq(kt_int("LLEN rec:log"), 4, "each ran once");
    for (int i = 0; i < 4; i++)
        free(p[i]);
    free(y);
}

/* (g) Jobs given back go where the next fetch looks: the right end. */
Test(reliable, shutdown_requeue_puts_unfinished_job_at_the_head)
{
    redisContext *c = kt_redis();
    char x[25], yj[25], z[25];
    kt_make_jid(x, 11, 0);
    kt_make_jid(yj, 11, 1);
    kt_make_jid(z, 11, 2);
    char *px = kt_payload("SleepJob", "[10000]", x, "default");
    kt_push_all(c, "default", &px, 1);
    char *y = kt_write_file("head.yml", FAST_YAML);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", "-t", "1", NULL });
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 1, 10), "%s", kt_capstan_log(pid));
    push_one(c, "RecordJob", "[\"rec\"]", yj);
    push_one(c, "RecordJob", "[\"rec\"]", z);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0, "%s", kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "Pushed 1 jobs back"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN queue:default"), 3);
    char *head = kt_str("LINDEX queue:default -1");
    cr_assert_str_eq(head, px, "the interrupted job is fetched next, unchanged");
    cr_assert_eq(kt_int("EXISTS %s", w), 0);
    cr_assert_eq(kt_int("SCARD rec"), 0);
    free(head);
    free(px);
    free(id);
    free(w);
    free(y);
}

Test(reliable, job_fetched_while_going_quiet_goes_back_to_the_head)
{
    redisContext *c = kt_redis();
    char x[25], yj[25];
    kt_make_jid(x, 12, 0);
    kt_make_jid(yj, 12, 1);
    char *y = kt_write_file("quiet.yml", FAST_YAML);
    /* One processor, so the two jobs cannot be given back by two threads
     * in either order. Its blocking fetch waits up to 1 s, so it is most
     * likely still waiting when the jobs arrive just after TSTP. */
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", NULL });
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "Starting processing"), 10));
    kill(pid, SIGTSTP);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "no longer accepting new work"), 5));
    char *px = kt_payload("RecordJob", "[\"rec\"]", x, "default");
    char *py = kt_payload("RecordJob", "[\"rec\"]", yj, "default");
    char *both[] = { px, py };
    kt_push_all(c, "default", both, 2);
    int gave_back = KT_WAIT_UNTIL(kt_log_has(pid, "went back to queue:default"), 2.5);
    fprintf(stderr, "[quiet] the give-back path %s\n", gave_back ? "ran" : "did not run this time");
    cr_assert_eq(kt_int("LLEN queue:default"), 2);
    char *head = kt_str("LINDEX queue:default -1");
    cr_assert_str_eq(head, px, "the first pushed is still the next fetched");
    cr_assert_eq(kt_int("SCARD rec"), 0, "a quiet process runs nothing new");
    cr_assert_eq(kt_int("EXISTS %s", w), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(head);
    free(px);
    free(py);
    free(id);
    free(w);
    free(y);
}

Test(reliable, recovery_keeps_the_order_the_dead_process_took_jobs_in)
{
    char j[4][25], *p[4];
    for (unsigned i = 0; i < 4; i++) {
        kt_make_jid(j[i], 13, i);
        p[i] = kt_payload("RecordJob", "[\"rec\"]", j[i], "default");
    }
    /* p[0] waits in the queue; p[1] was fetched first, then p[2], p[3]
     * (LMOVE RIGHT LEFT leaves the first taken at the right end). */
    freeReplyObject(kt_cmd("LPUSH queue:default %s", p[0]));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:gone:1:aaaaaaaaaaaa %s %s %s", p[1], p[2], p[3]));
    capstan_redis_t *r = kt_lib_redis();
    capstan_recovery_t rec;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__fetch_recover(r, "me:2:bbbbbbbbbbbb", 3, 0, CAPSTAN_TS_FLOAT, 0, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.recovered, 3);
    cr_assert_eq(rec.lists, 1);
    /* Fetched next first: p[1], then p[2], p[3], and p[0] after them. */
    for (int i = 1, at = -1; i <= 4; i++, at--) {
        char *e = kt_str("LINDEX queue:default %d", at);
        cr_assert(e && strstr(e, j[i % 4]), "position %d: %s", at, e);
        if (i < 4)
            cr_assert(strstr(e, "\"recovery_count\":1"), "%s", e);
        free(e);
    }
    capstan_redis_free(r);
    for (int i = 0; i < 4; i++)
        free(p[i]);
}

/* The fast pass looks only at the lists of capstan:working: a dead
 * registered process's jobs go back, a live one's and an unregistered
 * list stay (for the full pass), and a dead process with nothing left
 * leaves the set. A running worker registers itself. */
Test(reliable, the_fast_recovery_pass_takes_the_registered_lists_of_dead_processes)
{
    char j[3][25], *p[3];
    for (unsigned i = 0; i < 3; i++) {
        kt_make_jid(j[i], 14, i);
        p[i] = kt_payload("RecordJob", "[\"rec\"]", j[i], "default");
    }
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:gone:1:aaaaaaaaaaaa %s", p[0]));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:live:1:cccccccccccc %s", p[1]));
    freeReplyObject(kt_cmd("SET uniquejobs:heartbeat:live:1:cccccccccccc 1 EX 60"));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:ruby:1:dddddddddddd %s", p[2]));
    freeReplyObject(kt_cmd("SADD capstan:working gone:1:aaaaaaaaaaaa live:1:cccccccccccc empty:1:eeeeeeeeeeee"));
    capstan_redis_t *r = kt_lib_redis();
    capstan_recovery_t rec;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__fetch_recover_known(r, "me:2:bbbbbbbbbbbb", 3, 0, CAPSTAN_TS_FLOAT, 0, &rec, err), 0,
                 "%s", err);
    cr_assert_eq(rec.recovered, 1);
    cr_assert_eq(rec.lists, 1);
    char *e = kt_str("LINDEX queue:default 0");
    cr_assert(e && strstr(e, j[0]), "%s", e);
    free(e);
    cr_assert_eq(kt_int("LLEN uniquejobs:working:live:1:cccccccccccc"), 1, "a live owner's list stays");
    cr_assert_eq(kt_int("LLEN uniquejobs:working:ruby:1:dddddddddddd"), 1, "left for the full pass");
    cr_assert_eq(kt_int("SISMEMBER capstan:working empty:1:eeeeeeeeeeee"), 0);
    cr_assert_eq(kt_int("SISMEMBER capstan:working live:1:cccccccccccc"), 1);
    /* Emptied, the dead one leaves the set at the next pass. */
    cr_assert_eq(capstan__fetch_recover_known(r, "me:2:bbbbbbbbbbbb", 3, 0, CAPSTAN_TS_FLOAT, 0, &rec, err), 0,
                 "%s", err);
    cr_assert_eq(kt_int("SISMEMBER capstan:working gone:1:aaaaaaaaaaaa"), 0);
    /* The full pass finds the unregistered one. */
    cr_assert_eq(capstan__fetch_recover(r, "me:2:bbbbbbbbbbbb", 3, 0, CAPSTAN_TS_FLOAT, 0, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.recovered, 1);
    capstan_redis_free(r);

    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", "--no-supervisor", NULL });
    char *id = kt_wait_identity(pid);
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER capstan:working %s", id) == 1, 20), "a worker registers");
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    cr_assert_eq(kt_int("SISMEMBER capstan:working %s", id), 0, "and leaves at a clean stop");
    free(id);
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

/* A recovery_count written elsewhere may be anything: the largest stays the
 * largest (the job is a poison pill), a negative one counts as none. */
Test(reliable, recovery_count_saturates_and_ignores_negatives)
{
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:gone:1:aaaaaaaaaaaa %s %s",
                           "{\"class\":\"RecordJob\",\"queue\":\"default\",\"jid\":\"big\","
                           "\"args\":[],\"recovery_count\":9223372036854775807}",
                           "{\"class\":\"RecordJob\",\"queue\":\"default\",\"jid\":\"neg\","
                           "\"args\":[],\"recovery_count\":-5}"));
    capstan_redis_t *r = kt_lib_redis();
    capstan_recovery_t rec;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__fetch_recover(r, "me:2:bbbbbbbbbbbb", 3, 0, CAPSTAN_TS_FLOAT, 0, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.recovered, 1);
    cr_assert_eq(rec.killed, 1);
    redisReply *dr = kt_cmd("ZRANGE dead 0 0");
    cr_assert(dr->type == REDIS_REPLY_ARRAY && dr->elements == 1);
    char *dead = strdup(dr->element[0]->str);
    freeReplyObject(dr);
    cr_assert(strstr(dead, "\"jid\":\"big\"")
              && strstr(dead, "\"recovery_count\":9223372036854775807"), "%s", dead);
    char *queued = kt_str("LINDEX queue:default 0");
    cr_assert(queued && strstr(queued, "\"jid\":\"neg\"")
              && strstr(queued, "\"recovery_count\":1"), "%s", queued);
    free(dead);
    free(queued);
    capstan_redis_free(r);
}

/* A job stranded in a live process's own list (its fetch reply lost with the
 * connection) runs; a job a processor is running is left alone. */
Test(reliable, job_stranded_in_a_live_processs_own_list_runs)
{
    redisContext *c = kt_redis();
    char *y = kt_write_file("stray.yml", FAST_YAML);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    char sj[25], rj[25];
    kt_make_jid(sj, 14, 0);
    kt_make_jid(rj, 14, 1);
    push_one(c, "SleepJob", "[4000]", sj);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 1, 10), "%s", kt_capstan_log(pid));
    char *pr = kt_payload("RecordJob", "[\"rec\"]", rj, "default");
    freeReplyObject(kt_cmd("LPUSH %s %s", w, pr));
    double t0 = kt_now();
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", rj), 10), "%s", kt_capstan_log(pid));
    fprintf(stderr, "[stray] ran %.2f s after it was stranded\n", kt_now() - t0);
    cr_assert(kt_log_has(pid, "gave back 1 jobs"), "%s", kt_capstan_log(pid));
    char *j = jid_eq(sj);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, j, "INFO: done") == 1, 10));
    cr_assert_eq(log_lines_with(pid, j, "INFO: start"), 1, "the running job was not given back");
    cr_assert(KT_WAIT_UNTIL(working_lists(c) == 0, 5));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(j);
    free(pr);
    free(id);
    free(w);
    free(y);
}

/* What `capstan stats` shows: each working list, its owner, alive or not. */
Test(reliable, list_working_shows_owners_and_liveness)
{
    redisContext *c = kt_redis();
    /* No periodic recovery during the test, and the dead list is written
     * after the startup pass: it must stay for the listing to show it. */
    char *y = kt_write_file("stats.yml", "heartbeat_interval: 0.5\nliveness_ttl: 2\n"
                                      "recovery_interval: 600\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", "-t", "1", NULL });
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "Starting processing"), 10));
    char sj[25];
    kt_make_jid(sj, 15, 0);
    push_one(c, "SleepJob", "[5000]", sj);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 1, 10), "%s", kt_capstan_log(pid));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:h1:1:aaaaaaaaaaaa a b c"));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:h0:2:bbbbbbbbbbbb d"));
    freeReplyObject(kt_cmd("SET uniquejobs:heartbeat:h0:2:bbbbbbbbbbbb 1 EX 60"));
    /* A live owner with nothing in flight has no list to show. */
    freeReplyObject(kt_cmd("SET uniquejobs:heartbeat:h2:3:cccccccccccc 1 EX 60"));

    capstan_redis_t *r = kt_lib_redis();
    capstan_working_info_t *info = NULL;
    size_t n = 0;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__fetch_list_working(r, &info, &n, err), 0, "%s", err);
    cr_assert_eq(n, 3);
    const char *want[3] = { "h0:2:bbbbbbbbbbbb", "h1:1:aaaaaaaaaaaa", id };
    /* Sorted by identity; capstan's own hostname may sort anywhere. */
    for (size_t k = 0; k < 3; k++) {
        size_t i = 0;
        while (i < n && strcmp(info[i].identity, want[k]) != 0)
            i++;
        cr_assert_lt(i, n, "%s listed", want[k]);
        if (k == 0) {
            cr_assert_eq(info[i].length, 1);
            cr_assert(info[i].alive);
            cr_assert(info[i].liveness_ms > 50000 && info[i].liveness_ms <= 60000);
        } else if (k == 1) {
            cr_assert_eq(info[i].length, 3);
            cr_assert_not(info[i].alive);
            cr_assert_eq(info[i].liveness_ms, 0);
        } else {
            cr_assert_eq(info[i].length, 1);
            cr_assert(info[i].alive, "a running capstan is alive");
            cr_assert(info[i].liveness_ms > 0 && info[i].liveness_ms <= 2000,
                      "liveness_ttl 2 s: %lld ms", info[i].liveness_ms);
        }
    }
    for (size_t i = 1; i < n; i++)
        cr_assert_lt(strcmp(info[i - 1].identity, info[i].identity), 0);
    capstan__fetch_working_info_free(info, n);
    capstan__fetch_working_info_free(NULL, 0);

    /* An empty database lists nothing. */
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    freeReplyObject(kt_cmd("DEL uniquejobs:working:h1:1:aaaaaaaaaaaa uniquejobs:working:h0:2:bbbbbbbbbbbb"));
    freeReplyObject(kt_cmd("DEL queue:default"));
    info = (capstan_working_info_t *)1;
    cr_assert_eq(capstan__fetch_list_working(r, &info, &n, err), 0, "%s", err);
    cr_assert_eq(n, 0);
    cr_assert_null(info);
    capstan_redis_free(r);
    free(id);
    free(w);
    free(y);
}

Test(reliable, liveness_ttl_is_configurable_and_checked)
{
    char *ok = kt_write_file("ttl.yml", "heartbeat_interval: 1\nliveness_ttl: 4.5\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", ok, "-c", "1", NULL });
    char *id = kt_log_identity(pid);
    char lkey[512];
    capstan__fetch_liveness_key(id, lkey, sizeof(lkey));
    cr_assert(KT_WAIT_UNTIL(kt_int("PTTL %s", lkey) > 0, 5));
    long long ms = kt_int("PTTL %s", lkey);
    cr_assert(ms > 0 && ms <= 4500, "PTTL %lld", ms);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    cr_assert_eq(kt_int("EXISTS %s", lkey), 0, "a clean exit with nothing in flight removes it");

    char *slow = kt_write_file("ttl-slow.yml", "heartbeat_interval: 5\nliveness_ttl: 10\n");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-C", slow, NULL }, &out), 78, "%s", out);
    cr_assert(strstr(out, "liveness_ttl: must be at least 3 times heartbeat_interval"), "%s", out);
    free(out);
    char *zero = kt_write_file("ttl-zero.yml", "liveness_ttl: 0\n");
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-C", zero, NULL }, &out), 78, "%s", out);
    cr_assert(strstr(out, "liveness_ttl"), "%s", out);
    free(out);
    free(id);
    free(ok);
    free(slow);
    free(zero);
}

/* Receives datagrams on fd until one contains want or timeout passes;
 * counts the WATCHDOG=1 pings seen on the way. */
static int recv_until(int fd, const char *want, double timeout, int *pings)
{
    double end = kt_now() + timeout;
    char buf[512];
    while (kt_now() < end) {
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        if (poll(&pf, 1, (int)((end - kt_now()) * 1000) + 1) <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        if (pings && strstr(buf, "WATCHDOG=1"))
            (*pings)++;
        if (strstr(buf, want))
            return 1;
    }
    return 0;
}

static int notify_socket(const char *name, int abstract)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t len = strlen(name);
    cr_assert(len < sizeof(sa.sun_path));
    memcpy(sa.sun_path, name, len);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    if (abstract)
        sa.sun_path[0] = '\0';
    else
        salen++;
    cr_assert(bind(fd, (struct sockaddr *)&sa, salen) == 0, "bind %s: %s", name, strerror(errno));
    return fd;
}

Test(reliable, systemd_notify_ready_watchdog_stopping)
{
    char *path = kt_tmp("notify.sock");
    unlink(path);
    int fd = notify_socket(path, 0);
    setenv("NOTIFY_SOCKET", path, 1);
    setenv("WATCHDOG_USEC", "400000", 1);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    int pings = 0;
    cr_assert(recv_until(fd, "READY=1", 10, &pings), "no READY=1: %s", kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "Starting processing"), "ready only once processing");
    cr_assert(recv_until(fd, "NEVER", 1.0, &pings) == 0);
    cr_assert_geq(pings, 3, "WATCHDOG=1 every 0.2 s: %d in 1 s", pings);
    kill(pid, SIGTERM);
    cr_assert(recv_until(fd, "STOPPING=1", 10, NULL), "no STOPPING=1: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_wait_exit(pid, 15), 0);
    close(fd);
    unlink(path);
    free(path);
}

Test(reliable, systemd_notify_abstract_socket_without_watchdog)
{
    char name[108];
    snprintf(name, sizeof(name), "@capstan-test-%d-%s", (int)getpid(), kt_url() + 8);
    int fd = notify_socket(name, 1);
    setenv("NOTIFY_SOCKET", name, 1);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    unsetenv("NOTIFY_SOCKET");
    int pings = 0;
    cr_assert(recv_until(fd, "READY=1", 10, &pings), "no READY=1: %s", kt_capstan_log(pid));
    kill(pid, SIGTERM);
    cr_assert(recv_until(fd, "STOPPING=1", 10, &pings), "no STOPPING=1: %s", kt_capstan_log(pid));
    cr_assert_eq(pings, 0, "no watchdog without WATCHDOG_USEC");
    cr_assert_eq(kt_wait_exit(pid, 15), 0);
    close(fd);
}

/* Processors fetch several jobs in one round trip under load and share
 * them: a job fetched together with a long one must not wait for it while
 * another thread is free. */
Test(reliable, jobs_fetched_together_never_wait_behind_a_long_one)
{
    redisContext *c = kt_redis();
    char jid[25];
    char *p[4];
    kt_make_jid(jid, 7, 0);
    p[0] = kt_payload("SleepJob", "[6000]", jid, "default");
    for (unsigned i = 1; i < 4; i++) {
        kt_make_jid(jid, 8, i);
        p[i] = kt_payload("RecordJob", "[\"hol\"]", jid, "default");
    }
    kt_push_all(c, "default", p, 4);
    for (int i = 0; i < 4; i++)
        free(p[i]);
    double t0 = kt_now();
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "4", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD hol") == 3, 20), "%s", kt_capstan_log(pid));
    double took = kt_now() - t0;
    /* Done before the long job could have finished: they did not wait. */
    cr_assert_lt(took, 5.5, "the three took %.1f s: %s", took, kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    cr_assert_eq(kt_int("SCARD hol"), 3, "each ran once");
    cr_assert_eq(kt_int("LLEN hol:log"), 3);
}

/* The library's batch exchange: one call fetches several jobs (reporting
 * each one's lock as held by its jid), and one call acks several, each
 * releasing its lock only if the job was still in the working list: a job
 * recovered meanwhile keeps its lock for the copy that will run. */
Test(reliable, batch_fetch_and_ack_release_only_locks_of_jobs_still_held)
{
    char jid[3][25], digest[3][64], *p[3];
    for (unsigned i = 0; i < 3; i++) {
        kt_make_jid(jid[i], 21, i);
        snprintf(digest[i], sizeof(digest[i]), "uniquejobs:batch%u", i);
        cr_assert(asprintf(&p[i],
                           "{\"retry\":true,\"queue\":\"ba\",\"args\":[%u],\"class\":\"NoopJob\","
                           "\"jid\":\"%s\",\"lock\":\"until_executed\",\"lock_digest\":\"%s\","
                           "\"created_at\":1,\"enqueued_at\":1}", i, jid[i], digest[i]) > 0);
        kt_int("HSET %s:LOCKED %s {}", digest[i], jid[i]);
        kt_int("ZADD uniquejobs:digests 1 %s", digest[i]);
    }
    kt_push_all(kt_redis(), "ba", p, 3);
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_queue_conf_t q = { .name = "ba" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = "batch-test", .queues = &q,
                            .nqueues = 1, .strict = 1, .block_timeout = 0.1 };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    capstan_fetched_t got[4];
    cr_assert_eq(capstan__fetch_exchange(f, r, NULL, 0, got, 4, 0), 3, "one call, three jobs");
    for (unsigned i = 0; i < 3; i++) {
        cr_assert(strstr(got[i].payload, jid[i]), "in queue order: %s", got[i].payload);
        cr_assert_str_eq(got[i].queue, "ba");
        cr_assert(got[i].held_digest && !strcmp(got[i].held_digest, digest[i])
                  && got[i].held_jid && !strcmp(got[i].held_jid, jid[i]),
                  "the fetch saw each lock held by its jid");
    }
    cr_assert_eq(kt_int("LLEN uniquejobs:working:batch-test"), 3);
    /* Job 1 was taken back meanwhile (as a recovery would). */
    kt_int("LREM uniquejobs:working:batch-test 1 %s", p[1]);
    capstan_ack_item_t acks[3];
    char keys[3][80];
    for (unsigned i = 0; i < 3; i++) {
        snprintf(keys[i], sizeof(keys[i]), "%s:LOCKED", digest[i]);
        acks[i] = (capstan_ack_item_t){ .raw = got[i].payload, .len = got[i].len,
                                    .ack = { .kind = CAPSTAN_ACK_OK, .lock_key = keys[i],
                                             .lock_jid = jid[i] } };
    }
    cr_assert_eq(capstan__fetch_exchange(f, r, acks, 3, NULL, 0, 0), 0);
    for (unsigned i = 0; i < 3; i++)
        cr_assert_eq(acks[i].rc, 0, "ack %u written", i);
    cr_assert_eq(kt_int("LLEN uniquejobs:working:batch-test"), 0);
    cr_assert_eq(kt_int("EXISTS %s", keys[0]), 0, "released with its job");
    cr_assert_eq(kt_int("EXISTS %s", keys[2]), 0, "released with its job");
    cr_assert_eq(kt_int("HEXISTS %s %s", keys[1], jid[1]), 1, "kept: its job was taken back");
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 1);
    /* Nothing left: a non-blocking fetch returns at once with none. */
    cr_assert_eq(capstan__fetch_exchange(f, r, NULL, 0, got, 4, 0), 0);
    for (unsigned i = 0; i < 3; i++) {
        capstan__fetched_clear(&got[i]);
        free(p[i]);
    }
    capstan__fetch_free(f);
    capstan_redis_free(r);
}

/* Builds the working list of fetch f and a copy "ref" from the payloads
 * named by order (indexes into p, head first), acks the jobs named by acks
 * (nacks of them, successes, in one round trip), takes the same jobs out
 * of ref one LREM from the tail each, and checks both lists are the same:
 * the payloads and their order. With locked, each ack releases a lock of
 * its own (acks.lua rather than acks_plain.lua), which must go exactly
 * when its LREM found the job. */
static void acks_match_lrem(capstan_fetch_t *f, capstan_redis_t *r, char **p, const unsigned *order,
                            size_t n, const unsigned *acks, size_t nacks, int locked)
{
    redisContext *c = kt_redis();
    const char *w = "uniquejobs:working:plain-acks";
    kt_int("DEL %s ref", w);
    for (size_t i = n; i-- > 0;) {
        kt_int("LPUSH %s %s", w, p[order[i]]);
        kt_int("LPUSH ref %s", p[order[i]]);
    }
    capstan_ack_item_t items[80];
    char keys[80][40], jids[80][8];
    cr_assert_leq(nacks, 80);
    for (size_t i = 0; i < nacks; i++) {
        items[i] = (capstan_ack_item_t){ .raw = p[acks[i]], .len = strlen(p[acks[i]]),
                                     .ack = { .kind = CAPSTAN_ACK_OK } };
        if (locked) {
            snprintf(keys[i], sizeof(keys[i]), "uniquejobs:ack%zu:LOCKED", i);
            snprintf(jids[i], sizeof(jids[i]), "j%zu", i);
            kt_int("HSET %s %s {}", keys[i], jids[i]);
            items[i].ack.lock_key = keys[i];
            items[i].ack.lock_jid = jids[i];
        }
    }
    cr_assert_eq(capstan__fetch_exchange(f, r, items, nacks, NULL, 0, 0), 0);
    for (size_t i = 0; i < nacks; i++) {
        cr_assert_eq(items[i].rc, 0, "ack %zu written", i);
        long long found = kt_int("LREM ref -1 %s", p[acks[i]]);
        if (locked)
            cr_assert_eq(kt_int("EXISTS %s", keys[i]), !found, "ack %zu: the lock goes with its job", i);
    }
    redisReply *got = redisCommand(c, "LRANGE %s 0 -1", w), *want = redisCommand(c, "LRANGE ref 0 -1");
    cr_assert(got && want && got->type == REDIS_REPLY_ARRAY && want->type == REDIS_REPLY_ARRAY);
    cr_assert_eq(got->elements, want->elements, "%zu jobs left, %zu with one LREM a job",
                 got->elements, want->elements);
    for (size_t i = 0; i < got->elements; i++)
        cr_assert_str_eq(got->element[i]->str, want->element[i]->str, "entry %zu", i);
    freeReplyObject(got);
    freeReplyObject(want);
    kt_int("DEL uniquejobs:digests");
    for (size_t i = 0; locked && i < nacks; i++)
        kt_int("DEL %s", keys[i]);
}

/* Successes acked together leave the working list exactly as one
 * LREM from the tail a job would: the jobs of other processors, older and
 * newer, stay in their order, a payload there twice loses only the copy
 * nearest the tail, a job no longer there (taken back) removes nothing,
 * and so it goes whether the jobs come oldest first or not, sit together
 * or apart, behind few older jobs or many. */
Test(reliable, acks_leave_the_working_list_as_one_lrem_a_job_would)
{
    enum { N = 120 };
    char *p[N];
    for (unsigned i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 33, i);
        p[i] = kt_payload("NoopJob", "[1]", jid, "default");
    }
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_queue_conf_t q = { .name = "default" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = "plain-acks", .queues = &q,
                            .nqueues = 1, .strict = 1, .block_timeout = 0.1 };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    /* Head first: newer jobs, the run acked (10..4, oldest nearest the
     * tail) with a job of another processor in it, one of the run again
     * nearer the tail, then older jobs. 99 is in no list. */
    const unsigned list[] = { 20, 21, 10, 9, 8, 7, 30, 6, 5, 4, 7, 40, 41, 42 };
    const unsigned run[] = { 4, 5, 6, 7, 8, 9, 10 }, late[] = { 99, 4, 5, 6, 7, 8, 9, 10 };
    const unsigned shuffled[] = { 10, 4, 30, 7, 99, 42, 5 }, apart[] = { 20, 4, 42, 8 };
    /* 7 acked three times, twice in the list: its third ack finds nothing. */
    const unsigned thrice[] = { 7, 4, 7, 5, 7 };
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, list, 14, thrice, 5, locked);
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, list, 14, run, 7, locked);
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, list, 14, late, 8, locked);
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, list, 14, shuffled, 7, locked);
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, list, 14, apart, 4, locked);
    /* Everything acked: the list goes. */
    const unsigned all[] = { 42, 41, 40, 7, 4, 5, 6, 30, 7, 8, 9, 10, 21, 20 };
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, list, 14, all, 14, locked);
    cr_assert_eq(kt_int("EXISTS uniquejobs:working:plain-acks"), 0);
    /* Behind many older jobs (more than the rewrite reads), and rounds
     * of 64 among 120. */
    unsigned many[N], some[64];
    for (unsigned i = 0; i < N; i++)
        many[i] = i;
    for (unsigned i = 0; i < 4; i++)
        some[i] = 3 - i;
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, many, N, some, 4, locked);
    for (unsigned i = 0; i < 64; i++)
        some[i] = (i * 37 + 11) % N;
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, many, N, some, 64, locked);
    for (unsigned i = 0; i < 64; i++)
        some[i] = 90 - i;
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, many, N, some, 64, locked);
    /* A long run behind many older jobs (the tail is rewritten then),
     * with one of them twice in the list, one acked twice, one late and
     * one newer than the run. */
    unsigned twice[111], run40[42] = { 115, 70, 10 };
    for (unsigned i = 0; i < 110; i++)
        twice[i] = i;
    twice[110] = 65;
    for (unsigned i = 0; i < 39; i++)
        run40[3 + i] = 89 - i;
    for (int locked = 0; locked < 2; locked++)
        acks_match_lrem(f, r, p, twice, 111, run40, 42, locked);
    for (unsigned i = 0; i < N; i++)
        free(p[i]);
    capstan__fetch_free(f);
    capstan_redis_free(r);
}

/* A sweep takes the oldest jobs of a queue into the working list, oldest
 * first, and hands each of them over, in order, once: also past the first
 * 1,000 jobs without a lock, when it stops looking into the payloads for
 * one. */
Test(reliable, sweeps_hand_over_every_job_they_move_in_queue_order)
{
    enum { N = 1250, MAX = 64 };
    char **p = calloc(N, sizeof(*p));
    cr_assert(p);
    for (unsigned i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 35, i);
        p[i] = kt_payload("NoopJob", "[1]", jid, "sweep");
    }
    kt_push_all(kt_redis(), "sweep", p, N);
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_queue_conf_t q = { .name = "sweep" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = "sweeps", .queues = &q,
                                .nqueues = 1, .strict = 1, .block_timeout = 0.1 };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    capstan_fetched_t got[MAX];
    unsigned next = 0;
    while (next < N) {
        int n = capstan__fetch_exchange(f, r, NULL, 0, got, MAX, 0);
        cr_assert_eq(n, N - next < MAX ? N - next : MAX, "after %u jobs", next);
        for (int k = 0; k < n; k++, next++) {
            cr_assert_str_eq(got[k].payload, p[next], "job %u in queue order", next);
            capstan__fetched_clear(&got[k]);
        }
        cr_assert_eq(kt_int("LLEN uniquejobs:working:sweeps"), next, "each moved job handed over");
    }
    redisReply *w = kt_cmd("LRANGE uniquejobs:working:sweeps 0 -1");
    cr_assert(w->type == REDIS_REPLY_ARRAY && w->elements == N);
    for (unsigned i = 0; i < N; i++)
        cr_assert_str_eq(w->element[i]->str, p[N - 1 - i], "the oldest at the tail: entry %u", i);
    freeReplyObject(w);
    cr_assert_eq(capstan__fetch_exchange(f, r, NULL, 0, got, MAX, 0), 0, "the queue is empty");
    for (unsigned i = 0; i < N; i++)
        free(p[i]);
    free(p);
    capstan__fetch_free(f);
    capstan_redis_free(r);
}

/* Successes acked together release their locks as one unlock a job would
 * (lua/unlock.lua): a hold that was the hash's last takes the hash and its
 * digest in "uniquejobs:digests" with it, one that leaves another holder
 * keeps both, a release wakes the lock's waiters (one token a waiter in
 * "<key>:WAKE"), a late ack (its job taken back) lets its runtime lock go
 * and keeps its until-lock, and a plain job among them releases nothing. */
Test(reliable, batched_acks_release_locks_as_one_unlock_a_job_would)
{
    enum { N = 7 };
    /* Lock hash a job holds (NULL: none), whether its job is still in the
     * working list, what else holds its hash, who waits for it. */
    static const struct {
        const char *lock;
        int listed;
        const char *other, *waiter;
    } jobs[N] = {
        { "uniquejobs:a:RUN:LOCKED", 1, NULL, NULL },
        { "uniquejobs:b:RUN:LOCKED", 1, "someone", NULL },
        { "uniquejobs:c:RUN:LOCKED", 1, NULL, "w1" },
        { "uniquejobs:d:RUN:LOCKED", 0, NULL, NULL },
        { "uniquejobs:e:LOCKED", 0, NULL, NULL },
        { NULL, 1, NULL, NULL },
        { "uniquejobs:g:LOCKED", 1, NULL, NULL },
    };
    char jid[N][25], *p[N];
    capstan_ack_item_t acks[N];
    const char *w = "uniquejobs:working:lock-acks";
    for (unsigned i = 0; i < N; i++) {
        kt_make_jid(jid[i], 34, i);
        p[i] = kt_payload("NoopJob", "[1]", jid[i], "default");
        if (jobs[i].listed)
            kt_int("LPUSH %s %s", w, p[i]);
        acks[i] = (capstan_ack_item_t){ .raw = p[i], .len = strlen(p[i]),
                                        .ack = { .kind = CAPSTAN_ACK_OK, .lock_key = jobs[i].lock,
                                                 .lock_jid = jobs[i].lock ? jid[i] : NULL } };
        if (!jobs[i].lock)
            continue;
        kt_int("HSET %s %s {}", jobs[i].lock, jid[i]);
        if (jobs[i].other)
            kt_int("HSET %s %s {}", jobs[i].lock, jobs[i].other);
        char digest[64];
        snprintf(digest, sizeof(digest), "%.*s", (int)(strlen(jobs[i].lock) - 7), jobs[i].lock);
        kt_int("ZADD uniquejobs:digests 1 %s", digest);
        if (jobs[i].waiter)
            kt_int("ZADD %s:WAITING 1 %s", digest, jobs[i].waiter);
    }
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_queue_conf_t q = { .name = "default" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = "lock-acks", .queues = &q,
                                .nqueues = 1, .strict = 1, .block_timeout = 0.1 };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    cr_assert_eq(capstan__fetch_exchange(f, r, acks, N, NULL, 0, 0), 0);
    for (unsigned i = 0; i < N; i++)
        cr_assert_eq(acks[i].rc, 0, "ack %u written", i);
    cr_assert_eq(kt_int("EXISTS %s", w), 0, "every listed job left the working list");
    cr_assert_eq(kt_int("EXISTS uniquejobs:a:RUN:LOCKED"), 0, "the last hold took its hash");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests uniquejobs:a:RUN"), 0, "and its digest");
    cr_assert_eq(kt_int("HEXISTS uniquejobs:b:RUN:LOCKED %s", jid[1]), 0, "its hold went");
    cr_assert_eq(kt_int("HEXISTS uniquejobs:b:RUN:LOCKED someone"), 1, "the other holder stays");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests uniquejobs:b:RUN"), 1, "and the digest");
    cr_assert_eq(kt_int("EXISTS uniquejobs:c:RUN:LOCKED"), 0);
    cr_assert_eq(kt_int("LLEN uniquejobs:c:RUN:WAKE"), 1, "its waiter woken");
    cr_assert_eq(kt_int("EXISTS uniquejobs:a:RUN:WAKE"), 0, "no token where no one waits");
    cr_assert_eq(kt_int("EXISTS uniquejobs:d:RUN:LOCKED"), 0, "a late ack's runtime lock goes");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests uniquejobs:d:RUN"), 0);
    cr_assert_eq(kt_int("HEXISTS uniquejobs:e:LOCKED %s", jid[4]), 1, "its until-lock stays");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests uniquejobs:e"), 1);
    cr_assert_eq(kt_int("EXISTS uniquejobs:g:LOCKED"), 0, "an until-lock goes with its job");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests uniquejobs:g"), 0);
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 2, "b:RUN and e left");
    for (unsigned i = 0; i < N; i++)
        free(p[i]);
    capstan__fetch_free(f);
    capstan_redis_free(r);
}

/* SCRIPT FLUSH (or a failover to a replica without the scripts) while jobs
 * drain: the scripts are loaded again at once and the EVALSHA that met
 * NOSCRIPT is sent again, in the fetch pipeline as anywhere else; no fetch
 * is reported failed, none waits a second, every job runs. */
Test(reliable, script_flush_mid_drain_reloads_at_once)
{
    enum { ROUNDS = 6, PER = 200, FAILS = 3 };
    kt_aof_redis_t s;
    kt_aof_init(&s, "flush");
    kt_aof_start(&s);
    redisContext *c = kt_aof_connect(&s);
    cr_assert(c);
    char *y = kt_write_file("flush.yml", FAST_YAML "average_scheduled_poll_interval: 0.2\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "4", "-q", "a", "-q", "b", "--redis-url",
                                               s.url, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "identity"), 10), "%s", kt_capstan_log(pid));
    for (unsigned round = 0; round < ROUNDS; round++) {
        char *p[PER + FAILS];
        size_t n = 0;
        for (unsigned i = 0; i < PER; i++) {
            char jid[25];
            kt_make_jid(jid, 20 + round, i);
            p[n++] = i % 10 == 9 ? kt_payload("SleepJob", "[5]", jid, i % 2 ? "a" : "b")
                                 : kt_payload("RecordJob", "[\"rec\"]", jid, i % 2 ? "a" : "b");
        }
        for (unsigned i = 0; i < FAILS; i++) {
            char jid[25];
            kt_make_jid(jid, 40 + round, i);
            p[n++] = kt_payload("FailJob", "[]", jid, "a");
        }
        long before = (long)kt_int_on(c, "SCARD rec");
        kt_push_all(c, "a", p, n);
        KT_WAIT_UNTIL(kt_int_on(c, "SCARD rec") > before + 20, 10);
        freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
        long want = (long)(round + 1) * (PER - PER / 10);
        cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD rec") == want
                                    && kt_int_on(c, "ZCARD retry") == (long)(round + 1) * FAILS
                                    && kt_int_on(c, "LLEN queue:a") + kt_int_on(c, "LLEN queue:b") == 0,
                                30),
                  "round %u: %lld of %ld recorded, %lld in retry\n%s", round, kt_int_on(c, "SCARD rec"),
                  want, kt_int_on(c, "ZCARD retry"), kt_capstan_log(pid));
        for (size_t i = 0; i < n; i++)
            free(p[i]);
    }
    /* Flushed while idle too: the next job still starts. */
    freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
    char jid[25];
    kt_make_jid(jid, 60, 0);
    char *last = kt_payload("RecordJob", "[\"rec\"]", jid, "b");
    kt_push_all(c, "b", &last, 1);
    free(last);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "SCARD rec") == ROUNDS * (PER - PER / 10) + 1, 10));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(!strstr(log, "fetch failed"), "%s", log);
    cr_assert(!strstr(log, "NOSCRIPT"), "%s", log);
    cr_assert_eq(kt_int_on(c, "LLEN rec:log"), kt_int_on(c, "SCARD rec"), "a job ran twice");
    free(log);
}

/* Redis at maxmemory refuses SET for longer than liveness_ttl while two
 * workers run slow jobs: they live on, so a process started afterwards
 * must not take their jobs. */
Test(reliable, maxmemory_longer_than_liveness_ttl_takes_no_live_jobs)
{
    kt_aof_redis_t s;
    kt_aof_init(&s, "oom");
    kt_aof_start(&s);
    redisContext *c = kt_aof_connect(&s);
    cr_assert(c);
    char *y = kt_write_file("oom.yml", FAST_YAML);
    const char *args[] = { "-C", y, "-c", "4", "--redis-url", s.url, NULL };
    pid_t procs[3];
    char sj[4][25];
    two_busy_workers(&s, c, args, &procs[0], &procs[1], sj, 22, "7000");
    freeReplyObject(redisCommand(c, "CONFIG SET maxmemory-policy noeviction"));
    redisReply *r = redisCommand(c, "CONFIG SET maxmemory 1");
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = redisCommand(c, "SET probe 1");
    cr_assert(r && r->type == REDIS_REPLY_ERROR && strstr(r->str, "OOM"), "SET is refused");
    freeReplyObject(r);
    kt_sleep(3.0); /* longer than liveness_ttl (2 s) */
    freeReplyObject(redisCommand(c, "CONFIG SET maxmemory 0"));
    procs[2] = kt_capstan_start(args);
    each_ran_once(c, procs, 3, sj);
    redisFree(c);
    kill(s.pid, SIGTERM);
    waitpid(s.pid, NULL, 0);
    free(y);
}


/* A user that may not run INFO (ACL -@dangerous), and a Redis restart after
 * which the workers' liveness keys are gone: a process started at once
 * must not take the jobs of the workers, which are alive. */
Test(reliable, redis_restart_without_info_permission_takes_no_live_jobs)
{
    kt_aof_redis_t s;
    kt_aof_init(&s, "acl");
    kt_aof_start(&s);
    redisContext *c = kt_aof_connect(&s);
    cr_assert(c);
    const char *acl = "ACL SETUSER worker on >secret ~* &* +@all -@dangerous";
    freeReplyObject(redisCommand(c, acl));
    char url[160];
    snprintf(url, sizeof(url), "redis://worker:secret@127.0.0.1:%d/0", s.port);
    char *y = kt_write_file("acl.yml", "heartbeat_interval: 0.5\nliveness_ttl: 3\n"
                                       "recovery_interval: 1\n");
    const char *args[] = { "-C", y, "-c", "4", "--redis-url", url, NULL };
    pid_t procs[3];
    char sj[4][25];
    two_busy_workers(&s, c, args, &procs[0], &procs[1], sj, 23, "10000");
    redisFree(c);
    kt_aof_kill(&s);
    kt_sleep(3.5); /* longer than liveness_ttl: the keys lapse meanwhile */
    kt_aof_start(&s);
    c = kt_aof_connect(&s);
    cr_assert(c);
    freeReplyObject(redisCommand(c, acl)); /* users are not in the AOF */
    procs[2] = kt_capstan_start(args);
    each_ran_once(c, procs, 3, sj);
    redisFree(c);
    kill(s.pid, SIGTERM);
    waitpid(s.pid, NULL, 0);
    free(y);
}

/* A queue key that holds a string: a due retry, an orphan and a requeued
 * job for that queue stay where they are, and move once the key is a
 * list again. */
Test(reliable, queue_key_of_wrong_type_leaves_jobs_where_they_were)
{
    redisContext *c = kt_redis();
    char j[3][25], *p[3];
    for (unsigned i = 0; i < 3; i++) {
        kt_make_jid(j[i], 24, i);
        p[i] = kt_payload("RecordJob", "[\"rec\"]", j[i], "bogus");
    }
    freeReplyObject(kt_cmd("SET queue:bogus not-a-list"));
    const char *dead = "uniquejobs:working:gone:1:aaaaaaaaaaaa";
    const char *own = "uniquejobs:working:me:2:bbbbbbbbbbbb";
    freeReplyObject(kt_cmd("LPUSH %s %s", dead, p[0]));
    freeReplyObject(kt_cmd("LPUSH %s %s", own, p[1]));
    freeReplyObject(kt_cmd("ZADD retry 1 %s", p[2]));
    capstan_redis_t *r = kt_lib_redis();
    capstan_recovery_t rec;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__fetch_recover(r, "me:2:bbbbbbbbbbbb", 3, 0, CAPSTAN_TS_FLOAT, 0, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.recovered, 0);
    cr_assert_eq(kt_int("LLEN %s", dead), 1, "the orphan stays in its working list");
    capstan_queue_conf_t q = { .name = "default" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = "me:2:bbbbbbbbbbbb",
                            .queues = &q, .nqueues = 1 };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    cr_assert_neq(capstan__fetch_requeue(f, r, "bogus", p[1], strlen(p[1])), 0);
    cr_assert_eq(kt_int("LLEN %s", own), 1, "the requeued job stays in the working list");
    /* The scheduler of a running worker (that fetches another queue and
     * leaves recovery to this test). */
    char *y = kt_write_file("bogus.yml", "recovery_interval: 600\npoll_interval_average: 0.2\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", "-q", "other", NULL });
    KT_WAIT_UNTIL(kt_int("ZCARD retry") == 0 || kt_log_has(pid, "queue:bogus"), 10);
    cr_assert_eq(kt_int("ZCARD retry"), 1, "the due retry stays in retry: %s", kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "queue:bogus"), "the key is named: %s", kt_capstan_log(pid));
    kt_sleep(1.0); /* a few more polls */
    cr_assert_eq(log_lines_with(pid, "queue:bogus", NULL), 1, "said once: %s", kt_capstan_log(pid));

    freeReplyObject(kt_cmd("DEL queue:bogus"));
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 0, 10), "%s", kt_capstan_log(pid));
    cr_assert_eq(capstan__fetch_recover(r, "me:2:bbbbbbbbbbbb", 3, 0, CAPSTAN_TS_FLOAT, 0, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.recovered, 1);
    cr_assert_eq(capstan__fetch_requeue(f, r, "bogus", p[1], strlen(p[1])), 0);
    cr_assert_eq(kt_int("LLEN queue:bogus"), 3, "all three are queued");
    cr_assert_eq(kt_int("EXISTS %s", dead), 0);
    cr_assert_eq(kt_int("LLEN %s", own), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    capstan__fetch_free(f);
    capstan_redis_free(r);
    for (int i = 0; i < 3; i++)
        free(p[i]);
    free(y);
    (void)c;
}

/* A queue name of 600 bytes: jobs pushed, retried, recovered from a dead
 * process and requeued at shutdown all land in exactly that queue. */
Test(reliable, queue_name_of_600_bytes_works_end_to_end)
{
    redisContext *c = kt_redis();
    char name[601], qkey[608];
    memset(name, 'q', 600);
    name[600] = '\0';
    snprintf(qkey, sizeof(qkey), "queue:%s", name);
    char *y = kt_write_file("long.yml", FAST_YAML "poll_interval_average: 0.2\ntimeout: 1\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", "-q", name, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "Starting processing"), 10), "%s", kt_capstan_log(pid));
    char j[4][25], *p[4];
    for (unsigned i = 0; i < 4; i++) {
        kt_make_jid(j[i], 25, i);
        p[i] = kt_payload(i == 3 ? "SleepJob" : "RecordJob", i == 3 ? "[20000]" : "[\"rec\"]", j[i],
                          name);
    }
    kt_push_all(c, name, &p[0], 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", j[0]), 10), "pushed: %s", kt_capstan_log(pid));
    freeReplyObject(kt_cmd("ZADD retry 1 %s", p[1]));
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", j[1]), 10), "retried: %s", kt_capstan_log(pid));
    freeReplyObject(kt_cmd("LPUSH uniquejobs:working:gone:1:cccccccccccc %s", p[2]));
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", j[2]), 10), "recovered: %s", kt_capstan_log(pid));
    kt_push_all(c, name, &p[3], 1);
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 1, 10), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0, "%s", kt_capstan_log(pid));
    char *back = kt_str("LINDEX %s 0", qkey);
    cr_assert(back && strstr(back, j[3]), "requeued to its queue: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN %s", qkey), 1);
    cr_assert_eq(kt_int("LLEN rec:log"), 3, "each ran once");
    free(back);
    free(id);
    free(w);
    for (int i = 0; i < 4; i++)
        free(p[i]);
    free(y);
}

/* A job recovered from a crashed process, as the recovery leaves it in
 * its queue: "recovery_count" among the other fields. */
static char *recovered_payload(const char *cls, const char *args, const char *jid)
{
    char *p = NULL;
    cr_assert(asprintf(&p,
                       "{\"retry\":true,\"queue\":\"default\",\"args\":%s,\"class\":\"%s\","
                       "\"recovery_count\":1,\"jid\":\"%s\",\"created_at\":1767225600.123456,"
                       "\"enqueued_at\":1767225600.123789}",
                       args, cls, jid) > 0);
    return p;
}

/* A recovered job whose handler fails (so it did not crash the process)
 * goes to retry without "recovery_count", every other byte kept: it runs
 * beside others next time. One that succeeds is simply gone. Under a
 * supervisor, so both run in its quarantine worker: the retry keeps the
 * job's own queue, not the quarantine's. */
Test(reliable, recovered_job_that_fails_normally_is_no_suspect_any_more)
{
    redisContext *c = kt_redis();
    char fj[25], rj[25];
    kt_make_jid(fj, 26, 0);
    kt_make_jid(rj, 26, 1);
    char *p[] = { recovered_payload("FailJob", "[\"boom\"]", fj),
                  recovered_payload("RecordJob", "[\"rec\"]", rj) };
    kt_push_all(c, "default", p, 2);
    char *y = kt_write_file("suspect.yml", FAST_YAML);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1 && kt_int("SISMEMBER rec %s", rj) == 1, 10),
              "%s", kt_capstan_log(pid));
    redisReply *rr = kt_cmd("ZRANGE retry 0 0");
    cr_assert(rr->type == REDIS_REPLY_ARRAY && rr->elements == 1);
    char *entry = strdup(rr->element[0]->str);
    freeReplyObject(rr);
    cr_assert(!strstr(entry, "recovery_count"), "%s", entry);
    /* The original text up to its closing brace, less the count, then the
     * error fields appended. */
    char *kept = strdup(p[0]);
    char *at = strstr(kept, "\"recovery_count\":1,");
    memmove(at, at + strlen("\"recovery_count\":1,"), strlen(at + strlen("\"recovery_count\":1,")) + 1);
    kept[strlen(kept) - 1] = '\0';
    cr_assert(strncmp(entry, kept, strlen(kept)) == 0, "%s\nkept: %s", entry, kept);
    json_t *j = json_loads(entry, 0, NULL);
    cr_assert(j, "%s", entry);
    cr_assert_str_eq(json_string_value(json_object_get(j, "error_class")), "RuntimeError");
    cr_assert_eq(json_integer_value(json_object_get(j, "retry_count")), 0);
    json_decref(j);
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 0, 5), "both acked: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert_eq(kt_int("ZCARD dead"), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(entry);
    free(kept);
    free(id);
    free(w);
    free(p[0]);
    free(p[1]);
    free(y);
}

/* Starts of jid in pid's log once its jobs are done: waits for at least one
 * "done" line, then for the queue and pid's working list to empty. */
static int started_once_done(redisContext *c, pid_t pid, const char *w, const char *jid)
{
    char *j = jid_eq(jid);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, j, "INFO: done") >= 1, 20), "%s never ran: %s",
              jid, kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "LLEN queue:default") == 0
                            && kt_int_on(c, "LLEN %s", w) == 0, 20), "%s", kt_capstan_log(pid));
    int n = log_lines_with(pid, j, "INFO: start");
    free(j);
    return n;
}

/* The gate, here and in the tests below, is that of a process without a
 * supervisor (under one, a worker moves its suspects to the quarantine
 * worker: test_supervisor.c).
 *
 * Recovered jobs carry recovery_count, so each runs alone. They reach a
 * process whose other processors are busy with long jobs: one processor
 * takes a suspect and waits for the long jobs to end, the other free ones
 * give theirs back. The waiting suspect is this process's own, however long
 * it waits, so the check for strays in the working list must not give it
 * back too: every recovered job starts exactly once. Twenty rounds. */
Test(reliable, recovered_jobs_waiting_to_run_alone_start_once_each)
{
    enum { ROUNDS = 20 };
    redisContext *c = kt_redis();
    char *y = kt_write_file("alone.yml", FAST_YAML);
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "4", NULL });
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    for (unsigned round = 0; round < ROUNDS; round++) {
        char lj[2][25], sj[4][25];
        for (unsigned i = 0; i < 2; i++) {
            kt_make_jid(lj[i], 60 + round, i);
            push_one(c, "SleepJob", "[1600]", lj[i]);
        }
        for (unsigned i = 0; i < 2; i++) {
            char *j = jid_eq(lj[i]);
            cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, j, "INFO: start") == 1, 10), "%s",
                      kt_capstan_log(pid));
            free(j);
        }
        char *p[4];
        for (unsigned i = 0; i < 4; i++) {
            kt_make_jid(sj[i], 60 + round, 2 + i);
            p[i] = recovered_payload("SleepJob", "[20]", sj[i]);
        }
        kt_push_all(c, "default", p, 4);
        for (unsigned i = 0; i < 4; i++) {
            cr_assert_eq(started_once_done(c, pid, w, sj[i]), 1,
                         "round %u: recovered job %s started more than once:\n%s", round, sj[i],
                         kt_capstan_log(pid));
            free(p[i]);
        }
        for (unsigned i = 0; i < 2; i++)
            cr_assert_eq(started_once_done(c, pid, w, lj[i]), 1, "%s", kt_capstan_log(pid));
    }
    cr_assert(!kt_log_has(pid, "gave back"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(id);
    free(w);
    free(y);
}

/* Two processors: one runs a SleepJob of 5 s (lj, tag's first jid,
 * started here); the other runs 3,000 short jobs fetched ahead, then next
 * (a payload, freed), then 500 more. Returns the seconds from the end of
 * the last short job before next to its ack, or -1 when it was not
 * written within 2 s; *still is 1 while the long job has not ended. */
static double ack_before(redisContext *c, pid_t pid, unsigned tag, char *next, int *still)
{
    char *id = kt_log_identity(pid), lj[25], last[25];
    kt_make_jid(lj, tag, 0);
    push_one(c, "SleepJob", "[5000]", lj);
    char *l = jid_eq(lj);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, l, "INFO: start") == 1, 10), "%s", kt_capstan_log(pid));
    kt_push_jobs("NoopJob", "[]", tag + 1, 3000);
    kt_make_jid(last, tag + 1, 2999);
    kt_push_all(c, "default", &next, 1);
    kt_push_jobs("NoopJob", "[]", tag + 2, 500);
    char *lastj = jid_eq(last);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, lastj, "INFO: done") == 1, 10), "%s", kt_capstan_log(pid));
    double t0 = kt_now();
    int acked = KT_WAIT_UNTIL(!kt_working_has(id, last), 2);
    double took = acked ? kt_now() - t0 : -1;
    *still = log_lines_with(pid, l, "INFO: done") == 0;
    free(next);
    free(lastj);
    free(l);
    free(id);
    return took;
}

/* A suspect waits for the other processors' jobs to end before it runs
 * alone: the acks waiting are written meanwhile, not after. Held, a kill
 * or a failover meanwhile ran those jobs again. */
Test(reliable, a_finished_jobs_ack_does_not_wait_with_a_suspect)
{
    char *y = kt_write_file("solo.yml", FAST_YAML), sj[25];
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "2", NULL });
    kt_make_jid(sj, 95, 9);
    int still;
    double took = ack_before(kt_redis(), pid, 95, recovered_payload("NoopJob", "[]", sj), &still);
    fprintf(stderr, "reliable figures: the ack of the job before a suspect was written %.2f s after it "
            "ended\n", took);
    cr_assert(took >= 0, "it stayed in the working list while the suspect waited:\n%s", kt_capstan_log(pid));
    cr_assert(still, "the long job ended: the suspect did not wait");
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 0 && kt_int("LLEN queue:default") == 0, 15), "%s",
              kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(id);
    free(w);
    free(y);
}

/* The jobs are short on average, the other processor is busy, and the
 * next job a processor takes from the jobs fetched ahead runs long: the
 * last short job's ack is written while it runs, not after. */
Test(reliable, an_ack_does_not_wait_for_the_next_long_job)
{
    char *y = kt_write_file("long.yml", FAST_YAML), nj[25];
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    kt_make_jid(nj, 99, 9);
    int still;
    double took = ack_before(kt_redis(), pid, 99, kt_payload("SleepJob", "[3000]", nj, "default"), &still);
    fprintf(stderr, "reliable figures: the ack of a short job before a long one was written %.2f s "
            "after it ended\n", took);
    cr_assert(took >= 0, "it stayed in the working list while the long job ran:\n%s", kt_capstan_log(pid));
    cr_assert(still, "the first long job ended: nothing waited");
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(y);
}

/* A job that ends while a suspect waits to run alone: its processor waits
 * at the gate, and its ack is written then, not when the long job the
 * suspect waits for ends. */
Test(reliable, an_ack_written_while_a_suspect_waits)
{
    redisContext *c = kt_redis();
    char *y = kt_write_file("solo2.yml", FAST_YAML);
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "3", NULL });
    char *id = kt_log_identity(pid), *w = kt_working_key(id), lj[25], mj[25], sj[25];
    kt_make_jid(lj, 98, 0);
    kt_make_jid(mj, 98, 1);
    kt_make_jid(sj, 98, 2);
    push_one(c, "SleepJob", "[4000]", lj);
    char *l = jid_eq(lj), *m = jid_eq(mj), *sq = jid_eq(sj);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, l, "INFO: start") == 1, 10), "%s", kt_capstan_log(pid));
    push_one(c, "SleepJob", "[700]", mj);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, m, "INFO: start") == 1, 10), "%s", kt_capstan_log(pid));
    char *p = recovered_payload("NoopJob", "[]", sj);
    kt_push_all(c, "default", &p, 1);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, m, "INFO: done") == 1, 10), "%s", kt_capstan_log(pid));
    double t0 = kt_now();
    int acked = KT_WAIT_UNTIL(!kt_working_has(id, mj), 2);
    fprintf(stderr, "reliable figures: a job ending while a suspect waited was acknowledged %.2f s "
            "after it ended\n", kt_now() - t0);
    cr_assert(acked, "it stayed in the working list while the suspect waited:\n%s", kt_capstan_log(pid));
    cr_assert(log_lines_with(pid, l, "INFO: done") == 0, "the long job ended: nothing waited");
    cr_assert(log_lines_with(pid, sq, "INFO: start") == 0, "the suspect did not wait for the long job");
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, sq, "INFO: done") == 1 && kt_int("LLEN %s", w) == 0, 15),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(l);
    free(m);
    free(sq);
    free(p);
    free(id);
    free(w);
    free(y);
}

/* The scenario as it happens: a process is killed running four jobs, and a
 * live process whose processors are busy with long jobs recovers them.
 * Each of the four starts once there (twice in all: the killed run and one
 * recovery), never more. */
Test(reliable, jobs_of_a_killed_process_start_once_more_on_a_busy_one)
{
    redisContext *c = kt_redis();
    char *y = kt_write_file("busy.yml", FAST_YAML);
    const char *args[] = { "--no-supervisor", "-C", y, "-c", "4", NULL };
    pid_t a = kt_capstan_start(args);
    char *ida = kt_log_identity(a), *wa = kt_working_key(ida);
    char kj[4][25], lj[3][25];
    for (unsigned i = 0; i < 4; i++) {
        kt_make_jid(kj[i], 90, i);
        push_one(c, "SleepJob", "[3000]", kj[i]);
    }
    cr_assert(KT_WAIT_UNTIL(log_lines_with(a, "SleepJob", "INFO: start") == 4, 10), "%s",
              kt_capstan_log(a));
    pid_t b = kt_capstan_start((const char *[]){ "-C", y, "-c", "6", NULL });
    char *idb = kt_log_identity(b), *wb = kt_working_key(idb);
    /* Three long jobs keep three of b's six processors busy past the
     * recovery; the other three take the recovered jobs. */
    for (unsigned i = 0; i < 3; i++) {
        kt_make_jid(lj[i], 91, i);
        push_one(c, "SleepJob", "[6000]", lj[i]);
    }
    cr_assert(KT_WAIT_UNTIL(log_lines_with(b, "SleepJob", "INFO: start") == 3, 10), "%s",
              kt_capstan_log(b));
    cr_assert_eq(kt_capstan_stop(a, SIGKILL, 10), 128 + SIGKILL);
    cr_assert(KT_WAIT_UNTIL(!kt_int("EXISTS %s", wa), 15), "not recovered: %s", kt_capstan_log(b));
    for (unsigned i = 0; i < 4; i++)
        cr_assert_eq(started_once_done(c, b, wb, kj[i]), 1, "%s started more than once more:\n%s",
                     kj[i], kt_capstan_log(b));
    cr_assert(!kt_log_has(b, "gave back"), "%s", kt_capstan_log(b));
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 15), 0);
    free(ida);
    free(wa);
    free(idb);
    free(wb);
    free(y);
}

/* A worker cut off from Redis long enough for another process to recover
 * its list learns it when its acks find the jobs gone, and says so in its
 * own log, with the count. The recovery here is the library's own, run on
 * the list of a worker whose only processor is busy. */
Test(reliable, worker_whose_jobs_were_recovered_says_so_when_it_acks)
{
    redisContext *c = kt_redis();
    char *y = kt_write_file("late.yml", FAST_YAML);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", NULL });
    char *id = kt_log_identity(pid);
    char jid[25];
    kt_make_jid(jid, 95, 0);
    push_one(c, "SleepJob", "[1000]", jid);
    char *j = jid_eq(jid);
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, j, "INFO: start") == 1, 10), "%s", kt_capstan_log(pid));
    capstan_redis_t *r = kt_lib_redis();
    capstan_recovery_t rec = {0};
    char err[CAPSTAN_ERRLEN], lkey[512];
    /* As if its liveness key had lapsed while it was cut off. */
    capstan__fetch_liveness_key(id, lkey, sizeof(lkey));
    freeReplyObject(kt_cmd("DEL %s", lkey));
    cr_assert_eq(capstan__fetch_recover_one(r, id, 3, CAPSTAN_TS_FLOAT, 0, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.recovered, 1);
    /* The worker finishes its run, finds the job gone, says so, then runs
     * the recovered copy (the one duplicate a recovery of a live worker
     * costs). */
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "1 finished jobs were no longer in this process's "
                                            "working list"), 10), "%s", kt_capstan_log(pid));
    /* The ack cannot tell who took the job: the line says what may have
     * happened, not that another process did (none may exist: a give-back
     * of this process's own after a lost reply looks the same). */
    cr_assert(kt_log_has(pid, "when acked: given back for another run meanwhile (by this process, "
                              "or by another's recovery if this one was cut off or frozen past "
                              "liveness_ttl; they may run again) or acked by an earlier try whose "
                              "reply was lost"), "%s", kt_capstan_log(pid));
    cr_assert_not(kt_log_has(pid, "another process recovered them"), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(log_lines_with(pid, j, "INFO: done") == 2, 10), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    capstan_redis_free(r);
    free(j);
    free(id);
    free(y);
}

/* A suspect waiting for its turn when the process goes quiet goes back to
 * its queue; when that key holds another type than a list by then, the
 * error reply is said once and the job stays in the working list (no
 * reconnecting and retrying forever), where recovery finds it later. */
Test(reliable, give_back_to_a_queue_key_of_wrong_type_is_said_once)
{
    redisContext *c = kt_redis();
    char hj[25], sj[25];
    kt_make_jid(hj, 27, 0);
    kt_make_jid(sj, 27, 1);
    char *y = kt_write_file("giveback.yml", FAST_YAML "timeout: 8\n");
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "2", NULL });
    char *id = kt_log_identity(pid), *w = kt_working_key(id);
    push_one(c, "SleepJob", "[3000]", hj);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 1, 10), "%s", kt_capstan_log(pid));
    /* The other processor takes the suspect and waits for the sleeper. */
    char *ps = recovered_payload("RecordJob", "[\"rec\"]", sj);
    kt_push_all(c, "default", &ps, 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", w) == 2, 10), "%s", kt_capstan_log(pid));
    kt_sleep(0.3);
    freeReplyObject(kt_cmd("SET queue:default not-a-list"));
    kill(pid, SIGTSTP);
    const char *said = "could not give a fetched job back to queue:default";
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, said), 5), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(log_lines_with(pid, said, NULL), 1, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SISMEMBER rec %s", sj), 0, "the suspect did not run");
    char *left = kt_str("LINDEX %s 0", w);
    cr_assert(left && strstr(left, sj), "the suspect stays in the working list: %s", left);
    cr_assert_eq(kt_int("LLEN %s", w), 1, "the sleeper finished and was acked");
    /* Once the key is a list again, a new process recovers and runs it. */
    freeReplyObject(kt_cmd("DEL queue:default"));
    pid_t next = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rec %s", sj) == 1, 15), "%s", kt_capstan_log(next));
    cr_assert_eq(kt_capstan_stop(next, SIGTERM, 15), 0);
    free(left);
    free(ps);
    free(id);
    free(w);
    free(y);
}

/* An ack that writes a failure to a retry (or dead) key of another type is
 * refused before the job leaves the working list, and written once the key
 * is right again: the failed job is never lost between the two. */
Test(reliable, failure_ack_to_a_retry_key_of_wrong_type_keeps_the_job)
{
    char jid[25], err[CAPSTAN_ERRLEN];
    kt_make_jid(jid, 25, 0);
    char *p = kt_payload("FailJob", "[]", jid, "default");
    const char *own = "uniquejobs:working:me:3:cccccccccccc";
    freeReplyObject(kt_cmd("LPUSH %s %s", own, p));
    freeReplyObject(kt_cmd("SET retry not-a-zset"));
    capstan_redis_t *r = kt_lib_redis();
    capstan_queue_conf_t q = { .name = "default" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = "me:3:cccccccccccc",
                            .queues = &q, .nqueues = 1 };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    capstan_ack_t ack = { .kind = CAPSTAN_ACK_RETRY, .score = 1, .payload = p, .len = strlen(p),
                      .dead_max = 10 };
    cr_assert_neq(capstan__fetch_ack(f, r, p, strlen(p), &ack), 0, "the ack is refused");
    cr_assert_eq(kt_int("LLEN %s", own), 1, "the job stays in the working list");
    freeReplyObject(kt_cmd("DEL retry"));
    cr_assert_eq(capstan__fetch_ack(f, r, p, strlen(p), &ack), 0);
    cr_assert_eq(kt_int("LLEN %s", own), 0);
    cr_assert_eq(kt_int("ZCARD retry"), 1, "the failure is written once the key is right");
    capstan__fetch_free(f);
    capstan_redis_free(r);
    free(p);
}

/* Fetches for about 2.4 s, a job every 0.2 s, from a process whose
 * liveness key was set once with a TTL of 1 s and never refreshed by its
 * housekeeper (a connection that lags the others, as one with a write in
 * flight does after a network partition heals), while another process's
 * recovery passes run every 0.25 s. Returns how many of the jobs fetched
 * were taken from the list by those passes. */
static long fetch_beside_recovery(capstan_liveness_t *l)
{
    const char *me = "me:7:dddddddddddd", *w = "uniquejobs:working:me:7:dddddddddddd";
    char err[CAPSTAN_ERRLEN];
    freeReplyObject(kt_cmd("SET uniquejobs:heartbeat:%s 1 PX 1000", me));
    for (unsigned i = 0; i < 12; i++) {
        char jid[25];
        kt_make_jid(jid, 26, i);
        char *p = kt_payload("RecordJob", "[\"rec\"]", jid, "live");
        freeReplyObject(kt_cmd("LPUSH queue:live %s", p));
        free(p);
    }
    capstan_queue_conf_t q = { .name = "live" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = me, .queues = &q,
                                .nqueues = 1, .liveness = l };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    capstan_redis_t *mine = kt_lib_redis(), *other = kt_lib_redis();
    long fetched = 0, taken = 0;
    for (int i = 0; i < 12; i++) {
        capstan_fetched_t job;
        int rc = capstan__fetch_exchange(f, mine, NULL, 0, &job, 1, 0);
        cr_assert_geq(rc, 0);
        fetched += rc;
        if (rc == 1)
            capstan__fetched_clear(&job);
        kt_sleep(0.1);
        capstan_recovery_t rec;
        cr_assert_eq(capstan__fetch_recover(other, "other:1:eeeeeeeeeeee", 1000, 1.0, CAPSTAN_TS_FLOAT, 0, &rec,
                                            err), 0, "%s", err);
        taken += rec.recovered;
        kt_sleep(0.1);
    }
    cr_assert_eq(fetched, 12);
    cr_assert_eq(kt_int("LLEN %s", w) + taken, 12, "every job is in the list or was taken");
    freeReplyObject(kt_cmd("DEL %s queue:live uniquejobs:heartbeat:%s uniquejobs:orphan:%s", w, me, me));
    capstan__fetch_free(f);
    capstan_redis_free(mine);
    capstan_redis_free(other);
    return taken;
}

/* A process whose fetches get through is alive, whatever its housekeeper's
 * connection does: each fetch that finds the liveness key not refreshed
 * for half its TTL refreshes it in the same round trip, so no recovery
 * takes the jobs it fetches (which it would run, and the fleet again).
 * Without that, the key lapses and the jobs are taken. */
Test(reliable, a_process_that_fetches_keeps_its_liveness_key_while_its_housekeeper_lags)
{
    (void)kt_redis();
    cr_assert_gt(fetch_beside_recovery(NULL), 0, "without the fetchers' refresh the jobs are taken");
    capstan_liveness_t *l = capstan__liveness_new("me:7:dddddddddddd", 1.0);
    cr_assert(l);
    cr_assert_eq(fetch_beside_recovery(l), 0, "a process that fetches keeps its jobs");
    capstan__liveness_free(l);
}
