/* Batches, as Sidekiq Pro has them: a group of jobs with callbacks that run
 * once when the group is done.
 *
 * A batch has a bid, a description, a total, a pending count (jobs not yet
 * succeeded), its failed jobs with their last error, and up to three
 * callbacks, each a plain Sidekiq job (class, queue) pushed with args
 * [status, options] so any Sidekiq or capstan process can run it:
 *   complete  every job has run at least once, successfully or not;
 *   success   every job has succeeded, possibly after retries;
 *   death     a job of the batch went to the dead set.
 * status is a JSON object: bid, event, description, total, pending,
 * failures, created_at, parent_bid.
 *
 * Jobs carry "bid" in their payload. Each job's outcome moves the batch in
 * its ack's own Redis step, once per jid, so callbacks fire exactly once
 * even when a job runs twice (a crash, a retry). Callbacks fire only once
 * the batch is committed; a batch can be reopened (typically by one of its
 * own jobs, see capstan_job_bid) to add jobs until it has succeeded. A child
 * batch (capstan_batch_set_parent) counts as one job of its parent, and its
 * callbacks are jobs of the parent: the parent's complete and success fire
 * after the child's callbacks have run and succeeded, which may add jobs to
 * the parent. A child's death reaches the parent at once.
 *
 * A capstan_batch_t is a handle on one batch for one client; like the client,
 * not thread-safe. Inside the client's transaction (capstan_client_begin) a
 * batch's steps wait with its pushes and land with them at
 * capstan_client_commit, or never (capstan_client_rollback); errors Redis finds then
 * (a parent that does not exist) are not reported, and such jobs run as
 * plain jobs. The keys are described in doc/features.md (Batches).
 * Through a client with shards (capstan_client_use_config), a batch lives in
 * one shard, its home: the one the client is pinned to when the batch is
 * made or reopened (capstan_client_set_shard), else the placing rule's pick
 * of its bid. Its keys, all its jobs (whatever their queues' routes) and
 * so its callbacks are in that shard; the client's pin is its own again
 * after each call. A child batch lives in its parent's shard: through a
 * client that is not pinned, capstan_batch_set_parent looks for the parent
 * (the pick of its bid first, then every other shard), and
 * capstan_batch_reopen for the batch, the same way. */
#ifndef CAPSTAN_BATCH_H
#define CAPSTAN_BATCH_H

#include <stddef.h>

#include "client.h"
#include "error.h"
#include "job.h"
#include "redis.h"

typedef struct capstan_batch capstan_batch_t;

typedef enum capstan_batch_event {
    CAPSTAN_BATCH_COMPLETE = 0,
    CAPSTAN_BATCH_SUCCESS,
    CAPSTAN_BATCH_DEATH,
} capstan_batch_event_t;

/* A new batch with a fresh bid, pushing through c (borrowed: it must
 * outlive the handle). Nothing is written until the first push or the
 * commit, so description, callbacks, parent and linger are set first.
 * Returns a handle owned by the caller (capstan_batch_free), or NULL with err
 * filled. */
CAPSTAN_API capstan_batch_t *capstan_batch_new(capstan_client_t *c, char *err);

/* Reopens batch bid to add jobs to it, typically from one of its own jobs
 * (capstan_job_bid): its callbacks wait until this handle is committed too.
 * Returns a handle owned by the caller, or NULL with err filled: CAPSTAN_ENOTFOUND
 * (no such batch) or CAPSTAN_EDENIED (it has already succeeded). */
CAPSTAN_API capstan_batch_t *capstan_batch_reopen(capstan_client_t *c, const char *bid, char *err);

/* Frees the handle. A batch never committed stays open: its callbacks do
 * not fire. NULL is fine. */
CAPSTAN_API void capstan_batch_free(capstan_batch_t *b);

/* The batch's id (owned by the handle). */
CAPSTAN_API const char *capstan_batch_bid(const capstan_batch_t *b);
/* The last error's text; valid until the next call on b. */
CAPSTAN_API const char *capstan_batch_error(const capstan_batch_t *b);

/* Before the first push of a new batch; the strings are copied. Each
 * returns 0, or CAPSTAN_EINVAL with
 * capstan_batch_error() saying why (a reopened or already written batch, or a
 * bad value). */
CAPSTAN_API int capstan_batch_describe(capstan_batch_t *b, const char *description);
/* The callback of event: a job of class cls pushed to queue (NULL =
 * "default") with args [status, options]; options is the text of a JSON
 * object (NULL = {}), kept byte for byte. Refused: an empty class, a queue
 * name with spaces or control characters, options that are not a JSON
 * object. */
CAPSTAN_API int capstan_batch_on(capstan_batch_t *b, capstan_batch_event_t event, const char *cls,
                                 const char *queue, const char *options);
/* Makes this batch a child of parent_bid, which must exist and not have
 * succeeded (it counts the child as one pending job from the first push).
 * Through a client with shards that is not pinned, it asks the shards in
 * turn (an EXISTS each, at most) which holds the parent: the child's
 * home. */
CAPSTAN_API int capstan_batch_set_parent(capstan_batch_t *b, const char *parent_bid);
/* Seconds the batch's data stays after success (default 30 days) and,
 * before that, after the last addition (expiry, default 30 days). */
CAPSTAN_API int capstan_batch_set_linger(capstan_batch_t *b, long linger, long expiry);

/* capstan_client_push / capstan_client_push_bulk into the batch: the payloads carry
 * "bid" (added to opts->extra), and the batch counts them in the same
 * transaction as they are pushed (the client's open one, else one of the
 * call's own), so no job can finish before it is counted, and a lost
 * connection leaves the count and the jobs together (CAPSTAN_EREDIS: all were
 * pushed and counted, once, or none; the jids are then ""). Jobs refused
 * by the client chain are not counted. Returns 0, CAPSTAN_PUSH_UNREPLICATED
 * (in, but on fewer replicas than min_replicas_ack) or a CAPSTAN_E* code with
 * capstan_batch_error() saying why (CAPSTAN_EDENIED: some jobs were refused, the
 * others are in; CAPSTAN_EINVAL after the commit). */
CAPSTAN_API int capstan_batch_push(capstan_batch_t *b, const char *cls, const char *args,
                                   const capstan_push_opts_t *opts, char jid[25]);
CAPSTAN_API int capstan_batch_push_bulk(capstan_batch_t *b, const char *cls, const char *const *args,
                                        size_t n, const capstan_push_opts_t *opts, char (*jids)[25]);

/* Ends this handle's additions. When no other handle holds the batch open,
 * what is due fires now (an empty batch, or jobs already finished);
 * otherwise the last job's ack fires it. Once per handle. Returns 0 or a
 * CAPSTAN_E* code with capstan_batch_error() saying why. */
CAPSTAN_API int capstan_batch_commit(capstan_batch_t *b);

/* What capstan batch status shows. */
typedef struct capstan_batch_status {
    char *bid, *description, *parent; /* owned; parent NULL when none */
    long total;        /* jobs, child batches and their callbacks added */
    long pending;      /* not succeeded yet */
    long failures;     /* failed and not succeeded since */
    long dead;         /* in the dead set */
    long open;         /* handles not committed */
    int invalidated;
    double created_at, complete_at, success_at, death_at; /* 0 = not (yet) */
    char *first_failed_jid, *first_error; /* one failure, or NULL */
} capstan_batch_status_t;

/* Reads batch bid into *out (capstan_batch_status_clear it). Returns 0,
 * CAPSTAN_ENOTFOUND, CAPSTAN_EREDIS, CAPSTAN_EREPLY or CAPSTAN_ENOMEM with err filled. */
CAPSTAN_API int capstan_batch_status(capstan_redis_t *r, const char *bid, capstan_batch_status_t *out,
                                     char *err);
CAPSTAN_API void capstan_batch_status_clear(capstan_batch_status_t *s);

/* The bids of the batches still stored, oldest first: *bids is an array of
 * *n strings owned by the caller (capstan_batch_list_free). Bids whose data
 * expired are dropped from the index on the way. Returns 0 or a CAPSTAN_E*
 * code with err filled. */
CAPSTAN_API int capstan_batch_list(capstan_redis_t *r, char ***bids, size_t *n, char *err);
CAPSTAN_API void capstan_batch_list_free(char **bids, size_t n);

/* Deletes batch bid's data: its jobs then run as plain jobs (with a
 * warning) and no callback fires. Returns 0, CAPSTAN_ENOTFOUND or a CAPSTAN_E* code
 * with err filled. */
CAPSTAN_API int capstan_batch_delete(capstan_redis_t *r, const char *bid, char *err);
/* Marks batch bid invalid: its running jobs may check (capstan_batch_valid)
 * and stop. Returns 0, CAPSTAN_ENOTFOUND or a CAPSTAN_E* code with err filled. */
CAPSTAN_API int capstan_batch_invalidate(capstan_redis_t *r, const char *bid, char *err);

/* For a handler: 1 when job belongs to no batch or to one still valid, 0
 * when its batch was invalidated or deleted, CAPSTAN_EREDIS when Redis did not
 * answer. Uses the job's own connection. */
CAPSTAN_API int capstan_batch_valid(capstan_job_t *job);

#endif
