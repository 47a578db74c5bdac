/* Pushing jobs: payloads built the way Ruby's Sidekiq::Client writes them
 * (retry, queue, options, args, class, jid, created_at, enqueued_at), so
 * every Sidekiq version reads them, with the class's options filled in as
 * Sidekiq fills in a worker's sidekiq_options. */
#include "kiq/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/json.h"
#include "support/payload.h"
#include "support/time.h"
#include "kiq/middleware.h"
#include "kiq/redis.h"
#include "middleware/mw.h"
#include "redis/keys.h"
#include "client/txn.h"

/* Options set with kiq_client_set_class. */
typedef struct client_class {
    char *cls;
    char *queue;
    int retry;
    const kiq_unique_opts_t *unique;
} client_class_t;

struct kiq_client {
    kiq_redis_t *r;
    char err[KIQ_ERRLEN];
    kiq_chain_t *chain;  /* client middleware, "unique" by default */
    client_class_t *classes;
    size_t nclasses;
    const kiq_config_t *cfg; /* classes: section and min_replicas_ack,
                                borrowed, or NULL */
    kiq_txn_t *txn;      /* open transaction (kiq_client_begin), or NULL */
};

kiq_push_opts_t kiq_push_opts_default(void)
{
    kiq_push_opts_t o = { .queue = NULL, .retry = KIQ_RETRY_UNSET, .at = 0,
                          .timestamps = KIQ_TS_FLOAT, .extra = NULL };
    return o;
}

kiq_client_t *kiq_client_new(const char *url, char *err)
{
    if (!url)
        url = getenv("REDIS_URL");
    if (!url || !*url)
        url = "redis://127.0.0.1:6379/0";
    kiq_client_t *c = calloc(1, sizeof(*c));
    if (!c) {
        kiq_seterr(err, KIQ_ENOMEM, "out of memory");
        return NULL;
    }
    c->r = kiq_redis_new(url, 10, err);
    if (!c->r) {
        free(c);
        return NULL;
    }
    if (kiq_redis_connect(c->r)) {
        kiq_seterr(err, KIQ_EREDIS, "%s", kiq_redis_error(c->r));
        kiq_client_free(c);
        return NULL;
    }
    if (!(c->chain = kiq_chain_new()) ||
        kiq_chain_add(c->chain, "unique", kiq_unique_client_mw, NULL)) {
        kiq_seterr(err, KIQ_ENOMEM, "out of memory");
        kiq_client_free(c);
        return NULL;
    }
    return c;
}

kiq_chain_t *kiq_client_chain(kiq_client_t *c)
{
    return c ? c->chain : NULL;
}

void kiq_client_free(kiq_client_t *c)
{
    if (!c)
        return;
    if (c->txn)
        (void)kiq_client_rollback(c);
    kiq_redis_free(c->r);
    kiq_chain_free(c->chain);
    for (size_t i = 0; i < c->nclasses; i++) {
        free(c->classes[i].cls);
        free(c->classes[i].queue);
    }
    free(c->classes);
    free(c);
}

static client_class_t *find_class(const kiq_client_t *c, const char *cls)
{
    for (size_t i = 0; i < c->nclasses; i++)
        if (strcmp(c->classes[i].cls, cls) == 0)
            return &c->classes[i];
    return NULL;
}

int kiq_client_set_class(kiq_client_t *c, const char *cls, const kiq_class_opts_t *opts)
{
    if (!c || !cls || !*cls || !opts)
        return KIQ_EINVAL;
    char *queue = opts->queue && *opts->queue ? strdup(opts->queue) : NULL;
    if (opts->queue && *opts->queue && !queue)
        return KIQ_ENOMEM;
    client_class_t *e = find_class(c, cls);
    if (!e) {
        client_class_t *p = realloc(c->classes, (c->nclasses + 1) * sizeof(*p));
        char *name = strdup(cls);
        if (p)
            c->classes = p;
        if (!p || !name) {
            free(name);
            free(queue);
            return KIQ_ENOMEM;
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

void kiq_client_use_config(kiq_client_t *c, const kiq_config_t *cfg)
{
    if (c)
        c->cfg = cfg;
}

/* Fills what o leaves unset from the class's options: the config file's
 * first, then kiq_client_set_class's, as the server reads them. *cc gets
 * the config's entry for the uniqueness middleware, unless the push gave
 * its own lock. */
static void class_defaults(const kiq_client_t *c, const char *cls, kiq_push_opts_t *o,
                           const kiq_class_conf_t **cc)
{
    const kiq_class_conf_t *conf = c->cfg ? kiq_config_class(c->cfg, cls) : NULL;
    const client_class_t *set = find_class(c, cls);
    if (o->retry == KIQ_RETRY_UNSET)
        o->retry = conf && conf->retry != KIQ_RETRY_UNSET ? conf->retry
                 : set ? set->retry : KIQ_RETRY_UNSET;
    if (!o->queue || !*o->queue)
        o->queue = conf && conf->queue ? conf->queue : set && set->queue ? set->queue : "default";
    *cc = o->unique ? NULL : conf;
    if (!o->unique && set)
        o->unique = set->unique;
}

const char *kiq_client_error(const kiq_client_t *c)
{
    return c->err;
}

kiq_redis_t *kiq_client_redis(kiq_client_t *c)
{
    return c->r;
}

/* Appends the payload of one job to b. */
static int build(kiq_client_t *c, kiq_buf_t *b, const char *cls, const char *args,
                 const kiq_push_opts_t *o, const char *queue, double now, char jid[25])
{
    kiq_jobject_t extra = {0};
    int rc = 0;
    if (!args)
        args = "[]";
    size_t alen = strlen(args);
    while (alen && (args[0] == ' ' || args[0] == '\n')) { args++; alen--; }
    if (alen == 0 || args[0] != '[' || kiq__json_validate(args, alen, c->err))
        return kiq_seterr(c->err, KIQ_EINVAL, "args must be a JSON array, got: %.60s", args);
    if (o->extra && kiq__json_scan_object(o->extra, strlen(o->extra), &extra, c->err))
        return kiq_seterr(c->err, KIQ_EINVAL, "extra fields must be a JSON object");
    char ts[32];
    kiq__ts_json(ts, now, o->timestamps);
    kiq__new_jid(jid);
    if (o->retry == KIQ_RETRY_UNSET || o->retry == KIQ_RETRY_DEFAULT)
        rc = kiq__buf_puts(b, "{\"retry\":true");
    else if (o->retry == KIQ_RETRY_NONE)
        rc = kiq__buf_puts(b, "{\"retry\":false");
    else
        rc = kiq__buf_printf(b, "{\"retry\":%d", o->retry);
    if (!rc) rc = kiq__buf_puts(b, ",\"queue\":");
    if (!rc) rc = kiq__json_quote(b, queue, strlen(queue));
    for (size_t i = 0; i < extra.n && !rc; i++) {
        const kiq_jmember_t *m = &extra.m[i];
        rc = kiq__buf_printf(b, ",\"%.*s\":%.*s", (int)m->klen, o->extra + m->kstart,
                            (int)m->vlen, o->extra + m->vstart);
    }
    if (!rc) rc = kiq__buf_puts(b, ",\"args\":");
    if (!rc) rc = kiq__buf_put(b, args, alen);
    if (!rc) rc = kiq__buf_puts(b, ",\"class\":");
    if (!rc) rc = kiq__json_quote(b, cls, strlen(cls));
    if (!rc) rc = kiq__buf_printf(b, ",\"jid\":\"%s\",\"created_at\":%s", jid, ts);
    if (!rc && !(o->at > now))
        rc = kiq__buf_printf(b, ",\"enqueued_at\":%s", ts);
    if (!rc) rc = kiq__buf_puts(b, "}");
    kiq__jobject_free(&extra);
    return rc;
}

/* The end of the client chain: the job is accepted into the batch. */
static int accept_push(kiq_mw_t *mw, void *ud)
{
    (void)ud;
    mw->accepted = 1;
    return 0;
}

/* One job of a bulk push. */
typedef struct push_job {
    kiq_mw_t mw;    /* its client chain state; owns the payload */
    char jid[25];
    char score[32]; /* ZADD score, for a job scheduled later */
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
static int prepare_job(kiq_client_t *c, push_job_t *job, const char *cls, const char *args,
                       const kiq_push_opts_t *o, const kiq_class_conf_t *cc, double now)
{
    const char *queue = o->queue;
    kiq_buf_t b = {0};
    int rc = build(c, &b, cls, args, o, queue, now, job->jid);
    kiq_mw_t *mw = &job->mw;
    mw->r = c->r;
    mw->unique = o->unique;
    mw->cc = cc;
    mw->cls = cls;
    mw->jid = job->jid;
    mw->queue = queue;
    mw->at = o->at > now ? o->at : 0;
    mw->payload = kiq__buf_take(&b, &mw->len);
    if (!rc && (!mw->payload || kiq__json_scan_object(mw->payload, mw->len, &mw->obj, NULL)))
        rc = kiq_seterr(c->err, KIQ_ENOMEM, "out of memory");
    return rc;
}

/* Runs the client chain on mw. A denial is counted in *denied, with its
 * reason in c->err, and is not an error: the other jobs go on. Returns
 * KIQ_EREDIS when Redis failed, which stops the batch. */
static int run_chain(kiq_client_t *c, kiq_mw_t *mw, const char *cls, size_t *denied)
{
    if (!kiq_redis_ok(c->r) && kiq_redis_connect(c->r))
        return kiq_seterr(c->err, KIQ_EREDIS, "%s", kiq_redis_error(c->r));
    int mrc = kiq__mw_run(c->chain, mw, accept_push, NULL);
    if (mw->accepted)
        return 0;
    (*denied)++;
    kiq_seterr(c->err, mrc && mrc != KIQ_EDENIED ? mrc : KIQ_EDENIED, "push of %s denied: %s",
               cls, mw->deny && *mw->deny ? mw->deny : kiq_strerror(mrc ? mrc : KIQ_EDENIED));
    return mrc == KIQ_EREDIS ? KIQ_EREDIS : 0;
}

/* Notes in t the uniqueness lock the chain took for an accepted job, so
 * that it is released if the push is not made. The while_executing family
 * locks only when the job runs. */
static int hold_lock(kiq_txn_t *t, const kiq_mw_t *mw)
{
    size_t tlen, dlen;
    const char *type = kiq_mw_field_raw(mw, "lock", &tlen);
    const char *digest = kiq_mw_field_raw(mw, "lock_digest", &dlen);
    char *name = type ? kiq__json_string_dup(type, tlen) : NULL;
    char *d = digest ? kiq__json_string_dup(digest, dlen) : NULL;
    kiq_lock_type_t lt = KIQ_LOCK_NONE;
    int rc = 0;
    if (name && d && kiq_lock_type_parse(name, &lt) == 0 && lt != KIQ_LOCK_WHILE_EXECUTING
        && lt != KIQ_LOCK_WHILE_EXECUTING_REJECT && lt != KIQ_LOCK_NONE)
        rc = kiq__txn_hold(t, d, lt, mw->jid);
    free(name);
    free(d);
    return rc;
}

/* Adds the accepted jobs to t: those due now onto the queue (SADD queues,
 * LPUSH), the others into the schedule (ZADD). argv and lens have room
 * for both commands (3n + 4 entries). */
static int add_accepted(kiq_txn_t *t, const char *queue, push_job_t *jobs, size_t n,
                        double now, const char **argv, size_t *lens)
{
    /* Sized to the name: a queue name may be of any length. */
    char *qkey = kiq__key_dup(KIQ_KEY_QUEUE, queue);
    if (!qkey)
        return KIQ_ENOMEM;
    cmd_t lpush = { argv, lens, 0 }, zadd = { argv + n + 2, lens + n + 2, 0 };
    cmd_add(&lpush, "LPUSH", strlen("LPUSH"));
    cmd_add(&lpush, qkey, strlen(qkey));
    cmd_add(&zadd, "ZADD", strlen("ZADD"));
    cmd_add(&zadd, KIQ_KEY_SCHEDULE, strlen(KIQ_KEY_SCHEDULE));
    for (size_t i = 0; i < n; i++) {
        kiq_mw_t *mw = &jobs[i].mw;
        if (!mw->accepted)
            continue;
        if (mw->at > now) {
            snprintf(jobs[i].score, sizeof(jobs[i].score), "%.6f", mw->at);
            cmd_add(&zadd, jobs[i].score, strlen(jobs[i].score));
            cmd_add(&zadd, mw->payload, mw->len);
        } else {
            cmd_add(&lpush, mw->payload, mw->len);
        }
    }
    const char *sadd[] = { "SADD", KIQ_KEY_QUEUES, queue };
    int rc = 0;
    if (lpush.n > 2)
        rc = kiq__txn_add(t, 3, sadd, NULL);
    if (!rc && lpush.n > 2)
        rc = kiq__txn_add(t, (int)lpush.n, lpush.argv, lpush.lens);
    if (!rc && zadd.n > 2)
        rc = kiq__txn_add(t, (int)zadd.n, zadd.argv, zadd.lens);
    free(qkey);
    return rc;
}

/* Sends t, followed by WAIT when min_replicas_ack is set, as processors
 * do after acks. */
static int exec_txn(kiq_client_t *c, const kiq_txn_t *t)
{
    int replicas = c->cfg ? c->cfg->min_replicas_ack : 0;
    long ms = c->cfg && c->cfg->min_replicas_timeout > 0 ? c->cfg->min_replicas_timeout : 1000;
    return kiq__txn_exec(t, c->r, replicas, ms, c->err);
}

/* Sends t now, outside a transaction of the caller's: a broken connection
 * is retried once, as Sidekiq's client does. */
static int send_now(kiq_client_t *c, const kiq_txn_t *t)
{
    int rc = 0;
    for (int attempt = 0; attempt < 2 && kiq__txn_len(t); attempt++) {
        if (!kiq_redis_ok(c->r) && kiq_redis_connect(c->r)) {
            rc = kiq_seterr(c->err, KIQ_EREDIS, "%s", kiq_redis_error(c->r));
            continue;
        }
        rc = exec_txn(c, t);
        if (rc != KIQ_EREDIS)
            break;
    }
    return rc;
}

/* Fills jids (when given) with the jid of each pushed (or, in a
 * transaction, buffered) job, "" for the others, and frees jobs. */
static void collect(push_job_t *jobs, size_t n, int sent, char (*jids)[25])
{
    for (size_t i = 0; jobs && i < n; i++) {
        int pushed = sent && jobs[i].mw.accepted;
        if (jids)
            memcpy(jids[i], pushed ? jobs[i].jid : "", pushed ? 25 : 1);
        kiq__mw_clear(&jobs[i].mw);
    }
    free(jobs);
}

int kiq_client_push_bulk(kiq_client_t *c, const char *cls, const char *const *args, size_t n,
                         const kiq_push_opts_t *opts, char (*jids)[25])
{
    kiq_push_opts_t o = opts ? *opts : kiq_push_opts_default();
    const kiq_class_conf_t *cc = NULL;
    c->err[0] = '\0';
    if (!cls || !*cls)
        return kiq_seterr(c->err, KIQ_EINVAL, "a job class is required");
    class_defaults(c, cls, &o, &cc);
    const char *queue = o.queue;
    if (n == 0)
        return 0;
    double now = kiq__now();
    if (o.at > 0 && o.at < 1e9)
        o.at += now; /* small values mean "seconds from now", as Sidekiq */
    /* Allocated before the chain runs, as much as can be: a middleware may
     * take a lock, which a later failure must give back (kiq__txn_undo). */
    kiq_txn_t *t = c->txn ? c->txn : kiq__txn_new();
    kiq_txn_mark_t mark = t ? kiq__txn_mark(t) : (kiq_txn_mark_t){ 0, 0 };
    push_job_t *jobs = calloc(n, sizeof(*jobs));
    const char **argv = calloc(3 * n + 4, sizeof(*argv));
    size_t *lens = calloc(3 * n + 4, sizeof(*lens)), denied = 0;
    int rc = t && jobs && argv && lens ? 0 : kiq_seterr(c->err, KIQ_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        rc = prepare_job(c, &jobs[i], cls, args ? args[i] : NULL, &o, cc, now);
        if (!rc)
            rc = run_chain(c, &jobs[i].mw, cls, &denied);
        if (!rc && jobs[i].mw.accepted && hold_lock(t, &jobs[i].mw))
            rc = kiq_seterr(c->err, KIQ_ENOMEM, "out of memory");
    }
    if (!rc && add_accepted(t, queue, jobs, n, now, argv, lens))
        rc = kiq_seterr(c->err, KIQ_ENOMEM, "out of memory");
    int sent = 0;
    if (!rc && !c->txn) {
        sent = 1;
        rc = send_now(c, t);
    }
    /* Not pushed for sure (a failure before sending, or Redis refused the
     * transaction): the locks taken for these jobs are released. */
    if (t && rc < 0 && !(sent && rc == KIQ_EREDIS))
        kiq__txn_undo(t, c->r, mark);
    collect(jobs, n, rc >= 0, jids);
    if (t != c->txn)
        kiq__txn_free(t);
    free(argv);
    free(lens);
    return rc < 0 ? rc : denied ? KIQ_EDENIED : rc;
}

int kiq_client_push(kiq_client_t *c, const char *cls, const char *args,
                    const kiq_push_opts_t *opts, char jid[25])
{
    const char *one[] = { args };
    char jids[1][25];
    int rc = kiq_client_push_bulk(c, cls, one, 1, opts, jids);
    if (rc >= 0 && jid)
        memcpy(jid, jids[0], 25);
    return rc;
}

kiq_txn_t *kiq__client_txn(kiq_client_t *c)
{
    return c->txn;
}

int kiq_client_begin(kiq_client_t *c)
{
    c->err[0] = '\0';
    if (c->txn)
        return kiq_seterr(c->err, KIQ_EINVAL, "a transaction is already open");
    if (!(c->txn = kiq__txn_new()))
        return kiq_seterr(c->err, KIQ_ENOMEM, "out of memory");
    return 0;
}

/* Ends the open transaction; the locks of its pushes are released unless
 * keep. */
static void end_txn(kiq_client_t *c, int keep)
{
    if (!keep)
        kiq__txn_undo(c->txn, c->r, (kiq_txn_mark_t){ 0, 0 });
    kiq__txn_free(c->txn);
    c->txn = NULL;
}

int kiq_client_commit(kiq_client_t *c)
{
    c->err[0] = '\0';
    if (!c->txn)
        return kiq_seterr(c->err, KIQ_EINVAL, "no transaction is open");
    if (!kiq__txn_len(c->txn)) {
        end_txn(c, 1);
        return 0;
    }
    int rc, maybe_sent = 0;
    if (!kiq_redis_ok(c->r) && kiq_redis_connect(c->r))
        rc = kiq_seterr(c->err, KIQ_EREDIS, "nothing was pushed: %s", kiq_redis_error(c->r));
    else if ((rc = exec_txn(c, c->txn)) == KIQ_EREDIS)
        maybe_sent = 1;
    /* Sent once, never again: after a lost connection the pushes may have
     * been made, and a second EXEC would make them twice. */
    if (maybe_sent) {
        char why[KIQ_ERRLEN];
        snprintf(why, sizeof(why), "%s", c->err);
        kiq_seterr(c->err, KIQ_EREDIS, "the connection failed during the commit: its pushes "
                   "were all made or none was, unknown which (%.120s)", why);
    }
    end_txn(c, rc >= 0 || maybe_sent);
    return rc;
}

int kiq_client_rollback(kiq_client_t *c)
{
    if (!c->txn)
        return kiq_seterr(c->err, KIQ_EINVAL, "no transaction is open");
    end_txn(c, 0);
    return 0;
}
