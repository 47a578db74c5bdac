/* The worker runtime: a registry of C handlers and the threads that fetch,
 * run and acknowledge jobs, plus heartbeat, scheduler and signal handling.
 *
 * Typical embedding:
 *
 *   int main(int argc, char **argv) {
 *       return kiq_main(argc, argv, my_register);   // kiq's CLI, my handlers
 *   }
 *
 * or, without the CLI: kiq_runtime_new(cfg) + kiq_register(...) +
 * kiq_runtime_run(rt). */
#ifndef KIQ_RUNTIME_H
#define KIQ_RUNTIME_H

#include "config.h"
#include "error.h"
#include "job.h"

typedef struct kiq_runtime kiq_runtime_t;

/* Per-class options given at registration. Start from KIQ_CLASS_OPTS_INIT:
 * a zeroed struct means "retry: 0" (straight to the dead set). */
typedef struct kiq_class_opts {
    const char *queue; /* default queue for kiq pushes of this class, or NULL */
    int retry;         /* KIQ_RETRY_UNSET, KIQ_RETRY_DEFAULT (true),
                          KIQ_RETRY_NONE (false) or a count N >= 0 */
    const struct kiq_unique_opts *unique; /* uniqueness lock (kiq/unique.h),
                          or NULL; must outlive the runtime. The YAML
                          classes: options and the payload's own fields
                          take precedence. */
    const struct kiq_limit_opts *limit; /* rate limit (kiq/limiter.h), or
                          NULL; must outlive the runtime. A YAML limit: for
                          the class takes precedence. */
} kiq_class_opts_t;

#define KIQ_CLASS_OPTS_INIT { NULL, KIQ_RETRY_UNSET, NULL, NULL }

/* Sidekiq's error_handlers and death_handlers. A hook gets the job, its
 * error class and message (what kiq_job_fail recorded, or the runtime's own
 * error such as NameError), and the udata it was registered with.
 *   - error hooks run after every failed run, on the processor thread that
 *     ran the job (kiq_job_redis() is that thread's connection);
 *   - death hooks run once a job's retries are exhausted, after it was
 *     written to the dead set.
 * Hooks run concurrently from several threads and must not block for long.
 * kiq_job_redis() is NULL in a death hook (the connection it would give
 * may belong to another thread by then). Register before kiq_runtime_run;
 * hooks run in the order registered. Returns 0, KIQ_EINVAL or KIQ_ENOMEM. */
typedef void (*kiq_hook_fn)(kiq_job_t *job, const char *error_class,
                            const char *message, void *udata);
KIQ_API int kiq_on_error(kiq_runtime_t *rt, kiq_hook_fn fn, void *udata);
KIQ_API int kiq_on_death(kiq_runtime_t *rt, kiq_hook_fn fn, void *udata);

/* The symbol a handler plugin (loaded with -r path.so) must export. It
 * registers the plugin's classes and returns 0, or nonzero to abort start. */
#define KIQ_PLUGIN_INIT "kiq_plugin_init"
typedef int (*kiq_plugin_init_fn)(kiq_runtime_t *rt);

/* Returns a new runtime that takes ownership of cfg (freed with the runtime),
 * or NULL with err (KIQ_ERRLEN) filled. Nothing connects until run. */
KIQ_API kiq_runtime_t *kiq_runtime_new(kiq_config_t *cfg, char *err);
KIQ_API void kiq_runtime_free(kiq_runtime_t *rt);

/* Registers fn for job class cls (copied). opts may be NULL. Registering a
 * class twice replaces the handler. Returns 0, KIQ_EINVAL (kiq_limit_opts_check
 * says why a limit is refused) or KIQ_ENOMEM. */
KIQ_API int kiq_register(kiq_runtime_t *rt, const char *cls, kiq_handler_fn fn,
                         void *udata, const kiq_class_opts_t *opts);

/* dlopens path and calls its kiq_plugin_init. Returns 0 or KIQ_ENOTFOUND /
 * KIQ_EINVAL with err filled. The library stays loaded until exit. */
KIQ_API int kiq_runtime_load_plugin(kiq_runtime_t *rt, const char *path, char *err);

/* Runs until stopped: by TERM/INT, by a Stop from the Web UI, or by
 * kiq_runtime_stop(). Blocks TERM, INT, TSTP, TTIN and USR2 in the calling
 * thread (and so in every thread it starts) and handles them itself, and
 * ignores SIGPIPE unless the program has set a disposition for it.
 * Returns 0 after a graceful stop, or a KIQ_E* code when it cannot start
 * (err filled): KIQ_ECONFIG when Redis refuses the URL's password, user or
 * database, KIQ_EREDIS when Redis stays unreachable for the config's
 * startup_timeout. */
KIQ_API int kiq_runtime_run(kiq_runtime_t *rt, char *err);

/* Thread-safe requests, as the signals TSTP and TERM do. */
KIQ_API void kiq_runtime_quiet(kiq_runtime_t *rt);
KIQ_API void kiq_runtime_stop(kiq_runtime_t *rt);

/* The process identity, "hostname:pid:12hex", as Sidekiq's API shows it. */
KIQ_API const char *kiq_runtime_identity(const kiq_runtime_t *rt);

/* Number of processor threads still running a job when the process stopped
 * (their jobs were put back in their queues). */
KIQ_API int kiq_runtime_abandoned(const kiq_runtime_t *rt);

/* The kiq command line (run, the default, and every subcommand `kiq --help`
 * lists) with extra handlers registered by init (may be NULL). Returns the
 * process exit status. */
KIQ_API int kiq_main(int argc, char **argv, kiq_plugin_init_fn init);

#endif
