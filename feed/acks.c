/* The feed's acks waiting: kept for the next round trip, written with it
 * and finished after it (see feed.h and feed_internal.h). */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

/* Under feed->mu: leaves d's ack waiting for the next round trip (now:
 * capstan__mono()). Returns NULL, or d when there was no memory to keep it (the
 * caller writes it). */
capstan_done_t *capstan__feed_ack_later(capstan_feed_t *feed, capstan_done_t *d, double now)
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
size_t capstan__feed_drop_stale(capstan_feed_t *feed, capstan_done_t **acks, size_t n, const capstan_redis_t *r)
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
            capstan__feed_let_go_one(feed, d->hash, d->job.len); /* a stray now: given back */
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

/* Writes d's ack at once and frees d. */
void capstan__feed_ack_now(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    if (!capstan__feed_drop_stale(s->feed, &d, 1, r))
        return; /* freed: it runs again */
    capstan_ack_item_t item = { .rc = capstan__fetch_ack(s->fetch, r, d->job.payload, d->job.len, &d->ack) };
    /* Written, or left in the working list for the stray check. */
    capstan__feed_finish_acks(s, r, &d, &item, 1, 0, NULL);
}

void capstan__feed_ack(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    capstan_feed_t *feed = s->feed;
    pthread_mutex_lock(&feed->mu);
    d = capstan__feed_ack_later(feed, d, capstan__mono());
    pthread_mutex_unlock(&feed->mu);
    if (d)
        capstan__feed_ack_now(s, r, d);
}

/* Under feed->mu: takes every waiting ack, to be written by the caller. */
capstan_done_t **capstan__feed_take_acks(capstan_feed_t *feed, size_t *n)
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
void capstan__feed_ack_items(capstan_done_t *const *acks, size_t nacks, capstan_ack_item_t *items)
{
    for (size_t i = 0; i < nacks; i++)
        items[i] = (capstan_ack_item_t){ .raw = acks[i]->job.payload, .len = acks[i]->job.len,
                                     .ack = acks[i]->ack, .rc = CAPSTAN_EREDIS };
}

/* The one step that finishes the acks a round trip carried (items their
 * results), called once per round trip on the stack that made it: fetching
 * job n+1 finishes job n's ack. Those written are let go, then each goes
 * through the runtime's acked callback (the lock metric and its Prometheus event,
 * the death hooks, the scheduler's wake) and is freed. Those not written
 * wait in the feed again for the next round trip when again is set;
 * otherwise they are let go too and freed (left in the working list for
 * the stray check). *unwritten (when not NULL) counts them. The array
 * acks is the caller's to free. */
void capstan__feed_finish_acks(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t **acks,
                               const capstan_ack_item_t *items, size_t nacks, int again, size_t *unwritten)
{
    size_t failed = 0;
    capstan_feed_t *feed = s->feed;
    pthread_mutex_lock(&feed->mu);
    for (size_t i = 0; i < nacks; i++)
        if (items[i].rc == 0 || !again)
            capstan__feed_let_go_one(feed, acks[i]->hash, acks[i]->job.len);
    pthread_mutex_unlock(&feed->mu);
    for (size_t i = 0; i < nacks; i++) {
        if (items[i].rc == 0) {
            s->feed->env.acked(s->feed->env.ctx, acks[i], r);
            capstan__done_release(acks[i]); /* cleared by acked */
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
static int exchange_calls(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t **acks, size_t nacks,
                          capstan_script_call_t *calls, size_t ncalls, capstan_fetched_t *got,
                          size_t max, int block, size_t *unwritten)
{
    nacks = capstan__feed_drop_stale(s->feed, acks, nacks, r);
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
    capstan__feed_ack_items(acks, nacks, items);
    for (size_t i = 0; i < ncalls; i++)
        calls[i].reply = NULL;
    int rc = capstan_redis_ok(r) ? capstan__fetch_exchange_calls(s->fetch, r, items, nacks, calls,
                                                                 ncalls, got, max, block)
                             : CAPSTAN_EREDIS;
    capstan__feed_finish_acks(s, r, acks, items, nacks, 1, unwritten);
    free(acks);
    if (items != few)
        free(items);
    return rc;
}

int capstan__feed_exchange(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t **acks, size_t nacks,
                           capstan_fetched_t *got, size_t max, int block, size_t *unwritten)
{
    return exchange_calls(s, r, acks, nacks, NULL, 0, got, max, block, unwritten);
}

int capstan__feed_ride(capstan_seat_t *s, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    capstan_feed_t *feed = s->feed;
    size_t nacks;
    pthread_mutex_lock(&feed->mu);
    /* This thread's own round trip on its second connection may carry the
     * release of a lock these calls ask for (its last job's): read first,
     * or Redis may serve this connection before that one. */
    capstan__feed_settle_own(s, feed);
    capstan_done_t **acks = capstan__feed_take_acks(feed, &nacks);
    pthread_mutex_unlock(&feed->mu);
    int rc = exchange_calls(s, r, acks, nacks, calls, ncalls, NULL, 0, 0, NULL);
    return rc < 0 ? rc : 0;
}

void capstan__feed_prompt(capstan_seat_t *s, capstan_redis_t *r, int all)
{
    capstan_feed_t *feed = s->feed;
    size_t nacks = 0;
    if (!all && !atomic_load(&feed->prompt))
        return;
    pthread_mutex_lock(&feed->mu);
    capstan_done_t **acks = all || atomic_load(&feed->prompt) ? capstan__feed_take_acks(feed, &nacks) : NULL;
    pthread_mutex_unlock(&feed->mu);
    if (nacks)
        capstan__feed_exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
}

/* Acks that have waited this long (seconds) are written by the
 * housekeeper: when every processor is in a long job or a long wait (a
 * lock, a limiter slot, a suspect running alone), none comes back to the
 * feed to send them, and a kill or a failover meanwhile would run their
 * jobs again. Under load acks never wait this long (see take_waiting). */
#define ACK_LATE 0.1

double capstan__feed_ack_late(capstan_seat_t *s, capstan_redis_t *r)
{
    capstan_feed_t *feed = s->feed;
    size_t nacks = 0;
    capstan_done_t **acks = NULL;
    pthread_mutex_lock(&feed->mu);
    double age = feed->nacks ? capstan__mono() - feed->acks_since : 0;
    if (age >= ACK_LATE && capstan_redis_ok(r))
        acks = capstan__feed_take_acks(feed, &nacks);
    pthread_mutex_unlock(&feed->mu);
    if (nacks) {
        capstan__feed_exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
        return ACK_LATE;
    }
    if (age >= ACK_LATE)
        return -1;
    return ACK_LATE - age;
}

/* Writes every waiting ack, reconnecting until they are written or the
 * process is about to exit (then their jobs stay in the working list and
 * are recovered once this process is gone). */
void capstan__feed_flush_acks(capstan_seat_t *s, capstan_redis_t *r)
{
    capstan_feed_t *feed = s->feed;
    for (;;) {
        size_t n;
        pthread_mutex_lock(&feed->mu);
        capstan_done_t **acks = capstan__feed_take_acks(feed, &n);
        pthread_mutex_unlock(&feed->mu);
        if (!n)
            return;
        size_t failed;
        capstan__feed_exchange(s, r, acks, n, NULL, 0, 0, &failed);
        /* Acks other threads queued meanwhile simply go in the next turn;
         * only a failure of these calls for a new connection. */
        if (failed && (feed->env.exiting(feed->env.ctx) || feed->env.connect(feed->env.ctx, r))) {
            pthread_mutex_lock(&feed->mu);
            acks = capstan__feed_take_acks(feed, &n);
            for (size_t i = 0; i < n; i++)
                capstan__feed_let_go_one(feed, acks[i]->hash, acks[i]->job.len);
            pthread_mutex_unlock(&feed->mu);
            for (size_t i = 0; i < n; i++)
                capstan__done_free(acks[i]);
            free(acks);
            return;
        }
    }
}
