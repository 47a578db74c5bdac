/* Internal: the look at the fleet (fleet.c), which of this process's
 * queues a Ruby Sidekiq process reads too, and so what becomes of a job
 * whose class has no handler here. */
#ifndef CAPSTAN_FLEET_FLEET_H
#define CAPSTAN_FLEET_FLEET_H

#include "capstan/config.h"
#include "capstan/redis.h"

typedef struct capstan_fleet capstan_fleet_t;

/* A fleet of c's queues, nothing shared yet; c outlives it. shard names
 * the shard c's Redis is in a sharded process (its lines say it), else
 * NULL. NULL when out of memory. */
capstan_fleet_t *capstan__fleet_new(const capstan_config_t *c, const char *shard);
void capstan__fleet_free(capstan_fleet_t *f);
/* Reads the process set and each process's info on r, notes the queues of
 * ours a Ruby process reads (and keeps them in Redis), and logs one line
 * when that changes. Any thread, one look at a time. */
void capstan__fleet_look(capstan_fleet_t *f, capstan_redis_t *r);
/* Whether a Ruby process read queue at one of the looks of the last ten
 * minutes (0 when f is NULL). Any thread. */
int capstan__fleet_shared(const capstan_fleet_t *f, const char *queue);
/* The unknown_class policy for a job of queue, looking at the fleet f (or
 * NULL) again on r when the last look is a second old: c's when it sets
 * unknown_class, else requeue for a shared queue and, in the process's
 * first minute, for every queue, and the default for the others. *why
 * says why when that is not the config's, else NULL. Any thread. */
capstan_unknown_class_t capstan__unknown_policy(capstan_fleet_t *f, const capstan_config_t *c, capstan_redis_t *r,
                                                const char *queue, const char **why);

#endif
