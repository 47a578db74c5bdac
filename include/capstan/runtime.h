/* The worker runtime: a registry of C handlers and the threads that fetch,
 * run and acknowledge jobs, plus heartbeat, scheduler and signal handling.
 *
 * Typical embedding:
 *
 *   int main(int argc, char **argv) {
 *       return capstan_main(argc, argv, my_register); // capstan's CLI, my handlers
 *   }
 *
 * or, without the CLI: capstan_runtime_new(cfg) + capstan_register(...) +
 * capstan_runtime_run(rt). */
#ifndef CAPSTAN_RUNTIME_H
#define CAPSTAN_RUNTIME_H

#include "config.h"
#include "error.h"
#include "job.h"

typedef struct capstan_runtime capstan_runtime_t;

/* Per-class options given at registration. Start from CAPSTAN_CLASS_OPTS_INIT:
 * a zeroed struct means "retry: 0" (straight to the dead set). */
typedef struct capstan_class_opts {
    const char *queue; /* default queue for capstan pushes of this class, or NULL */
    int retry;         /* CAPSTAN_RETRY_UNSET, CAPSTAN_RETRY_DEFAULT (true),
                          CAPSTAN_RETRY_NONE (false) or a count N >= 0 */
    const struct capstan_unique_opts *unique; /* uniqueness lock (capstan/unique.h),
                          or NULL; must outlive the runtime. The YAML
                          classes: options and the payload's own fields
                          take precedence. */
    const struct capstan_limit_opts *limit; /* rate limit (capstan/limiter.h), or
                          NULL; must outlive the runtime. A YAML limit: for
                          the class takes precedence. */
    double timeout;    /* hard timeout in seconds, 0 = none: a job running
                          longer fails with Capstan::Timeout and its worker
                          process is replaced (supervised workers only; the
                          YAML classes: timeout takes precedence) */
} capstan_class_opts_t;

#define CAPSTAN_CLASS_OPTS_INIT { NULL, CAPSTAN_RETRY_UNSET, NULL, NULL, 0 }

/* Sidekiq's error_handlers and death_handlers. A hook gets the job, its
 * error class and message (what capstan_job_fail recorded, or the runtime's own
 * error such as NameError; all three borrowed for the call), and the udata
 * it was registered with, which must outlive the runtime.
 *   - error hooks run after every failed run, on the processor thread that
 *     ran the job (capstan_job_redis() is that thread's connection);
 *   - death hooks run once a job's retries are exhausted, after it was
 *     written to the dead set.
 * Hooks run concurrently from several threads and must not block for long.
 * capstan_job_redis() is NULL in a death hook (the connection it would give
 * may belong to another thread by then). Register before capstan_runtime_run;
 * hooks run in the order registered. Returns 0, CAPSTAN_EINVAL or CAPSTAN_ENOMEM. */
typedef void (*capstan_hook_fn)(capstan_job_t *job, const char *error_class,
                                const char *message, void *udata);
CAPSTAN_API int capstan_on_error(capstan_runtime_t *rt, capstan_hook_fn fn, void *udata);
CAPSTAN_API int capstan_on_death(capstan_runtime_t *rt, capstan_hook_fn fn, void *udata);

/* The symbol a handler plugin (loaded with -r path.so) must export. It
 * registers the plugin's classes and returns 0, or nonzero to abort start. */
#define CAPSTAN_PLUGIN_INIT "capstan_plugin_init"
typedef int (*capstan_plugin_init_fn)(capstan_runtime_t *rt);

/* Returns a new runtime that takes ownership of cfg (freed with the runtime),
 * or NULL with err (CAPSTAN_ERRLEN) filled. Nothing connects until run. */
CAPSTAN_API capstan_runtime_t *capstan_runtime_new(capstan_config_t *cfg, char *err);
CAPSTAN_API void capstan_runtime_free(capstan_runtime_t *rt);

/* Registers fn for job class cls (copied). udata is passed to fn and must
 * outlive the runtime. opts may be NULL; it is copied (opts->queue too),
 * but opts->unique and opts->limit must outlive the runtime. Registering a
 * class twice replaces the handler. Returns 0, CAPSTAN_EINVAL or CAPSTAN_ENOMEM, the
 * reason then in capstan_runtime_error (a limit's is capstan_limit_opts_check's). */
CAPSTAN_API int capstan_register(capstan_runtime_t *rt, const char *cls, capstan_handler_fn fn,
                                 void *udata, const capstan_class_opts_t *opts);

/* dlopens path (borrowed for the call) and calls its capstan_plugin_init. Returns 0 or CAPSTAN_ENOTFOUND /
 * CAPSTAN_EINVAL with err filled: for an init that returned nonzero, "plugin PATH:
 * capstan_plugin_init returned N: " and the capstan_runtime_error it left, if any
 * (cleared before the call). The library stays loaded until exit. */
CAPSTAN_API int capstan_runtime_load_plugin(capstan_runtime_t *rt, const char *path, char *err);

/* Why the last capstan_register, capstan_on_error or capstan_on_death on rt
 * was refused, in one English line, or "" when none was: what a plugin
 * init (or a program) reports when it gives up. Owned by rt, changed by the
 * next refusal; not thread-safe, as registration is not. */
CAPSTAN_API const char *capstan_runtime_error(const capstan_runtime_t *rt);

/* Runs until stopped: by TERM/INT, by a Stop from the Web UI, or by
 * capstan_runtime_stop(). Blocks TERM, INT, TSTP, TTIN and USR2 in the calling
 * thread (and so in every thread it starts) and handles them itself, and
 * ignores SIGPIPE unless the program has set a disposition for it.
 * Returns 0 after a graceful stop, or a CAPSTAN_E* code when it cannot start
 * (err filled): CAPSTAN_ECONFIG when Redis refuses the URL's password, user or
 * database, CAPSTAN_EREDIS when Redis stays unreachable for the config's
 * startup_timeout. */
CAPSTAN_API int capstan_runtime_run(capstan_runtime_t *rt, char *err);

/* Requests that return at once, safe from any thread, as the signals TSTP
 * and TERM are. quiet: the runtime finishes the jobs it runs, fetches no
 * new one and stays in "processes", marked quiet, until stopped. stop:
 * capstan_runtime_run returns after the graceful stop. */
CAPSTAN_API void capstan_runtime_quiet(capstan_runtime_t *rt);
CAPSTAN_API void capstan_runtime_stop(capstan_runtime_t *rt);

/* The process identity, "hostname:pid:12hex", as Sidekiq's API shows it:
 * the heartbeat's name in "processes" and that of the working list. Set by
 * capstan_runtime_new; owned by rt, valid until capstan_runtime_free. */
CAPSTAN_API const char *capstan_runtime_identity(const capstan_runtime_t *rt);

/* Number of processor threads still running a job when the process stopped
 * (their jobs were put back in their queues). */
CAPSTAN_API int capstan_runtime_abandoned(const capstan_runtime_t *rt);

/* Runs rt under a supervisor, as `capstan run` does unless
 * --no-supervisor: the config read and the plugins loaded, nothing
 * connected yet. The supervisor forks the worker processes (the config's
 * processes), runs no jobs itself, gives a dead worker's jobs back at once
 * and replaces it, forwards the signals, and on HUP replaces every worker
 * in turn from the binary on disk with `capstan run`'s arguments
 * argv[1..argc). Returns as fork does: in the supervisor once every worker
 * ended, with *worker 0 and the exit status to leave with; in a worker,
 * with *worker 1 and 0 (rt is that worker's: call capstan_runtime_run),
 * or a CAPSTAN_E* code with err filled (the worker should exit 1). A
 * process a reload started (CAPSTAN_WORKER_ENV in its environment) is a
 * worker at once: a program's main must leave its pidfile to its
 * supervisor then. */
#define CAPSTAN_WORKER_ENV "CAPSTAN_WORKER"
CAPSTAN_API int capstan_runtime_supervise(capstan_runtime_t *rt, int argc, char **argv, int *worker,
                                          char *err);

/* The capstan command line (run, the default, and every subcommand `capstan --help`
 * lists) with extra handlers registered by init (may be NULL). Returns the
 * process exit status. */
CAPSTAN_API int capstan_main(int argc, char **argv, capstan_plugin_init_fn init);

#endif
