/* State with a home in a sharded fleet: a rate limiter lives in one shard
 * (its limit's shard:, else the placing rule's pick of its name), so that
 * its size holds across every shard and every process; a batch made
 * through a sharded client puts all its jobs in one shard (the pick of its
 * bid), where its counters and callbacks are too; a periodic schedule
 * ticks once in its home shard, however many processes offer its ticks.
 *
 * Ledger: ShardJob (tests/plugins/shards.c) appends "<jid> <port> <start>
 * <end>" to one file, shared by every process. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <capstan/batch.h>
#include <capstan/client.h>
#include <capstan/config.h>
#include <capstan/limiter.h>

#include "helpers.h"
#include "support/shard_pick.h"

TestSuite(shard_home, .timeout = 280, .fini = kt_kill_children);

#define NSHARDS 3
#define PER_SHARD_MAX 1024

typedef struct fleet {
    kt_aof_redis_t s[NSHARDS];
    redisContext *c[NSHARDS];
    char *conf;
    char *ledger_dir;
} fleet_t;

/* The three servers up, and a capstan.yml naming them s1..s3 (after the
 * fixture's fast polls and beats), with extra after. */
static void fleet_up(fleet_t *f, const char *extra)
{
    f->conf = kt_shards_up(f->s, f->c, NSHARDS, "home", "concurrency: 5\n", extra);
    f->ledger_dir = kt_ledger_dir();
}

/* `capstan run -r <shards plugin> -C <conf> --no-supervisor`, its output
 * in the log kt_capstan_log reads, with no REDIS_URL. */
static pid_t capstan_up(fleet_t *f)
{
    return kt_capstan_shards_start(f->conf, f->ledger_dir, (const char *[]){ "--no-supervisor", NULL });
}

/* Job i of shard k: its jid says both ("5b00000k" then i). */
static void jid_of(char out[25], int k, unsigned i)
{
    snprintf(out, 25, "%08x%016x", 0x5b000000u | (unsigned)k, i);
}

/* Pushes ShardJobs 0..n-1 of shard k into that shard's queue:default. */
static void push(fleet_t *f, int k, unsigned n, const char *args)
{
    char **p = calloc(n, sizeof(char *));
    cr_assert(p);
    for (unsigned i = 0; i < n; i++) {
        char jid[25];
        jid_of(jid, k, i);
        p[i] = kt_payload("ShardJob", args, jid, "default");
    }
    kt_push_all(f->c[k], "default", p, n);
    for (unsigned i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

typedef struct ledger {
    unsigned char runs[NSHARDS][PER_SHARD_MAX];
    long lines, wrong_shard, unknown, most; /* most: handlers running at once */
} ledger_t;

/* Reads the ledger into L: runs per jid, the runs on another shard's Redis
 * than the jid was pushed into, and the most handlers that ran at once. */
static void ledger_read(const fleet_t *f, ledger_t *L)
{
    memset(L, 0, sizeof(*L));
    kt_ledger_run_t *runs;
    long bad, n = kt_ledger_runs(f->ledger_dir, &runs, &bad), ok = 0;
    L->lines = n + bad;
    L->unknown = bad;
    for (long m = 0; m < n; m++) {
        const kt_ledger_run_t *r = &runs[m];
        int k = (int)(r->tag & 0xff);
        if ((r->tag & 0xffffff00u) != 0x5b000000u || k >= NSHARDS || r->i >= PER_SHARD_MAX) {
            L->unknown++;
            continue;
        }
        runs[ok++] = *r;
        if (L->runs[k][r->i] < 255)
            L->runs[k][r->i]++;
        L->wrong_shard += r->port != f->s[k].port;
    }
    for (long i = 0; i < ok; i++) {
        long at = 0; /* running as job i started */
        for (long j = 0; j < ok; j++)
            at += runs[j].start <= runs[i].start && runs[j].end > runs[i].start;
        L->most = at > L->most ? at : L->most;
    }
    free(runs);
}

/* The keys of shard k matching pattern. */
static long long keys(fleet_t *f, int k, const char *pattern)
{
    redisReply *r = redisCommand(f->c[k], "KEYS %s", pattern);
    long long n = r && r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : -1;
    freeReplyObject(r);
    return n;
}

/* A concurrent limiter of size 3 homed in shard s2, its class's jobs in all
 * three shards, two processes serving all three: never more than 3 of them
 * run at once in the whole fleet, and the limiter's keys are in s2 only. */
Test(shard_home, a_limiter_holds_its_size_across_the_fleet)
{
    enum { N = 12 };
    fleet_t f;
    fleet_up(&f, "classes:\n  ShardJob:\n    limit: {type: concurrent, name: fleetwide, size: 3, shard: s2}\n");
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, N, "[300]");
    pid_t a = capstan_up(&f), b = capstan_up(&f);
    static ledger_t L;
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), L.lines >= NSHARDS * N), 240), "%ld of %d jobs ran\n%s\n%s",
              L.lines, NSHARDS * N, kt_capstan_log(a), kt_capstan_log(b));
    kt_sleep(0.5); /* a second run would show by now */
    ledger_read(&f, &L);
    long once = 0;
    for (int k = 0; k < NSHARDS; k++)
        for (unsigned i = 0; i < N; i++)
            once += L.runs[k][i] == 1;
    printf("shard_home: a limiter of size 3 over 3 shards and 2 processes: at most %ld jobs ran at once; "
           "%ld of %d ran once, %ld in another shard\n", L.most, once, NSHARDS * N, L.wrong_shard);
    long long held[NSHARDS];
    for (int k = 0; k < NSHARDS; k++)
        held[k] = keys(&f, k, "limiter:fleetwide:*");
    printf("shard_home: limiter:fleetwide:* keys by shard: %lld %lld %lld\n", held[0], held[1], held[2]);
    cr_assert_leq(L.most, 3, "%ld jobs of a limit of 3 ran at once", L.most);
    cr_assert_eq(once, NSHARDS * N);
    cr_assert_eq(L.lines, NSHARDS * N);
    cr_assert_eq(L.wrong_shard, 0);
    cr_assert_gt(held[1], 0);
    cr_assert_eq(held[0], 0);
    cr_assert_eq(held[2], 0);
    cr_assert_eq(kt_capstan_stop(a, SIGTERM, 30), 0, "%s", kt_capstan_log(a));
    cr_assert_eq(kt_capstan_stop(b, SIGTERM, 30), 0, "%s", kt_capstan_log(b));
}

/* A client with the fleet's three shards (s1..s3), its own URL s1's;
 * *cfg is the config it uses (the caller frees both). */
static capstan_client_t *sharded_client(const fleet_t *f, capstan_config_t **cfg)
{
    char err[CAPSTAN_ERRLEN];
    *cfg = capstan_config_new();
    cr_assert(*cfg);
    for (int k = 0; k < NSHARDS; k++) {
        char name[8];
        snprintf(name, sizeof(name), "s%d", k + 1);
        cr_assert_eq(capstan_config_add_shard(*cfg, name, f->s[k].url, NULL, 0, err), 0, "%s", err);
    }
    cr_assert_eq(capstan_config_validate(*cfg, err), 0, "%s", err);
    capstan_client_t *c = capstan_client_new(f->s[0].url, err);
    cr_assert(c, "%s", err);
    capstan_client_use_config(c, *cfg);
    return c;
}

/* The ledger's lines by the port of the Redis each handler ran on, and
 * how many distinct jids it holds. */
static long lines_on(const fleet_t *f, int port, long *distinct)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/ledger", f->ledger_dir);
    char *text = kt_read_file(path);
    long n = 0, d = 0;
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        if (!next)
            break;
        char jid[32];
        int p = 0;
        if (sscanf(line, "%31s %d", jid, &p) == 2 && p == port) {
            n++;
            /* Distinct: no earlier line has this jid. */
            size_t len = strlen(jid);
            int seen = 0;
            for (char *q = text; q < line && !seen; q = strchr(q, '\n') + 1)
                seen = !strncmp(q, jid, len) && q[len] == ' ';
            d += !seen;
        }
        line = next + 1;
    }
    free(text);
    if (distinct)
        *distinct = d;
    return n;
}

/* Starts capstan on fleet f and waits for runs runs of the ledger in shard
 * home (a batch's jobs and callbacks), then a second more, for a callback
 * run twice to show: the runs there, distinct ones, and those in other
 * shards. Returns the process. */
static pid_t run_batches(fleet_t *f, int home, long runs, long *here, long *distinct, long *elsewhere)
{
    pid_t pid = capstan_up(f);
    cr_assert(KT_WAIT_UNTIL(lines_on(f, f->s[home].port, NULL) >= runs, 120), "%ld of %ld runs in the home "
              "shard\n%s", lines_on(f, f->s[home].port, NULL), runs, kt_capstan_log(pid));
    kt_sleep(1);
    *here = lines_on(f, f->s[home].port, distinct);
    *elsewhere = 0;
    for (int k = 0; k < NSHARDS; k++)
        *elsewhere += k == home ? 0 : lines_on(f, f->s[k].port, NULL);
    return pid;
}

/* A batch of 1,000 jobs made through a client with three shards: every job
 * goes to the batch's home shard (the pick of its bid), where its counters
 * are, and a process serving every shard runs them and fires its success
 * callback once, there. */
Test(shard_home, a_batch_lives_in_one_shard)
{
    enum { N = 1000 };
    fleet_t f;
    fleet_up(&f, NULL);
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg;
    capstan_client_t *c = sharded_client(&f, &cfg);
    /* A bid homed away from the client's own URL (s1's), so that the
     * client's connection there cannot pass for the home. */
    const char *names[NSHARDS] = { "s1", "s2", "s3" };
    capstan_batch_t *b = NULL;
    int home = 0;
    for (int tries = 0; tries < 100 && home == 0; tries++) {
        capstan_batch_free(b);
        cr_assert((b = capstan_batch_new(c, err)) != NULL, "%s", err);
        home = (int)capstan__shard_pick(names, NSHARDS, capstan_batch_bid(b), strlen(capstan_batch_bid(b)));
    }
    cr_assert_neq(home, 0);
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "ShardJob", "default", NULL), 0);
    static const char *args[N];
    for (int i = 0; i < N; i++)
        args[i] = "[]";
    int rc = capstan_batch_push_bulk(b, "ShardJob", args, N, NULL, NULL);
    long long queued[NSHARDS];
    for (int k = 0; k < NSHARDS; k++)
        queued[k] = kt_int_on(f.c[k], "LLEN queue:default");
    const char *bid = capstan_batch_bid(b);
    printf("shard_home: a batch of %d through a sharded client (home s%d): push rc %d (%s), queued by "
           "shard %lld %lld %lld\n", N, home + 1, rc, capstan_batch_error(b), queued[0], queued[1], queued[2]);
    cr_assert_eq(rc, 0, "%s", capstan_batch_error(b));
    for (int k = 0; k < NSHARDS; k++)
        cr_assert_eq(queued[k], k == home ? N : 0, "shard s%d holds %lld of the batch's jobs", k + 1, queued[k]);
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    pid_t pid = capstan_up(&f);
    long distinct = 0;
    cr_assert(KT_WAIT_UNTIL(lines_on(&f, f.s[home].port, NULL) >= N + 1, 240), "%ld of %d jobs and the "
              "callback ran in the home shard\n%s", lines_on(&f, f.s[home].port, NULL), N + 1,
              kt_capstan_log(pid));
    kt_sleep(1); /* a second callback would show by now */
    long here = lines_on(&f, f.s[home].port, &distinct), elsewhere = 0;
    for (int k = 0; k < NSHARDS; k++)
        elsewhere += k == home ? 0 : lines_on(&f, f.s[k].port, NULL);
    capstan_batch_status_t st = {0};
    capstan_redis_t *hr = capstan_redis_new(f.s[home].url, 10, err);
    cr_assert(hr && capstan_redis_connect(hr) == 0);
    cr_assert_eq(capstan_batch_status(hr, bid, &st, err), 0, "%s", err);
    capstan_redis_free(hr);
    printf("shard_home: %ld runs in the home shard (%ld distinct jids: the jobs and one callback), %ld "
           "elsewhere; pending %ld, succeeded at %.0f\n", here, distinct, elsewhere, st.pending, st.success_at);
    cr_assert_eq(here, N + 1);
    cr_assert_eq(distinct, N + 1);
    cr_assert_eq(elsewhere, 0);
    cr_assert_eq(st.pending, 0);
    cr_assert_gt(st.success_at, 0);
    capstan_batch_status_clear(&st);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    capstan_batch_free(b);
    capstan_client_free(c);
    capstan_config_free(cfg);
}

/* The periodic_at of each tick in shard k's queue:NAME (into at, up to
 * max), and how many jids repeat. Returns how many ticks it holds. */
static long ticks_in(fleet_t *f, int k, const char *name, long long *at, long max, long *jid_twice)
{
    redisReply *r = redisCommand(f->c[k], "LRANGE queue:%s 0 -1", name);
    cr_assert(r && r->type == REDIS_REPLY_ARRAY);
    long n = 0;
    *jid_twice = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const char *p = r->element[i]->str, *t = strstr(p, "\"periodic_at\":"), *j = strstr(p, "\"jid\":\"");
        cr_assert(t && j, "%s", p);
        if (n < max)
            at[n++] = atoll(t + strlen("\"periodic_at\":"));
        for (size_t m = 0; m < i; m++)
            *jid_twice += !strncmp(strstr(r->element[m]->str, "\"jid\":\""), j, strlen("\"jid\":\"") + 24);
    }
    freeReplyObject(r);
    return n;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Three processes over three shards, each with the same schedules of a
 * tick a second, one homed in each shard: each tick (its periodic_at, its
 * jid) is enqueued exactly once in the whole fleet, in its schedule's home
 * shard (the pick of its name), and no other shard gets any. The ticks' queues are not fetched, so every tick stays to be
 * counted. */
Test(shard_home, three_processes_enqueue_each_tick_once)
{
    enum { NS = NSHARDS, TICKS = 6, MAX = 256 };
    /* A schedule homed in each shard: the front's and both members'. */
    const char *shard_names[NSHARDS] = { "s1", "s2", "s3" };
    char names[NS][32], yml[1024] = "periodic:\n";
    size_t home[NS], len = strlen(yml);
    for (int i = 0; i < NS; i++) {
        unsigned n = 0;
        do
            snprintf(names[i], sizeof(names[i]), "fleet_tick_%u", n++);
        while (capstan__shard_pick(shard_names, NSHARDS, names[i], strlen(names[i])) != (size_t)i);
        home[i] = (size_t)i;
        len += (size_t)snprintf(yml + len, sizeof(yml) - len,
                                "  %s: {cron: \"* * * * * *\", class: ShardJob, queue: %s}\n", names[i], names[i]);
    }
    fleet_t f;
    fleet_up(&f, yml);
    pid_t p[3];
    for (int i = 0; i < 3; i++)
        p[i] = capstan_up(&f);
    for (int i = 0; i < 3; i++)
        cr_assert(KT_WAIT_UNTIL(kt_log_has(p[i], "Starting processing") && kt_log_has(p[i], "shard s2: connected")
                                && kt_log_has(p[i], "shard s3: connected"), 60), "%s", kt_capstan_log(p[i]));
    /* Every process is up: TICKS more ticks of each schedule, all three
     * offering each. */
    long long from[NS];
    for (int i = 0; i < NS; i++)
        from[i] = kt_int_on(f.c[home[i]], "LLEN queue:%s", names[i]);
    for (int i = 0; i < NS; i++)
        cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[home[i]], "LLEN queue:%s", names[i]) >= from[i] + TICKS, 60),
                  "%s: %lld ticks\n%s", names[i], kt_int_on(f.c[home[i]], "LLEN queue:%s", names[i]),
                  kt_capstan_log(p[0]));
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kt_capstan_stop(p[i], SIGTERM, 30), 0, "%s", kt_capstan_log(p[i]));
    for (int i = 0; i < NS; i++) {
        static long long at[MAX];
        long jid_twice, n = ticks_in(&f, (int)home[i], names[i], at, MAX, &jid_twice), twice = 0;
        qsort(at, (size_t)n, sizeof(at[0]), cmp_ll);
        for (long k = 1; k < n; k++)
            twice += at[k] == at[k - 1];
        long long span = n ? at[n - 1] - at[0] + 1 : 0;
        long elsewhere = 0;
        for (int k = 0; k < NSHARDS; k++)
            elsewhere += (size_t)k != home[i] && kt_int_on(f.c[k], "EXISTS queue:%s", names[i]);
        printf("shard_home: %s (home s%zu) over 3 processes: %ld ticks over %lld s, %ld times enqueued twice "
               "(%ld jids twice); other shards holding its queue: %ld\n", names[i], home[i] + 1, n, span, twice,
               jid_twice, elsewhere);
        cr_assert_geq(n, TICKS);
        cr_assert_eq(twice, 0, "%s: %ld ticks enqueued twice", names[i], twice);
        cr_assert_eq(n, span, "%s: %ld ticks over %lld s: some were lost", names[i], n, span);
        cr_assert_eq(jid_twice, 0);
        cr_assert_eq(elsewhere, 0);
    }
}

/* Pushes one job of cls with args and jid into shard k's queue:default. */
static void push_one(fleet_t *f, int k, const char *cls, const char *args, const char *jid)
{
    char *p = kt_payload(cls, args, jid, "default");
    kt_push_all(f->c[k], "default", &p, 1);
    free(p);
}

/* The line of log holding needle, as a new string ("" when none). */
static char *line_of(const char *log, const char *needle)
{
    const char *at = strstr(log, needle);
    if (!at)
        return strdup("");
    while (at > log && at[-1] != '\n')
        at--;
    const char *eol = strchr(at, '\n');
    return strndup(at, eol ? (size_t)(eol - at) : strlen(at));
}

/* A handler that crashes in shard s3 of a sharded process, while jobs run
 * in s1 and s2: the crash report names it first, in its shard, and the
 * jobs of every shard's processors after it, each with its shard. */
Test(shard_home, the_crash_report_lists_every_shards_jobs)
{
    /* No core file in the test directory; and a sanitizer's SEGV handler
     * would report instead of capstan's. */
    setrlimit(RLIMIT_CORE, &(struct rlimit){ 0, 0 });
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof(opts), "%s%shandle_segv=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    fleet_t f;
    fleet_up(&f, NULL);
    pid_t pid = kt_capstan_shards_start(f.conf, f.ledger_dir,
                                        (const char *[]){ "-r", getenv("CAPSTAN_PLUGIN"), "--no-supervisor", NULL });
    push_one(&f, 0, "SleepJob", "[20000]", "c5000000000000000000000a");
    push_one(&f, 1, "SleepJob", "[20000]", "c5000000000000000000000b");
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "class=SleepJob") == 2, 30), "%s", kt_capstan_log(pid));
    push_one(&f, 2, "SegfaultJob", "[]", "c5000000000000000000000c");
    int st = kt_wait_exit(pid, 30);
    char *log = kt_capstan_log(pid);
    char *crasher = line_of(log, "FATAL: running SegfaultJob"), *a = line_of(log, "FATAL: running SleepJob jid=c5000000000000000000000a"),
         *b = line_of(log, "FATAL: running SleepJob jid=c5000000000000000000000b");
    const char *first = strstr(log, "FATAL: running ");
    printf("shard_home: the crash report of a sharded process:\n  %s\n  %s\n  %s\n", crasher, a, b);
    cr_assert_eq(st, 128 + SIGSEGV, "died with %d, not of SIGSEGV: %s", st, log);
    cr_assert(first && first == strstr(log, "FATAL: running SegfaultJob jid=c5000000000000000000000c"),
              "the first job line does not name the crasher: %s", log);
    cr_assert(strstr(crasher, " in shard s3 (its thread took the signal)"), "%s", log);
    cr_assert(strstr(a, " in shard s1") && strstr(b, " in shard s2"), "%s", log);
    free(crasher);
    free(a);
    free(b);
    free(log);
}

/* The index among s1..s3 of the placing rule's pick of bid. */
static int pick_of(const char *bid)
{
    const char *names[NSHARDS] = { "s1", "s2", "s3" };
    return (int)capstan__shard_pick(names, NSHARDS, bid, strlen(bid));
}

/* A child batch made through a sharded client that is not pinned, its bid
 * picking another shard than its parent's: it lives in its parent's shard
 * (its link to the parent and its callbacks are counted there), a reopen
 * through that client finds it there, and a process serving every shard
 * runs all its jobs and both batches' callbacks in that shard, the
 * parent's success firing once after the child's. */
Test(shard_home, a_child_batch_lives_in_its_parents_shard)
{
    fleet_t f;
    fleet_up(&f, NULL);
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg;
    capstan_client_t *c = sharded_client(&f, &cfg);
    capstan_batch_t *parent = capstan_batch_new(c, err), *child = NULL;
    cr_assert(parent, "%s", err);
    int home = pick_of(capstan_batch_bid(parent));
    do {
        capstan_batch_free(child);
        cr_assert((child = capstan_batch_new(c, err)) != NULL, "%s", err);
    } while (pick_of(capstan_batch_bid(child)) == home);
    char child_bid[40];
    snprintf(child_bid, sizeof(child_bid), "%s", capstan_batch_bid(child));
    cr_assert_eq(capstan_batch_on(parent, CAPSTAN_BATCH_SUCCESS, "ShardJob", "default", NULL), 0);
    cr_assert_eq(capstan_batch_push(parent, "ShardJob", "[]", NULL, NULL), 0, "%s", capstan_batch_error(parent));
    cr_assert_eq(capstan_batch_set_parent(child, capstan_batch_bid(parent)), 0, "%s", capstan_batch_error(child));
    cr_assert_eq(capstan_batch_on(child, CAPSTAN_BATCH_SUCCESS, "ShardJob", "default", NULL), 0);
    static const char *args[] = { "[]", "[]" };
    int pushed = capstan_batch_push_bulk(child, "ShardJob", args, 2, NULL, NULL);
    printf("shard_home: a child batch (its bid picks s%d) of a parent in s%d: push rc %d (%s)\n",
           pick_of(child_bid) + 1, home + 1, pushed, capstan_batch_error(child));
    cr_assert_eq(pushed, 0, "%s", capstan_batch_error(child));
    cr_assert_eq(capstan_batch_commit(child), 0, "%s", capstan_batch_error(child));
    capstan_batch_free(child);
    /* Reopened through the same client, not pinned: found where it is. */
    child = capstan_batch_reopen(c, child_bid, err);
    cr_assert(child, "reopen: %s", err);
    cr_assert_eq(capstan_batch_push(child, "ShardJob", "[]", NULL, NULL), 0, "%s", capstan_batch_error(child));
    cr_assert_eq(capstan_batch_commit(child), 0, "%s", capstan_batch_error(child));
    cr_assert_eq(capstan_batch_commit(parent), 0, "%s", capstan_batch_error(parent));
    long long held[NSHARDS];
    for (int k = 0; k < NSHARDS; k++)
        held[k] = keys(&f, k, "batch:*");
    printf("shard_home: batch:* keys by shard: %lld %lld %lld\n", held[0], held[1], held[2]);
    for (int k = 0; k < NSHARDS; k++)
        cr_assert(k == home ? held[k] > 0 : held[k] == 0, "shard s%d holds %lld batch keys", k + 1, held[k]);
    /* The parent's job, the child's three, the child's callback and the
     * parent's. */
    enum { RUNS = 6 };
    long here, distinct, elsewhere;
    pid_t pid = run_batches(&f, home, RUNS, &here, &distinct, &elsewhere);
    capstan_batch_status_t ps = {0}, cs = {0};
    capstan_redis_t *hr = capstan_redis_new(f.s[home].url, 10, err);
    cr_assert(hr && capstan_redis_connect(hr) == 0);
    cr_assert_eq(capstan_batch_status(hr, capstan_batch_bid(parent), &ps, err), 0, "%s", err);
    cr_assert_eq(capstan_batch_status(hr, child_bid, &cs, err), 0, "%s", err);
    capstan_redis_free(hr);
    printf("shard_home: %ld runs in the home shard (%ld distinct), %ld elsewhere; parent pending %ld, "
           "succeeded after the child: %s\n", here, distinct, elsewhere, ps.pending,
           ps.success_at >= cs.success_at && cs.success_at > 0 ? "yes" : "no");
    cr_assert_eq(here, RUNS);
    cr_assert_eq(distinct, RUNS);
    cr_assert_eq(elsewhere, 0);
    cr_assert_eq(ps.pending, 0);
    cr_assert_gt(cs.success_at, 0);
    cr_assert_geq(ps.success_at, cs.success_at);
    capstan_batch_status_clear(&ps);
    capstan_batch_status_clear(&cs);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    capstan_batch_free(child);
    capstan_batch_free(parent);
    capstan_client_free(c);
    capstan_config_free(cfg);
}

/* A program's own use of a class's limiter in a sharded fleet: the home
 * capstan_limiter_home gives (the pick of the limiter's name, here s3, not
 * the s1 a program's first connection would reach) is where the server
 * middleware takes the class's slots too. While the program holds the one
 * slot there, none of the class's jobs (in s1) runs; once it gives the
 * slot back, they all run, one at a time. */
Test(shard_home, a_limiter_used_directly_at_its_home_shares_the_fleets_slots)
{
    enum { N = 3 };
    const char *names[NSHARDS] = { "s1", "s2", "s3" };
    char name[32], extra[256];
    unsigned i = 0;
    do
        snprintf(name, sizeof(name), "direct_%u", i++);
    while (capstan__shard_pick(names, NSHARDS, name, strlen(name)) != 2);
    snprintf(extra, sizeof(extra), "classes:\n  ShardJob:\n    limit: {type: concurrent, name: %s, size: 1, "
             "wait_timeout: 30}\n", name);
    fleet_t f;
    fleet_up(&f, extra);
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = capstan_config_new();
    cr_assert(cfg);
    cr_assert_eq(capstan_config_load_file(cfg, f.conf, err), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    const char *home = NULL, *url = capstan_limiter_home(cfg, name, NULL, &home);
    printf("shard_home: limiter %s's home: %s (%s)\n", name, home ? home : "(none)", url ? url : "(none)");
    cr_assert(url && home && !strcmp(home, "s3") && !strcmp(url, f.s[2].url));
    cr_assert_null(capstan_limiter_home(cfg, name, "s9", NULL));
    capstan_redis_t *r = capstan_redis_new(url, 10, err);
    cr_assert(r && capstan_redis_connect(r) == 0, "%s", err);
    capstan_limiter_t *lim = capstan_limiter_new(CAPSTAN_LIMIT_CONCURRENT, name, 1, 0, err);
    cr_assert(lim, "%s", err);
    capstan_limit_token_t tok;
    cr_assert_eq(capstan_limiter_acquire(lim, r, 0, &tok, NULL, err), 0, "%s", err);
    push(&f, 0, N, "[100]");
    pid_t pid = capstan_up(&f);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[0], "LLEN queue:default") == 0, 30), "%s", kt_capstan_log(pid));
    kt_sleep(1); /* a job let through would have run by now */
    static ledger_t L;
    ledger_read(&f, &L);
    long while_held = L.lines;
    cr_assert_eq(capstan_limiter_release(lim, r, &tok, err), 0, "%s", err);
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), L.lines >= N), 60), "%ld of %d ran\n%s", L.lines, N,
              kt_capstan_log(pid));
    printf("shard_home: while the program held the slot at home, %ld of %d jobs ran; after, %ld, at most %ld at "
           "once\n", while_held, N, L.lines, L.most);
    cr_assert_eq(while_held, 0);
    cr_assert_eq(L.most, 1);
    cr_assert_eq(keys(&f, 0, "limiter:*"), 0);
    cr_assert_gt(keys(&f, 2, "limiter:*"), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    capstan_limiter_free(lim);
    capstan_redis_free(r);
    capstan_config_free(cfg);
}

/* A parent batch and its child made from Ruby (capstan_batch.rb) with
 * Capstan::Shards configured, the child's bid picking another shard than
 * the parent's home: both live in the parent's home, the child reopened
 * there too, and a capstan process serving every shard runs all their jobs
 * and both callbacks in that shard. */
KT_SIDEKIQ_TEST(shard_home, a_ruby_batch_and_its_child_live_in_one_shard)
{
    fleet_t f;
    fleet_up(&f, NULL);
    char *spec = NULL, *out = NULL;
    cr_assert(asprintf(&spec, "s1=%s,s2=%s,s3=%s", f.s[0].url, f.s[1].url, f.s[2].url) > 0);
    int st = kt_ruby_v(sidekiq, "batch_shards.rb", (const char *[]){ spec, NULL }, &out);
    cr_assert_eq(st, 0, "%s", out);
    char pbid[40] = "", phome[8] = "", cbid[40] = "", chome[8] = "";
    const char *p = strstr(out, "PARENT "), *c = strstr(out, "CHILD ");
    cr_assert(p && c && sscanf(p, "PARENT %39s %7s", pbid, phome) == 2 && sscanf(c, "CHILD %39s %7s", cbid, chome) == 2,
              "%s", out);
    int home = phome[1] - '1';
    cr_assert(home >= 0 && home < NSHARDS, "%s", out);
    long long held[NSHARDS], queued[NSHARDS];
    for (int k = 0; k < NSHARDS; k++) {
        held[k] = keys(&f, k, "batch:*");
        queued[k] = kt_int_on(f.c[k], "LLEN queue:default");
    }
    printf("shard_home: Sidekiq %s: a Ruby batch in %s, its child (bid picking s%d) in %s; batch keys by shard "
           "%lld %lld %lld, jobs %lld %lld %lld\n", sidekiq, phome, pick_of(cbid) + 1, chome, held[0], held[1],
           held[2], queued[0], queued[1], queued[2]);
    cr_assert_neq(pick_of(cbid), home);
    cr_assert_str_eq(chome, phome);
    for (int k = 0; k < NSHARDS; k++) {
        cr_assert(k == home ? held[k] > 0 : held[k] == 0, "shard s%d holds %lld batch keys", k + 1, held[k]);
        cr_assert_eq(queued[k], k == home ? 4 : 0, "shard s%d holds %lld jobs", k + 1, queued[k]);
    }
    /* The four jobs, the child's callback and the parent's. */
    enum { RUNS = 6 };
    long here, distinct, elsewhere;
    pid_t pid = run_batches(&f, home, RUNS, &here, &distinct, &elsewhere);
    char err[CAPSTAN_ERRLEN];
    capstan_batch_status_t ps = {0};
    capstan_redis_t *hr = capstan_redis_new(f.s[home].url, 10, err);
    cr_assert(hr && capstan_redis_connect(hr) == 0);
    cr_assert_eq(capstan_batch_status(hr, pbid, &ps, err), 0, "%s", err);
    capstan_redis_free(hr);
    printf("shard_home: Sidekiq %s: %ld runs in the home shard (%ld distinct), %ld elsewhere; parent pending "
           "%ld\n", sidekiq, here, distinct, elsewhere, ps.pending);
    cr_assert_eq(here, RUNS);
    cr_assert_eq(distinct, RUNS);
    cr_assert_eq(elsewhere, 0);
    cr_assert_eq(ps.pending, 0);
    cr_assert_gt(ps.success_at, 0);
    capstan_batch_status_clear(&ps);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    free(spec);
    free(out);
}
