/* The state of one middleware invocation, shared by the chain runner
 * (chain.c), the runtime that starts server chains (runtime/server_chain.c),
 * the client that starts client chains (client/push.c) and the built-in
 * middleware.
 * Not part of the public API. */
#ifndef CAPSTAN_MIDDLEWARE_MW_H
#define CAPSTAN_MIDDLEWARE_MW_H

#include "capstan/middleware.h"
#include "capstan/unique.h"

#include "middleware/outcome.h"

#include "redis/scripts.h"
#include "support/json.h"

/* What a job's runtime lock asked for ahead holds (unique/prelock.h). */
struct capstan_prelock;

/* How a server middleware shares the round trips of the processor's feed
 * (feed/), which carry the acks waiting. */
typedef struct capstan_trip_hooks {
    /* Sends script calls in a round trip that writes the acks waiting too,
     * or NULL: a round trip of their own. */
    int (*ride)(void *ud, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls);
    /* Writes the acks waiting that release runtime locks, or with all
     * every ack waiting (as a wait for a lock or a limiter slot begins:
     * see capstan__feed_prompt), or NULL. */
    void (*prompt)(void *ud, capstan_redis_t *r, int all);
    void *ud;
} capstan_trip_hooks_t;

/* The uniqueness locks a server chain's job holds, as the chain learns of
 * them. */
typedef struct capstan_held_locks {
    const char *digest;          /* the fetch saw this digest's lock held by
                                    jid (see capstan_fetched_t), or NULL */
    struct capstan_prelock *prelock; /* the runtime lock asked for before the
                                    job's turn, or NULL */
    /* The runtime lock ("<digest>:RUN:LOCKED") the job holds while its
     * handler runs, or "": a hard timeout's failure, written while the
     * handler still runs, releases it. */
    char runtime[CAPSTAN_DIGEST_MAX + 16];
} capstan_held_locks_t;

struct capstan_mw {
    const capstan_chain_t *chain;
    size_t pos;                  /* next entry to run */
    capstan_mw_fn terminal;      /* handler call or push acceptance */
    void *terminal_ud;
    int server;
    capstan_redis_t *r;
    const capstan_config_t *cfg; /* server only */
    const capstan_class_conf_t *cc; /* the class's YAML options, or NULL */
    const capstan_unique_opts_t *unique; /* registered or push options, or NULL */
    const capstan_limit_opts_t *limit; /* server: the class's limit (the file's,
                                    else the registered one), or NULL */

    capstan_job_t *job;          /* server */
    char *payload;               /* client: owned, edited in place */
    size_t len;
    capstan_jobject_t obj;       /* client: members of payload */
    const char *cls, *jid, *queue;
    double at;                   /* client: scheduled time, 0 = now */

    capstan_outcome_t *out;      /* server: where the chain leaves the
                                    job's outcome (its ack's); client: NULL */
    capstan_held_locks_t held;   /* server */
    capstan_trip_hooks_t trip;   /* server: its round trips (ride and
                                    prompt NULL without a feed) */
    void *priv;                  /* the starter's own per-job state */
    char *deny;                  /* client: why the push was denied (owned),
                                    or NULL */
    int accepted;                /* client: the terminal ran */
};

/* A copy of chain c, each entry whose udata is from given to instead (a
 * sharded process's members run the front's chain, the built-ins each on
 * their own runtime). NULL when out of memory. */
capstan_chain_t *capstan__chain_copy(const capstan_chain_t *c, const void *from, void *to);

/* Starts chain c on mw (filled by the caller) with terminal as its end.
 * Returns what the outermost middleware returns. */
int capstan__mw_run(const capstan_chain_t *c, capstan_mw_t *mw, capstan_mw_fn terminal, void *ud);
/* Frees what an invocation owns (the client payload, a denial); the
 * outcome is its owner's (capstan__outcome_clear). */
void capstan__mw_clear(capstan_mw_t *mw);

/* For a server middleware's wait (a lock, a limiter slot): mw (a
 * capstan_mw_t *) writes every ack waiting as the wait begins, rather than
 * leave them to wait with its processor. A no-op without mw->trip.prompt. */
void capstan__mw_waiting(void *mw);

#endif
