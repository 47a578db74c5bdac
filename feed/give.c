/* The feed's give-back: fetched jobs that did not start go back to their
 * queues (see feed.h and feed_internal.h). */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

/* ---- Giving jobs back ------------------------------------------------- */

/* Jobs given back in one call at most. */
enum { GIVE_BACK_MAX = 100 };

/* Gives n (at most GIVE_BACK_MAX) fetched jobs of one queue back in one
 * call, newest first, and frees them. feed: the feed that counted them, or
 * NULL (a job of the basic source). connect(ctx, r) mends a broken
 * connection for another try (capstan_feed_env_t's); NULL: one try. */
void capstan__feed_give_back_run(capstan_fetch_t *f, capstan_feed_t *feed, capstan_redis_t *r, capstan_fetched_t *jobs,
                                 size_t n, int (*connect)(void *ctx, capstan_redis_t *r), void *ctx)
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
            capstan__feed_let_go_one(feed, jobs[i].hash, jobs[i].len);
        feed->gave_back_at = capstan__mono();
        pthread_mutex_unlock(&feed->mu);
    }
    const char *queue = jobs[0].queue;
    int back = capstan__fetch_requeue_n(f, r, queue, raws, lens, n);
    /* Only a broken connection is worth another try: an error reply (the
     * queue key holds another type than a list) would only come again. */
    while (back == CAPSTAN_EREDIS && !capstan_redis_ok(r) && connect && connect(ctx, r) == 0)
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

void capstan__give_back(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *job,
                        int (*connect)(void *ctx, capstan_redis_t *r), void *ctx)
{
    capstan__feed_give_back_run(f, NULL, r, job, 1, connect, ctx);
}

/* Newest first, so that each queue's oldest ends up fetched first again;
 * a run of jobs of one queue goes back in one call. */
int capstan__feed_give_back(capstan_feed_t *feed, capstan_fetch_t *f, capstan_redis_t *r, int connect)
{
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
    size_t nheld = capstan__feed_take_back_ahead(feed, &held);
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
            jobs[n] = capstan__feed_pop_newest(feed);
            n++;
        }
        pthread_mutex_unlock(&feed->mu);
        if (!n)
            break;
        for (size_t i = 0, j; i < n; i = j) {
            for (j = i + 1; j < n && strcmp(jobs[j].queue, jobs[i].queue) == 0; j++)
                ;
            capstan__feed_give_back_run(f, feed, r, jobs + i, j - i, connect ? feed->env.connect : NULL,
                                        feed->env.ctx);
        }
        total += (int)n;
    }
    pthread_mutex_unlock(&feed->give_mu);
    return total;
}
