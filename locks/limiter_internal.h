/* What the limiter (locks/limiter.c) offers its middleware beyond the
 * public capstan/limiter.h. Not part of the public API. */
#ifndef CAPSTAN_LOCKS_LIMITER_INTERNAL_H
#define CAPSTAN_LOCKS_LIMITER_INTERNAL_H

#include "capstan/limiter.h"

/* capstan_limiter_acquire_points with the attempts on r and a concurrent
 * waiter's blocking wait for a release on w: a connection of the caller's
 * thread that nothing else uses meanwhile (it may be r). w NULL, or not
 * connected: the waiter rechecks every 50 ms instead. waiting(ud), when
 * not NULL, is called once as a wait begins (the runtime writes the acks
 * of finished jobs then, which would otherwise wait with it). A token
 * whose id is set on entry keeps it (a slot the fetch took under that id
 * is then renewed, not taken twice); zero it for a new holder. */
int capstan__limiter_acquire_wait(capstan_limiter_t *lim, capstan_redis_t *r, capstan_redis_t *w,
                                  long points, double wait_timeout, capstan_limit_token_t *token,
                                  double *retry_in, void (*waiting)(void *), void *ud, char *err);

/* Where this thread's limiters keep their state instead of Redis: the
 * testing kit's memory (testing/, capstan/testing.h), or NULL
 * (production). attempt answers one attempt as the acquire script does (1
 * taken, 0 refused with *wait_ms, or an error), release gives a concurrent
 * slot back. With a store nothing waits (wait_timeout is one attempt) and
 * no lease is extended. */
typedef struct capstan_limit_store {
    int (*attempt)(void *ud, const char *name, capstan_limit_type_t type, long count, long long ms,
                   const char *holder, long points, long long *wait_ms);
    void (*release)(void *ud, const char *name, const char *holder);
    void *ud;
} capstan_limit_store_t;
/* Sets this thread's store (borrowed until set again), NULL for Redis. */
void capstan__limit_store_set(const capstan_limit_store_t *store);
/* This thread's store, or NULL. */
const capstan_limit_store_t *capstan__limit_store(void);

/* One attempt to take a slot of lim as token's holder (its id set), not
 * counted in the metrics: the fetch's, which the job's middleware then
 * takes over as the same holder and counts. Returns 1 taken, 0 refused,
 * or an error with err filled. */
int capstan__limiter_take(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                          char *err);
/* Gives back what capstan__limiter_take took, as uncounted. */
int capstan__limiter_untake(capstan_limiter_t *lim, capstan_redis_t *r, const capstan_limit_token_t *token,
                            char *err);

/* A concurrent limiter's slots (zset limiter:NAME:held), the list its
 * releases wake waiters on, its size and its lease (ms): what the fetch
 * needs to take a slot with a job (lua/fetch.lua). */
const char *capstan__limiter_name(const capstan_limiter_t *lim);
const char *capstan__limiter_held_key(const capstan_limiter_t *lim);
const char *capstan__limiter_free_key(const capstan_limiter_t *lim);
long capstan__limiter_size(const capstan_limiter_t *lim);
long long capstan__limiter_lease_ms(const capstan_limiter_t *lim);

#endif
