/* The C client's transactions and replica acknowledgement, against real
 * Redis servers: pushes between capstan_client_begin and capstan_client_rollback
 * never reach Redis; between begin and capstan_client_commit they reach it
 * together; and with min_replicas_ack a push returns once the replica has
 * it, or says that it does not. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/capstan.h"
#include "capstan/unique.h"

TestSuite(client, .timeout = 60, .fini = kt_kill_children);

static capstan_client_t *client_at(const char *url)
{
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(url, err);
    cr_assert(c, "capstan_client_new: %s", err);
    return c;
}

/* Everything a push may write: queues, the schedule and the queue set. */
static long long written(void)
{
    return kt_int("LLEN queue:default") + kt_int("LLEN queue:other") +
           kt_int("ZCARD schedule") + kt_int("SCARD queues");
}

static long long locks_held(void)
{
    redisReply *r = kt_cmd("KEYS *:LOCKED");
    long long n = (long long)r->elements;
    freeReplyObject(r);
    return n;
}

/* One push of each kind: single, bulk of three, scheduled, another queue. */
static void push_each_kind(capstan_client_t *c)
{
    const char *args[] = { "[1]", "[2]", "[3]" };
    char jids[3][25], jid[25];
    capstan_push_opts_t later = capstan_push_opts_default(), other = capstan_push_opts_default();
    later.at = 60;
    other.queue = "other";
    cr_assert_eq(capstan_client_push(c, "TxJob", "[0]", NULL, jid), 0, "%s", capstan_client_error(c));
    cr_assert_eq(strlen(jid), 24);
    cr_assert_eq(written(), 0);
    cr_assert_eq(capstan_client_push_bulk(c, "TxJob", args, 3, NULL, jids), 0);
    cr_assert_eq(strlen(jids[2]), 24);
    cr_assert_eq(written(), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[4]", &later, NULL), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[5]", &other, NULL), 0);
    cr_assert_eq(written(), 0, "a push in a transaction reached Redis before the commit");
}

Test(client, pushes_between_begin_and_rollback_never_reach_redis)
{
    capstan_client_t *c = client_at(kt_url());
    cr_assert_eq(capstan_client_begin(c), 0);
    push_each_kind(c);
    cr_assert_eq(capstan_client_rollback(c), 0);
    cr_assert_eq(written(), 0);
    /* The transaction is over: the next push goes out at once. */
    cr_assert_eq(capstan_client_push(c, "TxJob", "[6]", NULL, NULL), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    capstan_client_free(c);
}

/* The commands MONITOR shows for this test's database from its last MULTI
 * to its EXEC, each as its name (malloc'd, "|"-separated). */
static char *monitored_until_exec(redisContext *m)
{
    const char *url = kt_url();
    char tag[16];
    snprintf(tag, sizeof(tag), "[%s ", strrchr(url, '/') + 1);
    size_t cap = 4096, len = 0;
    char *seen = calloc(1, cap);
    cr_assert(seen);
    for (;;) {
        redisReply *r = NULL;
        cr_assert_eq(redisGetReply(m, (void **)&r), REDIS_OK, "MONITOR: %s", m->errstr);
        const char *cmd = r->type == REDIS_REPLY_STATUS ? strstr(r->str, tag) : NULL;
        cmd = cmd ? strstr(cmd, "] \"") : NULL;
        if (cmd) {
            cmd += 3;
            size_t n = strcspn(cmd, "\"");
            if (strncmp(cmd, "MULTI\"", 6) == 0)
                len = 0; /* what came before: the fixture's checks */
            if (len + n + 2 < cap) {
                memcpy(seen + len, cmd, n);
                len += n;
                seen[len++] = '|';
                seen[len] = '\0';
            }
        }
        int done = cmd && strncmp(cmd, "EXEC\"", 5) == 0;
        freeReplyObject(r);
        if (done)
            return seen;
    }
}

Test(client, pushes_between_begin_and_commit_arrive_together)
{
    redisContext *m = redisConnect("127.0.0.1", atoi(strrchr(kt_url(), ':') + 1));
    cr_assert(m && !m->err);
    struct timeval tv = { 10, 0 };
    redisSetTimeout(m, tv);
    freeReplyObject(redisCommand(m, "MONITOR"));
    capstan_client_t *c = client_at(kt_url());
    cr_assert_eq(capstan_client_begin(c), 0);
    push_each_kind(c);
    cr_assert_eq(capstan_client_commit(c), 0, "%s", capstan_client_error(c));
    /* All in one MULTI/EXEC: SADD queues and LPUSH for each push due now,
     * ZADD for the scheduled one. */
    char *seen = monitored_until_exec(m);
    cr_assert_str_eq(seen, "MULTI|SADD|LPUSH|SADD|LPUSH|ZADD|SADD|LPUSH|EXEC|",
                     "%s", seen);
    free(seen);
    redisFree(m);
    cr_assert_eq(kt_int("LLEN queue:default"), 4);
    cr_assert_eq(kt_int("LLEN queue:other"), 1);
    cr_assert_eq(kt_int("ZCARD schedule"), 1);
    cr_assert_eq(kt_int("SCARD queues"), 2);
    char *first = kt_str("LINDEX queue:default -1");
    cr_assert(first && strstr(first, "\"args\":[0]") && strstr(first, "\"class\":\"TxJob\""),
              "%s", first);
    free(first);
    capstan_client_free(c);
}

Test(client, begin_twice_commit_or_rollback_without_begin_are_refused)
{
    capstan_client_t *c = client_at(kt_url());
    cr_assert_eq(capstan_client_commit(c), CAPSTAN_EINVAL);
    cr_assert(strstr(capstan_client_error(c), "no transaction"));
    cr_assert_eq(capstan_client_rollback(c), CAPSTAN_EINVAL);
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[1]", NULL, NULL), 0);
    cr_assert_eq(capstan_client_begin(c), CAPSTAN_EINVAL);
    cr_assert(strstr(capstan_client_error(c), "already open"));
    /* The open one kept its push. */
    cr_assert_eq(capstan_client_commit(c), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    /* Nothing buffered: nothing to send, and a success. */
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_commit(c), 0);
    /* A bad push in a transaction fails at once and buffers nothing. */
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "{}", NULL, NULL), CAPSTAN_EINVAL);
    cr_assert_eq(capstan_client_commit(c), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    /* A command that fails as it runs is reported, not taken for success. */
    freeReplyObject(kt_cmd("SET queue:broken x"));
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = "broken";
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[1]", &o, NULL), 0);
    cr_assert_eq(capstan_client_commit(c), CAPSTAN_EREPLY);
    cr_assert(strstr(capstan_client_error(c), "WRONGTYPE"), "%s", capstan_client_error(c));
    capstan_client_free(c);
}

static capstan_push_opts_t locked(capstan_unique_opts_t *uo)
{
    *uo = (capstan_unique_opts_t)CAPSTAN_UNIQUE_OPTS_INIT;
    uo->lock = CAPSTAN_LOCK_UNTIL_EXECUTED;
    capstan_push_opts_t o = capstan_push_opts_default();
    o.unique = uo;
    return o;
}

/* The lock is taken at push time: a duplicate is denied at once, and
 * rollback (or a free with pushes buffered) gives the lock back. */
Test(client, until_executed_locks_are_taken_at_push_and_released_by_rollback)
{
    capstan_unique_opts_t uo;
    capstan_push_opts_t o = locked(&uo);
    capstan_client_t *c = client_at(kt_url());
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), 0, "%s",
                 capstan_client_error(c));
    cr_assert_eq(locks_held(), 1);
    cr_assert_eq(capstan_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), CAPSTAN_EDENIED);
    cr_assert_eq(capstan_client_rollback(c), 0);
    cr_assert_eq(locks_held(), 0);
    cr_assert_eq(written(), 0);

    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), 0);
    capstan_client_free(c); /* discards the push and its lock */
    cr_assert_eq(locks_held(), 0);
    cr_assert_eq(written(), 0);

    c = client_at(kt_url());
    char jid[25];
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "UniqueTx", "[\"u\"]", &o, jid), 0);
    cr_assert_eq(capstan_client_commit(c), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    cr_assert_eq(locks_held(), 1, "a committed push keeps its lock until it is executed");
    char *job = kt_str("LINDEX queue:default 0");
    cr_assert(strstr(job, jid) && strstr(job, "\"lock\":\"until_executed\""), "%s", job);
    free(job);
    cr_assert_eq(capstan_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), CAPSTAN_EDENIED);
    capstan_client_free(c);
}

/* The connection fails during the commit: nothing is sent twice, and the
 * error says what is known. */
Test(client, a_connection_failure_during_commit_is_reported)
{
    kt_aof_redis_t s;
    kt_aof_init(&s, "down");
    kt_aof_start(&s);
    capstan_unique_opts_t uo;
    capstan_push_opts_t o = locked(&uo);
    capstan_client_t *c = client_at(s.url);
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[1]", NULL, NULL), 0);
    kt_aof_kill(&s);
    /* Taking a lock finds the server gone; the commit then cannot connect,
     * so it surely sent nothing. */
    cr_assert_eq(capstan_client_push(c, "TxJob", "[2]", &o, NULL), CAPSTAN_EREDIS);
    cr_assert_eq(capstan_client_commit(c), CAPSTAN_EREDIS);
    cr_assert(strstr(capstan_client_error(c), "nothing was pushed"), "%s", capstan_client_error(c));
    cr_assert_eq(capstan_client_commit(c), CAPSTAN_EINVAL, "the transaction ended");

    /* The server goes while the commit is sent: the client cannot tell
     * whether EXEC ran before it went, and does not send it again. */
    kt_aof_start(&s);
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[3]", NULL, NULL), 0);
    kt_aof_kill(&s);
    cr_assert_eq(capstan_client_commit(c), CAPSTAN_EREDIS);
    cr_assert(strstr(capstan_client_error(c), "unknown which"), "%s", capstan_client_error(c));
    capstan_client_free(c);

    kt_aof_start(&s);
    redisContext *r = kt_aof_connect(&s);
    cr_assert(r);
    cr_assert_eq(kt_int_on(r, "LLEN queue:default"), 0);
    redisFree(r);
}

/* The server closed the connection (CLIENT KILL; a restart or its idle
 * timeout does the same) before the commit: writing to it raises SIGPIPE,
 * which must not kill a program that does not ignore it. The commit fails
 * with an error instead, and none of its pushes is made. */
Test(client, a_commit_on_a_connection_the_server_closed_fails_without_sigpipe)
{
    int st = kt_commit_after_client_kill(kt_url(), atoi(strrchr(kt_url(), ':') + 1));
    cr_assert_neq(st, 128 + SIGPIPE, "the client library killed its caller with SIGPIPE");
    cr_assert_eq(st, 0, "the commit did not fail with CAPSTAN_EREDIS (step %d, see helpers.c)", st);
    cr_assert_eq(kt_int("LLEN queue:default"), 0, "a push of the failed commit was made");
}

/* Redis refuses the whole transaction (a read-only replica): none of it is
 * written. */
static void refused_by(const char *url)
{
    capstan_client_t *c = client_at(url);
    cr_assert_eq(capstan_client_begin(c), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[1]", NULL, NULL), 0);
    cr_assert_eq(capstan_client_push(c, "TxJob", "[2]", NULL, NULL), 0);
    cr_assert_eq(capstan_client_commit(c), CAPSTAN_EREPLY);
    cr_assert(strstr(capstan_client_error(c), "READONLY") || strstr(capstan_client_error(c), "EXECABORT"),
              "%s", capstan_client_error(c));
    capstan_client_free(c);
}

/* A master and a replica of the test's own. */
typedef struct pair {
    int master, replica;
    pid_t replica_pid;
    char master_url[64], replica_url[64];
} pair_t;

static pid_t start_server(const char *dir, const char *tag, int port, int replica_of)
{
    char p[16], m[16], logf[600];
    snprintf(p, sizeof(p), "%d", port);
    snprintf(m, sizeof(m), "%d", replica_of);
    snprintf(logf, sizeof(logf), "%s/%s.log", dir, tag);
    pid_t pid = fork();
    if (pid == 0) {
        if (replica_of)
            execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save",
                   "", "--appendonly", "no", "--dir", dir, "--logfile", logf, "--replicaof",
                   "127.0.0.1", m, (char *)NULL);
        else
            execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save",
                   "", "--appendonly", "no", "--dir", dir, "--logfile", logf, (char *)NULL);
        _exit(127);
    }
    return kt_track(pid);
}

static int info_has(int port, const char *needle)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r = c && !c->err ? redisCommand(c, "INFO replication") : NULL;
    int yes = r && r->type == REDIS_REPLY_STRING && strstr(r->str, needle);
    freeReplyObject(r);
    redisFree(c);
    return yes;
}

static void pair_start(pair_t *k)
{
    char *dir = kt_tmp("pair");
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    k->master = kt_free_port();
    start_server(dir, "master", k->master, 0);
    k->replica = kt_free_port();
    k->replica_pid = start_server(dir, "replica", k->replica, k->master);
    snprintf(k->master_url, sizeof(k->master_url), "redis://127.0.0.1:%d/0", k->master);
    snprintf(k->replica_url, sizeof(k->replica_url), "redis://127.0.0.1:%d/0", k->replica);
    cr_assert(KT_WAIT_UNTIL(info_has(k->replica, "master_link_status:up"), 30),
              "the replica did not sync");
    /* WAIT counts a replica only once its master has it online. */
    cr_assert(KT_WAIT_UNTIL(info_has(k->master, "state=online"), 30));
    free(dir);
}

static long long llen_on(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    cr_assert(c && !c->err);
    long long n = kt_int_on(c, "LLEN queue:default");
    redisFree(c);
    return n;
}

static capstan_config_t *wait_config(const char *name, long ms, char **path)
{
    char body[128], err[CAPSTAN_ERRLEN];
    snprintf(body, sizeof(body), "min_replicas_ack: 1\nmin_replicas_timeout: %ld\n", ms);
    *path = kt_write_file(name, body);
    capstan_config_t *cfg = capstan_config_new();
    cr_assert(cfg);
    cr_assert_eq(capstan_config_load_file(cfg, *path, err), 0, "%s", err);
    return cfg;
}

/* With min_replicas_ack: 1, a push returns once the replica has it; with
 * the replica stopped, it returns within the timeout and says so. */
Test(client, min_replicas_ack_pushes_wait_for_the_replica)
{
    pair_t k;
    pair_start(&k);
    char *path;
    capstan_config_t *cfg = wait_config("wait.yml", 3000, &path);
    capstan_client_t *c = client_at(k.master_url);
    capstan_client_use_config(c, cfg);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(capstan_client_push(c, "WaitJob", "[]", NULL, NULL), 0, "%s",
                     capstan_client_error(c));
        cr_assert_eq(llen_on(k.replica), i + 1, "the push returned before the replica had it");
    }
    cr_assert_eq(capstan_client_begin(c), 0);
    const char *args[] = { "[1]", "[2]" };
    cr_assert_eq(capstan_client_push_bulk(c, "WaitJob", args, 2, NULL, NULL), 0);
    cr_assert_eq(capstan_client_commit(c), 0, "%s", capstan_client_error(c));
    cr_assert_eq(llen_on(k.replica), 22);

    /* A replica refuses writes: the whole transaction is refused. */
    refused_by(k.replica_url);
    cr_assert_eq(llen_on(k.replica), 22);
    /* A failed push still reads WAIT's reply: the next push gets its own. */
    redisContext *m = redisConnect("127.0.0.1", k.master);
    cr_assert(m && !m->err);
    freeReplyObject(redisCommand(m, "SET queue:broken x"));
    redisFree(m);
    capstan_push_opts_t broken = capstan_push_opts_default();
    broken.queue = "broken";
    cr_assert_eq(capstan_client_push(c, "WaitJob", "[]", &broken, NULL), CAPSTAN_EREPLY);
    cr_assert_eq(capstan_client_push(c, "WaitJob", "[]", NULL, NULL), 0, "%s", capstan_client_error(c));
    cr_assert_eq(llen_on(k.replica), 23);

    kill(k.replica_pid, SIGSTOP);
    double t0 = kt_now();
    char jid[25] = "";
    int rc = capstan_client_push(c, "WaitJob", "[]", NULL, jid);
    double took = kt_now() - t0;
    kill(k.replica_pid, SIGCONT);
    cr_assert_eq(rc, CAPSTAN_PUSH_UNREPLICATED, "%d: %s", rc, capstan_client_error(c));
    cr_assert_eq(strlen(jid), 24, "the job was pushed and has its jid");
    cr_assert(strstr(capstan_client_error(c), "only 0 of 1 replicas had it within 3000 ms"), "%s",
              capstan_client_error(c));
    cr_assert(took >= 2.9 && took < 6, "took %.2f s", took);
    cr_assert_eq(llen_on(k.master), 24);
    cr_assert(KT_WAIT_UNTIL(llen_on(k.replica) == 24, 10));

    /* So is a push into a batch: the jobs are in, counted, with their jids. */
    char err[CAPSTAN_ERRLEN];
    capstan_batch_t *b = capstan_batch_new(c, err);
    cr_assert(b, "%s", err);
    cr_assert_eq(capstan_batch_push(b, "WaitJob", "[]", NULL, NULL), 0, "%s", capstan_batch_error(b));
    kill(k.replica_pid, SIGSTOP);
    char jids[2][25];
    rc = capstan_batch_push_bulk(b, "WaitJob", args, 2, NULL, jids);
    kill(k.replica_pid, SIGCONT);
    cr_assert_eq(rc, CAPSTAN_PUSH_UNREPLICATED, "%d: %s", rc, capstan_batch_error(b));
    cr_assert_eq(strlen(jids[1]), 24, "the jobs were pushed and have their jids");
    cr_assert_eq(llen_on(k.master), 27);
    redisContext *mc = redisConnect("127.0.0.1", k.master);
    redisReply *total = redisCommand(mc, "HGET batch:%s total", capstan_batch_bid(b));
    cr_assert(total && total->type == REDIS_REPLY_STRING && !strcmp(total->str, "3"));
    freeReplyObject(total);
    redisFree(mc);
    capstan_batch_free(b);
    capstan_client_free(c);
    capstan_config_free(cfg);
    free(path);
}

/* capstan push -C with min_replicas_ack: the job is pushed either way; a
 * shortfall is a warning, not a failure. */
Test(client, capstan_push_warns_when_the_replicas_fall_short)
{
    pair_t k;
    pair_start(&k);
    char *path;
    capstan_config_t *cfg = wait_config("cli.yml", 2000, &path);
    capstan_config_free(cfg);
    char *out = NULL;
    /* -q: the class has no queue, which push would warn about too. */
    const char *args[] = { "push", "CliJob", "[1]", "-C", path, "-q", "default", "--redis-url",
                           k.master_url, NULL };
    cr_assert_eq(kt_capstan_run(args, &out), 0, "%s", out);
    cr_assert(!strstr(out, "warning"), "%s", out);
    cr_assert_eq(llen_on(k.replica), 1);
    free(out);

    kill(k.replica_pid, SIGSTOP);
    cr_assert_eq(kt_capstan_run(args, &out), 0, "%s", out);
    kill(k.replica_pid, SIGCONT);
    cr_assert(strstr(out, "capstan push: warning: pushed, but only 0 of 1 replicas had it "
                          "within 2000 ms"), "%s", out);
    cr_assert_eq(llen_on(k.master), 2);
    free(out);
    free(path);
}
