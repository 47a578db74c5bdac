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

/* What both usages say of a sharded fleet. */
#define SHARDS_HELP                                                                      \
    "\n"                                                                                 \
    "With -C FILE's shards: list, in every shard that fetches the queue (one whose\n"   \
    "queues: list has it, or that has no queues: list), one line a shard; a queue\n"   \
    "no shard fetches is refused (exit 64). A shard that cannot be reached is\n"       \
    "named on stderr, the others still done, and the exit status is 1.\n"              \
    "\n"                                                                                 \
    CAPSTAN_CLI_FLEET_USAGE("in that shard alone")

static const char *pause_usage =
    "Usage: capstan pause QUEUE... [--redis-url URL | -C FILE [--shard NAME]]\n"
    "\n"
    "Pauses the queues as Sidekiq Pro does: adds their names (without \"queue:\")\n"
    "to the Redis set \"paused\". capstan processes stop fetching from them within\n"
    "a heartbeat (jobs already fetched still run); pushes still add to them.\n"
    "`capstan unpause` resumes them; `capstan stats` shows which are paused.\n"
    SHARDS_HELP;

static const char *unpause_usage =
    "Usage: capstan unpause QUEUE... [--redis-url URL | -C FILE [--shard NAME]]\n"
    "\n"
    "Resumes queues paused with `capstan pause` or Sidekiq Pro: removes their\n"
    "names from the Redis set \"paused\". capstan processes fetch from them again\n"
    "within a heartbeat.\n"
    SHARDS_HELP;

/* Whether shard s fetches queue q: it lists q, or lists no queue (then it
 * fetches every one). */
static int shard_reads(const capstan_shard_conf_t *s, const char *q)
{
    for (size_t i = 0; i < s->nqueues; i++)
        if (!strcmp(s->queues[i], q))
            return 1;
    return s->nqueues == 0;
}

/* Pauses (or resumes) queues[0..n) in the Redis at url, saying so after
 * prefix ("" or "shard a: "). Returns 0, or the exit status with the
 * reason printed. */
static int apply(const char *who, const char *prefix, const char *url, int pause, const char *const *queues,
                 size_t n)
{
    int failed = 1;
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan__cli_connect_err(url, &failed, err);
    long long newly = 0;
    int rc = r ? capstan__paused_set(r, queues, n, pause, &newly, err) : 0;
    capstan_redis_free(r);
    if (!r || rc) {
        fprintf(stderr, "%s: %s%s\n", who, prefix, err);
        return r ? 1 : failed;
    }
    printf("%s", prefix);
    for (size_t i = 0; i < n; i++)
        printf("%s%s", i ? " " : "", queues[i]);
    printf(": %s (%lld %s)\n", pause ? "paused" : "unpaused", newly,
           pause ? "newly; the others were paused already" : "were paused");
    return 0;
}

/* In each shard of f, the queues it fetches (with --shard, all of them in
 * that one): a queue no shard fetches is refused before any is touched.
 * A shard that cannot be reached is named, the others still done, and
 * the exit status is 1. */
static int apply_shards(const char *who, const capstan_cli_fleet_t *f, int pause, char **queues, size_t n)
{
    for (size_t q = 0; q < n && f->nshards > 1; q++) {
        size_t k = 0;
        while (k < f->nshards && !shard_reads(&f->shards[k], queues[q]))
            k++;
        if (k == f->nshards) {
            fprintf(stderr, "%s: no shard of %s fetches %s (each lists its queues:); give --shard NAME "
                    "to act in one anyway\n", who, f->conf, queues[q]);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    const char **mine = calloc(n, sizeof(*mine));
    if (!mine) {
        fprintf(stderr, "%s: out of memory\n", who);
        return 1;
    }
    int status = 0;
    for (size_t k = 0; k < f->nshards; k++) {
        size_t m = 0;
        for (size_t q = 0; q < n; q++)
            if (f->nshards == 1 || shard_reads(&f->shards[k], queues[q]))
                mine[m++] = queues[q];
        char prefix[128];
        snprintf(prefix, sizeof(prefix), "shard %s: ", f->shards[k].name);
        int rc = m ? apply(who, prefix, f->shards[k].redis_url, pause, mine, m) : 0;
        if (rc && !status)
            status = rc;
    }
    free(mine);
    return status;
}

static int run(const char *who, const char *usage, int pause, int argc, char **argv)
{
    capstan_cli_fleet_t f = {0};
    int done = capstan__cli_fleet_options(who, usage, argc, argv, &f, NULL);
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
    done = capstan__cli_fleet_load(who, &f);
    if (done < 0)
        done = f.nshards ? apply_shards(who, &f, pause, argv + optind, (size_t)(argc - optind))
                         : apply(who, "", f.url, pause, (const char *const *)argv + optind,
                                 (size_t)(argc - optind));
    capstan__cli_fleet_free(&f);
    return done;
}

int capstan__cmd_pause(int argc, char **argv)
{
    return run("capstan pause", pause_usage, 1, argc, argv);
}

int capstan__cmd_unpause(int argc, char **argv)
{
    return run("capstan unpause", unpause_usage, 0, argc, argv);
}
