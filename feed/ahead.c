/* The feed's runs: short jobs with runtime locks taken ahead by one
 * processor, and put back (see feed.h and feed_internal.h). */
#include "feed/feed_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "unique/prelock.h"
#include "unique/server.h"

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
     * one length), rather than a search a type; the key by its 'k', which a
     * usual payload's keys and values lack. */
    while ((p = capstan__feed_find(p, (size_t)(end - p), key, k, 4)) && (size_t)(end - p) >= k + t) {
        p += k;
        if (!memcmp(p, "while_executing", t) || !memcmp(p, "until_and_while", t))
            return 1;
    }
    return 0;
}

size_t capstan__feed_take_ahead(capstan_seat_t *s, double run_time, const capstan_fetched_t *first,
                                capstan_fetched_t *out, size_t max)
{
    capstan_feed_t *feed = s->feed;
    size_t n = 0;
    if (run_time >= RUN_JOB_TIME || !runtime_locked(first))
        return 0;
    double fit = RUN_SPAN / (run_time > 1e-6 ? run_time : 1e-6);
    if ((double)max > fit)
        max = (size_t)fit;
    pthread_mutex_lock(&feed->mu);
    pthread_mutex_lock(s->mu);
    if (max > CAPSTAN_RUN_MAX - 1 - s->nahead)
        max = CAPSTAN_RUN_MAX - 1 - s->nahead;
    /* A thread waiting for a job gets one first. */
    while (n < max && feed->n > feed->waiting && !feed->solo && !capstan__feed_quiet(feed)) {
        const capstan_fetched_t *head = &feed->jobs[feed->head];
        if (!runtime_locked(head) || capstan__feed_suspect(head))
            break;
        out[n] = capstan__feed_pop(feed);
        s->ahead[s->nahead++] = (struct capstan_ahead){ .payload = out[n].payload, .len = out[n].len,
                                                    .queue = out[n].queue, .seq = out[n].seq };
        n++;
    }
    if (n && !s->in_run) {
        s->in_run = 1;
        atomic_fetch_add(&feed->runs, 1);
    }
    pthread_mutex_unlock(s->mu);
    s->taken_n += n;
    pthread_mutex_unlock(&feed->mu);
    return n;
}

/* Under *s->mu: removes the view of payload from s->ahead. Returns 0 when
 * it was there, 1 when a give-back took it. */
static int ahead_remove(capstan_seat_t *s, const char *payload)
{
    for (size_t i = 0; i < s->nahead; i++)
        if (s->ahead[i].payload == payload) {
            memmove(&s->ahead[i], &s->ahead[i + 1], (s->nahead - i - 1) * sizeof(s->ahead[0]));
            s->nahead--;
            return 0;
        }
    return 1;
}

int capstan__feed_ahead_start(capstan_seat_t *s, const char *payload)
{
    return ahead_remove(s, payload);
}

void capstan__feed_ahead_locks(capstan_seat_t *s, const capstan_fetched_t *got, capstan_prelock_t *pre, size_t n)
{
    pthread_mutex_lock(s->mu);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < s->nahead; k++)
            if (s->ahead[k].payload == got[i].payload)
                s->ahead[k].pre = &pre[i];
    pthread_mutex_unlock(s->mu);
}

void capstan__feed_put_back(capstan_seat_t *s, capstan_redis_t *r, capstan_fetched_t *jobs, capstan_prelock_t *pre,
                            size_t n)
{
    capstan_feed_t *feed = s->feed;
    char mine[n ? n : 1];
    pthread_mutex_lock(&feed->mu);
    pthread_mutex_lock(s->mu);
    for (size_t i = 0; i < n; i++)
        mine[i] = ahead_remove(s, jobs[i].payload) == 0;
    pthread_mutex_unlock(s->mu);
    pthread_mutex_unlock(&feed->mu);
    /* Their locks go before they can be given back and fetched again. */
    for (size_t i = 0; pre && i < n; i++)
        if (mine[i])
            capstan__unique_prelock_drop(r, &pre[i]);
    pthread_mutex_lock(&feed->mu);
    for (size_t i = 0; i < n; i++) {
        if (mine[i])
            capstan__feed_push(feed, &jobs[i]); /* in its place again, by its seq */
        else
            capstan__fetched_clear(&jobs[i]); /* the give-back took a copy */
    }
    s->taken_n = s->taken_n > n ? s->taken_n - n : 1;
    pthread_mutex_unlock(&feed->mu);
}

void capstan__feed_run_end(capstan_seat_t *s)
{
    if (s->in_run) {
        s->in_run = 0;
        atomic_fetch_sub(&s->feed->runs, 1);
    }
}

/* Under feed->mu, at a hard stop: copies every job the processors took
 * ahead and asked the lock of into the feed, to be given back with it in
 * order, and takes those locks over into *held (to be released before the
 * jobs go back): the processors start none of them. A job whose lock is
 * still being asked for, or that cannot be copied, stays in the working
 * list, recovered once this process is gone. Returns how many locks. */
size_t capstan__feed_take_back_ahead(capstan_feed_t *feed, capstan_prelock_t ***held)
{
    size_t nheld = 0, cap = (size_t)feed->env.nslots * (CAPSTAN_RUN_MAX - 1);
    *held = calloc(cap, sizeof(**held));
    for (int i = 0; *held && i < feed->env.nslots; i++) {
        capstan_seat_t *s = &feed->seats[i];
        if (!s->mu)
            continue; /* no processor sits there */
        pthread_mutex_lock(s->mu);
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
            capstan__feed_push(feed, &j);
            ahead_remove(s, a->payload);
        }
        pthread_mutex_unlock(s->mu);
    }
    return nheld;
}
