/* Uniqueness locks end to end: `capstan push --lock` on the client side, the
 * capstan binary's server middleware, v9's keys as a Ruby process writes and
 * reads them, and the lifecycle of reference §4.8 per lock type, including
 * the fixes over v9 (retry keeps an until_executed lock, no silent drops,
 * bad input falls back with a log line). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "helpers.h"
#include "capstan/unique.h"
#include "redis/scripts.h"

static int stop(pid_t pid)
{
    return kt_capstan_stop(pid, SIGTERM, 30);
}

TestSuite(unique, .timeout = 60, .fini = kt_kill_children);

static int log_says(pid_t pid, const char *what)
{
    char *log = kt_capstan_log(pid);
    int yes = log && strstr(log, what);
    free(log);
    return yes;
}

/* The first member of a sorted set (its payload), malloc'd, or NULL. */
static char *first_member(const char *set)
{
    redisReply *r = kt_cmd("ZRANGE %s 0 0", set);
    char *s = r->type == REDIS_REPLY_ARRAY && r->elements == 1
                  ? strndup(r->element[0]->str, r->element[0]->len) : NULL;
    freeReplyObject(r);
    cr_assert(s, "%s is empty", set);
    return s;
}

static void chomp(char *s)
{
    if (s)
        s[strcspn(s, "\n")] = '\0';
}

/* The digest Ruby computes (Digest::MD5 over v9's JSON), malloc'd. */
static char *ruby_digest(const char *cls, const char *queue, const char *args)
{
    char *out = NULL;
    cr_assert_eq(kt_ruby("unique.rb", (const char *[]){ "digest", cls, queue, args, NULL }, &out), 0);
    chomp(out);
    return out;
}

/* `capstan push` with lock flags; returns the exit status, and its last output
 * line that is not a warning (the jid, or why it was denied) into out. */
static int push(const char *const *argv, char **out)
{
    char *all = NULL;
    int rc = kt_capstan_run(argv, &all);
    if (all) {
        char *warn;
        while ((warn = strstr(all, "capstan push: warning:"))) {
            char *end = strchr(warn, '\n');
            memmove(warn, end ? end + 1 : warn + strlen(warn), strlen(end ? end + 1 : "") + 1);
        }
        size_t n = strlen(all);
        while (n && all[n - 1] == '\n')
            all[--n] = '\0';
        char *last = strrchr(all, '\n');
        if (last)
            memmove(all, last + 1, strlen(last + 1) + 1);
    }
    if (out)
        *out = all;
    else
        free(all);
    return rc;
}

Test(unique, until_executed_denies_duplicates_and_releases_after_success)
{
    char *d = ruby_digest("RecordJob", "default", "[\"ue\"]");
    char *jid = NULL, *out = NULL;
    cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"ue\"]", "--lock", "until_executed",
                                        NULL }, &jid), 0, "%s", jid);
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d, jid), 1, "capstan's lock has Ruby's digest %s", d);
    cr_assert(kt_int("ZSCORE uniquejobs:digests %s", d) > 1e9);
    char *meta = kt_str("HGET %s:LOCKED %s", d, jid);
    cr_assert(strstr(meta, "{\"worker\":\"RecordJob\",\"queue\":\"default\",\"limit\":null,"
                           "\"timeout\":0,\"ttl\":null,\"type\":\"until_executed\","
                           "\"lock_args\":[\"ue\"],\"time\":"), "%s", meta);
    char *payload = kt_str("LINDEX queue:default 0");
    cr_assert(strstr(payload, d) && strstr(payload, "\"lock\":\"until_executed\""), "%s", payload);

    cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"ue\"]", "--lock", "until_executed",
                                        NULL }, &out), 3, "a duplicate is denied: %s", out);
    cr_assert(strstr(out, "denied"), "%s", out);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);

    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD ue") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:LOCKED", d) == 0, 10), "released after success");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests %s", d), 0);
    /* v9's metrics see the locks (the push's, and the server's re-entrant
     * one, as v9 counts it), the denied duplicate and the release at ack. */
    const char *want = "\"type\":\"until_executed\",\"acquired\":2,\"denied\":1,\"released\":1";
    char *metrics = NULL;
    cr_assert(KT_WAIT_UNTIL((free(metrics), metrics = NULL,
                             kt_capstan_run((const char *[]){ "locks", "metrics", "--json", NULL }, &metrics) == 0
                             && strstr(metrics, want)), 10), "%s", metrics);
    free(metrics);
    cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"ue\"]", "--lock", "until_executed",
                                        NULL }, NULL), 0, "free again");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD ue") == 2, 20));
    cr_assert_eq(stop(pid), 0);
    free(d); free(jid); free(out); free(meta); free(payload);
}

Test(unique, until_executed_lock_survives_retry_and_is_released_at_death)
{
    char *d = ruby_digest("FailJob", "default", "[\"boom\"]");
    char *jid = NULL, *out = NULL;
    cr_assert_eq(push((const char *[]){ "push", "FailJob", "[\"boom\"]", "--lock", "until_executed",
                                        "--retry", "1", NULL }, &jid), 0, "%s", jid);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 20), "%s", kt_capstan_log(pid));
    /* v9's ack drops it here; capstan keeps it while the job waits in retry. */
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d, jid), 1, "the lock is kept in retry");
    cr_assert_eq(push((const char *[]){ "push", "FailJob", "[\"boom\"]", "--lock", "until_executed",
                                        NULL }, &out), 3, "no duplicate piles up in retry: %s", out);
    /* Due now: the retry runs, fails again, and the job dies. */
    char *member = first_member("retry");
    redisReply *z = kt_cmd("ZADD retry 0 %b", member, strlen(member));
    freeReplyObject(z);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 30), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:LOCKED", d) == 0, 5), "death releases the lock");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests %s", d), 0);
    cr_assert_eq(stop(pid), 0);
    free(d); free(jid); free(out); free(member);
}

Test(unique, until_executing_releases_before_perform_and_relocks_on_failure)
{
    char *d = ruby_digest("SleepJob", "default", "[1500]");
    char *jid = NULL;
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[1500]", "--lock", "until_executing",
                                        NULL }, &jid), 0, "%s", jid);
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[1500]", "--lock", "until_executing",
                                        NULL }, NULL), 3, "denied while queued");
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0 &&
                            kt_int("EXISTS %s:LOCKED", d) == 0, 10), "unlocked as it starts");
    char *jid2 = NULL;
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[1500]", "--lock", "until_executing",
                                        NULL }, &jid2), 0, "a new one may queue while it runs");
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d, jid2), 1);
    cr_assert_eq(stop(pid), 0);

    /* A failure takes the lock again while the job waits in retry. */
    char *df = ruby_digest("FailJob", "default", "[\"ux\"]");
    char *fj = NULL;
    cr_assert_eq(push((const char *[]){ "push", "FailJob", "[\"ux\"]", "--lock", "until_executing",
                                        NULL }, &fj), 0);
    pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("HEXISTS %s:LOCKED %s", df, fj) == 1, 5), "re-locked in retry");
    cr_assert_eq(stop(pid), 0);
    free(d); free(jid); free(jid2); free(df); free(fj);
}

Test(unique, until_and_while_executing_swaps_locks_around_perform)
{
    char *d = ruby_digest("SleepJob", "default", "[1200]");
    char *jid = NULL;
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[1200]", "--lock",
                                        "until_and_while_executing", NULL }, &jid), 0, "%s", jid);
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[1200]", "--lock",
                                        "until_and_while_executing", NULL }, NULL), 3);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("HEXISTS %s:RUN:LOCKED %s", d, jid) == 1, 10),
              "runtime lock while it runs: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("EXISTS %s:LOCKED", d), 0, "until-lock released before perform");
    char *jid2 = NULL;
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[1200]", "--lock",
                                        "until_and_while_executing", NULL }, &jid2), 0,
                 "may enqueue while the first runs");
    /* The second cannot run while the first holds :RUN; the default server
     * strategy logs it (never silently). Both locks are gone at the end. */
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:RUN:LOCKED", d) == 0 &&
                            kt_int("EXISTS %s:LOCKED", d) == 0 &&
                            kt_int("LLEN queue:default") == 0, 15), "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, jid2), "%s", log);
    free(d); free(jid); free(jid2); free(log);
}

Test(unique, until_expired_outlives_the_job_until_its_ttl)
{
    char *d = ruby_digest("NoopJob", "default", "[7]");
    char *jid = NULL;
    cr_assert_eq(push((const char *[]){ "push", "NoopJob", "[7]", "--lock", "until_expired",
                                        "--lock-ttl", "3", NULL }, &jid), 0, "%s", jid);
    long long pttl = kt_int("PTTL %s:LOCKED", d);
    cr_assert(pttl > 1000 && pttl <= 3000, "%lld", pttl);
    char *score = kt_str("ZSCORE uniquejobs:digests %s", d);
    double now = (double)time(NULL);
    cr_assert(atof(score) < now + 10, "score is the expiry in seconds, not now+ms (%s)", score);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0, 10));
    kt_sleep(0.3);
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d, jid), 1, "kept after the run");
    cr_assert_eq(push((const char *[]){ "push", "NoopJob", "[7]", "--lock", "until_expired",
                                        "--lock-ttl", "3", NULL }, NULL), 3);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:LOCKED", d) == 0, 5), "gone with its ttl");
    cr_assert_eq(stop(pid), 0);
    free(d); free(jid); free(score);
}

/* Clients of this test's database blocked in cmd ("blmove": capstan's idle
 * processors; "blpop": lock waiters between tries). */
static int blocked_in(const char *cmd)
{
    char what[32];
    snprintf(what, sizeof(what), "cmd=%s ", cmd);
    const char *url = kt_url();
    char db[32];
    snprintf(db, sizeof(db), " db=%s ", strrchr(url, '/') + 1);
    redisReply *r = kt_cmd("CLIENT LIST");
    int n = 0;
    for (const char *l = r->str; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *end = strchr(l, '\n');
        size_t len = end ? (size_t)(end - l) : strlen(l);
        n += memmem(l, len, db, strlen(db)) && memmem(l, len, what, strlen(what));
    }
    freeReplyObject(r);
    return n;
}

/* 16 jobs with one digest over 2 processes x 8 threads: lock_timeout makes
 * each wait its turn, and OverlapJob records any two that ran at once. */
Test(unique, while_executing_never_overlaps_across_threads_and_processes)
{
    const char *bulk = "{\"class\":\"OverlapJob\",\"lock\":\"while_executing\",\"lock_timeout\":20,"
                       "\"args\":[[\"ov\",60],[\"ov\",60],[\"ov\",60],[\"ov\",60],[\"ov\",60],"
                       "[\"ov\",60],[\"ov\",60],[\"ov\",60],[\"ov\",60],[\"ov\",60],[\"ov\",60],"
                       "[\"ov\",60],[\"ov\",60],[\"ov\",60],[\"ov\",60],[\"ov\",60]]}";
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push_bulk", bulk, NULL }, NULL), 0);
    pid_t a = kt_capstan_start((const char *[]){ "-c", "8", NULL });
    pid_t b = kt_capstan_start((const char *[]){ "-c", "8", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ov:log") == 16, 40), "A: %s\nB: %s", kt_capstan_log(a),
              kt_capstan_log(b));
    cr_assert_eq(kt_int("GET ov:overlaps"), 0, "no two ran at once");
    char *d = ruby_digest("OverlapJob", "default", "[\"ov\",60]");
    cr_assert_eq(kt_int("EXISTS %s:RUN:LOCKED", d), 0);
    cr_assert_eq(stop(a), 0);
    cr_assert_eq(stop(b), 0);

    /* The same jobs without a lock do overlap: the evidence works. They
     * are pushed once the four processors wait on the queue, each for a
     * job of its own (pushed before, one processor starting ahead of the
     * others on a loaded machine could run them all in turn). */
    const char *free_bulk = "{\"class\":\"OverlapJob\",\"args\":[[\"fr\",300],[\"fr\",300],"
                            "[\"fr\",300],[\"fr\",300]]}";
    a = kt_capstan_start((const char *[]){ "-c", "4", NULL });
    cr_assert(KT_WAIT_UNTIL(blocked_in("blmove") >= 4, 20), "%s", kt_capstan_log(a));
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push_bulk", free_bulk, NULL }, NULL), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN fr:log") == 4, 20));
    cr_assert(kt_int("GET fr:overlaps") > 0);
    cr_assert_eq(stop(a), 0);
    free(d);
}

/* A while_executing job's runtime lock is released by its ack, which goes
 * out with the round trip that asks for the next job's lock, before it: a
 * thread running jobs of one digest back to back never finds its own last
 * job in the way. A failed job's ack releases it too, as the job enters
 * the retry set. */
Test(unique, while_executing_lock_goes_with_the_ack_before_the_next_job)
{
    char bulk[2048] = "{\"class\":\"RecordJob\",\"lock\":\"while_executing\",\"args\":[";
    for (int i = 0; i < 30; i++)
        strcat(bulk, i ? ",[\"wb\"]" : "[\"wb\"]");
    strcat(bulk, "]}");
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push_bulk", bulk, NULL }, NULL), 0);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD wb") == 30, 20), "%s", kt_capstan_log(pid));
    cr_assert(!log_says(pid, "Skipping job"), "%s", kt_capstan_log(pid));
    char *d = ruby_digest("RecordJob", "default", "[\"wb\"]");
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:RUN:LOCKED", d) == 0, 5));
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests %s:RUN", d), 0);

    char *f = ruby_digest("FailJob", "default", "[\"wf\"]");
    cr_assert_eq(push((const char *[]){ "push", "FailJob", "[\"wf\"]", "--lock", "while_executing",
                                        NULL }, NULL), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:RUN:LOCKED", f) == 0, 5), "released in retry");
    cr_assert_eq(stop(pid), 0);
    free(d);
    free(f);
}

/* lock_limit 2: two jobs with one digest may run at once, never three,
 * across processes; the others wait (lock_timeout) and all run. */
Test(unique, lock_limit_two_lets_two_run_at_once_and_never_three)
{
    const char *bulk = "{\"class\":\"OverlapJob\",\"lock\":\"while_executing\",\"lock_limit\":2,"
                       "\"lock_timeout\":20,\"args\":[[\"ll\",150],[\"ll\",150],[\"ll\",150],"
                       "[\"ll\",150],[\"ll\",150],[\"ll\",150],[\"ll\",150],[\"ll\",150]]}";
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push_bulk", bulk, NULL }, NULL), 0);
    pid_t a = kt_capstan_start((const char *[]){ "-c", "4", NULL });
    pid_t b = kt_capstan_start((const char *[]){ "-c", "4", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ll:log") == 8, 40), "A: %s\nB: %s", kt_capstan_log(a),
              kt_capstan_log(b));
    redisReply *r = kt_cmd("LRANGE ll:levels 0 -1");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 8, "every job recorded its level");
    long max = 0;
    for (size_t i = 0; i < r->elements; i++)
        if (atol(r->element[i]->str) > max)
            max = atol(r->element[i]->str);
    freeReplyObject(r);
    cr_assert_eq(max, 2, "the limit let two run at once, and never three (max %ld)", max);
    char *d = ruby_digest("OverlapJob", "default", "[\"ll\",150]");
    cr_assert_eq(kt_int("EXISTS %s:RUN:LOCKED", d), 0, "released at the end");
    cr_assert_eq(stop(a), 0);
    cr_assert_eq(stop(b), 0);
    free(d);
}

/* The median of n values (sorts them). */
static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

typedef struct lock_waiter {
    char jid[25];
    int rc;
    double got; /* when the wait returned */
} lock_waiter_t;

#define WAKE_DIGEST "uniquejobs:wake"

static void *wait_for_lock(void *arg)
{
    lock_waiter_t *w = arg;
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN] = "";
    capstan_lock_req_t q = { .digest = WAKE_DIGEST, .runtime = 1, .jid = w->jid,
                             .type = CAPSTAN_LOCK_WHILE_EXECUTING };
    w->rc = capstan_unique_lock_wait(r, &q, 10, err);
    w->got = kt_now();
    capstan_redis_free(r);
    return NULL;
}

/* A job waiting for a lock (lock_timeout) is woken by the release: it takes
 * the lock within milliseconds, not at its next try (a try every 0.05 to
 * 0.15 s otherwise, and every 0.1 s before the wake). Five hand-offs, each
 * to a waiter that has waited half a second. */
Test(unique, a_release_wakes_the_lock_waiter_at_once)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN] = "";
    enum { N = 5 };
    double took[N];
    for (int i = 0; i < N; i++) {
        char holder[25];
        kt_make_jid(holder, 3, (unsigned)i);
        capstan_lock_req_t h = { .digest = WAKE_DIGEST, .runtime = 1, .jid = holder,
                                 .type = CAPSTAN_LOCK_WHILE_EXECUTING };
        cr_assert_eq(capstan_unique_lock(r, &h, err), CAPSTAN_LOCK_ACQUIRED, "%s", err);
        lock_waiter_t w = { .rc = 0 };
        kt_make_jid(w.jid, 4, (unsigned)i);
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, wait_for_lock, &w), 0);
        cr_assert(KT_WAIT_UNTIL(kt_int("ZSCORE " WAKE_DIGEST ":RUN:WAITING %s", w.jid) > 0, 5));
        kt_sleep(0.5);
        cr_assert(KT_WAIT_UNTIL(blocked_in("blpop") == 1, 5), "the waiter blocks between tries");
        double t0 = kt_now();
        cr_assert_eq(capstan_unique_unlock(r, WAKE_DIGEST, 1, holder, CAPSTAN_LOCK_WHILE_EXECUTING, 0, err),
                     0, "%s", err);
        pthread_join(th, NULL);
        cr_assert_eq(w.rc, CAPSTAN_LOCK_ACQUIRED);
        took[i] = w.got - t0;
        cr_assert_eq(capstan_unique_unlock(r, WAKE_DIGEST, 1, w.jid, CAPSTAN_LOCK_WHILE_EXECUTING, 0, err),
                     0, "%s", err);
    }
    double m = median(took, N);
    printf("unique: a lock waiter took the lock %.1f ms (median of %d) after its release, %.1f at most\n",
           m * 1000, N, took[N - 1] * 1000);
    cr_assert_lt(m, 0.025, "woken by the release, not at its next try: median %.3f s", m);
    cr_assert_eq(kt_int("EXISTS " WAKE_DIGEST ":RUN:WAITING"), 0, "the line is empty");

    /* The wake is best effort: a key of another type in its place fails
     * it, never the release. */
    freeReplyObject(kt_cmd("SET " WAKE_DIGEST ":RUN:WAITING not-a-zset"));
    capstan_lock_req_t h = { .digest = WAKE_DIGEST, .runtime = 1, .jid = "000000000000000000000009",
                             .type = CAPSTAN_LOCK_WHILE_EXECUTING };
    cr_assert_eq(capstan_unique_lock(r, &h, err), CAPSTAN_LOCK_ACQUIRED, "%s", err);
    cr_assert_eq(capstan_unique_unlock(r, WAKE_DIGEST, 1, h.jid, CAPSTAN_LOCK_WHILE_EXECUTING, 0, err), 0,
                 "%s", err);
    cr_assert_eq(kt_int("EXISTS " WAKE_DIGEST ":RUN:LOCKED"), 0, "released");
    capstan_redis_free(r);
}

/* The same through the runtime: six jobs of one digest (while_executing,
 * lock_timeout), one to each of six processes, run one after the other,
 * each starting as soon as the one before ends and its ack releases the
 * lock. LimitJob records each start on the Redis clock and runs 200 ms.
 * (One process would run them in turn on one processor, the lock going
 * with each ack before the next job: no wait.) */
Test(unique, a_runtime_lock_passes_to_a_job_waiting_elsewhere_at_once)
{
    enum { N = 6, MS = 200 };
    pid_t pids[N];
    for (int i = 0; i < N; i++)
        pids[i] = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(blocked_in("blmove") == N, 20), "each process waits for a job");
    for (int i = 0; i < N; i++)
        cr_assert_eq(push((const char *[]){ "push", "LimitJob", "[\"hw\", 200]", "--lock", "while_executing",
                                            "--lock-timeout", "20", NULL }, NULL), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN hw:starts") == N && kt_int("GET hw:running") == 0, 20), "%s",
              kt_capstan_log(pids[0]));
    redisReply *r = kt_cmd("LRANGE hw:starts 0 -1");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == N);
    double starts[N], gaps[N - 1];
    for (int i = 0; i < N; i++)
        starts[i] = atof(r->element[i]->str) / 1000;
    freeReplyObject(r);
    median(starts, N);
    for (int i = 0; i + 1 < N; i++)
        gaps[i] = starts[i + 1] - starts[i] - MS / 1000.0;
    double m = median(gaps, N - 1);
    printf("unique: a runtime lock passed to a job waiting in another process %.1f ms (median of %d) "
           "after its holder's end, %.1f at most\n", m * 1000, N - 1, gaps[N - 2] * 1000);
    cr_assert_eq(kt_int("GET hw:max"), 1, "one at a time");
    cr_assert_eq(kt_int("SCARD hw:jids"), N);
    cr_assert_lt(m, 0.015, "the next job started %.3f s after the lock's holder ended", m);
    for (int i = 0; i < N; i++)
        cr_assert_eq(stop(pids[i]), 0);
}

/* A finished job's ack goes out as its processor begins to wait for a
 * lock. Left for the next job's round trip, it waited with the processor
 * (up to lock_timeout), and a kill or a failover meanwhile ran the job
 * again. One processor, a run of short jobs fetched ahead, then a job whose
 * runtime lock is held elsewhere (lock_timeout 6), then more. */
Test(unique, a_finished_jobs_ack_does_not_wait_with_a_lock_wait)
{
    char *d = ruby_digest("RecordJob", "default", "[\"ww\"]");
    char run[400], last[25];
    snprintf(run, sizeof(run), "%s:RUN", d);
    cr_assert_eq(kt_ruby("unique.rb", (const char *[]){ "hold", run, "000000000000000000000001",
                                                        "while_executing", NULL }, NULL), 0);
    kt_push_jobs("NoopJob", "[]", 1, 3000);
    kt_make_jid(last, 1, 2999);
    char *locked = NULL;
    cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"ww\"]", "--lock", "while_executing",
                                        "--lock-timeout", "6", NULL }, &locked), 0, "%s", locked);
    kt_push_jobs("NoopJob", "[]", 2, 500);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    char *id = kt_wait_identity(pid), done[64];
    snprintf(done, sizeof(done), "jid=%s elapsed=", last);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, done), 10), "%s", kt_capstan_log(pid));
    double t0 = kt_now();
    int acked = KT_WAIT_UNTIL(!kt_working_has(id, last), 3);
    printf("unique: the ack of the job before a lock wait was written %.2f s after it ended\n", kt_now() - t0);
    cr_assert(acked, "it stayed in the working list while the next job waited for its lock:\n%s",
              kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD ww"), 0, "the locked job did not wait");
    cr_assert_eq(stop(pid), 0);
    free(id);
    free(d);
    free(locked);
}

/* A runtime lock held by someone else: each server strategy. */
Test(unique, server_strategies_reject_reschedule_log_raise)
{
    char *d = ruby_digest("RecordJob", "default", "[\"ss\"]");
    char run[400];
    snprintf(run, sizeof(run), "%s:RUN", d);
    cr_assert_eq(kt_ruby("unique.rb", (const char *[]){ "hold", run, "000000000000000000000001",
                                                        "while_executing", NULL }, NULL), 0);
    const char *names[] = { "reject", "reschedule", "log", "raise" };
    char *jids[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"ss\"]", "--lock",
                                            "while_executing", "--on-conflict", names[i], NULL },
                          &jids[i]), 0, "%s", jids[i]);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0 && kt_int("ZCARD dead") == 1 &&
                            kt_int("ZCARD schedule") == 1 && kt_int("ZCARD retry") == 1, 15),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    cr_assert_eq(kt_int("SCARD ss"), 0, "none ran");
    char *dead = first_member("dead"), *sch = first_member("schedule");
    char *retry = first_member("retry");
    cr_assert(strstr(dead, jids[0]), "reject -> dead: %s", dead);
    cr_assert(strstr(sch, jids[1]), "reschedule -> schedule: %s", sch);
    cr_assert(strstr(retry, jids[3]) && strstr(retry, "SidekiqUniqueJobs::Conflict"),
              "raise -> retry: %s", retry);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "Skipping job with id") && strstr(log, jids[2]), "log says so: %s", log);
    cr_assert_eq(kt_int("HLEN %s:RUN:LOCKED", d), 1, "the holder's lock is untouched");
    /* Only the raise counts (its Conflict is a failure, as in Sidekiq); the
     * three that did not run say what happened to them, not "done". */
    cr_assert(strstr(dead, "\"error_class\":\"Capstan::UniqueJobRejected\"")
              && strstr(dead, "\"error_message\":\"while_executing lock_digest "), "%s", dead);
    cr_assert_eq(kt_int("GET stat:processed"), 1);
    cr_assert_eq(kt_int("GET stat:failed"), 1);
    const char *outcome[] = { "INFO: rejected", "INFO: rescheduled", "INFO: skipped" };
    for (int i = 0; i < 3; i++) {
        char line[128];
        snprintf(line, sizeof(line), "jid=%s", jids[i]);
        const char *at = strstr(log, line);
        int found = 0;
        for (; at && !found; at = strstr(at + 1, line)) {
            const char *eol = strchr(at, '\n');
            found = eol && (size_t)(eol - at) > strlen(outcome[i])
                    && memcmp(eol - strlen(outcome[i]), outcome[i], strlen(outcome[i])) == 0;
        }
        cr_assert(found, "%s: %s\n%s", jids[i], outcome[i], log);
    }
    cr_assert(!strstr(log, "INFO: done"), "none was done: %s", log);
    free(d); free(dead); free(sch); free(retry); free(log);
    for (int i = 0; i < 4; i++)
        free(jids[i]);
}

/* A job that expired before its turn does not run, and the lock it holds
 * goes as after a run: until_executed's, and until_and_while_executing's
 * until-lock. */
Test(unique, an_expired_job_releases_its_lock_as_after_a_run)
{
    char *d1 = ruby_digest("RecordJob", "default", "[\"xl\"]");
    char *d2 = ruby_digest("RecordJob", "default", "[\"xw\"]");
    char *j1 = NULL, *j2 = NULL;
    cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"xl\"]", "--lock", "until_executed",
                                        "--expires-in", "0.001", NULL }, &j1), 0, "%s", j1);
    cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"xw\"]", "--lock", "until_and_while_executing",
                                        "--expires-in", "0.001", NULL }, &j2), 0, "%s", j2);
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d1, j1), 1);
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d2, j2), 1);
    kt_sleep(0.01);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0 && kt_int("EXISTS %s:LOCKED", d1) == 0
                            && kt_int("EXISTS %s:LOCKED", d2) == 0, 15), "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    cr_assert_eq(kt_int("SCARD xl") + kt_int("SCARD xw"), 0, "neither ran");
    cr_assert_eq(kt_int("EXISTS %s:RUN:LOCKED", d2), 0, "no runtime lock was taken");
    cr_assert_eq(kt_int("ZCARD dead") + kt_int("ZCARD retry"), 0);
    free(d1); free(d2); free(j1); free(j2);
}

/* The dead-set entry of a rejected duplicate, as Sidekiq's API (and so its
 * Dead page) reads it: the class, and the error that says why. */
KT_SIDEKIQ_TEST(unique, a_rejected_duplicate_shows_its_error_in_sidekiqs_dead_set)
{
    freeReplyObject(kt_cmd("HSET uniquejobs:rd:RUN:LOCKED 000000000000000000000001 {}"));
    char jid[25];
    kt_make_jid(jid, 72, 0);
    char *p = kt_payload_locked("RecordJob", "[\"rd\"]", jid, "default", "while_executing_reject", "rd");
    freeReplyObject(kt_cmd("LPUSH queue:default %s", p));
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 15), "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    char *out = NULL;
    cr_assert_eq(kt_ruby_v(sidekiq, "sidekiq.rb", (const char *[]){ "dead", NULL }, &out), 0);
    cr_assert(strstr(out, "\"display_class\":\"RecordJob\"")
              && strstr(out, "\"error\":\"Capstan::UniqueJobRejected: while_executing_reject lock_digest "
                             "uniquejobs:rd is running (on_conflict: reject)\""), "%s", out);
    cr_assert_eq(kt_int("SCARD rd"), 0, "it did not run");
    free(p);
    free(out);
}

/* `sidekiq_options ...` of a job class, then one perform_async per args,
 * from the Ruby Sidekiq of a KT_SIDEKIQ_TEST. */
static void ruby_perform(const char *sidekiq, const char *cls, const char *opts, const char *args, int n)
{
    const char *argv[8] = { "perform_async", cls, opts };
    for (int i = 0; i < n; i++)
        argv[3 + i] = args;
    char *out = NULL;
    cr_assert_eq(kt_ruby_v(sidekiq, "sidekiq.rb", argv, &out), 0, "%s", out);
    free(out);
}

/* A Ruby app that gives `lock: :until_executed` without the gem's client
 * middleware pushes every job without its lock, and the server takes it:
 * that is the usual way, not news, so it is logged at debug only. 3 jobs
 * with different args log nothing at the default level; with -v each says
 * so. */
Test(unique, ruby_pushed_locks_taken_at_the_server_are_logged_at_debug)
{
    ruby_perform("6.4.1", "RecordJob", "{\"lock\":\"until_executed\"}", "[\"rp1\"]", 1);
    ruby_perform("6.4.1", "RecordJob", "{\"lock\":\"until_executed\"}", "[\"rp2\"]", 1);
    ruby_perform("6.4.1", "RecordJob", "{\"lock\":\"until_executed\"}", "[\"rp3\"]", 1);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rp1") + kt_int("SCARD rp2") + kt_int("SCARD rp3") == 3, 20),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    cr_assert_eq(kt_log_count(pid, "uniqueness_lapsed"), 0, "%s", kt_capstan_log(pid));
    ruby_perform("6.4.1", "RecordJob", "{\"lock\":\"until_executed\"}", "[\"rp4\"]", 1);
    pid = kt_capstan_start((const char *[]){ "-c", "2", "-v", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rp4") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    cr_assert_eq(kt_log_count(pid, "uniqueness_lapsed: RecordJob"), 1, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 0, "every lock released");
}

/* Sidekiq Enterprise's unique_for, as a Ruby app without Enterprise pushes
 * it (`sidekiq_options unique_for: 600`): capstan refuses at the server the
 * copies Enterprise's client would have refused at the push. Of 3 copies
 * enqueued before the first ran, 1 runs and 2 are skipped, even one at a
 * time; a copy pushed after the first succeeded runs. With `unique_until:
 * :start` the lock goes when the job starts: of 2 copies enqueued before,
 * 1 runs, and one pushed while it runs runs too. */
KT_SIDEKIQ_TEST(unique, ruby_unique_for_runs_one_of_the_copies_enqueued_before_it_ran)
{
    ruby_perform(sidekiq, "RecordJob", "{\"unique_for\":600}", "[\"uf\"]", 3);
    ruby_perform(sidekiq, "OverlapJob", "{\"unique_for\":600,\"unique_until\":\"start\"}",
                 "[\"us\",3000]", 2);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("GET us:running") == 1, 20), "%s", kt_capstan_log(pid));
    ruby_perform(sidekiq, "OverlapJob", "{\"unique_for\":600,\"unique_until\":\"start\"}",
                 "[\"us\",3000]", 1);
    cr_assert_eq(kt_int("GET us:running"), 1, "pushed while the first one runs");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN us:log") == 2, 30), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD uf"), 1, "%s", kt_capstan_log(pid));
    ruby_perform(sidekiq, "RecordJob", "{\"unique_for\":600}", "[\"uf\"]", 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD uf") == 2 && kt_int("LLEN queue:default") == 0, 20),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    char *d = ruby_digest("RecordJob", "default", "[\"uf\"]");
    cr_assert_eq(kt_int("EXISTS %s:LOCKED", d), 0, "released at success");
    cr_assert_eq(kt_int("LLEN us:log"), 2);
    cr_assert_eq(kt_log_count(pid, "Skipping job with id"), 3, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "uniqueness_lapsed"), 0, "no lock was expected at the push");
    cr_assert_eq(kt_int("ZCARD dead") + kt_int("ZCARD retry"), 0);
    free(d);
}

/* A class's unique_for given in the YAML alone, not in the payload (an app
 * leaving Enterprise that moved the option into capstan's file): a copy
 * enqueued before the first one ran is refused at the fetch as a
 * payload's unique_for's copy is, even when it comes after the first one
 * succeeded. 2 copies, 1 run; one pushed afterwards runs. */
Test(unique, yaml_unique_for_refuses_copies_enqueued_before_the_first_ran)
{
    char *y = kt_write_file("uf.yml", "classes:\n  RecordJob:\n    unique_for: 600\n");
    ruby_perform("6.4.1", "RecordJob", "{}", "[\"yu\"]", 1);
    ruby_perform("6.4.1", "RecordJob", "{}", "[\"yu\"]", 1);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0 &&
                            kt_int("SCARD yu") + kt_log_count(pid, "Skipping job with id") == 2, 20),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD yu"), 1, "%s", kt_capstan_log(pid));
    ruby_perform("6.4.1", "RecordJob", "{}", "[\"yu\"]", 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD yu") == 2, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    cr_assert_eq(kt_log_count(pid, "Skipping job with id"), 1, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "uniqueness_lapsed"), 0, "no lock was expected at the push");
    free(y);
}

Test(unique, client_strategies_reject_and_reschedule)
{
    char *jid = NULL, *out = NULL;
    cr_assert_eq(push((const char *[]){ "push", "NoopJob", "[\"cs\"]", "--lock", "until_executed",
                                        NULL }, &jid), 0);
    cr_assert_eq(push((const char *[]){ "push", "NoopJob", "[\"cs\"]", "--lock", "until_executed",
                                        "--on-conflict", "reject", NULL }, &out), 3, "%s", out);
    cr_assert_eq(kt_int("ZCARD dead"), 1, "rejected to dead");
    free(out);
    cr_assert_eq(push((const char *[]){ "push", "NoopJob", "[\"cs\"]", "--lock", "until_executed",
                                        "--on-conflict", "reschedule", NULL }, &out), 0, "%s", out);
    cr_assert_eq(kt_int("ZCARD schedule"), 1, "rescheduled");
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    free(out);
    cr_assert_eq(push((const char *[]){ "push", "NoopJob", "[\"cs\"]", "--lock", "until_executed",
                                        "--on-conflict", "replace", NULL }, &out), 0, "%s", out);
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "the old job was replaced");
    char *q = kt_str("LINDEX queue:default 0");
    cr_assert(strstr(q, out) && !strstr(q, jid), "%s", q);
    free(jid); free(out); free(q);
}

/* A lock a Ruby v9 client wrote (keys and metadata as the gem writes them)
 * is honoured by capstan's push and released by capstan's server. */
Test(unique, ruby_v9_lock_is_honoured_and_released)
{
    char *out = NULL;
    cr_assert_eq(kt_ruby("unique.rb", (const char *[]){ "lock", "RecordJob", "default", "[\"rb\"]",
                                                        "until_executed", NULL }, &out), 0);
    char jid[64], digest[128];
    cr_assert_eq(sscanf(out, "{\"jid\":\"%63[^\"]\",\"digest\":\"%127[^\"]\"}", jid, digest), 2,
                 "%s", out);
    char *denied = NULL;
    cr_assert_eq(push((const char *[]){ "push", "RecordJob", "[\"rb\"]", "--lock", "until_executed",
                                        NULL }, &denied), 3, "Ruby's lock holds: %s", denied);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SISMEMBER rb %s", jid) == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:LOCKED", digest) == 0, 5), "capstan released it");
    cr_assert_eq(kt_int("ZSCORE uniquejobs:digests %s", digest), 0);
    cr_assert_eq(stop(pid), 0);
    char *log = kt_capstan_log(pid);
    cr_assert_null(strstr(log, "uniqueness_lapsed"), "the lock was found: %s", log);
    free(out); free(denied); free(log);
}

Test(unique, kill_9_and_recovery_keep_the_lock)
{
    char *y = kt_write_file("fast.yml", "heartbeat_interval: 0.5\nliveness_ttl: 2\nrecovery_interval: 1\n");
    char *d = ruby_digest("SleepJob", "default", "[4000]");
    char *jid = NULL;
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[4000]", "--lock", "until_executed",
                                        NULL }, &jid), 0);
    pid_t a = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0, 10));
    kt_sleep(0.3);
    cr_assert_eq(kt_capstan_stop(a, SIGKILL, 10), 128 + SIGKILL);
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d, jid), 1, "kept with the orphan");
    pid_t b = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 1 || kt_int("LLEN queue:default") == 0,
                            1));
    /* Recovered, run to completion by B, and only then released. */
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:LOCKED", d) == 0, 25), "%s", kt_capstan_log(b));
    char *log = kt_capstan_log(b);
    cr_assert(strstr(log, jid), "B ran it: %s", log);
    cr_assert_null(strstr(log, "uniqueness_lapsed"), "%s", log);
    cr_assert_eq(stop(b), 0);
    free(y); free(d); free(jid); free(log);
}

Test(unique, bad_lock_input_falls_back_with_a_log_line)
{
    const char *jobs[] = {
        "{\"class\":\"RecordJob\",\"args\":[\"bad\",0],\"lock\":\"until_forever\"}",
        "{\"class\":\"RecordJob\",\"args\":[\"bad\",1],\"lock\":\"until_executed\",\"lock_ttl\":-5}",
        "{\"class\":\"RecordJob\",\"args\":[\"bad\",2],\"lock\":\"until_executed\","
        "\"lock_digest\":\"$$garbage$$\"}",
        "{\"class\":\"RecordJob\",\"args\":[\"bad\",3],\"lock\":42,\"lock_digest\":[1]}",
    };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push", jobs[i], NULL }, NULL), 0);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD bad") == 4, 20), "all ran: %s", kt_capstan_log(pid));
    char *d = ruby_digest("RecordJob", "default", "[\"bad\",2]");
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:LOCKED", d) == 0, 5), "computed digest released");
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 0);
    cr_assert_eq(stop(pid), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "unknown lock type \"until_forever\""), "%s", log);
    cr_assert(strstr(log, "lock_ttl must be a number of seconds >= 0"), "%s", log);
    cr_assert(strstr(log, "is not a digest"), "%s", log);
    cr_assert(strstr(log, "is not a lock type name"), "%s", log);

    /* Bad configuration: clear errors, exit 78 (file) and 64 (flags). */
    char *y = kt_write_file("bad.yml", "classes:\n  RecordJob:\n    lock: until_forever\n");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-C", y, NULL }, &out), 78, "%s", out);
    cr_assert(strstr(out, "classes.RecordJob.lock: unknown lock type until_forever"), "%s", out);
    free(out);
    char *y2 = kt_write_file("bad2.yml", "classes:\n  RecordJob:\n    lock: until_executed\n"
                                      "    lock_ttl: -3\n");
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-C", y2, NULL }, &out), 78, "%s", out);
    cr_assert(strstr(out, "classes.RecordJob.lock_ttl"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "--lock", "bogus", NULL }, &out),
                 64, "%s", out);
    cr_assert(strstr(out, "unknown lock type bogus"), "%s", out);
    free(out);
    free(d); free(log); free(y); free(y2);
}

/* Lock times beyond 10 years are cut to 10 years with a log line instead
 * of overflowing into a lock with a random expiry (or none). */
Test(unique, absurd_lock_times_are_cut_to_ten_years)
{
    const long long ten_years_ms = 10LL * 365 * 86400 * 1000;
    char *d = ruby_digest("SleepJob", "default", "[1500]");
    const char *raw = "{\"class\":\"SleepJob\",\"args\":[1500],\"jid\":\"c0000000000000000000000a\","
                      "\"queue\":\"default\",\"lock\":\"while_executing\",\"lock_ttl\":1e17,"
                      "\"lock_timeout\":1e300,\"lock_limit\":1e20}";
    freeReplyObject(kt_cmd("LPUSH queue:default %s", raw));
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:RUN:LOCKED", d) == 1, 20), "locked: %s",
              kt_capstan_log(pid));
    long long pttl = kt_int("PTTL %s:RUN:LOCKED", d);
    cr_assert(pttl > ten_years_ms - 60000 && pttl <= ten_years_ms, "PTTL %lld", pttl);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:RUN:LOCKED", d) == 0, 10), "released: %s",
              kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0, "%s", kt_capstan_log(pid));
    cr_assert(log_says(pid, "lock_ttl 1e+17 is more than 10 years"), "%s", kt_capstan_log(pid));
    cr_assert(log_says(pid, "lock_timeout 1e+300 is more than 10 years"), "%s", kt_capstan_log(pid));
    free(d);
}

/* YAML classes: options apply to jobs a plain Ruby client pushed. */
Test(unique, yaml_class_options_lock_jobs_without_lock_fields)
{
    char *y = kt_write_file("classes.yml",
                            "classes:\n  OverlapJob:\n    lock: while_executing\n    lock_timeout: 20\n"
                            "  RecordJob:\n    unique_for: 60\n    unique_until: success\n");
    const char *bulk = "{\"class\":\"OverlapJob\",\"args\":[[\"ym\",80],[\"ym\",80],[\"ym\",80],"
                       "[\"ym\",80],[\"ym\",80],[\"ym\",80]]}";
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push_bulk", bulk, NULL }, NULL), 0);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "6", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ym:log") == 6, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("GET ym:overlaps"), 0);
    cr_assert_eq(stop(pid), 0);
    free(y);
}

/* The fetch checks an until_executed job's lock on the way (so the server
 * needs no round trip of its own), reading lock_digest and jid from the
 * payload by pattern. It must be trusted only for the job's real fields: a
 * decoy pair inside args, whose lock is really held, must not make a job
 * whose own lock lapsed run without re-taking it; and a lock held by
 * another jid still stops the job. */
Test(unique, fetch_lock_check_trusts_only_the_jobs_own_fields)
{
    char *d = ruby_digest("RecordJob", "default", "[\"fd\"]");
    char *d2 = ruby_digest("RecordJob", "default", "[\"fo\"]");
    /* Job 1: its own lock lapsed; the decoy in args names a held lock. */
    kt_int("HSET uniquejobs:decoy:LOCKED dddddddddddddddddddddddd {}");
    char p1[1024];
    snprintf(p1, sizeof(p1),
             "{\"class\":\"RecordJob\",\"args\":[\"fd\",{\"lock_digest\":\"uniquejobs:decoy\","
             "\"jid\":\"dddddddddddddddddddddddd\"}],\"queue\":\"default\",\"retry\":false,"
             "\"jid\":\"f00000000000000000000001\",\"lock\":\"until_executed\","
             "\"lock_digest\":\"%s\",\"created_at\":1,\"enqueued_at\":1}", d);
    /* Job 2: its lock is held by another jid. */
    kt_int("HSET %s:LOCKED f0000000000000000000000f {}", d2);
    char p2[1024];
    snprintf(p2, sizeof(p2),
             "{\"class\":\"RecordJob\",\"args\":[\"fo\"],\"queue\":\"default\",\"retry\":false,"
             "\"jid\":\"f00000000000000000000002\",\"lock\":\"until_executed\","
             "\"lock_digest\":\"%s\",\"created_at\":1,\"enqueued_at\":1}", d2);
    redisReply *r = kt_cmd("LPUSH queue:default %s %s", p1, p2);
    freeReplyObject(r);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", "-v", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD fd") == 1 && log_says(pid, "Skipping job with id"), 15),
              "%s", kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "uniqueness_lapsed: RecordJob f00000000000000000000001"),
              "job 1 re-took its own lock rather than trust the decoy: %s", log);
    cr_assert_eq(kt_int("EXISTS %s:LOCKED", d), 0, "and released it after success");
    cr_assert_eq(kt_int("HEXISTS uniquejobs:decoy:LOCKED dddddddddddddddddddddddd"), 1,
                 "the decoy's lock is untouched");
    cr_assert_eq(kt_int("SCARD fo"), 0, "job 2 did not run");
    cr_assert(strstr(log, "Skipping job with id (f00000000000000000000002)"), "%s", log);
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED f0000000000000000000000f", d2), 1,
                 "the holder keeps its lock");
    free(d); free(d2); free(log);
}

/* ---- runtime locks asked for several at a time ------------------------ */

/* n payloads of cls with args, each with lock type lock and the lock key
 * keyof(i) gives, pushed on c so that job 0 runs first. */
static void push_locked(redisContext *c, const char *cls, const char *args, const char *lock,
                        int n, void (*keyof)(int, char *))
{
    char **p = calloc((size_t)n, sizeof(char *));
    for (int i = 0; i < n; i++) {
        char jid[25], k[64];
        kt_make_jid(jid, 7, (unsigned)i);
        keyof(i, k);
        p[i] = kt_payload_locked(cls, args, jid, "default", lock, k);
    }
    kt_push_all(c, "default", p, (size_t)n);
    for (int i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

static void own_key(int i, char *k)
{
    snprintf(k, 64, "own%05d", i);
}

static void pair_key(int i, char *k)
{
    snprintf(k, 64, "pair%05d", i / 2);
}

static void held_key(int i, char *k)
{
    snprintf(k, 64, i % 50 == 25 ? "held" : "own%05d", i);
}

/* The calls the server c is connected to counted for cmd. */
static long long calls_of(redisContext *c, const char *cmd)
{
    redisReply *r = redisCommand(c, "INFO commandstats");
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    char needle[64];
    snprintf(needle, sizeof(needle), "cmdstat_%s:calls=", cmd);
    const char *at = strstr(r->str, needle);
    long long n = at ? atoll(at + strlen(needle)) : 0;
    freeReplyObject(r);
    return n;
}

/* Short while_executing jobs: a processor takes several from the feed and
 * asks for their runtime locks in one script call (feed/ahead.c), so
 * Redis sees fewer script calls than jobs (a call each for the locks
 * alone, before). Each runs once, and every lock is gone when they are
 * done. On a server of its own, to count its calls alone. */
static void short_locked_jobs(const char *lock)
{
    enum { N = 3000 };
    kt_aof_redis_t s;
    kt_aof_init(&s, "calls");
    kt_aof_start(&s);
    redisContext *c = kt_aof_connect(&s);
    cr_assert(c);
    push_locked(c, "NoopJob", "[]", lock, N, own_key);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "5", "--redis-url", s.url, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(c, "LLEN queue:default") == 0
                            && kt_log_count(pid, "INFO: done") == N, 60),
              "%d of %d ran\n%s", kt_log_count(pid, "INFO: done"), N, kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0, "%s", kt_capstan_log(pid));
    long long scripts = calls_of(c, "evalsha");
    fprintf(stderr, "[unique] %d %s jobs: %lld script calls\n", N, lock, scripts);
    cr_assert_eq(kt_log_count(pid, "INFO: done"), N, "each ran once");
    cr_assert(!log_says(pid, "Skipping job"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int_on(c, "ZCARD uniquejobs:digests"), 0, "no lock is left");
    cr_assert_lt(scripts, N, "%lld script calls for %d jobs", scripts, N);
    redisFree(c);
    kt_aof_kill(&s);
}

Test(unique, short_while_executing_jobs_lock_several_in_one_call)
{
    short_locked_jobs("while_executing");
}

Test(unique, short_until_and_while_jobs_lock_several_in_one_call)
{
    short_locked_jobs("until_and_while_executing");
}

/* Two jobs of one lock next to each other in the queue: a processor that
 * takes both at once would find the second's lock held by the first, so it
 * takes the second with the next round trip, after the first's release. */
Test(unique, jobs_sharing_a_lock_back_to_back_all_run)
{
    enum { N = 400 };
    push_locked(kt_redis(), "RecordJob", "[\"pr\"]", "while_executing", N, pair_key);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD pr") == N, 30), "%lld of %d ran\n%s",
              kt_int("SCARD pr"), N, kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0, "%s", kt_capstan_log(pid));
    cr_assert(!log_says(pid, "Skipping job"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 0, "no lock is left");
}

/* A lock another process holds still refuses the job asked for with
 * others: its server strategy (log: skip) applies to it alone. */
Test(unique, a_lock_held_elsewhere_refuses_only_its_job)
{
    enum { N = 400 };
    freeReplyObject(kt_cmd("HSET uniquejobs:held:RUN:LOCKED elsewhere {}"));
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests 1 uniquejobs:held:RUN"));
    push_locked(kt_redis(), "RecordJob", "[\"hl\"]", "while_executing", N, held_key);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD hl") == N - N / 50 && kt_int("LLEN queue:default") == 0
                            && kt_log_count(pid, "Skipping job") == N / 50, 30),
              "%lld ran\n%s", kt_int("SCARD hl"), kt_capstan_log(pid));
    cr_assert_eq(stop(pid), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD hl"), N - N / 50);
    cr_assert_eq(kt_int("HEXISTS uniquejobs:held:RUN:LOCKED elsewhere"), 1, "still held");
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 1, "only that lock is left");
}

/* A late ack (the job left this process's working list while it ran: a
 * freeze or a partition past the liveness lease, found by the fault
 * harness) releases the runtime lock its run took: the copy that went
 * elsewhere takes its own, and nothing else would release this hold, so
 * the digest stayed locked until the reaper. The until-lock stays for the
 * copy. Here the process is frozen mid-job and its job taken from its
 * working list, as a recovery would; the run's hold is left as a run that
 * took it after the copy finished leaves it. */
Test(unique, a_late_ack_releases_the_runtime_lock_its_run_took)
{
    char *d = ruby_digest("SleepJob", "default", "[1500]");
    char *jid = NULL;
    cr_assert_eq(push((const char *[]){ "push", "SleepJob", "[1500]", "--lock", "until_and_while_executing",
                                        NULL }, &jid), 0, "%s", jid);
    pid_t a = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    char *id = kt_wait_identity(a), *w = kt_working_key(id);
    cr_assert(KT_WAIT_UNTIL(kt_int("HEXISTS %s:RUN:LOCKED %s", d, jid) == 1, 10), "%s", kt_capstan_log(a));
    kill(a, SIGSTOP);
    char *payload = kt_str("LINDEX %s 0", w);
    cr_assert(payload && strstr(payload, jid), "%s", payload ? payload : "(none)");
    cr_assert_eq(kt_int("LREM %s 1 %s", w, payload), 1);
    /* The copy's until-lock, as a recovery leaves it when it requeues. */
    cr_assert_eq(kt_int("HSET %s:LOCKED %s {}", d, jid), 1);
    kill(a, SIGCONT);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(a, "elapsed=") == 1, 10), "%s", kt_capstan_log(a));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:RUN:LOCKED", d) == 0, 5), "the runtime lock leaked: %s",
              kt_capstan_log(a));
    cr_assert_eq(kt_int("HEXISTS %s:LOCKED %s", d, jid), 1, "the until-lock stays for the copy");
    cr_assert_eq(stop(a), 0);
    free(payload); free(w); free(id); free(d); free(jid);
}

/* One locks.lua call (what a run's runtime locks go in) for the jobs
 * whose runtime lock hashes are keys[0..n), in the kinds and groups
 * locks.lua takes; its two digits a job, in *out. */
static void run_locks(capstan_redis_t *r, const char *const *keys, int n, const char *kinds,
                      const char *const *groups, int ngroups, char *out, size_t len)
{
    const char *argv[1 + 8 + 2 + 6 * 8];
    int argc = 0;
    argv[argc++] = "uniquejobs:digests";
    for (int i = 0; i < n; i++)
        argv[argc++] = keys[i];
    argv[argc++] = "1700000000.500000";
    argv[argc++] = kinds;
    for (int i = 0; i < ngroups; i++)
        argv[argc++] = groups[i];
    redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_LOCKS, 1 + n, argc, argv, NULL);
    cr_assert(rep && rep->type == REDIS_REPLY_STRING, "locks.lua: %s", rep ? rep->str : "no reply");
    snprintf(out, len, "%s", rep->str);
    freeReplyObject(rep);
}

/* Runtime locks taken together are v9's: the hash "<digest>:LOCKED" with
 * the jid's metadata, the digest in "uniquejobs:digests" scored at now,
 * the TTL when there is one; a lock named twice in one call is taken once,
 * and one held elsewhere is refused alone, whether the call's other locks
 * exist or not, in the short form (jid and metadata) or the long. */
Test(unique, runtime_locks_taken_together_are_v9s_hashes_and_index)
{
    capstan_redis_t *r = kt_lib_redis();
    char got[32];
    /* None of them exists: A twice (limit 1), T with a TTL (the long
     * form), C after them. */
    const char *keys1[] = { "uniquejobs:a:RUN:LOCKED", "uniquejobs:t:RUN:LOCKED",
                            "uniquejobs:a:RUN:LOCKED", "uniquejobs:c:RUN:LOCKED" };
    const char *groups1[] = {
        "ja", "{\"m\":\"a\"}",
        "", "jt", "5000", "while_executing", "1", "{\"m\":\"t\"}",
        "jb", "{\"m\":\"b\"}",
        "jc", "{\"m\":\"c\"}",
    };
    run_locks(r, keys1, 4, "slss", groups1, 12, got, sizeof(got));
    cr_assert_str_eq(got, "11111011", "taken, taken, refused (held by ja), taken");
    redisReply *hc = kt_cmd("HGET uniquejobs:c:RUN:LOCKED jc");
    cr_assert(hc->type == REDIS_REPLY_STRING && !strcmp(hc->str, "{\"m\":\"c\"}"), "C's own group");
    freeReplyObject(hc);
    redisReply *h = kt_cmd("HGETALL uniquejobs:a:RUN:LOCKED");
    cr_assert(h->type == REDIS_REPLY_ARRAY && h->elements == 2, "one holder");
    cr_assert_str_eq(h->element[0]->str, "ja");
    cr_assert_str_eq(h->element[1]->str, "{\"m\":\"a\"}", "its metadata as given");
    freeReplyObject(h);
    redisReply *sc = kt_cmd("ZSCORE uniquejobs:digests uniquejobs:a:RUN");
    cr_assert(sc->type == REDIS_REPLY_STRING && !strcmp(sc->str, "1700000000.5"), "scored at now");
    freeReplyObject(sc);
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 3);
    cr_assert_eq(kt_int("PTTL uniquejobs:a:RUN:LOCKED"), -1, "no TTL asked");
    long long ttl = kt_int("PTTL uniquejobs:t:RUN:LOCKED");
    cr_assert(ttl > 0 && ttl <= 5000, "its TTL: %lld", ttl);
    /* B held elsewhere, E free, D held elsewhere with a limit of 2. */
    freeReplyObject(kt_cmd("HSET uniquejobs:b:RUN:LOCKED elsewhere {}"));
    freeReplyObject(kt_cmd("HSET uniquejobs:d:RUN:LOCKED elsewhere {}"));
    const char *keys2[] = { "uniquejobs:b:RUN:LOCKED", "uniquejobs:e:RUN:LOCKED",
                            "uniquejobs:d:RUN:LOCKED" };
    const char *groups2[] = { "jb", "{}", "je", "{}", "", "jd", "0", "while_executing", "2", "{}" };
    run_locks(r, keys2, 3, "ssl", groups2, 10, got, sizeof(got));
    cr_assert_str_eq(got, "101111", "refused, taken, taken");
    cr_assert_eq(kt_int("HLEN uniquejobs:b:RUN:LOCKED"), 1);
    cr_assert_eq(kt_int("HEXISTS uniquejobs:e:RUN:LOCKED je"), 1);
    cr_assert_eq(kt_int("HLEN uniquejobs:d:RUN:LOCKED"), 2);
    cr_assert_eq(kt_int("ZCARD uniquejobs:digests"), 5, "a, t, c, e and d; not b");
    capstan_redis_free(r);
}
