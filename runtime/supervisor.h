/* The supervisor: `capstan run` loads the config and the plugins once, then
 * forks the worker processes (processes:) and watches them. It runs no jobs
 * and holds no Redis connection or thread across a fork. When a worker
 * dies it knows for certain (it reaped it), so it puts the worker's jobs
 * back at once and starts a replacement; it forwards the signals to every
 * worker, and replaces a worker that leaves on its own (a hard timeout,
 * max_memory) or, on HUP, every worker in turn.
 *
 * A worker and its supervisor share a board: a little shared memory made
 * before the fork, in which the worker writes its identity, its readiness,
 * why it leaves, and the jids of the jobs each processor started last. The
 * supervisor reads the jids only once it reaped the worker, so it knows
 * which jobs of the dead worker's list had started: the running ones, and
 * the finished ones whose ack was still to ride a round trip. Not part of
 * the public API. */
#ifndef CAPSTAN_RUNTIME_SUPERVISOR_H
#define CAPSTAN_RUNTIME_SUPERVISOR_H

#include <stdatomic.h>

struct capstan_runtime;

/* Why a worker leaves of its own accord (the board's leaving). */
enum {
    CAPSTAN_LEAVE_NONE = 0,
    CAPSTAN_LEAVE_TIMEOUT = 1, /* a job ran over its class's timeout */
    CAPSTAN_LEAVE_MEMORY = 2,  /* its RSS went over max_memory */
};

#define CAPSTAN_BOARD_JID 64
/* The jids a processor's row keeps: more than its acks still to be
 * written can be (a run of CAPSTAN_RUN_MAX jobs and the ones before). */
#define CAPSTAN_BOARD_RING 32

typedef struct capstan_board_row {
    unsigned next;          /* where the next start goes, mod the ring */
    char jid[CAPSTAN_BOARD_RING][CAPSTAN_BOARD_JID]; /* "" unused */
} capstan_board_row_t;

typedef struct capstan_board {
    char identity[320];     /* written before the worker touches Redis */
    atomic_int ready;       /* 1 once the worker processes jobs */
    atomic_int leaving;     /* CAPSTAN_LEAVE_*, set before it goes quiet */
    atomic_llong rss;       /* bytes, as the worker last read it */
    int nslots;             /* processors, the rows */
    capstan_board_row_t row[]; /* per processor: the jobs it started last */
} capstan_board_t;

/* Runs the supervisor for rt (config read, plugins loaded, nothing
 * connected). Returns twice, as fork does: in the supervisor once every
 * worker has ended, with *worker 0 and the exit status (0, or the status a
 * worker that could not start exited with, such as CAPSTAN_EXIT_CONFIG); in
 * each worker with *worker 1 and 0, rt made that worker's (its own
 * identity and board): the caller then runs capstan_runtime_run(rt) and
 * exits. argv[1..argc) are `capstan run`'s arguments, which a reload
 * (HUP) passes to the binary on disk. */
int capstan__supervise(struct capstan_runtime *rt, int argc, char **argv, int *worker);

/* The environment variable through which a worker started by a reload
 * (the binary on disk, with `capstan run`'s arguments argv[1..argc))
 * finds its board. */
#define CAPSTAN_WORKER_ENV "CAPSTAN_WORKER"

/* In a process started so (CAPSTAN_WORKER_ENV set), after it read its
 * configuration and loaded its plugins: makes rt that worker's, as
 * capstan__supervise does for a forked one. Returns 0, or CAPSTAN_EINVAL /
 * CAPSTAN_ESYS with err filled. */
int capstan__supervised(struct capstan_runtime *rt, char *err);

/* Notes the job jid started on processor index of a supervised worker's
 * board; a no-op without a board. Any processor thread, for its own index. */
void capstan__board_run(struct capstan_runtime *rt, int index, const char *jid);

#endif
