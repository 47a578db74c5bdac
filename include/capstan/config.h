/* Configuration: defaults, the YAML file and command-line flags, merged into
 * one struct that the runtime reads.
 *
 * Precedence: flags > file (environment section > top level) > defaults.
 * Errors name the file, line and key, e.g.
 *   "capstan.yml:7: concurrency: must be an integer between 1 and 1000". */
#ifndef CAPSTAN_CONFIG_H
#define CAPSTAN_CONFIG_H

#include <stddef.h>
#include "error.h"
#include "limiter.h"

/* Exit status of the capstan binary for a bad configuration (EX_CONFIG): a bad
 * file, flag or URL, or Redis refusing the password, user or database, or
 * being a Redis Cluster node. */
#define CAPSTAN_EXIT_CONFIG 78
/* Exit status when Redis stays unreachable for startup_timeout
 * (EX_UNAVAILABLE). */
#define CAPSTAN_EXIT_UNAVAILABLE 69

/* retry option values besides a plain count N >= 0. */
/* The most worker processes one supervisor forks (processes:). */
#define CAPSTAN_MAX_PROCESSES 256

#define CAPSTAN_RETRY_DEFAULT (-1) /* retry: true, use max_retries */
#define CAPSTAN_RETRY_NONE (-2) /* retry: false, drop after failure */
#define CAPSTAN_RETRY_UNSET (-3) /* option not given */

typedef enum { CAPSTAN_FETCH_RELIABLE = 0, CAPSTAN_FETCH_BASIC = 1 } capstan_fetch_mode_t;
typedef enum { CAPSTAN_TS_FLOAT = 0, CAPSTAN_TS_MILLIS = 1 } capstan_ts_format_t;
typedef enum { CAPSTAN_LOG_PRETTY = 0, CAPSTAN_LOG_JSON = 1 } capstan_log_format_t;
/* What happens to a job whose class has no handler (unknown_class):
 * FAIL as Sidekiq does (NameError, retried, then dead); REQUEUE leaves it
 * untouched at the back of its queue for a Ruby process; SKIP sends it to
 * the dead set at once with a NameError, never retried. */
typedef enum { CAPSTAN_UNKNOWN_FAIL = 0, CAPSTAN_UNKNOWN_REQUEUE = 1, CAPSTAN_UNKNOWN_SKIP = 2 } capstan_unknown_class_t;

typedef struct capstan_queue_conf {
    char *name;  /* queue name without "queue:" */
    int weight;  /* 0 = no weight given */
} capstan_queue_conf_t;

/* sidekiq-limit_fetch's caps on a queue: how many of its jobs run at once
 * across every capstan process on the Redis (`:limits:`) and in one
 * process (`:process_limits:`). */
typedef struct capstan_queue_limit {
    char *queue; /* queue name without "queue:" */
    int limit;         /* 0 = none */
    int process_limit; /* 0 = none */
} capstan_queue_limit_t;

typedef struct capstan_class_conf {
    char *name;  /* job class */
    char *queue; /* default queue for pushes of this class, or NULL */
    int retry;   /* N >= 0, or CAPSTAN_RETRY_DEFAULT/NONE/UNSET */
    /* Uniqueness (capstan/unique.h); zero or NULL = not set. unique_for and
     * unique_until are mapped onto lock and lock_ttl when read, and
     * unique_for is set: the lock is Enterprise's, whose copies enqueued
     * before the first one let it go are refused too. */
    int unique_for;
    char *lock;                /* lock type name, checked when read */
    long lock_ttl;             /* seconds */
    long lock_timeout;         /* seconds */
    int lock_limit;
    char *lock_prefix;
    int *lock_args;            /* indexes of args making lock_args */
    size_t nlock_args;
    char *on_conflict_client;  /* strategy names, checked when read */
    char *on_conflict_server;
    int unique_across_queues;
    int unique_across_workers;
    double schedule_in;        /* reschedule delay in seconds */
    capstan_limit_opts_t limit; /* rate limit, checked when read; its name
                                * is owned (free((char *)limit.name)) */
    char *limit_shard;          /* the limit's shard: with shards, the one its
                                   state lives in (else the pick of its
                                   name), or NULL; owned */
    /* max_limiter_reschedules when the file gives it: it applies to the
     * class's limit declared in C (capstan_class_opts_t) too. */
    int has_max_limiter_reschedules;
    int max_limiter_reschedules;
    long max_iteration_runtime; /* seconds an iterating run goes on before it
                                   is interrupted and re-queued; 0 = the
                                   process's setting */
    long timeout;              /* hard timeout in seconds (supervised
                                  workers only), 0 = none */
} capstan_class_conf_t;

/* TLS settings for a rediss:// URL given apart from it (the file's tls:
 * mapping, --tls-* flags); names as redis-rb's ssl_params. NULL/0 = unset. */
typedef struct capstan_tls_conf {
    char *ca_file;       /* CA certificates (PEM); default the system's ($SSL_CERT_FILE) */
    char *ca_path;       /* directory of hashed CA certificates ($SSL_CERT_DIR) */
    char *cert;          /* client certificate, for mutual TLS */
    char *key;           /* its private key (PEM, not encrypted) */
    char *server_name;   /* SNI and the name verified; default the URL's host */
    int verify_none;     /* no certificate checks at all (warned at start) */
} capstan_tls_conf_t;

/* One Redis shard of a sharded fleet (the file's shards: list): a
 * complete Sidekiq-format Redis of its own, with the connection settings a
 * redis_url has. */
typedef struct capstan_shard_conf {
    char *name;               /* a plain word, unique in the list */
    char *redis_url;          /* as the top-level redis_url; the top-level tls:
                                 settings are carried into it when it speaks TLS */
    char **queues;            /* the shard's own queues (weights from the
                                 top-level list); NULL = every queue */
    size_t nqueues;
} capstan_shard_conf_t;

typedef struct capstan_config {
    char *redis_url;          /* default redis://127.0.0.1:6379/0; with shards,
                                 the first shard's (capstan_config_validate) */
    int concurrency;          /* processor threads, default 10 */
    capstan_queue_conf_t *queues; /* default one queue "default" */
    size_t nqueues;
    int strict;               /* derived: 1 when no queue has a weight */
    double timeout;           /* shutdown grace in seconds, default 25 */
    double startup_timeout;   /* seconds to wait for an unreachable Redis at
                                 start before giving up, default 30; 0 = forever */
    char *tag;                /* "" by default */
    char **labels;
    size_t nlabels;
    char *environment;        /* -e; selects a section of the YAML file */
    int max_retries;          /* default 25 */
    long dead_max_jobs;       /* default 10000 */
    long dead_timeout;        /* seconds, default 180 days */
    double poll_interval_average;   /* 0 = scale with process count */
    double average_scheduled_poll_interval; /* default 5 */
    double heartbeat_interval;      /* seconds, default 5 */
    double max_iteration_runtime;   /* seconds an iterating run (capstan_job_checkpoint)
                                       goes on before it is interrupted and
                                       re-queued; 0 = no limit (the default) */
    double recovery_interval;       /* seconds between orphan passes, default 60 */
    int max_recoveries;             /* poison-pill limit, default 3 */
    char **plugins;           /* shared objects to load (-r) */
    size_t nplugins;
    capstan_class_conf_t *classes;
    size_t nclasses;
    capstan_queue_limit_t *queue_limits; /* the file's :limits: and :process_limits: */
    size_t nqueue_limits;
    capstan_fetch_mode_t fetch;
    int prefetch;             /* reliable fetch: jobs fetched ahead and not yet
                                 started, at most; 0 = 10 per processor, at
                                 least 500 */
    capstan_ts_format_t timestamps;
    /* Sidekiq's execution metrics (the Web UI's Metrics tab), written once a
     * heartbeat: 1 the 7.x layout, 2 the 8.x layout, 3 both (the default),
     * 0 none. The file's sidekiq_metrics: both, 7, 8 or off. */
    int sidekiq_metrics;
    capstan_log_format_t log_format;
    capstan_unknown_class_t unknown_class; /* default CAPSTAN_UNKNOWN_FAIL */
    int unknown_class_explicit; /* 1 once a file or flag set unknown_class (a
                                 program that sets it sets this too): left at
                                 0, the runtime uses requeue on the queues a
                                 Ruby Sidekiq process reads too */
    char *log_file;           /* NULL = stderr */
    char *pidfile;            /* written at start, removed at exit; NULL = none */
    char **warnings;          /* "file:line: key: problem" for keys of the file
                                 capstan does not use, for the caller to log */
    size_t nwarnings;
    int verbose;
    char *config_file;        /* the -C path, if any */
    int redis_url_explicit;   /* 1 once a file or flag set redis_url, so env vars yield */
    int queues_from_flags;    /* 1 after the first capstan_config_add_queue call */
    double liveness_ttl;      /* seconds the fetch liveness key lives, default 60
                                 (v9's value); refreshed every heartbeat_interval,
                                 which must be at most a third of it */
    double reaper_interval;   /* seconds between uniqueness reaper runs, default
                                 600 as v9; 0 disables the reaper */
    long reaper_count;        /* most digests one run removes, default 1000 */
    double reaper_timeout;    /* seconds one run may work, default 10 */
    int metrics_port;         /* serve GET /metrics on this port; 0 (default) = off */
    char *metrics_bind;       /* address for it; NULL = 127.0.0.1 (not exposed) */
    capstan_tls_conf_t tls;   /* moved into redis_url's query by capstan_config_validate,
                                 where every connection reads them */
    int min_replicas_ack;     /* after writing acks, WAIT for this many replicas
                                 to have them; 0 (default) = do not wait */
    long min_replicas_timeout; /* milliseconds that WAIT may take, default 1000 */
    struct capstan_periodic_conf *periodic; /* schedules (capstan/periodic.h) */
    size_t nperiodic;
    int processes;            /* worker processes the supervisor forks, default 1 */
    int no_supervisor;        /* 1: run the worker in this process, no supervisor */
    long long max_memory;     /* bytes of RSS a supervised worker may reach before
                                 it is recycled; 0 (default) = no limit */
    capstan_shard_conf_t *shards; /* the shards served at once; none (the
                                 default) = the one redis_url */
    size_t nshards;
} capstan_config_t;

/* Returns a new config holding the defaults, owned by the caller (free with
 * capstan_config_free), or NULL when out of memory. */
CAPSTAN_API capstan_config_t *capstan_config_new(void);
CAPSTAN_API void capstan_config_free(capstan_config_t *cfg);

/* Merges the YAML file at path into cfg: values in the file replace what cfg
 * holds, and cfg->config_file becomes a copy of path. On error returns CAPSTAN_ECONFIG or
 * CAPSTAN_EPARSE and writes "path:line: key: problem" into err (CAPSTAN_ERRLEN), or
 * CAPSTAN_ENOTFOUND with "path: reason" when the file cannot be opened; cfg may
 * then hold part of the file, since the caller exits on a bad config. Keys
 * that Sidekiq or its plugins use and capstan does not are not errors: each adds
 * a line to cfg->warnings. */
CAPSTAN_API int capstan_config_load_file(capstan_config_t *cfg, const char *path, char *err);

/* The environment whose section of the file applies, as Sidekiq picks it:
 * cfg->environment (-e), else $APP_ENV, $RAILS_ENV, $RACK_ENV, else
 * "development". Borrowed. */
CAPSTAN_API const char *capstan_config_environment(const capstan_config_t *cfg);

/* Applies REDIS_URL (or the variable named by REDIS_PROVIDER) when no URL
 * was configured explicitly (cfg->redis_url_explicit, which whoever sets
 * redis_url from a file or flag also sets). */
CAPSTAN_API void capstan_config_apply_env(capstan_config_t *cfg);

/* Adds a queue from a "name" or "name,weight" word (flag syntax). The first
 * call replaces the current list (defaults or file), later calls append, so
 * repeated -q flags build one list. Returns CAPSTAN_ECONFIG with err filled on a
 * bad word or a duplicate queue; cfg is unchanged on error. */
CAPSTAN_API int capstan_config_add_queue(capstan_config_t *cfg, const char *word, char *err);

/* Appends queue name (copied) with weight (0 = none) to cfg->queues.
 * Returns CAPSTAN_ECONFIG and "queue NAME is given twice" in err for a
 * duplicate, CAPSTAN_ENOMEM when out of memory; cfg is unchanged on error. */
CAPSTAN_API int capstan_config_append_queue(capstan_config_t *cfg, const char *name,
                                            int weight, char *err);

/* Appends a shard called name (a plain word, not yet in the list) at url,
 * reading queues[0..nqueues) only (nqueues 0: every queue). Copies all.
 * Returns 0, CAPSTAN_ECONFIG with err filled, or CAPSTAN_ENOMEM; cfg is
 * unchanged on error. */
CAPSTAN_API int capstan_config_add_shard(capstan_config_t *cfg, const char *name, const char *url,
                                         const char *const *queues, size_t nqueues, char *err);

/* Checks ranges and derives cfg->strict; moves cfg->tls into redis_url
 * (which must then be rediss://), or with shards into each shard's URL
 * that speaks TLS, and makes the first shard's URL cfg->redis_url.
 * Returns CAPSTAN_ECONFIG with err filled. */
CAPSTAN_API int capstan_config_validate(capstan_config_t *cfg, char *err);

/* The options given for a class, or NULL. Borrowed from cfg. */
CAPSTAN_API const capstan_class_conf_t *capstan_config_class(const capstan_config_t *cfg,
                                                             const char *name);

/* Parses the flags of `capstan run` (argv[0] is the command name): -C is read
 * first, then every flag overrides the file, then capstan_config_apply_env
 * runs. Returns 0, CAPSTAN_ENOTFOUND for --help (the caller prints
 * capstan_config_usage()), or CAPSTAN_ECONFIG / CAPSTAN_EPARSE with err
 * filled (a -C file that cannot be read is CAPSTAN_ECONFIG). */
CAPSTAN_API int capstan_config_parse_args(capstan_config_t *cfg, int argc, char **argv, char *err);
/* The help text of `capstan run`'s flags (static). */
CAPSTAN_API const char *capstan_config_usage(void);

/* Parses "fail", "requeue" or "skip" into *out. Returns 0 or CAPSTAN_ECONFIG. */
CAPSTAN_API int capstan_config_unknown_class(const char *word, capstan_unknown_class_t *out);
/* The word for a policy ("fail", "requeue", "skip"; static). */
CAPSTAN_API const char *capstan_config_unknown_class_name(capstan_unknown_class_t v);

/* Replaces *slot (freeing the old string) with a copy of value (NULL
 * clears it); the struct that holds *slot owns the copy. Returns 0, or
 * CAPSTAN_ENOMEM with *slot unchanged. */
CAPSTAN_API int capstan_config_set_str(char **slot, const char *value);

#endif
