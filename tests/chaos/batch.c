/* The fault-injection harness's batch maker (scripts/chaos.sh), through the
 * C client API as an application makes a batch:
 *
 *     capstan-chaos-batch URL TAG N
 *
 * makes one batch of N LedgerBatchJob jobs on queue "chaos" (args
 * [ms, TAG, i], ms from 0 to 50), with complete and success callbacks of
 * class LedgerBatchCallback on that queue (options {"tag": TAG}), commits
 * it, and prints
 *
 *     bid <bid>
 *     jid <jid>        (N lines, once the pushes are in)
 *     committed
 *
 * The harness reads how far it got: without "jid" lines the jobs may or may
 * not be in (a lost reply); without "committed" the batch may or may not be
 * committed. Exit status 0 when committed, 1 otherwise, 2 on bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <capstan/batch.h>
#include <capstan/client.h>

int main(int argc, char **argv)
{
    if (argc != 4 || atoi(argv[3]) <= 0 || atoi(argv[3]) > 1000 || strlen(argv[2]) > 64) {
        fprintf(stderr, "usage: capstan-chaos-batch URL TAG N (N from 1 to 1000)\n");
        return 2;
    }
    const char *tag = argv[2];
    size_t n = (size_t)atoi(argv[3]);
    char err[CAPSTAN_ERRLEN], opts[128];
    capstan_client_t *c = capstan_client_new(argv[1], err);
    if (!c) {
        fprintf(stderr, "capstan-chaos-batch: %s\n", err);
        return 1;
    }
    int status = 1;
    capstan_batch_t *b = capstan_batch_new(c, err);
    char **args = calloc(n, sizeof(*args));
    char (*jids)[25] = calloc(n, sizeof(*jids));
    snprintf(opts, sizeof(opts), "{\"tag\":\"%s\"}", tag);
    if (!b || !args || !jids) {
        fprintf(stderr, "capstan-chaos-batch: %s\n", b ? "out of memory" : err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        static const int ms[] = { 0, 1, 5, 20, 50 };
        args[i] = malloc(96);
        if (!args[i])
            goto out;
        snprintf(args[i], 96, "[%d,\"%s\",%zu]", ms[(i * 7 + n) % 5], tag, i);
    }
    capstan_push_opts_t po = capstan_push_opts_default();
    po.queue = "chaos";
    if (capstan_batch_describe(b, tag) || capstan_batch_on(b, CAPSTAN_BATCH_COMPLETE, "LedgerBatchCallback", "chaos", opts) ||
        capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "LedgerBatchCallback", "chaos", opts)) {
        fprintf(stderr, "capstan-chaos-batch: %s\n", capstan_batch_error(b));
        goto out;
    }
    printf("bid %s\n", capstan_batch_bid(b));
    fflush(stdout);
    if (capstan_batch_push_bulk(b, "LedgerBatchJob", (const char *const *)args, n, &po, jids) != 0) {
        fprintf(stderr, "capstan-chaos-batch: push: %s\n", capstan_batch_error(b));
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        printf("jid %s\n", jids[i]);
    fflush(stdout);
    if (capstan_batch_commit(b) != 0) {
        fprintf(stderr, "capstan-chaos-batch: commit: %s\n", capstan_batch_error(b));
        goto out;
    }
    printf("committed\n");
    status = 0;
out:
    if (args)
        for (size_t i = 0; i < n; i++)
            free(args[i]);
    free(args);
    free(jids);
    capstan_batch_free(b);
    capstan_client_free(c);
    return status;
}
