/* Internal: what the housekeeper asks of the batches. */
#ifndef KIQ_BATCH_INTERNAL_H
#define KIQ_BATCH_INTERNAL_H

#include "kiq/redis.h"

/* One step of a walk over "batches:open" (ZSCAN from cursor, "" or "0" to
 * start; cursor gets the next, "0" at the end): batches whose data has expired
 * leave it and "batches", counted in *removed. Returns 0 or KIQ_EREDIS /
 * KIQ_EREPLY with err filled. */
int kiq__batches_prune(kiq_redis_t *r, char cursor[32], long *removed, char *err);

#endif
