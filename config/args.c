/* The flags of `capstan run`, applied over the config file. */
#include "capstan/config.h"
#include "redis/url.h"
#include "config/tls.h"
#include "support/number.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_REDIS_URL = 1000, OPT_FETCH, OPT_PREFETCH, OPT_TIMESTAMPS, OPT_LOG_FORMAT, OPT_LABEL,
       OPT_METRICS_PORT, OPT_METRICS_BIND, OPT_STARTUP_TIMEOUT, OPT_UNKNOWN_CLASS, OPT_TLS,
       OPT_PROCESSES, OPT_NO_SUPERVISOR, OPT_MAX_MEMORY };

static const struct option longopts[] = {
    { "concurrency", required_argument, NULL, 'c' },
    { "queue", required_argument, NULL, 'q' },
    { "require", required_argument, NULL, 'r' },
    { "config", required_argument, NULL, 'C' },
    { "timeout", required_argument, NULL, 't' },
    { "tag", required_argument, NULL, 'g' },
    { "environment", required_argument, NULL, 'e' },
    { "verbose", no_argument, NULL, 'v' },
    { "log-file", required_argument, NULL, 'L' },
    { "logfile", required_argument, NULL, 'L' },
    { "pidfile", required_argument, NULL, 'P' },
    { "startup-timeout", required_argument, NULL, OPT_STARTUP_TIMEOUT },
    { "help", no_argument, NULL, 'h' },
    { "redis-url", required_argument, NULL, OPT_REDIS_URL },
    { "fetch", required_argument, NULL, OPT_FETCH },
    { "prefetch", required_argument, NULL, OPT_PREFETCH },
    { "timestamps", required_argument, NULL, OPT_TIMESTAMPS },
    { "log-format", required_argument, NULL, OPT_LOG_FORMAT },
    { "label", required_argument, NULL, OPT_LABEL },
    { "metrics-port", required_argument, NULL, OPT_METRICS_PORT },
    { "metrics-bind", required_argument, NULL, OPT_METRICS_BIND },
    { "unknown-class", required_argument, NULL, OPT_UNKNOWN_CLASS },
    { "processes", required_argument, NULL, OPT_PROCESSES },
    { "no-supervisor", no_argument, NULL, OPT_NO_SUPERVISOR },
    { "max-memory", required_argument, NULL, OPT_MAX_MEMORY },
    { "tls-ca-file", required_argument, NULL, OPT_TLS },
    { "tls-ca-path", required_argument, NULL, OPT_TLS },
    { "tls-cert", required_argument, NULL, OPT_TLS },
    { "tls-key", required_argument, NULL, OPT_TLS },
    { "tls-server-name", required_argument, NULL, OPT_TLS },
    { "tls-verify", required_argument, NULL, OPT_TLS },
    { NULL, 0, NULL, 0 },
};

static const char *shortopts = "+c:q:r:C:t:g:e:vL:P:h";

const char *capstan_config_usage(void)
{
    return "Usage: capstan [run] [options]\n"
           "\n"
           "Runs the jobs of Sidekiq-format Redis queues with C handlers.\n"
           "\n"
           "  -r, --require PATH       load a handler plugin (.so); repeatable\n"
           "  -C, --config PATH        YAML config file (sidekiq.yml keys + capstan's own)\n"
           "  -c, --concurrency N      processor threads (default 10)\n"
           "      --processes N        worker processes, forked and watched by a supervisor\n"
           "                           (default 1)\n"
           "      --no-supervisor      run the worker in this process (no supervisor)\n"
           "      --max-memory SIZE    recycle a worker whose RSS exceeds SIZE (e.g. 512MB)\n"
           "  -q, --queue NAME[,W]     queue to fetch, with optional weight; repeatable\n"
           "  -t, --timeout SECONDS    shutdown grace period (default 25)\n"
           "      --startup-timeout S  give up (exit 69) when Redis stays unreachable this long\n"
           "                           at start (default 30; 0 = wait forever)\n"
           "  -g, --tag TAG            tag shown in the Web UI\n"
           "      --label LABEL        label shown in the Web UI; repeatable\n"
           "  -e, --environment ENV    section of the config file to merge\n"
           "      --redis-url URL      redis://[user:password@]host:port/db or unix:///path?db=N\n"
           "                           (default: $REDIS_URL, else redis://127.0.0.1:6379/0);\n"
           "                           rediss:// for TLS\n"
           "      --tls-ca-file PATH   CA certificates for TLS (default the system's);\n"
           "                           also --tls-ca-path DIR, --tls-cert PATH, --tls-key PATH,\n"
           "                           --tls-server-name NAME, --tls-verify none\n"
           "      --fetch MODE         reliable (default) or basic\n"
           "      --prefetch N         jobs fetched ahead at most (default 10 a processor, >= 500)\n"
           "      --timestamps FORMAT  float (Sidekiq 6/7, default) or millis (Sidekiq 8)\n"
           "      --log-format FORMAT  pretty (default) or json\n"
"      --unknown-class P    a job whose class has no handler: fail (default: NameError,\n"
           "                           retried), requeue (left in its queue for Ruby) or skip\n"
           "                           (to the dead set, not retried)\n"
           "  -L, --log-file PATH      log to PATH (reopened on USR2) instead of stderr\n"
           "  -P, --pidfile PATH       write the process id to PATH (removed at exit)\n"
           "      --metrics-port PORT  serve Prometheus metrics at http://127.0.0.1:PORT/metrics\n"
           "      --metrics-bind ADDR  address for --metrics-port (default 127.0.0.1)\n"
           "  -v, --verbose            debug logging\n"
           "  -h, --help               this help\n";
}

/* Every numeric flag: the whole word must be a finite number (an integer
 * when integer) in [lo, hi], the checks yaml.c makes on the same keys, so a
 * flag cannot set what the file may not (inf, nan, 1e400, "5s"). lo is
 * exclusive for a non-integer: "greater than 0". */
static int parse_number(const char *flag, const char *v, int integer, double lo, double hi,
                        double *out, char *err)
{
    double d = 0;
    int bad = capstan__parse_number(v, integer, lo, hi, &d) || (!integer && d == lo);
    if (bad && integer)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: must be an integer between %.0f and %.0f (got \"%s\")",
                              flag, lo, hi, v);
    if (bad)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: must be a number greater than %g (got \"%s\")", flag,
                              lo, v);
    *out = d;
    return 0;
}

static int push_str(char ***arr, size_t *n, const char *v)
{
    char **p = realloc(*arr, (*n + 1) * sizeof(char *));
    if (!p)
        return CAPSTAN_ENOMEM;
    *arr = p;
    if (!(p[*n] = strdup(v)))
        return CAPSTAN_ENOMEM;
    (*n)++;
    return 0;
}

static int apply(capstan_config_t *cfg, int opt, const char *v, char *err)
{
    double n = 0;
    int rc = 0;
    switch (opt) {
    case 'c':
        if (!(rc = parse_number("--concurrency", v, 1, 1, 1000, &n, err)))
            cfg->concurrency = (int)n;
        return rc;
    case 'q': return capstan_config_add_queue(cfg, v, err);
    case 'r': return push_str(&cfg->plugins, &cfg->nplugins, v);
    case 't': return parse_number("--timeout", v, 0, 0, HUGE_VAL, &cfg->timeout, err);
    case 'g': return capstan_config_set_str(&cfg->tag, v);
    case 'e': return capstan_config_set_str(&cfg->environment, v);
    case 'v': cfg->verbose = 1; return 0;
    case 'L': return capstan_config_set_str(&cfg->log_file, v);
    case 'P': return capstan_config_set_str(&cfg->pidfile, v);
    case OPT_STARTUP_TIMEOUT:
        if (capstan__parse_number(v, 0, 0, HUGE_VAL, &n))
            return capstan_seterr(err, CAPSTAN_ECONFIG,
                                  "--startup-timeout: must be a number >= 0 (got \"%s\")", v);
        cfg->startup_timeout = n;
        return 0;
    case OPT_PROCESSES:
        if (!(rc = parse_number("--processes", v, 1, 1, CAPSTAN_MAX_PROCESSES, &n, err)))
            cfg->processes = (int)n;
        return rc;
    case OPT_NO_SUPERVISOR: cfg->no_supervisor = 1; return 0;
    case OPT_MAX_MEMORY:
        if (capstan__parse_size(v, &cfg->max_memory))
            return capstan_seterr(err, CAPSTAN_ECONFIG,
                                  "--max-memory: must be a size such as 512MB or 2GB (got \"%s\")", v);
        return 0;
    case OPT_LABEL: return push_str(&cfg->labels, &cfg->nlabels, v);
    case OPT_METRICS_PORT:
        if (!(rc = parse_number("--metrics-port", v, 1, 1, 65535, &n, err)))
            cfg->metrics_port = (int)n;
        return rc;
    case OPT_METRICS_BIND: return capstan_config_set_str(&cfg->metrics_bind, v);
    case OPT_REDIS_URL:
        cfg->redis_url_explicit = 1;
        return capstan_config_set_str(&cfg->redis_url, v);
    case OPT_PREFETCH:
        if (!(rc = parse_number("--prefetch", v, 1, 0, 100000, &n, err)))
            cfg->prefetch = (int)n;
        return rc;
    case OPT_FETCH:
        if (strcmp(v, "reliable") == 0) cfg->fetch = CAPSTAN_FETCH_RELIABLE;
        else if (strcmp(v, "basic") == 0) cfg->fetch = CAPSTAN_FETCH_BASIC;
        else return capstan_seterr(err, CAPSTAN_ECONFIG, "--fetch: must be reliable or basic (got \"%s\")", v);
        return 0;
    case OPT_TIMESTAMPS:
        if (strcmp(v, "float") == 0) cfg->timestamps = CAPSTAN_TS_FLOAT;
        else if (strcmp(v, "millis") == 0) cfg->timestamps = CAPSTAN_TS_MILLIS;
        else return capstan_seterr(err, CAPSTAN_ECONFIG, "--timestamps: must be float or millis (got \"%s\")", v);
        return 0;
    case OPT_UNKNOWN_CLASS:
        if (capstan_config_unknown_class(v, &cfg->unknown_class))
            return capstan_seterr(err, CAPSTAN_ECONFIG,
                                  "--unknown-class: must be fail, requeue or skip (got \"%s\")", v);
        cfg->unknown_class_explicit = 1;
        return 0;
    case OPT_LOG_FORMAT:
        if (strcmp(v, "pretty") == 0) cfg->log_format = CAPSTAN_LOG_PRETTY;
        else if (strcmp(v, "json") == 0) cfg->log_format = CAPSTAN_LOG_JSON;
        else return capstan_seterr(err, CAPSTAN_ECONFIG, "--log-format: must be pretty or json (got \"%s\")", v);
        return 0;
    default:
        return 0;
    }
}

int capstan_config_parse_args(capstan_config_t *cfg, int argc, char **argv, char *err)
{
    const char *file = NULL;
    int opt, rc = 0;
    /* Pass 1: the file and environment, which the flags then override. */
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (opt == 'C')
            file = optarg;
        else if (opt == 'e' && (rc = capstan_config_set_str(&cfg->environment, optarg)))
            return rc;
        else if (opt == 'h')
            return CAPSTAN_ENOTFOUND;
        else if (opt == '?')
            return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: unknown option or missing value (see --help)",
                                  argv[optind - 1]);
    }
    if (optind < argc) {
        /* A stray URL may hold a password: never echo it. */
        char shown[512];
        capstan__redis_url_redact(argv[optind], shown, sizeof(shown));
        return capstan_seterr(err, CAPSTAN_ECONFIG, "unexpected argument \"%s\" (see --help)", shown);
    }
    /* A -C file that cannot be read is a configuration error (78), said in
     * one line, never mistaken for --help. */
    if (file && (rc = capstan_config_load_file(cfg, file, err)) == CAPSTAN_ENOTFOUND) {
        char reason[CAPSTAN_ERRLEN];
        snprintf(reason, sizeof(reason), "%s", err);
        return capstan_seterr(err, CAPSTAN_ECONFIG, "cannot read the config file %s", reason);
    }
    if (rc)
        return rc;
    /* Pass 2: every flag, in order. Queues given as flags replace the
     * file's (capstan_config_add_queue's first call starts a new list). */
    optind = 1;
    int idx = -1;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, &idx)) != -1) {
        if (opt == 'C' || opt == 'e')
            continue;
        if (opt == OPT_TLS)
            rc = capstan__config_tls_flag(cfg, longopts[idx].name, optarg, err);
        else
            rc = apply(cfg, opt, optarg, err);
        if (rc)
            return rc;
    }
    capstan_config_apply_env(cfg);
    return 0;
}
