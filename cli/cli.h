/* The subcommands of the capstan command, one file each, which the command
 * table in cli.c dispatches to. Each takes its own argv (argv[0] is the
 * command's name) and returns the process's exit status. */
#ifndef CAPSTAN_CLI_CLI_H
#define CAPSTAN_CLI_CLI_H

#include "capstan/runtime.h"

/* `capstan run`: init, when not NULL, registers the program's own handlers
 * after the plugins' (capstan_main's argument). */
int capstan__cmd_run(int argc, char **argv, capstan_plugin_init_fn init);
/* `capstan push`: init, when not NULL, registers the program's own classes,
 * whose options a push takes as run's handlers do. */
int capstan__cmd_push(int argc, char **argv, capstan_plugin_init_fn init);
int capstan__cmd_stats(int argc, char **argv);
int capstan__cmd_locks(int argc, char **argv);
int capstan__cmd_lock(int argc, char **argv);
int capstan__cmd_top(int argc, char **argv);
int capstan__cmd_limits(int argc, char **argv);
int capstan__cmd_batch(int argc, char **argv);
int capstan__cmd_cancel(int argc, char **argv);
int capstan__cmd_periodic(int argc, char **argv);
int capstan__cmd_pause(int argc, char **argv);
int capstan__cmd_unpause(int argc, char **argv);
int capstan__cmd_probe(int argc, char **argv);

#endif
