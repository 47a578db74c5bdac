/* The Prometheus endpoint of `capstan run --metrics-port PORT`: GET /metrics on
 * a small HTTP/1.x server's own thread, with its own Redis connection for
 * the numbers that live in Redis. */
#ifndef CAPSTAN_OBSERVE_HTTP_H
#define CAPSTAN_OBSERVE_HTTP_H

#include "support/buf.h"
#include "capstan/redis.h"

struct capstan_runtime;
typedef struct capstan_http capstan_http_t;

/* Seconds a scrape waits for Redis (connect and each command) before it
 * answers without the Redis-derived series. */
#define CAPSTAN_HTTP_REDIS_TIMEOUT 2.0

/* Listens on cfg->metrics_bind (NULL: 127.0.0.1) port cfg->metrics_port
 * and serves /metrics for rt until capstan__http_stop. The listening socket is
 * bound here, synchronously, so a port in use is an error at start rather
 * than a worker silently without metrics. rt must outlive the server.
 * On success *out is owned by the caller. Returns 0, or CAPSTAN_ESYS /
 * CAPSTAN_ECONFIG / CAPSTAN_ENOMEM with err naming the address and port. */
int capstan__http_start(struct capstan_runtime *rt, capstan_http_t **out, char *err);
/* Stops serving and frees h (NULL is fine). Waits for a scrape in progress. */
void capstan__http_stop(capstan_http_t *h);

/* Appends the whole /metrics text for rt to b: this process's counters,
 * its thread gauges, and the queue, set and Redis gauges read on r (each
 * scrape reads them fresh; when Redis does not answer they are left out
 * and capstan_redis_up is 0). r is connected when it is not. Returns 0 or
 * CAPSTAN_ENOMEM. */
int capstan__http_scrape(struct capstan_runtime *rt, capstan_redis_t *r, capstan_buf_t *b);

#endif
