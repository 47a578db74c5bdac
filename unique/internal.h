/* What the uniqueness files share: the options of one job resolved from
 * its payload, its class and its registration, whose lock_args are Ruby's
 * JSON (ruby_json.h). Not public. */
#ifndef CAPSTAN_UNIQUE_INTERNAL_H
#define CAPSTAN_UNIQUE_INTERNAL_H

#include "capstan/unique.h"
#include "redis/keys.h"
#include "redis/scripts.h"
#include "unique/ruby_json.h"

/* The longest lock_ttl or lock_timeout: a longer one is cut to this, so
 * that seconds times 1000 and the extension by a schedule never overflow. */
#define CAPSTAN_UNIQUE_MAX_SECONDS (10L * 365 * 86400)

/* lock.lua's "earlier waiters go first" (never leaves the module). */
#define CAPSTAN_UNIQUE_NOT_YET (-100)

struct capstan_mw;

/* lock_args: the elements of the args array at the given indexes (skipping
 * indexes past its end), or all of args when idx is NULL, as Ruby JSON.
 * Returns a string owned by the caller, or NULL when args is not an array. */
char *capstan__unique_lock_args(const char *args, size_t len, const int *idx, size_t nidx);

/* True when s can be used as a digest a client wrote: "<prefix>:<rest>",
 * both non-empty, printable ASCII without spaces, short enough for a key.
 * The hex part is not checked: a Ruby client's digest is trusted as is. */
int capstan__unique_digest_valid(const char *s);

typedef struct capstan_unique_spec {
    capstan_lock_type_t type;
    long ttl, timeout;
    int limit;
    char prefix[128];
    capstan_on_conflict_t client, server;
    int across_queues, across_workers;
    capstan_digest_alg_t alg;
    double schedule_in;
    char digest[CAPSTAN_DIGEST_MAX]; /* base digest (no :RUN) */
    int digest_from_payload;      /* trusted as the client wrote it */
    int unique_for;               /* Enterprise's unique_for, the payload's or the class's */
    char *lock_args;              /* owned: Ruby JSON */
} capstan_unique_spec_t;

/* Resolves the options of mw's job: the payload's fields win over the
 * class's YAML options, which win over its registered (or push) options.
 * Bad values are logged and fall back (an unknown lock type: no lock).
 * compute_digest: also fill digest (from a valid payload lock_digest, else
 * computed). Returns 0 (type CAPSTAN_LOCK_NONE when the job is not unique) or
 * a CAPSTAN_E* code with err filled; free with capstan_unique__spec_clear. */
int capstan_unique__resolve(struct capstan_mw *mw, capstan_unique_spec_t *s, int compute_digest, char *err);
void capstan_unique__spec_clear(capstan_unique_spec_t *s);

/* "<digest>[:RUN]<suffix>" into out. */
void capstan_unique__key(char *out, size_t n, const char *digest, int runtime, const char *suffix);
/* Sends ncalls script calls in a round trip the runtime makes anyway (it
 * writes the acks waiting); each call's reply is left in it, NULL when the
 * connection failed. Returns 0 or CAPSTAN_EREDIS. */
typedef int (*capstan_ride_fn)(void *ud, capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls);

/* capstan_unique_lock (no wait), its call sent through ride when not NULL. */
int capstan_unique__lock_ride(capstan_redis_t *r, const capstan_lock_req_t *req, capstan_ride_fn ride,
                              void *ud, char *err);

/* capstan_unique_lock_wait, calling waiting(ud) once when the lock is
 * refused and a wait begins: the runtime writes the acks of finished jobs then,
 * which would otherwise wait with it. */
int capstan_unique__lock_wait_then(capstan_redis_t *r, const capstan_lock_req_t *req, double timeout,
                                   void (*waiting)(void *), void *ud, char *err);

/* until_and_while_executing's start: jid's hold on the until-lock of
 * req->digest goes and the runtime lock req is taken, in one round trip
 * (through ride when not NULL). *released is capstan_unique_unlock's result for
 * the until-lock (err says why when it failed); the runtime lock is given
 * back at once when it was taken but the release was refused. Returns the
 * runtime lock's result, as capstan_unique_lock. */
int capstan_unique__swap_ride(capstan_redis_t *r, const capstan_lock_req_t *req, capstan_ride_fn ride, void *ud,
                              int *released, char *err);

/* The runtime locks reqs[0..n) in one round trip through ride, each as
 * capstan_unique__swap_ride when pre[i]->type is until_and_while_executing,
 * else as capstan_unique__lock_ride; the results go into pre[i] (asked set,
 * and meta for until_and_while_executing). */
struct capstan_prelock;
void capstan_unique__lock_many(capstan_redis_t *r, const capstan_lock_req_t *reqs,
                               struct capstan_prelock *const *pre, size_t n, capstan_ride_fn ride, void *ud);

/* Where this thread's locks are kept instead of Redis: the testing kit's
 * memory (testing/, capstan/testing.h), or NULL (production). lock answers
 * as capstan_unique_lock, unlock as capstan_unique_unlock (force: whatever
 * the type). With a store nothing waits: lock_timeout is one attempt. */
typedef struct capstan_lock_store {
    int (*lock)(void *ud, const capstan_lock_req_t *req);
    int (*unlock)(void *ud, const char *digest, int runtime, const char *jid, capstan_lock_type_t type,
                  int force);
    void *ud;
} capstan_lock_store_t;
/* Sets this thread's store (borrowed until set again), NULL for Redis. */
void capstan__lock_store_set(const capstan_lock_store_t *store);

/* Counts a lock event in v9's metrics, when the metrics module is linked. */
void capstan_unique__metric(capstan_redis_t *r, capstan_lock_type_t t, const char *event);

#endif
