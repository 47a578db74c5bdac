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
/* The "limit" server middleware (middleware/limit_mw.c). */
int kiq__limit_mw(kiq_mw_t *mw, void *udata);
/* Records v9's "unlocked" metric for a lock the ack released. */
void kiq__mw_note_released(const kiq_mw_t *mw, kiq_redis_t *r);

#endif
