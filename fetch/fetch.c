/* Reliable (LMOVE into a working list) and basic (BRPOP) fetch, ack and
 * requeue. See include/kiq/fetch.h. */
#include "kiq/fetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/timeutil.h"

struct kiq_fetch {
    kiq_fetch_mode_t mode;
    int strict, index;
    double block_timeout;
    size_t nq;
    char **names;        /* queue names, configured order */
    char **keys;         /* "queue:NAME", configured order */
    int *weights;
    size_t nexp;         /* weighted expansion length */
    size_t *order;       /* scratch: queue indexes in this fetch's order */
    size_t *expanded;    /* scratch: weighted expansion */
    char working[512];
    char timeout_s[32];
};

void kiq_fetch_working_key(const char *identity, char *out, size_t n)
{
    snprintf(out, n, "uniquejobs:working:%s", identity);
}

void kiq_fetch_liveness_key(const char *identity, char *out, size_t n)
{
    snprintf(out, n, "uniquejobs:heartbeat:%s", identity);
}

void kiq_fetch_free(kiq_fetch_t *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->nq; i++) {
        free(f->names[i]);
        free(f->keys[i]);
    }
    free(f->names);
    free(f->keys);
    free(f->weights);
    free(f->order);
    free(f->expanded);
    free(f);
}

kiq_fetch_t *kiq_fetch_new(const kiq_fetch_conf_t *c, char *err)
{
    if (!c->nqueues || !c->identity) {
        kiq_seterr(err, KIQ_EINVAL, "fetch needs an identity and at least one queue");
        return NULL;
    }
    kiq_fetch_t *f = calloc(1, sizeof(*f));
    if (!f)
        goto nomem;
    f->mode = c->mode;
    f->strict = c->strict;
    f->index = c->index;
    f->block_timeout = c->block_timeout > 0 ? c->block_timeout : 1.0;
    f->nq = c->nqueues;
    f->names = calloc(f->nq, sizeof(char *));
    f->keys = calloc(f->nq, sizeof(char *));
    f->weights = calloc(f->nq, sizeof(int));
    f->order = calloc(f->nq, sizeof(size_t));
    if (!f->names || !f->keys || !f->weights || !f->order)
        goto nomem;
    for (size_t i = 0; i < f->nq; i++) {
        int w = c->queues[i].weight > 0 ? c->queues[i].weight : 1;
        f->weights[i] = w;
        f->nexp += (size_t)w;
        f->names[i] = strdup(c->queues[i].name);
        f->keys[i] = malloc(strlen(c->queues[i].name) + 7);
        if (!f->names[i] || !f->keys[i])
            goto nomem;
        sprintf(f->keys[i], "queue:%s", c->queues[i].name);
    }
    f->expanded = calloc(f->nexp, sizeof(size_t));
    if (!f->expanded)
        goto nomem;
    kiq_fetch_working_key(c->identity, f->working, sizeof(f->working));
    snprintf(f->timeout_s, sizeof(f->timeout_s), "%.3f", f->block_timeout);
    return f;
nomem:
    kiq_fetch_free(f);
    kiq_seterr(err, KIQ_ENOMEM, "out of memory");
    return NULL;
}

/* Fills f->order for this fetch: the configured order when strict, else
 * Sidekiq's rule: shuffle the weight-expanded list, keep first occurrences,
 * so a queue of weight w leads with probability w / total. */
static void plan_order(kiq_fetch_t *f)
{
    if (f->strict || f->nq == 1) {
        for (size_t i = 0; i < f->nq; i++)
            f->order[i] = i;
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < f->nq; i++)
        for (int w = 0; w < f->weights[i]; w++)
            f->expanded[k++] = i;
    for (size_t i = f->nexp; i > 1; i--) {
        size_t j = (size_t)(kiq_rand() * (double)i);
        size_t t = f->expanded[i - 1];
        f->expanded[i - 1] = f->expanded[j];
        f->expanded[j] = t;
    }
    size_t n = 0;
    for (size_t i = 0; i < f->nexp && n < f->nq; i++) {
        size_t q = f->expanded[i], seen = 0;
        for (size_t j = 0; j < n && !seen; j++)
            seen = f->order[j] == q;
        if (!seen)
            f->order[n++] = q;
    }
}

static int take(kiq_fetch_t *f, const redisReply *payload, size_t qi, kiq_fetched_t *out)
{
    out->payload = malloc(payload->len + 1);
    if (!out->payload)
        return KIQ_ENOMEM;
    memcpy(out->payload, payload->str, payload->len);
    out->payload[payload->len] = '\0';
    out->len = payload->len;
    out->queue = f->names[qi];
    return 1;
}

static size_t queue_of_key(const kiq_fetch_t *f, const char *key)
{
    for (size_t i = 0; i < f->nq; i++)
        if (strcmp(f->keys[i], key) == 0)
            return i;
    return 0;
}

static int fetch_basic(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out)
{
    const char *argv[f->nq + 2];
    argv[0] = "BRPOP";
    for (size_t i = 0; i < f->nq; i++)
        argv[1 + i] = f->keys[f->order[i]];
    argv[f->nq + 1] = f->timeout_s;
    redisReply *rep = kiq_redis_cmd(r, (int)f->nq + 2, argv, NULL);
    if (!rep)
        return KIQ_EREDIS;
    int rc = 0;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
        rc = take(f, rep->element[1], queue_of_key(f, rep->element[0]->str), out);
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = KIQ_EREPLY;
    freeReplyObject(rep);
    return rc;
}

/* The reliable fetch's first command: with several queues, one script that
 * tries them all in order; with one queue, the blocking move itself. */
static int append_fetch(kiq_fetch_t *f, kiq_redis_t *r)
{
    if (f->nq == 1) {
        const char *argv[] = { "BLMOVE", f->keys[0], f->working, "RIGHT", "LEFT", f->timeout_s };
        return kiq_redis_append(r, 6, argv, NULL);
    }
    const char *argv[f->nq + 1];
    for (size_t i = 0; i < f->nq; i++)
        argv[i] = f->keys[f->order[i]];
    argv[f->nq] = f->working;
    return kiq_redis_append_script(r, KIQ_SCRIPT_FETCH, (int)f->nq + 1, (int)f->nq + 1, argv, NULL);
}

/* Reads what append_fetch asked for. Returns 1 with a job, 0 for none,
 * KIQ_EREDIS or KIQ_EREPLY. */
static int read_fetch(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out)
{
    redisReply *rep = kiq_redis_get_reply(r);
    int rc = 0;
    if (!rep)
        return KIQ_EREDIS;
    if (rep->type == REDIS_REPLY_ERROR)
        rc = KIQ_EREPLY;
    else if (f->nq == 1 && rep->type == REDIS_REPLY_STRING)
        rc = take(f, rep, 0, out);
    else if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2
             && rep->element[0]->type == REDIS_REPLY_INTEGER) {
        long long i = rep->element[0]->integer;
        if (i >= 1 && (size_t)i <= f->nq)
            rc = take(f, rep->element[1], f->order[i - 1], out);
    }
    freeReplyObject(rep);
    return rc;
}

/* Every queue was empty: block on one of them rather than poll. Idle
 * processors spread over the queues (by index), so a job pushed to any
 * queue wakes one of them at once while there are at least as many
 * processors as queues. */
static int fetch_block(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out)
{
    size_t qi = (size_t)f->index % f->nq;
    const char *argv[] = { "BLMOVE", f->keys[qi], f->working, "RIGHT", "LEFT", f->timeout_s };
    redisReply *rep = kiq_redis_cmd(r, 6, argv, NULL);
    int rc = 0;
    if (!rep)
        return KIQ_EREDIS;
    if (rep->type == REDIS_REPLY_STRING)
        rc = take(f, rep, qi, out);
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = KIQ_EREPLY;
    freeReplyObject(rep);
    return rc;
}

/* The sweep (or, with one queue, the blocking move) whose command was
 * already appended, then the block when the sweep found nothing. */
static int finish_fetch(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out)
{
    int rc = read_fetch(f, r, out);
    if (rc || f->nq == 1)
        return rc;
    return fetch_block(f, r, out);
}

static int fetch_reliable(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out)
{
    int rc = append_fetch(f, r);
    return rc ? rc : finish_fetch(f, r, out);
}

int kiq_fetch_next(kiq_fetch_t *f, kiq_redis_t *r, kiq_fetched_t *out)
{
    memset(out, 0, sizeof(*out));
    plan_order(f);
    int rc = f->mode == KIQ_FETCH_BASIC ? fetch_basic(f, r, out) : fetch_reliable(f, r, out);
    return rc == KIQ_EREPLY ? KIQ_EREDIS : rc;
}

/* Appends the ack of one job. A success without a lock to release needs
 * no script: LREM alone, the cheapest command that is still guarded (a job
 * requeued or recovered meanwhile is simply not there). Sets *sent to 0
 * when nothing had to be sent. */
static int append_ack(kiq_fetch_t *f, kiq_redis_t *r, const char *raw, size_t len,
                      const kiq_ack_t *ack, int *sent)
{
    static const char *modes[] = { "ok", "retry", "dead", "drop", "retry" };
    static const char *sets[] = { "retry", "retry", "dead", "retry", "schedule" };
    int basic = f->mode == KIQ_FETCH_BASIC;
    int lock = ack->lock_key && ack->lock_jid;
    int plain = ack->kind == KIQ_ACK_OK || ack->kind == KIQ_ACK_DROP;
    *sent = 0;
    if (basic && !lock && plain)
        return 0; /* BRPOP already took it; nothing to write */
    *sent = 1;
    if (!basic && !lock && plain) {
        const char *argv[] = { "LREM", f->working, "1", raw };
        size_t lens[] = { 4, strlen(f->working), 1, len };
        return kiq_redis_append(r, 4, argv, lens);
    }
    char score[32], cutoff[32], max[32];
    snprintf(score, sizeof(score), "%.6f", ack->score);
    snprintf(cutoff, sizeof(cutoff), "%.6f", ack->dead_cutoff);
    snprintf(max, sizeof(max), "%ld", ack->dead_max > 0 ? ack->dead_max : 10000);
    const char *argv[] = { basic ? "" : f->working, sets[ack->kind],
                           lock ? ack->lock_key : NULL, lock ? "uniquejobs:digests" : NULL,
                           raw, modes[ack->kind], score,
                           ack->payload ? ack->payload : "", cutoff, max,
                           lock ? ack->lock_jid : NULL };
    size_t lens[] = { strlen(argv[0]), strlen(argv[1]), lock ? strlen(argv[2]) : 0,
                      lock ? strlen(argv[3]) : 0, len, strlen(argv[5]), strlen(score),
                      ack->payload ? ack->len : 0, strlen(cutoff), strlen(max),
                      lock ? strlen(argv[10]) : 0 };
    if (lock)
        return kiq_redis_append_script(r, KIQ_SCRIPT_ACK, 4, 11, argv, lens);
    /* Without a lock the script gets its original two keys. */
    const char *a2[] = { argv[0], argv[1], argv[4], argv[5], argv[6], argv[7], argv[8], argv[9] };
    size_t l2[] = { lens[0], lens[1], lens[4], lens[5], lens[6], lens[7], lens[8], lens[9] };
    return kiq_redis_append_script(r, KIQ_SCRIPT_ACK, 2, 8, a2, l2);
}

static int read_ack(kiq_redis_t *r)
{
    redisReply *rep = kiq_redis_get_reply(r);
    if (!rep)
        return KIQ_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR ? KIQ_EREDIS : 0;
    freeReplyObject(rep);
    return rc;
}

int kiq_fetch_ack(kiq_fetch_t *f, kiq_redis_t *r, const char *raw, size_t len,
                  const kiq_ack_t *ack)
{
    int sent, rc = append_ack(f, r, raw, len, ack, &sent);
    if (rc || !sent)
        return rc ? KIQ_EREDIS : 0;
    return read_ack(r);
}

int kiq_fetch_ack_next(kiq_fetch_t *f, kiq_redis_t *r, const char *raw, size_t len,
                       const kiq_ack_t *ack, int *ack_rc, kiq_fetched_t *out)
{
    memset(out, 0, sizeof(*out));
    if (f->mode == KIQ_FETCH_BASIC) {
        *ack_rc = kiq_fetch_ack(f, r, raw, len, ack);
        return *ack_rc ? KIQ_EREDIS : kiq_fetch_next(f, r, out);
    }
    plan_order(f);
    int sent;
    *ack_rc = append_ack(f, r, raw, len, ack, &sent) ? KIQ_EREDIS : 0;
    if (*ack_rc)
        return KIQ_EREDIS;
    if (append_fetch(f, r)) {
        *ack_rc = KIQ_EREDIS;
        return KIQ_EREDIS;
    }
    /* A failed ack (an error reply) leaves the job in the working list for
     * the caller to ack again; the fetch behind it still counts. */
    if (sent)
        *ack_rc = read_ack(r);
    int rc = finish_fetch(f, r, out);
    return rc == KIQ_EREPLY ? KIQ_EREDIS : rc;
}

int kiq_fetch_requeue(kiq_fetch_t *f, kiq_redis_t *r, const char *queue,
                      const char *raw, size_t len)
{
    char key[512];
    snprintf(key, sizeof(key), "queue:%s", queue);
    redisReply *rep;
    if (f->mode == KIQ_FETCH_BASIC) {
        const char *argv[] = { "RPUSH", key, raw };
        size_t lens[] = { 5, strlen(key), len };
        rep = kiq_redis_cmd(r, 3, argv, lens);
    } else {
        const char *argv[] = { f->working, key, raw };
        size_t lens[] = { strlen(f->working), strlen(key), len };
        rep = kiq_redis_script(r, KIQ_SCRIPT_REQUEUE, 2, 3, argv, lens);
    }
    if (!rep)
        return KIQ_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR ? KIQ_EREDIS : 0;
    freeReplyObject(rep);
    return rc;
}

int kiq_fetch_heartbeat(kiq_redis_t *r, const char *identity, double ttl)
{
    char key[512];
    kiq_fetch_liveness_key(identity, key, sizeof(key));
    /* PX, so a sub-second TTL is not rounded to 0 (an error) or down. */
    long long ms = (long long)(ttl * 1000.0);
    redisReply *rep = kiq_redis_cmdf(r, "SET %s 1 PX %lld", key, ms > 0 ? ms : 1);
    if (!rep)
        return KIQ_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR ? KIQ_EREDIS : 0;
    freeReplyObject(rep);
    return rc;
}
