/* Rate limiters: the C API against a real redis-server, and the per-class
 * `limit:` option with capstan processes sharing one limit. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "helpers.h"
#include "capstan/client.h"
#include "capstan/limiter.h"
#include "capstan/runtime.h"

TestSuite(limiter, .init = NULL, .fini = kt_kill_children);

static capstan_limiter_t *mk(capstan_limit_type_t t, const char *name, long n, double s)
{
    char err[CAPSTAN_ERRLEN] = "";
    capstan_limiter_t *l = capstan_limiter_new(t, name, n, s, err);
    cr_assert(l, "%s", err);
    return l;
}

Test(limiter, concurrent_slots_are_owned_leases)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_CONCURRENT, "api", 2, 0.5);
    capstan_limit_token_t a, b, c;
    char err[CAPSTAN_ERRLEN];
    double in = 0;
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &a, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &b, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &c, &in, err), CAPSTAN_EDENIED);
    cr_assert(in > 0 && in <= 0.5, "%f", in);
    cr_assert_eq(kt_int("ZCARD limiter:api:held"), 2);
    /* Only the holder releases its slot. */
    capstan_limit_token_t other;
    strcpy(other.id, "someone-else");
    cr_assert_eq(capstan_limiter_release(l, r, &other, err), CAPSTAN_ENOTFOUND);
    cr_assert_eq(capstan_limiter_release(l, r, &a, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &c, NULL, err), 0, "%s", err);
    /* A waiter gets the slot as soon as the holders' leases lapse. */
    double t0 = kt_now();
    cr_assert_eq(capstan_limiter_acquire(l, r, 2, &a, NULL, err), 0, "%s", err);
    double waited = kt_now() - t0;
    cr_assert(waited > 0.3 && waited < 1.0, "%f", waited);
    /* b's lease lapsed: it holds nothing any more. */
    cr_assert_eq(capstan_limiter_extend(l, r, &b, err), CAPSTAN_ENOTFOUND);
    cr_assert_eq(capstan_limiter_extend(l, r, &a, err), 0, "%s", err);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

static int bump(void *ud)
{
    (*(int *)ud)++;
    return 7;
}

/* Each type's name is the word YAML's limit: type takes back, and the one
 * its limiter records in limiter:NAME:meta. */
Test(limiter, type_names_read_back_and_name_the_meta)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    for (int t = CAPSTAN_LIMIT_CONCURRENT; t <= CAPSTAN_LIMIT_POINTS; t++) {
        const char *name = capstan_limit_type_name((capstan_limit_type_t)t);
        capstan_limit_type_t back = 0;
        cr_assert_eq(capstan_limit_type_parse(name, &back), 0, "%s", name);
        cr_assert_eq((int)back, t, "%s", name);
        char lname[32];
        snprintf(lname, sizeof(lname), "named%d", t);
        capstan_limiter_t *l = mk((capstan_limit_type_t)t, lname, 3, 1);
        capstan_limit_token_t tok;
        cr_assert_eq(capstan_limiter_acquire(l, r, 0, &tok, NULL, err), 0, "%s: %s", name, err);
        char *meta = kt_str("GET limiter:%s:meta", lname);
        cr_assert(meta && !strncmp(meta, name, strlen(name)) && meta[strlen(name)] == ' ', "%s: %s", name, meta);
        free(meta);
        cr_assert_eq(capstan_limiter_release(l, r, &tok, err), 0, "%s: %s", name, err);
        capstan_limiter_free(l);
    }
    cr_assert_str_eq(capstan_limit_type_name(0), "unknown");
    capstan_limit_type_t out = 0;
    cr_assert_eq(capstan_limit_type_parse("throttle", &out), CAPSTAN_EINVAL);
    capstan_redis_free(r);
}

Test(limiter, within_runs_under_the_limit_and_releases)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_CONCURRENT, "mutex", 1, 0);
    char err[CAPSTAN_ERRLEN];
    int n = 0;
    cr_assert_eq(capstan_limiter_within(l, r, 0, bump, &n, err), 7);
    cr_assert_eq(capstan_limiter_within(l, r, 0, bump, &n, err), 7);
    cr_assert_eq(n, 2);
    cr_assert_eq(kt_int("ZCARD limiter:mutex:held"), 0);
    capstan_limit_token_t t;
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0);
    cr_assert_eq(capstan_limiter_within(l, r, 0.1, bump, &n, err), CAPSTAN_EDENIED);
    cr_assert_eq(n, 2);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

Test(limiter, a_name_keeps_its_type_and_parameters)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_limit_token_t t;
    capstan_limiter_t *a = mk(CAPSTAN_LIMIT_CONCURRENT, "stripe", 5, 0);
    capstan_limiter_t *b = mk(CAPSTAN_LIMIT_WINDOW, "stripe", 5, 1);
    capstan_limiter_t *c = mk(CAPSTAN_LIMIT_CONCURRENT, "stripe", 6, 0);
    cr_assert_eq(capstan_limiter_acquire(a, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(b, r, 0, &t, NULL, err), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, "limiter stripe is in use as \"concurrent size=5\""), "%s", err);
    cr_assert_eq(capstan_limiter_acquire(c, r, 1, &t, NULL, err), CAPSTAN_ECONFIG);
    cr_assert_eq(kt_int("ZCARD limiter:stripe:held"), 1);
    capstan_limiter_free(a);
    capstan_limiter_free(b);
    capstan_limiter_free(c);
    /* Bad parameters never reach Redis. */
    cr_assert_null(capstan_limiter_new(CAPSTAN_LIMIT_CONCURRENT, "x", 0, 0, err));
    cr_assert(strstr(err, "size must be >= 1"), "%s", err);
    cr_assert_null(capstan_limiter_new(CAPSTAN_LIMIT_WINDOW, "x", 3, -1, err));
    cr_assert(strstr(err, "interval"), "%s", err);
    cr_assert_null(capstan_limiter_new((capstan_limit_type_t)99, "x", 3, 1, err));
    capstan_redis_free(r);
}

/* Waits for the next calendar second to begin plus a margin, so a test of
 * one window does not straddle two. */
static void next_second(void)
{
    double now = kt_wall();
    kt_sleep((double)(long)now + 1.05 - now);
}

/* Waits, if need be, for a calendar minute with 10 s or more left, so that
 * a window of a minute spent now stays spent through the test: a job the
 * window refused is rescheduled for its end, which must not come first. */
static void minute_room(void)
{
    double now = kt_wall(), into = now - (double)((long long)now / 60 * 60);
    if (into >= 50)
        kt_sleep(60 - into + 0.05);
}

Test(limiter, window_counts_per_calendar_window_and_says_when_it_reopens)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_WINDOW, "search", 3, 1);
    char err[CAPSTAN_ERRLEN];
    capstan_limit_token_t t;
    double in = 0;
    next_second();
    for (int i = 0; i < 3; i++)
        cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, &in, err), CAPSTAN_EDENIED);
    cr_assert(in > 0.5 && in <= 1.0, "%f", in);
    /* Waiting is exact: the 4th gets in right after the second turns. */
    cr_assert_eq(capstan_limiter_acquire(l, r, 2, &t, NULL, err), 0, "%s", err);
    double now = kt_wall(), frac = now - (double)(long)now;
    cr_assert(frac < 0.3, "%f", frac);
    cr_assert_eq(capstan_limiter_release(l, r, &t, err), 0);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

Test(limiter, bucket_refills_at_the_start_of_each_interval)
{
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_BUCKET, "tokens", 2, 1);
    char err[CAPSTAN_ERRLEN];
    capstan_limit_token_t t;
    next_second();
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), CAPSTAN_EDENIED);
    cr_assert_eq(kt_int("HGET limiter:tokens:bucket tokens"), 0);
    cr_assert_eq(capstan_limiter_acquire(l, r, 2, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(kt_int("HGET limiter:tokens:bucket tokens"), 1);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

/* ---- the `limit:` class option, with capstan processes -------------------- */

/* Pushes n LimitJob [key, ms] to "default". */
static void push_limit_jobs(unsigned tag, const char *key, long ms, size_t n)
{
    char args[64];
    snprintf(args, sizeof(args), "[\"%s\",%ld]", key, ms);
    kt_push_jobs("LimitJob", args, tag, n);
}

static char *limit_yml(const char *name, const char *limit)
{
    char *body;
    cr_assert(asprintf(&body, "poll_interval_average: 0.3\nclasses:\n  LimitJob:\n"
                              "    limit:\n%s", limit) > 0);
    char *y = kt_write_file(name, body);
    free(body);
    return y;
}

/* The start times (ms, Redis clock) the LimitJobs of key recorded, in the
 * order they started; *n their number. */
static long long *job_starts(const char *key, size_t *n)
{
    redisReply *rep = kt_cmd("LRANGE %s:starts 0 -1", key);
    long long *t = calloc(rep->elements + 1, sizeof(*t));
    for (size_t i = 0; i < rep->elements; i++)
        t[i] = atoll(rep->element[i]->str);
    *n = rep->elements;
    freeReplyObject(rep);
    return t;
}

/* A job records its start (Redis's clock) one round trip or so after the
 * limiter let it in, longer when the machine is busy: a start at t was
 * acquired within [t - START_SLACK_MS, t]. */
#define START_SLACK_MS 100

/* n starts t (ascending, ms) under a limit of per_sec a calendar second:
 * the starts t_i..t_j were acquired in the seconds from that of
 * t_i - slack to that of t_j, so no more than per_sec times as many. */
static void check_calendar(const long long *t, size_t n, long long per_sec)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i; j < n; j++) {
            long long secs = t[j] / 1000 - (t[i] - START_SLACK_MS) / 1000 + 1;
            cr_assert_leq((long long)(j - i + 1), per_sec * secs, "%zu starts in %lld..%lld ms",
                          j - i + 1, t[i], t[j]);
        }
}

/* Two processes of 10 processors share a concurrent limit of 3: never more
 * than 3 jobs run at once, every job runs once, none fails. */
Test(limiter, concurrent_limit_is_fleet_wide)
{
    char *y = limit_yml("conc.yml", "      type: concurrent\n      name: stripe\n      size: 3\n"
                                    "      wait_timeout: 5\n");
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", NULL });
    pid_t b = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", NULL });
    push_limit_jobs(1, "lc", 50, 200);
    /* 200 x 50 ms through 3 slots is 3.4 s of work at best. */
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD lc:jids") == 200, 40), "%s", kt_capstan_log(a));
    cr_assert(KT_WAIT_UNTIL(kt_int("GET lc:running") == 0, 5));
    cr_assert_eq(kt_int("LLEN lc:starts"), 200, "a job ran twice");
    cr_assert_eq(kt_int("GET lc:max"), 3);
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
    cr_assert_eq(kt_int("ZCARD limiter:stripe:held"), 0, "every slot was given back");
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 10), 0);
    free(y);
}

/* A window of 10 per second over three processes, with no wait in the
 * processor: no calendar second sees more than 10 starts; the others wait
 * in the schedule set and all run. A reschedule is logged at debug only. */
Test(limiter, window_limit_reschedules_and_runs_everything)
{
    char *y = limit_yml("win.yml", "      type: window\n      name: search\n      count: 10\n"
                                   "      interval: second\n      wait_timeout: 0\n");
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", "-v", NULL });
    pid_t b = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", NULL });
    pid_t c = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", NULL });
    push_limit_jobs(2, "lw", 10, 100);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD schedule") > 0, 5), "no job was rescheduled");
    /* 100 at 10 a second: 10 s at best. */
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD lw:jids") == 100, 40), "%s", kt_capstan_log(a));
    cr_assert_eq(kt_int("LLEN lw:starts"), 100, "a job ran twice");
    size_t got;
    long long *t = job_starts("lw", &got);
    check_calendar(t, got, 10);
    free(t);
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead") + kt_int("ZCARD schedule"), 0);
    cr_assert(kt_log_has(a, "limiter search is over its limit; rescheduled in"), "%s",
              kt_capstan_log(a));
    cr_assert(!kt_log_has(b, "rescheduled in") && !kt_log_has(c, "rescheduled in"),
              "a reschedule was logged above debug");
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 10), 0);
    cr_assert_eq(kt_capstan_stop(c, SIGTERM, 10), 0);
    free(y);
}

/* A running job keeps its slot past its lease (the lease is extended); a
 * process killed with -9 gives its slots back once their leases lapse. */
Test(limiter, killed_holder_frees_its_slots_when_the_lease_lapses)
{
    char *y = limit_yml("kill.yml", "      type: concurrent\n      name: gpu\n      size: 2\n"
                                    "      lock_timeout: 1.5\n");
    pid_t a = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "2", NULL });
    push_limit_jobs(3, "lk", 20000, 2);
    cr_assert(KT_WAIT_UNTIL(kt_int("GET lk:running") == 2, 10), "%s", kt_capstan_log(a));
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_CONCURRENT, "gpu", 2, 1.5);
    capstan_limit_token_t t;
    char err[CAPSTAN_ERRLEN];
    /* Twice the lease: still held while the jobs run. */
    cr_assert_eq(capstan_limiter_acquire(l, r, 3, &t, NULL, err), CAPSTAN_EDENIED, "%s", err);
    cr_assert_eq(kt_capstan_stop(a, SIGKILL, 5), 128 + SIGKILL);
    double t0 = kt_now();
    cr_assert_eq(capstan_limiter_acquire(l, r, 2.5, &t, NULL, err), 0, "%s", err);
    cr_assert_lt(kt_now() - t0, 2.5);
    capstan_limiter_free(l);
    capstan_redis_free(r);
    free(y);
}

/* Past max_limiter_reschedules the job fails into the retry set, its
 * reschedule count in the payload. The limit is a window spent for a
 * minute (the test's), so the job comes back when the test says. */
Test(limiter, too_many_reschedules_go_through_retry)
{
    char *y = kt_write_file("max.yml", "poll_interval_average: 0.3\nclasses:\n"
                                      "  LimitJob:\n    max_limiter_reschedules: 1\n"
                                      "    limit: { type: window, name: one, count: 1, "
                                      "interval: minute }\n");
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_WINDOW, "one", 1, 60);
    capstan_limit_token_t t;
    char err[CAPSTAN_ERRLEN];
    minute_room();
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    push_limit_jobs(4, "lm", 10, 1);
    /* Its first refusal reschedules it (the window's wait is longer than
     * wait_timeout, so it does not wait); the test makes it due now. */
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD schedule") == 1, 10), "%s", kt_capstan_log(a));
    redisReply *sr = kt_cmd("ZRANGE schedule 0 0");
    char *first = strdup(sr->element[0]->str);
    freeReplyObject(sr);
    cr_assert(strstr(first, "\"limiter_reschedules\":1"), "%s", first);
    freeReplyObject(kt_cmd("ZADD schedule 0 %s", first));
    free(first);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 10), "%s", kt_capstan_log(a));
    redisReply *rr = kt_cmd("ZRANGE retry 0 0");
    cr_assert_eq(rr->elements, 1);
    char *job = strdup(rr->element[0]->str);
    freeReplyObject(rr);
    cr_assert(strstr(job, "\"limiter_reschedules\":1"), "%s", job);
    cr_assert(strstr(job, "Capstan::OverLimit"), "%s", job);
    cr_assert_eq(kt_int("SCARD lm:jids"), 0);
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    free(job);
    capstan_limiter_free(l);
    capstan_redis_free(r);
    free(y);
}

Test(limiter, bad_limit_configuration_fails_at_start)
{
    static const char *const cases[][2] = {
        { "      type: throttle\n      size: 3\n", "classes.LimitJob.limit.type: unknown limiter type throttle" },
        { "      type: concurrent\n      size: 0\n", "classes.LimitJob.limit.size: must be an integer >= 1" },
        { "      type: window\n      count: 5\n      interval: -1\n", "classes.LimitJob.limit.interval: must be" },
        { "      type: bucket\n      count: 5\n", "classes.LimitJob.limit.interval: is required for bucket" },
        { "      size: 5\n", "classes.LimitJob.limit.type: is required" },
        { "      type: window\n      count: 5\n      interval: 1\n      cost: 2\n",
          "classes.LimitJob.limit.cost: is for points limiters only" },
        { "      type: points\n      points: 10\n      interval: 1\n      cost: 11\n",
          "classes.LimitJob.limit.cost: must be between 1 and the limit's 10 points" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *y = limit_yml("bad.yml", cases[i][0]), *out = NULL;
        cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-C", y, NULL }, &out), 78, "%s", out);
        cr_assert(strstr(out, cases[i][1]), "%s", out);
        cr_assert(strstr(out, "bad.yml:"), "%s", out);
        free(out);
        free(y);
    }
}

Test(limiter, sliding_counts_any_interval_and_leaky_drains_evenly)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_limit_token_t t;
    double in = 0;
    capstan_limiter_t *s = mk(CAPSTAN_LIMIT_SLIDING, "slide", 3, 0.6);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(capstan_limiter_acquire(s, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(s, r, 0, &t, &in, err), CAPSTAN_EDENIED);
    cr_assert(in > 0.4 && in <= 0.6, "%f", in);
    double t0 = kt_now();
    cr_assert_eq(capstan_limiter_acquire(s, r, 1, &t, NULL, err), 0, "%s", err);
    cr_assert(kt_now() - t0 > 0.4, "%f", kt_now() - t0);
    /* The first entry left the window; the others too only if they were
     * taken in the same millisecond, which a loaded machine does not do. */
    long long in_window = kt_int("ZCARD limiter:slide:sliding");
    cr_assert(in_window >= 1 && in_window <= 3, "%lld", in_window);
    capstan_limiter_free(s);
    /* 4 per second: a burst of 4, then one every 0.25 s. */
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_LEAKY, "drip", 4, 1);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, &in, err), CAPSTAN_EDENIED);
    cr_assert(in > 0.15 && in <= 0.25, "%f", in);
    t0 = kt_now();
    for (int i = 0; i < 2; i++)
        cr_assert_eq(capstan_limiter_acquire(l, r, 1, &t, NULL, err), 0, "%s", err);
    double took = kt_now() - t0;
    cr_assert(took > 0.4 && took < 1.0, "%f", took);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

Test(limiter, points_spend_a_cost_from_a_restoring_budget)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_limit_token_t t;
    double in = 0;
    /* 100 points, restored at 100 per second. */
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_POINTS, "graphql", 100, 1);
    cr_assert_eq(capstan_limiter_acquire_points(l, r, 70, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire_points(l, r, 50, 0, &t, &in, err), CAPSTAN_EDENIED);
    cr_assert(in > 0.1 && in <= 0.2, "%f", in);
    cr_assert_eq(capstan_limiter_acquire_points(l, r, 20, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire_points(l, r, 101, 5, &t, NULL, err), CAPSTAN_EINVAL);
    cr_assert(strstr(err, "does not fit"), "%s", err);
    double t0 = kt_now();
    cr_assert_eq(capstan_limiter_acquire_points(l, r, 60, 2, &t, NULL, err), 0, "%s", err);
    double took = kt_now() - t0;
    cr_assert(took > 0.4 && took < 1.2, "%f", took);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

/* A class whose limit clashes with the name's recorded type fails its job
 * (retried as usual) and leaves the limiter as it was. */
Test(limiter, class_limit_clashing_with_the_name_fails_the_job)
{
    kt_int("SET limiter:shared:meta %s", "window count=5 interval_ms=1000");
    char *y = limit_yml("clash.yml", "      type: concurrent\n      name: shared\n      size: 3\n");
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    push_limit_jobs(5, "lx", 10, 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 10), "%s", kt_capstan_log(a));
    redisReply *rr = kt_cmd("ZRANGE retry 0 0");
    cr_assert_eq(rr->elements, 1);
    cr_assert(strstr(rr->element[0]->str, "Capstan::LimiterConfigError"), "%s", rr->element[0]->str);
    cr_assert(strstr(rr->element[0]->str, "limiter shared is in use as"), "%s", rr->element[0]->str);
    freeReplyObject(rr);
    cr_assert_eq(kt_int("SCARD lx:jids"), 0);
    cr_assert_eq(kt_int("EXISTS limiter:shared:held"), 0);
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    free(y);
}

/* A payload's limiter_cost that is not a whole number of points fails its
 * job with a clear error (spending another cost could break the limit);
 * a valid one runs, and so does null (the class's cost). */
Test(limiter, a_bad_cost_in_the_payload_fails_the_job)
{
    char *y = limit_yml("cost.yml", "      type: points\n      name: pts\n      points: 10\n"
                                    "      interval: 1\n");
    /* null is no cost given: the class's applies. */
    const char *costs[] = { "\"lots\"", "2.5", "-1", "3", "null" };
    for (unsigned i = 0; i < 5; i++) {
        char jid[25], *raw = NULL;
        kt_make_jid(jid, 12, i);
        char *p = kt_payload("LimitJob", "[\"lc\",1]", jid, "default");
        p[strlen(p) - 1] = '\0';
        cr_assert(asprintf(&raw, "%s,\"" CAPSTAN_LIMIT_COST_FIELD "\":%s}", p, costs[i]) > 0);
        kt_push_all(kt_redis(), "default", &raw, 1);
        free(raw);
        free(p);
    }
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 3 && kt_int("SCARD lc:jids") == 2, 10), "%s",
              kt_capstan_log(a));
    redisReply *rr = kt_cmd("ZRANGE retry 0 -1");
    for (size_t i = 0; i < rr->elements; i++)
        cr_assert(strstr(rr->element[i]->str, "limiter pts: limiter_cost must be an integer >= 1"),
                  "%s", rr->element[i]->str);
    freeReplyObject(rr);
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    free(y);
}

/* `capstan limits` shows what a user needs to see why a job waits: every
 * limiter's type and parameters, and for one its holders and their lease
 * left, how full its window is, its tokens left and the wait for a slot. */
Test(limiter, capstan_limits_lists_and_shows_each_limiter)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN], *out = NULL;
    capstan_limit_token_t t1, t2;
    capstan_limiter_t *c = mk(CAPSTAN_LIMIT_CONCURRENT, "stripe", 2, 60);
    capstan_limiter_t *w = mk(CAPSTAN_LIMIT_WINDOW, "search", 3, 3600);
    capstan_limiter_t *b = mk(CAPSTAN_LIMIT_BUCKET, "api", 5, 3600);
    cr_assert_eq(capstan_limiter_acquire(c, r, 0, &t1, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(c, r, 0, &t2, NULL, err), 0, "%s", err);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(capstan_limiter_acquire(w, r, 0, &t1, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(b, r, 0, &t1, NULL, err), 0, "%s", err);

    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "api\tbucket\tcount=5\tinterval=3600s\n"), "%s", out);
    cr_assert(strstr(out, "search\twindow\tcount=3\tinterval=3600s\n"), "%s", out);
    cr_assert(strstr(out, "stripe\tconcurrent\tsize=2\n"), "%s", out);
    cr_assert(strstr(out, "api") < strstr(out, "search"), "sorted by name: %s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", "list", "--json", NULL }, &out), 0);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(json_is_array(j) && json_array_size(j) == 3, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(j, 2), "type")),
                     "concurrent");
    json_decref(j);
    free(out);

    /* Full: both holders with the lease they have left, and the wait. */
    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", "info", "stripe", "--json", NULL }, &out),
                 0, "%s", out);
    j = json_loads(out, 0, NULL);
    cr_assert(j, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(j, "used")), 2, "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(j, "left")), 0, "%s", out);
    json_t *h = json_object_get(j, "holders");
    cr_assert_eq(json_array_size(h), 2, "%s", out);
    int mine = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(h, i);
        mine += strcmp(json_string_value(json_object_get(e, "id")), t2.id) == 0;
        double left = json_real_value(json_object_get(e, "lease_left"));
        cr_assert(left > 55 && left <= 60, "%s", out);
    }
    cr_assert_eq(mine, 1, "%s", out);
    double wait = json_real_value(json_object_get(j, "wait_seconds"));
    cr_assert(wait > 55 && wait <= 60, "%s", out);
    json_decref(j);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", "info", "search", NULL }, &out), 0);
    cr_assert(strstr(out, "search\twindow\tcount=3\tinterval=3600s\tused=3\tleft=0\twait="), "%s",
              out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", "info", "api", "--json", NULL }, &out), 0);
    j = json_loads(out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "left")), 4, "%s", out);
    cr_assert_float_eq(json_real_value(json_object_get(j, "wait_seconds")), 0, 1e-9, "%s", out);
    json_decref(j);
    free(out);

    /* A release shows at once. */
    cr_assert_eq(capstan_limiter_release(c, r, &t2, err), 0, "%s", err);
    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", "info", "stripe", NULL }, &out), 0);
    cr_assert(strstr(out, "stripe\tconcurrent\tsize=2\tused=1\tleft=1\twait=0.000s\n"), "%s", out);
    cr_assert_null(strstr(out, t2.id), "%s", out);
    free(out);

    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", "info", "nope", NULL }, &out), 1);
    cr_assert(strstr(out, "no limiter named nope"), "%s", out);
    free(out);
    capstan_limiter_free(c);
    capstan_limiter_free(w);
    capstan_limiter_free(b);
    capstan_redis_free(r);
}

/* ---- long-run rates, measured by the jobs themselves ------------------- */

/* Runs n LimitJobs of 10 ms under key on two processes of 10 processors,
 * the class limited by limit (which waits in the processor rather than
 * rescheduling, so the limiter alone sets the pace), and returns their
 * start times. */
static long long *run_limited(const char *file, const char *limit, unsigned tag,
                              const char *key, size_t n)
{
    char *y = limit_yml(file, limit);
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", NULL });
    pid_t b = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", NULL });
    push_limit_jobs(tag, key, 10, n);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD %s:jids", key) == (long long)n, 30), "%s",
              kt_capstan_log(a));
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead") + kt_int("ZCARD schedule"), 0);
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 10), 0);
    free(y);
    size_t got;
    long long *t = job_starts(key, &got);
    cr_assert_eq(got, n, "a job ran twice");
    return t;
}

/* A leaky or points limiter: a budget of burst jobs, restored evenly at
 * per_s jobs a second. In any span [t_i, t_j] no more jobs start than the
 * budget allows (burst + per_s * span, the span widened by the slack), and
 * after the first burst the rate is within 10% of per_s. */
static void check_restoring(const long long *t, size_t n, size_t burst, double per_s)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i; j < n; j++) {
            double allowed = (double)burst +
                             per_s * ((double)(t[j] - t[i]) + START_SLACK_MS) / 1000;
            cr_assert_leq((double)(j - i + 1), allowed, "%zu starts in %lld ms",
                          j - i + 1, t[j] - t[i]);
        }
    double rate = (double)(n - 1 - burst) * 1000 / (double)(t[n - 1] - t[burst]);
    cr_assert(rate >= per_s * 0.9 && rate <= per_s * 1.1, "%.2f a second, not %.2f", rate,
              per_s);
}

Test(limiter, leaky_keeps_its_rate_over_seconds)
{
    /* Bursts of 20, then 20 a second: 100 jobs in about 4 s. */
    long long *t = run_limited("leaky.yml", "      type: leaky\n      name: drain\n"
                               "      size: 20\n      interval: 1\n      wait_timeout: 5\n",
                               6, "ll", 100);
    check_restoring(t, 100, 20, 20);
    free(t);
}

Test(limiter, points_keep_their_rate_over_seconds)
{
    /* 40 points a second at 2 a job: bursts of 20, then 20 a second. */
    long long *t = run_limited("points.yml", "      type: points\n      name: gql\n"
                               "      points: 40\n      cost: 2\n      interval: second\n"
                               "      wait_timeout: 5\n", 7, "lp", 100);
    check_restoring(t, 100, 20, 20);
    free(t);
}

Test(limiter, bucket_keeps_its_rate_over_seconds)
{
    /* 20 a calendar second: 100 jobs over 5 seconds. */
    long long *t = run_limited("bucket.yml", "      type: bucket\n      name: refill\n"
                               "      count: 20\n      interval: second\n      wait_timeout: 5\n",
                               8, "lb", 100);
    check_calendar(t, 100, 20);
    long long first = t[0] / 1000, last = t[99] / 1000, full = 0;
    for (size_t i = 0; i < 100; i++)
        full += t[i] / 1000 > first && t[i] / 1000 < last;
    /* The whole seconds between the first and the last are full. */
    cr_assert_geq(last - first, 2, "%lld", last - first);
    double rate = (double)full / (double)(last - first - 1);
    cr_assert(rate >= 18 && rate <= 22, "%.2f a second, not 20", rate);
    free(t);
}

/* ---- a limit declared in C, and per-job costs ------------------------- */

/* CostJob: appends the Redis clock (ms) to PREFIX:10 when its payload says
 * "limiter_cost" (10 in the test), else to PREFIX:5 (the class's cost);
 * udata is PREFIX. */
static int cost_job(capstan_job_t *job, void *ud)
{
    size_t len;
    const char *own = capstan_job_field_raw(job, CAPSTAN_LIMIT_COST_FIELD, &len);
    redisReply *r = redisCommand(capstan_job_redis(job), "EVAL %s 1 %s:%s",
                                 "local t = redis.call('TIME')\n"
                                 "return redis.call('RPUSH', KEYS[1], "
                                 "t[1] * 1000 + math.floor(t[2] / 1000))",
                                 (const char *)ud, own ? "10" : "5");
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "CostJob: RPUSH failed");
}

/* A points limit given through capstan_class_opts_t: a budget of 10 a second
 * and jobs costing 5 let 2 jobs run per interval once the first budget is
 * spent; a job whose payload says it costs 10 runs alone in its interval.
 * A YAML limit for a class wins over its C one. */
Test(limiter, class_limit_from_c_spends_each_jobs_cost)
{
    char err[CAPSTAN_ERRLEN];
    capstan_limit_opts_t lo = CAPSTAN_LIMIT_OPTS_INIT;
    lo.type = CAPSTAN_LIMIT_POINTS;
    lo.name = "budget";
    lo.count = 10;
    lo.seconds = 1;
    lo.cost = 11;
    cr_assert_eq(capstan_limit_opts_check(&lo, "CostJob", err), CAPSTAN_EINVAL);
    cr_assert(strstr(err, "cost must be between 1 and its 10 points"), "%s", err);
    lo.cost = 5;
    lo.wait_timeout = 10;
    cr_assert_eq(capstan_limit_opts_check(&lo, "CostJob", err), 0, "%s", err);

    capstan_config_t *cfg = kt_config(4);
    char *y = kt_write_file("wins.yml", "classes:\n  YamlWins:\n"
                                        "    limit: { type: concurrent, name: yaml, size: 1 }\n");
    cr_assert_eq(capstan_config_load_file(cfg, y, err), 0, "%s", err);
    free(y);
    capstan_runtime_t *rt = capstan_runtime_new(cfg, err);
    cr_assert(rt, "%s", err);
    capstan_limit_opts_t bad = lo;
    bad.count = 0;
    capstan_class_opts_t opts = CAPSTAN_CLASS_OPTS_INIT;
    opts.limit = &bad;
    cr_assert_eq(capstan_register(rt, "CostJob", cost_job, "cj", &opts), CAPSTAN_EINVAL);
    opts.limit = &lo;
    cr_assert_eq(capstan_register(rt, "CostJob", cost_job, "cj", &opts), 0);
    capstan_limit_opts_t c_only = lo;
    c_only.name = "c-only";
    opts.limit = &c_only;
    cr_assert_eq(capstan_register(rt, "YamlWins", cost_job, "yw", &opts), 0);
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    cr_assert_eq(capstan_client_use_runtime(c, rt), 0);
    kt_runtime_start(rt);

    for (int i = 0; i < 6; i++)
        cr_assert_eq(capstan_client_push(c, "CostJob", "[]", NULL, NULL), 0, "%s",
                     capstan_client_error(c));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN cj:5") == 6, 15));
    capstan_push_opts_t po = capstan_push_opts_default();
    po.extra = "{\"" CAPSTAN_LIMIT_COST_FIELD "\":10}";
    for (int i = 0; i < 2; i++)
        cr_assert_eq(capstan_client_push(c, "CostJob", "[]", &po, NULL), 0, "%s",
                     capstan_client_error(c));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN cj:10") == 2, 15));
    cr_assert_eq(capstan_client_push(c, "YamlWins", "[]", NULL, NULL), 0, "%s", capstan_client_error(c));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN yw:5") == 1, 15));
    cr_assert_eq(kt_int("EXISTS limiter:yaml:meta"), 1, "the YAML limit applied");
    cr_assert_eq(kt_int("EXISTS limiter:c-only:meta"), 0, "not the C one");
    capstan_client_free(c); /* before the runtime it may use */
    kt_runtime_end(rt);

    long long t[8];
    for (int i = 0; i < 8; i++)
        t[i] = kt_int("LINDEX %s %d", i < 6 ? "cj:5" : "cj:10", i < 6 ? i : i - 6);
    /* The first budget, 2 jobs at once; then no 3 within an interval (a
     * job records its start a little after it was let in, hence 50 ms). */
    cr_assert_lt(t[1] - t[0], 300, "%lld", t[1] - t[0]);
    cr_assert_geq(t[2] - t[0], 450, "%lld", t[2] - t[0]);
    for (int i = 3; i < 6; i++)
        cr_assert_geq(t[i] - t[i - 2], 950, "jobs %d..%d in %lld ms", i - 2, i, t[i] - t[i - 2]);
    /* Costing the whole budget, each waits for all of it to come back. */
    for (int i = 6; i < 8; i++)
        cr_assert_geq(t[i] - t[i - 1], 950, "job %d after %lld ms", i, t[i] - t[i - 1]);
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
}

/* max_limiter_reschedules in the file applies to a class whose limit is
 * declared in C: with 0, a job over the limit goes straight to retry. */
Test(limiter, file_max_reschedules_applies_to_a_limit_declared_in_c)
{
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = kt_config(2);
    char *y = kt_write_file("cmax.yml", "classes:\n  CLimited:\n    max_limiter_reschedules: 0\n");
    cr_assert_eq(capstan_config_load_file(cfg, y, err), 0, "%s", err);
    free(y);
    capstan_runtime_t *rt = capstan_runtime_new(cfg, err);
    cr_assert(rt, "%s", err);
    capstan_limit_opts_t lo = CAPSTAN_LIMIT_OPTS_INIT;
    lo.type = CAPSTAN_LIMIT_WINDOW;
    lo.name = "cmax";
    lo.count = 1;
    lo.seconds = 60;
    capstan_class_opts_t opts = CAPSTAN_CLASS_OPTS_INIT;
    opts.limit = &lo;
    cr_assert_eq(capstan_register(rt, "CLimited", cost_job, "cm", &opts), 0);
    /* The window's only acquisition is the test's. */
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_WINDOW, "cmax", 1, 60);
    minute_room();
    capstan_limit_token_t t;
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    cr_assert_eq(capstan_client_push(c, "CLimited", "[]", NULL, NULL), 0, "%s", capstan_client_error(c));
    kt_runtime_start(rt);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 15));
    redisReply *rr = kt_cmd("ZRANGE retry 0 0");
    cr_assert(strstr(rr->element[0]->str, "Capstan::OverLimit"), "%s", rr->element[0]->str);
    freeReplyObject(rr);
    cr_assert_eq(kt_int("ZCARD schedule"), 0, "not rescheduled");
    cr_assert_eq(kt_int("LLEN cm:5"), 0, "not run");
    capstan_client_free(c); /* before the runtime it may use */
    kt_runtime_end(rt);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

/* ---- keys of unused limiters expire ----------------------------------- */

static long long limiter_keys(void)
{
    return kt_int("EVAL %s 0", "return #redis.call('KEYS', 'limiter:*')");
}

/* Every key a limiter writes expires once it is unused, its meta last; a
 * holder that keeps extending its lease keeps them all. */
Test(limiter, an_unused_limiters_keys_expire)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_limit_token_t t, kept;
    capstan_limiter_t *l[] = {
        mk(CAPSTAN_LIMIT_CONCURRENT, "e1", 2, 0.2), mk(CAPSTAN_LIMIT_WINDOW, "e2", 2, 0.2),
        mk(CAPSTAN_LIMIT_BUCKET, "e3", 2, 0.2),     mk(CAPSTAN_LIMIT_SLIDING, "e4", 2, 0.2),
        mk(CAPSTAN_LIMIT_LEAKY, "e5", 2, 0.2),      mk(CAPSTAN_LIMIT_POINTS, "e6", 2, 0.2),
    };
    for (size_t i = 0; i < 6; i++)
        cr_assert_eq(capstan_limiter_acquire(l[i], r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_release(l[5], r, &t, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l[0], r, 0, &kept, NULL, err), 0, "%s", err);
    for (int i = 1; i <= 6; i++) {
        long long ttl = kt_int("PTTL limiter:e%d:meta", i);
        cr_assert(ttl > 0 && ttl <= 400, "limiter:e%d:meta PTTL %lld", i, ttl);
    }
    /* Three leases on: e1's holder extended its slot all along. */
    for (int i = 0; i < 6; i++) {
        kt_sleep(0.1);
        cr_assert_eq(capstan_limiter_extend(l[0], r, &kept, err), 0, "%s", err);
    }
    cr_assert_gt(kt_int("PTTL limiter:e1:held"), 0);
    cr_assert_gt(kt_int("PTTL limiter:e1:meta"), 0);
    cr_assert_eq(limiter_keys(), 2, "only e1's keys are left");
    /* Once it stops, they go within a lease. */
    double t0 = kt_now();
    cr_assert(KT_WAIT_UNTIL(limiter_keys() == 0, 2), "%lld keys left", limiter_keys());
    cr_assert_lt(kt_now() - t0, 0.5);
    for (size_t i = 0; i < 6; i++)
        capstan_limiter_free(l[i]);
    capstan_redis_free(r);
}

/* The lease is each process's own (not in the meta): a newcomer with a
 * short one never cuts the life of the holder set under a longer one. */
Test(limiter, a_short_lease_never_shortens_a_longer_one)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN];
    capstan_limit_token_t long_t, short_t;
    capstan_limiter_t *slow = mk(CAPSTAN_LIMIT_CONCURRENT, "lease", 2, 5);
    capstan_limiter_t *quick = mk(CAPSTAN_LIMIT_CONCURRENT, "lease", 2, 0.1);
    cr_assert_eq(capstan_limiter_acquire(slow, r, 0, &long_t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(quick, r, 0, &short_t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_extend(quick, r, &short_t, err), 0, "%s", err);
    kt_sleep(0.3);
    cr_assert_eq(capstan_limiter_extend(slow, r, &long_t, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_release(slow, r, &long_t, err), 0, "%s", err);
    capstan_limiter_free(slow);
    capstan_limiter_free(quick);
    capstan_redis_free(r);
}

/* ---- a limit is reached, not merely kept ------------------------------- */

/* LimitJob under limit, with a schedule poll only every 15 to 45 s (and
 * none at start): a rescheduled job back sooner came back because its
 * process woke its scheduler for it. */
static char *slow_poll_yml(const char *name, const char *limit)
{
    char *body;
    cr_assert(asprintf(&body, "poll_interval_average: 30\nclasses:\n  LimitJob:\n    limit:\n%s",
                       limit) > 0);
    char *y = kt_write_file(name, body);
    free(body);
    return y;
}

typedef struct burst {
    size_t ran;     /* jobs that started within the bound */
    double secs;    /* from the push to the last end, or to the bound */
    long long *t;   /* their starts (ms, Redis clock), ascending */
} burst_t;

/* Pushes n LimitJobs of ms each under limit to procs processes of 10
 * processors once they are up, and waits at most bound seconds for them
 * all to end. Prints what ran in how long, with what. */
static burst_t run_burst(const char *what, const char *limit, unsigned tag, const char *key, long ms,
                         size_t n, int procs, double bound)
{
    char *y = slow_poll_yml("burst.yml", limit);
    pid_t p[2];
    for (int i = 0; i < procs; i++)
        p[i] = kt_capstan_start((const char *[]){ "-C", y, "-c", "10", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == procs, 20), "%s", kt_capstan_log(p[0]));
    double t0 = kt_now();
    push_limit_jobs(tag, key, ms, n);
    int done = KT_WAIT_UNTIL(kt_int("SCARD %s:jids", key) == (long long)n &&
                             kt_int("GET %s:running", key) == 0, bound);
    burst_t b = { 0 };
    b.secs = kt_now() - t0;
    b.t = job_starts(key, &b.ran);
    fprintf(stderr, "limiter figures: %s: %zu of %zu jobs of %ld ms ran in %.2f s%s\n", what, b.ran,
            n, ms, b.secs, done ? "" : " (the bound)");
    for (int i = 0; i < procs; i++)
        cr_assert_eq(kt_capstan_stop(p[i], SIGTERM, 10), 0);
    free(y);
    cr_assert(done, "%zu of %zu jobs ran in %.0f s", b.ran, n, bound);
    cr_assert_eq(kt_int("LLEN %s:starts", key), (long long)n, "a job ran twice");
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead") + kt_int("ZCARD schedule"), 0);
    return b;
}

/* The share of size x span that the jobs of b, ms each, kept busy, from
 * the first start to the last job's end. A job's end is taken as its start
 * plus its ms: it sleeps that long after recording its start, so the
 * figure is a lower bound. */
static double busy_share(const burst_t *b, long ms, long size)
{
    double span = (double)(b->t[b->ran - 1] + ms - b->t[0]);
    return (double)b->ran * (double)ms / ((double)size * span);
}

/* The jobs of the busy-share tests (ms): long enough beside a hand-over
 * (a few ms, more under the sanitizers or on a loaded machine) that the
 * share measures the limiter, not the build. */
#define JOB_MS 250
/* The target is 90 % (printed with each run: 95-99 % on a quiet machine);
 * the assertion leaves room for a machine busy with other tests, and still
 * fails the polling it replaced by far (under 10 %). */
#define BUSY_MIN 0.8

/* A concurrent limit of 2 with a backlog: the jobs over it wait in their
 * processors (wait_timeout's default, 5 s) and each release hands its slot
 * to a waiter at once, so both slots stay busy. */
Test(limiter, a_concurrent_limit_keeps_its_slots_busy)
{
    burst_t b = run_burst("concurrent size 2, one process", "      type: concurrent\n"
                          "      name: busy2\n      size: 2\n", 20, "lu", JOB_MS, 20, 1, 60);
    double share = busy_share(&b, JOB_MS, 2);
    fprintf(stderr, "limiter figures: concurrent size 2: slots busy %.1f%% of the time\n",
            100 * share);
    cr_assert_eq(kt_int("GET lu:max"), 2);
    cr_assert_geq(share, BUSY_MIN, "slots busy %.1f%% of the time", 100 * share);
    free(b.t);
}

/* The same across processes: a release in one wakes a waiter in the
 * other, as they block on the same list. */
Test(limiter, a_concurrent_limit_keeps_its_slots_busy_across_processes)
{
    burst_t b = run_burst("concurrent size 3, two processes", "      type: concurrent\n"
                          "      name: busy3\n      size: 3\n", 21, "lv", JOB_MS, 45, 2, 60);
    double share = busy_share(&b, JOB_MS, 3);
    fprintf(stderr, "limiter figures: concurrent size 3, two processes: slots busy %.1f%% of the "
            "time\n", 100 * share);
    cr_assert_eq(kt_int("GET lv:max"), 3);
    cr_assert_geq(share, BUSY_MIN, "slots busy %.1f%% of the time", 100 * share);
    free(b.t);
}

/* A window of 5 a second lets 5 jobs start in each calendar second while
 * work is queued: the whole seconds between the first start and the last
 * average at least 90% of that, and none has more. */
Test(limiter, a_window_limit_runs_at_its_rate)
{
    burst_t b = run_burst("window 5 a second", "      type: window\n      name: rate5\n"
                          "      count: 5\n      interval: second\n", 22, "lr", 10, 40, 1, 60);
    check_calendar(b.t, b.ran, 5);
    long long first = b.t[0] / 1000, last = b.t[b.ran - 1] / 1000, inner = 0;
    for (size_t i = 0; i < b.ran; i++)
        inner += b.t[i] / 1000 > first && b.t[i] / 1000 < last;
    cr_assert_geq(last - first, 2, "%lld", last - first);
    double rate = (double)inner / (double)(last - first - 1);
    fprintf(stderr, "limiter figures: window 5 a second: %.2f a second over the whole seconds\n",
            rate);
    cr_assert_geq(rate, 4.5, "%.2f a second, not 5", rate);
    free(b.t);
}

/* A job rescheduled off a busy concurrent slot (no wait here) comes back
 * when its backoff ends, though no poll comes for 15 s or more; and its
 * reschedules do not use up max_limiter_reschedules, however many. */
Test(limiter, a_rescheduled_job_comes_back_when_due)
{
    char *y = slow_poll_yml("due.yml", "      type: concurrent\n      name: due\n      size: 1\n"
                                       "      wait_timeout: 0\n");
    char *body = kt_read_file(y), *yml;
    cr_assert(asprintf(&yml, "%s    max_limiter_reschedules: 1\n", body) > 0);
    free(y);
    y = kt_write_file("due.yml", yml);
    free(body);
    free(yml);
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_CONCURRENT, "due", 1, 60);
    capstan_limit_token_t t;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 20), "%s", kt_capstan_log(a));
    push_limit_jobs(23, "ld", 10, 1);
    /* Refused at 0, 0.5 and 1.5 s at least: past the maximum of 1. */
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD schedule") == 1, 10), "%s", kt_capstan_log(a));
    kt_sleep(2.5);
    cr_assert_eq(kt_int("ZCARD retry"), 0, "failed with %lld of 1 reschedules",
                 kt_int("ZCARD retry"));
    double t0 = kt_now();
    cr_assert_eq(capstan_limiter_release(l, r, &t, err), 0, "%s", err);
    /* Its backoff is at most 4 s by now (0.5 s, doubling). */
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD ld:jids") == 1, 10), "not back within 10 s: %s",
              kt_capstan_log(a));
    fprintf(stderr, "limiter figures: a rescheduled job ran %.2f s after its slot freed\n",
            kt_now() - t0);
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead") + kt_int("ZCARD schedule"), 0);
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    capstan_limiter_free(l);
    capstan_redis_free(r);
    free(y);
}

typedef struct releaser {
    capstan_limiter_t *l;
    capstan_redis_t *r;
    const capstan_limit_token_t *t;
    int rc;
} releaser_t;

static void *release_later(void *arg)
{
    releaser_t *rel = arg;
    char err[CAPSTAN_ERRLEN];
    kt_sleep(0.3);
    rel->rc = capstan_limiter_release(rel->l, rel->r, rel->t, err);
    return NULL;
}

/* A waiter on a concurrent slot gets it the moment its holder gives it
 * back (woken by the release, not by a timer); the list that wakes it stays short and expires. */
Test(limiter, a_release_wakes_a_waiter_at_once)
{
    capstan_redis_t *r = kt_lib_redis(), *r2 = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_CONCURRENT, "wake", 1, 2);
    capstan_limit_token_t held, got;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &held, NULL, err), 0, "%s", err);
    /* The releaser frees the slot 0.3 s from now, on its own connection;
     * the timer fallback alone would take up to 1 s. */
    releaser_t rel = { l, r2, &held, -1 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, release_later, &rel), 0);
    double t0 = kt_now();
    cr_assert_eq(capstan_limiter_acquire(l, r, 5, &got, NULL, err), 0, "%s", err);
    double waited = kt_now() - t0;
    pthread_join(th, NULL);
    cr_assert_eq(rel.rc, 0);
    fprintf(stderr, "limiter figures: a waiter got a released slot after %.3f s (released at 0.3)\n",
            waited);
    cr_assert(waited >= 0.25 && waited < 0.6, "%.3f s", waited);
    cr_assert_eq(capstan_limiter_release(l, r, &got, err), 0, "%s", err);
    /* Releases nobody waited for: no more than the size are kept, and
     * they expire with the lease. */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(capstan_limiter_acquire(l, r, 0, &got, NULL, err), 0, "%s", err);
        cr_assert_eq(capstan_limiter_release(l, r, &got, err), 0, "%s", err);
    }
    cr_assert_eq(kt_int("LLEN limiter:wake:free"), 1);
    long long ttl = kt_int("PTTL limiter:wake:free");
    cr_assert(ttl > 0 && ttl <= 2000, "%lld", ttl);
    capstan_limiter_free(l);
    capstan_redis_free(r);
    capstan_redis_free(r2);
}

/* A finished job's ack goes out as its processor begins to wait for a
 * limiter slot, not with the next job's round trip: with every processor
 * waiting (wait_timeout's default, 5 s) that trip did not come, and a kill
 * or a failover meanwhile ran the finished job again. One processor, a
 * run of short jobs fetched ahead, then a job whose slot the test holds. */
Test(limiter, a_finished_jobs_ack_does_not_wait_with_a_slot_wait)
{
    char *y = limit_yml("held.yml", "      type: concurrent\n      name: held\n      size: 1\n"
                                    "      lock_timeout: 30\n");
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = mk(CAPSTAN_LIMIT_CONCURRENT, "held", 1, 30);
    capstan_limit_token_t t;
    char err[CAPSTAN_ERRLEN], last[25], done[64];
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    kt_push_jobs("NoopJob", "[]", 30, 3000);
    kt_make_jid(last, 30, 2999);
    push_limit_jobs(31, "lh", 10, 1);
    kt_push_jobs("NoopJob", "[]", 32, 500);
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", NULL });
    char *id = kt_wait_identity(a);
    snprintf(done, sizeof(done), "jid=%s elapsed=", last);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(a, done), 10), "%s", kt_capstan_log(a));
    double t0 = kt_now();
    int acked = KT_WAIT_UNTIL(!kt_working_has(id, last), 3);
    fprintf(stderr, "limiter figures: the ack of the job before a slot wait was written %.2f s after "
            "it ended\n", kt_now() - t0);
    cr_assert(acked, "it stayed in the working list while the next job waited for a slot:\n%s",
              kt_capstan_log(a));
    cr_assert_eq(kt_int("SCARD lh:jids"), 0, "the limited job did not wait");
    cr_assert_eq(capstan_limiter_release(l, r, &t, err), 0, "%s", err);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD lh:jids") == 1, 10), "%s", kt_capstan_log(a));
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    capstan_limiter_free(l);
    capstan_redis_free(r);
    free(id);
    free(y);
}

/* ---- the scheduler -------------------------------------------------- */

/* A job due in retry or schedule goes back to its queue with enqueued_at
 * in the unit its payload carries: a Sidekiq 8 job keeps integer
 * milliseconds under the default timestamps: float; one with float seconds
 * keeps seconds, and one with neither gets the configured unit. */
Test(limiter, the_scheduler_keeps_the_payloads_timestamp_unit)
{
    static const char *const jobs[] = {
        "{\"class\":\"Nobody\",\"jid\":\"0000000000000000000000s8\",\"queue\":\"unrun\",\"args\":[],"
        "\"created_at\":1760000000123,\"enqueued_at\":1760000000123}",
        "{\"class\":\"Nobody\",\"jid\":\"0000000000000000000000s7\",\"queue\":\"unrun\",\"args\":[],"
        "\"created_at\":1760000000.123,\"enqueued_at\":1760000000.123}",
        "{\"class\":\"Nobody\",\"jid\":\"0000000000000000000000s0\",\"queue\":\"unrun\",\"args\":[]}",
    };
    for (int i = 0; i < 3; i++)
        freeReplyObject(kt_cmd("ZADD %s 1 %s", i == 1 ? "retry" : "schedule", jobs[i]));
    char *y = kt_write_file("sched.yml", "poll_interval_average: 0.3\n");
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-q", "default", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:unrun") == 3, 10), "%s", kt_capstan_log(a));
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    double now = kt_wall();
    for (int i = 0; i < 3; i++) {
        redisReply *rep = kt_cmd("LINDEX queue:unrun %d", i);
        json_t *j = json_loads(rep->str, JSON_DECODE_ANY, NULL);
        cr_assert(j, "%s", rep->str);
        const char *jid = json_string_value(json_object_get(j, "jid"));
        json_t *at = json_object_get(j, "enqueued_at");
        int ms = strcmp(jid + 22, "s8") == 0;
        cr_assert(ms ? json_is_integer(at) : json_is_real(at), "%s", rep->str);
        double secs = ms ? (double)json_integer_value(at) / 1000 : json_real_value(at);
        cr_assert(secs > now - 30 && secs <= now + 1, "%s", rep->str);
        cr_assert_null(json_object_get(j, "at"));
        json_decref(j);
        freeReplyObject(rep);
    }
    free(y);
}

/* A limit waits 5 s by default, given in C or in YAML, as Sidekiq
 * Enterprise's does; the file may set 0 (no wait). */
Test(limiter, a_limit_waits_five_seconds_by_default)
{
    capstan_limit_opts_t lo = CAPSTAN_LIMIT_OPTS_INIT;
    cr_assert_eq(lo.wait_timeout, 5);
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = kt_config(1);
    char *y = kt_write_file("wait.yml", "classes:\n  A: {limit: {type: concurrent, size: 2}}\n"
                                        "  B: {limit: {type: window, count: 5, interval: 1, "
                                        "wait_timeout: 0}}\n");
    cr_assert_eq(capstan_config_load_file(cfg, y, err), 0, "%s", err);
    cr_assert_eq(capstan_config_class(cfg, "A")->limit.wait_timeout, 5);
    cr_assert_eq(capstan_config_class(cfg, "B")->limit.wait_timeout, 0);
    capstan_config_free(cfg);
    free(y);
}

/* ---- sidekiq-limit_fetch's `:limits:` ------------------------------------ */

/* Pushes n LimitJob [key, ms] to queue:NAME, jids kt_make_jid(tag, i). */
static void push_to_queue(const char *queue, unsigned tag, const char *key, long ms, size_t n)
{
    char args[64], jid[25], **p = calloc(n, sizeof(*p));
    snprintf(args, sizeof(args), "[\"%s\",%ld]", key, ms);
    for (size_t i = 0; i < n; i++) {
        kt_make_jid(jid, tag, (unsigned)i);
        p[i] = kt_payload("LimitJob", args, jid, queue);
    }
    redisContext *c = kt_redis();
    kt_push_all(c, queue, p, n);
    for (size_t i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

static const char limits_yml[] = ":queues:\n  - reports\n  - default\n:limits:\n  reports: 2\n"
                                 ":blocking:\n  - reports\npoll_interval_average: 0.3\n";

/* A sidekiq.yml's `:limits: {reports: 2}` caps the queue across two
 * processes of 5 processors: never more than 2 of its jobs at once, each
 * once; and while it is at its cap, a job of another queue runs at once. */
Test(limiter, a_queues_limit_caps_it_across_the_fleet)
{
    char *y = kt_write_file("qlimit.yml", limits_yml), port[16];
    int mport = kt_free_port();
    snprintf(port, sizeof(port), "%d", mport);
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "5", "--metrics-port", port, NULL });
    pid_t b = kt_capstan_start((const char *[]){ "-C", y, "-c", "5", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 2, 20), "%s", kt_capstan_log(a));
    cr_assert(kt_log_has(a, "blocking: not used by capstan"), "%s", kt_capstan_log(a));
    cr_assert(!kt_log_has(a, "limits: not used"), "%s", kt_capstan_log(a));
    double t0 = kt_now();
    push_to_queue("reports", 40, "rq", 200, 40);
    cr_assert(KT_WAIT_UNTIL(kt_int("GET rq:running") == 2, 10), "%s", kt_capstan_log(a));
    /* At its cap, with a backlog: the other queue's job does not wait. */
    push_to_queue("default", 41, "oq", 0, 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD oq:jids") == 1, 10), "%s", kt_capstan_log(a));
    cr_assert_gt(kt_int("LLEN queue:reports"), 0, "the backlog ran out before the other job ran");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rq:jids") == 40 && kt_int("GET rq:running") == 0, 60),
              "%lld of 40 ran\n%s", kt_int("SCARD rq:jids"), kt_capstan_log(a));
    fprintf(stderr, "limiter figures: limits reports 2, two processes of 5: 40 jobs of 200 ms in "
            "%.2f s\n", kt_now() - t0);
    cr_assert_eq(kt_int("LLEN rq:starts"), 40, "a job ran twice");
    cr_assert_eq(kt_int("GET rq:max"), 2);
    cr_assert_eq(kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD limiter:queue:reports:held") == 0, 5),
              "every slot was given back");
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "queue:reports\tconcurrent\tsize=2\n"), "%s", out);
    free(out);
    /* Each job's slot is counted once, held and given back. */
    out = kt_scrape(mport);
    cr_assert(out && strstr(out, "capstan_limiter_acquired_total{limiter=\"queue:reports\"}")
              && strstr(out, "capstan_limiter_held{limiter=\"queue:reports\"} 0\n"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 10), 0);
    free(y);
}

/* `:process_limits: {reports: 1}` caps the queue in each process: 6 jobs
 * through 5 processors run one at a time. */
Test(limiter, a_queues_process_limit_caps_it_in_each_process)
{
    char *y = kt_write_file("plimit.yml", ":queues:\n  - reports\n:process_limits:\n  reports: 1\n");
    pid_t a = kt_capstan_start((const char *[]){ "-C", y, "-c", "5", NULL });
    push_to_queue("reports", 42, "pq", 100, 6);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD pq:jids") == 6 && kt_int("GET pq:running") == 0, 30),
              "%lld of 6 ran\n%s", kt_int("SCARD pq:jids"), kt_capstan_log(a));
    cr_assert_eq(kt_int("GET pq:max"), 1);
    cr_assert_eq(kt_int("LLEN pq:starts"), 6, "a job ran twice");
    cr_assert(!kt_log_has(a, "process_limits: not used"), "%s", kt_capstan_log(a));
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 10), 0);
    free(y);
}

/* A process killed while it holds a queue's only slot gives it back once
 * its lease lapses (10 s): another process's job of the queue then runs.
 * While it is held, `capstan limits info` shows it. */
Test(limiter, a_killed_processs_queue_slot_comes_back)
{
    char *y = kt_write_file("klimit.yml", ":queues:\n  - reports\n:limits:\n  reports: 1\n");
    pid_t a = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "2", NULL });
    push_to_queue("reports", 43, "kq", 60000, 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("GET kq:running") == 1, 10), "%s", kt_capstan_log(a));
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "limits", "info", "queue:reports", "--json", NULL },
                                &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "used")), 1, "%s", out);
    json_decref(j);
    free(out);
    cr_assert_eq(kt_capstan_stop(a, SIGKILL, 5), 128 + SIGKILL);
    pid_t b = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    double t0 = kt_now();
    push_to_queue("reports", 44, "kb", 0, 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD kb:jids") == 1, 40), "%s", kt_capstan_log(b));
    fprintf(stderr, "limiter figures: a killed process's queue slot came back in %.1f s\n",
            kt_now() - t0);
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 10), 0);
    free(y);
}
