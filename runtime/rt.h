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
#include "fleet/fleet.h"
#include "capstan/redis.h"
#include "capstan/runtime.h"
#include "runtime/notify.h"
#include "capstan/unique.h"
#include "periodic/periodic.h"
#include "runtime/board.h"

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
    int requeue_streak;    /* jobs of unknown classes it requeued in a row,
                              with no job run between them: when only those
                              come, capstan may be the only reader of the
                              queue and would fetch them again and again
                              (server_chain.c). The processor thread's. */
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
    struct capstan_seat *seat; /* its part of the feed (reliable source),
                              else NULL */
    double run_time;       /* handler time, seconds (moving average), by
                              the processor's thread only */
    struct capstan_run *run; /* a run's state (processor.c), made when first
                              needed; owned by the processor thread */
    struct capstan_done_pool *dones; /* its finished records for reuse
                              (feed.h), made by the processor thread */
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

/* The class table, built before the run starts by the thread that
 * registers (capstan_register, capstan_on_error/death) and then resolves it
 * (capstan__classes_resolve, at start); read by every thread after, with
 * no lock since nothing writes it once the processors run. */
typedef struct capstan_rt_classes {
    capstan_handler_entry_t *handlers;
    size_t nhandlers;
    capstan_class_row_t *rows;     /* the classes registered or in the file */
    size_t nrows;
    capstan_class_row_t no_row;    /* any other class's */
    capstan_retry_conf_t retry;    /* the retry rules' settings, from cfg at start */
    capstan_hook_t *hooks;
    size_t nhooks;
    char error[CAPSTAN_ERRLEN];    /* why the last registration was refused
                                      (capstan_runtime_error), "" if none */
} capstan_rt_classes_t;

/* Who this process is to Sidekiq: written by the main thread, in
 * capstan_runtime_new and at start (a supervised worker's identity when it
 * joins its board), before any other thread runs; read-only after. */
typedef struct capstan_rt_self {
    char identity[320];
    char hostname[256];
    double started_at;
    char *info_json;               /* the process "info" field, built at start */
} capstan_rt_self_t;

/* How Redis answers, as every thread sees it: written by any thread, with
 * atomics (fetch_error under the runtime's wake_mu), so that an outage or
 * failing fetches are logged once for the process; clock_said by the beat
 * alone (heartbeat.c: on the main thread at start, then the housekeeper's). */
typedef struct capstan_rt_health {
    atomic_int redis_down;         /* a thread cannot reach Redis */
    _Atomic double redis_down_at;  /* capstan__mono() when it was noticed */
    atomic_int fetch_failing;      /* fetches get error replies (logged once,
                                      until one of them works again) */
    atomic_long fetch_errors;      /* error replies to fetches since the last
                                      beat, which reports them (heartbeat.c) */
    char fetch_error[CAPSTAN_ERRLEN]; /* the last one's text */
    double clock_said;             /* the clock offset from Redis's last
                                      logged, 0 while it is small */
} capstan_rt_health_t;

/* The link to the supervisor (board.h): set by the main thread at start,
 * before the other threads run; after that the board's fields are atomics
 * of their own, and the probe stamps are written by the housekeeper alone. */
typedef struct capstan_rt_link {
    struct capstan_board *board;   /* shared with the supervisor, NULL when
                                      unsupervised */
    struct capstan_board_end *board_end; /* past its rows; NULL also under a
                                      supervisor of an older binary */
    capstan_probe_t own_probe;     /* the probe stamps, unsupervised */
    capstan_probe_t *probe;        /* where the housekeeper writes them: own_probe,
                                      or this worker's in probes */
    capstan_probe_row_t *probes;   /* under a supervisor, every worker's
                                      (board.h), for the worker that serves
                                      the probes; NULL unsupervised */
    int nprobes;
    int probe_row;                 /* this worker's row in probes */
    int worker_slot;               /* which of the supervisor's workers */
    const char *quarantine;        /* the queue suspects go to (a worker
                                      under a supervisor that runs them in
                                      its quarantine worker; board_end is
                                      set then), NULL: they run here alone */
    int quarantine_worker;         /* this is the supervisor's quarantine
                                      worker: its jobs' queues are the ones
                                      their payloads name */
    int supervisor_pid;            /* and the supervisor's pid */
} capstan_rt_link_t;

/* What this process knows of the fleet and of its own queues and liveness.
 * fleet, paused and liveness are made by the main thread at start, and
 * are then safe for any thread on their own (fleet/fleet.c's lock, the
 * atomics of fetch/paused.c and fetch/liveness.c): paused is read anew
 * with each beat, liveness refreshed by the housekeeper and by fetchers
 * when due. unknown, the classes without a handler whose policy was
 * logged, is written by any processor under unknown_mu. */
typedef struct capstan_rt_view {
    pthread_mutex_t unknown_mu;    /* taken once per job without a handler */
    char **unknown;
    size_t nunknown;
    capstan_fleet_t *fleet;        /* the queues Ruby processes read too */
    capstan_paused_t *paused;      /* which of its queues are paused (Sidekiq
                                      Pro's "paused" set) */
    capstan_liveness_t *liveness;  /* its liveness key */
    struct capstan__qlimits *qlimits; /* the caps of its queues (the file's
                                      limits:, locks/queue_limit.h); NULL:
                                      none */
} capstan_rt_view_t;

/* The main thread's: what capstan_runtime_stop/quiet and remote signals ask
 * of it (any thread sets them, atomically), and how many running jobs its
 * shutdown gave up waiting for (written by it alone). */
typedef struct capstan_rt_ctl {
    atomic_int stop_req;           /* capstan_runtime_stop or a remote TERM */
    atomic_int quiet_req;
    int abandoned;
} capstan_rt_ctl_t;

/* The housekeeper thread's own state. The main thread starts and joins it
 * (thread, started) and makes slot; the rest is the housekeeper's alone. */
typedef struct capstan_keeper {
    pthread_t thread;
    int started;
    capstan_slot_t *slot;          /* for the acks it writes
                                      (capstan__feed_ack_late): no processor's */
    char batch_cursor[32];         /* its walk over batches:open */
    long last_left;                /* jobs the last orphan pass left in dead
                                      processes' lists because their queue
                                      key held another type: reported when
                                      that changes. The passes run one at a
                                      time, at start (on the main thread,
                                      before the housekeeper starts), then
                                      in the housekeeper */
    long passes;                   /* orphan passes made (the same threads;
                                      capstan__fetch_recover_full_due) */
    long late_said;                /* the late acks its log has told of */
} capstan_keeper_t;

/* The scheduler thread's, the periodic thread's and the master watch's:
 * each written by the main thread, which starts and joins it; the periodic
 * thread reads env, which outlives it. (The scheduler's wake-ups are
 * rt->sched_wake, which other threads write.) */
typedef struct capstan_sched {
    pthread_t thread;
    int started;
} capstan_sched_t;
typedef struct capstan_rt_periodic {
    pthread_t thread;
    int started;
    capstan_periodic_env_t env;    /* what the periodic thread is given */
} capstan_rt_periodic_t;
typedef struct capstan_watch {
    pthread_t thread;
    int started;
} capstan_watch_t;

/* Which runtime of a sharded process this is (runtime/shards.h): the
 * front (index 0), the one the program made and runs, or the member of
 * shard index, which the front makes and frees. Written before the
 * member's threads start; state and rc after by its start thread. */
typedef struct capstan_rt_member {
    struct capstan_shards *group;  /* every member; NULL without shards */
    size_t index;
    capstan_redis_t *r;            /* a member's own main connection (its
                                      start, then the front's shutdown) */
    pthread_t start;               /* its start thread (shards.c) */
    int start_started;
    atomic_int state;              /* CAPSTAN_MEMBER_* (shards.h) */
    capstan_config_t *ticks;       /* the front's: shard 0's config, whose
                                      schedules its periodic thread ticks
                                      (a member's are in its own cfg) */
    struct capstan_metrics *metrics; /* with shards, this member's series
                                      alone: /metrics serves them with
                                      its shard's label, and Sidekiq's
                                      execution metrics are taken from
                                      it (the shard's Metrics tab) */
    int rc;                        /* why its start failed, with err */
    char err[CAPSTAN_ERRLEN];
} capstan_rt_member_t;

/* What every thread of the runtime shares, then one member per owner. */
struct capstan_runtime {
    capstan_config_t *cfg;         /* read-only once the run starts */
    capstan_rt_classes_t classes;
    capstan_rt_self_t self;

    atomic_int quiet;              /* stop fetching */
    atomic_int stopping;           /* shutting down (handlers may look) */
    atomic_long processed, failed; /* since the last flush */
    atomic_int busy;

    capstan_slot_t *slots;         /* the processors', made at start */
    int nslots;
    atomic_int housekeeper_stop;   /* stops the housekeeper and the master
                                      watch, and the acks written at the end
                                      give up on it too */
    pthread_mutex_t wake_mu;       /* every thread's timed sleep is on wake
                                      (rt.c), which quiet and stop cut short */
    pthread_cond_t wake;
    capstan_sched_wake_t sched_wake; /* under wake_mu: any thread that puts a
                                      job in the schedule set writes it */
    struct capstan_chain *server_chain; /* middleware around every job; built
                                      before the processors start */
    const struct capstan_source *source; /* where the processors take jobs
                                      from (source.h), set at start */
    struct capstan_feed *feed;     /* reliable source: the processors' shared
                                      batch of fetched and finished jobs */

    capstan_rt_health_t health;
    capstan_rt_link_t link;
    capstan_rt_view_t view;
    capstan_rt_ctl_t ctl;
    capstan_keeper_t keeper;
    capstan_sched_t sched;
    capstan_rt_periodic_t periodic;
    capstan_watch_t watch;
    capstan_rt_member_t member;
};

/* rt.c: the waits and reconnects every thread of the runtime goes through. */
/* Sleeps up to s seconds on rt->wake; returns early when woken. */
/* The queue to parse the fetched job got as of (capstan__job_init's): the
 * one it was fetched from, but in the quarantine worker the one its
 * payload names (NULL), which its retry, its requeue and its metrics keep. */
static inline const char *capstan__rt_job_queue(const struct capstan_runtime *rt, const capstan_fetched_t *got)
{
    return rt->link.quarantine_worker ? NULL : got->queue;
}

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

/* The registry what rt does is counted in (its jobs, fetches, reconnects,
 * recovery, clock offset; observe/prometheus.h states the rule): with
 * shards its member's own (rt->member.metrics, served with its shard's
 * label), else the process's. */
struct capstan_metrics *capstan__rt_metrics(struct capstan_runtime *rt);
/* A job of class cls (raw: its handler's registered name, or NULL) ran
 * for seconds, failed or not: counted in capstan__rt_metrics(rt). */
void capstan__rt_job_metrics(struct capstan_runtime *rt, const char *cls, const char *queue, double seconds,
                             int failed, const char *raw);

/* registry.c */
/* The registered class a mistyped cls most likely means (capstan__nearest),
 * or NULL. */
const char *capstan__registry_nearest(const struct capstan_runtime *rt, const char *cls);
void capstan__registry_free(struct capstan_runtime *rt);
/* Builds rt's class table from its handlers and its config's classes:
 * (again, should it be called again). Returns 0 or CAPSTAN_ENOMEM. */
int capstan__classes_resolve(struct capstan_runtime *rt);
/* cls's row; rt->classes.no_row for a class neither registered nor in the file,
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

/* server_chain.c: runs job through rt->server_chain to its handler on
 * processor s's connection r, leaving the outcome in *out (zeroed by the
 * caller; disposition, payload to store, lock to release). held_digest is
 * the lock the fetch saw held by the job's jid, or NULL; prelock the
 * runtime lock asked for before its turn, or NULL. */
struct capstan_outcome;
struct capstan_prelock;
void capstan__server_run(capstan_slot_t *s, capstan_redis_t *r, capstan_job_t *job, struct capstan_outcome *out,
                         const char *held_digest, struct capstan_prelock *prelock);
/* The same without a processor, for the testing kit (capstan/testing.h):
 * rt's classes resolved and its chain built, r a connection the chain's
 * middleware may use (never reconnected here), job->redis what the handler
 * gets. A class without a handler fails with NameError, as under
 * unknown_class: fail. */
void capstan__server_run_bare(struct capstan_runtime *rt, capstan_redis_t *r, capstan_job_t *job,
                              struct capstan_outcome *out);
/* Asks for the runtime locks of the fetched jobs got[0..n), about to run
 * in turn on processor s, in one round trip (capstan__unique_prelock); pre[i]
 * is what job i's server chain uses (with prelock). Returns how many of
 * the jobs, from the first, should run so (at least 1): the others go back
 * to the feed. jobs[i], for those, is job i parsed (its payload still
 * got[i]'s), or zeroed when it did not parse. */
size_t capstan__server_prelock(capstan_slot_t *s, capstan_redis_t *r, const capstan_fetched_t *got, size_t n,
                               struct capstan_prelock *pre, capstan_job_t *jobs);

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
