/* `capstan run` (also the command when none is given): reads the
 * configuration, writes the pidfile, loads the plugins and the program's
 * handlers, and runs the worker until it is told to stop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/password.h"
#include "support/log.h"
#include "capstan/capstan.h"
#include "capstan/redis.h"
#include "redis/url.h"

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

int capstan__cmd_run(int argc, char **argv, capstan_plugin_init_fn init)
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
    if (capstan__cli_password_hidden())
        capstan_warn("%s", capstan__cli_password_warning);
    for (size_t i = 0; i < cfg->nwarnings; i++)
        capstan_warn("%s", cfg->warnings[i]);
    if (cfg->config_file)
        capstan_debug("read %s (environment %s)", cfg->config_file, capstan_config_environment(cfg));
    /* A copy: the runtime frees cfg before the file is removed. */
    char *pidfile = NULL;
    /* A worker started by a reload leaves the pidfile to its supervisor. */
    if (cfg->pidfile && !getenv(CAPSTAN_WORKER_ENV) && !(pidfile = strdup(cfg->pidfile)))
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
        rc = capstan_seterr(err, CAPSTAN_EINVAL, "the program's handler registration failed%s%s",
                            *capstan_runtime_error(rt) ? ": " : "", capstan_runtime_error(rt));
    if (rc) {
        fprintf(stderr, "capstan: %s\n", err);
        capstan_runtime_free(rt);
        rc = CAPSTAN_EXIT_CONFIG;
        goto out;
    }
    if (!cfg->no_supervisor || getenv(CAPSTAN_WORKER_ENV)) {
        int worker = 0;
        rc = capstan_runtime_supervise(rt, argc, argv, &worker, err);
        if (!worker || rc) {
            if (worker)
                fprintf(stderr, "capstan: %s\n", err);
            capstan_runtime_free(rt);
            rc = worker ? 1 : rc;
            goto out;
        }
        /* A worker: the pidfile is its supervisor's. */
        free(pidfile);
        pidfile = NULL;
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
