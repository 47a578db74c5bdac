/* The kiq command's subcommands (cli.c dispatches). Each returns the process
 * exit status. */
#ifndef KIQ_CLI_CLI_H
#define KIQ_CLI_CLI_H

#include "kiq/redis.h"

#define KIQ_EXIT_USAGE 64
#define KIQ_EXIT_DENIED 3

int kiq_cmd_push(int argc, char **argv);
int kiq_cmd_stats(int argc, char **argv);
int kiq_cmd_locks(int argc, char **argv);
int kiq_cmd_lock(int argc, char **argv);
int kiq_cmd_top(int argc, char **argv);
int kiq_cmd_limits(int argc, char **argv);
int kiq_cmd_batch(int argc, char **argv);

/* The Redis URL for a subcommand: --redis-url, else $REDIS_URL (or the
 * variable named by $REDIS_PROVIDER), else the default. */
const char *kiq_cli_redis_url(const char *flag);

/* A connection to that Redis for the command who ("kiq stats"), owned by
 * the caller. On failure it prints "who: reason" on stderr and returns
 * NULL. */
kiq_redis_t *kiq_cli_connect(const char *who, const char *url_flag);

/* Parses the options of a subcommand that only reads or manages (who,
 * "kiq stats"): --redis-url into *url, --json into *json (none when json
 * is NULL) and --help, which prints usage. The operands start at optind
 * after it. Returns -1 to go on, else the exit status. */
int kiq_cli_options(const char *who, const char *usage, int argc, char **argv, const char **url,
                    int *json);

#endif
