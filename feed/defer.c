/* The feed's deferred round trips, read after the sender's job (see
 * feed.h and feed_internal.h). */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

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

/* Under feed->mu: whether s sends its round trips to read after its job. */
int capstan__feed_defers(capstan_seat_t *s, const capstan_feed_t *feed)
{
    if (feed->job_time <= DEFER_AFTER || s->pend)
        return 0;
    if (!s->aux || !capstan_redis_ok(s->aux)) {
        s->want_aux = 1; /* capstan__feed_next makes one, out of the lock */
        return 0;
    }
    return 1;
}

/* Under feed->mu, which it keeps: p (claimed by this thread and out of the
 * list) is read, its jobs go into the feed in their place and its acks are
 * settled; the lock is let go meanwhile. */
static void complete(capstan_feed_t *feed, pending_t *p)
{
    capstan_seat_t *o = p->owner;
    capstan_fetched_t *got = p->got;
    pthread_mutex_unlock(&feed->mu);
    int rc = p->x ? capstan__fetch_recv(o->fetch, o->aux, p->x, p->items, got) : CAPSTAN_EREDIS;
    if (rc > 0)
        capstan__feed_hash_all(got, (size_t)rc);
    capstan__feed_finish_acks(o, o->aux, p->acks, p->items, p->nacks, 1, NULL);
    free(p->acks);
    pthread_mutex_lock(&feed->mu);
    if (rc > 0)
        capstan__feed_hold(feed, got, (size_t)rc);
    if (p->want) {
        feed->sweeping--;
        feed->asked -= p->want;
        capstan__feed_note_sweep(feed, 0, p->want, rc);
        for (int i = 0; i < rc; i++)
            capstan__feed_push(feed, &got[i]);
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
void capstan__feed_defer(capstan_seat_t *s, size_t want)
{
    capstan_feed_t *feed = s->feed;
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
    p->acks = capstan__feed_take_acks(feed, &p->nacks);
    feed->sweeping += want > 0;
    feed->asked += want;
    s->pend = p;
    pthread_mutex_unlock(&feed->mu);

    p->nacks = capstan__feed_drop_stale(feed, p->acks, p->nacks, s->aux);
    capstan__feed_ack_items(p->acks, p->nacks, p->items);
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
int capstan__feed_read_one(capstan_feed_t *feed)
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
void capstan__feed_settle_own(capstan_seat_t *s, capstan_feed_t *feed)
{
    while (s->pend) {
        if (!s->pend->claimed) {
            pending_t *p = s->pend;
            claim(feed, p);
            complete(feed, p);
        } else {
            capstan__feed_wait(feed);
        }
    }
}

void capstan__feed_read_deferred(capstan_feed_t *feed)
{
    pthread_mutex_lock(&feed->mu);
    while (capstan__feed_read_one(feed))
        ;
    pthread_mutex_unlock(&feed->mu);
}
