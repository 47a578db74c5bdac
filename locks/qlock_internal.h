/* Shared by the files of the queued-lock module (locks/qlock*.c); not
 * part of the public API. */
#ifndef CAPSTAN_LOCKS_QLOCK_INTERNAL_H
#define CAPSTAN_LOCKS_QLOCK_INTERNAL_H

#include <stddef.h>

#include "capstan/qlock.h"
#include "redis/keys.h"

#define QL_KEY_MAX (CAPSTAN_QLOCK_NAME_MAX + 32)

typedef struct ql_keys {
    char lock[QL_KEY_MAX];
    char queue[QL_KEY_MAX];
    char seen[QL_KEY_MAX];
    char fence[QL_KEY_MAX];
} ql_keys_t;

/* Builds the four keys of lock name. Returns 0 or CAPSTAN_EINVAL (empty or too
 * long a name) with err filled. */
int capstan__qlock_keys(const char *name, ql_keys_t *k, char *err);
/* Hands ev to the client's event callback, if any (c may be NULL). */
void capstan__qlock_emit(const capstan_qlock_client_t *c, capstan_qlock_event_t *ev);

#endif
