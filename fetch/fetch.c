/* What the two fetch strategies share: the fetcher, the order of its
 * queues, paused queues, one ack's command and reply, and the entry points
 * of fetch/fetch.h, which go through the fetcher's table (the strategies
 * are reliable.c and basic.c). */
#include "fetch/fetch_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "feed/feed.h"
#include "locks/limiter_internal.h"
#include "locks/queue_limit.h"
#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/wake.h"
#include "support/fmt.h"
#include "support/log.h"
#include "support/time.h"

unsigned long capstan__fetch_answered(capstan_fetch_t *f)
{
    return atomic_load(&f->answered);
}

void capstan__fetch_working_key(const char *identity, char *out, size_t n)
{
    capstan__key(out, n, CAPSTAN_KEY_WORKING, identity);
}

void capstan__fetch_free(capstan_fetch_t *f)
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
    free(f->caps);
    free(f);
}

capstan_fetch_t *capstan__fetch_new(const capstan_fetch_conf_t *c, char *err)
{
    if (!c->nqueues || !c->identity || !c->ops) {
        capstan_seterr(err, CAPSTAN_EINVAL, "fetch needs a strategy, an identity and at least one queue");
        return NULL;
    }
    capstan_fetch_t *f = calloc(1, sizeof(*f));
    if (!f)
        goto nomem;
    f->ops = c->ops;
    f->strict = c->strict;
    f->index = c->index;
    f->block_timeout = c->block_timeout > 0 ? c->block_timeout : 1.0;
    f->min_replicas = c->min_replicas;
    f->paused = c->paused;
    f->liveness = c->liveness;
    f->nact = c->nqueues;
    snprintf(f->wait_args[0], sizeof(f->wait_args[0]), "%d", c->min_replicas);
    snprintf(f->wait_args[1], sizeof(f->wait_args[1]), "%ld",
             c->min_replicas_timeout > 0 ? c->min_replicas_timeout : 1000);
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
        f->keys[i] = capstan__key_dup(CAPSTAN_KEY_QUEUE, c->queues[i].name);
        if (!f->names[i] || !f->keys[i])
            goto nomem;
    }
    f->expanded = calloc(f->nexp, sizeof(size_t));
    if (!f->expanded)
        goto nomem;
    for (size_t i = 0; c->limits && i < f->nq; i++) {
        const capstan__qlimit_t *q = capstan__qlimits_find(c->limits, f->names[i]);
        if (q && !f->caps && !(f->caps = calloc(f->nq, sizeof(*f->caps))))
            goto nomem;
        if (q)
            f->caps[i] = q;
    }
    snprintf(f->lease_ms, sizeof(f->lease_ms), "%.0f", CAPSTAN__QLIMIT_LEASE * 1000);
    capstan__fetch_working_key(c->identity, f->working, sizeof(f->working));
    snprintf(f->timeout_s, sizeof(f->timeout_s), "%.3f", f->block_timeout);
    return f;
nomem:
    capstan__fetch_free(f);
    capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    return NULL;
}

/* Leaves the paused queues out of f->order[0..nq), keeping the order of
 * the others, and sets f->nact to their number. */
static void skip_paused(capstan_fetch_t *f)
{
    size_t n = 0;
    for (size_t i = 0; i < f->nq; i++)
        if (!capstan__paused_is(f->paused, f->order[i]))
            f->order[n++] = f->order[i];
    f->nact = n;
}

/* f->order for this fetch: the configured order when strict, else
 * Sidekiq's rule: shuffle the weight-expanded list, keep first occurrences,
 * so a queue of weight w leads with probability w / total. Paused queues
 * are then left out (skip_paused). */
void capstan__fetch_plan_order(capstan_fetch_t *f)
{
    if (f->strict || f->nq == 1) {
        for (size_t i = 0; i < f->nq; i++)
            f->order[i] = i;
        skip_paused(f);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < f->nq; i++)
        for (int w = 0; w < f->weights[i]; w++)
            f->expanded[k++] = i;
    for (size_t i = f->nexp; i > 1; i--) {
        size_t j = (size_t)(capstan__rand() * (double)i);
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
    skip_paused(f);
}

void capstan__fetched_clear(capstan_fetched_t *j)
{
    free(j->payload);
    free(j->held_digest);
    free(j->held_jid);
    memset(j, 0, sizeof(*j));
}

/* Whether the job's lock is one the sweep's check of held locks does not
 * serve (fetch.lua: a runtime lock is never held by a job being fetched),
 * by plain search: a payload whose args say so too is at worst checked. */
static int runtime_only(const char *payload, size_t len)
{
    const char *v = memmem(payload, len, "\"lock\":\"", 8);
    if (!v)
        return 0;
    v += 8;
    const char *q = memchr(v, '"', len - (size_t)(v - payload));
    return q && memmem(v, (size_t)(q - v), "while_executing", 15);
}

/* Takes the payload string out of the reply (hiredis allocates it with
 * malloc, NUL-terminated, and frees a NULL one as nothing): no copy. */
int capstan__fetch_take(capstan_fetch_t *f, redisReply *payload, size_t qi, capstan_fetched_t *out)
{
    memset(out, 0, sizeof(*out));
    out->payload = payload->str;
    out->len = payload->len;
    payload->str = NULL;
    out->queue = f->names[qi];
    /* By its 'k', which a usual payload's keys and hex jid lack. */
    static const char key[] = "\"lock_digest\"";
    f->locks_seen = capstan__feed_find(out->payload, out->len, key, sizeof(key) - 1, 4) != NULL;
    if (f->locks_seen && !runtime_only(out->payload, out->len))
        atomic_store_explicit(&f->plain_run, 0, memory_order_relaxed);
    else if (atomic_load_explicit(&f->plain_run, memory_order_relaxed) < 1000)
        atomic_fetch_add_explicit(&f->plain_run, 1, memory_order_relaxed);
    return 1;
}

/* A blocking fetch waits up to the block timeout, and its queue may be
 * paused meanwhile. Should the give-back fail, the reliable fetch's job
 * stays in the working list, where the stray check finds it; the basic
 * fetch's, which exists nowhere else, runs rather than be lost (keep). */
int capstan__fetch_give_back_paused(capstan_fetch_t *f, capstan_redis_t *r, size_t qi, capstan_fetched_t *out,
                                    int keep)
{
    if (!capstan__paused_is(f->paused, qi))
        return 1;
    if (capstan__fetch_requeue(f, r, f->names[qi], out->payload, out->len) != 0 && keep)
        return 1;
    capstan__fetched_clear(out);
    return 0;
}

int capstan__fetch_append_capped(capstan_fetch_t *f, capstan_redis_t *r, size_t max)
{
    /* KEYS: the queues, the working list, each queue's two held zsets;
     * ARGV: max, "1", the queues' number, the lease, each queue's two
     * sizes. A cap a queue lacks has size 0 and the working list for its
     * key, never touched. */
    size_t nq = f->nact, nkeys = 3 * nq + 1, argc = nkeys + 4 + 2 * nq;
    const char **argv = malloc(argc * sizeof(*argv));
    char (*num)[CAPSTAN_FMT_INT] = malloc((2 * nq + 2) * sizeof(*num));
    int rc = CAPSTAN_EREDIS;
    if (!argv || !num)
        goto out;
    capstan__fmt_uint(num[0], max);
    capstan__fmt_uint(num[1], nq);
    size_t a = nkeys;
    argv[nq] = f->working;
    argv[a++] = num[0];
    argv[a++] = "1";
    argv[a++] = num[1];
    argv[a++] = f->lease_ms;
    for (size_t i = 0; i < nq; i++) {
        const capstan__qlimit_t *q = f->caps[f->order[i]];
        argv[i] = f->keys[f->order[i]];
        for (int k = 0; k < 2; k++) {
            capstan_limiter_t *lim = q ? q->lim[k] : NULL;
            char *n = num[2 + 2 * i + (size_t)k];
            capstan__fmt_uint(n, lim ? (size_t)capstan__limiter_size(lim) : 0);
            argv[nq + 1 + 2 * i + (size_t)k] = lim ? capstan__limiter_held_key(lim) : f->working;
            argv[nkeys + 4 + 2 * i + (size_t)k] = n;
        }
    }
    rc = capstan__redis_append_script(r, CAPSTAN_SCRIPT_FETCH, (int)nkeys, (int)argc, argv, NULL)
             ? CAPSTAN_EREDIS : 0;
out:
    free(argv);
    free(num);
    return rc;
}

int capstan__fetch_cap_full(const capstan_fetch_t *f, capstan_redis_t *r, size_t qi)
{
    /* ZCARD counts lapsed leases too, which the next sweep clears: at
     * worst a wait of a block timeout too many. */
    for (int k = 0; k < 2; k++) {
        capstan_limiter_t *lim = f->caps[qi]->lim[k];
        redisReply *rep = lim ? capstan_redis_cmdf(r, "ZCARD %s", capstan__limiter_held_key(lim)) : NULL;
        int full = lim && (!rep || rep->type != REDIS_REPLY_INTEGER
                           || rep->integer >= capstan__limiter_size(lim));
        freeReplyObject(rep);
        if (full)
            return 1;
    }
    return 0;
}

int capstan__fetch_wait_cap(const capstan_fetch_t *f, capstan_redis_t *r, size_t qi)
{
    const capstan__qlimit_t *q = f->caps[qi];
    capstan_limiter_t *lim = q->lim[0] ? q->lim[0] : q->lim[1];
    /* Every release pushes to the list (limit_release.lua). */
    capstan__redis_wait_wake(r, capstan__limiter_free_key(lim), f->block_timeout, 0.05);
    return 0;
}

int capstan__fetch_take_cap(capstan_fetch_t *f, capstan_redis_t *r, size_t qi, capstan_fetched_t *out)
{
    capstan_limit_token_t tok[2] = { { { 0 } }, { { 0 } } };
    const char *j = memmem(out->payload, out->len, "\"jid\":\"", 7), *end = NULL;
    if (j && (end = memchr(j + 7, '"', out->len - (size_t)(j + 7 - out->payload))))
        for (int k = 0; k < 2; k++)
            snprintf(tok[k].id, sizeof(tok[k].id), "%s%.*s", CAPSTAN__QLIMIT_HOLDER,
                     (int)(end - j - 7), j + 7);
    char err[CAPSTAN_ERRLEN];
    for (int k = 0; k < 2; k++) {
        capstan_limiter_t *lim = f->caps[qi]->lim[k];
        if (!lim || capstan__limiter_take(lim, r, &tok[k], err) != 0)
            continue; /* taken, or an error: the middleware tries again */
        if (k == 1 && f->caps[qi]->lim[0])
            capstan__limiter_untake(f->caps[qi]->lim[0], r, &tok[0], err);
        if (capstan__fetch_requeue(f, r, f->names[qi], out->payload, out->len) != 0)
            return 1; /* it stays in the working list: run it, within the middleware's wait */
        capstan__fetched_clear(out);
        return 0;
    }
    return 1;
}

/* As a blocking fetch of empty queues would wait, so that processors do
 * not spin. */
int capstan__fetch_wait_paused(const capstan_fetch_t *f)
{
    capstan__sleep(f->block_timeout);
    return 0;
}

/* A success without a lock to release needs no script: LREM alone, the
 * cheapest command that is still guarded (a job requeued or recovered
 * meanwhile is simply not there); without a working list, nothing. */
int capstan__fetch_append_ack(capstan_redis_t *r, const char *working, const char *raw, size_t len,
                              const capstan_ack_t *ack, int *sent)
{
    static const char *modes[] = { "ok", "retry", "dead", "drop", "retry", "queue" };
    static const char *sets[] = { CAPSTAN_KEY_RETRY, CAPSTAN_KEY_RETRY, CAPSTAN_KEY_DEAD, CAPSTAN_KEY_RETRY,
                                  CAPSTAN_KEY_SCHEDULE, NULL };
    /* What the job's outcome is to its batch: a reschedule or a requeue is
     * none. */
    static const char *outcomes[] = { "s", "f", "d", "f", "", "" };
    /* A requeue's key is its queue's. */
    char qkey[512];
    if (ack->kind == CAPSTAN_ACK_REQUEUE)
        capstan__key(qkey, sizeof(qkey), CAPSTAN_KEY_QUEUE, ack->queue ? ack->queue : "default");
    const char *set = ack->kind == CAPSTAN_ACK_REQUEUE ? qkey : sets[ack->kind];
    int lock = ack->lock_key && ack->lock_jid;
    int batch = ack->bid && ack->lock_jid;
    int plain = (ack->kind == CAPSTAN_ACK_OK || ack->kind == CAPSTAN_ACK_DROP) && !batch;
    *sent = 0;
    if (!working && !lock && plain)
        return 0; /* BRPOP already took it; nothing to write */
    *sent = 1;
    if (working && !lock && plain) {
        /* From the tail: the oldest jobs, the ones finishing first, are
         * there (the fetch pushes on the left). */
        const char *argv[] = { "LREM", working, "-1", raw };
        size_t lens[] = { 4, strlen(working), 2, len };
        return capstan_redis_append(r, 4, argv, lens);
    }
    char score[32], cutoff[32], max[32];
    snprintf(score, sizeof(score), "%.6f", ack->score);
    snprintf(cutoff, sizeof(cutoff), "%.6f", ack->dead_cutoff);
    snprintf(max, sizeof(max), "%ld", ack->dead_max > 0 ? ack->dead_max : 10000);
    /* Every key the call touches is declared (Dragonfly, cluster proxies):
     * the working list and the set; with a lock, the lock hash and the
     * digests; with a batch, the batch's keys, though lib/batch_done.lua
     * names them itself; with a lock, last, its waiters' line and wake
     * list (lib/wake_waiters.lua). */
    char *owned[5] = { NULL };
    const char *argv[21];
    size_t lens[21];
    int argc = 0, rc = 0;
#define ARG(s, n) (argv[argc] = (s), lens[argc] = (n), argc++)
    ARG(working ? working : "", working ? strlen(working) : 0);
    ARG(set, strlen(set));
    if (lock || batch) {
        ARG(lock ? ack->lock_key : "", lock ? strlen(ack->lock_key) : 0);
        ARG(lock ? CAPSTAN_UNIQUE_DIGESTS : "", lock ? strlen(CAPSTAN_UNIQUE_DIGESTS) : 0);
    }
    if (batch) {
        if (!(owned[0] = capstan__key_dup(CAPSTAN_KEY_BATCH, ack->bid))
            || !(owned[1] = capstan__key_dup(owned[0], ":jids"))
            || !(owned[2] = capstan__key_dup(owned[0], ":failures"))) {
            rc = CAPSTAN_ENOMEM;
            goto out;
        }
        for (int k = 0; k < 3; k++)
            ARG(owned[k], strlen(owned[k]));
        ARG(CAPSTAN_KEY_BATCHES_OPEN, strlen(CAPSTAN_KEY_BATCHES_OPEN));
        ARG(CAPSTAN_KEY_QUEUES, strlen(CAPSTAN_KEY_QUEUES));
    }
    if (lock) {
        if (!(owned[3] = capstan__key_swap_dup(ack->lock_key, CAPSTAN_KEY_LOCKED, CAPSTAN_KEY_WAITING))
            || !(owned[4] = capstan__key_swap_dup(ack->lock_key, CAPSTAN_KEY_LOCKED, CAPSTAN_KEY_WAKE))) {
            rc = CAPSTAN_ENOMEM;
            goto out;
        }
        ARG(owned[3], strlen(owned[3]));
        ARG(owned[4], strlen(owned[4]));
    }
    int nkeys = argc;
    ARG(raw, len);
    ARG(modes[ack->kind], strlen(modes[ack->kind]));
    ARG(score, strlen(score));
    ARG(ack->payload ? ack->payload : "", ack->payload ? ack->len : 0);
    ARG(cutoff, strlen(cutoff));
    ARG(max, strlen(max));
    if (lock || batch)
        ARG(lock ? ack->lock_jid : "", lock ? strlen(ack->lock_jid) : 0);
    if (batch) {
        ARG(ack->bid, strlen(ack->bid));
        ARG(ack->lock_jid, strlen(ack->lock_jid));
        ARG(outcomes[ack->kind], strlen(outcomes[ack->kind]));
    }
#undef ARG
    rc = capstan__redis_append_script(r, CAPSTAN_SCRIPT_ACK, nkeys, argc, argv, lens);
out:
    for (int k = 0; k < 5; k++)
        free(owned[k]);
    return rc;
}

/* ack (may be NULL) is the ack the reply is for: a job whose bid names no
 * batch ran as a plain job, which is worth a warning. Of the jobs expected
 * in the working list (0 with the basic fetch), those it no longer found
 * are counted. */
int capstan__fetch_read_ack(capstan_redis_t *r, const capstan_ack_t *ack, long jobs)
{
    redisReply *rep = capstan_redis_get_reply(r);
    if (!rep)
        return CAPSTAN_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR ? CAPSTAN_EREPLY : 0;
    /* acks.lua answers {removed, flags, a bid naming no batch or ""}. */
    int many = rep->type == REDIS_REPLY_ARRAY && rep->elements == 3
               && rep->element[0]->type == REDIS_REPLY_INTEGER
               && rep->element[1]->type == REDIS_REPLY_INTEGER
               && rep->element[2]->type == REDIS_REPLY_STRING;
    /* ack.lua answers 0 when the job was gone, with or without a batch. */
    long found = many ? (long)rep->element[0]->integer
               : rep->type == REDIS_REPLY_INTEGER ? (rep->integer > 0) : jobs;
    if (jobs > found)
        capstan__metrics_add(capstan__metrics_here(), CAPSTAN_METRIC_LATE_ACKS, jobs - found);
    long long flags = many ? rep->element[1]->integer
                    : ack && ack->bid && rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;
    capstan__metrics_batch_fired(capstan__metrics_here(), flags);
    if (flags & 2)
        capstan_warn("jid=%s names batch %s, which does not exist (expired or deleted?); it ran "
                     "as a plain job", many ? "(one of several)" : ack->lock_jid,
                     many ? rep->element[2]->str : ack->bid);
    freeReplyObject(rep);
    return rc;
}
void capstan__fetch_reset(capstan_ack_item_t *acks, size_t nacks, capstan_script_call_t *calls, size_t ncalls,
                  capstan_fetched_t *out, size_t max)
{
    for (size_t i = 0; i < nacks; i++)
        acks[i].rc = CAPSTAN_EREDIS;
    for (size_t i = 0; i < max; i++)
        memset(&out[i], 0, sizeof(out[i]));
    for (size_t i = 0; i < ncalls; i++)
        calls[i].reply = NULL;
}

int capstan__fetch_ack(capstan_fetch_t *f, capstan_redis_t *r, const char *raw, size_t len,
                       const capstan_ack_t *ack)
{
    return f->ops->ack(f, r, raw, len, ack);
}

/* Once every reply of the round trip is read: a call refused with NOSCRIPT
 * runs again on its own (the connection loads the scripts first). */
static void retry_noscript(capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    for (size_t i = 0; i < ncalls; i++) {
        redisReply *rep = calls[i].reply;
        if (rep && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(rep);
            calls[i].reply = capstan__redis_script(r, calls[i].script, calls[i].nkeys,
                                                   calls[i].argc, calls[i].argv, NULL);
        }
    }
}

int capstan__fetch_exchange(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks, size_t nacks,
                            capstan_fetched_t *out, size_t max, int block)
{
    return capstan__fetch_exchange_calls(f, r, acks, nacks, NULL, 0, out, max, block);
}

int capstan__fetch_exchange_calls(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                  size_t nacks, capstan_script_call_t *calls, size_t ncalls,
                                  capstan_fetched_t *out, size_t max, int block)
{
    int rc = f->ops->exchange(f, r, acks, nacks, calls, ncalls, out, max, block);
    if (ncalls && capstan_redis_ok(r))
        retry_noscript(r, calls, ncalls);
    return rc;
}

capstan_exchange_t *capstan__fetch_send(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                        size_t nacks, size_t max, int *rc)
{
    return f->ops->send(f, r, acks, nacks, max, rc);
}

int capstan__fetch_next(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *out)
{
    return capstan__fetch_exchange(f, r, NULL, 0, out, 1, 1);
}

int capstan__fetch_requeue(capstan_fetch_t *f, capstan_redis_t *r, const char *queue,
                           const char *raw, size_t len)
{
    return capstan__fetch_requeue_n(f, r, queue, &raw, &len, 1);
}

int capstan__fetch_requeue_n(capstan_fetch_t *f, capstan_redis_t *r, const char *queue,
                             const char *const *raws, const size_t *lens, size_t n)
{
    char *key = capstan__key_dup(CAPSTAN_KEY_QUEUE, queue);
    const char **argv = malloc((n + 2) * sizeof(*argv));
    size_t *alens = malloc((n + 2) * sizeof(*alens));
    if (!key || !argv || !alens) {
        free(key);
        free(argv);
        free(alens);
        return CAPSTAN_ENOMEM;
    }
    /* Either way the last one given ends at the head of the queue. */
    argv[1] = key;
    alens[1] = strlen(key);
    memcpy(argv + 2, raws, n * sizeof(*argv));
    memcpy(alens + 2, lens, n * sizeof(*alens));
    redisReply *rep = f->ops->requeue(f, r, argv, alens, (int)n + 2);
    free(argv);
    free(alens);
    free(key);
    if (!rep)
        return CAPSTAN_EREDIS;
    int rc = rep->type == REDIS_REPLY_ERROR ? CAPSTAN_EREDIS : 0;
    if (rep->type == REDIS_REPLY_INTEGER && rep->integer < 0)
        rc = CAPSTAN_EREPLY; /* the queue key is not a list: the job stays */
    freeReplyObject(rep);
    return rc;
}
