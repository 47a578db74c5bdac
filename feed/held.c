/* The feed's count of the jobs this process holds, for the stray check
 * (see feed.h and feed_internal.h). */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

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
void capstan__feed_hold(capstan_feed_t *feed, const capstan_fetched_t *got, size_t n)
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
void capstan__feed_let_go_one(capstan_feed_t *feed, unsigned long long hash, size_t len)
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

void capstan__feed_let_go(capstan_feed_t *feed, unsigned long long hash, size_t len)
{
    pthread_mutex_lock(&feed->mu);
    capstan__feed_let_go_one(feed, hash, len);
    pthread_mutex_unlock(&feed->mu);
}

/* Under feed->mu: whether a fetch sent at or before t (capstan__mono()), or
 * any when t is negative, has a reply no thread has read yet. */
static int unread_since(const capstan_feed_t *feed, double t)
{
    for (int i = 0; i < feed->env.nslots; i++) {
        const capstan_seat_t *s = &feed->seats[i];
        double a = s->fetch_sent, b = s->pend && s->pend->want ? s->pend->sent : 0;
        if ((a > 0 && (t < 0 || a <= t)) || (b > 0 && (t < 0 || b <= t)))
            return 1;
    }
    return 0;
}

/* The hashes of jobs[0..n), computed out of the feed's lock. */
void capstan__feed_hash_all(capstan_fetched_t *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        jobs[i].hash = capstan__feed_hash(jobs[i].payload, jobs[i].len);
}

int capstan__feed_holds(capstan_feed_t *feed, const char *payload, size_t len, double since)
{
    unsigned long long hash = capstan__feed_hash(payload, len);
    pthread_mutex_lock(&feed->mu);
    int held = feed->held_lost
               || (feed->held_cap && feed->held[held_place(feed, hash, len)].count);
    /* Since the job was first seen, this process gave jobs back and a fetch
     * is on its way: the same payload may have gone back to its queue and
     * be fetched again. It counts as held, and is seen anew next pass. */
    held = held || (since >= 0 && feed->gave_back_at >= since && unread_since(feed, -1));
    /* A fetch sent before the list was read may have moved it, its reply
     * not read yet: not known until that reply is read. */
    if (!held && since >= 0 && unread_since(feed, since))
        held = 2;
    pthread_mutex_unlock(&feed->mu);
    return held;
}
