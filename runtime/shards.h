/* A sharded process (the file's shards:): one runtime per shard, each a
 * complete Sidekiq process on its own Redis as far as that Redis sees,
 * all under one identity. The front is the runtime the program made: it
 * serves the first shard, handles signals and the metrics port, and
 * makes the members for the others, which run on threads of their own
 * and borrow its class table (handlers, rows, hooks), its settings and
 * its identity. Quiet and stop act on every member at once (runtime.c).
 * Not part of the public API. */
#ifndef CAPSTAN_RUNTIME_SHARDS_H
#define CAPSTAN_RUNTIME_SHARDS_H

#include "runtime/rt.h"

/* A member's state (capstan_rt_member_t.state). */
enum { CAPSTAN_MEMBER_STARTING = 0, CAPSTAN_MEMBER_RUNNING = 1, CAPSTAN_MEMBER_FAILED = 2 };

/* How many runtimes the process runs (1 without shards) and the i-th of
 * them, the front (rt itself) first. rt is the front or any member. */
size_t capstan__members(const struct capstan_runtime *rt);
struct capstan_runtime *capstan__member(struct capstan_runtime *rt, size_t i);

/* The name of rt's shard (the front's or a member's), NULL without
 * shards: the lines of what it decides for its shard alone say it. */
const char *capstan__shard_name(const struct capstan_runtime *rt);
/* Makes the front's members, one for each shard after the first, ready
 * to start (capstan__runtime_prepare), then gives the front the first
 * shard's queues. Called by the front's run once its classes are
 * resolved; nothing without shards. 0, or an error with err filled (what
 * was made is freed by capstan__shards_free). */
int capstan__shards_new(struct capstan_runtime *front, char *err);
/* Starts each member on a thread of its own: it connects (waiting for its
 * Redis as the front does, up to startup_timeout), then starts as the
 * front does (capstan__runtime_begin). 0 or CAPSTAN_ESYS with err. */
int capstan__shards_start(struct capstan_runtime *front, char *err);
/* 1 when a member's start failed, err filled with why (its rc in *rc). */
int capstan__shards_failed(struct capstan_runtime *front, int *rc, char *err);
/* Waits for the members' start threads, which give up once the front
 * is quiet. */
void capstan__shards_join(struct capstan_runtime *front);
/* Names rt's shard in the calling thread's log lines (support/log.h), and
 * makes its registry the one the thread's metrics go to
 * (capstan__metrics_use): every thread of a member's, the front's too,
 * calls it first. Nothing without shards. */
void capstan__member_log(const struct capstan_runtime *rt);
/* The registry of member i of ud (the front), its shard's name in *name
 * and its Redis in *redis_url, NULL past the last member or without
 * shards: the metrics port's capstan_http_conf_t.shard_metrics. */
struct capstan_metrics *capstan__shards_metrics(void *ud, size_t i, const char **name,
                                                const char **redis_url);
/* Frees the members (the front's capstan_runtime_free). */
void capstan__shards_free(struct capstan_runtime *front);

/* The run-slot budget: concurrency is how many jobs run at once in the
 * whole process, whichever shard they come from (each member has that
 * many processors, to fetch from its shard). A processor holding a job
 * fetched takes a token before it runs it and gives it back once the job
 * ended; without shards neither does anything. */
void capstan__shards_run_begin(struct capstan_runtime *rt);
void capstan__shards_run_end(struct capstan_runtime *rt);

/* The URL of the home of state that lives in one shard of the fleet (a
 * rate limiter): the shard called shard, else the placing rule's pick of
 * key; NULL when that is rt's own shard, or without shards. */
const char *capstan__shards_home(struct capstan_runtime *rt, const char *shard, const char *key);

/* runtime.c: the steps of a start every member takes. */
/* What rt makes before it touches Redis: its source and feed, its process
 * info, paused queues, liveness key and fleet look. 0 or CAPSTAN_ENOMEM
 * with err. */
int capstan__runtime_prepare(struct capstan_runtime *rt, char *err);
/* Once r is connected: orphan recovery, the first beat, the fleet's look,
 * then the threads. 0 or an error with err. */
int capstan__runtime_begin(struct capstan_runtime *rt, capstan_redis_t *r, char *err);

#endif
