/* The Prometheus endpoint of `capstan run --metrics-port PORT`: GET /metrics on
 * a small HTTP/1.x server's own thread, with its own Redis connection for
 * the numbers that live in Redis. */
#ifndef CAPSTAN_OBSERVE_HTTP_H
#define CAPSTAN_OBSERVE_HTTP_H

#include "support/buf.h"
#include "capstan/redis.h"

typedef struct capstan_http capstan_http_t;

/* What the endpoint serves, handed over by the process that starts it (the
 * runtime fills it), so that observe/ reads no state of the runtime's own.
 * The strings and ud must outlive the server. */
typedef struct capstan_http_conf {
    const char *bind;          /* address to listen on; NULL or "": 127.0.0.1 */
    int port;
    const char *redis_url;     /* where the queue, set and Redis gauges are read
                                  (with shards, the first shard's) */
    int threads;               /* the capstan_threads gauge: processor threads */
    /* The capstan_busy_threads gauge: processor threads running a job, read
     * at each scrape on the server's thread (NULL: 0). */
    int (*busy_threads)(void *ud);
    /* The capstan_prefetched_jobs gauge: jobs fetched ahead and not started
     * in shard (0 without shards), for each of the n queues named (every
     * shard's), read at each scrape and added to counts[0..n) (NULL: the
     * gauge is left out). */
    const char *const *queues;
    size_t nqueues;
    void (*prefetched)(void *ud, size_t shard, const char *const *queues, size_t n, long long *counts);
    /* GET /livez (ready 0) and /readyz (ready 1): 1 for 200, else 0 with
     * why (n bytes) the 503's body (NULL: both 404). On the server's
     * thread; it must not wait on Redis, so /livez answers while Redis
     * does not. */
    int (*probe)(void *ud, int ready, char *why, size_t n);
    /* With shards: the registry of shard i's own series, its name (*name)
     * and its Redis (*redis_url), NULL past the last, read at each scrape;
     * its series, and the queue, set and Redis gauges read there, are
     * served with a shard label (NULL: no shards). */
    struct capstan_metrics *(*shard_metrics)(void *ud, size_t i, const char **name,
                                             const char **redis_url);
    void *ud;
    int reuse_port;            /* SO_REUSEPORT: a supervised worker's successor
                                  listens while the worker it replaces still does */
} capstan_http_conf_t;

/* Seconds a scrape waits for Redis (connect and each command) before it
 * answers without the Redis-derived series. */
#define CAPSTAN_HTTP_REDIS_TIMEOUT 2.0

/* Listens on conf->bind port conf->port and serves /metrics (and the
 * probes) until
 * capstan__http_stop (conf is copied). The listening socket is bound here,
 * synchronously, so a port in use is an error at start rather than a
 * worker silently without metrics. On success *out is owned by the caller.
 * Returns 0, or CAPSTAN_ESYS / CAPSTAN_ECONFIG / CAPSTAN_ENOMEM with err
 * naming the address and port. */
int capstan__http_start(const capstan_http_conf_t *conf, capstan_http_t **out, char *err);
/* Whether bind (NULL: 127.0.0.1) and port can be listened on now, as
 * capstan__http_start would: 0, or CAPSTAN_ESYS / CAPSTAN_ECONFIG with err
 * as it fills it. A supervisor checks before it forks the worker that
 * serves the port, so a port in use stops the start with one line. */
int capstan__http_check(const char *bind, int port, char *err);
/* Stops serving and frees h (NULL is fine). Waits for a scrape in progress. */
void capstan__http_stop(capstan_http_t *h);

/* Appends the whole /metrics text to b: this process's counters, the
 * thread gauges conf gives, and the queue, set and Redis gauges read on
 * rs[i], shard i's Redis (rs[0] alone without shards), each line with its
 * shard's label (each scrape reads them fresh; when a Redis does not
 * answer its series are left out and its capstan_redis_up is 0). Each
 * rs[i] is connected when it is not. Returns 0 or CAPSTAN_ENOMEM. */
int capstan__http_scrape(const capstan_http_conf_t *conf, capstan_redis_t *const *rs, capstan_buf_t *b);
/* How many shards conf->shard_metrics names (0: none). */
size_t capstan__http_shards(const capstan_http_conf_t *conf);

#endif
