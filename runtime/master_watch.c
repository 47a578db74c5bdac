/* The master watch thread, started for a sentinel URL only. After a
 * SENTINEL FAILOVER the old master goes on taking writes for seconds,
 * until the sentinels demote it, and what a job acks there is lost with
 * it (the job runs again on the new master). The sentinels announce the
 * switch on +switch-master (redis/sentinel.h): on one, this thread has
 * every connection of the process leave the old master at once rather
 * than at the housekeeper's next beat, which still asks the sentinels
 * every beat for an announcement this thread missed. */
#include "runtime/rt.h"
#include "runtime/shards.h"

#include "redis/scripts.h"
#include "redis/sentinel.h"
#include "support/log.h"
#include "support/time.h"

/* The longest a wait lasts, so that a stop is seen within about as long. */
#define SLICE 1.0
/* After an announcement, how long and how often the sentinels are asked
 * again while the one asked first names the old master still: the one
 * that announced may not be the first asked, and the others hear of the
 * switch from it within a couple of seconds. */
#define FOLLOW_FOR 4.0
#define FOLLOW_EVERY 0.2
/* How often a connection that cannot be made is tried again. */
#define CONNECT_EVERY 5.0

/* Connects r when it is not usable (never made, lost, or of an era that
 * ended), at most every CONNECT_EVERY seconds unless now. Its outages are
 * the other threads' to log. Returns 1 when r is usable. */
static int usable(capstan_redis_t *r, double *next_try, int now)
{
    if (capstan_redis_ok(r))
        return 1;
    if (!now && capstan__mono() < *next_try)
        return 0;
    if (capstan_redis_connect(r) == 0)
        return 1;
    *next_try = capstan__mono() + CONNECT_EVERY;
    return 0;
}

void *capstan__master_watch_main(void *arg)
{
    capstan_runtime_t *rt = arg;
    capstan__member_log(rt);
    char err[CAPSTAN_ERRLEN];
    capstan_sentinel_watch_t *w = capstan__sentinel_watch_new(rt->cfg->redis_url, err);
    /* A short timeout: a connect to a master that does not answer must
     * not hold up a stop. */
    capstan_redis_t *r = w ? capstan_redis_new(rt->cfg->redis_url, SLICE, err) : NULL;
    if (!r) {
        capstan_error("master watch: %s", err);
        capstan__sentinel_watch_free(w);
        return NULL;
    }
    double next_try = 0, follow_until = 0;
    int failing = 0;
    while (!atomic_load(&rt->housekeeper_stop)) {
        /* Made before the switch, r is what tells the sentinels' new
         * master from the one every connection of its era was made to. */
        int was_ok = usable(r, &next_try, 0);
        double slice = capstan__mono() < follow_until ? FOLLOW_EVERY : SLICE;
        int rc = capstan__sentinel_watch_wait(w, slice, err);
        if (rc < 0) {
            if (!failing)
                capstan_warn("cannot subscribe to the sentinels' +switch-master (%s); a new master "
                             "is found at the next beat instead", err);
            failing = 1;
            capstan__rt_wait(rt, SLICE);
            continue;
        }
        if (failing)
            capstan_info("subscribed to the sentinels' +switch-master again");
        failing = 0;
        if (rc == 1)
            follow_until = capstan__mono() + FOLLOW_FOR;
        if (capstan__mono() >= follow_until)
            continue;
        /* A connect resolves the master afresh and ends the era itself
         * when the sentinels name another; a connection still usable asks
         * them. Either way this switch is followed. */
        if (!was_ok || !capstan_redis_ok(r)) {
            if (usable(r, &next_try, 1))
                follow_until = 0;
        } else if (capstan__redis_follow_master(r)) {
            follow_until = 0;
        }
    }
    capstan_redis_free(r);
    capstan__sentinel_watch_free(w);
    return NULL;
}
