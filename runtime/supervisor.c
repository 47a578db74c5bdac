/* The supervisor (supervisor.h): forks the workers, forwards signals to
 * them, reaps them, gives back a dead worker's jobs at once and starts its
 * replacement, with a backoff when a worker keeps dying. Single-threaded:
 * it waits for signals with sigtimedwait and polls the boards and
 * waitpid every 50 ms, and connects to Redis only to recover a dead
 * worker's jobs, closing the connection again before any later fork. */
#include "runtime/supervisor.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fetch/fetch.h"
#include "redis/keys.h"
#include "runtime/rt.h"
#include "support/identity.h"
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
    double started;           /* capstan__mono() at the fork */
    int ready;                /* seen ready once */
    int leaving;              /* leaving of its own accord, or told to */
    int told;                 /* the supervisor sent it TERM (reload, stop) */
    double kill_at;           /* capstan__mono() when it is killed if still
                                 running; 0 = not due */
} worker_t;

/* One of the processes: slots, each served by one worker at a time (two
 * while one leaves and its successor starts). */
typedef struct wslot {
    double delay;             /* the next restart's backoff, seconds */
    double start_at;          /* capstan__mono(): no worker starts before */
    int ever_ready;           /* a worker of this slot was ready once */
    int stopped;              /* its worker was stopped from outside (the
                                 Web UI's Stop): it is not replaced */
    long restarts[NCAUSES];
} wslot_t;

typedef struct sup {
    struct capstan_runtime *rt;
    int n;                    /* slots */
    wslot_t *slots;
    worker_t *w;              /* 2n entries */
    int nw;
    int stopping, quiet;
    int status;               /* the supervisor's exit status */
    int ready_sent;
    pid_t self;
    sigset_t set, old;
} sup_t;

void capstan__board_run(struct capstan_runtime *rt, int index, const char *jid)
{
    capstan_board_t *b = rt->board;
    if (!b || !jid || index < 0 || index >= b->nslots)
        return;
    capstan_board_row_t *row = &b->row[index];
    char *at = row->jid[row->next++ % CAPSTAN_BOARD_RING];
    size_t n = strlen(jid);
    if (n >= CAPSTAN_BOARD_JID)
        n = CAPSTAN_BOARD_JID - 1;
    memcpy(at, jid, n);
    at[n] = '\0';
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGTERM: return "TERM";
    case SIGINT: return "INT";
    case SIGTSTP: return "TSTP";
    case SIGTTIN: return "TTIN";
    case SIGUSR2: return "USR2";
    case SIGHUP: return "HUP";
    case SIGKILL: return "KILL";
    case SIGSEGV: return "SEGV";
    case SIGABRT: return "ABRT";
    case SIGBUS: return "BUS";
    case SIGFPE: return "FPE";
    case SIGILL: return "ILL";
    default: return "?";
    }
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

/* In a new worker: what the fork must not keep of the supervisor, and the
 * worker's own identity and board. */
static void become_worker(sup_t *s, worker_t *me)
{
    struct capstan_runtime *rt = s->rt;
    /* The supervisor's death (even kill -9) reaches the worker as a TERM:
     * it finishes its jobs, and leases cover what remains. */
    capstan__log_forked();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != s->self)
        raise(SIGTERM);
    /* A terminal's Ctrl-C reaches the supervisor alone, which forwards it:
     * a worker seeing it twice would take it for a second INT. */
    setpgid(0, 0);
    /* systemd hears the supervisor only. */
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    rt->board = me->board;
    rt->worker_slot = me->slot;
    capstan__identity_make(rt->identity, sizeof(rt->identity));
    memcpy(me->board->identity, rt->identity, sizeof(me->board->identity));
    /* One /metrics port per host: the first worker serves it. */
    if (me->slot > 0)
        rt->cfg->metrics_port = 0;
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].board && &s->w[i] != me)
            munmap(s->w[i].board, s->w[i].board_size);
    sigset_t old = s->old;
    free(s->w);
    free(s->slots);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* Forks a worker for slot. Returns 1 in the new worker, 0 in the
 * supervisor (also when the fork failed: it is tried again later). */
static int spawn(sup_t *s, int slot)
{
    worker_t *w = NULL;
    for (int i = 0; i < s->nw && !w; i++)
        if (s->w[i].pid == 0)
            w = &s->w[i];
    if (!w)
        return 0;
    size_t size = sizeof(capstan_board_t) + (size_t)s->rt->cfg->concurrency * sizeof(capstan_board_row_t);
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        capstan_error("cannot start worker %d: mmap: %s", slot, strerror(errno));
        s->slots[slot].start_at = capstan__mono() + 1;
        return 0;
    }
    memset(w, 0, sizeof(*w));
    w->board = mem;
    w->board_size = size;
    w->board->nslots = s->rt->cfg->concurrency;
    w->slot = slot;
    capstan__log_flush();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        capstan_error("cannot start worker %d: fork: %s", slot, strerror(errno));
        munmap(mem, size);
        memset(w, 0, sizeof(*w));
        s->slots[slot].start_at = capstan__mono() + 1;
        return 0;
    }
    if (pid == 0) {
        become_worker(s, w);
        return 1;
    }
    w->pid = pid;
    w->started = capstan__mono();
    capstan_info("worker %d started (pid %d)", slot, (int)pid);
    return 0;
}

/* Starts a worker for each slot that has none running (and not leaving).
 * Returns 1 in a new worker. */
static int start_missing(sup_t *s)
{
    double now = capstan__mono();
    for (int slot = 0; slot < s->n; slot++) {
        wslot_t *ws = &s->slots[slot];
        if (ws->stopped || now < ws->start_at)
            continue;
        int serving = 0;
        for (int i = 0; i < s->nw; i++)
            serving += s->w[i].pid > 0 && s->w[i].slot == slot && !s->w[i].leaving;
        if (!serving && spawn(s, slot))
            return 1;
    }
    return 0;
}

/* Gives back the jobs of a reaped worker: it is dead for certain, so its
 * list need not wait for its lease, and the board says which of its jobs
 * had started. Also takes it off Sidekiq's process set. */
static void recover(sup_t *s, worker_t *w)
{
    const capstan_config_t *c = s->rt->cfg;
    char id[sizeof(w->board->identity)];
    memcpy(id, w->board->identity, sizeof(id));
    id[sizeof(id) - 1] = '\0';
    if (!id[0])
        return; /* it died before it touched Redis */
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
    capstan_redis_t *r = capstan_redis_new(c->redis_url, 5, err);
    int rc = r ? capstan_redis_connect(r) : CAPSTAN_ECONFIG;
    if (r && rc)
        snprintf(err, sizeof(err), "%s", capstan_redis_error(r));
    if (!rc && c->fetch == CAPSTAN_FETCH_RELIABLE)
        rc = capstan__fetch_recover_dead(r, id, startedp, c->max_recoveries, c->timestamps, &out, err);
    if (!rc) {
        char work[400], workers[400];
        snprintf(work, sizeof(work), "%s%s", id, CAPSTAN_KEY_WORK);
        snprintf(workers, sizeof(workers), "%s%s", id, CAPSTAN_KEY_WORKERS);
        const char *srem[] = { "SREM", CAPSTAN_KEY_PROCESSES, id };
        const char *unl[] = { "UNLINK", work, workers };
        freeReplyObject(capstan_redis_cmd(r, 3, srem, NULL));
        freeReplyObject(capstan_redis_cmd(r, 3, unl, NULL));
    }
    capstan_redis_free(r);
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
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (sig)
        capstan_warn("worker %d (pid %d) was killed by signal %d (SIG%s)", w->slot, (int)w->pid, sig,
                     sig_name(sig));
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
    else if (sig || code != 0)
        cause = CAUSE_CRASH;
    if (cause >= 0 && !s->stopping)
        ws->restarts[cause]++;
    if (atomic_load(&w->board->ready))
        ws->ever_ready = w->ready = 1; /* between two looks */
    if (!s->stopping && code > 0 && !ws->ever_ready) {
        /* It could not start at all (a bad URL, Redis away past
         * startup_timeout, a port in use): neither will its replacement. */
        capstan_error("worker %d could not start; stopping", w->slot);
        s->status = code;
        s->stopping = 1;
        forward(s, SIGTERM);
    } else if (cause < 0 && !s->stopping && !w->told) {
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
            w->kill_at = now + s->rt->cfg->timeout + KILL_MARGIN;
            capstan_info("worker %d (pid %d) is leaving (%s): starting its successor", w->slot, (int)w->pid,
                         cause_names[leave == CAPSTAN_LEAVE_TIMEOUT ? CAUSE_TIMEOUT : CAUSE_MEMORY]);
        }
        if (w->kill_at > 0 && now > w->kill_at) {
            capstan_warn("worker %d (pid %d) outstayed its shutdown grace: killing it", w->slot, (int)w->pid);
            kill(w->pid, SIGKILL);
            w->kill_at = 0;
        }
        ready += w->ready && !w->leaving;
    }
    if (!s->ready_sent && ready >= s->n) {
        s->ready_sent = 1;
        capstan_info("all %d workers ready", s->n);
        capstan__notify("READY=1");
    }
}

static void stop_all(sup_t *s, int sig)
{
    double now = capstan__mono();
    if (!s->stopping) {
        capstan_info("Received %s, stopping %d workers", sig_name(sig), live(s));
        capstan__notify("STOPPING=1");
        s->stopping = 1;
    }
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].pid > 0) {
            s->w[i].told = 1;
            if (!s->w[i].kill_at)
                s->w[i].kill_at = now + s->rt->cfg->timeout + KILL_MARGIN;
        }
    forward(s, sig);
}

int capstan__supervise(struct capstan_runtime *rt, int *worker)
{
    sup_t s = { .rt = rt, .n = rt->cfg->processes, .self = getpid() };
    *worker = 0;
    s.nw = 2 * s.n;
    s.slots = calloc((size_t)s.n, sizeof(*s.slots));
    s.w = calloc((size_t)s.nw, sizeof(*s.w));
    if (!s.slots || !s.w) {
        free(s.slots);
        free(s.w);
        capstan_error("out of memory");
        return 1;
    }
    sigemptyset(&s.set);
    int sigs[] = { SIGTERM, SIGINT, SIGTSTP, SIGTTIN, SIGUSR2, SIGHUP, SIGCHLD };
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(&s.set, sigs[i]);
    sigprocmask(SIG_BLOCK, &s.set, &s.old);
    capstan_info("supervisor started (pid %d): %d worker%s of %d threads", (int)s.self, s.n,
                 s.n == 1 ? "" : "s", rt->cfg->concurrency);
    double tick = capstan__notify_watchdog_every();
    tick = tick > 0 && tick < TICK ? tick : TICK;
    for (;;) {
        if (!s.stopping && !s.quiet && start_missing(&s)) {
            *worker = 1;
            return 0;
        }
        watch(&s);
        if ((s.stopping || s.quiet) && live(&s) == 0)
            break;
        if (!s.stopping && live(&s) == 0) {
            int waiting = 0;
            for (int i = 0; i < s.n; i++)
                waiting += !s.slots[i].stopped;
            if (!waiting)
                break;
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
            capstan_info("Received HUP: ignored (restart the service to load new code)");
            break;
        default:
            break;
        }
        reap(&s);
    }
    capstan_info("supervisor: every worker has ended");
    capstan__log_flush();
    for (int i = 0; i < s.n; i++)
        for (int c = 0; c < NCAUSES; c++)
            if (s.slots[i].restarts[c])
                capstan_debug("worker %d: %ld restarts (%s)", i, s.slots[i].restarts[c], cause_names[c]);
    free(s.w);
    free(s.slots);
    sigprocmask(SIG_SETMASK, &s.old, NULL);
    return s.status;
}
