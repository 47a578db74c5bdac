/* Internal: what a process's fetch leaves in Redis at a clean stop. */
#ifndef CAPSTAN_FETCH_LEAVE_H
#define CAPSTAN_FETCH_LEAVE_H

#include "capstan/redis.h"

/* At the end of a clean stop, once every job was acked or given back:
 * when identity's working list is empty, deletes its liveness key, as no
 * job of it is left to recover; otherwise logs how many jobs remain there
 * (recovered once the process is gone). Returns 0 when the key went, else
 * 1 (jobs remain, or Redis did not answer). */
int capstan__fetch_leave(capstan_redis_t *r, const char *identity);

#endif
