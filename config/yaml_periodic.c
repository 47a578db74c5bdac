/* The periodic: section of a capstan.yml: one mapping per schedule (cron,
 * tz, class, queue, args, retry, missed and a few more job options), each
 * checked as it is read so that a bad expression stops the start with the
 * file, line and schedule. args and option values are YAML turned into
 * JSON: a quoted scalar is a string, a plain one a number, boolean or null
 * when it reads as one. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "periodic/periodic.h"
#include "config/yaml.h"
#include "support/buf.h"
#include "support/cron.h"
#include "support/json.h"
#include "support/tz.h"

/* Further job fields a schedule may set, written into its payloads as
 * they are. */
static const char *const job_options[] = { "tags", "backtrace", "dead", "retry_for", "retry_queue" };

#define MAX_DEPTH 32

static int plain_literal(const char *s)
{
    static const char *const words[] = { "true", "false", "null" };
    for (size_t i = 0; i < sizeof(words) / sizeof(*words); i++)
        if (!strcmp(s, words[i]))
            return 1;
    return (*s == '-' || (*s >= '0' && *s <= '9')) && capstan__json_validate(s, strlen(s), NULL) == 0;
}

/* Appends node v as JSON to b. */
static int to_json(ctx_t *c, const char *key, yaml_node_t *v, capstan_buf_t *b, int depth)
{
    int rc = 0;
    if (depth > MAX_DEPTH)
        return capstan__yaml_fail(c, v, key, "nests too deeply");
    if (v->type == YAML_SCALAR_NODE) {
        if (is_null(v))
            return capstan__buf_puts(b, "null") ? nomem(c) : 0;
        char *s = NULL;
        int b1;
        if ((rc = capstan__yaml_scalar(c, v, key, "must be a value", &s)) < 0)
            return rc;
        if (v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
            rc = capstan__json_quote(b, s, strlen(s));
        else if (to_bool(s, &b1) == 0)
            rc = capstan__buf_puts(b, b1 ? "true" : "false");
        else if (plain_literal(s))
            rc = capstan__buf_puts(b, s);
        else
            rc = capstan__json_quote(b, s, strlen(s));
        free(s);
        return rc ? nomem(c) : 0;
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        rc = capstan__buf_puts(b, "[");
        for (yaml_node_item_t *it = v->data.sequence.items.start;
             it < v->data.sequence.items.top && !rc; it++) {
            if (it != v->data.sequence.items.start && capstan__buf_puts(b, ","))
                return nomem(c);
            rc = to_json(c, key, node(c, *it), b, depth + 1);
        }
        return rc ? rc : capstan__buf_puts(b, "]") ? nomem(c) : 0;
    }
    if (v->type == YAML_MAPPING_NODE) {
        rc = capstan__buf_puts(b, "{");
        for (yaml_node_pair_t *p = v->data.mapping.pairs.start;
             p < v->data.mapping.pairs.top && !rc; p++) {
            const char *k = key_name(node(c, p->key));
            if (!k)
                return capstan__yaml_fail(c, node(c, p->key), key, "a key must be a plain word");
            if ((p != v->data.mapping.pairs.start && capstan__buf_puts(b, ",")) ||
                capstan__json_quote(b, k, strlen(k)) || capstan__buf_puts(b, ":"))
                return nomem(c);
            rc = to_json(c, key, node(c, p->value), b, depth + 1);
        }
        return rc ? rc : capstan__buf_puts(b, "}") ? nomem(c) : 0;
    }
    return capstan__yaml_fail(c, v, key, "must be a value");
}

/* The options of one schedule, named name, into *o (strings owned by the
 * caller: what *o points to is freed with free_opts). */
typedef struct sched {
    capstan_periodic_opts_t o;
    char *name, *cron, *tz, *cls, *queue, *args, *missed;
    capstan_buf_t extra;
} sched_t;

static void sched_free(sched_t *s)
{
    free(s->name);
    free(s->cron);
    free(s->tz);
    free(s->cls);
    free(s->queue);
    free(s->args);
    free(s->missed);
    capstan__buf_free(&s->extra);
}

static int read_schedule(ctx_t *c, const char *name, yaml_node_t *kn, yaml_node_t *v, sched_t *s)
{
    char key[CAPSTAN_ERRLEN], why[CAPSTAN_ERRLEN];
    snprintf(key, sizeof(key), "periodic.%s", name);
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping (cron, class, queue, args, ...)");
    capstan_periodic_opts_t def = CAPSTAN_PERIODIC_OPTS_INIT;
    s->o = def;
    if (!(s->name = strdup(name)))
        return nomem(c);
    int rc = 0;
    yaml_node_t *cron_node = NULL, *tz_node = NULL;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top && !rc; p++) {
        const char *o = key_name(node(c, p->key));
        yaml_node_t *ov = node(c, p->value);
        char sub[CAPSTAN_ERRLEN];
        snprintf(sub, sizeof(sub), "%s.%s", key, o ? o : "?");
        if (!o) {
            rc = capstan__yaml_fail(c, node(c, p->key), key, "a key must be a plain word");
        } else if (!strcmp(o, "cron")) {
            cron_node = ov;
            rc = capstan__yaml_set_string(c, sub, ov, &s->cron, NULL);
        } else if (!strcmp(o, "tz")) {
            tz_node = ov;
            rc = capstan__yaml_set_string(c, sub, ov, &s->tz, NULL);
        } else if (!strcmp(o, "class")) {
            rc = capstan__yaml_set_string(c, sub, ov, &s->cls, NULL);
        } else if (!strcmp(o, "queue")) {
            rc = capstan__yaml_set_string(c, sub, ov, &s->queue, NULL);
        } else if (!strcmp(o, "missed")) {
            if (!(rc = capstan__yaml_set_string(c, sub, ov, &s->missed, NULL)) &&
                capstan_periodic_missed(s->missed, &s->o.missed))
                rc = capstan__yaml_fail(c, ov, sub, "must be skip, last or all");
        } else if (!strcmp(o, "retry")) {
            rc = capstan__yaml_retry(c, sub, ov, &s->o.retry);
        } else if (!strcmp(o, "args")) {
            capstan_buf_t b = { 0 };
            if (ov->type != YAML_SEQUENCE_NODE && !is_null(ov))
                rc = capstan__yaml_fail(c, ov, sub, "must be a list");
            else if (!(rc = to_json(c, sub, ov, &b, 0)) && !is_null(ov))
                s->args = capstan__buf_take(&b, NULL);
            capstan__buf_free(&b);
            if (!rc && !is_null(ov) && !s->args)
                rc = nomem(c);
        } else {
            size_t i, n = sizeof(job_options) / sizeof(*job_options);
            for (i = 0; i < n && strcmp(o, job_options[i]); i++)
                ;
            if (i == n) {
                rc = capstan__yaml_fail(c, node(c, p->key), sub,
                                        "unknown key (cron, tz, class, queue, args, retry, missed, "
                                        "tags, backtrace, dead, retry_for, retry_queue)");
                break;
            }
            rc = capstan__buf_puts(&s->extra, s->extra.len ? "," : "{") ||
                         capstan__json_quote(&s->extra, o, strlen(o)) || capstan__buf_puts(&s->extra, ":")
                     ? nomem(c)
                     : to_json(c, sub, ov, &s->extra, 0);
        }
    }
    if (rc)
        return rc;
    if (!s->cron)
        return capstan__yaml_fail(c, kn, key, "cron: must be given");
    if (!s->cls)
        return capstan__yaml_fail(c, kn, key, "class: must be given");
    /* The expression and the zone are checked here too, so the line named
     * is theirs. */
    capstan_cron_t cron;
    if (capstan__cron_parse(s->cron, &cron, why))
        return capstan__yaml_fail(c, cron_node, key, "cron: %s", why);
    const char *zone, *bad;
    capstan_tz_t *tz = capstan__periodic_zone(&cron, s->tz, &zone, &bad, why);
    if (!tz)
        return capstan__yaml_fail(c, strcmp(bad, "cron") ? tz_node : cron_node, key, "%s: %s", bad, why);
    capstan__tz_free(tz);
    if (s->extra.len && capstan__buf_puts(&s->extra, "}"))
        return nomem(c);
    s->o.name = s->name;
    s->o.cron = s->cron;
    s->o.tz = s->tz;
    s->o.cls = s->cls;
    s->o.queue = s->queue;
    s->o.args = s->args;
    s->o.extra = s->extra.len ? s->extra.p : NULL;
    return 0;
}

int capstan__yaml_set_periodic(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    if (is_null(v))
        return 0;
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping of schedule names to schedules");
    /* An environment's section replaces the top level's schedules. */
    capstan__periodic_conf_free(c->cfg);
    int rc = 0;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top && !rc; p++) {
        yaml_node_t *kn = node(c, p->key);
        const char *name = key_name(kn);
        if (!name || !*name) {
            rc = capstan__yaml_fail(c, kn, key, "a schedule name must be a plain word");
            break;
        }
        sched_t s = { 0 };
        char origin[CAPSTAN_ERRLEN], why[CAPSTAN_ERRLEN];
        rc = read_schedule(c, name, kn, node(c, p->value), &s);
        snprintf(origin, sizeof(origin), "%s:%lu", c->path, (unsigned long)kn->start_mark.line + 1);
        if (!rc && (rc = capstan__periodic_add(c->cfg, &s.o, origin, why)) != 0) {
            /* why names the schedule as "periodic NAME: "; the file's
             * wording is "periodic.NAME: ". */
            char sub[CAPSTAN_ERRLEN];
            size_t skip = strlen("periodic ") + strlen(name) + 2;
            snprintf(sub, sizeof(sub), "periodic.%s", name);
            rc = rc != CAPSTAN_ECONFIG ? nomem(c)
                 : capstan__yaml_fail(c, kn, sub, "%s", strlen(why) > skip ? why + skip : why);
        }
        sched_free(&s);
    }
    return rc;
}
