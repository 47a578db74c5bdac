/* The fault-injection harness's job plugin (scripts/chaos.sh): every start
 * and end of a job, one line each, appended to a file of this process's own
 * in $CAPSTAN_LEDGER_DIR, so runs are counted even while Redis is
 * partitioned, frozen or restarting:
 *
 *     S <jid> <pid> <epoch seconds> <port> <class> <args>
 *     E <jid> <pid> <epoch seconds> <run>
 *
 * <run> being the epoch of the run's S line: two runs of one job in one
 * process at once (it fetched again a job of its own that another process
 * recovered while it was frozen) are told apart. <port> is the Redis port
 * of the job's own connection (0 when not known): with shards each shard
 * is a redis-server of its own port, so the line says which shard the job
 * was fetched from.
 *
 * One write(2) a line on an O_APPEND descriptor: a line is never torn, and
 * one a kill -9 interrupts is either written whole or not at all.
 *
 *   LedgerJob [ms, ...]       sleeps ms (the rest of the args tells jobs
 *   LedgerLockJob [ms, ...]   apart); the others differ only in name,
 *   LedgerLimitJob [ms, ...]  which the harness's config gives a lock or a
 *   LedgerWindowJob [ms, ...] limit (concurrent, window; the until-locks:
 *   LedgerUntil*Job [ms, ...] Executed, Expired, While for
 *                             until_and_while_executing), or which
 *   LedgerBatchJob [ms, ...]  tests/chaos/batch.c pushes in
 *   LedgerBatchCallback       a batch; its callbacks and a periodic
 *   LedgerTickJob             schedule's jobs write [enqueued_at, args] and
 *                             [enqueued_at, periodic_at] as their args, so
 *                             the checker tells enqueues of one jid apart;
 *   LedgerIterJob [ms, n, ...] an iterable job of n steps of ms each, one
 *                             line per step: I <jid> <pid> <epoch> <index>
 *                             <run>, and H <jid> <pid> <epoch> <run> when
 *                             interrupted. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <capstan/capstan.h>

static int ledger_fd = -1;
static pthread_once_t ledger_once = PTHREAD_ONCE_INIT;

static void ledger_open(void)
{
    const char *dir = getenv("CAPSTAN_LEDGER_DIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/ledger.%d", dir && *dir ? dir : ".", (int)getpid());
    ledger_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One line, written whole; the job fails when the ledger cannot take it
 * (a run nobody counted would make the checker's figures wrong). */
static int note(capstan_job_t *job, const char *line, int len)
{
    if (len <= 0 || len >= 4096 || write(ledger_fd, line, (size_t)len) != len)
        return capstan_job_fail(job, "IOError", "the ledger cannot be written");
    return 0;
}

/* The args column of a line that tells enqueues apart: [enqueued_at, the
 * payload's field named (its args when "")]. A job run again after a
 * recovery keeps its enqueued_at; a second enqueue has its own. */
static int enqueue_args(capstan_job_t *job, const char *field, char *out, size_t size)
{
    size_t elen = 0, flen = 0;
    const char *enq = capstan_job_field_raw(job, "enqueued_at", &elen);
    const char *f = *field ? capstan_job_field_raw(job, field, &flen) : capstan_job_args_raw(job, &flen);
    return snprintf(out, size, "[%.*s,%.*s]", enq ? (int)(elen < 64 ? elen : 64) : 4, enq ? enq : "null",
                    f ? (int)(flen < 900 ? flen : 900) : 4, f ? f : "null");
}

/* The port of the Redis the job's connection talks to, 0 when not known. */
static int redis_port(capstan_job_t *job)
{
    redisContext *c = capstan_job_redis(job);
    return c ? c->tcp.port : 0;
}

/* The start line of job's run (args as the payload has them, or as
 * enqueue_args writes them when field is not NULL); *at is its time. */
static int start_line(capstan_job_t *job, const char *field, double *at)
{
    pthread_once(&ledger_once, ledger_open);
    if (ledger_fd < 0)
        return capstan_job_fail(job, "IOError", "no ledger file in $CAPSTAN_LEDGER_DIR");
    size_t alen = 0;
    const char *args = capstan_job_args_raw(job, &alen);
    char enq[1024];
    if (field) {
        int n = enqueue_args(job, field, enq, sizeof(enq));
        args = enq;
        alen = n < 0 ? 0 : (size_t)n < sizeof(enq) ? (size_t)n : sizeof(enq) - 1;
    }
    char line[4096];
    *at = wall();
    int len = snprintf(line, sizeof(line), "S %s %d %.6f %d %s %.*s\n", capstan_job_jid(job), (int)getpid(),
                       *at, redis_port(job), capstan_job_class(job), (int)(alen < 1024 ? alen : 1024),
                       args ? args : "");
    return note(job, line, len);
}

static int end_line(capstan_job_t *job, double began)
{
    char line[128];
    int len = snprintf(line, sizeof(line), "E %s %d %.6f %.6f\n", capstan_job_jid(job), (int)getpid(), wall(),
                       began);
    return note(job, line, len);
}

static void sleep_ms(long ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
    while (ms > 0 && nanosleep(&ts, &ts) != 0)
        ;
}

/* args[i] as a number (0 when absent). */
static long arg_long(capstan_job_t *job, size_t i)
{
    json_t *a = capstan_job_args(job);
    return a ? (long)json_integer_value(json_array_get(a, i)) : 0;
}

static int ledger_job(capstan_job_t *job, void *ud)
{
    double at;
    int rc = start_line(job, ud, &at);
    if (rc)
        return rc;
    sleep_ms(arg_long(job, 0));
    return end_line(job, at);
}

/* LedgerIterJob [ms, n, ...]: n steps of ms each, resumed from its cursor
 * (the next step's index), one line per step taken. An interrupted run
 * says so (H: handed back, its next run resumes it) and
 * ends (E), the job going back to its queue. */
static int iter_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    double began;
    int rc = start_line(job, NULL, &began);
    if (rc)
        return rc;
    long ms = arg_long(job, 0), n = arg_long(job, 1);
    const json_t *c = capstan_job_cursor(job);
    for (long i = c ? (long)json_integer_value(c) : 0; i < n; i++) {
        json_t *at = json_integer(i);
        int go = capstan_job_checkpoint(job, at);
        json_decref(at);
        char line[128];
        int len = go == CAPSTAN_ITER_STOP
                      ? snprintf(line, sizeof(line), "H %s %d %.6f %.6f\n", capstan_job_jid(job), (int)getpid(),
                                 wall(), began)
                      : snprintf(line, sizeof(line), "I %s %d %.6f %ld %.6f\n", capstan_job_jid(job),
                                 (int)getpid(), wall(), i, began);
        if (go != CAPSTAN_ITER_CANCELLED && (rc = note(job, line, len)))
            return rc;
        if (go != CAPSTAN_ITER_NEXT)
            break;
        sleep_ms(ms);
    }
    return end_line(job, began);
}

__attribute__((visibility("default"))) int capstan_plugin_init(capstan_runtime_t *rt)
{
    capstan_class_opts_t opts = CAPSTAN_CLASS_OPTS_INIT;
    int rc = 0;
    rc |= capstan_register(rt, "LedgerJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerLockJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerLimitJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerBatchJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerBatchCallback", ledger_job, (void *)"", &opts);
    rc |= capstan_register(rt, "LedgerTickJob", ledger_job, (void *)"periodic_at", &opts);
    rc |= capstan_register(rt, "LedgerIterJob", iter_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerUntilExecutedJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerUntilExpiredJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerUntilWhileJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerWindowJob", ledger_job, NULL, &opts);
    return rc;
}
