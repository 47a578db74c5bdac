/* Routing pushes over shards, against three real redis-servers: the C
 * client, `capstan push` and the Ruby module (examples/ruby/capstan_shards.rb,
 * under each Sidekiq) put every job where the one rule says (an explicit
 * shard, else the queue's home shard, else the rendezvous pick of the
 * job's lock digest, else of its jid), which the test recomputes with
 * capstan__shard_pick and checks entry by entry in each shard's queue. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/capstan.h"
#include "capstan/unique.h"
#include "support/shard_pick.h"

TestSuite(routing, .timeout = 300, .fini = kt_kill_children);

#define NSHARDS 3
static const char *const names[NSHARDS] = { "a", "b", "c" };

typedef kt_own_server_t shard_srv_t;

static shard_srv_t srv[NSHARDS];

/* Starts three redis-servers of the test's own (no persistence: nothing
 * here restarts them). */
static void shards_start(void)
{
    for (int i = 0; i < NSHARDS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "shard-%s", names[i]);
        kt_own_server_start(&srv[i], name);
    }
}

static void shards_flush(void)
{
    for (int i = 0; i < NSHARDS; i++)
        freeReplyObject(redisCommand(srv[i].conn, "FLUSHALL"));
}

/* "a=URL,b=URL,c=URL", as tests/ruby/shards.rb reads it. */
static char *shard_spec(void)
{
    char *spec = NULL;
    cr_assert(asprintf(&spec, "a=%s,b=%s,c=%s", srv[0].url, srv[1].url, srv[2].url) > 0);
    return spec;
}

/* The shards a, b and c, b the home of "reports" when home. */
static capstan_config_t *shards_config(int home)
{
    char err[CAPSTAN_ERRLEN];
    const char *reports[] = { "reports" };
    capstan_config_t *cfg = capstan_config_new();
    cr_assert(cfg);
    for (int i = 0; i < NSHARDS; i++)
        cr_assert_eq(capstan_config_add_shard(cfg, names[i], srv[i].url, i == 1 && home ? reports : NULL,
                                              i == 1 && home ? 1 : 0, err), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    return cfg;
}

/* The same as a file for `capstan push -C`. */
static char *shards_file(int home)
{
    char *body = NULL;
    cr_assert(asprintf(&body, "shards:\n  - name: a\n    redis_url: %s\n  - name: b\n    redis_url: %s\n%s"
                              "  - name: c\n    redis_url: %s\n",
                       srv[0].url, srv[1].url, home ? "    queues: [reports]\n" : "", srv[2].url) > 0);
    char *path = kt_write_file(home ? "shards-home.yml" : "shards.yml", body);
    free(body);
    return path;
}

/* The shard the rule's hash gives key: among every shard, or (home)
 * among a and c, as b fetches "reports" alone. */
static int pick(const char *key, int home)
{
    static const char *const open[] = { "a", "c" };
    if (!home)
        return (int)capstan__shard_pick(names, NSHARDS, key, strlen(key));
    return capstan__shard_pick(open, 2, key, strlen(key)) == 0 ? 0 : 2;
}

static int shard_index(const char *name)
{
    for (int i = 0; i < NSHARDS; i++)
        if (name && !strcmp(names[i], name))
            return i;
    cr_assert_fail("no shard named %s", name ? name : "(null)");
    return -1;
}

/* A payload's jid (24 hex digits), copied into jid. */
static void jid_of(const char *payload, char jid[25])
{
    const char *at = strstr(payload, "\"jid\":\"");
    cr_assert(at, "no jid in %s", payload);
    memcpy(jid, at + 7, 24);
    jid[24] = '\0';
}

/* Checks every entry of queue q in every shard: each is where want(jid)
 * says. Writes each shard's count into counts. Returns the total. */
static long check_queue(const char *q, int (*want)(const char *jid, void *ud), void *ud, long counts[NSHARDS])
{
    long total = 0;
    for (int i = 0; i < NSHARDS; i++) {
        redisReply *r = redisCommand(srv[i].conn, "LRANGE queue:%s 0 -1", q);
        cr_assert(r && r->type == REDIS_REPLY_ARRAY);
        counts[i] = (long)r->elements;
        for (size_t k = 0; k < r->elements; k++) {
            char jid[25];
            jid_of(r->element[k]->str, jid);
            int w = want(jid, ud);
            cr_assert_eq(w, i, "queue %s: job %s is in shard %s, the rule gives %s", q, jid, names[i],
                         names[w]);
        }
        total += counts[i];
        freeReplyObject(r);
    }
    return total;
}

static int by_jid(const char *jid, void *ud)
{
    return pick(jid, *(int *)ud);
}

static int to_b(const char *jid, void *ud)
{
    (void)jid;
    (void)ud;
    return 1;
}

/* One "JOB jid shard queue" line per job of tests/ruby/shards.rb; checks
 * the shard it says against the rule. Returns the number of lines. */
static long ruby_lines(char *out, int home)
{
    long n = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char jid[64], shard[16], q[32];
        if (sscanf(line, "JOB %63s %15s %31s", jid, shard, q) != 3)
            continue;
        int want = home && !strcmp(q, "reports") ? 1 : pick(jid, home);
        cr_assert_eq(shard_index(shard), want, "Ruby routed %s (%s) to %s", jid, q, shard);
        n++;
    }
    return n;
}

static capstan_client_t *sharded_client(const capstan_config_t *cfg)
{
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(srv[0].url, err);
    cr_assert(c, "%s", err);
    capstan_client_use_config(c, cfg);
    return c;
}

/* Pushes n jobs to q in bulks of 100; checks capstan_client_pushed_shard
 * against the rule. */
static void c_push(capstan_client_t *c, const char *q, long n, int home)
{
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = q;
    char args[100][16], jids[100][25];
    const char *argv[100];
    for (long done = 0; done < n; done += 100) {
        size_t k = n - done < 100 ? (size_t)(n - done) : 100;
        for (size_t i = 0; i < k; i++) {
            snprintf(args[i], sizeof(args[i]), "[%ld]", done + (long)i);
            argv[i] = args[i];
        }
        cr_assert_eq(capstan_client_push_bulk(c, "PlainJob", argv, k, &o, jids), 0, "%s",
                     capstan_client_error(c));
        for (size_t i = 0; i < k; i++) {
            int want = home && !strcmp(q, "reports") ? 1 : pick(jids[i], home);
            cr_assert_eq(shard_index(capstan_client_pushed_shard(c, i)), want);
        }
    }
}

/* `capstan push` n times: checks its "JID SHARD" output against the rule. */
static void cli_push(const char *conf, const char *q, int n, int home)
{
    for (int i = 0; i < n; i++) {
        char *out = NULL, jid[64], shard[16];
        int st = kt_capstan_run((const char *[]){ "push", "PlainJob", "[1]", "-C", conf, "-q", q, NULL }, &out);
        cr_assert_eq(st, 0, "capstan push: %s", out);
        cr_assert_eq(sscanf(out, "%63s %15s", jid, shard), 2, "capstan push said: %s", out);
        int want = home && !strcmp(q, "reports") ? 1 : pick(jid, home);
        cr_assert_eq(shard_index(shard), want, "capstan push routed %s to %s", jid, shard);
        free(out);
    }
}

/* Every shard got a share: a third would be 1/3 of total; a tenth is
 * far below what rendezvous hashing gives, and far above nothing. */
static void assert_spread(const long counts[NSHARDS], const int *which, int nwhich, long total)
{
    for (int k = 0; k < nwhich; k++)
        cr_assert_gt(counts[which[k]], total / (nwhich * 3), "shard %s got %ld of %ld jobs", names[which[k]],
                     counts[which[k]], total);
}

Test(routing, c_client_and_cli_follow_the_rule)
{
    shards_start();
    for (int home = 0; home <= 1; home++) {
        shards_flush();
        capstan_config_t *cfg = shards_config(home);
        capstan_client_t *c = sharded_client(cfg);
        c_push(c, "default", 3000, home);
        c_push(c, "reports", 300, home);
        char *conf = shards_file(home);
        cli_push(conf, "default", 15, home);
        cli_push(conf, "reports", 5, home);
        long counts[NSHARDS], rep[NSHARDS];
        cr_assert_eq(check_queue("default", by_jid, &home, counts), 3015);
        if (home) {
            cr_assert_eq(check_queue("reports", to_b, NULL, rep), 305);
            cr_assert_eq(counts[1], 0, "a job of a queue b does not fetch went to b");
            assert_spread(counts, (const int[]){ 0, 2 }, 2, 3015);
        } else {
            cr_assert_eq(check_queue("reports", by_jid, &home, rep), 305);
            assert_spread(counts, (const int[]){ 0, 1, 2 }, 3, 3015);
        }
        /* The client's own connection (shard a's URL) took no push of its own. */
        free(conf);
        capstan_client_free(c);
        capstan_config_free(cfg);
    }
}

KT_SIDEKIQ_TEST(routing, ruby_module_follows_the_rule)
{
    shards_start();
    char *spec = shard_spec();
    for (int home = 0; home <= 1; home++) {
        shards_flush();
        char *out = NULL;
        int st = kt_ruby_v(sidekiq, "shards.rb", (const char *[]){ "push", spec, home ? "reports=b" : "-",
                                                                   "3000", NULL }, &out);
        cr_assert_eq(st, 0, "shards.rb push: %s", out ? out : "");
        cr_assert_eq(ruby_lines(out, home), 3300);
        free(out);
        long counts[NSHARDS], rep[NSHARDS];
        cr_assert_eq(check_queue("default", by_jid, &home, counts), 3000);
        if (home) {
            cr_assert_eq(check_queue("reports", to_b, NULL, rep), 300);
            cr_assert_eq(counts[1], 0);
            assert_spread(counts, (const int[]){ 0, 2 }, 2, 3000);
        } else {
            cr_assert_eq(check_queue("reports", by_jid, &home, rep), 300);
            assert_spread(counts, (const int[]){ 0, 1, 2 }, 3, 3000);
        }
    }
    free(spec);
}

/* UniqueJob [3] with an until_executed lock: v9's digest. */
static void unique_digest(char d[CAPSTAN_DIGEST_MAX])
{
    char err[CAPSTAN_ERRLEN];
    capstan_digest_input_t in = { .cls = "UniqueJob", .queue = "default", .lock_args = "[3]" };
    cr_assert_eq(capstan_unique_digest(&in, d, NULL, err), 0, "%s", err);
    /* Not shard a, whose URL is also the client's own connection's. */
    cr_assert_eq(pick(d, 0), 1, "UniqueJob [3]'s digest %s is not b's any more", d);
}

/* Exactly one UniqueJob in all the shards, in the digest's shard, and its
 * lock there alone. */
static void assert_one_unique(const char *d)
{
    int where = pick(d, 0);
    for (int i = 0; i < NSHARDS; i++) {
        redisReply *r = redisCommand(srv[i].conn, "LLEN queue:default");
        cr_assert_eq(r->integer, i == where ? 1 : 0, "shard %s holds %lld UniqueJobs; the digest's shard is %s",
                     names[i], r->integer, names[where]);
        freeReplyObject(r);
        r = redisCommand(srv[i].conn, "EXISTS %s:LOCKED", d);
        cr_assert_eq(r->integer, i == where ? 1 : 0, "the lock of %s is %sin shard %s", d,
                     r->integer ? "" : "not ", names[i]);
        freeReplyObject(r);
    }
}

/* 100 pushes of UniqueJob [3] through the C client: one accepted. */
static void c_push_unique(const capstan_config_t *cfg, int accepted)
{
    capstan_unique_opts_t u = CAPSTAN_UNIQUE_OPTS_INIT;
    u.lock = CAPSTAN_LOCK_UNTIL_EXECUTED;
    capstan_class_opts_t co = { .queue = "default", .retry = CAPSTAN_RETRY_UNSET, .unique = &u };
    capstan_client_t *c = sharded_client(cfg);
    cr_assert_eq(capstan_client_set_class(c, "UniqueJob", &co), 0);
    int ok = 0;
    for (int i = 0; i < 100; i++) {
        int rc = capstan_client_push(c, "UniqueJob", "[3]", NULL, NULL);
        cr_assert(rc == 0 || rc == CAPSTAN_EDENIED, "push: %d %s", rc, capstan_client_error(c));
        ok += rc == 0;
    }
    cr_assert_eq(ok, accepted);
    capstan_client_free(c);
}

Test(routing, a_digest_meets_in_one_shard_from_c_and_cli)
{
    shards_start();
    char d[CAPSTAN_DIGEST_MAX];
    unique_digest(d);
    capstan_config_t *cfg = shards_config(0);
    char *conf = shards_file(0);
    c_push_unique(cfg, 1);
    assert_one_unique(d);
    int pushed = 0;
    for (int i = 0; i < 100; i++) {
        char *out = NULL;
        int st = kt_capstan_run((const char *[]){ "push", "UniqueJob", "[3]", "-C", conf, "-q", "default",
                                                  "--lock", "until_executed", NULL }, &out);
        cr_assert(st == 0 || st == 3, "capstan push exited %d: %s", st, out);
        pushed += st == 0;
        free(out);
    }
    cr_assert_eq(pushed, 0, "capstan push took a digest the C client holds");
    assert_one_unique(d);
    /* And `capstan push` alone, from nothing. */
    shards_flush();
    for (int i = 0; i < 100; i++) {
        char *out = NULL;
        int st = kt_capstan_run((const char *[]){ "push", "UniqueJob", "[3]", "-C", conf, "-q", "default",
                                                  "--lock", "until_executed", "--json", NULL }, &out);
        cr_assert(st == 0 || st == 3, "capstan push exited %d: %s", st, out);
        if (st == 0) {
            char want[64];
            snprintf(want, sizeof(want), "\"shard\":\"%s\"}", names[pick(d, 0)]);
            cr_assert(strstr(out, want) && strstr(out, "\"queue\":\"default\""), "--json said %s", out);
        }
        pushed += st == 0;
        free(out);
    }
    cr_assert_eq(pushed, 1);
    assert_one_unique(d);
    free(conf);
    capstan_config_free(cfg);
}

KT_SIDEKIQ_TEST(routing, a_digest_meets_in_one_shard_from_ruby)
{
    shards_start();
    char d[CAPSTAN_DIGEST_MAX];
    unique_digest(d);
    char *spec = shard_spec(), *out = NULL;
    int st = kt_ruby_v(sidekiq, "shards.rb", (const char *[]){ "unique", spec, "-", "100", NULL }, &out);
    cr_assert_eq(st, 0, "shards.rb unique: %s", out ? out : "");
    int pushed = 0, lines = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char jid[64], shard[16], digest[CAPSTAN_DIGEST_MAX];
        if (sscanf(line, "JOB %63s %15s %127s", jid, shard, digest) != 3)
            continue;
        lines++;
        pushed += strcmp(jid, "denied") != 0;
        cr_assert_str_eq(digest, d, "Ruby's digest differs from capstan's");
        cr_assert_eq(shard_index(shard), pick(d, 0));
    }
    free(out);
    cr_assert_eq(lines, 100);
    cr_assert_eq(pushed, 1);
    assert_one_unique(d);
    /* The C client sees Ruby's lock, in the same shard. */
    capstan_config_t *cfg = shards_config(0);
    c_push_unique(cfg, 0);
    assert_one_unique(d);
    capstan_config_free(cfg);
    free(spec);
}

Test(routing, an_explicit_shard_wins_and_an_unknown_one_is_an_error)
{
    shards_start();
    capstan_config_t *cfg = shards_config(1);
    capstan_client_t *c = sharded_client(cfg);
    /* Explicit c over the hash (and over b's home queue). */
    cr_assert_eq(capstan_client_set_shard(c, "c"), 0);
    int elsewhere = 0;
    for (int i = 0; i < 40; i++) {
        char jid[25];
        capstan_push_opts_t o = capstan_push_opts_default();
        o.queue = i % 4 ? "default" : "reports";
        cr_assert_eq(capstan_client_push(c, "PlainJob", "[1]", &o, jid), 0, "%s", capstan_client_error(c));
        cr_assert_str_eq(capstan_client_pushed_shard(c, 0), "c");
        elsewhere += pick(jid, 1) != 2;
    }
    cr_assert_gt(elsewhere, 0, "every jid hashed to c anyway: the test shows nothing");
    redisReply *r = redisCommand(srv[2].conn, "LLEN queue:default");
    cr_assert_eq(r->integer, 30);
    freeReplyObject(r);
    r = redisCommand(srv[2].conn, "LLEN queue:reports");
    cr_assert_eq(r->integer, 10);
    freeReplyObject(r);
    cr_assert_eq(capstan_client_set_shard(c, "zz"), CAPSTAN_ENOTFOUND);
    cr_assert(strstr(capstan_client_error(c), "\"zz\"") && strstr(capstan_client_error(c), "a, b, c"),
              "error: %s", capstan_client_error(c));
    cr_assert_eq(capstan_client_set_shard(c, NULL), 0);
    cr_assert_eq(capstan_client_begin(c), CAPSTAN_EINVAL, "a transaction over shards was opened");
    cr_assert(strstr(capstan_client_error(c), "no transactions"), "%s", capstan_client_error(c));
    cr_assert_eq(capstan_client_push(c, "PlainJob", "[1]", NULL, NULL), 0);
    cr_assert_neq(shard_index(capstan_client_pushed_shard(c, 0)), 1, "a default job went to b");
    capstan_client_free(c);
    /* A client without shards has nothing to name. */
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *plain = capstan_client_new(srv[0].url, err);
    cr_assert(plain, "%s", err);
    cr_assert_eq(capstan_client_set_shard(plain, "a"), CAPSTAN_EINVAL);
    cr_assert_null(capstan_client_pushed_shard(plain, 0));
    capstan_client_free(plain);

    /* capstan push --shard. */
    shards_flush();
    char *conf = shards_file(1), *out = NULL, jid[64], shard[16];
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "PlainJob", "-C", conf, "-q", "reports", "--shard", "a",
                                                  NULL }, &out), 0, "%s", out);
    cr_assert_eq(sscanf(out, "%63s %15s", jid, shard), 2);
    cr_assert_str_eq(shard, "a");
    free(out);
    r = redisCommand(srv[0].conn, "LLEN queue:reports");
    cr_assert_eq(r->integer, 1);
    freeReplyObject(r);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "PlainJob", "-C", conf, "--shard", "zz", NULL }, &out),
                 64, "%s", out);
    cr_assert(strstr(out, "no shard named \"zz\""), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "PlainJob", "--redis-url", srv[0].url, "--shard", "a",
                                                  NULL }, &out), 64, "%s", out);
    cr_assert(strstr(out, "shards: list"), "%s", out);
    free(out);
    free(conf);

    /* The Ruby module. */
    char *spec = shard_spec();
    cr_assert_eq(kt_ruby("shards.rb", (const char *[]){ "explicit", spec, "reports=b", "c", NULL }, &out), 0);
    cr_assert_eq(sscanf(out, "JOB %63s %15s", jid, shard), 2, "%s", out);
    cr_assert_str_eq(shard, "c");
    free(out);
    cr_assert_eq(kt_ruby("shards.rb", (const char *[]){ "explicit", spec, "reports=b", "zz", NULL }, &out), 0);
    cr_assert(strstr(out, "ERROR ArgumentError") && strstr(out, "\"zz\""), "%s", out);
    free(out);
    free(spec);
    capstan_config_free(cfg);
}

Test(routing, ruby_and_c_pick_alike)
{
    static const char *const four[] = { "alpha", "b-2", "c_3", "d" };
    char *out = NULL;
    cr_assert_eq(kt_ruby("shards.rb", (const char *[]){ "picks", "300", NULL }, &out), 0, "%s", out);
    int n = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char hex[200], shard[16], key[100];
        if (sscanf(line, "JOB %199s %15s", hex, shard) != 2) {
            /* An empty key prints no hex. */
            if (sscanf(line, "JOB  %15s", shard) != 1)
                continue;
            hex[0] = '\0';
        }
        size_t len = strlen(hex) / 2;
        for (size_t i = 0; i < len; i++)
            cr_assert_eq(sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&key[i]), 1);
        const char *c = four[capstan__shard_pick(four, 4, key, len)];
        cr_assert_str_eq(shard, c, "key %s: Ruby picks %s, C %s", hex, shard, c);
        n++;
    }
    cr_assert_eq(n, 300);
    free(out);
}

/* A bulk push over shards, one of them down: its chain cannot run there,
 * so nothing is pushed (as for a client without shards whose Redis is
 * down), no jid is handed out, and the error names the shard. */
Test(routing, a_shard_down_fails_the_bulk_naming_it)
{
    shards_start();
    capstan_config_t *cfg = shards_config(0);
    capstan_client_t *c = sharded_client(cfg);
    kill(srv[2].pid, SIGKILL);
    cr_assert_eq(kt_wait_exit(srv[2].pid, 20), 128 + SIGKILL);
    char args[300][16], jids[300][25];
    const char *argv[300];
    for (int i = 0; i < 300; i++) {
        snprintf(args[i], sizeof(args[i]), "[%d]", i);
        argv[i] = args[i];
    }
    cr_assert_eq(capstan_client_push_bulk(c, "PlainJob", argv, 300, NULL, jids), CAPSTAN_EREDIS);
    cr_assert(strstr(capstan_client_error(c), "shard c: "), "%s", capstan_client_error(c));
    for (int i = 0; i < 300; i++) {
        cr_assert_eq(jids[i][0], '\0', "job %d has a jid, as if pushed", i);
        cr_assert_null(capstan_client_pushed_shard(c, (size_t)i));
    }
    cr_assert_eq(kt_int_on(srv[0].conn, "DBSIZE") + kt_int_on(srv[1].conn, "DBSIZE"), 0);
    /* A push whose rule gives a or b still goes. */
    int pushed = 0;
    for (int i = 0; i < 30; i++) {
        char jid[25];
        int rc = capstan_client_push(c, "PlainJob", "[1]", NULL, jid);
        cr_assert(rc == 0 || rc == CAPSTAN_EREDIS, "%d: %s", rc, capstan_client_error(c));
        if (rc == 0)
            cr_assert_neq(shard_index(capstan_client_pushed_shard(c, 0)), 2);
        pushed += rc == 0;
    }
    cr_assert_eq(kt_int_on(srv[0].conn, "LLEN queue:default") + kt_int_on(srv[1].conn, "LLEN queue:default"),
                 pushed);
    cr_assert_gt(pushed, 0);
    capstan_client_free(c);
    capstan_config_free(cfg);
}

/* A queue that no shard fetches is refused, not stranded. */
Test(routing, a_queue_no_shard_fetches_is_refused)
{
    shards_start();
    char err[CAPSTAN_ERRLEN];
    const char *qa[] = { "alpha" }, *qb[] = { "beta" };
    capstan_config_t *cfg = capstan_config_new();
    cr_assert_eq(capstan_config_add_shard(cfg, "a", srv[0].url, qa, 1, err), 0, "%s", err);
    cr_assert_eq(capstan_config_add_shard(cfg, "b", srv[1].url, qb, 1, err), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    capstan_client_t *c = sharded_client(cfg);
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = "gamma";
    cr_assert_eq(capstan_client_push(c, "PlainJob", "[1]", &o, NULL), CAPSTAN_ECONFIG);
    cr_assert(strstr(capstan_client_error(c), "gamma"), "%s", capstan_client_error(c));
    o.queue = "beta";
    cr_assert_eq(capstan_client_push(c, "PlainJob", "[1]", &o, NULL), 0, "%s", capstan_client_error(c));
    cr_assert_str_eq(capstan_client_pushed_shard(c, 0), "b");
    cr_assert_eq(kt_int_on(srv[0].conn, "DBSIZE") + kt_int_on(srv[1].conn, "LLEN queue:gamma"), 0);
    capstan_client_free(c);
    capstan_config_free(cfg);
}

/* A job's shard is not known from its jid alone (a home queue or a digest
 * may have chosen it): a cancel through a sharded client marks it in every
 * shard, so the job's own shard sees it whichever route it took. */
Test(routing, a_cancel_reaches_the_jobs_shard_whatever_its_route)
{
    shards_start();
    capstan_config_t *cfg = shards_config(1);
    capstan_client_t *c = sharded_client(cfg);
    char jid[25];
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = "reports"; /* homed in b, not the client's own connection (a) */
    cr_assert_eq(capstan_client_push(c, "PlainJob", "[1]", &o, jid), 0, "%s", capstan_client_error(c));
    cr_assert_str_eq(capstan_client_pushed_shard(c, 0), "b");
    long long at = capstan_client_cancel(c, jid);
    cr_assert_gt(at, 0, "%s", capstan_client_error(c));
    for (int i = 0; i < NSHARDS; i++) {
        redisReply *r = redisCommand(srv[i].conn, "HGET it-%s cancelled", jid);
        cr_assert(r && r->type == REDIS_REPLY_STRING && strtoll(r->str, NULL, 10) == at,
                  "shard %s has no cancel mark for the job", names[i]);
        freeReplyObject(r);
    }
    /* Again: the first cancel's time, from every shard. */
    cr_assert_eq(capstan_client_cancel(c, jid), at);
    /* A shard down: the cancel says which. */
    kill(srv[2].pid, SIGKILL);
    waitpid(srv[2].pid, NULL, 0);
    cr_assert_eq(capstan_client_cancel(c, "0123456789abcdef01234567"), -1);
    cr_assert(strstr(capstan_client_error(c), "shard c:"), "%s", capstan_client_error(c));
    /* The first shard down too: the one still up is marked all the same. */
    kill(srv[0].pid, SIGKILL);
    waitpid(srv[0].pid, NULL, 0);
    cr_assert_eq(capstan_client_cancel(c, "76543210fedcba9876543210"), -1);
    cr_assert(strstr(capstan_client_error(c), "shard a:"), "%s", capstan_client_error(c));
    redisReply *r = redisCommand(srv[1].conn, "HGET it-76543210fedcba9876543210 cancelled");
    cr_assert(r && r->type == REDIS_REPLY_STRING, "shard b was not marked while shard a was down");
    freeReplyObject(r);
    capstan_client_free(c);
    capstan_config_free(cfg);
}

/* The whole path: 15,000 jobs pushed by the C client and 15,000 by the
 * Ruby module (Sidekiq 7.3.10), spread over the three shards by the rule,
 * all run once by one supervised capstan (processes: 2) serving every
 * shard, each in the shard it was pushed to. */
Test(routing, jobs_routed_from_c_and_ruby_all_run_once_in_their_shard, .timeout = 400)
{
    enum { PER_ROUTE = 15000 };
    kt_sidekiq_need("7.3.10");
    shards_start();
    capstan_config_t *cfg = shards_config(0);
    capstan_client_t *c = sharded_client(cfg);
    c_push(c, "default", PER_ROUTE, 0);
    char *spec = shard_spec(), *out = NULL;
    /* shards.rb pushes a tenth more to "reports": 13,637 + 1,363. */
    char n[16];
    snprintf(n, sizeof(n), "%d", PER_ROUTE * 10 / 11);
    cr_assert_eq(kt_ruby_v("7.3.10", "shards.rb", (const char *[]){ "push", spec, "-", n, NULL }, &out), 0, "%s",
                 out ? out : "");
    long ruby = ruby_lines(out, 0);
    free(out);
    long counts[NSHARDS], rep[NSHARDS];
    long total = check_queue("default", by_jid, &(int){ 0 }, counts);
    total += check_queue("reports", by_jid, &(int){ 0 }, rep);
    cr_assert_eq(total, PER_ROUTE + ruby);
    assert_spread(counts, (const int[]){ 0, 1, 2 }, 3, total);

    char *conf = NULL, *dir = kt_ledger_dir();
    cr_assert(asprintf(&conf, "processes: 2\nconcurrency: 5\nqueues: [default, reports]\n"
                              "shards:\n  - name: a\n    redis_url: %s\n  - name: b\n    redis_url: %s\n"
                              "  - name: c\n    redis_url: %s\n", srv[0].url, srv[1].url, srv[2].url) > 0);
    char *path = kt_write_file("run.yml", conf);
    pid_t pid = kt_capstan_shards_start(path, dir, NULL);
    char ledger[700];
    snprintf(ledger, sizeof(ledger), "%s/ledger", dir);
    long lines = 0;
    cr_assert(KT_WAIT_UNTIL(({
                  char *t = kt_read_file(ledger);
                  lines = 0;
                  for (char *p = t; p && *p; p++)
                      lines += *p == '\n';
                  free(t);
                  lines >= total; }), 300), "%ld of %ld jobs ran\n%s", lines, total, kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 60), 0, "%s", kt_capstan_log(pid));
    /* Every jid once, in the shard the rule gives it. */
    char *text = kt_read_file(ledger);
    size_t njobs = 0, cap = (size_t)total + 16, wrong = 0;
    char (*jids)[25] = calloc(cap, sizeof(*jids));
    cr_assert(jids);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char jid[64];
        int port = 0;
        cr_assert_eq(sscanf(line, "%63s %d", jid, &port), 2, "ledger line: %s", line);
        cr_assert_lt(njobs, cap, "more runs than jobs");
        snprintf(jids[njobs++], 25, "%s", jid);
        wrong += srv[pick(jid, 0)].port != port;
    }
    free(text);
    qsort(jids, njobs, sizeof(*jids), (int (*)(const void *, const void *))strcmp);
    size_t twice = 0;
    for (size_t i = 1; i < njobs; i++)
        twice += !strcmp(jids[i], jids[i - 1]);
    printf("routing: %ld jobs (%d from C, %ld from Ruby 7.3.10) over 3 shards: %zu runs, %zu twice, %zu in "
           "another shard than the rule's; per shard %ld %ld %ld\n", total, PER_ROUTE, ruby, njobs, twice, wrong,
           counts[0] + rep[0], counts[1] + rep[1], counts[2] + rep[2]);
    cr_assert_eq(njobs, (size_t)total);
    cr_assert_eq(twice, 0);
    cr_assert_eq(wrong, 0);
    for (int i = 0; i < NSHARDS; i++) {
        redisReply *r = redisCommand(srv[i].conn, "GET stat:processed");
        cr_assert(r && r->type == REDIS_REPLY_STRING && strtol(r->str, NULL, 10) == counts[i] + rep[i],
                  "shard %s: stat:processed %s, want %ld", names[i], r && r->str ? r->str : "none",
                  counts[i] + rep[i]);
        freeReplyObject(r);
    }
    free(jids);
    free(path);
    free(conf);
    free(dir);
    free(spec);
    capstan_client_free(c);
    capstan_config_free(cfg);
}

/* The hash gives each shard its share of jids (a CRC's raw scores gave one
 * of three shards half of them), for a few shard lists. */
Test(routing, the_rule_gives_each_shard_its_share)
{
    static const char *const lists[][5] = { { "a", "b", "c" }, { "s1", "s2", "s3", "s4", "s5" }, { "east", "west" } };
    static const size_t lens[] = { 3, 5, 2 };
    enum { KEYS = 30000 };
    for (size_t l = 0; l < 3; l++) {
        long counts[5] = { 0 };
        for (unsigned i = 0; i < KEYS; i++) {
            char jid[25];
            kt_make_jid(jid, (int)l, i);
            counts[capstan__shard_pick(lists[l], lens[l], jid, 24)]++;
        }
        double share = (double)KEYS / (double)lens[l];
        for (size_t k = 0; k < lens[l]; k++)
            cr_assert(counts[k] > 0.9 * share && counts[k] < 1.1 * share,
                      "list %zu: shard %s took %ld of %d keys, its share is %.0f", l, lists[l][k], counts[k], KEYS,
                      share);
    }
}
