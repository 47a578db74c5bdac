/* What every subcommand of the capstan command shares: its exit statuses,
 * the Redis it talks to, and the options of the commands that only read or
 * manage. */
#ifndef CAPSTAN_CLI_COMMON_H
#define CAPSTAN_CLI_COMMON_H

#include <stddef.h>

#include "capstan/config.h"
#include "capstan/redis.h"

/* A bad command line (EX_USAGE). */
#define CAPSTAN_EXIT_USAGE 64
/* What was asked was refused: a push (by a uniqueness lock or another
 * client middleware), or a reaper run (another reaper holds the lease). */
#define CAPSTAN_EXIT_DENIED 3

/* The Redis URL for a subcommand: --redis-url, else $REDIS_URL (or the
 * variable named by $REDIS_PROVIDER), else the default. Borrowed from flag
 * or the environment. */
const char *capstan__cli_redis_url(const char *flag);

/* A connection to that Redis for the command who ("capstan stats"), owned by
 * the caller. On failure it prints "who: reason" on stderr, sets *status to
 * CAPSTAN_EXIT_CONFIG when retrying cannot help (a bad URL, a password or
 * ACL refused, a Redis Cluster node), leaves it otherwise, and returns
 * NULL. */
capstan_redis_t *capstan__cli_connect(const char *who, const char *url_flag, int *status);

/* Parses the options of a subcommand that only reads or manages (who,
 * "capstan stats"): --redis-url into *url, --json into *json (none when json
 * is NULL) and --help, which prints usage. The operands start at optind
 * after it. Returns -1 to go on, else the exit status. */
int capstan__cli_options(const char *who, const char *usage, int argc, char **argv, const char **url,
                         int *json);

/* The Redis servers an operator's command addresses: --redis-url's one,
 * or with -C FILE's shards: list every shard (--shard NAME: that one). */
typedef struct capstan_cli_fleet {
    const char *url;               /* --redis-url; after capstan__cli_fleet_load,
                                      the one URL when there are no shards */
    const char *conf, *env, *shard; /* -C, -e, --shard */
    capstan_config_t *cfg;         /* FILE, read by capstan__cli_fleet_load */
    const capstan_shard_conf_t *shards; /* borrowed from cfg: all, or --shard's */
    size_t nshards;                /* 0: no shards, the one URL */
} capstan_cli_fleet_t;

/* The usage lines of the options capstan__cli_fleet_options reads, for a
 * command whose --shard NAME means shard (a phrase: "that shard alone"). */
#define CAPSTAN_CLI_FLEET_USAGE(shard)                                                      \
    "  -C, --config FILE       read redis_url, or the shards: list, from FILE\n"            \
    "  -e, --environment ENV   section of FILE to merge, as for capstan run\n"              \
    "      --shard NAME        with FILE's shards: list, " shard "\n"                        \
    "      --redis-url URL     default: FILE's, else $REDIS_URL, else\n"                    \
    "                          redis://127.0.0.1:6379/0 (not with shards)\n"

/* capstan__cli_options that also takes -C FILE, -e ENV and --shard NAME
 * into *fleet. */
int capstan__cli_fleet_options(const char *who, const char *usage, int argc, char **argv,
                               capstan_cli_fleet_t *fleet, int *json);

/* Reads fleet->conf (if given) and settles what the command addresses:
 * FILE's shards (--redis-url is then refused), one of them (--shard, which
 * needs them), else one URL (--redis-url, FILE's redis_url, $REDIS_URL).
 * Returns -1 to go on, else the exit status, the reason printed. */
int capstan__cli_fleet_load(const char *who, capstan_cli_fleet_t *fleet);
void capstan__cli_fleet_free(capstan_cli_fleet_t *fleet);

/* Where the key of a command that addresses one Redis lives among the
 * shards: nowhere known (the command needs --shard), the rendezvous pick
 * among every shard, or among those without a queues: list (as a push's
 * lock digest is routed). */
enum { CAPSTAN_CLI_PICK_NONE, CAPSTAN_CLI_PICK_ALL, CAPSTAN_CLI_PICK_OPEN };

/* The one Redis of such a command, into *url: without shards the one URL
 * (NULL: the environment's); with --shard that shard's; else, by pick, the
 * shard capstan__shard_pick gives key. Otherwise it is refused: acting on
 * the first shard alone would be wrong silently. *shard: the shard's name,
 * NULL without shards. Returns -1 to go on, else the exit status (64), the
 * reason printed. */
int capstan__cli_fleet_one(const char *who, const capstan_cli_fleet_t *f, int pick, const char *key,
                           const char **url, const char **shard);

/* capstan__cli_connect without printing: the reason in err, *status set
 * as there. */
capstan_redis_t *capstan__cli_connect_err(const char *url, int *status, char *err);

#endif
