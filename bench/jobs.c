/* Handler plugin for bench/run: the job classes the benchmarks push.
 * Load: capstan run -r build/bench/libcapstan-bench.so. Like examples/jobs.c it
 * resolves capstan_* symbols from the capstan binary and does not link libcapstan.
 *
 *   NoopJob [...]        does nothing (throughput, memory)
 *   SleepJob [...]       sleeps 2 ms, as a job waiting on I/O would
 *   SlowJob [...]        sleeps 50 ms, as a job calling a slow service would
 *   LatencyJob KEY       RPUSHes to KEY the microseconds between the job's
 *                        enqueued_at and the moment its handler starts */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <capstan/capstan.h>

static int noop_job(capstan_job_t *job, void *ud)
{
    (void)job;
    (void)ud;
    return 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = { 0, ms * 1000000 };
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static int sleep_job(capstan_job_t *job, void *ud)
{
    (void)job;
    (void)ud;
    sleep_ms(2);
    return 0;
}

static int slow_job(capstan_job_t *job, void *ud)
{
    (void)job;
    (void)ud;
    sleep_ms(50);
    return 0;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* enqueued_at as epoch seconds: float seconds (Sidekiq 6/7) or integer
 * milliseconds (Sidekiq 8), or a negative number when absent. */
static double enqueued_at(capstan_job_t *job)
{
    size_t len;
    const char *v = capstan_job_field_raw(job, "enqueued_at", &len);
    char text[64];
    if (!v || len == 0 || len >= sizeof(text))
        return -1;
    memcpy(text, v, len);
    text[len] = '\0';
    double t = strtod(text, NULL);
    if (!strpbrk(text, ".eE"))
        t /= 1000.0;
    return t;
}

static int latency_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    double start = wall_now(); /* first thing: the figure is push-to-start */
    double enq = enqueued_at(job);
    if (enq <= 0)
        return capstan_job_fail(job, "ArgumentError", "no enqueued_at in the payload");
    json_t *args = capstan_job_args(job);
    const char *key = json_string_value(json_array_get(args, 0));
    if (!key)
        return capstan_job_fail(job, "ArgumentError", "LatencyJob needs a result key");
    redisContext *c = capstan_job_redis(job);
    if (!c)
        return capstan_job_fail(job, "Redis::CannotConnectError", "no Redis connection");
    char us[32];
    snprintf(us, sizeof(us), "%lld", (long long)((start - enq) * 1e6));
    redisReply *r = redisCommand(c, "RPUSH %s %s", key, us);
    int ok = r && r->type != REDIS_REPLY_ERROR;
    freeReplyObject(r);
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "RPUSH %s failed", key);
}

__attribute__((visibility("default"))) int capstan_plugin_init(capstan_runtime_t *rt)
{
    capstan_class_opts_t opts = CAPSTAN_CLASS_OPTS_INIT;
    int rc = 0;
    rc |= capstan_register(rt, "NoopJob", noop_job, NULL, &opts);
    rc |= capstan_register(rt, "SleepJob", sleep_job, NULL, &opts);
    rc |= capstan_register(rt, "SlowJob", slow_job, NULL, &opts);
    rc |= capstan_register(rt, "LatencyJob", latency_job, NULL, &opts);
    return rc;
}
