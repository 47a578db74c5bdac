/* The C client's transactions and replica acknowledgement, against real
 * Redis servers: pushes between kiq_client_begin and kiq_client_rollback
 * never reach Redis; between begin and kiq_client_commit they reach it
 * together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "kiq/kiq.h"
#include "kiq/unique.h"

TestSuite(client, .timeout = 60, .fini = kt_kill_children);

static kiq_client_t *client_at(const char *url)
{
    char err[KIQ_ERRLEN];
    kiq_client_t *c = kiq_client_new(url, err);
    cr_assert(c, "kiq_client_new: %s", err);
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
static void push_each_kind(kiq_client_t *c)
{
    const char *args[] = { "[1]", "[2]", "[3]" };
    char jids[3][25], jid[25];
    kiq_push_opts_t later = kiq_push_opts_default(), other = kiq_push_opts_default();
    later.at = 60;
    other.queue = "other";
    cr_assert_eq(kiq_client_push(c, "TxJob", "[0]", NULL, jid), 0, "%s", kiq_client_error(c));
    cr_assert_eq(strlen(jid), 24);
    cr_assert_eq(written(), 0);
    cr_assert_eq(kiq_client_push_bulk(c, "TxJob", args, 3, NULL, jids), 0);
    cr_assert_eq(strlen(jids[2]), 24);
    cr_assert_eq(written(), 0);
    cr_assert_eq(kiq_client_push(c, "TxJob", "[4]", &later, NULL), 0);
    cr_assert_eq(kiq_client_push(c, "TxJob", "[5]", &other, NULL), 0);
    cr_assert_eq(written(), 0, "a push in a transaction reached Redis before the commit");
}

Test(client, pushes_between_begin_and_rollback_never_reach_redis)
{
    kiq_client_t *c = client_at(kt_url());
    cr_assert_eq(kiq_client_begin(c), 0);
    push_each_kind(c);
    cr_assert_eq(kiq_client_rollback(c), 0);
    cr_assert_eq(written(), 0);
    /* The transaction is over: the next push goes out at once. */
    cr_assert_eq(kiq_client_push(c, "TxJob", "[6]", NULL, NULL), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    kiq_client_free(c);
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
    kiq_client_t *c = client_at(kt_url());
    cr_assert_eq(kiq_client_begin(c), 0);
    push_each_kind(c);
    cr_assert_eq(kiq_client_commit(c), 0, "%s", kiq_client_error(c));
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
    kiq_client_free(c);
}

Test(client, begin_twice_commit_or_rollback_without_begin_are_refused)
{
    kiq_client_t *c = client_at(kt_url());
    cr_assert_eq(kiq_client_commit(c), KIQ_EINVAL);
    cr_assert(strstr(kiq_client_error(c), "no transaction"));
    cr_assert_eq(kiq_client_rollback(c), KIQ_EINVAL);
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "TxJob", "[1]", NULL, NULL), 0);
    cr_assert_eq(kiq_client_begin(c), KIQ_EINVAL);
    cr_assert(strstr(kiq_client_error(c), "already open"));
    /* The open one kept its push. */
    cr_assert_eq(kiq_client_commit(c), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    /* Nothing buffered: nothing to send, and a success. */
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_commit(c), 0);
    /* A bad push in a transaction fails at once and buffers nothing. */
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "TxJob", "{}", NULL, NULL), KIQ_EINVAL);
    cr_assert_eq(kiq_client_commit(c), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    /* A command that fails as it runs is reported, not taken for success. */
    freeReplyObject(kt_cmd("SET queue:broken x"));
    kiq_push_opts_t o = kiq_push_opts_default();
    o.queue = "broken";
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "TxJob", "[1]", &o, NULL), 0);
    cr_assert_eq(kiq_client_commit(c), KIQ_EREPLY);
    cr_assert(strstr(kiq_client_error(c), "WRONGTYPE"), "%s", kiq_client_error(c));
    kiq_client_free(c);
}

static kiq_push_opts_t locked(kiq_unique_opts_t *uo)
{
    *uo = (kiq_unique_opts_t)KIQ_UNIQUE_OPTS_INIT;
    uo->lock = KIQ_LOCK_UNTIL_EXECUTED;
    kiq_push_opts_t o = kiq_push_opts_default();
    o.unique = uo;
    return o;
}

/* The lock is taken at push time: a duplicate is denied at once, and
 * rollback (or a free with pushes buffered) gives the lock back. */
Test(client, until_executed_locks_are_taken_at_push_and_released_by_rollback)
{
    kiq_unique_opts_t uo;
    kiq_push_opts_t o = locked(&uo);
    kiq_client_t *c = client_at(kt_url());
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), 0, "%s",
                 kiq_client_error(c));
    cr_assert_eq(locks_held(), 1);
    cr_assert_eq(kiq_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), KIQ_EDENIED);
    cr_assert_eq(kiq_client_rollback(c), 0);
    cr_assert_eq(locks_held(), 0);
    cr_assert_eq(written(), 0);

    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), 0);
    kiq_client_free(c); /* discards the push and its lock */
    cr_assert_eq(locks_held(), 0);
    cr_assert_eq(written(), 0);

    c = client_at(kt_url());
    char jid[25];
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "UniqueTx", "[\"u\"]", &o, jid), 0);
    cr_assert_eq(kiq_client_commit(c), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    cr_assert_eq(locks_held(), 1, "a committed push keeps its lock until it is executed");
    char *job = kt_str("LINDEX queue:default 0");
    cr_assert(strstr(job, jid) && strstr(job, "\"lock\":\"until_executed\""), "%s", job);
    free(job);
    cr_assert_eq(kiq_client_push(c, "UniqueTx", "[\"u\"]", &o, NULL), KIQ_EDENIED);
    kiq_client_free(c);
}

/* The connection fails during the commit: nothing is sent twice, and the
 * error says what is known. */
Test(client, a_connection_failure_during_commit_is_reported)
{
    kt_aof_redis_t s;
    kt_aof_init(&s, "down");
    kt_aof_start(&s);
    kiq_unique_opts_t uo;
    kiq_push_opts_t o = locked(&uo);
    kiq_client_t *c = client_at(s.url);
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "TxJob", "[1]", NULL, NULL), 0);
    kt_aof_kill(&s);
    /* Taking a lock finds the server gone; the commit then cannot connect,
     * so it surely sent nothing. */
    cr_assert_eq(kiq_client_push(c, "TxJob", "[2]", &o, NULL), KIQ_EREDIS);
    cr_assert_eq(kiq_client_commit(c), KIQ_EREDIS);
    cr_assert(strstr(kiq_client_error(c), "nothing was pushed"), "%s", kiq_client_error(c));
    cr_assert_eq(kiq_client_commit(c), KIQ_EINVAL, "the transaction ended");

    /* The server goes while the commit is sent: the client cannot tell
     * whether EXEC ran before it went, and does not send it again. */
    kt_aof_start(&s);
    cr_assert_eq(kiq_client_begin(c), 0);
    cr_assert_eq(kiq_client_push(c, "TxJob", "[3]", NULL, NULL), 0);
    kt_aof_kill(&s);
    cr_assert_eq(kiq_client_commit(c), KIQ_EREDIS);
    cr_assert(strstr(kiq_client_error(c), "unknown which"), "%s", kiq_client_error(c));
    kiq_client_free(c);

    kt_aof_start(&s);
    redisContext *r = kt_aof_connect(&s);
    cr_assert(r);
    cr_assert_eq(kt_int_on(r, "LLEN queue:default"), 0);
    redisFree(r);
}
