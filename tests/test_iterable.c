/* Iterable jobs (capstan/job.h: capstan_job_cursor, capstan_job_checkpoint)
 * end to end: examples/jobs.c's IterateJob walks steps and RPUSHes the
 * first item of each to KEY:steps, so every step's runs are counted. A TERM
 * or max_iteration_runtime stops a run between two steps and the job goes
 * back to its queue with its cursor in it-<jid>; the next run resumes there,
 * on capstan or on Ruby Sidekiq 7.3/8.0/8.1 (tests/ruby/iterable_jobs.rb);
 * cancellation from `capstan cancel` and from Sidekiq 8's own API; the
 * state as Sidekiq 8.1's Busy page shows it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "helpers.h"

TestSuite(iterable, .timeout = 120, .fini = kt_kill_children);

/* Pushes IterateJob [key, n, step, ms] with jid tag 1 to queue "default";
 * the jid into jid. */
static void push_iterate(const char *key, long n, long step, long ms, char jid[25])
{
    char args[256];
    snprintf(args, sizeof(args), "[\"%s\", %ld, %ld, %ld]", key, n, step, ms);
    kt_make_jid(jid, 1, 0);
    char *p = kt_payload("IterateJob", args, jid, "default");
    kt_push_all(kt_redis(), "default", &p, 1);
    free(p);
}

/* How many times each step (0 .. n/step - 1) ran, from key:steps, into
 * runs (calloc'd, nsteps entries); returns how many steps ran twice or more
 * beyond the first time (the repeats). */
static long count_steps(const char *key, long n, long step, long **runs)
{
    long nsteps = (n + step - 1) / step, repeats = 0;
    *runs = calloc((size_t)nsteps, sizeof(long));
    redisReply *r = kt_cmd("LRANGE %s:steps 0 -1", key);
    for (size_t i = 0; i < r->elements; i++) {
        long first = strtol(r->element[i]->str, NULL, 10);
        cr_assert(first % step == 0 && first / step < nsteps, "a step at %ld", first);
        if ((*runs)[first / step]++)
            repeats++;
    }
    freeReplyObject(r);
    return repeats;
}

/* Every step ran, none more than twice, and at most max_repeats steps ran
 * twice. */
static void check_steps(const char *key, long n, long step, long max_repeats)
{
    long *runs, repeats = count_steps(key, n, step, &runs), nsteps = (n + step - 1) / step;
    for (long k = 0; k < nsteps; k++)
        cr_assert(runs[k] >= 1 && runs[k] <= 2, "step %ld (items %ld..) ran %ld times", k, k * step,
                  runs[k]);
    fprintf(stderr, "[iterable] %ld steps of %ld items: %ld ran twice\n", nsteps, step, repeats);
    cr_assert_leq(repeats, max_repeats, "%ld steps ran twice", repeats);
    free(runs);
}

/* The "jid-executions" the job wrote when it completed. */
static long executions_done(const char *key, const char *jid)
{
    char *done = kt_str("LINDEX %s:done 0", key);
    cr_assert(done, "not done");
    size_t jl = strlen(jid);
    cr_assert(strncmp(done, jid, jl) == 0 && done[jl] == '-', "done: %s", done);
    long ex = strtol(done + jl + 1, NULL, 10);
    free(done);
    return ex;
}

/* The first target: 100,000 items in steps of 100, TERM in the
 * middle. The run stops between two steps, its cursor saved, and the job
 * is back in its queue, same jid, not in retry; the next process resumes
 * at the cursor: every item ran, at most one step twice. */
Test(iterable, term_mid_run_resumes_at_the_saved_cursor)
{
    enum { N = 100000, STEP = 100 };
    char jid[25], itkey[64];
    push_iterate("it", N, STEP, 4, jid);
    snprintf(itkey, sizeof(itkey), "it-%s", jid);
    pid_t a = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN it:steps") >= 300, 20), "%s", kt_capstan_log(a));
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 15), 0, "%s", kt_capstan_log(a));
    long ran = kt_int("LLEN it:steps");
    cr_assert_lt(ran, N / STEP, "the run was not interrupted");
    cr_assert(kt_log_has(a, "interrupted after 1 executions: back to queue:default"), "%s",
              kt_capstan_log(a));
    /* Back in its queue, not in retry; the state says where. */
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    char *back = kt_str("LINDEX queue:default 0");
    cr_assert(strstr(back, jid), "%s", back);
    free(back);
    cr_assert_eq(kt_int("ZCARD retry"), 0);
    cr_assert_eq(kt_int("HGET %s ex", itkey), 1);
    long cursor = kt_int("HGET %s c", itkey);
    cr_assert(cursor >= ran - 1 && cursor <= ran, "cursor %ld after %ld steps", cursor, ran);
    cr_assert_gt(kt_int("TTL %s", itkey), 29 * 86400, "Sidekiq's 30-day expiry");

    /* capstan stats shows the running iteration, as Sidekiq's Busy page. */
    char *conf = kt_write_conf("heartbeat_interval: 0.5\n"), *out = NULL;
    pid_t b = kt_capstan_start((const char *[]){ "-C", conf, "-c", "2", NULL });
    free(conf);
    char want[128];
    snprintf(want, sizeof(want), "\"jid\":\"%s\",\"class\":\"IterateJob\"", jid);
    cr_assert(KT_WAIT_UNTIL((free(out), out = NULL,
                             kt_capstan_run((const char *[]){ "stats", "--json", NULL }, &out) == 0
                                 && strstr(out, want)), 10),
              "%s", out);
    char cur[64];
    snprintf(cur, sizeof(cur), "\"executions\":1,\"cursor\":%ld", cursor);
    cr_assert(strstr(out, cur), "%s", out);
    free(out);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN it:done") == 1, 30), "%s", kt_capstan_log(b));
    cr_assert_eq(executions_done("it", jid), 2);
    check_steps("it", N, STEP, 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s", itkey) == 0, 5), "the state goes when the job completes");
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 15), 0, "%s", kt_capstan_log(b));
}

/* Five TERMs during one job: it completes, having run six times (ex 6),
 * each resumption one step at most repeated; it-<jid> is gone at the end. */
Test(iterable, five_terms_during_one_job_then_it_completes)
{
    enum { N = 4000, STEP = 100, TERMS = 5 };
    char jid[25];
    push_iterate("five", N, STEP, 20, jid);
    for (int t = 0; t < TERMS; t++) {
        long before = kt_int("LLEN five:steps");
        pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
        cr_assert(KT_WAIT_UNTIL(kt_int("LLEN five:steps") >= before + 3, 20), "%s", kt_capstan_log(p));
        cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
        cr_assert_eq(kt_int("LLEN five:done"), 0, "finished before TERM %d", t + 1);
        cr_assert_eq(kt_int("HGET it-%s ex", jid), t + 1);
    }
    pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN five:done") == 1, 30), "%s", kt_capstan_log(p));
    cr_assert_eq(executions_done("five", jid), TERMS + 1);
    check_steps("five", N, STEP, TERMS);
    cr_assert_eq(kt_int("EXISTS it-%s", jid), 0);
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

/* max_iteration_runtime (per class here): a run goes back to its queue
 * after a second, several times, and the job finishes, never failing. */
Test(iterable, max_iteration_runtime_requeues_until_it_finishes)
{
    enum { N = 3000, STEP = 100 };
    char jid[25];
    char *conf = kt_write_conf("classes:\n  IterateJob:\n    max_iteration_runtime: 1\n");
    push_iterate("mir", N, STEP, 100, jid); /* 30 steps of 100 ms */
    pid_t p = kt_capstan_start((const char *[]){ "-C", conf, "-c", "1", NULL });
    free(conf);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN mir:done") == 1, 30), "%s", kt_capstan_log(p));
    long ex = executions_done("mir", jid);
    fprintf(stderr, "[iterable] 3 s of steps, max_iteration_runtime 1: %ld executions\n", ex);
    cr_assert(ex >= 3 && ex <= 4, "%ld executions", ex);
    check_steps("mir", N, STEP, 0);
    cr_assert_eq(kt_int("GET stat:failed"), 0);
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
    cr_assert_eq(kt_log_count(p, "interrupted after"), ex - 1, "%s", kt_capstan_log(p));
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

/* A Redis that refuses the write of an interrupted run's cursor (here an
 * ACL that takes HSET away from the worker's user for a moment; maxmemory,
 * a restart or a killed connection do the same) had the job go back to its
 * queue without it, and the next run repeat every step since the last
 * save. The write is tried again until it lands. */
Test(iterable, an_interrupted_runs_cursor_is_saved_after_a_refused_write)
{
    enum { N = 500, STEP = 100 };
    char jid[25], user[64], url[256], *db = strrchr(kt_url(), '/') + 1;
    snprintf(user, sizeof(user), "iter%s", db);
    freeReplyObject(kt_cmd("ACL SETUSER %s on >pw ~* &* +@all", user));
    snprintf(url, sizeof(url), "redis://%s:pw@127.0.0.1:%s/%s", user, getenv("KT_REDIS_PORT"), db);
    char *conf = kt_write_conf("classes:\n  IterateJob:\n    max_iteration_runtime: 1\n");
    push_iterate("refused", N, STEP, 400, jid); /* 5 steps of 400 ms */
    pid_t p = kt_capstan_start((const char *[]){ "-C", conf, "-c", "1", "--redis-url", url, NULL });
    free(conf);
    /* Steps 0, 1 and 2 have run at 0, 0.4 and 0.8 s; the run stops at the
     * checkpoint of 1.2 s, its first write. */
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN refused:steps") == 3, 10), "%s", kt_capstan_log(p));
    freeReplyObject(kt_cmd("ACL SETUSER %s -hset", user));
    bool refused = KT_WAIT_UNTIL(kt_log_has(p, "its cursor was not saved"), 10);
    freeReplyObject(kt_cmd("ACL SETUSER %s +hset", user));
    cr_assert(refused, "%s", kt_capstan_log(p));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN refused:done") == 1, 20), "%s", kt_capstan_log(p));
    check_steps("refused", N, STEP, 0);
    cr_assert(kt_log_has(p, "its cursor is saved"), "%s", kt_capstan_log(p));
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
    freeReplyObject(kt_cmd("ACL DELUSER %s", user));
}

/* Waits until the job with state itkey stopped for its cancel: its state is
 * gone and no step ran for a while; returns the seconds it took. */
static double wait_cancelled(pid_t p, const char *key, const char *itkey, double t0)
{
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s", itkey) == 0, 10), "still running: %s", kt_capstan_log(p));
    double took = kt_now() - t0;
    long steps = kt_int("LLEN %s:steps", key);
    kt_sleep(0.3);
    cr_assert_eq(kt_int("LLEN %s:steps", key), steps, "steps after the cancel");
    cr_assert_eq(kt_int("LLEN %s:done", key), 0, "it did not walk to the end");
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead") + kt_int("LLEN queue:default"), 0,
                 "no retry, no requeue");
    cr_assert(kt_log_has(p, "cancelled after"), "%s", kt_capstan_log(p));
    return took;
}

/* `capstan cancel JID`: a job cancelled before it starts stops at its
 * first step; a running one at its next state flush (every 5 s, as
 * Sidekiq), without retry, its state cleaned up. */
Test(iterable, capstan_cancel_stops_a_queued_and_a_running_job)
{
    char jid[25], itkey[64], *out = NULL;
    push_iterate("cq", 1000, 100, 0, jid);
    cr_assert_eq(kt_capstan_run((const char *[]){ "cancel", jid, NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "cancelled at"), "%s", out);
    free(out);
    pid_t p = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    snprintf(itkey, sizeof(itkey), "it-%s", jid);
    wait_cancelled(p, "cq", itkey, kt_now());
    cr_assert_eq(kt_int("LLEN cq:steps"), 0, "a cancelled job runs no step");

    char jid2[25];
    push_iterate("cr", 100000, 100, 10, jid2);
    snprintf(itkey, sizeof(itkey), "it-%s", jid2);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN cr:steps") >= 5, 10), "%s", kt_capstan_log(p));
    double t0 = kt_now();
    out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "cancel", jid2, NULL }, &out), 0, "%s", out);
    free(out);
    double took = wait_cancelled(p, "cr", itkey, t0);
    fprintf(stderr, "[iterable] capstan cancel: a running job stopped %.2f s later\n", took);
    cr_assert_lt(took, 6.0);
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

/* Sidekiq 8.0 and 8.1's own Sidekiq::Client#cancel! on a running C iterable job. */
static void sidekiq_cancel_stops_a_running_c_job(const char *sidekiq)
{
    char jid[25], itkey[64], *out = NULL;
    push_iterate("rc", 100000, 100, 10, jid);
    snprintf(itkey, sizeof(itkey), "it-%s", jid);
    pid_t p = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN rc:steps") >= 5, 10), "%s", kt_capstan_log(p));
    double t0 = kt_now();
    cr_assert_eq(kt_ruby_v(sidekiq, "cancel.rb", (const char *[]){ jid, NULL }, &out), 0, "%s", out);
    /* The time it printed, on its last line (Sidekiq logs before it). */
    size_t len = strlen(out);
    while (len && out[len - 1] == '\n')
        out[--len] = '\0';
    const char *last = strrchr(out, '\n');
    cr_assert_gt(strtol(last ? last + 1 : out, NULL, 10), 1700000000, "%s", out);
    free(out);
    double took = wait_cancelled(p, "rc", itkey, t0);
    fprintf(stderr, "[iterable] Sidekiq %s cancel!: a running C job stopped %.2f s later\n", sidekiq, took);
    cr_assert_lt(took, 6.0);
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

Test(iterable, sidekiq_8_cancel_stops_a_running_c_job)
{
    kt_sidekiq_need("8.0.10");
    sidekiq_cancel_stops_a_running_c_job("8.0.10");
}

Test(iterable, sidekiq_8_1_cancel_stops_a_running_c_job)
{
    kt_sidekiq_need("8.1.7");
    sidekiq_cancel_stops_a_running_c_job("8.1.7");
}

/* One job between Ruby and capstan: Ruby Sidekiq's IterableJob runs it
 * first and is stopped (TERM); capstan resumes from Ruby's cursor and is
 * stopped; Ruby resumes from capstan's cursor and completes: three
 * executions, each hand-over repeating one step at most. */
static void ruby_and_capstan_hand_over(const char *sidekiq)
{
    enum { N = 6000, STEP = 100 };
    char jid[25];
    push_iterate("ho", N, STEP, 30, jid);
    pid_t rb = kt_sidekiq_start_v(sidekiq, "iterable_jobs.rb", "default");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ho:steps") >= 5, 30), "%s", kt_sidekiq_log());
    kt_capstan_stop(rb, SIGTERM, 15);
    long after_ruby = kt_int("LLEN ho:steps");
    cr_assert_eq(kt_int("HGET it-%s ex", jid), 1, "Ruby saved its state: %s", kt_sidekiq_log());
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 1, 5), "Ruby put it back: %s", kt_sidekiq_log());

    pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ho:steps") >= after_ruby + 5, 20), "%s", kt_capstan_log(p));
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
    cr_assert_eq(kt_int("HGET it-%s ex", jid), 2);
    cr_assert_eq(kt_int("LLEN ho:done"), 0);

    rb = kt_sidekiq_start_v(sidekiq, "iterable_jobs.rb", "default");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ho:done") == 1, 30), "%s", kt_sidekiq_log());
    cr_assert_eq(executions_done("ho", jid), 3);
    check_steps("ho", N, STEP, 2);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS it-%s", jid) == 0, 5));
    kt_capstan_stop(rb, SIGTERM, 15);
}

Test(iterable, ruby_7_3_and_capstan_resume_each_other)
{
    kt_sidekiq_need("7.3.10");
    ruby_and_capstan_hand_over("7.3.10");
}

Test(iterable, ruby_8_0_and_capstan_resume_each_other)
{
    kt_sidekiq_need("8.0.10");
    ruby_and_capstan_hand_over("8.0.10");
}

Test(iterable, ruby_8_1_and_capstan_resume_each_other)
{
    kt_sidekiq_need("8.1.7");
    ruby_and_capstan_hand_over("8.1.7");
}

/* The number after "name=" in s (-1 when absent). */
static double after(const char *s, const char *name)
{
    const char *at = s ? strstr(s, name) : NULL;
    return at ? strtod(at + strlen(name), NULL) : -1;
}

/* Sidekiq 8.1's Busy page shows, under a running iterable job's start
 * time, the state it reads from it-<jid> (IterableJobQuery: "c" as JSON,
 * "ex", "rt"): a C job running on capstan shows there as a Ruby one does,
 * once its first write is in (5 s into the run). capstan's "rt" counts
 * this run's time so far; Ruby's writes during a run hold the earlier
 * runs' only. The page's Queues line reads capstan's "capsules". */
Test(iterable, sidekiq_8_1_busy_page_shows_a_c_jobs_iteration)
{
    kt_sidekiq_need("8.1.7");
    char jid[25], want[128], *out = NULL;
    push_iterate("bz", 100000, 100, 30, jid); /* 30 s: it runs on while Ruby reads */
    pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS it-%s", jid) == 1, 30), "no state written: %s", kt_capstan_log(p));
    cr_assert_eq(kt_ruby_v("8.1.7", "busy_iteration.rb", (const char *[]){ jid, NULL }, &out), 0, "%s", out);
    fprintf(stderr, "[iterable] Sidekiq 8.1's Busy page:\n%s", out);
    snprintf(want, sizeof(want), "work queue=default class=IterateJob jid=%s\n", jid);
    cr_assert(strstr(out, want), "%s", out);
    /* The state as 8.1's API reads it, and as the page prints it (read a
     * moment later: the job may have written again in between). */
    const char *page = strstr(out, "\npage ");
    double cursor = after(out, "state exec=1 cursor="), rt = after(out, " rt="),
           page_cursor = after(page, "<small>cursor="), page_rt = after(page, "data-nwp=\"3\">");
    cr_assert(cursor > 0 && cursor < 1000, "the cursor, a step's index: %s", out);
    cr_assert(rt >= 4.5 && rt < 120, "rt, the seconds iterated so far: %s", out);
    cr_assert(page && strstr(page, "; exec=1; rt=<span data-nwp=\"3\">") && strstr(page, "</span>s</small>"),
              "%s", out);
    cr_assert(page_cursor >= cursor && page_cursor < 1000 && page_rt >= rt - 0.001, "%s", out);
    cr_assert_geq(kt_int("HGET it-%s c", jid), (long)page_cursor, "the state in Redis moved on only");
    cr_assert(strstr(out, "\nqueues default\n"), "the Busy page's Queues of capstan: %s", out);
    free(out);
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

/* A failed C iterable job keeps its state, and Sidekiq 8.1's Retries page
 * shows it beside the error: WalkJob [-100] fails at item 13, its cursor. */
Test(iterable, sidekiq_8_1_retries_page_shows_a_failed_c_jobs_iteration)
{
    kt_sidekiq_need("8.1.7");
    char jid[25], *out = NULL;
    kt_make_jid(jid, 2, 0);
    char *pl = kt_payload("WalkJob", "[-100]", jid, "default");
    kt_push_all(kt_redis(), "default", &pl, 1);
    free(pl);
    pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 20), "%s", kt_capstan_log(p));
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
    cr_assert_eq(kt_ruby_v("8.1.7", "busy_iteration.rb", (const char *[]){ "--retries", jid, NULL }, &out), 0,
                 "%s", out);
    fprintf(stderr, "[iterable] Sidekiq 8.1's Retries page:\n%s", out);
    double rt = after(out, "state exec=1 cursor=13 rt=");
    cr_assert(rt >= 0 && rt < 60, "%s", out);
    cr_assert(strstr(out, "page <div><small>cursor=13; exec=1; rt=<span data-nwp=\"3\">"), "%s", out);
    free(out);
}

/* An interrupted run goes back in line still unique: its until-lock is
 * taken again (a duplicate push is refused while it waits), its runtime
 * lock goes; the run that completes releases the until-lock. */
Test(iterable, an_interrupted_job_keeps_its_until_lock_in_the_queue)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-q", "default", "IterateJob", "[\"ul\", 3000, 100, 50]",
                                                  "--lock", "until_and_while_executing", NULL }, &out),
                 0, "%s", out);
    free(out);
    char *payload = kt_str("LINDEX queue:default 0");
    const char *d = strstr(payload, "\"lock_digest\":\"");
    cr_assert(d, "%s", payload);
    d += strlen("\"lock_digest\":\"");
    char digest[128];
    snprintf(digest, sizeof(digest), "%.*s", (int)strcspn(d, "\""), d);
    free(payload);
    pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ul:steps") >= 3, 10), "%s", kt_capstan_log(p));
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
    cr_assert_eq(kt_int("LLEN queue:default"), 1, "back in its queue");
    cr_assert_eq(kt_int("EXISTS %s:LOCKED", digest), 1, "its until-lock held again while it waits");
    cr_assert_eq(kt_int("EXISTS %s:RUN:LOCKED", digest), 0, "its runtime lock gone");
    out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "-q", "default", "IterateJob", "[\"ul\", 3000, 100, 50]",
                                                  "--lock", "until_and_while_executing", NULL }, &out),
                 3, "a duplicate is refused: %s", out);
    free(out);
    p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ul:done") == 1, 20), "%s", kt_capstan_log(p));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s:LOCKED", digest) == 0, 5), "released when it completed");
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

/* Sidekiq's largest execution count (a Ruby job retried for ever, or a
 * hand-edited hash): the run counts itself without overflowing and walks
 * on from the cursor. */
Test(iterable, the_largest_execution_count_runs_on_from_its_cursor)
{
    enum { N = 500, STEP = 100 };
    char jid[25];
    kt_make_jid(jid, 1, 0);
    freeReplyObject(kt_cmd("HSET it-%s ex 9223372036854775807 c 2", jid));
    push_iterate("big", N, STEP, 0, jid);
    pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN big:done") == 1, 20), "%s", kt_capstan_log(p));
    cr_assert_eq(executions_done("big", jid), 9223372036854775807L);
    cr_assert_eq(kt_int("LLEN big:steps"), 3, "steps 2, 3 and 4");
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

/* Runs IterateJob [key, 500, 100] whose it-<jid> the caller's set_state
 * wrote: the job fails into the retry set with
 * Capstan::IterationStateError, whose message names the key and has want;
 * no step runs (none is redone from step 0) and the state is left as it
 * was for whoever looks into it. */
static void bad_state(const char *key, void (*set_state)(const char *itkey), const char *want)
{
    char jid[25], itkey[64];
    kt_make_jid(jid, 1, 0);
    snprintf(itkey, sizeof(itkey), "it-%s", jid);
    set_state(itkey);
    redisReply *before = kt_cmd("DUMP %s", itkey);
    push_iterate(key, 500, 100, 0, jid);
    pid_t p = kt_capstan_start((const char *[]){ "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1 || kt_int("LLEN %s:done", key) == 1, 20), "%s",
              kt_capstan_log(p));
    long redone = kt_int("LLEN %s:steps", key);
    cr_assert_eq(redone, 0, "%ld steps redone from step 0: %s", redone, kt_capstan_log(p));
    cr_assert_eq(kt_int("ZCARD retry"), 1, "%s", kt_capstan_log(p));
    redisReply *r = kt_cmd("ZRANGE retry 0 0");
    const char *entry = r->element[0]->str;
    json_t *j = json_loads(entry, 0, NULL);
    cr_assert(j, "%s", entry);
    const char *cls = json_string_value(json_object_get(j, "error_class")),
               *msg = json_string_value(json_object_get(j, "error_message"));
    cr_assert(cls && strcmp(cls, "Capstan::IterationStateError") == 0, "%s", entry);
    cr_assert(msg && strstr(msg, itkey) && strstr(msg, want), "%s", entry);
    fprintf(stderr, "[iterable] %s: %s\n", cls, msg);
    json_decref(j);
    freeReplyObject(r);
    redisReply *after = kt_cmd("DUMP %s", itkey);
    cr_assert(after->type == REDIS_REPLY_STRING && after->len == before->len
                  && memcmp(after->str, before->str, after->len) == 0, "the state was overwritten");
    freeReplyObject(before);
    freeReplyObject(after);
    cr_assert_eq(kt_capstan_stop(p, SIGTERM, 15), 0, "%s", kt_capstan_log(p));
}

static void garbage(const char *itkey) { freeReplyObject(kt_cmd("HSET %s ex 3 c {garbage", itkey)); }
static void huge(const char *itkey) { freeReplyObject(kt_cmd("HSET %s ex 3 c 1e400", itkey)); }
static void surrogate(const char *itkey) { freeReplyObject(kt_cmd("HSET %s ex 3 c \"\\ud800\"", itkey)); }
static void deep(const char *itkey)
{
    enum { DEPTH = 100000 };
    char *c = malloc(2 * DEPTH + 1);
    memset(c, '[', DEPTH);
    memset(c + DEPTH, ']', DEPTH);
    c[2 * DEPTH] = '\0';
    freeReplyObject(kt_cmd("HSET %s ex 3 c %s", itkey, c));
    free(c);
}
static void a_list(const char *itkey) { freeReplyObject(kt_cmd("RPUSH %s 3", itkey)); }

Test(iterable, a_cursor_that_is_not_json_fails_the_job)
{
    bad_state("garbage", garbage, "\"c\"");
}

Test(iterable, a_cursor_out_of_double_range_fails_the_job)
{
    bad_state("huge", huge, "\"c\"");
}

Test(iterable, a_cursor_with_a_lone_surrogate_fails_the_job)
{
    bad_state("surrogate", surrogate, "\"c\"");
}

Test(iterable, a_cursor_nested_100000_deep_fails_the_job)
{
    bad_state("deep", deep, "\"c\"");
}

Test(iterable, a_state_key_of_another_type_fails_the_job)
{
    bad_state("list", a_list, "not a hash");
}
