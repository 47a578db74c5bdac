/* The shortest periods the settings accept, one table for the YAML reader
 * (which names the file and line) and capstan_config_validate (which also
 * guards settings made in C). A period far below these does nothing useful
 * and harms: a housekeeper beating every microsecond floods Redis, and a
 * liveness key that lives for microseconds lapses between any two
 * refreshes, so other processes take a live process's jobs. Not public. */
#ifndef CAPSTAN_CONFIG_BOUNDS_H
#define CAPSTAN_CONFIG_BOUNDS_H

#include <stdio.h>
#include <string.h>

/* The liveness key must live at least this many heartbeats: two refreshes
 * may fail (a Redis blip) before it lapses. */
#define CAPSTAN__LIVENESS_BEATS 3

/* A concurrent limiter's slot is a lease renewed every third of its
 * lock_timeout while its job runs: under a second, renewals come faster
 * than a loaded host keeps up with, and one slow round trip lets a live
 * job's slot lapse, so the limit is exceeded. */
#define CAPSTAN__MIN_LIMIT_LEASE 1.0

/* The least value other than 0 a period setting takes (seconds), or 0 when
 * it has none beyond being positive. */
static inline double capstan__config_floor(const char *key)
{
    static const struct {
        const char *key;
        double floor;
    } floors[] = {
        /* Each beat costs a few round trips (liveness refresh, the beat,
         * the working-list check) and, with Redis down, a reconnect: two
         * a second is cheap, and fast enough for tests that want crash
         * recovery in seconds. Sidekiq beats every 10 s, capstan every 5. */
        { "heartbeat_interval", 0.5 },
        /* It must outlast a missed refresh and a slow round trip on a
         * loaded host; under 2 s, scheduling jitter alone would lose it. */
        { "liveness_ttl", 2 },
        /* Each poll runs a script over retry and schedule; ten a second
         * is finer than any due time needs. */
        { "poll_interval_average", 0.1 },
        { "average_scheduled_poll_interval", 0.1 },
    };
    for (size_t i = 0; i < sizeof(floors) / sizeof(floors[0]); i++)
        if (strcmp(key, floors[i].key) == 0)
            return floors[i].floor;
    return 0;
}

/* What a period setting must be, in the words both readers use: key's
 * floor, and whether 0 (off, or chosen by capstan) is allowed. */
static inline void capstan__config_period_want(const char *key, int zero_ok, char *buf, size_t size)
{
    double floor = capstan__config_floor(key);
    if (floor > 0)
        snprintf(buf, size, zero_ok ? "must be 0 or a number >= %g" : "must be a number >= %g", floor);
    else
        snprintf(buf, size, "%s", zero_ok ? "must be a number >= 0" : "must be a number greater than 0");
}

/* Whether v is a value key takes (see capstan__config_period_want). */
static inline int capstan__config_period_ok(const char *key, int zero_ok, double v)
{
    return v >= 0 && (zero_ok || v > 0) && (v == 0 || v >= capstan__config_floor(key));
}

#endif
