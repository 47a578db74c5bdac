/* GET /metrics in the Prometheus text format 0.0.4, served by
 * libmicrohttpd's internal thread. Queue sizes and latencies are read from
 * Redis at scrape time (not cached by the housekeeper) so a scrape shows
 * the queues as they are, at the cost of a few pipelined round trips on the
 * server's own connection, each bounded by KIQ_HTTP_REDIS_TIMEOUT. */
#include "observe/http.h"

#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "support/log.h"
#include "observe/prometheus.h"
#include "observe/overview.h"
#include "runtime/rt.h"
#include "support/time.h"

#if MHD_VERSION < 0x00097002
typedef int mhd_result_t; /* before 0.9.71 handlers returned int */
#else
typedef enum MHD_Result mhd_result_t;
#endif

/* libmicrohttpd (and the TLS stack it links) is opened only when a metrics
 * port is configured, so a worker without one does not carry it in memory. */
static struct {
    __typeof__(&MHD_start_daemon) start_daemon;
    __typeof__(&MHD_stop_daemon) stop_daemon;
    __typeof__(&MHD_create_response_from_buffer) create_response_from_buffer;
    __typeof__(&MHD_add_response_header) add_response_header;
    __typeof__(&MHD_queue_response) queue_response;
    __typeof__(&MHD_destroy_response) destroy_response;
} mhd;
static int mhd_ok;
static char mhd_err[200];
static pthread_once_t mhd_once = PTHREAD_ONCE_INIT;

static void mhd_load(void)
{
    void *h = dlopen("libmicrohttpd.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen("libmicrohttpd.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(mhd_err, sizeof(mhd_err), "%s", dlerror());
        return;
    }
#define MHD_SYM(field, name) mhd.field = (__typeof__(mhd.field))(uintptr_t)dlsym(h, name)
    MHD_SYM(start_daemon, "MHD_start_daemon");
    MHD_SYM(stop_daemon, "MHD_stop_daemon");
    MHD_SYM(create_response_from_buffer, "MHD_create_response_from_buffer");
    MHD_SYM(add_response_header, "MHD_add_response_header");
    MHD_SYM(queue_response, "MHD_queue_response");
    MHD_SYM(destroy_response, "MHD_destroy_response");
#undef MHD_SYM
    mhd_ok = mhd.start_daemon && mhd.stop_daemon && mhd.create_response_from_buffer
             && mhd.add_response_header && mhd.queue_response && mhd.destroy_response;
    if (!mhd_ok)
        snprintf(mhd_err, sizeof(mhd_err), "a symbol is missing from libmicrohttpd");
}

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct kiq_http {
    struct MHD_Daemon *d;
    struct kiq_runtime *rt;
    kiq_redis_t *r;          /* used only by the daemon's thread, under mu */
    pthread_mutex_t mu;
    int redis_warned;        /* an unreachable Redis is logged once per outage */
};

static int gauge(kiq_buf_t *b, const char *name, const char *help)
{
    return kiq_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

static int queue_gauges(kiq_buf_t *b, const kiq_overview_t *ov)
{
    int rc = gauge(b, "kiq_queue_size", "Jobs waiting in each queue.");
    for (size_t i = 0; i < ov->nqueues && !rc; i++) {
        rc = kiq_buf_puts(b, "kiq_queue_size{queue=\"");
        if (!rc) rc = kiq_metrics_escape(b, ov->queues[i].name);
        if (!rc) rc = kiq_buf_printf(b, "\"} %lld\n", ov->queues[i].size);
    }
    if (!rc)
        rc = gauge(b, "kiq_queue_latency_seconds",
                   "Age of the oldest job in each queue (0 when empty).");
    for (size_t i = 0; i < ov->nqueues && !rc; i++) {
        rc = kiq_buf_puts(b, "kiq_queue_latency_seconds{queue=\"");
        if (!rc) rc = kiq_metrics_escape(b, ov->queues[i].name);
        if (!rc) rc = kiq_buf_printf(b, "\"} %.6f\n", ov->queues[i].latency);
    }
    return rc;
}

int kiq_http_scrape(struct kiq_runtime *rt, kiq_redis_t *r, kiq_buf_t *b)
{
    int rc = kiq_metrics_render(kiq_metrics_default(), b);
    if (!rc) rc = gauge(b, "kiq_busy_threads", "Processor threads running a job.");
    if (!rc) rc = kiq_buf_printf(b, "kiq_busy_threads %d\n", atomic_load(&rt->busy));
    if (!rc) rc = gauge(b, "kiq_threads", "Processor threads (concurrency).");
    if (!rc) rc = kiq_buf_printf(b, "kiq_threads %d\n", rt->cfg->concurrency);
    if (rc)
        return rc;

    char err[KIQ_ERRLEN] = "";
    kiq_overview_t ov;
    memset(&ov, 0, sizeof(ov));
    double rtt = -1;
    int up = kiq_redis_ok(r) || kiq_redis_connect(r) == 0;
    if (up) {
        double t0 = kiq_mono();
        redisReply *pong = kiq_redis_cmdf(r, "PING");
        rtt = kiq_mono() - t0;
        up = pong != NULL;
        freeReplyObject(pong);
    }
    if (up && kiq_overview_read(r, 0, &ov, err))
        up = 0;
    rc = gauge(b, "kiq_redis_up", "1 when this scrape could read Redis; the Redis series "
                                  "are left out when it is 0.");
    if (!rc) rc = kiq_buf_printf(b, "kiq_redis_up %d\n", up);
    if (up) {
        if (!rc) rc = gauge(b, "kiq_redis_rtt_seconds", "Round trip of a PING at this scrape.");
        if (!rc) rc = kiq_buf_printf(b, "kiq_redis_rtt_seconds %.6f\n", rtt);
        if (!rc) rc = queue_gauges(b, &ov);
        if (!rc) rc = gauge(b, "kiq_schedule_size", "Jobs in the schedule set.");
        if (!rc) rc = kiq_buf_printf(b, "kiq_schedule_size %lld\n", ov.scheduled);
        if (!rc) rc = gauge(b, "kiq_retry_size", "Jobs in the retry set.");
        if (!rc) rc = kiq_buf_printf(b, "kiq_retry_size %lld\n", ov.retries);
        if (!rc) rc = gauge(b, "kiq_dead_size", "Jobs in the dead set.");
        if (!rc) rc = kiq_buf_printf(b, "kiq_dead_size %lld\n", ov.dead);
    }
    kiq_overview_clear(&ov);
    return rc;
}

static mhd_result_t reply(struct MHD_Connection *conn, unsigned status, char *body, size_t len)
{
    struct MHD_Response *res = mhd.create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!res) {
        free(body);
        return MHD_NO;
    }
    mhd.add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE,
                            status == MHD_HTTP_OK ? CONTENT_TYPE : "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        mhd.add_response_header(res, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    mhd_result_t ret = mhd.queue_response(conn, status, res);
    mhd.destroy_response(res);
    return ret;
}

static mhd_result_t plain(struct MHD_Connection *conn, unsigned status, const char *text)
{
    char *body = strdup(text);
    return body ? reply(conn, status, body, strlen(body)) : MHD_NO;
}

static mhd_result_t handle(void *cls, struct MHD_Connection *conn, const char *url,
                           const char *method, const char *version, const char *upload,
                           size_t *upload_size, void **con_cls)
{
    (void)version;
    (void)upload;
    kiq_http_t *h = cls;
    /* The first call only announces the request; answering at once is
     * allowed for requests without a body and saves a round. */
    (void)con_cls;
    if (*upload_size)
        return plain(conn, MHD_HTTP_BAD_REQUEST, "no request body expected\n");
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return plain(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
    if (strcmp(url, "/metrics") != 0)
        return plain(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics\n");
    kiq_buf_t b = {0};
    pthread_mutex_lock(&h->mu);
    int rc = kiq_http_scrape(h->rt, h->r, &b);
    int up = kiq_redis_ok(h->r);
    if (!up && !h->redis_warned)
        kiq_warn("metrics: %s; serving /metrics without the Redis series",
                 kiq_redis_error(h->r));
    h->redis_warned = !up;
    pthread_mutex_unlock(&h->mu);
    if (rc) {
        kiq_buf_free(&b);
        return plain(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    size_t len = 0;
    char *body = kiq_buf_take(&b, &len);
    if (!body)
        body = strdup("");
    return body ? reply(conn, MHD_HTTP_OK, body, len) : MHD_NO;
}

/* Binds and listens on addr:port; returns the socket or -1 with err. */
static int listen_on(const char *addr, int port, char *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE };
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    int gai = getaddrinfo(addr, service, &hints, &res);
    if (gai) {
        kiq_seterr(err, KIQ_ECONFIG, "metrics_bind %s: %s", addr, gai_strerror(gai));
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
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 32) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        kiq_seterr(err, KIQ_ESYS, "metrics_port %d: cannot listen on %s port %d: %s", port, addr,
                   port, strerror(e));
    return fd;
}

int kiq_http_start(struct kiq_runtime *rt, kiq_http_t **out, char *err)
{
    const kiq_config_t *c = rt->cfg;
    const char *addr = c->metrics_bind && *c->metrics_bind ? c->metrics_bind : "127.0.0.1";
    int rc = 0, fd = -1;
    *out = NULL;
    kiq_http_t *h = calloc(1, sizeof(*h));
    if (!h)
        return kiq_seterr(err, KIQ_ENOMEM, "out of memory");
    pthread_mutex_init(&h->mu, NULL);
    h->rt = rt;
    if (!(h->r = kiq_redis_new(c->redis_url, KIQ_HTTP_REDIS_TIMEOUT, err))) {
        rc = KIQ_ECONFIG;
        goto out;
    }
    pthread_once(&mhd_once, mhd_load);
    if (!mhd_ok) {
        rc = kiq_seterr(err, KIQ_ENOTFOUND, "metrics_port %d: cannot load libmicrohttpd: %s",
                        c->metrics_port, mhd_err);
        goto out;
    }
    if ((fd = listen_on(addr, c->metrics_port, err)) < 0) {
        rc = KIQ_ESYS;
        goto out;
    }
    /* One internal thread answers connections one at a time: scrapes are
     * rare, and it keeps the Redis connection single-threaded. */
    h->d = mhd.start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO,
                            (uint16_t)c->metrics_port, NULL, NULL, handle, h,
                            MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
                            MHD_OPTION_END);
    if (!h->d) {
        rc = kiq_seterr(err, KIQ_ESYS, "metrics_port %d: cannot start the HTTP server on %s",
                        c->metrics_port, addr);
        goto out;
    }
    fd = -1; /* the daemon owns it now and closes it when stopped */
    kiq_info("serving Prometheus metrics on http://%s%s%s:%d/metrics",
             strchr(addr, ':') ? "[" : "", addr, strchr(addr, ':') ? "]" : "", c->metrics_port);
    *out = h;
    h = NULL;
out:
    if (fd >= 0)
        close(fd);
    kiq_http_stop(h);
    return rc;
}

void kiq_http_stop(kiq_http_t *h)
{
    if (!h)
        return;
    if (h->d)
        mhd.stop_daemon(h->d);
    kiq_redis_free(h->r);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
