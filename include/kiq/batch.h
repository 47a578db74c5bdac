/* Batches, as Sidekiq Pro has them: a group of jobs with callbacks that run
 * once when the group is done.
 *
 * A batch has a bid, a description, a total, a pending count (jobs not yet
 * succeeded), its failed jobs with their last error, and up to three
 * callbacks, each a plain Sidekiq job (class, queue) pushed with args
 * [status, options] so any Sidekiq or kiq process can run it:
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
 * own jobs, see kiq_job_bid) to add jobs until it has succeeded. A child
 * batch (kiq_batch_set_parent) counts as one job of its parent, and its
 * callbacks are jobs of the parent: the parent's complete and success fire
 * after the child's callbacks have run and succeeded, which may add jobs to
 * the parent. A child's death reaches the parent at once.
 *
 * A kiq_batch_t is a handle on one batch for one client; like the client,
 * not thread-safe. Inside the client's transaction (kiq_client_begin) a
 * batch's steps wait with its pushes and land with them at
 * kiq_client_commit, or never (kiq_client_rollback); errors Redis finds then
 * (a parent that does not exist) are not reported, and such jobs run as
 * plain jobs. The keys are described in the README. */
#ifndef KIQ_BATCH_H
#define KIQ_BATCH_H

#include <stddef.h>

#include "client.h"
#include "error.h"
#include "job.h"
#include "redis.h"

typedef struct kiq_batch kiq_batch_t;

typedef enum kiq_batch_event {
    KIQ_BATCH_COMPLETE = 0,
    KIQ_BATCH_SUCCESS,
    KIQ_BATCH_DEATH,
} kiq_batch_event_t;

/* A new batch with a fresh bid, pushing through c (borrowed: it must
 * outlive the handle). Nothing is written until the first push or the
 * commit, so description, callbacks, parent and linger are set first.
 * Returns a handle owned by the caller (kiq_batch_free), or NULL with err
 * filled. */
KIQ_API kiq_batch_t *kiq_batch_new(kiq_client_t *c, char *err);

/* Reopens batch bid to add jobs to it, typically from one of its own jobs
 * (kiq_job_bid): its callbacks wait until this handle is committed too.
 * Returns a handle owned by the caller, or NULL with err filled: KIQ_ENOTFOUND
 * (no such batch) or KIQ_EDENIED (it has already succeeded). */
KIQ_API kiq_batch_t *kiq_batch_reopen(kiq_client_t *c, const char *bid, char *err);

/* Frees the handle. A batch never committed stays open: its callbacks do
 * not fire. NULL is fine. */
KIQ_API void kiq_batch_free(kiq_batch_t *b);

/* The batch's id (owned by the handle). */
KIQ_API const char *kiq_batch_bid(const kiq_batch_t *b);
/* The last error's text; valid until the next call on b. */
KIQ_API const char *kiq_batch_error(const kiq_batch_t *b);

/* Before the first push of a new batch. Each returns 0, or KIQ_EINVAL with
 * kiq_batch_error() saying why (a reopened or already written batch, or a
 * bad value). */
KIQ_API int kiq_batch_describe(kiq_batch_t *b, const char *description);
/* The callback of event: a job of class cls pushed to queue (NULL =
 * "default") with args [status, options]; options is the text of a JSON
 * object (NULL = {}), kept byte for byte. Refused: an empty class, a queue
 * name with spaces or control characters, options that are not a JSON
 * object. */
KIQ_API int kiq_batch_on(kiq_batch_t *b, kiq_batch_event_t event, const char *cls,
                         const char *queue, const char *options);
/* Makes this batch a child of parent_bid, which must exist and not have
 * succeeded (it counts the child as one pending job from the first push). */
KIQ_API int kiq_batch_set_parent(kiq_batch_t *b, const char *parent_bid);
/* Seconds the batch's data stays after success (default 30 days) and,
 * before that, after the last addition (expiry, default 30 days). */
KIQ_API int kiq_batch_set_linger(kiq_batch_t *b, long linger, long expiry);

/* kiq_client_push / kiq_client_push_bulk into the batch: the payloads carry
 * "bid" (added to opts->extra), and the batch counts them in the same
 * transaction as they are pushed (the client's open one, else one of the
 * call's own), so no job can finish before it is counted, and a lost
 * connection leaves the count and the jobs together (KIQ_EREDIS: all were
 * pushed and counted, once, or none; the jids are then ""). Jobs refused
 * by the client chain are not counted. Returns 0, KIQ_PUSH_UNREPLICATED
 * (in, but on fewer replicas than min_replicas_ack) or a KIQ_E* code with
 * kiq_batch_error() saying why (KIQ_EDENIED: some jobs were refused, the
 * others are in; KIQ_EINVAL after the commit). */
KIQ_API int kiq_batch_push(kiq_batch_t *b, const char *cls, const char *args,
                           const kiq_push_opts_t *opts, char jid[25]);
KIQ_API int kiq_batch_push_bulk(kiq_batch_t *b, const char *cls, const char *const *args,
                                size_t n, const kiq_push_opts_t *opts, char (*jids)[25]);

/* Ends this handle's additions. When no other handle holds the batch open,
 * what is due fires now (an empty batch, or jobs already finished);
 * otherwise the last job's ack fires it. Once per handle. Returns 0 or a
 * KIQ_E* code with kiq_batch_error() saying why. */
KIQ_API int kiq_batch_commit(kiq_batch_t *b);

/* What kiq batch status shows. */
typedef struct kiq_batch_status {
    char *bid, *description, *parent; /* owned; parent NULL when none */
    long total;        /* jobs, child batches and their callbacks added */
    long pending;      /* not succeeded yet */
    long failures;     /* failed and not succeeded since */
    long dead;         /* in the dead set */
    long open;         /* handles not committed */
    int invalidated;
    double created_at, complete_at, success_at, death_at; /* 0 = not (yet) */
    char *first_failed_jid, *first_error; /* one failure, or NULL */
} kiq_batch_status_t;

/* Reads batch bid into *out (kiq_batch_status_clear it). Returns 0,
 * KIQ_ENOTFOUND, KIQ_EREDIS, KIQ_EREPLY or KIQ_ENOMEM with err filled. */
KIQ_API int kiq_batch_status(kiq_redis_t *r, const char *bid, kiq_batch_status_t *out,
                             char *err);
KIQ_API void kiq_batch_status_clear(kiq_batch_status_t *s);

/* The bids of the batches still stored, oldest first: *bids is an array of
 * *n strings owned by the caller (kiq_batch_list_free). Bids whose data
 * expired are dropped from the index on the way. Returns 0 or a KIQ_E*
 * code with err filled. */
KIQ_API int kiq_batch_list(kiq_redis_t *r, char ***bids, size_t *n, char *err);
KIQ_API void kiq_batch_list_free(char **bids, size_t n);

/* Deletes batch bid's data: its jobs then run as plain jobs (with a
 * warning) and no callback fires. Returns 0, KIQ_ENOTFOUND or a KIQ_E* code
 * with err filled. */
KIQ_API int kiq_batch_delete(kiq_redis_t *r, const char *bid, char *err);
/* Marks batch bid invalid: its running jobs may check (kiq_batch_valid)
 * and stop. Returns 0, KIQ_ENOTFOUND or a KIQ_E* code with err filled. */
KIQ_API int kiq_batch_invalidate(kiq_redis_t *r, const char *bid, char *err);

/* For a handler: 1 when job belongs to no batch or to one still valid, 0
 * when its batch was invalidated or deleted, KIQ_EREDIS when Redis did not
 * answer. Uses the job's own connection. */
KIQ_API int kiq_batch_valid(kiq_job_t *job);

#endif
