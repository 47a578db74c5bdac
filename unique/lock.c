/* Taking, releasing and waiting for uniqueness locks: one Lua script each
 * way (lua/lock.lua, lua/unlock.lua), in v9's key and metadata format. */
#include "capstan/unique.h"
#include "unique/admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/fmt.h"
#include "support/json.h"
#include "observe/prometheus.h"
#include "middleware/mw.h"
#include "support/time.h"
#include "unique/admin_internal.h"
#include "unique/internal.h"
#include "redis/scripts.h"
#include "redis/wake.h"
#include "unique/prelock.h"

static _Thread_local const capstan_lock_store_t *store;

void capstan__lock_store_set(const capstan_lock_store_t *s)
{
    store = s;
}

/* Metrics are recorded where the lock happens, as v9 does; a failure to
 * count never fails the lock. */
void capstan_unique__metric(capstan_redis_t *r, capstan_lock_type_t t, const char *event)
{
    if (store)
        return;
    capstan__metrics_lock_event(capstan__metrics_here(), capstan_lock_type_name(t), event);
    (void)capstan__unique_metric_record(r, capstan_lock_type_name(t), event);
}

void capstan_unique__key(char *out, size_t n, const char *digest, int runtime, const char *suffix)
{
    capstan__fmt_cat(out, n, digest, runtime ? CAPSTAN_KEY_RUN : "", suffix, NULL);
}

/* v9's metadata, keys in its order; now_s the time already formatted. */
static char *metadata(const capstan_lock_req_t *q, const char *now_s)
{
    char store[512];
    capstan_buf_t b;
    capstan__buf_on(&b, store, sizeof(store));
    int rc = capstan__buf_puts(&b, "{\"worker\":");
    if (!rc) rc = capstan__json_quote(&b, q->cls ? q->cls : "", strlen(q->cls ? q->cls : ""));
    if (!rc) rc = capstan__buf_puts(&b, ",\"queue\":");
    if (!rc) rc = capstan__json_quote(&b, q->queue ? q->queue : "", strlen(q->queue ? q->queue : ""));
    if (!rc) rc = capstan__buf_puts(&b, ",\"limit\":");
    if (!rc) rc = q->limit > 1 ? capstan__buf_put_int(&b, q->limit) : capstan__buf_puts(&b, "null");
    if (!rc) rc = capstan__buf_puts(&b, ",\"timeout\":");
    if (!rc) rc = capstan__buf_put_int(&b, q->timeout > 0 ? q->timeout : 0);
    if (!rc) rc = capstan__buf_puts(&b, ",\"ttl\":");
    if (!rc) rc = q->ttl > 0 ? capstan__buf_put_int(&b, q->ttl) : capstan__buf_puts(&b, "null");
    if (!rc) rc = capstan__buf_puts(&b, ",\"type\":\"");
    if (!rc) rc = capstan__buf_puts(&b, capstan_lock_type_name(q->type));
    if (!rc) rc = capstan__buf_puts(&b, "\",\"lock_args\":");
    if (!rc) rc = capstan__buf_puts(&b, q->lock_args ? q->lock_args : "[]");
    if (!rc) rc = capstan__buf_puts(&b, ",\"time\":");
    if (!rc) rc = capstan__buf_puts(&b, now_s);
    if (!rc) rc = capstan__buf_puts(&b, ",\"at\":");
    if (!rc) rc = q->at > 0 ? capstan__buf_put_fixed(&b, q->at, 6) : capstan__buf_puts(&b, "null");
    if (!rc) rc = capstan__buf_puts(&b, "}");
    char *out = rc ? NULL : capstan__buf_take(&b, NULL);
    capstan__buf_free(&b);
    return out;
}

/* The arguments of one lock.lua call and their storage. */
typedef struct lock_call {
    char locked[CAPSTAN_DIGEST_MAX + 16], waiting[CAPSTAN_DIGEST_MAX + 16];
    char pttl[CAPSTAN_FMT_INT], limit[CAPSTAN_FMT_INT], now_s[32], arr[32], cut[32];
    char *meta; /* owned */
    const char *argv[11];
    capstan_script_call_t call;
} lock_call_t;

/* Fills c for one run of lock.lua; waiting (arrival > 0) adds the waiting
 * zset. Free with lock_done. (Each field read is written: a run's calls
 * are a few kilobytes to clear otherwise.) */
static int lock_prepare(lock_call_t *c, const capstan_lock_req_t *q, double arrival, double cutoff,
                        char *err)
{
    c->meta = NULL;
    c->call = (capstan_script_call_t){ 0 };
    if (!q->digest || !q->jid)
        return capstan_seterr(err, CAPSTAN_EINVAL, "a lock needs a digest and a jid");
    double now = capstan__now();
    capstan_unique__key(c->locked, sizeof(c->locked), q->digest, q->runtime, CAPSTAN_KEY_LOCKED);
    capstan_unique__key(c->waiting, sizeof(c->waiting), q->digest, q->runtime, CAPSTAN_KEY_WAITING);
    long ttl = q->ttl < CAPSTAN_UNIQUE_MAX_SECONDS ? q->ttl : CAPSTAN_UNIQUE_MAX_SECONDS;
    capstan__fmt_int(c->pttl, ttl > 0 ? ttl * 1000 : 0);
    capstan__fmt_int(c->limit, q->limit > 0 ? q->limit : 1);
    capstan__fmt_fixed(c->now_s, sizeof(c->now_s), now, 6);
    if (arrival > 0) {
        capstan__fmt_fixed(c->arr, sizeof(c->arr), arrival, 6);
        capstan__fmt_fixed(c->cut, sizeof(c->cut), cutoff, 6);
    }
    c->meta = q->metadata ? NULL : metadata(q, c->now_s);
    if (!q->metadata && !c->meta)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    const char *meta = q->metadata ? q->metadata : c->meta;
    const char **a = c->argv;
    c->call.script = CAPSTAN_SCRIPT_LOCK;
    c->call.argv = a;
    if (arrival > 0) {
        const char *all[] = { c->locked, CAPSTAN_UNIQUE_DIGESTS, c->waiting, q->jid, c->pttl,
                              capstan_lock_type_name(q->type), c->limit, meta, c->now_s, c->arr,
                              c->cut };
        memcpy(a, all, sizeof(all));
        c->call.nkeys = 3;
        c->call.argc = 11;
    } else {
        const char *two[] = { c->locked, CAPSTAN_UNIQUE_DIGESTS, q->jid, c->pttl,
                              capstan_lock_type_name(q->type), c->limit, meta, c->now_s };
        memcpy(a, two, sizeof(two));
        c->call.nkeys = 2;
        c->call.argc = 8;
    }
    return 0;
}

static void lock_done(lock_call_t *c)
{
    free(c->meta);
    freeReplyObject(c->call.reply);
    c->meta = NULL;
    c->call.reply = NULL;
}

/* A lock script's integer result as capstan_unique_lock returns it. */
static int lock_code(long long v)
{
    return v == 1 ? CAPSTAN_LOCK_ACQUIRED : v == 2 ? CAPSTAN_LOCK_REENTERED
                                               : v == -1 ? CAPSTAN_UNIQUE_NOT_YET : CAPSTAN_EDENIED;
}

/* What lock.lua's reply in c says (see lock_once); frees c. */
static int lock_result(lock_call_t *c, capstan_redis_t *r, char *err)
{
    redisReply *rep = c->call.reply;
    int rc;
    if (!rep)
        rc = capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
    else if (rep->type != REDIS_REPLY_INTEGER)
        rc = capstan_seterr(err, CAPSTAN_EREPLY, "lock.lua: %s",
                            rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    else
        rc = lock_code(rep->integer);
    lock_done(c);
    return rc;
}

/* One run of lock.lua, in a round trip of its own. */
static int lock_once(capstan_redis_t *r, const capstan_lock_req_t *q, double arrival, double cutoff,
                     char *err)
{
    lock_call_t c;
    int rc = lock_prepare(&c, q, arrival, cutoff, err);
    if (rc) {
        lock_done(&c);
        return rc;
    }
    c.call.reply = capstan__redis_script(r, CAPSTAN_SCRIPT_LOCK, c.call.nkeys, c.call.argc, c.argv,
                                         NULL);
    return lock_result(&c, r, err);
}

/* Counts v9's metric for a lock attempt's result. */
static int counted(capstan_redis_t *r, const capstan_lock_req_t *req, int rc)
{
    if (rc > 0)
        capstan_unique__metric(r, req->type, "locked");
    else if (rc == CAPSTAN_EDENIED)
        capstan_unique__metric(r, req->type, "lock_failed");
    return rc;
}

int capstan_unique__lock_ride(capstan_redis_t *r, const capstan_lock_req_t *req, capstan_ride_fn ride,
                              void *ud, char *err)
{
    if (!ride || store)
        return capstan_unique_lock(r, req, err);
    lock_call_t c;
    int rc = lock_prepare(&c, req, 0, 0, err);
    if (rc) {
        lock_done(&c);
        return rc;
    }
    ride(ud, r, &c.call, 1);
    return counted(r, req, lock_result(&c, r, err));
}

int capstan_unique_lock(capstan_redis_t *r, const capstan_lock_req_t *req, char *err)
{
    if (store)
        return store->lock(store->ud, req);
    return counted(r, req, lock_once(r, req, 0, 0, err));
}

/* What unlock.lua's reply says (capstan_unique_unlock's result); frees it. */
static int unlock_result(redisReply *rep, capstan_redis_t *r, capstan_lock_type_t type, int force,
                         char *err)
{
    int rc;
    if (!rep)
        return capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
    if (rep->type != REDIS_REPLY_INTEGER)
        rc = capstan_seterr(err, CAPSTAN_EREPLY, "unlock.lua: %s",
                            rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    else
        rc = rep->integer == 1 ? 0 : CAPSTAN_EDENIED;
    freeReplyObject(rep);
    if (!force)
        capstan_unique__metric(r, type, rc == 0 ? "unlocked" : "unlock_failed");
    return rc;
}

int capstan_unique_unlock(capstan_redis_t *r, const char *digest, int runtime, const char *jid,
                          capstan_lock_type_t type, int force, char *err)
{
    if (!digest || !jid)
        return capstan_seterr(err, CAPSTAN_EINVAL, "an unlock needs a digest and a jid");
    if (store)
        return store->unlock(store->ud, digest, runtime, jid, type, force);
    char locked[CAPSTAN_DIGEST_MAX + 16], waiting[CAPSTAN_DIGEST_MAX + 16], wake[CAPSTAN_DIGEST_MAX + 16];
    capstan_unique__key(locked, sizeof(locked), digest, runtime, CAPSTAN_KEY_LOCKED);
    capstan_unique__key(waiting, sizeof(waiting), digest, runtime, CAPSTAN_KEY_WAITING);
    capstan_unique__key(wake, sizeof(wake), digest, runtime, CAPSTAN_KEY_WAKE);
    const char *argv[] = { locked, CAPSTAN_UNIQUE_DIGESTS, waiting, wake, jid,
                           force ? "force" : capstan_lock_type_name(type) };
    return unlock_result(capstan__redis_script(r, CAPSTAN_SCRIPT_UNLOCK, 4, 6, argv, NULL), r, type,
                         force, err);
}

/* The until-lock release that goes before until_and_while_executing's
 * runtime lock, in the same round trip. */
typedef struct swap_call {
    char until[CAPSTAN_DIGEST_MAX + 16], waiting[CAPSTAN_DIGEST_MAX + 16], wake[CAPSTAN_DIGEST_MAX + 16];
    const char *argv[6];
} swap_call_t;

static capstan_script_call_t swap_prepare(swap_call_t *u, const capstan_lock_req_t *req)
{
    capstan_unique__key(u->until, sizeof(u->until), req->digest, 0, CAPSTAN_KEY_LOCKED);
    capstan_unique__key(u->waiting, sizeof(u->waiting), req->digest, 0, CAPSTAN_KEY_WAITING);
    capstan_unique__key(u->wake, sizeof(u->wake), req->digest, 0, CAPSTAN_KEY_WAKE);
    const char *argv[] = { u->until, CAPSTAN_UNIQUE_DIGESTS, u->waiting, u->wake, req->jid,
                           capstan_lock_type_name(req->type) };
    memcpy(u->argv, argv, sizeof(argv));
    return (capstan_script_call_t){ .script = CAPSTAN_SCRIPT_UNLOCK, .nkeys = 4, .argc = 6,
                                .argv = u->argv };
}

/* What the until-lock release (urep) and the runtime lock (in c) did, as
 * capstan_unique__swap_ride returns it; frees both replies. */
static int swap_result(capstan_redis_t *r, const capstan_lock_req_t *req, lock_call_t *c,
                       redisReply *urep, int *released, char *err)
{
    char uerr[CAPSTAN_ERRLEN] = "";
    *released = unlock_result(urep, r, req->type, 0, uerr);
    int rc = counted(r, req, lock_result(c, r, err));
    if (*released == 0)
        return rc;
    /* The until-lock is another job's: this one must not run, nor keep a
     * runtime lock it took for it. */
    if (rc == CAPSTAN_LOCK_ACQUIRED)
        (void)capstan_unique_unlock(r, req->digest, 1, req->jid, req->type, 0, err);
    if (*released < 0)
        capstan_seterr(err, *released, "%s", uerr);
    return rc;
}

int capstan_unique__swap_ride(capstan_redis_t *r, const capstan_lock_req_t *req, capstan_ride_fn ride, void *ud,
                              int *released, char *err)
{
    if (store) {
        *released = capstan_unique_unlock(r, req->digest, 0, req->jid, req->type, 0, err);
        return *released ? CAPSTAN_EDENIED : capstan_unique_lock(r, req, err);
    }
    lock_call_t c;
    int rc = lock_prepare(&c, req, 0, 0, err);
    if (rc) {
        lock_done(&c);
        return rc;
    }
    swap_call_t u;
    capstan_script_call_t calls[2] = { swap_prepare(&u, req), c.call };
    if (ride) {
        ride(ud, r, calls, 2);
    } else {
        calls[0].reply = capstan__redis_script(r, CAPSTAN_SCRIPT_UNLOCK, 4, 6, u.argv, NULL);
        if (calls[0].reply)
            calls[1].reply = capstan__redis_script(r, CAPSTAN_SCRIPT_LOCK, c.call.nkeys, c.call.argc,
                                                   c.argv, NULL);
    }
    c.call.reply = calls[1].reply;
    return swap_result(r, req, &c, calls[0].reply, released, err);
}

/* Fills each job's results from locks.lua's reply (err when it failed). */
static void many_results(capstan_redis_t *r, const capstan_lock_req_t *reqs, capstan_prelock_t *const *pre,
                         size_t n, const redisReply *rep)
{
    /* Two digits a job: released, taken; "99" its commands failed (see
     * locks.lua). */
    int ok = rep && rep->type == REDIS_REPLY_STRING && rep->len == 2 * n;
    for (size_t i = 0; ok && i < 2 * n; i++)
        ok = (rep->str[i] >= '0' && rep->str[i] <= '2') || rep->str[i] == '9';
    for (size_t i = 0; i < n; i++) {
        capstan_prelock_t *p = pre[i];
        int swap = p->type == CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING;
        if (!rep) {
            /* Not known whether the call ran: the job's middleware asks
             * again, after the reconnect (both steps are idempotent for
             * one jid). */
            p->asked = 0;
            continue;
        }
        if (!ok || rep->str[2 * i] == '9') {
            p->lr = capstan_seterr(p->err, CAPSTAN_EREPLY, "locks.lua: %s",
                                   rep->type == REDIS_REPLY_ERROR ? rep->str
                                   : ok ? "a command on this job's lock keys failed"
                                    : "unexpected reply");
            if (swap)
                p->released = p->lr;
            continue;
        }
        if (swap) {
            p->released = rep->str[2 * i] == '1' ? 0 : CAPSTAN_EDENIED;
            capstan_unique__metric(r, p->type, p->released == 0 ? "unlocked" : "unlock_failed");
        }
        p->lr = p->released ? CAPSTAN_EDENIED
                            : counted(r, &reqs[i], lock_code(rep->str[2 * i + 1] - '0'));
    }
}

void capstan_unique__lock_many(capstan_redis_t *r, const capstan_lock_req_t *reqs, capstan_prelock_t *const *pre,
                               size_t n, capstan_ride_fn ride, void *ud)
{
    /* n is a run's few jobs (CAPSTAN_RUN_MAX): on the stack. */
    lock_call_t c[n ? n : 1];
    char until[n ? n : 1][CAPSTAN_DIGEST_MAX + 16], kinds[n + 1];
    /* KEYS: the digests, each job's runtime lock hash, then the until-locks
     * (every key the script touches is declared, for Dragonfly and cluster
     * proxies); then now, the jobs' kinds and their groups (see
     * locks.lua). */
    const char *argv[1 + 2 * n + 2 + 6 * n];
    const char *untils[n ? n : 1], *groups[6 * n + 1];
    size_t argc = 1, ng = 0, nu = 0, k = 0;
    char err[CAPSTAN_ERRLEN] = "";
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        c[i].meta = NULL; /* what lock_done frees */
        c[i].call.reply = NULL;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        until[i][0] = '\0';
        capstan_prelock_t *p = pre[i];
        if ((rc = lock_prepare(&c[i], &reqs[i], 0, 0, err)))
            break;
        if (p->type == CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING) {
            capstan_unique__key(until[i], sizeof(until[i]), reqs[i].digest, 0, CAPSTAN_KEY_LOCKED);
            untils[nu++] = until[i];
        }
        /* lock_prepare's arguments for lock.lua without a waiting line:
         * locked, digests, jid, pttl, type, limit, meta, now. */
        const char *const *a = c[i].argv;
        int short_form = !until[i][0] && !strcmp(a[3], "0") && !strcmp(a[5], "1");
        kinds[k] = short_form ? 's' : 'l';
        if (short_form) {
            groups[ng++] = a[2];
            groups[ng++] = a[6];
        } else {
            const char *group[] = { until[i], a[2], a[3], a[4], a[5], a[6] };
            memcpy(groups + ng, group, sizeof(group));
            ng += 6;
        }
        argv[argc++] = a[0];
        k++;
    }
    kinds[k] = '\0';
    memcpy(argv + argc, untils, nu * sizeof(*untils));
    argc += nu;
    int nkeys = (int)argc;
    argv[0] = CAPSTAN_UNIQUE_DIGESTS;
    if (!rc && k) {
        argv[argc++] = c[0].now_s;
        argv[argc++] = kinds;
        memcpy(argv + argc, groups, ng * sizeof(*groups));
        argc += ng;
    }
    capstan_script_call_t call = { .script = CAPSTAN_SCRIPT_LOCKS, .nkeys = nkeys, .argc = (int)argc,
                               .argv = argv };
    for (size_t i = 0; i < n; i++)
        pre[i]->asked = 1;
    if (!rc && k) {
        ride(ud, r, &call, 1);
        many_results(r, reqs, pre, n, call.reply);
    }
    for (size_t i = 0; i < n; i++) {
        capstan_prelock_t *p = pre[i];
        if (rc) {
            p->lr = capstan_seterr(p->err, rc, "%s", err);
            if (p->type == CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING)
                p->released = p->lr;
        }
        if (p->type == CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING) {
            /* Kept to take the until-lock again if the job does not run. */
            p->meta = c[i].meta;
            c[i].meta = NULL;
        }
        lock_done(&c[i]);
    }
    freeReplyObject(call.reply);
}

/* How long a waiter blocks between tries when no release wakes it. Redis
 * 7.0 ends a blocking command's timeout at its next cron tick (every
 * 100 ms at the default hz 10): a wait of 0.05 s lasts 0.05 to 0.15 s. */
#define LOCK_RETRY_S 0.05

/* The wait for a lock: in line by arrival time in "<key>:WAITING", trying
 * again when a release wakes it ("<key>:WAKE"), and at least every 0.15 s
 * for what wakes no one (a lease that ran out, a release by a client that
 * does not push the token, more than 64 waiters). Entries older than this
 * wait's timeout plus a margin belong to waiters that crashed and are
 * dropped by lock.lua. */
static int waited(capstan_redis_t *r, const capstan_lock_req_t *req, double timeout, void (*waiting)(void *),
                  void *ud, char *err)
{
    double arrival = capstan__now(), end = capstan__mono() + timeout;
    char wake[CAPSTAN_DIGEST_MAX + 16];
    capstan_unique__key(wake, sizeof(wake), req->digest, req->runtime, CAPSTAN_KEY_WAKE);
    int rc;
    for (;;) {
        rc = lock_once(r, req, arrival, capstan__now() - timeout - 5, err);
        if (rc > 0 || (rc < 0 && rc != CAPSTAN_EDENIED && rc != CAPSTAN_UNIQUE_NOT_YET))
            break;
        if (capstan__mono() >= end) {
            rc = CAPSTAN_EDENIED;
            break;
        }
        if (waiting) {
            waiting(ud);
            waiting = NULL;
        }
        /* Until a release wakes the line (lib/wake_waiters.lua). */
        capstan__redis_wait_wake(r, wake, LOCK_RETRY_S, LOCK_RETRY_S);
    }
    if (rc <= 0) {
        /* Leave the line so those behind need not wait out our entry. */
        char waiting[CAPSTAN_DIGEST_MAX + 16];
        capstan_unique__key(waiting, sizeof(waiting), req->digest, req->runtime, CAPSTAN_KEY_WAITING);
        redisReply *rep = capstan_redis_cmdf(r, "ZREM %s %s", waiting, req->jid);
        freeReplyObject(rep);
    }
    return rc;
}

int capstan_unique_lock_wait(capstan_redis_t *r, const capstan_lock_req_t *req, double timeout, char *err)
{
    return capstan_unique__lock_wait_then(r, req, timeout, NULL, NULL, err);
}

int capstan_unique__lock_wait_then(capstan_redis_t *r, const capstan_lock_req_t *req, double timeout,
                                   void (*waiting)(void *), void *ud, char *err)
{
    if (timeout <= 0 || store)
        return capstan_unique_lock(r, req, err);
    return counted(r, req, waited(r, req, timeout, waiting, ud, err));
}
