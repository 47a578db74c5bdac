/* The state of one middleware invocation, shared by the chain runner
 * (chain.c), the runtime that starts server chains (runtime/server_chain.c),
 * the client that starts client chains (client/push.c) and the built-in
 * middleware.
 * Not part of the public API. */
#ifndef KIQ_MIDDLEWARE_MW_H
#define KIQ_MIDDLEWARE_MW_H

#include "kiq/middleware.h"
#include "kiq/unique.h"

#include "redis/scripts.h"
#include "support/json.h"

/* A runtime lock asked for before its job's turn, with those of the jobs
 * run after it in one round trip (kiq_unique_prelock): the server
 * middleware takes the result over instead of asking itself. Free with
 * kiq_unique_prelock_clear. */
typedef struct kiq_prelock {
    int asked;               /* lr, released and err hold the results */
    int used;                /* the server middleware took them over */
    int lr, released;        /* as kiq_unique__swap_ride (released: 0
                                without an until-lock) */
    kiq_lock_type_t type;
    long ttl;
    int limit;
    char *meta;              /* owned: until_and_while_executing's
                                metadata, to take its until-lock again */
    struct kiq_unique_spec *spec; /* owned: the job's options as resolved
                                for the lock, for its middleware */
    char digest[KIQ_DIGEST_MAX];
    char *jid;               /* owned */
    char err[KIQ_ERRLEN];
} kiq_prelock_t;

struct kiq_mw {
    const kiq_chain_t *chain;
    size_t pos;                  /* next entry to run */
    kiq_mw_fn terminal;          /* handler call or push acceptance */
    void *terminal_ud;
    int server;
    kiq_redis_t *r;
    const kiq_config_t *cfg;     /* server only */
    const kiq_class_conf_t *cc;  /* the class's YAML options, or NULL */
    const kiq_unique_opts_t *unique; /* registered or push options, or NULL */
    const kiq_limit_opts_t *limit;   /* server: registered limit, or NULL */

    kiq_job_t *job;              /* server */
    char *payload;               /* client: owned, edited in place */
    size_t len;
    kiq_jobject_t obj;           /* client: members of payload */
    const char *cls, *jid, *queue;
    double at;                   /* client: scheduled time, 0 = now */

    kiq_dispose_t disp;          /* server outcome */
    double score;
    char *dpayload;              /* owned */
    size_t dlen;

    /* A lock the ack releases for jid, depending on the outcome. */
    char release_key[KIQ_DIGEST_MAX + 16];
    int release_on_done;         /* until_executed: released after success */
    int release_on_death;        /* until_* : released when the job dies */
    int release_type;            /* its kiq_lock_type_t, for the metric */
    int release_runtime;         /* a runtime lock: released whatever the
                                    outcome, the ack written promptly */

    /* server: sends script calls in a round trip that writes the acks
     * waiting too (runtime/feed.c), or NULL: a round trip of their own. */
    int (*ride)(void *ud, kiq_redis_t *r, kiq_script_call_t *calls, size_t ncalls);
    /* server: writes the acks waiting that release runtime locks (see
     * kiq_feed_prompt), or NULL */
    void (*prompt)(void *ud, kiq_redis_t *r);
    void *ride_ud;

    const char *held_digest;     /* server: the fetch saw this digest's lock
                                    held by jid (see kiq_fetched_t) */
    kiq_prelock_t *prelock;      /* server: the runtime lock asked for
                                    before the job's turn, or NULL */
    void *priv;                  /* the starter's own per-job state */
    char *deny;                  /* client: why the push was denied (owned),
                                    or NULL */
    int accepted;                /* client: the terminal ran */
};

/* Starts chain c on mw (filled by the caller) with terminal as its end.
 * Returns what the outermost middleware returns. */
int kiq__mw_run(const kiq_chain_t *c, kiq_mw_t *mw, kiq_mw_fn terminal, void *ud);
/* Frees what an invocation owns (the client payload, a disposition). */
void kiq__mw_clear(kiq_mw_t *mw);

/* The lock to release at ack for this outcome, or NULL. */
const char *kiq__mw_release_key(const kiq_mw_t *mw, kiq_dispose_t d);
/* Asks for the runtime locks of the jobs of mws[0..n) that take one at
 * once (while_executing and its kin, without a lock_timeout) in one round
 * trip through mws[0]->ride, results into pre[i], in the order the jobs
 * will run. The run stops before a job whose lock repeats an earlier one's
 * (it would be refused by it), or that takes no lock at once or cannot be
 * resolved (its lock would wait): the jobs from there on are not asked
 * for, and the number before it is returned; 1 when job 0 is such a job
 * (then nothing is asked), n when none is. pre[i].asked is 0 for a job not
 * asked for, and also when the reply was lost (its middleware asks again).
 * The jobs are parsed and the mws filled as kiq_server_run does. */
size_t kiq_unique_prelock(kiq_mw_t *const *mws, size_t n, kiq_prelock_t *pre);
/* Gives back what p holds when its job did not get to use it (it did not
 * run): the runtime lock, and the until-lock taken again. Then clears p. */
void kiq_unique_prelock_drop(kiq_redis_t *r, kiq_prelock_t *p);
void kiq_unique_prelock_clear(kiq_prelock_t *p);
/* The "limit" server middleware (middleware/limit_mw.c). */
int kiq__limit_mw(kiq_mw_t *mw, void *udata);
/* Records v9's "unlocked" metric for a lock the ack released. */
void kiq__mw_note_released(const kiq_mw_t *mw, kiq_redis_t *r);

#endif
