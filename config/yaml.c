/* Reads a capstan.yml (or an existing sidekiq.yml) into a capstan_config_t.
 *
 * It exists so that a Sidekiq file works unchanged and every mistake in it is
 * reported as one "file:line: key: problem" line. Unknown keys are errors to
 * catch typos (with the nearest known key as a suggestion); keys that Sidekiq
 * or its plugins read but capstan has no use for are warnings, so a Rails app's
 * sidekiq.yml loads as it is. A top-level key holding a mapping of settings
 * is an environment section, applied over the top level only when it names
 * the current environment. */
#include "config/bounds.h"
#include "config/names.h"
#include "config/settings.h"
#include "config/yaml.h"
#include "support/nearest.h"
#include "support/number.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* An anchor can merge (<<) into itself; stop rather than recurse forever.
 * And a few lines can merge a mapping that merges several copies of the
 * one before (a "billion laughs"), so the total is bounded too. */
#define MAX_MERGE_DEPTH 16
#define MAX_MERGED 1000

/* A setting of the settings table (config/settings.h): its scalar, read
 * by the table's parser. A null gives a string its default and is no value
 * for anything else. */
static int set_row(ctx_t *c, const capstan__setting_t *s, const char *key, yaml_node_t *v)
{
    char want[CAPSTAN_ERRLEN], why[CAPSTAN_ERRLEN], *text = NULL;
    int rc = 0;
    capstan__setting_want(s, want, sizeof(want));
    if (!is_null(v) || s->type != CAPSTAN__SET_STRING)
        rc = capstan__yaml_scalar(c, v, key, want, &text);
    if (rc < 0)
        return rc;
    rc = capstan__setting_set(c->cfg, s, text, why);
    free(text);
    if (rc == CAPSTAN_ECONFIG)
        return capstan__yaml_fail(c, v, key, "%s", why);
    if (rc < 0)
        return nomem(c);
    capstan__setting_given(c->cfg, s);
    return 0;
}

static int redis_url(ctx_t *c, const char *key, yaml_node_t *v)
{
    return set_row(c, capstan__setting_by_key("redis_url"), key, v);
}

/* Options of Ruby's Redis clients that tune a connection pool or socket
 * capstan manages its own way. */
static const char *const redis_tuning[] = {
    "size", "pool_timeout", "network_timeout", "connect_timeout", "read_timeout",
    "write_timeout", "timeout", "reconnect_attempts", "driver", "id",
};

/* Options that choose which server or database to use: ignoring one would
 * connect capstan somewhere else than the Ruby processes. */
static const char *const redis_target[] = {
    "host", "port", "path", "db", "password", "username", "ssl", "sentinels", "role",
    "name", "namespace",
};

static int in_list(const char *name, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, names[i]))
            return 1;
    return 0;
}

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* `redis: {url: ...}`, the shape of Sidekiq's own redis options. */
static int set_redis(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping with a url");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++)
        if (key_name(node(c, p->key)) && !strcmp(key_name(node(c, p->key)), "sentinels"))
            return capstan__yaml_set_sentinels(c, key, v);
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = node(c, p->key);
        const char *name = key_name(kn);
        char sub[CAPSTAN_ERRLEN];
        snprintf(sub, sizeof(sub), "%s.%s", key, name ? name : "?");
        int rc;
        if (name && !strcmp(name, "url"))
            rc = redis_url(c, sub, node(c, p->value));
        else if (name && !strcmp(name, "ssl_params"))
            rc = capstan__yaml_warn(c, kn, sub, "not read by capstan; give TLS settings under tls: "
                                    "(ca_file, cert, key, server_name, verify) with TLS in the url");
        else if (name && in_list(name, redis_tuning, NELEM(redis_tuning)))
            rc = capstan__yaml_warn(c, kn, sub, "not used by capstan (a Ruby client option); ignored");
        else if (name && in_list(name, redis_target, NELEM(redis_target)))
            rc = capstan__yaml_fail(c, kn, sub, "not supported; give the server in url "
                                            "(redis://[user:password@]host:port/db)");
        else {
            const char *const all[] = {"url"};
            const char *near = name ? capstan__nearest(name, all, 1) : NULL;
            if (!near)
                near = name ? capstan__nearest(name, redis_tuning, NELEM(redis_tuning)) : NULL;
            rc = near ? capstan__yaml_fail(c, kn, sub, "unknown key; did you mean %s?", near)
                      : capstan__yaml_fail(c, kn, sub, "unknown key");
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Reads a list of strings (null = empty) into a new vector; with prefix,
 * relative entries get it prepended. */
static int string_list(ctx_t *c, const char *key, yaml_node_t *v, const char *prefix,
                       char ***out, size_t *nout)
{
    const char *want = "must be a list of strings";
    char **list = NULL, *s = NULL;
    size_t n = 0;
    int rc = 0;
    if (is_null(v))
        goto out;
    if (v->type != YAML_SEQUENCE_NODE)
        return capstan__yaml_fail(c, v, key, "%s", want);
    size_t cap = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (cap && !(list = calloc(cap, sizeof(*list))))
        return nomem(c);
    for (yaml_node_item_t *it = v->data.sequence.items.start;
         it < v->data.sequence.items.top; it++) {
        yaml_node_t *item = node(c, *it);
        if ((rc = capstan__yaml_scalar(c, item, key, want, &s)) < 0)
            goto out;
        if (prefix && *s != '/') {
            char *joined = NULL;
            if (asprintf(&joined, "%s%s", prefix, s) < 0) {
                rc = nomem(c);
                goto out;
            }
            free(s);
            s = joined;
        }
        list[n++] = s;
        s = NULL;
    }
out:
    free(s);
    if (rc < 0) {
        for (size_t i = 0; i < n; i++)
            free(list[i]);
        free(list);
        return rc;
    }
    *out = list;
    *nout = n;
    return 0;
}

static int set_labels(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    char **list;
    size_t n;
    int rc = string_list(c, key, v, NULL, &list, &n);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < c->cfg->nlabels; i++)
        free(c->cfg->labels[i]);
    free(c->cfg->labels);
    c->cfg->labels = list;
    c->cfg->nlabels = n;
    return 0;
}

/* Plugin paths are relative to the file, not to wherever capstan was started,
 * so a config directory can be moved as a whole. A file given without a
 * directory gets "./" so that dlopen does not search the library path. */
static int set_plugins(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    char **list, *dir = NULL;
    size_t n;
    const char *slash = strrchr(c->path, '/');
    if (!(dir = slash ? strndup(c->path, (size_t)(slash - c->path) + 1) : strdup("./")))
        return nomem(c);
    int rc = string_list(c, key, v, dir, &list, &n);
    free(dir);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < c->cfg->nplugins; i++)
        free(c->cfg->plugins[i]);
    free(c->cfg->plugins);
    c->cfg->plugins = list;
    c->cfg->nplugins = n;
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* One entry of `queues:`: "name", "name,weight" (Sidekiq 7), [name] or
 * [name, weight]. Appends it to list. */
static int queue_item(ctx_t *c, const char *key, yaml_node_t *item, capstan_config_t *list)
{
    const char *want = "each queue must be name, \"name,weight\", [name] or [name, weight]";
    char *raw = NULL, *wraw = NULL, *wtext = NULL, msg[CAPSTAN_ERRLEN];
    long weight = 0;
    int rc;
    if (item->type == YAML_SEQUENCE_NODE) {
        yaml_node_item_t *it = item->data.sequence.items.start;
        ptrdiff_t n = item->data.sequence.items.top - it;
        if (n < 1 || n > 2)
            return capstan__yaml_fail(c, item, key, "%s", want);
        if ((rc = capstan__yaml_scalar(c, node(c, it[0]), key, want, &raw)) < 0)
            goto out;
        if (n == 2 && (rc = capstan__yaml_scalar(c, node(c, it[1]), key, want, &wraw)) < 0)
            goto out;
        wtext = wraw;
    } else {
        if ((rc = capstan__yaml_scalar(c, item, key, want, &raw)) < 0)
            goto out;
        char *comma = strchr(raw, ',');
        if (comma) {
            *comma = '\0';
            wtext = comma + 1;
        }
    }
    char *name = trim(raw);
    if (capstan__config_queue_name_check(name, msg)) {
        rc = capstan__yaml_fail(c, item, key, "%s", msg);
        goto out;
    }
    if (wtext && (to_long(trim(wtext), &weight) < 0 || weight < 1 || weight > INT_MAX)) {
        rc = capstan__yaml_fail(c, item, key, "weight of %s must be an integer >= 1", name);
        goto out;
    }
    rc = capstan_config_append_queue(list, name, (int)weight, msg);
    if (rc == CAPSTAN_ECONFIG)
        rc = capstan__yaml_fail(c, item, key, "%s", msg);
    else if (rc < 0)
        rc = nomem(c);
out:
    free(raw);
    free(wraw);
    return rc;
}

static int set_queues(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    capstan_config_t fresh = {0}; /* only its queue list is used */
    int rc = 0;
    if (v->type != YAML_SEQUENCE_NODE ||
        v->data.sequence.items.top == v->data.sequence.items.start)
        return capstan__yaml_fail(c, v, key, "must be a non-empty list of queues");
    for (yaml_node_item_t *it = v->data.sequence.items.start;
         it < v->data.sequence.items.top && rc == 0; it++)
        rc = queue_item(c, key, node(c, *it), &fresh);
    if (rc < 0) {
        for (size_t i = 0; i < fresh.nqueues; i++)
            free(fresh.queues[i].name);
        free(fresh.queues);
        return rc;
    }
    for (size_t i = 0; i < c->cfg->nqueues; i++)
        free(c->cfg->queues[i].name);
    free(c->cfg->queues);
    c->cfg->queues = fresh.queues;
    c->cfg->nqueues = fresh.nqueues;
    return 0;
}

/* sidekiq-limit_fetch's `limits:` and `process_limits:`, each a mapping of
 * queue name to the jobs of it that may run at once (null: no cap). A key
 * given again (an environment's section) replaces the whole mapping, as
 * Ruby's merge does. */
static int set_queue_limits(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    int process = !strcmp(k->name, "process_limits");
    capstan_config_t *cfg = c->cfg;
    if (!is_null(v) && v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping of queue name to a number of jobs");
    for (size_t i = 0; i < cfg->nqueue_limits; i++)
        *(process ? &cfg->queue_limits[i].process_limit : &cfg->queue_limits[i].limit) = 0;
    if (is_null(v))
        return 0;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = node(c, p->key), *vn = node(c, p->value);
        const char *name = key_name(kn);
        char sub[CAPSTAN_ERRLEN], why[CAPSTAN_ERRLEN], *text = NULL;
        long n = 0;
        snprintf(sub, sizeof(sub), "%s.%s", key, name ? name : "?");
        if (!name || capstan__config_queue_name_check(name, why))
            return capstan__yaml_fail(c, kn, sub, "%s", name ? why : "a queue name must be a plain word");
        if (!is_null(vn)) {
            int rc = capstan__yaml_scalar(c, vn, sub, "must be an integer >= 1", &text);
            if (rc < 0)
                return rc;
            rc = to_long(text, &n) || n < 1 || n > INT_MAX;
            free(text);
            if (rc)
                return capstan__yaml_fail(c, vn, sub, "must be an integer >= 1");
        }
        capstan_queue_limit_t *q = NULL;
        for (size_t i = 0; i < cfg->nqueue_limits && !q; i++)
            if (!strcmp(cfg->queue_limits[i].queue, name))
                q = &cfg->queue_limits[i];
        if (!q) {
            capstan_queue_limit_t *grown =
                realloc(cfg->queue_limits, (cfg->nqueue_limits + 1) * sizeof(*grown));
            if (!grown)
                return nomem(c);
            cfg->queue_limits = grown;
            q = &grown[cfg->nqueue_limits];
            *q = (capstan_queue_limit_t){ .queue = strdup(name) };
            if (!q->queue)
                return nomem(c);
            cfg->nqueue_limits++;
        }
        *(process ? &q->process_limit : &q->limit) = (int)n;
    }
    return 0;
}

/* The settings with a structure of their own; every other key of the file
 * is a row of the settings table (config/settings.c). */
static const key_def_t keys[] = {
    {"queues", set_queues},
    {"labels", set_labels},
    {"plugins", set_plugins},
    {"redis", set_redis},
    {"tls", capstan__yaml_set_tls},
    {"classes", capstan__yaml_set_classes},
    {"periodic", capstan__yaml_set_periodic},
    {"schedule", capstan__yaml_set_schedule},
    {"scheduler", capstan__yaml_set_scheduler},
    {"limits", set_queue_limits},
    {"process_limits", set_queue_limits},
    {"shards", capstan__yaml_set_shards},
};

/* Keys that Sidekiq or a common plugin reads and capstan does not: a warning
 * each, so a Rails app's sidekiq.yml works as it is. */
static const struct {
    const char *name, *why;
} unused[] = {
    {"require", "Ruby code to load; capstan's handlers come from plugins"},
    {"strict", "Sidekiq drops it too: queue weights decide the order"},
    {"environment", "the environment is chosen before the file is read; use -e or RAILS_ENV"},
    {"lifecycle_events", "Ruby callbacks"},
    {"error_handlers", "Ruby callbacks"},
    {"death_handlers", "Ruby callbacks"},
    {"daemon", "removed in Sidekiq 6; run capstan under a supervisor"},
    {"capsules", "Sidekiq 7 capsules; capstan runs the top-level queues and concurrency"},
    {"on_complex_arguments", "a Ruby client option"},
    {"logged_job_attributes", "Ruby logging"},
    {"redis_idle_timeout", "a Ruby client option"},
    {"dynamic", "sidekiq-scheduler"},
    {"cron_poll_interval", "sidekiq-cron"},
    {"blocking", "sidekiq-limit_fetch's blocking queues; the queues' order and weights decide"},
};

static const key_def_t *find_key(const char *name)
{
    for (size_t i = 0; i < NELEM(keys); i++)
        if (!strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

static const char *unused_why(const char *name)
{
    for (size_t i = 0; i < NELEM(unused); i++)
        if (!strcmp(unused[i].name, name))
            return unused[i].why;
    return NULL;
}

/* A key of the settings table that the file may give. */
static const capstan__setting_t *find_row(const char *name)
{
    const capstan__setting_t *s = capstan__setting_by_key(name);
    return s && s->type != CAPSTAN__SET_OWN ? s : NULL;
}

static int is_known(const char *name)
{
    return find_key(name) || find_row(name) || unused_why(name) || !strcmp(name, "<<");
}

/* The known key (used or not) closest to name, or NULL. */
static const char *suggest(const char *name)
{
    size_t nrows;
    const capstan__setting_t *rows = capstan__settings(&nrows);
    const char *names[NELEM(keys) + NELEM(unused) + 2 * nrows];
    size_t n = 0;
    for (size_t i = 0; i < NELEM(keys); i++)
        names[n++] = keys[i].name;
    for (size_t i = 0; i < nrows; i++) {
        if (rows[i].key && rows[i].type != CAPSTAN__SET_OWN)
            names[n++] = rows[i].key;
        if (rows[i].alias)
            names[n++] = rows[i].alias;
    }
    for (size_t i = 0; i < NELEM(unused); i++)
        names[n++] = unused[i].name;
    return capstan__nearest(name, names, n);
}

static int unknown_key(ctx_t *c, yaml_node_t *kn, const char *name)
{
    const char *near = suggest(name);
    if (near)
        return capstan__yaml_fail(c, kn, name, "unknown key; did you mean %s?", near);
    return capstan__yaml_fail(c, kn, name, "unknown key");
}

/* Environment names a Rails app uses, always taken for sections. */
static int is_env_name(const char *name)
{
    static const char *const envs[] = {"production", "development", "staging", "test"};
    return in_list(name, envs, NELEM(envs));
}

/* An unknown top-level key is fine when it holds a mapping of settings: that
 * is another environment's section (not applied, so only its keys are
 * checked). A mapping with some known keys, or named like an environment, or
 * whose keys are near known ones, is a section with a typo, reported at the
 * typo; anything else is a typo itself. */
static int check_section(ctx_t *c, yaml_node_t *kn, const char *name, yaml_node_t *v)
{
    yaml_node_t *bad = NULL;
    int known = 0, near = 0;
    if (v->type != YAML_MAPPING_NODE)
        return unknown_key(c, kn, name);
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *inner = node(c, p->key);
        const char *iname = key_name(inner);
        if (iname && is_known(iname)) {
            known = 1;
        } else if (!bad) {
            bad = inner;
            near = iname && suggest(iname);
        }
    }
    if (!bad)
        return 0;
    if (!known && !near && !is_env_name(name))
        return unknown_key(c, kn, name);
    if (!key_name(bad))
        return capstan__yaml_fail(c, bad, "?", "a key must be a plain word");
    return unknown_key(c, bad, key_name(bad));
}

/* Applies a mapping of settings: the top level (top = 1) or an environment
 * section. Merge keys (<<) go first so the mapping's own keys override what
 * they bring in, as in Ruby. */
static int apply_mapping(ctx_t *c, yaml_node_t *map, int top, int depth)
{
    yaml_node_pair_t *p, *start = map->data.mapping.pairs.start,
                         *end = map->data.mapping.pairs.top;
    int rc = 0;
    if (depth > MAX_MERGE_DEPTH)
        return capstan__yaml_fail(c, map, "<<", "merges nest too deeply");
    if (depth > 0 && ++c->merged > MAX_MERGED)
        return capstan__yaml_fail(c, map, "<<", "more than %d mappings merged", MAX_MERGED);
    for (p = start; p < end && rc == 0; p++) {
        const char *name = key_name(node(c, p->key));
        yaml_node_t *v = node(c, p->value);
        if (!name || strcmp(name, "<<") != 0)
            continue;
        if (v->type == YAML_MAPPING_NODE) {
            rc = apply_mapping(c, v, top, depth + 1);
        } else if (v->type == YAML_SEQUENCE_NODE) {
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top && rc == 0; it++) {
                yaml_node_t *m = node(c, *it);
                rc = m->type == YAML_MAPPING_NODE
                         ? apply_mapping(c, m, top, depth + 1)
                         : capstan__yaml_fail(c, m, "<<", "must be a mapping or a list of mappings");
            }
        } else {
            rc = capstan__yaml_fail(c, v, "<<", "must be a mapping or a list of mappings");
        }
    }
    for (p = start; p < end && rc == 0; p++) {
        yaml_node_t *kn = node(c, p->key), *v = node(c, p->value);
        const char *name = key_name(kn);
        const key_def_t *k = name ? find_key(name) : NULL;
        const capstan__setting_t *row = name ? find_row(name) : NULL;
        if (name && !strcmp(name, "<<"))
            continue;
        if (k)
            rc = k->set(c, k, name, v);
        else if (row)
            rc = set_row(c, row, name, v);
        else if (!name)
            rc = capstan__yaml_fail(c, kn, "?", "a key must be a plain word");
        else if (unused_why(name))
            rc = capstan__yaml_warn(c, kn, name, "not used by capstan (%s); ignored", unused_why(name));
        else if (top && !strcmp(name, c->env))
            continue; /* applied by the caller, after the top level */
        else if (top)
            rc = check_section(c, kn, name, v);
        else
            rc = unknown_key(c, kn, name);
    }
    return rc;
}

/* The section named after the environment, applied over the top level.
 * Every other unknown top-level key is another environment's section
 * (apply_mapping refused anything else), so when the file has sections
 * and none for this environment, -e has a typo or the deploy forgot
 * RAILS_ENV: one warning. A file without sections reads the same in every
 * environment and is not warned about. */
static int apply_env_section(ctx_t *c, yaml_node_t *root)
{
    const yaml_node_t *first = NULL;
    char others[CAPSTAN_ERRLEN / 2] = "";
    int found = 0;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
         p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = node(c, p->key), *v = node(c, p->value);
        const char *name = key_name(kn);
        if (!name || is_known(name))
            continue;
        if (strcmp(name, c->env) != 0) {
            size_t n = strlen(others);
            snprintf(others + n, sizeof(others) - n, "%s%s", n ? ", " : "", name);
            first = first ? first : kn;
            continue;
        }
        found = 1;
        if (is_null(v))
            continue;
        if (v->type != YAML_MAPPING_NODE)
            return capstan__yaml_fail(c, v, name, "must be a mapping of settings for environment %s",
                        c->env);
        int rc = apply_mapping(c, v, 0, 0);
        if (rc < 0)
            return rc;
    }
    if (!found && first)
        return capstan__yaml_warn(c, first, c->env, "no section for this environment (the file has "
                                  "%s); only the top-level settings apply", others);
    return 0;
}

/* libyaml gives only a byte offset for bad encoding; count lines up to it. */
static unsigned long line_at(const capstan_erb_t *erb, size_t offset)
{
    unsigned long line = 1;
    for (size_t i = 0; i < offset && i < erb->len; i++)
        if (erb->text[i] == '\n')
            line++;
    return capstan__erb_line(erb, line);
}

/* libyaml's loader spends time quadratic in the nesting depth before it
 * returns (18 s for 100k '['), so a first pass over the parser's events,
 * which come as it reads, refuses a file nested deeper than any setting
 * needs before the document is built. Syntax errors are left to the load,
 * which reports them. */
enum { MAX_DEPTH = 64 };

static int check_depth(const capstan_erb_t *erb, const char *path, char *err)
{
    yaml_parser_t p;
    yaml_event_t ev;
    int depth = 0, rc = 0, done = 0;
    if (!yaml_parser_initialize(&p))
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char *)erb->text, erb->len);
    while (!done && !rc && yaml_parser_parse(&p, &ev)) {
        if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) {
            if (++depth > MAX_DEPTH)
                rc = capstan_seterr(err, CAPSTAN_ECONFIG, "%s:%lu: nesting deeper than %d levels", path,
                                    file_line(erb, ev.start_mark.line), MAX_DEPTH);
        } else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (ev.type == YAML_STREAM_END_EVENT) {
            done = 1;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

/* A config file bigger than this is not one: refuse it rather than read a
 * device or a log given to -C by mistake into memory. */
#define MAX_FILE_BYTES (16u << 20)

/* Reads all of f into *out (malloc'd, NUL-terminated) and *len. Returns 0,
 * CAPSTAN_ENOMEM, or CAPSTAN_ECONFIG for a read error or an oversized file. */
static int read_all(FILE *f, const char *path, char **out, size_t *len, char *err)
{
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 4096) {
            if (cap > MAX_FILE_BYTES) {
                free(buf);
                return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: larger than %u MiB, not a config file",
                                      path, MAX_FILE_BYTES >> 20);
            }
            char *p = realloc(buf, cap = cap ? cap * 2 : 8192);
            if (!p) {
                free(buf);
                return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: %s", path, strerror(e));
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

int capstan_config_load_file(capstan_config_t *cfg, const char *path, char *err)
{
    capstan_erb_t erb = {0};
    ctx_t c = {.cfg = cfg, .path = path, .err = err, .env = capstan_config_environment(cfg),
               .erb = &erb};
    yaml_parser_t parser;
    int parser_ready = 0, loaded = 0, rc = 0;
    char *raw = NULL;
    size_t raw_len = 0;
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f)
        return capstan_seterr(err, CAPSTAN_ENOTFOUND, "%s: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return capstan_seterr(err, CAPSTAN_ENOTFOUND, "%s: %s", path, strerror(EISDIR));
    }
    if (capstan_config_set_str(&cfg->config_file, path) < 0) {
        rc = nomem(&c);
        goto out;
    }
    /* Sidekiq renders the file's ERB before it reads the YAML; so do we. */
    if ((rc = read_all(f, path, &raw, &raw_len, err)) ||
        (rc = capstan__erb_render(path, raw, raw_len, &erb, err)))
        goto out;
    if ((rc = check_depth(&erb, path, err)))
        goto out;
    /* libyaml answers 1 for success and 0 for failure. */
    if (!yaml_parser_initialize(&parser)) {
        rc = nomem(&c);
        goto out;
    }
    parser_ready = 1;
    yaml_parser_set_input_string(&parser, (const unsigned char *)erb.text, erb.len);
    if (!yaml_parser_load(&parser, &c.doc)) {
        unsigned long line = parser.error == YAML_READER_ERROR
                                 ? line_at(&erb, parser.problem_offset)
                                 : file_line(&erb, parser.problem_mark.line);
        rc = capstan_seterr(err, CAPSTAN_EPARSE, "%s:%lu: %s", path, line,
                            parser.problem ? parser.problem : "invalid YAML");
        goto out;
    }
    loaded = 1;
    yaml_node_t *root = yaml_document_get_root_node(&c.doc);
    if (!root || is_null(root))
        goto out; /* an empty file changes nothing */
    if (root->type != YAML_MAPPING_NODE) {
        rc = capstan_seterr(err, CAPSTAN_ECONFIG, "%s:%lu: the file must be a mapping of settings",
                            path, file_line(&erb, root->start_mark.line));
        goto out;
    }
    rc = apply_mapping(&c, root, 1, 0);
    if (rc == 0)
        rc = apply_env_section(&c, root);
out:
    if (loaded)
        yaml_document_delete(&c.doc);
    if (parser_ready)
        yaml_parser_delete(&parser);
    capstan__erb_clear(&erb);
    free(raw);
    fclose(f);
    return rc;
}
