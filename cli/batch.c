/* `capstan batch`: the batches on a Redis (include/capstan/batch.h). status BID
 * shows one batch's counts, first failure and which callbacks fired; list
 * shows every batch still stored, one a line; delete and invalidate act on
 * one batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "capstan/batch.h"

#define EXIT_REDIS 69
#define EXIT_NOTFOUND 1

static const char *usage =
    "Usage: capstan batch status BID\n"
    "       capstan batch list\n"
    "       capstan batch delete BID | invalidate BID\n"
    "\n"
    "status shows a batch's description, total, pending, failures (with one\n"
    "failed job's error), dead jobs, and when each callback fired. list shows\n"
    "every batch still stored: bid, state, total, pending, failures and\n"
    "description. delete removes a batch's data (its jobs then run as plain\n"
    "jobs); invalidate marks it so its jobs can check and stop.\n"
    "\n"
    "  --redis-url URL     default: FILE's, else $REDIS_URL, else\n"
    "                      redis://127.0.0.1:6379/0\n"
    "  -C, --config FILE   read redis_url, or the shards: list, from FILE (-e ENV:\n"
    "                      its section); with shards, list shows each shard's\n"
    "                      batches, and a BID is looked for in each shard (a\n"
    "                      batch lives in the one it was made in): status then\n"
    "                      says which\n"
    "  --shard NAME        with FILE's shards: list, that shard alone\n"
    "  -h, --help          this help\n";

/* "2026-11-22 19:41:52 UTC", or "-" for 0. */
static const char *when(double t, char *buf, size_t n)
{
    if (t <= 0)
        return "-";
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S UTC", &tm);
    return buf;
}

static const char *state_of(const capstan_batch_status_t *s)
{
    if (s->success_at > 0)
        return "succeeded";
    if (s->complete_at > 0)
        return "complete";
    if (s->open > 0)
        return "open";
    return "running";
}

static int cmd_status(capstan_redis_t *r, const char *bid)
{
    char err[CAPSTAN_ERRLEN], t[4][40];
    capstan_batch_status_t s;
    int rc = capstan_batch_status(r, bid, &s, err);
    if (rc) {
        fprintf(stderr, "capstan batch: %s\n", err);
        return rc == CAPSTAN_ENOTFOUND ? EXIT_NOTFOUND : EXIT_REDIS;
    }
    printf("bid:          %s\n"
           "description:  %s\n"
           "state:        %s%s\n"
           "parent:       %s\n"
           "created:      %s\n"
           "total:        %ld\n"
           "pending:      %ld\n"
           "failures:     %ld\n"
           "dead:         %ld\n",
           s.bid, s.description ? s.description : "", state_of(&s),
           s.invalidated ? " (invalidated)" : "", s.parent ? s.parent : "-",
           when(s.created_at, t[0], sizeof(t[0])), s.total, s.pending, s.failures, s.dead);
    if (s.first_error)
        printf("first error:  %s (jid %s)\n", s.first_error, s.first_failed_jid);
    printf("callbacks fired:\n"
           "  complete:   %s\n"
           "  success:    %s\n"
           "  death:      %s\n",
           when(s.complete_at, t[1], sizeof(t[1])), when(s.success_at, t[2], sizeof(t[2])),
           when(s.death_at, t[3], sizeof(t[3])));
    capstan_batch_status_clear(&s);
    return 0;
}

static int cmd_list(capstan_redis_t *r)
{
    char err[CAPSTAN_ERRLEN];
    char **bids;
    size_t n;
    if (capstan_batch_list(r, &bids, &n, err)) {
        fprintf(stderr, "capstan batch: %s\n", err);
        return EXIT_REDIS;
    }
    printf("%-20s %-10s %8s %8s %8s  %s\n", "BID", "STATE", "TOTAL", "PENDING", "FAILURES",
           "DESCRIPTION");
    int status = 0;
    for (size_t i = 0; i < n; i++) {
        capstan_batch_status_t s;
        int rc = capstan_batch_status(r, bids[i], &s, err);
        if (rc == CAPSTAN_ENOTFOUND)
            continue; /* expired meanwhile */
        if (rc) {
            fprintf(stderr, "capstan batch: %s\n", err);
            status = EXIT_REDIS;
            break;
        }
        printf("%-20s %-10s %8ld %8ld %8ld  %s\n", s.bid, state_of(&s), s.total, s.pending,
               s.failures, s.description ? s.description : "");
        capstan_batch_status_clear(&s);
    }
    capstan_batch_list_free(bids, n);
    return status;
}

static int cmd_change(capstan_redis_t *r, const char *op, const char *bid)
{
    char err[CAPSTAN_ERRLEN];
    int rc = strcmp(op, "delete") == 0 ? capstan_batch_delete(r, bid, err)
                                       : capstan_batch_invalidate(r, bid, err);
    if (rc) {
        fprintf(stderr, "capstan batch: %s\n", err);
        return rc == CAPSTAN_ENOTFOUND ? EXIT_NOTFOUND : EXIT_REDIS;
    }
    printf("%s %s\n", strcmp(op, "delete") == 0 ? "deleted" : "invalidated", bid);
    return 0;
}

/* The command on the Redis at url. */
static int on_url(const char *url, int list, char **ops)
{
    int status = EXIT_REDIS;
    capstan_redis_t *r = capstan__cli_connect("capstan batch", url, &status);
    if (r)
        status = list ? cmd_list(r)
               : strcmp(ops[0], "status") == 0 ? cmd_status(r, ops[1])
               : cmd_change(r, ops[0], ops[1]);
    capstan_redis_free(r);
    return status;
}

/* With shards: a batch lives in the shard its maker's client wrote it to
 * (one without shards: a batch needs one MULTI), which its bid does not
 * say. So list shows each shard's, and a BID is looked for in each until
 * found. A shard that cannot be reached is named and the others read;
 * the status is then EXIT_REDIS unless the batch was found elsewhere. */
static int every_shard(const capstan_cli_fleet_t *f, int list, char **ops)
{
    int status = list ? 0 : EXIT_NOTFOUND;
    for (size_t i = 0; i < f->nshards; i++) {
        char err[CAPSTAN_ERRLEN];
        int failed = EXIT_REDIS;
        capstan_redis_t *r = capstan__cli_connect_err(f->shards[i].redis_url, &failed, err);
        if (!r) {
            fprintf(stderr, "capstan batch: shard %s: %s\n", f->shards[i].name, err);
            status = status == EXIT_NOTFOUND || !status ? failed : status;
            continue;
        }
        if (list) {
            printf("%sShard %s\n", i ? "\n" : "", f->shards[i].name);
            int rc = cmd_list(r);
            status = rc ? rc : status;
            capstan_redis_free(r);
            continue;
        }
        capstan_batch_status_t s;
        int rc = capstan_batch_status(r, ops[1], &s, err);
        if (rc == 0) {
            capstan_batch_status_clear(&s);
            int show = strcmp(ops[0], "status") == 0;
            if (show)
                printf("shard:        %s\n", f->shards[i].name);
            status = show ? cmd_status(r, ops[1]) : cmd_change(r, ops[0], ops[1]);
            capstan_redis_free(r);
            return status;
        }
        if (rc != CAPSTAN_ENOTFOUND) {
            fprintf(stderr, "capstan batch: shard %s: %s\n", f->shards[i].name, err);
            status = EXIT_REDIS;
        }
        capstan_redis_free(r);
    }
    if (status == EXIT_NOTFOUND)
        fprintf(stderr, "capstan batch: no batch %s in any shard\n", ops[1]);
    return status;
}

int capstan__cmd_batch(int argc, char **argv)
{
    capstan_cli_fleet_t f = {0};
    int done = capstan__cli_fleet_options("capstan batch", usage, argc, argv, &f, NULL);
    if (done >= 0)
        return done;
    int nops = argc - optind;
    char **ops = argv + optind;
    int list = nops == 1 && strcmp(ops[0], "list") == 0;
    int one = nops == 2 && (strcmp(ops[0], "status") == 0 || strcmp(ops[0], "delete") == 0
                            || strcmp(ops[0], "invalidate") == 0);
    if (!list && !one) {
        fprintf(stderr, "capstan batch: expected status BID, list, delete BID or invalidate BID\n\n%s",
                usage);
        return CAPSTAN_EXIT_USAGE;
    }
    int status = capstan__cli_fleet_load("capstan batch", &f);
    if (status < 0)
        status = f.nshards > 1 ? every_shard(&f, list, ops)
                               : on_url(f.nshards ? f.shards[0].redis_url : f.url, list, ops);
    capstan__cli_fleet_free(&f);
    return status;
}
