/* Where the processors take their jobs from, as one table of operations:
 * the reliable source (the feed, feed/, over fetch/'s reliable fetch) and
 * the basic one (fetch/'s BRPOP, one job at a time). runtime.c picks the
 * table once (capstan__source_for), where it makes the feed; from then on
 * no caller asks which fetch runs. Not part of the public API.
 *
 * A source that prefetches shares what it fetched and the acks owed among
 * the processors; one that does not hands each processor its own job and
 * writes its ack as the job ends. A source with a working list keeps each
 * job there until its ack, so recovery and the stray check look there. */
#ifndef CAPSTAN_RUNTIME_SOURCE_H
#define CAPSTAN_RUNTIME_SOURCE_H

#include "feed/feed.h"
#include "runtime/rt.h"

typedef struct capstan_source {
    const char *name;
    int working_list; /* jobs wait in this process's working list until acked */
    int prefetches;   /* jobs are fetched ahead and counted in "prefetched" */
    const capstan_fetch_ops_t *fetch; /* how each processor's fetcher fetches */

    /* Processor i's slot s (i = nslots: the housekeeper's) is made: the
     * source gives it what it keeps for it (the feed's seat). */
    void (*bind)(capstan_runtime_t *rt, capstan_slot_t *s, int i);
    /* One job for processor s into *job. done (the source's from here, or
     * NULL) is the processor's last job, its ack owed. *inside is the
     * processor's own mark (0 at first), for the source to keep. Returns 1
     * with a job, 0 without (look again), or the fetch's error; never a
     * job once the process is quiet. */
    int (*take)(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *done, capstan_fetched_t *job,
                int *inside);
    /* Job d has its outcome (d->ack, d->active) and slot s is still busy
     * with it: the ack is written now (d then cleared) or owed, d staying
     * active for a later round trip. */
    void (*settle)(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d);
    /* d's ack is owed: leave it for the next round trip (the source owns
     * d from here). */
    void (*ack)(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d);
    /* Processor s stops: what it owes is written, what it holds for others
     * is given back. */
    void (*leave)(capstan_slot_t *s, capstan_redis_t *r, int *inside);
    /* A job counted by its hash and length is no longer this process's. */
    void (*let_go)(capstan_runtime_t *rt, unsigned long long hash, size_t len);

    /* Runs: the jobs that follow *first in the source and may start with
     * it (see capstan__feed_take_ahead), up to max into out. Returns how
     * many; 0 when the source takes none ahead. */
    size_t (*take_ahead)(capstan_slot_t *s, const capstan_fetched_t *first, capstan_fetched_t *out,
                         size_t max);
    /* Suspects: a job recovered from a crashed process runs alone. */
    int (*suspect)(const capstan_fetched_t *job);
    int (*solo_begin)(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job);
    void (*solo_end)(capstan_slot_t *s, capstan_redis_t *r);

    /* The middleware's hooks (capstan_mw_t's ride and prompt): script
     * calls riding the next round trip, and owed acks that release a
     * runtime lock written before a handler runs or a processor waits.
     * ride NULL: the source has no round trip to ride. */
    int (*ride)(capstan_slot_t *s, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls);
    void (*prompt)(capstan_slot_t *s, capstan_redis_t *r, int all);

    /* The housekeeper's: writes the acks that waited too long through the
     * slot no processor uses (see capstan__feed_ack_late), returning how
     * long to wait before the next call, or -1 when acks are late and r is
     * not connected. */
    double (*ack_late)(capstan_slot_t *s, capstan_redis_t *r);
    /* Before the stray check: reads the round trips still on their way. */
    void (*read_deferred)(capstan_runtime_t *rt);
    /* At a hard stop: gives back the jobs fetched and not started, through
     * r (see capstan__feed_give_back). Returns how many. */
    int (*give_back)(capstan_runtime_t *rt, capstan_redis_t *r);
    /* The jobs fetched and not started, by queue, added to counts[0..n). */
    void (*count)(capstan_runtime_t *rt, const char *const *names, long long *counts, size_t n);
} capstan_source_t;

extern const capstan_source_t capstan__source_reliable;
extern const capstan_source_t capstan__source_basic;

/* The source c's fetch setting names: the one place that reads it. */
const capstan_source_t *capstan__source_for(const capstan_config_t *c);
/* The reliable source's feed for rt's processors, given what it asks of
 * the runtime (capstan_feed_env_t). NULL without memory. */
capstan_feed_t *capstan__source_feed_new(struct capstan_runtime *rt);

#endif
