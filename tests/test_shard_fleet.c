/* A mixed fleet per shard: one capstan process serves three shards (the
 * file's shards:) while a real Ruby Sidekiq 7.3.10 process reads queue
 * default on shard 1 only. What capstan learns of Ruby in one shard stays
 * in that shard: on shard 1 a job of a class only Ruby has goes back for
 * Ruby, also after capstan's first minute, and Ruby runs it once; on
 * shards 2 and 3, where no Ruby process reads, the same class fails with
 * NameError into that shard's retry set once the first minute is over, as
 * on one Redis. capstan's own jobs (ShardJob, tests/plugins/shards.c) run
 * once each in their own shard meanwhile, and a kill -9 mid-drain loses
 * none of any shard's.
 *
 * Shard 1 is the fixture's database (kt_url()), so that Ruby Sidekiq runs
 * there as in the other tests; shards 2 and 3 are servers of the test's
 * own. ShardJobs go to queue capstan, which Ruby does not read. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

TestSuite(shard_fleet, .timeout = 280, .fini = kt_kill_children);

#define NSHARDS 3
#define PER_SHARD_MAX 200
#define SIDEKIQ "7.3.10"

typedef struct fleet {
    kt_aof_redis_t s[NSHARDS]; /* s[0] unused: shard 1 is the fixture's */
    redisContext *c[NSHARDS];
    int port[NSHARDS];
    char *conf;
    char *ledger_dir;
} fleet_t;

/* Shards s1 (the fixture's database), s2 and s3 (servers of the test's
 * own) in a capstan.yml with a look at the fleet and orphan recovery
 * every second. */
static void fleet_up(fleet_t *f)
{
    char yml[2048];
    int len = snprintf(yml, sizeof(yml), "concurrency: 6\nrecovery_interval: 1\nshards:\n  - name: s1\n"
                                         "    redis_url: %s\n", kt_url());
    f->c[0] = kt_redis();
    const char *colon = strrchr(kt_url(), ':');
    f->port[0] = atoi(colon + 1);
    for (int k = 1; k < NSHARDS; k++) {
        char name[16];
        snprintf(name, sizeof(name), "shard%d", k + 1);
        kt_aof_init(&f->s[k], name);
        kt_aof_start(&f->s[k]);
        cr_assert((f->c[k] = kt_aof_connect(&f->s[k])) != NULL);
        f->port[k] = f->s[k].port;
        len += snprintf(yml + len, sizeof(yml) - (size_t)len, "  - name: s%d\n    redis_url: %s\n", k + 1,
                        f->s[k].url);
    }
    f->conf = kt_write_conf(yml);
    f->ledger_dir = kt_ledger_dir();
}

static void fleet_down(fleet_t *f)
{
    for (int k = 1; k < NSHARDS; k++)
        redisFree(f->c[k]);
    free(f->conf);
    free(f->ledger_dir);
}

/* `capstan run -r <shards plugin> -C <conf> --no-supervisor -q default
 * -q capstan`, its output where kt_capstan_log reads it, with no
 * REDIS_URL (the shards give theirs). */
static pid_t capstan_up(fleet_t *f)
{
    return kt_capstan_shards_start(f->conf, f->ledger_dir, (const char *[]){ "--no-supervisor", "-c", "6", "-q",
                                                                             "default", "-q", "capstan", NULL });
}

/* Sidekiq 7.3.10 with tests/ruby/fleet_jobs.rb on shard 1's default, once
 * it is in shard 1's process set. */
static pid_t ruby_up(void)
{
    pid_t rb = kt_sidekiq_start_v(SIDEKIQ, "fleet_jobs.rb", "default");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 60), "Sidekiq never beat: %s", kt_sidekiq_log());
    return rb;
}

/* ShardJob i of shard k: its jid says both ("5a00000k" then i). */
static void jid_of(char out[25], int k, unsigned i)
{
    snprintf(out, 25, "%08x%016x", 0x5a000000u | (unsigned)k, i);
}

/* Pushes ShardJobs 0..n-1 of shard k, each with args, into that shard's
 * queue capstan. */
static void push_own(fleet_t *f, int k, unsigned n, const char *args)
{
    char **p = calloc(n, sizeof(char *));
    cr_assert(p);
    for (unsigned i = 0; i < n; i++) {
        char jid[25];
        jid_of(jid, k, i);
        p[i] = kt_payload("ShardJob", args, jid, "capstan");
    }
    kt_push_all(f->c[k], "capstan", p, n);
    for (unsigned i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

/* Pushes n RubyOnlyJobs (a class capstan has no handler for) with args
 * [key], jids kt_make_jid(tag, 0..n-1), into shard k's queue default. */
static void push_ruby(fleet_t *f, int k, const char *key, unsigned tag, unsigned n)
{
    char **p = calloc(n, sizeof(char *)), args[64], jid[25];
    cr_assert(p);
    snprintf(args, sizeof(args), "[\"%s\"]", key);
    for (unsigned i = 0; i < n; i++) {
        kt_make_jid(jid, tag, i);
        p[i] = kt_payload("RubyOnlyJob", args, jid, "default");
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
        L->wrong_shard += r->port != f->port[k];
    }
    free(runs);
}

/* ShardJobs 0..n-1 of shard k that ran, and that ran more than once. */
static long ran(const ledger_t *L, int k, unsigned n)
{
    long r = 0;
    for (unsigned i = 0; i < n; i++)
        r += L->runs[k][i] > 0;
    return r;
}

static long again(const ledger_t *L, int k, unsigned n)
{
    long r = 0;
    for (unsigned i = 0; i < n; i++)
        r += L->runs[k][i] > 1;
    return r;
}

static int all_ran(const fleet_t *f, ledger_t *L, unsigned n)
{
    ledger_read(f, L);
    for (int k = 0; k < NSHARDS; k++)
        if (ran(L, k, n) < (long)n)
            return 0;
    return 1;
}

/* The one member of shard k's retry set (malloc'd), or NULL. */
static char *retry_member(fleet_t *f, int k)
{
    redisReply *r = redisCommand(f->c[k], "ZRANGE retry 0 -1");
    char *m = r && r->type == REDIS_REPLY_ARRAY && r->elements == 1 ? strdup(r->element[0]->str) : NULL;
    freeReplyObject(r);
    return m;
}

static long long failed_in(fleet_t *f, int k)
{
    return kt_int_on(f->c[k], "GET stat:failed") + kt_int_on(f->c[k], "ZCARD retry")
           + kt_int_on(f->c[k], "ZCARD dead");
}

/* Ruby reads default on shard 1 only. On shard 1, RubyOnlyJobs pushed in
 * capstan's first minute and after it all run in Ruby, once, none failed;
 * on shards 2 and 3 one RubyOnlyJob each, there from capstan's start, is
 * held through the first minute, then fails with NameError into that
 * shard's retry set; each shard's ShardJobs run once, there. */
Test(shard_fleet, the_mixed_fleet_rules_hold_per_shard)
{
    enum { OWN = 50, RUBY = 40 };
    kt_sidekiq_need(SIDEKIQ);
    fleet_t f;
    fleet_up(&f);
    pid_t rb = ruby_up();
    char jid[NSHARDS][25];
    for (int k = 1; k < NSHARDS; k++) {
        push_ruby(&f, k, "lost", 40 + (unsigned)k, 1);
        kt_make_jid(jid[k], 40 + (unsigned)k, 0);
    }
    for (int k = 0; k < NSHARDS; k++)
        push_own(&f, k, OWN, "[]");
    pid_t pid = capstan_up(&f);
    free(kt_log_identity(pid));
    double t0 = kt_now();
    /* capstan's processors wait on shard 1's default beside Ruby's. */
    push_ruby(&f, 0, "early", 50, RUBY);
    static ledger_t L;
    cr_assert(KT_WAIT_UNTIL(all_ran(&f, &L, OWN) && kt_int("SCARD early") == RUBY, 60),
              "ShardJobs ran %ld %ld %ld of %d, Ruby ran %lld of %d: %s", ran(&L, 0, OWN), ran(&L, 1, OWN),
              ran(&L, 2, OWN), OWN, kt_int("SCARD early"), RUBY, kt_capstan_log(pid));
    /* Each line names the shard it is about. */
    cr_assert(kt_log_has(pid, "shard s1: no handler for RubyOnlyJob (queue:default); unknown_class: requeue (a "
                              "Ruby Sidekiq process reads the queue)"),
              "capstan handed shard 1's Ruby jobs back: %s", kt_capstan_log(pid));
    for (int k = 1; k < NSHARDS; k++) {
        char line[128];
        snprintf(line, sizeof(line), "shard s%d: no handler for RubyOnlyJob (queue:default); unknown_class: "
                 "requeue (capstan started less than a minute ago", k + 1);
        cr_assert(kt_log_has(pid, line), "%s: %s", line, kt_capstan_log(pid));
    }

    /* Past the first minute, shards 2 and 3 fail theirs as one Redis. */
    cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[1], "ZCARD retry") == 1 && kt_int_on(f.c[2], "ZCARD retry") == 1, 100),
              "retry sets of shards 2 and 3: %lld, %lld: %s", kt_int_on(f.c[1], "ZCARD retry"),
              kt_int_on(f.c[2], "ZCARD retry"), kt_capstan_log(pid));
    cr_assert(kt_now() - t0 > 40, "held through the first minute: failed after %.0f s", kt_now() - t0);
    for (int k = 1; k < NSHARDS; k++) {
        char *m = retry_member(&f, k);
        cr_assert(m && strstr(m, jid[k]) && strstr(m, "\"error_class\":\"NameError\"")
                      && strstr(m, "\"error_message\":\"uninitialized constant RubyOnlyJob\""),
                  "shard %d: %s", k + 1, m);
        free(m);
        cr_assert_eq(kt_int_on(f.c[k], "ZCARD dead"), 0);
        cr_assert_eq(kt_int_on(f.c[k], "LLEN queue:default"), 0);
        cr_assert_eq(kt_int_on(f.c[k], "EXISTS capstan:ruby:default"), 0, "shard %d: no Ruby was seen there",
                     k + 1);
    }

    /* And shard 1, past that minute too, still gives them back for Ruby. */
    push_ruby(&f, 0, "late", 51, RUBY);
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD late") == RUBY || failed_in(&f, 0) > 0, 60), "Ruby ran %lld of %d: %s",
              kt_int("SCARD late"), RUBY, kt_capstan_log(pid));
    kt_sleep(1.5); /* a second run, or a late failure, would show by now */
    printf("shard_fleet: shard 1: %lld + %lld Ruby-only jobs ran in Ruby, %lld failed; shards 2, 3: "
           "%lld, %lld in retry\n",
           kt_int("LLEN early:log"), kt_int("LLEN late:log"), failed_in(&f, 0), kt_int_on(f.c[1], "ZCARD retry"),
           kt_int_on(f.c[2], "ZCARD retry"));
    cr_assert_eq(failed_in(&f, 0), 0, "shard 1: none failed: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN early:log"), RUBY, "each once");
    cr_assert_eq(kt_int("LLEN late:log"), RUBY, "each once");
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert(kt_int("TTL capstan:ruby:default") > 0, "shard 1 remembers Ruby");
    cr_assert_eq(kt_log_count(pid, " reads queues [default]"), 1, "one shard is shared: %s", kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "shard s1: Ruby Sidekiq process "), "that shard named: %s", kt_capstan_log(pid));

    ledger_read(&f, &L);
    for (int k = 0; k < NSHARDS; k++) {
        cr_assert_eq(ran(&L, k, OWN), OWN, "shard %d", k + 1);
        cr_assert_eq(again(&L, k, OWN), 0, "shard %d: each once", k + 1);
        cr_assert_eq(kt_int_on(f.c[k], "LLEN queue:capstan"), 0);
    }
    cr_assert_eq(L.lines, NSHARDS * OWN);
    cr_assert_eq(L.wrong_shard, 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    kt_untrack(pid);
    cr_assert_eq(kt_capstan_stop(rb, SIGTERM, 30), 0, "sidekiq exits 0");
    kt_untrack(rb);
    fleet_down(&f);
}

/* kill -9 of the capstan process while it drains every shard, Ruby on
 * shard 1: the Ruby side here (Sidekiq OSS's BasicFetch) recovers no
 * working list, so the restarted capstan recovers the dead one's working
 * list in each shard into that shard's queue: every ShardJob of every
 * shard runs, in its shard, again only if it was in flight, and Ruby's
 * jobs on shard 1 all run in Ruby, none failed. */
Test(shard_fleet, a_kill_mid_drain_loses_no_job_of_any_shard)
{
    enum { OWN = 60, RUBY = 20 };
    kt_sidekiq_need(SIDEKIQ);
    fleet_t f;
    fleet_up(&f);
    pid_t rb = ruby_up();
    pid_t pid = capstan_up(&f);
    char *id = kt_log_identity(pid), *wk = kt_working_key(id);
    /* Every shard's member fetching before the jobs come, so that the kill
     * falls in the middle of each shard's drain. */
    for (int k = 0; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[k], "SISMEMBER processes %s", id) == 1, 30), "shard %d: %s", k + 1,
                  kt_capstan_log(pid));
    for (int k = 0; k < NSHARDS; k++)
        push_own(&f, k, OWN, "[300]");
    push_ruby(&f, 0, "kill", 60, RUBY);
    static ledger_t L;
    cr_assert(KT_WAIT_UNTIL((ledger_read(&f, &L), ran(&L, 0, OWN) >= 3 && ran(&L, 1, OWN) >= 3
                                                      && ran(&L, 2, OWN) >= 3),
                            60),
              "%s", kt_capstan_log(pid));
    long long held[NSHARDS];
    cr_assert_eq(kt_capstan_stop(pid, SIGKILL, 10), 128 + SIGKILL);
    kt_untrack(pid);
    ledger_read(&f, &L);
    for (int k = 0; k < NSHARDS; k++) {
        held[k] = kt_int_on(f.c[k], "LLEN %s", wk);
        cr_assert(ran(&L, k, OWN) < OWN, "shard %d drained before the kill", k + 1);
    }
    pid_t again_pid = capstan_up(&f);
    free(kt_log_identity(again_pid));
    cr_assert(KT_WAIT_UNTIL(all_ran(&f, &L, OWN) && kt_int("SCARD kill") == RUBY, 120),
              "ShardJobs ran %ld %ld %ld of %d, Ruby ran %lld of %d: %s", ran(&L, 0, OWN), ran(&L, 1, OWN),
              ran(&L, 2, OWN), OWN, kt_int("SCARD kill"), RUBY, kt_capstan_log(again_pid));
    for (int k = 0; k < NSHARDS; k++)
        cr_assert(KT_WAIT_UNTIL(kt_int_on(f.c[k], "EXISTS %s", wk) == 0, 30), "shard %d: %s left", k + 1, wk);
    kt_sleep(1);
    ledger_read(&f, &L);
    for (int k = 0; k < NSHARDS; k++) {
        printf("shard_fleet: kill -9: shard %d: %ld of %d ran (%ld again, %lld were in its working list)\n",
               k + 1, ran(&L, k, OWN), OWN, again(&L, k, OWN), held[k]);
        cr_assert_eq(ran(&L, k, OWN), OWN, "shard %d: none lost", k + 1);
        cr_assert(again(&L, k, OWN) <= held[k], "shard %d: only those in flight ran again", k + 1);
        cr_assert_eq(failed_in(&f, k), 0, "shard %d", k + 1);
        cr_assert_eq(kt_int_on(f.c[k], "LLEN queue:capstan"), 0);
    }
    cr_assert_eq(L.wrong_shard, 0);
    cr_assert_eq(kt_int("LLEN kill:log"), RUBY, "Ruby ran each once");
    cr_assert_eq(kt_capstan_stop(again_pid, SIGTERM, 30), 0, "%s", kt_capstan_log(again_pid));
    kt_untrack(again_pid);
    cr_assert_eq(kt_capstan_stop(rb, SIGTERM, 30), 0, "sidekiq exits 0");
    kt_untrack(rb);
    free(wk);
    free(id);
    fleet_down(&f);
}
