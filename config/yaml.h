/* What the files of the YAML reader share: config/yaml.c reads the file
 * and its top-level settings, config/yaml_classes.c the classes: section,
 * config/yaml_sentinel.c a redis: mapping with sentinels: and
 * config/tls.c the tls: mapping. The parse state, the node helpers and the
 * one way to report a "file:line: key: problem" error. Not public. */
#ifndef CAPSTAN_CONFIG_YAML_H
#define CAPSTAN_CONFIG_YAML_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "capstan/config.h"
#include "config/erb.h"
#include "config/settings.h"

typedef struct ctx {
    capstan_config_t *cfg;
    yaml_document_t doc;
    const char *path;
    const char *env; /* environment whose section applies */
    char *err;
    unsigned merged; /* mappings merged in with << so far */
    const capstan_erb_t *erb; /* the rendered file, whose lines map to the file's */
} ctx_t;

typedef struct key_def key_def_t;
typedef int (*setter_fn)(ctx_t *c, const key_def_t *k, const char *key,
                         yaml_node_t *v);

struct key_def {
    const char *name;
    setter_fn set;
};

/* Fills c->err with "path:line: key: problem" for node n and returns
 * CAPSTAN_ECONFIG. */
int capstan__yaml_fail(ctx_t *c, const yaml_node_t *n, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Adds "path:line: key: problem" for node n to c->cfg->warnings. Returns 0
 * or CAPSTAN_ENOMEM. */
int capstan__yaml_warn(ctx_t *c, const yaml_node_t *n, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Copies a scalar's text into *out (owned by the caller) with ${VAR} and
 * ${VAR:-default} replaced from the environment. want is the problem to
 * report when v is not a scalar. (ERB was rendered before the YAML was
 * read: config/erb.h.) */
int capstan__yaml_scalar(ctx_t *c, yaml_node_t *v, const char *key, const char *want,
                         char **out);

/* Replaces *slot with the expanded scalar; null gives null_value. */
int capstan__yaml_set_string(ctx_t *c, const char *key, yaml_node_t *v, char **slot,
                             const char *null_value);

/* A YAML 1.1 boolean into *out. */
int capstan__yaml_flag(ctx_t *c, const char *key, yaml_node_t *v, int *out);
/* A job's retry: true (max_retries), false (none) or a count, into *out
 * (CAPSTAN_RETRY_DEFAULT, CAPSTAN_RETRY_NONE or the count). */
int capstan__yaml_retry(ctx_t *c, const char *key, yaml_node_t *v, int *out);

/* A redis: mapping with sentinels: (config/yaml_sentinel.c), into a
 * redis+sentinel:// URL. */
int capstan__yaml_set_sentinels(ctx_t *c, const char *key, yaml_node_t *v);

/* The classes: section (config/yaml_classes.c). */
int capstan__yaml_set_classes(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v);

/* The periodic: section (config/yaml_periodic.c). */
int capstan__yaml_set_periodic(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v);
/* The schedule: section of sidekiq-scheduler and sidekiq-cron, and
 * sidekiq-scheduler 5's scheduler: {schedule: ...} (config/yaml_periodic.c). */
int capstan__yaml_set_schedule(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v);
int capstan__yaml_set_scheduler(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v);

/* The shards: list (config/yaml_shards.c). */
int capstan__yaml_set_shards(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v);

/* The tls: mapping (config/tls.c). */
int capstan__yaml_set_tls(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v);

/* The file's line of a node: its line in the text rendered from the
 * file's ERB, mapped back. */
static inline unsigned long file_line(const capstan_erb_t *erb, size_t mark_line)
{
    return capstan__erb_line(erb, (unsigned long)mark_line + 1);
}

static inline int nomem(ctx_t *c)
{
    return capstan_seterr(c->err, CAPSTAN_ENOMEM, "out of memory");
}

static inline yaml_node_t *node(ctx_t *c, int index)
{
    return yaml_document_get_node(&c->doc, index);
}

static inline const char *text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* YAML's null: an empty value, ~ or null, unquoted. */
static inline int is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *s = text(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

/* Ruby symbol keys (":concurrency:") name the same setting. */
static inline const char *key_name(const yaml_node_t *k)
{
    if (k->type != YAML_SCALAR_NODE)
        return NULL;
    const char *s = text(k);
    return *s == ':' ? s + 1 : s;
}

static inline int to_long(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno)
        return CAPSTAN_EINVAL;
    *out = v;
    return 0;
}

/* YAML 1.1 booleans, as the settings table reads them. */
static inline int to_bool(const char *s, int *out)
{
    return capstan__setting_bool(s, out);
}

#endif
