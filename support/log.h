/* Logging in Sidekiq's line format or JSON, safe from any thread.
 *
 *   2026-11-21T23:09:49.756Z pid=11252 tid=97o class=OkJob jid=6cd… elapsed=0.0 INFO: done
 *
 * The logger is process-wide: the runtime configures it once at start. */
#ifndef KIQ_SUPPORT_LOG_H
#define KIQ_SUPPORT_LOG_H

#include "kiq/config.h"

typedef enum { KIQ_DEBUG = 0, KIQ_INFO, KIQ_WARN, KIQ_ERROR } kiq_level_t;

/* Job context printed after pid/tid; any field may be NULL, elapsed < 0
 * means absent. */
typedef struct kiq_logctx {
    const char *cls;
    const char *jid;
    const char *tags;   /* already joined with ',' */
    double elapsed;
} kiq_logctx_t;

/* Sets format, minimum level and destination (NULL = stderr). Returns 0 or
 * KIQ_ESYS when the file cannot be opened (the old destination stays). */
int kiq__log_setup(kiq_log_format_t fmt, int verbose, const char *path);
/* Writes every thread's batched job lines now (see log.c). */
void kiq__log_flush(void);
/* Reopens the log file (after rotation; USR2). */
int kiq__log_reopen(void);
void kiq__log_close(void);

/* The descriptor log lines go to (2 for stderr). Async-signal-safe: the
 * crash handler writes its report there with write(2). */
int kiq__log_fd(void);

/* Names this thread in log lines; by default tid is base36(thread id ^ pid). */
const char *kiq__log_tid(void);

void kiq__log(kiq_level_t lvl, const kiq_logctx_t *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define kiq_info(...) kiq__log(KIQ_INFO, NULL, __VA_ARGS__)
#define kiq_warn(...) kiq__log(KIQ_WARN, NULL, __VA_ARGS__)
#define kiq_error(...) kiq__log(KIQ_ERROR, NULL, __VA_ARGS__)
#define kiq_debug(...) kiq__log(KIQ_DEBUG, NULL, __VA_ARGS__)

#endif
