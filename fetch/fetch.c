/* Reliable (LMOVE into a working list) and basic (BRPOP) fetch, ack and
 * requeue. See fetch/fetch.h. */
#include "fetch/fetch.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/scripts.h"
#include "support/fmt.h"
#include "support/log.h"
#include "support/time.h"

struct capstan_fetch {
    capstan_fetch_mode_t mode;
    int strict, index;
    double block_timeout;
    size_t nq;
    char **names;        /* queue names, configured order */
    char **keys;         /* "queue:NAME", configured order */
    int *weights;
    size_t nexp;         /* weighted expansion length */
    size_t *order;       /* scratch: queue indexes in this fetch's order,
                            the nact not paused */
    size_t nact;
    const capstan_paused_t *paused; /* borrowed, or NULL */
    capstan_liveness_t *liveness; /* borrowed, or NULL */
    size_t *expanded;    /* scratch: weighted expansion */
    char working[512];
    char timeout_s[32];
    int locks_seen;      /* the last job fetched carried a lock_digest */
    int min_replicas;    /* WAIT after acks for this many replicas; 0 = no WAIT */
    char wait_args[2][32];
    double wait_warned;  /* capstan__mono() of the last warning that WAIT fell short */
    atomic_ulong answered; /* fetches Redis answered without an error (atomic: a
                              deferred round trip may be read by another thread) */
};

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
    free(f);
}

capstan_fetch_t *capstan__fetch_new(const capstan_fetch_conf_t *c, char *err)
{
    if (!c->nqueues || !c->identity) {
        capstan_seterr(err, CAPSTAN_EINVAL, "fetch needs an identity and at least one queue");
        return NULL;
    }
    capstan_fetch_t *f = calloc(1, sizeof(*f));
    if (!f)
        goto nomem;
    f->mode = c->mode;
    f->strict = c->strict;
    f->index = c->index;
    f->block_timeout = c->block_timeout > 0 ? c->block_timeout : 1.0;
    f->min_replicas = c->min_replicas;
    f->paused = c->paused;
    f->liveness = c->mode == CAPSTAN_FETCH_RELIABLE ? c->liveness : NULL;
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

/* Fills f->order for this fetch: the configured order when strict, else
 * Sidekiq's rule: shuffle the weight-expanded list, keep first occurrences,
 * so a queue of weight w leads with probability w / total. Paused queues
 * are then left out (skip_paused). */
static void plan_order(capstan_fetch_t *f)
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

/* Takes the payload string out of the reply (hiredis allocates it with
 * malloc, NUL-terminated, and frees a NULL one as nothing): no copy. */
static int take(capstan_fetch_t *f, redisReply *payload, size_t qi, capstan_fetched_t *out)
{
    memset(out, 0, sizeof(*out));
    out->payload = payload->str;
    out->len = payload->len;
    payload->str = NULL;
    out->queue = f->names[qi];
    f->locks_seen = memmem(out->payload, out->len, "\"lock_digest\"", 13) != NULL;
    return 1;
}

/* The lock the fetch script saw held by the job's own jid (NULL when it
 * did not look or it was not held). */
static int take_hint(const redisReply *digest, const redisReply *jid, capstan_fetched_t *out)
{
    if (!digest || !jid || digest->type != REDIS_REPLY_STRING || jid->type != REDIS_REPLY_STRING
        || !digest->len || !jid->len)
        return 0;
    out->held_digest = strndup(digest->str, digest->len);
    out->held_jid = strndup(jid->str, jid->len);
    if (out->held_digest && out->held_jid)
        return 0;
    capstan__fetched_clear(out);
    return CAPSTAN_ENOMEM;
}

static size_t queue_of_key(const capstan_fetch_t *f, const char *key)
{
    for (size_t i = 0; i < f->nq; i++)
        if (strcmp(f->keys[i], key) == 0)
            return i;
    return 0;
}

/* A blocking fetch waits up to the block timeout, and its queue may be
 * paused meanwhile: then the job it got (out, from queue qi) goes back to
 * the fetched end of its queue. Returns 1 (keep it) or 0 (given back).
 * Should the give-back fail, the reliable fetch's job stays in the working
 * list, where the stray check finds it; the basic fetch's, which exists
 * nowhere else, runs rather than be lost. */
static int give_back_paused(capstan_fetch_t *f, capstan_redis_t *r, size_t qi, capstan_fetched_t *out)
{
    if (!capstan__paused_is(f->paused, qi))
        return 1;
    if (capstan__fetch_requeue(f, r, f->names[qi], out->payload, out->len) != 0
        && f->mode == CAPSTAN_FETCH_BASIC)
        return 1;
    capstan__fetched_clear(out);
    return 0;
}

/* Every queue is paused: wait as a blocking fetch of empty queues would,
 * so that processors do not spin. */
static int wait_paused(const capstan_fetch_t *f)
{
    capstan__sleep(f->block_timeout);
    return 0;
}

static int fetch_basic(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *out)
{
    if (!f->nact)
        return wait_paused(f);
    const char *argv[f->nact + 2];
    argv[0] = "BRPOP";
    for (size_t i = 0; i < f->nact; i++)
        argv[1 + i] = f->keys[f->order[i]];
    argv[f->nact + 1] = f->timeout_s;
    redisReply *rep = capstan_redis_cmd(r, (int)f->nact + 2, argv, NULL);
    if (!rep)
        return CAPSTAN_EREDIS;
    int rc = 0;
    size_t qi = 0;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
        rc = take(f, rep->element[1], qi = queue_of_key(f, rep->element[0]->str), out);
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = CAPSTAN_EREPLY;
    if (rep->type != REDIS_REPLY_ERROR)
        atomic_fetch_add(&f->answered, 1);
    freeReplyObject(rep);
    return rc == 1 ? give_back_paused(f, r, qi, out) : rc;
}

/* Whether the next fetch goes through the script: several queues, several
 * jobs, or jobs with locks (the script checks them on the way). With one
 * queue, one job and no locks the blocking move alone is cheapest. */
static int use_script(const capstan_fetch_t *f, size_t max)
{
    return f->nact > 1 || max > 1 || f->locks_seen;
}

/* Appends the move of the job at queue qi's head, blocking when block,
 * after a TIME: a move has no clock of its own to order its job among the
 * sweeps' (see read_sweep). The TIME runs just before the move, and a
 * blocked move is served as the job is pushed, before any sweep can take
 * it, so every sweep with a later clock takes a newer job. */
static int append_move(capstan_fetch_t *f, capstan_redis_t *r, size_t qi, int block)
{
    const char *now[] = { "TIME" };
    const char *argv[] = { block ? "BLMOVE" : "LMOVE", f->keys[qi], f->working, "RIGHT", "LEFT",
                           f->timeout_s };
    if (capstan_redis_append(r, 1, now, NULL))
        return CAPSTAN_EREDIS;
    return capstan_redis_append(r, block ? 6 : 5, argv, NULL);
}

/* Reads what append_move asked for into out (its seq from the TIME).
 * Returns 1 with a job, 0 without, CAPSTAN_EREDIS or CAPSTAN_EREPLY. */
static int read_move(capstan_fetch_t *f, capstan_redis_t *r, size_t qi, capstan_fetched_t *out)
{
    redisReply *t = capstan_redis_get_reply(r), *rep = t ? capstan_redis_get_reply(r) : NULL;
    int rc = 0;
    if (!rep)
        rc = CAPSTAN_EREDIS;
    else if (rep->type == REDIS_REPLY_ERROR || t->type != REDIS_REPLY_ARRAY || t->elements != 2
             || t->element[0]->type != REDIS_REPLY_STRING
             || t->element[1]->type != REDIS_REPLY_STRING)
        rc = CAPSTAN_EREPLY;
    else if (rep->type == REDIS_REPLY_STRING && (rc = take(f, rep, qi, out)) == 1)
        out->seq = (strtoull(t->element[0]->str, NULL, 10) * 1000000ULL
                    + strtoull(t->element[1]->str, NULL, 10)) * 128;
    if (rc != CAPSTAN_EREDIS && rc != CAPSTAN_EREPLY)
        atomic_fetch_add(&f->answered, 1);
    freeReplyObject(t);
    freeReplyObject(rep);
    return rc;
}

/* The reliable fetch's first command: the script that sweeps the queues in
 * order for up to max jobs, or the move itself (blocking when block). */
static int append_fetch(capstan_fetch_t *f, capstan_redis_t *r, size_t max, int block)
{
    if (!use_script(f, max))
        return append_move(f, r, f->order[0], block);
    char n[CAPSTAN_FMT_INT];
    capstan__fmt_uint(n, max);
    const char *argv[f->nact + 3];
    for (size_t i = 0; i < f->nact; i++)
        argv[i] = f->keys[f->order[i]];
    argv[f->nact] = f->working;
    argv[f->nact + 1] = n;
    argv[f->nact + 2] = "1";
    return capstan__redis_append_script(r, CAPSTAN_SCRIPT_FETCH, (int)f->nact + 1, (int)f->nact + 3,
                                        argv, NULL);
}

/* Reads the script's reply into out[0..max). Returns the number of jobs,
 * or CAPSTAN_EREDIS, CAPSTAN_EREPLY, CAPSTAN_ENOMEM (nothing in out then). Each job's
 * seq is Redis's clock at the fetch (microseconds) times 128 plus its
 * place in the batch: the order of every fetch as Redis ran it. */
static int read_sweep(capstan_fetch_t *f, const redisReply *rep, capstan_fetched_t *out, size_t max)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements % 2 != 1
        || rep->element[0]->type != REDIS_REPLY_INTEGER || rep->element[0]->integer < 0)
        return CAPSTAN_EREPLY;
    unsigned long long clock = (unsigned long long)rep->element[0]->integer;
    size_t n = 0;
    int rc = 0;
    for (size_t i = 1; i < rep->elements && n < max && rc == 0; i += 2) {
        redisReply **e = rep->element + i;
        /* The queue's index, or {index, digest, jid} (see fetch.lua). */
        const redisReply *meta = e[0], *const *held = NULL;
        if (meta->type == REDIS_REPLY_ARRAY && meta->elements == 3) {
            held = (const redisReply *const *)meta->element;
            meta = held[0];
        }
        long long qi = meta->type == REDIS_REPLY_INTEGER ? meta->integer : 0;
        if (qi < 1 || (size_t)qi > f->nact || e[1]->type != REDIS_REPLY_STRING) {
            rc = CAPSTAN_EREPLY;
            break;
        }
        rc = take(f, e[1], f->order[qi - 1], &out[n]);
        if (rc == 1 && (rc = take_hint(held ? held[1] : NULL, held ? held[2] : NULL,
                                       &out[n])) == 0) {
            out[n].seq = clock * 128 + n;
            n++;
        }
    }
    if (rc < 0) {
        /* Jobs already moved stay in the working list: the stray check
         * gives them back. */
        while (n)
            capstan__fetched_clear(&out[--n]);
        return rc;
    }
    return (int)n;
}

/* Reads what append_fetch asked for (the script when script). Returns the
 * number of jobs, or CAPSTAN_EREDIS, CAPSTAN_EREPLY, CAPSTAN_ENOMEM. */
static int read_fetch(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *out, size_t max,
                      int script)
{
    if (!script)
        return read_move(f, r, f->order[0], out);
    redisReply *rep = capstan_redis_get_reply(r);
    int rc = 0;
    if (!rep)
        return CAPSTAN_EREDIS;
    if (rep->type == REDIS_REPLY_ERROR)
        rc = CAPSTAN_EREPLY;
    else
        rc = read_sweep(f, rep, out, max);
    if (rep->type != REDIS_REPLY_ERROR)
        atomic_fetch_add(&f->answered, 1);
    freeReplyObject(rep);
    return rc;
}

/* Every queue was empty: block on one of them rather than poll. Idle
 * processors spread over the queues not paused (by index, in configured
 * order), so a job pushed to any of them wakes one at once while there are
 * at least as many processors as queues. */
static int fetch_block(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *out)
{
    if (!f->nact)
        return wait_paused(f);
    size_t k = (size_t)f->index % f->nact, qi = 0;
    for (size_t i = 0; i < f->nq; i++)
        if (!capstan__paused_is(f->paused, i) && k-- == 0) {
            qi = i;
            break;
        }
    int rc = append_move(f, r, qi, 1) ? CAPSTAN_EREDIS : read_move(f, r, qi, out);
    return rc == 1 ? give_back_paused(f, r, qi, out) : rc;
}

/* The sweep (or the move) whose command was already appended, then, when
 * block, the blocking move when the sweep found nothing. */
static int finish_fetch(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *out, size_t max,
                        int block, int script)
{
    int rc = read_fetch(f, r, out, max, script);
    if (rc || !script || !block)
        return rc;
    return fetch_block(f, r, out);
}

/* Appends the ack of one job. A success without a lock to release needs
 * no script: LREM alone, the cheapest command that is still guarded (a job
 * requeued or recovered meanwhile is simply not there). Sets *sent to 0
 * when nothing had to be sent. */
static int append_ack(capstan_fetch_t *f, capstan_redis_t *r, const char *raw, size_t len,
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
    int basic = f->mode == CAPSTAN_FETCH_BASIC;
    int lock = ack->lock_key && ack->lock_jid;
    int batch = ack->bid && ack->lock_jid;
    int plain = (ack->kind == CAPSTAN_ACK_OK || ack->kind == CAPSTAN_ACK_DROP) && !batch;
    *sent = 0;
    if (basic && !lock && plain)
        return 0; /* BRPOP already took it; nothing to write */
    *sent = 1;
    if (!basic && !lock && plain) {
        /* From the tail: the oldest jobs, the ones finishing first, are
         * there (the fetch pushes on the left). */
        const char *argv[] = { "LREM", f->working, "-1", raw };
        size_t lens[] = { 4, strlen(f->working), 2, len };
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
    ARG(basic ? "" : f->working, basic ? 0 : strlen(f->working));
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

/* Reads one ack's reply: 0, CAPSTAN_EREPLY (an error reply) or CAPSTAN_EREDIS (the
 * connection broke). ack (may be NULL) is the ack the reply is for: a job
 * whose bid names no batch ran as a plain job, which is worth a warning.
 * jobs: how many jobs the call acked, each expected in the working list
 * (0 with the basic fetch); those it no longer found are counted. */
static int read_ack(capstan_redis_t *r, const capstan_ack_t *ack, long jobs)
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
        capstan__metrics_add(capstan__metrics_default(), CAPSTAN_METRIC_LATE_ACKS, jobs - found);
    long long flags = many ? rep->element[1]->integer
                    : ack && ack->bid && rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;
    capstan__metrics_batch_fired(capstan__metrics_default(), flags);
    if (flags & 2)
        capstan_warn("jid=%s names batch %s, which does not exist (expired or deleted?); it ran "
                     "as a plain job", many ? "(one of several)" : ack->lock_jid,
                     many ? rep->element[2]->str : ack->bid);
    freeReplyObject(rep);
    return rc;
}

int capstan__fetch_ack(capstan_fetch_t *f, capstan_redis_t *r, const char *raw, size_t len,
                       const capstan_ack_t *ack)
{
    int sent, rc = append_ack(f, r, raw, len, ack, &sent);
    if (rc || !sent)
        return rc ? CAPSTAN_EREDIS : 0;
    return read_ack(r, ack, f->mode == CAPSTAN_FETCH_BASIC ? 0 : 1) ? CAPSTAN_EREDIS : 0;
}

/* A success, with or without a lock to release or a batch to move: several
 * of them go in one acks.lua call (a failure stores a payload and goes
 * through ack.lua; so does a dropped job of a batch, a failure to it). */
static int batchable(const capstan_ack_t *ack)
{
    if (ack->bid)
        return ack->kind == CAPSTAN_ACK_OK && ack->lock_jid;
    return ack->kind == CAPSTAN_ACK_OK || ack->kind == CAPSTAN_ACK_DROP;
}

enum { ACKS_PER_CALL = 64 };

/* Appends one acks.lua call for the next ACKS_PER_CALL batchable acks from
 * *from on, marking them sent 2. Every key the call touches is declared in
 * KEYS (Dragonfly, cluster proxies): the working list, the digests, each
 * lock hash with its waiters' line and wake list (lib/wake_waiters.lua),
 * each batch's three keys and then "batches:open" and "queues". */
static int append_batch(capstan_fetch_t *f, capstan_redis_t *r, const capstan_ack_item_t *acks,
                        size_t nacks, size_t *from, char *sent)
{
    enum { MAX_KEYS = 2 + 6 * ACKS_PER_CALL + 2, MAX_ARGS = MAX_KEYS + 4 * ACKS_PER_CALL };
    /* On the heap: 4 KB of stack here would stay touched in every thread. */
    const char **argv = malloc(MAX_ARGS * sizeof(*argv));
    size_t *lens = malloc(MAX_ARGS * sizeof(*lens));
    size_t *picked = malloc(ACKS_PER_CALL * sizeof(*picked));
    char **owned = calloc(5 * ACKS_PER_CALL, sizeof(*owned));
    size_t npicked = 0, nowned = 0;
    int nkeys = 2, rc = 0, batches = 0;
    if (!argv || !lens || !picked || !owned) {
        rc = CAPSTAN_ENOMEM;
        goto out;
    }
    argv[0] = f->working;
    argv[1] = CAPSTAN_UNIQUE_DIGESTS;
    size_t i = *from;
    for (; i < nacks && npicked < ACKS_PER_CALL; i++) {
        const capstan_ack_t *a = &acks[i].ack;
        if (!batchable(a))
            continue;
        picked[npicked++] = i;
        if (a->lock_key && a->lock_jid) {
            argv[nkeys++] = a->lock_key;
            static const char *const line[] = { CAPSTAN_KEY_WAITING, CAPSTAN_KEY_WAKE };
            for (int t = 0; t < 2; t++) {
                if (!(owned[nowned] = capstan__key_swap_dup(a->lock_key, CAPSTAN_KEY_LOCKED, line[t]))) {
                    rc = CAPSTAN_ENOMEM;
                    goto out;
                }
                argv[nkeys++] = owned[nowned++];
            }
        }
        int seen = !a->bid;
        for (size_t k = 0; !seen && k + 1 < npicked; k++)
            seen = acks[picked[k]].ack.bid && strcmp(acks[picked[k]].ack.bid, a->bid) == 0;
        if (seen)
            continue;
        batches = 1;
        static const char *const tails[] = { "", ":jids", ":failures" };
        for (int t = 0; t < 3; t++) {
            size_t n = strlen(CAPSTAN_KEY_BATCH) + strlen(a->bid) + strlen(tails[t]) + 1;
            if (!(owned[nowned] = malloc(n))) {
                rc = CAPSTAN_ENOMEM;
                goto out;
            }
            snprintf(owned[nowned], n, "%s%s%s", CAPSTAN_KEY_BATCH, a->bid, tails[t]);
            argv[nkeys++] = owned[nowned++];
        }
    }
    *from = i;
    if (batches) {
        argv[nkeys++] = CAPSTAN_KEY_BATCHES_OPEN;
        argv[nkeys++] = CAPSTAN_KEY_QUEUES;
    }
    int argc = nkeys;
    for (size_t k = 0; k < npicked; k++) {
        const capstan_ack_item_t *it = &acks[picked[k]];
        const capstan_ack_t *a = &it->ack;
        int lock = a->lock_key && a->lock_jid;
        argv[argc++] = it->raw;
        argv[argc++] = lock ? a->lock_key : "";
        argv[argc++] = a->lock_jid ? a->lock_jid : "";
        argv[argc++] = a->bid ? a->bid : "";
        sent[picked[k]] = 2;
    }
    for (int k = 0; k < argc; k++)
        lens[k] = strlen(argv[k]);
    for (size_t k = 0; k < npicked; k++)
        lens[nkeys + 4 * (int)k] = acks[picked[k]].len;
    rc = capstan__redis_append_script(r, CAPSTAN_SCRIPT_ACKS, nkeys, argc, argv, lens);
out:
    for (size_t k = 0; k < nowned; k++)
        free(owned[k]);
    free(owned);
    free(picked);
    free(argv);
    free(lens);
    return rc;
}

/* Reads the reply of the WAIT sent after acks. Replication is
 * asynchronous: an ack the master took but no replica got is lost in a
 * failover, and the job runs again. Waiting makes that rarer (and slows
 * this processor down to what the replicas keep up with); falling short is
 * only reported, as the acks are written on the master either way. */
static int read_wait(capstan_fetch_t *f, capstan_redis_t *r)
{
    redisReply *rep = capstan_redis_get_reply(r);
    if (!rep)
        return CAPSTAN_EREDIS;
    double now = capstan__mono();
    if (rep->type == REDIS_REPLY_INTEGER && rep->integer < f->min_replicas
        && now - f->wait_warned > 60) {
        f->wait_warned = now;
        capstan_warn("acks reached %lld of min_replicas_ack %d replicas within %s ms",
                     rep->integer, f->min_replicas, f->wait_args[1]);
    }
    freeReplyObject(rep);
    return 0;
}

/* Reads the replies of calls sent. Returns CAPSTAN_EREDIS when the connection
 * failed. */
static int read_calls(capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    for (size_t i = 0; i < ncalls; i++)
        if (!(calls[i].reply = capstan_redis_get_reply(r)))
            return CAPSTAN_EREDIS;
    return 0;
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

/* The calls one by one, each in a round trip of its own. */
static int run_calls(capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    for (size_t i = 0; i < ncalls; i++)
        if (!(calls[i].reply = capstan__redis_script(r, calls[i].script, calls[i].nkeys,
                                                     calls[i].argc, calls[i].argv, NULL)))
            return CAPSTAN_EREDIS;
    return 0;
}

int capstan__fetch_exchange(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks, size_t nacks,
                            capstan_fetched_t *out, size_t max, int block)
{
    return capstan__fetch_exchange_calls(f, r, acks, nacks, NULL, 0, out, max, block);
}

/* A round trip sent and not read yet: what reading its replies needs. */
struct capstan_exchange {
    size_t nacks, batches, ncalls, max;
    int waits, block;
    int script; /* the fetch is the script (as decided when it was sent:
                   the jobs read change f->locks_seen) */
    int all_paused; /* no fetch was sent: every queue is paused */
    int live;       /* the liveness key's refresh went first */
    double live_sent;
    capstan_script_call_t *calls;
    char sent[]; /* per ack: 0 nothing sent, 1 its own reply, 2 in a batch */
};

/* Appends the acks, the calls and the fetch (reliable fetch only). Returns
 * the state to read them with (capstan__fetch_recv), or NULL with *rc set. */
static capstan_exchange_t *send_all(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                    size_t nacks, capstan_script_call_t *calls, size_t ncalls,
                                    size_t max, int block, int *rc)
{
    capstan_exchange_t *x = calloc(1, sizeof(*x) + (nacks ? nacks : 1));
    if (!x) {
        *rc = CAPSTAN_ENOMEM;
        return NULL;
    }
    *x = (capstan_exchange_t){ .nacks = nacks, .ncalls = ncalls, .calls = calls, .max = max,
                           .block = block };
    *rc = CAPSTAN_EREDIS;
    /* First, so that every job this round trip fetches is in the list of
     * a process Redis knows alive. */
    if (capstan__liveness_due(f->liveness)) {
        x->live = 1;
        if (capstan__liveness_append(f->liveness, r, &x->live_sent))
            goto fail;
    }
    size_t nbatch = 0;
    for (size_t i = 0; i < nacks; i++)
        nbatch += batchable(&acks[i].ack);
    if (nbatch < 2)
        nbatch = 0;
    x->batches = (nbatch + ACKS_PER_CALL - 1) / ACKS_PER_CALL;
    for (size_t b = 0, i = 0; b < x->batches; b++)
        if (append_batch(f, r, acks, nacks, &i, x->sent))
            goto fail;
    for (size_t i = 0; i < nacks; i++) {
        int snt;
        if (nbatch && batchable(&acks[i].ack))
            continue;
        if (append_ack(f, r, acks[i].raw, acks[i].len, &acks[i].ack, &snt))
            goto fail;
        x->sent[i] = (char)snt;
    }
    for (size_t i = 0; f->min_replicas && i < nacks && !x->waits; i++)
        x->waits = x->sent[i] != 0;
    if (x->waits) {
        const char *argv[] = { "WAIT", f->wait_args[0], f->wait_args[1] };
        if (capstan_redis_append(r, 3, argv, NULL))
            goto fail;
    }
    for (size_t i = 0; i < ncalls; i++)
        if (capstan__redis_append_script(r, calls[i].script, calls[i].nkeys, calls[i].argc,
                                         calls[i].argv, NULL))
            goto fail;
    if (max) {
        plan_order(f);
        x->all_paused = !f->nact;
        x->script = use_script(f, max);
        if (!x->all_paused && append_fetch(f, r, max, block))
            goto fail;
    }
    *rc = 0;
    return x;
fail:
    free(x);
    return NULL;
}

/* Reads what send_all sent, in order, and frees x. An ack refused by an
 * error reply keeps rc CAPSTAN_EREDIS (the job stays in the working list, to be
 * acked again); the replies behind it still count. A broken connection
 * ends the reading. */
static int recv_all(capstan_fetch_t *f, capstan_redis_t *r, capstan_exchange_t *x, capstan_ack_item_t *acks,
                    capstan_fetched_t *out)
{
    int rc = CAPSTAN_EREDIS;
    if (x->live && capstan__liveness_read(f->liveness, r, x->live_sent))
        goto done;
    for (size_t b = 0, i = 0; b < x->batches; b++) {
        long jobs = 0;
        for (size_t k = i; k < x->nacks && jobs < ACKS_PER_CALL; k++)
            jobs += x->sent[k] == 2;
        int brc = read_ack(r, NULL, f->mode == CAPSTAN_FETCH_BASIC ? 0 : jobs);
        if (brc == CAPSTAN_EREDIS)
            goto done;
        brc = brc ? CAPSTAN_EREDIS : 0;
        for (size_t k = 0; k < ACKS_PER_CALL && i < x->nacks; i++)
            if (x->sent[i] == 2) {
                acks[i].rc = brc;
                k++;
            }
    }
    for (size_t i = 0; i < x->nacks; i++) {
        if (x->sent[i] == 2)
            continue;
        if (!x->sent[i]) {
            acks[i].rc = 0;
            continue;
        }
        int arc = read_ack(r, &acks[i].ack, f->mode == CAPSTAN_FETCH_BASIC ? 0 : 1);
        if (arc == CAPSTAN_EREDIS)
            goto done;
        acks[i].rc = arc ? CAPSTAN_EREDIS : 0;
    }
    if (x->waits && read_wait(f, r))
        goto done;
    if (read_calls(r, x->calls, x->ncalls))
        goto done;
    rc = 0;
    if (x->max && x->all_paused)
        rc = x->block ? wait_paused(f) : 0;
    else if (x->max) {
        rc = finish_fetch(f, r, out, x->max, x->block, x->script);
        rc = rc == CAPSTAN_EREPLY ? CAPSTAN_EREDIS : rc;
    }
done:
    free(x);
    return rc;
}

/* Clears the results before a round trip. */
static void reset(capstan_ack_item_t *acks, size_t nacks, capstan_script_call_t *calls, size_t ncalls,
                  capstan_fetched_t *out, size_t max)
{
    for (size_t i = 0; i < nacks; i++)
        acks[i].rc = CAPSTAN_EREDIS;
    for (size_t i = 0; i < max; i++)
        memset(&out[i], 0, sizeof(out[i]));
    for (size_t i = 0; i < ncalls; i++)
        calls[i].reply = NULL;
}

static int exchange(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks, size_t nacks,
                    capstan_script_call_t *calls, size_t ncalls, capstan_fetched_t *out, size_t max,
                    int block)
{
    reset(acks, nacks, calls, ncalls, out, max);
    if (f->mode == CAPSTAN_FETCH_BASIC) {
        for (size_t i = 0; i < nacks; i++)
            if ((acks[i].rc = capstan__fetch_ack(f, r, acks[i].raw, acks[i].len, &acks[i].ack)))
                return CAPSTAN_EREDIS;
        if (run_calls(r, calls, ncalls))
            return CAPSTAN_EREDIS;
        if (!max)
            return 0;
        plan_order(f);
        int rc = fetch_basic(f, r, out);
        return rc == CAPSTAN_EREPLY ? CAPSTAN_EREDIS : rc;
    }
    /* Everything goes out in one write; replies come back in order. */
    int rc;
    capstan_exchange_t *x = send_all(f, r, acks, nacks, calls, ncalls, max, block, &rc);
    return x ? recv_all(f, r, x, acks, out) : rc;
}

capstan_exchange_t *capstan__fetch_send(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                        size_t nacks, size_t max, int *rc)
{
    if (f->mode == CAPSTAN_FETCH_BASIC) {
        *rc = CAPSTAN_EINVAL;
        return NULL;
    }
    reset(acks, nacks, NULL, 0, NULL, 0);
    capstan_exchange_t *x = send_all(f, r, acks, nacks, NULL, 0, max, 0, rc);
    if (x && capstan__redis_flush(r)) {
        free(x);
        *rc = CAPSTAN_EREDIS;
        return NULL;
    }
    return x;
}

int capstan__fetch_recv(capstan_fetch_t *f, capstan_redis_t *r, capstan_exchange_t *x, capstan_ack_item_t *acks,
                        capstan_fetched_t *out)
{
    for (size_t i = 0; i < x->max; i++)
        memset(&out[i], 0, sizeof(out[i]));
    return recv_all(f, r, x, acks, out);
}

int capstan__fetch_exchange_calls(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                  size_t nacks, capstan_script_call_t *calls, size_t ncalls,
                                  capstan_fetched_t *out, size_t max, int block)
{
    int rc = exchange(f, r, acks, nacks, calls, ncalls, out, max, block);
    if (ncalls && capstan_redis_ok(r))
        retry_noscript(r, calls, ncalls);
    return rc;
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
    /* Basic fetch: RPUSH key raws...; reliable: requeue.lua, the working
     * list and the queue as keys. Either way the last one given ends at the
     * head of the queue. */
    int basic = f->mode == CAPSTAN_FETCH_BASIC;
    argv[0] = basic ? "RPUSH" : f->working;
    argv[1] = key;
    alens[0] = strlen(argv[0]);
    alens[1] = strlen(key);
    memcpy(argv + 2, raws, n * sizeof(*argv));
    memcpy(alens + 2, lens, n * sizeof(*alens));
    redisReply *rep = basic ? capstan_redis_cmd(r, (int)n + 2, argv, alens)
                            : capstan__redis_script(r, CAPSTAN_SCRIPT_REQUEUE, 2, (int)n + 2, argv, alens);
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
