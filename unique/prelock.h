/* Runtime locks asked for ahead of their jobs' turns, for a run of jobs
 * in one round trip (unique/server.c): the processor asks, and each job's
 * server middleware takes its result over instead of asking itself. Not
 * part of the public API. */
#ifndef CAPSTAN_UNIQUE_PRELOCK_H
#define CAPSTAN_UNIQUE_PRELOCK_H

#include <stddef.h>
#include "capstan/unique.h"
#include "middleware/mw.h"

/* A runtime lock asked for before its job's turn, with those of the jobs
 * run after it in one round trip (capstan__unique_prelock): the server
 * middleware takes the result over instead of asking itself. Free with
 * capstan__unique_prelock_clear. */
typedef struct capstan_prelock {
    int asked;               /* lr, released and err hold the results */
    int used;                /* the server middleware took them over */
    int lr, released;        /* as capstan_unique__swap_ride (released: 0
                                without an until-lock) */
    capstan_lock_type_t type;
    long ttl;
    int limit;
    char *meta;              /* owned: until_and_while_executing's
                                metadata, to take its until-lock again */
    struct capstan_unique_spec *spec; /* owned: the job's options as resolved
                                for the lock, for its middleware */
    char digest[CAPSTAN_DIGEST_MAX];
    char *jid;               /* owned */
    char err[CAPSTAN_ERRLEN];
} capstan_prelock_t;

/* Asks for the runtime locks of the jobs of mws[0..n) that take one at
 * once (while_executing and its kin, without a lock_timeout) in one round
 * trip through mws[0]->ride, results into pre[i], in the order the jobs
 * will run. The run stops before a job whose lock repeats an earlier one's
 * (it would be refused by it), or that takes no lock at once or cannot be
 * resolved (its lock would wait): the jobs from there on are not asked
 * for, and the number before it is returned; 1 when job 0 is such a job
 * (then nothing is asked), n when none is. pre[i].asked is 0 for a job not
 * asked for, and also when the reply was lost (its middleware asks again).
 * The jobs are parsed and the mws filled as capstan__server_run does. */
size_t capstan__unique_prelock(capstan_mw_t *const *mws, size_t n, capstan_prelock_t *pre);
/* Gives back what p holds when its job did not get to use it (it did not
 * run): the runtime lock, and the until-lock taken again. Then clears p. */
void capstan__unique_prelock_drop(capstan_redis_t *r, capstan_prelock_t *p);
void capstan__unique_prelock_clear(capstan_prelock_t *p);

#endif
