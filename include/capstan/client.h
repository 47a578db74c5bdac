/* Pushing jobs from C, in the payload format every Sidekiq version reads. */
#ifndef CAPSTAN_CLIENT_H
#define CAPSTAN_CLIENT_H

#include <stddef.h>

#include "config.h"
#include "error.h"
#include "redis.h"
#include "runtime.h"

typedef struct capstan_client capstan_client_t;

/* A push's (or a commit's) success with a warning: the jobs are in Redis,
 * but with min_replicas_ack: N configured (capstan_client_use_config), fewer
 * than N replicas had them within min_replicas_timeout, so a failover now
 * could lose them. capstan_client_error() says how many did. Positive: not an
 * error, and nothing to push again. */
#define CAPSTAN_PUSH_UNREPLICATED 1

/* A field left unset (NULL, CAPSTAN_RETRY_UNSET) takes the class's option (see
 * capstan_client_use_config and capstan_client_set_class), else the default.
 * The options and their strings are borrowed for the push call only. */
typedef struct capstan_push_opts {
    const char *queue;   /* NULL = the class's queue, else "default" */
    int retry;           /* CAPSTAN_RETRY_UNSET (the class's, else true),
                            CAPSTAN_RETRY_DEFAULT (true), CAPSTAN_RETRY_NONE (false)
                            or a count */
    double at;           /* run at this epoch time (seconds); 0 = now */
    capstan_ts_format_t timestamps; /* created_at/enqueued_at format */
    const char *extra;   /* raw JSON object whose members are added to the
                            payload (e.g. "{\"tags\":[\"a\"]}"), or NULL */
    const struct capstan_unique_opts *unique; /* uniqueness lock to take on push
                            (capstan/unique.h), or NULL for the class's; must
                            outlive the call. Replaces every lock option of
                            the class. */
    double expires_in;   /* seconds after it is due (at, else now) past which
                            the job is dropped unstarted: writes "expires_at"
                            (float epoch seconds, as Sidekiq Pro's expiry
                            does; see doc/features.md); 0 = never. An
                            "expires_at" of extra's takes precedence. */
} capstan_push_opts_t;

/* The defaults: no queue (the class's, else "default"), retry unset, now,
 * float timestamps, no extra fields, the class's lock, no expiry. */
CAPSTAN_API capstan_push_opts_t capstan_push_opts_default(void);

/* Connects to url (NULL = REDIS_URL or redis://127.0.0.1:6379/0). Returns a
 * client owned by the caller (capstan_client_free), or NULL with err filled.
 * A client is not thread-safe: use one per thread. capstan_client_free rolls
 * back an open transaction (see capstan_client_begin). A connection the server
 * has closed makes a push or commit fail with CAPSTAN_EREDIS; the library's
 * writes never raise SIGPIPE in the program, which need not ignore it. */
CAPSTAN_API capstan_client_t *capstan_client_new(const char *url, char *err);
CAPSTAN_API void capstan_client_free(capstan_client_t *c);

/* Pushes one job of class cls with args (a JSON array text, NULL = "[]"),
 * through the client middleware chain. Writes its jid into jid (25 bytes,
 * may be NULL). Returns 0, CAPSTAN_PUSH_UNREPLICATED, or a CAPSTAN_E* code
 * (CAPSTAN_EDENIED when a middleware, such as a uniqueness lock, refused the
 * push); capstan_client_error() then says why. With min_replicas_ack: N, the
 * push is followed by WAIT N min_replicas_timeout. */
CAPSTAN_API int capstan_client_push(capstan_client_t *c, const char *cls, const char *args,
                                    const capstan_push_opts_t *opts, char jid[25]);

/* Pushes n jobs of one class in one round trip (one LPUSH, or one ZADD when
 * opts->at is in the future). jids may be NULL or hold n entries. Each job
 * goes through the client chain; a denied job gets an empty jid, the others
 * are pushed, and the call returns CAPSTAN_EDENIED (ahead of
 * CAPSTAN_PUSH_UNREPLICATED). With shards (capstan_client_use_config), each
 * job is routed on its own and each shard's share goes in a MULTI/EXEC of
 * its own. A shard that cannot be reached when a job's chain runs there
 * fails the call before anything is sent (nothing pushed, as for a client
 * whose Redis is down); one that fails as the writes are sent does not stop
 * the others, whose jobs keep their jids (the failed shard's get empty
 * ones). The call returns the first failure, its text naming the shard. */
CAPSTAN_API int capstan_client_push_bulk(capstan_client_t *c, const char *cls,
                                         const char *const *args, size_t n,
                                         const capstan_push_opts_t *opts, char (*jids)[25]);

/* Class options, as a worker's sidekiq_options are to Sidekiq's client:
 * every push of cls writes opts->retry, opts->queue and the lock options of
 * opts->unique into the payload, unless the push options give their own.
 * Copied, but opts->unique must outlive c. Setting a class again replaces
 * its options. Returns 0, CAPSTAN_EINVAL or CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_client_set_class(capstan_client_t *c, const char *cls,
                                         const capstan_class_opts_t *opts);

/* Reads the classes: section of cfg on every push (retry, queue and the
 * lock options), ahead of capstan_client_set_class's options, as the server
 * reads them, and its min_replicas_ack and min_replicas_timeout. cfg is
 * borrowed and must outlive c; NULL stops.
 *
 * When cfg has a shards: list, the client routes: each job (of a bulk push
 * too) goes to one shard, and its uniqueness lock is taken there. The rule,
 * in order: the shard capstan_client_set_shard named; else the first shard
 * whose queues: list has the job's queue; else, among the shards without
 * a queues: list (they fetch every queue), the one rendezvous hashing
 * (doc/sharding.md, "Routing pushes") gives for the job's lock digest, as the
 * "unique" middleware computes it, so that a job's duplicates meet in one
 * shard; else for its jid. A push to a queue no shard fetches fails with
 * CAPSTAN_ECONFIG. One
 * connection per shard is made at its first push; the connection of
 * capstan_client_new is then not used for pushes. A client with shards
 * has transactions only while pinned to one shard (capstan_client_begin).
 * A batch made through it lives in one shard (capstan/batch.h). A testing
 * kit's client does not route. */
CAPSTAN_API void capstan_client_use_config(capstan_client_t *c, const capstan_config_t *cfg);

/* The pushes that follow go to the shard called name, whatever the rule
 * says; NULL routes by the rule again. Returns 0, CAPSTAN_ENOTFOUND when no
 * shard has that name, or CAPSTAN_EINVAL when the client has no shards or
 * a transaction is open; capstan_client_error() says which, and the
 * shards it knows. */
CAPSTAN_API int capstan_client_set_shard(capstan_client_t *c, const char *name);

/* The name of the shard job i of the last push (or bulk push) went to,
 * or NULL when it was not pushed or the client has no shards. Borrowed
 * from the config. */
CAPSTAN_API const char *capstan_client_pushed_shard(const capstan_client_t *c, size_t i);

/* The queue a push of cls goes to when the push names none: the classes:
 * section's (capstan_client_use_config), else capstan_client_set_class's;
 * NULL when neither gives one (the push then goes to "default"). Borrowed:
 * valid while those options are. */
CAPSTAN_API const char *capstan_client_class_queue(const capstan_client_t *c, const char *cls);

/* Both at once from a runtime: the options its classes were registered
 * with and its configuration's classes: section. rt must outlive c. This
 * is how a handler's own client pushes jobs of the runtime's classes.
 * Returns 0 or CAPSTAN_ENOMEM. */
CAPSTAN_API int capstan_client_use_runtime(capstan_client_t *c, const capstan_runtime_t *rt);

/* Transactions: pushes that wait for the caller's own commit, so that
 * enqueueing can follow a database transaction. After capstan_client_begin,
 * every push (single, bulk, scheduled, with class options or a lock) runs
 * its client chain and returns as usual (jids, CAPSTAN_EDENIED), but its
 * writes wait in the client; capstan_client_commit sends them all in one
 * MULTI/EXEC, so a worker sees all of them or none, and
 * capstan_client_rollback drops them. Nothing is refused inside a transaction,
 * but a push there still needs the connection (CAPSTAN_EREDIS without it):
 * its chain may take a lock.
 *
 * Uniqueness locks (until_executed and the other until_* types) are taken
 * when the push is made, not at commit: a conflicting push is denied at
 * once, as outside a transaction, and the lock is held for the buffered
 * job. A rollback, capstan_client_free, or a commit that surely did not push
 * releases those locks. What middleware itself writes to Redis (a user's,
 * or the reject and replace conflict strategies) is written at push time
 * and not undone.
 *
 * capstan_client_begin returns 0, CAPSTAN_ENOMEM, or CAPSTAN_EINVAL when a transaction
 * is already open (that one stays as it was) or the client has shards and
 * is not pinned to one (capstan_client_set_shard): one MULTI/EXEC cannot
 * span several Redis servers. A pinned client's transaction is its
 * shard's. */
CAPSTAN_API int capstan_client_begin(capstan_client_t *c);
/* Sends the buffered pushes (nothing to send is a success) and ends the
 * transaction, whatever the outcome. Returns
 *   0 or CAPSTAN_PUSH_UNREPLICATED: all were pushed (then the WAIT of
 *     min_replicas_ack, as for any push);
 *   CAPSTAN_EREPLY: Redis refused the transaction (a read-only replica, out
 *     of memory): none was pushed, and their locks are released. (Or,
 *     rarer, a command failed as it ran, such as an LPUSH onto a key that
 *     is not a list: MULTI/EXEC does not undo the others.);
 *   CAPSTAN_EREDIS: the connection failed. When it failed before anything was
 *     sent, none was pushed (the error says "nothing was pushed", and the
 *     locks are released if Redis can be reached, else they expire or go
 *     to the reaper); when it failed after, MULTI/EXEC made them all or
 *     none, but which is unknown (the error says "unknown which"), and the
 *     locks are kept. A commit is never sent twice;
 *   CAPSTAN_EINVAL: no transaction is open. */
CAPSTAN_API int capstan_client_commit(capstan_client_t *c);
/* Drops the buffered pushes, releases their locks and ends the
 * transaction. Returns 0, or CAPSTAN_EINVAL when none is open. */
CAPSTAN_API int capstan_client_rollback(capstan_client_t *c);

/* Cancels job jid as Sidekiq::Client#cancel! does (Sidekiq 7.3+): marks its
 * iteration state it-<jid> cancelled, once; an iterating handler
 * (capstan_job_checkpoint) stops at its next flush, the job ends without
 * retry and its state goes; any handler may poll capstan_job_cancelled.
 * Returns the epoch second the job was cancelled at (the first cancel's
 * when it already was), or -1 (capstan_client_error says why). A client
 * with shards marks the job in every shard, since its route is not known
 * from the jid alone; -1 when a shard could not be marked (the others
 * are marked still). */
CAPSTAN_API long long capstan_client_cancel(capstan_client_t *c, const char *jid);

/* The last error's text; valid until the next call. */
CAPSTAN_API const char *capstan_client_error(const capstan_client_t *c);

/* The client's own connection (borrowed), for commands that go with its
 * pushes, such as a batch's (capstan/batch.h). For a client with shards:
 * the connection of the shard capstan_client_set_shard named (made, not
 * connected, on first use: see capstan_redis_ok), else the one of
 * capstan_client_new, which routed pushes do not use. */
CAPSTAN_API capstan_redis_t *capstan_client_redis(capstan_client_t *c);

#endif
