/* The configuration struct itself: its life (new, free), the checks that
 * hold however a setting was given (each row of the settings table, then
 * the rules that tie settings together), the queue list, the environment
 * and small setters. */
#include "capstan/config.h"
#include "support/number.h"
#include "config/bounds.h"
#include "config/names.h"
#include "periodic/periodic.h"
#include "config/settings.h"
#include "config/shards.h"
#include "config/tls.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

capstan_config_t *capstan_config_new(void)
{
    capstan_config_t *cfg = calloc(1, sizeof(*cfg));
    if (!cfg)
        return NULL;
    cfg->strict = 1;
    if (capstan__settings_defaults(cfg) < 0 || capstan_config_append_queue(cfg, "default", 0, NULL) < 0) {
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
    capstan__settings_free(cfg);
    free_queues(cfg->queues, cfg->nqueues);
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
        free(cfg->classes[i].limit_shard);
    }
    free(cfg->classes);
    for (size_t i = 0; i < cfg->nqueue_limits; i++)
        free(cfg->queue_limits[i].queue);
    free(cfg->queue_limits);
    free_strv(cfg->warnings, cfg->nwarnings);
    free(cfg->config_file);
    capstan__config_tls_clear(&cfg->tls);
    capstan__periodic_conf_free(cfg);
    capstan__config_shards_free(cfg);
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

int capstan_config_validate(capstan_config_t *cfg, char *err)
{
    size_t n;
    const capstan__setting_t *rows = capstan__settings(&n);
    for (size_t i = 0; i < n; i++)
        if (rows[i].key && rows[i].type != CAPSTAN__SET_OWN && capstan__setting_check(cfg, &rows[i], err))
            return CAPSTAN_ECONFIG;
    /* Two refreshes may fail (a Redis blip) before the key lapses and the
     * fleet takes this live process's jobs. Only a file sets the two, so
     * the message names it when there is one. */
    if (cfg->heartbeat_interval * CAPSTAN__LIVENESS_BEATS > cfg->liveness_ttl)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "%s%sliveness_ttl: must be at least %d times heartbeat_interval (%g s)",
                              cfg->config_file ? cfg->config_file : "", cfg->config_file ? ": " : "",
                              CAPSTAN__LIVENESS_BEATS, cfg->heartbeat_interval);
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
    int rc = capstan__config_tls_into_url(cfg, err);
    return rc ? rc : capstan__config_shards_check(cfg, err);
}

const capstan_class_conf_t *capstan_config_class(const capstan_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nclasses; i++)
        if (strcmp(cfg->classes[i].name, name) == 0)
            return &cfg->classes[i];
    return NULL;
}

int capstan_config_unknown_class(const char *word, capstan_unknown_class_t *out)
{
    int i = capstan__setting_word(capstan__setting_by_key("unknown_class"), word);
    if (i < 0)
        return CAPSTAN_ECONFIG;
    *out = (capstan_unknown_class_t)i;
    return 0;
}

const char *capstan_config_unknown_class_name(capstan_unknown_class_t v)
{
    const capstan__setting_t *s = capstan__setting_by_key("unknown_class");
    for (int i = 0; s->words[i]; i++)
        if (i == (int)v)
            return s->words[i];
    return s->words[0];
}
