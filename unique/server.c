/* The server half of uniqueness: what each lock type does around a job
 * (the lifecycle of v9's table, §4.8 of the reference), and the server
 * conflict strategies.
 *
 * Where v9 drops a job silently (until_executed held by another jid at
 * perform, until_and_while_executing's until-lock held by another jid), the
 * server strategy runs instead, and its default logs. Locks a job holds
 * while it waits in retry are kept (v9's ack releases them); the ack
 * releases them only when the job is done or dead (mw->release_*). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/fmt.h"
#include "support/log.h"
#include "support/payload.h"
#include "support/time.h"
#include "middleware/mw.h"
#include "unique/internal.h"
#include "unique/prelock.h"
#include "unique/server.h"

/* The job goes back in line instead of ending: it failed (retry), or an
 * iterating run was interrupted (back to its queue). Either way it stays
 * unique while it waits, as Sidekiq's re-push through the client takes its
 * lock again. */
static int back_in_line(capstan_mw_t *mw)
{
    return capstan_job_error_class(mw->job) != NULL || mw->out->disp == CAPSTAN_DISPOSE_REQUEUE;
}

static capstan_lock_req_t request(capstan_mw_t *mw, const capstan_unique_spec_t *s, int runtime)
{
    capstan_lock_req_t q = {
        .digest = s->digest, .runtime = runtime, .jid = mw->jid, .type = s->type,
        .ttl = s->ttl, .limit = s->limit, .cls = mw->cls, .queue = mw->queue,
        .lock_args = s->lock_args, .timeout = s->timeout,
    };
    return q;
}

/* The lock could not be taken at run time: apply the server strategy. The
 * job never ran. */
static int conflict(capstan_mw_t *mw, const capstan_unique_spec_t *s, const char *what)
{
    capstan_unique__metric(mw->r, s->type, "execution_failed");
    capstan_on_conflict_t st = s->server;
    if (st == CAPSTAN_CONFLICT_REPLACE) {
        capstan_warn("%s %s: on_conflict replace applies to pushes only; logging instead",
                     mw->cls, mw->jid);
        st = CAPSTAN_CONFLICT_LOG;
    }
    switch (st) {
    case CAPSTAN_CONFLICT_RAISE:
        capstan_job_fail(mw->job, "SidekiqUniqueJobs::Conflict",
                         "%s: lock_digest %s is held by another job", what, s->digest);
        return 0;
    case CAPSTAN_CONFLICT_REJECT:
        capstan_warn("Rejecting job with id (%s) to the dead set because lock_digest: (%s) %s",
                     mw->jid, s->digest, what);
        /* The error is what its dead-set entry and the death hooks show
         * (the server chain writes it into the entry); the job did not
         * run, so it is neither processed nor failed. */
        mw->out->skipped = "rejected";
        capstan_job_fail(mw->job, CAPSTAN_UNIQUE_REJECTED, "%s lock_digest %s %s (on_conflict: reject)",
                         capstan_lock_type_name(s->type), s->digest, what);
        return capstan_mw_dispose(mw, CAPSTAN_DISPOSE_DEAD, capstan__now(), NULL, 0);
    case CAPSTAN_CONFLICT_RESCHEDULE: {
        double in = s->schedule_in > 0 ? s->schedule_in : 5;
        capstan_info("Rescheduling job with id (%s) in %.0fs because lock_digest: (%s) %s",
                     mw->jid, in, s->digest, what);
        mw->out->skipped = "rescheduled";
        return capstan_mw_dispose(mw, CAPSTAN_DISPOSE_SCHEDULE, capstan__now() + in, NULL, 0);
    }
    default:
        capstan_warn("Skipping job with id (%s) because lock_digest: (%s) %s",
                     mw->jid, s->digest, what);
        mw->out->skipped = "skipped";
        return capstan_mw_dispose(mw, CAPSTAN_DISPOSE_DONE, 0, NULL, 0);
    }
}

/* Sidekiq Enterprise's client refuses a push while an earlier job with the
 * same digest holds its lock: from that job's push until it succeeds (or,
 * with unique_until start, starts), at most unique_for seconds. A job a
 * Ruby app pushed with unique_for took no lock then, so its lock is taken
 * at fetch, and a later copy is a duplicate when that lock is held, or
 * when it was enqueued before the earlier job let the lock go: that moment
 * is kept in "<digest>:FREED" for unique_for seconds, written before the
 * lock goes, so a copy that finds the lock free always finds it. */
static double enqueued_at(capstan_mw_t *mw)
{
    size_t len;
    const char *v = capstan_mw_field_raw(mw, "enqueued_at", &len);
    return v ? capstan__ts_parse(v, len) : 0;
}

static void note_freed(capstan_mw_t *mw, const capstan_unique_spec_t *s)
{
    double until = capstan__now(), enq = enqueued_at(mw);
    if (enq > 0 && enq + (double)s->ttl < until)
        until = enq + (double)s->ttl; /* Enterprise's lock had expired by then */
    char key[CAPSTAN_DIGEST_MAX + 16];
    capstan_unique__key(key, sizeof(key), s->digest, 0, CAPSTAN_KEY_FREED);
    redisReply *rep = capstan_redis_cmdf(mw->r, "SET %s %.6f EX %ld", key, until, s->ttl);
    if (!rep || rep->type == REDIS_REPLY_ERROR)
        capstan_warn("%s %s: could not note when lock %s was freed: %s; a copy enqueued "
                     "before may run", mw->cls, mw->jid, s->digest,
                     rep ? rep->str : capstan_redis_error(mw->r));
    freeReplyObject(rep);
}

/* Whether the job, which has just taken its lock (lr), is a copy that
 * Enterprise's client would have refused; then the lock goes back. */
static int refused_copy(capstan_mw_t *mw, const capstan_unique_spec_t *s, int lr)
{
    if (!s->unique_for || lr != CAPSTAN_LOCK_ACQUIRED)
        return 0;
    char key[CAPSTAN_DIGEST_MAX + 16], err[CAPSTAN_ERRLEN];
    capstan_unique__key(key, sizeof(key), s->digest, 0, CAPSTAN_KEY_FREED);
    redisReply *rep = capstan_redis_cmdf(mw->r, "GET %s", key);
    double freed = rep && rep->type == REDIS_REPLY_STRING ? strtod(rep->str, NULL) : 0;
    freeReplyObject(rep);
    double enq = enqueued_at(mw);
    if (!(freed > 0 && enq > 0 && enq <= freed))
        return 0;
    if (capstan_unique_unlock(mw->r, s->digest, 0, mw->jid, s->type, 0, err) < 0)
        capstan_warn("%s %s: could not give back lock %s: %s", mw->cls, mw->jid, s->digest, err);
    return 1;
}

/* A lock operation that failed on Redis: the job cannot be run safely, so
 * it fails and is retried. */
static int lock_error(capstan_mw_t *mw, const char *err)
{
    capstan_job_fail(mw->job, "Capstan::LockError", "uniqueness lock: %s", err);
    return 0;
}

/* After taking or checking a lock: refused (lr CAPSTAN_EDENIED: the server
 * strategy) or failed on Redis (lr < 0: the job fails). Returns 1 with *rc
 * set when the job must not go on. */
static int lock_stops(capstan_mw_t *mw, const capstan_unique_spec_t *s, int lr, const char *err, int *rc)
{
    if (lr == CAPSTAN_EDENIED)
        *rc = conflict(mw, s, "is held by another job");
    else if (lr < 0)
        *rc = lock_error(mw, err);
    return lr < 0;
}

/* lock_stops for a lock just taken at the fetch, where a unique_for copy
 * enqueued while the first was still pending is refused too. */
static int taken_stops(capstan_mw_t *mw, const capstan_unique_spec_t *s, int lr, const char *err, int *rc)
{
    if (lock_stops(mw, s, lr, err, rc))
        return 1;
    if (!refused_copy(mw, s, lr))
        return 0;
    *rc = conflict(mw, s, "was held when it was enqueued (unique_for)");
    return 1;
}

static void hold_until(capstan_mw_t *mw, const capstan_unique_spec_t *s, int on_done)
{
    capstan_outcome_t *o = mw->out;
    capstan_unique__key(o->release_key, sizeof(o->release_key), s->digest, 0, CAPSTAN_KEY_LOCKED);
    o->release_on_done = on_done;
    o->release_on_death = 1;
    o->release_type = (int)s->type;
}

void capstan__unique_note_released(const capstan_outcome_t *o, capstan_redis_t *r)
{
    capstan_unique__metric(r, (capstan_lock_type_t)o->release_type, "unlocked");
}

/* Whether the job's runtime lock was asked for before its turn (see
 * capstan__unique_prelock): then *lr, *released and err are what came back. */
static int prelocked(capstan_mw_t *mw, const capstan_unique_spec_t *s, int *lr, int *released, char *err)
{
    capstan_prelock_t *p = mw->held.prelock;
    if (!p || !p->asked || p->used || p->type != s->type || strcmp(p->digest, s->digest) != 0)
        return 0;
    p->used = 1;
    *lr = p->lr;
    *released = p->released;
    snprintf(err, CAPSTAN_ERRLEN, "%s", p->err);
    return 1;
}

/* Runs the job under the runtime lock "<digest>:RUN:LOCKED". Without a
 * wait, the lock is asked for in the round trip that writes the acks
 * waiting (with until, the job's until-lock goes in the same round trip;
 * refused, the job does not run: *rc says what then). The runtime lock is
 * released whatever happens: by the job's ack when the job is done with
 * it (the ack goes out before the next handler starts, or inside a run of
 * short jobs whose locks were asked for at once, with the next round
 * trip), otherwise at once. The lock may have been asked for already
 * (mw->held.prelock).
 * Returns 1 when the job ran, 0 when its runtime lock was refused, -1 when
 * its until-lock could not be released. */
static int while_executing(capstan_mw_t *mw, const capstan_unique_spec_t *s, int until, int *rc)
{
    char err[CAPSTAN_ERRLEN];
    capstan_lock_req_t q = request(mw, s, 1);
    int lr, released = 0;
    if (prelocked(mw, s, &lr, &released, err))
        ;
    else if (until && s->timeout <= 0)
        lr = capstan_unique__swap_ride(mw->r, &q, mw->trip.ride, mw->trip.ud, &released, err);
    else if (until && (released = capstan_unique_unlock(mw->r, s->digest, 0, mw->jid, s->type, 0,
                                                        err)) != 0)
        lr = released;
    else if (s->timeout > 0)
        lr = capstan_unique__lock_wait_then(mw->r, &q, (double)s->timeout, capstan__mw_waiting, mw,
                                            err);
    else
        lr = capstan_unique__lock_ride(mw->r, &q, mw->trip.ride, mw->trip.ud, err);
    if (released) {
        lock_stops(mw, s, released, err, rc);
        return -1;
    }
    if (lr == CAPSTAN_EDENIED) {
        *rc = conflict(mw, s, s->timeout > 0 ? "stayed busy for lock_timeout" : "is running");
        return 0;
    }
    if (lr < 0) {
        *rc = lock_error(mw, err);
        return 0;
    }
    capstan_unique__key(mw->held.runtime, sizeof(mw->held.runtime), s->digest, 1, CAPSTAN_KEY_LOCKED);
    *rc = capstan_mw_next(mw);
    mw->held.runtime[0] = '\0';
    /* until_and_while_executing's failed job takes its until-lock again,
     * which its ack then holds: the runtime lock goes now. */
    int later = !(until && back_in_line(mw));
    capstan_outcome_t *o = mw->out;
    if (later && !o->release_key[0] && o->disp != CAPSTAN_DISPOSE_KEEP) {
        capstan_unique__key(o->release_key, sizeof(o->release_key), s->digest, 1, CAPSTAN_KEY_LOCKED);
        o->release_runtime = 1;
        o->release_type = (int)s->type;
        o->release_quiet = s->timeout <= 0;
        return 1;
    }
    if (capstan_unique_unlock(mw->r, s->digest, 1, mw->jid, s->type, 0, err) < 0)
        capstan_error("%s %s: releasing runtime lock %s:RUN failed: %s; it is freed when its "
                      "ttl passes or by the reaper", mw->cls, mw->jid, s->digest, err);
    return 1;
}

/* Whether the job's runtime lock is taken at once, with no wait
 * (while_executing and its kin without a lock_timeout): it can ride a
 * round trip made anyway, or one for several jobs (capstan__unique_prelock). */
static int at_once(const capstan_unique_spec_t *s)
{
    return (s->type == CAPSTAN_LOCK_WHILE_EXECUTING || s->type == CAPSTAN_LOCK_WHILE_EXECUTING_REJECT
            || s->type == CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING) && s->timeout <= 0;
}

int capstan_unique_server_mw(capstan_mw_t *mw, void *udata)
{
    (void)udata;
    char err[CAPSTAN_ERRLEN] = "";
    capstan_unique_spec_t s;
    if (mw->held.prelock && mw->held.prelock->spec) {
        s = *mw->held.prelock->spec; /* resolved as its lock was asked for */
        free(mw->held.prelock->spec);
        mw->held.prelock->spec = NULL;
    } else if (capstan_unique__resolve(mw, &s, 1, err)) {
        capstan_warn("%s %s: uniqueness skipped: %s", mw->cls, mw->jid, err);
        return capstan_mw_next(mw);
    }
    int rc = 0, lr, ran;
    capstan_lock_req_t q = request(mw, &s, 0);
    /* Runtime locks of jobs finished here are released by their acks; a
     * lock taken at once carries them, before it. Anything else writes them
     * now, before it might wait on a lock held by one of those jobs. */
    int rides = at_once(&s) && mw->trip.ride;
    if (!rides && s.type != CAPSTAN_LOCK_NONE && mw->trip.prompt)
        mw->trip.prompt(mw->trip.ud, mw->r, 0);
    switch (s.type) {
    case CAPSTAN_LOCK_UNTIL_EXECUTED:
    case CAPSTAN_LOCK_UNTIL_EXPIRED:
        /* Re-check the lock taken at push; re-take it if it lapsed. The
         * fetch may have checked it already, on the way. */
        if (mw->held.digest && strcmp(mw->held.digest, s.digest) == 0) {
            lr = CAPSTAN_LOCK_REENTERED;
            capstan_unique__metric(mw->r, s.type, "locked"); /* as the lock call counts it */
        } else
            lr = capstan_unique_lock(mw->r, &q, err);
        if (taken_stops(mw, &s, lr, err, &rc))
            break;
        /* A unique_for job pushed from Ruby took no lock: that is no lapse.
         * Nor is news a v9 lock a Ruby app without the gem's client never
         * took, which is every job it pushes: debug, not a line a job. */
        if (lr == CAPSTAN_LOCK_ACQUIRED && !s.unique_for)
            capstan_debug("uniqueness_lapsed: %s %s fetched without its lock %s; taken again",
                         mw->cls, mw->jid, s.digest);
        if (s.type == CAPSTAN_LOCK_UNTIL_EXECUTED)
            hold_until(mw, &s, 1);
        rc = capstan_mw_next(mw);
        if (s.unique_for && !back_in_line(mw))
            note_freed(mw, &s);
        break;
    case CAPSTAN_LOCK_UNTIL_EXECUTING:
        if (s.unique_for) {
            /* Held from its fetch to its start, as Enterprise's from the
             * push to the start. */
            lr = capstan_unique_lock(mw->r, &q, err);
            if (taken_stops(mw, &s, lr, err, &rc))
                break;
            note_freed(mw, &s);
        }
        if (capstan_unique_unlock(mw->r, s.digest, 0, mw->jid, s.type, 0, err) == CAPSTAN_EDENIED)
            capstan_info("%s %s: lock %s is held by another job; running anyway (until_executing)",
                         mw->cls, mw->jid, s.digest);
        rc = capstan_mw_next(mw);
        if (back_in_line(mw)) {
            /* Stay unique while waiting in retry. */
            if (capstan_unique_lock(mw->r, &q, err) < 0)
                capstan_warn("%s %s: could not take lock %s again after the failure: %s",
                             mw->cls, mw->jid, s.digest, err[0] ? err : "held by another job");
            hold_until(mw, &s, 0);
        }
        break;
    case CAPSTAN_LOCK_WHILE_EXECUTING:
    case CAPSTAN_LOCK_WHILE_EXECUTING_REJECT:
        while_executing(mw, &s, 0, &rc);
        break;
    case CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING:
        ran = while_executing(mw, &s, 1, &rc);
        if (ran < 0)
            break;
        if (!ran || back_in_line(mw)) {
            /* Back in line (retry or rescheduled): unique again until it
             * runs; released if it dies or was dropped. */
            if (capstan_unique_lock(mw->r, &q, err) < 0)
                capstan_warn("%s %s: could not take lock %s again: %s", mw->cls, mw->jid,
                             s.digest, err[0] ? err : "held by another job");
            hold_until(mw, &s, !ran);
        }
        break;
    default:
        rc = capstan_mw_next(mw);
        break;
    }
    capstan_unique__spec_clear(&s);
    return rc;
}

void capstan__unique_server_skip(capstan_mw_t *mw)
{
    char err[CAPSTAN_ERRLEN] = "";
    capstan_unique_spec_t s;
    if (mw->held.prelock && mw->held.prelock->spec) {
        s = *mw->held.prelock->spec;
        free(mw->held.prelock->spec);
        mw->held.prelock->spec = NULL;
    } else if (capstan_unique__resolve(mw, &s, 1, err)) {
        capstan_warn("%s %s: uniqueness skipped: %s", mw->cls, mw->jid, err);
        return;
    }
    int lr, released;
    if (prelocked(mw, &s, &lr, &released, err)) {
        /* Its runtime lock was taken ahead (and until_and_while_executing's
         * until-lock let go in the same call): the ack gives it back. */
        if (lr == CAPSTAN_LOCK_ACQUIRED || lr == CAPSTAN_LOCK_REENTERED) {
            capstan_outcome_t *o = mw->out;
            capstan_unique__key(o->release_key, sizeof(o->release_key), s.digest, 1, CAPSTAN_KEY_LOCKED);
            o->release_runtime = 1;
            o->release_type = (int)s.type;
            o->release_quiet = s.timeout <= 0;
        }
    } else if (s.type == CAPSTAN_LOCK_UNTIL_EXECUTED || s.type == CAPSTAN_LOCK_UNTIL_EXECUTING
               || s.type == CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING) {
        /* The lock taken at push goes as after a run, with the ack. */
        hold_until(mw, &s, 1);
    }
    capstan_unique__spec_clear(&s);
}

size_t capstan__unique_prelock(capstan_mw_t *const *mws, size_t n, capstan_prelock_t *pre)
{
    capstan_lock_req_t reqs[n ? n : 1];
    capstan_unique_spec_t specs[n ? n : 1];
    capstan_prelock_t *asked[n ? n : 1];
    size_t k = 0, keep = n;
    memset(pre, 0, n * sizeof(*pre));
    for (size_t i = 0; i < n; i++) {
        char err[CAPSTAN_ERRLEN];
        capstan_unique_spec_t *s = &specs[k];
        if (capstan_unique__resolve(mws[i], s, 1, err)) {
            keep = i ? i : 1;
            break;
        }
        /* A job that waits for its lock, or takes none at once, ends the
         * run (the locks after it would be held while it waits); so does
         * one whose lock repeats an earlier one's. */
        int ends = !at_once(s);
        for (size_t j = 0; j < k && !ends; j++)
            ends = strcmp(asked[j]->digest, s->digest) == 0;
        capstan_prelock_t *p = &pre[i];
        if (ends || !(p->jid = strdup(mws[i]->jid))) {
            capstan_unique__spec_clear(s);
            keep = i ? i : 1;
            break;
        }
        p->type = s->type;
        p->ttl = s->ttl;
        p->limit = s->limit;
        capstan__fmt_cat(p->digest, sizeof(p->digest), s->digest, NULL);
        reqs[k] = request(mws[i], s, 1);
        asked[k++] = p;
    }
    if (k && mws[0]->trip.ride)
        capstan_unique__lock_many(mws[0]->r, reqs, asked, k, mws[0]->trip.ride, mws[0]->trip.ud);
    /* Each job's middleware takes its options over rather than resolve
     * them again. */
    for (size_t j = 0; j < k; j++) {
        if ((asked[j]->spec = malloc(sizeof(specs[j]))))
            *asked[j]->spec = specs[j];
        else
            capstan_unique__spec_clear(&specs[j]);
    }
    return keep;
}

void capstan__unique_prelock_drop(capstan_redis_t *r, capstan_prelock_t *p)
{
    char err[CAPSTAN_ERRLEN];
    if (p->asked && !p->used && p->released == 0) {
        if ((p->lr == CAPSTAN_LOCK_ACQUIRED || p->lr == CAPSTAN_LOCK_REENTERED)
            && capstan_unique_unlock(r, p->digest, 1, p->jid, p->type, 0, err) < 0)
            capstan_warn("%s: releasing runtime lock %s:RUN of a job that did not run failed: %s",
                         p->jid, p->digest, err);
        /* The until-lock went in the same call, whatever the runtime lock
         * did: back in line, the job is unique again until it runs. */
        if (p->type == CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING && p->meta) {
            capstan_lock_req_t q = { .digest = p->digest, .jid = p->jid, .type = p->type,
                                 .ttl = p->ttl, .limit = p->limit, .metadata = p->meta };
            if (capstan_unique_lock(r, &q, err) < 0)
                capstan_warn("%s: could not take lock %s again: %s", p->jid, p->digest, err);
        }
    }
    capstan__unique_prelock_clear(p);
}

void capstan__unique_prelock_clear(capstan_prelock_t *p)
{
    if (p->spec)
        capstan_unique__spec_clear(p->spec);
    free(p->spec);
    free(p->meta);
    free(p->jid);
    memset(p, 0, sizeof(*p));
}
