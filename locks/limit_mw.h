/* The limiter's server middleware (locks/limit_mw.c), which the runtime
 * puts in every server chain. Not part of the public API. */
#ifndef CAPSTAN_LOCKS_LIMIT_MW_H
#define CAPSTAN_LOCKS_LIMIT_MW_H

#include "middleware/mw.h"

/* The URL of the Redis holding the state of limiter name (of class
 * options cc, or NULL) when that is not the job's own Redis, else NULL: a
 * sharded process keeps each limiter in one shard, its home. */
typedef const char *(*capstan__limit_home_fn)(void *ud, const capstan_class_conf_t *cc, const char *name);

/* The "limit" server middleware (locks/limit_mw.c), its limiters at
 * home(ud, ...) when home is not NULL. */
int capstan__limit_mw(capstan_mw_t *mw, capstan__limit_home_fn home, void *ud);

#endif
