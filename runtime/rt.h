/* The runtime's own state, shared by the files of runtime/: its threads
 * (processor, housekeeper, scheduler), their slots, the feed and the
 * server chain; and what each file of runtime/ offers the others, the
 * waits and reconnects of rt.c first. */
#ifndef CAPSTAN_RUNTIME_RT_H
#define CAPSTAN_RUNTIME_RT_H

#include <pthread.h>
#include <stdatomic.h>

#include "job/job.h"
#include "fetch/fetch.h"
#include "capstan/redis.h"
#include "capstan/runtime.h"
#include "runtime/notify.h"
#include "capstan/unique.h"
#include "periodic/periodic.h"
#include "runtime/board.h"

/* The most jobs a processor takes at once when their runtime locks can be
 * asked for in one round trip (processor.c). */
#define CAPSTAN_RUN_MAX 16

/* What one processor thread is doing (its functions are in slot.h).
 * Guarded by mu, except that the fatal-signal handler (crash.c) reads
 * busy, cls, jid and tid without it: they are fixed-size copies, so a torn
 * read garbles a name but never reads past them. */
typedef struct capstan_slot {
    pthread_mutex_t mu;
    struct capstan_runtime *rt;
    int index;
    pthread_t thread;
    int started, exited;   /* exited is written under mu */
    char tid[16];
    int busy;
    int abandoned;         /* shutdown gave the job back; do not ack it */
    char *queue;           /* while busy: the running job's own (the */
    char *payload;         /* job owns them until its ack) */
    size_t len;
    long run_at;
    double deadline;       /* capstan__mono() past which the running job
                              breaks its class's hard timeout; 0 = none */
    const struct capstan_class_row *row; /* while deadline is set: the
                              running job's class */
    char cls[128];
    char jid[64];          /* cut to fit, like cls */
    char lock_key[CAPSTAN_DIGEST_MAX + 16]; /* while busy: the runtime lock its
                              job holds (a hard timeout releases it), or "" */
    capstan_fetch_t *fetch;
    /* Jobs the processor took from the feed to run after its current one,
     * in order (a run of short jobs whose runtime locks went in one round
     * trip: see processor.c): views of payloads it owns, for the give-back
     * at a hard stop, which copies them into the feed, takes their locks
     * over and empties the list (the processor then starts none of them).
     * Under mu (and the feed's lock too where the feed changes with it). */
    struct capstan_ahead {
        const char *payload, *queue;
        size_t len;
        unsigned long long seq;
        struct capstan_prelock *pre; /* its runtime lock once asked for (the
                                    processor's), or NULL until then */
    } ahead[CAPSTAN_RUN_MAX - 1];
    size_t nahead;
    int in_run;            /* the processor runs a run (see feed_ahead.c) */
    double run_time;       /* handler time, seconds (moving average), by
                              the processor's thread only */
    struct capstan_run *run; /* a run's state (processor.c), made when first
                              needed; owned by the processor thread */
    /* The processor's second connection, for round trips read after its
     * job (runtime/feed_defer.c), made when first needed; and the one on its
     * way, under the feed's lock. Owned by the processor thread. */
    struct capstan_redis *aux;
    struct pending *pend;
    /* capstan__mono() when the fetch this processor waits for was sent, 0 when
     * none is on its way: its jobs are in the working list before the
     * feed counts them (see capstan__feed_holds). Under the feed's lock. */
    double fetch_sent;
} capstan_slot_t;

typedef struct capstan_handler_entry {
    char *cls;
    capstan_handler_fn fn;
    void *udata;
    char *queue;
    int retry;
    const struct capstan_unique_opts *unique; /* registered uniqueness, or NULL */
    const struct capstan_limit_opts *limit; /* registered rate limit, or NULL */
    double timeout;        /* hard timeout in seconds as registered, 0 =
                              none (the file's wins: capstan_class_row_t) */
} capstan_handler_entry_t;

/* One job class as this process runs it: its handler and the file's
 * classes: entry, with the options both may give merged, the file's
 * winning. Resolved once when the run starts (capstan__classes_resolve);
 * read-only after. */
typedef struct capstan_class_row {
    const char *cls;
    const capstan_handler_entry_t *h;  /* NULL: no handler here */
    const capstan_class_conf_t *cc;    /* the file's entry, or NULL */
    int retry;                         /* CAPSTAN_RETRY_*; UNSET when neither gives it */
    double timeout;                    /* hard timeout in seconds, 0 = none */
    double max_iteration_runtime;      /* the class's, else the setting's */
    const struct capstan_limit_opts *limit; /* rate limit, or NULL */
} capstan_class_row_t;

/* When the scheduler thread should wake, besides its poll: the times that
 * jobs this process put in the schedule set fall due (scheduler.c), so a
 * job rescheduled for a moment's time comes back then rather than at the
 * next poll, seconds later. Under the runtime's wake_mu. */
#define CAPSTAN_SCHED_DUES 32
typedef struct capstan_sched_wake {
    pthread_cond_t cv;     /* the scheduler sleeps on it; capstan__rt_wake
                              and a due sooner than its wake-up signal it */
    double until;          /* epoch s the sleeping scheduler wakes at, 0
                              while it is not asleep */
    int n;
    double due[CAPSTAN_SCHED_DUES]; /* epoch s, unordered */
} capstan_sched_wake_t;

/* One capstan_on_error or capstan_on_death registration. */
typedef struct capstan_hook {
    int death;         /* 0 = error hook */
    capstan_hook_fn fn;
    void *udata;
} capstan_hook_t;

struct capstan_runtime {
    capstan_config_t *cfg;
    capstan_handler_entry_t *handlers;
    size_t nhandlers;
    capstan_class_row_t *rows;     /* the classes registered or in the file */
    size_t nrows;
    capstan_class_row_t no_row;    /* any other class's */
    capstan_retry_conf_t retry;    /* the retry rules' settings, from cfg at start */
    capstan_hook_t *hooks; /* registered before run, read-only after */
    size_t nhooks;
    char error[CAPSTAN_ERRLEN]; /* why the last registration was refused
                                   (capstan_runtime_error), "" if none */
    char identity[320];
    char batch_cursor[32]; /* the housekeeper's walk over batches:open */
    char hostname[256];
    double started_at;
    char *info_json;       /* the process "info" field, built at start */

    atomic_int quiet;      /* stop fetching */
    atomic_int stopping;   /* shutting down (handlers may look) */
    atomic_int stop_req;   /* capstan_runtime_stop or a remote TERM */
    atomic_int quiet_req;
    atomic_long processed, failed;  /* since the last flush */
    atomic_int busy;

    capstan_slot_t *slots;
    int nslots;
    capstan_slot_t *keeper; /* the housekeeper's, for the acks it writes
                               (capstan__feed_ack_late): no processor's */
    pthread_t housekeeper, scheduler, periodic, master_watch;
    capstan_periodic_env_t periodic_env; /* what the periodic thread is given */
    int housekeeper_started, scheduler_started, periodic_started, master_watch_started;
    atomic_int housekeeper_stop;   /* and the master watch's */
    pthread_mutex_t wake_mu;       /* every thread's timed sleep is on wake
                                      (rt.c), which quiet and stop cut short */
    pthread_cond_t wake;
    capstan_sched_wake_t sched_wake; /* under wake_mu */
    int abandoned;
    atomic_int redis_down;         /* a thread cannot reach Redis: one outage
                                      is logged once, not once per thread */
    _Atomic double redis_down_at;  /* capstan__mono() when it was noticed */
    atomic_int fetch_failing;      /* fetches get error replies (logged once,
                                      until one of them works again) */
    atomic_long fetch_errors;      /* error replies to fetches since the last
                                      beat, which reports them (heartbeat.c) */
    char fetch_error[CAPSTAN_ERRLEN]; /* the last one's text, under wake_mu */
    struct capstan_chain *server_chain; /* middleware around every job; built
                                       before the processors start */
    const struct capstan_source *source; /* where the processors take jobs
                                      from (source.h), set at start */
    struct capstan_feed *feed;     /* reliable source: the processors' shared
                                      batch of fetched and finished jobs */
    char **unknown;                /* classes without a handler whose policy
                                      was logged (server_chain.c's lock) */
    size_t nunknown;
    struct capstan_fleet *fleet;   /* the queues Ruby processes read too
                                      (fleet.c); made at start */
    capstan_paused_t *paused;      /* which of its queues are paused (Sidekiq
                                      Pro's "paused" set), read with each
                                      beat (heartbeat.c); made at start */
    struct capstan__qlimits *qlimits; /* the caps of its queues (the file's
                                      limits:, locks/queue_limit.h), made at
                                      start; NULL: none */
    capstan_liveness_t *liveness;  /* its liveness key, refreshed by the
                                      housekeeper and by fetchers when it is
                                      due; made at start */
    struct capstan_board *board;   /* shared with the supervisor
                                      (board.h), NULL when unsupervised */
    struct capstan_board_end *board_end; /* past its rows; NULL also under a
                                      supervisor of an older binary */
    capstan_probe_t own_probe;     /* the probe stamps, unsupervised */
    capstan_probe_t *probe;        /* where the housekeeper writes them: own_probe,
                                      or this worker's in probes */
    capstan_probe_t *probes;       /* under a supervisor, every worker's (by
                                      slot), for the worker that serves the
                                      probes; NULL unsupervised */
    int nprobes;
    int worker_slot;               /* which of the supervisor's workers */
    int supervisor_pid;            /* and the supervisor's pid */
    double clock_said;             /* the clock offset from Redis's last
                                      logged, 0 while it is small (the
                                      beat's, heartbeat.c) */
};

/* rt.c: the waits and reconnects every thread of the runtime goes through. */
/* Sleeps up to s seconds on rt->wake; returns early when woken. */
void capstan__rt_wait(struct capstan_runtime *rt, double s);
/* Wakes every thread sleeping in capstan__rt_wait. */
void capstan__rt_wake(struct capstan_runtime *rt);

/* Connects r, retrying with exponential backoff capped at 5 s until it
 * works (0) or *give_up is set (CAPSTAN_EREDIS; give_up may be NULL). An outage is logged once for the whole
 * process (by the first thread to notice it), and so is the recovery. */
int capstan__rt_connect(struct capstan_runtime *rt, capstan_redis_t *r, atomic_int *give_up);
/* Same with the backoff capped at max_delay seconds. */
int capstan__rt_connect_every(struct capstan_runtime *rt, capstan_redis_t *r, atomic_int *give_up,
                              double max_delay);

/* registry.c */
/* The registered class a mistyped cls most likely means (capstan__nearest),
 * or NULL. */
const char *capstan__registry_nearest(const struct capstan_runtime *rt, const char *cls);
void capstan__registry_free(struct capstan_runtime *rt);
/* Builds rt's class table from its handlers and its config's classes:
 * (again, should it be called again). Returns 0 or CAPSTAN_ENOMEM. */
int capstan__classes_resolve(struct capstan_runtime *rt);
/* cls's row; rt->no_row for a class neither registered nor in the file,
 * or for NULL. */
const capstan_class_row_t *capstan__class_find(const struct capstan_runtime *rt, const char *cls);
/* Run the error hooks (capstan_on_error) for job, failed with cls and msg:
 * called by the retry middleware when the rest of the chain returns. */
void capstan__hooks_error(const struct capstan_runtime *rt, capstan_job_t *job, const char *cls,
                          const char *msg);
/* Run the death hooks (capstan_on_death) for job: called once the ack that
 * wrote it to the dead set succeeded. */
void capstan__hooks_death(const struct capstan_runtime *rt, capstan_job_t *job, const char *cls,
                          const char *msg);

/* processor.c: the thread loop, fetch -> run the server chain -> ack. */
void *capstan__processor_main(void *slot);

/* feed.c: the reliable fetch's batch shared by nslots processors, holding
 * at most prefetch jobs fetched and not started (0: the default, see
 * capstan__feed_default_prefetch). The operations are in feed.h. */
typedef struct capstan_feed capstan_feed_t;
capstan_feed_t *capstan__feed_new(int nslots, int prefetch);
/* The prefetch bound when none is set: ten jobs a processor, 500 at least. */
int capstan__feed_default_prefetch(int nslots);
void capstan__feed_free(capstan_feed_t *feed);
/* The jobs waiting in the feed, fetched and not started, by queue:
 * counts[i] for names[i], i < n (a job of a queue not named is not
 * counted). */
void capstan__feed_count(capstan_feed_t *feed, const char *const *names, long long *counts, size_t n);

/* server_chain.c: runs job through rt->server_chain to its handler on
 * processor s's connection r. mw is filled here and holds the outcome
 * afterwards (disposition, payload to store). held_digest is the lock the
 * fetch saw held by the job's jid, or NULL; prelock the runtime lock asked
 * for before its turn, or NULL. */
struct capstan_mw;
struct capstan_prelock;
void capstan__server_run(capstan_slot_t *s, capstan_redis_t *r, capstan_job_t *job, struct capstan_mw *mw,
                         const char *held_digest, struct capstan_prelock *prelock);
/* Asks for the runtime locks of the fetched jobs got[0..n), about to run
 * in turn on processor s, in one round trip (capstan__unique_prelock); pre[i]
 * is what job i's server chain uses (with prelock). Returns how many of
 * the jobs, from the first, should run so (at least 1): the others go back
 * to the feed. jobs[i], for those, is job i parsed (its payload still
 * got[i]'s), or zeroed when it did not parse. */
size_t capstan__server_prelock(capstan_slot_t *s, capstan_redis_t *r, const capstan_fetched_t *got, size_t n,
                               struct capstan_prelock *pre, capstan_job_t *jobs);

/* fleet.c: which of this process's queues a Ruby Sidekiq process reads
 * too, and so what becomes of a job whose class has no handler here. */
struct capstan_fleet;
/* Makes rt->fleet (nothing shared yet). Returns 0 or CAPSTAN_ENOMEM. */
int capstan__fleet_new(struct capstan_runtime *rt);
void capstan__fleet_free(struct capstan_fleet *f);
/* Reads the process set and each process's info on r, notes the queues of
 * ours a Ruby process reads (and keeps them in Redis), and logs one line
 * when that changes. Any thread, one look at a time. */
void capstan__fleet_look(struct capstan_runtime *rt, capstan_redis_t *r);
/* Whether a Ruby process read queue at one of the looks of the last ten
 * minutes. Any thread. */
int capstan__fleet_shared(const struct capstan_runtime *rt, const char *queue);
/* The unknown_class policy for a job of queue, looking at the fleet again
 * on r when the last look is a second old: the config's when it sets
 * unknown_class, else requeue for a shared queue and, in the process's
 * first minute, for every queue, and the default for the others. *why
 * says why when that is not the config's, else NULL. Any thread. */
capstan_unknown_class_t capstan__unknown_policy(struct capstan_runtime *rt, capstan_redis_t *r, const char *queue,
                                                const char **why);

/* housekeeper.c: the housekeeper thread (liveness, beats, strays,
 * recovery, reaper). */
void *capstan__housekeeper_main(void *rt);
/* One orphan-recovery pass (see capstan__fetch_recover), logged and counted in
 * the metrics. The periodic passes take a fleet-wide lease first; the one
 * at start does not need it (each job moves under a guarded script). */
void capstan__recover_orphans(struct capstan_runtime *rt, capstan_redis_t *r);

/* heartbeat.c: the beat (process record, work hashes, signals, stats,
 * paused queues).
 * Writes one beat now (used at start so the process shows at once), and
 * reads which queues are paused, logging each change. */
int capstan__heartbeat_beat(struct capstan_runtime *rt, capstan_redis_t *r, int final);
/* Flushes the in-memory counters. */
int capstan__stats_flush(struct capstan_runtime *rt, capstan_redis_t *r);
/* (capstan__heartbeat_leave, which the supervisor calls too, is in
 * board.h.) */

/* master_watch.c: the thread that, for a sentinel URL, has every
 * connection leave a replaced master as soon as the sentinels announce the
 * switch (started only then; it stops with the housekeeper). */
void *capstan__master_watch_main(void *rt);

/* scheduler.c */
void *capstan__scheduler_main(void *rt);
/* Due jobs left in retry/schedule because their queue key holds another
 * type than a list: how many, and the first such key (cut to 200 bytes). */
typedef struct capstan_sched_blocked {
    long n;
    char key[208];
} capstan_sched_blocked_t;
/* Moves every due job of "retry" then "schedule" to its queue; returns the
 * number moved or CAPSTAN_EREDIS, with *blocked filled. */
long capstan__scheduler_enqueue_due(capstan_redis_t *r, capstan_ts_format_t ts, double now,
                                    capstan_sched_blocked_t *blocked);
/* Has the scheduler thread move due jobs at epoch time at (or a few ms
 * after), as well as at its polls: called once a job is written to the
 * schedule set at that score. */
void capstan__scheduler_wake_at(struct capstan_runtime *rt, double at);

#endif
