/* Process-wide logger: Sidekiq's pretty line format or one JSON object per
 * line. A whole line is formatted first and written under a lock, so lines
 * from different threads never interleave.
 *
 * The start/done/fail lines of jobs are the bulk of a busy worker's output;
 * writing each with its own system call cost a third of capstan's throughput.
 * They collect in a per-thread batch that is handed on when it holds 4 KB,
 * when its oldest line is 50 ms old, before any other line of the same
 * thread (so a thread's lines keep their order), and whenever
 * capstan__log_flush runs (the main thread calls it five times a second,
 * and at exit). Handed-on batches of every thread gather in one process-wide
 * buffer, written with one system call at 16 KB, at 50 ms, before any line
 * written at once and at each flush: a write every 50 jobs or so, while each
 * thread keeps only 4 KB. A kill -9 can therefore lose the last 50 ms of job
 * lines; warnings and errors are always written at once. */
#include "support/log.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "support/buf.h"
#include "support/json.h"
#include "capstan/error.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_out;           /* NULL = stderr */
static char *log_path;
static atomic_int log_fd = 2;   /* log_out's descriptor, for capstan__log_fd */
static capstan_log_format_t log_fmt = CAPSTAN_LOG_PRETTY;
static capstan_level_t log_min = CAPSTAN_INFO;

static const char *level_name[] = { "DEBUG", "INFO", "WARN", "ERROR" };
/* " INFO: " and the others, for the text line (its lengths known). */
static const char *const level_tag[] = { " DEBUG: ", " INFO: ", " WARN: ", " ERROR: " };
static const size_t level_tag_len[] = { 8, 7, 7, 8 };

/* A string literal appended without measuring it. */
#define PUT_LIT(b, lit) capstan__buf_put((b), (lit), sizeof(lit) - 1)

#define BATCH_BYTES 4096
/* The process-wide buffer: about 50 jobs' two lines a system call (a write
 * a 4 KB batch made the writes a quarter of the worker's system calls). */
#define OUT_BYTES 16384
#define BATCH_AGE 0.05

/* One thread's pending job lines; registered for capstan__log_flush and kept
 * until capstan__log_close (threads come and go, their last lines must not). */
typedef struct batch {
    pthread_mutex_t mu;
    capstan_buf_t buf;
    double since;            /* wall-clock time of the oldest pending line */
    struct batch *next;
} batch_t;

static pthread_mutex_t batches_lock = PTHREAD_MUTEX_INITIALIZER;
static batch_t *batches;
static _Thread_local batch_t *my_batch;
static int log_pid;

/* Under log_lock: the handed-on batches, and since when the oldest waits. */
static capstan_buf_t out_buf;
static double out_since;

/* Under log_lock: writes n bytes at p straight to the descriptor (a
 * line-buffered stream would cut them into writes of its buffer's size),
 * what the stream holds first. */
static void put_fd(const char *p, size_t n)
{
    FILE *f = log_out ? log_out : stderr;
    fflush(f);
    /* A log that cannot be written loses the lines, not the jobs. */
    capstan__write_all(fileno(f), p, n);
}

/* Under log_lock: the handed-on batches written. */
static void out_write(void)
{
    put_fd(out_buf.p, out_buf.len);
    out_buf.len = 0;
}

/* Writes p at once, after the batches handed on before it. */
static void write_out(const char *p, size_t n)
{
    if (!n)
        return;
    pthread_mutex_lock(&log_lock);
    out_write();
    put_fd(p, n);
    pthread_mutex_unlock(&log_lock);
}

/* Hands b's pending lines on (b->mu is held by the caller); written at
 * once with the others waiting when now says they are due, or with all
 * set. */
static void batch_write(batch_t *b, double now, int all)
{
    if (!b->buf.len && !all)
        return;
    pthread_mutex_lock(&log_lock);
    if (out_buf.len && out_buf.len + b->buf.len > OUT_BYTES)
        out_write();
    if (b->buf.len) {
        if (!out_buf.len)
            out_since = b->since;
        if (capstan__buf_put(&out_buf, b->buf.p, b->buf.len) != 0) {
            out_write();
            put_fd(b->buf.p, b->buf.len);
        }
    }
    if (all || out_buf.len >= OUT_BYTES || now - out_since >= BATCH_AGE)
        out_write();
    pthread_mutex_unlock(&log_lock);
    b->buf.len = 0;
}

static batch_t *batch_mine(void)
{
    if (!my_batch) {
        batch_t *b = calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        pthread_mutex_init(&b->mu, NULL);
        pthread_mutex_lock(&batches_lock);
        b->next = batches;
        batches = b;
        pthread_mutex_unlock(&batches_lock);
        my_batch = b;
    }
    return my_batch;
}

void capstan__log_flush(void)
{
    pthread_mutex_lock(&batches_lock);
    for (batch_t *b = batches; b; b = b->next) {
        pthread_mutex_lock(&b->mu);
        batch_write(b, 0, 0);
        pthread_mutex_unlock(&b->mu);
    }
    pthread_mutex_unlock(&batches_lock);
    pthread_mutex_lock(&log_lock);
    out_write();
    pthread_mutex_unlock(&log_lock);
}

int capstan__log_setup(capstan_log_format_t fmt, int verbose, const char *path)
{
    FILE *f = NULL;
    if (path && !(f = fopen(path, "a")))
        return CAPSTAN_ESYS;
    if (f)
        setvbuf(f, NULL, _IOLBF, 0);
    pthread_mutex_lock(&log_lock);
    out_write(); /* to the file it was logged for */
    if (log_out)
        fclose(log_out);
    log_out = f;
    atomic_store(&log_fd, f ? fileno(f) : 2);
    free(log_path);
    log_path = path ? strdup(path) : NULL;
    log_fmt = fmt;
    log_min = verbose ? CAPSTAN_DEBUG : CAPSTAN_INFO;
    pthread_mutex_unlock(&log_lock);
    return 0;
}

int capstan__log_reopen(void)
{
    int rc = 0;
    capstan__log_flush(); /* what was logged before the signal goes to the old file */
    pthread_mutex_lock(&log_lock);
    if (log_path) {
        FILE *f = fopen(log_path, "a");
        if (f) {
            setvbuf(f, NULL, _IOLBF, 0);
            out_write(); /* handed on since the flush: the old file's too */
            atomic_store(&log_fd, fileno(f));
            fclose(log_out);
            log_out = f;
        } else {
            rc = CAPSTAN_ESYS;
        }
    }
    pthread_mutex_unlock(&log_lock);
    return rc;
}

void capstan__log_close(void)
{
    capstan__log_flush();
    pthread_mutex_lock(&batches_lock);
    while (batches) {
        batch_t *b = batches;
        batches = b->next;
        capstan__buf_free(&b->buf);
        pthread_mutex_destroy(&b->mu);
        free(b);
    }
    pthread_mutex_unlock(&batches_lock);
    pthread_mutex_lock(&log_lock);
    out_write();
    capstan__buf_free(&out_buf);
    atomic_store(&log_fd, 2);
    if (log_out)
        fclose(log_out);
    log_out = NULL;
    free(log_path);
    log_path = NULL;
    pthread_mutex_unlock(&log_lock);
}

int capstan__log_fd(void)
{
    return atomic_load(&log_fd);
}

void capstan__log_forked(void)
{
    log_pid = (int)getpid();
}

const char *capstan__log_tid(void)
{
    static _Thread_local char tid[16];
    if (!tid[0]) {
        unsigned long v = (unsigned long)syscall(SYS_gettid) ^ (unsigned long)getpid();
        char tmp[16];
        int n = 0;
        do {
            tmp[n++] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
            v /= 36;
        } while (v && n < 15);
        for (int i = 0; i < n; i++)
            tid[i] = tmp[n - 1 - i];
        tid[n] = '\0';
    }
    return tid;
}

/* UTC iso8601 with milliseconds; the part up to the second is formatted
 * once a second per thread. Returns the time read, in seconds. */
static double timestamp(char *out, size_t n)
{
    static _Thread_local time_t last = -1;
    static _Thread_local char prefix[32];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec != last) {
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        strftime(prefix, sizeof(prefix), "%Y-%m-%dT%H:%M:%S", &tm);
        last = ts.tv_sec;
    }
    /* The prefix is 19 characters; ".mmmZ" and the NUL follow. */
    long ms = ts.tv_nsec / 1000000;
    if (n < 25)
        return 0;
    memcpy(out, prefix, 19);
    out[19] = '.';
    out[20] = (char)('0' + ms / 100);
    out[21] = (char)('0' + ms / 10 % 10);
    out[22] = (char)('0' + ms % 10);
    out[23] = 'Z';
    out[24] = '\0';
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The shard this thread serves (capstan__log_shard), or NULL. */
static _Thread_local const char *log_shard;

void capstan__log_shard(const char *name)
{
    log_shard = name;
}

/* " pid=P tid=T" (and " shard=S" on a shard's thread), formatted once per
 * thread (and again if the pid changes); *len is its length. */
static const char *pid_tid(size_t *len)
{
    static _Thread_local char s[160];
    static _Thread_local size_t n;
    static _Thread_local int for_pid;
    static _Thread_local const char *for_shard;
    if (for_pid != log_pid || for_shard != log_shard) {
        snprintf(s, sizeof(s), " pid=%d tid=%s%s%.64s", log_pid, capstan__log_tid(), log_shard ? " shard=" : "",
                 log_shard ? log_shard : "");
        n = strlen(s);
        for_pid = log_pid;
        for_shard = log_shard;
    }
    *len = n;
    return s;
}

static void json_ctx_str(capstan_buf_t *b, int *first, const char *k, const char *v)
{
    if (!v)
        return;
    capstan__buf_printf(b, "%s\"%s\":", *first ? "" : ",", k);
    capstan__json_quote(b, v, strlen(v));
    *first = 0;
}

/* Appends s with control characters escaped (\n, \t, \r, \xNN), so that a
 * class name, jid, tag or error message taken from a payload cannot split
 * a text line in two or forge one. One pass: plain runs go out in one
 * append, their length taken from the walk. */
static void put_escaped(capstan_buf_t *b, const char *s)
{
    /* The bytes that end a plain run: control characters, NUL included. */
    static const unsigned char stop[256] = {
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, [0x7f] = 1,
    };
    const unsigned char *run = (const unsigned char *)s;
    for (const unsigned char *c = run;; c++) {
        if (!stop[*c])
            continue;
        capstan__buf_put(b, (const char *)run, (size_t)(c - run));
        if (!*c)
            return;
        if (*c == '\n')
            PUT_LIT(b, "\\n");
        else if (*c == '\t')
            PUT_LIT(b, "\\t");
        else if (*c == '\r')
            PUT_LIT(b, "\\r");
        else
            capstan__buf_printf(b, "\\x%02x", *c);
        run = c + 1;
    }
}

void capstan__log(capstan_level_t lvl, const capstan_logctx_t *ctx, const char *fmt, ...)
{
    if (lvl < log_min)
        return;
    int saved = errno;
    char buf[2048], ts[40];
    const char *msg = fmt; /* a message without arguments is used as it is */
    if (!log_pid)
        log_pid = (int)getpid();
    if (strchr(fmt, '%')) {
        msg = buf;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
    }
    double now = timestamp(ts, sizeof(ts));

    char line[512]; /* most lines fit: no allocation on a job's path */
    capstan_buf_t b;
    capstan__buf_on(&b, line, sizeof(line));
    if (log_fmt == CAPSTAN_LOG_JSON) {
        capstan__buf_printf(&b, "{\"ts\":\"%s\",\"pid\":%d,\"tid\":\"%s\",", ts, log_pid, capstan__log_tid());
        if (log_shard) {
            capstan__buf_puts(&b, "\"shard\":");
            capstan__json_quote(&b, log_shard, strlen(log_shard));
            capstan__buf_puts(&b, ",");
        }
        capstan__buf_printf(&b, "\"lvl\":\"%s\",\"msg\":", level_name[lvl]);
        capstan__json_quote(&b, msg, strlen(msg));
        capstan__buf_puts(&b, ",\"ctx\":{");
        int first = 1;
        if (ctx) {
            json_ctx_str(&b, &first, "class", ctx->cls);
            json_ctx_str(&b, &first, "jid", ctx->jid);
            json_ctx_str(&b, &first, "tags", ctx->tags);
            json_ctx_str(&b, &first, "trace_id", ctx->trace_id);
            if (ctx->elapsed >= 0)
                capstan__buf_printf(&b, "%s\"elapsed\":%.3f", first ? "" : ",", ctx->elapsed);
        }
        capstan__buf_puts(&b, "}}\n");
    } else {
        /* Built with plain appends of known lengths: this runs twice per job. */
        size_t ptlen;
        const char *pt = pid_tid(&ptlen);
        capstan__buf_put(&b, ts, 24);
        capstan__buf_put(&b, pt, ptlen);
        if (ctx) {
            if (ctx->cls) { PUT_LIT(&b, " class="); put_escaped(&b, ctx->cls); }
            if (ctx->jid) { PUT_LIT(&b, " jid="); put_escaped(&b, ctx->jid); }
            if (ctx->tags) { PUT_LIT(&b, " tags="); put_escaped(&b, ctx->tags); }
            if (ctx->trace_id) { PUT_LIT(&b, " trace_id="); put_escaped(&b, ctx->trace_id); }
            if (ctx->elapsed >= 0) {
                PUT_LIT(&b, " elapsed=");
                capstan__buf_put_fixed(&b, ctx->elapsed, 3); /* a line per job: no printf */
            }
        }
        capstan__buf_put(&b, level_tag[lvl], level_tag_len[lvl]);
        put_escaped(&b, msg); /* messages quote payloads too (errors, class names) */
        PUT_LIT(&b, "\n");
    }
    batch_t *mine = b.p ? batch_mine() : NULL;
    if (mine) {
        pthread_mutex_lock(&mine->mu);
        if (ctx && lvl == CAPSTAN_INFO) {
            /* The line's own clock read dates the batch: a step of the
             * clock back only delays it to the next capstan__log_flush. */
            /* Written before it would pass BATCH_BYTES, so that each
             * thread's buffer stays that size. */
            if (mine->buf.len && mine->buf.len + b.len >= BATCH_BYTES)
                batch_write(mine, now, 0);
            if (!mine->buf.len)
                mine->since = now;
            if (capstan__buf_put(&mine->buf, b.p, b.len) != 0)
                write_out(b.p, b.len);
            if (now - mine->since >= BATCH_AGE)
                batch_write(mine, now, 1);
            else if (mine->buf.len >= BATCH_BYTES)
                batch_write(mine, now, 0);
        } else {
            batch_write(mine, now, 0);
            write_out(b.p, b.len);
        }
        pthread_mutex_unlock(&mine->mu);
    } else if (b.p) {
        write_out(b.p, b.len);
    }
    capstan__buf_free(&b);
    errno = saved;
}

const char *capstan__sig_name(int sig)
{
    switch (sig) {
    case SIGTERM: return "TERM";
    case SIGINT: return "INT";
    case SIGTSTP: return "TSTP";
    case SIGTTIN: return "TTIN";
    case SIGUSR2: return "USR2";
    case SIGHUP: return "HUP";
    case SIGKILL: return "KILL";
    case SIGSEGV: return "SEGV";
    case SIGABRT: return "ABRT";
    case SIGBUS: return "BUS";
    case SIGFPE: return "FPE";
    case SIGILL: return "ILL";
    default: return "?";
    }
}
