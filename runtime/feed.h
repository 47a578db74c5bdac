/* The reliable fetch's local buffer, shared by the processors of one
 * process (feed.c): jobs fetched and waiting to start, finished jobs whose
 * acks wait for the next round trip, and the gate that lets a suspect run
 * alone. Not part of the public API. */
#ifndef KIQ_RUNTIME_FEED_H
#define KIQ_RUNTIME_FEED_H

#include "runtime/rt.h"
#include "middleware/mw.h"

/* A finished job whose ack has not been written yet (reliable fetch: the
 * ack script and LREM are guarded by the working list, so a requeue or
 * recovery meanwhile cannot make it count twice). */
typedef struct kiq_done {
    int active;
    kiq_job_t job;   /* owns the payload the ack removes */
    kiq_mw_t mw;     /* owns the payload the ack stores */
    kiq_ack_t ack;
    int prompt;      /* the ack releases a runtime lock: it is written before
                        this thread (or any) runs a handler or waits */
    int era;         /* kiq_redis_era of the connection the job ran on */
    unsigned long long hash; /* the fetched payload's (kiq_feed_hash) */
} kiq_done_t;

/* Clears d and frees it (NULL is fine). */
void kiq_done_free(kiq_done_t *d);
/* Frees what d holds; d stays allocated. */
void kiq_done_clear(kiq_done_t *d);
/* d's ack was written: notes the lock it released, then clears d. */
void kiq_done_acked(struct kiq_runtime *rt, kiq_done_t *d, kiq_redis_t *r);

/* One job for processor s into *job, from the feed or fetched by s for
 * itself and the threads that look next. done (owned by the feed from
 * here, or NULL) is the thread's last job, whose ack waits in the feed: the
 * acks waiting go out with any round trip. *inside is the thread's own mark
 * that it passed the gate (0 at first). Returns 1 with a job, 0 without
 * (look again), or kiq__fetch_exchange's error. */
int kiq_feed_next(kiq_slot_t *s, kiq_redis_t *r, kiq_done_t *done, kiq_fetched_t *job,
                  int *inside);
/* Sends ncalls script calls in one round trip that writes the acks waiting
 * too; each call's reply is left in it (NULL when the connection failed).
 * Returns 0 or KIQ_EREDIS. */
int kiq_feed_ride(kiq_slot_t *s, kiq_redis_t *r, kiq_script_call_t *calls, size_t ncalls);
/* Writes the acks waiting when one of them releases a runtime lock: called
 * before a handler runs, so no such lock outlives its job by more than the
 * time the next job takes to start. */
void kiq_feed_prompt(kiq_slot_t *s, kiq_redis_t *r);
/* Leaves d's ack in the feed for the next round trip; on no memory,
 * writes it at once instead. */
void kiq_feed_ack(kiq_slot_t *s, kiq_redis_t *r, kiq_done_t *d);
/* Processor s stops: it leaves the gate, writes the acks waiting and gives
 * back the jobs waiting in the feed. */
void kiq_feed_leave(kiq_slot_t *s, kiq_redis_t *r, int *inside);

/* Whether *job is a suspect: recovered from a crashed process, it runs
 * alone (see feed.c). */
int kiq_feed_suspect(const kiq_fetched_t *job);
/* Takes the process for the suspect *job. Returns 1 when it may run (then
 * kiq_feed_solo_end after it), 0 when it went back to its queue. */
int kiq_feed_solo_begin(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *job);
void kiq_feed_solo_end(kiq_slot_t *s, kiq_redis_t *r);

/* Processor s is about to run *first, which it took from the feed: when
 * that job takes a runtime lock at once and jobs run short, takes the jobs
 * of that kind that follow it in the feed, up to max, into out (owned by
 * the caller), and lists them in s->ahead. Returns how many. */
size_t kiq_feed_take_ahead(kiq_slot_t *s, const kiq_fetched_t *first, kiq_fetched_t *out,
                           size_t max);
/* Under s->mu: processor s starts the job it took ahead whose payload this
 * is. Returns 0, or 1 when the give-back at shutdown took it meanwhile
 * (as a copy): it must not start. */
int kiq_feed_ahead_start(kiq_slot_t *s, const char *payload);
/* The runtime locks of jobs got[0..n), taken ahead, were asked for into
 * pre[0..n) (the processor's): a give-back at a hard stop may take them
 * over with the jobs. */
void kiq_feed_ahead_locks(kiq_slot_t *s, const kiq_fetched_t *got, kiq_prelock_t *pre, size_t n);
/* Puts jobs[0..n), taken ahead and not started, back in the feed in their
 * place, their locks pre[0..n) (or NULL) released first; frees those the
 * give-back took meanwhile. */
void kiq_feed_put_back(kiq_slot_t *s, kiq_redis_t *r, kiq_fetched_t *jobs, kiq_prelock_t *pre,
                       size_t n);
/* Processor s's run is over: every job it took ahead started or went back. */
void kiq_feed_run_end(kiq_slot_t *s);

/* Gives back every job waiting in the feed, and those the processors took
 * ahead (their locks released first), using f and r (reconnecting when
 * connect is set). One thread gives back at a time; without connect (a
 * hard stop) it does not wait for another, and then gives back nothing.
 * Returns how many it gave back. */
int kiq_feed_give_back(kiq_runtime_t *rt, kiq_fetch_t *f, kiq_redis_t *r, int connect);
/* Reads every round trip deferred by a processor whose job still runs, so
 * that the jobs they fetched are counted (kiq_feed_holds) before this
 * process checks its own working list. */
void kiq_feed_read_deferred(struct kiq_runtime *rt);
/* Whether this process holds a job with this exact payload, fetched and
 * not yet acked or given back (in the feed, taken, running, finished): 1
 * it does, 0 it does not, 2 it cannot tell yet (a fetch whose reply is not
 * read may have moved it). since is kiq__mono() when the working list was
 * read at the pass that first saw the job unheld, -1 at first sight: a
 * fetch sent after that cannot have moved it (unless this process gave
 * jobs back since, and so may fetch the same payload again). */
int kiq_feed_holds(struct kiq_runtime *rt, const char *payload, size_t len, double since);
/* The hash the feed counts a payload by. */
unsigned long long kiq_feed_hash(const char *payload, size_t len);
/* A job the feed counted (by its hash and length) is no longer this
 * process's: it is done, or left in the working list for the stray check
 * (no-op without the reliable fetch). */
void kiq_feed_let_go(struct kiq_runtime *rt, unsigned long long hash, size_t len);

/* Gives a fetched job that did not start back to its queue (and frees
 * *job). When connect is set a broken connection is reconnected and the
 * requeue tried again, until the process exits. */
void kiq_give_back(kiq_fetch_t *f, kiq_runtime_t *rt, kiq_redis_t *r, kiq_fetched_t *job,
                   int connect);

#endif
