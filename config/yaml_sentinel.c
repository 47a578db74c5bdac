/* `redis:` with `sentinels:`, the shape of redis-client's Sentinel options
 * (Sidekiq's redis: hash), read into the redis+sentinel:// URL it means:
 *
 *   redis:
 *     sentinels: [{host: s1, port: 26379}, {host: s2, port: 26379}]
 *     name: mymaster          # or master_name
 *     role: master
 *     password: ...           # the master's (and username, db, ssl)
 *     sentinel_username: ...  # the sentinels' own
 *     sentinel_password: ...
 *     sentinel_ssl: true      # TLS to the sentinels too (or ssl: true on
 *                             # every entry of sentinels:, as redis-client) */
#include "config/yaml.h"

#include <ctype.h>
#include <stdio.h>

typedef struct parts {
    char *name, *user, *password, *suser, *spassword, *db, *role;
    int ssl;
    int sentinel_ssl;
    size_t nssl;  /* sentinels entries with ssl: true */
    char *hosts;  /* "h:p,h:p" */
    size_t nhosts;
} parts_t;

/* Appends s to *buf, percent-escaping what a URL's parts cannot hold. */
static int append(char **buf, const char *s, int escape)
{
    size_t have = *buf ? strlen(*buf) : 0, n = strlen(s);
    char *b = realloc(*buf, have + 3 * n + 1);
    if (!b)
        return CAPSTAN_ENOMEM;
    char *o = b + have;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (escape && !(isalnum(ch) || strchr("-._~", ch)))
            o += sprintf(o, "%%%02X", ch);
        else
            *o++ = (char)ch;
    }
    *o = '\0';
    *buf = b;
    return 0;
}

static int sentinel_entry(ctx_t *c, const char *key, yaml_node_t *v, parts_t *p)
{
    char *host = NULL, *port = NULL;
    int rc = 0;
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "each sentinel must be a mapping with host and port");
    for (yaml_node_pair_t *q = v->data.mapping.pairs.start; !rc && q < v->data.mapping.pairs.top; q++) {
        const char *name = key_name(node(c, q->key));
        char **slot = name && !strcmp(name, "host") ? &host : name && !strcmp(name, "port") ? &port
                                                                                          : NULL;
        int ssl = 0;
        if (name && !strcmp(name, "ssl")) {
            rc = capstan__yaml_flag(c, key, node(c, q->value), &ssl);
            p->nssl += ssl && rc == 0;
            continue;
        }
        rc = slot ? capstan__yaml_scalar(c, node(c, q->value), key, "must be a string", slot)
                  : capstan__yaml_fail(c, node(c, q->key), key,
                                       "a sentinel has host, port and ssl only");
    }
    long pn = 26379;
    if (!rc && (!host || !*host))
        rc = capstan__yaml_fail(c, v, key, "a sentinel needs a host");
    if (!rc && port && (to_long(port, &pn) || pn < 1 || pn > 65535))
        rc = capstan__yaml_fail(c, v, key, "port must be an integer between 1 and 65535");
    char hp[300];
    if (!rc) {
        snprintf(hp, sizeof(hp), "%s%s%s%s:%ld", p->nhosts++ ? "," : "", strchr(host, ':') ? "[" : "",
                 host, strchr(host, ':') ? "]" : "", pn);
        rc = append(&p->hosts, hp, 0) ? nomem(c) : 0;
    }
    free(host);
    free(port);
    return rc;
}

/* Options of Ruby's Redis clients that tune a pool or socket. */
static int is_tuning(const char *name)
{
    static const char *const tuning[] = { "size", "driver", "id", "ssl_params", "timeout",
                                          "reconnect_attempts", "sentinel_timeout" };
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof(tuning) / sizeof(*tuning); i++)
        if (!strcmp(name, tuning[i]))
            return 1;
    return n > 8 && !strcmp(name + n - 8, "_timeout");
}

static int read_parts(ctx_t *c, const char *key, yaml_node_t *v, parts_t *p)
{
    for (yaml_node_pair_t *q = v->data.mapping.pairs.start; q < v->data.mapping.pairs.top; q++) {
        yaml_node_t *kn = node(c, q->key), *vn = node(c, q->value);
        const char *name = key_name(kn);
        char sub[CAPSTAN_ERRLEN];
        snprintf(sub, sizeof(sub), "%s.%s", key, name ? name : "?");
        static const char *const names[] = { "name", "master_name", "username", "password",
                                             "sentinel_username", "sentinel_password", "db",
                                             "role" };
        char **slots[] = { &p->name, &p->name, &p->user, &p->password, &p->suser,
                           &p->spassword, &p->db, &p->role };
        int rc = -1;
        for (size_t i = 0; name && i < sizeof(names) / sizeof(*names); i++)
            if (!strcmp(name, names[i])) {
                free(*slots[i]);
                *slots[i] = NULL;
                rc = capstan__yaml_scalar(c, vn, sub, "must be a string", slots[i]);
            }
        if (rc != -1) {
            if (rc < 0)
                return rc;
        } else if (name && !strcmp(name, "sentinels")) {
            if (vn->type != YAML_SEQUENCE_NODE)
                return capstan__yaml_fail(c, vn, sub, "must be a list of {host, port}");
            for (yaml_node_item_t *i = vn->data.sequence.items.start; i < vn->data.sequence.items.top; i++)
                if ((rc = sentinel_entry(c, sub, node(c, *i), p)) < 0)
                    return rc;
        } else if (name && !strcmp(name, "ssl")) {
            if ((rc = capstan__yaml_flag(c, sub, vn, &p->ssl)) < 0)
                return rc;
        } else if (name && !strcmp(name, "sentinel_ssl")) {
            if ((rc = capstan__yaml_flag(c, sub, vn, &p->sentinel_ssl)) < 0)
                return rc;
        } else if (name && !strcmp(name, "url")) {
            return capstan__yaml_fail(c, kn, sub, "give either url or sentinels, not both");
        } else if (name && is_tuning(name)) {
            /* Pool and socket tuning: as for a plain redis: mapping. */
            if ((rc = capstan__yaml_warn(c, kn, sub, "not used by capstan (a Ruby client option); "
                                                 "ignored")) < 0)
                return rc;
        } else {
            return capstan__yaml_fail(c, kn, sub, "unknown key");
        }
    }
    return 0;
}

int capstan__yaml_set_sentinels(ctx_t *c, const char *key, yaml_node_t *v)
{
    parts_t p = { 0 };
    char *url = NULL;
    long db = 0;
    int rc = read_parts(c, key, v, &p);
    if (!rc && !p.nhosts)
        rc = capstan__yaml_fail(c, v, key, "sentinels: must list at least one {host, port}");
    else if (!rc && (!p.name || !*p.name))
        rc = capstan__yaml_fail(c, v, key, "name: the master's name (as the sentinels monitor it) "
                                       "is missing");
    else if (!rc && p.role && strcmp(p.role, "master"))
        rc = capstan__yaml_fail(c, v, key, "role: only master is supported (jobs are written)");
    else if (!rc && p.db && (to_long(p.db, &db) || db < 0 || db > 100000))
        rc = capstan__yaml_fail(c, v, key, "db: must be an integer >= 0");
    else if (!rc && p.nssl && p.nssl != p.nhosts)
        rc = capstan__yaml_fail(c, v, key, "sentinels: ssl must be on every sentinel or none "
                                       "(capstan speaks TLS to all of them or none)");
    if (!rc) {
        char dbs[32];
        snprintf(dbs, sizeof(dbs), "/%ld", db);
        int bad = append(&url, p.ssl ? "rediss+sentinel://" : "redis+sentinel://", 0);
        if (p.user || p.password) {
            bad |= p.user ? append(&url, p.user, 1) : 0;
            bad |= append(&url, ":", 0) | append(&url, p.password ? p.password : "", 1);
            bad |= append(&url, "@", 0);
        }
        bad |= append(&url, p.hosts, 0) | append(&url, "/", 0) | append(&url, p.name, 1);
        bad |= append(&url, dbs, 0);
        const char *sep = "?";
        if (p.suser) {
            bad |= append(&url, "?sentinel_username=", 0) | append(&url, p.suser, 1);
            sep = "&";
        }
        if (p.spassword) {
            bad |= append(&url, sep, 0) | append(&url, "sentinel_password=", 0)
                   | append(&url, p.spassword, 1);
            sep = "&";
        }
        if (p.sentinel_ssl || p.nssl)
            bad |= append(&url, sep, 0) | append(&url, "sentinel_ssl=true", 0);
        rc = bad ? nomem(c) : 0;
    }
    if (!rc) {
        free(c->cfg->redis_url);
        c->cfg->redis_url = url;
        c->cfg->redis_url_explicit = 1;
        url = NULL;
    }
    free(url);
    free(p.name), free(p.user), free(p.password), free(p.suser), free(p.spassword);
    free(p.db), free(p.role), free(p.hosts);
    return rc;
}
