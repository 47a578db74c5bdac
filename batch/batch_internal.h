/* Internal: what the housekeeper asks of the batches. */
#ifndef CAPSTAN_BATCH_INTERNAL_H
#define CAPSTAN_BATCH_INTERNAL_H

#include "capstan/redis.h"

/* One step of a walk over "batches:open" (ZSCAN from cursor, "" or "0" to
 * start; cursor gets the next, "0" at the end): batches whose data has expired
 * leave it and "batches", counted in *removed. Returns 0 or CAPSTAN_EREDIS /
 * CAPSTAN_EREPLY with err filled. */
int capstan__batches_prune(capstan_redis_t *r, char cursor[32], long *removed, char *err);

#endif
