/* Internal: redis://, rediss://, unix:// and sentinel URLs, parsed and
 * redacted. */
#ifndef CAPSTAN_REDIS_URL_H
#define CAPSTAN_REDIS_URL_H

#include <stddef.h>

#include "capstan/error.h"

/* TLS settings of a rediss:// URL, from its query (?ca_file=...&cert=...),
 * named after redis-rb's ssl_params. */
typedef struct capstan_redis_tls_conf {
    int on;            /* rediss:// */
    char *ca_file;     /* CA certificates (PEM); default: the system's, or $SSL_CERT_FILE */
    char *ca_path;     /* directory of hashed CA certificates, or $SSL_CERT_DIR */
    char *cert;        /* client certificate (PEM) for mutual TLS */
    char *key;         /* its private key (PEM, not encrypted) */
    char *server_name; /* SNI and the name verified; default the host */
    int verify_none;   /* verify=none: no certificate checks (warned at start) */
} capstan_redis_tls_conf_t;

/* A parsed redis://, rediss:// or unix:// URL. */
typedef struct capstan_redis_url {
    char *host;      /* NULL for unix sockets */
    int port;
    char *path;      /* unix socket path, or NULL */
    char *user;      /* ACL user, or NULL */
    char *password;  /* or NULL */
    int db;
    capstan_redis_tls_conf_t tls;
    struct capstan_sentinel *sentinel; /* a sentinel URL's sentinels and master name, or NULL */
} capstan_redis_url_t;

/* Parses "redis[s]://[user:password@]host[:port][/db][?query]" or
 * "unix:///path[?query]" (percent-escapes in user and password are
 * decoded). Every query takes db=N and password=P, a rediss:// one the
 * TLS settings too; any other name, a TLS setting without rediss://, or a
 * database or password given twice is refused. A redis+sentinel:// or
 * rediss+sentinel:// URL is parsed as capstan__sentinel_parse says
 * (redis/sentinel.h). Returns 0 or CAPSTAN_EINVAL
 * (CAPSTAN_ENOMEM) with err filled; free the strings with
 * capstan__redis_url_clear. */
int capstan__redis_url_parse(const char *url, capstan_redis_url_t *out, char *err);
void capstan__redis_url_clear(capstan_redis_url_t *u);
/* Applies one name=value (n bytes at q) of a TLS query to t: 0 when used,
 * 1 when name is no TLS setting, else CAPSTAN_EINVAL or CAPSTAN_ENOMEM with err
 * filled. */
int capstan__redis_tls_param(const char *q, size_t n, capstan_redis_tls_conf_t *t, char *err);
/* Percent-decodes n bytes of s into a new string (NULL when out of memory). */
char *capstan__url_decode(const char *s, size_t n);
/* Writes url with any password replaced by "***" into out (n bytes). */
void capstan__redis_url_redact(const char *url, char *out, size_t n);

#endif
