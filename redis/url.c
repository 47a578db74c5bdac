/* Redis URL parsing and redaction. */
#include "redis/url.h"
#include "support/number.h"
#include "redis/sentinel.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *pct_decode(const char *s, size_t n)
{
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1])
            && isxdigit((unsigned char)s[i + 2])) {
            char hex[3] = { s[i + 1], s[i + 2], 0 };
            *o++ = (char)strtol(hex, NULL, 16);
            i += 2;
        } else {
            *o++ = s[i];
        }
    }
    *o = '\0';
    return out;
}

char *capstan__url_decode(const char *s, size_t n) { return pct_decode(s, n); }

static void tls_conf_clear(capstan_redis_tls_conf_t *t)
{
    free(t->ca_file);
    free(t->ca_path);
    free(t->cert);
    free(t->key);
    free(t->server_name);
}

void capstan__redis_url_clear(capstan_redis_url_t *u)
{
    if (!u)
        return;
    capstan__sentinel_free(u->sentinel);
    free(u->host);
    free(u->path);
    free(u->user);
    free(u->password);
    tls_conf_clear(&u->tls);
    memset(u, 0, sizeof(*u));
}

static int parse_query(const char *q, capstan_redis_url_t *u, int db_in_path, char *err);

static int parse_unix(const char *rest, capstan_redis_url_t *u, char *err, const char *url)
{
    const char *q = strchr(rest, '?');
    size_t plen = q ? (size_t)(q - rest) : strlen(rest);
    if (plen == 0 || rest[0] != '/')
        return capstan_seterr(err, CAPSTAN_EINVAL, "redis url %s: unix socket path must be absolute", url);
    if (!(u->path = strndup(rest, plen)))
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    return q ? parse_query(q + 1, u, 0, err) : 0;
}

int capstan__redis_tls_param(const char *q, size_t n, capstan_redis_tls_conf_t *t, char *err)
{
    static const char *const names[] = { "ca_file", "ca_path", "cert", "key", "server_name" };
    char **fields[] = { &t->ca_file, &t->ca_path, &t->cert, &t->key, &t->server_name };
    const char *eq = memchr(q, '=', n);
    size_t kn = eq ? (size_t)(eq - q) : n;
    const char *v = eq ? eq + 1 : q + n;
    size_t vn = (size_t)(q + n - v);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (kn == strlen(names[i]) && strncmp(q, names[i], kn) == 0) {
            free(*fields[i]);
            if (!(*fields[i] = pct_decode(v, vn)))
                return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            return 0;
        }
    }
    if (kn == 6 && strncmp(q, "verify", 6) == 0) {
        if (vn == 4 && strncmp(v, "none", 4) == 0)
            t->verify_none = 1;
        else if (vn == 4 && strncmp(v, "peer", 4) == 0)
            t->verify_none = 0;
        else
            return capstan_seterr(err, CAPSTAN_EINVAL, "redis url: verify must be peer or none");
        return 0;
    }
    return 1;
}

/* Whether name=value (n bytes at q) is a TLS setting. */
static int is_tls_param(const char *q, size_t n)
{
    capstan_redis_tls_conf_t scratch = { 0 };
    char err[CAPSTAN_ERRLEN];
    int rc = capstan__redis_tls_param(q, n, &scratch, err);
    tls_conf_clear(&scratch);
    return rc != 1;
}

/* The query of a redis://, rediss:// or unix:// URL (q after the '?'),
 * read by one rule for all three: db and password on every URL, the TLS
 * settings (redis-rb's ssl_params names) on rediss:// only, and any other
 * name refused, as sentinel URLs refuse theirs, so that no setting is
 * silently ignored (redis://host:port?db=3 used to push to db 0). A
 * setting the URL gives twice (/N and db=, a password before the '@' and
 * password=) is refused too: neither could be said to win.
 * db_in_path: the URL's path named a database. */
static int parse_query(const char *q, capstan_redis_url_t *u, int db_in_path, char *err)
{
    int password_in_userinfo = u->password != NULL;
    while (q && *q) {
        const char *amp = strchr(q, '&');
        size_t n = amp ? (size_t)(amp - q) : strlen(q);
        const char *eq = memchr(q, '=', n);
        size_t kn = eq ? (size_t)(eq - q) : n;
        const char *v = eq ? eq + 1 : q + n;
        size_t vn = (size_t)(q + n - v);
        int shown = (int)(kn > 40 ? 40 : kn), rc = 0;
        if (n == 0) {
            /* "a&&b", or a URL ending in "?": nothing said */
        } else if (kn == 2 && strncmp(q, "db", 2) == 0) {
            if (db_in_path)
                rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: the database is given twice "
                                    "(in the path and as db=): give one");
            else if (capstan__parse_digits(v, vn, 0, 100000, &u->db))
                rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: bad db number");
        } else if (kn == 8 && strncmp(q, "password", 8) == 0) {
            if (password_in_userinfo)
                rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: the password is given twice "
                                    "(before the @ and as password=): give one");
            else if (vn) {   /* an empty one is no password, as before the '@' */
                free(u->password);
                if (!(u->password = pct_decode(v, vn)))
                    rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            }
        } else if (u->tls.on) {
            rc = capstan__redis_tls_param(q, n, &u->tls, err);
            if (rc == 1)
                rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: unknown parameter %.*s (known: "
                                    "db, password, ca_file, ca_path, cert, key, server_name, "
                                    "verify)", shown, q);
        } else if (is_tls_param(q, n)) {
            rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: %.*s is a TLS setting: it needs a "
                                "rediss:// URL", shown, q);
        } else {
            rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: unknown parameter %.*s (known: db, "
                                "password; and for rediss:// ca_file, ca_path, cert, key, "
                                "server_name, verify)", shown, q);
        }
        if (rc)
            return rc;
        q = amp ? amp + 1 : NULL;
    }
    return 0;
}

int capstan__redis_url_parse(const char *url, capstan_redis_url_t *u, char *err)
{
    memset(u, 0, sizeof(*u));
    u->port = 6379;
    int rc = 0;
    const char *rest;
    if (!url || !*url) {
        rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url is empty");
        goto out;
    }
    if (strncmp(url, "unix://", 7) == 0) {
        rc = parse_unix(url + 7, u, err, "(unix)");
        goto out;
    }
    if (capstan__sentinel_scheme(url)) {
        rc = capstan__sentinel_parse(url, u, err);
        goto out;
    }
    if (strncmp(url, "redis://", 8) == 0) {
        rest = url + 8;
    } else if (strncmp(url, "rediss://", 9) == 0) {
        rest = url + 9;
        u->tls.on = 1;
    } else {
        rc = capstan_seterr(err, CAPSTAN_EINVAL,
                            "redis url must start with redis://, rediss:// or unix:// "
                            "(got a %zu-byte string)",
                            strlen(url));
        goto out;
    }
    const char *at = strrchr(rest, '@');
    const char *slash = strchr(at ? at : rest, '/');
    const char *query = strchr(at ? at : rest, '?');
    if (query && (!slash || query < slash))
        slash = query; /* host:port?ca_file=... with no /db */
    if (at && (!slash || at < slash)) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        if (colon) {
            if (colon > rest)
                u->user = pct_decode(rest, (size_t)(colon - rest));
            u->password = pct_decode(colon + 1, (size_t)(at - colon - 1));
        } else if (at > rest) {
            u->password = pct_decode(rest, (size_t)(at - rest));
        }
        rest = at + 1;
    }
    size_t hostlen = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *hp = rest;
    const char *portsep = NULL;
    if (hp[0] == '[') { /* [ipv6]:port */
        const char *close = memchr(hp, ']', hostlen);
        if (!close) {
            rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: unterminated [ in host");
            goto out;
        }
        u->host = strndup(hp + 1, (size_t)(close - hp - 1));
        if (close + 1 < hp + hostlen && close[1] == ':')
            portsep = close + 1;
    } else {
        portsep = memchr(hp, ':', hostlen);
        size_t hl = portsep ? (size_t)(portsep - hp) : hostlen;
        u->host = hl ? strndup(hp, hl) : strdup("127.0.0.1");
    }
    if (portsep && capstan__parse_digits(portsep + 1, (size_t)(hp + hostlen - portsep - 1), 1, 65535, &u->port)) {
        rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: bad port");
        goto out;
    }
    int db_in_path = 0;
    if (slash && *slash == '/' && slash[1]) {
        const char *q = strchr(slash + 1, '?');
        size_t n = q ? (size_t)(q - slash - 1) : strlen(slash + 1);
        if (n && capstan__parse_digits(slash + 1, n, 0, 100000, &u->db)) {
            rc = capstan_seterr(err, CAPSTAN_EINVAL, "redis url: bad db number");
            goto out;
        }
        db_in_path = n > 0;
    }
    if (!u->host)
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    if (!rc && query)
        rc = parse_query(query + 1, u, db_in_path, err);
out:
    if (rc)
        capstan__redis_url_clear(u);
    return rc;
}

/* Every "password=" value in out (n bytes) becomes "***": a password may
 * come in the query of any URL, with or without user info before it. */
static void redact_query(char *out, size_t n)
{
    static const char key[] = "password=";
    char *copy = n ? strdup(out) : NULL;
    if (!copy) {
        char *pw = n ? strstr(out, key) : NULL;
        if (pw) /* no memory: cut the URL there rather than show it */
            snprintf(pw, n - (size_t)(pw - out), "%s***", key);
        return;
    }
    size_t len = 0;
    const char *p = copy, *pw;
    while ((pw = strstr(p, key)) && len < n) {
        pw += sizeof(key) - 1;
        len += (size_t)snprintf(out + len, n - len, "%.*s***", (int)(pw - p), p);
        p = pw + strcspn(pw, "&");
    }
    if (len < n)
        snprintf(out + len, n - len, "%s", p);
    free(copy);
}

void capstan__redis_url_redact(const char *url, char *out, size_t n)
{
    const char *scheme = strstr(url, "://");
    /* A unix socket has no user info, and its path may hold an '@'. */
    const char *at = scheme && strncmp(url, "unix://", 7) ? strrchr(scheme, '@') : NULL;
    const char *colon = scheme ? strchr(scheme + 3, ':') : NULL;
    if (at && colon && colon < at) {
        snprintf(out, n, "%.*s:***%s", (int)(colon - url), url, at);
    } else if (at) {
        snprintf(out, n, "%.*s***%s", (int)(scheme + 3 - url), url, at);
    } else {
        snprintf(out, n, "%s", url);
    }
    redact_query(out, n);
    capstan__sentinel_redact(out, n);
}
