/* Redis Sentinel: the sentinel URL, and the discovery every connect of a
 * sentinel URL goes through (the master's address asked of each sentinel in
 * turn, then the server checked to be a master), so every connection
 * follows a failover by reconnecting; and the subscription to the
 * sentinels' +switch-master announcements that tells of a failover at
 * once. */
#include "redis/sentinel.h"
#include "redis/nopipe.h"
#include "redis/tls.h"
#include "support/number.h"
#include "support/time.h"

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Short: a dead sentinel must not hold up the next one for long. */
#define SENTINEL_TIMEOUT_US 500000
/* Learnt peers stop being added there: a list that long is a mistake
 * somewhere, and each dead entry costs a failover up to the timeout. */
#define MAX_SENTINELS 16

typedef struct addr {
    char *host;
    int port;
} addr_t;

struct capstan_sentinel {
    addr_t *sentinels;
    size_t n;
    char *master;    /* the name the sentinels monitor it by */
    char *user;      /* the sentinels' own ACL user and password, or NULL */
    char *password;
    int tls;         /* sentinel_ssl=true: TLS to the sentinels too */
};

/* redisCommand, whose write to a sentinel or server that closed the
 * connection fails with EPIPE, never killing the program (nopipe.h). */
static redisReply *command(redisContext *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static redisReply *command(redisContext *c, const char *fmt, ...)
{
    capstan_nopipe_t np;
    capstan__nopipe_begin(&np);
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    capstan__nopipe_end(&np, rep == NULL);
    return rep;
}

int capstan__sentinel_scheme(const char *url)
{
    return url && (strncmp(url, "redis+sentinel://", 17) == 0
                   || strncmp(url, "rediss+sentinel://", 18) == 0);
}

void capstan__sentinel_free(capstan_sentinel_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->sentinels[i].host);
    free(s->sentinels);
    free(s->master);
    free(s->user);
    free(s->password);
    free(s);
}

/* Adds host:port to the list unless it is there. */
static int add_addr(capstan_sentinel_t *s, const char *host, size_t hl, int port)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->sentinels[i].port == port && strlen(s->sentinels[i].host) == hl
            && strncmp(s->sentinels[i].host, host, hl) == 0)
            return 0;
    addr_t *a = realloc(s->sentinels, (s->n + 1) * sizeof(*a));
    if (!a)
        return CAPSTAN_ENOMEM;
    s->sentinels = a;
    if (!(a[s->n].host = strndup(host, hl)))
        return CAPSTAN_ENOMEM;
    a[s->n++].port = port;
    return 0;
}

/* One "host[:port]" or "[v6][:port]" of the list; the port defaults to
 * Sentinel's own, 26379. */
static int add_sentinel(capstan_sentinel_t *s, const char *p, size_t n)
{
    const char *hp = p, *colon = NULL;
    size_t hl = n;
    if (n && p[0] == '[') {
        const char *close = memchr(p, ']', n);
        if (!close)
            return CAPSTAN_EINVAL;
        hp = p + 1;
        hl = (size_t)(close - hp);
        if (close + 1 < p + n)
            colon = close[1] == ':' ? close + 1 : NULL;
        if (close + 1 < p + n && !colon)
            return CAPSTAN_EINVAL;
    } else if ((colon = memchr(p, ':', n)) != NULL) {
        hl = (size_t)(colon - p);
    }
    int port = 26379;
    if (hl == 0 || (colon && capstan__parse_digits(colon + 1, (size_t)(p + n - colon - 1), 1, 65535, &port)))
        return CAPSTAN_EINVAL;
    return add_addr(s, hp, hl, port);
}

/* The sentinels a sentinel names as its peers: each one the list does not
 * hold yet is added at its end, so that a sentinel started after capstan was
 * configured is asked when the configured ones are down. Errors (an old
 * sentinel, ACL) leave the list as it is. */
static void learn_peers(capstan_sentinel_t *s, redisContext *c)
{
    redisReply *rep = command(c, "SENTINEL SENTINELS %s", s->master);
    for (size_t i = 0; rep && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        const char *ip = NULL;
        int port = 0;
        for (size_t j = 0; e->type == REDIS_REPLY_ARRAY && j + 1 < e->elements; j += 2) {
            const redisReply *k = e->element[j], *v = e->element[j + 1];
            if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
                continue;
            if (strcmp(k->str, "ip") == 0)
                ip = v->str;
            else if (strcmp(k->str, "port") == 0 && capstan__parse_digits(v->str, v->len, 1, 65535, &port))
                port = 0;
        }
        if (ip && *ip && port && s->n < MAX_SENTINELS)
            add_addr(s, ip, strlen(ip), port);
    }
    freeReplyObject(rep);
}

/* The query: the sentinels' credentials, sentinel_ssl, and the TLS
 * settings of a rediss:// URL (for the master, and for the sentinels
 * with sentinel_ssl=true). */
static int query(const char *q, capstan_redis_url_t *u, char *err)
{
    capstan_sentinel_t *s = u->sentinel;
    while (q && *q) {
        q++;
        const char *amp = strchr(q, '&');
        size_t n = amp ? (size_t)(amp - q) : strlen(q);
        char **slot = NULL;
        size_t k = 0;
        if (n >= 18 && strncmp(q, "sentinel_password=", 18) == 0)
            slot = &s->password, k = 18;
        else if (n >= 18 && strncmp(q, "sentinel_username=", 18) == 0)
            slot = &s->user, k = 18;
        if (slot) {
            free(*slot);
            if (!(*slot = capstan__url_decode(q + k, n - k)))
                return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        } else if (n >= 13 && strncmp(q, "sentinel_ssl=", 13) == 0) {
            if (n == 17 && strncmp(q + 13, "true", 4) == 0)
                s->tls = 1;
            else if (n == 18 && strncmp(q + 13, "false", 5) == 0)
                s->tls = 0;
            else
                return capstan_seterr(err, CAPSTAN_EINVAL, "redis sentinel url: sentinel_ssl must be "
                                      "true or false");
        } else if (n) {
            int rc = capstan__redis_tls_param(q, n, &u->tls, err);
            if (rc == 1)
                return capstan_seterr(err, CAPSTAN_EINVAL, "redis sentinel url: unknown parameter "
                                      "%.*s (known: sentinel_username, sentinel_password, "
                                      "sentinel_ssl, ca_file, ca_path, cert, key, server_name, "
                                      "verify)", (int)(n > 40 ? 40 : n), q);
            if (rc)
                return rc;
        }
        q = amp;
    }
    return 0;
}

int capstan__sentinel_parse(const char *url, capstan_redis_url_t *u, char *err)
{
    capstan_sentinel_t *s = calloc(1, sizeof(*s));
    if (!s)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    u->sentinel = s;
    u->tls.on = url[5] == 's';
    const char *rest = strstr(url, "://") + 3;
    const char *slash = strchr(rest, '/');
    const char *at = memchr(rest, '@', slash ? (size_t)(slash - rest) : strlen(rest));
    /* One '@', ending the user info: any other would read differently
     * here and where the URL is redacted for logs. */
    if (strchr(rest, '@') != strrchr(rest, '@') || (!at && strchr(rest, '@')))
        return capstan_seterr(err, CAPSTAN_EINVAL, "redis sentinel url: an '@' other than the one "
                              "after the password (percent-escape an '@' as %%40)");
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        if (colon && colon > rest && !(u->user = capstan__url_decode(rest, (size_t)(colon - rest))))
            return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        const char *pw = colon ? colon + 1 : rest;
        if (at > pw && !(u->password = capstan__url_decode(pw, (size_t)(at - pw))))
            return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        rest = at + 1;
    }
    if (!slash || !slash[1] || slash[1] == '?' || slash[1] == '/')
        return capstan_seterr(err, CAPSTAN_EINVAL, "redis sentinel url: the master's name is missing "
                              "(redis+sentinel://host:port[,host:port...]/MASTER_NAME[/DB])");
    for (const char *p = rest; p < slash;) {
        const char *comma = memchr(p, ',', (size_t)(slash - p));
        const char *end = comma ? comma : slash;
        int rc = add_sentinel(s, p, (size_t)(end - p));
        if (rc)
            return capstan_seterr(err, rc, rc == CAPSTAN_ENOMEM ? "out of memory"
                                  : "redis sentinel url: bad sentinel address (want host:port)");
        p = end + (comma != NULL);
    }
    if (s->n == 0)
        return capstan_seterr(err, CAPSTAN_EINVAL, "redis sentinel url: no sentinel given");
    const char *name = slash + 1, *q = strchr(name, '?');
    size_t nlen = q ? (size_t)(q - name) : strlen(name);
    const char *dbs = memchr(name, '/', nlen);
    if (dbs) {
        size_t dl = (size_t)(name + nlen - dbs - 1);
        int db = 0;
        for (size_t i = 0; i < dl; i++) {
            /* The bound redis:// URLs have, checked after each digit. */
            if (!isdigit((unsigned char)dbs[1 + i])
                || (db = db * 10 + (dbs[1 + i] - '0')) > 100000)
                return capstan_seterr(err, CAPSTAN_EINVAL, "redis sentinel url: bad db number");
        }
        u->db = db;
        nlen = (size_t)(dbs - name);
    }
    if (!(s->master = capstan__url_decode(name, nlen)))
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    return query(q, u, err);
}

/* A connection to one sentinel, and its TLS session when sentinel_ssl. */
typedef struct link {
    redisContext *c;
    capstan_tls_t *tls;
} link_t;

static void link_close(link_t *l)
{
    redisFree(l->c);   /* closes hiredis's end, which ends the TLS thread */
    capstan__tls_free(l->tls);
}

/* Connects to one sentinel (TLS with the URL's settings, verified by the
 * sentinel's own address, when sentinel_ssl) and authenticates. Returns 0,
 * or -1 with errstr filled and l closed. */
static int sentinel_connect(const capstan_redis_url_t *u, const addr_t *a, const char *name,
                            char *errstr, int *refused, link_t *l)
{
    const capstan_sentinel_t *s = u->sentinel;
    struct timeval tv = { 0, SENTINEL_TIMEOUT_US };
    *l = (link_t){ 0 };
    if (s->tls) {
        capstan_redis_url_t su = { .host = a->host, .port = a->port, .tls = u->tls };
        su.tls.server_name = NULL;
        char why[CAPSTAN_ERRLEN];
        int fd = -1;
        int rc = capstan__tls_connect(&su, SENTINEL_TIMEOUT_US / 1e6, &l->tls, &fd, why);
        if (rc) {
            snprintf(errstr, CAPSTAN_ERRLEN, "%s: sentinel %s:%d: %s", name, a->host, a->port, why);
            *refused = rc == CAPSTAN_ECONFIG;
            return -1;
        }
        if (!(l->c = redisConnectFd(fd)))
            close(fd);
    } else {
        l->c = redisConnectWithTimeout(a->host, a->port, tv);
    }
    if (!l->c || l->c->err) {
        snprintf(errstr, CAPSTAN_ERRLEN, "%s: sentinel %s:%d: %s", name, a->host, a->port,
                 l->c ? l->c->errstr : "out of memory");
        link_close(l);
        return -1;
    }
    redisSetTimeout(l->c, tv);
    if (!s->password)
        return 0;
    redisReply *rep = s->user ? command(l->c, "AUTH %s %s", s->user, s->password)
                              : command(l->c, "AUTH %s", s->password);
    int bad = !rep || rep->type == REDIS_REPLY_ERROR;
    if (bad) {
        snprintf(errstr, CAPSTAN_ERRLEN, "%s: sentinel %s:%d: AUTH: %s", name, a->host, a->port,
                 rep ? rep->str : l->c->errstr);
        *refused = rep != NULL;
        link_close(l);
    }
    freeReplyObject(rep);
    return bad ? -1 : 0;
}

int capstan__sentinel_resolve(capstan_redis_url_t *u, const char *name, char *errstr)
{
    capstan_sentinel_t *s = u->sentinel;
    size_t answered = 0, unknown = 0, refused = 0;
    for (size_t i = 0; i < s->n; i++) {
        const addr_t *a = &s->sentinels[i];
        int no = 0;
        link_t l;
        int failed = sentinel_connect(u, a, name, errstr, &no, &l);
        refused += (size_t)no;
        if (failed)
            continue;
        redisContext *c = l.c;
        redisReply *rep = command(c, "SENTINEL get-master-addr-by-name %s", s->master);
        if (!rep) {
            snprintf(errstr, CAPSTAN_ERRLEN, "%s: sentinel %s:%d: %s", name, a->host, a->port,
                     c->errstr);
        } else if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2
                   && rep->element[0]->type == REDIS_REPLY_STRING
                   && rep->element[1]->type == REDIS_REPLY_STRING) {
            int port = atoi(rep->element[1]->str);
            char *host = strdup(rep->element[0]->str);
            if (host && port > 0) {
                free(u->host);
                u->host = host;
                u->port = port;
                freeReplyObject(rep);
                learn_peers(s, c);
                link_close(&l);
                return 0;
            }
            free(host);
        } else {
            answered++;
            if (rep->type == REDIS_REPLY_NIL || (rep->type == REDIS_REPLY_ARRAY && !rep->elements))
                unknown++;
            snprintf(errstr, CAPSTAN_ERRLEN, "%s: sentinel %s:%d knows no master named %s%s%s", name,
                     a->host, a->port, s->master, rep->type == REDIS_REPLY_ERROR ? ": " : "",
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "");
        }
        freeReplyObject(rep);
        link_close(&l);
    }
    /* Every sentinel that answered knows no such master, or every one
     * refused the credentials: waiting will not help. */
    if ((answered && unknown == answered) || refused == s->n)
        return CAPSTAN_ECONFIG;
    return CAPSTAN_EREDIS;
}

int capstan__sentinel_check_role(redisContext *c, const char *name, char *errstr)
{
    redisReply *rep = command(c, "ROLE");
    if (!rep) {
        snprintf(errstr, CAPSTAN_ERRLEN, "%s: ROLE: %s", name, c->errstr);
        return CAPSTAN_EREDIS;
    }
    int replica = rep->type == REDIS_REPLY_ARRAY && rep->elements > 0
                  && rep->element[0]->type == REDIS_REPLY_STRING
                  && strcmp(rep->element[0]->str, "master") != 0;
    if (replica)
        snprintf(errstr, CAPSTAN_ERRLEN, "%s: the server is a %s, not a master (a failover "
                 "under way?)", name, rep->element[0]->str);
    freeReplyObject(rep);
    return replica ? CAPSTAN_EREDIS : 0;
}

struct capstan_sentinel_watch {
    capstan_redis_url_t url; /* its own sentinels (peers learnt too) and master */
    char name[512];          /* the URL with its passwords redacted */
    link_t link;             /* the subscribed sentinel; link.c NULL when none */
    size_t at;               /* its index, or where the next attempt starts */
    int missed;              /* unsubscribed for a while: an announcement may
                                have gone by */
};

capstan_sentinel_watch_t *capstan__sentinel_watch_new(const char *url, char *err)
{
    if (!capstan__sentinel_scheme(url)) {
        capstan_seterr(err, CAPSTAN_EINVAL, "not a sentinel url");
        return NULL;
    }
    capstan_sentinel_watch_t *w = calloc(1, sizeof(*w));
    if (!w) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    if (capstan__redis_url_parse(url, &w->url, err)) {
        capstan__redis_url_clear(&w->url);
        free(w);
        return NULL;
    }
    capstan__redis_url_redact(url, w->name, sizeof(w->name));
    return w;
}

void capstan__sentinel_watch_free(capstan_sentinel_watch_t *w)
{
    if (!w)
        return;
    link_close(&w->link);
    capstan__redis_url_clear(&w->url);
    free(w);
}

/* Subscribes to +switch-master on the first sentinel that takes it,
 * starting at w->at. Returns 0, or CAPSTAN_EREDIS with errstr filled. */
static int subscribe(capstan_sentinel_watch_t *w, char *errstr)
{
    capstan_sentinel_t *s = w->url.sentinel;
    for (size_t k = 0; k < s->n; k++) {
        size_t i = (w->at + k) % s->n;
        int refused = 0;
        if (sentinel_connect(&w->url, &s->sentinels[i], w->name, errstr, &refused, &w->link)) {
            w->link = (link_t){ 0 }; /* closed, not cleared */
            continue;
        }
        learn_peers(s, w->link.c); /* may move s->sentinels: indexed from here on */
        redisReply *rep = command(w->link.c, "SUBSCRIBE +switch-master");
        int ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 3
                 && rep->element[0]->type == REDIS_REPLY_STRING
                 && strcmp(rep->element[0]->str, "subscribe") == 0;
        if (!ok)
            snprintf(errstr, CAPSTAN_ERRLEN, "%s: sentinel %s:%d: SUBSCRIBE: %s", w->name,
                     s->sentinels[i].host, s->sentinels[i].port,
                     !rep ? w->link.c->errstr
                     : rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        freeReplyObject(rep);
        if (ok) {
            w->at = i;
            return 0;
        }
        link_close(&w->link);
        w->link = (link_t){ 0 };
    }
    return CAPSTAN_EREDIS;
}

/* Whether rep is "<master> <old-ip> <old-port> <new-ip> <new-port>" on
 * +switch-master for w's master. */
static int is_switch(const capstan_sentinel_watch_t *w, const redisReply *rep)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3)
        return 0;
    const redisReply *kind = rep->element[0], *msg = rep->element[2];
    if (kind->type != REDIS_REPLY_STRING || strcmp(kind->str, "message") != 0
        || msg->type != REDIS_REPLY_STRING)
        return 0;
    size_t n = strlen(w->url.sentinel->master);
    return msg->len > n && strncmp(msg->str, w->url.sentinel->master, n) == 0 && msg->str[n] == ' ';
}

/* Reads what the subscribed sentinel sent within timeout_s: 1 for an
 * announcement about w's master, 0 for none, -1 when the connection
 * failed (errstr filled). */
static int read_announcements(capstan_sentinel_watch_t *w, double timeout_s, char *errstr)
{
    redisContext *c = w->link.c;
    double until = capstan__mono() + timeout_s;
    for (;;) {
        void *rep = NULL;
        if (redisGetReplyFromReader(c, &rep) != REDIS_OK)
            break;
        if (rep) {
            int hit = is_switch(w, rep);
            freeReplyObject(rep);
            if (hit)
                return 1;
            continue;
        }
        double left = until - capstan__mono();
        if (left <= 0)
            return 0;
        /* poll, not a read timeout: one leaves a hiredis 0.14 context
         * unusable. */
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(c->errstr, sizeof(c->errstr), "poll: %s", strerror(errno));
            break;
        }
        if (n > 0 && redisBufferRead(c) != REDIS_OK)
            break;
    }
    const addr_t *a = &w->url.sentinel->sentinels[w->at];
    snprintf(errstr, CAPSTAN_ERRLEN, "%s: sentinel %s:%d: subscription lost: %s", w->name, a->host,
             a->port, c->errstr[0] ? c->errstr : "protocol error");
    return -1;
}

int capstan__sentinel_watch_wait(capstan_sentinel_watch_t *w, double timeout_s, char *errstr)
{
    if (!w->link.c) {
        if (subscribe(w, errstr)) {
            w->missed = 1;
            return CAPSTAN_EREDIS;
        }
        if (w->missed) {
            w->missed = 0;
            return 1;
        }
    }
    int got = read_announcements(w, timeout_s, errstr);
    if (got >= 0)
        return got;
    link_close(&w->link);
    w->link = (link_t){ 0 };
    /* That sentinel went away, most likely: the others first. */
    w->at = (w->at + 1) % w->url.sentinel->n;
    if (subscribe(w, errstr)) {
        w->missed = 1;
        return CAPSTAN_EREDIS;
    }
    return 1;
}

void capstan__sentinel_redact(char *out, size_t n)
{
    char *pw = strstr(out, "sentinel_password=");
    if (!pw)
        return;
    pw += 18;
    char *amp = strchr(pw, '&');
    char tail[512];
    snprintf(tail, sizeof(tail), "%s", amp ? amp : "");
    snprintf(pw, n - (size_t)(pw - out), "***%s", tail);
}
