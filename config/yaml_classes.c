/* The classes: section of a capstan.yml: per-class options (queue, retry and
 * the uniqueness options of sidekiq-unique-jobs and Sidekiq Enterprise),
 * each checked as it is read so that a typo is a config error. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/bounds.h"
#include "config/names.h"
#include "config/yaml.h"
#include "capstan/limiter.h"
#include "capstan/unique.h"
#include "support/number.h"

/* A non-negative whole number of seconds (or a count) for a class option. */
static int class_count(ctx_t *c, const char *key, yaml_node_t *v, long max, long *out)
{
    char *s = NULL;
    long n;
    int rc = capstan__yaml_scalar(c, v, key, "must be an integer >= 0", &s);
    if (rc < 0)
        return rc;
    if (to_long(s, &n) || n < 0 || n > max)
        rc = capstan__yaml_fail(c, v, key, "must be an integer between 0 and %ld", max);
    else
        *out = n;
    free(s);
    return rc;
}

/* A lock type or strategy name, checked now so a typo is a config error. */
static int class_name(ctx_t *c, const char *key, yaml_node_t *v, int strategy, char **slot)
{
    char *s = NULL;
    int rc = capstan__yaml_scalar(c, v, key, "must be a name", &s);
    if (rc < 0)
        return rc;
    capstan_lock_type_t t;
    capstan_on_conflict_t st;
    if (strategy ? capstan_on_conflict_parse(s, &st) : capstan_lock_type_parse(s, &t)) {
        rc = capstan__yaml_fail(c, v, key,
                                strategy ? "unknown strategy %s (log, raise, reject, replace, reschedule)"
                                     : "unknown lock type %s", s);
        free(s);
        return rc;
    }
    free(*slot);
    *slot = strdup(strategy ? capstan_on_conflict_name(st) : capstan_lock_type_name(t));
    free(s);
    return *slot ? 0 : nomem(c);
}

/* The uniqueness options of a class entry. Returns 1 when oname is not one
 * of them. until is where unique_until goes until the entry is complete. */
static int class_unique(ctx_t *c, const char *key, const char *oname, yaml_node_t *ov,
                        capstan_class_conf_t *cc, long *unique_for, char **until)
{
    long n = 0;
    int rc = 0;
    if (!strcmp(oname, "lock"))
        return class_name(c, key, ov, 0, &cc->lock);
    if (!strcmp(oname, "lock_ttl") || !strcmp(oname, "lock_expiration")) {
        if (!(rc = class_count(c, key, ov, LONG_MAX / 1000, &n)))
            cc->lock_ttl = n;
        return rc;
    }
    if (!strcmp(oname, "lock_timeout")) {
        if (!(rc = class_count(c, key, ov, 86400, &n)))
            cc->lock_timeout = n;
        return rc;
    }
    if (!strcmp(oname, "lock_limit")) {
        if (!(rc = class_count(c, key, ov, INT_MAX, &n)))
            cc->lock_limit = (int)n;
        return rc;
    }
    if (!strcmp(oname, "unique_for"))
        return class_count(c, key, ov, LONG_MAX / 1000, unique_for);
    if (!strcmp(oname, "max_iteration_runtime")) {
        if (!(rc = class_count(c, key, ov, 86400 * 365, &n)))
            cc->max_iteration_runtime = n;
        return rc;
    }
    if (!strcmp(oname, "schedule_in")) {
        if (!(rc = class_count(c, key, ov, 86400 * 365, &n)))
            cc->schedule_in = (double)n;
        return rc;
    }
    if (!strcmp(oname, "lock_prefix"))
        return capstan__yaml_set_string(c, key, ov, &cc->lock_prefix, NULL);
    if (!strcmp(oname, "unique_until"))
        return capstan__yaml_set_string(c, key, ov, until, NULL);
    if (!strcmp(oname, "unique_across_queues"))
        return capstan__yaml_flag(c, key, ov, &cc->unique_across_queues);
    if (!strcmp(oname, "unique_across_workers"))
        return capstan__yaml_flag(c, key, ov, &cc->unique_across_workers);
    if (!strcmp(oname, "on_conflict")) {
        if (ov->type == YAML_SCALAR_NODE) {
            rc = class_name(c, key, ov, 1, &cc->on_conflict_client);
            if (!rc && !(cc->on_conflict_server = strdup(cc->on_conflict_client)))
                rc = nomem(c);
            return rc;
        }
        if (ov->type != YAML_MAPPING_NODE)
            return capstan__yaml_fail(c, ov, key,
                                      "must be a strategy name or {client: NAME, server: NAME}");
        for (yaml_node_pair_t *p = ov->data.mapping.pairs.start;
             p < ov->data.mapping.pairs.top && rc == 0; p++) {
            const char *side = key_name(node(c, p->key));
            char sub[CAPSTAN_ERRLEN];
            snprintf(sub, sizeof(sub), "%s.%s", key, side ? side : "?");
            if (side && !strcmp(side, "client"))
                rc = class_name(c, sub, node(c, p->value), 1, &cc->on_conflict_client);
            else if (side && !strcmp(side, "server"))
                rc = class_name(c, sub, node(c, p->value), 1, &cc->on_conflict_server);
            else
                rc = capstan__yaml_fail(c, node(c, p->key), sub, "unknown key (client or server)");
        }
        return rc;
    }
    if (!strcmp(oname, "lock_args")) {
        if (ov->type != YAML_SEQUENCE_NODE)
            return capstan__yaml_fail(c, ov, key, "must be a list of argument indexes");
        size_t cnt = (size_t)(ov->data.sequence.items.top - ov->data.sequence.items.start);
        int *idx = calloc(cnt ? cnt : 1, sizeof(int));
        if (!idx)
            return nomem(c);
        for (size_t i = 0; i < cnt && rc == 0; i++) {
            rc = class_count(c, key, node(c, ov->data.sequence.items.start[i]), 1000, &n);
            idx[i] = (int)n;
        }
        if (rc) {
            free(idx);
            return rc;
        }
        free(cc->lock_args);
        cc->lock_args = idx;
        cc->nlock_args = cnt;
        return 0;
    }
    return 1;
}

/* A number of seconds for a limit option, > 0 (interval words allowed
 * when words is set). */
static int limit_seconds(ctx_t *c, const char *key, yaml_node_t *v, int words, double *out)
{
    static const struct { const char *w; double s; } named[] = {
        { "second", 1 }, { "minute", 60 }, { "hour", 3600 }, { "day", 86400 },
    };
    const char *want = words ? "must be second, minute, hour, day or a number of seconds > 0"
                             : "must be a number of seconds > 0";
    char *s = NULL;
    int rc = capstan__yaml_scalar(c, v, key, want, &s);
    if (rc < 0)
        return rc;
    int found = 0;
    for (size_t i = 0; words && i < sizeof(named) / sizeof(named[0]) && !found; i++)
        if (!strcmp(s, named[i].w)) {
            *out = named[i].s;
            found = 1;
        }
    if (!found && capstan__parse_number(s, 0, 0.001, 366 * 86400.0, out))
        rc = capstan__yaml_fail(c, v, key, "%s", want);
    free(s);
    return rc;
}

/* `limit: {type: concurrent, name: stripe, size: 5}` (window and bucket
 * take count: and interval:, points cost:), checked whole so a bad limit
 * fails at start. */
static int class_limit(ctx_t *c, const char *key, yaml_node_t *v, capstan_class_conf_t *cc)
{
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping (type, name, size or count, ...)");
    capstan_limit_opts_t *lo = &cc->limit;
    char sub[CAPSTAN_ERRLEN], *type = NULL, *name = NULL;
    long n;
    int rc = 0;
    yaml_node_t *count_node = NULL, *interval_node = NULL, *cost_node = NULL;
    const char *interval_key = "interval";
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start;
         p < v->data.mapping.pairs.top && rc == 0; p++) {
        const char *o = key_name(node(c, p->key));
        yaml_node_t *ov = node(c, p->value);
        snprintf(sub, sizeof(sub), "%s.%s", key, o ? o : "?");
        if (o && !strcmp(o, "type"))
            rc = capstan__yaml_set_string(c, sub, ov, &type, NULL);
        else if (o && !strcmp(o, "name"))
            rc = capstan__yaml_set_string(c, sub, ov, &name, NULL);
        else if (o && !strcmp(o, "shard"))
            rc = capstan__yaml_set_string(c, sub, ov, &cc->limit_shard, NULL);
        else if (o && (!strcmp(o, "size") || !strcmp(o, "count") || !strcmp(o, "points"))) {
            count_node = ov;
            if (!(rc = class_count(c, sub, ov, INT_MAX, &n)))
                lo->count = n;
        } else if (o && !strcmp(o, "cost")) {
            cost_node = ov;
            if (!(rc = class_count(c, sub, ov, INT_MAX, &n)))
                lo->cost = n;
        } else if (o && (!strcmp(o, "interval") || !strcmp(o, "lock_timeout"))) {
            interval_node = ov;
            interval_key = o;
            rc = limit_seconds(c, sub, ov, !strcmp(o, "interval"), &lo->seconds);
        } else if (o && !strcmp(o, "wait_timeout")) {
            if (!(rc = class_count(c, sub, ov, 86400, &n)))
                lo->wait_timeout = (double)n;
        } else
            rc = capstan__yaml_fail(c, node(c, p->key), sub,
                                    "unknown key (type, name, size, count, points, cost, interval, "
                                    "lock_timeout, wait_timeout, shard)");
    }
    free((char *)lo->name);
    lo->name = name;
    capstan_limit_type_t t = 0;
    if (!rc && (!type || capstan_limit_type_parse(type, &t))) {
        snprintf(sub, sizeof(sub), "%s.type", key);
        rc = capstan__yaml_fail(c, v, sub, "%s%s (concurrent, window, bucket, sliding, leaky, points)",
                                type ? "unknown limiter type " : "is required", type ? type : "");
    }
    if (!rc && lo->count < 1) {
        const char *what = t == CAPSTAN_LIMIT_CONCURRENT ? "size" : "count";
        snprintf(sub, sizeof(sub), "%s.%s", key, what);
        rc = capstan__yaml_fail(c, count_node ? count_node : v, sub, "must be an integer >= 1");
    }
    if (!rc && t == CAPSTAN_LIMIT_CONCURRENT && lo->seconds > 0 && lo->seconds < CAPSTAN__MIN_LIMIT_LEASE) {
        snprintf(sub, sizeof(sub), "%s.%s", key, interval_key);
        rc = capstan__yaml_fail(c, interval_node, sub, "a concurrent slot's lease must be at least %g s",
                                CAPSTAN__MIN_LIMIT_LEASE);
    }
    if (!rc && t != CAPSTAN_LIMIT_CONCURRENT && lo->seconds <= 0) {
        snprintf(sub, sizeof(sub), "%s.interval", key);
        rc = capstan__yaml_fail(c, interval_node ? interval_node : v, sub, "is required for %s", type);
    }
    if (!rc && cost_node && (t != CAPSTAN_LIMIT_POINTS || lo->cost < 1 || lo->cost > lo->count)) {
        snprintf(sub, sizeof(sub), "%s.cost", key);
        rc = t != CAPSTAN_LIMIT_POINTS
                 ? capstan__yaml_fail(c, cost_node, sub, "is for points limiters only")
                 : capstan__yaml_fail(c, cost_node, sub, "must be between 1 and the limit's %ld points",
                                      lo->count);
    }
    if (!rc)
        lo->type = t;
    free(type);
    return rc;
}

static void class_opts_free(capstan_class_conf_t *cc)
{
    free((char *)cc->limit.name);
    free(cc->limit_shard);
    free(cc->lock);
    free(cc->lock_prefix);
    free(cc->lock_args);
    free(cc->on_conflict_client);
    free(cc->on_conflict_server);
}

/* One `Name: {queue: q, retry: r}` entry, added to or updating list. */
static int class_entry(ctx_t *c, yaml_node_t *kn, yaml_node_t *v, capstan_config_t *list)
{
    char key[CAPSTAN_ERRLEN];
    capstan_class_conf_t cc = { .retry = CAPSTAN_RETRY_UNSET, .limit = CAPSTAN_LIMIT_OPTS_INIT };
    long unique_for = 0;
    char *until = NULL;
    int rc = 0;
    const char *name = key_name(kn);
    if (!name || !*name)
        return capstan__yaml_fail(c, kn, "classes", "a class name must be a non-empty string");
    snprintf(key, sizeof(key), "classes.%s", name);
    if (!is_null(v) && v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key,
                                  "must be a mapping of class options (queue, retry, lock, ...)");
    if (v->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = v->data.mapping.pairs.start;
             p < v->data.mapping.pairs.top && rc == 0; p++) {
            yaml_node_t *opt = node(c, p->key), *ov = node(c, p->value);
            const char *oname = key_name(opt);
            snprintf(key, sizeof(key), "classes.%s.%s", name, oname ? oname : "?");
            if (oname && !strcmp(oname, "queue")) {
                char why[CAPSTAN_ERRLEN];
                rc = capstan__yaml_set_string(c, key, ov, &cc.queue, NULL);
                if (!rc && cc.queue && capstan__config_queue_name_check(cc.queue, why))
                    rc = capstan__yaml_fail(c, ov, key, "%s", why);
            }
            else if (oname && !strcmp(oname, "retry"))
                rc = capstan__yaml_retry(c, key, ov, &cc.retry);
            else if (oname && !strcmp(oname, "limit"))
                rc = class_limit(c, key, ov, &cc);
            else if (oname && !strcmp(oname, "timeout")) {
                long n = 0;
                if (!(rc = class_count(c, key, ov, 86400 * 365, &n)))
                    cc.timeout = n;
            }
            else if (oname && !strcmp(oname, "max_limiter_reschedules")) {
                long n = 0;
                if (!(rc = class_count(c, key, ov, INT_MAX, &n))) {
                    cc.limit.max_reschedules = cc.max_limiter_reschedules = (int)n;
                    cc.has_max_limiter_reschedules = 1;
                }
            }
            else if (!oname ||
                     (rc = class_unique(c, key, oname, ov, &cc, &unique_for, &until)) == 1)
                rc = capstan__yaml_fail(c, opt, key, "unknown key");
        }
        if (rc < 0)
            goto out;
        /* Sidekiq Enterprise's unique_for/unique_until name a lock type. */
        if (unique_for || until) {
            capstan_unique_opts_t uo = CAPSTAN_UNIQUE_OPTS_INIT;
            snprintf(key, sizeof(key), "classes.%s.unique_until", name);
            if (!unique_for || capstan_unique_for(&uo, unique_for, until)) {
                rc = capstan__yaml_fail(c, v, key, unique_for ? "must be start or success"
                                                : "needs unique_for (seconds)");
                goto out;
            }
            free(cc.lock);
            cc.lock = strdup(capstan_lock_type_name(uo.lock));
            if (!cc.lock) {
                rc = nomem(c);
                goto out;
            }
            if (!cc.lock_ttl)
                cc.lock_ttl = uo.lock_ttl;
            cc.unique_for = 1;
        }
    }
    /* A class listed twice: the later entry wins, as with any YAML key. */
    capstan_class_conf_t *slot = NULL;
    for (size_t i = 0; i < list->nclasses && !slot; i++)
        if (!strcmp(list->classes[i].name, name))
            slot = &list->classes[i];
    if (!slot) {
        capstan_class_conf_t *grown = realloc(list->classes, (list->nclasses + 1) * sizeof(*grown));
        if (grown)
            list->classes = grown;
        if (!grown || !(cc.name = strdup(name))) {
            rc = nomem(c);
            goto out;
        }
        list->classes[list->nclasses++] = cc;
        free(until);
        return 0;
    }
    free(slot->queue);
    class_opts_free(slot);
    cc.name = slot->name;
    *slot = cc;
    free(until);
    return 0;
out:
    free(cc.queue);
    class_opts_free(&cc);
    free(until);
    return rc;
}

static void free_classes(capstan_class_conf_t *cls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(cls[i].name);
        free(cls[i].queue);
        class_opts_free(&cls[i]);
    }
    free(cls);
}

int capstan__yaml_set_classes(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    capstan_config_t fresh = {0}; /* only its class list is used */
    int rc = 0;
    if (!is_null(v) && v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping of class name to options");
    if (v->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = v->data.mapping.pairs.start;
             p < v->data.mapping.pairs.top && rc == 0; p++)
            rc = class_entry(c, node(c, p->key), node(c, p->value), &fresh);
    }
    if (rc < 0) {
        free_classes(fresh.classes, fresh.nclasses);
        return rc;
    }
    free_classes(c->cfg->classes, c->cfg->nclasses);
    c->cfg->classes = fresh.classes;
    c->cfg->nclasses = fresh.nclasses;
    return 0;
}
