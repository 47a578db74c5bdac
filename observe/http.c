/* GET /metrics in the Prometheus text format 0.0.4, served by one thread
 * of our own: a poll() loop over HTTP/1.x connections, each answered once
 * and closed. Every connection has a deadline (REQUEST_SECONDS to send its
 * request, then SEND_SECONDS to take the answer), so clients that trickle
 * their headers are cut off however busy they look, and at MAX_CONNS the
 * oldest connection makes room for the new one.
 *
 * Queue sizes and latencies are read from Redis at scrape time (not cached
 * by the housekeeper) so a scrape shows the queues as they are, at the cost
 * of a few pipelined round trips on the server's own connection (one per
 * shard with shards), each bounded by CAPSTAN_HTTP_REDIS_TIMEOUT. */
#include "observe/http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/log.h"
#include "observe/prometheus.h"
#include "redis/keys.h"
#include "observe/overview.h"
#include "support/time.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define MAX_CONNS 256
#define MAX_REQUEST 8192       /* request line and headers */
#define REQUEST_SECONDS 5.0    /* from accept to the end of the headers */
#define SEND_SECONDS 5.0       /* to take the whole answer */

typedef struct conn {
    int fd;
    double deadline;           /* capstan__mono() */
    char *out;                 /* the answer, once the request is in */
    size_t olen, sent, got;
    char req[MAX_REQUEST];
} conn_t;

struct capstan_http {
    capstan_http_conf_t conf;
    capstan_redis_t **rs;      /* each shard's Redis (rs[0] alone without
                                  shards), used only by the server's thread */
    size_t nrs;
    unsigned char *warned;     /* an unreachable Redis is logged once per outage */
    int lfd, wake[2];          /* listening socket; a byte on wake stops the thread */
    double accept_after;       /* capstan__mono(): out of descriptors until then */
    pthread_t thread;
    int started;
    conn_t *conns[MAX_CONNS];
    size_t n;
};

static int gauge(capstan_buf_t *b, const char *name, const char *help)
{
    return capstan__buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

/* What one Redis answered at a scrape: the shard's (its escaped name, NULL
 * without shards). */
typedef struct redis_view {
    const char *shard;
    int up;
    double rtt;
    capstan_overview_t ov;
    long long open;        /* batches open, -1: not read */
} redis_view_t;

/* Starts a sample: name, with {shard="s"} or {shard="s", before more
 * labels (open), or nothing or { without a shard. */
static int head(capstan_buf_t *b, const char *name, const char *shard, int open)
{
    if (shard)
        return capstan__buf_printf(b, "%s{shard=\"%s\"%s", name, shard, open ? "," : "}");
    return capstan__buf_printf(b, "%s%s", name, open ? "{" : "");
}

/* A gauge without labels of its own: get's figure of each view that is up. */
static int view_gauge(capstan_buf_t *b, const redis_view_t *v, size_t n, const char *name,
                      const char *help, long long (*get)(const redis_view_t *))
{
    int rc = gauge(b, name, help);
    for (size_t i = 0; i < n && !rc; i++) {
        if (!v[i].up)
            continue;
        rc = head(b, name, v[i].shard, 0);
        if (!rc) rc = capstan__buf_printf(b, " %lld\n", get(&v[i]));
    }
    return rc;
}
static long long scheduled(const redis_view_t *v) { return v->ov.scheduled; }
static long long retries(const redis_view_t *v) { return v->ov.retries; }
static long long dead(const redis_view_t *v) { return v->ov.dead; }

/* One of the per-queue gauges: what = 0 size, 1 latency, 2 paused. */
static int queue_gauge(capstan_buf_t *b, const redis_view_t *v, size_t n, int what)
{
    static const struct { const char *name, *help; } fam[] = {
        { "capstan_queue_size", "Jobs waiting in each queue." },
        { "capstan_queue_latency_seconds", "Age of the oldest job in each queue (0 when empty)." },
        { "capstan_queue_paused", "1 for a queue in Sidekiq Pro's paused set (not fetched), else 0." },
    };
    int rc = gauge(b, fam[what].name, fam[what].help);
    for (size_t k = 0; k < n && !rc; k++) {
        const capstan_overview_t *ov = &v[k].ov;
        for (size_t i = 0; v[k].up && i < ov->nqueues && !rc; i++) {
            rc = head(b, fam[what].name, v[k].shard, 1);
            if (!rc) rc = capstan__buf_puts(b, "queue=\"");
            if (!rc) rc = capstan__metrics_escape(b, ov->queues[i].name);
            if (!rc)
                rc = what == 0 ? capstan__buf_printf(b, "\"} %lld\n", ov->queues[i].size)
                   : what == 1 ? capstan__buf_printf(b, "\"} %.6f\n", ov->queues[i].latency)
                               : capstan__buf_printf(b, "\"} %d\n", ov->queues[i].paused);
        }
    }
    return rc;
}

/* Reads v from r (connected when it is not). */
static void read_view(capstan_redis_t *r, redis_view_t *v)
{
    char err[CAPSTAN_ERRLEN] = "";
    v->rtt = -1;
    v->open = -1;
    v->up = capstan_redis_ok(r) || capstan_redis_connect(r) == 0;
    if (v->up) {
        double t0 = capstan__mono();
        redisReply *pong = capstan_redis_cmdf(r, "PING");
        v->rtt = capstan__mono() - t0;
        v->up = pong != NULL;
        freeReplyObject(pong);
    }
    if (v->up && capstan__overview_read(r, 0, &v->ov, err))
        v->up = 0;
    redisReply *open = v->up ? capstan_redis_cmdf(r, "ZCARD " CAPSTAN_KEY_BATCHES_OPEN) : NULL;
    if (open && open->type == REDIS_REPLY_INTEGER)
        v->open = open->integer;
    freeReplyObject(open);
}

/* The Redis series of every view: each family once, a line per view. */
static int redis_series(capstan_buf_t *b, const redis_view_t *v, size_t n)
{
    int rc = gauge(b, "capstan_redis_up", "1 when this scrape could read Redis; the Redis series "
                                          "are left out when it is 0.");
    int any = 0, open = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        any |= v[i].up;
        open |= v[i].open >= 0;
        rc = head(b, "capstan_redis_up", v[i].shard, 0);
        if (!rc) rc = capstan__buf_printf(b, " %d\n", v[i].up);
    }
    if (any) {
        if (!rc) rc = gauge(b, "capstan_redis_rtt_seconds", "Round trip of a PING at this scrape.");
        for (size_t i = 0; i < n && !rc; i++) {
            if (!v[i].up)
                continue;
            rc = head(b, "capstan_redis_rtt_seconds", v[i].shard, 0);
            if (!rc) rc = capstan__buf_printf(b, " %.6f\n", v[i].rtt);
        }
        for (int q = 0; q < 3 && !rc; q++)
            rc = queue_gauge(b, v, n, q);
        if (!rc) rc = view_gauge(b, v, n, "capstan_schedule_size", "Jobs in the schedule set.", scheduled);
        if (!rc) rc = view_gauge(b, v, n, "capstan_retry_size", "Jobs in the retry set.", retries);
        if (!rc) rc = view_gauge(b, v, n, "capstan_dead_size", "Jobs in the dead set.", dead);
    }
    if (!rc && open)
        rc = gauge(b, "capstan_batches_open", "Batches stored that have not succeeded yet.");
    for (size_t i = 0; i < n && open && !rc; i++) {
        if (v[i].open < 0)
            continue;
        rc = head(b, "capstan_batches_open", v[i].shard, 0);
        if (!rc) rc = capstan__buf_printf(b, " %lld\n", v[i].open);
    }
    return rc;
}

/* Jobs this process fetched ahead and has not started, by shard and
 * queue: in its working list, so out of the queue's size and latency. */
static int prefetched_gauge(const capstan_http_conf_t *conf, capstan_buf_t *b)
{
    if (!conf->prefetched || !conf->nqueues)
        return 0;
    long long *counts = calloc(conf->nqueues, sizeof(*counts));
    if (!counts)
        return CAPSTAN_ENOMEM;
    int rc = gauge(b, "capstan_prefetched_jobs",
                   "Jobs this process fetched ahead and holds waiting for a processor, by queue: in "
                   "its working list, not in the queue's size and latency.");
    size_t n = capstan__http_shards(conf);
    for (size_t k = 0; k < (n ? n : 1) && !rc; k++) {
        const char *shard = NULL, *url;
        if (n)
            conf->shard_metrics(conf->ud, k, &shard, &url);
        memset(counts, 0, conf->nqueues * sizeof(*counts));
        conf->prefetched(conf->ud, k, conf->queues, conf->nqueues, counts);
        for (size_t i = 0; i < conf->nqueues && !rc; i++) {
            rc = capstan__buf_puts(b, "capstan_prefetched_jobs{");
            if (!rc && shard) rc = capstan__buf_puts(b, "shard=\"");
            if (!rc && shard) rc = capstan__metrics_escape(b, shard);
            if (!rc && shard) rc = capstan__buf_puts(b, "\",");
            if (!rc) rc = capstan__buf_puts(b, "queue=\"");
            if (!rc) rc = capstan__metrics_escape(b, conf->queues[i]);
            if (!rc) rc = capstan__buf_printf(b, "\"} %lld\n", counts[i]);
        }
    }
    free(counts);
    return rc;
}

/* The process's counters, with each shard's series (conf->shard_metrics). */
static int render_metrics(const capstan_http_conf_t *conf, capstan_buf_t *b)
{
    size_t n = capstan__http_shards(conf);
    const char *url;
    capstan_metrics_t **regs = n ? calloc(n, sizeof(*regs)) : NULL;
    const char **names = n ? calloc(n, sizeof(*names)) : NULL;
    int rc = n && (!regs || !names) ? CAPSTAN_ENOMEM : 0;
    for (size_t i = 0; i < n && !rc; i++)
        regs[i] = conf->shard_metrics(conf->ud, i, &names[i], &url);
    if (!rc)
        rc = capstan__metrics_render_shards(capstan__metrics_default(), regs, names, n, b);
    free(regs);
    free(names);
    return rc;
}

int capstan__http_scrape(const capstan_http_conf_t *conf, capstan_redis_t *const *rs, capstan_buf_t *b)
{
    int rc = render_metrics(conf, b);
    int busy = conf->busy_threads ? conf->busy_threads(conf->ud) : 0;
    if (!rc) rc = gauge(b, "capstan_busy_threads", "Processor threads running a job.");
    if (!rc) rc = capstan__buf_printf(b, "capstan_busy_threads %d\n", busy);
    if (!rc) rc = gauge(b, "capstan_threads", "Processor threads (concurrency).");
    if (!rc) rc = capstan__buf_printf(b, "capstan_threads %d\n", conf->threads);
    if (!rc) rc = prefetched_gauge(conf, b);
    if (rc)
        return rc;
    size_t n = capstan__http_shards(conf);
    redis_view_t *v = calloc(n ? n : 1, sizeof(*v));
    char **names = n ? calloc(n, sizeof(*names)) : NULL;
    rc = !v || (n && !names) ? CAPSTAN_ENOMEM : 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *name = NULL, *url = NULL;
        capstan_buf_t e = { 0 };
        conf->shard_metrics(conf->ud, i, &name, &url);
        rc = capstan__metrics_escape(&e, name);
        if (!rc && !(v[i].shard = names[i] = capstan__buf_take(&e, NULL)))
            rc = CAPSTAN_ENOMEM;
        capstan__buf_free(&e);
    }
    for (size_t i = 0; i < (n ? n : 1) && !rc; i++)
        read_view(rs[i], &v[i]);
    if (!rc)
        rc = redis_series(b, v, n ? n : 1);
    for (size_t i = 0; v && i < (n ? n : 1); i++)
        capstan__overview_clear(&v[i].ov);
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
    free(v);
    return rc;
}

size_t capstan__http_shards(const capstan_http_conf_t *conf)
{
    size_t n = 0;
    const char *name, *url;
    while (conf->shard_metrics && conf->shard_metrics(conf->ud, n, &name, &url))
        n++;
    return n;
}

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}

/* Sets c's answer: status, the body (owned by the caller) and, for HEAD,
 * only the headers. Without memory the connection is just closed. */
static void answer(conn_t *c, int status, const char *body, size_t blen, int head)
{
    capstan_buf_t b = {0};
    int rc = capstan__buf_printf(&b, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s"
                                 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                                 status, reason(status),
                                 status == 200 ? CONTENT_TYPE : "text/plain; charset=utf-8",
                                 status == 405 ? "Allow: GET, HEAD\r\n" : "", blen);
    if (!rc && !head)
        rc = capstan__buf_put(&b, body, blen);
    if (rc) {
        capstan__buf_free(&b);
        c->deadline = 0; /* closed at the next turn */
        return;
    }
    c->out = capstan__buf_take(&b, &c->olen);
    c->deadline = capstan__mono() + SEND_SECONDS;
}

static void plain(conn_t *c, int status, const char *text)
{
    answer(c, status, text, strlen(text), 0);
}

/* 1 when a header of the request (after its first line) announces a body. */
static int has_body(const char *req)
{
    for (const char *l = strchr(req, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        l++;
        if (!strncasecmp(l, "Transfer-Encoding:", 18))
            return 1;
        if (!strncasecmp(l, "Content-Length:", 15) && strtoul(l + 15, NULL, 10) > 0)
            return 1;
    }
    return 0;
}

static void respond(capstan_http_t *h, conn_t *c)
{
    char method[16], target[1024], minor[2];
    if (sscanf(c->req, "%15[A-Z] %1023[^ \r\n] HTTP/1.%1[0-9]", method, target, minor) != 3)
        return plain(c, 400, "not an HTTP/1.x request\n");
    if (has_body(c->req))
        return plain(c, 400, "no request body expected\n");
    int head = !strcmp(method, "HEAD");
    if (strcmp(method, "GET") != 0 && !head)
        return plain(c, 405, "only GET\n");
    target[strcspn(target, "?")] = '\0';
    int ready = !strcmp(target, "/readyz");
    if (h->conf.probe && (ready || !strcmp(target, "/livez"))) {
        char why[CAPSTAN_ERRLEN + 2];
        if (h->conf.probe(h->conf.ud, ready, why, sizeof(why) - 1))
            return answer(c, 200, "ok\n", 3, head);
        strcat(why, "\n");
        return answer(c, 503, why, strlen(why), head);
    }
    if (strcmp(target, "/metrics") != 0)
        return plain(c, 404, "not found: try /metrics\n");
    capstan_buf_t b = {0};
    int rc = capstan__http_scrape(&h->conf, h->rs, &b);
    for (size_t i = 0; i < h->nrs; i++) {
        int up = capstan_redis_ok(h->rs[i]);
        if (!up && !h->warned[i])
            capstan_warn("metrics: %s; serving /metrics without its Redis series",
                         capstan_redis_error(h->rs[i]));
        h->warned[i] = !up;
    }
    if (rc)
        plain(c, 500, "out of memory\n");
    else
        answer(c, 200, b.p ? b.p : "", b.len, head);
    capstan__buf_free(&b);
}

static void drop(capstan_http_t *h, size_t i)
{
    conn_t *c = h->conns[i];
    close(c->fd);
    free(c->out);
    free(c);
    h->conns[i] = h->conns[--h->n];
}

/* Reads what c sent or sends what it is owed; 0 when it is done with. */
static int step(capstan_http_t *h, conn_t *c)
{
    ssize_t n;
    if (c->out && c->sent < c->olen) {
        n = send(c->fd, c->out + c->sent, c->olen - c->sent, MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR;
        c->sent += (size_t)n;
        if (c->sent == c->olen)
            shutdown(c->fd, SHUT_WR);
        return 1;
    }
    if (c->out) {
        /* Answered: wait for the client's close (or the deadline), as
         * closing with unread input would reset the answer away. */
        char sink[512];
        n = recv(c->fd, sink, sizeof(sink), 0);
        return n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR));
    }
    n = recv(c->fd, c->req + c->got, sizeof(c->req) - 1 - c->got, 0);
    if (n <= 0)
        return n < 0 && (errno == EAGAIN || errno == EINTR);
    c->got += (size_t)n;
    c->req[c->got] = '\0';
    if (memmem(c->req, c->got, "\r\n\r\n", 4) || memmem(c->req, c->got, "\n\n", 2))
        respond(h, c);
    else if (c->got == sizeof(c->req) - 1)
        plain(c, 431, "request headers too large\n");
    return c->deadline > 0;
}

/* Takes the connections waiting on the listening socket; at MAX_CONNS the
 * one closest to its deadline goes first. */
static void accept_all(capstan_http_t *h)
{
    for (int k = 0; k < 64; k++) {
        int fd = accept4(h->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* Out of descriptors the socket stays readable: rest a while
             * rather than spin (the deadlines free some). */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                h->accept_after = capstan__mono() + 0.1;
            return;
        }
        conn_t *c = malloc(sizeof(*c));
        if (!c) {
            close(fd);
            return;
        }
        if (h->n == MAX_CONNS) {
            size_t old = 0;
            for (size_t i = 1; i < h->n; i++)
                if (h->conns[i]->deadline < h->conns[old]->deadline)
                    old = i;
            drop(h, old);
        }
        *c = (conn_t){ .fd = fd, .deadline = capstan__mono() + REQUEST_SECONDS };
        c->req[0] = '\0';
        h->conns[h->n++] = c;
    }
}

static void *serve(void *arg)
{
    capstan_http_t *h = arg;
    struct pollfd pf[MAX_CONNS + 2];
    for (;;) {
        double now = capstan__mono(), next = now + 60;
        for (size_t i = h->n; i-- > 0;) {
            if (h->conns[i]->deadline <= now)
                drop(h, i);
            else if (h->conns[i]->deadline < next)
                next = h->conns[i]->deadline;
        }
        if (h->accept_after > now && h->accept_after < next)
            next = h->accept_after;
        pf[0] = (struct pollfd){ .fd = h->wake[0], .events = POLLIN };
        pf[1] = (struct pollfd){ .fd = h->accept_after > now ? -1 : h->lfd, .events = POLLIN };
        for (size_t i = 0; i < h->n; i++) {
            const conn_t *c = h->conns[i];
            pf[i + 2] = (struct pollfd){ .fd = c->fd,
                                         .events = c->out && c->sent < c->olen ? POLLOUT : POLLIN };
        }
        int ms = (int)((next - now) * 1000) + 1;
        if (poll(pf, h->n + 2, ms) < 0) {
            if (errno == EINTR)
                continue;
            capstan_error("metrics: poll: %s; /metrics is no longer served", strerror(errno));
            return NULL;
        }
        if (pf[0].revents)
            return NULL;
        /* Downwards: drop() moves the last one, already seen, into i. */
        for (size_t i = h->n; i-- > 0;)
            if (pf[i + 2].revents && !step(h, h->conns[i]))
                drop(h, i);
        if (pf[1].revents & POLLIN)
            accept_all(h);
    }
}

/* Binds and listens on addr:port; returns the socket or -1 with err. */
static int listen_on(const char *addr, int port, int reuse_port, char *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE };
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    int gai = getaddrinfo(addr, service, &hints, &res);
    if (gai) {
        capstan_seterr(err, CAPSTAN_ECONFIG, "metrics_bind %s: %s", addr, gai_strerror(gai));
        return -1;
    }
    int fd = -1, e = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        /* Lets a restart bind while old connections sit in TIME_WAIT; on
         * Linux it never lets two sockets listen on one port. */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (reuse_port)
            setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        capstan_seterr(err, CAPSTAN_ESYS, "metrics_port %d: cannot listen on %s port %d: %s", port, addr,
                       port, strerror(e));
    return fd;
}

int capstan__http_check(const char *bind, int port, char *err)
{
    int fd = listen_on(bind && *bind ? bind : "127.0.0.1", port, 0, err);
    if (fd < 0)
        return CAPSTAN_ESYS;
    close(fd);
    return 0;
}

int capstan__http_start(const capstan_http_conf_t *conf, capstan_http_t **out, char *err)
{
    const char *addr = conf->bind && *conf->bind ? conf->bind : "127.0.0.1";
    int rc = 0;
    *out = NULL;
    capstan_http_t *h = calloc(1, sizeof(*h));
    if (!h)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    h->conf = *conf;
    h->lfd = h->wake[0] = h->wake[1] = -1;
    size_t n = capstan__http_shards(conf);
    h->rs = calloc(n ? n : 1, sizeof(*h->rs));
    h->warned = calloc(n ? n : 1, 1);
    if (!h->rs || !h->warned) {
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < (n ? n : 1); i++) {
        const char *name, *url = conf->redis_url;
        if (i)
            conf->shard_metrics(conf->ud, i, &name, &url);
        if (!(h->rs[h->nrs] = capstan_redis_new(url, CAPSTAN_HTTP_REDIS_TIMEOUT, err))) {
            rc = CAPSTAN_ECONFIG;
            goto out;
        }
        h->nrs++;
    }
    if ((h->lfd = listen_on(addr, conf->port, conf->reuse_port, err)) < 0) {
        rc = CAPSTAN_ESYS;
        goto out;
    }
    if (fcntl(h->lfd, F_SETFL, O_NONBLOCK) != 0 || pipe2(h->wake, O_CLOEXEC) != 0
        || pthread_create(&h->thread, NULL, serve, h) != 0) {
        rc = capstan_seterr(err, CAPSTAN_ESYS, "metrics_port %d: cannot start the HTTP server on %s",
                            conf->port, addr);
        goto out;
    }
    h->started = 1;
    capstan_info("serving Prometheus metrics on http://%s%s%s:%d/metrics",
                 strchr(addr, ':') ? "[" : "", addr, strchr(addr, ':') ? "]" : "", conf->port);
    *out = h;
    h = NULL;
out:
    capstan__http_stop(h);
    return rc;
}

void capstan__http_stop(capstan_http_t *h)
{
    if (!h)
        return;
    if (h->started) {
        ssize_t n;
        do
            n = write(h->wake[1], "x", 1);
        while (n < 0 && errno == EINTR);
        pthread_join(h->thread, NULL);
    }
    while (h->n)
        drop(h, h->n - 1);
    if (h->lfd >= 0)
        close(h->lfd);
    if (h->wake[0] >= 0) {
        close(h->wake[0]);
        close(h->wake[1]);
    }
    for (size_t i = 0; i < h->nrs; i++)
        capstan_redis_free(h->rs[i]);
    free(h->rs);
    free(h->warned);
    free(h);
}
