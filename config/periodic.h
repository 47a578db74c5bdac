/* The schedules of capstan_periodic_add and the file's periodic: section,
 * as the config holds them (config/periodic.c), for the runtime's
 * periodic thread and `capstan periodic`. Not public. */
#ifndef CAPSTAN_CONFIG_PERIODIC_H
#define CAPSTAN_CONFIG_PERIODIC_H

#include "capstan/periodic.h"
#include "support/cron.h"
#include "support/tz.h"

struct capstan_periodic_conf {
    char *name, *cron, *tz, *cls, *queue, *args, *extra; /* owned; tz NULL = UTC,
                                                      extra NULL = none */
    int retry;
    capstan_missed_t missed;
    char *origin; /* where it was declared: "capstan.yml:12", or "C" */
};

/* capstan_periodic_add with its origin (copied; NULL = "C"). */
int capstan__periodic_add(capstan_config_t *cfg, const capstan_periodic_opts_t *o, const char *origin,
                          char *err);
void capstan__periodic_conf_free(capstan_config_t *cfg);

/* The zone of a schedule whose expression parsed into c and whose tz: is
 * tz (NULL when not given): the one cron: names after its fields, else tz.
 * Refuses an empty tz, a tz other than cron:'s zone and a zone that does
 * not load. Returns it loaded (capstan__tz_free) with *zone its name (NULL
 * for UTC), or NULL with why (CAPSTAN_ERRLEN) filled and *bad the key at
 * fault, "cron" or "tz". */
capstan_tz_t *capstan__periodic_zone(const capstan_cron_t *c, const char *tz, const char **zone,
                                     const char **bad, char *why);

#endif
