/* sidekiq-limit_fetch's caps on queues (capstan_queue_limit_t: the file's
 * `limits:` and `process_limits:`) as concurrent limiters: "queue:NAME"
 * for the fleet's cap, "queue:NAME@PID:HEX" for one process's. The fetch
 * takes a slot of each with the job, under the holder id "job:<jid>"
 * (lua/fetch.lua), so that a queue at its cap is not fetched from and no
 * processor waits for it; the "queue_limit" server middleware
 * (locks/limit_mw.c) keeps those slots while the job runs, taking them
 * then should the fetch not have (the basic fetch, a lease that lapsed
 * while the job waited to start), and gives them back after. A slot is a
 * lease, so that a dead process's come back when theirs lapse. Not part of
 * the public API. */
#ifndef CAPSTAN_LOCKS_QUEUE_LIMIT_H
#define CAPSTAN_LOCKS_QUEUE_LIMIT_H

#include "capstan/config.h"
#include "capstan/limiter.h"
#include "middleware/mw.h"

/* The holder id of a job's slots is this and its jid. */
#define CAPSTAN__QLIMIT_HOLDER "job:"
/* s: a cap's lease, renewed every third of it while the job runs. Short, as
 * a job given back unrun (a shutdown) keeps its slots until they lapse. */
#define CAPSTAN__QLIMIT_LEASE 10.0

typedef struct capstan__qlimit {
    const char *queue;         /* borrowed from the config */
    capstan_limiter_t *lim[2]; /* the fleet's cap, the process's; NULL: none */
} capstan__qlimit_t;

typedef struct capstan__qlimits {
    size_t n;
    capstan__qlimit_t *q;
} capstan__qlimits_t;

/* The caps of cfg's queue_limits, for this process. Returns 0 with *out
 * NULL when cfg has none, or CAPSTAN_ENOMEM / CAPSTAN_EINVAL with err. */
int capstan__qlimits_new(const capstan_config_t *cfg, capstan__qlimits_t **out, char *err);
void capstan__qlimits_free(capstan__qlimits_t *q);
/* queue's caps, or NULL when it has none (q may be NULL). */
const capstan__qlimit_t *capstan__qlimits_find(const capstan__qlimits_t *q, const char *queue);

/* The "queue_limit" server middleware; udata is the runtime's
 * capstan__qlimits_t (NULL: nothing to do). */
int capstan__queue_limit_mw(capstan_mw_t *mw, void *udata);

#endif
