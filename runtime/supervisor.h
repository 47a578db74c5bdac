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
 * why it leaves, that its run ended (and why, when it failed), and the
 * jids of the jobs each processor started last. The supervisor reads the
 * jids only once it reaped the worker, so it knows which jobs of the dead
 * worker's list had started: the running ones, and the finished ones whose
 * ack was still to ride a round trip. Not part of the public API. */
#ifndef CAPSTAN_RUNTIME_SUPERVISOR_H
#define CAPSTAN_RUNTIME_SUPERVISOR_H

#include <stdatomic.h>

#include "capstan/error.h"

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

/* The board's layout is shared with the binary a reload starts, which may
 * be a newer one under a supervisor still running the older code: its
 * members never move, and what was added since follows the rows, where a
 * worker finds it only when the board's size leaves room for it. */
typedef struct capstan_board {
    char identity[320];     /* written before the worker touches Redis;
                               "" when its working list is empty */
    atomic_int ready;       /* 1 once the worker processes jobs */
    atomic_int leaving;     /* CAPSTAN_LEAVE_*, set before it goes quiet */
    atomic_llong rss;       /* bytes, as the worker last read it */
    int nslots;             /* processors, the rows */
    capstan_board_row_t row[]; /* per processor: the jobs it started last */
} capstan_board_t;

/* After the rows. */
typedef struct capstan_board_end {
    atomic_int ended;       /* 1 once capstan_runtime_run returned: any
                               exit without it is a crash, exit(0) too */
    char reason[CAPSTAN_ERRLEN]; /* why that run failed (its error), or "" */
} capstan_board_end_t;

/* The size of a board of nslots rows. */
static inline size_t capstan__board_size(int nslots)
{
    return sizeof(capstan_board_t) + (size_t)nslots * sizeof(capstan_board_row_t) + sizeof(capstan_board_end_t);
}

/* Where b's end is, or NULL when size (the board's mapped size) has no
 * room for it: a board an older supervisor made. */
static inline capstan_board_end_t *capstan__board_end(capstan_board_t *b, size_t size)
{
    return b && size >= capstan__board_size(b->nslots)
               ? (capstan_board_end_t *)(void *)&b->row[b->nslots] : NULL;
}

/* Notes the job jid started on processor index of a supervised worker's
 * board; a no-op without a board. Any processor thread, for its own index. */
void capstan__board_run(struct capstan_runtime *rt, int index, const char *jid);

#endif
