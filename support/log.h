/* Logging in Sidekiq's line format or JSON, safe from any thread.
 *
 *   2026-11-21T23:09:49.756Z pid=11252 tid=97o class=OkJob jid=6cd… elapsed=0.0 INFO: done
 *
 * (with trace_id=<32 hex> after the jid and tags of a job pushed with a
 * W3C traceparent, so a log search finds the job's lines by its trace).
 *
 * The logger is process-wide: `capstan run` configures it once at start
 * (cli/run.c); until then, and in a program that does not, lines go to
 * stderr at INFO. */
#ifndef CAPSTAN_SUPPORT_LOG_H
#define CAPSTAN_SUPPORT_LOG_H

#include "capstan/config.h"

typedef enum { CAPSTAN_DEBUG = 0, CAPSTAN_INFO, CAPSTAN_WARN, CAPSTAN_ERROR } capstan_level_t;

/* Job context printed after pid/tid; any field may be NULL, elapsed < 0
 * means absent. */
typedef struct capstan_logctx {
    const char *cls;
    const char *jid;
    const char *tags;   /* already joined with ',' */
    const char *trace_id; /* W3C trace id (32 hex) of the job's traceparent */
    double elapsed;
} capstan_logctx_t;

/* Sets format, minimum level and destination (NULL = stderr). Returns 0 or
 * CAPSTAN_ESYS when the file cannot be opened (the old destination stays). */
int capstan__log_setup(capstan_log_format_t fmt, int verbose, const char *path);
/* Writes every thread's batched job lines now (see log.c). */
void capstan__log_flush(void);
/* In a child after fork: its lines carry its own pid from now on. */
void capstan__log_forked(void);
/* Reopens the log file (after rotation; USR2). */
int capstan__log_reopen(void);
void capstan__log_close(void);

/* The descriptor log lines go to (2 for stderr). Async-signal-safe: the
 * crash handler writes its report there with write(2). */
int capstan__log_fd(void);

/* Names this thread in log lines; by default tid is base36(thread id ^ pid). */
const char *capstan__log_tid(void);
/* Names the shard the calling thread serves (name outlives the thread;
 * NULL: none): its lines then say shard=NAME after the tid, "shard" in
 * JSON, so an error of a shard's connection names the shard. */
void capstan__log_shard(const char *name);

void capstan__log(capstan_level_t lvl, const capstan_logctx_t *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define capstan_info(...) capstan__log(CAPSTAN_INFO, NULL, __VA_ARGS__)
#define capstan_warn(...) capstan__log(CAPSTAN_WARN, NULL, __VA_ARGS__)
#define capstan_error(...) capstan__log(CAPSTAN_ERROR, NULL, __VA_ARGS__)
#define capstan_debug(...) capstan__log(CAPSTAN_DEBUG, NULL, __VA_ARGS__)

/* The name a signal is logged under, as Sidekiq names them ("TERM",
 * "TSTP", ...; "?" for one it does not name). */
const char *capstan__sig_name(int sig);

#endif
