/* The housekeeper thread: every beat it refreshes the fetch liveness key
 * and writes the beat (heartbeat.c), gives back strays from this process's
 * own working list, and now and then recovers orphaned jobs under a
 * fleet-wide lease, looks at which queues Ruby processes read (fleet/fleet.c)
 * and reaps orphaned uniqueness locks in v9's reaper role.
 * Lock metrics are flushed with the beat. Between beats it writes the
 * acks of finished jobs that waited too long for a processor to send them
 * (capstan__feed_ack_late). */
#include "runtime/rt.h"
#include "runtime/shards.h"
#include "runtime/source.h"

#include <stdio.h>

#include "batch/batch_internal.h"
#include "unique/admin_internal.h"
#include "observe/prometheus.h"
#include "redis/keys.h"
#include "support/log.h"
#include "support/number.h"
#include "support/time.h"

/* Refreshes the liveness key (capstan__liveness_refresh; fetchers refresh
 * it too when this has not for half its TTL). *until is when the key
 * lapses by this process's clock, if no refresh gets through before. A
 * refresh that finds the key gone re-creates it at once and says so. While
 * the key is gone others may take this process's jobs, but only once a
 * pass has seen it missing for liveness_ttl / 2 with Redis taking writes
 * (lua/recover.lua); this process re-creates it sooner as long as it
 * reaches Redis, since it refreshes at least every liveness_ttl / 3. */
static void refresh_liveness(capstan_runtime_t *rt, capstan_redis_t *r, double *until, int *warned)
{
    double ttl = rt->cfg->liveness_ttl, t0 = capstan__mono();
    int rc = capstan__liveness_refresh(rt->view.liveness, r);
    if (rc >= 0) {
        if (rc == 1)
            capstan_warn("liveness key " CAPSTAN_KEY_HEARTBEAT "%s was gone (%s); re-created it",
                         rt->self.identity, t0 > *until ? "it lapsed while Redis refused or missed the refresh"
                                               : "Redis lost it");
        *until = t0 + ttl;
        *warned = 0;
        return;
    }
    if (t0 > *until && !*warned) {
        *warned = 1;
        capstan_error("liveness key not refreshed for %.1f s, longer than liveness_ttl (%s); it is "
                      "re-created as soon as Redis takes it, before another process may take this "
                      "process's jobs, unless this process cannot reach Redis while others can",
                      t0 - *until + ttl, rc == CAPSTAN_EREDIS ? capstan_redis_error(r) : "refused");
    }
}

/* Jobs waiting in the quarantine that no worker of this supervisor moved
 * there (left by a stop, or by another host's workers) need its quarantine
 * worker too: one LLEN a pass, until it is asked for. */
static void quarantine_pass(capstan_runtime_t *rt, capstan_redis_t *r)
{
    if (!rt->link.quarantine || atomic_load(&rt->link.board_end->quarantined))
        return;
    redisReply *n = capstan_redis_cmdf(r, "LLEN " CAPSTAN_KEY_QUEUE "%s", rt->link.quarantine);
    if (n && n->type == REDIS_REPLY_INTEGER && n->integer > 0)
        capstan__board_quarantined(rt);
    freeReplyObject(n);
}

static void recovery_pass(capstan_runtime_t *rt, capstan_redis_t *r)
{
    quarantine_pass(rt, r);
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%ld", (long)(rt->cfg->recovery_interval > 1 ? rt->cfg->recovery_interval - 0.5 : 1));
    redisReply *lease = capstan_redis_cmdf(r, "SET %s %s NX EX %s", CAPSTAN_KEY_RECOVERY_LEASE, rt->self.identity, ttl);
    int mine = lease && lease->type == REDIS_REPLY_STATUS;
    freeReplyObject(lease);
    if (!mine)
        return; /* another process of the fleet does this pass */
    capstan__recover_orphans(rt, r);
    /* A batch that expired before it succeeded leaves the open-batches
     * index (and capstan_batches_open) here, a page a pass. */
    char err[CAPSTAN_ERRLEN];
    long gone = 0;
    if (capstan__batches_prune(r, rt->keeper.batch_cursor, &gone, err))
        capstan_warn("open-batches index: %s", err);
    else if (gone)
        capstan_info("%ld expired batches left the open-batches index", gone);
}

void capstan__recover_orphans(capstan_runtime_t *rt, capstan_redis_t *r)
{
    capstan_recovery_t rec = {0};
    char err[CAPSTAN_ERRLEN];
    int (*pass)(capstan_redis_t *, const char *, int, double, capstan_ts_format_t, int, capstan_recovery_t *,
                char *) = capstan__fetch_recover_full_due(r, rt->keeper.passes++) ? capstan__fetch_recover
                                                                                    : capstan__fetch_recover_known;
    /* The batches it fires are counted as its shard's, on whichever
     * thread it runs (the main thread at start). */
    capstan_metrics_t *was = capstan__metrics_use(rt->member.metrics);
    int rc = pass(r, rt->self.identity, rt->cfg->max_recoveries, rt->cfg->liveness_ttl, rt->cfg->timestamps,
                  rt->cfg->sidekiq_metrics, &rec, err);
    capstan__metrics_use(was);
    if (rc) {
        capstan_warn("orphan recovery: %s", err);
        return;
    }
    if (rec.recovered || rec.killed)
        capstan_warn("recovered %ld orphaned jobs from %ld dead processes; %ld poison pills sent to the dead set",
                     rec.recovered, rec.lists, rec.killed);
    if (rec.suspects)
        capstan_info("%ld working lists have no liveness key; recovered after %.1f s if still so",
                     rec.suspects, rt->cfg->liveness_ttl / 2);
    if (rec.left != rt->keeper.last_left && rec.left)
        capstan_error("%ld orphaned jobs stay in dead processes' working lists: their queue key "
                      "holds another type than a list (or \"dead\" is not a sorted set); they move "
                      "once it is fixed", rec.left);
    rt->keeper.last_left = rec.left;
    capstan__metrics_add(capstan__rt_metrics(rt), CAPSTAN_METRIC_ORPHANS_RECOVERED, rec.recovered);
    capstan__metrics_add(capstan__rt_metrics(rt), CAPSTAN_METRIC_POISON_PILLS, rec.killed);
}

/* The uniqueness reaper, in v9's fleet role (uniquejobs:reaper, held for
 * the interval plus 2 % and renewed each run), so that one process of a
 * mixed Ruby/capstan fleet reaps at a time. */
static void reaper_pass(capstan_runtime_t *rt, capstan_redis_t *r)
{
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    capstan_reap_result_t res;
    char err[CAPSTAN_ERRLEN];
    o.count = rt->cfg->reaper_count;
    o.timeout = rt->cfg->reaper_timeout;
    o.owner = rt->self.identity;
    o.role_ttl = rt->cfg->reaper_interval + capstan__ceil(rt->cfg->reaper_interval * 0.02);
    if (capstan__unique_reap(r, &o, &res, err))
        capstan_warn("uniqueness reaper: %s", err);
    else if (res.removed)
        capstan_info("uniqueness reaper removed %ld orphaned locks (%ld examined)", res.removed,
                     res.examined);
    capstan__reap_result_clear(&res);
}

/* capstan_fetch_held_fn over what the feed counts. */
static int feed_holds(const char *payload, size_t len, double since, void *ud)
{
    return capstan__feed_holds(ud, payload, len, since);
}

/* Acks that found their job gone. The ack cannot tell why: this process
 * gave the job back itself (a hard stop, a give-back retried after a lost
 * reply took a copy fetched again meanwhile), another process recovered it
 * while this one was cut off or frozen past its lease, or an earlier try of
 * the same ack was written and its reply lost. Said once a pass, with the
 * count, so a partitioned worker's own log shows it. */
static void late_acks(capstan_runtime_t *rt)
{
    long said = rt->keeper.late_said;
    long n = capstan__metrics_get(capstan__rt_metrics(rt), CAPSTAN_METRIC_LATE_ACKS);
    if (n > said)
        capstan_warn("%ld finished jobs were no longer in this process's working list when acked: "
                     "given back for another run meanwhile (by this process, or by another's "
                     "recovery if this one was cut off or frozen past liveness_ttl; they may run "
                     "again) or acked by an earlier try whose reply was lost", n - said);
    rt->keeper.late_said = n;
}

/* Recovery never touches a live process's list, so a job stranded in our
 * own (its fetch reply lost with the connection) is ours to give back. */
static void reclaim_pass(capstan_runtime_t *rt, capstan_redis_t *r, capstan_strays_t *st)
{
    long n = 0;
    char err[CAPSTAN_ERRLEN];
    double min_age = rt->cfg->heartbeat_interval > 1 ? rt->cfg->heartbeat_interval : 1;
    rt->source->read_deferred(rt);
    if (capstan__fetch_reclaim(r, rt->self.identity, st, min_age, feed_holds, rt->feed, &n, err))
        capstan_warn("working list check: %s", err);
    else if (n)
        capstan_warn("gave back %ld jobs that sat in this process's working list with no processor "
                     "running them", n);
}

void *capstan__housekeeper_main(void *arg)
{
    capstan_runtime_t *rt = arg;
    capstan__member_log(rt);
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(rt->cfg->redis_url, 10, err);
    if (!r) {
        capstan_error("housekeeper: %s", err);
        return NULL;
    }
    double next_recovery = capstan__mono() + rt->cfg->recovery_interval;
    /* As v9, the first run is one interval after start. */
    double next_reap = capstan__mono() + rt->cfg->reaper_interval;
    /* Ruby processes come and go with deploys: looked at again as often
     * as orphans are, by every process (fleet/fleet.c; the first look was at
     * start). */
    double next_look = capstan__mono() + rt->cfg->recovery_interval;
    capstan_strays_t *strays = rt->source->working_list ? capstan__strays_new() : NULL;
    int was_connected = 0, warned = 0;
    /* The key was set at start, just before this thread. */
    double lease_until = capstan__mono() + rt->cfg->liveness_ttl;
    double next_beat = capstan__mono() + rt->cfg->heartbeat_interval, next_try = 0;
    capstan_probe_t *probe = rt->link.probe;
    atomic_store(&probe->beat, rt->cfg->heartbeat_interval);
    atomic_store(&probe->answered, capstan__mono()); /* the start's beat */
    while (!atomic_load(&rt->housekeeper_stop)) {
        double now = capstan__mono(), wait = next_beat - now;
        /* The ack's round trip is a wait on Redis too: not a turn. */
        atomic_store(&probe->turn, 0);
        double late = rt->source->ack_late(rt->keeper.slot, r);
        atomic_store(&probe->turn, capstan__mono());
        if (late < 0 && now >= next_try) {
            /* Acks wait for this connection: one try a second. */
            next_try = now + 1;
            capstan_redis_connect(r);
            continue;
        }
        if (late >= 0 && late < wait)
            wait = late;
        else if (late < 0 && next_try - now < wait)
            wait = next_try - now;
        if (wait > 0)
            capstan__rt_wait(rt, wait);
        if (atomic_load(&rt->housekeeper_stop))
            break;
        if (capstan__mono() < next_beat)
            continue;
        double beat_at = capstan__mono();
        next_beat = beat_at + rt->cfg->heartbeat_interval;
        /* From here on it waits on Redis: not stuck, but not ready when
         * that takes longer than CAPSTAN_PROBE_STALL (board.h). */
        atomic_store(&probe->turn, 0);
        atomic_store(&probe->asked, capstan__mono());
        /* A master replaced (SENTINEL FAILOVER) may take writes until the
         * sentinels demote it. The master watch (master_watch.c) has every
         * connection leave it when the sentinels announce the switch; this
         * makes it within a beat when that announcement was missed. */
        capstan__redis_follow_master(r);
        if (!capstan_redis_ok(r)) {
            /* Tried every beat, not backing off further: the liveness key
             * must be back well within the recovery grace. */
            if (capstan__rt_connect_every(rt, r, &rt->housekeeper_stop, rt->cfg->heartbeat_interval))
                break;
            /* Cut off from Redis, so maybe the whole fleet was: the others'
             * liveness keys may have lapsed while they lived on. Give them
             * a full TTL to refresh before judging any of them dead. */
            double after = capstan__mono() + rt->cfg->liveness_ttl;
            if (was_connected && next_recovery < after)
                next_recovery = after;
            was_connected = 1;
        }
        refresh_liveness(rt, r, &lease_until, &warned);
        int beat = capstan__heartbeat_beat(rt, r, 0);
        atomic_store(&probe->fetch_failing, atomic_load(&rt->health.fetch_failing));
        atomic_store(&probe->quiet, atomic_load(&rt->quiet));
        if (beat != CAPSTAN_EREDIS)
            atomic_store(&probe->answered, capstan__mono());
        atomic_store(&probe->asked, 0);
        if (beat == CAPSTAN_EREDIS)
            continue;
        if (strays)
            reclaim_pass(rt, r, strays);
        late_acks(rt);
        if (capstan__mono() >= next_recovery) {
            /* From the beat's start, not from after its round trips: with
             * recovery_interval a multiple of heartbeat_interval, every
             * due pass runs at its beat, not one beat late. */
            next_recovery = beat_at + rt->cfg->recovery_interval;
            recovery_pass(rt, r);
        }
        if (capstan__mono() >= next_look) {
            next_look = capstan__mono() + rt->cfg->recovery_interval;
            capstan__fleet_look(rt->view.fleet, r);
        }
        if (rt->cfg->reaper_interval > 0 && capstan__mono() >= next_reap) {
            next_reap = capstan__mono() + rt->cfg->reaper_interval;
            reaper_pass(rt, r);
        }
    }
    /* Stopping: no longer fetching, and not stuck while the jobs finish. */
    atomic_store(&probe->quiet, 1);
    atomic_store(&probe->turn, 0);
    if (rt->cfg->reaper_interval > 0 && capstan_redis_ok(r))
        capstan__unique_reaper_release(r, rt->self.identity); /* let another take over now */
    capstan__strays_free(strays);
    capstan_redis_free(r);
    return NULL;
}
