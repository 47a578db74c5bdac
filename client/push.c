/* Pushing jobs: payloads built the way Ruby's Sidekiq::Client writes them
 * (retry, queue, options, args, class, jid, created_at, enqueued_at), so
 * every Sidekiq version reads them, with the class's options filled in as
 * Sidekiq fills in a worker's sidekiq_options. */
#include "capstan/client.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/json.h"
#include "support/payload.h"
#include "config/shards.h"
#include "support/time.h"
#include "support/trace.h"
#include "capstan/middleware.h"
#include "capstan/redis.h"
#include "middleware/mw.h"
#include "redis/keys.h"
#include "client/txn.h"
#include "unique/internal.h"

/* Options set with capstan_client_set_class. */
typedef struct client_class {
    char *cls;
    char *queue;
    int retry;
    const capstan_unique_opts_t *unique;
} client_class_t;

struct capstan_client {
    capstan_redis_t *r;
    char err[CAPSTAN_ERRLEN];
    capstan_chain_t *chain; /* client middleware, "unique" by default */
    client_class_t *classes;
    size_t nclasses;
    const capstan_config_t *cfg; /* classes: section and min_replicas_ack,
                                borrowed, or NULL */
    capstan_txn_t *txn;  /* open transaction (capstan_client_begin), or NULL */
    const capstan_push_sink_t *sink; /* the testing kit's, or NULL */
    /* Routing over cfg's shards: a connection per shard (NULL until its
     * first push), and the shard capstan_client_set_shard named (-1: by
     * the rule). */
    capstan_redis_t **shard_r;
    long pin;
    size_t *last;        /* the shard of each job of the last push,
                            SIZE_MAX for one not pushed */
    size_t nlast;
};

static _Thread_local const capstan_push_sink_t *thread_sink;

void capstan__push_sink_set(const capstan_push_sink_t *sink)
{
    thread_sink = sink;
}

capstan_push_opts_t capstan_push_opts_default(void)
{
    capstan_push_opts_t o = { .queue = NULL, .retry = CAPSTAN_RETRY_UNSET, .at = 0,
                          .timestamps = CAPSTAN_TS_FLOAT, .extra = NULL };
    return o;
}

capstan_client_t *capstan_client_new(const char *url, char *err)
{
    int code;
    return capstan__client_open(url, err, &code);
}

capstan_client_t *capstan__client_open(const char *url, char *err, int *code)
{
    if (!url)
        url = getenv("REDIS_URL");
    if (!url || !*url)
        url = "redis://127.0.0.1:6379/0";
    capstan_client_t *c = calloc(1, sizeof(*c));
    *code = CAPSTAN_ENOMEM;
    if (!c) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    c->r = capstan_redis_new(url, 10, err);
    if (!c->r) {
        free(c);
        *code = CAPSTAN_ECONFIG; /* a malformed URL (or no memory) */
        return NULL;
    }
    c->sink = thread_sink;
    c->pin = -1;
    int rc = c->sink ? 0 : capstan_redis_connect(c->r);
    if (rc) {
        *code = capstan_seterr(err, rc, "%s", capstan_redis_error(c->r));
        capstan_client_free(c);
        return NULL;
    }
    if (!(c->chain = capstan_chain_new()) ||
        capstan_chain_add(c->chain, "unique", capstan_unique_client_mw, NULL)) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        capstan_client_free(c);
        return NULL;
    }
    return c;
}

capstan_chain_t *capstan_client_chain(capstan_client_t *c)
{
    return c ? c->chain : NULL;
}

/* True when pushes are routed over the config's shards. A testing kit's
 * client connects nowhere, so it does not route either. */
static int sharded(const capstan_client_t *c)
{
    return c->cfg && c->cfg->nshards > 0 && !c->sink;
}

static void drop_shards(capstan_client_t *c)
{
    for (size_t i = 0; c->shard_r && i < c->cfg->nshards; i++)
        capstan_redis_free(c->shard_r[i]);
    free(c->shard_r);
    free(c->last);
    c->shard_r = NULL;
    c->last = NULL;
    c->nlast = 0;
    c->pin = -1;
}

/* Makes the per-shard arrays at the first routed push. */
static int shards_ready(capstan_client_t *c)
{
    if (c->shard_r)
        return 0;
    c->shard_r = calloc(c->cfg->nshards, sizeof(*c->shard_r));
    return c->shard_r ? 0 : capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
}

/* Shard i's connection, made (not connected) on first use; NULL with
 * c->err filled. */
static capstan_redis_t *shard_conn(capstan_client_t *c, size_t i)
{
    char err[CAPSTAN_ERRLEN];
    if (shards_ready(c))
        return NULL;
    if (!c->shard_r[i] && !(c->shard_r[i] = capstan_redis_new(c->cfg->shards[i].redis_url, 10, err)))
        capstan_seterr(c->err, CAPSTAN_ECONFIG, "shard %s: %s", c->cfg->shards[i].name, err);
    return c->shard_r[i];
}

void capstan_client_free(capstan_client_t *c)
{
    if (!c)
        return;
    if (c->txn)
        (void)capstan_client_rollback(c);
    drop_shards(c);
    capstan_redis_free(c->r);
    capstan_chain_free(c->chain);
    for (size_t i = 0; i < c->nclasses; i++) {
        free(c->classes[i].cls);
        free(c->classes[i].queue);
    }
    free(c->classes);
    free(c);
}

static client_class_t *find_class(const capstan_client_t *c, const char *cls)
{
    for (size_t i = 0; i < c->nclasses; i++)
        if (strcmp(c->classes[i].cls, cls) == 0)
            return &c->classes[i];
    return NULL;
}

int capstan_client_set_class(capstan_client_t *c, const char *cls, const capstan_class_opts_t *opts)
{
    if (!c || !cls || !*cls || !opts)
        return CAPSTAN_EINVAL;
    char *queue = opts->queue && *opts->queue ? strdup(opts->queue) : NULL;
    if (opts->queue && *opts->queue && !queue)
        return CAPSTAN_ENOMEM;
    client_class_t *e = find_class(c, cls);
    if (!e) {
        client_class_t *p = realloc(c->classes, (c->nclasses + 1) * sizeof(*p));
        char *name = strdup(cls);
        if (p)
            c->classes = p;
        if (!p || !name) {
            free(name);
            free(queue);
            return CAPSTAN_ENOMEM;
        }
        e = &c->classes[c->nclasses++];
        *e = (client_class_t){ .cls = name };
    }
    free(e->queue);
    e->queue = queue;
    e->retry = opts->retry;
    e->unique = opts->unique;
    return 0;
}

void capstan_client_use_config(capstan_client_t *c, const capstan_config_t *cfg)
{
    if (!c || c->cfg == cfg)
        return;
    drop_shards(c); /* made for the other config's shards */
    c->cfg = cfg;
}

int capstan_client_set_shard(capstan_client_t *c, const char *name)
{
    c->err[0] = '\0';
    if (!sharded(c))
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "this client has no shards: give it a "
                              "configuration with a shards: list (capstan_client_use_config)");
    if (c->txn)
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "a transaction is open in shard %s",
                              c->cfg->shards[c->pin].name);
    if (!name) {
        c->pin = -1;
        return 0;
    }
    char known[CAPSTAN_ERRLEN] = "";
    for (size_t i = 0; i < c->cfg->nshards; i++) {
        if (!strcmp(c->cfg->shards[i].name, name)) {
            c->pin = (long)i;
            return 0;
        }
        size_t used = strlen(known);
        snprintf(known + used, sizeof(known) - used, "%s%s", i ? ", " : "", c->cfg->shards[i].name);
    }
    return capstan_seterr(c->err, CAPSTAN_ENOTFOUND, "no shard named \"%.60s\" (the shards: %s)", name, known);
}

long capstan__client_home(capstan_client_t *c, const char *key)
{
    if (!sharded(c))
        return -1;
    if (c->pin >= 0)
        return c->pin;
    return capstan__config_shard_of(c->cfg, key, 0);
}

long capstan__client_pin(capstan_client_t *c, long shard)
{
    long was = c->pin;
    if (sharded(c))
        c->pin = shard;
    return was;
}

long capstan__client_pinned(const capstan_client_t *c)
{
    return sharded(c) ? c->pin : -1;
}

long capstan__client_holder(capstan_client_t *c, const char *key, long first)
{
    if (!sharded(c) || first < 0)
        return -1;
    size_t n = c->cfg->nshards;
    for (size_t k = 0; k < n; k++) {
        size_t i = ((size_t)first + k) % n;
        capstan_redis_t *r = shard_conn(c, i);
        if (!r || (!capstan_redis_ok(r) && capstan_redis_connect(r)))
            continue;
        redisReply *rep = capstan_redis_cmdf(r, "EXISTS %s", key);
        int has = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
        freeReplyObject(rep);
        if (has)
            return (long)i;
    }
    return -1;
}

const char *capstan_client_pushed_shard(const capstan_client_t *c, size_t i)
{
    return c && i < c->nlast && c->last[i] != SIZE_MAX ? c->cfg->shards[c->last[i]].name : NULL;
}

/* Fills what o leaves unset from the class's options: the config file's
 * first, then capstan_client_set_class's, as the server reads them. *cc gets
 * the config's entry for the uniqueness middleware, unless the push gave
 * its own lock. */
static void class_defaults(const capstan_client_t *c, const char *cls, capstan_push_opts_t *o,
                           const capstan_class_conf_t **cc)
{
    const capstan_class_conf_t *conf = c->cfg ? capstan_config_class(c->cfg, cls) : NULL;
    const client_class_t *set = find_class(c, cls);
    if (o->retry == CAPSTAN_RETRY_UNSET)
        o->retry = conf && conf->retry != CAPSTAN_RETRY_UNSET ? conf->retry
                 : set ? set->retry : CAPSTAN_RETRY_UNSET;
    if (!o->queue || !*o->queue) {
        const char *q = capstan_client_class_queue(c, cls);
        o->queue = q ? q : "default";
    }
    *cc = o->unique ? NULL : conf;
    if (!o->unique && set)
        o->unique = set->unique;
}

const char *capstan_client_class_queue(const capstan_client_t *c, const char *cls)
{
    if (!c || !cls)
        return NULL;
    const capstan_class_conf_t *conf = c->cfg ? capstan_config_class(c->cfg, cls) : NULL;
    const client_class_t *set = find_class(c, cls);
    return conf && conf->queue ? conf->queue : set && set->queue ? set->queue : NULL;
}

/* The cancel mark for jid in the Redis behind r (see capstan_client_cancel). */
static long long cancel_on(capstan_client_t *c, capstan_redis_t *r0, const char *jid)
{
    char *key = capstan__key_dup(CAPSTAN_KEY_ITERATION, jid), now[32], ttl[32];
    if (!key) {
        capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
        return -1;
    }
    snprintf(now, sizeof(now), "%lld", (long long)capstan__now());
    snprintf(ttl, sizeof(ttl), "%d", CAPSTAN_ITERATION_TTL);
    /* One MULTI, so a job that completes (and deletes its state) between
     * the mark and the read cannot make the read come back empty. EXPIRE
     * without NX, as Sidekiq 7.3 sends it: NX needs Redis 7. */
    const char *multi[] = { "MULTI" }, *exec[] = { "EXEC" };
    const char *hsetnx[] = { "HSETNX", key, "cancelled", now }, *hget[] = { "HGET", key, "cancelled" },
               *expire[] = { "EXPIRE", key, ttl };
    int rc = capstan_redis_ok(r0) ? 0 : capstan_redis_connect(r0);
    int sent = 0;
    if (!rc && !(rc = capstan_redis_append(r0, 1, multi, NULL))) sent++;
    if (!rc && !(rc = capstan_redis_append(r0, 4, hsetnx, NULL))) sent++;
    if (!rc && !(rc = capstan_redis_append(r0, 3, hget, NULL))) sent++;
    if (!rc && !(rc = capstan_redis_append(r0, 3, expire, NULL))) sent++;
    if (!rc && !(rc = capstan_redis_append(r0, 1, exec, NULL))) sent++;
    free(key);
    long long at = -1;
    /* Every reply is read, whatever came before, so none is left for the
     * client's next command; the EXEC's is the last. */
    for (int i = 0; i < sent; i++) {
        redisReply *r = capstan_redis_get_reply(r0);
        if (!r) {
            rc = CAPSTAN_EREDIS;
            break;
        }
        if (r->type == REDIS_REPLY_ERROR && !rc)
            rc = capstan_seterr(c->err, CAPSTAN_EREPLY, "cancel %s: %s", jid, r->str);
        if (i == sent - 1 && r->type == REDIS_REPLY_ARRAY && r->elements == 3) {
            const redisReply *v = r->element[1];
            if (v->type == REDIS_REPLY_STRING)
                at = strtoll(v->str, NULL, 10);
            else if (v->type == REDIS_REPLY_ERROR && !rc)
                rc = capstan_seterr(c->err, CAPSTAN_EREPLY, "cancel %s: %s", jid, v->str);
            if (r->element[0]->type == REDIS_REPLY_ERROR && !rc)
                rc = capstan_seterr(c->err, CAPSTAN_EREPLY, "cancel %s: %s", jid, r->element[0]->str);
        }
        freeReplyObject(r);
    }
    if (rc == CAPSTAN_EREDIS)
        capstan_seterr(c->err, rc, "cancel %s: %s", jid, capstan_redis_error(r0));
    else if (!rc && at < 0)
        rc = capstan_seterr(c->err, CAPSTAN_EREPLY, "cancel %s: the mark did not stay", jid);
    return rc ? -1 : at;
}

long long capstan_client_cancel(capstan_client_t *c, const char *jid)
{
    if (!jid || !*jid) {
        capstan_seterr(c->err, CAPSTAN_EINVAL, "a jid is needed");
        return -1;
    }
    if (!sharded(c))
        return cancel_on(c, c->r, jid);
    /* The job runs in a shard its route chose (a home queue, a digest or
     * its jid), which the jid alone does not tell: the mark goes to every
     * shard, where it expires unread in all but the job's. */
    /* A shard that fails does not keep the others unmarked; the first
     * failure is the one said. */
    long long first = -1;
    char failed[CAPSTAN_ERRLEN] = "";
    for (size_t i = 0; i < c->cfg->nshards; i++) {
        capstan_redis_t *r = shard_conn(c, i);
        long long at = r ? cancel_on(c, r, jid) : -1;
        if (at < 0 && !*failed)
            snprintf(failed, sizeof(failed), "shard %s: %s", c->cfg->shards[i].name, c->err);
        if (at >= 0 && (first < 0 || at < first))
            first = at;
    }
    if (*failed)
        capstan_seterr(c->err, CAPSTAN_EREDIS, "%s", failed);
    return *failed ? -1 : first;
}

const char *capstan_client_error(const capstan_client_t *c)
{
    return c->err;
}

capstan_redis_t *capstan_client_redis(capstan_client_t *c)
{
    capstan_redis_t *r = sharded(c) && c->pin >= 0 ? shard_conn(c, (size_t)c->pin) : NULL;
    return r ? r : c->r;
}

/* Appends the trace context of the job this thread runs, if any, unless
 * the push's extra fields give a traceparent of their own: the W3C
 * "traceparent" as it came (capstan makes no span of its own, so the
 * parent a span of the pushed job links to is the one the running job
 * was pushed under) and its "tracestate", as OpenTelemetry's Sidekiq
 * client middleware writes them. */
static int put_trace(capstan_buf_t *b, const capstan_jobject_t *extra, const char *extra_text)
{
    const char *tp = capstan__trace_parent(), *ts = capstan__trace_state();
    if (!tp || (extra_text && capstan__jobject_get(extra, extra_text, "traceparent")))
        return 0;
    int rc = capstan__buf_puts(b, ",\"traceparent\":");
    if (!rc) rc = capstan__json_quote(b, tp, strlen(tp));
    if (!rc && ts && !(extra_text && capstan__jobject_get(extra, extra_text, "tracestate"))) {
        rc = capstan__buf_puts(b, ",\"tracestate\":");
        if (!rc) rc = capstan__json_quote(b, ts, strlen(ts));
    }
    return rc;
}

/* Appends the payload of one job to b. */
static int build(capstan_client_t *c, capstan_buf_t *b, const char *cls, const char *args,
                 const capstan_push_opts_t *o, const char *queue, double now, char jid[25])
{
    capstan_jobject_t extra = {0};
    int rc = 0;
    if (!args)
        args = "[]";
    size_t alen = strlen(args);
    while (alen && (args[0] == ' ' || args[0] == '\n')) { args++; alen--; }
    if (alen == 0 || args[0] != '[' || capstan__json_validate(args, alen, c->err))
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "args must be a JSON array, got: %.60s", args);
    if (o->extra && capstan__json_scan_object(o->extra, strlen(o->extra), &extra, c->err))
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "extra fields must be a JSON object");
    char ts[32];
    capstan__ts_json(ts, now, o->timestamps);
    capstan__new_jid(jid);
    if (o->retry == CAPSTAN_RETRY_UNSET || o->retry == CAPSTAN_RETRY_DEFAULT)
        rc = capstan__buf_puts(b, "{\"retry\":true");
    else if (o->retry == CAPSTAN_RETRY_NONE)
        rc = capstan__buf_puts(b, "{\"retry\":false");
    else
        rc = capstan__buf_printf(b, "{\"retry\":%d", o->retry);
    if (!rc) rc = capstan__buf_puts(b, ",\"queue\":");
    if (!rc) rc = capstan__json_quote(b, queue, strlen(queue));
    for (size_t i = 0; i < extra.n && !rc; i++) {
        const capstan_jmember_t *m = &extra.m[i];
        rc = capstan__buf_printf(b, ",\"%.*s\":%.*s", (int)m->klen, o->extra + m->kstart,
                                 (int)m->vlen, o->extra + m->vstart);
    }
    if (!rc) rc = put_trace(b, &extra, o->extra);
    if (!rc) rc = capstan__buf_puts(b, ",\"args\":");
    if (!rc) rc = capstan__buf_put(b, args, alen);
    if (!rc) rc = capstan__buf_puts(b, ",\"class\":");
    if (!rc) rc = capstan__json_quote(b, cls, strlen(cls));
    if (!rc) rc = capstan__buf_printf(b, ",\"jid\":\"%s\",\"created_at\":%s", jid, ts);
    if (!rc && !(o->at > now))
        rc = capstan__buf_printf(b, ",\"enqueued_at\":%s", ts);
    if (!rc && o->expires_in > 0 && !capstan__jobject_get(&extra, o->extra, "expires_at"))
        rc = capstan__buf_printf(b, ",\"expires_at\":%.3f", (o->at > now ? o->at : now) + o->expires_in);
    if (!rc) rc = capstan__buf_puts(b, "}");
    capstan__jobject_free(&extra);
    return rc;
}

/* The end of the client chain: the job is accepted into the batch. */
static int accept_push(capstan_mw_t *mw, void *ud)
{
    (void)ud;
    mw->accepted = 1;
    return 0;
}

/* One job of a bulk push. */
typedef struct push_job {
    capstan_mw_t mw; /* its client chain state; owns the payload */
    char jid[25];
    char score[32]; /* ZADD score, for a job scheduled later */
    size_t shard;   /* the shard it goes to (0 for a client without shards) */
    int pushed;     /* sent (or, in a transaction, buffered) */
} push_job_t;

/* The argv of one Redis command, built word by word. */
typedef struct cmd {
    const char **argv;
    size_t *lens;
    size_t n;
} cmd_t;

static void cmd_add(cmd_t *cmd, const char *s, size_t len)
{
    cmd->argv[cmd->n] = s;
    cmd->lens[cmd->n++] = len;
}

/* Builds job's payload and the chain state that carries it. */
static int prepare_job(capstan_client_t *c, push_job_t *job, const char *cls, const char *args,
                       const capstan_push_opts_t *o, const capstan_class_conf_t *cc, double now)
{
    const char *queue = o->queue;
    capstan_buf_t b = {0};
    int rc = build(c, &b, cls, args, o, queue, now, job->jid);
    capstan_mw_t *mw = &job->mw;
    mw->r = c->r;
    mw->unique = o->unique;
    mw->cc = cc;
    mw->cls = cls;
    mw->jid = job->jid;
    mw->queue = queue;
    mw->at = o->at > now ? o->at : 0;
    mw->payload = capstan__buf_take(&b, &mw->len);
    if (!rc && (!mw->payload || capstan__json_scan_object(mw->payload, mw->len, &mw->obj, NULL)))
        rc = capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
    return rc;
}

/* Runs the client chain on mw. A denial is counted in *denied, with its
 * reason in c->err, and is not an error: the other jobs go on. Returns
 * CAPSTAN_EREDIS when Redis failed, which stops the batch. */
static int run_chain(capstan_client_t *c, capstan_mw_t *mw, const char *cls, size_t *denied)
{
    if (!c->sink && !capstan_redis_ok(mw->r) && capstan_redis_connect(mw->r))
        return capstan_seterr(c->err, CAPSTAN_EREDIS, "%s", capstan_redis_error(mw->r));
    int mrc = capstan__mw_run(c->chain, mw, accept_push, NULL);
    if (mw->accepted)
        return 0;
    (*denied)++;
    capstan_seterr(c->err, mrc && mrc != CAPSTAN_EDENIED ? mrc : CAPSTAN_EDENIED, "push of %s denied: %s",
                   cls, mw->deny && *mw->deny ? mw->deny : capstan_strerror(mrc ? mrc : CAPSTAN_EDENIED));
    return mrc == CAPSTAN_EREDIS ? CAPSTAN_EREDIS : 0;
}

/* Picks job's shard by the rule (doc/sharding.md, "Routing pushes"): the shard
 * capstan_client_set_shard named; else the first whose queues: list has
 * the job's queue; else, among the shards that fetch every queue (no
 * queues: list), capstan__config_shard_of the job's lock digest, so that its
 * duplicates meet (and its lock is taken) in one shard, else of its jid,
 * so that one queue spreads over them all. The digest is the one the
 * "unique" middleware computes from the payload as built: a middleware
 * ahead of it that rewrites args is not seen here. Points the job's
 * chain at that shard's connection. */
static int route(capstan_client_t *c, push_job_t *job)
{
    const capstan_config_t *cfg = c->cfg;
    long home = c->pin;
    size_t nopen = 0;
    for (size_t i = 0; i < cfg->nshards; i++) {
        for (size_t k = 0; home < 0 && k < cfg->shards[i].nqueues; k++)
            if (!strcmp(cfg->shards[i].queues[k], job->mw.queue))
                home = (long)i;
        nopen += !cfg->shards[i].queues;
    }
    if (home < 0 && !nopen)
        return capstan_seterr(c->err, CAPSTAN_ECONFIG, "no shard fetches queue %.80s: none lists it "
                              "in its queues:, and none is without a queues: list", job->mw.queue);
    if (home >= 0) {
        job->shard = (size_t)home;
    } else {
        char err[CAPSTAN_ERRLEN];
        capstan_unique_spec_t s;
        /* A lock that cannot be resolved fails the push in the chain,
         * with the reason; the jid places it meanwhile. */
        int locked = capstan_unique__resolve(&job->mw, &s, 1, err) == 0 && s.type != CAPSTAN_LOCK_NONE;
        job->shard = (size_t)capstan__config_shard_of(cfg, locked ? s.digest : job->jid, 1);
        if (locked)
            capstan_unique__spec_clear(&s);
    }
    job->mw.r = shard_conn(c, job->shard);
    return job->mw.r ? 0 : CAPSTAN_ECONFIG; /* c->err says why */
}

/* Notes in t the uniqueness lock the chain took for an accepted job, so
 * that it is released if the push is not made. The while_executing family
 * locks only when the job runs. */
static int hold_lock(capstan_txn_t *t, const capstan_mw_t *mw)
{
    size_t tlen, dlen;
    const char *type = capstan_mw_field_raw(mw, "lock", &tlen);
    const char *digest = capstan_mw_field_raw(mw, "lock_digest", &dlen);
    char *name = type ? capstan__json_string_dup(type, tlen) : NULL;
    char *d = digest ? capstan__json_string_dup(digest, dlen) : NULL;
    capstan_lock_type_t lt = CAPSTAN_LOCK_NONE;
    int rc = 0;
    if (name && d && capstan_lock_type_parse(name, &lt) == 0 && lt != CAPSTAN_LOCK_WHILE_EXECUTING
        && lt != CAPSTAN_LOCK_WHILE_EXECUTING_REJECT && lt != CAPSTAN_LOCK_NONE)
        rc = capstan__txn_hold(t, d, lt, mw->jid);
    free(name);
    free(d);
    return rc;
}

/* Adds the accepted jobs of shard to t: those due now onto the queue
 * (SADD queues, LPUSH), the others into the schedule (ZADD). argv and lens
 * have room for both commands (3n + 4 entries). */
static int add_accepted(capstan_txn_t *t, const char *queue, push_job_t *jobs, size_t n, size_t shard,
                        double now, const char **argv, size_t *lens)
{
    /* Sized to the name: a queue name may be of any length. */
    char *qkey = capstan__key_dup(CAPSTAN_KEY_QUEUE, queue);
    if (!qkey)
        return CAPSTAN_ENOMEM;
    cmd_t lpush = { argv, lens, 0 }, zadd = { argv + n + 2, lens + n + 2, 0 };
    cmd_add(&lpush, "LPUSH", strlen("LPUSH"));
    cmd_add(&lpush, qkey, strlen(qkey));
    cmd_add(&zadd, "ZADD", strlen("ZADD"));
    cmd_add(&zadd, CAPSTAN_KEY_SCHEDULE, strlen(CAPSTAN_KEY_SCHEDULE));
    for (size_t i = 0; i < n; i++) {
        capstan_mw_t *mw = &jobs[i].mw;
        if (!mw->accepted || jobs[i].shard != shard)
            continue;
        if (mw->at > now) {
            snprintf(jobs[i].score, sizeof(jobs[i].score), "%.6f", mw->at);
            cmd_add(&zadd, jobs[i].score, strlen(jobs[i].score));
            cmd_add(&zadd, mw->payload, mw->len);
        } else {
            cmd_add(&lpush, mw->payload, mw->len);
        }
    }
    const char *sadd[] = { "SADD", CAPSTAN_KEY_QUEUES, queue };
    int rc = 0;
    if (lpush.n > 2)
        rc = capstan__txn_add(t, 3, sadd, NULL);
    if (!rc && lpush.n > 2)
        rc = capstan__txn_add(t, (int)lpush.n, lpush.argv, lpush.lens);
    if (!rc && zadd.n > 2)
        rc = capstan__txn_add(t, (int)zadd.n, zadd.argv, zadd.lens);
    free(qkey);
    return rc;
}

/* Sends t, followed by WAIT when min_replicas_ack is set, as processors
 * do after acks. */
static int exec_txn(capstan_client_t *c, capstan_redis_t *r, const capstan_txn_t *t)
{
    int replicas = c->cfg ? c->cfg->min_replicas_ack : 0;
    long ms = c->cfg && c->cfg->min_replicas_timeout > 0 ? c->cfg->min_replicas_timeout : 1000;
    return capstan__txn_exec(t, r, replicas, ms, c->err);
}

/* Sends t now, outside a transaction of the caller's: a broken connection
 * is retried once, as Sidekiq's client does. */
static int send_now(capstan_client_t *c, capstan_redis_t *r, const capstan_txn_t *t)
{
    int rc = 0;
    for (int attempt = 0; attempt < 2 && capstan__txn_len(t); attempt++) {
        if (!capstan_redis_ok(r) && capstan_redis_connect(r)) {
            rc = capstan_seterr(c->err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
            continue;
        }
        rc = exec_txn(c, r, t);
        if (rc != CAPSTAN_EREDIS)
            break;
    }
    return rc;
}

/* Fills jids (when given) with the jid of each pushed (or, in a
 * transaction, buffered) job, "" for the others, and c->last with their
 * shards; frees jobs. */
static void collect(capstan_client_t *c, push_job_t *jobs, size_t n, char (*jids)[25])
{
    free(c->last);
    c->nlast = 0;
    c->last = sharded(c) && jobs ? malloc(n * sizeof(*c->last)) : NULL;
    if (c->last)
        c->nlast = n;
    for (size_t i = 0; jobs && i < n; i++) {
        int pushed = jobs[i].pushed && jobs[i].mw.accepted;
        if (jids)
            memcpy(jids[i], pushed ? jobs[i].jid : "", pushed ? 25 : 1);
        if (c->last)
            c->last[i] = pushed ? jobs[i].shard : SIZE_MAX;
        capstan__mw_clear(&jobs[i].mw);
    }
    free(jobs);
}

/* Why a client with shards has no transactions unless pinned to one
 * shard: one MULTI cannot span several Redis servers, and a MULTI per
 * shard would not be all or none. */
static const char no_txn[] = "a client with shards has no transactions unless pinned to one shard "
                             "(capstan_client_set_shard): one MULTI/EXEC cannot span several Redis "
                             "servers";

/* What one shard's share of a push became. */
typedef struct shard_send {
    capstan_txn_t *t; /* its writes (the open transaction's, unsharded) */
    int rc;           /* as capstan_client_push_bulk returns */
    int sent;         /* handed to Redis, so a lost connection leaves it unknown */
} shard_send_t;

/* Shard s's connection: the client's own without shards. */
static capstan_redis_t *conn_of(capstan_client_t *c, size_t s)
{
    return sharded(c) ? c->shard_r[s] : c->r;
}

/* Sends each shard's writes in a MULTI of its own; a shard that fails
 * does not stop the others. Returns the first failure (else the first
 * warning), its text naming its shard. */
static int send_all(capstan_client_t *c, shard_send_t *ss, size_t ns)
{
    int rc = 0;
    char why[CAPSTAN_ERRLEN] = "";
    size_t which = 0;
    for (size_t s = 0; s < ns; s++) {
        if (!ss[s].t)
            continue;
        ss[s].sent = 1;
        ss[s].rc = send_now(c, conn_of(c, s), ss[s].t);
        if (ss[s].rc < 0 ? rc >= 0 : ss[s].rc > 0 && rc == 0) {
            rc = ss[s].rc;
            which = s;
            snprintf(why, sizeof(why), "%s", c->err);
        }
    }
    if (rc && sharded(c))
        capstan_seterr(c->err, rc, "shard %s: %s", c->cfg->shards[which].name, why);
    return rc;
}

int capstan_client_push_bulk(capstan_client_t *c, const char *cls, const char *const *args, size_t n,
                             const capstan_push_opts_t *opts, char (*jids)[25])
{
    capstan_push_opts_t o = opts ? *opts : capstan_push_opts_default();
    const capstan_class_conf_t *cc = NULL;
    c->err[0] = '\0';
    if (!cls || !*cls)
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "a job class is required");
    if (sharded(c) && c->txn && c->pin < 0)
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "%s", no_txn);
    class_defaults(c, cls, &o, &cc);
    const char *queue = o.queue;
    if (n == 0)
        return 0;
    double now = capstan__now();
    if (o.at > 0 && o.at < 1e9)
        o.at += now; /* small values mean "seconds from now", as Sidekiq */
    /* Allocated before the chain runs, as much as can be: a middleware may
     * take a lock, which a later failure must give back (capstan__txn_undo).
     * A shard's transaction is made when its first job is routed there. */
    size_t ns = sharded(c) ? c->cfg->nshards : 1;
    shard_send_t *ss = calloc(ns, sizeof(*ss));
    capstan_txn_mark_t mark = c->txn ? capstan__txn_mark(c->txn) : (capstan_txn_mark_t){ 0, 0 };
    push_job_t *jobs = calloc(n, sizeof(*jobs));
    const char **argv = calloc(3 * n + 4, sizeof(*argv));
    size_t *lens = calloc(3 * n + 4, sizeof(*lens)), denied = 0;
    int rc = ss && jobs && argv && lens ? 0 : capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
    if (!rc && sharded(c))
        rc = shards_ready(c);
    if (!rc)
        ss[c->txn && sharded(c) ? (size_t)c->pin : 0].t = c->txn; /* the pinned shard's */
    for (size_t i = 0; i < n && !rc; i++) {
        rc = prepare_job(c, &jobs[i], cls, args ? args[i] : NULL, &o, cc, now);
        if (!rc && sharded(c))
            rc = route(c, &jobs[i]);
        capstan_txn_t **t = &ss[jobs[i].shard].t;
        if (!rc && !*t && !(*t = capstan__txn_new()))
            rc = capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
        if (!rc && (rc = run_chain(c, &jobs[i].mw, cls, &denied)) && sharded(c)) {
            char why[CAPSTAN_ERRLEN];
            snprintf(why, sizeof(why), "%s", c->err);
            capstan_seterr(c->err, rc, "shard %s: %s", c->cfg->shards[jobs[i].shard].name, why);
        }
        if (!rc && jobs[i].mw.accepted && hold_lock(*t, &jobs[i].mw))
            rc = capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
    }
    for (size_t i = 0; c->sink && i < n && !rc; i++)
        if (jobs[i].mw.accepted && (rc = c->sink->take(c->sink->ud, jobs[i].mw.payload, jobs[i].mw.len, queue,
                                                       jobs[i].mw.at > now ? jobs[i].mw.at : 0)))
            capstan_seterr(c->err, rc, "the testing kit could not keep the push of %s", cls);
    for (size_t s = 0; !rc && !c->sink && s < ns; s++)
        if (ss[s].t && add_accepted(ss[s].t, queue, jobs, n, s, now, argv, lens))
            rc = capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
    if (!rc && !c->txn && !c->sink)
        rc = send_all(c, ss, ns);
    else
        for (size_t s = 0; ss && s < ns; s++)
            ss[s].rc = rc;
    /* Not pushed for sure (a failure before sending, or Redis refused the
     * transaction): the locks taken for these jobs are released. */
    for (size_t s = 0; ss && s < ns; s++)
        if (ss[s].t && ss[s].rc < 0 && !(ss[s].sent && ss[s].rc == CAPSTAN_EREDIS))
            capstan__txn_undo(ss[s].t, conn_of(c, s), ss[s].t == c->txn ? mark : (capstan_txn_mark_t){ 0, 0 });
    for (size_t i = 0; jobs && ss && i < n; i++)
        jobs[i].pushed = ss[jobs[i].shard].rc >= 0;
    collect(c, jobs, n, jids);
    for (size_t s = 0; ss && s < ns; s++)
        if (ss[s].t != c->txn)
            capstan__txn_free(ss[s].t);
    free(ss);
    free(argv);
    free(lens);
    return rc < 0 ? rc : denied ? CAPSTAN_EDENIED : rc;
}

int capstan_client_push(capstan_client_t *c, const char *cls, const char *args,
                        const capstan_push_opts_t *opts, char jid[25])
{
    const char *one[] = { args };
    char jids[1][25];
    int rc = capstan_client_push_bulk(c, cls, one, 1, opts, jids);
    if (rc >= 0 && jid)
        memcpy(jid, jids[0], 25);
    return rc;
}

capstan_txn_t *capstan__client_txn(capstan_client_t *c)
{
    return c->txn;
}

int capstan_client_begin(capstan_client_t *c)
{
    c->err[0] = '\0';
    if (sharded(c) && c->pin < 0)
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "%s", no_txn);
    if (c->txn)
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "a transaction is already open");
    if (!(c->txn = capstan__txn_new()))
        return capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
    return 0;
}

/* Ends the open transaction; the locks of its pushes are released unless
 * keep. */
static void end_txn(capstan_client_t *c, int keep)
{
    if (!keep)
        capstan__txn_undo(c->txn, capstan_client_redis(c), (capstan_txn_mark_t){ 0, 0 });
    capstan__txn_free(c->txn);
    c->txn = NULL;
}

int capstan_client_commit(capstan_client_t *c)
{
    c->err[0] = '\0';
    if (!c->txn)
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "no transaction is open");
    if (!capstan__txn_len(c->txn)) {
        end_txn(c, 1);
        return 0;
    }
    int rc, maybe_sent = 0;
    capstan_redis_t *r = capstan_client_redis(c); /* a sharded client's pinned shard */
    if (!capstan_redis_ok(r) && capstan_redis_connect(r))
        rc = capstan_seterr(c->err, CAPSTAN_EREDIS, "nothing was pushed: %s", capstan_redis_error(r));
    else if ((rc = exec_txn(c, r, c->txn)) == CAPSTAN_EREDIS)
        maybe_sent = 1;
    /* Sent once, never again: after a lost connection the pushes may have
     * been made, and a second EXEC would make them twice. */
    if (maybe_sent) {
        char why[CAPSTAN_ERRLEN];
        snprintf(why, sizeof(why), "%s", c->err);
        capstan_seterr(c->err, CAPSTAN_EREDIS, "the connection failed during the commit: its pushes "
                       "were all made or none was, unknown which (%.120s)", why);
    }
    end_txn(c, rc >= 0 || maybe_sent);
    return rc;
}

int capstan_client_rollback(capstan_client_t *c)
{
    if (!c->txn)
        return capstan_seterr(c->err, CAPSTAN_EINVAL, "no transaction is open");
    end_txn(c, 0);
    return 0;
}
