/* `capstan push CLASS [ARGS_JSON] [-C FILE] [-q Q] [--in S | --at T]
 * [--retry N|false] [--expires-in S]`: pushes one job with capstan's client and prints its jid.
 * The classes: section of FILE gives the class's retry, queue and lock
 * options, as a worker's sidekiq_options do for Ruby's client, and its
 * min_replicas_ack makes the push wait for the replicas (a shortfall is a
 * warning: the job was pushed). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "config/names.h"
#include "support/number.h"
#include "capstan/capstan.h"
#include "capstan/unique.h"

static const char *usage =
    "Usage: capstan push CLASS [ARGS_JSON] [options]\n"
    "\n"
    "Pushes one job and prints its jid. ARGS_JSON is a JSON array (default []).\n"
    "\n"
    "  -C, --config FILE       read the class's retry, queue and lock options (and\n"
    "                          redis_url) from FILE's classes: section; with\n"
    "                          min_replicas_ack: N, wait for N replicas to have it\n"
    "  -q, --queue NAME        queue (default: the class's, else \"default\"); not\n"
    "                          empty and without spaces, as for capstan run\n"
    "      --in SECONDS        run it this many seconds from now\n"
    "      --at EPOCH          run it at this Unix time (seconds)\n"
    "      --retry N|true|false  retry option written into the payload\n"
    "      --expires-in S      drop it unrun if it has not started S seconds after it\n"
    "                          is due (writes expires_at)\n"
    "      --timestamps FORMAT float (default) or millis\n"
    "      --lock TYPE         take a uniqueness lock (until_executed, until_executing,\n"
    "                          until_expired, while_executing, until_and_while_executing)\n"
    "      --lock-ttl S        lock expiry in seconds (extended by --in/--at)\n"
    "      --lock-timeout S    seconds a while_executing job waits for its lock\n"
    "      --on-conflict NAME  log (default), raise, reject, replace or reschedule;\n"
    "                          a denied push exits with status 3\n"
    "      --redis-url URL     default: $REDIS_URL, else redis://127.0.0.1:6379/0\n"
    "  -h, --help              this help\n";

enum { OPT_IN = 1000, OPT_AT, OPT_RETRY, OPT_URL, OPT_TS, OPT_LOCK, OPT_LOCK_TTL,
       OPT_LOCK_TIMEOUT, OPT_ON_CONFLICT, OPT_EXPIRES_IN };

int capstan__cmd_push(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "config", required_argument, NULL, 'C' }, { "queue", required_argument, NULL, 'q' }, { "in", required_argument, NULL, OPT_IN },
        { "at", required_argument, NULL, OPT_AT }, { "retry", required_argument, NULL, OPT_RETRY },
        { "redis-url", required_argument, NULL, OPT_URL },
        { "timestamps", required_argument, NULL, OPT_TS },
        { "lock", required_argument, NULL, OPT_LOCK },
        { "lock-ttl", required_argument, NULL, OPT_LOCK_TTL },
        { "lock-timeout", required_argument, NULL, OPT_LOCK_TIMEOUT },
        { "on-conflict", required_argument, NULL, OPT_ON_CONFLICT },
        { "expires-in", required_argument, NULL, OPT_EXPIRES_IN },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    capstan_push_opts_t o = capstan_push_opts_default();
    capstan_unique_opts_t uo = CAPSTAN_UNIQUE_OPTS_INIT;
    int lock_opts = 0;
    const char *url = NULL, *conf = NULL;
    double in = 0, at = 0;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "C:q:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': conf = optarg; break;
        case 'q': o.queue = optarg; break;
        case OPT_URL: url = optarg; break;
        case OPT_IN:
            if (capstan__parse_number(optarg, 0, 0, HUGE_VAL, &in)) {
                fprintf(stderr, "capstan push: --in: not a number of seconds: %s\n", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_AT:
            if (capstan__parse_number(optarg, 0, 1e9, HUGE_VAL, &at)) {
                fprintf(stderr, "capstan push: --at: not an epoch time in seconds: %s\n", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_EXPIRES_IN:
            if (capstan__parse_number(optarg, 0, 0, 1e9, &o.expires_in) || !(o.expires_in > 0)) {
                fprintf(stderr, "capstan push: --expires-in: not a number of seconds > 0: %s\n", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_RETRY:
            if (strcmp(optarg, "false") == 0) o.retry = CAPSTAN_RETRY_NONE;
            else if (strcmp(optarg, "true") == 0) o.retry = CAPSTAN_RETRY_DEFAULT;
            else {
                double n;
                if (capstan__parse_number(optarg, 1, 0, 1000000, &n)) {
                    fprintf(stderr, "capstan push: --retry: must be a count, true or false: %s\n", optarg);
                    return CAPSTAN_EXIT_USAGE;
                }
                o.retry = (int)n;
            }
            break;
        case OPT_TS:
            if (strcmp(optarg, "millis") == 0) o.timestamps = CAPSTAN_TS_MILLIS;
            else if (strcmp(optarg, "float") != 0) {
                fprintf(stderr, "capstan push: --timestamps: float or millis\n");
                return CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_LOCK:
            if (capstan_lock_type_parse(optarg, &uo.lock)) {
                fprintf(stderr, "capstan push: --lock: unknown lock type %s\n", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_LOCK_TTL:
        case OPT_LOCK_TIMEOUT: {
            double v;
            if (capstan__parse_number(optarg, 1, 0, 100000000, &v)) {
                fprintf(stderr, "capstan push: --%s: not a number of seconds >= 0: %s\n",
                        opt == OPT_LOCK_TTL ? "lock-ttl" : "lock-timeout", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            *(opt == OPT_LOCK_TTL ? &uo.lock_ttl : &uo.lock_timeout) = (long)v;
            lock_opts = 1;
            break;
        }
        case OPT_ON_CONFLICT:
            if (capstan_on_conflict_parse(optarg, &uo.on_conflict_client)) {
                fprintf(stderr, "capstan push: --on-conflict: unknown strategy %s "
                                "(log, raise, reject, replace, reschedule)\n", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            uo.on_conflict_server = uo.on_conflict_client;
            lock_opts = 1;
            break;
        case 'h': fputs(usage, stdout); return 0;
        default:
            fprintf(stderr, "capstan push: %s: unknown option or missing value\n\n%s", argv[optind - 1], usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    if (optind >= argc || argc - optind > 2) {
        fputs(usage, stderr);
        return CAPSTAN_EXIT_USAGE;
    }
    char err[CAPSTAN_ERRLEN], jid[25];
    if (o.queue && capstan__config_queue_name_check(o.queue, err)) {
        fprintf(stderr, "capstan push: --queue: %s\n", err);
        return CAPSTAN_EXIT_USAGE;
    }
    if (in > 0 && at > 0) {
        fprintf(stderr, "capstan push: give --in or --at, not both\n");
        return CAPSTAN_EXIT_USAGE;
    }
    if (lock_opts && uo.lock == CAPSTAN_LOCK_NONE) {
        fprintf(stderr, "capstan push: --lock-ttl, --lock-timeout and --on-conflict need --lock\n");
        return CAPSTAN_EXIT_USAGE;
    }
    if (uo.lock != CAPSTAN_LOCK_NONE)
        o.unique = &uo;
    const char *cls = argv[optind];
    const char *args = optind + 1 < argc ? argv[optind + 1] : "[]";
    o.at = at > 0 ? at : in; /* the client reads small values as "from now" */
    capstan_config_t *cfg = conf ? capstan_config_new() : NULL;
    if (conf && (!cfg || capstan_config_load_file(cfg, conf, err))) {
        fprintf(stderr, "capstan push: %s\n", cfg ? err : "out of memory");
        capstan_config_free(cfg);
        return CAPSTAN_EXIT_CONFIG;
    }
    if (!url && cfg && cfg->redis_url_explicit)
        url = cfg->redis_url;
    capstan_client_t *c = capstan_client_new(capstan__cli_redis_url(url), err);
    if (!c) {
        fprintf(stderr, "capstan push: %s\n", err);
        capstan_config_free(cfg);
        return 1;
    }
    capstan_client_use_config(c, cfg);
    int rc = capstan_client_push(c, cls, args, &o, jid), status = 0;
    if (rc == CAPSTAN_EDENIED) {
        fprintf(stderr, "capstan push: denied: %s\n", capstan_client_error(c));
        status = CAPSTAN_EXIT_DENIED;
    } else if (rc < 0) {
        fprintf(stderr, "capstan push: %s\n", capstan_client_error(c));
        status = rc == CAPSTAN_EINVAL ? CAPSTAN_EXIT_USAGE : 1;
    } else {
        printf("%s\n", jid);
        /* Pushed: a replica shortfall is worth saying, not a failure. */
        if (rc == CAPSTAN_PUSH_UNREPLICATED)
            fprintf(stderr, "capstan push: warning: %s\n", capstan_client_error(c));
    }
    capstan_client_free(c);
    capstan_config_free(cfg);
    return status;
}
