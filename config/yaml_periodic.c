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

static int finish_schedule(ctx_t *c, const char *key, sched_t *s, yaml_node_t *cron_node, yaml_node_t *tz_node);

static int read_schedule(ctx_t *c, const char *name, yaml_node_t *kn, yaml_node_t *v, sched_t *s)
{
    char key[CAPSTAN_ERRLEN];
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
            free(s->args); /* a key given twice: the later wins */
            s->args = NULL;
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
    return finish_schedule(c, key, s, cron_node, tz_node);
}

/* Checks a schedule read into s (cron_node and tz_node: where its cron and
 * tz came from) and points s->o at its fields. */
static int finish_schedule(ctx_t *c, const char *key, sched_t *s, yaml_node_t *cron_node, yaml_node_t *tz_node)
{
    char why[CAPSTAN_ERRLEN];
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

/* Adds the schedule s read at kn from section (its key's first word). */
static int add_schedule(ctx_t *c, yaml_node_t *kn, const char *section, sched_t *s)
{
    char origin[CAPSTAN_ERRLEN], why[CAPSTAN_ERRLEN];
    snprintf(origin, sizeof(origin), "%s:%lu", c->path, (unsigned long)kn->start_mark.line + 1);
    int rc = capstan__periodic_add(c->cfg, &s->o, origin, why);
    if (!rc)
        return 0;
    /* why names the schedule as "periodic NAME: "; the file's wording is
     * "SECTION.NAME: ". */
    char sub[CAPSTAN_ERRLEN];
    size_t skip = strlen("periodic ") + strlen(s->name) + 2;
    snprintf(sub, sizeof(sub), "%s.%s", section, s->name);
    return rc != CAPSTAN_ECONFIG ? nomem(c) : capstan__yaml_fail(c, kn, sub, "%s", strlen(why) > skip ? why + skip : why);
}

/* Reads one schedule entry name (at kn) into s; *off set when it is not
 * to run. */
typedef int (*entry_fn)(ctx_t *c, const char *name, yaml_node_t *kn, yaml_node_t *v, sched_t *s, int *off);

/* A section of schedules by name, periodic: (gem 0) or a gem's schedule:
 * (gem 1), each entry read by read. An environment's section replaces the
 * top level's schedules of its own kind. */
static int read_section(ctx_t *c, const char *key, yaml_node_t *v, int gem, entry_fn read)
{
    if (is_null(v))
        return 0;
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping of schedule names to schedules");
    capstan__periodic_conf_drop(c->cfg, gem);
    int rc = 0;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top && !rc; p++) {
        yaml_node_t *kn = node(c, p->key);
        const char *name = key_name(kn);
        if (!name || !*name)
            return capstan__yaml_fail(c, kn, key, "a schedule name must be a plain word");
        sched_t s = { 0 };
        int off = 0;
        rc = read(c, name, kn, node(c, p->value), &s, &off);
        if (!rc && !off && !(rc = add_schedule(c, kn, gem ? "schedule" : "periodic", &s)))
            c->cfg->periodic[c->cfg->nperiodic - 1].gem = gem;
        sched_free(&s);
    }
    return rc;
}

static int periodic_entry(ctx_t *c, const char *name, yaml_node_t *kn, yaml_node_t *v, sched_t *s, int *off)
{
    (void)off;
    return read_schedule(c, name, kn, v, s);
}

int capstan__yaml_set_periodic(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    return read_section(c, key, v, 0, periodic_entry);
}

/* sidekiq-scheduler's and sidekiq-cron's schedules, as a sidekiq.yml gives
 * them (`:schedule:`, or sidekiq-scheduler 5's `:scheduler: {:schedule:}`),
 * read as periodic schedules with the same exactly-once ticks. What the
 * gems have and capstan cannot honour is a warning naming the key, never
 * a refusal, so a Rails app's file starts as it is. */

/* An every: value ("30s", or ["30m", {first_in: "5m"}]) as "@every D" in
 * s->cron. */
static int gem_every(ctx_t *c, const char *key, yaml_node_t *v, sched_t *s)
{
    yaml_node_t *d = v;
    char *text = NULL, why[CAPSTAN_ERRLEN];
    int64_t secs;
    if (v->type == YAML_SEQUENCE_NODE && v->data.sequence.items.top > v->data.sequence.items.start) {
        d = node(c, v->data.sequence.items.start[0]);
        for (yaml_node_item_t *it = v->data.sequence.items.start + 1; it < v->data.sequence.items.top; it++) {
            yaml_node_t *o = node(c, *it);
            if (o->type != YAML_MAPPING_NODE)
                continue;
            for (yaml_node_pair_t *p = o->data.mapping.pairs.start; p < o->data.mapping.pairs.top; p++) {
                const char *opt = key_name(node(c, p->key));
                char sub[CAPSTAN_ERRLEN];
                snprintf(sub, sizeof(sub), "%s.%s", key, opt ? opt : "?");
                int rc = capstan__yaml_warn(c, node(c, p->key), sub, "not honoured: capstan's ticks fall "
                                            "on multiples of the interval since the epoch, the same in every process");
                if (rc < 0)
                    return rc;
            }
        }
    }
    int rc = capstan__yaml_scalar(c, d, key, "must be a duration (30s, 5m, 1h30m, 2d)", &text);
    if (rc < 0)
        return rc;
    if (capstan__cron_duration(text, &secs, why))
        rc = capstan__yaml_fail(c, d, key, "%s", why);
    else if (asprintf(&s->cron, "@every %s", text) < 0)
        rc = nomem(c);
    free(text);
    return rc;
}

/* Whether a gem's status: or enabled: turns the entry off. */
static int gem_off(ctx_t *c, const char *key, const char *o, yaml_node_t *v, int *off)
{
    char *text = NULL;
    int b, rc = capstan__yaml_scalar(c, v, key, "must be enabled or disabled", &text);
    if (rc < 0)
        return rc;
    if (!strcmp(o, "status") && (!strcmp(text, "enabled") || !strcmp(text, "disabled")))
        *off = !strcmp(text, "disabled");
    else if (!strcmp(o, "enabled") && to_bool(text, &b) == 0)
        *off = !b;
    else
        rc = capstan__yaml_fail(c, v, key, !strcmp(o, "status") ? "must be enabled or disabled"
                                                                 : "must be true or false");
    free(text);
    return rc;
}

/* One entry of a gem's schedule. *off is set when it is not to run
 * (disabled, or a one-shot). */
static int gem_entry(ctx_t *c, const char *name, yaml_node_t *kn, yaml_node_t *v, sched_t *s, int *off)
{
    char key[CAPSTAN_ERRLEN];
    snprintf(key, sizeof(key), "schedule.%s", name);
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping (cron or every, class, queue, args, ...)");
    capstan_periodic_opts_t def = CAPSTAN_PERIODIC_OPTS_INIT;
    s->o = def;
    if (!(s->name = strdup(name)))
        return nomem(c);
    int rc = 0, once = 0;
    yaml_node_t *cron_node = NULL, *tz_node = NULL;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top && rc >= 0; p++) {
        yaml_node_t *on = node(c, p->key), *ov = node(c, p->value);
        const char *o = key_name(on);
        char sub[CAPSTAN_ERRLEN];
        snprintf(sub, sizeof(sub), "%s.%s", key, o ? o : "?");
        if (!o) {
            rc = capstan__yaml_fail(c, on, key, "a key must be a plain word");
        } else if (!strcmp(o, "cron")) {
            cron_node = ov;
            free(s->cron);
            s->cron = NULL;
            rc = capstan__yaml_set_string(c, sub, ov, &s->cron, NULL);
        } else if (!strcmp(o, "every") || !strcmp(o, "interval")) {
            cron_node = ov;
            free(s->cron);
            s->cron = NULL;
            rc = gem_every(c, sub, ov, s);
        } else if (!strcmp(o, "at") || !strcmp(o, "in")) {
            once = 1;
            rc = capstan__yaml_warn(c, on, sub, "a one-shot job: capstan's schedules recur, so this entry is "
                                    "not run (push it once with capstan push --at or --in)");
        } else if (!strcmp(o, "class")) {
            rc = capstan__yaml_set_string(c, sub, ov, &s->cls, NULL);
        } else if (!strcmp(o, "queue")) {
            rc = capstan__yaml_set_string(c, sub, ov, &s->queue, NULL);
        } else if (!strcmp(o, "tz")) {
            tz_node = ov;
            rc = capstan__yaml_set_string(c, sub, ov, &s->tz, NULL);
        } else if (!strcmp(o, "retry")) {
            rc = capstan__yaml_retry(c, sub, ov, &s->o.retry);
        } else if (!strcmp(o, "missed")) {
            if (!(rc = capstan__yaml_set_string(c, sub, ov, &s->missed, NULL)) &&
                capstan_periodic_missed(s->missed, &s->o.missed))
                rc = capstan__yaml_fail(c, ov, sub, "must be skip, last or all");
        } else if (!strcmp(o, "args")) {
            /* Both gems pass a list as the arguments and anything else as
             * the one argument. */
            capstan_buf_t b = { 0 };
            int list = ov->type == YAML_SEQUENCE_NODE;
            if (!is_null(ov) && !(rc = (!list && capstan__buf_puts(&b, "[")) ? nomem(c) : 0) &&
                !(rc = to_json(c, sub, ov, &b, 0)) && !list && capstan__buf_puts(&b, "]"))
                rc = nomem(c);
            free(s->args);
            s->args = !rc && !is_null(ov) ? capstan__buf_take(&b, NULL) : NULL;
            capstan__buf_free(&b);
            if (!rc && !is_null(ov) && !s->args)
                rc = nomem(c);
        } else if (!strcmp(o, "enabled") || !strcmp(o, "status")) {
            rc = gem_off(c, sub, o, ov, off);
        } else if (!strcmp(o, "description")) {
            /* words for people: nothing to do */
        } else if (!strcmp(o, "active_job")) {
            int b = 0;
            if (!(rc = capstan__yaml_flag(c, sub, ov, &b)) && b)
                rc = capstan__yaml_warn(c, on, sub, "not honoured: the job is enqueued as a Sidekiq job of its "
                                        "class, which a Ruby ActiveJob class cannot run");
        } else {
            rc = capstan__yaml_warn(c, on, sub, "not used by capstan (an option of sidekiq-scheduler or "
                                    "sidekiq-cron); ignored");
        }
    }
    if (rc < 0)
        return rc;
    if (once || *off) {
        *off = 1;
        return 0;
    }
    if (!s->cron)
        return capstan__yaml_fail(c, kn, key, "cron or every: must be given");
    /* sidekiq-scheduler runs the class named like the entry when it names
     * none. */
    if (!s->cls && !(s->cls = strdup(name)))
        return nomem(c);
    return finish_schedule(c, key, s, cron_node, tz_node);
}

int capstan__yaml_set_schedule(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    return read_section(c, key, v, 1, gem_entry);
}

/* sidekiq-scheduler 5's section: its schedule: and its switches. */
int capstan__yaml_set_scheduler(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    if (is_null(v))
        return 0;
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping (schedule, enabled, ...)");
    int rc = 0, off = 0;
    yaml_node_t *schedule = NULL;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top && rc >= 0; p++) {
        yaml_node_t *on = node(c, p->key);
        const char *o = key_name(on);
        char sub[CAPSTAN_ERRLEN];
        snprintf(sub, sizeof(sub), "%s.%s", key, o ? o : "?");
        if (o && !strcmp(o, "schedule"))
            schedule = node(c, p->value);
        else if (o && !strcmp(o, "enabled"))
            rc = gem_off(c, sub, o, node(c, p->value), &off);
        else
            rc = capstan__yaml_warn(c, on, sub, "not used by capstan (a sidekiq-scheduler option); ignored");
    }
    if (rc < 0 || !schedule)
        return rc < 0 ? rc : 0;
    if (off)
        return capstan__yaml_warn(c, schedule, key, "enabled: false: the schedules of this section are not run");
    return capstan__yaml_set_schedule(c, k, "schedule", schedule);
}
