/* The sharding test's job plugin (tests/test_shards.c): ShardJob [ms]
 * sleeps ms (none: returns at once), then appends
 *
 *     <jid> <port> <start> <end>
 *
 * to $CAPSTAN_LEDGER_DIR/ledger, the port being the one of the Redis its
 * connection (capstan_job_redis) reaches: the shard it ran in; start and
 * end the handler's, in microseconds of CLOCK_MONOTONIC. One write(2) a
 * line on an O_APPEND descriptor, shared by every process. PlainJob (the
 * routing test's, tests/test_routing.c) does the same without sleeping. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <capstan/capstan.h>
#include <jansson.h>

static int ledger_fd = -1;
static pthread_once_t ledger_once = PTHREAD_ONCE_INIT;

static void ledger_open(void)
{
    const char *dir = getenv("CAPSTAN_LEDGER_DIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/ledger", dir && *dir ? dir : ".");
    ledger_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static long long mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int shard_job(capstan_job_t *job, void *udata)
{
    long long start = mono_us();
    json_t *args = udata ? NULL : capstan_job_args(job);
    json_t *v = args ? json_array_get(args, 0) : NULL;
    long long ms = json_is_integer(v) ? (long long)json_integer_value(v) : 0;
    if (ms > 0) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    pthread_once(&ledger_once, ledger_open);
    redisContext *c = capstan_job_redis(job);
    char line[128];
    int len = snprintf(line, sizeof(line), "%s %d %lld %lld\n", capstan_job_jid(job), c ? c->tcp.port : 0, start,
                       mono_us());
    if (len <= 0 || (size_t)len >= sizeof(line) || write(ledger_fd, line, (size_t)len) != len)
        return capstan_job_fail(job, "IOError", "the ledger cannot be written");
    return 0;
}

__attribute__((visibility("default"))) int capstan_plugin_init(capstan_runtime_t *rt)
{
    /* PlainJob (the routing test's pushes) ledgers its run without
     * reading its args as a sleep. */
    static int plain = 1;
    int rc = capstan_register(rt, "ShardJob", shard_job, NULL, NULL);
    return rc ? rc : capstan_register(rt, "PlainJob", shard_job, &plain, NULL);
}
