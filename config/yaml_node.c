/* The YAML reader's helpers that every part of it uses (config/yaml.h):
 * the one way to report a "file:line: key: problem" line or a warning,
 * scalars with ${VAR} expansion, and the flag, retry and string values
 * several sections take. Kept apart from config/yaml.c so the section
 * readers (classes, periodic, sentinels, tls) and the top level call down
 * into one file instead of into each other. */
#include "config/yaml.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define line_of(n) file_line(c->erb, (n)->start_mark.line)

int capstan__yaml_warn(ctx_t *c, const yaml_node_t *n, const char *key, const char *fmt, ...)
{
    capstan_config_t *cfg = c->cfg;
    char problem[CAPSTAN_ERRLEN], *line = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof(problem), fmt, ap);
    va_end(ap);
    char **grown = realloc(cfg->warnings, (cfg->nwarnings + 1) * sizeof(*grown));
    if (!grown)
        return nomem(c);
    cfg->warnings = grown;
    if (asprintf(&line, "%s:%lu: %s: %s", c->path, line_of(n), key, problem) < 0)
        return nomem(c);
    cfg->warnings[cfg->nwarnings++] = line;
    return 0;
}

int capstan__yaml_fail(ctx_t *c, const yaml_node_t *n, const char *key, const char *fmt, ...)
{
    char problem[CAPSTAN_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof(problem), fmt, ap);
    va_end(ap);
    return capstan_seterr(c->err, CAPSTAN_ECONFIG, "%s:%lu: %s: %s", c->path, line_of(n),
                          key, problem);
}

/* Copies a scalar's text into *out (owned by the caller) with ${VAR} and
 * ${VAR:-default} replaced from the environment, as a shell would: the
 * default also covers a variable that is set but empty. want is the problem
 * to report when v is not a scalar. */
int capstan__yaml_scalar(ctx_t *c, yaml_node_t *v, const char *key, const char *want,
                         char **out)
{
    if (v->type != YAML_SCALAR_NODE)
        return capstan__yaml_fail(c, v, key, "%s", want);
    const char *s = text(v);
    size_t len = v->data.scalar.length;
    /* A "\0" escape would cut the value short, unseen, where it is read. */
    if (memchr(s, '\0', len))
        return capstan__yaml_fail(c, v, key, "must not hold a NUL byte (\"\\0\")");
    char *buf = NULL, *name = NULL;
    size_t blen = 0;
    int rc = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f)
        return nomem(c);
    for (size_t i = 0; i < len && !rc;) {
        if (s[i] != '$' || i + 1 >= len || s[i + 1] != '{') {
            fputc(s[i++], f);
            continue;
        }
        size_t j = i + 2;
        while (j < len && (isalnum((unsigned char)s[j]) || s[j] == '_'))
            j++;
        size_t name_len = j - (i + 2);
        const char *def = NULL;
        size_t def_len = 0;
        if (j + 1 < len && s[j] == ':' && s[j + 1] == '-') {
            def = s + j + 2;
            for (j += 2; j < len && s[j] != '}'; j++)
                def_len++;
        }
        if (j >= len || s[j] != '}' || name_len == 0) {
            rc = capstan__yaml_fail(c, v, key, "malformed ${...} reference");
            break;
        }
        free(name);
        if (!(name = strndup(s + i + 2, name_len))) {
            rc = nomem(c);
            break;
        }
        const char *val = getenv(name);
        if (val && (*val || !def))
            fputs(val, f);
        else if (def)
            fwrite(def, 1, def_len, f);
        else
            rc = capstan__yaml_fail(c, v, key, "environment variable %s is not set", name);
        i = j + 1;
    }
    free(name);
    if (fclose(f) != 0 && !rc)
        rc = nomem(c);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

int capstan__yaml_flag(ctx_t *c, const char *key, yaml_node_t *v, int *out)
{
    char *s = NULL;
    int rc = capstan__yaml_scalar(c, v, key, "must be true or false", &s);
    if (rc == 0 && to_bool(s, out))
        rc = capstan__yaml_fail(c, v, key, "must be true or false");
    free(s);
    return rc;
}

int capstan__yaml_retry(ctx_t *c, const char *key, yaml_node_t *v, int *out)
{
    const char *want = "must be true, false or an integer >= 0";
    char *s = NULL;
    long n;
    int b, rc = capstan__yaml_scalar(c, v, key, want, &s);
    if (rc < 0)
        return rc;
    if (to_bool(s, &b) == 0)
        *out = b ? CAPSTAN_RETRY_DEFAULT : CAPSTAN_RETRY_NONE;
    else if (to_long(s, &n) == 0 && n >= 0 && n <= INT_MAX)
        *out = (int)n;
    else
        rc = capstan__yaml_fail(c, v, key, "%s", want);
    free(s);
    return rc;
}

int capstan__yaml_set_string(ctx_t *c, const char *key, yaml_node_t *v, char **slot,
                             const char *null_value)
{
    char *s = NULL;
    if (is_null(v))
        return capstan_config_set_str(slot, null_value) < 0 ? nomem(c) : 0;
    int rc = capstan__yaml_scalar(c, v, key, "must be a string", &s);
    if (rc < 0)
        return rc;
    free(*slot);
    *slot = s;
    return 0;
}

