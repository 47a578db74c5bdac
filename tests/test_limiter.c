/* Rate limiters: the C API against a real redis-server, and the per-class
 * `limit:` option with kiq processes sharing one limit. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "kiq/limiter.h"

TestSuite(limiter, .init = NULL, .fini = kt_kill_children);

static kiq_limiter_t *mk(kiq_limit_type_t t, const char *name, long n, double s)
{
    char err[KIQ_ERRLEN] = "";
    kiq_limiter_t *l = kiq_limiter_new(t, name, n, s, err);
    cr_assert(l, "%s", err);
    return l;
}

Test(limiter, concurrent_slots_are_owned_leases)
{
    kiq_redis_t *r = kt_lib_redis();
    kiq_limiter_t *l = mk(KIQ_LIMIT_CONCURRENT, "api", 2, 0.5);
    kiq_limit_token_t a, b, c;
    char err[KIQ_ERRLEN];
    double in = 0;
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &a, NULL, err), 0, "%s", err);
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &b, NULL, err), 0, "%s", err);
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &c, &in, err), KIQ_EDENIED);
    cr_assert(in > 0 && in <= 0.5, "%f", in);
    cr_assert_eq(kt_int("ZCARD limiter:api:held"), 2);
    /* Only the holder releases its slot. */
    kiq_limit_token_t other;
    strcpy(other.id, "someone-else");
    cr_assert_eq(kiq_limiter_release(l, r, &other, err), KIQ_ENOTFOUND);
    cr_assert_eq(kiq_limiter_release(l, r, &a, err), 0, "%s", err);
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &c, NULL, err), 0, "%s", err);
    /* A waiter gets the slot as soon as the holders' leases lapse. */
    double t0 = kt_now();
    cr_assert_eq(kiq_limiter_acquire(l, r, 2, &a, NULL, err), 0, "%s", err);
    double waited = kt_now() - t0;
    cr_assert(waited > 0.3 && waited < 1.0, "%f", waited);
    /* b's lease lapsed: it holds nothing any more. */
    cr_assert_eq(kiq_limiter_extend(l, r, &b, err), KIQ_ENOTFOUND);
    cr_assert_eq(kiq_limiter_extend(l, r, &a, err), 0, "%s", err);
    kiq_limiter_free(l);
    kiq_redis_free(r);
}

static int bump(void *ud)
{
    (*(int *)ud)++;
    return 7;
}

Test(limiter, within_runs_under_the_limit_and_releases)
{
    kiq_redis_t *r = kt_lib_redis();
    kiq_limiter_t *l = mk(KIQ_LIMIT_CONCURRENT, "mutex", 1, 0);
    char err[KIQ_ERRLEN];
    int n = 0;
    cr_assert_eq(kiq_limiter_within(l, r, 0, bump, &n, err), 7);
    cr_assert_eq(kiq_limiter_within(l, r, 0, bump, &n, err), 7);
    cr_assert_eq(n, 2);
    cr_assert_eq(kt_int("ZCARD limiter:mutex:held"), 0);
    kiq_limit_token_t t;
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &t, NULL, err), 0);
    cr_assert_eq(kiq_limiter_within(l, r, 0.1, bump, &n, err), KIQ_EDENIED);
    cr_assert_eq(n, 2);
    kiq_limiter_free(l);
    kiq_redis_free(r);
}

Test(limiter, a_name_keeps_its_type_and_parameters)
{
    kiq_redis_t *r = kt_lib_redis();
    char err[KIQ_ERRLEN];
    kiq_limit_token_t t;
    kiq_limiter_t *a = mk(KIQ_LIMIT_CONCURRENT, "stripe", 5, 0);
    kiq_limiter_t *b = mk(KIQ_LIMIT_WINDOW, "stripe", 5, 1);
    kiq_limiter_t *c = mk(KIQ_LIMIT_CONCURRENT, "stripe", 6, 0);
    cr_assert_eq(kiq_limiter_acquire(a, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(kiq_limiter_acquire(b, r, 0, &t, NULL, err), KIQ_ECONFIG);
    cr_assert(strstr(err, "limiter stripe is in use as \"concurrent size=5\""), "%s", err);
    cr_assert_eq(kiq_limiter_acquire(c, r, 1, &t, NULL, err), KIQ_ECONFIG);
    cr_assert_eq(kt_int("ZCARD limiter:stripe:held"), 1);
    kiq_limiter_free(a);
    kiq_limiter_free(b);
    kiq_limiter_free(c);
    /* Bad parameters never reach Redis. */
    cr_assert_null(kiq_limiter_new(KIQ_LIMIT_CONCURRENT, "x", 0, 0, err));
    cr_assert(strstr(err, "size must be >= 1"), "%s", err);
    cr_assert_null(kiq_limiter_new(KIQ_LIMIT_WINDOW, "x", 3, -1, err));
    cr_assert(strstr(err, "interval"), "%s", err);
    cr_assert_null(kiq_limiter_new((kiq_limit_type_t)99, "x", 3, 1, err));
    kiq_redis_free(r);
}

/* Waits for the next calendar second to begin plus a margin, so a test of
 * one window does not straddle two. */
static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void next_second(void)
{
    double now = wall();
    kt_sleep((double)(long)now + 1.05 - now);
}

Test(limiter, window_counts_per_calendar_window_and_says_when_it_reopens)
{
    kiq_redis_t *r = kt_lib_redis();
    kiq_limiter_t *l = mk(KIQ_LIMIT_WINDOW, "search", 3, 1);
    char err[KIQ_ERRLEN];
    kiq_limit_token_t t;
    double in = 0;
    next_second();
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kiq_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &t, &in, err), KIQ_EDENIED);
    cr_assert(in > 0.5 && in <= 1.0, "%f", in);
    /* Waiting is exact: the 4th gets in right after the second turns. */
    cr_assert_eq(kiq_limiter_acquire(l, r, 2, &t, NULL, err), 0, "%s", err);
    double now = wall(), frac = now - (double)(long)now;
    cr_assert(frac < 0.2, "%f", frac);
    cr_assert_eq(kiq_limiter_release(l, r, &t, err), 0);
    kiq_limiter_free(l);
    kiq_redis_free(r);
}

Test(limiter, bucket_refills_at_the_start_of_each_interval)
{
    kiq_redis_t *r = kt_lib_redis();
    kiq_limiter_t *l = mk(KIQ_LIMIT_BUCKET, "tokens", 2, 1);
    char err[KIQ_ERRLEN];
    kiq_limit_token_t t;
    next_second();
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(kiq_limiter_acquire(l, r, 0, &t, NULL, err), KIQ_EDENIED);
    cr_assert_eq(kt_int("HGET limiter:tokens:bucket tokens"), 0);
    cr_assert_eq(kiq_limiter_acquire(l, r, 2, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(kt_int("HGET limiter:tokens:bucket tokens"), 1);
    kiq_limiter_free(l);
    kiq_redis_free(r);
}
