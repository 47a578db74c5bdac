/* capstan-bench: the measuring side of bench/run. It talks to the private
 * redis-server directly (never through the delay proxy), so it adds no
 * latency to what it measures.
 *
 *   capstan-bench push PORT QUEUE CLASS JOBS BATCH [LOCK]
 *       pushes JOBS jobs of CLASS (args [i]) with capstan_client_push_bulk,
 *       BATCH per round trip, as Sidekiq::Client.push_bulk does; with LOCK
 *       (until_executed, while_executing, ...) every push carries v9's lock
 *       fields and the client middleware takes the lock where the type says;
 *       with LOCK "batch" every job goes into one batch (capstan/batch.h),
 *       committed after the last push
 *   capstan-bench locks PORT N
 *       N lock+unlock cycles through the C API (capstan_unique_lock, then
 *       capstan_unique_unlock, until_executed, a distinct digest each), on one
 *       connection; prints "N SECONDS CYCLES_PER_S"
 *   capstan-bench limits PORT N SIZE
 *       N acquire+release cycles of the concurrent limiter "bench" of SIZE
 *       slots through the C API (capstan_limiter_acquire, no wait, then
 *       capstan_limiter_release), on one connection; prints "N SECONDS
 *       CYCLES_PER_S"
 *   capstan-bench limits-raw PORT N SIZE
 *       the same N cycles as plain EVALSHA of the library's own
 *       lua/limit_acquire.lua and lua/limit_release.lua, with the keys and
 *       arguments the C API sends, on one hiredis connection: the ceiling
 *       the C API is measured against; prints the same
 *   capstan-bench prelock PORT COUNT JID METADATA
 *       takes COUNT locks "uniquejobs:<20 zeros><12 digits>:LOCKED" (k =
 *       0..COUNT-1, the keys redis-benchmark's __rand_int__ makes) for JID,
 *       pipelined HSET + ZADD, so that the raw unlock benchmark finds a
 *       held lock behind (almost) every key it draws
 *   capstan-bench fill PORT QUEUE COUNT
 *       LPUSHes COUNT copies of one real NoopJob payload to queue:QUEUE (the
 *       redis-benchmark ceiling needs identical payloads) and prints it
 *   capstan-bench drain PORT QUEUE MODE TIMEOUT_S
 *       times the drain of queue:QUEUE. Start: the first poll that sees the
 *       queue shorter than at the beginning (the first fetch). End, MODE
 *       "working": the first poll that sees the queue and the working
 *       list of every process in "processes" empty (the last ack); MODE "stamp:KEY":
 *       the queue is empty and KEY holds the epoch time the worker wrote
 *       after its last job (basic fetch leaves no trace in Redis).
 *       Prints "JOBS SECONDS JOBS_PER_S WORKING_MAX", the last the most
 *       jobs seen in the working lists at one poll (fetched ahead, running,
 *       or finished with their ack not written yet).
 *   capstan-bench ceiling PORT QUEUE BATCH DEPTH [LOCK]
 *       Redis's own limit for what capstan asks of it per job: drains
 *       queue:QUEUE with the library's fetch.lua, (with LOCK
 *       while_executing or until_and_while_executing) locks.lua, and
 *       acks.lua, BATCH jobs a call, with the arguments capstan sends, on one
 *       connection with DEPTH fetches in flight and every call pipelined:
 *       a client that costs Redis nothing to wait for. Jobs run for no
 *       time between their lock and their ack. Prints "JOBS SECONDS
 *       JOBS_PER_S".
 *   capstan-bench latency PORT QUEUE N KEY
 *       pushes N single LatencyJob jobs (after 5 warm-up ones) into an idle
 *       worker, one at a time with 3-8 ms of idle time between them, waits
 *       for the microseconds each job RPUSHes to KEY, and prints
 *       "P50_MS P99_MS MAX_MS".
 *
 * Every wait is bounded; on a timeout or an error it prints why on stderr
 * and exits nonzero. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <capstan/batch.h>
#include <capstan/client.h>
#include <capstan/error.h>
#include <capstan/limiter.h>
#include <capstan/redis.h>

#include "unique/admin_internal.h"
#include "redis/scripts.h"
#include "support/json.h"
#include <capstan/unique.h>
#include "unique/admin.h"

static const char *prog_cmd = "";

static void die(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "capstan-bench %s: ", prog_cmd);
    fprintf(stderr, fmt, a ? a : "", b ? b : "");
    fputc('\n', stderr);
    exit(1);
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_us(long us)
{
    struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static long num(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0)
        die("bad %s: %s", what, s);
    return v;
}

static redisContext *connect_port(const char *port)
{
    struct timeval tv = { 5, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)num(port, "port"), tv);
    if (!c || c->err)
        die("cannot connect to 127.0.0.1:%s: %s", port, c ? c->errstr : "out of memory");
    redisSetTimeout(c, tv);
    return c;
}

/* Runs a command and dies unless the reply has the expected type. */
static redisReply *cmd(redisContext *c, int type, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r)
        die("redis: %s%s", c->errstr, NULL);
    if (type >= 0 && r->type != type)
        die("unexpected reply to %s: %s", fmt, r->type == REDIS_REPLY_ERROR ? r->str : "(type)");
    return r;
}

static capstan_client_t *client_for(const char *port)
{
    char url[64], err[CAPSTAN_ERRLEN];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%ld/0", num(port, "port"));
    capstan_client_t *k = capstan_client_new(url, err);
    if (!k)
        die("%s%s", err, NULL);
    return k;
}

/* A connected library connection to 127.0.0.1:port. */
static capstan_redis_t *redis_for(const char *port)
{
    char url[64], err[CAPSTAN_ERRLEN];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%ld/0", num(port, "port"));
    capstan_redis_t *r = capstan_redis_new(url, 5.0, err);
    if (!r)
        die("%s%s", err, NULL);
    if (capstan_redis_connect(r))
        die("cannot connect: %s%s", capstan_redis_error(r), NULL);
    return r;
}

static int do_push(int argc, char **argv)
{
    if (argc != 5 && argc != 6)
        die("usage: push PORT QUEUE CLASS JOBS BATCH [LOCK]%s%s", NULL, NULL);
    capstan_client_t *k = client_for(argv[0]);
    long jobs = num(argv[3], "job count"), batch = num(argv[4], "batch size");
    if (batch < 1)
        batch = 1;
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = argv[1];
    capstan_unique_opts_t uo = CAPSTAN_UNIQUE_OPTS_INIT;
    capstan_batch_t *b = NULL;
    char err[CAPSTAN_ERRLEN];
    if (argc == 6 && strcmp(argv[5], "batch") == 0) {
        if (!(b = capstan_batch_new(k, err)))
            die("batch: %s%s", err, NULL);
    } else if (argc == 6) {
        if (capstan_lock_type_parse(argv[5], &uo.lock))
            die("unknown lock type %s%s", argv[5], NULL);
        if (uo.lock != CAPSTAN_LOCK_NONE)
            o.unique = &uo;
    }
    char (*text)[32] = malloc((size_t)batch * sizeof(*text));
    const char **args = malloc((size_t)batch * sizeof(*args));
    if (!text || !args)
        die("out of memory%s%s", NULL, NULL);
    for (long done = 0; done < jobs;) {
        long n = jobs - done < batch ? jobs - done : batch;
        for (long i = 0; i < n; i++) {
            snprintf(text[i], sizeof(text[i]), "[%ld]", done + i);
            args[i] = text[i];
        }
        if (b ? capstan_batch_push_bulk(b, argv[2], args, (size_t)n, &o, NULL)
              : capstan_client_push_bulk(k, argv[2], args, (size_t)n, &o, NULL))
            die("push_bulk: %s%s", b ? capstan_batch_error(b) : capstan_client_error(k), NULL);
        done += n;
    }
    if (b && capstan_batch_commit(b))
        die("batch commit: %s%s", capstan_batch_error(b), NULL);
    capstan_batch_free(b);
    free(text);
    free(args);
    capstan_client_free(k);
    return 0;
}

static int do_fill(int argc, char **argv)
{
    if (argc != 3)
        die("usage: fill PORT QUEUE COUNT%s%s", NULL, NULL);
    long count = num(argv[2], "count");
    capstan_client_t *k = client_for(argv[0]);
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = argv[1];
    if (capstan_client_push(k, "NoopJob", "[0]", &o, NULL))
        die("push: %s%s", capstan_client_error(k), NULL);
    capstan_client_free(k);
    redisContext *c = connect_port(argv[0]);
    char qkey[256];
    snprintf(qkey, sizeof(qkey), "queue:%s", argv[1]);
    redisReply *p = cmd(c, REDIS_REPLY_STRING, "RPOP %s", qkey);
    enum { CHUNK = 1000 };
    const char *av[CHUNK + 2];
    size_t al[CHUNK + 2];
    av[0] = "LPUSH";
    al[0] = 5;
    av[1] = qkey;
    al[1] = strlen(qkey);
    for (long done = 0; done < count;) {
        long n = count - done < CHUNK ? count - done : CHUNK;
        for (long i = 0; i < n; i++) {
            av[2 + i] = p->str;
            al[2 + i] = p->len;
        }
        redisReply *r = redisCommandArgv(c, (int)n + 2, av, al);
        if (!r || r->type != REDIS_REPLY_INTEGER)
            die("LPUSH failed: %s%s", r && r->type == REDIS_REPLY_ERROR ? r->str : c->errstr, NULL);
        freeReplyObject(r);
        done += n;
    }
    fwrite(p->str, 1, p->len, stdout);
    fputc('\n', stdout);
    freeReplyObject(p);
    redisFree(c);
    return 0;
}

/* The lock and limiter cycles' line: "N SECONDS CYCLES_PER_SECOND". */
static int print_rate(long n, double dt)
{
    if (dt <= 0)
        dt = 1e-6;
    printf("%ld %.6f %.1f\n", n, dt, (double)n / dt);
    return 0;
}

static int do_locks(int argc, char **argv)
{
    if (argc != 2)
        die("usage: locks PORT N%s%s", NULL, NULL);
    long n = num(argv[1], "cycle count");
    if (n < 1)
        die("need at least one cycle%s%s", NULL, NULL);
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = redis_for(argv[0]);
    /* Digests and jids shaped as real ones: "uniquejobs:" + 32 hex, 24 hex. */
    char digest[64], jid[32], largs[32];
    capstan_lock_req_t q = { .jid = jid, .type = CAPSTAN_LOCK_UNTIL_EXECUTED, .cls = "NoopJob",
                         .queue = "bench", .lock_args = largs };
    q.digest = digest;
    /* As in a running worker, v9's lock metrics are counted in memory and
     * written in one pipeline (capstan__unique_metrics_flush, timed below). */
    capstan__unique_metrics_buffer(1);
    /* One warm-up cycle: the scripts get loaded, the connection is hot. */
    double t0 = 0;
    for (long i = -1; i < n; i++) {
        if (i == 0)
            t0 = mono();
        unsigned long k = (unsigned long)(i + 1);
        snprintf(digest, sizeof(digest), "uniquejobs:%032lx", k);
        snprintf(jid, sizeof(jid), "%024lx", 0xb0000000UL + k);
        snprintf(largs, sizeof(largs), "[%lu]", k);
        int rc = capstan_unique_lock(r, &q, err);
        if (rc != CAPSTAN_LOCK_ACQUIRED)
            die("capstan_unique_lock: %s%s", rc < 0 ? err : "not newly acquired", NULL);
        rc = capstan_unique_unlock(r, digest, 0, jid, CAPSTAN_LOCK_UNTIL_EXECUTED, 0, err);
        if (rc != 0)
            die("capstan_unique_unlock: %s%s", rc == CAPSTAN_EDENIED ? "held by another jid" : err, NULL);
    }
    if (capstan__unique_metrics_flush(r))
        die("writing the lock metrics failed%s%s", NULL, NULL);
    double dt = mono() - t0;
    capstan_redis_free(r);
    return print_rate(n, dt);
}

static int do_limits(int argc, char **argv)
{
    if (argc != 3)
        die("usage: limits PORT N SIZE%s%s", NULL, NULL);
    long n = num(argv[1], "cycle count"), size = num(argv[2], "size");
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = redis_for(argv[0]);
    capstan_limiter_t *lim = capstan_limiter_new(CAPSTAN_LIMIT_CONCURRENT, "bench", size, 0, err);
    if (!lim)
        die("%s%s", err, NULL);
    capstan_limit_token_t t;
    double t0 = 0;
    for (long i = -1; i < n; i++) { /* one warm-up cycle, as in do_locks */
        if (i == 0)
            t0 = mono();
        if (capstan_limiter_acquire(lim, r, 0, &t, NULL, err) || capstan_limiter_release(lim, r, &t, err))
            die("limiter: %s%s", err, NULL);
    }
    double dt = mono() - t0;
    capstan_limiter_free(lim);
    capstan_redis_free(r);
    return print_rate(n, dt);
}

static redisReply *must(redisReply *rep, redisContext *c, int type)
{
    if (!rep || rep->type != type)
        die("limits-raw: %s%s", rep && rep->type == REDIS_REPLY_ERROR ? rep->str : c->errstr,
            NULL);
    return rep;
}

static int do_limits_raw(int argc, char **argv)
{
    if (argc != 3)
        die("usage: limits-raw PORT N SIZE%s%s", NULL, NULL);
    long n = num(argv[1], "cycle count"), size = num(argv[2], "size");
    redisContext *c = redisConnect("127.0.0.1", (int)num(argv[0], "port"));
    if (!c || c->err)
        die("cannot connect: %s%s", c ? c->errstr : "no memory", NULL);
    char sha[2][41];
    capstan_script_t scripts[2] = { CAPSTAN_SCRIPT_LIMIT_ACQUIRE, CAPSTAN_SCRIPT_LIMIT_RELEASE };
    for (int i = 0; i < 2; i++) {
        redisReply *rep = must(redisCommand(c, "SCRIPT LOAD %s", capstan__script_text(scripts[i])), c,
                               REDIS_REPLY_STRING);
        snprintf(sha[i], sizeof(sha[i]), "%s", rep->str);
        freeReplyObject(rep);
    }
    char meta[64], count[24], id[CAPSTAN_LIMIT_TOKEN_MAX];
    snprintf(meta, sizeof(meta), "concurrent size=%ld", size);
    snprintf(count, sizeof(count), "%ld", size);
    const char *acq[] = { "EVALSHA", sha[0], "2", "limiter:bench:meta", "limiter:bench:held",
                          "concurrent", meta, count, "30000", id, "1" };
    const char *rel[] = { "EVALSHA", sha[1], "3", "limiter:bench:held", "limiter:bench:meta",
                          "limiter:bench:free", id, "release", "30000", count };
    double t0 = 0;
    for (long i = -1; i < n; i++) { /* one warm-up cycle, as in do_limits */
        if (i == 0)
            t0 = mono();
        /* As long as the C API's holder ids: pid, 12 hex digits, a count. */
        snprintf(id, sizeof(id), "%ld:5eed0f1e1d5a:%ld", (long)getpid(), i + 2);
        redisReply *a = must(redisCommandArgv(c, 11, acq, NULL), c, REDIS_REPLY_ARRAY);
        if (a->elements != 2 || a->element[0]->integer != 1)
            die("limits-raw: an acquisition was refused%s%s", "", "");
        freeReplyObject(a);
        freeReplyObject(must(redisCommandArgv(c, 10, rel, NULL), c, REDIS_REPLY_INTEGER));
    }
    double dt = mono() - t0;
    redisFree(c);
    return print_rate(n, dt);
}

static int do_prelock(int argc, char **argv)
{
    if (argc != 4)
        die("usage: prelock PORT COUNT JID METADATA%s%s", NULL, NULL);
    long count = num(argv[1], "count");
    redisContext *c = connect_port(argv[0]);
    enum { CHUNK = 1000 };
    char (*digest)[64] = malloc(CHUNK * sizeof(*digest));
    char (*locked)[80] = malloc(CHUNK * sizeof(*locked));
    const char **zav = malloc((2 * CHUNK + 2) * sizeof(*zav));
    if (!digest || !locked || !zav)
        die("out of memory%s%s", NULL, NULL);
    char now[32];
    snprintf(now, sizeof(now), "%.6f", wall());
    for (long done = 0; done < count;) {
        long m = count - done < CHUNK ? count - done : CHUNK;
        zav[0] = "ZADD";
        zav[1] = "uniquejobs:digests";
        for (long i = 0; i < m; i++) {
            snprintf(digest[i], sizeof(digest[i]), "uniquejobs:00000000000000000000%012ld", done + i);
            snprintf(locked[i], sizeof(locked[i]), "%s:LOCKED", digest[i]);
            const char *hav[] = { "HSET", locked[i], argv[2], argv[3] };
            if (redisAppendCommandArgv(c, 4, hav, NULL) != REDIS_OK)
                die("redis: %s%s", c->errstr, NULL);
            zav[2 + 2 * i] = now;
            zav[3 + 2 * i] = digest[i];
        }
        if (redisAppendCommandArgv(c, (int)(2 * m + 2), zav, NULL) != REDIS_OK)
            die("redis: %s%s", c->errstr, NULL);
        for (long i = 0; i <= m; i++) {
            void *rep = NULL;
            if (redisGetReply(c, &rep) != REDIS_OK || !rep)
                die("redis: %s%s", c->errstr, NULL);
            redisReply *rr = rep;
            if (rr->type != REDIS_REPLY_INTEGER)
                die("prelock: %s%s", rr->type == REDIS_REPLY_ERROR ? rr->str : "unexpected reply", NULL);
            freeReplyObject(rep);
        }
        done += m;
    }
    free(digest);
    free(locked);
    free(zav);
    redisFree(c);
    return 0;
}

/* One poll: {LLEN queue, total length of the working lists, stamp or false}.
 * The lists are found through the "processes" set (capstan registers there
 * before its first fetch): a KEYS pattern would walk the whole keyspace on
 * every poll, and with a uniqueness lock per queued job that stalls Redis. */
static const char *POLL_LUA =
    "local w = 0\n"
    "for _, id in ipairs(redis.call('SMEMBERS', 'processes')) do\n"
    "  w = w + redis.call('LLEN', 'uniquejobs:working:' .. id)\n"
    "end\n"
    "local s = false\n"
    "if ARGV[1] ~= '' then s = redis.call('GET', ARGV[1]) end\n"
    "return {redis.call('LLEN', KEYS[1]), w, s}\n";

static int do_drain(int argc, char **argv)
{
    if (argc != 4)
        die("usage: drain PORT QUEUE working|stamp:KEY TIMEOUT_S%s%s", NULL, NULL);
    const char *stamp = "";
    if (strncmp(argv[2], "stamp:", 6) == 0)
        stamp = argv[2] + 6;
    else if (strcmp(argv[2], "working") != 0)
        die("bad mode %s%s", argv[2], NULL);
    double timeout = (double)num(argv[3], "timeout");
    const long poll_us = 1000;
    redisContext *c = connect_port(argv[0]);
    char qkey[256];
    snprintf(qkey, sizeof(qkey), "queue:%s", argv[1]);
    redisReply *sha = cmd(c, REDIS_REPLY_STRING, "SCRIPT LOAD %s", POLL_LUA);
    redisReply *r = cmd(c, REDIS_REPLY_INTEGER, "LLEN %s", qkey);
    long long n0 = r->integer;
    freeReplyObject(r);
    if (n0 <= 0)
        die("queue %s is empty%s", qkey, NULL);
    fprintf(stderr, "ready\n"); /* bench/run starts the worker after this */
    fflush(stderr);

    double deadline = mono() + timeout, t0 = 0, t1 = 0;
    int started = 0;
    long long wmax = 0; /* the most jobs seen in working lists at once */
    while (mono() < deadline) {
        r = cmd(c, REDIS_REPLY_ARRAY, "EVALSHA %s 1 %s %s", sha->str, qkey, stamp);
        long long q = r->element[0]->integer, w = r->element[1]->integer;
        if (w > wmax)
            wmax = w;
        const redisReply *s = r->element[2];
        double now = wall();
        if (!started && q < n0) {
            started = 1;
            t0 = now;
        }
        int done = started && q == 0
            && (*stamp ? s->type == REDIS_REPLY_STRING : w == 0);
        if (done)
            t1 = *stamp ? strtod(s->str, NULL) : now;
        freeReplyObject(r);
        if (done)
            break;
        sleep_us(poll_us);
    }
    freeReplyObject(sha);
    redisFree(c);
    if (t1 <= 0)
        die(started ? "the drain did not finish within %s s%s"
                    : "no fetch within %s s%s", argv[3], NULL);
    if (t1 <= t0)
        t1 = t0 + 1e-6;
    printf("%lld %.6f %.1f %lld\n", n0, t1 - t0, (double)n0 / (t1 - t0), wmax);
    return 0;
}

/* The value of the top-level member name of the payload p, scanned into
 * o (a string without its quotes, escapes left as they are); NULL when
 * absent. */
static const char *raw_field(const capstan_jobject_t *o, const char *p, const char *name,
                             size_t *len)
{
    const capstan_jmember_t *m = capstan__jobject_get(o, p, name);
    if (!m)
        return NULL;
    const char *v = p + m->vstart;
    *len = m->vlen;
    if (*len >= 2 && *v == '"') {
        v++;
        *len -= 2;
    }
    return v;
}

enum { CEIL_FETCH, CEIL_LOCKS, CEIL_ACKS };

/* Appends the library's script s (EVALSHA) to c's pipeline. */
static void ceil_append(capstan_redis_t *c, capstan_script_t s, int nkeys, int argc, const char **argv,
                        const size_t *lens)
{
    if (capstan__redis_append_script(c, s, nkeys, argc, argv, lens))
        die("redis: %s%s", capstan_redis_error(c), NULL);
}

/* The locks.lua and acks.lua calls for the jobs of one fetch reply f. */
static void ceil_lock_and_ack(capstan_redis_t *c, const redisReply *f, const char *working,
                              const char *lock)
{
    size_t n = (f->elements - 1) / 2;
    const char **la = calloc(3 + 8 * n, sizeof(*la)), **aa = calloc(2 + 7 * n, sizeof(*aa));
    size_t *al = calloc(2 + 7 * n, sizeof(*al));
    char (*keys)[2][160] = calloc(n, sizeof(*keys)), (*jids)[32] = calloc(n, sizeof(*jids));
    char **metas = calloc(n, sizeof(*metas)), now[32], *kinds = calloc(n + 1, 1);
    char *akinds = calloc(n + 1, 1); /* acks.lua's: a byte a job, what it has */
    if (!la || !aa || !al || !keys || !jids || !metas || !kinds || !akinds)
        die("out of memory%s%s", NULL, NULL);
    snprintf(now, sizeof(now), "%.6f", wall());
    int until = lock && strcmp(lock, "until_and_while_executing") == 0;
    capstan_jobject_t o = { 0 };
    /* locks.lua's KEYS: the digests, each job's runtime lock, then its
     * until-locks; then now, the jobs' kinds and their groups. */
    size_t nlk = lock ? 1 + n + (until ? n : 0) : 1, nl = nlk, na = 0;
    la[0] = "uniquejobs:digests";
    la[nl++] = now;
    la[nl++] = kinds;
    aa[na] = working;
    al[na] = strlen(working);
    na++;
    aa[na] = "uniquejobs:digests";
    al[na] = strlen(aa[na]);
    na++;
    /* acks.lua's KEYS: each lock hash (no one waits for these: no
     * lock_timeout); then the kinds, the jids of the locks, the payloads. */
    size_t nk = lock ? 2 + n : 2;
    na = nk;
    memset(akinds, '0', n);
    aa[na] = akinds;
    al[na++] = n;
    for (size_t i = 0; i < n; i++) {
        const redisReply *job = f->element[2 + 2 * i];
        if (capstan__json_scan_object(job->str, job->len, &o, NULL))
            die("a payload that is not a JSON object: %s%s", job->str, NULL);
        size_t dl = 0, jl = 0, gl = 0, cl = 0, ql = 0;
        const char *d = raw_field(&o, job->str, "lock_digest", &dl);
        const char *j = raw_field(&o, job->str, "jid", &jl);
        const char *g = raw_field(&o, job->str, "lock_args", &gl);
        const char *cls = raw_field(&o, job->str, "class", &cl);
        const char *q = raw_field(&o, job->str, "queue", &ql);
        if (!j || jl >= sizeof(jids[i]))
            die("a payload without a jid: %s%s", job->str, NULL);
        snprintf(jids[i], sizeof(jids[i]), "%.*s", (int)jl, j);
        if (lock) {
            if (!d)
                die("a payload without a lock_digest: %s%s", job->str, NULL);
            snprintf(keys[i][0], sizeof(keys[i][0]), "%.*s:RUN:LOCKED", (int)dl, d);
            snprintf(keys[i][1], sizeof(keys[i][1]), "%.*s:LOCKED", (int)dl, d);
            aa[2 + i] = keys[i][0];
            al[2 + i] = strlen(aa[2 + i]);
            size_t ml = 256 + gl + cl + ql;
            metas[i] = malloc(ml);
            if (!metas[i])
                die("out of memory%s%s", NULL, NULL);
            /* As unique/lock.c writes it (the payload's class and
             * queue are plain names here). */
            snprintf(metas[i], ml,
                     "{\"worker\":\"%.*s\",\"queue\":\"%.*s\",\"limit\":null,\"timeout\":0,"
                     "\"ttl\":null,\"type\":\"%s\",\"lock_args\":%.*s,\"time\":%s,\"at\":null}",
                     (int)(cls ? cl : 0), cls ? cls : "", (int)(q ? ql : 0), q ? q : "", lock,
                     (int)(g ? gl : 2), g ? g : "[]", now);
            la[1 + i] = keys[i][0];
            if (until) {
                la[1 + n + i] = keys[i][1];
                const char *one[] = { keys[i][1], jids[i], "0", lock, "1", metas[i] };
                memcpy(&la[nl], one, sizeof(one));
                nl += 6;
                kinds[i] = 'l';
            } else {
                la[nl++] = jids[i];
                la[nl++] = metas[i];
                kinds[i] = 's';
            }
            akinds[i] = 'l';
            aa[na] = jids[i];
            al[na] = strlen(aa[na]);
            na++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        aa[na] = f->element[2 + 2 * i]->str;
        al[na++] = f->element[2 + 2 * i]->len;
    }
    if (lock)
        ceil_append(c, CAPSTAN_SCRIPT_LOCKS, (int)nlk, (int)nl, la, NULL);
    ceil_append(c, CAPSTAN_SCRIPT_ACKS, (int)nk, (int)na, aa, al);
    capstan__jobject_free(&o);
    for (size_t i = 0; i < n; i++)
        free(metas[i]);
    free(metas);
    free(kinds);
    free(akinds);
    free(jids);
    free(keys);
    free(al);
    free(aa);
    free(la);
}

static int do_ceiling(int argc, char **argv)
{
    if (argc != 4 && argc != 5)
        die("usage: ceiling PORT QUEUE BATCH DEPTH [LOCK]%s%s", NULL, NULL);
    const char *lock = argc == 5 ? argv[4] : NULL;
    if (lock && strcmp(lock, "while_executing") && strcmp(lock, "until_and_while_executing"))
        die("ceiling: LOCK is while_executing or until_and_while_executing, not %s%s", lock, NULL);
    long batch = num(argv[2], "batch"), depth = num(argv[3], "depth");
    if (batch < 1 || depth < 1)
        die("ceiling: BATCH and DEPTH are at least 1%s%s", NULL, NULL);
    capstan_redis_t *c = redis_for(argv[0]);
    char qkey[256], bn[32];
    const char *working = "uniquejobs:working:bench-ceiling";
    snprintf(qkey, sizeof(qkey), "queue:%s", argv[1]);
    snprintf(bn, sizeof(bn), "%ld", batch);
    redisReply *r = capstan_redis_cmdf(c, "LLEN %s", qkey);
    long long total = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    if (total <= 0)
        die("queue %s is empty%s", qkey, NULL);
    const char *fa[] = { qkey, working, bn, "1" };
    /* What each reply on its way answers, in order (a ring). */
    size_t cap = (size_t)depth * 3 + 8, head = 0, nexp = 0;
    int *expect = malloc(cap * sizeof(*expect));
    if (!expect)
        die("out of memory%s%s", NULL, NULL);
#define CEIL_SEND(kind) (expect[(head + nexp++) % cap] = (kind))
#define CEIL_FETCH_MORE() (ceil_append(c, CAPSTAN_SCRIPT_FETCH, 2, 4, fa, NULL), CEIL_SEND(CEIL_FETCH))
    double t0 = mono();
    for (long i = 0; i < depth; i++)
        CEIL_FETCH_MORE();
    long long acked = 0;
    int empty = 0;
    while (nexp > 0) {
        redisReply *rr = capstan_redis_get_reply(c);
        if (!rr)
            die("redis: %s%s", capstan_redis_error(c), NULL);
        int kind = expect[head];
        head = (head + 1) % cap;
        nexp--;
        if (rr->type == REDIS_REPLY_ERROR)
            die("ceiling: %s%s", rr->str, NULL);
        if (kind == CEIL_FETCH) {
            if (rr->type != REDIS_REPLY_ARRAY || rr->elements < 1)
                die("ceiling: unexpected fetch reply%s%s", NULL, NULL);
            if (rr->elements == 1) {
                empty = 1;
            } else {
                ceil_lock_and_ack(c, rr, working, lock);
                if (lock)
                    CEIL_SEND(CEIL_LOCKS);
                CEIL_SEND(CEIL_ACKS);
                if (!empty)
                    CEIL_FETCH_MORE();
            }
        } else if (kind == CEIL_LOCKS) {
            if (rr->type != REDIS_REPLY_STRING || rr->len % 2)
                die("ceiling: unexpected locks reply%s%s", NULL, NULL);
            for (size_t i = 0; i + 1 < rr->len; i += 2)
                if (rr->str[i] != '1' || rr->str[i + 1] != '1')
                    die("ceiling: a lock was refused: %s%s", rr->str, NULL);
        } else {
            if (rr->type != REDIS_REPLY_ARRAY || rr->elements < 1)
                die("ceiling: unexpected acks reply%s%s", NULL, NULL);
            acked += rr->element[0]->integer;
        }
        freeReplyObject(rr);
    }
#undef CEIL_FETCH_MORE
#undef CEIL_SEND
    double dt = mono() - t0;
    free(expect);
    capstan_redis_free(c);
    if (acked != total)
        die("ceiling: acked a different count than was queued%s%s", NULL, NULL);
    return print_rate(total, dt);
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array. */
static long long pct(const long long *v, long n, double p)
{
    long rank = (long)(p * (double)n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

static int do_latency(int argc, char **argv)
{
    if (argc != 4)
        die("usage: latency PORT QUEUE N KEY%s%s", NULL, NULL);
    long n = num(argv[2], "count");
    if (n < 1)
        die("need at least one push%s%s", NULL, NULL);
    const long warm = 5;
    capstan_client_t *k = client_for(argv[0]);
    redisContext *c = connect_port(argv[0]);
    freeReplyObject(cmd(c, -1, "DEL %s", argv[3]));
    capstan_push_opts_t o = capstan_push_opts_default();
    o.queue = argv[1];
    char args[300];
    snprintf(args, sizeof(args), "[\"%s\"]", argv[3]);
    long long *v = calloc((size_t)n, sizeof(*v));
    if (!v)
        die("out of memory%s%s", NULL, NULL);
    srand((unsigned)time(NULL));
    for (long i = 0; i < n + warm; i++) {
        sleep_us(3000 + rand() % 5000); /* the worker goes back to its blocking fetch */
        if (capstan_client_push(k, "LatencyJob", args, &o, NULL))
            die("push: %s%s", capstan_client_error(k), NULL);
        redisReply *r = cmd(c, -1, "BLPOP %s 10", argv[3]);
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2)
            die("no LatencyJob result on %s within 10 s (is the worker running queue %s?)",
                argv[3], argv[1]);
        if (i >= warm)
            v[i - warm] = strtoll(r->element[1]->str, NULL, 10);
        freeReplyObject(r);
    }
    qsort(v, (size_t)n, sizeof(*v), cmp_ll);
    printf("%.3f %.3f %.3f\n", (double)pct(v, n, 0.50) / 1000.0, (double)pct(v, n, 0.99) / 1000.0,
           (double)v[n - 1] / 1000.0);
    free(v);
    redisFree(c);
    capstan_client_free(k);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: capstan-bench push|fill|drain|latency|locks|limits|prelock|ceiling ARGS (see bench/driver.c)\n");
        return 2;
    }
    prog_cmd = argv[1];
    if (strcmp(argv[1], "push") == 0)
        return do_push(argc - 2, argv + 2);
    if (strcmp(argv[1], "fill") == 0)
        return do_fill(argc - 2, argv + 2);
    if (strcmp(argv[1], "drain") == 0)
        return do_drain(argc - 2, argv + 2);
    if (strcmp(argv[1], "latency") == 0)
        return do_latency(argc - 2, argv + 2);
    if (strcmp(argv[1], "locks") == 0)
        return do_locks(argc - 2, argv + 2);
    if (strcmp(argv[1], "limits") == 0)
        return do_limits(argc - 2, argv + 2);
    if (strcmp(argv[1], "limits-raw") == 0)
        return do_limits_raw(argc - 2, argv + 2);
    if (strcmp(argv[1], "prelock") == 0)
        return do_prelock(argc - 2, argv + 2);
    if (strcmp(argv[1], "ceiling") == 0)
        return do_ceiling(argc - 2, argv + 2);
    die("unknown command%s%s", NULL, NULL);
    return 2;
}
