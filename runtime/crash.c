/* The fatal-signal report (crash.h). The handler runs in a process that may
 * be corrupt, so it calls only async-signal-safe functions: write(2) into a
 * buffer on its stack, no malloc, no stdio, no locks. backtrace() is the
 * exception, last: its first call loads libgcc, which takes locks a crash
 * may have left held, so should it hang an alarm ends the process with its
 * signal. (Loaded at start, libgcc would stay resident in every worker for
 * its crash.) */
#include "runtime/crash.h"

#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "support/log.h"

#define ALT_STACK (64 * 1024)
#define FRAMES 64
#define BACKTRACE_SECONDS 3

static const int fatal[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };
#define NFATAL (sizeof(fatal) / sizeof(fatal[0]))

static struct sigaction old_action[NFATAL];
static int installed[NFATAL];
/* The processors of each runtime of the process: the front's (or the one
 * runtime's without shards) first, then each shard's member's. */
typedef struct watch {
    capstan_slot_t *_Atomic slots;
    atomic_int n;
    const char *_Atomic shard;
} watch_t;
static watch_t watched[CAPSTAN_CRASH_WATCH_MAX];
static atomic_flag reporting = ATOMIC_FLAG_INIT;
static _Thread_local void *alt_stack;

/* A line under construction, on the handler's stack. */
typedef struct line {
    char s[512];
    size_t n;
} line_t;

static void put(line_t *l, const char *s)
{
    while (*s && l->n < sizeof(l->s) - 1)
        l->s[l->n++] = *s++;
}

/* At most max bytes of a field the handler reads without the lock: a torn
 * copy is cut at the array's end, and control characters become '?' so a
 * class name cannot split the line. */
static void put_field(line_t *l, const char *s, size_t max)
{
    for (size_t i = 0; i < max && s[i] && l->n < sizeof(l->s) - 1; i++)
        l->s[l->n++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
}

static void put_num(line_t *l, unsigned long v, int width)
{
    char t[24];
    int n = 0;
    do {
        t[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v || n < width);
    while (n && l->n < sizeof(l->s) - 1)
        l->s[l->n++] = t[--n];
}

/* The start of a log line: UTC time as the logger writes it (computed
 * here, gmtime_r is not async-signal-safe), pid, level. */
static void put_head(line_t *l)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long days = (long)(ts.tv_sec / 86400), secs = (long)(ts.tv_sec % 86400);
    /* Civil date from days since 1970-01-01 (H. Hinnant's algorithm). */
    long z = days + 719468, era = z / 146097, doe = z - era * 146097;
    long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    long d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
    long y = yoe + era * 400 + (m <= 2);
    put_num(l, (unsigned long)y, 4); put(l, "-");
    put_num(l, (unsigned long)m, 2); put(l, "-");
    put_num(l, (unsigned long)d, 2); put(l, "T");
    put_num(l, (unsigned long)(secs / 3600), 2); put(l, ":");
    put_num(l, (unsigned long)(secs / 60 % 60), 2); put(l, ":");
    put_num(l, (unsigned long)(secs % 60), 2); put(l, ".");
    put_num(l, (unsigned long)(ts.tv_nsec / 1000000), 3); put(l, "Z pid=");
    put_num(l, (unsigned long)getpid(), 0);
    put(l, " FATAL: ");
}

static void emit(int fd, line_t *l)
{
    l->s[l->n++] = '\n';
    const char *p = l->s;
    while (l->n) {
        ssize_t w = write(fd, p, l->n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        l->n -= (size_t)w;
    }
    l->n = 0;
}

static const char *sig_text(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV (segmentation fault)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGFPE: return "SIGFPE (arithmetic error)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGABRT: return "SIGABRT (aborted)";
    default: return "a fatal signal";
    }
}

static volatile sig_atomic_t crash_sig;

/* Gives sig to handler (SIG_DFL or one of these) and unblocks it in this
 * thread. */
static void take_signal(int sig, void (*handler)(int))
{
    struct sigaction sa = { .sa_handler = handler };
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* The backtrace hung: the process dies of the signal being reported, with
 * its core where enabled, as it would have without the report. Whichever
 * thread this runs on, the signal is unblocked there with its default. */
static void on_alarm(int s)
{
    (void)s;
    int sig = crash_sig;
    take_signal(sig, SIG_DFL);
    raise(sig);
    _exit(128 + sig);
}

/* One job line: what s runs (in shard, when not NULL), and whether its
 * thread took the signal. */
static void put_job(int fd, line_t *l, const capstan_slot_t *s, const char *shard, int faulted)
{
    put_head(l);
    put(l, "running ");
    put_field(l, s->cls, sizeof(s->cls));
    put(l, " jid=");
    put_field(l, s->jid, sizeof(s->jid));
    put(l, " on processor-");
    put_num(l, (unsigned long)s->index, 0);
    put(l, " TID-");
    put_field(l, s->tid, sizeof(s->tid));
    if (shard) {
        put(l, " in shard ");
        put_field(l, shard, sizeof(l->s));
    }
    if (faulted)
        put(l, " (its thread took the signal)");
    emit(fd, l);
}

static void report(int sig)
{
    int fd = capstan__log_fd();
    line_t l = { .n = 0 };
    put_head(&l);
    put(&l, "received ");
    put(&l, sig_text(sig));
    put(&l, "; the jobs running (first the one whose thread took it) and a backtrace follow");
    emit(fd, &l);
    /* A fault or an abort is delivered to the thread that caused it, the
     * one running here: its job is the likely culprit, the others are
     * bystanders. (pthread_self reads the thread pointer; glibc takes no
     * lock for it or for pthread_equal.) */
    pthread_t self = pthread_self();
    const capstan_slot_t *culprit = NULL;
    const char *culprit_shard = NULL;
    for (int w = 0; w < CAPSTAN_CRASH_WATCH_MAX && !culprit; w++) {
        capstan_slot_t *slots = atomic_load(&watched[w].slots);
        int n = atomic_load(&watched[w].n);
        for (int i = 0; slots && i < n && !culprit; i++)
            if (slots[i].busy && pthread_equal(slots[i].thread, self)) {
                culprit = &slots[i];
                culprit_shard = atomic_load(&watched[w].shard);
            }
    }
    if (culprit)
        put_job(fd, &l, culprit, culprit_shard, 1);
    for (int w = 0; w < CAPSTAN_CRASH_WATCH_MAX; w++) {
        capstan_slot_t *slots = atomic_load(&watched[w].slots);
        int n = atomic_load(&watched[w].n);
        const char *shard = atomic_load(&watched[w].shard);
        for (int i = 0; slots && i < n; i++)
            if (slots[i].busy && &slots[i] != culprit)
                put_job(fd, &l, &slots[i], shard, 0);
    }
    put_head(&l);
    put(&l, "backtrace:");
    emit(fd, &l);
    crash_sig = sig;
    take_signal(SIGALRM, on_alarm);
    alarm(BACKTRACE_SECONDS);
    void *frames[FRAMES];
    backtrace_symbols_fd(frames, backtrace(frames, FRAMES), fd);
}

static void on_fatal(int sig)
{
    /* One report: a second thread that faults meanwhile waits for the
     * first to end the process. */
    if (!atomic_flag_test_and_set(&reporting))
        report(sig);
    else
        for (;;)
            pause();
    struct sigaction dfl = { .sa_handler = SIG_DFL };
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* Pending until the handler returns (sig is blocked in it); a fault
     * would also recur at the faulting instruction, now with the default. */
    raise(sig);
}

void capstan__crash_install(void)
{
    struct sigaction sa = { .sa_handler = on_fatal, .sa_flags = SA_ONSTACK };
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < NFATAL; i++) {
        struct sigaction cur;
        installed[i] = sigaction(fatal[i], NULL, &cur) == 0 && cur.sa_handler == SIG_DFL
                    && sigaction(fatal[i], &sa, &old_action[i]) == 0;
    }
    capstan__crash_thread_begin();
}

void capstan__crash_uninstall(void)
{
    for (size_t i = 0; i < NFATAL; i++)
        if (installed[i])
            sigaction(fatal[i], &old_action[i], NULL);
    memset(installed, 0, sizeof(installed));
    capstan__crash_thread_end();
}

void capstan__crash_watch(size_t member, const char *shard, capstan_slot_t *slots, int nslots)
{
    if (member >= CAPSTAN_CRASH_WATCH_MAX)
        return;
    watch_t *w = &watched[member];
    /* Emptied first: a report meanwhile sees no slots rather than a mix. */
    atomic_store(&w->n, 0);
    atomic_store(&w->slots, slots);
    atomic_store(&w->shard, shard);
    atomic_store(&w->n, slots ? nslots : 0);
}

void capstan__crash_thread_begin(void)
{
    stack_t cur;
    if (alt_stack || (sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)))
        return;
    /* Mapped, not malloc'd: its pages cost memory only once a crash
     * touches them, and they leave no hole in the heap. */
    void *p = mmap(NULL, ALT_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
    stack_t st = { .ss_sp = p, .ss_size = ALT_STACK };
    if (sigaltstack(&st, NULL) == 0)
        alt_stack = p;
    else
        munmap(p, ALT_STACK);
}

void capstan__crash_thread_end(void)
{
    if (!alt_stack)
        return;
    stack_t off = { .ss_flags = SS_DISABLE };
    sigaltstack(&off, NULL);
    munmap(alt_stack, ALT_STACK);
    alt_stack = NULL;
}
