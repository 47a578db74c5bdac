/* `kiq push CLASS [ARGS_JSON] [-q Q] [--in S | --at T] [--retry N|false]`:
 * pushes one job with kiq's client and prints its jid. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiq/kiq.h"

static const char *usage =
    "Usage: kiq push CLASS [ARGS_JSON] [options]\n"
    "\n"
    "Pushes one job and prints its jid. ARGS_JSON is a JSON array (default []).\n"
    "\n"
    "  -q, --queue NAME        queue (default \"default\")\n"
    "      --in SECONDS        run it this many seconds from now\n"
    "      --at EPOCH          run it at this Unix time (seconds)\n"
    "      --retry N|true|false  retry option written into the payload\n"
    "      --timestamps FORMAT float (default) or millis\n"
    "      --redis-url URL     default: $REDIS_URL, else redis://127.0.0.1:6379/0\n"
    "  -h, --help              this help\n";

enum { OPT_IN = 1000, OPT_AT, OPT_RETRY, OPT_URL, OPT_TS };

int kiq_cmd_push(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "queue", required_argument, NULL, 'q' }, { "in", required_argument, NULL, OPT_IN },
        { "at", required_argument, NULL, OPT_AT }, { "retry", required_argument, NULL, OPT_RETRY },
        { "redis-url", required_argument, NULL, OPT_URL },
        { "timestamps", required_argument, NULL, OPT_TS },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    kiq_push_opts_t o = kiq_push_opts_default();
    const char *url = NULL;
    double in = 0, at = 0;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "q:h", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (opt) {
        case 'q': o.queue = optarg; break;
        case OPT_URL: url = optarg; break;
        case OPT_IN:
            in = strtod(optarg, &end);
            if (end == optarg || *end || in < 0) {
                fprintf(stderr, "kiq push: --in: not a number of seconds: %s\n", optarg);
                return KIQ_EXIT_USAGE;
            }
            break;
        case OPT_AT:
            at = strtod(optarg, &end);
            if (end == optarg || *end || at < 1e9) {
                fprintf(stderr, "kiq push: --at: not an epoch time in seconds: %s\n", optarg);
                return KIQ_EXIT_USAGE;
            }
            break;
        case OPT_RETRY:
            if (strcmp(optarg, "false") == 0) o.retry = KIQ_RETRY_NONE;
            else if (strcmp(optarg, "true") == 0) o.retry = KIQ_RETRY_DEFAULT;
            else {
                long n = strtol(optarg, &end, 10);
                if (end == optarg || *end || n < 0 || n > 1000000) {
                    fprintf(stderr, "kiq push: --retry: must be a count, true or false: %s\n", optarg);
                    return KIQ_EXIT_USAGE;
                }
                o.retry = (int)n;
            }
            break;
        case OPT_TS:
            if (strcmp(optarg, "millis") == 0) o.timestamps = KIQ_TS_MILLIS;
            else if (strcmp(optarg, "float") != 0) {
                fprintf(stderr, "kiq push: --timestamps: float or millis\n");
                return KIQ_EXIT_USAGE;
            }
            break;
        case 'h': fputs(usage, stdout); return 0;
        default:
            fprintf(stderr, "kiq push: %s: unknown option or missing value\n\n%s", argv[optind - 1], usage);
            return KIQ_EXIT_USAGE;
        }
    }
    if (optind >= argc || argc - optind > 2) {
        fputs(usage, stderr);
        return KIQ_EXIT_USAGE;
    }
    if (in > 0 && at > 0) {
        fprintf(stderr, "kiq push: give --in or --at, not both\n");
        return KIQ_EXIT_USAGE;
    }
    const char *cls = argv[optind];
    const char *args = optind + 1 < argc ? argv[optind + 1] : "[]";
    o.at = at > 0 ? at : in; /* the client reads small values as "from now" */
    char err[KIQ_ERRLEN], jid[25];
    kiq_client_t *c = kiq_client_new(kiq_cli_redis_url(url), err);
    if (!c) {
        fprintf(stderr, "kiq push: %s\n", err);
        return 1;
    }
    int rc = kiq_client_push(c, cls, args, &o, jid);
    if (rc) {
        fprintf(stderr, "kiq push: %s\n", kiq_client_error(c));
        kiq_client_free(c);
        return rc == KIQ_EINVAL ? KIQ_EXIT_USAGE : 1;
    }
    printf("%s\n", jid);
    kiq_client_free(c);
    return 0;
}
