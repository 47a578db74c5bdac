/* Example handler plugin: the job classes the README, the demo and the
 * tests use. Build: part of the meson build (examples/libcapstan-examples.so);
 * load: capstan run -r path/to/libcapstan-examples.so. */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <capstan/capstan.h>

/* Argument i as an integer, or def. capstan_job_args gives the arguments
 * perform receives, so these handlers serve a class a Rails app enqueues
 * with perform_later as well as one it pushes with perform_async. */
static long arg_long(capstan_job_t *job, size_t i, long def)
{
    json_t *args = capstan_job_args(job);
    json_t *v = args ? json_array_get(args, i) : NULL;
    return json_is_integer(v) ? (long)json_integer_value(v) : def;
}

static const char *arg_str(capstan_job_t *job, size_t i, const char *def)
{
    json_t *args = capstan_job_args(job);
    json_t *v = args ? json_array_get(args, i) : NULL;
    return json_is_string(v) ? json_string_value(v) : def;
}

/* Sleeps ms milliseconds, through signals (none for ms <= 0). */
static void sleep_ms(long ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
    while (ms > 0 && nanosleep(&ts, &ts) != 0)
        ;
}

/* NoopJob: does nothing (benchmarks, smoke tests). */
static int noop_job(capstan_job_t *job, void *ud)
{
    (void)job;
    (void)ud;
    return 0;
}

/* SleepJob [ms]: sleeps, to keep a processor busy. */
static int sleep_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    long ms = arg_long(job, 0, 1000);
    sleep_ms(ms);
    return 0;
}

/* IterateJob [key, n, step, ms]: walks items 0..n-1, step at a time
 * (default 100), resumable: the cursor is the index of the next step, as a
 * Ruby Sidekiq::IterableJob walking array_enumerator((0...n/step).to_a)
 * keeps it. Each step RPUSHes its first item to key:steps and sleeps ms
 * (default 0); at the end RPUSH key:done "jid-executions". A deploy, a
 * quiet process or max_iteration_runtime stops it between two steps; the
 * next run starts at the saved step. */
static int iterate_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    const char *key = arg_str(job, 0, "capstan:iterate");
    long n = arg_long(job, 1, 1000), step = arg_long(job, 2, 100), ms = arg_long(job, 3, 0);
    if (step < 1)
        return capstan_job_fail(job, "ArgumentError", "step must be at least 1");
    redisContext *c = capstan_job_redis(job);
    const json_t *cursor = capstan_job_cursor(job);
    for (long k = cursor ? (long)json_integer_value(cursor) : 0; k * step < n; k++) {
        json_t *at = json_integer(k);
        int go = capstan_job_checkpoint(job, at);
        json_decref(at);
        if (go != CAPSTAN_ITER_NEXT)
            return 0;
        redisReply *r = redisCommand(c, "RPUSH %s:steps %ld", key, k * step);
        int ok = r && r->type == REDIS_REPLY_INTEGER;
        freeReplyObject(r);
        if (!ok)
            return capstan_job_fail(job, "Redis::CommandError", "RPUSH %s:steps failed", key);
        sleep_ms(ms);
    }
    freeReplyObject(redisCommand(c, "RPUSH %s:done %s-%ld", key, capstan_job_jid(job),
                                 capstan_job_executions(job)));
    return 0;
}

/* FailJob [message, [backtrace lines]]: fails with RuntimeError, with the
 * backtrace when one is given. */
static int fail_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    json_t *args = capstan_job_args(job);
    json_t *bt = args ? json_array_get(args, 1) : NULL;
    const char *lines[16];
    size_t n = 0;
    for (; n < json_array_size(bt) && n < 16; n++)
        lines[n] = json_string_value(json_array_get(bt, n));
    if (n && capstan_job_set_backtrace(job, lines, n))
        return capstan_job_fail(job, "NoMemoryError", "no memory for the backtrace");
    return capstan_job_fail(job, "RuntimeError", "%s", arg_str(job, 0, "FailJob failed on purpose"));
}

/* RecordJob [key]: SADD key jid and RPUSH key:log jid on the job's own
 * connection, so tests can see each execution. */
static int record_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    const char *key = arg_str(job, 0, "capstan:records");
    redisContext *c = capstan_job_redis(job); /* connected when the handler starts */
    if (!c) /* under the testing kit without a connection (capstan/testing.h) */
        return capstan_job_fail(job, "Redis::CannotConnectError", "RecordJob needs Redis");
    redisReply *a = redisCommand(c, "SADD %s %s", key, capstan_job_jid(job));
    redisReply *b = a ? redisCommand(c, "RPUSH %s:log %s", key, capstan_job_jid(job)) : NULL;
    int ok = a && b && a->type != REDIS_REPLY_ERROR && b->type != REDIS_REPLY_ERROR;
    freeReplyObject(a);
    freeReplyObject(b);
    /* The connection can still break under a command (c->errstr says why). */
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "recording %s failed: %s",
                                     capstan_job_jid(job), c->err ? c->errstr : "error reply");
}

/* OverlapJob [key, ms]: evidence of overlapping runs, kept in Redis so it
 * spans threads and processes. INCR key:running (and RPUSH the count it
 * reached to key:levels); if that made it more than one, INCR key:overlaps;
 * sleep ms (default 100); DECR key:running; RPUSH key:log jid. A
 * while_executing lock must leave key:overlaps unset; with lock_limit N no
 * level may pass N. */
static int overlap_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    const char *key = arg_str(job, 0, "capstan:overlap");
    long ms = arg_long(job, 1, 100);
    redisContext *c = capstan_job_redis(job);
    redisReply *r = redisCommand(c, "INCR %s:running", key);
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    if (ok)
        freeReplyObject(redisCommand(c, "RPUSH %s:levels %lld", key, r->integer));
    if (ok && r->integer > 1)
        freeReplyObject(redisCommand(c, "INCR %s:overlaps", key));
    freeReplyObject(r);
    sleep_ms(ms);
    freeReplyObject(redisCommand(c, "DECR %s:running", key));
    freeReplyObject(redisCommand(c, "RPUSH %s:log %s", key, capstan_job_jid(job)));
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "INCR %s:running failed", key);
}

/* LimitJob [key, ms]: what a rate limit lets through, kept in Redis so it
 * spans processes. At start, in one step: INCR key:running, raise key:max to
 * it if higher, RPUSH the Redis clock (ms) to key:starts and SADD the jid to
 * key:jids; then sleep ms (default 50) and DECR key:running. */
static int limit_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    static const char start[] =
        "local n = redis.call('INCR', KEYS[1] .. ':running')\n"
        "if n > tonumber(redis.call('GET', KEYS[1] .. ':max') or '0') then\n"
        "  redis.call('SET', KEYS[1] .. ':max', n) end\n"
        "local t = redis.call('TIME')\n"
        "redis.call('RPUSH', KEYS[1] .. ':starts', t[1] * 1000 + math.floor(t[2] / 1000))\n"
        "redis.call('SADD', KEYS[1] .. ':jids', ARGV[1])\n"
        "return n\n";
    const char *key = arg_str(job, 0, "capstan:limit");
    long ms = arg_long(job, 1, 50);
    redisContext *c = capstan_job_redis(job);
    redisReply *r = redisCommand(c, "EVAL %s 1 %s %s", start, key, capstan_job_jid(job));
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    sleep_ms(ms);
    if (ok)
        freeReplyObject(redisCommand(c, "DECR %s:running", key));
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "LimitJob %s: start failed", key);
}

/* AjRecordJob (an ActiveJob class): RPUSH to "capstan:aj" the JSON of
 * {"class": capstan_job_class, "jid": ..., "arguments": capstan_job_args,
 * "job_class": the wrapper's args[0]["job_class"]}, plus "raw" (the text of
 * capstan_job_args_raw) when the arguments do not fit jansson, to show what
 * a handler receives from perform_later. */
static int aj_record_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    json_t *args = capstan_job_args(job);
    json_t *wrapped = json_array_get(capstan_job_wrapper_args(job), 0);
    size_t rawlen;
    const char *raw = capstan_job_args_raw(job, &rawlen);
    json_t *rec = json_pack("{s:s, s:s, s:O?, s:O?}", "class", capstan_job_class(job), "jid",
                            capstan_job_jid(job), "arguments", args, "job_class",
                            json_object_get(wrapped, "job_class"));
    if (rec && !args && json_object_set_new(rec, "raw", json_stringn(raw, rawlen))) {
        json_decref(rec);
        rec = NULL;
    }
    char *text = rec ? json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(rec);
    if (!text)
        return capstan_job_fail(job, "NoMemoryError", "no memory to record %s", capstan_job_jid(job));
    redisReply *r = redisCommand(capstan_job_redis(job), "RPUSH capstan:aj %s", text);
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    free(text);
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "RPUSH capstan:aj failed");
}

/* FailingAjJob (an ActiveJob class): always fails with ArgumentError. */
static int failing_aj_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    return capstan_job_fail(job, "ArgumentError", "%s failed on purpose", capstan_job_class(job));
}

/* FlakyJob [key, fail_first]: RPUSH key:runs jid at every run; when
 * fail_first is true, fails the first time its jid runs (remembered in
 * key:seen, so across processes and crashes); else SADD key jid. */
static int flaky_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    const char *key = arg_str(job, 0, "capstan:flaky");
    json_t *args = capstan_job_args(job);
    int fail_first = json_is_true(json_array_get(args, 1));
    redisContext *c = capstan_job_redis(job);
    const char *jid = capstan_job_jid(job);
    freeReplyObject(redisCommand(c, "RPUSH %s:runs %s", key, jid));
    redisReply *r = fail_first ? redisCommand(c, "SADD %s:seen %s", key, jid) : NULL;
    int first = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (first)
        return capstan_job_fail(job, "RuntimeError", "FlakyJob %s fails its first run", jid);
    r = redisCommand(c, "SADD %s %s", key, jid);
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "SADD %s failed", key);
}

/* FanoutJob [n, queue]: pushes n NoopJob [i] (i from 0) to queue
 * (default "default") through a client of its own, as a handler that
 * splits its work does. */
static int fanout_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    char err[CAPSTAN_ERRLEN], args[32];
    capstan_client_t *c = capstan_client_new(NULL, err);
    if (!c)
        return capstan_job_fail(job, "Redis::CannotConnectError", "%s", err);
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = arg_str(job, 1, NULL);
    int rc = 0;
    for (long i = 0; i < arg_long(job, 0, 1) && rc >= 0; i++) {
        snprintf(args, sizeof(args), "[%ld]", i);
        rc = capstan_client_push(c, "NoopJob", args, &o, NULL);
    }
    if (rc < 0)
        rc = capstan_job_fail(job, "RuntimeError", "push failed: %s", capstan_client_error(c));
    capstan_client_free(c);
    return rc < 0 ? rc : 0;
}

/* WalkJob [n]: an iterable job with no side effects: walks 0..n-1, one
 * item a step, the cursor the next item; fails on item 13 when n is
 * negative (walking -n items), to show a failed iteration keeps its
 * cursor. */
static int walk_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    long n = arg_long(job, 0, 10), end = n < 0 ? -n : n;
    const json_t *cursor = capstan_job_cursor(job);
    for (long i = cursor ? (long)json_integer_value(cursor) : 0; i < end; i++) {
        json_t *at = json_integer(i);
        int go = capstan_job_checkpoint(job, at);
        json_decref(at);
        if (go != CAPSTAN_ITER_NEXT)
            return 0;
        if (n < 0 && i == 13)
            return capstan_job_fail(job, "RuntimeError", "item 13 is broken");
    }
    return 0;
}

/* Adds n RecordJob [key] jobs to the batch job runs in (reopened through
 * the Redis at url, then committed again). Returns 0, or an error with its
 * reason in err. */
static int add_to_own_batch(capstan_job_t *job, const char *url, const char *key, long n,
                            char err[CAPSTAN_ERRLEN])
{
    if (!capstan_job_bid(job)) {
        snprintf(err, CAPSTAN_ERRLEN, "%s runs in a batch", capstan_job_class(job));
        return CAPSTAN_EINVAL;
    }
    capstan_client_t *c = capstan_client_new(url, err);
    capstan_batch_t *b = c ? capstan_batch_reopen(c, capstan_job_bid(job), err) : NULL;
    int rc = b ? 0 : CAPSTAN_EREDIS;
    char args[256];
    snprintf(args, sizeof(args), "[\"%s\"]", key);
    for (long i = 0; i < n && !rc; i++)
        rc = capstan_batch_push(b, "RecordJob", args, NULL, NULL);
    if (!rc)
        rc = capstan_batch_commit(b);
    if (b && rc)
        snprintf(err, CAPSTAN_ERRLEN, "%s", capstan_batch_error(b));
    capstan_batch_free(b);
    capstan_client_free(c);
    return rc;
}

/* BatchCallbackJob [status, options]: a batch callback (capstan/batch.h);
 * RPUSHes the status as JSON to options["key"] (default capstan:callbacks).
 * With options {"add": n, "url": redis_url} it first adds n RecordJob
 * [key:added] to its own batch: a child batch's callback adding the next
 * step to its parent, as Sidekiq Pro workflows do. */
static int batch_callback_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    json_t *args = capstan_job_args(job);
    json_t *opts = json_array_get(args, 1);
    const char *key = json_string_value(json_object_get(opts, "key"));
    key = key ? key : "capstan:callbacks";
    long add = (long)json_integer_value(json_object_get(opts, "add"));
    if (add > 0) {
        char err[CAPSTAN_ERRLEN], added[256];
        snprintf(added, sizeof(added), "%s:added", key);
        const char *url = json_string_value(json_object_get(opts, "url"));
        if (add_to_own_batch(job, url, added, add, err))
            return capstan_job_fail(job, "RuntimeError", "adding to the batch failed: %s", err);
    }
    char *status = json_dumps(json_array_get(args, 0), JSON_COMPACT | JSON_SORT_KEYS);
    if (!status)
        return capstan_job_fail(job, "ArgumentError", "BatchCallbackJob needs [status, options]");
    redisReply *r = redisCommand(capstan_job_redis(job), "RPUSH %s %s", key, status);
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    free(status);
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "RPUSH failed");
}

/* BatchValidJob [key]: RPUSH key capstan_batch_valid(job): 1 when the job's
 * batch is valid (or it has none), 0 when it was invalidated or deleted. */
static int batch_valid_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    int valid = capstan_batch_valid(job);
    redisReply *r = redisCommand(capstan_job_redis(job), "RPUSH %s %d",
                                 arg_str(job, 0, "capstan:valid"), valid);
    freeReplyObject(r);
    return 0;
}

/* ReopenJob [redis_url, key, n]: adds n RecordJob [key] jobs to its own
 * batch (reopened, then committed again), then SADD key jid itself. */
static int reopen_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    char err[CAPSTAN_ERRLEN];
    const char *key = arg_str(job, 1, "capstan:reopen");
    if (add_to_own_batch(job, arg_str(job, 0, NULL), key, arg_long(job, 2, 10), err))
        return capstan_job_fail(job, "RuntimeError", "reopening the batch failed: %s", err);
    freeReplyObject(redisCommand(capstan_job_redis(job), "SADD %s %s", key, capstan_job_jid(job)));
    return 0;
}

/* TraceJob [key, redis_url, child_queue]: RPUSHes to key what it sees of
 * its W3C trace context, {"jid", "traceparent", "tracestate"} (null when
 * absent); given a child queue, it first pushes TraceJob [key] there
 * through a client on redis_url, which carries the context on. */
static int trace_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    const char *key = arg_str(job, 0, "capstan:traces");
    const char *child = arg_str(job, 2, NULL);
    if (child) {
        char err[CAPSTAN_ERRLEN], args[256];
        capstan_client_t *c = capstan_client_new(arg_str(job, 1, NULL), err);
        capstan_push_opts_t o = capstan_push_opts_default();
        o.queue = child;
        json_t *a = json_pack("[s]", key);
        char *text = a ? json_dumps(a, JSON_COMPACT) : NULL;
        snprintf(args, sizeof(args), "%s", text ? text : "[]");
        free(text);
        json_decref(a);
        int rc = c ? capstan_client_push(c, "TraceJob", args, &o, NULL) : CAPSTAN_EREDIS;
        if (c && rc)
            snprintf(err, sizeof(err), "%s", capstan_client_error(c));
        capstan_client_free(c);
        if (rc)
            return capstan_job_fail(job, "RuntimeError", "pushing the child failed: %s", err);
    }
    const char *tp = capstan_job_traceparent(job), *ts = capstan_job_tracestate(job);
    json_t *rec = json_pack("{s:s, s:s?, s:s?}", "jid", capstan_job_jid(job), "traceparent", tp,
                            "tracestate", ts);
    char *s = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    redisReply *r = s ? redisCommand(capstan_job_redis(job), "RPUSH %s %s", key, s) : NULL;
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    free(s);
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "RPUSH %s failed", key);
}

/* CrashJob: kills the whole process (SIGKILL), as a handler with a fatal
 * bug would; shows recovery and the poison-pill limit. */
static int crash_job(capstan_job_t *job, void *ud)
{
    (void)job;
    (void)ud;
    raise(SIGKILL);
    return 0;
}

/* Recurses depth times with a kilobyte of stack a call (the caller asks for
 * more than any stack holds). */
static long deep(long depth)
{
    volatile char frame[1024];
    frame[0] = (char)depth;
    if (depth <= 0)
        return frame[0];
    return deep(depth - 1) + frame[0];
}

/* SegfaultJob ["overflow" | "double_free" | "", ms]: dies as a handler with
 * a memory bug would: of SIGSEGV (at once, or "overflow" by running out of
 * stack), or "double_free" of SIGABRT inside malloc, which may hold its
 * lock; ms (default 0) after it started, so its neighbours are running;
 * shows the crash report in the log. */
static int segfault_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    sleep_ms(arg_long(job, 1, 0));
    if (strcmp(arg_str(job, 0, ""), "overflow") == 0)
        return (int)deep(LONG_MAX);
    if (strcmp(arg_str(job, 0, ""), "double_free") == 0) {
        char *volatile p = malloc(4096); /* past the sizes freed without the lock */
        free(p);
        free(p);
    }
    raise(SIGSEGV);
    return 0;
}

/* ExitJob [status]: ends the whole process with exit(status) (default
 * 0), as a handler or a library that calls exit() would; shows that any
 * exit a worker was not told to make is a crash. */
static int exit_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    exit((int)arg_long(job, 0, 0));
}

/* LedgerJob [key, ms]: HINCRBY key jid 1 as it starts (a ledger of starts
 * per jid, across processes), sleeps ms (default 0), then RPUSH key:done
 * jid. */
static int ledger_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    const char *key = arg_str(job, 0, "capstan:ledger");
    long ms = arg_long(job, 1, 0);
    redisContext *c = capstan_job_redis(job);
    redisReply *r = redisCommand(c, "HINCRBY %s %s 1", key, capstan_job_jid(job));
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    sleep_ms(ms);
    freeReplyObject(redisCommand(c, "RPUSH %s:done %s", key, capstan_job_jid(job)));
    return ok ? 0 : capstan_job_fail(job, "Redis::CommandError", "HINCRBY %s failed", key);
}

/* FileLedgerJob [path, ms]: appends "start JID PID" to the file path as
 * it starts, sleeps ms, then "end JID PID": a ledger that a kill of the
 * process, or of Redis, cannot lose or delay (one write(2) a line, with
 * O_APPEND, so processes sharing the file do not mix their lines). */
static int file_ledger_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    int fd = open(arg_str(job, 0, "/dev/null"), O_WRONLY | O_APPEND | O_CREAT, 0644);
    char line[128];
    int n = snprintf(line, sizeof(line), "start %s %d\n", capstan_job_jid(job), (int)getpid());
    int ok = fd >= 0 && write(fd, line, (size_t)n) == n;
    sleep_ms(arg_long(job, 1, 0));
    n = snprintf(line, sizeof(line), "end %s %d\n", capstan_job_jid(job), (int)getpid());
    ok = ok && write(fd, line, (size_t)n) == n;
    if (fd >= 0)
        close(fd);
    return ok ? 0 : capstan_job_fail(job, "IOError", "cannot write the ledger");
}

/* HangJob [key]: RPUSH key jid, then never returns, as a handler stuck in a
 * deadlock or a read without a timeout; shows hard timeouts. */
static int hang_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    redisContext *c = capstan_job_redis(job);
    freeReplyObject(redisCommand(c, "RPUSH %s %s", arg_str(job, 0, "capstan:hung"), capstan_job_jid(job)));
    for (;;)
        pause();
    return 0;
}

/* LeakJob [mb]: allocates mb megabytes (default 8), touches them and never
 * frees them, as a leaking handler; shows max_memory. */
static void *volatile leaked;

static int leak_job(capstan_job_t *job, void *ud)
{
    (void)ud;
    long mb = arg_long(job, 0, 8);
    char *p = malloc((size_t)mb << 20);
    if (!p)
        return capstan_job_fail(job, "NoMemoryError", "cannot leak %ld MB", mb);
    memset(p, 1, (size_t)mb << 20);
    leaked = p; /* kept where the compiler must assume it is read */
    return 0;
}

/* DigestJob's lock: one job per args until it has run. Static, because the
 * runtime (and a client that takes the class's options) keeps a pointer. */
static capstan_unique_opts_t digest_lock = CAPSTAN_UNIQUE_OPTS_INIT;

__attribute__((visibility("default"))) int capstan_plugin_init(capstan_runtime_t *rt)
{
    capstan_class_opts_t opts = CAPSTAN_CLASS_OPTS_INIT;
    /* DigestJob [key]: RecordJob's work with class options, as a Ruby
     * worker's sidekiq_options (queue "digests", 3 retries, until_executed):
     * `capstan push -r` and capstan_client_use_runtime write them into the
     * payload. */
    capstan_class_opts_t digest = CAPSTAN_CLASS_OPTS_INIT;
    digest_lock.lock = CAPSTAN_LOCK_UNTIL_EXECUTED;
    digest.queue = "digests";
    digest.retry = 3;
    digest.unique = &digest_lock;
    int rc = 0;
    rc |= capstan_register(rt, "NoopJob", noop_job, NULL, &opts);
    rc |= capstan_register(rt, "SleepJob", sleep_job, NULL, &opts);
    rc |= capstan_register(rt, "IterateJob", iterate_job, NULL, &opts);
    rc |= capstan_register(rt, "FailJob", fail_job, NULL, &opts);
    rc |= capstan_register(rt, "RecordJob", record_job, NULL, &opts);
    rc |= capstan_register(rt, "CrashJob", crash_job, NULL, &opts);
    rc |= capstan_register(rt, "OverlapJob", overlap_job, NULL, &opts);
    rc |= capstan_register(rt, "LimitJob", limit_job, NULL, &opts);
    rc |= capstan_register(rt, "SegfaultJob", segfault_job, NULL, &opts);
    rc |= capstan_register(rt, "AjRecordJob", aj_record_job, NULL, &opts);
    rc |= capstan_register(rt, "FailingAjJob", failing_aj_job, NULL, &opts);
    rc |= capstan_register(rt, "FlakyJob", flaky_job, NULL, &opts);
    rc |= capstan_register(rt, "BatchCallbackJob", batch_callback_job, NULL, &opts);
    rc |= capstan_register(rt, "ReopenJob", reopen_job, NULL, &opts);
    rc |= capstan_register(rt, "BatchValidJob", batch_valid_job, NULL, &opts);
    rc |= capstan_register(rt, "DigestJob", record_job, NULL, &digest);
    rc |= capstan_register(rt, "TraceJob", trace_job, NULL, &opts);
    rc |= capstan_register(rt, "LedgerJob", ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "FileLedgerJob", file_ledger_job, NULL, &opts);
    rc |= capstan_register(rt, "ExitJob", exit_job, NULL, &opts);
    rc |= capstan_register(rt, "HangJob", hang_job, NULL, &opts);
    rc |= capstan_register(rt, "LeakJob", leak_job, NULL, &opts);
    rc |= capstan_register(rt, "FanoutJob", fanout_job, NULL, &opts);
    rc |= capstan_register(rt, "WalkJob", walk_job, NULL, &opts);
    return rc;
}
