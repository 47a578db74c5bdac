/* What Sidekiq's dashboard shows, read from Redis in one place for
 * `capstan stats`, `capstan top` and the /metrics endpoint: processed/failed
 * totals, schedule/retry/dead sizes, each queue's size, latency and
 * whether it is paused, and
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
    int paused;           /* in Sidekiq Pro's "paused" set: not fetched */
} capstan_overview_queue_t;

typedef struct capstan_overview_process {
    char *identity;
    char *info;           /* the raw "info" JSON of the heartbeat */
    int capstan;          /* 1 a capstan process, 0 a Ruby Sidekiq one (see
                             capstan__overview_info_is_capstan) */
    char *version;        /* info's "version" (Sidekiq 7.0.2+ and capstan),
                             or NULL */
    char **queues;        /* the queues it reads, as its info lists them */
    size_t nqueues;
    long long busy;       /* -1 when a field is absent */
    long long rss;        /* KB */
    long long concurrency;/* from info */
    double beat;          /* epoch seconds; < 0 when absent */
    int quiet;            /* 0, 1, or -1 when absent */
    long long supervisor; /* a supervised capstan worker's supervisor pid and */
    long long worker;     /* its slot there, or -1 */
    char *prefetched;     /* capstan's jobs fetched ahead and not started, by
                             queue, at its last beat: a JSON object, or NULL
                             (Ruby Sidekiq) */
    long long fetch_errors; /* capstan's fetches answered with an error since
                               the beat before its last, -1 when absent */
    char *fetch_error;    /* the last of them, or NULL */
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

/* Only the live processes, for the runtime's look at its fleet: fills
 * out->processes as capstan__overview_read does, nothing else. */
int capstan__overview_processes(capstan_redis_t *r, capstan_overview_t *out, char *err);

/* The key capstan writes into its process's info JSON, with its version,
 * so that anyone reading the process set tells it from a Ruby Sidekiq
 * process (whose info carries Sidekiq's own "version" from 7.0.2 on, and
 * no version at all before). */
#define CAPSTAN_INFO_MARKER "capstan"

#endif
