/* Internal: where redis/connection.c records the digests Redis gives for the scripts. */
#ifndef KIQ_REDIS_SCRIPTS_H
#define KIQ_REDIS_SCRIPTS_H

#include <stddef.h>
#include "kiq/redis.h"

/* Records the SHA1 (40 hex chars) SCRIPT LOAD returned for s. */
void kiq_script_learn_sha(kiq_script_t s, const char *sha, size_t len);

#endif
