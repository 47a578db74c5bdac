/* TLS settings given apart from the URL, carried into the query of a URL
 * that speaks TLS (rediss://, or a sentinel URL with TLS to the master or
 * the sentinels), where every connection (the worker's threads, the
 * metrics server) reads them from cfg->redis_url, or from each shard's
 * URL. */
#include "config/tls.h"
#include "config/yaml.h"
#include "redis/url.h"

#include <stdio.h>

void capstan__config_tls_clear(capstan_tls_conf_t *t)
{
    free(t->ca_file);
    free(t->ca_path);
    free(t->cert);
    free(t->key);
    free(t->server_name);
    memset(t, 0, sizeof(*t));
}

/* The setting called name (ca_file, cert, ...), or NULL for verify. */
static char **slot(capstan_tls_conf_t *t, const char *name)
{
    if (!strcmp(name, "ca_file")) return &t->ca_file;
    if (!strcmp(name, "ca_path")) return &t->ca_path;
    if (!strcmp(name, "cert")) return &t->cert;
    if (!strcmp(name, "key")) return &t->key;
    if (!strcmp(name, "server_name")) return &t->server_name;
    return NULL;
}

static int set_verify(capstan_tls_conf_t *t, const char *v)
{
    if (!strcmp(v, "none") || !strcmp(v, "peer")) {
        t->verify_none = !strcmp(v, "none");
        return 0;
    }
    return CAPSTAN_EINVAL;
}

int capstan__config_tls_flag(capstan_config_t *cfg, const char *flag, const char *v, char *err)
{
    char name[32];   /* "tls-ca-file" -> "ca_file" */
    snprintf(name, sizeof(name), "%s", flag + 4);
    for (char *p = name; *p; p++)
        if (*p == '-')
            *p = '_';
    char **s = slot(&cfg->tls, name);
    if (s)
        return capstan_config_set_str(s, v);
    if (set_verify(&cfg->tls, v))
        return capstan_seterr(err, CAPSTAN_ECONFIG, "--tls-verify: must be peer or none (got \"%s\")", v);
    return 0;
}

/* The tls: mapping: ca_file, ca_path, cert, key, server_name, verify. */
int capstan__yaml_set_tls(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "must be a mapping (ca_file, ca_path, cert, key, "
                                         "server_name, verify)");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        const char *name = key_name(node(c, p->key));
        char sub[CAPSTAN_ERRLEN];
        snprintf(sub, sizeof(sub), "%s.%s", key, name ? name : "?");
        char **s = name ? slot(&c->cfg->tls, name) : NULL;
        int rc;
        if (s) {
            rc = capstan__yaml_set_string(c, sub, node(c, p->value), s, NULL);
        } else if (name && !strcmp(name, "verify")) {
            char *val = NULL;
            rc = capstan__yaml_scalar(c, node(c, p->value), sub, "must be peer or none", &val);
            if (rc >= 0 && set_verify(&c->cfg->tls, val))
                rc = capstan__yaml_fail(c, node(c, p->value), sub, "must be peer or none");
            free(val);
        } else {
            rc = capstan__yaml_fail(c, node(c, p->key), sub, "unknown key (known: ca_file, ca_path, "
                                                         "cert, key, server_name, verify)");
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Appends "&name=value" with value percent-escaped where the URL syntax
 * would read it otherwise. */
static void put_param(FILE *f, const char *name, const char *v)
{
    if (!v)
        return;
    fprintf(f, "&%s=", name);
    for (; *v; v++) {
        if (strchr("%&#?+@ ", *v) || (unsigned char)*v < 0x20)
            fprintf(f, "%%%02X", (unsigned char)*v);
        else
            fputc(*v, f);
    }
}

/* Whether url speaks TLS to a server: rediss://, rediss+sentinel://, or
 * redis+sentinel:// with sentinel_ssl=true in its query. */
static int speaks_tls(const char *url)
{
    if (!strncmp(url, "rediss://", 9) || !strncmp(url, "rediss+sentinel://", 18))
        return 1;
    const char *q = strchr(url, '?');
    return !strncmp(url, "redis+sentinel://", 17) && q && strstr(q, "sentinel_ssl=true");
}

/* Appends t to *url as query parameters. 0 or CAPSTAN_ENOMEM. */
static int into(char **url, const capstan_tls_conf_t *t, char *err)
{
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    fputs(*url, f);
    put_param(f, "ca_file", t->ca_file);
    put_param(f, "ca_path", t->ca_path);
    put_param(f, "cert", t->cert);
    put_param(f, "key", t->key);
    put_param(f, "server_name", t->server_name);
    if (t->verify_none)
        fputs("&verify=none", f);
    if (fclose(f) || !out) {
        free(out);
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    }
    /* The first parameter starts the query unless the URL has one. */
    char *amp = out + strlen(*url);
    if (!strchr(*url, '?'))
        *amp = '?';
    free(*url);
    *url = out;
    return 0;
}

int capstan__config_tls_into_url(capstan_config_t *cfg, char *err)
{
    capstan_tls_conf_t *t = &cfg->tls;
    if (!t->ca_file && !t->ca_path && !t->cert && !t->key && !t->server_name && !t->verify_none)
        return 0;
    /* Sharded: into every shard that speaks TLS, at least one. */
    size_t tls = 0;
    for (size_t i = 0; i < cfg->nshards; i++)
        if (speaks_tls(cfg->shards[i].redis_url)) {
            int rc = into(&cfg->shards[i].redis_url, t, err);
            if (rc)
                return rc;
            tls++;
        }
    if (cfg->nshards && !tls)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "tls: settings need a shard whose URL speaks TLS "
                              "(rediss://, or sentinels with ssl or sentinel_ssl)");
    if (!cfg->nshards && (!cfg->redis_url || !speaks_tls(cfg->redis_url))) {
        char shown[512];
        capstan__redis_url_redact(cfg->redis_url ? cfg->redis_url : "", shown, sizeof(shown));
        return capstan_seterr(err, CAPSTAN_ECONFIG, "tls: settings need a URL that speaks TLS "
                              "(rediss://, or sentinels with ssl or sentinel_ssl; got %s)", shown);
    }
    int rc = cfg->nshards ? 0 : into(&cfg->redis_url, t, err);
    if (!rc)
        capstan__config_tls_clear(t);
    return rc;
}
