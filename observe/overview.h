/* What Sidekiq's dashboard shows, read from Redis in one place for
 * `kiq stats`, `kiq top` and the /metrics endpoint: processed/failed
 * totals, schedule/retry/dead sizes, each queue's size and latency, and
 * the live processes' heartbeats.
 *
 * Not thread-safe on one kiq_redis_t: each caller passes its own. */
#ifndef KIQ_OBSERVE_OVERVIEW_H
#define KIQ_OBSERVE_OVERVIEW_H

#include <stddef.h>

#include "kiq/redis.h"

typedef struct kiq_overview_queue {
    char *name;           /* without "queue:" */
    long long size;
    double latency;       /* seconds since its oldest job was enqueued; 0 when empty */
} kiq_overview_queue_t;

typedef struct kiq_overview_process {
    char *identity;
    char *info;           /* the raw "info" JSON of the heartbeat */
    long long busy;       /* -1 when a field is absent */
    long long rss;        /* KB */
    long long concurrency;/* from info */
    double beat;          /* epoch seconds; < 0 when absent */
    int quiet;            /* 0, 1, or -1 when absent */
} kiq_overview_process_t;

typedef struct kiq_overview {
    long long processed, failed;        /* stat:processed, stat:failed */
    long long scheduled, retries, dead; /* zset sizes */
    kiq_overview_queue_t *queues;       /* sorted by name */
    size_t nqueues;
    kiq_overview_process_t *processes;  /* those with a live heartbeat hash */
    size_t nprocesses;
} kiq_overview_t;

/* Fills out (owned by the caller: kiq__overview_clear, also after an
 * error); the processes only when with_processes (one round trip each).
 * Returns 0, or KIQ_EREDIS with err filled when the connection
 * failed part-way (out then holds what was read), or KIQ_ENOMEM. */
int kiq__overview_read(kiq_redis_t *r, int with_processes, kiq_overview_t *out, char *err);
void kiq__overview_clear(kiq_overview_t *o);

#endif
