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
 * working list meanwhile, so a crash loses none of them.
 *
 * This file makes and frees the feed, and holds its finished jobs and its
 * ring of fetched jobs; feed_internal.h lists the others, one a mechanism. */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

int capstan__feed_default_prefetch(int nslots)
{
    return nslots * 10 < 500 ? 500 : nslots * 10;
}

capstan_feed_t *capstan__feed_new(const capstan_feed_env_t *env)
{
    int nslots = env->nslots, prefetch = env->prefetch;
    capstan_feed_t *feed = calloc(1, sizeof(*feed));
    if (!feed)
        return NULL;
    feed->env = *env;
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
    feed->seats = calloc((size_t)nslots + 1, sizeof(capstan_seat_t));
    if (!feed->jobs || !feed->seats) {
        free(feed->jobs);
        free(feed->seats);
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

capstan_seat_t *capstan__feed_seat(capstan_feed_t *feed, int i, capstan_fetch_t *f, pthread_mutex_t *mu)
{
    capstan_seat_t *s = &feed->seats[i];
    s->feed = feed;
    s->index = i;
    s->fetch = f;
    s->mu = mu;
    return s;
}

void capstan__feed_free(capstan_feed_t *feed)
{
    if (!feed)
        return;
    free(feed->seats);
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

/* ---- Finished jobs ---------------------------------------------------- */

void capstan__done_clear(capstan_done_t *d)
{
    capstan__outcome_clear(&d->out);
    capstan__job_clear(&d->job);
    d->active = 0;
}

/* Any thread puts a record back on back; the owner takes the whole list
 * at once into mine when that is empty (one taker, and nothing popped
 * singly from the shared list, so no record is seen twice), and keeps
 * POOL_KEEP of them: about what a processor has finished and not acked
 * at once. The rest it frees, so that a burst does not hold memory. */
enum { POOL_KEEP = 16 };

struct capstan_done_pool {
    _Atomic(capstan_done_t *) back;
    capstan_done_t *mine;
};

capstan_done_pool_t *capstan__done_pool_new(void)
{
    return calloc(1, sizeof(capstan_done_pool_t));
}

static void free_list(capstan_done_t *d)
{
    while (d) {
        capstan_done_t *next = d->next;
        free(d);
        d = next;
    }
}

void capstan__done_pool_free(capstan_done_pool_t *pool)
{
    if (!pool)
        return;
    free_list(pool->mine);
    free_list(atomic_load(&pool->back));
    free(pool);
}

capstan_done_t *capstan__done_new(capstan_done_pool_t *pool)
{
    /* A copy of a zeroed one, not calloc: glibc's calloc skips the
     * per-thread cache (and a memset after malloc becomes calloc). */
    static const capstan_done_t zero;
    capstan_done_t *d = pool ? pool->mine : NULL;
    if (!d && pool && atomic_load_explicit(&pool->back, memory_order_relaxed)) {
        d = atomic_exchange_explicit(&pool->back, NULL, memory_order_acquire);
        capstan_done_t *last = d;
        for (int n = 1; last && last->next && n < POOL_KEEP; n++)
            last = last->next;
        if (last) {
            free_list(last->next);
            last->next = NULL;
        }
    }
    if (d)
        pool->mine = d->next;
    else if (!(d = malloc(sizeof(*d))))
        return NULL;
    *d = zero;
    d->pool = pool;
    return d;
}

void capstan__done_release(capstan_done_t *d)
{
    capstan_done_pool_t *pool = d->pool;
    if (!pool) {
        free(d);
        return;
    }
    capstan_done_t *head = atomic_load_explicit(&pool->back, memory_order_relaxed);
    do
        d->next = head;
    while (!atomic_compare_exchange_weak_explicit(&pool->back, &head, d, memory_order_release,
                                                  memory_order_relaxed));
}

void capstan__done_free(capstan_done_t *d)
{
    if (!d)
        return;
    capstan__done_clear(d);
    capstan__done_release(d);
}

/* ---- The ring of fetched jobs and the acks waiting -------------------- */

/* Under feed->mu: puts job in the ring in the order Redis fetched it
 * (capstan_fetched_t.seq): usually at the end, but sweeps on their way at once
 * may come back in another order than Redis ran them, and the job a thread
 * holds as its sweep comes back to a quiet process goes back in its place.
 * So the feed gives its jobs back in order. The ring has room for every
 * sweep in flight and a job put back by each thread. */
void capstan__feed_push(capstan_feed_t *feed, capstan_fetched_t *job)
{
    size_t i = feed->n;
    for (; i > 0 && feed->jobs[(feed->head + i - 1) % feed->cap].seq > job->seq; i--)
        feed->jobs[(feed->head + i) % feed->cap] = feed->jobs[(feed->head + i - 1) % feed->cap];
    feed->jobs[(feed->head + i) % feed->cap] = *job;
    feed->n++;
    memset(job, 0, sizeof(*job));
}

/* Under feed->mu: the oldest job waiting (there is one). */
capstan_fetched_t capstan__feed_pop(capstan_feed_t *feed)
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
capstan_fetched_t capstan__feed_pop_newest(capstan_feed_t *feed)
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
void capstan__feed_wait(capstan_feed_t *feed)
{
    struct timespec until = capstan__timespec(capstan__now() + WAIT_MAX);
    feed->waiting++;
    pthread_cond_timedwait(&feed->came, &feed->mu, &until);
    feed->waiting--;
}
