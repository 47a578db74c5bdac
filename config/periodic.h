/* The schedules of capstan_periodic_add and the file's periodic: section,
 * as the config holds them (config/periodic.c), for the runtime's
 * periodic thread and `capstan periodic`. Not public. */
#ifndef CAPSTAN_CONFIG_PERIODIC_H
#define CAPSTAN_CONFIG_PERIODIC_H

#include "capstan/periodic.h"

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

#endif
