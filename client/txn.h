/* A client transaction: Redis commands kept until they go out together in
 * one MULTI/EXEC, and the uniqueness locks their pushes took, released when
 * the commands are not sent. Every push goes through one (kiq_client_begin
 * keeps it open until kiq_client_commit); other writes that must land with
 * pushes, such as a batch's own keys, add their commands to the client's
 * open transaction (kiq__client_txn).
 * Not part of the public API. */
#ifndef KIQ_CLIENT_TXN_H
#define KIQ_CLIENT_TXN_H

#include <stddef.h>

#include "kiq/client.h"
#include "kiq/redis.h"
#include "kiq/unique.h"

typedef struct kiq_txn kiq_txn_t;

/* A point to go back to (kiq__txn_undo): what t held when it was taken. */
typedef struct kiq_txn_mark {
    size_t ncmds, nholds;
} kiq_txn_mark_t;

/* A new empty transaction owned by the caller, or NULL. */
kiq_txn_t *kiq__txn_new(void);
/* Frees t and its commands without sending them. The locks it holds stay
 * held: release them first (kiq__txn_undo) when the pushes did not happen.
 * NULL is a no-op. */
void kiq__txn_free(kiq_txn_t *t);
/* The number of commands waiting. */
size_t kiq__txn_len(const kiq_txn_t *t);

/* Copies one command into t (lens NULL = strlen). Returns 0 or KIQ_ENOMEM,
 * t unchanged then. */
int kiq__txn_add(kiq_txn_t *t, int argc, const char *const *argv, const size_t *lens);
/* Remembers that jid took the uniqueness lock of digest (copied), to
 * release it if t is not sent. Returns 0 or KIQ_ENOMEM. */
int kiq__txn_hold(kiq_txn_t *t, const char *digest, kiq_lock_type_t type, const char *jid);

kiq_txn_mark_t kiq__txn_mark(const kiq_txn_t *t);
/* Drops the commands added since mark and releases the locks held since
 * then (best effort: a lock Redis cannot release now expires with its
 * TTL or goes to the reaper). */
void kiq__txn_undo(kiq_txn_t *t, kiq_redis_t *r, kiq_txn_mark_t mark);

/* Sends MULTI, t's commands and EXEC in one write, followed by WAIT
 * replicas wait_ms when replicas > 0. Returns 0, KIQ_PUSH_UNREPLICATED
 * (written, but fewer replicas than asked had it within wait_ms, or WAIT
 * got no answer), KIQ_EREPLY (Redis refused the transaction, and nothing
 * was written; or a command failed as it ran, and the others were
 * written) or KIQ_EREDIS (the connection failed: the commands ran all or
 * none, unknown which), with err filled. t is left as it was. */
int kiq__txn_exec(const kiq_txn_t *t, kiq_redis_t *r, int replicas, long wait_ms, char *err);

/* The client's open transaction (kiq_client_begin), or NULL. */
kiq_txn_t *kiq__client_txn(kiq_client_t *c);

#endif
