/* Process-wide logger: Sidekiq's pretty line format or one JSON object per
 * line. A whole line is formatted first and written with one fwrite under a
 * lock, so lines from different threads never interleave. */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "json.h"
#include "kiq/error.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_out;           /* NULL = stderr */
static char *log_path;
static kiq_log_format_t log_fmt = KIQ_LOG_PRETTY;
static kiq_level_t log_min = KIQ_INFO;

static const char *level_name[] = { "DEBUG", "INFO", "WARN", "ERROR" };

int kiq_log_setup(kiq_log_format_t fmt, int verbose, const char *path)
{
    FILE *f = NULL;
    if (path && !(f = fopen(path, "a")))
        return KIQ_ESYS;
    if (f)
        setvbuf(f, NULL, _IOLBF, 0);
    pthread_mutex_lock(&log_lock);
    if (log_out)
        fclose(log_out);
    log_out = f;
    free(log_path);
    log_path = path ? strdup(path) : NULL;
    log_fmt = fmt;
    log_min = verbose ? KIQ_DEBUG : KIQ_INFO;
    pthread_mutex_unlock(&log_lock);
    return 0;
}

int kiq_log_reopen(void)
{
    int rc = 0;
    pthread_mutex_lock(&log_lock);
    if (log_path) {
        FILE *f = fopen(log_path, "a");
        if (f) {
            setvbuf(f, NULL, _IOLBF, 0);
            fclose(log_out);
            log_out = f;
        } else {
            rc = KIQ_ESYS;
        }
    }
    pthread_mutex_unlock(&log_lock);
    return rc;
}

void kiq_log_close(void)
{
    pthread_mutex_lock(&log_lock);
    if (log_out)
        fclose(log_out);
    log_out = NULL;
    free(log_path);
    log_path = NULL;
    pthread_mutex_unlock(&log_lock);
}

const char *kiq_log_tid(void)
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

static void timestamp(char *out, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
}

static void json_ctx_str(kiq_buf_t *b, int *first, const char *k, const char *v)
{
    if (!v)
        return;
    kiq_buf_printf(b, "%s\"%s\":", *first ? "" : ",", k);
    kiq_json_quote(b, v, strlen(v));
    *first = 0;
}

void kiq_log(kiq_level_t lvl, const kiq_logctx_t *ctx, const char *fmt, ...)
{
    if (lvl < log_min)
        return;
    int saved = errno;
    char msg[2048], ts[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    timestamp(ts, sizeof(ts));

    kiq_buf_t b = {0};
    if (log_fmt == KIQ_LOG_JSON) {
        kiq_buf_printf(&b, "{\"ts\":\"%s\",\"pid\":%d,\"tid\":\"%s\",\"lvl\":\"%s\",\"msg\":",
                       ts, (int)getpid(), kiq_log_tid(), level_name[lvl]);
        kiq_json_quote(&b, msg, strlen(msg));
        kiq_buf_puts(&b, ",\"ctx\":{");
        int first = 1;
        if (ctx) {
            json_ctx_str(&b, &first, "class", ctx->cls);
            json_ctx_str(&b, &first, "jid", ctx->jid);
            json_ctx_str(&b, &first, "tags", ctx->tags);
            if (ctx->elapsed >= 0)
                kiq_buf_printf(&b, "%s\"elapsed\":%.3f", first ? "" : ",", ctx->elapsed);
        }
        kiq_buf_puts(&b, "}}\n");
    } else {
        kiq_buf_printf(&b, "%s pid=%d tid=%s", ts, (int)getpid(), kiq_log_tid());
        if (ctx) {
            if (ctx->cls) kiq_buf_printf(&b, " class=%s", ctx->cls);
            if (ctx->jid) kiq_buf_printf(&b, " jid=%s", ctx->jid);
            if (ctx->tags) kiq_buf_printf(&b, " tags=%s", ctx->tags);
            if (ctx->elapsed >= 0) kiq_buf_printf(&b, " elapsed=%.3f", ctx->elapsed);
        }
        kiq_buf_printf(&b, " %s: %s\n", level_name[lvl], msg);
    }
    if (b.p) {
        pthread_mutex_lock(&log_lock);
        FILE *f = log_out ? log_out : stderr;
        fwrite(b.p, 1, b.len, f);
        fflush(f);
        pthread_mutex_unlock(&log_lock);
    }
    kiq_buf_free(&b);
    errno = saved;
}
