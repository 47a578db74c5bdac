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
    "Usage: capstan cancel JID... [--redis-url URL]\n"
    "\n"
    "Cancels each job as Sidekiq::Client#cancel! does: an iterating job (capstan\n"
    "or Ruby Sidekiq::IterableJob) stops at its next state flush (every 5 s) and\n"
    "ends without retry; a job not started yet stops at its first step. Any\n"
    "handler can poll capstan_job_cancelled. Prints when each was cancelled (the\n"
    "first cancel's time when it already was).\n";

int capstan__cmd_cancel(int argc, char **argv)
{
    const char *url = NULL;
    int done = capstan__cli_options("capstan cancel", usage, argc, argv, &url, NULL);
    if (done >= 0)
        return done;
    if (optind >= argc) {
        fprintf(stderr, "capstan cancel: give the jid of each job to cancel\n%s", usage);
        return CAPSTAN_EXIT_USAGE;
    }
    char err[CAPSTAN_ERRLEN];
    int code;
    capstan_client_t *c = capstan__client_open(capstan__cli_redis_url(url), err, &code);
    if (!c) {
        fprintf(stderr, "capstan cancel: %s\n", err);
        return code == CAPSTAN_ECONFIG ? CAPSTAN_EXIT_CONFIG : 1;
    }
    int status = 0;
    for (int i = optind; i < argc; i++) {
        long long at = capstan_client_cancel(c, argv[i]);
        if (at < 0) {
            fprintf(stderr, "capstan cancel: %s\n", capstan_client_error(c));
            status = 1;
            continue;
        }
        time_t t = (time_t)at;
        struct tm tm;
        char when[32];
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
        printf("%s cancelled at %s\n", argv[i], when);
    }
    capstan_client_free(c);
    return status;
}
