/* The feed's gate: a suspect runs alone, or in the quarantine (see feed.h
 * and feed_internal.h). */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

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
 * job and a counter kept under the lock capstan__feed_next takes anyway.
 *
 * Alone costs the process its other threads while the suspect runs (a
 * suspect of 40 s idles them for 40 s), and first the wait for their jobs
 * to end. So under a supervisor, a worker does not run a suspect of a
 * class it has a handler for: it moves it to the quarantine, a queue only
 * the supervisor's quarantine worker reads, with one thread; that worker
 * runs each alone as above, reliably (its own working list), and a crash
 * there is recovered as any worker's, so the count of recoveries and the
 * poison-pill rule are the same. A crash's neighbours then wait only for
 * the suspects before them in the quarantine; the other jobs run on the
 * other workers at full concurrency. */

/* Under feed->mu: this thread looks for a job again, so it holds none. */
void capstan__feed_gate_leave(capstan_feed_t *feed, int *inside)
{
    if (!*inside)
        return;
    *inside = 0;
    feed->inside--;
    if (feed->solo)
        pthread_cond_broadcast(&feed->came); /* the suspect waits for this */
}

const char *capstan__feed_find(const char *s, size_t len, const char *key, size_t klen, size_t rare)
{
    if (len < klen)
        return NULL;
    const char *end = s + len, *p = s + rare;
    while (p < end && (p = memchr(p, key[rare], (size_t)(end - p)))) {
        const char *at = p - rare;
        if (at + klen <= end && !memcmp(at, key, klen))
            return at;
        p++;
    }
    return NULL;
}

int capstan__feed_suspect(const capstan_fetched_t *job)
{
    /* A plain search: a nested field of that name only costs a solo run.
     * By its 'v', which a usual payload's keys and values lack. */
    static const char key[] = "\"recovery_count\"";
    return capstan__feed_find(job->payload, job->len, key, sizeof(key) - 1, 5) != NULL;
}

/* Waits until no other thread holds a job (the acks that wait meanwhile
 * are the housekeeper's to write: see capstan__feed_ack_late), writes the
 * acks waiting then and gives back the jobs waiting in the feed. The
 * suspect goes back to its queue instead when another suspect runs (this
 * one runs after it) or the process goes quiet. */
int capstan__feed_solo_begin(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *job)
{
    capstan_feed_t *feed = s->feed;
    pthread_mutex_lock(&feed->mu);
    int mine = !feed->solo;
    if (mine) {
        feed->solo = 1;
        while (feed->inside > 1 && !capstan__feed_quiet(feed))
            capstan__feed_wait(feed);
    }
    pthread_mutex_unlock(&feed->mu);
    int quiet = capstan__feed_quiet(feed);
    if (mine && !quiet) {
        capstan__feed_flush_acks(s, r);
        capstan__feed_give_back(feed, s->fetch, r, 1);
    }
    if (mine && quiet) {
        pthread_mutex_lock(&feed->mu);
        feed->solo = 0;
        pthread_mutex_unlock(&feed->mu);
    }
    if (mine && !quiet)
        return 1;
    capstan__feed_give_back_run(s->fetch, feed, r, job, 1, feed->env.connect, feed->env.ctx);
    return 0;
}

void capstan__feed_quarantine(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *job,
                              const char *quarantine)
{
    /* As a give-back of a job not started, to the quarantine's head: the
     * job was never this process's to start, and a crash before the move
     * leaves it in the working list with its count unchanged. */
    job->queue = quarantine;
    capstan__feed_give_back_run(s->fetch, s->feed, r, job, 1, s->feed->env.connect, s->feed->env.ctx);
}

/* The suspect is done: its ack is written before any other job is
 * fetched, then the gate opens. */
void capstan__feed_solo_end(capstan_seat_t *s, capstan_redis_t *r)
{
    capstan_feed_t *feed = s->feed;
    capstan__feed_flush_acks(s, r);
    pthread_mutex_lock(&feed->mu);
    feed->solo = 0;
    pthread_cond_broadcast(&feed->came);
    pthread_mutex_unlock(&feed->mu);
}
