/* The operator's commands over a sharded fleet, against three real
 * redis-servers named in a config's shards: list: `capstan stats` (text and
 * JSON) and `capstan top` show each shard and the totals, a shard that
 * cannot be reached is named while the others are still shown, --shard
 * picks one, and `capstan pause`/`unpause` act in every shard that reads
 * the queue. The figures are written into each shard directly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "helpers.h"
#include "capstan/batch.h"
#include "capstan/capstan.h"
#include "support/shard_pick.h"

TestSuite(ops_shards, .timeout = 300, .fini = kt_kill_children);

#define NSHARDS 3
static const char *const names[NSHARDS] = { "a", "b", "c" };

typedef kt_own_server_t shard_srv_t;

static shard_srv_t srv[NSHARDS];

/* Starts a redis-server of the test's own for each shard (no persistence:
 * nothing here restarts them). */
static void shards_start(void)
{
    for (int i = 0; i < NSHARDS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "shard-%s", names[i]);
        kt_own_server_start(&srv[i], name);
    }
}

/* Shards a, b and c, b fetching "reports" alone; c at down_url when given
 * (a port nothing listens on: a shard down). */
static char *shards_file(const char *down_url)
{
    char *body = NULL;
    cr_assert(asprintf(&body, "shards:\n  - name: a\n    redis_url: %s\n  - name: b\n    redis_url: %s\n"
                              "    queues: [reports]\n  - name: c\n    redis_url: %s\n",
                       srv[0].url, srv[1].url, down_url ? down_url : srv[2].url) > 0);
    char *path = kt_write_file(down_url ? "shards-down.yml" : "shards.yml", body);
    free(body);
    return path;
}

/* The URL of a shard that is down: a port bound and never listened on,
 * held for the test's life, so that a connection is refused and no other
 * server (of a test running beside) can take the port meanwhile. */
static char *down_url(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0
              && getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    char *url = NULL;
    cr_assert(asprintf(&url, "redis://127.0.0.1:%d/0", ntohs(a.sin_port)) > 0);
    return url;
}

static long long int_on(int i, const char *fmt, const char *arg)
{
    return kt_int_on(srv[i].conn, fmt, arg);
}

/* Into shard i: processed and failed counts, jobs in "default" (and in
 * "reports" for b) pushed with the C client, sizes of the retry, schedule
 * and dead sets, and a live process of another host with busy threads. */
static void shard_fill(int i, long long processed, long long failed, int jobs, int busy)
{
    char err[CAPSTAN_ERRLEN], jid[32];
    freeReplyObject(redisCommand(srv[i].conn, "SET stat:processed %lld", processed));
    freeReplyObject(redisCommand(srv[i].conn, "SET stat:failed %lld", failed));
    capstan_client_t *c = capstan_client_new(srv[i].url, err);
    cr_assert(c, "%s", err);
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = "default";
    for (int k = 0; k < jobs; k++)
        cr_assert_eq(capstan_client_push(c, "PlainJob", "[1]", &o, jid), 0, "%s", capstan_client_error(c));
    o.queue = "reports";
    for (int k = 0; i == 1 && k < 2; k++)
        cr_assert_eq(capstan_client_push(c, "ReportJob", "[1]", &o, jid), 0, "%s", capstan_client_error(c));
    capstan_client_free(c);
    for (int k = 0; k <= i; k++) {
        freeReplyObject(redisCommand(srv[i].conn, "ZADD retry %d r%d", k, k));
        freeReplyObject(redisCommand(srv[i].conn, "ZADD dead %d d%d", k, k));
    }
    freeReplyObject(redisCommand(srv[i].conn, "ZADD schedule 1 s"));
    char id[64];
    snprintf(id, sizeof(id), "elsewhere-%s:1:abc", names[i]);
    freeReplyObject(redisCommand(srv[i].conn, "SADD processes %s", id));
    freeReplyObject(redisCommand(srv[i].conn, "HSET %s info {\"hostname\":\"elsewhere\",\"concurrency\":10,"
                                              "\"queues\":[\"default\"]} busy %d beat %f",
                                 id, busy, kt_wall()));
}

static void fill_all(void)
{
    shard_fill(0, 5, 1, 3, 2);
    shard_fill(1, 7, 2, 1, 0);
    shard_fill(2, 11, 3, 4, 5);
}

/* The JSON object in out, which may follow stderr's lines. */
static json_t *json_in(const char *out)
{
    const char *p = out[0] == '{' ? out : strstr(out, "\n{");
    cr_assert(p, "no JSON in: %s", out);
    json_t *j = json_loads(p + (p[0] == '\n'), JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert(j, "bad JSON in: %s", out);
    return j;
}

static long long jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_integer(v), "no %s", key);
    return json_integer_value(v);
}

/* The size of queue q in o's queues (-1 when absent). */
static long long queue_size(json_t *o, const char *q)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(o, "queues"), i, e)
        if (!strcmp(json_string_value(json_object_get(e, "name")), q))
            return json_integer_value(json_object_get(e, "size"));
    return -1;
}

Test(ops_shards, stats_json_shows_each_shard_and_the_totals)
{
    shards_start();
    fill_all();
    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, "--json", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    json_t *j = json_in(out);
    /* The totals where one Redis's figures are, for today's readers. */
    cr_expect_eq(jint(j, "processed"), 23);
    cr_expect_eq(jint(j, "failed"), 6);
    cr_expect_eq(jint(j, "retries"), 1 + 2 + 3);
    cr_expect_eq(jint(j, "dead"), 1 + 2 + 3);
    cr_expect_eq(jint(j, "scheduled"), 3);
    cr_expect_eq(queue_size(j, "default"), 3 + 1 + 4);
    cr_expect_eq(queue_size(j, "reports"), 2);
    json_t *procs = json_object_get(j, "processes");
    cr_assert_eq(json_array_size(procs), 3);
    long long busy = 0;
    size_t i;
    json_t *p;
    json_array_foreach(procs, i, p) {
        busy += jint(p, "busy");
        const char *id = json_string_value(json_object_get(p, "identity"));
        char want[64];
        snprintf(want, sizeof(want), "elsewhere-%s:1:abc", json_string_value(json_object_get(p, "shard")));
        cr_expect_str_eq(id, want, "a process listed with its own shard");
    }
    cr_expect_eq(busy, 7);
    /* Each shard's own object, as one Redis's stats are. */
    json_t *shards = json_object_get(j, "shards");
    cr_assert_eq(json_object_size(shards), 3);
    static const long long processed[] = { 5, 7, 11 }, failed[] = { 1, 2, 3 }, jobs[] = { 3, 1, 4 };
    for (int k = 0; k < NSHARDS; k++) {
        json_t *s = json_object_get(shards, names[k]);
        cr_assert(s, "no shard %s", names[k]);
        cr_expect_eq(jint(s, "processed"), processed[k], "shard %s", names[k]);
        cr_expect_eq(jint(s, "failed"), failed[k], "shard %s", names[k]);
        cr_expect_eq(jint(s, "retries"), k + 1, "shard %s", names[k]);
        cr_expect_eq(queue_size(s, "default"), jobs[k], "shard %s", names[k]);
        cr_expect_eq(queue_size(s, "reports"), k == 1 ? 2 : -1, "shard %s", names[k]);
        cr_expect_eq(json_array_size(json_object_get(s, "processes")), 1, "shard %s", names[k]);
        cr_expect_null(json_object_get(s, "error"));
    }
    json_decref(j);
    free(out);
    free(conf);
}

Test(ops_shards, stats_text_shows_each_shard_and_the_totals)
{
    shards_start();
    fill_all();
    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    char *a = strstr(out, "\nShard a "), *b = strstr(out, "\nShard b "), *c = strstr(out, "\nShard c ");
    char *t = strstr(out, "\nTotal of 3 shards\n");
    cr_assert(a && b && c && t && a < b && b < c && c < t, "sections in order: %s", out);
    cr_expect(strstr(a, "Processed: 5  Failed: 1") && strstr(a, "Processed: 5  Failed: 1") < b, "%s", out);
    cr_expect(strstr(b, "Processed: 7  Failed: 2") && strstr(b, "Processed: 7  Failed: 2") < c, "%s", out);
    cr_expect(strstr(c, "Processed: 11  Failed: 3") && strstr(c, "Processed: 11  Failed: 3") < t, "%s", out);
    cr_expect(strstr(t, "Processed: 23  Failed: 6\nScheduled: 3  Retries: 6  Dead: 6\n"), "%s", t);
    cr_expect(strstr(t, "Busy: 7 of 30 threads in 3 processes"), "%s", t);
    cr_expect(strstr(t, "\ndefault                                 8 "), "%s", t);
    cr_expect(strstr(t, "\nreports                                 2 "), "%s", t);
    free(out);
    free(conf);
}

Test(ops_shards, stats_shows_the_others_when_a_shard_is_down)
{
    shards_start();
    fill_all();
    char *url = down_url(), *conf = shards_file(url), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, "--json", NULL }, &out);
    cr_expect_eq(rc, 1, "a shard down exits 1: %s", out);
    cr_expect(strstr(out, "capstan stats: shard c: "), "named on stderr: %s", out);
    json_t *j = json_in(out);
    cr_expect_eq(jint(j, "processed"), 5 + 7, "the totals of the shards read");
    cr_expect_eq(queue_size(j, "default"), 3 + 1);
    json_t *shards = json_object_get(j, "shards");
    cr_expect_eq(jint(json_object_get(shards, "a"), "processed"), 5);
    cr_expect_eq(jint(json_object_get(shards, "b"), "processed"), 7);
    json_t *why = json_object_get(json_object_get(shards, "c"), "error");
    cr_assert(json_is_string(why), "%s", out);
    cr_expect(strstr(json_string_value(why), url), "the error names the shard's server: %s",
              json_string_value(why));
    json_decref(j);
    free(out);

    rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "\nShard c  UNREACHABLE: "), "%s", out);
    cr_expect(strstr(out, "Processed: 5  Failed: 1"), "%s", out);
    cr_expect(strstr(out, "\nTotal of 3 shards (1 unreachable, not counted)\n"), "%s", out);
    cr_expect(strstr(out, "Processed: 12  Failed: 3"), "%s", out);
    free(out);
    free(conf);
    free(url);
}

Test(ops_shards, stats_shard_shows_that_one)
{
    shards_start();
    fill_all();
    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, "--shard", "b", "--json", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    json_t *j = json_in(out);
    cr_expect_eq(jint(j, "processed"), 7);
    cr_expect_eq(json_object_size(json_object_get(j, "shards")), 1);
    cr_expect(json_object_get(json_object_get(j, "shards"), "b"));
    json_decref(j);
    free(out);

    rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, "--shard", "b", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "\nShard b ") && strstr(out, "Processed: 7  Failed: 2"), "%s", out);
    cr_expect(!strstr(out, "\nShard a ") && !strstr(out, "Total of"), "%s", out);
    free(out);

    rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, "--shard", "z", NULL }, &out);
    cr_expect_eq(rc, 64, "%s", out);
    cr_expect(strstr(out, "no shard z") && strstr(out, "a, b, c"), "the known shards named: %s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "stats", "--shard", "b", NULL }, &out);
    cr_expect_eq(rc, 64, "--shard without shards: %s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, "--redis-url", srv[0].url, NULL }, &out);
    cr_expect_eq(rc, 64, "--redis-url with shards: %s", out);
    free(out);
    free(conf);
}

/* A file without shards: its redis_url is the one stats reads. */
Test(ops_shards, stats_file_without_shards_reads_its_redis_url)
{
    shards_start();
    fill_all();
    char *body = NULL, *out = NULL;
    cr_assert(asprintf(&body, "redis_url: %s\n", srv[2].url) > 0);
    char *conf = kt_write_file("one.yml", body);
    int rc = kt_capstan_run((const char *[]){ "stats", "-C", conf, "--json", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    json_t *j = json_in(out);
    cr_expect_eq(jint(j, "processed"), 11);
    cr_expect_null(json_object_get(j, "shards"), "no shards object without shards");
    json_decref(j);
    free(out);
    free(conf);
    free(body);
}

static int paused_in(int i, const char *q)
{
    return (int)int_on(i, "SISMEMBER paused %s", q);
}

Test(ops_shards, pause_acts_in_every_shard_that_fetches_the_queue)
{
    shards_start();
    char *conf = shards_file(NULL), *out = NULL;
    /* default: a and c (no queues: list); reports: b lists it, and a and
     * c fetch every queue. */
    int rc = kt_capstan_run((const char *[]){ "pause", "default", "reports", "-C", conf, NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(paused_in(0, "default") && paused_in(2, "default") && !paused_in(1, "default"), "%s", out);
    cr_expect(paused_in(0, "reports") && paused_in(1, "reports") && paused_in(2, "reports"), "%s", out);
    cr_expect(strstr(out, "shard b: reports: paused"), "%s", out);
    cr_expect(strstr(out, "shard a: default reports: paused"), "%s", out);
    free(out);

    rc = kt_capstan_run((const char *[]){ "unpause", "reports", "-C", conf, NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    for (int i = 0; i < NSHARDS; i++)
        cr_expect(!paused_in(i, "reports"), "shard %s: %s", names[i], out);
    cr_expect(paused_in(0, "default"), "the other queue left paused");
    free(out);

    /* --shard: there alone, even a queue it does not list. */
    rc = kt_capstan_run((const char *[]){ "pause", "default", "-C", conf, "--shard", "b", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(paused_in(1, "default"), "%s", out);
    free(out);
    free(conf);

    /* Every shard with a queues: list: a queue none lists is refused. */
    char *body = NULL;
    cr_assert(asprintf(&body, "shards:\n  - name: a\n    redis_url: %s\n    queues: [mail]\n  - name: b\n"
                              "    redis_url: %s\n    queues: [reports]\n", srv[0].url, srv[1].url) > 0);
    conf = kt_write_file("homes.yml", body);
    rc = kt_capstan_run((const char *[]){ "pause", "mail", "nowhere", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 64, "%s", out);
    cr_expect(strstr(out, "no shard") && strstr(out, "nowhere"), "%s", out);
    cr_expect(!paused_in(0, "mail"), "nothing done when one queue is refused");
    free(out);
    free(conf);
    free(body);
}

Test(ops_shards, pause_with_a_shard_down_does_the_others)
{
    shards_start();
    char *url = down_url(), *conf = shards_file(url), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "pause", "default", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "capstan pause: shard c: "), "%s", out);
    cr_expect(paused_in(0, "default"), "%s", out);
    free(out);
    free(conf);
    free(url);
}

Test(ops_shards, top_shows_a_section_a_shard_and_the_total)
{
    shards_start();
    fill_all();
    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "top", "-C", conf, NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    char *a = strstr(out, "\n== SHARD a "), *b = strstr(out, "\n== SHARD b "), *c = strstr(out, "\n== SHARD c ");
    char *t = strstr(out, "\nTOTAL of 3 shards\n");
    cr_assert(a && b && c && t && a < b && b < c && c < t, "sections in order: %s", out);
    cr_expect(strstr(a, "Processed: 5  Failed: 1") && strstr(a, "Processed: 5  Failed: 1") < b, "%s", out);
    cr_expect(strstr(b, "\nreports ") && strstr(b, "\nreports ") < c, "%s", out);
    cr_expect(strstr(c, "elsewhere-c:1:abc") && strstr(c, "elsewhere-c:1:abc") < t, "%s", out);
    cr_expect(strstr(t, "Processed: 23  Failed: 6  "), "%s", t);
    cr_expect(strstr(t, "Scheduled: 3  Retries: 6  Dead: 6  Busy: 7/30\n"), "%s", t);
    free(out);

    rc = kt_capstan_run((const char *[]){ "top", "-C", conf, "--shard", "c", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "\n== SHARD c ") && !strstr(out, "SHARD a") && !strstr(out, "TOTAL"), "%s", out);
    free(out);
    free(conf);
}

Test(ops_shards, top_shows_the_others_when_a_shard_is_down)
{
    shards_start();
    fill_all();
    char *url = down_url(), *conf = shards_file(url), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "top", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 1, "a shard down exits 1: %s", out);
    cr_expect(strstr(out, "\n== SHARD c  UNREACHABLE: "), "%s", out);
    cr_expect(strstr(out, "capstan top: shard c: "), "named on stderr: %s", out);
    cr_expect(strstr(out, "Processed: 7  Failed: 2"), "%s", out);
    cr_expect(strstr(out, "\nTOTAL of 3 shards (1 unreachable, not counted)\nProcessed: 12  Failed: 3  "),
              "%s", out);
    free(out);
    free(conf);
    free(url);
}

/* The shards with a periodic: schedule "nightly" (c at down_url when given). */
static char *periodic_file(const char *down)
{
    char *base = shards_file(down);
    FILE *f = fopen(base, "a");
    cr_assert(f);
    fputs("periodic:\n  nightly:\n    class: Nightly\n    cron: \"0 3 * * *\"\n", f);
    fclose(f);
    return base;
}

Test(ops_shards, periodic_shows_the_latest_tick_of_any_shard)
{
    shards_start();
    freeReplyObject(redisCommand(srv[0].conn, "HSET capstan:periodic:nightly last 1700000000"));
    freeReplyObject(redisCommand(srv[2].conn, "HSET capstan:periodic:nightly last 1800000000"));
    freeReplyObject(redisCommand(srv[1].conn, "HSET capstan:periodic:gone last 1600000000"));
    freeReplyObject(redisCommand(srv[2].conn, "HSET capstan:periodic:gone last 1600000001"));
    char *conf = periodic_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "periodic", "-C", conf, "--json", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(json_is_array(j), "%s", out);
    cr_assert_eq(json_array_size(j), 2, "each record once: %s", out);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(j, 0), "name")), "nightly");
    cr_expect_eq(jint(json_array_get(j, 0), "last"), 1800000000, "the latest of any shard");
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(j, 1), "name")), "gone");
    cr_expect_eq(jint(json_array_get(j, 1), "last"), 1600000001);
    json_decref(j);
    free(out);

    rc = kt_capstan_run((const char *[]){ "periodic", "-C", conf, "--json", "--shard", "a", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    j = json_loads(out, 0, NULL);
    cr_assert_eq(json_array_size(j), 1, "%s", out);
    cr_expect_eq(jint(json_array_get(j, 0), "last"), 1700000000, "shard a's alone");
    json_decref(j);
    free(out);
    free(conf);

    char *url = down_url();
    conf = periodic_file(url);
    rc = kt_capstan_run((const char *[]){ "periodic", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 0, "the schedules shown, as with one Redis unreachable: %s", out);
    cr_expect(strstr(out, "capstan periodic: shard c: ") && strstr(out, "its last ticks unknown"), "%s", out);
    cr_expect(strstr(out, "2023-11-14T22:13:20+00:00"), "shard a's tick: %s", out);
    free(out);
    free(conf);
    free(url);
}

Test(ops_shards, cancel_marks_the_job_in_every_shard)
{
    shards_start();
    char *conf = shards_file(NULL), *out = NULL;
    freeReplyObject(redisCommand(srv[1].conn, "HSET it-j2 cancelled 1700000000"));
    int rc = kt_capstan_run((const char *[]){ "cancel", "j1", "j2", "-C", conf, NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    for (int i = 0; i < NSHARDS; i++) {
        cr_expect_eq(int_on(i, "HEXISTS it-%s cancelled", "j1"), 1, "shard %s", names[i]);
        cr_expect_gt(int_on(i, "TTL it-%s", "j1"), 0, "shard %s: the mark expires", names[i]);
    }
    cr_expect(strstr(out, "j2 cancelled at 2023-11-14T22:13:20Z"), "the first cancel's time: %s", out);
    free(out);
    free(conf);

    char *url = down_url();
    conf = shards_file(url);
    rc = kt_capstan_run((const char *[]){ "cancel", "j3", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "capstan cancel: shard c: "), "%s", out);
    cr_expect_eq(int_on(0, "HEXISTS it-%s cancelled", "j3"), 1, "the others still done");
    free(out);
    free(conf);
    free(url);
}

/* The listings whose state has no shard to find it by refuse without
 * --shard rather than act on the first shard. */
Test(ops_shards, listings_of_locks_need_a_shard)
{
    shards_start();
    char *conf = shards_file(NULL), *out = NULL;
    const char *const *refused[] = {
        (const char *[]){ "locks", "list", "-C", conf, NULL },
        (const char *[]){ "locks", "reap", "-C", conf, NULL },
        (const char *[]){ "lock", "list", "-C", conf, NULL },
        (const char *[]){ "lock", "clear-dead", "-C", conf, NULL },
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        int rc = kt_capstan_run(refused[i], &out);
        cr_expect_eq(rc, 64, "%s %s: %s", refused[i][0], refused[i][1], out);
        cr_expect(strstr(out, "does not yet support shards: give --shard NAME (a, b, c)"), "%s", out);
        free(out);
    }
    int rc = kt_capstan_run((const char *[]){ "locks", "list", "-C", conf, "--shard", "b", NULL }, &out);
    cr_expect_eq(rc, 0, "--shard: %s", out);
    free(out);
    free(conf);
}

/* A limiter allows its size in each shard: each shard's is shown. */
Test(ops_shards, limits_shows_each_shards_limiters)
{
    shards_start();
    freeReplyObject(redisCommand(srv[1].conn, "SET limiter:api:meta %s", "concurrent size=3"));
    freeReplyObject(redisCommand(srv[2].conn, "SET limiter:api:meta %s", "concurrent size=5"));
    freeReplyObject(redisCommand(srv[2].conn, "SET limiter:mail:meta %s", "concurrent size=1"));
    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "limits", "-C", conf, "--json", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(json_is_object(j), "%s", out);
    cr_expect_eq(json_array_size(json_object_get(j, "a")), 0, "%s", out);
    cr_expect_eq(json_array_size(json_object_get(j, "b")), 1, "%s", out);
    cr_expect_eq(json_array_size(json_object_get(j, "c")), 2, "%s", out);
    json_decref(j);
    free(out);

    rc = kt_capstan_run((const char *[]){ "limits", "info", "api", "-C", conf, NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    char *b = strstr(out, "Shard b\n"), *c = strstr(out, "Shard c\n");
    cr_expect(strstr(out, "Shard a\n(no limiter named api)\n"), "%s", out);
    cr_expect(b && c && strstr(b, "size=3") && strstr(b, "size=3") < c && strstr(c, "size=5"), "%s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "limits", "info", "nope", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 1, "in no shard, as on one Redis: %s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "limits", "-C", conf, "--shard", "b", "--json", NULL }, &out);
    cr_expect_eq(rc, 0, "%s", out);
    j = json_loads(out, 0, NULL);
    cr_expect(json_is_array(j) && json_array_size(j) == 1, "--shard: that shard's, as one Redis: %s", out);
    json_decref(j);
    free(out);
    free(conf);

    char *url = down_url();
    conf = shards_file(url);
    rc = kt_capstan_run((const char *[]){ "limits", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 69, "%s", out);
    cr_expect(strstr(out, "capstan limits: shard c: ") && strstr(out, "\nShard c\nUNREACHABLE: "), "%s", out);
    cr_expect(strstr(out, "api\tconcurrent\tsize=3"), "the others shown: %s", out);
    free(out);
    free(conf);
    free(url);
}

Test(ops_shards, locks_delete_acts_in_the_digests_shard)
{
    shards_start();
    const char *digest = "uniquejobs:0123abcd";
    static const char *const open[] = { "a", "c" }; /* b lists its queues */
    int home = capstan__shard_pick(open, 2, digest, strlen(digest)) == 0 ? 0 : 2;
    for (int i = 0; i < NSHARDS; i++) {
        freeReplyObject(redisCommand(srv[i].conn, "HSET %s:LOCKED j1 1", digest));
        freeReplyObject(redisCommand(srv[i].conn, "ZADD uniquejobs:digests 1 %s", digest));
    }
    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "locks", "delete", digest, "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 0, "%s", out);
    for (int i = 0; i < NSHARDS; i++)
        cr_expect_eq(int_on(i, "EXISTS %s:LOCKED", digest), i == home ? 0 : 1, "shard %s (home %s): %s",
                     names[i], names[home], out);
    free(out);
    /* --shard: a lock of a queue with a home shard is there. */
    rc = kt_capstan_run((const char *[]){ "locks", "delete", digest, "-C", conf, "--shard", "b", NULL }, &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect_eq(int_on(1, "EXISTS %s:LOCKED", digest), 0, "%s", out);
    free(out);
    free(conf);
}

Test(ops_shards, lock_is_taken_in_its_names_shard)
{
    shards_start();
    const char *name = "nightly-report";
    int home = (int)capstan__shard_pick(names, NSHARDS, name, strlen(name));
    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "lock", name, "-C", conf, "--", "true", NULL }, &out);
    cr_assert_eq(rc, 0, "%s", out);
    for (int i = 0; i < NSHARDS; i++)
        cr_expect_eq(int_on(i, "EXISTS rql:fence:%s", name), i == home ? 1 : 0, "shard %s (home %s)", names[i],
                     names[home]);
    free(out);
    free(conf);
}

/* A batch is in the shard it was made in (by a client without shards:
 * it needs one MULTI), which its bid does not say: looked for in each. */
Test(ops_shards, batch_is_found_in_its_shard)
{
    shards_start();
    char err[CAPSTAN_ERRLEN], bid[64];
    capstan_client_t *c = capstan_client_new(srv[1].url, err);
    cr_assert(c, "%s", err);
    capstan_batch_t *b = capstan_batch_new(c, err);
    cr_assert(b, "%s", err);
    cr_assert_eq(capstan_batch_describe(b, "nightly export"), 0);
    cr_assert_eq(capstan_batch_push(b, "PlainJob", "[1]", NULL, NULL), 0, "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    snprintf(bid, sizeof(bid), "%s", capstan_batch_bid(b));
    capstan_batch_free(b);
    capstan_client_free(c);

    char *conf = shards_file(NULL), *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "batch", "status", bid, "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "shard:        b\n") && strstr(out, "nightly export"), "%s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "batch", "list", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 0, "%s", out);
    char *sb = strstr(out, "Shard b\n"), *sc = strstr(out, "Shard c\n"), *at = strstr(out, bid);
    cr_expect(strstr(out, "Shard a\n") && sb && sc && at > sb && at < sc, "listed under b: %s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "batch", "status", "nosuchbid", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "no batch nosuchbid in any shard"), "%s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "batch", "invalidate", bid, "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 0, "%s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "batch", "status", bid, "-C", conf, "--shard", "b", NULL }, &out);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "(invalidated)"), "invalidated in its shard: %s", out);
    free(out);
    free(conf);

    char *url = down_url();
    conf = shards_file(url);
    rc = kt_capstan_run((const char *[]){ "batch", "status", bid, "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 0, "found in b with c down: %s", out);
    free(out);
    rc = kt_capstan_run((const char *[]){ "batch", "status", "nosuchbid", "-C", conf, NULL }, &out);
    cr_expect_eq(rc, 69, "not found, and a shard not read: %s", out);
    cr_expect(strstr(out, "capstan batch: shard c: "), "%s", out);
    free(out);
    free(conf);
    free(url);
}
