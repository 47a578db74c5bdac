/* The capstan command's subcommands (cli.c dispatches). Each returns the process
 * exit status. */
#ifndef CAPSTAN_CLI_CLI_H
#define CAPSTAN_CLI_CLI_H

#include "capstan/redis.h"

#define CAPSTAN_EXIT_USAGE 64
#define CAPSTAN_EXIT_DENIED 3

int capstan__cmd_push(int argc, char **argv);
int capstan__cmd_stats(int argc, char **argv);
int capstan__cmd_locks(int argc, char **argv);
int capstan__cmd_lock(int argc, char **argv);
int capstan__cmd_top(int argc, char **argv);
int capstan__cmd_limits(int argc, char **argv);
int capstan__cmd_batch(int argc, char **argv);

/* The Redis URL for a subcommand: --redis-url, else $REDIS_URL (or the
 * variable named by $REDIS_PROVIDER), else the default. */
const char *capstan__cli_redis_url(const char *flag);

/* A connection to that Redis for the command who ("capstan stats"), owned by
 * the caller. On failure it prints "who: reason" on stderr and returns
 * NULL. */
capstan_redis_t *capstan__cli_connect(const char *who, const char *url_flag);

/* Parses the options of a subcommand that only reads or manages (who,
 * "capstan stats"): --redis-url into *url, --json into *json (none when json
 * is NULL) and --help, which prints usage. The operands start at optind
 * after it. Returns -1 to go on, else the exit status. */
int capstan__cli_options(const char *who, const char *usage, int argc, char **argv, const char **url,
                         int *json);

#endif
