/* Batches from C (capstan/batch.h): creating, reopening and committing them,
 * pushing their jobs through a client, and reading them back. What a job's
 * ack does to its batch is in lua/lib/batch_done.lua. */
#include "capstan/batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch/batch_internal.h"
#include "client/txn.h"
#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/scripts.h"
#include "support/buf.h"
#include "support/json.h"
#include "support/time.h"

#define DAYS_30 (30L * 24 * 3600)

static const char *const events[] = { "complete", "success", "death" };

typedef enum state { UNWRITTEN = 0, OPEN, COMMITTED } state_t;

struct capstan_batch {
    capstan_client_t *c;        /* borrowed */
    state_t state;
    char bid[33];
    char key[40];               /* "batch:BID" */
    char err[CAPSTAN_ERRLEN];
    char *description, *parent; /* owned; for a new batch only */
    char *cb_class[3], *cb_queue[3], *cb_opts[3];
    long linger, expiry;
    int create_lost;            /* a creation's reply was lost: it may be in */
    long home;                  /* a sharded client's shard for all of it
                                   (capstan__client_home), or -1 */
    int pinned;                 /* made through a client pinned to home */
};

static capstan_batch_t *handle(capstan_client_t *c, const char *bid, char *err)
{
    if (!c) {
        capstan_seterr(err, CAPSTAN_EINVAL, "a batch needs a client");
        return NULL;
    }
    capstan_batch_t *b = calloc(1, sizeof(*b));
    if (!b) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    b->c = c;
    b->linger = DAYS_30;
    b->expiry = DAYS_30;
    if (bid) {
        snprintf(b->bid, sizeof(b->bid), "%s", bid);
    } else {
        capstan__random_hex(b->bid, 8);
    }
    capstan__key(b->key, sizeof(b->key), CAPSTAN_KEY_BATCH, b->bid);
    b->home = capstan__client_home(c, b->bid);
    b->pinned = capstan__client_pinned(c) >= 0;
    return b;
}

/* The shard where batch bid lives, for a handle made through a client with
 * shards that is not pinned: the pick of its bid, else the first other
 * shard that holds it (a batch made through a pinned client, a child in
 * its parent's shard). The pick when none does: the step there says it
 * finds no batch. */
static long located(capstan_batch_t *b, const char *bid)
{
    if (b->pinned)
        return b->home;
    long pick = capstan__client_home(b->c, bid);
    if (pick < 0)
        return pick;
    char key[48];
    capstan__key(key, sizeof(key), CAPSTAN_KEY_BATCH, bid);
    long at = capstan__client_holder(b->c, key, pick);
    return at >= 0 ? at : pick;
}

/* Pins the client to the batch's home shard for one step, so that its
 * keys, its jobs and so its callbacks are all in that shard; returns the
 * pin to give back (capstan__client_pin), or sets *rc when the client's
 * open transaction is in another shard. */
static long pin_home(capstan_batch_t *b, int *rc)
{
    long was = capstan__client_pin(b->c, b->home);
    *rc = 0;
    if (was != b->home && capstan__client_txn(b->c)) {
        capstan__client_pin(b->c, was);
        *rc = capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s lives in shard %ld, not in the one of the "
                             "client's open transaction", b->bid, b->home);
    }
    return was;
}

void capstan_batch_free(capstan_batch_t *b)
{
    if (!b)
        return;
    free(b->description);
    free(b->parent);
    for (int i = 0; i < 3; i++) {
        free(b->cb_class[i]);
        free(b->cb_queue[i]);
        free(b->cb_opts[i]);
    }
    free(b);
}

const char *capstan_batch_bid(const capstan_batch_t *b) { return b->bid; }
const char *capstan_batch_error(const capstan_batch_t *b) { return b->err; }

/* Runs script s on the client's connection (reconnecting first when it is
 * broken). Never sent twice: a step whose reply was lost may have been
 * applied, and counting jobs twice would keep the batch from succeeding.
 * An error reply's first word says which code it is (see
 * lua/batch_open.lua). *out gets an integer reply (may be NULL). */
static int run_home(capstan_batch_t *b, capstan_script_t s, int nkeys, int argc, const char **argv,
                    long long *out)
{
    capstan_txn_t *t = capstan__client_txn(b->c);
    if (t) {
        /* Inside the client's transaction the step waits with the pushes,
         * and lands with them in capstan_client_commit or never. */
        char n[16];
        snprintf(n, sizeof(n), "%d", nkeys);
        const char *av[argc + 3];
        av[0] = "EVAL";
        av[1] = capstan__lua_texts[s];
        av[2] = n;
        memcpy(av + 3, argv, (size_t)argc * sizeof(*argv));
        if (out)
            *out = 0;
        return capstan__txn_add(t, argc + 3, av, NULL) ? capstan_seterr(b->err, CAPSTAN_ENOMEM, "out of memory")
                                                   : 0;
    }
    capstan_redis_t *r = capstan_client_redis(b->c);
    if (!capstan_redis_ok(r) && capstan_redis_connect(r))
        return capstan_seterr(b->err, CAPSTAN_EREDIS, "batch %s: %s", b->bid, capstan_redis_error(r));
    redisReply *rep = capstan__redis_script(r, s, nkeys, argc, argv, NULL);
    if (!rep)
        return capstan_seterr(b->err, CAPSTAN_EREDIS, "batch %s: %s (the step may have been applied)",
                              b->bid, capstan_redis_error(r));
    int rc = 0;
    if (rep->type == REDIS_REPLY_ERROR) {
        rc = strncmp(rep->str, "NOTFOUND ", 9) == 0 ? CAPSTAN_ENOTFOUND
           : strncmp(rep->str, "DENIED ", 7) == 0 || strncmp(rep->str, "EXISTS ", 7) == 0
               ? CAPSTAN_EDENIED
               : CAPSTAN_EREPLY;
        const char *text = strchr(rep->str, ' ');
        capstan_seterr(b->err, rc, "%s", rc == CAPSTAN_EREPLY || !text ? rep->str : text + 1);
    } else if (out) {
        *out = rep->type == REDIS_REPLY_INTEGER ? rep->integer
             : rep->type == REDIS_REPLY_STRING ? atoll(rep->str) : 0;
    }
    freeReplyObject(rep);
    return rc;
}

static int run(capstan_batch_t *b, capstan_script_t s, int nkeys, int argc, const char **argv,
               long long *out)
{
    int rc;
    long was = pin_home(b, &rc);
    if (rc)
        return rc;
    rc = run_home(b, s, nkeys, argc, argv, out);
    capstan__client_pin(b->c, was);
    return rc;
}

/* The batch's own keys beside b->key, for the scripts to declare: every key
 * a script touches is in its KEYS, which Dragonfly and cluster proxies
 * need (doc/internals.md). */
typedef struct batch_keys {
    char jids[48], failures[48];
} batch_keys_t;

static batch_keys_t own_keys(const capstan_batch_t *b)
{
    batch_keys_t k;
    snprintf(k.jids, sizeof(k.jids), "%s:jids", b->key);
    snprintf(k.failures, sizeof(k.failures), "%s:failures", b->key);
    return k;
}

capstan_batch_t *capstan_batch_new(capstan_client_t *c, char *err)
{
    return handle(c, NULL, err);
}

capstan_batch_t *capstan_batch_reopen(capstan_client_t *c, const char *bid, char *err)
{
    if (!bid || !*bid || strlen(bid) > 32) {
        capstan_seterr(err, CAPSTAN_EINVAL, "not a batch id: \"%.40s\"", bid ? bid : "");
        return NULL;
    }
    capstan_batch_t *b = handle(c, bid, err);
    if (!b)
        return NULL;
    b->home = located(b, bid);
    char expiry[24];
    snprintf(expiry, sizeof(expiry), "%ld", b->expiry);
    const char *argv[] = { b->key, CAPSTAN_KEY_BATCHES, b->bid, "reopen", "", expiry };
    int rc = run(b, CAPSTAN_SCRIPT_BATCH_OPEN, 2, 6, argv, NULL);
    if (rc) {
        capstan_seterr(err, rc, "%s", b->err);
        capstan_batch_free(b);
        return NULL;
    }
    b->state = OPEN;
    return b;
}

/* The setters are for a batch not written yet. */
static int settable(capstan_batch_t *b)
{
    if (b->state == UNWRITTEN)
        return 0;
    return capstan_seterr(b->err, CAPSTAN_EINVAL,
                          "batch %s: description, callbacks, parent and linger are set before its "
                          "first push",
                          b->bid);
}

static int set_str(capstan_batch_t *b, char **field, const char *value)
{
    char *copy = value ? strdup(value) : NULL;
    if (value && !copy)
        return capstan_seterr(b->err, CAPSTAN_ENOMEM, "out of memory");
    free(*field);
    *field = copy;
    return 0;
}

int capstan_batch_describe(capstan_batch_t *b, const char *description)
{
    int rc = settable(b);
    return rc ? rc : set_str(b, &b->description, description);
}

/* A name Sidekiq takes for a queue: printable, without spaces. */
static int queue_name_ok(const char *q)
{
    if (!*q || strlen(q) > 200)
        return 0;
    for (const unsigned char *p = (const unsigned char *)q; *p; p++)
        if (*p <= ' ' || *p == 0x7f)
            return 0;
    return 1;
}

int capstan_batch_on(capstan_batch_t *b, capstan_batch_event_t event, const char *cls, const char *queue,
                     const char *options)
{
    int rc = settable(b);
    if (rc)
        return rc;
    if ((int)event < 0 || event > CAPSTAN_BATCH_DEATH)
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: no such callback event %d", b->bid,
                              (int)event);
    const char *ev = events[event];
    if (!cls || !*cls || strlen(cls) > 200 || !queue_name_ok(cls))
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: the %s callback needs a class name",
                              b->bid, ev);
    if (!queue)
        queue = "default";
    if (!queue_name_ok(queue))
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: the %s callback's queue \"%.60s\" is "
                              "not a queue name", b->bid, ev, queue);
    if (!options)
        options = "{}";
    capstan_jobject_t obj = {0};
    char why[CAPSTAN_ERRLEN] = "";
    rc = capstan__json_scan_object(options, strlen(options), &obj, why);
    capstan__jobject_free(&obj);
    if (rc)
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: the %s callback's options must be a "
                              "JSON object (%s): %.60s", b->bid, ev, why, options);
    if ((rc = set_str(b, &b->cb_class[event], cls)) || (rc = set_str(b, &b->cb_queue[event], queue))
        || (rc = set_str(b, &b->cb_opts[event], options)))
        return rc;
    return 0;
}

int capstan_batch_set_parent(capstan_batch_t *b, const char *parent_bid)
{
    int rc = settable(b);
    if (rc)
        return rc;
    if (parent_bid && (!*parent_bid || strlen(parent_bid) > 32 || !strcmp(parent_bid, b->bid)))
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: not a parent batch id: \"%.40s\"",
                              b->bid, parent_bid);
    /* A child lives in its parent's shard, where its link and callbacks
     * are counted. */
    if ((rc = set_str(b, &b->parent, parent_bid)))
        return rc;
    b->home = parent_bid ? located(b, parent_bid) : b->pinned ? b->home : capstan__client_home(b->c, b->bid);
    return 0;
}

int capstan_batch_set_linger(capstan_batch_t *b, long linger, long expiry)
{
    int rc = settable(b);
    if (rc)
        return rc;
    if (linger <= 0 || expiry <= 0)
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: linger and expiry are seconds > 0",
                              b->bid);
    b->linger = linger;
    b->expiry = expiry;
    return 0;
}

/* Writes a new batch: its fields, and its place in its parent. */
static int create(capstan_batch_t *b)
{
    char expiry[24], linger[24];
    snprintf(expiry, sizeof(expiry), "%ld", b->expiry);
    snprintf(linger, sizeof(linger), "%ld", b->linger);
    char names[3][3][24];
    const char *argv[5 + 4 + 2 * 2 + 9 * 2]; /* keys, 4 args, linger and description, callbacks */
    int argc = 0;
    batch_keys_t k = own_keys(b);
    char pkey[48];
    if (b->parent)
        capstan__key(pkey, sizeof(pkey), CAPSTAN_KEY_BATCH, b->parent);
    argv[argc++] = b->key;
    argv[argc++] = CAPSTAN_KEY_BATCHES;
    argv[argc++] = k.jids;
    argv[argc++] = CAPSTAN_KEY_BATCHES_OPEN;
    if (b->parent)
        argv[argc++] = pkey;
    int nkeys = argc;
    argv[argc++] = b->bid;
    argv[argc++] = "new";
    argv[argc++] = b->parent ? b->parent : "";
    argv[argc++] = expiry;
    argv[argc++] = "linger";
    argv[argc++] = linger;
    argv[argc++] = "description";
    argv[argc++] = b->description ? b->description : "";
    for (int e = 0; e < 3; e++) {
        if (!b->cb_class[e])
            continue;
        const char *parts[] = { "class", "queue", "opts" };
        const char *values[] = { b->cb_class[e], b->cb_queue[e], b->cb_opts[e] };
        for (int p = 0; p < 3; p++) {
            snprintf(names[e][p], sizeof(names[e][p]), "cb_%s_%s", events[e], parts[p]);
            argv[argc++] = names[e][p];
            argv[argc++] = values[p];
        }
    }
    int rc = run(b, CAPSTAN_SCRIPT_BATCH_OPEN, nkeys, argc, argv, NULL);
    /* Made again after a lost reply, the batch is found made: by this
     * handle (bids are random), so it is open. */
    if (rc == CAPSTAN_EDENIED && b->create_lost && strstr(b->err, "exists already"))
        rc = 0;
    b->create_lost = rc == CAPSTAN_EREDIS;
    if (!rc)
        b->state = OPEN;
    return rc;
}

/* Counts n more jobs in the batch (n < 0 takes them back). */
static int add(capstan_batch_t *b, long n)
{
    char count[24], expiry[24];
    snprintf(count, sizeof(count), "%ld", n);
    snprintf(expiry, sizeof(expiry), "%ld", b->expiry);
    batch_keys_t k = own_keys(b);
    const char *argv[] = { b->key, k.jids, k.failures, count, expiry };
    return run(b, CAPSTAN_SCRIPT_BATCH_ADD, 3, 5, argv, NULL);
}

/* opts->extra with "bid" first (malloc'd), or NULL when out of memory. */
static char *extra_with_bid(const capstan_batch_t *b, const char *extra)
{
    capstan_buf_t buf = {0};
    const char *rest = "}";
    if (extra) {
        rest = extra + strspn(extra, " \t\r\n");
        rest = *rest == '{' ? rest + 1 : "}";
        rest += strspn(rest, " \t\r\n");
    }
    int rc = capstan__buf_printf(&buf, "{\"bid\":\"%s\"%s%s", b->bid, *rest == '}' ? "" : ",", rest);
    if (rc) {
        capstan__buf_free(&buf);
        return NULL;
    }
    return capstan__buf_take(&buf, NULL);
}

static int push_home(capstan_batch_t *b, const char *cls, const char *const *args, size_t n,
                     const capstan_push_opts_t *opts, char (*jids)[25])
{
    if (b->state == COMMITTED)
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: this handle is committed; reopen the "
                              "batch to add jobs", b->bid);
    if (n == 0)
        return 0;
    capstan_push_opts_t o = opts ? *opts : capstan_push_opts_default();
    char *extra = extra_with_bid(b, o.extra);
    char (*own)[25] = jids ? jids : calloc(n, sizeof(*own));
    if (!extra || !own) {
        free(extra);
        if (!jids)
            free(own);
        return capstan_seterr(b->err, CAPSTAN_ENOMEM, "out of memory");
    }
    o.extra = extra;
    /* The count and the pushes go in one transaction (the caller's, else
     * one of this call's own): after a lost connection they were both made,
     * once, or neither, never the jobs without their count or twice. A
     * batch already written is checked first (deleted, expired), as a
     * failed count inside the transaction would not stop the pushes; while
     * this handle is not committed the batch cannot succeed meanwhile. */
    int own_txn = capstan__client_txn(b->c) == NULL;
    int rc = b->state == UNWRITTEN ? create(b) : own_txn ? add(b, 0) : 0;
    if (!rc && own_txn && capstan_client_begin(b->c))
        rc = capstan_seterr(b->err, CAPSTAN_ENOMEM, "%s", capstan_client_error(b->c));
    if (!rc)
        rc = add(b, (long)n);
    int tried = !rc;
    if (!rc) {
        rc = capstan_client_push_bulk(b->c, cls, args, n, &o, own);
        if (rc)
            capstan_seterr(b->err, rc, "%s", capstan_client_error(b->c));
        /* Refused by the client chain, or none pushed (a failed push drops
         * all its own, jids maybe unwritten): not counted (in the caller's
         * transaction the count is taken back with them). */
        long missing = rc < 0 && rc != CAPSTAN_EDENIED ? (long)n : 0;
        for (size_t i = 0; !missing && i < n; i++)
            missing += own[i][0] == '\0';
        if (missing && add(b, -missing) == 0 && rc == 0)
            rc = CAPSTAN_EDENIED;
    }
    if (own_txn && capstan__client_txn(b->c)) {
        if (rc < 0 && rc != CAPSTAN_EDENIED) {
            capstan_client_rollback(b->c);
        } else {
            int sent = capstan_client_commit(b->c);
            if (sent < 0)
                rc = capstan_seterr(b->err, sent, "batch %s: %s", b->bid, capstan_client_error(b->c));
            else if (sent > 0 && rc == 0) /* CAPSTAN_PUSH_UNREPLICATED: in, with a warning */
                rc = capstan_seterr(b->err, sent, "%s", capstan_client_error(b->c));
        }
    }
    if (jids && (!tried || (rc < 0 && rc != CAPSTAN_EDENIED)))
        memset(jids, 0, n * sizeof(*jids)); /* none is known to be in */
    free(extra);
    if (!jids)
        free(own);
    return rc;
}

int capstan_batch_push_bulk(capstan_batch_t *b, const char *cls, const char *const *args, size_t n,
                            const capstan_push_opts_t *opts, char (*jids)[25])
{
    b->err[0] = '\0';
    int rc;
    long was = pin_home(b, &rc);
    if (rc)
        return rc;
    rc = push_home(b, cls, args, n, opts, jids);
    capstan__client_pin(b->c, was);
    return rc;
}

int capstan_batch_push(capstan_batch_t *b, const char *cls, const char *args,
                       const capstan_push_opts_t *opts, char jid[25])
{
    const char *one[] = { args };
    char jids[1][25] = { "" };
    int rc = capstan_batch_push_bulk(b, cls, one, 1, opts, jids);
    if (jid)
        memcpy(jid, jids[0], 25);
    return rc;
}

int capstan_batch_commit(capstan_batch_t *b)
{
    b->err[0] = '\0';
    if (b->state == COMMITTED)
        return capstan_seterr(b->err, CAPSTAN_EINVAL, "batch %s: already committed", b->bid);
    int rc = b->state == UNWRITTEN ? create(b) : 0;
    if (rc)
        return rc;
    /* What firing the callbacks touches, as far as it can be known here:
     * a parent's keys and the callbacks' queues are read in the script. */
    batch_keys_t k = own_keys(b);
    const char *argv[] = { b->key, k.jids, k.failures, CAPSTAN_KEY_BATCHES_OPEN, CAPSTAN_KEY_QUEUES,
                           b->bid };
    long long fired = 0;
    rc = run(b, CAPSTAN_SCRIPT_BATCH_COMMIT, 5, 6, argv, &fired);
    if (!rc) {
        b->state = COMMITTED;
        capstan__metrics_batch_fired(capstan__metrics_here(), fired);
    }
    return rc;
}

/* ---- Reading and managing batches by bid ------------------------------ */

static int bid_ok(const char *bid, char *err)
{
    if (bid && *bid && strlen(bid) <= 32)
        return 0;
    return capstan_seterr(err, CAPSTAN_EINVAL, "not a batch id: \"%.40s\"", bid ? bid : "");
}

/* Runs fmt with bid in each of its %s. Returns the reply, or NULL with
 * *rc CAPSTAN_EREDIS or CAPSTAN_EREPLY (an error reply) and err filled. */
static redisReply *command(capstan_redis_t *r, char *err, int *rc, const char *fmt, const char *bid)
{
    *rc = CAPSTAN_EREDIS;
    if (!capstan_redis_ok(r) && capstan_redis_connect(r)) {
        capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
        return NULL;
    }
    redisReply *rep = capstan_redis_cmdf(r, fmt, bid, bid, bid);
    if (!rep) {
        capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
        return NULL;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        *rc = capstan_seterr(err, CAPSTAN_EREPLY, "%s", rep->str);
        freeReplyObject(rep);
        return NULL;
    }
    *rc = 0;
    return rep;
}

static char *dup_elem(const redisReply *e)
{
    return e->type == REDIS_REPLY_STRING ? strndup(e->str, e->len) : NULL;
}

static double num_elem(const redisReply *e)
{
    return e->type == REDIS_REPLY_STRING ? atof(e->str) : 0;
}

void capstan_batch_status_clear(capstan_batch_status_t *s)
{
    if (!s)
        return;
    free(s->bid);
    free(s->description);
    free(s->parent);
    free(s->first_failed_jid);
    free(s->first_error);
    memset(s, 0, sizeof(*s));
}

int capstan_batch_status(capstan_redis_t *r, const char *bid, capstan_batch_status_t *out, char *err)
{
    memset(out, 0, sizeof(*out));
    int rc = bid_ok(bid, err);
    if (rc)
        return rc;
    redisReply *rep = command(r, err, &rc,
        "HMGET " CAPSTAN_KEY_BATCH "%s created_at description parent total pending dead open "
        "invalidated complete_at success_at death_at", bid);
    if (!rep)
        return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 11) {
        freeReplyObject(rep);
        return capstan_seterr(err, CAPSTAN_EREPLY, "batch %s: unexpected reply", bid);
    }
    redisReply **e = rep->element;
    if (e[0]->type != REDIS_REPLY_STRING) {
        freeReplyObject(rep);
        return capstan_seterr(err, CAPSTAN_ENOTFOUND, "no batch %s (expired or deleted?)", bid);
    }
    out->bid = strdup(bid);
    out->created_at = num_elem(e[0]);
    out->description = dup_elem(e[1]);
    out->parent = dup_elem(e[2]);
    out->total = (long)num_elem(e[3]);
    out->pending = (long)num_elem(e[4]);
    out->dead = (long)num_elem(e[5]);
    out->open = (long)num_elem(e[6]);
    out->invalidated = e[7]->type == REDIS_REPLY_STRING;
    out->complete_at = num_elem(e[8]);
    out->success_at = num_elem(e[9]);
    out->death_at = num_elem(e[10]);
    freeReplyObject(rep);
    rc = out->bid ? 0 : capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    if (!rc && (rep = command(r, err, &rc, "HLEN " CAPSTAN_KEY_BATCH "%s:failures", bid))) {
        out->failures = rep->type == REDIS_REPLY_INTEGER ? (long)rep->integer : 0;
        freeReplyObject(rep);
    }
    if (!rc && out->failures
        && (rep = command(r, err, &rc, "HSCAN " CAPSTAN_KEY_BATCH "%s:failures 0 COUNT 1", bid))) {
        /* Any one of them: a hash keeps no order. */
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2
            && rep->element[1]->type == REDIS_REPLY_ARRAY && rep->element[1]->elements >= 2) {
            out->first_failed_jid = dup_elem(rep->element[1]->element[0]);
            out->first_error = dup_elem(rep->element[1]->element[1]);
        }
        freeReplyObject(rep);
    }
    if (rc)
        capstan_batch_status_clear(out);
    return rc;
}

void capstan_batch_list_free(char **bids, size_t n)
{
    for (size_t i = 0; bids && i < n; i++)
        free(bids[i]);
    free(bids);
}

/* Whether bid's data is gone (expired); if so both indexes forget it.
 * -1 on a failure (*rc and err set). */
static int forget_if_gone(capstan_redis_t *r, const char *bid, char *err, int *rc)
{
    redisReply *ex = command(r, err, rc, "EXISTS " CAPSTAN_KEY_BATCH "%s", bid);
    if (!ex)
        return -1;
    int gone = ex->type == REDIS_REPLY_INTEGER && ex->integer == 0;
    freeReplyObject(ex);
    for (int i = 0; gone && i < 2; i++) {
        redisReply *z = command(r, err, rc, i ? "ZREM " CAPSTAN_KEY_BATCHES_OPEN " %s"
                                              : "ZREM " CAPSTAN_KEY_BATCHES " %s", bid);
        if (!z)
            return -1;
        freeReplyObject(z);
    }
    return gone;
}

int capstan__batches_prune(capstan_redis_t *r, char cursor[32], long *removed, char *err)
{
    *removed = 0;
    int rc;
    redisReply *page = command(r, err, &rc, "ZSCAN " CAPSTAN_KEY_BATCHES_OPEN " %s COUNT 100",
                               cursor[0] ? cursor : "0");
    if (!page)
        return rc;
    const redisReply *m = page->type == REDIS_REPLY_ARRAY && page->elements == 2
                              && page->element[0]->type == REDIS_REPLY_STRING
                              && page->element[1]->type == REDIS_REPLY_ARRAY
                          ? page->element[1] : NULL;
    if (!m) {
        freeReplyObject(page);
        return capstan_seterr(err, CAPSTAN_EREPLY, "ZSCAN " CAPSTAN_KEY_BATCHES_OPEN ": unexpected reply");
    }
    snprintf(cursor, 32, "%s", page->element[0]->str);
    for (size_t i = 0; i + 1 < m->elements && !rc; i += 2) {
        int gone = m->element[i]->type == REDIS_REPLY_STRING
                       ? forget_if_gone(r, m->element[i]->str, err, &rc) : 0;
        *removed += gone > 0;
    }
    freeReplyObject(page);
    return rc;
}

int capstan_batch_list(capstan_redis_t *r, char ***bids, size_t *n, char *err)
{
    *bids = NULL;
    *n = 0;
    int rc;
    redisReply *rep = command(r, err, &rc, "ZRANGE " CAPSTAN_KEY_BATCHES " 0 -1%s", "");
    if (!rep)
        return rc;
    char **out = rep->elements ? calloc(rep->elements, sizeof(*out)) : NULL;
    if (rep->elements && !out)
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        const char *bid = rep->element[i]->str;
        int gone = forget_if_gone(r, bid, err, &rc);
        if (gone < 0)
            break;
        if (gone)
            continue; /* its data expired: the indexes forget it too */
        if (!(out[*n] = strdup(bid)))
            rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        else
            (*n)++;
    }
    freeReplyObject(rep);
    if (rc) {
        capstan_batch_list_free(out, *n);
        *n = 0;
        return rc;
    }
    *bids = out;
    return 0;
}

int capstan_batch_delete(capstan_redis_t *r, const char *bid, char *err)
{
    int rc = bid_ok(bid, err);
    if (rc)
        return rc;
    redisReply *rep = command(r, err, &rc,
        "DEL " CAPSTAN_KEY_BATCH "%s " CAPSTAN_KEY_BATCH "%s:jids " CAPSTAN_KEY_BATCH "%s:failures", bid);
    if (!rep)
        return rc;
    int found = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
    freeReplyObject(rep);
    if (!(rep = command(r, err, &rc, "ZREM " CAPSTAN_KEY_BATCHES " %s", bid)))
        return rc;
    freeReplyObject(rep);
    if (!(rep = command(r, err, &rc, "ZREM " CAPSTAN_KEY_BATCHES_OPEN " %s", bid)))
        return rc;
    freeReplyObject(rep);
    return found ? 0 : capstan_seterr(err, CAPSTAN_ENOTFOUND, "no batch %s", bid);
}

int capstan_batch_invalidate(capstan_redis_t *r, const char *bid, char *err)
{
    int rc = bid_ok(bid, err);
    if (rc)
        return rc;
    /* HSET only where the batch exists: an expired one stays gone. */
    redisReply *rep = command(r, err, &rc, "EXISTS " CAPSTAN_KEY_BATCH "%s", bid);
    if (!rep)
        return rc;
    int found = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
    freeReplyObject(rep);
    if (!found)
        return capstan_seterr(err, CAPSTAN_ENOTFOUND, "no batch %s", bid);
    if (!(rep = command(r, err, &rc, "HSET " CAPSTAN_KEY_BATCH "%s invalidated 1", bid)))
        return rc;
    freeReplyObject(rep);
    return 0;
}

int capstan_batch_valid(capstan_job_t *job)
{
    const char *bid = capstan_job_bid(job);
    if (!bid)
        return 1;
    redisReply *rep = redisCommand(capstan_job_redis(job), "HMGET " CAPSTAN_KEY_BATCH "%s created_at invalidated", bid);
    if (!rep)
        return CAPSTAN_EREDIS;
    int valid = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2
                && rep->element[0]->type == REDIS_REPLY_STRING
                && rep->element[1]->type != REDIS_REPLY_STRING;
    int rc = rep->type == REDIS_REPLY_ERROR ? CAPSTAN_EREPLY : valid;
    freeReplyObject(rep);
    return rc;
}
