/* The feed's taking of a job: its level, its sweeps, a processor's look
 * for a job and its leaving (see feed.h and feed_internal.h). */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

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
/* Jobs fetched beyond the free threads are out of sight of the queue's
 * size and latency as Sidekiq reads them (and of autoscalers built on
 * those): at most what the process takes in this long (seconds), however
 * long jobs run, unless two network round trips take longer. A deferred
 * round trip waits for its sender's job: the cap keeps that wait from
 * adding to what is fetched ahead, and the threads fetch a little more
 * often for themselves. */
#define AHEAD_MAX 0.02
static size_t level(const capstan_feed_t *feed)
{
    long idle = (long)feed->env.nslots - (long)feed->env.busy(feed->env.ctx);
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
static size_t shortfall(const capstan_feed_t *feed)
{
    size_t want = level(feed), have = feed->n + feed->asked;
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
static void wake_for_jobs(capstan_feed_t *feed)
{
    if (!feed->waiting || !feed->n)
        return;
    long running = (long)feed->env.nslots - (long)feed->waiting;
    double wait = (double)feed->n * feed->job_time / (double)(running < 1 ? 1 : running);
    if (wait > WAKE_AFTER)
        pthread_cond_signal(&feed->came);
}

/* How many times the average round trip one sweep's may count for. */
#define RTT_STEP 4.0

/* Under feed->mu: a sweep that asked for asked jobs came back with got (or
 * an error) after a round trip begun at began: the averages move. */
void capstan__feed_note_sweep(capstan_feed_t *feed, double began, size_t asked, int got)
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
static int sweep(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *job, size_t want)
{
    capstan_feed_t *feed = s->feed;
    int ahead = job->payload != NULL, first = ahead ? 0 : 1;
    /* On the heap, not the stack: each thread's stack keeps resident the
     * deepest it ever went. */
    capstan_fetched_t *got = calloc(want ? want : 1, sizeof(*got));
    if (!got) {
        pthread_mutex_unlock(&feed->mu);
        return ahead ? 1 : CAPSTAN_ENOMEM;
    }
    size_t nacks;
    capstan_done_t **acks = capstan__feed_take_acks(feed, &nacks);
    feed->sweeping++;
    feed->asked += want;
    double began = capstan__mono();
    s->fetch_sent = began;
    pthread_mutex_unlock(&feed->mu);

    int rc = capstan__feed_exchange(s, r, acks, nacks, got, want, 0, NULL);
    if (rc > 0)
        capstan__feed_hash_all(got, (size_t)rc);
    pthread_mutex_lock(&feed->mu);
    if (rc > 0)
        capstan__feed_hold(feed, got, (size_t)rc);
    s->fetch_sent = 0;
    feed->sweeping--;
    feed->asked -= want;
    capstan__feed_note_sweep(feed, began, want, rc);
    /* Even as the process goes quiet: the feed gives its jobs back in order
     * (capstan__feed_leave waits for the sweeps on their way), the job this
     * thread holds with them. */
    int quiet = capstan__feed_quiet(feed);
    for (int i = quiet ? 0 : first; i < rc; i++)
        capstan__feed_push(feed, &got[i]);
    if (quiet && ahead)
        capstan__feed_push(feed, job);
    acks = NULL;
    nacks = 0;
    if (rc == 0 && !ahead && !quiet) {
        pthread_cond_broadcast(&feed->came); /* all go and wait on the queues */
        acks = capstan__feed_take_acks(feed, &nacks);
    } else {
        wake_for_jobs(feed);
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
    rc = capstan__feed_exchange(s, r, acks, nacks, job, 1, 1, NULL);
    if (rc == 1)
        capstan__feed_hash_all(job, 1);
    pthread_mutex_lock(&feed->mu);
    s->fetch_sent = 0;
    if (rc == 1)
        capstan__feed_hold(feed, job, 1);
    if (rc == 1 && capstan__feed_quiet(feed)) {
        capstan__feed_push(feed, job); /* given back by this thread's leave */
        rc = 0;
    }
    pthread_mutex_unlock(&feed->mu);
    return rc;
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
static int take_waiting(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *job, double now,
                        int *trip)
{
    capstan_feed_t *feed = s->feed;
    size_t nacks = 0;
    *job = capstan__feed_pop(feed);
    wake_for_jobs(feed);
    /* Below half its level (a sweep asks SWEEP_MAX at most, so the
     * shortfall alone would never say so of a level above twice that). */
    if (can_sweep(feed) && now >= feed->dry_until && (feed->n + feed->asked) * 2 < level(feed)) {
        if (!capstan__feed_defers(s, feed)) {
            *trip = 1;
            return sweep(s, r, job, shortfall(feed));
        }
        capstan__feed_defer(s, shortfall(feed));
        return 1;
    }
    int last = feed->env.busy(feed->env.ctx) + 1 >= feed->env.nslots;
    int due = feed->nacks && (!feed->n || feed->nacks >= ACKS_MAX
                              || now - feed->acks_since >= ACK_DELAY
                              || (last && feed->job_time >= LONG_JOB));
    if (due && capstan__feed_defers(s, feed)) {
        capstan__feed_defer(s, 0);
        return 1;
    }
    capstan_done_t **acks = due ? capstan__feed_take_acks(feed, &nacks) : NULL;
    pthread_mutex_unlock(&feed->mu);
    if (nacks) {
        *trip = 1;
        capstan__feed_exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
    }
    return 1;
}

/* A job waiting in the feed comes first. Otherwise this thread sweeps the
 * queues for itself and for the threads that will look next, unless
 * sweepers_max sweeps are on their way already: then it waits for them
 * (one waiter is woken per sweep that came back, and each that takes a job
 * wakes the next while jobs are left; so under load a few threads do the
 * round trips and the others are not woken for each job). When the queues
 * are empty every thread blocks on one of them. */

int capstan__feed_next(capstan_seat_t *s, capstan_redis_t *r, capstan_done_t *done, capstan_fetched_t *job,
                       int *inside)
{
    capstan_feed_t *feed = s->feed;
    double now = capstan__mono();
    pthread_mutex_lock(&feed->mu);
    /* now stays the time while feed->mu is held and no round trip is read. */
    int fresh = !s->pend;
    capstan__feed_settle_own(s, feed);
    if (s->taken_at > 0) {
        feed->job_time = 0.9 * feed->job_time + 0.1 * (now - s->taken_at) / (double)s->taken_n;
        feed->taken += s->taken_n;
    }
    s->taken_at = 0;
    /* The last job's ack is left under the same lock as the next is taken:
     * the lock is what every job pays for, once. */
    if (done && (done = capstan__feed_ack_later(feed, done, now))) {
        pthread_mutex_unlock(&feed->mu);
        capstan__feed_ack_now(s, r, done);
        pthread_mutex_lock(&feed->mu);
        fresh = 0;
    }
    capstan__feed_gate_leave(feed, inside);
    if (s->want_aux && capstan_redis_ok(r) && !capstan__feed_quiet(feed)) {
        /* Out of the lock, the last job's ack already in the feed for any
         * round trip: one try; without it round trips are not deferred. */
        char err[CAPSTAN_ERRLEN];
        s->want_aux = 0;
        pthread_mutex_unlock(&feed->mu);
        if (!s->aux)
            s->aux = capstan_redis_new(feed->env.redis_url, 15, err);
        if (s->aux && capstan_redis_connect(s->aux) && !s->warned++)
            capstan_warn("processor %d: a second connection failed (%s); its round trips are "
                         "not deferred", s->index, capstan_redis_error(s->aux));
        pthread_mutex_lock(&feed->mu);
        fresh = 0;
    }
    if (atomic_load(&feed->prompt) && must_wait(feed)) {
        /* A runtime lock is not held while this thread waits. */
        size_t nacks;
        capstan_done_t **acks = capstan__feed_take_acks(feed, &nacks);
        pthread_mutex_unlock(&feed->mu);
        capstan__feed_exchange(s, r, acks, nacks, NULL, 0, 0, NULL);
        pthread_mutex_lock(&feed->mu);
        fresh = 0;
    }
    while (must_wait(feed) && !capstan__feed_quiet(feed)) {
        if (!capstan__feed_read_one(feed))
            capstan__feed_wait(feed);
        fresh = 0;
    }
    if (capstan__feed_quiet(feed)) {
        pthread_mutex_unlock(&feed->mu);
        return 0;
    }
    *inside = 1;
    feed->inside++;
    size_t want = feed->n ? 0 : shortfall(feed);
    if (feed->n && !fresh)
        now = capstan__mono();
    /* A job taken without a round trip is taken at now. */
    int trip = !feed->n;
    int rc = feed->n ? take_waiting(s, r, job, now, &trip) : sweep(s, r, job, want ? want : 1);
    if (rc == 1) {
        s->taken_at = trip ? capstan__mono() : now;
        s->taken_n = 1;
    }
    return rc;
}

void capstan__feed_leave(capstan_seat_t *s, capstan_redis_t *r, int *inside)
{
    capstan_feed_t *feed = s->feed;
    pthread_mutex_lock(&feed->mu);
    capstan__feed_gate_leave(feed, inside);
    capstan__feed_settle_own(s, feed);
    /* The jobs of a sweep on its way are newer than those in the feed: they
     * go back first, so the feed waits for them (a round trip at most). So
     * it does for the jobs other processors took ahead: each puts back
     * those it will not start, their locks released, once its job is done
     * (capstan__feed_put_back). */
    while (feed->sweeping || atomic_load(&feed->runs))
        if (!capstan__feed_read_one(feed))
            capstan__feed_wait(feed);
    pthread_mutex_unlock(&feed->mu);
    capstan__feed_flush_acks(s, r);
    capstan__feed_give_back(feed, s->fetch, r, 1);
    capstan_redis_free(s->aux);
    s->aux = NULL;
}
