/* The reliable fetch: a job moves atomically from queue:NAME into this
 * process's working list (a script sweeping the queues, or LMOVE/BLMOVE)
 * and leaves it only with its ack; acks, script calls and the next fetch
 * share one round trip. See fetch/fetch.h. */
#include "fetch/fetch_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/scripts.h"
#include "support/fmt.h"
#include "support/log.h"
#include "support/time.h"

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

/* Whether the next fetch goes through the script: several queues, several
 * jobs, or jobs with locks (the script checks them on the way). With one
 * queue, one job and no locks the blocking move alone is cheapest. */
static int use_script(const capstan_fetch_t *f, size_t max)
{
    return f->nact > 1 || max > 1 || f->locks_seen || f->caps;
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
    else if (rep->type == REDIS_REPLY_STRING && (rc = capstan__fetch_take(f, rep, qi, out)) == 1)
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
    if (f->caps)
        return capstan__fetch_append_capped(f, r, max);
    char n[CAPSTAN_FMT_INT];
    capstan__fmt_uint(n, max);
    const char *argv[f->nact + 3];
    for (size_t i = 0; i < f->nact; i++)
        argv[i] = f->keys[f->order[i]];
    argv[f->nact] = f->working;
    argv[f->nact + 1] = n;
    /* Looking costs Redis a search through each payload: not once the
     * last 1,000 jobs carried no lock it would look for (none, or a
     * runtime lock only; the first locked jobs after them check their
     * locks themselves, as without the hint). */
    argv[f->nact + 2] = atomic_load_explicit(&f->plain_run, memory_order_relaxed) < 1000 ? "1" : "0";
    return capstan__redis_append_script(r, CAPSTAN_SCRIPT_FETCH, (int)f->nact + 1, (int)f->nact + 3,
                                        argv, NULL);
}

/* Reads the script's reply into out[0..max). Returns the number of jobs,
 * or CAPSTAN_EREDIS, CAPSTAN_EREPLY, CAPSTAN_ENOMEM (nothing in out then). Each job's
 * seq is Redis's clock at the fetch (microseconds) times 128 plus its
 * place in the batch: the order of every fetch as Redis ran it. */
static int read_sweep(capstan_fetch_t *f, const redisReply *rep, capstan_fetched_t *out, size_t max)
{
    if (rep->type != REDIS_REPLY_ARRAY || !rep->elements)
        return CAPSTAN_EREPLY;
    /* From one queue: the payloads, then the clock (see fetch.lua). */
    int bare = rep->element[0]->type == REDIS_REPLY_STRING;
    const redisReply *last = rep->element[bare ? rep->elements - 1 : 0];
    if ((!bare && rep->elements % 2 != 1) || last->type != REDIS_REPLY_INTEGER
        || last->integer < 0)
        return CAPSTAN_EREPLY;
    unsigned long long clock = (unsigned long long)last->integer;
    size_t n = 0;
    int rc = 0;
    for (size_t i = 0; bare && i + 1 < rep->elements && n < max && rc == 0; i++) {
        if (rep->element[i]->type != REDIS_REPLY_STRING) {
            rc = CAPSTAN_EREPLY;
            break;
        }
        /* The one queue is the first of the order sent (index 1). */
        capstan__fetch_take(f, rep->element[i], f->order[0], &out[n]);
        out[n].seq = clock * 128 + n;
        n++;
    }
    for (size_t i = 1; !bare && i < rep->elements && n < max && rc == 0; i += 2) {
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
        rc = capstan__fetch_take(f, e[1], f->order[qi - 1], &out[n]);
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
        return capstan__fetch_wait_paused(f);
    size_t k = (size_t)f->index % f->nact, qi = 0;
    for (size_t i = 0; i < f->nq; i++)
        if (!capstan__paused_is(f->paused, i) && k-- == 0) {
            qi = i;
            break;
        }
    int capped = f->caps && f->caps[qi];
    if (capped && capstan__fetch_cap_full(f, r, qi))
        return capstan__fetch_wait_cap(f, r, qi);
    int rc = append_move(f, r, qi, 1) ? CAPSTAN_EREDIS : read_move(f, r, qi, out);
    rc = rc == 1 ? capstan__fetch_give_back_paused(f, r, qi, out, 0) : rc;
    return rc == 1 && capped ? capstan__fetch_take_cap(f, r, qi, out) : rc;
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

static int ack(capstan_fetch_t *f, capstan_redis_t *r, const char *raw, size_t len, const capstan_ack_t *a)
{
    int sent, rc = capstan__fetch_append_ack(r, f->working, raw, len, a, &sent);
    if (rc || !sent)
        return rc ? CAPSTAN_EREDIS : 0;
    return capstan__fetch_read_ack(r, a, 1) ? CAPSTAN_EREDIS : 0;
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

/* Whether the picked acks, whose call declares nkeys keys, release their
 * locks apart from the ack (append_batch): no batch, at least one lock,
 * and every lock a runtime one that no one waits for. */
static int split(const capstan_ack_item_t *acks, const size_t *picked, size_t npicked, int batches, int nkeys)
{
    static const char tail[] = CAPSTAN_KEY_RUN CAPSTAN_KEY_LOCKED;
    int ok = !batches && nkeys > 2;
    for (size_t k = 0; ok && k < npicked; k++) {
        const capstan_ack_t *a = &acks[picked[k]].ack;
        size_t n = a->lock_key ? strlen(a->lock_key) : 0;
        ok = !(a->lock_key && a->lock_jid)
             || (a->lock_quiet && n >= sizeof(tail) - 1 && !strcmp(a->lock_key + n - (sizeof(tail) - 1), tail));
    }
    return ok;
}

/* A success with no lock to release and no batch: its ack is one LREM. */
static int plain(const capstan_ack_t *ack)
{
    return batchable(ack) && !ack->bid && !(ack->lock_key && ack->lock_jid);
}

/* Below this many plain acks in a round trip, each is one LREM of its own,
 * pipelined: what acks_plain.lua would run for them anyway (lib/take_out.lua
 * reads the tail only for 32 jobs or more), without a Lua argument and a
 * call from Lua a job (bench/acks_cost.py: 9.5k instructions a job against
 * 14.4k for 40 jobs with 7 older ones behind). From 32 on, acks_plain.lua,
 * which rewrites a long tail once rather than walk it for each job. */
enum { LREM_BELOW = 32 };

/* Whether the ack goes in an acks.lua or acks_plain.lua call (lrem: the
 * round's plain acks go as LREMs of their own). */
static int in_call(const capstan_ack_t *ack, int lrem)
{
    return batchable(ack) && !(lrem && plain(ack));
}

/* Appends one acks.lua call for the next ACKS_PER_CALL batchable acks from
 * *from on, marking them sent 2. Every key the call touches is declared in
 * KEYS (Dragonfly, cluster proxies): the working list, the digests, each
 * lock hash with its waiters' line and wake list (lib/wake_waiters.lua),
 * in the acks' order (the script takes them from there rather than build
 * them), then each batch's three keys and "batches:open" and "queues". */
static int append_batch(capstan_fetch_t *f, capstan_redis_t *r, const capstan_ack_item_t *acks,
                        size_t nacks, size_t *from, char *sent, int lrem)
{
    enum { MAX_KEYS = 2 + 6 * ACKS_PER_CALL + 2, MAX_ARGS = MAX_KEYS + 4 * ACKS_PER_CALL };
    /* On the heap: 4 KB of stack here would stay touched in every thread. */
    const char **argv = malloc((MAX_ARGS + 3 * ACKS_PER_CALL) * sizeof(*argv));
    size_t *lens = malloc(MAX_ARGS * sizeof(*lens));
    size_t *picked = malloc(ACKS_PER_CALL * sizeof(*picked));
    /* Read only up to nowned: malloc, which the per-thread cache serves. */
    char **owned = malloc(5 * ACKS_PER_CALL * sizeof(*owned));
    size_t npicked = 0, nowned = 0;
    int nkeys = 2, rc = 0, batches = 0;
    if (!argv || !lens || !picked || !owned) {
        rc = CAPSTAN_ENOMEM;
        goto out;
    }
    argv[0] = f->working;
    argv[1] = CAPSTAN_UNIQUE_DIGESTS;
    /* The batches' keys go after every lock's (acks.lua): kept past the
     * arguments till then. */
    const char **bkeys = argv + MAX_ARGS;
    int nbkeys = 0;
    size_t i = *from;
    for (; i < nacks && npicked < ACKS_PER_CALL; i++) {
        const capstan_ack_t *a = &acks[i].ack;
        if (!in_call(a, lrem))
            continue;
        picked[npicked++] = i;
        if (a->lock_key && a->lock_jid) {
            argv[nkeys++] = a->lock_key;
            static const char *const line[] = { CAPSTAN_KEY_WAITING, CAPSTAN_KEY_WAKE };
            for (int t = 0; t < 2 && !a->lock_quiet; t++) {
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
            bkeys[nbkeys++] = owned[nowned++];
        }
    }
    *from = i;
    memcpy(argv + nkeys, bkeys, (size_t)nbkeys * sizeof(*bkeys));
    nkeys += nbkeys;
    if (batches) {
        argv[nkeys++] = CAPSTAN_KEY_BATCHES_OPEN;
        argv[nkeys++] = CAPSTAN_KEY_QUEUES;
    }
    /* Without a batch, and with only runtime locks no one waits for (a
     * while_executing job's, with no lock_timeout), each lock goes by a
     * plain HDEL, its digest's index entry by unlock_runtime.lua, and the
     * jobs by plain LREMs (by acks_plain.lua from LREM_BELOW jobs on,
     * where lib/take_out.lua may read the list's tail once instead): the
     * release needs nothing the ack reads, and an argument into Lua, with
     * the command a script runs for it, costs Redis more than the plain
     * command. Released first: should the round trip stop between, the job
     * runs again rather than leave its lock. */
    if (split(acks, picked, npicked, batches, nkeys)) {
        for (size_t k = 0; k < npicked && !rc; k++) {
            const capstan_ack_t *a = &acks[picked[k]].ack;
            if (a->lock_key && a->lock_jid) {
                const char *hdel[] = { "HDEL", a->lock_key, a->lock_jid };
                rc = capstan_redis_append(r, 3, hdel, NULL);
            }
        }
        if (!rc)
            rc = capstan__redis_append_script(r, CAPSTAN_SCRIPT_UNLOCK_RUNTIME, nkeys - 1, nkeys - 1,
                                              argv + 1, NULL);
        int lrems = npicked < LREM_BELOW;
        for (size_t k = 0; k < npicked; k++) {
            const capstan_ack_item_t *it = &acks[picked[k]];
            if (lrems && !rc) {
                const char *lrem[] = { "LREM", f->working, "-1", it->raw };
                size_t ll[] = { 4, strlen(f->working), 2, it->len };
                rc = capstan_redis_append(r, 4, lrem, ll);
            }
            argv[1 + k] = it->raw;
            lens[1 + k] = it->len;
            sent[picked[k]] = lrems ? 4 : 3;
        }
        lens[0] = strlen(argv[0]);
        if (!rc && !lrems)
            rc = capstan__redis_append_script(r, CAPSTAN_SCRIPT_ACKS_PLAIN, 1, 1 + (int)npicked, argv, lens);
        goto out;
    }
    /* Without a lock or a batch among them (only the working list is
     * declared then), acks_plain.lua takes the payloads alone. */
    int plain = nkeys == 2;
    nkeys = plain ? 1 : nkeys;
    int argc = nkeys;
    /* acks.lua's first argument: a byte a job, what it has (its lock, with
     * or without its waiters' keys, its batch); then each job's jid and bid
     * as it has them, then the payloads. */
    char kinds[ACKS_PER_CALL + 1];
    if (!plain)
        argv[argc++] = kinds;
    for (size_t k = 0; k < npicked && !plain; k++) {
        const capstan_ack_t *a = &acks[picked[k]].ack;
        int lock = a->lock_key && a->lock_jid;
        kinds[k] = !lock ? (a->bid ? 'b' : '0') : a->lock_quiet ? (a->bid ? 'L' : 'l') : (a->bid ? 'W' : 'w');
        if (lock || a->bid)
            argv[argc++] = a->lock_jid ? a->lock_jid : "";
        if (a->bid)
            argv[argc++] = a->bid;
    }
    kinds[npicked] = '\0';
    int first = argc;
    for (size_t k = 0; k < npicked; k++) {
        argv[argc++] = acks[picked[k]].raw;
        sent[picked[k]] = 2;
    }
    for (int k = 0; k < first; k++)
        lens[k] = strlen(argv[k]);
    for (size_t k = 0; k < npicked; k++)
        lens[first + (int)k] = acks[picked[k]].len;
    rc = capstan__redis_append_script(r, plain ? CAPSTAN_SCRIPT_ACKS_PLAIN : CAPSTAN_SCRIPT_ACKS,
                                      nkeys, argc, argv, lens);
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
    char sent[]; /* per ack: 0 nothing sent, 1 its own reply, 2 in a batch, 3 in
                   one whose locks went apart, 4 that too with an LREM
                   a job (append_batch) */
};

/* Appends the acks, the calls and the fetch. Returns
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
    size_t nbatch = 0, nplain = 0;
    for (size_t i = 0; i < nacks; i++)
        nplain += plain(&acks[i].ack);
    int lrem = nplain < LREM_BELOW;
    for (size_t i = 0; i < nacks; i++)
        nbatch += in_call(&acks[i].ack, lrem);
    if (nbatch < 2)
        nbatch = 0;
    x->batches = (nbatch + ACKS_PER_CALL - 1) / ACKS_PER_CALL;
    for (size_t b = 0, i = 0; b < x->batches; b++)
        if (append_batch(f, r, acks, nacks, &i, x->sent, lrem))
            goto fail;
    for (size_t i = 0; i < nacks; i++) {
        int snt;
        if (nbatch && in_call(&acks[i].ack, lrem))
            continue;
        if (capstan__fetch_append_ack(r, f->working, acks[i].raw, acks[i].len, &acks[i].ack, &snt))
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
        capstan__fetch_plan_order(f);
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

/* How far from i the first ack of the next batch is. */
static size_t first_sent(const capstan_exchange_t *x, size_t i)
{
    size_t k = 0;
    while (i + k < x->nacks && x->sent[i + k] < 2)
        k++;
    return k;
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
        long jobs = 0, locks = 0;
        for (size_t k = i; k < x->nacks && jobs < ACKS_PER_CALL; k++)
            if (x->sent[k] >= 2) {
                jobs++;
                locks += x->sent[k] >= 3 && acks[k].ack.lock_key && acks[k].ack.lock_jid;
            }
        /* The HDELs and unlock_runtime.lua before the jobs' call (see
         * append_batch): a failure there is a lock key of another type,
         * which holds no lock to release; the acks stand. */
        for (long k = 0, extra = locks ? locks + 1 : 0; k < extra; k++) {
            redisReply *rep = capstan_redis_get_reply(r);
            if (!rep)
                goto done;
            if (rep->type == REDIS_REPLY_ERROR)
                capstan_warn("releasing a runtime lock with its ack: %s", rep->str);
            freeReplyObject(rep);
        }
        if (jobs && x->sent[i + first_sent(x, i)] == 4) {
            /* One LREM a job: its own reply. */
            long found = 0;
            for (long k = 0; k < jobs; i++) {
                if (x->sent[i] != 4)
                    continue;
                redisReply *rep = capstan_redis_get_reply(r);
                if (!rep)
                    goto done;
                acks[i].rc = rep->type == REDIS_REPLY_INTEGER ? 0 : CAPSTAN_EREDIS;
                found += rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
                freeReplyObject(rep);
                k++;
            }
            if (jobs > found)
                capstan__metrics_add(capstan__metrics_default(), CAPSTAN_METRIC_LATE_ACKS, jobs - found);
            continue;
        }
        int brc = capstan__fetch_read_ack(r, NULL, jobs);
        if (brc == CAPSTAN_EREDIS)
            goto done;
        brc = brc ? CAPSTAN_EREDIS : 0;
        for (size_t k = 0; k < ACKS_PER_CALL && i < x->nacks; i++)
            if (x->sent[i] >= 2) {
                acks[i].rc = brc;
                k++;
            }
    }
    for (size_t i = 0; i < x->nacks; i++) {
        if (x->sent[i] >= 2)
            continue;
        if (!x->sent[i]) {
            acks[i].rc = 0;
            continue;
        }
        int arc = capstan__fetch_read_ack(r, &acks[i].ack, 1);
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
        rc = x->block ? capstan__fetch_wait_paused(f) : 0;
    else if (x->max) {
        rc = finish_fetch(f, r, out, x->max, x->block, x->script);
        rc = rc == CAPSTAN_EREPLY ? CAPSTAN_EREDIS : rc;
    }
done:
    free(x);
    return rc;
}

/* Everything goes out in one write; replies come back in order. */
static int exchange(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks, size_t nacks,
                    capstan_script_call_t *calls, size_t ncalls, capstan_fetched_t *out, size_t max,
                    int block)
{
    capstan__fetch_reset(acks, nacks, calls, ncalls, out, max);
    int rc;
    capstan_exchange_t *x = send_all(f, r, acks, nacks, calls, ncalls, max, block, &rc);
    return x ? recv_all(f, r, x, acks, out) : rc;
}

static capstan_exchange_t *send(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                size_t nacks, size_t max, int *rc)
{
    capstan__fetch_reset(acks, nacks, NULL, 0, NULL, 0);
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

/* requeue.lua, the working list and the queue as keys: only a job still in
 * the working list goes back. */
static redisReply *requeue(capstan_fetch_t *f, capstan_redis_t *r, const char **argv, size_t *lens, int argc)
{
    argv[0] = f->working;
    lens[0] = strlen(argv[0]);
    return capstan__redis_script(r, CAPSTAN_SCRIPT_REQUEUE, 2, argc, argv, lens);
}

const capstan_fetch_ops_t capstan__fetch_reliable = {
    .exchange = exchange, .send = send, .ack = ack, .requeue = requeue,
};
