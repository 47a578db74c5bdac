/* Internal to the feed (the files of feed/): its state and what its files
 * share, one file a mechanism. Each function is described where it is
 * defined; the words are feed.h's. */
#ifndef CAPSTAN_FEED_FEED_INTERNAL_H
#define CAPSTAN_FEED_FEED_INTERNAL_H

#include <stdatomic.h>

#include "feed/feed.h"

/* SWEEP_MAX jobs at most in one fetch call; ACKS_MAX acks waiting make the
 * next thread write them; SWEEPERS_MAX fetches on their way at once. */
enum { SWEEP_MAX = 100, ACKS_MAX = 64, SWEEPERS_MAX = 4 };

/* A round trip a processor sent on its second connection before running
 * its job, to read after it (see defer): the acks it writes, the jobs it
 * fetches. Any thread that would otherwise wait may read it instead. */
typedef struct pending {
    capstan_seat_t *owner;
    capstan_exchange_t *x;
    capstan_done_t **acks;
    capstan_ack_item_t *items;
    capstan_fetched_t *got; /* room for want jobs */
    size_t nacks, want;
    double sent;           /* capstan__mono() before its fetch was sent */
    int claimed;           /* a thread is sending or reading it */
    struct pending *next;
} pending_t;

/* One payload this process holds, by its hash and length (see hold). */
typedef struct held {
    unsigned long long hash;
    size_t len;
    size_t count; /* 0: an empty place */
} held_t;

/* One processor's part of the feed (see seat). The ahead list is under the
 * processor's lock (mu, lent: see capstan__feed_seat), and the feed's too
 * where the feed changes with it; the rest is the processor thread's own,
 * but fetch_sent, which is under the feed's lock. */
struct capstan_seat {
    capstan_feed_t *feed;
    int index;
    capstan_fetch_t *fetch;
    pthread_mutex_t *mu;
    /* Jobs the processor took from the feed to run after its current one,
     * in order (a run of short jobs whose runtime locks went in one round
     * trip: see processor.c): views of payloads it owns, for the give-back
     * at a hard stop, which copies them into the feed, takes their locks
     * over and empties the list (the processor then starts none of them). */
    struct capstan_ahead {
        const char *payload, *queue;
        size_t len;
        unsigned long long seq;
        capstan_prelock_t *pre; /* its runtime lock once asked for (the
                                   processor's), or NULL until then */
    } ahead[CAPSTAN_RUN_MAX - 1];
    size_t nahead;
    int in_run;            /* the processor runs a run (see ahead.c) */
    /* The processor's second connection, for round trips read after its
     * job (defer.c), made when first needed; and the one on its way,
     * under the feed's lock. */
    capstan_redis_t *aux;
    struct pending *pend;
    /* capstan__mono() when the fetch this processor waits for was sent, 0 when
     * none is on its way: its jobs are in the working list before the
     * feed counts them (see capstan__feed_holds). Under the feed's lock. */
    double fetch_sent;
    /* When the processor took its last job (capstan__mono()), 0 when it
     * holds none, and how many it took then (with those taken ahead);
     * whether it would have deferred without a second connection (see
     * capstan__feed_defers), and whether it said that it could not make
     * one. */
    double taken_at;
    size_t taken_n;
    int want_aux, warned;
};

struct capstan_feed {
    capstan_feed_env_t env;
    capstan_seat_t *seats; /* env.nslots processors', then the housekeeper's */
    pthread_mutex_t mu;
    pthread_mutex_t give_mu; /* held by the thread giving jobs back */
    pthread_cond_t came;   /* a sweep came back */
    capstan_fetched_t *jobs; /* ring, oldest at head */
    size_t head, n, cap;
    capstan_done_t **acks; /* finished, ack not written */
    size_t nacks, cap_acks;
    int sweeping;          /* sweeps on their way */
    atomic_int runs;       /* processors in a run (capstan__feed_take_ahead):
                              a thread leaving gives the feed back after
                              theirs is in it */
    pending_t *pending;    /* deferred round trips no thread reads yet */
    int sweepers_max;      /* at most this many at once */
    size_t prefetch;       /* jobs fetched and not started: at most this many */
    size_t asked;          /* jobs the sweeps on their way asked for */
    double rtt;            /* a sweep's round trip, seconds (moving average) */
    double rate;           /* jobs taken per second (moving average) */
    size_t taken;          /* jobs taken (and done) since rate_t0 */
    double rate_t0;
    double dry_until;      /* capstan__mono(): a sweep came back short (the queues
                              are about empty): none ahead of need till then */
    double job_time;       /* seconds from taking a job to looking again
                              (moving average) */
    double acks_since;     /* capstan__mono() when the oldest ack waiting came */
    atomic_size_t prompt;  /* acks waiting that release a runtime lock: they
                              go before a handler runs or a thread waits
                              (read without the lock to skip the lock) */
    size_t waiting;        /* threads waiting for one to come back */
    int inside;            /* threads past the gate in capstan__feed_next: holding
                              a job, or fetching, until they look again */
    int solo;              /* a suspect runs alone: the gate is shut */
    held_t *held;          /* the jobs this process holds (see hold) */
    size_t held_cap, held_n;
    int held_lost;         /* no memory to count one: hold every job */
    double gave_back_at;   /* capstan__mono() of the last give-back */
};

/* Jobs that take longer than this (seconds) defer their round trips (see
 * defer): a sweep's jobs then come in after the sweeper's job as well. The
 * job time starts at this, so nothing is deferred before it is measured. */
#define DEFER_AFTER 0.001

/* Whether the process stops fetching (env.quiet). */
static inline int capstan__feed_quiet(const capstan_feed_t *feed)
{
    return feed->env.quiet(feed->env.ctx);
}

/* feed.c: the ring of fetched jobs (under feed->mu). */
void capstan__feed_push(capstan_feed_t *feed, capstan_fetched_t *job);
capstan_fetched_t capstan__feed_pop(capstan_feed_t *feed);
capstan_fetched_t capstan__feed_pop_newest(capstan_feed_t *feed);
void capstan__feed_wait(capstan_feed_t *feed);

/* held.c: what this process holds (under feed->mu). */
void capstan__feed_hold(capstan_feed_t *feed, const capstan_fetched_t *got, size_t n);
void capstan__feed_let_go_one(capstan_feed_t *feed, unsigned long long hash, size_t len);
void capstan__feed_hash_all(capstan_fetched_t *jobs, size_t n);

/* acks.c: the acks waiting and the round trips that write them. */
capstan_done_t *capstan__feed_ack_later(capstan_feed_t *feed, capstan_done_t *d, double now);
size_t capstan__feed_drop_stale(capstan_feed_t *feed, capstan_done_t **acks, size_t n, const capstan_redis_t *r);
void capstan__feed_ack_now(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t *d);
capstan_done_t **capstan__feed_take_acks(capstan_feed_t *feed, size_t *n);
void capstan__feed_ack_items(capstan_done_t *const *acks, size_t nacks, capstan_ack_item_t *items);
void capstan__feed_finish_acks(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t **acks,
                               const capstan_ack_item_t *items, size_t nacks, int again, size_t *unwritten);
int capstan__feed_exchange(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t **acks, size_t nacks,
                           capstan_fetched_t *got, size_t max, int block, size_t *unwritten);
void capstan__feed_flush_acks(capstan_seat_t *s, capstan_redis_t *r);

/* ahead.c: runs taken ahead. */
size_t capstan__feed_take_back_ahead(capstan_feed_t *feed, capstan_prelock_t ***held);

/* give.c: giving jobs back. */
void capstan__feed_give_back_run(capstan_fetch_t *f, capstan_feed_t *feed, capstan_redis_t *r, capstan_fetched_t *jobs,
                                 size_t n, int (*connect)(void *ctx, capstan_redis_t *r), void *ctx);

/* gate.c: the gate. */
void capstan__feed_gate_leave(capstan_feed_t *feed, int *inside);

/* take.c: taking a job. */
void capstan__feed_note_sweep(capstan_feed_t *feed, double began, size_t asked, int got);

/* defer.c: deferred round trips. */
int capstan__feed_defers(capstan_seat_t *s, const capstan_feed_t *feed);
void capstan__feed_defer(capstan_seat_t *s, size_t want);
int capstan__feed_read_one(capstan_feed_t *feed);
void capstan__feed_settle_own(capstan_seat_t *s, capstan_feed_t *feed);

#endif
