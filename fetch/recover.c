/* Orphan recovery: jobs left in the working lists of processes that died
 * go back to their queues; a job that keeps killing its workers goes to the
 * dead set (a poison pill). Each job moves in a script that first checks the
 * owner's liveness key, so a live process's list is never touched, and that
 * takes a list only at a pass a grace period after the one that first saw
 * its liveness key missing (lua/recover.lua says why).
 * Also here, because they read working lists the same way: giving back
 * strays from a live process's own list, and the listing `capstan stats` shows. */
#include "fetch/fetch.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/reply.h"
#include "redis/scan.h"
#include "redis/scripts.h"
#include "support/buf.h"
#include "support/json.h"
#include "support/log.h"
#include "support/payload.h"
#include "support/time.h"

#define BATCH 64          /* jobs per script call */
/* The suspect marker outlives any gap between two passes: it is deleted by
 * the recovery that empties the list or by the owner when it comes back. */
#define MARKER_TTL_MS "86400000"

typedef struct moved {
    char *orig; size_t olen;   /* borrowed from the LRANGE reply */
    char *next; size_t nlen;   /* owned */
    char *dest;                /* owned: "dead" or "queue:NAME" */
    char *cls, *jid;           /* owned, for the dead only: named in the log */
    char *bid;                 /* owned, for the dead only: its batch's keys are declared */
    long count;                /* recoveries so far, for the dead only */
} moved_t;

/* Works out where one orphan goes and what it looks like there. A poison
 * pill's failed_at takes the unit of the payload's own timestamps; ts only
 * decides for a payload without any. */
/* Whether a job ran: started is NULL when every job counts (orphan
 * recovery cannot tell), else the jids of the jobs that had started. */
static int was_started(const char *raw, const capstan_jobject_t *obj, const capstan_started_t *started)
{
    if (!started)
        return 1;
    const capstan_jmember_t *j = capstan__jobject_get(obj, raw, "jid");
    char *jid = j ? capstan__json_string_dup(raw + j->vstart, j->vlen) : NULL;
    int found = 0;
    for (size_t i = 0; jid && i < started->n && !found; i++)
        found = strcmp(started->jids[i], jid) == 0;
    free(jid);
    return found;
}

static int plan_job(const char *raw, size_t len, int max_recoveries, capstan_ts_format_t ts,
                    double now, const capstan_started_t *started, moved_t *m)
{
    capstan_jobject_t obj = {0};
    int rc = 0;
    if (capstan__json_scan_object(raw, len, &obj, NULL) != 0) {
        /* Not JSON: hand it back unchanged; the processor that fetches it
         * sends it to the dead set with the reason. */
        m->dest = capstan__key_dup(CAPSTAN_KEY_QUEUE, "default");
        m->next = malloc(len ? len : 1);
        if (!m->next || !m->dest)
            return CAPSTAN_ENOMEM;
        memcpy(m->next, raw, len);
        m->nlen = len;
        goto out;
    }
    const capstan_jmember_t *q = capstan__jobject_get(&obj, raw, "queue");
    char *qname = q ? capstan__json_string_dup(raw + q->vstart, q->vlen) : NULL;
    if (!was_started(raw, &obj, started)) {
        /* Fetched ahead, never run: back untouched, as a TERM gives it. */
        m->dest = capstan__key_dup(CAPSTAN_KEY_QUEUE, qname && *qname ? qname : "default");
        m->next = malloc(len ? len : 1);
        free(qname);
        if (!m->next || !m->dest)
            rc = CAPSTAN_ENOMEM;
        else {
            memcpy(m->next, raw, len);
            m->nlen = len;
        }
        goto out;
    }
    const capstan_jmember_t *rc_m = capstan__jobject_get(&obj, raw, "recovery_count");
    long count = 1;
    if (rc_m) {
        char tmp[32];
        size_t n = rc_m->vlen < sizeof(tmp) - 1 ? rc_m->vlen : sizeof(tmp) - 1;
        memcpy(tmp, raw + rc_m->vstart, n);
        tmp[n] = '\0';
        /* A count from elsewhere may be anything: negative counts as
         * none, and the largest stays the largest. */
        long prev = strtol(tmp, NULL, 10);
        count = prev < 0 ? 1 : prev < LONG_MAX ? prev + 1 : LONG_MAX;
    }
    char cnt[32], when[32], msg[160];
    snprintf(cnt, sizeof(cnt), "%ld", count);
    if (count >= max_recoveries) {
        capstan__ts_json(when, now, capstan__ts_format_of(raw, &obj, ts));
        snprintf(msg, sizeof(msg),
                 "\"recovered from crashed processes %ld times; its worker died each time\"", count);
        capstan_field_t set[] = {
            { "recovery_count", cnt, 0 },
            { "error_class", "\"Capstan::PoisonPill\"", 0 },
            { "error_message", msg, 0 },
            { "failed_at", when, 0 },
        };
        rc = capstan__payload_edit(raw, &obj, set, 4, &m->next, &m->nlen);
        m->dest = strdup(CAPSTAN_KEY_DEAD);
        const capstan_jmember_t *c = capstan__jobject_get(&obj, raw, "class");
        const capstan_jmember_t *j = capstan__jobject_get(&obj, raw, "jid");
        m->cls = c ? capstan__json_string_dup(raw + c->vstart, c->vlen) : NULL;
        m->jid = j ? capstan__json_string_dup(raw + j->vstart, j->vlen) : NULL;
        const capstan_jmember_t *b = capstan__jobject_get(&obj, raw, "bid");
        m->bid = b && m->jid ? capstan__json_string_dup(raw + b->vstart, b->vlen) : NULL;
        m->count = count;
    } else {
        capstan_field_t set[] = { { "recovery_count", cnt, 0 } };
        rc = capstan__payload_edit(raw, &obj, set, 1, &m->next, &m->nlen);
        m->dest = capstan__key_dup(CAPSTAN_KEY_QUEUE, qname && *qname ? qname : "default");
    }
    free(qname);
    if (rc == 0 && !m->dest)
        rc = CAPSTAN_ENOMEM;
out:
    capstan__jobject_free(&obj);
    return rc;
}

/* Runs the recover script over jobs[0..n). Returns 0, 1 when the owner
 * turned out alive, 2 when it is only a suspect so far, or CAPSTAN_EREDIS. */
/* Whether s is one of list[0..n). */
static int listed(const char *const *list, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], s) == 0)
            return 1;
    return 0;
}

static int apply(capstan_redis_t *r, const char *const keys[4], long long grace_ms, moved_t *jobs,
                 size_t n, double now, capstan_recovery_t *out, char *err)
{
    /* Every key the script touches is declared in KEYS (Dragonfly, cluster
     * proxies): the four given, each destination queue, and each poison
     * pill's batch (its three keys, then "batches:open" and "queues"). */
    size_t maxkeys = 4 + n + 3 * n + 2, argc = maxkeys + 2 + 4 * n;
    const char **argv = calloc(argc, sizeof(*argv));
    size_t *lens = calloc(argc, sizeof(*lens));
    char **owned = calloc(3 * n + 1, sizeof(*owned));
    size_t nowned = 0, nkeys = 4;
    char score[32], grace[32];
    int rc = CAPSTAN_ENOMEM;
    if (!argv || !lens || !owned)
        goto out;
    argv[0] = keys[0]; argv[1] = keys[1]; argv[2] = keys[2]; argv[3] = keys[3];
    for (size_t i = 0; i < n; i++)
        if (!listed(argv, nkeys, jobs[i].dest))
            argv[nkeys++] = jobs[i].dest;
    for (size_t i = 0; i < n; i++) {
        static const char *const tails[] = { "", ":jids", ":failures" };
        char key[300];
        if (!jobs[i].bid || strlen(jobs[i].bid) > 200)
            continue; /* a bid that long names no batch of capstan's or Sidekiq's */
        snprintf(key, sizeof(key), "%s%s", CAPSTAN_KEY_BATCH, jobs[i].bid);
        if (listed(argv, nkeys, key))
            continue;
        for (int t = 0; t < 3; t++) {
            snprintf(key, sizeof(key), "%s%s%s", CAPSTAN_KEY_BATCH, jobs[i].bid, tails[t]);
            if (!(owned[nowned] = strdup(key)))
                goto out;
            argv[nkeys++] = owned[nowned++];
        }
    }
    if (nowned) {
        argv[nkeys++] = CAPSTAN_KEY_BATCHES_OPEN;
        argv[nkeys++] = CAPSTAN_KEY_QUEUES;
    }
    for (size_t i = 0; i < nkeys; i++)
        lens[i] = strlen(argv[i]);
    size_t base = nkeys + 2;
    argc = base + 4 * n;
    snprintf(score, sizeof(score), "%.6f", now);
    snprintf(grace, sizeof(grace), "%lld", grace_ms);
    argv[nkeys] = grace; argv[nkeys + 1] = MARKER_TTL_MS;
    lens[nkeys] = strlen(grace); lens[nkeys + 1] = strlen(MARKER_TTL_MS);
    for (size_t i = 0; i < n; i++) {
        size_t k = base + 4 * i;
        argv[k] = jobs[i].orig;     lens[k] = jobs[i].olen;
        argv[k + 1] = jobs[i].next; lens[k + 1] = jobs[i].nlen;
        argv[k + 2] = jobs[i].dest; lens[k + 2] = strlen(jobs[i].dest);
        argv[k + 3] = score;        lens[k + 3] = strlen(score);
    }
    redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_RECOVER, (int)nkeys, (int)argc, argv, lens);
    if (rep && rep->type == REDIS_REPLY_INTEGER && (rep->integer == -1 || rep->integer == -2)) {
        rc = rep->integer == -1 ? 1 : 2;
    } else if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 4) {
        out->recovered += rep->element[0]->integer;
        out->killed += rep->element[1]->integer;
        out->left += rep->element[2]->integer;
        capstan__metrics_batch_fired(capstan__metrics_here(), rep->element[3]->integer);
        rc = 0;
    } else {
        /* Refused (maxmemory, a read-only replica...): nothing moved. */
        char what[600];
        snprintf(what, sizeof(what), "recovering %s", keys[0]);
        capstan__reply_error(r, rep, what, err);
        rc = CAPSTAN_EREDIS;
    }
    freeReplyObject(rep);
out:
    for (size_t i = 0; i < nowned; i++)
        free(owned[i]);
    free(owned);
    free(argv);
    free(lens);
    return rc;
}

/* Names each job of a batch that went to the dead set, once the script
 * ran: an operator looks for the class and jid, not a count. The script
 * only counts what it moved: should it have sent fewer than planned (a job
 * taken meanwhile, "dead" of another type), the lines say "may have". */
static void log_poison_pills(const moved_t *jobs, size_t n, long sent)
{
    long planned = 0;
    for (size_t i = 0; i < n; i++)
        planned += strcmp(jobs[i].dest, CAPSTAN_KEY_DEAD) == 0;
    for (size_t i = 0; i < n && sent > 0; i++)
        if (strcmp(jobs[i].dest, CAPSTAN_KEY_DEAD) == 0)
            capstan_warn("poison pill %s jid=%s %s to the dead set: recovered from crashed "
                         "processes %ld times, its worker died each time",
                         jobs[i].cls ? jobs[i].cls : "(no class)", jobs[i].jid ? jobs[i].jid : "(none)",
                         sent == planned ? "sent" : "may have been sent", jobs[i].count);
}

/* Counts the poison pills the script sent to the dead set as Sidekiq
 * counts a job that raised: in stat:processed and stat:failed (and the
 * day's keys), and in its class's jobs and failures on the Metrics tab
 * (layouts: config's sidekiq_metrics). The processes that ran them died
 * each time, so no one else counts them. Should the script have sent
 * fewer than planned, the first ones planned count; a write that fails
 * drops the counts, as the beat's does: they are a chart, not a ledger. */
static void count_poison_pills(capstan_redis_t *r, const moved_t *jobs, size_t n, long sent, int layouts)
{
    capstan_exec_t e[BATCH];
    size_t k = 0;
    char err[CAPSTAN_ERRLEN];
    if (sent <= 0)
        return;
    for (size_t i = 0; i < n && (long)k < sent; i++)
        if (strcmp(jobs[i].dest, CAPSTAN_KEY_DEAD) == 0 && jobs[i].cls && capstan__exec_class_ok(jobs[i].cls))
            e[k++] = (capstan_exec_t){ .cls = jobs[i].cls, .processed = 1, .failed = 1 };
    time_t now = time(NULL);
    if (capstan__stats_incr(r, sent, sent, now, err) || capstan__exec_flush(r, e, k, layouts, now, err))
        capstan_warn("poison pills not counted: %s", err);
}

/* capstan__reply_error for an LRANGE of key. */
static int lrange_error(capstan_redis_t *r, const redisReply *rep, const char *key, char *err)
{
    char what[600];
    snprintf(what, sizeof(what), "LRANGE %s", key);
    return capstan__reply_error(r, rep, what, err);
}

/* Recovers one identity's list, after a grace of grace_ms by Redis's clock
 * since a pass first saw its liveness key missing (0: at once). */
static int recover_list(capstan_redis_t *r, const char *identity, long long grace_ms,
                        int max_recoveries, capstan_ts_format_t ts, int layouts,
                        const capstan_started_t *started, capstan_recovery_t *out, char *err)
{
    char *keys[4] = { capstan__key_dup(CAPSTAN_KEY_WORKING, identity),
                      capstan__key_dup(CAPSTAN_KEY_HEARTBEAT, identity),
                      CAPSTAN_KEY_DEAD, capstan__key_dup(CAPSTAN_KEY_ORPHAN, identity) };
    redisReply *list = NULL;
    int rc = 0;
    if (!keys[0] || !keys[1] || !keys[3]) {
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        goto out;
    }
    const char *wkey = keys[0];
    const char *argv[] = { "LRANGE", wkey, "0", "-1" };
    list = capstan_redis_cmd(r, 4, argv, NULL);
    if (!list || list->type != REDIS_REPLY_ARRAY) {
        rc = lrange_error(r, list, wkey, err);
        goto out;
    }
    double now = capstan__now();
    moved_t jobs[BATCH];
    size_t total = list->elements, done = 0;
    rc = 0;
    /* Each job is RPUSHed to the end of its queue that is fetched next, so
     * the last one pushed runs first. Pushing from the working list's left
     * (newest) end leaves the oldest job outermost: the queue is consumed in
     * the order the dead process took the jobs. */
    while (done < total && rc == 0) {
        size_t n = 0;
        for (; n < BATCH && done + n < total; n++) {
            redisReply *e = list->element[done + n];
            memset(&jobs[n], 0, sizeof(jobs[n]));
            jobs[n].orig = e->str;
            jobs[n].olen = e->len;
            if ((rc = plan_job(e->str, e->len, max_recoveries, ts, now, started, &jobs[n]))) {
                n++;
                break;
            }
        }
        long killed = out->killed;
        if (rc == 0)
            rc = apply(r, (const char *const *)keys, grace_ms, jobs, n, now, out, err);
        if (rc == 0) {
            log_poison_pills(jobs, n, out->killed - killed);
            count_poison_pills(r, jobs, n, out->killed - killed, layouts);
        }
        for (size_t i = 0; i < n; i++) {
            free(jobs[i].next);
            free(jobs[i].dest);
            free(jobs[i].cls);
            free(jobs[i].jid);
            free(jobs[i].bid);
        }
        done += n;
    }
    if (rc == 1) {
        rc = 0; /* alive after all: leave it */
    } else if (rc == 2) {
        out->suspects++;
        rc = 0;
    } else if (rc && rc != CAPSTAN_EREDIS) {
        capstan_seterr(err, rc, "recovering %s: %s", wkey,
                       rc == CAPSTAN_ENOMEM ? "out of memory" : "could not edit a payload");
    } else if (rc == 0 && total) {
        out->lists++;
    }
out:
    freeReplyObject(list);
    free(keys[0]);
    free(keys[1]);
    free(keys[3]);
    return rc;
}

int capstan__fetch_recover_one(capstan_redis_t *r, const char *identity, int max_recoveries,
                               capstan_ts_format_t ts, int layouts, capstan_recovery_t *out, char *err)
{
    return recover_list(r, identity, 0, max_recoveries, ts, layouts, NULL, out, err);
}

int capstan__fetch_recover_dead(capstan_redis_t *r, const char *identity, const capstan_started_t *started,
                                int max_recoveries, capstan_ts_format_t ts, int layouts,
                                capstan_recovery_t *out, char *err)
{
    char *lkey = capstan__key_dup(CAPSTAN_KEY_HEARTBEAT, identity);
    if (!lkey)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    redisReply *del = capstan_redis_cmdf(r, "DEL %s", lkey);
    int rc = del && del->type == REDIS_REPLY_INTEGER ? 0 : capstan__reply_error(r, del, "DEL", err);
    freeReplyObject(del);
    free(lkey);
    return rc ? rc : recover_list(r, identity, 0, max_recoveries, ts, layouts, started, out, err);
}

/* How long a list stays a suspect before it is taken: longer than the
 * owners' refresh interval (at most a third of the TTL), so a live owner
 * that can write to Redis has re-created its key. */
static long long grace_of(double liveness_ttl)
{
    return (long long)(liveness_ttl * 500.0);
}

/* Whether key exists: 1 or 0, or an error with err filled. */
static int exists(capstan_redis_t *r, const char *prefix, const char *id, char *err)
{
    redisReply *ex = capstan_redis_cmdf(r, "EXISTS %s%s", prefix, id);
    int rc = ex && ex->type == REDIS_REPLY_INTEGER ? ex->integer == 1 : capstan__reply_error(r, ex, "EXISTS", err);
    freeReplyObject(ex);
    return rc;
}

/* Judges identity id's list, found by a pass: its owner alive, it is left
 * alone; otherwise taken or marked a suspect (recover_list). registered: id
 * was read from the fast pass's set, which it leaves once its owner is
 * dead and its list gone (it comes back with the owner's next liveness
 * key, should it live after all). */
static int judge(capstan_redis_t *r, const char *id, int registered, long long grace_ms, int max_recoveries,
                 capstan_ts_format_t ts, int layouts, capstan_recovery_t *out, char *err)
{
    /* The script checks liveness again; this only spares reading the
     * lists of live owners. */
    int alive = exists(r, CAPSTAN_KEY_HEARTBEAT, id, err);
    if (alive != 0)
        return alive < 0 ? alive : 0;
    if (registered) {
        int listed = exists(r, CAPSTAN_KEY_WORKING, id, err);
        if (listed < 0)
            return listed;
        if (!listed) {
            freeReplyObject(capstan_redis_cmdf(r, "SREM %s %s", CAPSTAN_KEY_WORKING_SET, id));
            return 0;
        }
    }
    return recover_list(r, id, grace_ms, max_recoveries, ts, layouts, NULL, out, err);
}

int capstan__fetch_recover(capstan_redis_t *r, const char *own_identity, int max_recoveries,
                           double liveness_ttl, capstan_ts_format_t ts, int layouts,
                           capstan_recovery_t *out, char *err)
{
    memset(out, 0, sizeof(*out));
    long long grace_ms = grace_of(liveness_ttl);
    size_t plen = strlen(CAPSTAN_KEY_WORKING);
    capstan_scan_t scan;
    const redisReply *keys;
    int rc = 0, more;
    capstan__scan_init(&scan, r, NULL, CAPSTAN_KEY_WORKING "*", 200);
    while (rc == 0 && (more = capstan__scan_next(&scan, &keys, err)) != 0) {
        if (more < 0) {
            rc = more;
            break;
        }
        for (size_t i = 0; i < keys->elements && rc == 0; i++) {
            const redisReply *k = keys->element[i];
            if (k->type != REDIS_REPLY_STRING || k->len <= plen)
                continue;
            const char *id = k->str + plen;
            if (!own_identity || strcmp(id, own_identity) != 0)
                rc = judge(r, id, 0, grace_ms, max_recoveries, ts, layouts, out, err);
        }
    }
    capstan__scan_close(&scan);
    return rc;
}

int capstan__fetch_recover_full_due(capstan_redis_t *r, long pass)
{
    if (pass % CAPSTAN_FULL_PASS_EVERY == 0)
        return 1;
    redisReply *n = capstan_redis_cmdf(r, "DBSIZE");
    int small = n && n->type == REDIS_REPLY_INTEGER && n->integer <= CAPSTAN_SMALL_KEYSPACE;
    freeReplyObject(n);
    return small;
}

int capstan__fetch_recover_known(capstan_redis_t *r, const char *own_identity, int max_recoveries,
                                 double liveness_ttl, capstan_ts_format_t ts, int layouts,
                                 capstan_recovery_t *out, char *err)
{
    memset(out, 0, sizeof(*out));
    long long grace_ms = grace_of(liveness_ttl);
    redisReply *ids = capstan_redis_cmdf(r, "SMEMBERS %s", CAPSTAN_KEY_WORKING_SET);
    if (!ids || ids->type != REDIS_REPLY_ARRAY) {
        int rc = capstan__reply_error(r, ids, "SMEMBERS", err);
        freeReplyObject(ids);
        return rc ? rc : CAPSTAN_EREDIS;
    }
    int rc = 0;
    for (size_t i = 0; i < ids->elements && rc == 0; i++) {
        const redisReply *k = ids->element[i];
        if (k->type == REDIS_REPLY_STRING && (!own_identity || strcmp(k->str, own_identity) != 0))
            rc = judge(r, k->str, 1, grace_ms, max_recoveries, ts, layouts, out, err);
    }
    freeReplyObject(ids);
    return rc;
}

/* Orders listings by identity, so `capstan stats` prints a stable table. */
static int cmp_info(const void *a, const void *b)
{
    return strcmp(((const capstan_working_info_t *)a)->identity,
                  ((const capstan_working_info_t *)b)->identity);
}

void capstan__fetch_working_info_free(capstan_working_info_t *info, size_t n)
{
    if (!info)
        return;
    for (size_t i = 0; i < n; i++)
        free(info[i].identity);
    free(info);
}

/* Appends the identity of every working-list key in keys to *v (SCAN may
 * return a key twice; duplicates are removed after sorting). */
static int collect(const redisReply *keys, capstan_working_info_t **v, size_t *n, size_t *cap)
{
    size_t plen = strlen(CAPSTAN_KEY_WORKING);
    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= plen)
            continue;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 16;
            capstan_working_info_t *nv = realloc(*v, nc * sizeof(*nv));
            if (!nv)
                return CAPSTAN_ENOMEM;
            *v = nv;
            *cap = nc;
        }
        capstan_working_info_t *e = &(*v)[*n];
        memset(e, 0, sizeof(*e));
        if (!(e->identity = strndup(k->str + plen, k->len - plen)))
            return CAPSTAN_ENOMEM;
        (*n)++;
    }
    return 0;
}

int capstan__fetch_list_working(capstan_redis_t *r, capstan_working_info_t **out, size_t *nout, char *err)
{
    capstan_working_info_t *v = NULL;
    size_t n = 0, cap = 0, kept = 0;
    capstan_scan_t scan;
    const redisReply *page;
    int rc;
    capstan__scan_init(&scan, r, NULL, CAPSTAN_KEY_WORKING "*", 200);
    while ((rc = capstan__scan_next(&scan, &page, err)) > 0)
        if ((rc = collect(page, &v, &n, &cap)) != 0) {
            capstan_seterr(err, rc, "out of memory");
            break;
        }
    capstan__scan_close(&scan);
    if (rc)
        goto out;
    if (n)
        qsort(v, n, sizeof(*v), cmp_info);
    for (size_t i = 0; i < n; i++) {
        if (kept && strcmp(v[kept - 1].identity, v[i].identity) == 0) {
            free(v[i].identity);
            continue;
        }
        v[kept++] = v[i];
    }
    n = kept;
    /* One round trip for all of them: LLEN and PTTL per identity. */
    for (size_t i = 0; i < n && rc == 0; i++) {
        char wkey[512], lkey[512];
        capstan__fetch_working_key(v[i].identity, wkey, sizeof(wkey));
        capstan__fetch_liveness_key(v[i].identity, lkey, sizeof(lkey));
        const char *llen[] = { "LLEN", wkey }, *pttl[] = { "PTTL", lkey };
        rc = capstan_redis_append(r, 2, llen, NULL);
        if (!rc)
            rc = capstan_redis_append(r, 2, pttl, NULL);
    }
    /* Every reply is read even after an odd one, so none is left for the
     * connection's next command. */
    for (size_t i = 0; i < n && rc != CAPSTAN_EREDIS; i++) {
        for (int k = 0; k < 2; k++) {
            redisReply *x = capstan_redis_get_reply(r);
            if (!x) {
                rc = CAPSTAN_EREDIS;
                break;
            }
            if (x->type != REDIS_REPLY_INTEGER)
                rc = rc ? rc : CAPSTAN_EREPLY;
            else if (k == 0)
                v[i].length = x->integer;
            else
                v[i].liveness_ms = x->integer;
            freeReplyObject(x);
        }
        v[i].alive = v[i].liveness_ms != -2;
        if (v[i].liveness_ms < -1)
            v[i].liveness_ms = 0;
    }
    if (rc) {
        capstan_seterr(err, rc, "listing working lists: %s",
                       rc == CAPSTAN_EREDIS ? capstan_redis_error(r) : "unexpected reply");
        goto out;
    }
    /* A list emptied since SCAN no longer exists: it has no jobs to show. */
    kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].length > 0)
            v[kept++] = v[i];
        else
            free(v[i].identity);
    }
    n = kept;
out:
    if (rc) {
        capstan__fetch_working_info_free(v, n);
        return rc;
    }
    *out = v;
    *nout = n;
    return 0;
}

/* Entries of our own working list seen unheld at the last pass, each with
 * the time it was first seen so. */
struct capstan_strays {
    char **payload;
    size_t *len;
    double *since;  /* capstan__mono() */
    size_t n;
};

capstan_strays_t *capstan__strays_new(void)
{
    return calloc(1, sizeof(capstan_strays_t));
}

static void strays_clear(capstan_strays_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->payload[i]);
    free(s->payload);
    free(s->len);
    free(s->since);
    memset(s, 0, sizeof(*s));
}

void capstan__strays_free(capstan_strays_t *s)
{
    if (!s)
        return;
    strays_clear(s);
    free(s);
}

/* When p was first seen unheld, or -1 if it was held (or absent) last pass. */
static double suspect_since(const capstan_strays_t *s, const char *p, size_t len)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->len[i] == len && memcmp(s->payload[i], p, len) == 0)
            return s->since[i];
    return -1;
}

/* Puts one stray back at the fetched end of its queue, only if it is still
 * in our list (requeue.lua), so a processor that gives it back at the same
 * moment cannot double it. Returns 1 when moved, 0 when gone, or CAPSTAN_E*
 * (CAPSTAN_EREPLY with *bad set when the queue key holds another type: the job
 * stays). */
static int give_back(capstan_redis_t *r, const char *wkey, const char *raw, size_t len, int *bad)
{
    capstan_jobject_t obj = {0};
    char *name = NULL;
    if (capstan__json_scan_object(raw, len, &obj, NULL) == 0) {
        const capstan_jmember_t *q = capstan__jobject_get(&obj, raw, "queue");
        name = q ? capstan__json_string_dup(raw + q->vstart, q->vlen) : NULL;
    }
    capstan__jobject_free(&obj);
    char *qkey = capstan__key_dup(CAPSTAN_KEY_QUEUE, name && *name ? name : "default");
    free(name);
    if (!qkey)
        return CAPSTAN_ENOMEM;
    const char *argv[] = { wkey, qkey, raw };
    size_t lens[] = { strlen(wkey), strlen(qkey), len };
    redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_REQUEUE, 2, 3, argv, lens);
    free(qkey);
    if (!rep)
        return CAPSTAN_EREDIS;
    int rc = rep->type == REDIS_REPLY_INTEGER && rep->integer >= 0 ? (int)rep->integer
                                                                   : CAPSTAN_EREPLY;
    *bad = rep->type == REDIS_REPLY_INTEGER && rep->integer == -1;
    freeReplyObject(rep);
    return rc;
}

int capstan__fetch_reclaim(capstan_redis_t *r, const char *identity, capstan_strays_t *st, double min_age,
                           capstan_fetch_held_fn held, void *udata, long *reclaimed, char *err)
{
    char wkey[512];
    capstan__fetch_working_key(identity, wkey, sizeof(wkey));
    *reclaimed = 0;
    double asked = capstan__mono();
    redisReply *list = capstan_redis_cmdf(r, "LRANGE %s 0 -1", wkey);
    capstan_strays_t next = {0};
    int rc = 0;
    if (!list || list->type != REDIS_REPLY_ARRAY) {
        rc = lrange_error(r, list, wkey, err);
        goto out;
    }
    double now = capstan__mono();
    if (list->elements) {
        next.payload = calloc(list->elements, sizeof(char *));
        next.len = calloc(list->elements, sizeof(size_t));
        next.since = calloc(list->elements, sizeof(double));
        if (!next.payload || !next.len || !next.since) {
            rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            goto out;
        }
    }
    /* Left (newest) end first, as in recovery: the oldest is pushed last and
     * so is fetched first. */
    for (size_t i = 0; i < list->elements && rc == 0; i++) {
        const redisReply *e = list->element[i];
        if (e->type != REDIS_REPLY_STRING)
            continue;
        /* Only a job unheld at every pass for min_age is a stray. */
        double since = suspect_since(st, e->str, e->len);
        int h = held(e->str, e->len, since, udata);
        if (h == 1)
            continue;
        if (h == 0 && since >= 0 && now - since >= min_age) {
            int bad = 0, moved = give_back(r, wkey, e->str, e->len, &bad);
            if (moved >= 0) {
                *reclaimed += moved;
                continue;
            }
            if (!bad) {
                rc = capstan_seterr(err, moved, "giving back a job of %s: %s", wkey,
                                    moved == CAPSTAN_EREDIS ? capstan_redis_error(r) : "unexpected reply");
                continue;
            }
            /* Its queue key holds another type: it stays, and is tried
             * again at the next pass. */
        }
        if (!(next.payload[next.n] = malloc(e->len ? e->len : 1))) {
            rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            break;
        }
        memcpy(next.payload[next.n], e->str, e->len);
        next.len[next.n] = e->len;
        next.since[next.n++] = since >= 0 ? since : asked;
    }
    if (rc == 0) {
        strays_clear(st);
        *st = next;
        memset(&next, 0, sizeof(next));
    }
out:
    strays_clear(&next);
    freeReplyObject(list);
    return rc;
}
