/* The uniqueness reaper: frees locks whose jobs no longer exist anywhere,
 * a bounded piece of work per run, one run at a time across the fleet.
 *
 * Finding out whether a jid is anywhere means reading every queue, the
 * schedule and retry sets, the working lists and the work hashes: too much
 * to do inside one script without stalling Redis. So the sweep runs here,
 * in pages, in the order jobs flow (schedule, retry, queues, working lists,
 * work hashes, then retry and schedule again, which failed and rescheduled
 * jobs flow back into), so a job moving forward while we read is seen
 * before or after its move. What a job can move into behind the sweep's
 * back (a working list, a work hash, the fetched end of a queue) is checked
 * again together with the removal in lua/reap.lua, atomically.
 *
 * This file is the run: the leases that make it one at a time, the cursor
 * that carries the walk over uniquejobs:digests from run to run, and the
 * judgement of each digest; the sweep is in reap_sweep.c, the calls on the
 * digest index in reap_digests.c. */
#include "unique/admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "unique/admin_internal.h"
#include "unique/reap.h"
#include "redis/keys.h"
#include "redis/reply.h"
#include "support/identity.h"
#include "support/number.h"
#include "support/time.h"

#define CURSOR_TTL "86400"
#define BATCH 100 /* digests per reap.lua call */

/* ---- leases ------------------------------------------------------------------ */

/* Takes key for owner, or keeps it when owner already holds it. Returns 1
 * when owner holds it, 0 when another does (holder copied), or an error. */
static int lease(capstan_redis_t *r, const char *key, const char *owner, long ttl_ms,
                 char *holder, size_t hn, char *err)
{
    char px[32];
    snprintf(px, sizeof(px), "%ld", ttl_ms);
    for (int attempt = 0; attempt < 2; attempt++) {
        const char *set[] = { "SET", key, owner, "NX", "PX", px };
        redisReply *rep = capstan_redis_cmd(r, 6, set, NULL);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            int rc = capstan__reply_error(r, rep, "SET", err);
            freeReplyObject(rep);
            return rc;
        }
        int won = rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        if (won)
            return 1;
        const char *get[] = { "GET", key };
        rep = capstan_redis_cmd(r, 2, get, NULL);
        if (!rep)
            return capstan__reply_error(r, rep, "GET", err);
        if (rep->type != REDIS_REPLY_STRING) {
            freeReplyObject(rep); /* lapsed between SET and GET */
            continue;
        }
        int mine = strcmp(rep->str, owner) == 0;
        snprintf(holder, hn, "%s", rep->str);
        freeReplyObject(rep);
        if (!mine)
            return 0;
        const char *pexp[] = { "PEXPIRE", key, px };
        rep = capstan_redis_cmd(r, 3, pexp, NULL);
        int kept = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
        freeReplyObject(rep);
        if (kept)
            return 1;
    }
    return 0;
}

/* Deletes key if owner holds it. Not atomic: the run lease outlives the run
 * by 30 s, so it cannot have changed hands in between. */
static int unlease(capstan_redis_t *r, const char *key, const char *owner)
{
    const char *get[] = { "GET", key };
    redisReply *rep = capstan_redis_cmd(r, 2, get, NULL);
    if (!rep)
        return CAPSTAN_EREDIS;
    int mine = rep->type == REDIS_REPLY_STRING && strcmp(rep->str, owner) == 0;
    freeReplyObject(rep);
    if (!mine)
        return 0;
    const char *del[] = { "DEL", key };
    rep = capstan_redis_cmd(r, 2, del, NULL);
    int rc = rep ? 0 : CAPSTAN_EREDIS;
    freeReplyObject(rep);
    return rc;
}

int capstan__unique_reaper_release(capstan_redis_t *r, const char *owner)
{
    return unlease(r, CAPSTAN_UNIQUE_REAPER_KEY, owner);
}

/* ---- the run -------------------------------------------------------------- */

/* The same hostname as the process identity ($DYNO when set). */
static void default_owner(char *out, size_t n)
{
    char host[256];
    capstan__hostname(host, sizeof(host));
    snprintf(out, n, "%s:%ld", host, (long)getpid());
}

void capstan__reap_result_clear(capstan_reap_result_t *out)
{
    if (!out)
        return;
    for (size_t i = 0; i < out->ndigests; i++)
        free(out->digests[i]);
    free(out->digests);
    out->digests = NULL;
    out->ndigests = 0;
}

/* One run: its limits, the job sweep (done at most once, when the first
 * digest with holders needs it) and the walk's position. */
typedef struct run {
    capstan_redis_t *r;
    capstan_reap_result_t *out;
    long count;
    double grace;
    double cutoff;     /* digests locked after this keep their holders unchecked */
    capstan_reap_sweep_t sw;
    int swept;         /* 0 not yet, 1 complete, -1 ran out of time */
    capstan_reap_cand_t *cands; /* CAPSTAN_REAP_PAGE of them */
    int *suspect;      /* CAPSTAN_REAP_PAGE flags: send to reap.lua */
    char cscore[64], cmember[1024]; /* the last digest decided, or "" */
} run_t;

/* Takes v9's fleet role (when asked) and the per-run lease (unless forced).
 * Returns 1 when the run may go on, 0 when another reaper holds one
 * (out->busy, out->holder), or an error. *leased says whether the run lease
 * must be given back. */
static int take_leases(run_t *run, const capstan_reap_opts_t *o, double timeout, const char *owner,
                       int *leased, char *err)
{
    capstan_reap_result_t *out = run->out;
    int rc;
    if (o->role_ttl > 0) {
        /* v9 keeps the role (its reaper mutex) for interval + 2 %, in whole
         * seconds, and renews it every cycle. */
        long ms = (long)capstan__ceil(o->role_ttl) * 1000;
        rc = lease(run->r, CAPSTAN_UNIQUE_REAPER_KEY, owner, ms, out->holder, sizeof(out->holder),
                   err);
        if (rc <= 0) {
            out->busy = rc == 0;
            return rc;
        }
    }
    if (!o->force) {
        rc = lease(run->r, CAPSTAN_KEY_REAPER_RUNNING, owner, (long)((timeout + 30) * 1000),
                   out->holder, sizeof(out->holder), err);
        if (rc <= 0) {
            out->busy = rc == 0;
            return rc;
        }
        *leased = 1;
    }
    return 1;
}

/* Where the previous run stopped: "score member", or nothing. */
static int load_cursor(run_t *run, char *err)
{
    redisReply *cur = capstan_redis_cmdf(run->r, "GET %s", CAPSTAN_KEY_REAPER_CURSOR);
    if (!cur)
        return capstan__reply_error(run->r, cur, "GET " CAPSTAN_KEY_REAPER_CURSOR, err);
    if (cur->type == REDIS_REPLY_STRING) {
        const char *sp = strchr(cur->str, ' ');
        if (sp && (size_t)(sp - cur->str) < sizeof(run->cscore)) {
            snprintf(run->cscore, sizeof(run->cscore), "%.*s", (int)(sp - cur->str), cur->str);
            snprintf(run->cmember, sizeof(run->cmember), "%s", sp + 1);
        }
    }
    freeReplyObject(cur);
    return 0;
}

/* Where the next run starts; failures only cost that run a repeat. */
static void save_cursor(run_t *run)
{
    if (run->out->wrapped) {
        redisReply *d = capstan_redis_cmdf(run->r, "DEL %s", CAPSTAN_KEY_REAPER_CURSOR);
        freeReplyObject(d);
    } else if (*run->cscore) {
        char val[1200];
        snprintf(val, sizeof(val), "%s %s", run->cscore, run->cmember);
        const char *set[] = { "SET", CAPSTAN_KEY_REAPER_CURSOR, val, "EX", CURSOR_TTL };
        redisReply *s = capstan_redis_cmd(run->r, 5, set, NULL);
        freeReplyObject(s);
    }
}

/* Whether c goes to reap.lua: 1 yes, 0 no, or an error. */
static int judge(run_t *run, const capstan_reap_cand_t *c, char *err)
{
    if (c->foreign)
        return 0;
    if (c->njids == 0)
        return 1;
    /* Locked within the grace period, or an until_expired lock Redis will
     * expire: leave it. */
    if (strtod(c->score, NULL) > run->cutoff || (c->until_expired && c->pttl > 0))
        return 0;
    /* Are its holders anywhere? */
    if (!run->swept) {
        int rc = capstan__reap_sweep_all(run->r, &run->sw, err);
        if (rc < 0)
            return rc;
        run->swept = rc == 0 ? 1 : -1;
    }
    if (run->swept < 0) {
        run->out->incomplete = 1;
        return 0;
    }
    for (size_t k = 0; k < c->njids; k++)
        if (capstan__reap_sweep_has(&run->sw, c->jids[k]))
            return 0;
    return 1;
}

/* Decides the n digests of a page in order, sending suspects to reap.lua
 * in batches, and moves the cursor past the last one decided. *stop: the
 * time or the count ran out within the page. */
static int reap_page(run_t *run, size_t n, int *stop, char *err)
{
    capstan_reap_result_t *out = run->out;
    size_t from = 0, pending = 0, last = n; /* last: index decided last */
    int rc = 0;
    memset(run->suspect, 0, CAPSTAN_REAP_PAGE * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        if (capstan__mono() > run->sw.deadline) {
            out->timed_out = *stop = 1;
            break;
        }
        out->examined++;
        last = i;
        if ((rc = judge(run, &run->cands[i], err)) < 0)
            return rc;
        run->suspect[i] = rc;
        pending += (size_t)rc;
        rc = 0;
        long room = run->count - out->removed;
        if (pending && ((long)pending >= room || pending >= BATCH)) {
            rc = capstan__reap_flush(run->r, &run->sw, run->cands, run->suspect, from, i + 1, out, err);
            if (rc)
                return rc;
            from = i + 1;
            pending = 0;
            if (out->removed >= run->count) {
                *stop = 1;
                break;
            }
        }
    }
    /* Only what was decided: items up to and including `last`. */
    if (pending && (rc = capstan__reap_flush(run->r, &run->sw, run->cands, run->suspect, from, last + 1,
                                             out, err)))
        return rc;
    if (last < n) {
        snprintf(run->cscore, sizeof(run->cscore), "%s", run->cands[last].score);
        snprintf(run->cmember, sizeof(run->cmember), "%s", run->cands[last].digest);
    }
    return 0;
}

/* Walks uniquejobs:digests page by page from the cursor until the count,
 * the time or the index runs out. */
static int walk(run_t *run, char *err)
{
    capstan_reap_result_t *out = run->out;
    int stop = 0, rc = 0;
    run->cutoff = capstan__now() - run->grace;
    while (!stop && !rc && out->removed < run->count) {
        if (capstan__mono() > run->sw.deadline) {
            out->timed_out = 1;
            break;
        }
        size_t n = 0;
        rc = capstan__reap_read_page(run->r, run->cscore, run->cmember, run->cands, &n, err);
        if (!rc && n == 0)
            out->wrapped = 1;
        if (rc || n == 0)
            break;
        rc = reap_page(run, n, &stop, err);
        for (size_t i = 0; i < n; i++)
            capstan__reap_cand_clear(&run->cands[i]);
    }
    return rc;
}

int capstan__unique_reap(capstan_redis_t *r, const capstan_reap_opts_t *opts, capstan_reap_result_t *out,
                         char *err)
{
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    if (opts)
        o = *opts;
    memset(out, 0, sizeof(*out));
    double timeout = o.timeout > 0 ? o.timeout : 10;
    char owner[320];
    if (o.owner && *o.owner)
        snprintf(owner, sizeof(owner), "%s", o.owner);
    else
        default_owner(owner, sizeof(owner));
    run_t run = {
        .r = r,
        .out = out,
        .count = o.count > 0 ? o.count : 1000,
        .grace = o.grace >= 0 ? o.grace : timeout + 10,
        .sw = { .deadline = capstan__mono() + timeout },
        .cands = calloc(CAPSTAN_REAP_PAGE, sizeof(capstan_reap_cand_t)),
        .suspect = calloc(CAPSTAN_REAP_PAGE, sizeof(int)),
    };

    int rc, leased = 0;
    if (!run.cands || !run.suspect)
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    else
        rc = take_leases(&run, &o, timeout, owner, &leased, err);
    if (rc > 0) {
        rc = load_cursor(&run, err);
        if (!rc)
            rc = walk(&run, err);
        if (!rc)
            save_cursor(&run);
    }

    if (run.cands)
        for (size_t i = 0; i < CAPSTAN_REAP_PAGE; i++)
            capstan__reap_cand_clear(&run.cands[i]);
    free(run.cands);
    free(run.suspect);
    capstan__reap_sweep_free(&run.sw);
    if (leased && capstan_redis_ok(r))
        unlease(r, CAPSTAN_KEY_REAPER_RUNNING, owner);
    return rc;
}
