/* The helpers every subcommand uses: which Redis to talk to, a connection
 * to it, and the options of the commands that only read or manage. */
#include "cli/common.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/config.h"
#include "capstan/error.h"
#include "config/shards.h"

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

capstan_redis_t *capstan__cli_connect_err(const char *url, int *status, char *err)
{
    capstan_redis_t *r = capstan_redis_new(capstan__cli_redis_url(url), 10, err);
    if (!r) {
        *status = CAPSTAN_EXIT_CONFIG;
        return NULL;
    }
    int rc = capstan_redis_connect(r);
    if (rc) {
        snprintf(err, CAPSTAN_ERRLEN, "%s", capstan_redis_error(r));
        if (rc == CAPSTAN_ECONFIG)
            *status = CAPSTAN_EXIT_CONFIG;
        capstan_redis_free(r);
        return NULL;
    }
    return r;
}

capstan_redis_t *capstan__cli_connect(const char *who, const char *url_flag, int *status)
{
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan__cli_connect_err(url_flag, status, err);
    if (!r)
        fprintf(stderr, "%s: %s\n", who, err);
    return r;
}

/* The options of capstan__cli_options, and with fleet -C, -e and --shard. */
static int options(const char *who, const char *usage, int argc, char **argv, const char **url,
                   int *json, capstan_cli_fleet_t *fleet)
{
    static const struct option all[] = {
        { "config", required_argument, NULL, 'C' }, { "environment", required_argument, NULL, 'e' },
        { "shard", required_argument, NULL, 's' },
        { "redis-url", required_argument, NULL, 'u' }, { "help", no_argument, NULL, 'h' },
        { "json", no_argument, NULL, 'j' }, { NULL, 0, NULL, 0 },
    };
    /* -C, -e and --shard only for a fleet, --json only where it is taken. */
    struct option longopts[7];
    size_t n = 0;
    for (size_t i = fleet ? 0 : 3; i < 5; i++)
        longopts[n++] = all[i];
    if (json)
        longopts[n++] = all[5];
    longopts[n] = all[6];
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, fleet ? "hC:e:" : "h", longopts, NULL)) != -1) {
        if (opt == 'j') {
            *json = 1;
        } else if (opt == 'u') {
            *url = optarg;
        } else if (opt == 'C') {
            fleet->conf = optarg;
        } else if (opt == 'e') {
            fleet->env = optarg;
        } else if (opt == 's') {
            fleet->shard = optarg;
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

int capstan__cli_options(const char *who, const char *usage, int argc, char **argv, const char **url,
                         int *json)
{
    return options(who, usage, argc, argv, url, json, NULL);
}

int capstan__cli_fleet_options(const char *who, const char *usage, int argc, char **argv,
                               capstan_cli_fleet_t *fleet, int *json)
{
    return options(who, usage, argc, argv, &fleet->url, json, fleet);
}

int capstan__cli_fleet_load(const char *who, capstan_cli_fleet_t *f)
{
    char err[CAPSTAN_ERRLEN];
    if (f->conf) {
        f->cfg = capstan_config_new();
        if (!f->cfg || (f->env && capstan_config_set_str(&f->cfg->environment, f->env))) {
            fprintf(stderr, "%s: out of memory\n", who);
            return 1;
        }
        /* validate carries the file's tls: into each shard's URL, as for
         * capstan run. */
        if (capstan_config_load_file(f->cfg, f->conf, err) || capstan_config_validate(f->cfg, err)) {
            fprintf(stderr, "%s: %s\n", who, err);
            return CAPSTAN_EXIT_CONFIG;
        }
        capstan_config_apply_env(f->cfg);
    }
    size_t n = f->cfg ? f->cfg->nshards : 0;
    if (n && f->url) {
        fprintf(stderr, "%s: --redis-url: %s has a shards: list, whose URLs the command reads; use "
                        "--shard NAME to pick one\n", who, f->conf);
        return CAPSTAN_EXIT_USAGE;
    }
    if (f->shard && !n) {
        fprintf(stderr, "%s: --shard needs -C FILE with a shards: list\n", who);
        return CAPSTAN_EXIT_USAGE;
    }
    if (!n) {
        if (!f->url && f->cfg && f->cfg->redis_url_explicit)
            f->url = f->cfg->redis_url;
        return -1;
    }
    f->shards = f->cfg->shards;
    f->nshards = n;
    if (!f->shard)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(f->cfg->shards[i].name, f->shard)) {
            f->shards = &f->cfg->shards[i];
            f->nshards = 1;
            return -1;
        }
    fprintf(stderr, "%s: --shard: no shard %s in %s (it has", who, f->shard, f->conf);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%s %s", i ? "," : "", f->cfg->shards[i].name);
    fprintf(stderr, ")\n");
    return CAPSTAN_EXIT_USAGE;
}

void capstan__cli_fleet_free(capstan_cli_fleet_t *f)
{
    capstan_config_free(f->cfg);
    f->cfg = NULL;
}

int capstan__cli_fleet_one(const char *who, const capstan_cli_fleet_t *f, int pick, const char *key,
                           const char **url, const char **shard)
{
    *shard = NULL;
    *url = f->url;
    if (!f->nshards)
        return -1;
    if (f->nshards == 1 && f->shard) {
        *shard = f->shards[0].name;
        *url = f->shards[0].redis_url;
        return -1;
    }
    /* f->shards is every shard of f->cfg here. */
    long i = pick != CAPSTAN_CLI_PICK_NONE && key ? capstan__config_shard_of(f->cfg, key, pick == CAPSTAN_CLI_PICK_OPEN)
                                                  : -1;
    const capstan_shard_conf_t *s = i >= 0 ? &f->shards[i] : NULL;
    if (s) {
        *shard = s->name;
        *url = s->redis_url;
        return -1;
    }
    fprintf(stderr, "%s: this command does not yet support shards%s: give --shard NAME (", who,
            pick == CAPSTAN_CLI_PICK_OPEN && key ? " whose every shard has a queues: list" : "");
    for (size_t i = 0; i < f->nshards; i++)
        fprintf(stderr, "%s%s", i ? ", " : "", f->shards[i].name);
    fprintf(stderr, "), or --redis-url of one shard without -C\n");
    return CAPSTAN_EXIT_USAGE;
}
