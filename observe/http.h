/* The Prometheus endpoint of `kiq run --metrics-port PORT`: GET /metrics on
 * a small HTTP/1.x server's own thread, with its own Redis connection for
 * the numbers that live in Redis. */
#ifndef KIQ_OBSERVE_HTTP_H
#define KIQ_OBSERVE_HTTP_H

#include "support/buf.h"
#include "kiq/redis.h"

struct kiq_runtime;
typedef struct kiq_http kiq_http_t;

/* Seconds a scrape waits for Redis (connect and each command) before it
 * answers without the Redis-derived series. */
#define KIQ_HTTP_REDIS_TIMEOUT 2.0

/* Listens on cfg->metrics_bind (NULL: 127.0.0.1) port cfg->metrics_port
 * and serves /metrics for rt until kiq__http_stop. The listening socket is
 * bound here, synchronously, so a port in use is an error at start rather
 * than a worker silently without metrics. rt must outlive the server.
 * On success *out is owned by the caller. Returns 0, or KIQ_ESYS /
 * KIQ_ECONFIG / KIQ_ENOMEM with err naming the address and port. */
int kiq__http_start(struct kiq_runtime *rt, kiq_http_t **out, char *err);
/* Stops serving and frees h (NULL is fine). Waits for a scrape in progress. */
void kiq__http_stop(kiq_http_t *h);

/* Appends the whole /metrics text for rt to b: this process's counters,
 * its thread gauges, and the queue, set and Redis gauges read on r (each
 * scrape reads them fresh; when Redis does not answer they are left out
 * and kiq_redis_up is 0). r is connected when it is not. Returns 0 or
 * KIQ_ENOMEM. */
int kiq_http_scrape(struct kiq_runtime *rt, kiq_redis_t *r, kiq_buf_t *b);

#endif
