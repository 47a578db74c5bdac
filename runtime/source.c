/* The two job sources of source.h: the reliable one is the feed's
 * operations (feed/); the basic one fetches one job per processor with
 * fetch/'s basic fetch and writes its ack as the job ends. */
#include "runtime/source.h"

#include <math.h>

#include "runtime/slot.h"
#include "unique/server.h"

/* What the runtime gives the feed (capstan_feed_env_t), ctx the runtime. */
static int busy(void *ctx)
{
    return atomic_load(&((capstan_runtime_t *)ctx)->busy);
}

static int quiet(void *ctx)
{
    return atomic_load(&((capstan_runtime_t *)ctx)->quiet);
}

static int exiting(void *ctx)
{
    return atomic_load(&((capstan_runtime_t *)ctx)->housekeeper_stop);
}

static int reconnect(void *ctx, capstan_redis_t *r)
{
    capstan_runtime_t *rt = ctx;
    return capstan__rt_connect(rt, r, &rt->housekeeper_stop);
}

/* d's ack was written: notes the lock it released, runs the death hooks
 * when it wrote the job to the dead set, then clears d. */
static void acked(void *ctx, capstan_done_t *d, capstan_redis_t *r)
{
    capstan_runtime_t *rt = ctx;
    if (d->ack.lock_key)
        capstan__unique_note_released(&d->out, r);
    /* After the ack: the job is in the dead set when the hook runs. */
    if (d->ack.kind == CAPSTAN_ACK_DEAD)
        capstan__hooks_death(rt, &d->job, d->job.err_class, d->job.err_msg);
    /* After the ack too: the job is in the schedule set when it wakes. */
    if (d->ack.kind == CAPSTAN_ACK_SCHEDULE)
        capstan__scheduler_wake_at(rt, d->ack.score);
    capstan__done_clear(d);
}

capstan_feed_t *capstan__source_feed_new(capstan_runtime_t *rt)
{
    capstan_feed_env_t env = { .ctx = rt, .nslots = rt->cfg->concurrency, .prefetch = rt->cfg->prefetch,
                               .redis_url = rt->cfg->redis_url, .busy = busy, .quiet = quiet,
                               .exiting = exiting, .connect = reconnect, .acked = acked };
    return capstan__feed_new(&env);
}

/* The reliable source: the feed's operations on the slot's seat. */
static int feed_take(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *done, capstan_fetched_t *job,
                     int *inside)
{
    return capstan__feed_next(s->seat, r, done, job, inside);
}

static void settle_later(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    (void)s, (void)r, (void)d; /* the ack goes out with a later round trip */
}

static void feed_ack(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    capstan__feed_ack(s->seat, r, d);
}

static void feed_leave(capstan_slot_t *s, capstan_redis_t *r, int *inside)
{
    capstan__feed_leave(s->seat, r, inside);
}

static void feed_let_go(capstan_runtime_t *rt, unsigned long long hash, size_t len)
{
    capstan__feed_let_go(rt->feed, hash, len);
}

static size_t feed_take_ahead(capstan_slot_t *s, const capstan_fetched_t *first, capstan_fetched_t *out,
                              size_t max)
{
    return capstan__feed_take_ahead(s->seat, s->run_time, first, out, max);
}

static int feed_solo_begin(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job)
{
    return capstan__feed_solo_begin(s->seat, r, job);
}

static void feed_solo_end(capstan_slot_t *s, capstan_redis_t *r)
{
    capstan__feed_solo_end(s->seat, r);
}

static int feed_ride(capstan_slot_t *s, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    return capstan__feed_ride(s->seat, r, calls, ncalls);
}

static void feed_prompt(capstan_slot_t *s, capstan_redis_t *r, int all)
{
    capstan__feed_prompt(s->seat, r, all);
}

static double feed_ack_late(capstan_slot_t *s, capstan_redis_t *r)
{
    return capstan__feed_ack_late(s->seat, r);
}

static void feed_bind(capstan_runtime_t *rt, capstan_slot_t *s, int i)
{
    s->seat = capstan__feed_seat(rt->feed, i, s->fetch, &s->mu);
}

static void feed_read_deferred(capstan_runtime_t *rt)
{
    capstan__feed_read_deferred(rt->feed);
}

static int feed_give_back(capstan_runtime_t *rt, capstan_redis_t *r)
{
    return rt->nslots ? capstan__feed_give_back(rt->feed, rt->slots[0].fetch, r, 0) : 0;
}

static void feed_count(capstan_runtime_t *rt, const char *const *names, long long *counts, size_t n)
{
    capstan__feed_count(rt->feed, names, counts, n);
}

const capstan_source_t capstan__source_reliable = {
    .name = "reliable",
    .working_list = 1,
    .prefetches = 1,
    .fetch = &capstan__fetch_reliable,
    .bind = feed_bind,
    .take = feed_take,
    .settle = settle_later,
    .ack = feed_ack,
    .leave = feed_leave,
    .let_go = feed_let_go,
    .take_ahead = feed_take_ahead,
    .suspect = capstan__feed_suspect,
    .solo_begin = feed_solo_begin,
    .solo_end = feed_solo_end,
    .ride = feed_ride,
    .prompt = feed_prompt,
    .ack_late = feed_ack_late,
    .read_deferred = feed_read_deferred,
    .give_back = feed_give_back,
    .count = feed_count,
};

/* With no working list to guard the ack against the shutdown's requeue,
 * the slot lock does: the ack is written while the slot is busy. */
static void settle_now(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    if (capstan__slot_ack(s, r, d->job.payload, d->job.len, &d->ack) == 0)
        acked(s->rt, d, r);
    else
        capstan__done_clear(d);
}

static void ack_now(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *d)
{
    settle_now(s, r, d);
    capstan__done_free(d);
}

/* The fetch may have blocked while the process went quiet: a job that
 * came meanwhile goes back rather than start. */
static int take_one(capstan_slot_t *s, capstan_redis_t *r, capstan_done_t *done, capstan_fetched_t *job,
                    int *inside)
{
    (void)inside;
    if (done)
        ack_now(s, r, done);
    int rc = capstan__fetch_next(s->fetch, r, job);
    if (rc > 0 && atomic_load(&s->rt->quiet)) {
        capstan__give_back(s->fetch, r, job, reconnect, s->rt);
        return 0;
    }
    return rc;
}

static void leave_nothing(capstan_slot_t *s, capstan_redis_t *r, int *inside)
{
    (void)s, (void)r, (void)inside;
}

static void let_go_nothing(capstan_runtime_t *rt, unsigned long long hash, size_t len)
{
    (void)rt, (void)hash, (void)len;
}

static size_t take_none_ahead(capstan_slot_t *s, const capstan_fetched_t *first, capstan_fetched_t *out,
                              size_t max)
{
    (void)s, (void)first, (void)out, (void)max;
    return 0;
}

/* Only a working list's jobs are recovered, so only they are suspects. */
static int no_suspect(const capstan_fetched_t *job)
{
    (void)job;
    return 0;
}

static int solo_always(capstan_slot_t *s, capstan_redis_t *r, capstan_fetched_t *job)
{
    (void)s, (void)r, (void)job;
    return 1;
}

static void solo_end_nothing(capstan_slot_t *s, capstan_redis_t *r)
{
    (void)s, (void)r;
}

static double never_late(capstan_slot_t *s, capstan_redis_t *r)
{
    (void)s, (void)r;
    return HUGE_VAL;
}

static void read_nothing(capstan_runtime_t *rt)
{
    (void)rt;
}

static int give_back_nothing(capstan_runtime_t *rt, capstan_redis_t *r)
{
    (void)rt, (void)r;
    return 0;
}

static void count_nothing(capstan_runtime_t *rt, const char *const *names, long long *counts, size_t n)
{
    (void)rt, (void)names, (void)counts, (void)n;
}

static void bind_nothing(capstan_runtime_t *rt, capstan_slot_t *s, int i)
{
    (void)rt;
    (void)s;
    (void)i;
}

const capstan_source_t capstan__source_basic = {
    .name = "basic",
    .fetch = &capstan__fetch_basic,
    .bind = bind_nothing,
    .take = take_one,
    .settle = settle_now,
    .ack = ack_now,
    .leave = leave_nothing,
    .let_go = let_go_nothing,
    .take_ahead = take_none_ahead,
    .suspect = no_suspect,
    .solo_begin = solo_always,
    .solo_end = solo_end_nothing,
    .ack_late = never_late,
    .read_deferred = read_nothing,
    .give_back = give_back_nothing,
    .count = count_nothing,
};

const capstan_source_t *capstan__source_for(const capstan_config_t *c)
{
    return c->fetch == CAPSTAN_FETCH_BASIC ? &capstan__source_basic : &capstan__source_reliable;
}
