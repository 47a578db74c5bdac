/* Internal to fetch/: the fetcher's state and the table of operations
 * its two strategies fill, the reliable one (reliable.c) and the basic one
 * (basic.c), as hiredis's redisContextFuncs gives a plain and a TLS
 * connection; what both share is in fetch.c. */
#ifndef CAPSTAN_FETCH_FETCH_INTERNAL_H
#define CAPSTAN_FETCH_FETCH_INTERNAL_H

#include <stdatomic.h>

#include "fetch/fetch.h"

struct capstan_fetch {
    const capstan_fetch_ops_t *ops;
    int strict, index;
    double block_timeout;
    size_t nq;
    char **names;        /* queue names, configured order */
    char **keys;         /* "queue:NAME", configured order */
    int *weights;
    size_t nexp;         /* weighted expansion length */
    size_t *order;       /* scratch: queue indexes in this fetch's order,
                            the nact not paused */
    size_t nact;
    const capstan_paused_t *paused; /* borrowed, or NULL */
    capstan_liveness_t *liveness; /* borrowed, or NULL */
    const struct capstan__qlimit **caps; /* per queue (configured order), its
                                      caps (borrowed) or NULL; NULL when no
                                      queue has one */
    char lease_ms[24];   /* the caps' lease, for the fetch script */
    size_t *expanded;    /* scratch: weighted expansion */
    char working[512];
    char timeout_s[32];
    int locks_seen;      /* the last job fetched carried a lock_digest */
    atomic_uint plain_run; /* jobs fetched in a row without a lock_digest, or
                              with a runtime lock only (up to 1,000: then the
                              sweep stops looking for locks) */
    int min_replicas;    /* WAIT after acks for this many replicas; 0 = no WAIT */
    char wait_args[2][32];
    double wait_warned;  /* capstan__mono() of the last warning that WAIT fell short */
    atomic_ulong answered; /* fetches Redis answered without an error (atomic: a
                              deferred round trip may be read by another thread) */
};

struct capstan_fetch_ops {
    /* capstan__fetch_exchange_calls without the NOSCRIPT retry: the acks,
     * the calls, then up to max jobs; the results reset first. */
    int (*exchange)(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks, size_t nacks,
                    capstan_script_call_t *calls, size_t ncalls, capstan_fetched_t *out, size_t max,
                    int block);
    /* capstan__fetch_send. */
    capstan_exchange_t *(*send)(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                size_t nacks, size_t max, int *rc);
    /* capstan__fetch_ack. */
    int (*ack)(capstan_fetch_t *f, capstan_redis_t *r, const char *raw, size_t len, const capstan_ack_t *ack);
    /* Sends the requeue of argv[2..argc) (payloads, lens their lengths) to
     * the queue key argv[1], after filling argv[0] and lens[0] as its
     * command needs. Returns the reply, or NULL when the connection failed. */
    redisReply *(*requeue)(capstan_fetch_t *f, capstan_redis_t *r, const char **argv, size_t *lens, int argc);
};

/* Fills f->order for this fetch (configured or weighted order) and leaves
 * the paused queues out, f->nact the queues left. */
void capstan__fetch_plan_order(capstan_fetch_t *f);
/* Takes the payload string out of the reply into *out (queue qi's).
 * Returns 1. */
int capstan__fetch_take(capstan_fetch_t *f, redisReply *payload, size_t qi, capstan_fetched_t *out);
/* A blocking fetch's job (out, from queue qi) whose queue was paused
 * meanwhile goes back to the fetched end of its queue. Returns 1 (keep it)
 * or 0 (given back). Should the give-back fail, the job is kept when keep
 * is set (it exists nowhere else), else cleared. */
int capstan__fetch_give_back_paused(capstan_fetch_t *f, capstan_redis_t *r, size_t qi, capstan_fetched_t *out,
                                    int keep);
/* The fetch script's call (lua/fetch.lua) for up to max jobs when some
 * queue has caps: each queue's held slots go with it, and the script takes
 * a slot with each job of a capped queue. Returns 0 or CAPSTAN_EREDIS. */
int capstan__fetch_append_capped(capstan_fetch_t *f, capstan_redis_t *r, size_t max);
/* An idle fetcher's blocking move from capped queue qi would take a job
 * whatever the caps: it moves only while they have room (cap_full says
 * 0; 1 also when Redis failed), and the job it moved takes its slots at
 * once (take_cap: 1 taken, or not known as Redis failed, and the job
 * kept; 0 when a cap was full meanwhile, and the job given back to the
 * fetched end of its queue). At the caps it waits instead until one of
 * their slots is given back, or the block timeout (wait_cap, 0: no job). */
int capstan__fetch_cap_full(const capstan_fetch_t *f, capstan_redis_t *r, size_t qi);
int capstan__fetch_take_cap(capstan_fetch_t *f, capstan_redis_t *r, size_t qi, capstan_fetched_t *out);
int capstan__fetch_wait_cap(const capstan_fetch_t *f, capstan_redis_t *r, size_t qi);
/* Every queue is paused: waits out the block timeout. Returns 0. */
int capstan__fetch_wait_paused(const capstan_fetch_t *f);
/* Appends the ack of one job; working is the working list the job is in,
 * or NULL when it is in none (*sent 0 when nothing had to be sent). */
int capstan__fetch_append_ack(capstan_redis_t *r, const char *working, const char *raw, size_t len,
                              const capstan_ack_t *ack, int *sent);
/* Reads one ack's reply (jobs: how many jobs it acked that are expected in
 * a working list). Returns 0, CAPSTAN_EREPLY or CAPSTAN_EREDIS. */
int capstan__fetch_read_ack(capstan_redis_t *r, const capstan_ack_t *ack, long jobs);
/* Clears the results before a round trip. */
void capstan__fetch_reset(capstan_ack_item_t *acks, size_t nacks, capstan_script_call_t *calls, size_t ncalls,
                          capstan_fetched_t *out, size_t max);

#endif
