/* The board a supervised worker shares with its supervisor (supervisor/):
 * a little shared memory made before the fork, in which the worker writes
 * its identity, its readiness, why it leaves, that its run ended (and why,
 * when it failed), and the jids of the jobs each processor started last.
 * The supervisor reads the jids only once it reaped the worker, so it
 * knows which jobs of the dead worker's list had started: the running
 * ones, and the finished ones whose ack was still to ride a round trip.
 *
 * Both sides include this header: the layout below, the worker's writes
 * (board.c; each a no-op in a worker without a board), and the few calls
 * the supervisor makes into the worker's runtime. Not part of the public
 * API. */
#ifndef CAPSTAN_RUNTIME_BOARD_H
#define CAPSTAN_RUNTIME_BOARD_H

#include <stdatomic.h>
#include <stddef.h>

#include "capstan/config.h"
#include "capstan/error.h"
#include "capstan/redis.h"

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
    atomic_int quarantined; /* 1 once the worker moved a suspect to the
                               quarantine: the supervisor then starts the
                               quarantine worker */
} capstan_board_end_t;

/* The queue a supervised worker moves a job recovered after a crash to (a
 * suspect: see feed/gate.c), instead of running it alone and idling its
 * other threads meanwhile: queue:capstan:quarantine, which only the
 * supervisor's quarantine worker reads, one job at a time. Never in the
 * "queues" set, so Sidekiq's Web UI lists no such queue. */
#define CAPSTAN_QUARANTINE "capstan:quarantine"

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

/* What a process's probes (/livez, /readyz on the metrics port) judge a
 * worker by: stamps its housekeeper thread writes, in capstan__mono()'s
 * clock, which every process of the host shares. Under a supervisor they
 * sit in memory all its workers map, so the one serving the port judges
 * every worker. */
typedef struct capstan_probe {
    _Atomic double turn;     /* the housekeeper's loop last came round; 0
                                while it waits on Redis, which is not stuck */
    _Atomic double asked;    /* the running beat's round trips started; 0
                                when no beat runs */
    _Atomic double answered; /* Redis last answered a beat; 0: not yet */
    atomic_int fetch_failing; /* fetches got error replies at the last beat */
    atomic_int quiet;        /* fetching stopped (quiet or stopping) */
    _Atomic double beat;     /* heartbeat_interval */
} capstan_probe_t;

/* Seconds a beat may wait for Redis before the worker is not ready. */
#define CAPSTAN_PROBE_STALL 1.0
/* Turns of the housekeeper's loop (each at least once a beat) that may
 * be missed, outside waits on Redis, before the worker counts as stuck. */
#define CAPSTAN_PROBE_BEATS 3

/* Whether p's worker is alive (ready 0) or ready (ready 1) at now; when it
 * is not, why says so. Returns 1 or 0. */
int capstan__probe_judge(const capstan_probe_t *p, int ready, double now, char *why, size_t n);

/* The shards of a worker whose stamps the other workers see. */
#define CAPSTAN_PROBE_SHARDS 64
#define CAPSTAN_PROBE_NAME 64

/* Under a supervisor, one worker's stamps, in a table of a row for each
 * worker it may run at once, made before its first fork and mapped by
 * every worker: so the worker serving the port judges each of them by
 * each of its shards. */
typedef struct capstan_probe_row {
    atomic_int serving;      /* the supervisor's: 1 while the worker is ready
                                and not leaving, the only time it is judged */
    atomic_int slot;         /* the supervisor's: which worker it is */
    atomic_int shards;       /* the worker's: how many of shard[] it writes,
                                0 until it does (a binary without them) */
    capstan_probe_t shard[CAPSTAN_PROBE_SHARDS];
    char name[CAPSTAN_PROBE_SHARDS][CAPSTAN_PROBE_NAME]; /* each shard's, ""
                                without shards */
} capstan_probe_row_t;

/* Whether every serving worker of rows[nrows] but row self is alive or
 * ready (as capstan__probe_judge) by every shard it writes; when one is
 * not, why names it ("worker 1: shard s2: ..."). Returns 1 or 0. */
int capstan__probe_judge_rows(const capstan_probe_row_t *rows, int nrows, int self, int ready, double now,
                              char *why, size_t n);
/* Whether row self's worker does not serve while another worker serves
 * its slot (in a reload, the old one leaving, or its successor not ready
 * yet): the one serving is judged in its stead. */
int capstan__probe_replaced(const capstan_probe_row_t *rows, int nrows, int self);

/* The worker's side. */
/* Makes rt the worker of board (size bytes mapped) in the supervisor's
 * slot, under the supervisor of pid supervisor: a new identity of its
 * own, written on the board before the worker touches Redis. A worker
 * other than the quarantine one (quarantine 0) moves suspects to
 * CAPSTAN_QUARANTINE, when the board has room to say so; the quarantine
 * worker runs each job as of the queue its payload names. */
void capstan__board_attach(struct capstan_runtime *rt, capstan_board_t *board, size_t size, int slot,
                           int supervisor, int quarantine);
/* Gives rt the supervisor's probe table (nrows rows), its own row row:
 * its shards' stamps are written there from then on. */
void capstan__board_probes(struct capstan_runtime *rt, capstan_probe_row_t *rows, int nrows, int row);
/* Where the housekeeper of rt's shard i writes its stamps: the worker's
 * row, or the member's own. */
capstan_probe_t *capstan__board_probe(struct capstan_runtime *rt, struct capstan_runtime *member, size_t i);
/* The worker moved a suspect to the quarantine. Any thread. */
void capstan__board_quarantined(struct capstan_runtime *rt);
/* Notes the job jid started on processor index. Any processor thread, for
 * its own index. */
void capstan__board_run(struct capstan_runtime *rt, int index, const char *jid);
/* The worker processes jobs. */
void capstan__board_ready(struct capstan_runtime *rt);
/* Its RSS in bytes, as it last read it. */
void capstan__board_rss(struct capstan_runtime *rt, long long rss);
/* It leaves of its own accord (CAPSTAN_LEAVE_*), before it goes quiet. */
void capstan__board_leave(struct capstan_runtime *rt, int why);
/* Its working list is empty: nothing is left for the supervisor to
 * recover, which then need not connect. */
void capstan__board_forget(struct capstan_runtime *rt);
/* capstan_runtime_run returned, with err (NULL when the run did not fail)
 * for the supervisor to repeat as its own last line. */
void capstan__board_ended(struct capstan_runtime *rt, const char *err);

/* What the supervisor asks of the runtime besides. */
/* rt's config, which the workers it forks run (board.c). */
capstan_config_t *capstan__runtime_config(struct capstan_runtime *rt);
/* Takes identity off Sidekiq's process set, with its work hashes
 * (heartbeat.c): a worker at its stop, the supervisor for a dead one.
 * Returns 0 or CAPSTAN_EREDIS / CAPSTAN_EREPLY. */
int capstan__heartbeat_leave(capstan_redis_t *r, const char *identity);

#endif
