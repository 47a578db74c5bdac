/* Redis Sentinel, end to end with the capstan binary: a master, a replica and
 * three sentinels of the test's own. What a user checks: capstan given a
 * redis+sentinel:// URL works, keeps working through a failover with every
 * job run (some twice at most, those in flight), registers on the new
 * master, and names the problem when the master's name is wrong. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/config.h"

TestSuite(sentinel, .timeout = 120, .fini = kt_kill_children);

typedef struct cluster {
    int master, replica; /* ports; replica 0 = none */
    pid_t master_pid;
    int sentinel[3];
    pid_t sentinel_pid[3];
    int nsentinels;
    char url[256];       /* redis+sentinel://... /mymaster */
    char dir[512];       /* the servers' logs */
} cluster_t;

/* Starts redis-server with args in the test's own directory dir. */
static pid_t start_server(const char *dir, const char *tag, const char *const *args)
{
    const char *argv[32] = { "redis-server" };
    int n = 1;
    for (; args[n - 1]; n++)
        argv[n] = args[n - 1];
    char logf[600];
    snprintf(logf, sizeof(logf), "%s/%s.log", dir, tag);
    argv[n++] = "--dir";
    argv[n++] = dir;
    argv[n++] = "--logfile";
    argv[n++] = logf;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    return kt_track(pid);
}

/* The password of the sentinels, and of the master (none when NULL). */
static const char *sentinel_pw, *master_pw;
static int master_pw_port;

static redisContext *on(int port)
{
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    const char *pw = port == master_pw_port ? master_pw : sentinel_pw;
    if (c && !c->err && pw)
        freeReplyObject(redisCommand(c, "AUTH %s", pw));
    return c;
}

/* PING answered (a sentinel or a server that finished loading). */
static int pings(int port)
{
    redisContext *c = on(port);
    redisReply *r = c && !c->err ? redisCommand(c, "PING") : NULL;
    int ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* A command's reply on the server at port (caller frees; NULL if down). */
static redisReply *cmd_on(int port, const char *fmt, const char *arg)
{
    redisContext *c = on(port);
    redisReply *r = c && !c->err ? redisCommand(c, fmt, arg) : NULL;
    redisFree(c);
    return r;
}

static long long int_on(int port, const char *fmt, const char *arg)
{
    redisReply *r = cmd_on(port, fmt, arg);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

/* Whether INFO section of port contains needle. */
static int info_has(int port, const char *section, const char *needle)
{
    redisReply *r = cmd_on(port, "INFO %s", section);
    int yes = r && r->type == REDIS_REPLY_STRING && strstr(r->str, needle) != NULL;
    freeReplyObject(r);
    return yes;
}

/* The number after field in INFO section on port, or -1. */
static long long info_num(int port, const char *section, const char *field)
{
    redisReply *r = cmd_on(port, "INFO %s", section);
    const char *at = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, field) : NULL;
    long long v = at ? atoll(at + strlen(field)) : -1;
    freeReplyObject(r);
    return v;
}

/* The port sentinel s gives for mymaster, or -1. */
static int master_port(int s)
{
    redisReply *r = cmd_on(s, "SENTINEL get-master-addr-by-name %s", "mymaster");
    int port = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? atoi(r->element[1]->str) : -1;
    freeReplyObject(r);
    return port;
}

/* The last lines of the servers' and every sentinel's logs, for an
 * assertion about what the sentinels decided or the servers hold. */
static const char *sentinel_logs(const cluster_t *k)
{
    static char out[9000];
    size_t len = 0;
    out[0] = '\0';
    for (int i = -2; i < k->nsentinels; i++) {
        char path[600], name[32];
        if (i < 0) {
            snprintf(name, sizeof(name), "%s", i == -2 ? "master" : "replica");
            snprintf(path, sizeof(path), "%s/%s.log", k->dir, name);
        } else {
            snprintf(name, sizeof(name), "sentinel %d", i);
            snprintf(path, sizeof(path), "%s/s%d/sentinel.log", k->dir, i);
        }
        char *log = kt_read_file(path);
        size_t n = log ? strlen(log) : 0;
        len += (size_t)snprintf(out + len, sizeof(out) - len, "\n-- %s:\n%s", name,
                                log ? log + (n > 1200 ? n - 1200 : 0) : "(no log)");
        free(log);
        if (len >= sizeof(out))
            break;
    }
    return out;
}

/* Waits until the replica has every write the master had taken when
 * called. WAIT would not do: it waits for the writes of the connection it
 * is sent on, and the test's own connections write nothing (a fresh
 * connection's WAIT returns at once). Just after a full resync the master
 * streams nothing until the replica's first acknowledgement, up to a
 * second later. */
static void replica_caught_up(const cluster_t *k)
{
    long long off = info_num(k->master, "replication", "master_repl_offset:");
    cr_assert_geq(off, 0);
    cr_assert(KT_WAIT_UNTIL(info_num(k->replica, "replication", "slave_repl_offset:") >= off, 20),
              "the replica is at offset %lld of the master's %lld: %s",
              info_num(k->replica, "replication", "slave_repl_offset:"), off, sentinel_logs(k));
}

/* The end of the log of capstan process pid: a whole log is too much for an
 * assertion's message. */
static const char *log_tail(pid_t pid)
{
    static char tail[4000];
    char *log = kt_capstan_log(pid);
    size_t n = log ? strlen(log) : 0;
    snprintf(tail, sizeof(tail), "%s", log ? log + (n > 3000 ? n - 3000 : 0) : "(no log)");
    free(log);
    return tail;
}

/* Starts a master (with a replica if asked) and nsentinels sentinels
 * monitoring it as mymaster; with pw, the master and the sentinels each
 * want a password of their own ("mpw", "spw"). */
static void cluster_start_pw(cluster_t *k, int with_replica, int nsentinels, int pw)
{
    char *dir = kt_tmp("sentinel");
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    snprintf(k->dir, sizeof(k->dir), "%s", dir);
    char mp[16], rp[16];
    k->master = kt_free_port();
    master_pw_port = k->master;
    master_pw = pw ? "mpw" : NULL;
    snprintf(mp, sizeof(mp), "%d", k->master);
    const char *master_args[] = { "--port", mp, "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--requirepass", pw ? "mpw" : "", NULL };
    k->master_pid = start_server(dir, "master", master_args);
    if (with_replica) {
        k->replica = kt_free_port();
        snprintf(rp, sizeof(rp), "%d", k->replica);
        start_server(dir, "replica", (const char *[]){ "--port", rp, "--bind", "127.0.0.1",
                                                       "--save", "", "--appendonly", "no",
                                                       "--replicaof", "127.0.0.1", mp, NULL });
    }
    k->nsentinels = nsentinels;
    int len = snprintf(k->url, sizeof(k->url), "redis+sentinel://%s", pw ? ":mpw@" : "");
    for (int i = 0; i < nsentinels; i++) {
        k->sentinel[i] = kt_free_port();
        char name[32], conf[700], body[512], sdir[600];
        snprintf(name, sizeof(name), "s%d", i);
        snprintf(sdir, sizeof(sdir), "%s/%s", dir, name);
        cr_assert(mkdir(sdir, 0700) == 0 || errno == EEXIST);
        snprintf(conf, sizeof(conf), "%s/sentinel.conf", sdir);
        snprintf(body, sizeof(body),
                 "port %d\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 %d 2\n"
                 "sentinel down-after-milliseconds mymaster 1000\n"
                 "sentinel failover-timeout mymaster 5000\n%s", k->sentinel[i], k->master,
                 pw ? "sentinel auth-pass mymaster mpw\nrequirepass spw\n" : "");
        FILE *f = fopen(conf, "w");
        cr_assert(f);
        fputs(body, f);
        fclose(f);
        k->sentinel_pid[i] = start_server(sdir, "sentinel", (const char *[]){ conf, "--sentinel",
                                                                              NULL });
        len += snprintf(k->url + len, sizeof(k->url) - (size_t)len, "%s127.0.0.1:%d",
                        i ? "," : "", k->sentinel[i]);
    }
    snprintf(k->url + len, sizeof(k->url) - (size_t)len, "/mymaster%s",
             pw ? "?sentinel_password=spw" : "");
    sentinel_pw = pw ? "spw" : NULL;
    cr_assert(KT_WAIT_UNTIL(pings(k->master), 30));
    for (int i = 0; i < nsentinels; i++)
        cr_assert(KT_WAIT_UNTIL(master_port(k->sentinel[i]) == k->master, 30), "%s",
                  sentinel_logs(k));
    if (with_replica)
        cr_assert(KT_WAIT_UNTIL(info_has(k->replica, "replication", "master_link_status:up"), 30));
    free(dir);
}

static void cluster_start(cluster_t *k, int with_replica, int nsentinels)
{
    cluster_start_pw(k, with_replica, nsentinels, 0);
}

/* n RecordJobs, every second one followed by a SleepJob of sleep_ms when
 * not 0: paced so that the drain outlasts two failovers. */
static void push_paced(int port, unsigned n, int sleep_ms)
{
    redisContext *c = on(port);
    cr_assert(c && !c->err);
    unsigned total = sleep_ms ? n + n / 2 : n;
    char **p = calloc(total, sizeof(char *)), args[32];
    snprintf(args, sizeof(args), "[%d]", sleep_ms);
    for (unsigned i = 0, at = 0; i < n; i++) {
        char jid[25];
        kt_make_jid(jid, 7, i);
        p[at++] = kt_payload("RecordJob", "[\"rec\"]", jid, "default");
        if (sleep_ms && i % 2) {
            kt_make_jid(jid, 8, i);
            p[at++] = kt_payload("SleepJob", args, jid, "default");
        }
    }
    kt_push_all(c, "default", p, total);
    for (unsigned i = 0; i < total; i++)
        free(p[i]);
    free(p);
    redisFree(c);
}

static void push_records(int port, unsigned n)
{
    push_paced(port, n, 0);
}

/* Failed jobs (a handler's write refused mid-failover) due now. */
static void retry_now(int port)
{
    redisContext *c = on(port);
    redisReply *r = c && !c->err ? redisCommand(c, "ZRANGE retry 0 -1") : NULL;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        freeReplyObject(redisCommand(c, "ZADD retry XX 0 %b", r->element[i]->str,
                                     r->element[i]->len));
    freeReplyObject(r);
    redisFree(c);
}

Test(sentinel, capstan_run_finds_the_master_through_the_sentinels)
{
    cluster_t k = { 0 };
    cluster_start(&k, 0, 3);
    push_records(k.master, 50);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", k.url, NULL });
    cr_assert(KT_WAIT_UNTIL(int_on(k.master, "SCARD %s", "rec") == 50, 20), "%s",
              log_tail(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", log_tail(pid));
}

/* Whether any uniquejobs:working:* list on port holds anything. */
static long long working_left(int port)
{
    redisReply *r = cmd_on(port, "KEYS %s", "uniquejobs:working:*");
    long long n = 0;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        n += int_on(port, "LLEN %s", r->element[i]->str);
    freeReplyObject(r);
    return n;
}

/* How many jobs the failover tests drain: 20,000 as the issue has it, or
 * KT_SENTINEL_JOBS for a slow build. */
static unsigned failover_jobs(void)
{
    const char *e = getenv("KT_SENTINEL_JOBS");
    return e && atoi(e) > 0 ? (unsigned)atoi(e) : 20000;
}

static double epoch(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec / 1e6;
}

/* A master with a replica and three sentinels, n RecordJobs queued and capstan
 * draining them through the sentinels. */
typedef struct drain {
    cluster_t k;
    unsigned n;
    pid_t pid;
    char *identity;
    char *yml;
} drain_t;

static void drain_start(drain_t *d, unsigned n, const char *concurrency, int sleep_ms,
                        const char *yaml)
{
    memset(d, 0, sizeof(*d));
    d->n = n;
    cluster_start(&d->k, 1, 3);
    /* Failover needs the sentinels to know the replica, and every one of
     * them: a sentinel learns of replicas from the master's INFO (every 10
     * s), so one that missed it cannot learn of it once the master is
     * killed, and when elected leader it finds no replica to promote. */
    for (int i = 0; i < d->k.nsentinels; i++)
        cr_assert(KT_WAIT_UNTIL(info_has(d->k.sentinel[i], "sentinel", "slaves=1,sentinels=3"),
                                30), "%s", sentinel_logs(&d->k));
    push_paced(d->k.master, d->n, sleep_ms);
    /* The pushes are on the replica, as pushes with min_replicas_ack are:
     * a failover may cost acks, never jobs (see the README). */
    replica_caught_up(&d->k);
    char body[512];
    snprintf(body, sizeof(body), "heartbeat_interval: 0.5\nliveness_ttl: 2\nrecovery_interval: 1\n"
             "average_scheduled_poll_interval: 0.5\n%s", yaml);
    d->yml = kt_write_file("sentinel.yml", body);
    d->pid = kt_capstan_start((const char *[]){ "-C", d->yml, "-c", concurrency, "--redis-url",
                                            d->k.url, NULL });
    cr_assert(KT_WAIT_UNTIL(int_on(d->k.master, "SCARD %s", "processes") == 1, 20), "%s",
              log_tail(d->pid));
    redisReply *ids = cmd_on(d->k.master, "SMEMBERS %s", "processes");
    cr_assert(ids && ids->type == REDIS_REPLY_ARRAY && ids->elements == 1);
    d->identity = strdup(ids->element[0]->str);
    freeReplyObject(ids);
}

static void ran_at_least(const drain_t *d, int port, long long n)
{
    cr_assert(KT_WAIT_UNTIL(int_on(port, "SCARD %s", "rec") >= n, 40), "%lld of %lld: %s",
              int_on(port, "SCARD %s", "rec"), n, log_tail(d->pid));
}

/* The jobs on port still to run, wherever they are (the retry set,
 * queue:default, the working lists), counted in one step: a job moves
 * between them atomically, so it is counted once, and a count of 0 means
 * none is left anywhere (-1: no answer). Their payloads into *left, which
 * the caller frees. */
static long long unfinished(int port, redisReply **left)
{
    static const char lua[] =
        "local left = redis.call('ZRANGE', 'retry', 0, -1)\n"
        "for _, v in ipairs(redis.call('LRANGE', 'queue:default', 0, -1)) do left[#left + 1] = v end\n"
        "for _, k in ipairs(redis.call('KEYS', 'uniquejobs:working:*')) do\n"
        "  for _, v in ipairs(redis.call('LRANGE', k, 0, -1)) do left[#left + 1] = v end\n"
        "end\n"
        "return left\n";
    redisReply *r = cmd_on(port, "EVAL %s 0", lua);
    long long n = r && r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : -1;
    freeReplyObject(*left);
    *left = r;
    return n;
}

/* The payloads of reply r (an array), one a line, for an assertion's message. */
static const char *payloads(const redisReply *r)
{
    static char out[4000];
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements && len < sizeof(out); i++)
        len += (size_t)snprintf(out + len, sizeof(out) - len, "\n%s", r->element[i]->str);
    return out;
}

/* Every job ran on the master at port, none is left queued, to retry or in
 * a working list; returns how many ran twice (less writes of theirs Redis
 * lost). Every job recorded is not every job done: a job whose ack the
 * failover lost is given back from the working list after it ran, and one
 * whose SADD went through but not its RPUSH is retried; either then waits
 * in the queue until a processor is free to fetch it, which can take a
 * while on a busy machine, or with min_replicas_ack while the new master
 * has no replica yet (each WAIT then takes its whole timeout). */
static long long drain_finish(const drain_t *d, int port)
{
    cr_assert(KT_WAIT_UNTIL(({ retry_now(port);
                               int_on(port, "SCARD %s", "rec") == d->n; }), 40),
              "%lld of %u jobs ran, %lld queued: %s\n-- servers and sentinels:%s",
              int_on(port, "SCARD %s", "rec"), d->n, int_on(port, "LLEN %s", "queue:default"),
              log_tail(d->pid), sentinel_logs(&d->k));
    redisReply *left = NULL;
    cr_assert(KT_WAIT_UNTIL(({ retry_now(port);
                               unfinished(port, &left) == 0; }), 30),
              "%zu jobs left unrun (retry, queue:default, working lists):%s\n-- capstan: %s",
              left ? left->elements : 0, payloads(left), log_tail(d->pid));
    freeReplyObject(left);
    return int_on(port, "LLEN %s", "rec:log") - d->n;
}

/* The process is in Sidekiq's process set of the master at port, as the
 * Web UI reads it (Sidekiq::ProcessSet), with a beat later than since. */
static void listed_by_sidekiq(const drain_t *d, int port, double since)
{
    cr_assert(KT_WAIT_UNTIL(({ redisReply *b = cmd_on(port, "HGET %s beat", d->identity);
                               int newer = b && b->type == REDIS_REPLY_STRING &&
                                           atof(b->str) > since;
                               freeReplyObject(b);
                               newer; }), 15), "%s", log_tail(d->pid));
    char url[64], *out = NULL;
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", port);
    cr_assert_eq(kt_ruby("at_url.rb", (const char *[]){ url, "processes", NULL }, &out), 0,
                 "%s", out);
    cr_assert(strstr(out, d->identity), "Sidekiq::ProcessSet on the new master: %s", out);
    free(out);
}

static void drain_stop(drain_t *d)
{
    cr_assert_eq(kt_capstan_stop(d->pid, SIGTERM, 20), 0, "%s", log_tail(d->pid));
    free(d->identity);
    free(d->yml);
}

/* SENTINEL FAILOVER (asked again while the sentinels refuse it: one still
 * settling, the replica not yet known as good), then waits until every
 * sentinel names to as the master. Returns the jobs in flight at the
 * failover, the only ones that may run again: those in the working lists of
 * the old master just before, and of the new one once promoted. */
static long long fail_over(const cluster_t *k, int from, int to)
{
    long long in_flight = working_left(from);
    cr_assert(KT_WAIT_UNTIL(({ redisReply *r = cmd_on(k->sentinel[0], "SENTINEL FAILOVER %s",
                                                      "mymaster");
                               int ok = r && r->type == REDIS_REPLY_STATUS;
                               freeReplyObject(r);
                               ok; }), 30), "the sentinels refused the failover");
    cr_assert(KT_WAIT_UNTIL(master_port(k->sentinel[0]) == to, 15), "%s", sentinel_logs(k));
    in_flight += working_left(to);
    for (int i = 1; i < k->nsentinels; i++)
        cr_assert(KT_WAIT_UNTIL(master_port(k->sentinel[i]) == to, 15), "%s", sentinel_logs(k));
    return in_flight;
}

Test(sentinel, jobs_drain_through_two_failovers)
{
    drain_t d;
    /* Every other job sleeps 4 ms, so the drain (20 s) outlasts both
     * failovers (the second waits for the sentinels to demote the old
     * master, about 10 s, and for its full resync) however soon capstan is
     * on each new master. */
    drain_start(&d, failover_jobs(), "2", 4, "");
    ran_at_least(&d, d.k.master, d.n / 10);
    double t0 = kt_now(), since = epoch();
    long long in1 = fail_over(&d.k, d.k.master, d.k.replica);
    long long at1 = int_on(d.k.replica, "SCARD %s", "rec");
    /* The demoted master becomes the new one's replica, and can be
     * promoted back. */
    cr_assert(KT_WAIT_UNTIL(info_has(d.k.master, "replication", "master_link_status:up"), 30));
    long long in2 = fail_over(&d.k, d.k.replica, d.k.master);
    long long at2 = int_on(d.k.master, "SCARD %s", "rec");
    cr_assert_lt(at2, d.n, "drained before the second failover: too few jobs for the test");
    long long dups = drain_finish(&d, d.k.master);
    fprintf(stderr, "[two failovers] %u jobs: %lld and %lld done at the failovers, %lld and %lld "
            "in flight; all done %.1f s after the first; %lld ran twice\n", d.n, at1, at2, in1,
            in2, kt_now() - t0, dups);
    cr_assert_geq(dups, 0);
    cr_assert_leq(dups, in1 + in2, "more duplicates than jobs in flight at the failovers");
    listed_by_sidekiq(&d, d.k.master, since);
    drain_stop(&d);
}

/* Whether the server at port says it is a master. */
static int is_master(int port)
{
    redisReply *r = cmd_on(port, "ROLE%s", "");
    int m = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING
            && strcmp(r->element[0]->str, "master") == 0;
    freeReplyObject(r);
    return m;
}

/* After SENTINEL FAILOVER the old master stays a master, taking writes,
 * until the sentinels demote it (seconds later): a process that only asked
 * the sentinels again on a lost connection or a READONLY ran jobs there all
 * that time, jobs that run again on the new master. It asks every beat, so
 * it leaves the old master within one while that is still a master. */
Test(sentinel, a_replaced_master_still_taking_writes_is_left_within_a_beat)
{
    drain_t d;
    drain_start(&d, failover_jobs(), "2", 2, "");
    ran_at_least(&d, d.k.master, d.n / 10);
    fail_over(&d.k, d.k.master, d.k.replica);
    double t0 = kt_now();
    /* Left: no job recorded on the old master for 0.5 s. */
    long long last = int_on(d.k.master, "SCARD %s", "rec");
    double still = kt_now();
    int master_when_left = 0;
    while (kt_now() - t0 < 15) {
        kt_sleep(0.05);
        long long now = int_on(d.k.master, "SCARD %s", "rec");
        if (now != last) {
            last = now;
            still = kt_now();
        } else if (kt_now() - still >= 0.5) {
            master_when_left = is_master(d.k.master);
            break;
        }
    }
    fprintf(stderr, "[failover] the old master's last job %.2f s after the sentinels named the new one; "
            "it was %s then\n", still - t0, master_when_left ? "still a master" : "a replica already");
    cr_assert(master_when_left, "capstan stayed on the old master until it was demoted, %.1f s: %s",
              still - t0, log_tail(d.pid));
    cr_assert_leq(still - t0, 2.0, "%.1f s on the old master", still - t0);
    ran_at_least(&d, d.k.replica, int_on(d.k.replica, "SCARD %s", "rec") + 100); /* on the new one */
    drain_stop(&d);
}

/* The calls of capstan's scripts (fetches, acks) and of RecordJob's SADD
 * the server at port has run: what only capstan sends there. */
static long long capstan_calls(int port)
{
    return info_num(port, "commandstats", "cmdstat_evalsha:calls=")
           + info_num(port, "commandstats", "cmdstat_sadd:calls=");
}

/* Seconds from t0 to the last call of capstan's that the server at port
 * ran, once none has come for 0.5 s (at most 12 s on). */
static double last_call_after(int port, double t0)
{
    long long last = capstan_calls(port);
    double at = kt_now();
    while (kt_now() - at < 0.5 && kt_now() - t0 < 12) {
        kt_sleep(0.05);
        long long now = capstan_calls(port);
        if (now != last) {
            last = now;
            at = kt_now();
        }
    }
    return at - t0;
}

/* The sentinels announce a new master on +switch-master: capstan follows
 * the announcement at once, not at its next beat (10 s here), so every
 * connection leaves the old master, still a master taking writes, within a
 * second of the switch; twice in a row. */
Test(sentinel, a_switch_announced_by_the_sentinels_is_followed_at_once)
{
    drain_t d;
    drain_start(&d, failover_jobs(), "2", 4, "heartbeat_interval: 10\nliveness_ttl: 30\n");
    ran_at_least(&d, d.k.master, d.n / 20);
    int from = d.k.master, to = d.k.replica;
    for (int round = 1; round <= 2; round++) {
        fail_over(&d.k, from, to);
        double left = last_call_after(from, kt_now());
        int still_master = is_master(from);
        fprintf(stderr, "[switch %d] capstan's last call on the old master %.2f s after the "
                "sentinels named the new one; it is %s\n", round, left,
                still_master ? "still a master" : "a replica already");
        cr_assert(still_master, "the old master was demoted before capstan left it: %s",
                  log_tail(d.pid));
        cr_assert_leq(left, 1.0, "switch %d: on the old master %.1f s after the switch: %s", round,
                      left, log_tail(d.pid));
        ran_at_least(&d, to, int_on(to, "SCARD %s", "rec") + 100); /* on the new one */
        if (round == 2)
            break;
        /* What the sentinels do seconds later, done now: the old master
         * becomes the new one's replica, to be promoted back. */
        char port[16];
        snprintf(port, sizeof(port), "%d", to);
        redisContext *c = on(from);
        freeReplyObject(redisCommand(c, "REPLICAOF 127.0.0.1 %s", port));
        redisFree(c);
        cr_assert(KT_WAIT_UNTIL(info_has(from, "replication", "master_link_status:up"), 30));
        int was = from;
        from = to;
        to = was;
    }
    drain_stop(&d);
}

/* Whether a client of the sentinel at port is subscribed (capstan's watch
 * on +switch-master). */
static int subscribed_on(int port)
{
    redisReply *r = cmd_on(port, "CLIENT %s", "LIST");
    int yes = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cmd=subscribe");
    freeReplyObject(r);
    return yes;
}

/* No sentinel to subscribe to: said once, not every second, and said
 * again once a sentinel takes the subscription. */
Test(sentinel, a_subscription_lost_is_logged_once_and_again_when_made)
{
    cluster_t k = { 0 };
    cluster_start(&k, 0, 1);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", "--redis-url", k.url, NULL });
    cr_assert(KT_WAIT_UNTIL(subscribed_on(k.sentinel[0]), 20), "%s", log_tail(pid));
    cr_assert_eq(kill(k.sentinel_pid[0], SIGKILL), 0);
    static const char lost[] = "cannot subscribe to the sentinels' +switch-master";
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, lost) == 1, 10), "%s", log_tail(pid));
    kt_sleep(2.5); /* tried again about every second meanwhile */
    cr_assert_eq(kt_log_count(pid, lost), 1, "%s", log_tail(pid));
    char conf[700];
    snprintf(conf, sizeof(conf), "%s/s0/sentinel.conf", k.dir);
    snprintf(k.dir + strlen(k.dir), sizeof(k.dir) - strlen(k.dir), "/s0");
    start_server(k.dir, "sentinel", (const char *[]){ conf, "--sentinel", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "subscribed to the sentinels' +switch-master again"),
                            15), "%s", log_tail(pid));
    cr_assert(subscribed_on(k.sentinel[0]));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", log_tail(pid));
}

/* The master killed: the sentinels see it down after 1 s and elect the
 * replica; capstan goes on there. */
Test(sentinel, jobs_drain_when_the_master_is_killed)
{
    drain_t d;
    drain_start(&d, failover_jobs(), "2", 0, "");
    ran_at_least(&d, d.k.master, d.n / 5);
    double t0 = kt_now(), since = epoch();
    long long before = int_on(d.k.master, "SCARD %s", "rec");
    /* Asynchronous replication loses what the replica has not got; on a
     * loaded machine that can be seconds of acks, and the duplicates would
     * measure the machine. The kill comes right after the replica caught up. */
    replica_caught_up(&d.k);
    cr_assert_eq(kill(d.k.master_pid, SIGKILL), 0);
    for (int i = 0; i < d.k.nsentinels; i++)
        cr_assert(KT_WAIT_UNTIL(master_port(d.k.sentinel[i]) == d.k.replica, 30), "%s",
                  sentinel_logs(&d.k));
    long long in_flight = working_left(d.k.replica);
    long long at = int_on(d.k.replica, "SCARD %s", "rec");
    cr_assert_lt(at, d.n, "drained before the failover: too few jobs for the test");
    /* What the replica acknowledged before the kill is on it. */
    cr_assert_geq(at, before, "the promoted replica has %lld of the %lld records the master "
                  "had before it caught up: %s", at, before, sentinel_logs(&d.k));
    long long dups = drain_finish(&d, d.k.replica);
    fprintf(stderr, "[master killed] %u jobs: %lld done at the kill, %lld on the replica when "
            "elected, %lld in flight; all done %.1f s after the kill; %lld ran twice\n", d.n,
            before, at, in_flight, kt_now() - t0, dups);
    cr_assert_leq(dups, in_flight, "more duplicates than jobs in flight at the failover");
    listed_by_sidekiq(&d, d.k.replica, since);
    drain_stop(&d);
}

/* The jids of rec:log on port and the payloads in its working lists, read
 * in one step: a jid in the first and not in the second was acked. */
static redisReply *acked_snapshot(int port)
{
    static const char lua[] =
        "local w = {}\n"
        "for _, k in ipairs(redis.call('KEYS', 'uniquejobs:working:*')) do\n"
        "  for _, v in ipairs(redis.call('LRANGE', k, 0, -1)) do w[#w + 1] = v end\n"
        "end\n"
        "return {redis.call('LRANGE', 'rec:log', 0, -1), w}\n";
    redisReply *r = cmd_on(port, "EVAL %s 0", lua);
    cr_assert(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2, "%s",
              r && r->type == REDIS_REPLY_ERROR ? r->str : "no reply");
    return r;
}

static int was_acked(const redisReply *snap, const char *jid)
{
    const redisReply *log = snap->element[0], *working = snap->element[1];
    for (size_t i = 0; i < working->elements; i++)
        if (strstr(working->element[i]->str, jid))
            return 0;
    for (size_t i = 0; i < log->elements; i++)
        if (!strcmp(log->element[i]->str, jid))
            return 1;
    return 0;
}

static int by_str(const void *a, const void *b)
{
    return strcmp((*(redisReply *const *)a)->str, (*(redisReply *const *)b)->str);
}

/* With min_replicas_ack: 1, a job acked before a clean failover is not run
 * again after it (jobs in flight then still may be). "Acked before": in
 * rec:log and in no working list, read in one step just before the
 * failover. On one host the replica lags by next to nothing, so this holds
 * without min_replicas_ack too: it guards the claim, it cannot show the
 * window closing. */
Test(sentinel, min_replicas_ack_no_acked_job_runs_again_after_a_failover)
{
    drain_t d;
    /* Fewer jobs: the claim is about the failover, not the count. */
    drain_start(&d, failover_jobs() / 4, "4", 0,
                "min_replicas_ack: 1\nmin_replicas_timeout: 1000\n");
    ran_at_least(&d, d.k.master, d.n / 5);
    redisReply *snap = acked_snapshot(d.k.master);
    long long in_flight = fail_over(&d.k, d.k.master, d.k.replica);
    long long dups = drain_finish(&d, d.k.replica);
    redisReply *log = cmd_on(d.k.replica, "LRANGE %s 0 -1", "rec:log");
    cr_assert(log && log->type == REDIS_REPLY_ARRAY);
    qsort(log->element, log->elements, sizeof(*log->element), by_str);
    size_t twice = 0, acked_twice = 0;
    for (size_t i = 1; i < log->elements; i++) {
        if (strcmp(log->element[i]->str, log->element[i - 1]->str))
            continue;
        twice++;
        if (was_acked(snap, log->element[i]->str)) {
            acked_twice++;
            fprintf(stderr, "acked before the failover, ran again: %s\n", log->element[i]->str);
        }
    }
    fprintf(stderr, "[min_replicas_ack] %u jobs: %zu recorded and %zu in working lists just "
            "before the failover, %lld in flight at it; %lld ran twice, %zu of them acked "
            "before\n", d.n, snap->element[0]->elements, snap->element[1]->elements, in_flight,
            dups, acked_twice);
    cr_assert_eq(acked_twice, 0, "jobs acked before the failover ran again");
    cr_assert_eq((long long)twice, dups);
    freeReplyObject(log);
    freeReplyObject(snap);
    drain_stop(&d);
}

Test(sentinel, an_unknown_master_name_stops_the_start)
{
    cluster_t k = { 0 };
    cluster_start(&k, 0, 1);
    char url[300];
    snprintf(url, sizeof(url), "%s", k.url);
    strcpy(strstr(url, "/mymaster"), "/nosuchmaster");
    char *out = NULL;
    int rc = kt_capstan_run((const char *[]){ "run", "-r", getenv("CAPSTAN_PLUGIN"), "--redis-url", url,
                                          NULL }, &out);
    cr_assert_eq(rc, 78, "%s", out);
    cr_assert(strstr(out, "knows no master named nosuchmaster"), "%s", out);
    free(out);
}

/* Sentinels that name a master nobody answers at: the start fails (69)
 * with a last line that blames the master they named, by its address,
 * not the sentinels, which answered. Under the supervisor too. */
Test(sentinel, an_unreachable_master_named_by_the_sentinels_is_the_last_line)
{
    cluster_t k = { 0 };
    cluster_start(&k, 0, 1);
    kill(k.master_pid, SIGKILL);
    waitpid(k.master_pid, NULL, 0);
    kt_untrack(k.master_pid);
    cr_assert(KT_WAIT_UNTIL(!pings(k.master), 10));
    char want[128];
    snprintf(want, sizeof(want), ": master 127.0.0.1:%d (named by the sentinels): connect (", k.master);
    const char *modes[] = { NULL, "--no-supervisor" };
    for (int i = 0; i < 2; i++) {
        char *out = NULL;
        int rc = kt_capstan_run((const char *[]){ "run", "-r", getenv("CAPSTAN_PLUGIN"), "--redis-url", k.url,
                                              "--startup-timeout", "1", modes[i], NULL }, &out);
        char *last = kt_last_line(out);
        fprintf(stderr, "[unreachable master%s] status %d, last line: %s\n", modes[i] ? ", alone" : "", rc,
                last);
        cr_assert_eq(rc, 69, "%s", out);
        cr_assert(strstr(last, want) && strstr(last, "gave up after startup_timeout"), "%s", out);
        free(last);
        free(out);
    }
}

/* The sentinels' password and the master's are each sent where they
 * belong, and neither appears in the log. */
Test(sentinel, passwords_of_the_sentinels_and_of_the_master)
{
    cluster_t k = { 0 };
    cluster_start_pw(&k, 0, 2, 1);
    push_records(k.master, 20);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", k.url, NULL });
    cr_assert(KT_WAIT_UNTIL(int_on(k.master, "SCARD %s", "rec") == 20, 20), "%s", log_tail(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", log_tail(pid));
    cr_assert(!kt_log_has(pid, "spw") && !kt_log_has(pid, "mpw"), "%s", log_tail(pid));
    cr_assert(kt_log_has(pid, "sentinel_password=***"), "%s", log_tail(pid));
}

/* A master demoted under a connection answers writes with READONLY: the
 * connection is then dropped, so its owner reconnects (through the
 * sentinels) rather than writing to it again. */
Test(sentinel, a_readonly_reply_drops_the_connection)
{
    cluster_t k = { 0 };
    cluster_start(&k, 1, 1);
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(k.url, 2, err);
    cr_assert(r, "%s", err);
    cr_assert_eq(capstan_redis_connect(r), 0, "%s", capstan_redis_error(r));
    char rp[16];
    snprintf(rp, sizeof(rp), "%d", k.replica);
    redisContext *c = on(k.master);
    freeReplyObject(redisCommand(c, "REPLICAOF 127.0.0.1 %s", rp));
    redisFree(c);
    redisReply *rep = capstan_redis_cmdf(r, "SET a 1");
    cr_assert(rep && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "READONLY", 8));
    freeReplyObject(rep);
    cr_assert(!capstan_redis_ok(r), "still taken for usable after READONLY");
    cr_assert(strstr(capstan_redis_error(r), "READONLY"), "%s", capstan_redis_error(r));
    /* The sentinels have not noticed yet: the reconnect finds a replica
     * where they say the master is, and waits rather than use it. */
    cr_assert_eq(capstan_redis_connect(r), CAPSTAN_EREDIS);
    cr_assert(strstr(capstan_redis_error(r), "is a slave, not a master"), "%s", capstan_redis_error(r));
    capstan_redis_free(r);
}

/* Sidekiq's redis: hash with sentinels (redis-client's options) reads as
 * the sentinel URL it means, credentials escaped. */
Test(sentinel, yaml_sentinels_read_as_a_sentinel_url)
{
    char *y = kt_write_file("sentinels.yml",
                            "redis:\n"
                            "  sentinels:\n"
                            "    - {host: s1, port: 26380}\n"
                            "    - host: s2\n"
                            "  name: mymaster\n"
                            "  role: master\n"
                            "  password: \"p@ss/word\"\n"
                            "  db: 3\n"
                            "  sentinel_password: spw\n");
    capstan_config_t *cfg = capstan_config_new();
    char err[CAPSTAN_ERRLEN] = "";
    cr_assert_eq(capstan_config_load_file(cfg, y, err), 0, "%s", err);
    cr_assert_str_eq(cfg->redis_url, "redis+sentinel://:p%40ss%2Fword@s1:26380,s2:26379/mymaster/3"
                                     "?sentinel_password=spw");
    capstan_config_free(cfg);
    free(y);
    /* TLS to the sentinels: capstan's sentinel_ssl, or redis-client's ssl on
     * every sentinel. */
    static const char *const tls[] = {
        "redis: {sentinels: [{host: s1}], name: m, ssl: true, sentinel_ssl: true}\n",
        "redis: {sentinels: [{host: s1, ssl: true}, {host: s2, ssl: true}], name: m, ssl: true}\n",
    };
    for (size_t i = 0; i < sizeof(tls) / sizeof(*tls); i++) {
        y = kt_write_file("tls.yml", tls[i]);
        cfg = capstan_config_new();
        cr_assert_eq(capstan_config_load_file(cfg, y, err), 0, "%s", err);
        cr_assert(strncmp(cfg->redis_url, "rediss+sentinel://s1:26379", 26) == 0, "%s",
                  cfg->redis_url);
        cr_assert(strstr(cfg->redis_url, "/m/0?sentinel_ssl=true"), "%s", cfg->redis_url);
        capstan_redis_t *r = capstan_redis_new(cfg->redis_url, 1, err);
        cr_assert(r, "the URL it means is one capstan takes: %s", err);
        capstan_redis_free(r);
        capstan_config_free(cfg);
        free(y);
    }
    /* The tls: mapping joins the sentinel URL's query, an '@' in a path
     * escaped (the URL reads a bare one as its user's end). */
    y = kt_write_file("tls-at.yml", "redis: {sentinels: [{host: s1}], name: m, "
                                    "sentinel_ssl: true}\ntls: {ca_file: /etc/a@b/ca.pem}\n");
    cfg = capstan_config_new();
    cr_assert_eq(capstan_config_load_file(cfg, y, err), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert(strstr(cfg->redis_url, "&ca_file=/etc/a%40b/ca.pem"), "%s", cfg->redis_url);
    capstan_redis_t *at = capstan_redis_new(cfg->redis_url, 1, err);
    cr_assert(at, "%s", err);
    capstan_redis_free(at);
    capstan_config_free(cfg);
    free(y);
    static const char *const bad[][2] = {
        { "redis: {sentinels: [{host: a, ssl: true}, {host: b}], name: m}\n",
          "ssl must be on every sentinel or none" },
        { "redis: {sentinels: [{host: a, tls: true}], name: m}\n", "host, port and ssl only" },
        { "redis: {sentinels: [{host: a}]}\n", "name: the master's name" },
        { "redis: {sentinels: [{host: a}], name: m, role: replica}\n", "role: only master" },
        { "redis: {sentinels: [{host: a, port: 0}], name: m}\n", "port must be" },
        { "redis: {sentinels: [], name: m}\n", "at least one" },
        { "redis: {sentinels: [{host: a}], name: m, url: redis://x}\n", "url or sentinels" },
        { "redis: {sentinels: [{host: a}], name: m, sentinel_pasword: x}\n",
          "redis.sentinel_pasword: unknown key" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        y = kt_write_file("bad.yml", bad[i][0]);
        cfg = capstan_config_new();
        cr_assert_eq(capstan_config_load_file(cfg, y, err), CAPSTAN_ECONFIG, "%s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
        capstan_config_free(cfg);
        free(y);
    }
}

/* The same with the capstan binary and real sentinels: the file's sentinels
 * and credentials are the ones used. */
Test(sentinel, capstan_run_with_sentinels_from_the_yaml_file)
{
    cluster_t k = { 0 };
    cluster_start_pw(&k, 0, 2, 1);
    push_records(k.master, 20);
    char body[512];
    snprintf(body, sizeof(body),
             "redis:\n  sentinels:\n    - {host: 127.0.0.1, port: %d}\n"
             "    - {host: 127.0.0.1, port: %d}\n"
             "  name: mymaster\n  password: mpw\n  sentinel_password: spw\n",
             k.sentinel[0], k.sentinel[1]);
    char *y = kt_write_file("run-sentinels.yml", body);
    /* Not kt_capstan_start: its --redis-url would override the file's redis:. */
    char *logf = kt_tmp("run-sentinels.log");
    pid_t pid = fork();
    if (pid == 0) {
        freopen(logf, "w", stdout);
        dup2(1, 2);
        execl(getenv("CAPSTAN_BIN"), "capstan", "run", "-r", getenv("CAPSTAN_PLUGIN"), "-C", y, (char *)NULL);
        _exit(127);
    }
    kt_track(pid);
    int done = KT_WAIT_UNTIL(int_on(k.master, "SCARD %s", "rec") == 20, 20);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    char *log = kt_read_file(logf);
    cr_assert(done, "%s", log);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s", log);
    cr_assert(!strstr(log, "spw") && !strstr(log, "mpw"), "%s", log);
    free(log);
    free(logf);
    free(y);
}

/* min_replicas_ack: the acks are followed by WAIT; with the replica up it
 * has them in time, without one the jobs still run and capstan says the acks
 * were not replicated. */
static pid_t run_with_wait(const cluster_t *k, unsigned n, int timeout_ms)
{
    char url[64], yml[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", k->master);
    snprintf(yml, sizeof(yml), "min_replicas_ack: 1\nmin_replicas_timeout: %d\n", timeout_ms);
    char *y = kt_write_file("wait.yml", yml);
    push_records(k->master, n);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "4", "--redis-url", url, NULL });
    cr_assert(KT_WAIT_UNTIL(int_on(k->master, "SCARD %s", "rec") == (long long)n, 30), "%s",
              log_tail(pid));
    cr_assert(KT_WAIT_UNTIL(working_left(k->master) == 0, 10), "%s", log_tail(pid));
    free(y);
    return pid;
}

Test(sentinel, min_replicas_ack_waits_for_the_replica)
{
    cluster_t k = { 0 };
    cluster_start(&k, 1, 0);
    /* A generous timeout: a replica on a loaded machine may take long. */
    pid_t pid = run_with_wait(&k, 200, 5000);
    cr_assert(info_has(k.master, "commandstats", "cmdstat_wait:calls="), "no WAIT was sent");
    cr_assert(!kt_log_has(pid, "acks reached"), "%s", log_tail(pid));
    cr_assert_eq(int_on(k.replica, "SCARD %s", "rec"), 200);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", log_tail(pid));
}

Test(sentinel, min_replicas_ack_without_replicas_still_runs_and_says_so)
{
    cluster_t k = { 0 };
    cluster_start(&k, 0, 0);
    pid_t pid = run_with_wait(&k, 50, 200);
    cr_assert(kt_log_has(pid, "acks reached 0 of min_replicas_ack 1 replicas within 200 ms"),
              "%s", log_tail(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", log_tail(pid));
}

/* A malformed sentinel URL is refused when read, naming what is wrong. */
Test(sentinel, bad_sentinel_urls_are_refused)
{
    static const char *const bad[][2] = {
        { "redis+sentinel://127.0.0.1:26379", "master's name is missing" },
        { "redis+sentinel://127.0.0.1:26379/", "master's name is missing" },
        { "redis+sentinel://127.0.0.1:0/m", "bad sentinel address" },
        { "redis+sentinel://a:1,,b:2/m", "bad sentinel address" },
        { "redis+sentinel://a:1/m/x", "bad db number" },
        { "redis+sentinel://a:1/m?x=1", "unknown parameter x=1" },
        { "redis+sentinel://a:1/m?sentinel_ssl=yes", "sentinel_ssl must be true or false" },
    };
    char err[CAPSTAN_ERRLEN];
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        err[0] = '\0';
        capstan_redis_t *r = capstan_redis_new(bad[i][0], 1, err);
        cr_assert_null(r, "%s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    capstan_redis_t *r = capstan_redis_new("rediss+sentinel://u:secret@a:1,[::1]:2,c/m/2?"
                                           "sentinel_password=s3&verify=peer", 1, err);
    cr_assert(r, "%s", err);
    cr_assert_str_eq(capstan_redis_name(r), "rediss+sentinel://u:***@a:1,[::1]:2,c/m/2?"
                                        "sentinel_password=***&verify=peer");
    capstan_redis_free(r);
}

/* Without sentinels, behind one address that a managed service moves on
 * failover: the server capstan runs against is demoted to a replica (REPLICAOF
 * a master that is not there, so it keeps its data), then promoted again.
 * Every connection reconnects on READONLY, waits with backoff while the
 * address leads to a replica, and the jobs resume: all run, none is left
 * queued or in a working list, and the demotion is logged once. */
Test(sentinel, a_server_demoted_behind_a_plain_url_is_followed)
{
    char *dir = kt_tmp("demoted");
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    int port = kt_free_port();
    char p[16], nowhere[16], url[64];
    snprintf(p, sizeof(p), "%d", port);
    snprintf(nowhere, sizeof(nowhere), "%d", kt_free_port());
    start_server(dir, "solo", (const char *[]){ "--port", p, "--bind", "127.0.0.1", "--save", "",
                                                "--appendonly", "no", NULL });
    free(dir);
    cr_assert(KT_WAIT_UNTIL(pings(port), 30));
    drain_t d = { .n = 3000 };
    push_paced(port, d.n, 10);
    d.yml = kt_write_file("demoted.yml", "heartbeat_interval: 0.5\nliveness_ttl: 2\n"
                                         "recovery_interval: 1\n");
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", port);
    d.pid = kt_capstan_start((const char *[]){ "-C", d.yml, "-c", "5", "--redis-url", url, NULL });
    ran_at_least(&d, port, 300);
    redisReply *r = cmd_on(port, "REPLICAOF 127.0.0.1 %s", nowhere);
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(d.pid, "answered READONLY") == 1, 15), "%s",
              log_tail(d.pid));
    long long during = int_on(port, "SCARD %s", "rec");
    sleep(2);
    /* A handler's own write may slip in before a connection notices; a
     * fetch may not. */
    cr_assert(int_on(port, "SCARD %s", "rec") <= during + 5, "jobs ran on a replica");
    r = cmd_on(port, "REPLICAOF NO %s", "ONE");
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    drain_finish(&d, port);
    cr_assert_eq(kt_log_count(d.pid, "answered READONLY"), 1, "%s", log_tail(d.pid));
    cr_assert(kt_log_count(d.pid, "is a master again") >= 1, "%s", log_tail(d.pid));
    cr_assert_eq(kt_capstan_stop(d.pid, SIGTERM, 20), 0, "%s", log_tail(d.pid));
    free(d.yml);
}

/* Given one sentinel, capstan learns the others from it: once that one is
 * killed, a failover is still followed through them. */
Test(sentinel, the_other_sentinels_are_learnt_from_the_one_given)
{
    cluster_t k = { 0 };
    cluster_start(&k, 1, 3);
    cr_assert(KT_WAIT_UNTIL(info_has(k.sentinel[0], "sentinel", "slaves=1,sentinels=3"), 20));
    char url[128];
    snprintf(url, sizeof(url), "redis+sentinel://127.0.0.1:%d/mymaster", k.sentinel[0]);
    push_records(k.master, 50);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "3", "--redis-url", url, NULL });
    cr_assert(KT_WAIT_UNTIL(int_on(k.master, "SCARD %s", "rec") == 50, 20), "%s", log_tail(pid));
    kill(k.sentinel_pid[0], SIGKILL);
    /* The first sentinel is gone: the others carry the failover. */
    k.sentinel[0] = k.sentinel[1];
    k.sentinel[1] = k.sentinel[2];
    k.nsentinels = 2;
    cr_assert(KT_WAIT_UNTIL(info_has(k.sentinel[0], "sentinel", "slaves=1"), 20));
    fail_over(&k, k.master, k.replica);
    push_records(k.replica, 100);
    cr_assert(KT_WAIT_UNTIL(int_on(k.replica, "SCARD %s", "rec") >= 100, 30), "%s",
              log_tail(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", log_tail(pid));
}
