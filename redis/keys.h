/* Internal: every Redis key kiq reads or writes, by owner. The names are
 * other programs' formats (Sidekiq, sidekiq-unique-jobs v9,
 * redis_queued_locks), so they must stay byte for byte as they are.
 *
 * A name ending in ':' (or a suffix starting with one) is joined to a queue
 * name, identity or digest with kiq__key(). */
#ifndef KIQ_REDIS_KEYS_H
#define KIQ_REDIS_KEYS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiq/unique_admin.h" /* KIQ_UNIQUE_DIGESTS, _REAPER_KEY, _UPGRADED_KEY */

/* ---- Sidekiq ------------------------------------------------------------ */

#define KIQ_KEY_QUEUE "queue:"              /* + name: list of payloads */
#define KIQ_KEY_QUEUES "queues"             /* set of queue names */
#define KIQ_KEY_SCHEDULE "schedule"         /* zset: payload by run-at time */
#define KIQ_KEY_RETRY "retry"               /* zset: payload by retry time */
#define KIQ_KEY_DEAD "dead"                 /* zset: payload by death time */
#define KIQ_KEY_PROCESSED "stat:processed"  /* counter; + ":" + yyyy-mm-dd per day */
#define KIQ_KEY_FAILED "stat:failed"
#define KIQ_KEY_PROCESSES "processes"       /* set of identities; each a hash */
#define KIQ_KEY_WORK ":work"                /* identity +: hash of running jobs */
#define KIQ_KEY_WORKERS ":workers"          /* the same, for Sidekiq 6.4 readers */
#define KIQ_KEY_SIGNALS "-signals"          /* identity +: list of signals */

/* ---- sidekiq-unique-jobs v9 ----------------------------------------------- */

#define KIQ_KEY_UNIQUE_PREFIX "uniquejobs"  /* the default digest prefix */
/* KIQ_UNIQUE_DIGESTS "uniquejobs:digests": zset of digests by lock time. */
#define KIQ_KEY_LOCKED ":LOCKED"            /* digest +: hash of holder jids */
#define KIQ_KEY_RUN ":RUN"                  /* digest +: the runtime lock's digest */
#define KIQ_KEY_WORKING "uniquejobs:working:"     /* + identity: reliable fetch list */
#define KIQ_KEY_HEARTBEAT "uniquejobs:heartbeat:" /* + identity: liveness */
#define KIQ_KEY_ORPHAN "uniquejobs:orphan:"   /* + identity: recovery's suspect marker */
#define KIQ_KEY_METRICS "uniquejobs:metrics|"     /* + yymmdd|H:MM: counters */
/* v8 keys the upgrade removes or merges. */
#define KIQ_KEY_EXPIRING_DIGESTS "uniquejobs:expiring_digests"
#define KIQ_KEY_UNIQUE_V8_DEAD "uniquejobs:dead"
/* kiq's own, where v9 has no equivalent. */
#define KIQ_KEY_REAPER_RUNNING "kiq:reaper:running" /* one reaper run at a time */
#define KIQ_KEY_REAPER_CURSOR "kiq:reaper:cursor"   /* where the last run stopped */
#define KIQ_KEY_RECOVERY_LEASE "kiq:recovery:lease" /* one orphan recovery at a time */

/* ---- redis_queued_locks ------------------------------------------------------ */

#define KIQ_KEY_QLOCK "rql:lock:"           /* + name: the lock hash */
#define KIQ_KEY_QLOCK_QUEUE "rql:lock_queue:" /* + name: zset of waiting acquirers */
#define KIQ_KEY_QLOCK_SEEN "rql:kiq:seen:"  /* + name: kiq's liveness of waiters */
#define KIQ_KEY_QLOCK_FENCE "rql:fence:"    /* + name: the fencing counter */
#define KIQ_KEY_QLOCK_ANY "rql:lock*"       /* matches locks and their queues */
#define KIQ_QLOCK_ACQ_ID "rql:acq:"         /* acquirer id prefix (not a key) */
#define KIQ_QLOCK_HST_ID "rql:hst:"         /* host id prefix (not a key) */

/* ---- kiq's batches (lua/lib/batch_done.lua) ----------------------------- */

#define KIQ_KEY_BATCH "batch:"             /* + bid: hash; + bid + :jids, :failures */
#define KIQ_KEY_BATCHES "batches"          /* zset: bids by creation time */
#define KIQ_KEY_BATCHES_OPEN "batches:open" /* zset: the bids not succeeded yet */

/* ---- kiq's rate limiters (kiq/limiter.h) ---------------------------------- */

#define KIQ_KEY_LIMITER "limiter:"         /* + name + :meta, :held, :bucket, :sliding,
                                              :leaky, :points, :w:<ms> */

/* a then b into out (n bytes), e.g. kiq__key(k, sizeof(k), KIQ_KEY_QUEUE, name)
 * or kiq__key(k, sizeof(k), digest, KIQ_KEY_LOCKED). Truncates like snprintf. */
static inline void kiq__key(char *out, size_t n, const char *a, const char *b)
{
    snprintf(out, n, "%s%s", a, b);
}

/* a then b, malloc'd to fit (NULL when out of memory): for names of any
 * length (queue names come from payloads, identities from SCAN). */
static inline char *kiq__key_dup(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *k = malloc(la + lb + 1);
    if (k) {
        memcpy(k, a, la);
        memcpy(k + la, b, lb + 1);
    }
    return k;
}

/* The length of key without suffix when key is longer than suffix and ends
 * with it (kiq__key_base("x:RUN", KIQ_KEY_RUN) is 1), else 0. */
static inline size_t kiq__key_base(const char *key, const char *suffix)
{
    size_t len = strlen(key), slen = strlen(suffix);
    return len > slen && strcmp(key + len - slen, suffix) == 0 ? len - slen : 0;
}

#endif
