/* What Sidekiq's dashboard shows, read from Redis in one place for
 * `capstan stats`, `capstan top` and the /metrics endpoint: processed/failed
 * totals, schedule/retry/dead sizes, each queue's size and latency, and
 * the live processes' heartbeats.
 *
 * Not thread-safe on one capstan_redis_t: each caller passes its own. */
#ifndef CAPSTAN_OBSERVE_OVERVIEW_H
#define CAPSTAN_OBSERVE_OVERVIEW_H

#include <stddef.h>

#include "capstan/redis.h"

typedef struct capstan_overview_queue {
    char *name;           /* without "queue:" */
    long long size;
    double latency;       /* seconds since its oldest job was enqueued; 0 when empty */
} capstan_overview_queue_t;

typedef struct capstan_overview_process {
    char *identity;
    char *info;           /* the raw "info" JSON of the heartbeat */
    long long busy;       /* -1 when a field is absent */
    long long rss;        /* KB */
    long long concurrency;/* from info */
    double beat;          /* epoch seconds; < 0 when absent */
    int quiet;            /* 0, 1, or -1 when absent */
} capstan_overview_process_t;

typedef struct capstan_overview {
    long long processed, failed;        /* stat:processed, stat:failed */
    long long scheduled, retries, dead; /* zset sizes */
    capstan_overview_queue_t *queues;   /* sorted by name */
    size_t nqueues;
    capstan_overview_process_t *processes; /* those with a live heartbeat hash */
    size_t nprocesses;
} capstan_overview_t;

/* Fills out (owned by the caller: capstan__overview_clear, also after an
 * error); the processes only when with_processes (one round trip each).
 * Returns 0, or CAPSTAN_EREDIS with err filled when the connection
 * failed part-way (out then holds what was read), or CAPSTAN_ENOMEM. */
int capstan__overview_read(capstan_redis_t *r, int with_processes, capstan_overview_t *out, char *err);
void capstan__overview_clear(capstan_overview_t *o);

#endif
