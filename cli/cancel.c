/* `capstan cancel JID...`: cancels jobs as Sidekiq::Client#cancel! does
 * (capstan_client_cancel). */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "client/txn.h"
#include "capstan/capstan.h"
#include "capstan/client.h"

static const char *usage =
    "Usage: capstan cancel JID... [--redis-url URL | -C FILE [--shard NAME]]\n"
    "\n"
    "Cancels each job as Sidekiq::Client#cancel! does: an iterating job (capstan\n"
    "or Ruby Sidekiq::IterableJob) stops at its next state flush (every 5 s) and\n"
    "ends without retry; a job not started yet stops at its first step. Any\n"
    "handler can poll capstan_job_cancelled. Prints when each was cancelled (the\n"
    "first cancel's time when it already was).\n"
    "\n"
    "With -C FILE's shards: list, each job is cancelled in every shard, as its jid\n"
    "does not say which one holds it (the mark expires where it is not), and the\n"
    "time is the first cancel's in any. A shard that cannot be reached is named\n"
    "on stderr, the others still done, and the exit status is 1.\n"
    "\n"
    CAPSTAN_CLI_FLEET_USAGE("in that shard alone");

int capstan__cmd_cancel(int argc, char **argv)
{
    capstan_cli_fleet_t f = {0};
    int done = capstan__cli_fleet_options("capstan cancel", usage, argc, argv, &f, NULL);
    if (done >= 0)
        return done;
    if (optind >= argc) {
        fprintf(stderr, "capstan cancel: give the jid of each job to cancel\n%s", usage);
        return CAPSTAN_EXIT_USAGE;
    }
    done = capstan__cli_fleet_load("capstan cancel", &f);
    if (done >= 0) {
        capstan__cli_fleet_free(&f);
        return done;
    }
    /* With shards, in each: a jid does not say which shard its job is in
     * (its queue's home, its lock digest's or its own pick), and a mark
     * where the job is not only expires, as Sidekiq's does for a job that
     * never runs. */
    size_t n = f.nshards ? f.nshards : 1;
    capstan_client_t **cs = calloc(n, sizeof(*cs));
    int status = cs ? 0 : 1;
    char err[CAPSTAN_ERRLEN];
    for (size_t k = 0; cs && k < n; k++) {
        int code;
        cs[k] = capstan__client_open(capstan__cli_redis_url(f.nshards ? f.shards[k].redis_url : f.url), err, &code);
        if (!cs[k]) {
            fprintf(stderr, "capstan cancel: %s%s%s%s\n", f.nshards ? "shard " : "",
                    f.nshards ? f.shards[k].name : "", f.nshards ? ": " : "", err);
            status = code == CAPSTAN_ECONFIG ? CAPSTAN_EXIT_CONFIG : 1;
        }
    }
    for (int i = optind; cs && (f.nshards || cs[0]) && i < argc; i++) {
        long long at = -1;
        for (size_t k = 0; k < n; k++) {
            long long t = cs[k] ? capstan_client_cancel(cs[k], argv[i]) : -1;
            if (cs[k] && t < 0) {
                fprintf(stderr, "capstan cancel: %s%s%s%s\n", f.nshards ? "shard " : "",
                        f.nshards ? f.shards[k].name : "", f.nshards ? ": " : "", capstan_client_error(cs[k]));
                status = status ? status : 1;
            }
            if (t >= 0 && (at < 0 || t < at)) /* the first cancel's time */
                at = t;
        }
        if (at < 0)
            continue;
        time_t t = (time_t)at;
        struct tm tm;
        char when[32];
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
        printf("%s cancelled at %s\n", argv[i], when);
    }
    for (size_t k = 0; cs && k < n; k++)
        capstan_client_free(cs[k]);
    free(cs);
    capstan__cli_fleet_free(&f);
    return status;
}
