/* Periodic schedules (capstan/periodic.h): as the config holds them, from
 * capstan_periodic_add and the file's periodic: section (conf.c; the
 * section's reader is config/yaml_periodic.c), and the thread that
 * enqueues their ticks (thread.c), which the runtime starts. Not public. */
#ifndef CAPSTAN_PERIODIC_PERIODIC_H
#define CAPSTAN_PERIODIC_PERIODIC_H

#include <stdatomic.h>
#include <stdint.h>

#include "capstan/periodic.h"
#include "capstan/redis.h"
#include "support/cron.h"
#include "support/tz.h"

struct capstan_periodic_conf {
    char *name, *cron, *tz, *cls, *queue, *args, *extra; /* owned; tz NULL = UTC,
                                                      extra NULL = none */
    int retry;
    capstan_missed_t missed;
    char *origin; /* where it was declared: "capstan.yml:12", or "C" */
    int gem;      /* read from a sidekiq-scheduler or sidekiq-cron section
                     (schedule:), not from periodic: */
};

/* capstan_periodic_add with its origin (copied; NULL = "C"). */
int capstan__periodic_add(capstan_config_t *cfg, const capstan_periodic_opts_t *o, const char *origin,
                          char *err);
void capstan__periodic_conf_free(capstan_config_t *cfg);
/* Drops cfg's schedules whose gem is gem: an environment's section
 * replaces the top level's of the same kind. */
void capstan__periodic_conf_drop(capstan_config_t *cfg, int gem);

/* The zone of a schedule whose expression parsed into c and whose tz: is
 * tz (NULL when not given): the one cron: names after its fields, else tz.
 * Refuses an empty tz, a tz other than cron:'s zone and a zone that does
 * not load. Returns it loaded (capstan__tz_free) with *zone its name (NULL
 * for UTC), or NULL with why (CAPSTAN_ERRLEN) filled and *bad the key at
 * fault, "cron" or "tz". */
capstan_tz_t *capstan__periodic_zone(const capstan_cron_t *c, const char *tz, const char **zone,
                                     const char **bad, char *why);

/* What the thread is given by the runtime that starts it. */
typedef struct capstan_periodic_env {
    const capstan_config_t *cfg; /* the schedules, redis_url, timestamps */
    atomic_int *stop;            /* the thread ends once it is set */
    /* Connects r, retrying until it works (0) or *stop is set (nonzero). */
    int (*connect)(void *ud, capstan_redis_t *r);
    /* Sleeps up to s seconds; returns early when woken. */
    void (*wait)(void *ud, double s);
    void *ud;
} capstan_periodic_env_t;

/* The thread (env: a capstan_periodic_env_t that outlives it) that
 * enqueues the ticks of env->cfg's schedules; started only when there are
 * some. */
void *capstan__periodic_main(void *env);
/* The jid of schedule name's tick at epoch second tick: 24 hex digits
 * derived from the two, the same in every process. */
void capstan__periodic_jid(const char *name, int64_t tick, char out[25]);

#endif
