/* One capstan process serving three Sidekiq-format Redis servers at once
 * (the file's shards:): every job pushed into a shard runs exactly once,
 * in that shard (the handler writes which Redis its connection reaches);
 * each shard counts its own jobs in stat:processed and lists the process
 * in its own process set; a quiet asked on one shard quiets the process in
 * all of them.
 *
 * Ledger: ShardJob (tests/plugins/shards.c) appends "<jid> <port>" to one
 * file, shared by every process. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <math.h>

#include "capstan/batch.h"
#include "capstan/client.h"
#include "helpers.h"
#include "support/shard_pick.h"
#include "unique/admin_internal.h"

TestSuite(shards, .timeout = 280, .fini = kt_kill_children);

#define NSHARDS 3
#define PER_SHARD_MAX 10000

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
    f->conf = kt_shards_up(f->s, f->c, NSHARDS, "shard", "concurrency: 5\n", extra);
    f->ledger_dir = kt_ledger_dir();
}

/* `capstan run -r <shards plugin> -C <conf> args...`, its output in the
 * log kt_capstan_log reads, with no REDIS_URL (the shards give theirs). */
static pid_t capstan_up(fleet_t *f, const char *const *args)
{
    return kt_capstan_shards_start(f->conf, f->ledger_dir, args);
}

/* Job i of shard k: its jid says both ("5a00000k" then i). */
static void jid_of(char out[25], int k, unsigned i)
{
    snprintf(out, 25, "%08x%016x", 0x5a000000u | (unsigned)k, i);
}

/* Pushes ShardJobs from..from+n-1 of shard k into that shard's
 * queue:default, each with args. */
static void push(fleet_t *f, int k, unsigned from, unsigned n, const char *args)
{
    char **p = calloc(n, sizeof(char *));
    cr_assert(p);
    for (unsigned i = 0; i < n; i++) {
        char jid[25];
        jid_of(jid, k, from + i);
        p[i] = kt_payload("ShardJob", args, jid, "default");
    }
    kt_push_all(f->c[k], "default", p, n);
    for (unsigned i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

typedef struct ledger {
    unsigned char runs[NSHARDS][PER_SHARD_MAX];
    long lines, wrong_shard, unknown;
} ledger_t;

/* Reads the ledger into L: runs per jid, and the runs that happened on
 * another shard's Redis than the jid was pushed into. */
static void ledger_read(const fleet_t *f, ledger_t *L)
{
    memset(L, 0, sizeof(*L));
    kt_ledger_run_t *runs;
    long bad, parsed = kt_ledger_runs(f->ledger_dir, &runs, &bad);
    L->lines = parsed + bad;
    L->unknown = bad;
    for (long n = 0; n < parsed; n++) {
        const kt_ledger_run_t *r = &runs[n];
        int k = (int)(r->tag & 0xff);
        if ((r->tag & 0xffffff00u) != 0x5a000000u || k >= NSHARDS || r->i >= PER_SHARD_MAX) {
            L->unknown++;
            continue;
        }
        if (L->runs[k][r->i] < 255)
            L->runs[k][r->i]++;
        L->wrong_shard += r->port != f->s[k].port;
    }
    free(runs);
}

/* Jobs of shard k, 0..n-1, that ran other than once. */
static long not_once(const ledger_t *L, int k, unsigned n)
{
    long bad = 0;
    for (unsigned i = 0; i < n; i++)
        bad += L->runs[k][i] != 1;
    return bad;
}

static long long queued(fleet_t *f, int k)
{
    return kt_int_on(f->c[k], "LLEN queue:default");
}

static long long processed(fleet_t *f, int k)
{
    return kt_int_on(f->c[k], "GET stat:processed");
}

/* Every job of every shard (n[k] in shard k) ran once in its own shard,
 * and each shard's stat:processed counts its own. */
static void drain(fleet_t *f, pid_t pid, const unsigned n[NSHARDS])
{
    static ledger_t L;
    long total = 0;
    for (int k = 0; k < NSHARDS; k++)
        total += n[k];
    double t0 = kt_now();
    cr_assert(KT_WAIT_UNTIL((ledger_read(f, &L), L.lines >= total), 240),
              "%ld of %ld jobs ran; queued %lld %lld %lld\n%s", L.lines, total, queued(f, 0), queued(f, 1),
              queued(f, 2), kt_capstan_log(pid));
    printf("shards: %ld jobs over %d shards ran in %.1f s\n", total, NSHARDS, kt_now() - t0);
    for (int k = 0; k < NSHARDS; k++) {
        cr_assert(KT_WAIT_UNTIL(processed(f, k) == (long long)n[k], 10), "shard %d: stat:processed %lld, want %u",
                  k + 1, processed(f, k), n[k]);
        cr_assert_eq(queued(f, k), 0);
    }
    kt_sleep(0.5); /* a second run would show by now */
    ledger_read(f, &L);
    long once = 0;
    for (int k = 0; k < NSHARDS; k++)
        once += (long)n[k] - not_once(&L, k, n[k]);
    printf("shards: %ld of %ld jobs ran exactly once, %ld in another shard, %ld unknown lines\n", once, total,
           L.wrong_shard, L.unknown);
    cr_assert_eq(once, total);
    cr_assert_eq(L.lines, total);
    cr_assert_eq(L.wrong_shard, 0);
}

static void drain_all(fleet_t *f, pid_t pid, unsigned n)
{
    drain(f, pid, (const unsigned[NSHARDS]){ n, n, n });
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The members of each shard's process set, sorted, one string per shard;
 * returns 1 when all three hold the same nonempty set. */
static int same_processes(fleet_t *f, char out[NSHARDS][1024])
{
    for (int k = 0; k < NSHARDS; k++) {
        redisReply *r = redisCommand(f->c[k], "SMEMBERS processes");
        char *names[16];
        size_t n = 0, len = 0;
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements && n < 16; i++)
            names[n++] = r->element[i]->str;
        qsort(names, n, sizeof(*names), by_name);
        out[k][0] = '\0';
        for (size_t i = 0; i < n && len < 1024; i++)
            len += (size_t)snprintf(out[k] + len, 1024 - len, "%s ", names[i]);
        freeReplyObject(r);
    }
    return out[0][0] && !strcmp(out[0], out[1]) && !strcmp(out[1], out[2]);
}

Test(shards, every_job_once_in_its_own_shard)
{
    fleet_t f;
    fleet_up(&f, NULL);
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, 0, PER_SHARD_MAX, "[]");
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    char *id = kt_log_identity(pid);
    drain_all(&f, pid, PER_SHARD_MAX);
    char sets[NSHARDS][1024];
    cr_assert(same_processes(&f, sets), "process sets: [%s] [%s] [%s]", sets[0], sets[1], sets[2]);
    for (int k = 0; k < NSHARDS; k++) {
        cr_assert_eq(kt_int_on(f.c[k], "SISMEMBER processes %s", id), 1, "shard %d lacks %s", k + 1, id);
        /* Each shard's entry lists that shard's queues and counts its busy. */
        cr_assert_eq(kt_int_on(f.c[k], "HEXISTS %s info", id), 1);
    }
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    for (int k = 0; k < NSHARDS; k++)
        cr_assert_eq(kt_int_on(f.c[k], "SCARD processes"), 0, "shard %d still lists the process", k + 1);
    free(id);
}

Test(shards, supervised_workers_serve_every_shard)
{
    enum { N = PER_SHARD_MAX };
    fleet_t f;
    fleet_up(&f, "processes: 2\n");
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, 0, N, "[]");
    pid_t pid = capstan_up(&f, NULL);
    drain_all(&f, pid, N);
    char sets[NSHARDS][1024];
    /* Both workers, under the same identities, in every shard. */
    cr_assert(KT_WAIT_UNTIL(same_processes(&f, sets) && kt_int_on(f.c[0], "SCARD processes") == 2, 20),
              "process sets: [%s] [%s] [%s]", sets[0], sets[1], sets[2]);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    for (int k = 0; k < NSHARDS; k++)
        cr_assert_eq(kt_int_on(f.c[k], "SCARD processes"), 0, "shard %d still lists a worker", k + 1);
}

/* Sidekiq's Quiet button on shard 2's Web UI (TSTP pushed on the
 * process's signals list there, as Sidekiq::Process#quiet! does) quiets
 * the whole process: no shard's jobs are fetched after it, and every
 * shard's process entry says quiet. */
Test(shards, quiet_on_one_shard_quiets_every_shard)
{
    enum { N = 30, AFTER = 20 };
    fleet_t f;
    fleet_up(&f, NULL);
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, 0, N, "[]");
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    char *id = kt_log_identity(pid);
    drain_all(&f, pid, N);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[1], "SISMEMBER processes %s", id) == 1, 10));
    freeReplyObject(redisCommand(f.c[1], "LPUSH %s-signals TSTP", id));
    for (int k = 0; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL(({
                      redisReply *q = redisCommand(f.c[k], "HGET %s quiet", id);
                      int yes = q && q->type == REDIS_REPLY_STRING && !strcmp(q->str, "true");
                      freeReplyObject(q);
                      yes; }), 15),
                  "shard %d: the process is not quiet\n%s", k + 1, kt_capstan_log(pid));
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, N, AFTER, "[]");
    /* Several beats and polls: a fetcher still running would have taken
     * some by now. */
    kt_sleep(3);
    static ledger_t L;
    ledger_read(&f, &L);
    for (int k = 0; k < NSHARDS; k++)
        cr_assert_eq(queued(&f, k), AFTER, "shard %d: %lld of %d jobs pushed after the quiet are left", k + 1,
                     queued(&f, k), AFTER);
    cr_assert_eq(L.lines, N * NSHARDS, "%ld jobs ran after the quiet", L.lines - N * NSHARDS);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    printf("shards: quiet on shard 2: %lld %lld %lld jobs left queued in shards 1-3, %ld run after it\n",
           queued(&f, 0), queued(&f, 1), queued(&f, 2), L.lines - N * NSHARDS);
    free(id);
}

/* What Ruby Sidekiq `version` reads on shard k with tests/ruby/sidekiq.rb's
 * command cmd (at_url.rb), parsed; fails the test when it cannot. */
static json_t *sidekiq_at(const char *version, fleet_t *f, int k, const char *cmd)
{
    char *out = NULL;
    int rc = kt_ruby_v(version, "at_url.rb", (const char *[]){ f->s[k].url, cmd, NULL }, &out);
    cr_assert_eq(rc, 0, "sidekiq %s %s on shard %d: exit %d", version, cmd, k + 1, rc);
    json_t *v = json_loads(out, 0, NULL);
    cr_assert(v, "sidekiq %s %s on shard %d: %s", version, cmd, k + 1, out);
    free(out);
    return v;
}

/* Each shard's own Sidekiq API sees the process, as a Sidekiq process of
 * its own, with that shard's counts only: ProcessSet lists it, Stats
 * counts the shard's jobs, WorkSet shows a job running in shard 3 on
 * shard 3 alone, and Metrics::Query (7.x on) counts the shard's jobs. */
KT_SIDEKIQ_TEST(shards, each_shard_sidekiq_sees_its_own)
{
    const unsigned n[NSHARDS] = { 10, 20, 30 };
    fleet_t f;
    fleet_up(&f, "timeout: 2\n");
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, 0, n[k], "[]");
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    char *id = kt_log_identity(pid);
    drain(&f, pid, n);
    push(&f, 2, n[2], 1, "[30000]");
    char jid[25];
    jid_of(jid, 2, n[2]);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[2], "HLEN %s:work", id) == 1, 20), "%s", kt_capstan_log(pid));
    int modern = strcmp(sidekiq, KT_SIDEKIQ_DEBIAN) != 0;
    for (int k = 0; k < NSHARDS; k++) {
        json_t *procs = sidekiq_at(sidekiq, &f, k, "processes");
        cr_assert_eq(json_array_size(procs), 1, "shard %d: %zu processes", k + 1, json_array_size(procs));
        const char *pid_of = json_string_value(json_object_get(json_array_get(procs, 0), "identity"));
        cr_assert(pid_of && !strcmp(pid_of, id), "shard %d lists %s, not %s", k + 1, pid_of, id);
        json_decref(procs);

        json_t *stats = sidekiq_at(sidekiq, &f, k, "stats");
        long long p = json_integer_value(json_object_get(stats, "processed"));
        long long ps = json_integer_value(json_object_get(stats, "processes_size"));
        long long ws = json_integer_value(json_object_get(stats, "workers_size"));
        printf("shards: sidekiq %s on shard %d: processed %lld, processes %lld, busy %lld\n", sidekiq, k + 1, p,
               ps, ws);
        cr_assert_eq(p, n[k], "shard %d: Stats#processed %lld, want %u", k + 1, p, n[k]);
        cr_assert_eq(ps, 1);
        cr_assert_eq(ws, k == 2, "shard %d: Stats#workers_size %lld", k + 1, ws);
        json_decref(stats);

        json_t *works = sidekiq_at(sidekiq, &f, k, "workers");
        cr_assert_eq(json_array_size(works), k == 2, "shard %d: WorkSet has %zu entries", k + 1,
                     json_array_size(works));
        if (k == 2) {
            const char *wjid = json_string_value(json_object_get(json_array_get(works, 0), "jid"));
            cr_assert(wjid && !strcmp(wjid, jid), "shard 3's WorkSet shows %s, not %s", wjid, jid);
        }
        json_decref(works);

        if (!modern)
            continue;
        char *out = NULL;
        cr_assert_eq(kt_ruby_v(sidekiq, "metrics_at_url.rb", (const char *[]){ f.s[k].url, "ShardJob", NULL },
                               &out), 0);
        char want[64];
        snprintf(want, sizeof(want), "ShardJob p=%u f=0 ", n[k]);
        const char *line = strstr(out, "ShardJob p=");
        printf("shards: sidekiq %s Metrics::Query on shard %d: %.*s\n", sidekiq, k + 1,
               line ? (int)strcspn(line, "\n") : 0, line ? line : "");
        cr_assert(strstr(out, want), "shard %d: Metrics::Query says %s, want %s", k + 1, out, want);
        free(out);
    }
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    /* The long job went back to shard 3's queue at the stop. */
    cr_assert_eq(queued(&f, 2), 1);
    free(id);
}

/* Jobs of shard k that ran, as the ledger says. */
static long ran_in(const ledger_t *L, int k, unsigned n)
{
    long ran = 0;
    for (unsigned i = 0; i < n; i++)
        ran += L->runs[k][i] > 0;
    return ran;
}

/* Jobs of shards 1 and 3 run per second over the next s seconds. */
static double rate_13(const fleet_t *f, ledger_t *L, unsigned n, double s)
{
    ledger_read(f, L);
    long before = ran_in(L, 0, n) + ran_in(L, 2, n);
    double t0 = kt_now();
    kt_sleep(s);
    ledger_read(f, L);
    return (double)(ran_in(L, 0, n) + ran_in(L, 2, n) - before) / (kt_now() - t0);
}

/* A shard whose Redis dies (kill -9 mid-drain) stalls its own queues
 * only: the other two drain to the end while it is down, and once it is
 * back from its append-only file every one of its jobs runs, none lost;
 * a job that runs twice is one whose ack the dead server never wrote. */
/* Whether one line of pid's log holds both a and b. */
static int line_has(pid_t pid, const char *a, const char *b)
{
    const char *log = kt_capstan_log(pid);
    for (const char *p = log; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char *line = strndup(p, n);
        int both = line && strstr(line, a) && strstr(line, b);
        free(line);
        if (both)
            return 1;
        p = end ? end + 1 : p + n;
    }
    return 0;
}

Test(shards, a_dead_shard_stalls_only_its_own_queues)
{
    enum { N = 8000 };
    fleet_t f;
    fleet_up(&f, NULL);
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, 0, N, "[2]");
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    static ledger_t L;
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), ran_in(&L, 1, N) >= N / 10), 60), "%s", kt_capstan_log(pid));
    double before = rate_13(&f, &L, N, 1.0);
    long at_kill = ran_in(&L, 1, N);
    kt_aof_kill(&f.s[1]);
    redisFree(f.c[1]);
    f.c[1] = NULL;
    double after = rate_13(&f, &L, N, 1.0);
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), ran_in(&L, 0, N) == N && ran_in(&L, 2, N) == N), 120),
              "with shard 2 down, shards 1 and 3 ran %ld and %ld of %d\n%s", ran_in(&L, 0, N), ran_in(&L, 2, N), N,
              kt_capstan_log(pid));
    long while_down = ran_in(&L, 1, N);
    printf("shards: shards 1+3 ran %.0f jobs/s before shard 2's kill, %.0f after; shard 2 had run %ld of %d "
           "at the kill, %ld once 1 and 3 were done\n", before, after, at_kill, N, while_down);
    for (int k = 0; k < NSHARDS; k += 2)
        cr_assert_eq(queued(&f, k), 0);
    kt_aof_start(&f.s[1]);
    cr_assert((f.c[1] = kt_aof_connect(&f.s[1])) != NULL);
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), ran_in(&L, 1, N) == N), 120),
              "shard 2 ran %ld of %d after its restart; %lld queued\n%s", ran_in(&L, 1, N), N, queued(&f, 1),
              kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(queued(&f, 1) == 0, 20));
    kt_sleep(1); /* a second run would show by now */
    ledger_read(&f, &L);
    long twice = not_once(&L, 1, N), lost = N - ran_in(&L, 1, N);
    printf("shards: after shard 2's restart: %ld lost, %ld of its %d jobs ran twice (their acks were not "
           "written when it died), shards 1 and 3: %ld and %ld not run exactly once\n", lost, twice, N,
           not_once(&L, 0, N), not_once(&L, 2, N));
    cr_assert_eq(lost, 0);
    cr_assert_eq(not_once(&L, 0, N), 0);
    cr_assert_eq(not_once(&L, 2, N), 0);
    cr_assert_eq(L.wrong_shard, 0);
    /* At most the jobs in flight on shard 2 when it died: its processors'
     * and their acks still to be written. */
    cr_assert_leq(twice, 100);
    /* The outage and the recovery are logged naming the shard. */
    cr_assert(line_has(pid, " shard=s2 ", "retrying with backoff"), "%s", kt_capstan_log(pid));
    cr_assert(line_has(pid, " shard=s2 ", "Redis is online"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
}

/* The most handlers the ledger shows running at one time. */
static int most_at_once(const fleet_t *f)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/ledger", f->ledger_dir);
    char *text = kt_read_file(path);
    long long start[512], end[512];
    int n = 0, most = 0;
    for (char *line = text; line && *line && n < 512; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "")
        if (sscanf(line, "%*s %*d %lld %lld", &start[n], &end[n]) == 2)
            n++;
    for (int i = 0; i < n; i++) {
        int at = 0; /* running at job i's start */
        for (int j = 0; j < n; j++)
            at += start[j] <= start[i] && end[j] > start[i];
        most = at > most ? at : most;
    }
    free(text);
    return most;
}

/* concurrency is the process's: with three shards and concurrency 2, at
 * most two jobs run at once, whichever shards they come from. */
Test(shards, concurrency_is_the_process_budget)
{
    enum { N = 8 };
    fleet_t f;
    fleet_up(&f, "concurrency: 2\n");
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, 0, N, "[200]");
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    drain_all(&f, pid, N);
    int most = most_at_once(&f);
    printf("shards: concurrency 2 over 3 shards: at most %d jobs ran at once\n", most);
    cr_assert_leq(most, 2, "%d jobs ran at once", most);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
}

/* Each periodic schedule ticks in one shard, its home (the shard the
 * placing rule gives its name), and in none of the others. */
Test(shards, each_schedule_ticks_in_its_home_shard)
{
    static const char *const names[] = { "tick_a", "tick_b", "tick_c", "tick_d", "tick_e", "tick_f" };
    enum { NS = sizeof(names) / sizeof(names[0]) };
    char yml[2048] = "periodic:\n";
    size_t len = strlen(yml);
    for (int i = 0; i < NS; i++)
        len += (size_t)snprintf(yml + len, sizeof(yml) - len,
                                "  %s: {cron: \"* * * * * *\", class: ShardJob, queue: %s}\n", names[i], names[i]);
    fleet_t f;
    fleet_up(&f, yml);
    const char *shard_names[NSHARDS] = { "s1", "s2", "s3" };
    size_t home[NS], homes_used[NSHARDS] = { 0 };
    for (int i = 0; i < NS; i++)
        homes_used[home[i] = capstan__shard_pick(shard_names, NSHARDS, names[i], strlen(names[i]))]++;
    printf("shards: schedules per home shard: %zu %zu %zu\n", homes_used[0], homes_used[1], homes_used[2]);
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    for (int i = 0; i < NS; i++)
        cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[home[i]], "LLEN queue:%s", names[i]) >= 2, 20),
                  "%s: no ticks in its home shard %zu\n%s", names[i], home[i] + 1, kt_capstan_log(pid));
    for (int i = 0; i < NS; i++)
        for (int k = 0; k < NSHARDS; k++)
            if ((size_t)k != home[i])
                cr_assert_eq(kt_int_on(f.c[k], "EXISTS queue:%s", names[i]), 0, "%s ticked in shard %d too, home %zu",
                             names[i], k + 1, home[i] + 1);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
}

/* `capstan probe ready` (the metrics port's /readyz): 0 and "ok", or 1
 * and why, into *out (replaced). */
static int ready(int port, char **out)
{
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    free(*out);
    *out = NULL;
    return kt_capstan_run((const char *[]){ "probe", "ready", "--port", p, NULL }, out);
}

/* /readyz is ready only while every shard is: a frozen shard's Redis
 * (SIGSTOP) makes the process not ready, naming the shard, until it
 * answers again. */
Test(shards, readyz_needs_every_shard)
{
    int port = kt_free_port();
    char extra[64], *out = NULL;
    snprintf(extra, sizeof(extra), "metrics_port: %d\n", port);
    fleet_t f;
    fleet_up(&f, extra);
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    cr_assert(KT_WAIT_UNTIL(ready(port, &out) == 0, 20), "%s\n%s", out, kt_capstan_log(pid));
    kill(f.s[1].pid, SIGSTOP);
    int down = KT_WAIT_UNTIL(ready(port, &out) == 1, 20);
    char *why = strdup(out ? out : "");
    kill(f.s[1].pid, SIGCONT);
    printf("shards: /readyz with shard 2 frozen: %s", why);
    cr_assert(down && strstr(why, "shard s2"), "%s", why);
    cr_assert(KT_WAIT_UNTIL(ready(port, &out) == 0, 20), "after SIGCONT: %s", out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    free(why);
    free(out);
}

/* The pid in the process entry of identity on shard k, or 0. */
static pid_t entry_pid(fleet_t *f, int k, const char *identity)
{
    redisReply *r = redisCommand(f->c[k], "HGET %s info", identity);
    json_t *info = r && r->type == REDIS_REPLY_STRING ? json_loads(r->str, 0, NULL) : NULL;
    pid_t pid = (pid_t)json_integer_value(json_object_get(info, "pid"));
    json_decref(info);
    freeReplyObject(r);
    return pid;
}

/* A supervised worker killed (kill -9) while it runs a job in each of
 * shards 2 and 3: the supervisor gives back its jobs in every shard at
 * once (no lease to wait for), takes it off every shard's process set,
 * and its replacement runs the jobs. */
Test(shards, a_dead_worker_is_recovered_in_every_shard)
{
    fleet_t f;
    fleet_up(&f, "timeout: 2\n");
    pid_t sup = capstan_up(&f, NULL);
    char *id = NULL;
    cr_assert(KT_WAIT_UNTIL(({
                  redisReply *r = redisCommand(f.c[2], "SRANDMEMBER processes");
                  if (r && r->type == REDIS_REPLY_STRING)
                      id = strdup(r->str);
                  freeReplyObject(r);
                  id != NULL; }), 20), "%s", kt_capstan_log(sup));
    for (int k = 1; k < NSHARDS; k++)
        push(&f, k, 0, 1, "[60000]");
    for (int k = 1; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[k], "HLEN %s:work", id) == 1, 20), "%s", kt_capstan_log(sup));
    pid_t worker = entry_pid(&f, 2, id);
    cr_assert(worker > 0 && worker != sup);
    double t0 = kt_now();
    kill(worker, SIGKILL);
    /* Well within the fleet's own orphan recovery (liveness_ttl 60 s). */
    for (int k = 1; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[k], "SISMEMBER processes %s", id) == 0
                                    && kt_int_on(f.c[k], "HLEN %s:work", id) == 0, 15),
                  "shard %d still has the dead worker\n%s", k + 1, kt_capstan_log(sup));
    /* Its replacement runs each job again, in its own shard. */
    char *id2 = NULL;
    for (int k = 1; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL(({
                      redisReply *r = redisCommand(f.c[k], "SRANDMEMBER processes");
                      free(id2);
                      id2 = r && r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;
                      freeReplyObject(r);
                      id2 && kt_int_on(f.c[k], "HLEN %s:work", id2) == 1; }), 20),
                  "shard %d: the replacement does not run the job\n%s", k + 1, kt_capstan_log(sup));
    printf("shards: a dead worker's jobs of shards 2 and 3 given back and running again %.1f s after the kill\n",
           kt_now() - t0);
    cr_assert_str_neq(id2, id);
    cr_assert_eq(kt_capstan_stop(sup, SIGTERM, 30), 0, "%s", kt_capstan_log(sup));
    free(id);
    free(id2);
}

/* A dead worker's jobs in the shards that answer are given back at once
 * even while another of its shards is frozen (SIGSTOP). */
Test(shards, a_frozen_shard_does_not_hold_back_the_others_recovery)
{
    fleet_t f;
    fleet_up(&f, "timeout: 2\n");
    pid_t sup = capstan_up(&f, NULL);
    char *id = NULL;
    cr_assert(KT_WAIT_UNTIL(({
                  redisReply *r = redisCommand(f.c[2], "SRANDMEMBER processes");
                  if (r && r->type == REDIS_REPLY_STRING)
                      id = strdup(r->str);
                  freeReplyObject(r);
                  id != NULL; }), 20), "%s", kt_capstan_log(sup));
    push(&f, 2, 0, 1, "[60000]");
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[2], "HLEN %s:work", id) == 1, 20), "%s", kt_capstan_log(sup));
    pid_t worker = entry_pid(&f, 2, id);
    cr_assert(worker > 0 && worker != sup);
    kill(f.s[1].pid, SIGSTOP);
    kill(worker, SIGKILL);
    char *wkey = kt_working_key(id);
    int back = KT_WAIT_UNTIL(kt_int_on(f.c[2], "EXISTS %s", wkey) == 0
                                 && kt_int_on(f.c[2], "SISMEMBER processes %s", id) == 0, 15);
    kill(f.s[1].pid, SIGCONT);
    cr_assert(back, "shard 3 still holds the dead worker's job while shard 2 is frozen\n%s", kt_capstan_log(sup));
    cr_assert_eq(kt_capstan_stop(sup, SIGTERM, 30), 0, "%s", kt_capstan_log(sup));
    free(wkey);
    free(id);
}

/* A job recovered after a crash waits in its own shard's quarantine (the
 * worker that fetched it there moved it, or a stop left it): the
 * supervisor's quarantine worker reads the quarantine of every shard, a
 * shard with a queues: list of its own too, and runs it once there. */
Test(shards, a_quarantined_job_runs_in_its_own_shard)
{
    fleet_t f;
    fleet_up(&f, "");
    /* s2 reads its own list: its quarantine must still be read. */
    char yml[2048];
    snprintf(yml, sizeof(yml), "concurrency: 2\nqueues: [default, own]\nshards:\n"
                               "  - name: s1\n    redis_url: %s\n"
                               "  - name: s2\n    redis_url: %s\n    queues: [own]\n"
                               "  - name: s3\n    redis_url: %s\n", f.s[0].url, f.s[1].url, f.s[2].url);
    free(f.conf);
    f.conf = kt_write_conf(yml);
    char jid[25], *p = NULL;
    jid_of(jid, 1, 7);
    cr_assert(asprintf(&p, "{\"retry\":true,\"queue\":\"own\",\"args\":[],\"class\":\"ShardJob\",\"recovery_count\":1,"
                           "\"jid\":\"%s\",\"created_at\":1767225600.1,\"enqueued_at\":1767225600.2}", jid) > 0);
    freeReplyObject(redisCommand(f.c[1], "LPUSH queue:capstan:quarantine %s", p));
    free(p);
    pid_t sup = capstan_up(&f, NULL);
    static ledger_t L;
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), L.runs[1][7] == 1), 60), "the job did not run\n%s",
              kt_capstan_log(sup));
    cr_assert_eq(L.wrong_shard, 0);
    cr_assert_eq(kt_int_on(f.c[1], "LLEN queue:capstan:quarantine"), 0);
    cr_assert(kt_log_has(sup, "quarantine worker"), "%s", kt_capstan_log(sup));
    cr_assert_eq(kt_capstan_stop(sup, SIGTERM, 30), 0, "%s", kt_capstan_log(sup));
}

/* The value of the sample whose name and labels are exactly series in a
 * scrape's text, or -1. */
static double sample_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

/* The series a line of a scrape names: "# HELP name" or "# TYPE name"
 * for a comment, the name and labels of a sample (up to its value). */
static size_t key_len(const char *line, size_t len)
{
    size_t k = line[0] == '#' && len > 7 ? 7 : len;
    if (line[0] == '#')
        while (k < len && line[k] != ' ')
            k++;
    else
        while (k > 0 && line[k - 1] != ' ')
            k--;
    return line[0] == '#' || !k ? k : k - 1;
}

/* Whether two lines of text starting with prefix name the same series
 * (or family); prints the first such. */
static int repeated_lines(const char *text, const char *prefix)
{
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *end = strchr(p, '\n');
        size_t k = key_len(p, end ? (size_t)(end - p) : strlen(p));
        if (strncmp(p, prefix, pl))
            continue;
        for (const char *q = end ? end + 1 : NULL; q && *q; q = strchr(q, '\n') ? strchr(q, '\n') + 1 : NULL)
            if (!strncmp(q, p, k) && q[k] == ' ') {
                printf("shards: repeated in /metrics: %.*s\n", (int)k, p);
                return 1;
            }
    }
    return 0;
}

/* A scrape's body is a valid exposition: no family or series twice, and
 * promtool (when installed) accepts it. */
static void check_exposition(const char *body)
{
    cr_assert(!repeated_lines(body, "# "), "a family twice:\n%s", body);
    cr_assert(!repeated_lines(body, "capstan_"), "a series twice:\n%s", body);
    if (system("command -v promtool >/dev/null 2>&1") == 0) {
        FILE *pt = popen("promtool check metrics", "w");
        cr_assert_not_null(pt);
        fputs(body, pt);
        int st = pclose(pt);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "promtool rejected:\n%s", body);
    }
}

/* With shards, /metrics tells the shards' jobs apart: each shard's job
 * series carry shard="NAME" and count that shard's jobs alone (7, 3, 12
 * pushed, one more expired in s2), each family once, the whole text valid
 * for promtool; the counters are each shard's too. */
Test(shards, metrics_label_each_shards_jobs)
{
    int port = kt_free_port();
    char extra[64];
    snprintf(extra, sizeof(extra), "metrics_port: %d\n", port);
    fleet_t f;
    fleet_up(&f, extra);
    const unsigned n[NSHARDS] = { 7, 3, 12 };
    char jid[25], *p = NULL;
    jid_of(jid, 1, 999);
    cr_assert(asprintf(&p, "{\"retry\":true,\"queue\":\"default\",\"args\":[],\"class\":\"ShardJob\",\"jid\":\"%s\","
                           "\"created_at\":1767225600.1,\"enqueued_at\":1767225600.2,\"expires_at\":1767225601}",
                       jid) > 0);
    freeReplyObject(redisCommand(f.c[1], "LPUSH queue:default %s", p));
    free(p);
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, 0, n[k], "[]");
    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    drain(&f, pid, n);
    char *text = NULL, want[NSHARDS][160];
    for (int k = 0; k < NSHARDS; k++)
        snprintf(want[k], sizeof(want[k]),
                 "capstan_jobs_processed_total{shard=\"s%d\",class=\"ShardJob\",queue=\"default\"}", k + 1);
    const char *skipped = "capstan_jobs_skipped_total{shard=\"s2\",class=\"ShardJob\",reason=\"expired\"}";
    int got = KT_WAIT_UNTIL((free(text), text = kt_scrape(port)) != NULL && sample_of(text, want[0]) == n[0]
                                && sample_of(text, want[1]) == n[1] && sample_of(text, want[2]) == n[2]
                                && sample_of(text, skipped) == 1,
                            20);
    double seen[NSHARDS];
    for (int k = 0; k < NSHARDS; k++)
        seen[k] = sample_of(text, want[k]);
    printf("shards: /metrics jobs processed by shard: s1 %g s2 %g s3 %g (want %u %u %u), expired in s2 %g, "
           "unlabelled %g\n",
           seen[0], seen[1], seen[2], n[0], n[1], n[2], sample_of(text, skipped),
           sample_of(text, "capstan_jobs_processed_total{class=\"ShardJob\",queue=\"default\"}"));
    cr_assert(got, "%s", text);
    const char *body = strstr(text, "\r\n\r\n");
    cr_assert(body, "%s", text);
    body += 4;
    for (int k = 0; k < NSHARDS; k++) {
        char dur[160];
        snprintf(dur, sizeof(dur), "capstan_job_duration_seconds_count{shard=\"s%d\",class=\"ShardJob\"}", k + 1);
        cr_assert_eq(sample_of(body, dur), n[k], "%s", body);
    }
    cr_assert(!strstr(body, "capstan_jobs_processed_total{class="), "an unlabelled job series too:\n%s", body);
    cr_assert_geq(sample_of(body, "capstan_redis_reconnects_total{shard=\"s2\"}"), 0, "each shard's counters:\n%s", body);
    check_exposition(body);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    free(text);
}

/* Writes a supervised two-worker config naming the first n shards to
 * f->conf, in place: the path `capstan run -C` was given. */
static void conf_of(fleet_t *f, int n)
{
    char yml[2048];
    int len = snprintf(yml, sizeof(yml), "poll_interval_average: 1\nheartbeat_interval: 1\nprocesses: 2\n"
                                         "concurrency: 5\ntimeout: 2\nshards:\n");
    for (int k = 0; k < n; k++)
        len += snprintf(yml + len, sizeof(yml) - (size_t)len, "  - name: s%d\n    redis_url: %s\n", k + 1,
                        f->s[k].url);
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.new", f->conf);
    FILE *fp = fopen(tmp, "w");
    cr_assert(fp && fputs(yml, fp) >= 0 && fclose(fp) == 0);
    cr_assert(rename(tmp, f->conf) == 0);
}

/* The holder of shard k's one running job: its identity (caller frees),
 * or NULL. */
static char *busy_in(fleet_t *f, int k)
{
    char *id = NULL;
    redisReply *r = redisCommand(f->c[k], "SMEMBERS processes");
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements && !id; i++)
        if (kt_int_on(f->c[k], "HLEN %s:work", r->element[i]->str) == 1)
            id = strdup(r->element[i]->str);
    freeReplyObject(r);
    return id;
}

/* A shard added to the file of a running supervised capstan: a HUP's
 * rolling restart serves it (its jobs run once each there, and both
 * workers are in its process set), and a worker killed (kill -9) after
 * the reload has its jobs given back at once in every shard, the new one
 * too, by a replacement that serves all three. */
Test(shards, a_shard_added_to_the_file_is_served_after_a_hup)
{
    enum { N = 200 };
    fleet_t f;
    fleet_up(&f, "");
    conf_of(&f, 2);
    pid_t sup = capstan_up(&f, NULL);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[1], "SCARD processes") == 2, 30), "%s", kt_capstan_log(sup));
    cr_assert_eq(kt_int_on(f.c[2], "SCARD processes"), 0, "shard 3 is served before it is in the file");
    conf_of(&f, 3);
    kill(sup, SIGHUP);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(sup, "reload done: 2 workers"), 60), "%s", kt_capstan_log(sup));
    push(&f, 2, 0, N, "[]");
    static ledger_t L;
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), L.runs[2][N - 1] && L.lines >= N), 120),
              "%ld of %d jobs of the new shard ran\n%s", L.lines, N, kt_capstan_log(sup));
    kt_sleep(0.5); /* a second run would show by now */
    ledger_read(&f, &L);
    printf("shards: %ld of %d jobs of the shard added by a HUP ran other than once, %ld in another shard\n",
           not_once(&L, 2, N), N, L.wrong_shard);
    cr_assert_eq(not_once(&L, 2, N), 0);
    cr_assert_eq(L.lines, N);
    cr_assert_eq(L.wrong_shard, 0);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[2], "SCARD processes") == 2, 20), "%s", kt_capstan_log(sup));

    /* A running job in each shard; the holder of shard 3's is killed. */
    for (int k = 0; k < NSHARDS; k++)
        push(&f, k, N + 1, 1, "[60000]");
    char *id = NULL;
    for (int k = 0; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL((free(id), (id = busy_in(&f, k)) != NULL), 20), "shard %d\n%s", k + 1,
                  kt_capstan_log(sup));
    pid_t worker = entry_pid(&f, 2, id);
    cr_assert(worker > 0 && worker != sup);
    char *wkey = kt_working_key(id);
    kill(worker, SIGKILL);
    /* Well within the fleet's own orphan recovery (liveness_ttl 60 s). */
    for (int k = 0; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[k], "SISMEMBER processes %s", id) == 0
                                    && kt_int_on(f.c[k], "EXISTS %s", wkey) == 0, 15),
                  "shard %d still holds the dead worker's jobs\n%s", k + 1, kt_capstan_log(sup));
    /* Its replacement serves the new shard too, and the job runs again. */
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[2], "SCARD processes") == 2, 30),
              "shard 3 lists %lld processes after the replacement\n%s", kt_int_on(f.c[2], "SCARD processes"),
              kt_capstan_log(sup));
    char *again = NULL;
    cr_assert(KT_WAIT_UNTIL((free(again), (again = busy_in(&f, 2)) != NULL), 20), "%s", kt_capstan_log(sup));
    cr_assert_str_neq(again, id);
    cr_assert_eq(kt_capstan_stop(sup, SIGTERM, 30), 0, "%s", kt_capstan_log(sup));
    free(again);
    free(wkey);
    free(id);
}

/* A name for a periodic schedule whose home is shard k (the placing
 * rule's pick), into out. */
static void homed_name(char out[32], const char *stem, int k)
{
    const char *shard_names[NSHARDS] = { "s1", "s2", "s3" };
    for (int i = 0;; i++) {
        snprintf(out, 32, "%s%d", stem, i);
        if (capstan__shard_pick(shard_names, NSHARDS, out, strlen(out)) == (size_t)k)
            return;
    }
}

/* The samples of family (its name and "{") in text that name another
 * shard than shard, or none: printed, and how many. */
static int strays(const char *text, const char *family, const char *shard)
{
    char mine[96];
    snprintf(mine, sizeof(mine), "%s{shard=\"%s\"", family, shard);
    size_t fl = strlen(family), ml = strlen(mine);
    int n = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, family, fl) && (p[fl] == '{' || p[fl] == ' ') && strncmp(p, mine, ml)) {
            printf("shards: %s outside shard %s: %.*s\n", family, shard, (int)strcspn(p, "\n"), p);
            n++;
        }
    return n;
}

/* Every series about a shard carries its shard's label and that shard's
 * own figure: uniqueness locks taken in s1 (and v9's per-minute lock
 * counts written to s1's Redis alone), a limiter (homed in s1) taken by
 * s2's jobs, an orphan recovered and a batch's callback fired in s2, a
 * periodic schedule homed in s3 and fetches refused there, each shard's
 * queue sizes (2, 5 and 9 jobs parked), Redis and clock offset. */
Test(shards, metrics_label_every_shard_series)
{
    int port = kt_free_port();
    char tick[32], extra[512];
    homed_name(tick, "mtick", 2);
    snprintf(extra, sizeof(extra),
             "metrics_port: %d\nqueues:\n  - default\n  - broken\n"
             "classes:\n  PlainJob:\n    limit: {type: concurrent, name: mlim, size: 2, shard: s1}\n"
             "periodic:\n  %s: {cron: \"* * * * * *\", class: ShardJob, queue: ticks}\n",
             port, tick);
    fleet_t f;
    fleet_up(&f, extra);
    const long long parked[NSHARDS] = { 2, 5, 9 };
    for (int k = 0; k < NSHARDS; k++) {
        for (long long i = 0; i < parked[k]; i++)
            freeReplyObject(redisCommand(f.c[k], "LPUSH queue:parked {}"));
        freeReplyObject(redisCommand(f.c[k], "SADD queues parked"));
    }
    /* s1: three jobs under uniqueness locks. */
    for (unsigned i = 0; i < 3; i++) {
        char jid[25], key[16];
        jid_of(jid, 0, i);
        snprintf(key, sizeof(key), "m%u", i);
        char *p = kt_payload_locked("ShardJob", "[]", jid, "default", "until_executed", key);
        freeReplyObject(redisCommand(f.c[0], "LPUSH queue:default %s", p));
        free(p);
    }
    /* s2: four limited jobs, an orphan of a dead process, a batch. */
    for (unsigned i = 0; i < 4; i++) {
        char jid[25];
        jid_of(jid, 1, i);
        char *p = kt_payload("PlainJob", "[]", jid, "default");
        freeReplyObject(redisCommand(f.c[1], "LPUSH queue:default %s", p));
        free(p);
    }
    char jid[25], err[256];
    jid_of(jid, 1, 100);
    char *orphan = kt_payload("ShardJob", "[]", jid, "default");
    freeReplyObject(redisCommand(f.c[1], "LPUSH uniquejobs:working:gone:1:aaaaaaaaaaaa %s", orphan));
    free(orphan);
    capstan_client_t *cl = capstan_client_new(f.s[1].url, err);
    cr_assert(cl, "%s", err);
    capstan_batch_t *b = capstan_batch_new(cl, err);
    cr_assert(b, "%s", err);
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_COMPLETE, "ShardJob", "default", NULL), 0);
    cr_assert_eq(capstan_batch_push(b, "ShardJob", "[]", NULL, jid), 0, "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    capstan_batch_free(b);
    capstan_client_free(cl);
    /* s3: a queue that holds another type than a list. */
    freeReplyObject(redisCommand(f.c[2], "SET queue:broken x"));

    pid_t pid = capstan_up(&f, (const char *[]){ "--no-supervisor", NULL });
    char want_tick[96], *text = NULL;
    snprintf(want_tick, sizeof(want_tick), "capstan_periodic_enqueued_total{shard=\"s3\",schedule=\"%s\"}", tick);
    const char *locks = "capstan_lock_events_total{shard=\"s1\",type=\"until_executed\",event=\"released\"}";
    const char *limited = "capstan_limiter_acquired_total{shard=\"s2\",limiter=\"mlim\"}";
    const char *recovered = "capstan_orphans_recovered_total{shard=\"s2\"}";
    const char *completed = "capstan_batches_completed_total{shard=\"s2\"}";
    const char *callback = "capstan_batch_callback_latency_seconds_count{shard=\"s2\",event=\"complete\"}";
    const char *refused = "capstan_fetch_errors_total{shard=\"s3\"}";
    const char *lock_counts = "return #redis.call('keys', 'uniquejobs:metrics|*')";
    int got = KT_WAIT_UNTIL((free(text), text = kt_scrape(port)) != NULL && sample_of(text, locks) == 3
                                && sample_of(text, limited) == 4 && sample_of(text, recovered) == 1
                                && sample_of(text, completed) == 1 && sample_of(text, callback) == 1
                                && sample_of(text, want_tick) >= 1 && sample_of(text, refused) >= 1
                                && kt_int_on(f.c[0], "EVAL %s 0", lock_counts) > 0,
                            30);
    printf("shards: /metrics by shard: locks s1 %g, limiter s2 %g, orphans s2 %g, batches s2 %g (callback %g), "
           "ticks s3 %g, fetch errors s3 %g\n",
           sample_of(text, locks), sample_of(text, limited), sample_of(text, recovered), sample_of(text, completed),
           sample_of(text, callback), sample_of(text, want_tick), sample_of(text, refused));
    cr_assert(got, "%s\n%s", text, kt_capstan_log(pid));
    const char *body = strstr(text, "\r\n\r\n");
    cr_assert(body, "%s", text);
    body += 4;
    /* Each family in its shard alone. */
    cr_assert_eq(strays(body, "capstan_lock_events_total", "s1"), 0, "%s", body);
    cr_assert_eq(strays(body, "capstan_limiter_acquired_total", "s2"), 0, "%s", body);
    cr_assert_eq(strays(body, "capstan_batch_callback_latency_seconds_count", "s2"), 0, "%s", body);
    cr_assert_eq(strays(body, "capstan_periodic_enqueued_total", "s3"), 0, "%s", body);
    for (int k = 0; k < NSHARDS; k++) {
        char series[128];
        snprintf(series, sizeof(series), "capstan_orphans_recovered_total{shard=\"s%d\"}", k + 1);
        cr_assert_eq(sample_of(body, series), k == 1, "%s", body);
        snprintf(series, sizeof(series), "capstan_batches_completed_total{shard=\"s%d\"}", k + 1);
        cr_assert_eq(sample_of(body, series), k == 1, "%s", body);
        snprintf(series, sizeof(series), "capstan_fetch_errors_total{shard=\"s%d\"}", k + 1);
        if (k != 2)
            cr_assert_eq(sample_of(body, series), 0, "%s", body);
        snprintf(series, sizeof(series), "capstan_queue_size{shard=\"s%d\",queue=\"parked\"}", k + 1);
        cr_assert_eq(sample_of(body, series), kt_int_on(f.c[k], "LLEN queue:parked"), "%s", body);
        cr_assert_eq(sample_of(body, series), parked[k], "%s", body);
        snprintf(series, sizeof(series), "capstan_redis_up{shard=\"s%d\"}", k + 1);
        cr_assert_eq(sample_of(body, series), 1, "%s", body);
        snprintf(series, sizeof(series), "capstan_clock_offset_seconds{shard=\"s%d\"}", k + 1);
        cr_assert(fabs(sample_of(body, series)) < 5, "%s", body);
        /* v9's lock counts went to the Redis of the shard that took the locks. */
        if (k)
            cr_assert_eq(kt_int_on(f.c[k], "EVAL %s 0", lock_counts), 0,
                         "lock counts of s1 written to s%d's Redis", k + 1);
    }
    /* Nothing about a shard left unlabelled. */
    static const char *const unlabelled[] = {
        "capstan_orphans_recovered_total", "capstan_batches_completed_total", "capstan_fetch_errors_total",
        "capstan_redis_reconnects_total", "capstan_late_acks_total", "capstan_redis_up",
        "capstan_clock_offset_seconds", "capstan_dead_size",
    };
    for (size_t i = 0; i < sizeof(unlabelled) / sizeof(unlabelled[0]); i++)
        cr_assert_eq(sample_of(body, unlabelled[i]), -1, "%s without a shard:\n%s", unlabelled[i], body);
    cr_assert(!strstr(body, "{queue=") && !strstr(body, "{type=") && !strstr(body, "{limiter=")
                  && !strstr(body, "{schedule=") && !strstr(body, "{event="),
              "a series of a shard without its label:\n%s", body);
    check_exposition(body);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    free(text);
}

/* Under a supervisor (processes: 2) /readyz judges every worker by every
 * shard it serves: a frozen shard 2 makes it not ready, naming a worker
 * and the shard, and ready again once that Redis answers; after a reload,
 * a frozen worker other than the one serving the port makes it not ready
 * too, naming that worker. */
Test(shards, supervised_readyz_judges_every_worker_by_every_shard)
{
    int port = kt_free_port();
    char extra[96], *out = NULL;
    snprintf(extra, sizeof(extra), "processes: 2\nmetrics_port: %d\n", port);
    fleet_t f;
    fleet_up(&f, extra);
    pid_t sup = capstan_up(&f, NULL);
    cr_assert(KT_WAIT_UNTIL(ready(port, &out) == 0 && kt_log_has(sup, "all 2 workers ready"), 40), "%s\n%s", out,
              kt_capstan_log(sup));
    kill(f.s[1].pid, SIGSTOP);
    int down = KT_WAIT_UNTIL(ready(port, &out) == 1, 30);
    char *why = strdup(out ? out : "");
    kill(f.s[1].pid, SIGCONT);
    printf("shards: supervised /readyz with shard 2 frozen: %s", why);
    cr_assert(down && strstr(why, "shard s2: ") && (strstr(why, "worker 0: ") || strstr(why, "worker 1: ")), "%s\n%s",
              why, kt_capstan_log(sup));
    cr_assert(KT_WAIT_UNTIL(ready(port, &out) == 0, 30), "after SIGCONT: %s\n%s", out, kt_capstan_log(sup));
    free(why);

    /* Workers started from the binary on disk (a HUP) share the stamps too. */
    kill(sup, SIGHUP);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(sup, "reload done") && ready(port, &out) == 0, 60), "%s\n%s", out,
              kt_capstan_log(sup));
    pid_t w1 = kt_worker_pid(sup, 1);
    cr_assert(w1 > 0, "%s", kt_capstan_log(sup));
    kill(w1, SIGSTOP);
    down = KT_WAIT_UNTIL(ready(port, &out) == 1, 30);
    why = strdup(out ? out : "");
    kill(w1, SIGCONT);
    printf("shards: supervised /readyz with worker 1 frozen: %s", why);
    cr_assert(down && strstr(why, "worker 1: "), "%s\n%s", why, kt_capstan_log(sup));
    cr_assert(KT_WAIT_UNTIL(ready(port, &out) == 0, 30), "after SIGCONT: %s\n%s", out, kt_capstan_log(sup));
    cr_assert_eq(kt_capstan_stop(sup, SIGTERM, 60), 0, "%s", kt_capstan_log(sup));
    free(why);
    free(out);
}

/* Uniqueness lock counts recorded by a program's own thread, outside
 * every shard, while a sharded runtime runs in the process: they reach the
 * first shard's Redis with one of its beats, not only at start. */
Test(shards, lock_counts_of_a_thread_outside_every_shard_reach_the_first_shard)
{
    fleet_t f;
    fleet_up(&f, NULL);
    char err[CAPSTAN_ERRLEN], name[8];
    capstan_config_t *cfg = capstan_config_new();
    cr_assert(cfg);
    cfg->concurrency = 2;
    cfg->heartbeat_interval = 0.5;
    for (int k = 0; k < NSHARDS; k++) {
        snprintf(name, sizeof(name), "s%d", k + 1);
        cr_assert_eq(capstan_config_add_shard(cfg, name, f.s[k].url, NULL, 0, err), 0, "%s", err);
    }
    capstan_runtime_t *rt = capstan_runtime_new(cfg, err);
    cr_assert(rt, "%s", err);
    const char *id = capstan_runtime_identity(rt);
    kt_runtime_start(rt);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[0], "SISMEMBER processes %s", id) == 1, 20));
    /* Past the start's beat: this thread counts a lock taken. */
    cr_assert_eq(capstan__unique_metric_record(NULL, "until_executed", "locked"), 0);
    const char *sum = "local n = 0 for _, k in ipairs(redis.call('keys', 'uniquejobs:metrics|*')) do "
                      "n = n + tonumber(redis.call('hget', k, 'until_executed|locked') or 0) end return n";
    int got = KT_WAIT_UNTIL(kt_int_on(f.c[0], "EVAL %s 0", sum) == 1, 20);
    kt_runtime_end(rt);
    cr_assert(got, "the count of a thread outside every shard never reached s1");
    for (int k = 1; k < NSHARDS; k++)
        cr_assert_eq(kt_int_on(f.c[k], "EVAL %s 0", sum), 0, "written to s%d", k + 1);
}
