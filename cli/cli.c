/* capstan_main: the capstan command line's command table. `capstan run` (the
 * default) starts a worker; the other subcommands are tools around the same
 * Redis, one file each. The usage is printed from the table, so a command
 * cannot be dispatched without being listed. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/password.h"
#include "capstan/capstan.h"

static const struct command {
    const char *name;
    const char *summary;                /* one line of the usage */
    int (*fn)(int argc, char **argv);   /* NULL: run, push and version, below */
    /* run and push: they see the classes the program registers (init) */
    int (*fn_init)(int argc, char **argv, capstan_plugin_init_fn init);
} commands[] = {
    { "run", "process jobs (the default when no command is given)", NULL, capstan__cmd_run },
    { "push", "push a job: capstan push CLASS [ARGS_JSON] [options]", NULL, capstan__cmd_push },
    { "stats", "processed/failed counts, queues, sets, processes, working lists", capstan__cmd_stats, NULL },
    { "locks", "uniqueness locks: list, info, delete, metrics, reap, upgrade", capstan__cmd_locks, NULL },
    { "lock", "run a command under a FIFO lock: capstan lock NAME [options] -- CMD...", capstan__cmd_lock, NULL },
    { "limits", "rate limiters: list, info NAME (holders, window fill, wait)", capstan__cmd_limits, NULL },
    { "top", "live view: queues, processes, throughput, retries/dead, contended locks", capstan__cmd_top, NULL },
    { "batch", "batches: status BID, list, delete BID, invalidate BID", capstan__cmd_batch, NULL },
    { "cancel", "cancel jobs as Sidekiq::Client#cancel! does: capstan cancel JID...", capstan__cmd_cancel, NULL },
    { "periodic", "periodic schedules: last and next tick, where declared (-C FILE)", capstan__cmd_periodic, NULL },
    { "pause", "pause queues as Sidekiq Pro does: capstan pause QUEUE...", capstan__cmd_pause, NULL },
    { "unpause", "resume paused queues: capstan unpause QUEUE...", capstan__cmd_unpause, NULL },
    { "probe", "ask a running capstan's /readyz or /livez: capstan probe [live|ready]", capstan__cmd_probe, NULL },
    { "version", "print the version", NULL, NULL },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
    fputs("Usage: capstan [COMMAND] [options]\n\nCommands:\n", out);
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fputs("\n`capstan COMMAND --help` describes each command's options.\n", out);
}

static const struct command *find(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

int capstan_main(int argc, char **argv, capstan_plugin_init_fn init)
{
    const char *cmd = argc > 1 ? argv[1] : "run";
    capstan__cli_hide_passwords(argc, argv);
    if (capstan__cli_password_hidden() && strcmp(cmd, "run") != 0 && cmd[0] != '-')
        fprintf(stderr, "capstan: %s\n", capstan__cli_password_warning);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        if (argc > 2) {
            fprintf(stderr, "capstan version: unexpected argument \"%s\"\n\nUsage: capstan version\n",
                    argv[2]);
            return CAPSTAN_EXIT_USAGE;
        }
        printf("capstan %s\n", CAPSTAN_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (argc < 3) {
            usage(stdout);
            return 0;
        }
        /* `capstan help push` is `capstan push --help`. */
        const struct command *c = find(argv[2]);
        if (!c || argc > 3) {
            if (c)
                fprintf(stderr, "capstan help: unexpected argument \"%s\"\n\n", argv[3]);
            else
                fprintf(stderr, "capstan help: unknown command \"%s\"\n\n", argv[2]);
            usage(stderr);
            return CAPSTAN_EXIT_USAGE;
        }
        if (!c->fn && !c->fn_init) {
            printf("Usage: capstan version\n\n%s.\n", c->summary);
            return 0;
        }
        char *args[] = { argv[2], "--help", NULL };
        return c->fn ? c->fn(2, args) : c->fn_init(2, args, init);
    }
    const struct command *c = find(cmd);
    if (c && c->fn)
        return c->fn(argc - 1, argv + 1);
    if (c && c->fn_init)
        return c->fn_init(argc - 1, argv + 1, init);
    if (cmd[0] == '-')
        return capstan__cmd_run(argc, argv, init); /* flags only: run */
    fprintf(stderr, "capstan: unknown command \"%s\"\n\n", cmd);
    usage(stderr);
    return CAPSTAN_EXIT_USAGE;
}
