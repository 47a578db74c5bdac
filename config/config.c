/* The configuration struct itself: defaults, the checks every source of
 * settings shares (file, flags, environment), and small setters, so that
 * yaml.c and args.c only translate their syntax into calls here. */
#include "capstan/config.h"
#include "support/number.h"
#include "config/bounds.h"
#include "config/names.h"
#include "config/periodic.h"
#include "config/tls.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_REDIS_URL "redis://127.0.0.1:6379/0"

int capstan_config_set_str(char **slot, const char *value)
{
    char *copy = NULL;
    if (value && !(copy = strdup(value)))
        return CAPSTAN_ENOMEM;
    free(*slot);
    *slot = copy;
    return 0;
}

capstan_config_t *capstan_config_new(void)
{
    capstan_config_t *cfg = calloc(1, sizeof(*cfg));
    if (!cfg)
        return NULL;
    cfg->concurrency = 10;
    cfg->processes = 1;
    cfg->timeout = 25;
    cfg->startup_timeout = 30;
    cfg->max_retries = 25;
    cfg->dead_max_jobs = 10000;
    cfg->dead_timeout = 180L * 24 * 60 * 60;
    cfg->poll_interval_average = 0;
    cfg->average_scheduled_poll_interval = 5;
    cfg->heartbeat_interval = 5;
    cfg->recovery_interval = 60;
    cfg->max_recoveries = 3;
    cfg->liveness_ttl = 60;
    cfg->reaper_interval = 600;
    cfg->reaper_count = 1000;
    cfg->reaper_timeout = 10;
    cfg->min_replicas_timeout = 1000;
    cfg->fetch = CAPSTAN_FETCH_RELIABLE;
    cfg->timestamps = CAPSTAN_TS_FLOAT;
    cfg->sidekiq_metrics = 3;
    cfg->log_format = CAPSTAN_LOG_PRETTY;
    cfg->strict = 1;
    cfg->redis_url = strdup(DEFAULT_REDIS_URL);
    cfg->tag = strdup("");
    if (!cfg->redis_url || !cfg->tag ||
        capstan_config_append_queue(cfg, "default", 0, NULL) < 0) {
        capstan_config_free(cfg);
        return NULL;
    }
    return cfg;
}

static void free_queues(capstan_queue_conf_t *q, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(q[i].name);
    free(q);
}

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void capstan_config_free(capstan_config_t *cfg)
{
    if (!cfg)
        return;
    free(cfg->redis_url);
    free_queues(cfg->queues, cfg->nqueues);
    free(cfg->tag);
    free_strv(cfg->labels, cfg->nlabels);
    free(cfg->environment);
    free_strv(cfg->plugins, cfg->nplugins);
    for (size_t i = 0; i < cfg->nclasses; i++) {
        free(cfg->classes[i].name);
        free(cfg->classes[i].queue);
        free(cfg->classes[i].lock);
        free(cfg->classes[i].lock_prefix);
        free(cfg->classes[i].lock_args);
        free(cfg->classes[i].on_conflict_client);
        free(cfg->classes[i].on_conflict_server);
        free((char *)cfg->classes[i].limit.name);
    }
    free(cfg->classes);
    free(cfg->log_file);
    free(cfg->pidfile);
    free_strv(cfg->warnings, cfg->nwarnings);
    free(cfg->config_file);
    free(cfg->metrics_bind);
    capstan__config_tls_clear(&cfg->tls);
    capstan__periodic_conf_free(cfg);
    free(cfg);
}

const char *capstan_config_environment(const capstan_config_t *cfg)
{
    static const char *vars[] = {"APP_ENV", "RAILS_ENV", "RACK_ENV"};
    if (cfg->environment && *cfg->environment)
        return cfg->environment;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return v;
    }
    return "development";
}

void capstan_config_apply_env(capstan_config_t *cfg)
{
    if (cfg->redis_url_explicit)
        return;
    /* As in Sidekiq, REDIS_PROVIDER names the variable (a hosting add-on's
     * own name for it); when it is set, REDIS_URL is not consulted. */
    const char *provider = getenv("REDIS_PROVIDER");
    const char *url = getenv(provider && *provider ? provider : "REDIS_URL");
    if (url && *url)
        capstan_config_set_str(&cfg->redis_url, url); /* keeps the old URL on ENOMEM */
}

int capstan_config_append_queue(capstan_config_t *cfg, const char *name, int weight,
                                char *err)
{
    for (size_t i = 0; i < cfg->nqueues; i++)
        if (strcmp(cfg->queues[i].name, name) == 0)
            return capstan_seterr(err, CAPSTAN_ECONFIG, "queue %s is given twice", name);
    char *copy = strdup(name);
    capstan_queue_conf_t *q = copy ? realloc(cfg->queues, (cfg->nqueues + 1) * sizeof(*q))
                               : NULL;
    if (!q) {
        free(copy);
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    }
    q[cfg->nqueues].name = copy;
    q[cfg->nqueues].weight = weight;
    cfg->queues = q;
    cfg->nqueues++;
    return 0;
}

/* Parses a whole decimal integer in [1, INT_MAX]; 0 or CAPSTAN_EINVAL. */
static int parse_weight(const char *s, int *out)
{
    double v;
    if (capstan__parse_number(s, 1, 1, INT_MAX, &v))
        return CAPSTAN_EINVAL;
    *out = (int)v;
    return 0;
}

int capstan_config_add_queue(capstan_config_t *cfg, const char *word, char *err)
{
    capstan_config_t fresh = {0};
    int rc = 0, weight = 0;
    char *name = strdup(word);
    if (!name)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    char *comma = strchr(name, ',');
    if (comma) {
        *comma = '\0';
        if (parse_weight(comma + 1, &weight) < 0) {
            rc = capstan_seterr(err, CAPSTAN_ECONFIG,
                                "queue %s: weight must be an integer >= 1", word);
            goto out;
        }
    }
    if (!*name) {
        rc = capstan_seterr(err, CAPSTAN_ECONFIG, "queue %s: name is empty", word);
        goto out;
    }
    if (cfg->queues_from_flags) {
        rc = capstan_config_append_queue(cfg, name, weight, err);
        goto out;
    }
    /* The first flag replaces the file's or the default list; build the new
     * list aside so cfg is untouched if this fails. */
    rc = capstan_config_append_queue(&fresh, name, weight, err);
    if (rc < 0)
        goto out;
    free_queues(cfg->queues, cfg->nqueues);
    cfg->queues = fresh.queues;
    cfg->nqueues = fresh.nqueues;
    cfg->queues_from_flags = 1;
out:
    free(name);
    return rc;
}

int capstan__config_queue_name_check(const char *name, char *err)
{
    if (!*name)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "a queue name is empty");
    for (const char *p = name; *p; p++)
        if (isspace((unsigned char)*p))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "queue name \"%s\" contains a space", name);
    return 0;
}

#define CAPSTAN_CONFIG_MAX_SECONDS (10.0 * 365 * 24 * 3600)

int capstan_config_validate(capstan_config_t *cfg, char *err)
{
    /* The same wording as yaml.c uses, so a value reads the same whichever
     * way it was given. */
    if (cfg->concurrency < 1 || cfg->concurrency > 1000)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "concurrency: must be an integer between 1 and 1000");
    if (cfg->processes < 1 || cfg->processes > CAPSTAN_MAX_PROCESSES)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "processes: must be an integer between 1 and %d", CAPSTAN_MAX_PROCESSES);
    if (cfg->max_memory < 0)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "max_memory: must be a size >= 0");
    if (cfg->prefetch < 0 || cfg->prefetch > 100000)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "prefetch: must be an integer between 0 and 100000");
    /* Periods, with the file's floors (config/bounds.h). */
    const struct { const char *key; double v; int zero_ok; } periods[] = {
        { "timeout", cfg->timeout, 0 },
        { "startup_timeout", cfg->startup_timeout, 1 },
        { "poll_interval_average", cfg->poll_interval_average, 1 },
        { "average_scheduled_poll_interval", cfg->average_scheduled_poll_interval, 0 },
        { "heartbeat_interval", cfg->heartbeat_interval, 0 },
        { "recovery_interval", cfg->recovery_interval, 0 },
        { "liveness_ttl", cfg->liveness_ttl, 0 },
        { "max_iteration_runtime", cfg->max_iteration_runtime, 1 },
    };
    for (size_t i = 0; i < sizeof(periods) / sizeof(periods[0]); i++)
        if (!capstan__config_period_ok(periods[i].key, periods[i].zero_ok, periods[i].v)) {
            char want[96];
            capstan__config_period_want(periods[i].key, periods[i].zero_ok, want, sizeof(want));
            return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: %s", periods[i].key, want);
        }
    if (cfg->max_retries < 0)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "max_retries: must be an integer >= 0");
    if (cfg->dead_max_jobs < 1)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "dead_max_jobs: must be an integer >= 1");
    if (cfg->dead_timeout < 1)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "dead_timeout_in_seconds: must be an integer >= 1");
    /* Two refreshes may fail (a Redis blip) before the key lapses and the
     * fleet takes this live process's jobs. Only a file sets the two, so
     * the message names it when there is one. */
    if (cfg->heartbeat_interval * CAPSTAN__LIVENESS_BEATS > cfg->liveness_ttl)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "%s%sliveness_ttl: must be at least %d times heartbeat_interval (%g s)",
                              cfg->config_file ? cfg->config_file : "", cfg->config_file ? ": " : "",
                              CAPSTAN__LIVENESS_BEATS, cfg->heartbeat_interval);
    /* A duration past ten years is a typo, and would overflow once turned
     * into milliseconds or a timespec. */
    const struct { const char *key; double v; } durations[] = {
        { "timeout", cfg->timeout },
        { "startup_timeout", cfg->startup_timeout },
        { "max_iteration_runtime", cfg->max_iteration_runtime },
        { "dead_timeout_in_seconds", (double)cfg->dead_timeout },
        { "poll_interval_average", cfg->poll_interval_average },
        { "average_scheduled_poll_interval", cfg->average_scheduled_poll_interval },
        { "heartbeat_interval", cfg->heartbeat_interval },
        { "recovery_interval", cfg->recovery_interval },
        { "liveness_ttl", cfg->liveness_ttl },
    };
    for (size_t i = 0; i < sizeof(durations) / sizeof(durations[0]); i++)
        if (durations[i].v > CAPSTAN_CONFIG_MAX_SECONDS)
            return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: must be at most %.0f seconds (ten years)",
                                  durations[i].key, CAPSTAN_CONFIG_MAX_SECONDS);
    if (cfg->max_recoveries < 1)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "max_recoveries: must be an integer >= 1");
    if (!cfg->redis_url || !*cfg->redis_url)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "redis_url: must not be empty");
    if (cfg->nqueues == 0)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "queues: must list at least one queue");

    int weighted = 0;
    for (size_t i = 0; i < cfg->nqueues; i++) {
        const capstan_queue_conf_t *q = &cfg->queues[i];
        char why[CAPSTAN_ERRLEN];
        if (capstan__config_queue_name_check(q->name, why))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "queues: %s", why);
        if (q->weight < 0)
            return capstan_seterr(err, CAPSTAN_ECONFIG,
                                  "queues: weight of %s must be an integer >= 1", q->name);
        if (q->weight > 0)
            weighted = 1;
    }
    /* Sidekiq ignores a `strict:` setting: only weights decide the order. */
    cfg->strict = !weighted;
    return capstan__config_tls_into_url(cfg, err);
}

const capstan_class_conf_t *capstan_config_class(const capstan_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nclasses; i++)
        if (strcmp(cfg->classes[i].name, name) == 0)
            return &cfg->classes[i];
    return NULL;
}

static const char *const unknown_names[] = {
    [CAPSTAN_UNKNOWN_FAIL] = "fail", [CAPSTAN_UNKNOWN_REQUEUE] = "requeue", [CAPSTAN_UNKNOWN_SKIP] = "skip",
};

int capstan_config_unknown_class(const char *word, capstan_unknown_class_t *out)
{
    for (size_t i = 0; i < sizeof(unknown_names) / sizeof(*unknown_names); i++)
        if (word && strcmp(word, unknown_names[i]) == 0) {
            *out = (capstan_unknown_class_t)i;
            return 0;
        }
    return CAPSTAN_ECONFIG;
}

const char *capstan_config_unknown_class_name(capstan_unknown_class_t v)
{
    return (unsigned)v < sizeof(unknown_names) / sizeof(*unknown_names) ? unknown_names[v] : "fail";
}
