/* Bounds that tie settings together, beyond each setting's own row in the
 * settings table (config/settings.c). Not public. */
#ifndef CAPSTAN_CONFIG_BOUNDS_H
#define CAPSTAN_CONFIG_BOUNDS_H

/* The liveness key must live at least this many heartbeats: two refreshes
 * may fail (a Redis blip) before it lapses. */
#define CAPSTAN__LIVENESS_BEATS 3

/* A concurrent limiter's slot is a lease renewed every third of its
 * lock_timeout while its job runs: under a second, renewals come faster
 * than a loaded host keeps up with, and one slow round trip lets a live
 * job's slot lapse, so the limit is exceeded. */
#define CAPSTAN__MIN_LIMIT_LEASE 1.0

#endif
