/* capstan_main: the capstan command line and its command table. `capstan run` (the
 * default) starts a worker; the other subcommands (push, stats, locks, lock,
 * limits, top, batch, version) are tools around the same Redis, one file each. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "support/log.h"
#include "capstan/capstan.h"
#include "capstan/redis.h"
#include "redis/url.h"

static const char *main_usage =
    "Usage: capstan [COMMAND] [options]\n"
    "\n"
    "Commands:\n"
    "  run       process jobs (the default when no command is given)\n"
    "  push      push a job: capstan push CLASS [ARGS_JSON] [options]\n"
    "  stats     processed/failed counts, queues, sets, processes, working lists\n"
    "  locks     uniqueness locks: list, info, delete, metrics, reap, upgrade\n"
    "  lock      run a command under a FIFO lock: capstan lock NAME [options] -- CMD...\n"
    "  limits    rate limiters: list, info NAME (holders, window fill, wait)\n"
    "  top       live view: queues, processes, throughput, retries/dead, contended locks\n"
    "  batch     batches: status BID, list, delete BID, invalidate BID\n"
    "  version   print the version\n"
    "\n"
    "`capstan COMMAND --help` describes each command's options.\n";

const char *capstan__cli_redis_url(const char *flag)
{
    if (flag && *flag)
        return flag;
    const char *provider = getenv("REDIS_PROVIDER");
    const char *url = provider && *provider ? getenv(provider) : NULL;
    if (!url || !*url)
        url = getenv("REDIS_URL");
    return url && *url ? url : "redis://127.0.0.1:6379/0";
}

capstan_redis_t *capstan__cli_connect(const char *who, const char *url_flag)
{
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(capstan__cli_redis_url(url_flag), 10, err);
    if (!r) {
        fprintf(stderr, "%s: %s\n", who, err);
        return NULL;
    }
    if (capstan_redis_connect(r)) {
        fprintf(stderr, "%s: %s\n", who, capstan_redis_error(r));
        capstan_redis_free(r);
        return NULL;
    }
    return r;
}

/* Set when a password was blanked from the command line, for cmd_run to
 * warn in its log. */
static int argv_had_password;

/* The password of s when it is a redis://, rediss:// or unix:// URL, or a
 * --flag=URL (as url.c reads it: the userinfo up to the last '@', or the
 * password= of a socket URL); its length, 0 when there is none. Other
 * words (a job's arguments) are left alone. */
static size_t password_in(char *s, char **at)
{
    if (strncmp(s, "--", 2) == 0 && strchr(s, '='))
        s = strchr(s, '=') + 1;
    if (strncmp(s, "redis://", 8) != 0 && strncmp(s, "rediss://", 9) != 0
        && strncmp(s, "unix://", 7) != 0)
        return 0;
    char *auth = strstr(s, "://") + 3;
    char *end = strrchr(auth, '@');
    if (end) {
        char *colon = memchr(auth, ':', (size_t)(end - auth));
        *at = colon ? colon + 1 : auth;
        return (size_t)(end - *at);
    }
    char *q = strstr(auth, "password=");
    if (!q)
        return 0;
    *at = q + 9;
    return strcspn(*at, "&");
}

/* Anyone on the machine reads a process's command line (ps,
 * /proc/PID/cmdline), so a password given in --redis-url is copied for
 * the commands to use and blanked in the original argv bytes, which are
 * what the kernel shows. Arguments after "--" belong to another program. */
static void hide_passwords(int argc, char **argv)
{
    static char *copies[8]; /* kept for the life of the process */
    static size_t ncopies;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        char *at = NULL;
        size_t len = password_in(argv[i], &at);
        char *copy = len && ncopies < sizeof(copies) / sizeof(copies[0]) ? strdup(argv[i]) : NULL;
        if (!copy)
            continue;
        copies[ncopies++] = copy;
        memset(at, '*', len);
        argv[i] = copy;
        argv_had_password = 1;
    }
}

static const char *password_warning =
    "a password on the command line is visible to every user (ps); it was blanked there, but "
    "pass it in REDIS_URL or the config file instead";

/* Writes this process's id to path, for supervisors that want one. */
static int write_pidfile(const char *path, char *err)
{
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0) {
        int e = errno;
        if (f)
            unlink(path);
        return capstan_seterr(err, CAPSTAN_ECONFIG, "pidfile: cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

/* The exit status for what capstan_runtime_run returned: a refusal by Redis
 * is a configuration error, a Redis that never answered is unavailable. */
static int run_status(int rc)
{
    if (rc == CAPSTAN_ECONFIG)
        return CAPSTAN_EXIT_CONFIG;
    if (rc == CAPSTAN_EREDIS)
        return CAPSTAN_EXIT_UNAVAILABLE;
    return rc ? 1 : 0;
}

static int cmd_run(int argc, char **argv, capstan_plugin_init_fn init)
{
    char err[CAPSTAN_ERRLEN] = "";
    capstan_config_t *cfg = capstan_config_new();
    if (!cfg) {
        fprintf(stderr, "capstan: out of memory\n");
        return 1;
    }
    int rc = capstan_config_parse_args(cfg, argc, argv, err);
    if (rc == CAPSTAN_ENOTFOUND) {
        fputs(capstan_config_usage(), stdout);
        capstan_config_free(cfg);
        return 0;
    }
    if (!rc)
        rc = capstan_config_validate(cfg, err);
    /* A URL that can never work is a configuration error (78), found before
     * the worker starts rather than as a runtime failure. */
    capstan_redis_url_t url;
    if (!rc && !(rc = capstan__redis_url_parse(cfg->redis_url, &url, err))) {
        if (url.host && url.host[strcspn(url.host, " \t\r\n")])
            rc = capstan_seterr(err, CAPSTAN_ECONFIG, "redis url: the host \"%s\" contains a space",
                                url.host);
        capstan__redis_url_clear(&url);
    }
    if (rc) {
        fprintf(stderr, "capstan: %s\n", err);
        capstan_config_free(cfg);
        return CAPSTAN_EXIT_CONFIG;
    }
    if (capstan__log_setup(cfg->log_format, cfg->verbose, cfg->log_file)) {
        fprintf(stderr, "capstan: log_file: cannot open %s\n", cfg->log_file);
        capstan_config_free(cfg);
        return CAPSTAN_EXIT_CONFIG;
    }
    if (argv_had_password)
        capstan_warn("%s", password_warning);
    for (size_t i = 0; i < cfg->nwarnings; i++)
        capstan_warn("%s", cfg->warnings[i]);
    if (cfg->config_file)
        capstan_debug("read %s (environment %s)", cfg->config_file, capstan_config_environment(cfg));
    /* A copy: the runtime frees cfg before the file is removed. */
    char *pidfile = NULL;
    if (cfg->pidfile && !(pidfile = strdup(cfg->pidfile)))
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    else if (pidfile && (rc = write_pidfile(pidfile, err)) != 0)
        free(pidfile);
    if (rc) {
        fprintf(stderr, "capstan: %s\n", err);
        capstan_config_free(cfg);
        return rc == CAPSTAN_ENOMEM ? 1 : CAPSTAN_EXIT_CONFIG;
    }
    capstan_runtime_t *rt = capstan_runtime_new(cfg, err);
    if (!rt) {
        fprintf(stderr, "capstan: %s\n", err);
        capstan_config_free(cfg);
        rc = 1;
        goto out;
    }
    for (size_t i = 0; i < cfg->nplugins && !rc; i++)
        if (!(rc = capstan_runtime_load_plugin(rt, cfg->plugins[i], err)))
            capstan_debug("loaded plugin %s", cfg->plugins[i]);
    if (!rc && init && init(rt) != 0)
        rc = capstan_seterr(err, CAPSTAN_EINVAL, "the program's handler registration failed");
    if (rc) {
        fprintf(stderr, "capstan: %s\n", err);
        capstan_runtime_free(rt);
        rc = CAPSTAN_EXIT_CONFIG;
        goto out;
    }
    rc = capstan_runtime_run(rt, err);
    if (rc)
        capstan_error("%s", err);
    rc = run_status(rc);
    if (pidfile)
        unlink(pidfile);
    free(pidfile);
    pidfile = NULL;
    if (capstan_runtime_abandoned(rt)) {
        /* Handlers still running own memory we cannot reclaim; their jobs
         * are back in their queues. Leave without running exit handlers. */
        capstan__log_flush();
        fflush(NULL);
        _exit(rc);
    }
    capstan_runtime_free(rt);
out:
    if (pidfile)
        unlink(pidfile);
    free(pidfile);
    capstan__log_close();
    return rc;
}

int capstan_main(int argc, char **argv, capstan_plugin_init_fn init)
{
    const char *cmd = argc > 1 ? argv[1] : "run";
    hide_passwords(argc, argv);
    if (argv_had_password && strcmp(cmd, "run") != 0 && cmd[0] != '-')
        fprintf(stderr, "capstan: %s\n", password_warning);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("capstan %s\n", CAPSTAN_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(main_usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "push") == 0)
        return capstan__cmd_push(argc - 1, argv + 1);
    if (strcmp(cmd, "stats") == 0)
        return capstan__cmd_stats(argc - 1, argv + 1);
    if (strcmp(cmd, "locks") == 0)
        return capstan__cmd_locks(argc - 1, argv + 1);
    if (strcmp(cmd, "lock") == 0)
        return capstan__cmd_lock(argc - 1, argv + 1);
    if (strcmp(cmd, "limits") == 0)
        return capstan__cmd_limits(argc - 1, argv + 1);
    if (strcmp(cmd, "top") == 0)
        return capstan__cmd_top(argc - 1, argv + 1);
    if (strcmp(cmd, "batch") == 0)
        return capstan__cmd_batch(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 1, argv + 1, init);
    if (cmd[0] == '-')
        return cmd_run(argc, argv, init); /* flags only: run */
    fprintf(stderr, "capstan: unknown command \"%s\"\n\n%s", cmd, main_usage);
    return CAPSTAN_EXIT_USAGE;
}

int capstan__cli_options(const char *who, const char *usage, int argc, char **argv, const char **url,
                         int *json)
{
    static const struct option with_json[] = {
        { "json", no_argument, NULL, 'j' }, { "redis-url", required_argument, NULL, 'u' },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    const struct option *longopts = json ? with_json : with_json + 1;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (opt == 'j') {
            *json = 1;
        } else if (opt == 'u') {
            *url = optarg;
        } else if (opt == 'h') {
            fputs(usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "%s: %s: unknown option or missing value\n\n%s", who,
                    argv[optind - 1], usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    return -1;
}
