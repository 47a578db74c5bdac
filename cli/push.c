/* `capstan push CLASS [ARGS_JSON] [-C FILE] [-e ENV] [-r PLUGIN] [-q Q]
 * [--in S | --at T] [--retry N|false] [--expires-in S]`: pushes one job with
 * capstan's client and prints its jid. It reads what `capstan run` reads,
 * the same way: FILE with ENV's section, then the plugins (FILE's and -r's)
 * and the program's own handlers, whose registered class options (queue,
 * retry, lock) a push takes as a worker's sidekiq_options are taken by
 * Ruby's client; FILE's classes: section comes first, as on the server. Its
 * min_replicas_ack makes the push wait for the replicas (a shortfall is a
 * warning: the job was pushed). A class without a queue goes to "default",
 * with a warning: in a mixed fleet a Ruby process may take it there.
 * FILE's shards: list routes the job to one shard as the C client does
 * (--shard names it outright), and the output says which. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "client/txn.h"
#include "config/names.h"
#include "config/settings.h"
#include "support/buf.h"
#include "support/json.h"
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
    "  -e, --environment ENV   section of FILE to merge, as for capstan run (default:\n"
    "                          $APP_ENV, $RAILS_ENV, $RACK_ENV, else development)\n"
    "  -r, --require PATH      load a handler plugin (.so) and take the options its\n"
    "                          classes are registered with; repeatable (FILE's\n"
    "                          plugins: are loaded too, as by capstan run)\n"
    "  -q, --queue NAME        queue (default: the class's, else \"default\", with a\n"
    "                          warning); not empty and without spaces, as for\n"
    "                          capstan run\n"
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
    "                          (not with FILE's shards: list)\n"
    "      --shard NAME        with FILE's shards: list, push to that shard rather\n"
    "                          than route (by the queue's home shard, else the lock\n"
    "                          digest, else the jid); the output is then \"JID SHARD\"\n"
    "      --json              print {\"jid\":..,\"queue\":..,\"shard\":..} (shard null\n"
    "                          without shards)\n"
    "  -h, --help              this help\n";

enum { OPT_IN = 1000, OPT_AT, OPT_RETRY, OPT_URL, OPT_TS, OPT_LOCK, OPT_LOCK_TTL,
       OPT_LOCK_TIMEOUT, OPT_ON_CONFLICT, OPT_EXPIRES_IN, OPT_SHARD, OPT_JSON };

/* What `capstan run` would know of the classes: FILE read with env's
 * section, then FILE's plugins, the -r ones and the program's handlers
 * registered on a runtime that never runs. Sets *cfg, or *rt (which owns
 * the config) when there is anything to register. Returns 0 or the exit
 * status, with the reason printed. */
static int load_classes(const char *conf, const char *env, char **plugins, size_t nplugins,
                        capstan_plugin_init_fn init, capstan_config_t **cfg, capstan_runtime_t **rt)
{
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *c = capstan_config_new();
    *cfg = NULL;
    *rt = NULL;
    if (!c || (env && capstan_config_set_str(&c->environment, env))) {
        fprintf(stderr, "capstan push: out of memory\n");
        capstan_config_free(c);
        return 1;
    }
    if (conf && capstan_config_load_file(c, conf, err)) {
        fprintf(stderr, "capstan push: %s\n", err);
        capstan_config_free(c);
        return CAPSTAN_EXIT_CONFIG;
    }
    if (!c->nplugins && !nplugins && !init) {
        *cfg = c;
        return 0;
    }
    capstan_runtime_t *r = capstan_runtime_new(c, err);
    if (!r) {
        fprintf(stderr, "capstan push: %s\n", err);
        capstan_config_free(c);
        return 1;
    }
    int rc = 0;
    for (size_t i = 0; i < c->nplugins && !rc; i++)
        rc = capstan_runtime_load_plugin(r, c->plugins[i], err);
    for (size_t i = 0; i < nplugins && !rc; i++)
        rc = capstan_runtime_load_plugin(r, plugins[i], err);
    if (!rc && init && init(r) != 0)
        rc = capstan_seterr(err, CAPSTAN_EINVAL, "the program's handler registration failed%s%s",
                            *capstan_runtime_error(r) ? ": " : "", capstan_runtime_error(r));
    if (rc) {
        fprintf(stderr, "capstan push: %s\n", err);
        capstan_runtime_free(r);
        return CAPSTAN_EXIT_CONFIG;
    }
    *cfg = c;
    *rt = r;
    return 0;
}

int capstan__cmd_push(int argc, char **argv, capstan_plugin_init_fn init)
{
    static const struct option longopts[] = {
        { "config", required_argument, NULL, 'C' }, { "queue", required_argument, NULL, 'q' }, { "in", required_argument, NULL, OPT_IN },
        { "environment", required_argument, NULL, 'e' }, { "require", required_argument, NULL, 'r' },
        { "at", required_argument, NULL, OPT_AT }, { "retry", required_argument, NULL, OPT_RETRY },
        { "redis-url", required_argument, NULL, OPT_URL },
        { "timestamps", required_argument, NULL, OPT_TS },
        { "lock", required_argument, NULL, OPT_LOCK },
        { "lock-ttl", required_argument, NULL, OPT_LOCK_TTL },
        { "lock-timeout", required_argument, NULL, OPT_LOCK_TIMEOUT },
        { "on-conflict", required_argument, NULL, OPT_ON_CONFLICT },
        { "expires-in", required_argument, NULL, OPT_EXPIRES_IN },
        { "shard", required_argument, NULL, OPT_SHARD }, { "json", no_argument, NULL, OPT_JSON },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    capstan_push_opts_t o = capstan_push_opts_default();
    capstan_unique_opts_t uo = CAPSTAN_UNIQUE_OPTS_INIT;
    int lock_opts = 0;
    const char *url = NULL, *conf = NULL, *env = NULL, *shard = NULL;
    int json = 0;
    char **plugins = argc > 0 ? calloc((size_t)argc, sizeof(*plugins)) : NULL; /* borrowed from argv */
    size_t nplugins = 0;
    double in = 0, at = 0;
    int opt, status = 0;
    if (!plugins) {
        fprintf(stderr, "capstan push: out of memory\n");
        return 1;
    }
    optind = 1;
    opterr = 0;
    while (!status && (opt = getopt_long(argc, argv, "C:e:r:q:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': conf = optarg; break;
        case 'e': env = optarg; break;
        case 'r': plugins[nplugins++] = optarg; break;
        case 'q': o.queue = optarg; break;
        case OPT_URL: url = optarg; break;
        case OPT_SHARD: shard = optarg; break;
        case OPT_JSON: json = 1; break;
        case OPT_IN:
            if (capstan__parse_number(optarg, 0, 0, HUGE_VAL, &in)) {
                fprintf(stderr, "capstan push: --in: not a number of seconds: %s\n", optarg);
                status = CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_AT:
            if (capstan__parse_number(optarg, 0, 1e9, HUGE_VAL, &at)) {
                fprintf(stderr, "capstan push: --at: not an epoch time in seconds: %s\n", optarg);
                status = CAPSTAN_EXIT_USAGE;
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
                    status = CAPSTAN_EXIT_USAGE;
                    break;
                }
                o.retry = (int)n;
            }
            break;
        case OPT_TS: {
            /* The words of `capstan run`'s setting. */
            const capstan__setting_t *ts = capstan__setting_by_key("timestamps");
            int i = capstan__setting_word(ts, optarg);
            if (i < 0) {
                char want[CAPSTAN_ERRLEN];
                capstan__setting_want(ts, want, sizeof(want));
                fprintf(stderr, "capstan push: --timestamps: %s\n", want);
                status = CAPSTAN_EXIT_USAGE;
            } else {
                o.timestamps = (capstan_ts_format_t)i;
            }
            break;
        }
        case OPT_LOCK:
            if (capstan_lock_type_parse(optarg, &uo.lock)) {
                fprintf(stderr, "capstan push: --lock: unknown lock type %s\n", optarg);
                status = CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_LOCK_TTL:
        case OPT_LOCK_TIMEOUT: {
            double v;
            if (capstan__parse_number(optarg, 1, 0, 100000000, &v)) {
                fprintf(stderr, "capstan push: --%s: not a number of seconds >= 0: %s\n",
                        opt == OPT_LOCK_TTL ? "lock-ttl" : "lock-timeout", optarg);
                status = CAPSTAN_EXIT_USAGE;
                break;
            }
            *(opt == OPT_LOCK_TTL ? &uo.lock_ttl : &uo.lock_timeout) = (long)v;
            lock_opts = 1;
            break;
        }
        case OPT_ON_CONFLICT:
            if (capstan_on_conflict_parse(optarg, &uo.on_conflict_client)) {
                fprintf(stderr, "capstan push: --on-conflict: unknown strategy %s "
                                "(log, raise, reject, replace, reschedule)\n", optarg);
                status = CAPSTAN_EXIT_USAGE;
                break;
            }
            uo.on_conflict_server = uo.on_conflict_client;
            lock_opts = 1;
            break;
        case 'h':
            fputs(usage, stdout);
            free(plugins);
            return 0;
        default:
            fprintf(stderr, "capstan push: %s: unknown option or missing value\n\n%s", argv[optind - 1], usage);
            status = CAPSTAN_EXIT_USAGE;
        }
    }
    char err[CAPSTAN_ERRLEN], jid[25];
    if (status) {
        /* reported above */
    } else if (optind >= argc || argc - optind > 2) {
        fputs(usage, stderr);
        status = CAPSTAN_EXIT_USAGE;
    } else if (o.queue && capstan__config_queue_name_check(o.queue, err)) {
        fprintf(stderr, "capstan push: --queue: %s\n", err);
        status = CAPSTAN_EXIT_USAGE;
    } else if (in > 0 && at > 0) {
        fprintf(stderr, "capstan push: give --in or --at, not both\n");
        status = CAPSTAN_EXIT_USAGE;
    } else if (lock_opts && uo.lock == CAPSTAN_LOCK_NONE) {
        fprintf(stderr, "capstan push: --lock-ttl, --lock-timeout and --on-conflict need --lock\n");
        status = CAPSTAN_EXIT_USAGE;
    }
    if (status) {
        free(plugins);
        return status;
    }
    if (uo.lock != CAPSTAN_LOCK_NONE)
        o.unique = &uo;
    const char *cls = argv[optind];
    const char *args = optind + 1 < argc ? argv[optind + 1] : "[]";
    o.at = at > 0 ? at : in; /* the client reads small values as "from now" */
    capstan_config_t *cfg = NULL;
    capstan_runtime_t *rt = NULL;
    capstan_client_t *c = NULL;
    status = load_classes(conf, env, plugins, nplugins, init, &cfg, &rt);
    free(plugins);
    if (status)
        return status;
    /* The shards' own URLs are where the pushes go, with the file's tls:
     * carried into them as for capstan run. */
    if (cfg->nshards && capstan_config_validate(cfg, err)) {
        fprintf(stderr, "capstan push: %s\n", err);
        status = CAPSTAN_EXIT_CONFIG;
        goto out;
    }
    if (url && cfg->nshards) {
        fprintf(stderr, "capstan push: --redis-url: %s has a shards: list, whose URLs the push "
                        "goes to; use --shard NAME to pick one\n", conf);
        status = CAPSTAN_EXIT_USAGE;
        goto out;
    }
    if (!url && (cfg->redis_url_explicit || cfg->nshards))
        url = cfg->redis_url;
    int code;
    if (!(c = capstan__client_open(capstan__cli_redis_url(url), err, &code))) {
        fprintf(stderr, "capstan push: %s\n", err);
        status = code == CAPSTAN_ECONFIG ? CAPSTAN_EXIT_CONFIG : 1;
        goto out;
    }
    if (rt ? capstan_client_use_runtime(c, rt) : (capstan_client_use_config(c, cfg), 0)) {
        fprintf(stderr, "capstan push: out of memory\n");
        status = 1;
        goto out;
    }
    if (shard && !cfg->nshards) {
        fprintf(stderr, "capstan push: --shard needs -C FILE with a shards: list\n");
        status = CAPSTAN_EXIT_USAGE;
        goto out;
    }
    if (shard && capstan_client_set_shard(c, shard)) {
        fprintf(stderr, "capstan push: --shard: %s\n", capstan_client_error(c));
        status = CAPSTAN_EXIT_USAGE;
        goto out;
    }
    /* Asked before the push, which does not say where the queue came from. */
    const char *class_queue = capstan_client_class_queue(c, cls);
    int rc = capstan_client_push(c, cls, args, &o, jid);
    const char *went = capstan_client_pushed_shard(c, 0);
    if (rc == CAPSTAN_EDENIED) {
        fprintf(stderr, "capstan push: denied: %s\n", capstan_client_error(c));
        status = CAPSTAN_EXIT_DENIED;
    } else if (rc < 0) {
        fprintf(stderr, "capstan push: %s\n", capstan_client_error(c));
        status = rc == CAPSTAN_EINVAL ? CAPSTAN_EXIT_USAGE : 1;
    } else {
        if (json) {
            const char *q = o.queue ? o.queue : class_queue ? class_queue : "default";
            capstan_buf_t b = {0};
            int nomem = capstan__json_quote(&b, q, strlen(q));
            /* A shard's name is a plain word (capstan_config_add_shard). */
            printf("{\"jid\":\"%s\",\"queue\":%s,\"shard\":%s%s%s}\n", jid, nomem ? "null" : b.p,
                   went ? "\"" : "", went ? went : "null", went ? "\"" : "");
            capstan__buf_free(&b);
        } else if (went) {
            printf("%s %s\n", jid, went);
        } else {
            printf("%s\n", jid);
        }
        fflush(stdout); /* the jid first, then any warning */
        /* Pushed: a replica shortfall is worth saying, not a failure. */
        if (rc == CAPSTAN_PUSH_UNREPLICATED)
            fprintf(stderr, "capstan push: warning: %s\n", capstan_client_error(c));
        /* Where Ruby processes share the fleet, "default" is the queue they
         * all read: the C class's job may be run (and fail) there. */
        if (!o.queue && !class_queue)
            fprintf(stderr, "capstan push: warning: %s has no queue, so the job went to \"default\", "
                            "where a Ruby Sidekiq process of a mixed fleet may take it; give -q QUEUE, "
                            "or the class a queue in its plugin or in the classes: section of -C FILE\n",
                    cls);
    }
out:
    capstan_client_free(c);
    if (rt)
        capstan_runtime_free(rt); /* frees cfg */
    else
        capstan_config_free(cfg);
    return status;
}
