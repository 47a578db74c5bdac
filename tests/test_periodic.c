/* Periodic jobs against a real Redis and real capstan processes: each tick
 * of an every-second schedule enqueued exactly once by three processes
 * while they are killed and restarted; the missed-tick policies after
 * every process was down; a changed expression enqueuing no phantom
 * ticks; a bad expression stopping the start with one line; `capstan
 * periodic`; a process whose clock is 30 s off (libfaketime) neither
 * losing nor advancing a tick. The ledger is the queue itself, which no process reads: each
 * payload names its tick (periodic_at). */
#include <arpa/inet.h>
#include <glob.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "capstan/capstan.h"
#include "helpers.h"
#include "periodic/periodic.h"

TestSuite(periodic, .timeout = 120, .fini = kt_kill_children);

/* A tick as its payload in the queue shows it. */
typedef struct tick {
    long long at;       /* periodic_at */
    double enqueued_at;
    char jid[32];
} tick_t;

static int by_at(const void *a, const void *b)
{
    long long x = ((const tick_t *)a)->at, y = ((const tick_t *)b)->at;
    return x < y ? -1 : x > y;
}

/* Every payload of queue:q, sorted by tick; *n gets the count. */
static tick_t *ticks_of(const char *q, size_t *n)
{
    redisReply *r = kt_cmd("LRANGE queue:%s 0 -1", q);
    tick_t *v = calloc(r->elements + 1, sizeof(*v));
    for (size_t i = 0; i < r->elements; i++) {
        json_error_t je;
        json_t *o = json_loads(r->element[i]->str, 0, &je);
        cr_assert(o, "payload is JSON: %s", r->element[i]->str);
        v[i].at = json_integer_value(json_object_get(o, "periodic_at"));
        v[i].enqueued_at = json_number_value(json_object_get(o, "enqueued_at"));
        snprintf(v[i].jid, sizeof(v[i].jid), "%s", json_string_value(json_object_get(o, "jid")));
        cr_assert(v[i].at > 0 && v[i].enqueued_at > 0, "%s", r->element[i]->str);
        json_decref(o);
    }
    *n = r->elements;
    freeReplyObject(r);
    qsort(v, *n, sizeof(*v), by_at);
    return v;
}

/* The newest tick in queue:q, or 0. */
static long long newest(const char *q)
{
    size_t n;
    tick_t *v = ticks_of(q, &n);
    long long at = n ? v[n - 1].at : 0;
    free(v);
    return at;
}

/* Enqueued a second or more after its time: for an every-second
 * schedule, not the latest due tick when it was enqueued, so a missed one
 * caught up once a process was back (an on-time tick goes within ms). */
static int late(const tick_t *t)
{
    return t->enqueued_at - (double)t->at >= 1.0;
}

static pid_t start(const char *conf, int metrics_port)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", metrics_port);
    const char *with_port[] = { "-C", conf, "--metrics-port", port, NULL };
    const char *plain[] = { "-C", conf, NULL };
    return kt_capstan_start(metrics_port ? with_port : plain);
}

static void stop(pid_t pid, int sig)
{
    int st = kt_capstan_stop(pid, sig, 30);
    kt_untrack(pid);
    cr_assert(sig == SIGKILL ? st == 128 + SIGKILL : st == 0, "capstan %d stopped (status %d): %s", (int)pid,
              st, kt_capstan_log(pid));
}

Test(periodic, every_tick_once_across_three_processes_killed_and_restarted)
{
    char *conf = kt_write_conf("queues: [other]\n"
                               "periodic:\n"
                               "  each_second:\n"
                               "    cron: \"* * * * * *\"\n"
                               "    class: TickJob\n"
                               "    queue: ticks\n"
                               "    missed: all\n");
    /* KT_PERIODIC_SCALE=4 stretches the run to about a minute (not in CI). */
    double f = getenv("KT_PERIODIC_SCALE") ? atof(getenv("KT_PERIODIC_SCALE")) : 1;
    f = f >= 1 ? f : 1;
    pid_t p[3];
    for (int i = 0; i < 3; i++)
        p[i] = start(conf, 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:ticks") >= 2, 15), "ticks come: %s", kt_capstan_log(p[0]));
    double t0 = kt_wall();
    /* kill -9 one, restart it; a rolling restart of the two others; kill
     * -9 the first again and restart it. */
    kt_sleep(3 * f);
    stop(p[0], SIGKILL);
    p[0] = start(conf, 0);
    kt_sleep(3 * f);
    for (int i = 1; i < 3; i++) {
        stop(p[i], SIGTERM);
        p[i] = start(conf, 0);
        kt_sleep(1.5 * f);
    }
    kt_sleep(1.5 * f);
    stop(p[0], SIGKILL);
    p[0] = start(conf, 0);
    long long until = (long long)kt_wall() + 3;
    cr_assert(KT_WAIT_UNTIL(newest("ticks") >= until, 10));
    for (int i = 0; i < 3; i++)
        stop(p[i], SIGTERM);
    size_t n;
    tick_t *v = ticks_of("ticks", &n);
    long long span = v[n - 1].at - v[0].at + 1;
    size_t doubled = 0, lost = 0;
    for (size_t i = 1; i < n; i++) {
        if (v[i].at == v[i - 1].at)
            doubled++;
        else if (v[i].at != v[i - 1].at + 1)
            lost += (size_t)(v[i].at - v[i - 1].at - 1);
    }
    for (size_t i = 0; i < n; i++) {
        char jid[25];
        capstan__periodic_jid("each_second", v[i].at, jid);
        cr_assert_str_eq(v[i].jid, jid, "the jid of tick %lld is derived from name and time", v[i].at);
    }
    double worst = 0, sum = 0;
    for (size_t i = 0; i < n; i++) {
        double lag = v[i].enqueued_at - (double)v[i].at;
        sum += lag;
        worst = lag > worst ? lag : worst;
    }
    fprintf(stderr, "periodic: 3 processes, 2 kill -9 and a rolling restart over %.1f s: %zu jobs for "
                    "%lld ticks, %zu doubled, %zu lost; enqueued %.1f ms after the tick on average, "
                    "%.1f ms at worst\n", kt_wall() - t0, n, span, doubled, lost, sum / (double)n * 1000,
            worst * 1000);
    cr_assert_eq(doubled, 0, "never two jobs for one tick");
    cr_assert_eq(lost, 0, "never a tick without its job");
    cr_assert_eq((long long)n, span);
    free(v);
    free(conf);
}

/* The value of series name{schedule="sched"} in a scrape, or 0. */
static long series(const char *scrape, const char *name, const char *sched)
{
    char want[256];
    snprintf(want, sizeof(want), "%s{schedule=\"%s\"} ", name, sched);
    const char *at = scrape ? strstr(scrape, want) : NULL;
    return at ? atol(at + strlen(want)) : 0;
}

Test(periodic, missed_ticks_skip_last_all_after_every_process_was_down)
{
    char *conf = kt_write_conf("queues: [other]\n"
                               "periodic:\n"
                               "  skip_s: {cron: \"* * * * * *\", class: TickJob, queue: t_skip}\n"
                               "  last_s: {cron: \"* * * * * *\", class: TickJob, queue: t_last, missed: last}\n"
                               "  all_s: {cron: \"* * * * * *\", class: TickJob, queue: t_all, missed: all}\n");
    static const char *const queues[] = { "t_skip", "t_last", "t_all" };
    pid_t p[2] = { start(conf, 0), start(conf, 0) };
    for (int q = 0; q < 3; q++)
        cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:%s", queues[q]) >= 2, 15), "%s", kt_capstan_log(p[0]));
    stop(p[0], SIGKILL);
    stop(p[1], SIGKILL);
    double down = kt_wall();
    /* KT_PERIODIC_SCALE=2 keeps them down 10 s (not in CI). */
    double f = getenv("KT_PERIODIC_SCALE") ? atof(getenv("KT_PERIODIC_SCALE")) : 1;
    kt_sleep(5 * (f >= 1 ? f : 1));
    double up = kt_wall();
    int ports[2] = { kt_free_port(), kt_free_port() };
    p[0] = start(conf, ports[0]);
    p[1] = start(conf, ports[1]);
    for (int q = 0; q < 3; q++)
        cr_assert(KT_WAIT_UNTIL(newest(queues[q]) >= (long long)up + 2, 10));
    char *scrape[2] = { kt_scrape(ports[0]), kt_scrape(ports[1]) };
    stop(p[0], SIGTERM);
    stop(p[1], SIGTERM);
    long caught[3];
    for (int q = 0; q < 3; q++) {
        size_t n;
        tick_t *v = ticks_of(queues[q], &n);
        long long before = 0, first_on_time = 0;
        caught[q] = 0;
        for (size_t i = 0; i < n; i++) {
            if (i)
                cr_assert_neq(v[i].at, v[i - 1].at, "%s: never two jobs for one tick", queues[q]);
            if (v[i].enqueued_at < down)
                before = v[i].at;
            else if (late(&v[i]))
                caught[q]++;
            else if (!first_on_time)
                first_on_time = v[i].at;
        }
        long long gap = first_on_time - before - 1;
        fprintf(stderr, "periodic: missed %s, all down %.1f s: %lld ticks missed, %ld enqueued late\n",
                queues[q] + 2, up - down, gap, caught[q]);
        cr_assert_geq(gap, 4, "%s: the down time shows as missed ticks", queues[q]);
        if (q == 2)
            cr_assert_eq(caught[q], gap, "all: each missed tick once");
        free(v);
    }
    cr_assert_eq(caught[0], 0, "skip: nothing for the gap");
    cr_assert_eq(caught[1], 1, "last: the latest missed tick once");
    long let_go = series(scrape[0], "capstan_periodic_missed_total", "skip_s") +
                  series(scrape[1], "capstan_periodic_missed_total", "skip_s");
    long all_enq = series(scrape[0], "capstan_periodic_enqueued_total", "all_s") +
                   series(scrape[1], "capstan_periodic_enqueued_total", "all_s");
    cr_assert_geq(let_go, 4, "/metrics counts the ticks skip let go: %s", scrape[0]);
    cr_assert_geq(all_enq, caught[2] + 1, "/metrics counts the ticks enqueued: %s", scrape[0]);
    free(scrape[0]);
    free(scrape[1]);
    free(conf);
}

Test(periodic, changed_expression_starts_fresh_and_capstan_periodic_lists_it)
{
    char *conf = kt_write_conf("queues: [other]\n"
                               "periodic:\n"
                               "  sched:\n"
                               "    cron: \"* * * * * *\"\n"
                               "    class: TickJob\n"
                               "    queue: ticks\n"
                               "    missed: all\n");
    pid_t p = start(conf, 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:ticks") >= 2, 15), "%s", kt_capstan_log(p));
    stop(p, SIGTERM);
    free(conf);
    conf = kt_write_conf("queues: [other]\n"
                         "periodic:\n"
                         "  sched:\n"
                         "    cron: \"*/2 * * * * *\"\n"
                         "    class: TickJob\n"
                         "    queue: ticks\n"
                         "    missed: all\n");
    kt_sleep(3.5);
    double up = kt_wall();
    p = start(conf, 0);
    cr_assert(KT_WAIT_UNTIL(newest("ticks") >= (long long)up + 2, 10));
    char *log = kt_capstan_log(p);
    stop(p, SIGTERM);
    size_t n;
    tick_t *v = ticks_of("ticks", &n);
    for (size_t i = 0; i < n; i++)
        cr_assert(!late(&v[i]), "no phantom tick of the new expression in the gap: tick %lld enqueued at %.3f",
                  v[i].at, v[i].enqueued_at);
    cr_assert(strstr(log, "periodic sched: its expression changed"), "%s", log);
    free(v);
    free(log);

    char *out = NULL;
    const char *args[] = { "periodic", "-C", conf, "--redis-url", kt_url(), NULL };
    cr_assert_eq(kt_capstan_run(args, &out), 0, "%s", out);
    char *last = kt_str("HGET capstan:periodic:sched last");
    cr_assert(strstr(out, "*/2 * * * * *") && strstr(out, "capstan.yml:5") && strstr(out, "+00:00"), "%s", out);
    free(out);
    const char *jargs[] = { "periodic", "-C", conf, "--redis-url", kt_url(), "--json", NULL };
    cr_assert_eq(kt_capstan_run(jargs, &out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j && json_array_size(j) == 1, "%s", out);
    json_t *s = json_array_get(j, 0);
    cr_assert_eq(json_integer_value(json_object_get(s, "last")), atoll(last), "%s", out);
    cr_assert_gt(json_integer_value(json_object_get(s, "next")), atoll(last));
    cr_assert_eq(json_integer_value(json_object_get(s, "next")) % 2, 0);
    json_decref(j);
    free(out);
    free(last);
    free(conf);
}

Test(periodic, bad_expression_stops_the_start_with_one_line)
{
    char *conf = kt_write_conf("periodic:\n"
                               "  fine: {cron: \"@hourly\", class: A}\n"
                               "  broken:\n"
                               "    class: B\n"
                               "    cron: \"0 61 * * * *\"\n");
    char *out = NULL;
    const char *args[] = { "run", "-C", conf, "--redis-url", kt_url(), NULL };
    int st = kt_capstan_run(args, &out);
    cr_assert_eq(st, CAPSTAN_EXIT_CONFIG, "status %d: %s", st, out);
    cr_assert(strstr(out, "capstan.yml:7: periodic.broken: cron: minutes field \"61\": values must be "
                          "between 0 and 59"), "%s", out);
    cr_assert_eq(strchr(out, '\n'), strrchr(out, '\n'), "one line: %s", out);
    free(out);
    free(conf);
    conf = kt_write_conf("periodic:\n"
                         "  zoned: {cron: \"@daily\", class: A, tz: Europe/Atlantis}\n");
    args[2] = conf;
    st = kt_capstan_run(args, &out);
    cr_assert_eq(st, CAPSTAN_EXIT_CONFIG, "status %d: %s", st, out);
    cr_assert(strstr(out, "capstan.yml:4: periodic.zoned: tz: unknown time zone Europe/Atlantis"), "%s", out);
    free(out);
    free(conf);
}

/* Starts capstan with its clock moved by skew ("+30s") through Debian's
 * libfaketime: CLOCK_REALTIME and time() only, so its sleeps and timeouts
 * (CLOCK_MONOTONIC) stay real; the worker the supervisor forks inherits
 * it. */
static pid_t start_skewed(const char *conf, int metrics_port, const char *skew)
{
    glob_t g;
    cr_assert(glob("/usr/lib/*/faketime/libfaketime.so.1", 0, NULL, &g) == 0,
              "libfaketime is installed (Debian's faketime package, scripts/deps.sh)");
    const char *asan = getenv("ASAN_OPTIONS");
    char *asan_was = asan ? strdup(asan) : NULL, asan_now[1024];
    /* ASan wants to be first in the list of libraries; libfaketime is. */
    snprintf(asan_now, sizeof(asan_now), "%s%sverify_asan_link_order=0", asan ? asan : "", asan ? ":" : "");
    setenv("LD_PRELOAD", g.gl_pathv[0], 1);
    setenv("FAKETIME", skew, 1);
    setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1);
    setenv("ASAN_OPTIONS", asan_now, 1);
    pid_t pid = start(conf, metrics_port);
    unsetenv("LD_PRELOAD");
    unsetenv("FAKETIME");
    unsetenv("FAKETIME_DONT_FAKE_MONOTONIC");
    if (asan_was)
        setenv("ASAN_OPTIONS", asan_was, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(asan_was);
    globfree(&g);
    return pid;
}

/* Redis's clock, seconds. */
static double redis_now(void)
{
    redisReply *r = kt_cmd("TIME");
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    double t = atof(r->element[0]->str) + atof(r->element[1]->str) / 1e6;
    freeReplyObject(r);
    return t;
}

/* The ledger of an every-second schedule's queue, kept while it fills:
 * for each tick (from base), its jobs and when this test first saw one,
 * by Redis's clock. A job pushed before its tick is seen before it too. */
#define LEDGER 600
typedef struct ledger {
    long long base;
    int jobs[LEDGER];
    double seen[LEDGER];
    double enq_lag[LEDGER]; /* enqueued_at - tick of its job */
    long long outside;      /* jobs for ticks outside the ledger */
} ledger_t;

static void ledger_poll(ledger_t *l, const char *q)
{
    size_t n;
    tick_t *v = ticks_of(q, &n);
    double now = redis_now();
    int count[LEDGER] = { 0 };
    l->outside = 0;
    for (size_t i = 0; i < n; i++) {
        long long k = v[i].at - l->base;
        if (k < 0 || k >= LEDGER) {
            l->outside++;
            continue;
        }
        if (!count[k]++ && !l->jobs[k])
            l->seen[k] = now;
        l->enq_lag[k] = v[i].enqueued_at - (double)v[i].at;
    }
    memcpy(l->jobs, count, sizeof(count));
    free(v);
}

/* Polls queue q into l for seconds s. */
static void ledger_watch(ledger_t *l, const char *q, double s)
{
    double end = kt_now() + s;
    while (kt_now() < end) {
        ledger_poll(l, q);
        kt_sleep(0.05);
    }
}

/* Checks every tick from first to last (Redis time, both in the ledger):
 * one job each, seen neither before its tick nor LATE after it, its
 * enqueued_at by Redis's clock too (within LATE after the tick). Reports
 * the figures, returns the ticks bad. */
#define LATE 5.0
static long ledger_check(const ledger_t *l, long long first, long long last, const char *what)
{
    long missing = 0, doubled = 0, early = 0, late_seen = 0, stamped = 0, bad = 0;
    double worst_early = 0;
    for (long long t = first; t <= last; t++) {
        long long k = t - l->base;
        cr_assert(k >= 0 && k < LEDGER);
        int b = 0;
        if (!l->jobs[k])
            missing++, b = 1;
        else {
            if (l->jobs[k] > 1)
                doubled++, b = 1;
            if (l->seen[k] < (double)t) {
                early++, b = 1;
                if ((double)t - l->seen[k] > worst_early)
                    worst_early = (double)t - l->seen[k];
            }
            if (l->seen[k] - (double)t > LATE)
                late_seen++, b = 1;
            if (l->enq_lag[k] < 0 || l->enq_lag[k] > LATE)
                stamped++, b = 1;
        }
        if (b)
            fprintf(stderr, "periodic: %s: tick %lld (window %lld to %lld): %d jobs, seen %.3f, stamped %+.3f\n",
                    what, t, first, last, l->jobs[k], l->seen[k], l->enq_lag[k]);
        bad += b;
    }
    fprintf(stderr, "periodic: %s: %lld ticks, %ld missing, %ld doubled, %ld enqueued early (%.1f s at "
                    "worst), %ld late, %ld stamped off their tick\n",
            what, last - first + 1, missing, doubled, early, worst_early, late_seen, stamped);
    return bad;
}

/* The beat (capstan__now() at its last heartbeat) of the process that
 * wrote the newest one: how that process's clock reads. */
static double newest_beat(void)
{
    redisReply *r = kt_cmd("SMEMBERS processes");
    double best = 0;
    for (size_t i = 0; i < r->elements; i++) {
        char *b = kt_str("HGET %s beat", r->element[i]->str);
        if (b && atof(b) > best)
            best = atof(b);
        free(b);
    }
    freeReplyObject(r);
    return best;
}

/* The value of an unlabelled series in a scrape; NAN when absent. */
static double plain_series(const char *scrape, const char *name)
{
    char want[128];
    snprintf(want, sizeof(want), "\n%s ", name);
    const char *at = scrape ? strstr(scrape, want) : NULL;
    return at ? atof(at + strlen(want)) : 0.0 / 0.0;
}

Test(periodic, a_process_30_s_fast_joining_a_correct_one_loses_and_advances_no_tick)
{
    char *conf = kt_write_conf("queues: [other]\n"
                               "periodic:\n"
                               "  each_second: {cron: \"* * * * * *\", class: TickJob, queue: ticks}\n");
    int ports[2] = { kt_free_port(), kt_free_port() };
    pid_t fine = start(conf, ports[0]);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:ticks") >= 2, 15), "ticks come: %s", kt_capstan_log(fine));
    ledger_t *l = calloc(1, sizeof(*l));
    l->base = (long long)redis_now() - 60;
    long long from = newest("ticks");
    pid_t fast = start_skewed(conf, ports[1], "+30s");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 2, 20), "%s", kt_capstan_log(fast));
    cr_assert(KT_WAIT_UNTIL(newest_beat() - redis_now() > 25, 10), "libfaketime moves the second process's "
              "clock 30 s ahead: %s", kt_capstan_log(fast));
    ledger_watch(l, "ticks", 12);
    long long until = (long long)redis_now() - 1;
    char *scrape[2] = { kt_scrape(ports[0]), kt_scrape(ports[1]) };
    stop(fast, SIGTERM);
    stop(fine, SIGTERM);
    ledger_poll(l, "ticks");
    long ahead = 0;
    for (long long k = (long long)redis_now() + 1 - l->base; k < LEDGER; k++)
        ahead += l->jobs[k];
    long bad = ledger_check(l, from, until, "a correct process and one 30 s fast");
    fprintf(stderr, "periodic: %ld jobs for ticks still to come\n", ahead);
    char *log = kt_capstan_log(fast), *fine_log = kt_capstan_log(fine);
    cr_assert_eq(bad, 0, "every tick once, on time by Redis's clock: %s\n%s", log, fine_log);
    cr_assert_eq(ahead + l->outside, 0, "no job for a tick to come");
    cr_assert(!strstr(log, "missed tick") && !strstr(fine_log, "missed tick"), "%s", log);
    cr_assert(strstr(log, "clock is 30") && strstr(log, "s ahead of Redis's"), "the fast one says so: %s", log);
    cr_assert(!strstr(fine_log, "ahead of Redis's") && !strstr(fine_log, "behind Redis's"), "%s", fine_log);
    double off[2] = { plain_series(scrape[0], "capstan_clock_offset_seconds"),
                      plain_series(scrape[1], "capstan_clock_offset_seconds") };
    fprintf(stderr, "periodic: capstan_clock_offset_seconds %.3f (correct) and %.3f (30 s fast)\n", off[0],
            off[1]);
    cr_assert(off[0] > -1 && off[0] < 1, "%s", scrape[0]);
    cr_assert(off[1] > 29 && off[1] < 32, "%s", scrape[1]);
    free(scrape[0]);
    free(scrape[1]);
    free(log);
    free(fine_log);
    free(l);
    free(conf);
}

Test(periodic, a_process_30_s_slow_taking_over_alone_leaves_no_gap)
{
    char *conf = kt_write_conf("queues: [other]\n"
                               "periodic:\n"
                               "  each_second: {cron: \"* * * * * *\", class: TickJob, queue: ticks, missed: all}\n");
    pid_t fine = start(conf, 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:ticks") >= 2, 15), "ticks come: %s", kt_capstan_log(fine));
    ledger_t *l = calloc(1, sizeof(*l));
    l->base = (long long)redis_now() - 60;
    ledger_poll(l, "ticks");
    long long from = newest("ticks");
    int port = kt_free_port();
    stop(fine, SIGTERM);
    pid_t slow = start_skewed(conf, port, "-30s");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1 && newest_beat() > 0, 20), "%s",
              kt_capstan_log(slow));
    cr_assert(KT_WAIT_UNTIL(redis_now() - newest_beat() > 25, 10), "libfaketime moves the process's clock "
              "30 s back: %s", kt_capstan_log(slow));
    /* Ticks missed while no process ran are caught up late (missed:
     * all), so their enqueued_at is not checked: the ones after are. */
    long long up = (long long)redis_now();
    KT_WAIT_UNTIL(newest("ticks") > up, 10);
    long long on_time = (long long)redis_now();
    ledger_watch(l, "ticks", 8);
    long long until = (long long)redis_now() - 1;
    char *scrape = kt_scrape(port);
    stop(slow, SIGTERM);
    ledger_poll(l, "ticks");
    long missing = 0;
    for (long long t = from; t < on_time; t++)
        missing += !l->jobs[t - l->base];
    fprintf(stderr, "periodic: a process 30 s slow alone: %ld of the %lld ticks before it was on time missing\n",
            missing, on_time - from);
    long bad = ledger_check(l, on_time, until, "a process 30 s slow alone");
    char *log = kt_capstan_log(slow);
    cr_assert_eq(missing, 0, "no gap at the take-over: %s", log);
    cr_assert_eq(bad, 0, "every tick once, on time by Redis's clock: %s", log);
    cr_assert(strstr(log, "clock is 30") && strstr(log, "s behind Redis's"), "it says so: %s", log);
    double off = plain_series(scrape, "capstan_clock_offset_seconds");
    cr_assert(off > -32 && off < -29, "%s", scrape);
    free(scrape);
    free(log);
    free(l);
    free(conf);
}

/* A Rails team's sidekiq.yml as it is, read by two capstan processes with a
 * Ruby Sidekiq process beside them (which, without sidekiq-scheduler,
 * enqueues nothing): its sidekiq-scheduler cron: entry, run by Ruby, and
 * its every: "1s" entry with a description and its args as a hash each
 * tick exactly once a second; its sidekiq-cron entry with status: disabled
 * never. */
Test(periodic, a_rails_schedule_section_ticks_once_a_second_across_two_processes)
{
    char *conf = kt_write_conf(":queues: [other]\n"
                               ":schedule:\n"
                               "  nightly:\n"
                               "    cron: '* * * * * *'\n"
                               "    class: RecordJob\n"
                               "    queue: ruby_ticks\n"
                               "    args: ['sched:cron']\n"
                               "  heartbeat:\n"
                               "    every: '1s'\n"
                               "    description: 'pings the partner API'\n"
                               "    class: PingJob\n"
                               "    queue: ticks\n"
                               "    args: {region: eu}\n"
                               "  old_cleanup:\n"
                               "    cron: '* * * * * *'\n"
                               "    class: CleanupJob\n"
                               "    queue: ticks_off\n"
                               "    status: disabled\n");
    pid_t rb = kt_sidekiq_start("fleet_jobs.rb", "ruby_ticks");
    pid_t p[2] = { start(conf, 0), start(conf, 0) };
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:ticks") >= 2 && kt_int("LLEN sched:cron:log") >= 2, 60),
              "ticks come and Ruby runs them: %s\n%s", kt_capstan_log(p[0]), kt_sidekiq_log());
    long long first = newest("ticks") + 1, last = first + 19; /* 20 s of ticks */
    char last_jid[25];
    capstan__periodic_jid("nightly", last, last_jid);
    cr_assert(KT_WAIT_UNTIL(newest("ticks") >= last + 1 && kt_int("SISMEMBER sched:cron %s", last_jid) == 1, 30),
              "%s", kt_capstan_log(p[0]));
    for (int i = 0; i < 2; i++)
        stop(p[i], SIGTERM);
    /* The every: entry: one job a second, each with the hash as its one
     * argument. */
    size_t n;
    tick_t *v = ticks_of("ticks", &n);
    long per[32] = { 0 };
    for (size_t i = 0; i < n; i++)
        if (v[i].at >= first && v[i].at <= last)
            per[v[i].at - first]++;
    for (long long t = first; t <= last; t++)
        cr_expect_eq(per[t - first], 1, "heartbeat tick %lld: %ld jobs", t, per[t - first]);
    free(v);
    redisReply *one = kt_cmd("LINDEX queue:ticks 0");
    cr_assert(strstr(one->str, "\"args\":[{\"region\":\"eu\"}]") && strstr(one->str, "\"class\":\"PingJob\""),
              "%s", one->str);
    freeReplyObject(one);
    /* The cron: entry: each tick's job ran once, in Ruby. */
    for (long long t = first; t <= last; t++) {
        char jid[25];
        capstan__periodic_jid("nightly", t, jid);
        long runs = 0;
        redisReply *log = kt_cmd("LRANGE sched:cron:log 0 -1");
        for (size_t i = 0; i < log->elements; i++)
            runs += !strcmp(log->element[i]->str, jid);
        freeReplyObject(log);
        cr_expect_eq(runs, 1, "nightly tick %lld (%s) ran %ld times", t, jid, runs);
        cr_expect_eq(kt_int("SISMEMBER sched:cron:ruby %s", jid), 1, "tick %lld ran in Ruby", t);
    }
    /* The disabled entry: no job, no record. */
    cr_assert_eq(kt_int("LLEN queue:ticks_off"), 0);
    cr_assert_eq(kt_int("EXISTS capstan:periodic:old_cleanup"), 0);
    kt_capstan_stop(rb, SIGTERM, 30);
    free(conf);
}
