/* A client transaction: Redis commands kept until they go out together in
 * one MULTI/EXEC, and the uniqueness locks their pushes took, released when
 * the commands are not sent. Every push goes through one (capstan_client_begin
 * keeps it open until capstan_client_commit); other writes that must land with
 * pushes, such as a batch's own keys, add their commands to the client's
 * open transaction (capstan__client_txn).
 * Not part of the public API. */
#ifndef CAPSTAN_CLIENT_TXN_H
#define CAPSTAN_CLIENT_TXN_H

#include <stddef.h>

#include "capstan/client.h"
#include "capstan/redis.h"
#include "capstan/unique.h"

typedef struct capstan_txn capstan_txn_t;

/* A point to go back to (capstan__txn_undo): what t held when it was taken. */
typedef struct capstan_txn_mark {
    size_t ncmds, nholds;
} capstan_txn_mark_t;

/* A new empty transaction owned by the caller, or NULL. */
capstan_txn_t *capstan__txn_new(void);
/* Frees t and its commands without sending them. The locks it holds stay
 * held: release them first (capstan__txn_undo) when the pushes did not happen.
 * NULL is a no-op. */
void capstan__txn_free(capstan_txn_t *t);
/* The number of commands waiting. */
size_t capstan__txn_len(const capstan_txn_t *t);

/* Copies one command into t (lens NULL = strlen). Returns 0 or CAPSTAN_ENOMEM,
 * t unchanged then. */
int capstan__txn_add(capstan_txn_t *t, int argc, const char *const *argv, const size_t *lens);
/* Remembers that jid took the uniqueness lock of digest (copied), to
 * release it if t is not sent. Returns 0 or CAPSTAN_ENOMEM. */
int capstan__txn_hold(capstan_txn_t *t, const char *digest, capstan_lock_type_t type, const char *jid);

capstan_txn_mark_t capstan__txn_mark(const capstan_txn_t *t);
/* Drops the commands added since mark and releases the locks held since
 * then (best effort: a lock Redis cannot release now expires with its
 * TTL or goes to the reaper). */
void capstan__txn_undo(capstan_txn_t *t, capstan_redis_t *r, capstan_txn_mark_t mark);

/* Sends MULTI, t's commands and EXEC in one write, followed by WAIT
 * replicas wait_ms when replicas > 0. Returns 0, CAPSTAN_PUSH_UNREPLICATED
 * (written, but fewer replicas than asked had it within wait_ms, or WAIT
 * got no answer), CAPSTAN_EREPLY (Redis refused the transaction, and nothing
 * was written; or a command failed as it ran, and the others were
 * written) or CAPSTAN_EREDIS (the connection failed: the commands ran all or
 * none, unknown which), with err filled. t is left as it was. */
int capstan__txn_exec(const capstan_txn_t *t, capstan_redis_t *r, int replicas, long wait_ms, char *err);

/* The client's open transaction (capstan_client_begin), or NULL. */
capstan_txn_t *capstan__client_txn(capstan_client_t *c);
/* State with a home (a batch) made through a sharded client lives in one
 * shard: the one c is pinned to (capstan_client_set_shard), else the
 * placing rule's pick of key among every shard. Its index, or -1 without
 * shards. */
long capstan__client_home(capstan_client_t *c, const char *key);
/* Pins c to shard (-1: routed by the rule) and returns the pin it had;
 * does nothing without shards. */
long capstan__client_pin(capstan_client_t *c, long shard);
/* The shard c is pinned to, or -1 (none, or without shards). */
long capstan__client_pinned(const capstan_client_t *c);
/* The first shard whose Redis holds key, trying shard first, then the
 * ones after it in the list; -1 when none does (a shard that cannot be
 * reached counts as not holding it), or without shards. */
long capstan__client_holder(capstan_client_t *c, const char *key, long first);
/* capstan_client_new, which on failure also says why in *code:
 * CAPSTAN_ECONFIG when retrying cannot help (a malformed URL, a password or
 * ACL refused, a Redis Cluster node), CAPSTAN_EREDIS when Redis could not
 * be reached, CAPSTAN_ENOMEM. */
capstan_client_t *capstan__client_open(const char *url, char *err, int *code);

/* Where the pushes of clients made on this thread go instead of Redis: the
 * testing kit's (testing/, capstan/testing.h), or NULL (production). A
 * client made while a sink is set connects nowhere and hands each job its
 * chain accepts to take (payload as it would be pushed, its queue, at 0 or
 * the time it is scheduled for), at the push, in a transaction too;
 * take's nonzero return fails the push with it. */
typedef struct capstan_push_sink {
    int (*take)(void *ud, const char *payload, size_t len, const char *queue, double at);
    void *ud;
} capstan_push_sink_t;
/* Sets this thread's sink (borrowed while clients made under it live),
 * NULL for Redis. */
void capstan__push_sink_set(const capstan_push_sink_t *sink);

#endif
