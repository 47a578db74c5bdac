/* The helpers every subcommand uses: which Redis to talk to, a connection
 * to it, and the options of the commands that only read or manage. */
#include "cli/common.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "capstan/config.h"
#include "capstan/error.h"

const char *capstan__cli_redis_url(const char *flag)
{
    if (flag && *flag)
        return flag;
    const char *provider = getenv("REDIS_PROVIDER");
    const char *url = provider && *provider ? getenv(provider) : NULL;
    if (!url || !*url)
        url = getenv("REDIS_URL");
    return url && *url ? url : "redis://127.0.0.1:6379/0";
}

capstan_redis_t *capstan__cli_connect(const char *who, const char *url_flag, int *status)
{
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(capstan__cli_redis_url(url_flag), 10, err);
    if (!r) {
        fprintf(stderr, "%s: %s\n", who, err);
        *status = CAPSTAN_EXIT_CONFIG;
        return NULL;
    }
    int rc = capstan_redis_connect(r);
    if (rc) {
        fprintf(stderr, "%s: %s\n", who, capstan_redis_error(r));
        if (rc == CAPSTAN_ECONFIG)
            *status = CAPSTAN_EXIT_CONFIG;
        capstan_redis_free(r);
        return NULL;
    }
    return r;
}

int capstan__cli_options(const char *who, const char *usage, int argc, char **argv, const char **url,
                         int *json)
{
    static const struct option with_json[] = {
        { "json", no_argument, NULL, 'j' }, { "redis-url", required_argument, NULL, 'u' },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    const struct option *longopts = json ? with_json : with_json + 1;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (opt == 'j') {
            *json = 1;
        } else if (opt == 'u') {
            *url = optarg;
        } else if (opt == 'h') {
            fputs(usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "%s: %s: unknown option or missing value\n\n%s", who,
                    argv[optind - 1], usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    return -1;
}
