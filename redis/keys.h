/* Internal: every Redis key capstan reads or writes, by owner. The names are
 * other programs' formats (Sidekiq, sidekiq-unique-jobs v9,
 * redis_queued_locks), so they must stay byte for byte as they are.
 *
 * A name ending in ':' (or a suffix starting with one) is joined to a queue
 * name, identity or digest with capstan__key(). */
#ifndef CAPSTAN_REDIS_KEYS_H
#define CAPSTAN_REDIS_KEYS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Sidekiq ------------------------------------------------------------ */

#define CAPSTAN_KEY_QUEUE "queue:"          /* + name: list of payloads */
#define CAPSTAN_KEY_QUEUES "queues"         /* set of queue names */
#define CAPSTAN_KEY_SCHEDULE "schedule"     /* zset: payload by run-at time */
#define CAPSTAN_KEY_RETRY "retry"           /* zset: payload by retry time */
#define CAPSTAN_KEY_DEAD "dead"             /* zset: payload by death time */
#define CAPSTAN_KEY_PROCESSED "stat:processed" /* counter; + ":" + yyyy-mm-dd per day */
#define CAPSTAN_KEY_FAILED "stat:failed"
#define CAPSTAN_KEY_PROCESSES "processes"   /* set of identities; each a hash */
#define CAPSTAN_KEY_WORK ":work"            /* identity +: hash of running jobs */
#define CAPSTAN_KEY_WORKERS ":workers"      /* the same, for Sidekiq 6.4 readers */
#define CAPSTAN_KEY_ITERATION "it-"         /* + jid: an iterable job's state (Sidekiq 7.3+) */
#define CAPSTAN_ITERATION_TTL 2592000       /* seconds it-<jid> lives: 30 days, as Sidekiq */
#define CAPSTAN_KEY_SIGNALS "-signals"      /* identity +: list of signals */
#define CAPSTAN_KEY_PAUSED "paused"         /* Sidekiq Pro: set of paused queue
                                               names (without "queue:") */

/* ---- sidekiq-unique-jobs v9 ----------------------------------------------- */

#define CAPSTAN_KEY_UNIQUE_PREFIX "uniquejobs" /* the default digest prefix */
#define CAPSTAN_UNIQUE_DIGESTS "uniquejobs:digests" /* zset of digests by lock time */
#define CAPSTAN_KEY_LOCKED ":LOCKED"        /* digest +: hash of holder jids */
#define CAPSTAN_KEY_RUN ":RUN"              /* digest +: the runtime lock's digest */
#define CAPSTAN_KEY_WAITING ":WAITING"      /* lock +: zset of waiting jids by arrival
                                               (capstan's: v9 never waits) */
#define CAPSTAN_KEY_WAKE ":WAKE"            /* lock +: list the waiters block on */
#define CAPSTAN_KEY_FREED ":FREED"          /* digest +: when a unique_for job let its lock
                                               go (capstan's: epoch s, TTL unique_for) */
#define CAPSTAN_KEY_WORKING "uniquejobs:working:" /* + identity: reliable fetch list */
#define CAPSTAN_KEY_HEARTBEAT "uniquejobs:heartbeat:" /* + identity: liveness */
#define CAPSTAN_KEY_ORPHAN "uniquejobs:orphan:" /* + identity: recovery's suspect marker */
#define CAPSTAN_KEY_METRICS "uniquejobs:metrics|" /* + yymmdd|H:MM: counters */
#define CAPSTAN_UNIQUE_REAPER_KEY "uniquejobs:reaper" /* the fleet's reaper role */
#define CAPSTAN_UNIQUE_UPGRADED_KEY "uniquejobs:live:UPGRADED" /* the v8 -> v9 migration's marker */
/* v8 keys the upgrade removes or merges. */
#define CAPSTAN_KEY_EXPIRING_DIGESTS "uniquejobs:expiring_digests"
#define CAPSTAN_KEY_UNIQUE_V8_DEAD "uniquejobs:dead"
/* capstan's own, where v9 has no equivalent. */
#define CAPSTAN_KEY_REAPER_RUNNING "capstan:reaper:running" /* one reaper run at a time */
#define CAPSTAN_KEY_REAPER_CURSOR "capstan:reaper:cursor" /* where the last run stopped */
#define CAPSTAN_KEY_WORKING_SET "capstan:working" /* set of identities whose working
                                        lists the fast recovery pass looks at */
#define CAPSTAN_KEY_RECOVERY_LEASE "capstan:recovery:lease" /* one orphan recovery at a time */
#define CAPSTAN_KEY_RUBY_READ "capstan:ruby:" /* + queue name: when a capstan last saw a
                                              Ruby process read it (epoch s; lives 10 min) */
#define CAPSTAN_KEY_PERIODIC "capstan:periodic:" /* + schedule name: hash of its last
                                                  tick (last, sig) */

/* ---- redis_queued_locks ------------------------------------------------------ */

#define CAPSTAN_KEY_QLOCK "rql:lock:"       /* + name: the lock hash */
#define CAPSTAN_KEY_QLOCK_QUEUE "rql:lock_queue:" /* + name: zset of waiting acquirers */
#define CAPSTAN_KEY_QLOCK_SEEN "rql:capstan:seen:" /* + name: capstan's liveness of waiters */
#define CAPSTAN_KEY_QLOCK_FENCE "rql:fence:" /* + name: the fencing counter */
#define CAPSTAN_KEY_QLOCK_ANY "rql:lock*"   /* matches locks and their queues */
#define CAPSTAN_QLOCK_ACQ_ID "rql:acq:"     /* acquirer id prefix (not a key) */
#define CAPSTAN_QLOCK_HST_ID "rql:hst:"     /* host id prefix (not a key) */

/* ---- capstan's batches (lua/lib/batch_done.lua) ----------------------------- */

#define CAPSTAN_KEY_BATCH "batch:"         /* + bid: hash; + bid + :jids, :failures */
#define CAPSTAN_KEY_BATCHES "batches"      /* zset: bids by creation time */
#define CAPSTAN_KEY_BATCHES_OPEN "batches:open" /* zset: the bids not succeeded yet */

/* ---- capstan's rate limiters (capstan/limiter.h) ---------------------------------- */

#define CAPSTAN_KEY_LIMITER "limiter:"     /* + name + :meta, :held, :bucket, :sliding,
                                              :leaky, :points, :w:<ms> */

/* a then b into out (n bytes), e.g. capstan__key(k, sizeof(k), CAPSTAN_KEY_QUEUE, name)
 * or capstan__key(k, sizeof(k), digest, CAPSTAN_KEY_LOCKED). Truncates like snprintf. */
static inline void capstan__key(char *out, size_t n, const char *a, const char *b)
{
    snprintf(out, n, "%s%s", a, b);
}

/* a then b, malloc'd to fit (NULL when out of memory): for names of any
 * length (queue names come from payloads, identities from SCAN). */
static inline char *capstan__key_dup(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *k = malloc(la + lb + 1);
    if (k) {
        memcpy(k, a, la);
        memcpy(k + la, b, lb + 1);
    }
    return k;
}

/* key with its suffix replaced by with, malloc'd (capstan__key_swap_dup(
 * "d:RUN:LOCKED", CAPSTAN_KEY_LOCKED, CAPSTAN_KEY_WAKE) is "d:RUN:WAKE"); NULL
 * when key does not end with suffix or out of memory. */
static inline char *capstan__key_swap_dup(const char *key, const char *suffix, const char *with)
{
    size_t len = strlen(key), slen = strlen(suffix), wlen = strlen(with);
    if (len < slen || strcmp(key + len - slen, suffix) != 0)
        return NULL;
    char *k = malloc(len - slen + wlen + 1);
    if (k) {
        memcpy(k, key, len - slen);
        memcpy(k + len - slen, with, wlen + 1);
    }
    return k;
}

/* The length of key without suffix when key is longer than suffix and ends
 * with it (capstan__key_base("x:RUN", CAPSTAN_KEY_RUN) is 1), else 0. */
static inline size_t capstan__key_base(const char *key, const char *suffix)
{
    size_t len = strlen(key), slen = strlen(suffix);
    return len > slen && strcmp(key + len - slen, suffix) == 0 ? len - slen : 0;
}

#endif
