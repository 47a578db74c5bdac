/* The reliable fetch's local buffer (see feed.h).
 *
 * Processors fetch in batches and share what they fetched. The feed keeps
 * enough jobs fetched ahead to cover a round trip to Redis (the jobs taken
 * per second times the measured round trip, twice over, plus one for each
 * thread free to take one), bounded by the prefetch setting: a thread that
 * takes a job and finds the feed below half that level fetches more before
 * it runs its own, and a thread that finds the feed empty fetches for itself
 * and for the threads that look next. Acks of finished jobs wait in the
 * feed too and go out with the next round trip any processor makes, several
 * in one script call. Every job in the feed, fetched or finished, is in the
 * working list meanwhile, so a crash loses none of them. */
#include "runtime/feed.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

/* SWEEP_MAX jobs at most in one fetch call; ACKS_MAX acks waiting make the
 * next thread write them; SWEEPERS_MAX fetches on their way at once. */
enum { SWEEP_MAX = 100, ACKS_MAX = 64, SWEEPERS_MAX = 4 };

/* A round trip a processor sent on its second connection before running
 * its job, to read after it (see defer): the acks it writes, the jobs it
 * fetches. Any thread that would otherwise wait may read it instead. */
typedef struct pending {
    capstan_slot_t *owner;
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

struct capstan_feed {
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

/* When this thread took its last job (capstan__mono()), 0 when it holds none;
 * and how many it took then (see capstan__feed_take_ahead). */
static _Thread_local double taken_at;
static _Thread_local size_t taken_n;

int capstan__feed_default_prefetch(int nslots)
{
    return nslots * 10 < 500 ? 500 : nslots * 10;
}

capstan_feed_t *capstan__feed_new(int nslots, int prefetch)
{
    capstan_feed_t *feed = calloc(1, sizeof(*feed));
    if (!feed)
        return NULL;
    /* Two sweeps at least, so one is on its way while another's jobs are
     * taken; more when there are threads to make them. */
    feed->sweepers_max = nslots < 2 ? 2 : nslots < SWEEPERS_MAX ? nslots : SWEEPERS_MAX;
    feed->prefetch = (size_t)(prefetch > 0 ? prefetch : capstan__feed_default_prefetch(nslots));
    /* The feed and the sweeps on their way hold prefetch jobs at most (see
     * can_sweep), and each thread may put back the one it holds (a sweep
     * that comes back as the process goes quiet, and the jobs it took
     * ahead of their turn: see capstan__feed_take_ahead). */
    feed->cap = feed->prefetch + (size_t)nslots * CAPSTAN_RUN_MAX;
    feed->jobs = calloc(feed->cap, sizeof(capstan_fetched_t));
    if (!feed->jobs) {
        free(feed);
        return NULL;
    }
    feed->rate_t0 = capstan__mono();
    feed->job_time = 0.001; /* until measured: spread the first jobs */
    pthread_mutex_init(&feed->mu, NULL);
    pthread_mutex_init(&feed->give_mu, NULL);
    pthread_cond_init(&feed->came, NULL);
    return feed;
}

void capstan__feed_free(capstan_feed_t *feed)
{
    if (!feed)
        return;
    for (size_t i = 0; i < feed->n; i++)
        capstan__fetched_clear(&feed->jobs[(feed->head + i) % feed->cap]);
    for (size_t i = 0; i < feed->nacks; i++) {
        capstan__done_clear(feed->acks[i]);
        free(feed->acks[i]);
    }
    free(feed->acks);
    free(feed->jobs);
    free(feed->held);
    pthread_cond_destroy(&feed->came);
    pthread_mutex_destroy(&feed->give_mu);
    pthread_mutex_destroy(&feed->mu);
    free(feed);
}

/* ---- What this process holds -------------------------------------------
 *
 * A job is this process's from the reply that fetched it until its ack is
 * written or it is given back, wherever it is meanwhile: in the feed, taken
 * by a processor, running, taken ahead, waiting to run alone, finished with
 * its ack waiting or on its way. The check for strays in the working list
 * (capstan__feed_holds) must see it in every one of those states; looking in
 * each place would miss a job on its way between two, and some of those
 * ways last a round trip or a reconnect. So the feed counts the jobs it let
 * in and has not let go, by their payloads' hash and length, in a small
 * open-addressed table. Only the jobs of a fetch whose reply is not read
 * yet are unknown to it: capstan__feed_holds waits for those fetches. */

/* Eight bytes a step, a multiply and a shift each: every fetched job pays
 * for it once. Two payloads that collide only keep a stray waiting for the
 * recovery after this process exits. */
unsigned long long capstan__feed_hash(const char *payload, size_t len)
{
    unsigned long long h = 0x9e3779b97f4a7c15ULL ^ len, w;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&w, payload + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, payload + i, len - i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

/* Under feed->mu: the place of (hash, len), or of the empty place where it
 * would go. feed->held_cap is a power of two and never full. */
static size_t held_place(const capstan_feed_t *feed, unsigned long long hash, size_t len)
{
    size_t mask = feed->held_cap - 1, i = (size_t)hash & mask;
    while (feed->held[i].count && !(feed->held[i].hash == hash && feed->held[i].len == len))
        i = (i + 1) & mask;
    return i;
}

/* Under feed->mu: makes room for one more entry. Returns 0, or -1 without
 * memory. */
static int held_grow(capstan_feed_t *feed)
{
    if ((feed->held_n + 1) * 2 <= feed->held_cap)
        return 0;
    size_t cap = feed->held_cap ? feed->held_cap * 2 : 256;
    held_t *old = feed->held, *t = calloc(cap, sizeof(*t));
    if (!t)
        return -1;
    size_t ocap = feed->held_cap;
    feed->held = t;
    feed->held_cap = cap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].count)
            t[held_place(feed, old[i].hash, old[i].len)] = old[i];
    free(old);
    return 0;
}

/* Under feed->mu: the jobs got[0..n) are this process's now. Without the
 * memory to count one, every job counts as held from then on: a stray then
 * waits for the recovery after this process exits, never runs twice. */
static void hold(capstan_feed_t *feed, const capstan_fetched_t *got, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (held_grow(feed)) {
            feed->held_lost = 1;
            return;
        }
        size_t i = held_place(feed, got[k].hash, got[k].len);
        if (!feed->held[i].count++) {
            feed->held[i].hash = got[k].hash;
            feed->held[i].len = got[k].len;
            feed->held_n++;
        }
    }
}

/* Under feed->mu: one job of (hash, len) is no longer this process's. The
 * entries after an emptied place move back, so no search stops short. */
static void let_go(capstan_feed_t *feed, unsigned long long hash, size_t len)
{
    if (!feed->held_cap)
        return;
    size_t mask = feed->held_cap - 1, i = held_place(feed, hash, len);
    if (!feed->held[i].count || --feed->held[i].count)
        return;
    feed->held_n--;
    for (size_t j = (i + 1) & mask; feed->held[j].count; j = (j + 1) & mask) {
        size_t home = (size_t)feed->held[j].hash & mask;
        /* j's entry may fill the hole at i unless its home lies in (i, j]. */
        if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
            feed->held[i] = feed->held[j];
            feed->held[j].count = 0;
            i = j;
        }
    }
}

void capstan__feed_let_go(capstan_runtime_t *rt, unsigned long long hash, size_t len)
{
    pthread_mutex_lock(&rt->feed->mu);
    let_go(rt->feed, hash, len);
    pthread_mutex_unlock(&rt->feed->mu);
}

/* Under feed->mu: whether a fetch sent at or before t (capstan__mono()), or
 * any when t is negative, has a reply no thread has read yet. */
static int unread_since(capstan_runtime_t *rt, double t)
{
    for (int i = 0; i < rt->nslots; i++) {
        const capstan_slot_t *s = &rt->slots[i];
        double a = s->fetch_sent, b = s->pend && s->pend->want ? s->pend->sent : 0;
        if ((a > 0 && (t < 0 || a <= t)) || (b > 0 && (t < 0 || b <= t)))
            return 1;
    }
    return 0;
}

/* The hashes of jobs[0..n), computed out of the feed's lock. */
static void hash_all(capstan_fetched_t *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        jobs[i].hash = capstan__feed_hash(jobs[i].payload, jobs[i].len);
}

int capstan__feed_holds(capstan_runtime_t *rt, const char *payload, size_t len, double since)
{
    capstan_feed_t *feed = rt->feed;
    unsigned long long hash = capstan__feed_hash(payload, len);
    pthread_mutex_lock(&feed->mu);
    int held = feed->held_lost
               || (feed->held_cap && feed->held[held_place(feed, hash, len)].count);
    /* Since the job was first seen, this process gave jobs back and a fetch
     * is on its way: the same payload may have gone back to its queue and
     * be fetched again. It counts as held, and is seen anew next pass. */
    held = held || (since >= 0 && feed->gave_back_at >= since && unread_since(rt, -1));
    /* A fetch sent before the list was read may have moved it, its reply
     * not read yet: not known until that reply is read. */
    if (!held && since >= 0 && unread_since(rt, since))
        held = 2;
    pthread_mutex_unlock(&feed->mu);
    return held;
}

/* ---- Finished jobs ---------------------------------------------------- */

void capstan__done_clear(capstan_done_t *d)
{
    capstan__mw_clear(&d->mw);
    capstan__job_clear(&d->job);
    d->active = 0;
}

void capstan__done_acked(capstan_runtime_t *rt, capstan_done_t *d, capstan_redis_t *r)
{
    if (d->ack.lock_key)
        capstan__unique_note_released(&d->mw, r);
    /* After the ack: the job is in the dead set when the hook runs. */
    if (d->ack.kind == CAPSTAN_ACK_DEAD)
        capstan__hooks_death(rt, &d->job, d->job.err_class, d->job.err_msg);
    /* After the ack too: the job is in the schedule set when it wakes. */
    if (d->ack.kind == CAPSTAN_ACK_SCHEDULE)
        capstan__scheduler_wake_at(rt, d->ack.score);
    capstan__done_clear(d);
}

void capstan__done_free(capstan_done_t *d)
{
    if (!d)
        return;
    capstan__done_clear(d);
    free(d);
}

/* ---- The ring of fetched jobs and the acks waiting -------------------- */

/* Under feed->mu: puts job in the ring in the order Redis fetched it
 * (capstan_fetched_t.seq): usually at the end, but sweeps on their way at once
 * may come back in another order than Redis ran them, and the job a thread
 * holds as its sweep comes back to a quiet process goes back in its place.
 * So the feed gives its jobs back in order. The ring has room for every
 * sweep in flight and a job put back by each thread. */
static void feed_push(capstan_feed_t *feed, capstan_fetched_t *job)
{
    size_t i = feed->n;
    for (; i > 0 && feed->jobs[(feed->head + i - 1) % feed->cap].seq > job->seq; i--)
        feed->jobs[(feed->head + i) % feed->cap] = feed->jobs[(feed->head + i - 1) % feed->cap];
    feed->jobs[(feed->head + i) % feed->cap] = *job;
    feed->n++;
    memset(job, 0, sizeof(*job));
}

/* Under feed->mu: the oldest job waiting (there is one). */
static capstan_fetched_t feed_pop(capstan_feed_t *feed)
{
    capstan_fetched_t j = feed->jobs[feed->head];
    feed->head = (feed->head + 1) % feed->cap;
    feed->n--;
    return j;
}

void capstan__feed_count(capstan_feed_t *feed, const char *const *names, long long *counts, size_t n)
{
    memset(counts, 0, n * sizeof(*counts));
    pthread_mutex_lock(&feed->mu);
    for (size_t i = 0; i < feed->n; i++) {
        const char *q = feed->jobs[(feed->head + i) % feed->cap].queue;
        for (size_t k = 0; q && k < n; k++)
            if (strcmp(q, names[k]) == 0) {
                counts[k]++;
                break;
            }
    }
    pthread_mutex_unlock(&feed->mu);
}

/* Under feed->mu: the newest job waiting, or a zeroed one when none is. */
static capstan_fetched_t feed_pop_newest(capstan_feed_t *feed)
{
    capstan_fetched_t j = {0};
    if (feed->n) {
        feed->n--;
        j = feed->jobs[(feed->head + feed->n) % feed->cap];
    }
    return j;
}

/* Under feed->mu: waits for a sweep to come back, or a little while: a job
 * left in the feed because the threads running were thought quick (see
 * wake_for_jobs) is then taken by a waiter within WAIT_MAX. */
#define WAIT_MAX 0.01
static void feed_wait(capstan_feed_t *feed)
{
    struct timespec until = capstan__timespec(capstan__now() + WAIT_MAX);
    feed->waiting++;
    pthread_cond_timedwait(&feed->came, &feed->mu, &until);
    feed->waiting--;
}

/* Under feed->mu: leaves d's ack waiting for the next round trip (now:
 * capstan__mono()). Returns NULL, or d when there was no memory to keep it (the
 * caller writes it). */
static capstan_done_t *ack_later(capstan_feed_t *feed, capstan_done_t *d, double now)
{
    if (feed->nacks == feed->cap_acks) {
        size_t cap = feed->cap_acks ? feed->cap_acks * 2 : 64;
        capstan_done_t **a = realloc(feed->acks, cap * sizeof(*a));
        if (a) {
            feed->acks = a;
            feed->cap_acks = cap;
        }
    }
    if (feed->nacks == feed->cap_acks)
        return d;
    if (!feed->nacks)
        feed->acks_since = now;
    feed->acks[feed->nacks++] = d;
    if (d->prompt)
        atomic_fetch_add(&feed->prompt, 1);
    return NULL;
}

/* Acks of jobs that ran on a master this process has seen replaced are
 * not written to the new one: what the job wrote may be lost with the old
 * master (a failover loses the writes its replica had not got), while its
 * ack would make it done. Left in the working list, the job runs again
 * (the stray check or the recovery gives it back): a failover may cost
 * acks, never jobs. Frees those of acks[0..n) and returns how many are
 * left, in order. */
static size_t drop_stale(capstan_feed_t *feed, capstan_done_t **acks, size_t n, const capstan_redis_t *r)
{
    static atomic_int warned_era = -1;
    int era = capstan__redis_era(r);
    size_t k = 0, dropped = 0;
    for (size_t i = 0; i < n; i++) {
        if (acks[i]->era == era) {
            acks[k++] = acks[i];
        } else {
            capstan_done_t *d = acks[i];
            pthread_mutex_lock(&feed->mu);
            let_go(feed, d->hash, d->job.len); /* a stray now: given back */
            pthread_mutex_unlock(&feed->mu);
            capstan__done_free(d);
            dropped++;
        }
    }
    if (dropped && atomic_exchange(&warned_era, era) != era)
        capstan_warn("%zu finished jobs ran on a master that has been replaced since: not "
                     "acknowledged on the new one, they run again", dropped);
    return k;
}

static void finish_acks(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t **acks,
                        const capstan_ack_item_t *items, size_t nacks, int again, size_t *unwritten);

/* Writes d's ack at once and frees d. */
static void ack_now(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    if (!drop_stale(s->rt->feed, &d, 1, r))
        return; /* freed: it runs again */
    capstan_ack_item_t item = { .rc = capstan__fetch_ack(s->fetch, r, d->job.payload, d->job.len, &d->ack) };
    /* Written, or left in the working list for the stray check. */
    finish_acks(s, r, &d, &item, 1, 0, NULL);
}

void capstan__feed_ack(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    capstan_feed_t *feed = s->rt->feed;
    pthread_mutex_lock(&feed->mu);
    d = ack_later(feed, d, capstan__mono());
    pthread_mutex_unlock(&feed->mu);
    if (d)
        ack_now(s, r, d);
}

/* Under feed->mu: takes every waiting ack, to be written by the caller. */
static capstan_done_t **take_acks(capstan_feed_t *feed, size_t *n)
{
    *n = 0;
    if (!feed->nacks)
        return NULL;
    capstan_done_t **a = malloc(feed->nacks * sizeof(*a));
    if (!a)
        return NULL; /* they wait for the next taker */
    memcpy(a, feed->acks, feed->nacks * sizeof(*a));
    *n = feed->nacks;
    feed->nacks = 0;
    atomic_store(&feed->prompt, 0);
    return a;
}

/* The items that write acks (rc not known yet). */
static void ack_items(capstan_done_t *const *acks, size_t nacks, capstan_ack_item_t *items)
{
    for (size_t i = 0; i < nacks; i++)
        items[i] = (capstan_ack_item_t){ .raw = acks[i]->job.payload, .len = acks[i]->job.len,
                                     .ack = acks[i]->ack, .rc = CAPSTAN_EREDIS };
}

/* The one step that finishes the acks a round trip carried (items their
 * results), called once per round trip on the stack that made it: fetching
 * job n+1 finishes job n's ack. Those written are let go, then each goes
 * through capstan__done_acked (the lock metric and its Prometheus event,
 * the death hooks, the scheduler's wake) and is freed. Those not written
 * wait in the feed again for the next round trip when again is set;
 * otherwise they are let go too and freed (left in the working list for
 * the stray check). *unwritten (when not NULL) counts them. The array
 * acks is the caller's to free. */
static void finish_acks(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t **acks,
                        const capstan_ack_item_t *items, size_t nacks, int again, size_t *unwritten)
{
    size_t failed = 0;
    capstan_feed_t *feed = s->rt->feed;
    pthread_mutex_lock(&feed->mu);
    for (size_t i = 0; i < nacks; i++)
        if (items[i].rc == 0 || !again)
            let_go(feed, acks[i]->hash, acks[i]->job.len);
    pthread_mutex_unlock(&feed->mu);
    for (size_t i = 0; i < nacks; i++) {
        if (items[i].rc == 0) {
            capstan__done_acked(s->rt, acks[i], r);
            capstan__done_free(acks[i]);
        } else if (again) {
            capstan__feed_ack(s, r, acks[i]);
            failed++;
        } else {
            capstan__done_free(acks[i]);
            failed++;
        }
    }
    if (unwritten)
        *unwritten = failed;
}

/* Writes the acks taken (and makes the calls, and fetches up to max jobs
 * into got, in the same round trip). Acks written are released; the others
 * go back to the feed for the next round trip, and *unwritten (when not
 * NULL) counts them. Returns capstan__fetch_exchange's result. */
static int exchange_calls(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t **acks, size_t nacks,
                          capstan_script_call_t *calls, size_t ncalls, capstan_fetched_t *got,
                          size_t max, int block, size_t *unwritten)
{
    nacks = drop_stale(s->rt->feed, acks, nacks, r);
    /* A few on the stack; many (up to every ack waiting) on the heap, so
     * that no thread's stack grows by them. */
    capstan_ack_item_t few[8];
    capstan_ack_item_t *items = nacks <= 8 ? few : malloc(nacks * sizeof(*items));
    if (!items) {
        for (size_t i = 0; i < nacks; i++)
            capstan__feed_ack(s, r, acks[i]); /* they wait for the next round trip */
        free(acks);
        acks = NULL;
        nacks = 0;
        items = few;
    }
    ack_items(acks, nacks, items);
    for (size_t i = 0; i < ncalls; i++)
        calls[i].reply = NULL;
    int rc = capstan_redis_ok(r) ? capstan__fetch_exchange_calls(s->fetch, r, items, nacks, calls,
                                                                 ncalls, got, max, block)
                             : CAPSTAN_EREDIS;
    finish_acks(s, r, acks, items, nacks, 1, unwritten);
    free(acks);
    if (items != few)
        free(items);
    return rc;
}

static int exchange(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t **acks, size_t nacks,
                    capstan_fetched_t *got, size_t max, int block, size_t *unwritten)
{
    return exchange_calls(s, r, acks, nacks, NULL, 0, got, max, block, unwritten);
}

static void settle_own(capstan_slot_t *s, capstan_feed_t *feed);

int capstan__feed_ride(capstan_slot_t *s, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    capstan_feed_t *feed = s->rt->feed;
    size_t nacks;
    pthread_mutex_lock(&feed->mu);
    /* This thread's own round trip on its second connection may carry the
     * release of a lock these calls ask for (its last job's): read first,
     * or Redis may serve this connection before that one. */
    settle_own(s, feed);
    capstan_done_t **acks = take_acks(feed, &nacks);
    pthread_mutex_unlock(&feed->mu);
    int rc = exchange_calls(s, r, acks, nacks, calls, ncalls, NULL, 0, 0, NULL);
    return rc < 0 ? rc : 0;
}

void capstan__feed_prompt(capstan_slot_t *s, capstan_redis_t *r, int all)
{
    capstan_feed_t *feed = s->rt->feed;
    size_t nacks = 0;
    if (!all && !atomic_load(&feed->prompt))
        return;
    pthread_mutex_lock(&feed->mu);
    capstan_done_t **acks = all || atomic_load(&feed->prompt) ? take_acks(feed, &nacks) : NULL;
    pthread_mutex_unlock(&feed->mu);
    if (nacks)
        exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
}

/* Acks that have waited this long (seconds) are written by the
 * housekeeper: when every processor is in a long job or a long wait (a
 * lock, a limiter slot, a suspect running alone), none comes back to the
 * feed to send them, and a kill or a failover meanwhile would run their
 * jobs again. Under load acks never wait this long (see take_waiting). */
#define ACK_LATE 0.1

double capstan__feed_ack_late(capstan_slot_t *s, capstan_redis_t *r)
{
    capstan_feed_t *feed = s->rt->feed;
    size_t nacks = 0;
    capstan_done_t **acks = NULL;
    pthread_mutex_lock(&feed->mu);
    double age = feed->nacks ? capstan__mono() - feed->acks_since : 0;
    if (age >= ACK_LATE && capstan_redis_ok(r))
        acks = take_acks(feed, &nacks);
    pthread_mutex_unlock(&feed->mu);
    if (nacks) {
        exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
        return ACK_LATE;
    }
    if (age >= ACK_LATE)
        return -1;
    return ACK_LATE - age;
}

/* Writes every waiting ack, reconnecting until they are written or the
 * process is about to exit (then their jobs stay in the working list and
 * are recovered once this process is gone). */
static void flush_acks(capstan_slot_t *s, capstan_redis_t *r)
{
    capstan_runtime_t *rt = s->rt;
    capstan_feed_t *feed = rt->feed;
    for (;;) {
        size_t n;
        pthread_mutex_lock(&feed->mu);
        capstan_done_t **acks = take_acks(feed, &n);
        pthread_mutex_unlock(&feed->mu);
        if (!n)
            return;
        size_t failed;
        exchange(s, r, acks, n, NULL, 0, 0, &failed);
        /* Acks other threads queued meanwhile simply go in the next turn;
         * only a failure of these calls for a new connection. */
        if (failed && (atomic_load(&rt->housekeeper_stop)
                       || capstan__rt_connect(rt, r, &rt->housekeeper_stop))) {
            pthread_mutex_lock(&feed->mu);
            acks = take_acks(feed, &n);
            for (size_t i = 0; i < n; i++)
                let_go(feed, acks[i]->hash, acks[i]->job.len);
            pthread_mutex_unlock(&feed->mu);
            for (size_t i = 0; i < n; i++)
                capstan__done_free(acks[i]);
            free(acks);
            return;
        }
    }
}

/* ---- Runs of short jobs with runtime locks -----------------------------
 *
 * A job that takes a runtime lock (while_executing and its kin) waits for a
 * round trip of its own before it starts. When such jobs are short, a
 * processor takes the ones that follow it in the feed too, up to
 * CAPSTAN_RUN_MAX in all, asks for all their locks in one round trip and runs
 * them in turn (processor.c): a job's lock is then held from that round
 * trip until it has run, about RUN_SPAN longer at most. */

/* Jobs run so while the processor's handlers take less than RUN_JOB_TIME
 * (seconds) on average, and a run is cut to what they do in RUN_SPAN: no
 * lock is held much longer before its job starts. */
#define RUN_JOB_TIME 0.001
#define RUN_SPAN 0.002

/* Whether the payload names a lock type whose runtime lock is taken at
 * once (Ruby's client writes sidekiq_options into every payload). Plain
 * searches: a false match only costs a run of one. */
static int runtime_locked(const capstan_fetched_t *job)
{
    static const char key[] = "\"lock\":\"";
    const size_t k = sizeof(key) - 1, t = sizeof("while_executing") - 1;
    const char *p = job->payload, *end = job->payload + job->len;
    /* One search for the key, then its value (the two types' names are of
     * one length), rather than a search a type. */
    while ((p = memmem(p, (size_t)(end - p), key, k)) && (size_t)(end - p) >= k + t) {
        p += k;
        if (!memcmp(p, "while_executing", t) || !memcmp(p, "until_and_while", t))
            return 1;
    }
    return 0;
}

size_t capstan__feed_take_ahead(capstan_slot_t *s, const capstan_fetched_t *first, capstan_fetched_t *out,
                                size_t max)
{
    capstan_runtime_t *rt = s->rt;
    capstan_feed_t *feed = rt->feed;
    size_t n = 0;
    if (s->run_time >= RUN_JOB_TIME || !runtime_locked(first))
        return 0;
    double fit = RUN_SPAN / (s->run_time > 1e-6 ? s->run_time : 1e-6);
    if ((double)max > fit)
        max = (size_t)fit;
    pthread_mutex_lock(&feed->mu);
    pthread_mutex_lock(&s->mu);
    if (max > CAPSTAN_RUN_MAX - 1 - s->nahead)
        max = CAPSTAN_RUN_MAX - 1 - s->nahead;
    /* A thread waiting for a job gets one first. */
    while (n < max && feed->n > feed->waiting && !feed->solo && !atomic_load(&rt->quiet)) {
        const capstan_fetched_t *head = &feed->jobs[feed->head];
        if (!runtime_locked(head) || capstan__feed_suspect(head))
            break;
        out[n] = feed_pop(feed);
        s->ahead[s->nahead++] = (struct capstan_ahead){ .payload = out[n].payload, .len = out[n].len,
                                                    .queue = out[n].queue, .seq = out[n].seq };
        n++;
    }
    if (n && !s->in_run) {
        s->in_run = 1;
        atomic_fetch_add(&feed->runs, 1);
    }
    pthread_mutex_unlock(&s->mu);
    taken_n += n;
    pthread_mutex_unlock(&feed->mu);
    return n;
}

/* Under s->mu: removes the view of payload from s->ahead. Returns 0 when
 * it was there, 1 when a give-back took it. */
static int ahead_remove(capstan_slot_t *s, const char *payload)
{
    for (size_t i = 0; i < s->nahead; i++)
        if (s->ahead[i].payload == payload) {
            memmove(&s->ahead[i], &s->ahead[i + 1], (s->nahead - i - 1) * sizeof(s->ahead[0]));
            s->nahead--;
            return 0;
        }
    return 1;
}

int capstan__feed_ahead_start(capstan_slot_t *s, const char *payload)
{
    return ahead_remove(s, payload);
}

void capstan__feed_ahead_locks(capstan_slot_t *s, const capstan_fetched_t *got, capstan_prelock_t *pre, size_t n)
{
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < s->nahead; k++)
            if (s->ahead[k].payload == got[i].payload)
                s->ahead[k].pre = &pre[i];
    pthread_mutex_unlock(&s->mu);
}

void capstan__feed_put_back(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *jobs, capstan_prelock_t *pre,
                            size_t n)
{
    capstan_feed_t *feed = s->rt->feed;
    char mine[n ? n : 1];
    pthread_mutex_lock(&feed->mu);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++)
        mine[i] = ahead_remove(s, jobs[i].payload) == 0;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&feed->mu);
    /* Their locks go before they can be given back and fetched again. */
    for (size_t i = 0; pre && i < n; i++)
        if (mine[i])
            capstan__unique_prelock_drop(r, &pre[i]);
    pthread_mutex_lock(&feed->mu);
    for (size_t i = 0; i < n; i++) {
        if (mine[i])
            feed_push(feed, &jobs[i]); /* in its place again, by its seq */
        else
            capstan__fetched_clear(&jobs[i]); /* the give-back took a copy */
    }
    taken_n = taken_n > n ? taken_n - n : 1;
    pthread_mutex_unlock(&feed->mu);
}

void capstan__feed_run_end(capstan_slot_t *s)
{
    if (s->in_run) {
        s->in_run = 0;
        atomic_fetch_sub(&s->rt->feed->runs, 1);
    }
}

/* Under feed->mu, at a hard stop: copies every job the processors took
 * ahead and asked the lock of into the feed, to be given back with it in
 * order, and takes those locks over into *held (to be released before the
 * jobs go back): the processors start none of them. A job whose lock is
 * still being asked for, or that cannot be copied, stays in the working
 * list, recovered once this process is gone. Returns how many locks. */
static size_t take_back_ahead(capstan_runtime_t *rt, capstan_feed_t *feed, capstan_prelock_t ***held)
{
    size_t nheld = 0, cap = (size_t)rt->nslots * (CAPSTAN_RUN_MAX - 1);
    *held = calloc(cap, sizeof(**held));
    for (int i = 0; *held && i < rt->nslots; i++) {
        capstan_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        for (size_t k = 0; k < s->nahead;) {
            struct capstan_ahead *a = &s->ahead[k];
            capstan_fetched_t j = { .payload = a->pre ? malloc(a->len + 1) : NULL, .len = a->len,
                                .queue = a->queue, .seq = a->seq };
            capstan_prelock_t *p = j.payload ? malloc(sizeof(*p)) : NULL;
            if (!p) {
                free(j.payload);
                k++;
                continue;
            }
            memcpy(j.payload, a->payload, j.len);
            j.payload[j.len] = '\0';
            j.hash = capstan__feed_hash(j.payload, j.len); /* counted once, as this copy */
            *p = *a->pre;
            memset(a->pre, 0, sizeof(*a->pre)); /* ours now */
            (*held)[nheld++] = p;
            feed_push(feed, &j);
            ahead_remove(s, a->payload);
        }
        pthread_mutex_unlock(&s->mu);
    }
    return nheld;
}

/* ---- Giving jobs back ------------------------------------------------- */

/* Jobs given back in one call at most. */
enum { GIVE_BACK_MAX = 100 };

/* Gives n (at most GIVE_BACK_MAX) fetched jobs of one queue back in one
 * call, newest first, and frees them. feed: the feed that counted them, or
 * NULL (a job of the basic source). */
static void give_back_run(capstan_fetch_t *f, capstan_runtime_t *rt, capstan_feed_t *feed, capstan_redis_t *r,
                          capstan_fetched_t *jobs, size_t n, int connect)
{
    const char *raws[GIVE_BACK_MAX] = {0};
    size_t lens[GIVE_BACK_MAX] = {0};
    for (size_t i = 0; i < n; i++) {
        raws[i] = jobs[i].payload;
        lens[i] = jobs[i].len;
    }
    /* Gone from the working list, or left there for the stray check; and
     * the same payload may now be fetched again (see capstan__feed_holds). */
    if (feed) {
        pthread_mutex_lock(&feed->mu);
        for (size_t i = 0; i < n; i++)
            let_go(feed, jobs[i].hash, jobs[i].len);
        feed->gave_back_at = capstan__mono();
        pthread_mutex_unlock(&feed->mu);
    }
    const char *queue = jobs[0].queue;
    int back = capstan__fetch_requeue_n(f, r, queue, raws, lens, n);
    /* Only a broken connection is worth another try: an error reply (the
     * queue key holds another type than a list) would only come again. */
    while (back == CAPSTAN_EREDIS && !capstan_redis_ok(r) && connect
           && capstan__rt_connect(rt, r, &rt->housekeeper_stop) == 0)
        back = capstan__fetch_requeue_n(f, r, queue, raws, lens, n);
    if (back == 0 && n == 1)
        capstan_info("a fetched job that had not started went back to queue:%s", queue);
    else if (back == 0)
        capstan_info("%zu fetched jobs that had not started went back to queue:%s", n, queue);
    else if (n == 1)
        capstan_error("could not give a fetched job back to queue:%s: %s; it stays in the working "
                      "list and is recovered or reclaimed later", queue,
                      back == CAPSTAN_EREPLY ? "the key holds another type than a list"
                                     : capstan_redis_error(r));
    else
        capstan_error("could not give %zu fetched jobs back to queue:%s: %s; they stay in the "
                      "working list and are recovered or reclaimed later", n, queue,
                      back == CAPSTAN_EREPLY ? "the key holds another type than a list"
                                     : capstan_redis_error(r));
    for (size_t i = 0; i < n; i++)
        capstan__fetched_clear(&jobs[i]);
}

void capstan__give_back(capstan_fetch_t *f, capstan_runtime_t *rt, capstan_redis_t *r, capstan_fetched_t *job,
                        int connect)
{
    give_back_run(f, rt, NULL, r, job, 1, connect);
}

/* Newest first, so that each queue's oldest ends up fetched first again;
 * a run of jobs of one queue goes back in one call. */
int capstan__feed_give_back(capstan_runtime_t *rt, capstan_fetch_t *f, capstan_redis_t *r, int connect)
{
    capstan_feed_t *feed = rt->feed;
    int total = 0;
    /* One thread at a time: two giving back runs of one queue at once
     * could put the older run in place first and the newer in front. The
     * last give-back at a hard stop (no reconnecting) does not wait for
     * one that may be reconnecting: that one gives them back, or they stay
     * in the working list. */
    if (connect)
        pthread_mutex_lock(&feed->give_mu);
    else if (pthread_mutex_trylock(&feed->give_mu) != 0)
        return 0;
    capstan_prelock_t **held;
    pthread_mutex_lock(&feed->mu);
    size_t nheld = take_back_ahead(rt, feed, &held);
    pthread_mutex_unlock(&feed->mu);
    for (size_t i = 0; i < nheld; i++) {
        capstan__unique_prelock_drop(r, held[i]);
        free(held[i]);
    }
    free(held);
    for (;;) {
        capstan_fetched_t jobs[GIVE_BACK_MAX];
        size_t n = 0;
        pthread_mutex_lock(&feed->mu);
        while (n < GIVE_BACK_MAX && feed->n) {
            jobs[n] = feed_pop_newest(feed);
            n++;
        }
        pthread_mutex_unlock(&feed->mu);
        if (!n)
            break;
        for (size_t i = 0, j; i < n; i = j) {
            for (j = i + 1; j < n && strcmp(jobs[j].queue, jobs[i].queue) == 0; j++)
                ;
            give_back_run(f, rt, feed, r, jobs + i, j - i, connect);
        }
        total += (int)n;
    }
    pthread_mutex_unlock(&feed->give_mu);
    return total;
}

/* ---- Suspects ---------------------------------------------------------
 *
 * A job recovered from a crashed process carries "recovery_count", and so
 * does every job that was in that process's working list with it: fetched
 * in its batch, running beside it, or finished with its ack still waiting
 * in the feed. Had such a suspect run beside others and crashed the
 * process again, they all would be recovered again, and after
 * max_recoveries innocent jobs would go to the dead set as poison pills.
 * So a suspect runs alone: the jobs other threads hold finish first, the
 * acks waiting are written, the jobs waiting in the feed go back to the
 * head of their queues, and no thread fetches until the suspect is done
 * and acked. A crash then leaves only the suspect in the working list, and
 * only the job at fault counts recoveries. A suspect that fails normally
 * loses the count (see capstan__retry_decide): it did not crash the process.
 * Suspects are rare (only after a crash); otherwise this costs a memmem per
 * job and a counter kept under the lock capstan__feed_next takes anyway. */

/* Under feed->mu: this thread looks for a job again, so it holds none. */
static void gate_leave(capstan_feed_t *feed, int *inside)
{
    if (!*inside)
        return;
    *inside = 0;
    feed->inside--;
    if (feed->solo)
        pthread_cond_broadcast(&feed->came); /* the suspect waits for this */
}

int capstan__feed_suspect(const capstan_fetched_t *job)
{
    /* A plain search: a nested field of that name only costs a solo run. */
    static const char key[] = "\"recovery_count\"";
    return memmem(job->payload, job->len, key, sizeof(key) - 1) != NULL;
}

/* Waits until no other thread holds a job (the acks that wait meanwhile
 * are the housekeeper's to write: see capstan__feed_ack_late), writes the
 * acks waiting then and gives back the jobs waiting in the feed. The
 * suspect goes back to its queue instead when another suspect runs (this
 * one runs after it) or the process goes quiet. */
int capstan__feed_solo_begin(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job)
{
    capstan_runtime_t *rt = s->rt;
    capstan_feed_t *feed = rt->feed;
    pthread_mutex_lock(&feed->mu);
    int mine = !feed->solo;
    if (mine) {
        feed->solo = 1;
        while (feed->inside > 1 && !atomic_load(&rt->quiet))
            feed_wait(feed);
    }
    pthread_mutex_unlock(&feed->mu);
    int quiet = atomic_load(&rt->quiet);
    if (mine && !quiet) {
        flush_acks(s, r);
        capstan__feed_give_back(rt, s->fetch, r, 1);
    }
    if (mine && quiet) {
        pthread_mutex_lock(&feed->mu);
        feed->solo = 0;
        pthread_mutex_unlock(&feed->mu);
    }
    if (mine && !quiet)
        return 1;
    give_back_run(s->fetch, rt, feed, r, job, 1, 1);
    return 0;
}

/* The suspect is done: its ack is written before any other job is
 * fetched, then the gate opens. */
void capstan__feed_solo_end(capstan_slot_t *s, capstan_redis_t *r)
{
    capstan_feed_t *feed = s->rt->feed;
    flush_acks(s, r);
    pthread_mutex_lock(&feed->mu);
    feed->solo = 0;
    pthread_cond_broadcast(&feed->came);
    pthread_mutex_unlock(&feed->mu);
}

/* ---- Taking a job ----------------------------------------------------- */

/* A sweep that came back short leaves the queues about empty: sweeps ahead
 * of need wait this long (seconds), while a thread that finds the feed empty
 * still fetches, and blocks on the queues when they are. */
#define DRY_PAUSE 0.005

/* Under feed->mu: how many jobs the feed should hold or have asked for: one
 * for each thread free to take one, and what the threads take in two round
 * trips, so a sweep's jobs arrive before the feed runs dry. A round trip
 * counts as RTT_FLOOR at least: on a near Redis that keeps sweeps large
 * (a round trip costs CPU on both sides, however short it is), and a
 * millisecond of work is all another process might miss of a shared queue. */
#define RTT_FLOOR 0.001
/* Jobs that take longer than this (seconds) defer their round trips (see
 * defer): a sweep's jobs then come in after the sweeper's job as well. The
 * job time starts at this, so nothing is deferred before it is measured. */
#define DEFER_AFTER 0.001
/* Jobs fetched beyond the free threads are out of sight of the queue's
 * size and latency as Sidekiq reads them (and of autoscalers built on
 * those): at most what the process takes in this long (seconds), however
 * long jobs run, unless two network round trips take longer. A deferred
 * round trip waits for its sender's job: the cap keeps that wait from
 * adding to what is fetched ahead, and the threads fetch a little more
 * often for themselves. */
#define AHEAD_MAX 0.02
static size_t level(capstan_runtime_t *rt, const capstan_feed_t *feed)
{
    long idle = (long)rt->nslots - (long)atomic_load(&rt->busy);
    double rtt = feed->rtt > RTT_FLOOR ? feed->rtt : RTT_FLOOR, net = rtt * 2.0;
    if (feed->job_time > DEFER_AFTER)
        rtt += feed->job_time;
    /* The cap takes back only what the jobs' own length added: a distant
     * Redis still gets its two round trips, or it would starve the
     * processors. */
    double ahead = rtt * 2.0 < AHEAD_MAX ? rtt * 2.0 : AHEAD_MAX;
    if (ahead < net)
        ahead = net;
    double want = (double)(idle < 1 ? 1 : idle) + feed->rate * ahead;
    return want >= (double)feed->prefetch ? feed->prefetch : (size_t)want;
}

/* Under feed->mu: the jobs a sweep would ask for to bring the feed to its
 * level, at most SWEEP_MAX; 0 when it is there. */
static size_t shortfall(capstan_runtime_t *rt, const capstan_feed_t *feed)
{
    size_t want = level(rt, feed), have = feed->n + feed->asked;
    if (want <= have)
        return 0;
    return want - have > SWEEP_MAX ? SWEEP_MAX : want - have;
}

/* Under feed->mu: whether one more sweep may go out. */
static int can_sweep(const capstan_feed_t *feed)
{
    return feed->sweeping < feed->sweepers_max && feed->n + feed->asked < feed->prefetch;
}

/* Under feed->mu: whether a thread looking for a job has to wait: a suspect
 * runs alone, or the feed is empty and enough sweeps are on their way. */
static int must_wait(const capstan_feed_t *feed)
{
    return feed->solo || (!feed->n && !can_sweep(feed));
}

/* A job left in the feed may wait about this long (seconds) for one of
 * the threads running to come back before a waiting thread is woken. */
#define WAKE_AFTER 0.0005

/* Under feed->mu: wakes a waiting thread when the threads running would
 * not take the jobs left soon, as the time jobs take says. Waking one for
 * every job would cost a context switch a job when jobs are short; the
 * woken thread wakes the next in turn while that holds. */
static void wake_for_jobs(capstan_runtime_t *rt, capstan_feed_t *feed)
{
    if (!feed->waiting || !feed->n)
        return;
    long running = (long)rt->nslots - (long)feed->waiting;
    double wait = (double)feed->n * feed->job_time / (double)(running < 1 ? 1 : running);
    if (wait > WAKE_AFTER)
        pthread_cond_signal(&feed->came);
}

/* How many times the average round trip one sweep's may count for. */
#define RTT_STEP 4.0

/* Under feed->mu: a sweep that asked for asked jobs came back with got (or
 * an error) after a round trip begun at began: the averages move. */
static void note_sweep(capstan_feed_t *feed, double began, size_t asked, int got)
{
    double now = capstan__mono(), rtt = now - began, dt = now - feed->rate_t0;
    /* A round trip that spans a stall (the process stopped, Redis frozen,
     * a partition) says nothing of the network: counted in full it would
     * have the feed fetch seconds of jobs ahead, which a fault that came
     * next would hand to another process to run again. One sample moves
     * the average by a factor of 1.6 at most; a Redis that really is
     * farther away is reached in a few sweeps. 0: read after a job, the
     * round trip is not known; an error tells nothing either. */
    if (feed->rtt > 0 && rtt > RTT_STEP * feed->rtt)
        rtt = RTT_STEP * feed->rtt;
    if (began > 0 && got >= 0)
        feed->rtt = feed->rtt > 0 ? 0.8 * feed->rtt + 0.2 * rtt : rtt;
    if (got >= 0 && (size_t)got < asked)
        feed->dry_until = now + DRY_PAUSE;
    if (dt >= 0.05) {
        double rate = (double)feed->taken / dt;
        feed->rate = feed->rate > 0 ? 0.5 * feed->rate + 0.5 * rate : rate;
        feed->taken = 0;
        feed->rate_t0 = now;
    }
}

/* Under feed->mu, which it releases: fetches want jobs into the feed,
 * writing the acks waiting in the same round trip. A thread that found the
 * feed empty (job->payload NULL) keeps the first job for itself, and when
 * every queue was empty blocks on them for one; a thread that holds a job
 * already fetches ahead for the others. Returns 1 with a job in *job, 0
 * without, or capstan__fetch_exchange's error. */
static int sweep(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job, size_t want)
{
    capstan_runtime_t *rt = s->rt;
    capstan_feed_t *feed = rt->feed;
    int ahead = job->payload != NULL, first = ahead ? 0 : 1;
    /* On the heap, not the stack: each thread's stack keeps resident the
     * deepest it ever went. */
    capstan_fetched_t *got = calloc(want ? want : 1, sizeof(*got));
    if (!got) {
        pthread_mutex_unlock(&feed->mu);
        return ahead ? 1 : CAPSTAN_ENOMEM;
    }
    size_t nacks;
    capstan_done_t **acks = take_acks(feed, &nacks);
    feed->sweeping++;
    feed->asked += want;
    double began = capstan__mono();
    s->fetch_sent = began;
    pthread_mutex_unlock(&feed->mu);

    int rc = exchange(s, r, acks, nacks, got, want, 0, NULL);
    if (rc > 0)
        hash_all(got, (size_t)rc);
    pthread_mutex_lock(&feed->mu);
    if (rc > 0)
        hold(feed, got, (size_t)rc);
    s->fetch_sent = 0;
    feed->sweeping--;
    feed->asked -= want;
    note_sweep(feed, began, want, rc);
    /* Even as the process goes quiet: the feed gives its jobs back in order
     * (capstan__feed_leave waits for the sweeps on their way), the job this
     * thread holds with them. */
    int quiet = atomic_load(&rt->quiet);
    for (int i = quiet ? 0 : first; i < rc; i++)
        feed_push(feed, &got[i]);
    if (quiet && ahead)
        feed_push(feed, job);
    acks = NULL;
    nacks = 0;
    if (rc == 0 && !ahead && !quiet) {
        pthread_cond_broadcast(&feed->came); /* all go and wait on the queues */
        acks = take_acks(feed, &nacks);
    } else {
        wake_for_jobs(rt, feed);
    }
    pthread_mutex_unlock(&feed->mu);
    if (rc > 0 && !ahead && !quiet)
        *job = got[0];
    free(got);
    if (quiet)
        return 0;
    if (rc > 0)
        return 1;
    /* A thread that fetched ahead runs its job whatever came back: an error
     * shows again in the next sweep of a thread that finds the feed empty. */
    if (ahead)
        return 1;
    if (rc < 0)
        return rc;
    /* Every queue was empty: wait on them (see capstan__fetch_exchange). A
     * suspect waits for this too (it is inside the gate): a job it moves
     * into the working list would share the suspect's fate in a crash. */
    pthread_mutex_lock(&feed->mu);
    s->fetch_sent = capstan__mono();
    pthread_mutex_unlock(&feed->mu);
    rc = exchange(s, r, acks, nacks, job, 1, 1, NULL);
    if (rc == 1)
        hash_all(job, 1);
    pthread_mutex_lock(&feed->mu);
    s->fetch_sent = 0;
    if (rc == 1)
        hold(feed, job, 1);
    if (rc == 1 && atomic_load(&rt->quiet)) {
        feed_push(feed, job); /* given back by this thread's leave */
        rc = 0;
    }
    pthread_mutex_unlock(&feed->mu);
    return rc;
}

/* ---- Round trips read after the job ------------------------------------
 *
 * When jobs take long beside a round trip (I/O-bound jobs on a far Redis),
 * a thread that sweeps ahead or writes the acks waiting before its job
 * would spend a round trip idle each time. Instead it sends them on its
 * second connection, runs its job, and reads the replies after it, when
 * they have long arrived. So that a long job does not hold the jobs fetched
 * back from the others, a thread that would wait for jobs reads any such
 * round trip itself; the owner's second connection is not used meanwhile
 * (it runs a job on its first). */

/* Set when this thread would have deferred but had no second connection:
 * capstan__feed_next makes one, out of the feed's lock. */
static _Thread_local int want_aux;

/* Under feed->mu: whether s sends its round trips to read after its job. */
static int defers(capstan_slot_t *s, const capstan_feed_t *feed)
{
    if (feed->job_time <= DEFER_AFTER || s->pend)
        return 0;
    if (!s->aux || !capstan_redis_ok(s->aux)) {
        want_aux = 1;
        return 0;
    }
    return 1;
}

/* Under feed->mu, which it keeps: p (claimed by this thread and out of the
 * list) is read, its jobs go into the feed in their place and its acks are
 * settled; the lock is let go meanwhile. */
static void complete(capstan_feed_t *feed, pending_t *p)
{
    capstan_slot_t *o = p->owner;
    capstan_fetched_t *got = p->got;
    pthread_mutex_unlock(&feed->mu);
    int rc = p->x ? capstan__fetch_recv(o->fetch, o->aux, p->x, p->items, got) : CAPSTAN_EREDIS;
    if (rc > 0)
        hash_all(got, (size_t)rc);
    finish_acks(o, o->aux, p->acks, p->items, p->nacks, 1, NULL);
    free(p->acks);
    pthread_mutex_lock(&feed->mu);
    if (rc > 0)
        hold(feed, got, (size_t)rc);
    if (p->want) {
        feed->sweeping--;
        feed->asked -= p->want;
        note_sweep(feed, 0, p->want, rc);
        for (int i = 0; i < rc; i++)
            feed_push(feed, &got[i]);
    }
    o->pend = NULL;
    free(p->items);
    free(p->got);
    free(p);
    pthread_cond_broadcast(&feed->came);
}

/* Under feed->mu, which it releases: sends the acks waiting and, when want
 * is not 0, a sweep for want jobs on s's second connection, to be read
 * after s's job (or by a thread that waits first). */
static void defer(capstan_slot_t *s, size_t want)
{
    capstan_runtime_t *rt = s->rt;
    capstan_feed_t *feed = rt->feed;
    pending_t *p = calloc(1, sizeof(*p));
    if (!p) {
        pthread_mutex_unlock(&feed->mu);
        return; /* the acks wait; another round trip sweeps */
    }
    p->owner = s;
    p->want = want;
    p->sent = capstan__mono();
    p->claimed = 1;
    if ((feed->nacks && !(p->items = calloc(feed->nacks, sizeof(*p->items))))
        || (want && !(p->got = calloc(want, sizeof(*p->got))))) {
        free(p->items);
        free(p);
        pthread_mutex_unlock(&feed->mu);
        return; /* the acks wait for another round trip */
    }
    p->acks = take_acks(feed, &p->nacks);
    feed->sweeping += want > 0;
    feed->asked += want;
    s->pend = p;
    pthread_mutex_unlock(&feed->mu);

    p->nacks = drop_stale(feed, p->acks, p->nacks, s->aux);
    ack_items(p->acks, p->nacks, p->items);
    int rc;
    p->x = capstan__fetch_send(s->fetch, s->aux, p->items, p->nacks, want, &rc);
    pthread_mutex_lock(&feed->mu);
    if (!p->x) {
        complete(feed, p); /* nothing to read: acks back, the sweep undone */
    } else {
        p->claimed = 0;
        p->next = feed->pending;
        feed->pending = p;
    }
    pthread_mutex_unlock(&feed->mu);
}

/* Under feed->mu: takes p out of the list of those nobody reads. */
static void claim(capstan_feed_t *feed, pending_t *p)
{
    for (pending_t **pp = &feed->pending; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    p->claimed = 1;
}

/* Under feed->mu: reads the oldest deferred round trip nobody reads yet,
 * if any. Returns 1 when it did. */
static int read_one(capstan_feed_t *feed)
{
    pending_t *p = feed->pending;
    if (!p)
        return 0;
    while (p->next)
        p = p->next;
    claim(feed, p);
    complete(feed, p);
    return 1;
}

/* Under feed->mu: this thread's own deferred round trip is read (by it,
 * or by the thread that claimed it first) before it takes another job. */
static void settle_own(capstan_slot_t *s, capstan_feed_t *feed)
{
    while (s->pend) {
        if (!s->pend->claimed) {
            pending_t *p = s->pend;
            claim(feed, p);
            complete(feed, p);
        } else {
            feed_wait(feed);
        }
    }
}

void capstan__feed_read_deferred(capstan_runtime_t *rt)
{
    capstan_feed_t *feed = rt->feed;
    pthread_mutex_lock(&feed->mu);
    while (read_one(feed))
        ;
    pthread_mutex_unlock(&feed->mu);
}

/* Acks wait at most about this long (seconds) for a round trip to ride
 * while jobs are taken, unless jobs take long (see take_waiting). */
#define ACK_DELAY 0.002
/* Jobs that take this long (seconds) or more pay a round trip of their own
 * for the acks waiting when every other thread is busy. */
#define LONG_JOB 0.05

/* Under feed->mu, which it releases: takes the oldest job waiting. When the
 * feed is below half its level it fetches ahead before the job runs (the
 * others keep taking what is there meanwhile). Otherwise the acks waiting
 * go with it when the feed ran dry, too many wait, the oldest waited
 * ACK_DELAY, or this thread is the last one free and jobs take long: nobody
 * would send them before a job ends. Writing them costs this thread a round
 * trip, so not for every job. */
static int take_waiting(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job)
{
    capstan_runtime_t *rt = s->rt;
    capstan_feed_t *feed = rt->feed;
    size_t nacks = 0;
    *job = feed_pop(feed);
    wake_for_jobs(rt, feed);
    double now = capstan__mono();
    /* Below half its level (a sweep asks SWEEP_MAX at most, so the
     * shortfall alone would never say so of a level above twice that). */
    if (can_sweep(feed) && now >= feed->dry_until && (feed->n + feed->asked) * 2 < level(rt, feed)) {
        if (!defers(s, feed))
            return sweep(s, r, job, shortfall(rt, feed));
        defer(s, shortfall(rt, feed));
        return 1;
    }
    int last = atomic_load(&rt->busy) + 1 >= rt->nslots;
    int due = feed->nacks && (!feed->n || feed->nacks >= ACKS_MAX
                              || now - feed->acks_since >= ACK_DELAY
                              || (last && feed->job_time >= LONG_JOB));
    if (due && defers(s, feed)) {
        defer(s, 0);
        return 1;
    }
    capstan_done_t **acks = due ? take_acks(feed, &nacks) : NULL;
    pthread_mutex_unlock(&feed->mu);
    if (nacks)
        exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
    return 1;
}

/* A job waiting in the feed comes first. Otherwise this thread sweeps the
 * queues for itself and for the threads that will look next, unless
 * sweepers_max sweeps are on their way already: then it waits for them
 * (one waiter is woken per sweep that came back, and each that takes a job
 * wakes the next while jobs are left; so under load a few threads do the
 * round trips and the others are not woken for each job). When the queues
 * are empty every thread blocks on one of them. */

int capstan__feed_next(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *done, capstan_fetched_t *job,
                       int *inside)
{
    capstan_runtime_t *rt = s->rt;
    capstan_feed_t *feed = rt->feed;
    double now = capstan__mono();
    pthread_mutex_lock(&feed->mu);
    settle_own(s, feed);
    if (taken_at > 0) {
        feed->job_time = 0.9 * feed->job_time + 0.1 * (now - taken_at) / (double)taken_n;
        feed->taken += taken_n;
    }
    taken_at = 0;
    /* The last job's ack is left under the same lock as the next is taken:
     * the lock is what every job pays for, once. */
    if (done && (done = ack_later(feed, done, now))) {
        pthread_mutex_unlock(&feed->mu);
        ack_now(s, r, done);
        pthread_mutex_lock(&feed->mu);
    }
    gate_leave(feed, inside);
    if (want_aux && capstan_redis_ok(r) && !atomic_load(&rt->quiet)) {
        /* Out of the lock, the last job's ack already in the feed for any
         * round trip: one try; without it round trips are not deferred. */
        char err[CAPSTAN_ERRLEN];
        static _Thread_local int warned;
        want_aux = 0;
        pthread_mutex_unlock(&feed->mu);
        if (!s->aux)
            s->aux = capstan_redis_new(rt->cfg->redis_url, 15, err);
        if (s->aux && capstan_redis_connect(s->aux) && !warned++)
            capstan_warn("processor %d: a second connection failed (%s); its round trips are "
                         "not deferred", s->index, capstan_redis_error(s->aux));
        pthread_mutex_lock(&feed->mu);
    }
    if (atomic_load(&feed->prompt) && must_wait(feed)) {
        /* A runtime lock is not held while this thread waits. */
        size_t nacks;
        capstan_done_t **acks = take_acks(feed, &nacks);
        pthread_mutex_unlock(&feed->mu);
        exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
        pthread_mutex_lock(&feed->mu);
    }
    while (must_wait(feed) && !atomic_load(&rt->quiet))
        if (!read_one(feed))
            feed_wait(feed);
    if (atomic_load(&rt->quiet)) {
        pthread_mutex_unlock(&feed->mu);
        return 0;
    }
    *inside = 1;
    feed->inside++;
    size_t want = feed->n ? 0 : shortfall(rt, feed);
    int rc = feed->n ? take_waiting(s, r, job) : sweep(s, r, job, want ? want : 1);
    if (rc == 1) {
        taken_at = capstan__mono();
        taken_n = 1;
    }
    return rc;
}

void capstan__feed_leave(capstan_slot_t *s, capstan_redis_t *r, int *inside)
{
    capstan_feed_t *feed = s->rt->feed;
    pthread_mutex_lock(&feed->mu);
    gate_leave(feed, inside);
    settle_own(s, feed);
    /* The jobs of a sweep on its way are newer than those in the feed: they
     * go back first, so the feed waits for them (a round trip at most). So
     * it does for the jobs other processors took ahead: each puts back
     * those it will not start, their locks released, once its job is done
     * (capstan__feed_put_back). */
    while (feed->sweeping || atomic_load(&feed->runs))
        if (!read_one(feed))
            feed_wait(feed);
    pthread_mutex_unlock(&feed->mu);
    flush_acks(s, r);
    capstan__feed_give_back(s->rt, s->fetch, r, 1);
}
