/* The supervisor (supervisor.h): forks the workers, forwards signals to
 * them, reaps them, gives back a dead worker's jobs at once and starts its
 * replacement, with a backoff when a worker keeps dying. Besides the
 * `processes` workers, the quarantine worker: one thread reading only the
 * quarantine (CAPSTAN_QUARANTINE), where the others move the jobs
 * recovered after a crash (see feed/gate.c), started once a worker first
 * did, its slot the last. Single-threaded:
 * it waits for signals with sigtimedwait and polls the boards and
 * waitpid every 50 ms, and connects to Redis only to recover a dead
 * worker's jobs, closing the connection again before any later fork. */
#include "supervisor/supervisor.h"
#include "config/shards.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fetch/fetch.h"
#include "observe/http.h"
#include "observe/prometheus.h"
#include "runtime/board.h"
#include "runtime/notify.h"
#include "runtime/source.h"
#include "support/log.h"
#include "support/time.h"
#include "capstan/capstan.h"

#define TICK 0.05          /* seconds between two looks at the workers */
#define MAX_DELAY 60.0     /* the longest backoff before a restart */
#define HEALTHY 60.0       /* a worker that lived this long resets its backoff */
#define KILL_MARGIN 10.0   /* past the shutdown grace, a leaving worker is killed */

typedef enum { CAUSE_CRASH, CAUSE_TIMEOUT, CAUSE_MEMORY, CAUSE_RELOAD, NCAUSES } cause_t;
static const char *const cause_names[NCAUSES] = { "crash", "timeout", "memory", "reload" };

/* One worker process, running or leaving. */
typedef struct worker {
    pid_t pid;                /* 0: a free entry */
    int slot;
    capstan_board_t *board;   /* shared with the worker */
    size_t board_size;
    int fd;                   /* the board's memfd, open until the fork */
    int fresh;                /* started by a reload, not yet serving */
    double started;           /* capstan__mono() at the fork */
    int ready;                /* seen ready once */
    int leaving;              /* leaving of its own accord, or told to */
    int told;                 /* the supervisor sent it TERM (reload, stop) */
    double kill_at;           /* capstan__mono() when it is killed if still
                                 running; 0 = not due */
    double grace;             /* the timeout of the configuration it runs:
                                 its shutdown grace, before KILL_MARGIN */
} worker_t;

/* One of the processes: slots, each served by one worker at a time (two
 * while one leaves and its successor starts). */
typedef struct wslot {
    double delay;             /* the next restart's backoff, seconds */
    double start_at;          /* capstan__mono(): no worker starts before */
    int ever_ready;           /* a worker of this slot was ready once */
    int stopped;              /* its worker was stopped from outside (the
                                 Web UI's Stop): it is not replaced */
    atomic_long *restarts;    /* [NCAUSES], in the table shared with the
                                 workers (worker 0 serves it on /metrics) */
} wslot_t;

typedef struct sup {
    capstan_config_t *cfg;    /* the runtime's, which its workers run */
    capstan_runtime_t *rt;    /* only handed to the worker it becomes */
    int n;                    /* slots: processes, then the quarantine's */
    int quarantine;           /* a worker moved a suspect to the quarantine:
                                 the quarantine worker serves from then on */
    wslot_t *slots;
    worker_t *w;              /* 2n entries */
    int nw;
    int stopping, quiet;
    int status;               /* the supervisor's exit status */
    char reason[CAPSTAN_ERRLEN]; /* why, when a worker could not start */
    int ready_sent;
    pid_t self;
    sigset_t set, old;
    atomic_long *table;       /* n * NCAUSES restart counts, shared */
    size_t table_size;
    int table_fd;             /* its memfd, for workers started by exec */
    capstan_probe_row_t *probes; /* a row per entry of w: each worker's probe
                                 stamps, shared; NULL when it could not be made */
    size_t probes_size;
    int probes_fd;            /* its memfd, -1 without */
    char *exe;                /* the binary on disk, which a reload runs */
    int argc;                 /* `capstan run`'s arguments, for a reload */
    char **argv;
    int reloading;            /* a HUP's rolling restart is under way */
    int reload_slot;          /* the slot it replaces now */
    capstan_config_t *disk;   /* after a HUP: the configuration on disk,
                                 which the workers started since run */
} sup_t;

/* The configuration the workers run: the one on disk once a HUP started
 * workers from it (its shards: may have changed). */
static const capstan_config_t *worker_cfg(const sup_t *s)
{
    return s->disk ? s->disk : s->cfg;
}

/* w's row in the probe table, or NULL without one. */
static capstan_probe_row_t *probe_row(const sup_t *s, const worker_t *w)
{
    return s->probes ? &s->probes[w - s->w] : NULL;
}

/* Says in w's row whether it serves: ready and not leaving. */
static void serving(const sup_t *s, const worker_t *w)
{
    if (probe_row(s, w))
        atomic_store(&probe_row(s, w)->serving, w->pid > 0 && w->ready && !w->leaving);
}

static int live(const sup_t *s)
{
    int n = 0;
    for (int i = 0; i < s->nw; i++)
        n += s->w[i].pid > 0;
    return n;
}

static void forward(sup_t *s, int sig)
{
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].pid > 0)
            kill(s->w[i].pid, sig);
}

/* The supervisor's death (even kill -9) reaches the worker as a TERM: it
 * finishes its jobs, and leases cover what remains. A terminal's Ctrl-C
 * reaches the supervisor alone, which forwards it: a worker seeing it
 * twice would take it for a second INT. Both outlive an exec. */
static void detach(pid_t supervisor)
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != supervisor)
        raise(SIGTERM);
    setpgid(0, 0);
}

/* Whether slot (of nslots) is the quarantine worker's. */
static int quarantine_slot(int slot, int nslots)
{
    return slot == nslots - 1;
}

/* The quarantine worker runs the suspects one at a time, fetching none
 * ahead: one thread, the quarantine its only queue. */
static void become_quarantine(capstan_config_t *cfg)
{
    char err[CAPSTAN_ERRLEN];
    cfg->concurrency = 1;
    cfg->prefetch = 1;
    cfg->queues_from_flags = 0; /* the queue below replaces the list */
    if (capstan_config_add_queue(cfg, CAPSTAN_QUARANTINE, err))
        capstan_error("the quarantine worker reads its queues as configured: %s", err);
    /* In every shard, one with a queues: list of its own too. */
    capstan__config_shards_same_queues(cfg);
}

/* A worker's own identity and board; systemd hears the supervisor only. */
static void worker_setup(capstan_runtime_t *rt, capstan_config_t *cfg, capstan_board_t *board, size_t size,
                         int slot, atomic_long *table, int nslots, capstan_probe_row_t *probes, int row)
{
    capstan__log_forked();
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    int quarantine = quarantine_slot(slot, nslots);
    capstan__board_attach(rt, board, size, slot, (int)getppid(), quarantine);
    if (quarantine)
        become_quarantine(cfg);
    /* Two workers a slot at most (one leaving, its successor starting). */
    capstan__board_probes(rt, probes, 2 * nslots, row);
    /* One /metrics port per host: the first worker serves it, with the
     * supervisor's restart counts. */
    if (slot > 0)
        cfg->metrics_port = 0;
    else if (table)
        capstan__metrics_restarts(capstan__metrics_default(), table, nslots, cause_names, NCAUSES);
}

/* In a new worker: what the fork must not keep of the supervisor. */
static void become_worker(sup_t *s, worker_t *me)
{
    detach(s->self);
    worker_setup(s->rt, s->cfg, me->board, me->board_size, me->slot, s->table, s->n, s->probes,
                 (int)(me - s->w));
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].board && &s->w[i] != me)
            munmap(s->w[i].board, s->w[i].board_size);
    close(me->fd);
    close(s->table_fd);
    if (s->probes_fd >= 0)
        close(s->probes_fd);
    sigset_t old = s->old;
    free(s->w);
    free(s->slots);
    free(s->exe);
    capstan_config_free(s->disk);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* In a new worker started from the binary on disk (a reload): it reads the
 * configuration and loads the plugins itself, then capstan__supervised
 * finds its board through CAPSTAN_WORKER. Never returns. */
static void exec_worker(sup_t *s, worker_t *me)
{
    char spec[128];
    /* A binary that knows no probe table reads the first six. */
    snprintf(spec, sizeof(spec), "%d:%zu:%d:%d:%d:%d:%d:%d", me->fd, me->board_size, s->table_fd, me->slot,
             s->n, (int)s->self, s->probes_fd, (int)(me - s->w));
    detach(s->self);
    sigprocmask(SIG_SETMASK, &s->old, NULL);
    setenv(CAPSTAN_WORKER_ENV, spec, 1);
    const char **argv = calloc((size_t)s->argc + 3, sizeof(char *));
    if (argv) {
        argv[0] = s->exe;
        argv[1] = "run";
        for (int i = 1; i < s->argc; i++)
            argv[i + 1] = s->argv[i];
        execv(s->exe, (char *const *)argv);
    }
    capstan_board_end_t *end = capstan__board_end(me->board, me->board_size);
    snprintf(end->reason, sizeof(end->reason), "cannot start %s: %s", s->exe, strerror(errno));
    capstan_error("%s", end->reason);
    atomic_store(&end->ended, 1);
    capstan__log_flush();
    _exit(127);
}

static int supervised(capstan_runtime_t *rt, char *err)
{
    const char *spec = getenv(CAPSTAN_WORKER_ENV);
    int bfd, tfd, slot, n, parent, pfd = -1, row = -1;
    size_t size;
    int got = spec ? sscanf(spec, "%d:%zu:%d:%d:%d:%d:%d:%d", &bfd, &size, &tfd, &slot, &n, &parent, &pfd, &row) : 0;
    if (got != 6 && got != 8)
        return capstan_seterr(err, CAPSTAN_EINVAL, "%s: not a worker's", CAPSTAN_WORKER_ENV);
    unsetenv(CAPSTAN_WORKER_ENV);
    capstan_board_t *board = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
    size_t tsize = (size_t)n * NCAUSES * sizeof(atomic_long);
    atomic_long *table = mmap(NULL, tsize, PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
    /* Only a table of the layout this binary knows (an older supervisor
     * gives none: this worker then answers for itself alone). */
    size_t psize = (size_t)2 * n * sizeof(capstan_probe_row_t);
    struct stat st;
    capstan_probe_row_t *probes = pfd >= 0 && fstat(pfd, &st) == 0 && (size_t)st.st_size == psize
                                      ? mmap(NULL, psize, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0) : MAP_FAILED;
    close(bfd);
    close(tfd);
    if (pfd >= 0)
        close(pfd);
    if (board == MAP_FAILED)
        return capstan_seterr(err, CAPSTAN_ESYS, "%s: mmap: %s", CAPSTAN_WORKER_ENV, strerror(errno));
    if (getppid() != parent)
        raise(SIGTERM);
    worker_setup(rt, capstan__runtime_config(rt), board, size, slot, table == MAP_FAILED ? NULL : table, n,
                 probes == MAP_FAILED ? NULL : probes, row);
    return 0;
}

/* Shared memory that an exec'd worker can map again: a memfd (left open
 * across exec), or -1. */
static void *shared(size_t size, int *fd)
{
    *fd = memfd_create("capstan", 0);
    if (*fd < 0)
        return MAP_FAILED;
    void *mem = ftruncate(*fd, (off_t)size) == 0
                    ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0) : MAP_FAILED;
    if (mem == MAP_FAILED) {
        close(*fd);
        *fd = -1;
    }
    return mem;
}

/* Forks a worker for slot, which runs on from this process's image, or
 * with exec set starts the binary on disk. Returns 1 in a forked worker,
 * 0 in the supervisor (also when the fork failed: it is tried again
 * later). */
static int spawn(sup_t *s, int slot, int exec)
{
    worker_t *w = NULL;
    for (int i = 0; i < s->nw && !w; i++)
        if (s->w[i].pid == 0)
            w = &s->w[i];
    if (!w)
        return 0;
    /* A row per processor of every shard's member (board.c). */
    const capstan_config_t *c = worker_cfg(s);
    int threads = quarantine_slot(slot, s->n) ? 1 : c->concurrency;
    int rows = threads * (c->nshards ? (int)c->nshards : 1);
    size_t size = capstan__board_size(rows);
    int fd;
    void *mem = shared(size, &fd);
    if (mem == MAP_FAILED) {
        capstan_error("cannot start worker %d: mmap: %s", slot, strerror(errno));
        s->slots[slot].start_at = capstan__mono() + 1;
        return 0;
    }
    memset(w, 0, sizeof(*w));
    w->board = mem;
    w->board_size = size;
    w->fd = fd;
    w->fresh = exec && s->reloading && slot == s->reload_slot;
    w->board->nslots = rows;
    w->slot = slot;
    w->grace = c->timeout;
    capstan_probe_row_t *row = probe_row(s, w);
    if (row) {
        memset(row, 0, sizeof(*row));
        atomic_store(&row->slot, slot);
    }
    capstan__log_flush();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        capstan_error("cannot start worker %d: fork: %s", slot, strerror(errno));
        munmap(mem, size);
        close(fd);
        memset(w, 0, sizeof(*w));
        s->slots[slot].start_at = capstan__mono() + 1;
        return 0;
    }
    if (pid == 0) {
        if (exec)
            exec_worker(s, w);
        become_worker(s, w);
        return 1;
    }
    close(fd);
    w->fd = -1;
    w->pid = pid;
    w->started = capstan__mono();
    capstan_info("%s %d started (pid %d)%s", quarantine_slot(slot, s->n) ? "quarantine worker" : "worker", slot,
                 (int)pid, exec ? " from the binary on disk" : "");
    return 0;
}

/* Whether slot has a worker to serve it: the quarantine's only once a
 * worker asked for it. */
static int wanted(const sup_t *s, int slot)
{
    return !s->slots[slot].stopped && (s->quarantine || !quarantine_slot(slot, s->n));
}

/* Starts a worker for each slot that has none running (and not leaving).
 * Returns 1 in a new worker. */
static int start_missing(sup_t *s)
{
    double now = capstan__mono();
    for (int slot = 0; slot < s->n; slot++) {
        wslot_t *ws = &s->slots[slot];
        if (!wanted(s, slot) || now < ws->start_at)
            continue;
        int serving = 0;
        for (int i = 0; i < s->nw; i++)
            serving += s->w[i].pid > 0 && s->w[i].slot == slot && !s->w[i].leaving;
        /* After a HUP, from the binary and configuration on disk, as the
         * reload's workers: this image's may be older. */
        if (!serving && spawn(s, slot, s->disk != NULL))
            return 1;
    }
    return 0;
}

/* Gives back the jobs of a reaped worker: it is dead for certain, so its
 * list need not wait for its lease, and the board says which of its jobs
 * had started. Also takes it off Sidekiq's process set. */
static void recover(sup_t *s, worker_t *w)
{
    const capstan_config_t *c = worker_cfg(s);
    char id[sizeof(w->board->identity)];
    memcpy(id, w->board->identity, sizeof(id));
    id[sizeof(id) - 1] = '\0';
    if (!id[0])
        return; /* it died before it touched Redis, or left nothing behind */
    double t0 = capstan__mono();
    char err[CAPSTAN_ERRLEN] = "";
    const char **jids = calloc((size_t)w->board->nslots * CAPSTAN_BOARD_RING, sizeof(char *));
    size_t n = 0;
    for (int i = 0; jids && i < w->board->nslots; i++)
        for (int k = 0; k < CAPSTAN_BOARD_RING; k++) {
            char *jid = w->board->row[i].jid[k];
            jid[CAPSTAN_BOARD_JID - 1] = '\0';
            if (jid[0])
                jids[n++] = jid;
        }
    if (!jids)
        capstan_warn("out of memory: every job of worker %d counts as started", w->slot);
    capstan_started_t started = { jids, n };
    const capstan_started_t *startedp = jids ? &started : NULL;
    capstan_recovery_t out = {0};
    int rc = 0;
    /* A sharded worker left a list and a process entry in every shard:
     * one that does not answer leaves the others' to do at once. */
    for (size_t k = 0; k < (c->nshards ? c->nshards : 1); k++) {
        capstan_redis_t *r = capstan_redis_new(c->nshards ? c->shards[k].redis_url : c->redis_url, 5, err);
        int one = r ? capstan_redis_connect(r) : CAPSTAN_ECONFIG;
        if (r && one)
            snprintf(err, sizeof(err), "%s", capstan_redis_error(r));
        if (!one && capstan__source_for(c)->working_list)
            one = capstan__fetch_recover_dead(r, id, startedp, c->max_recoveries, c->timestamps,
                                              c->sidekiq_metrics, &out, err);
        if (!one)
            capstan__heartbeat_leave(r, id);
        capstan_redis_free(r);
        rc = rc ? rc : one;
    }
    free(jids);
    if (rc) {
        capstan_error("worker %d (pid %d): its jobs wait for orphan recovery: %s", w->slot, (int)w->pid,
                      err);
        return;
    }
    if (out.recovered || out.killed || out.left)
        capstan_warn("worker %d (pid %d): %ld jobs back in their queues, %ld poison pills to the dead "
                     "set, %ld left, in %.0f ms",
                     w->slot, (int)w->pid, out.recovered, out.killed, out.left,
                     (capstan__mono() - t0) * 1000);
}

/* What became of a reaped worker, and its replacement. */
static void reaped(sup_t *s, worker_t *w, int status)
{
    wslot_t *ws = &s->slots[w->slot];
    double now = capstan__mono();
    int leave = atomic_load(&w->board->leaving);
    capstan_board_end_t *end = capstan__board_end(w->board, w->board_size);
    int ended = atomic_load(&end->ended);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (sig)
        capstan_warn("worker %d (pid %d) was killed by signal %d (SIG%s)", w->slot, (int)w->pid, sig,
                     capstan__sig_name(sig));
    else if (!ended)
        capstan_warn("worker %d (pid %d) exited with status %d before its run ended (exit() in a "
                     "handler?): a crash", w->slot, (int)w->pid, code);
    else
        capstan_info("worker %d (pid %d) exited with status %d", w->slot, (int)w->pid, code);
    recover(s, w);
    int cause = -1;
    if (leave == CAPSTAN_LEAVE_TIMEOUT)
        cause = CAUSE_TIMEOUT;
    else if (leave == CAPSTAN_LEAVE_MEMORY)
        cause = CAUSE_MEMORY;
    else if (w->told && !s->stopping)
        cause = CAUSE_RELOAD;
    else if (sig || code != 0 || !ended)
        cause = CAUSE_CRASH;
    if (cause >= 0 && !s->stopping)
        atomic_fetch_add(&ws->restarts[cause], 1);
    if (atomic_load(&w->board->ready))
        ws->ever_ready = w->ready = 1; /* between two looks */
    if (!s->stopping && code > 0 && !ws->ever_ready) {
        /* It could not start at all (a bad URL, Redis away past
         * startup_timeout, a port in use): neither will its replacement. */
        capstan_error("worker %d could not start; stopping", w->slot);
        s->status = code;
        if (end->reason[0])
            snprintf(s->reason, sizeof(s->reason), "%.*s", (int)sizeof(end->reason) - 1, end->reason);
        else
            snprintf(s->reason, sizeof(s->reason), "worker %d exited with status %d before it was ready",
                     w->slot, code);
        s->stopping = 1;
        forward(s, SIGTERM);
    } else if (cause < 0 && !s->stopping && !w->told && !quarantine_slot(w->slot, s->n)) {
        capstan_info("worker %d was stopped (Web UI or API); it is not replaced", w->slot);
        ws->stopped = 1;
    } else if (cause == CAUSE_CRASH && !s->stopping) {
        if (now - w->started >= HEALTHY)
            ws->delay = 0;
        ws->start_at = now + ws->delay;
        if (ws->delay > 0)
            capstan_warn("worker %d keeps dying: restarting it in %.0f s", w->slot, ws->delay);
        ws->delay = ws->delay == 0 ? 1 : ws->delay * 2 > MAX_DELAY ? MAX_DELAY : ws->delay * 2;
    }
    munmap(w->board, w->board_size);
    w->pid = 0;
    serving(s, w);
    memset(w, 0, sizeof(*w));
}

static void reap(sup_t *s)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        for (int i = 0; i < s->nw; i++)
            if (s->w[i].pid == pid) {
                reaped(s, &s->w[i], status);
                break;
            }
}

/* Workers that said they leave (timeout, memory): their successor starts
 * now, and a worker that outstays its grace is killed. */
static void watch(sup_t *s)
{
    double now = capstan__mono();
    int ready = 0;
    for (int i = 0; i < s->nw; i++) {
        worker_t *w = &s->w[i];
        if (w->pid <= 0)
            continue;
        if (!w->ready && atomic_load(&w->board->ready)) {
            w->ready = 1;
            s->slots[w->slot].ever_ready = 1;
        }
        int leave = atomic_load(&w->board->leaving);
        if (leave && !w->leaving) {
            w->leaving = 1;
            w->kill_at = now + w->grace + KILL_MARGIN;
            capstan_info("worker %d (pid %d) is leaving (%s): starting its successor", w->slot, (int)w->pid,
                         cause_names[leave == CAPSTAN_LEAVE_TIMEOUT ? CAUSE_TIMEOUT : CAUSE_MEMORY]);
        }
        if (w->kill_at > 0 && now > w->kill_at) {
            capstan_warn("worker %d (pid %d) outstayed its shutdown grace: killing it", w->slot, (int)w->pid);
            kill(w->pid, SIGKILL);
            w->kill_at = 0;
        }
        capstan_board_end_t *end = capstan__board_end(w->board, w->board_size);
        if (!s->quarantine && end && atomic_load(&end->quarantined)) {
            s->quarantine = 1;
            capstan_info("worker %d moved a job recovered after a crash to the quarantine: starting the "
                         "quarantine worker", w->slot);
        }
        ready += w->ready && !w->leaving && !quarantine_slot(w->slot, s->n);
        serving(s, w);
    }
    if (!s->ready_sent && ready >= s->n - 1) {
        s->ready_sent = 1;
        capstan_info("all %d workers ready", s->n - 1);
        capstan__notify("READY=1");
    }
}

/* The rolling restart moves on to the next slot, or is done. */
static void reload_next(sup_t *s)
{
    if (++s->reload_slot >= s->n) {
        s->reloading = 0;
        capstan_info("reload done: %d workers from the binary on disk", s->n - 1);
        capstan__notify("READY=1");
    }
}

/* One step of a rolling restart (HUP): for the slot in turn, a worker
 * from the binary on disk is started; once it is ready the old ones of the
 * slot are told to leave (TERM: they finish their jobs and give back the
 * rest), and the next slot follows. */
static void reload_step(sup_t *s)
{
    if (!s->reloading || s->stopping)
        return;
    int slot = s->reload_slot;
    if (!wanted(s, slot) && !s->slots[slot].stopped) {
        reload_next(s); /* no quarantine worker runs: none to replace */
        return;
    }
    worker_t *fresh = NULL;
    for (int i = 0; i < s->nw && !fresh; i++)
        if (s->w[i].pid > 0 && s->w[i].slot == slot && s->w[i].fresh)
            fresh = &s->w[i];
    if (!fresh) {
        if (!s->slots[slot].stopped && capstan__mono() >= s->slots[slot].start_at)
            spawn(s, slot, 1);
        return;
    }
    if (!atomic_load(&fresh->board->ready))
        return;
    double now = capstan__mono();
    /* The probes judge the successor from now on, not the old ones. */
    fresh->ready = s->slots[slot].ever_ready = 1;
    serving(s, fresh);
    for (int i = 0; i < s->nw; i++) {
        worker_t *w = &s->w[i];
        if (w->pid > 0 && w->slot == slot && w != fresh && !w->told) {
            w->told = w->leaving = 1;
            serving(s, w);
            w->kill_at = now + w->grace + KILL_MARGIN;
            kill(w->pid, SIGTERM);
        }
    }
    fresh->fresh = 0;
    reload_next(s);
}

/* At a HUP: the configuration on disk, read as `capstan run` reads it,
 * for the recovery of the workers started from it. One that does not
 * parse keeps the last (its workers will not start either). */
static void reread(sup_t *s)
{
    char err[CAPSTAN_ERRLEN] = "";
    capstan_config_t *c = capstan_config_new();
    int rc = c ? capstan_config_parse_args(c, s->argc, s->argv, err) : CAPSTAN_ENOMEM;
    if (!rc)
        rc = capstan_config_validate(c, err);
    if (rc) {
        capstan_warn("HUP: cannot read the configuration: %s", rc == CAPSTAN_ENOMEM ? "out of memory" : err);
        capstan_config_free(c);
        return;
    }
    capstan_config_free(s->disk);
    s->disk = c;
}

static void stop_all(sup_t *s, int sig)
{
    double now = capstan__mono();
    if (!s->stopping) {
        capstan_info("Received %s, stopping %d workers", capstan__sig_name(sig), live(s));
        capstan__notify("STOPPING=1");
        s->stopping = 1;
    }
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].pid > 0) {
            s->w[i].told = 1;
            if (!s->w[i].kill_at)
                s->w[i].kill_at = now + s->w[i].grace + KILL_MARGIN;
        }
    forward(s, sig);
}

static int supervise(capstan_runtime_t *rt, int argc, char **argv, int *worker)
{
    capstan_config_t *cfg = capstan__runtime_config(rt);
    sup_t s = { .cfg = cfg, .rt = rt, .n = cfg->processes + 1, .self = getpid(), .argc = argc, .argv = argv };
    *worker = 0;
    char err[CAPSTAN_ERRLEN];
    if (cfg->metrics_port > 0 && capstan__http_check(cfg->metrics_bind, cfg->metrics_port, err)) {
        capstan_error("%s", err);
        return 1;
    }
    s.nw = 2 * s.n;
    s.slots = calloc((size_t)s.n, sizeof(*s.slots));
    s.w = calloc((size_t)s.nw, sizeof(*s.w));
    s.table_size = (size_t)s.n * NCAUSES * sizeof(atomic_long);
    s.table = shared(s.table_size, &s.table_fd);
    s.probes_size = (size_t)s.nw * sizeof(capstan_probe_row_t);
    s.probes = shared(s.probes_size, &s.probes_fd);
    if (s.probes == MAP_FAILED) {
        capstan_warn("no probe table (%s): /readyz and /livez judge worker 0 alone", strerror(errno));
        s.probes = NULL;
    }
    s.exe = realpath("/proc/self/exe", NULL);
    if (!s.slots || !s.w || s.table == MAP_FAILED || !s.exe) {
        free(s.slots);
        free(s.w);
        free(s.exe);
        if (s.table != MAP_FAILED) {
            munmap(s.table, s.table_size);
            close(s.table_fd);
        }
        if (s.probes) {
            munmap(s.probes, s.probes_size);
            close(s.probes_fd);
        }
        capstan_error("out of memory");
        return 1;
    }
    for (int i = 0; i < s.n; i++)
        s.slots[i].restarts = s.table + (size_t)i * NCAUSES;
    sigemptyset(&s.set);
    int sigs[] = { SIGTERM, SIGINT, SIGTSTP, SIGTTIN, SIGUSR2, SIGHUP, SIGCHLD };
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(&s.set, sigs[i]);
    sigprocmask(SIG_BLOCK, &s.set, &s.old);
    capstan_info("supervisor started (pid %d): %d worker%s of %d threads", (int)s.self, s.n - 1,
                 s.n == 2 ? "" : "s", cfg->concurrency);
    double tick = capstan__notify_watchdog_every();
    tick = tick > 0 && tick < TICK ? tick : TICK;
    for (;;) {
        if (!s.stopping && !s.quiet && start_missing(&s)) {
            *worker = 1;
            return 0;
        }
        watch(&s);
        reload_step(&s);
        if ((s.stopping || s.quiet) && live(&s) == 0)
            break;
        int waiting = 0;
        for (int i = 0; i < s.n - 1; i++)
            waiting += !s.slots[i].stopped;
        if (!s.stopping && !waiting && live(&s) == 0)
            break;
        if (!s.stopping && !waiting) {
            /* Every worker was stopped from outside: the quarantine
             * worker, which serves them, stops too. */
            s.stopping = 1;
            forward(&s, SIGTERM);
        }
        capstan__notify_watchdog();
        capstan__log_flush();
        struct timespec ts = { 0, (long)(tick * 1e9) };
        int sig = sigtimedwait(&s.set, NULL, &ts);
        switch (sig) {
        case SIGTERM:
        case SIGINT:
            stop_all(&s, sig);
            break;
        case SIGTSTP:
            if (!s.quiet)
                capstan_info("Received TSTP: workers go quiet and are not replaced");
            s.quiet = 1;
            forward(&s, sig);
            break;
        case SIGUSR2:
            if (capstan__log_reopen())
                capstan_error("cannot reopen the log file: %s", strerror(errno));
            forward(&s, sig);
            break;
        case SIGTTIN:
            forward(&s, sig);
            break;
        case SIGHUP:
            if (s.reloading || s.stopping || s.quiet) {
                capstan_info("Received HUP: ignored (%s)", s.reloading ? "a reload is under way"
                                                           : "stopping or quiet");
                break;
            }
            capstan_info("Received HUP: replacing the workers one at a time from %s", s.exe);
            reread(&s);
            capstan__notify("RELOADING=1");
            s.reloading = 1;
            s.reload_slot = 0;
            break;
        default:
            break;
        }
        reap(&s);
    }
    capstan_info("supervisor: every worker has ended");
    for (int i = 0; i < s.n; i++)
        for (int c = 0; c < NCAUSES; c++)
            if (atomic_load(&s.slots[i].restarts[c]))
                capstan_debug("worker %d: %ld restarts (%s)", i, atomic_load(&s.slots[i].restarts[c]),
                              cause_names[c]);
    /* The log's last line says why `capstan run` failed, as without the
     * supervisor. */
    if (s.reason[0])
        capstan_error("%s", s.reason);
    capstan__log_flush();
    free(s.w);
    free(s.slots);
    free(s.exe);
    capstan_config_free(s.disk);
    munmap(s.table, s.table_size);
    close(s.table_fd);
    if (s.probes) {
        munmap(s.probes, s.probes_size);
        close(s.probes_fd);
    }
    sigprocmask(SIG_SETMASK, &s.old, NULL);
    return s.status;
}

int capstan_runtime_supervise(capstan_runtime_t *rt, int argc, char **argv, int *worker, char *err)
{
    if (getenv(CAPSTAN_WORKER_ENV)) {
        /* Started by a supervisor's reload, from the binary on disk. */
        *worker = 1;
        return supervised(rt, err);
    }
    return supervise(rt, argc, argv, worker);
}
