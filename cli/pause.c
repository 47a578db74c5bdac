/* `capstan pause QUEUE...` and `capstan unpause QUEUE...`: pause queues as
 * Sidekiq Pro does, by their names in the Redis set "paused", which every
 * capstan process (and every Sidekiq Pro process) reads and skips. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "fetch/fetch.h"
#include "capstan/redis.h"

static const char *pause_usage =
    "Usage: capstan pause QUEUE... [--redis-url URL]\n"
    "\n"
    "Pauses the queues as Sidekiq Pro does: adds their names (without \"queue:\")\n"
    "to the Redis set \"paused\". capstan processes stop fetching from them within\n"
    "a heartbeat (jobs already fetched still run); pushes still add to them.\n"
    "`capstan unpause` resumes them; `capstan stats` shows which are paused.\n";

static const char *unpause_usage =
    "Usage: capstan unpause QUEUE... [--redis-url URL]\n"
    "\n"
    "Resumes queues paused with `capstan pause` or Sidekiq Pro: removes their\n"
    "names from the Redis set \"paused\". capstan processes fetch from them again\n"
    "within a heartbeat.\n";

static int run(const char *who, const char *usage, int pause, int argc, char **argv)
{
    const char *url = NULL;
    int done = capstan__cli_options(who, usage, argc, argv, &url, NULL);
    if (done >= 0)
        return done;
    if (optind >= argc) {
        fprintf(stderr, "%s: name at least one queue\n\n%s", who, usage);
        return CAPSTAN_EXIT_USAGE;
    }
    for (int i = optind; i < argc; i++)
        if (!argv[i][0] || strncmp(argv[i], "queue:", 6) == 0) {
            fprintf(stderr, "%s: \"%s\": give a queue's name without \"queue:\" (default, not "
                    "queue:default)\n", who, argv[i]);
            return CAPSTAN_EXIT_USAGE;
        }
    int failed = 1;
    capstan_redis_t *r = capstan__cli_connect(who, url, &failed);
    if (!r)
        return failed;
    char err[CAPSTAN_ERRLEN];
    long long n = 0;
    int rc = capstan__paused_set(r, (const char *const *)argv + optind, (size_t)(argc - optind), pause,
                                 &n, err);
    capstan_redis_free(r);
    if (rc) {
        fprintf(stderr, "%s: %s\n", who, err);
        return 1;
    }
    for (int i = optind; i < argc; i++)
        printf("%s%s", i > optind ? " " : "", argv[i]);
    printf(": %s (%lld %s)\n", pause ? "paused" : "unpaused", n,
           pause ? "newly; the others were paused already" : "were paused");
    return 0;
}

int capstan__cmd_pause(int argc, char **argv)
{
    return run("capstan pause", pause_usage, 1, argc, argv);
}

int capstan__cmd_unpause(int argc, char **argv)
{
    return run("capstan unpause", unpause_usage, 0, argc, argv);
}
