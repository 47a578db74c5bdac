/* The reliable fetch's local buffer, shared by the processors of one
 * process (feed/): jobs fetched and waiting to start, finished jobs whose
 * acks wait for the next round trip, and the gate that lets a suspect run
 * alone. It knows nothing of the runtime that makes it: what it asks of
 * it is in capstan_feed_env_t, and each processor's part is its seat. Not
 * part of the public API.
 *
 * The feed's words, as its code uses them:
 * feed: the ring of jobs fetched and not yet taken, oldest first (by seq),
 *   and the acks waiting beside it, under one lock (feed->mu).
 * round trip: one exchange with Redis; each carries the acks waiting.
 * sweep: a round trip that fetches up to SWEEP_MAX jobs into the feed, by
 *   a thread that found it empty (it keeps the first) or low (fetch ahead).
 * level: how many jobs the feed should hold or have asked for (a job for
 *   each free thread, plus what is taken in two round trips); shortfall:
 *   what a sweep asks to reach it.
 * dry: a sweep came back short, so no sweep ahead of need until dry_until.
 * ahead: fetched before a thread needs it (the feed's level); "taken
 *   ahead": jobs a processor takes after the one it starts, for a run.
 * seat: one processor's part of the feed (capstan_seat_t), passed with
 *   each of its calls: its jobs taken ahead, its second connection, its
 *   round trip deferred, its last look.
 * run: jobs with a runtime lock that one processor takes ahead, asks all
 *   locks of in one round trip and runs in turn (seat->ahead, seat->in_run).
 * put back: a processor returns jobs it took ahead and did not start to
 *   the feed, in their place, their locks released first.
 * give back: jobs fetched and not started go back to their queues, newest
 *   first, and are let go (at a stop, before a suspect runs).
 * hold: a job is this process's from the reply that fetched it until its
 *   ack is written or it is given back; counted by payload hash and length.
 * let go: one held job stops being this process's (acked, given back, or
 *   left in the working list for the stray check).
 * ack waiting: a finished job (capstan_done_t) whose ack rides the next
 *   round trip; ack late: one waiting ACK_LATE, written by the housekeeper.
 * prompt: an ack waiting that releases a runtime lock: written before a
 *   handler runs or a thread waits.
 * ride: script calls sent in the same round trip as the acks waiting.
 * settle (finish the acks): once per round trip, on its stack, the acks
 *   written are let go and finished (lock metric and event, death hooks,
 *   scheduler wake), the others wait again (finish_acks).
 * era: capstan__redis_era of the connection a job ran on; stale: an ack of
 *   an older era, dropped (the job runs again rather than count as done).
 * defer: a round trip sent on the processor's second connection (aux)
 *   before its job and read after it; pending: such a round trip.
 * claim: take a pending round trip out of the list nobody reads, to read
 *   it; complete: read a claimed one, its jobs into the feed, acks settled.
 * settle own: a thread reads its own pending round trip before it takes
 *   another job or rides.
 * suspect: a job carrying "recovery_count" (recovered after a crash).
 * solo: a suspect runs alone: the gate is shut, other jobs finish, the
 *   acks are written and the feed is given back first.
 * quarantine: under a supervisor, a queue only its quarantine worker (one
 *   thread) reads: a suspect goes there instead of running solo.
 * gate: the count of threads inside capstan__feed_next (holding a job or
 *   fetching, *inside set) that a suspect waits to fall to itself.
 * quiet: the process is stopping (env.quiet): jobs fetched go into the
 *   feed to be given back, none is taken. */
#ifndef CAPSTAN_FEED_FEED_H
#define CAPSTAN_FEED_FEED_H

#include <pthread.h>

#include "fetch/fetch.h"
#include "job/job.h"
#include "middleware/mw.h"
#include "middleware/outcome.h"
#include "unique/prelock.h"

/* The most jobs a processor takes at once when their runtime locks can be
 * asked for in one round trip (processor.c). */
#define CAPSTAN_RUN_MAX 16

typedef struct capstan_done_pool capstan_done_pool_t;

/* A finished job whose ack has not been written yet (reliable fetch: the
 * ack script and LREM are guarded by the working list, so a requeue or
 * recovery meanwhile cannot make it count twice). */
typedef struct capstan_done {
    int active;
    capstan_done_pool_t *pool; /* where it goes back when freed, or NULL */
    struct capstan_done *next; /* in the pool */
    capstan_job_t job; /* owns the payload the ack removes */
    capstan_outcome_t out; /* owns the payload the ack stores */
    capstan_ack_t ack;
    int prompt;      /* the ack releases a runtime lock: it is written before
                        this thread (or any) runs a handler or waits */
    int era;         /* capstan__redis_era of the connection the job ran on */
    unsigned long long hash; /* the fetched payload's (capstan__feed_hash) */
} capstan_done_t;

/* A processor's finished records, kept for its next jobs: a record is
 * freed by whichever thread writes its ack, and one malloc'd by one thread
 * and freed by another misses glibc's per-thread caches on both sides. */
capstan_done_pool_t *capstan__done_pool_new(void);
/* Frees the pool and the records in it; every record of the pool is back
 * (every thread that frees one has ended). NULL is fine. */
void capstan__done_pool_free(capstan_done_pool_t *pool);
/* A zeroed record that goes back to pool when freed (pool NULL: it is
 * freed), or NULL out of memory. Only pool's owner thread takes one. */
capstan_done_t *capstan__done_new(capstan_done_pool_t *pool);
/* Clears d and frees it (NULL is fine): back to its pool, if it has one. */
void capstan__done_free(capstan_done_t *d);
/* Frees d, cleared already. */
void capstan__done_release(capstan_done_t *d);
/* Frees what d holds; d stays allocated. */
void capstan__done_clear(capstan_done_t *d);

/* What the feed asks of the process that makes it; ctx is passed back to
 * each callback, which any processor's thread may call. */
typedef struct capstan_feed_env {
    void *ctx;
    int nslots;            /* the processors that share the feed */
    int prefetch;          /* jobs fetched and not started at most; 0: the
                              default (capstan__feed_default_prefetch) */
    const char *redis_url; /* where a processor's second connection goes */
    int (*busy)(void *ctx);  /* how many processors run a job */
    int (*quiet)(void *ctx); /* whether the process stops fetching */
    int (*exiting)(void *ctx); /* whether the process is about to exit
                              (nothing waits for Redis any more) */
    /* Reconnects r until it works (0) or the process is about to exit. */
    int (*connect)(void *ctx, capstan_redis_t *r);
    /* d's ack was written (on r): what follows from it is done (the lock
     * it released noted, the death hooks, the scheduler's wake) and d
     * cleared. */
    void (*acked)(void *ctx, capstan_done_t *d, capstan_redis_t *r);
} capstan_feed_env_t;

typedef struct capstan_feed capstan_feed_t;
typedef struct capstan_seat capstan_seat_t;

/* A feed for env's processors (env is copied). NULL without memory. */
capstan_feed_t *capstan__feed_new(const capstan_feed_env_t *env);
/* The prefetch bound when none is set: ten jobs a processor, 500 at least. */
int capstan__feed_default_prefetch(int nslots);
void capstan__feed_free(capstan_feed_t *feed);
/* Seat i of the feed, for processor i (i < env.nslots) or, i == nslots,
 * for the housekeeper's late acks; f is its fetcher. mu is the
 * processor's own lock, lent: a job it took ahead leaves the seat under
 * the lock that marks the processor busy, so the give-back at a hard stop
 * finds it in one place or the other. Called before the processors start. */
capstan_seat_t *capstan__feed_seat(capstan_feed_t *feed, int i, capstan_fetch_t *f, pthread_mutex_t *mu);
/* The jobs waiting in the feed, fetched and not started, by queue:
 * counts[i] for names[i], i < n (a job of a queue not named is not
 * counted). */
void capstan__feed_count(capstan_feed_t *feed, const char *const *names, long long *counts, size_t n);

/* One job for processor s (its seat) into *job, from the feed or fetched
 * by s for itself and the threads that look next. done (owned by the feed from
 * here, or NULL) is the thread's last job, whose ack waits in the feed: the
 * acks waiting go out with any round trip. *inside is the thread's own mark
 * that it passed the gate (0 at first). Returns 1 with a job, 0 without
 * (look again), or capstan__fetch_exchange's error. */
int capstan__feed_next(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t *done, capstan_fetched_t *job,
                       int *inside);
/* Sends ncalls script calls in one round trip that writes the acks waiting
 * too; each call's reply is left in it (NULL when the connection failed).
 * Returns 0 or CAPSTAN_EREDIS. */
int capstan__feed_ride(capstan_seat_t *s, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls);
/* Writes the acks waiting when one of them releases a runtime lock: called
 * before a handler runs, so no such lock outlives its job by more than the
 * time the next job takes to start. With all, every ack waiting: called as
 * a processor begins to wait for a lock or a limiter slot, which may be
 * held by a job whose ack (its release) waits in the feed: when every
 * processor waits, no round trip would carry it before the housekeeper's
 * (capstan__feed_ack_late). */
void capstan__feed_prompt(capstan_seat_t *s, capstan_redis_t *r, int all);
/* Writes the acks that waited ACK_LATE (0.1 s) or more, through s (the
 * seat no processor uses) and r: the housekeeper calls it between its beats.
 * Returns how long to wait before the next call (seconds), or -1 when
 * acks are late and r is not connected. */
double capstan__feed_ack_late(capstan_seat_t *s, capstan_redis_t *r);
/* Leaves d's ack in the feed for the next round trip; on no memory,
 * writes it at once instead. */
void capstan__feed_ack(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t *d);
/* Processor s stops: it leaves the gate, writes the acks waiting, gives
 * back the jobs waiting in the feed and closes its second connection. */
void capstan__feed_leave(capstan_seat_t *s, capstan_redis_t *r, int *inside);

/* Whether *job is a suspect: recovered from a crashed process, it runs
 * alone (see gate.c). */
int capstan__feed_suspect(const capstan_fetched_t *job);
/* Takes the process for the suspect *job. Returns 1 when it may run (then
 * capstan__feed_solo_end after it), 0 when it went back to its queue. */
int capstan__feed_solo_begin(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *job);
void capstan__feed_solo_end(capstan_seat_t *s, capstan_redis_t *r);
/* Moves the suspect *job from the working list to queue:<quarantine> (one
 * script: never in neither, never in both) and frees it. */
void capstan__feed_quarantine(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *job,
                              const char *quarantine);

/* Processor s is about to run *first, which it took from the feed: when
 * that job takes a runtime lock at once and jobs run short, takes the jobs
 * of that kind that follow it in the feed, up to max, into out (owned by
 * the caller), and lists them in s->ahead. run_time is the processor's
 * handler time (seconds, moving average). Returns how many. */
size_t capstan__feed_take_ahead(capstan_seat_t *s, double run_time, const capstan_fetched_t *first,
                                capstan_fetched_t *out, size_t max);
/* Under the processor's lock (lent to its seat): processor s starts the job it took ahead whose payload this
 * is. Returns 0, or 1 when the give-back at shutdown took it meanwhile
 * (as a copy): it must not start. */
int capstan__feed_ahead_start(capstan_seat_t *s, const char *payload);
/* The runtime locks of jobs got[0..n), taken ahead, were asked for into
 * pre[0..n) (the processor's): a give-back at a hard stop may take them
 * over with the jobs. */
void capstan__feed_ahead_locks(capstan_seat_t *s, const capstan_fetched_t *got, capstan_prelock_t *pre, size_t n);
/* Puts jobs[0..n), taken ahead and not started, back in the feed in their
 * place, their locks pre[0..n) (or NULL) released first; frees those the
 * give-back took meanwhile. */
void capstan__feed_put_back(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *jobs, capstan_prelock_t *pre,
                            size_t n);
/* Processor s's run is over: every job it took ahead started or went back. */
void capstan__feed_run_end(capstan_seat_t *s);

/* Gives back every job waiting in the feed, and those the processors took
 * ahead (their locks released first), using f and r (reconnecting when
 * connect is set). One thread gives back at a time; without connect (a
 * hard stop) it does not wait for another, and then gives back nothing.
 * Returns how many it gave back. */
int capstan__feed_give_back(capstan_feed_t *feed, capstan_fetch_t *f, capstan_redis_t *r, int connect);
/* Reads every round trip deferred by a processor whose job still runs, so
 * that the jobs they fetched are counted (capstan__feed_holds) before this
 * process checks its own working list. */
void capstan__feed_read_deferred(capstan_feed_t *feed);
/* Whether this process holds a job with this exact payload, fetched and
 * not yet acked or given back (in the feed, taken, running, finished): 1
 * it does, 0 it does not, 2 it cannot tell yet (a fetch whose reply is not
 * read may have moved it). since is capstan__mono() when the working list was
 * read at the pass that first saw the job unheld, -1 at first sight: a
 * fetch sent after that cannot have moved it (unless this process gave
 * jobs back since, and so may fetch the same payload again). */
int capstan__feed_holds(capstan_feed_t *feed, const char *payload, size_t len, double since);
/* The hash the feed counts a payload by. */
unsigned long long capstan__feed_hash(const char *payload, size_t len);
/* A job the feed counted (by its hash and length) is no longer this
 * process's: it is done, or left in the working list for the stray check
 * (the reliable source's let_go). */
void capstan__feed_let_go(capstan_feed_t *feed, unsigned long long hash, size_t len);

/* Gives a fetched job that did not start and that no feed counted (the
 * basic source's) back to its queue (and frees *job). A broken connection
 * is mended with connect(ctx, r) (capstan_feed_env_t's) and the requeue
 * tried again, while that works; connect NULL: one try. */
void capstan__give_back(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *job,
                        int (*connect)(void *ctx, capstan_redis_t *r), void *ctx);

/* Where key (klen bytes) first occurs in s[0..len), as memmem, found by
 * memchr for its byte at rare (< klen): one a payload seldom holds. */
const char *capstan__feed_find(const char *s, size_t len, const char *key, size_t klen, size_t rare);

#endif
