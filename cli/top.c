/* `capstan top`: a live view of the whole fleet, redrawn every interval on a
 * terminal (like sidekiqmon, but live): queues with size, latency and whether paused,
 * processes (capstan or Ruby) with busy/total and RSS, throughput over the last minute,
 * schedule/retry/dead sizes and the most contended uniqueness lock types.
 * With stdout not a terminal it prints one plain snapshot and exits, so it
 * can be piped or run from cron. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "support/buf.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "support/number.h"
#include "observe/overview.h"
#include "support/time.h"
#include "capstan/capstan.h"
#include "capstan/redis.h"
#include "unique/admin.h"

static const char *usage =
    "Usage: capstan top [--interval SECONDS] [--redis-url URL]\n"
    "\n"
    "A live view of the queues (size, latency, paused), the processes (capstan or\n"
    "Ruby Sidekiq, busy/total threads, RSS), throughput over the last minute, the schedule/retry/dead\n"
    "sizes and the uniqueness lock types denied most in the last hour.\n"
    "Redrawn every SECONDS (default 1) on a terminal; q or Ctrl-C quits.\n"
    "When stdout is not a terminal, prints one snapshot and exits.\n";

#define WINDOW 60.0      /* seconds of throughput history */
/* Processes add to stat:processed once per heartbeat (5 s by default), so
 * a rate over a shorter span is mostly noise. */
#define MIN_SPAN 10.0
#define MAX_SAMPLES 4096
#define TOP_LOCKS 5

typedef struct sample {
    double t;            /* capstan__mono() */
    long long processed, failed;
} sample_t;

typedef struct history {
    sample_t s[MAX_SAMPLES];
    size_t first, n;     /* a ring */
} history_t;

static volatile sig_atomic_t stop_flag, resized;

static void on_stop(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void on_winch(int sig)
{
    (void)sig;
    resized = 1;
}

/* Keeps the samples of the last WINDOW seconds, plus the one just before
 * (so the rate spans the whole window once there is that much history). */
static void history_add(history_t *h, double t, long long processed, long long failed)
{
    if (h->n == MAX_SAMPLES) {
        h->first = (h->first + 1) % MAX_SAMPLES;
        h->n--;
    }
    h->s[(h->first + h->n) % MAX_SAMPLES] = (sample_t){ t, processed, failed };
    h->n++;
    while (h->n > 2 && t - h->s[(h->first + 1) % MAX_SAMPLES].t >= WINDOW) {
        h->first = (h->first + 1) % MAX_SAMPLES;
        h->n--;
    }
}

/* Jobs per second between the oldest and newest sample; the span in
 * *span (0 while there is less than MIN_SPAN of history). */
static void history_rate(const history_t *h, double *proc, double *fail, double *span)
{
    *proc = *fail = *span = 0;
    if (h->n < 2)
        return;
    const sample_t *a = &h->s[h->first], *b = &h->s[(h->first + h->n - 1) % MAX_SAMPLES];
    double dt = b->t - a->t;
    if (dt < MIN_SPAN)
        return;
    /* A counter reset (FLUSHDB, a new Redis) would give a negative rate. */
    *proc = b->processed >= a->processed ? (double)(b->processed - a->processed) / dt : 0;
    *fail = b->failed >= a->failed ? (double)(b->failed - a->failed) / dt : 0;
    *span = dt;
}

static int by_denied(const void *x, const void *y)
{
    const capstan_unique_metrics_row_t *a = x, *b = y;
    if (a->denied != b->denied)
        return a->denied < b->denied ? 1 : -1;
    return strcmp(a->type, b->type);
}

static void human_secs(char *out, size_t n, double s)
{
    if (s < 60)
        snprintf(out, n, "%.1fs", s);
    else if (s < 3600)
        snprintf(out, n, "%ldm%02lds", (long)s / 60, (long)s % 60);
    else
        snprintf(out, n, "%.1fh", s / 3600);
}

/* One frame of the view into b. */
static void render(capstan_buf_t *b, const char *name, const capstan_overview_t *ov,
                   capstan_unique_metrics_t *locks, const history_t *h, double interval, int live)
{
    char when[32], lat[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(when, sizeof(when), "%H:%M:%S", &tm);
    capstan__buf_printf(b, "capstan top  %s  %s", name, when);
    if (live)
        capstan__buf_printf(b, "  (every %gs; q quits)", interval);
    capstan__buf_puts(b, "\n");

    double rp, rf, span;
    history_rate(h, &rp, &rf, &span);
    capstan__buf_printf(b, "Processed: %lld  Failed: %lld  ", ov->processed, ov->failed);
    if (span > 0)
        capstan__buf_printf(b, "Throughput: %.1f jobs/s, %.1f failed/s (last %.0fs)\n", rp, rf, span);
    else
        capstan__buf_puts(b, "Throughput: - (measured over the next minute)\n");
    capstan__buf_printf(b, "Scheduled: %lld  Retries: %lld  Dead: %lld\n\n", ov->scheduled,
                        ov->retries, ov->dead);

    capstan__buf_printf(b, "%-32s %10s %12s\n", "QUEUE", "SIZE", "LATENCY");
    for (size_t i = 0; i < ov->nqueues; i++) {
        human_secs(lat, sizeof(lat), ov->queues[i].latency);
        capstan__buf_printf(b, "%-32s %10lld %12s%s\n", ov->queues[i].name, ov->queues[i].size, lat,
                            ov->queues[i].paused ? "  paused" : "");
    }
    if (!ov->nqueues)
        capstan__buf_puts(b, "(no queues)\n");

    /* RUNTIME tells a mixed fleet apart: capstan and its version, or ruby
     * and the Sidekiq version (none before 7.0). */
    capstan__buf_printf(b, "\n%-36s %-14s %8s %10s %8s\n", "PROCESS", "RUNTIME", "BUSY", "RSS", "BEAT");
    double wall = capstan__now();
    for (size_t i = 0; i < ov->nprocesses; i++) {
        const capstan_overview_process_t *p = &ov->processes[i];
        char busy[48], rss[32], beat[32], kind[48];
        snprintf(kind, sizeof(kind), "%s%s%s", p->capstan ? "capstan" : "ruby", p->version ? " " : "",
                 p->version ? p->version : "");
        snprintf(busy, sizeof(busy), "%lld/%lld", p->busy < 0 ? 0 : p->busy,
                 p->concurrency < 0 ? 0 : p->concurrency);
        if (p->rss >= 0)
            snprintf(rss, sizeof(rss), "%.1f MB", (double)p->rss / 1024);
        else
            snprintf(rss, sizeof(rss), "-");
        if (p->beat > 0)
            human_secs(beat, sizeof(beat), wall - p->beat < 0 ? 0 : wall - p->beat);
        else
            snprintf(beat, sizeof(beat), "-");
        char sup[64] = "";
        if (p->supervisor > 0)
            snprintf(sup, sizeof(sup), "  worker %lld of supervisor %lld", p->worker, p->supervisor);
        capstan__buf_printf(b, "%-36s %-14s %8s %10s %8s%s%s\n", p->identity, kind, busy, rss, beat,
                            p->quiet == 1 ? "  quiet" : "", sup);
    }
    if (!ov->nprocesses)
        capstan__buf_puts(b, "(no live processes)\n");

    capstan__buf_printf(b, "\n%-32s %8s %9s %9s %9s\n", "CONTENDED LOCKS (last hour)", "DENIED",
                        "ACQUIRED", "RELEASED", "FAILURES");
    size_t shown = 0;
    if (locks && locks->n > 1) {
        /* The total row stays last in the reader's order; rank the others. */
        qsort(locks->rows, locks->n - 1, sizeof(*locks->rows), by_denied);
        for (size_t i = 0; i + 1 < locks->n && shown < TOP_LOCKS; i++) {
            const capstan_unique_metrics_row_t *r = &locks->rows[i];
            if (r->denied <= 0)
                continue;
            capstan__buf_printf(b, "%-32s %8lld %9lld %9lld %9lld\n", r->type, r->denied, r->acquired,
                                r->released, r->failures);
            shown++;
        }
    }
    if (!shown)
        capstan__buf_puts(b, locks ? "(no lock was denied)\n" : "(lock metrics unavailable)\n");
}

/* Reads everything a frame shows. Returns 0 or CAPSTAN_EREDIS with err. */
static int sample(capstan_redis_t *r, capstan_overview_t *ov, capstan_unique_metrics_t *locks,
                  int *have_locks, history_t *h, char *err)
{
    if (!capstan_redis_ok(r) && capstan_redis_connect(r))
        return capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
    int rc = capstan__overview_read(r, 1, ov, err);
    if (rc)
        return rc;
    history_add(h, capstan__mono(), ov->processed, ov->failed);
    char lerr[CAPSTAN_ERRLEN];
    *have_locks = capstan__unique_metrics_read(r, 60, locks, lerr) == 0;
    return 0;
}

static int snapshot(capstan_redis_t *r)
{
    history_t *h = calloc(1, sizeof(*h));
    capstan_overview_t ov;
    capstan_unique_metrics_t locks = {0};
    int have_locks = 0, status = 0;
    char err[CAPSTAN_ERRLEN];
    memset(&ov, 0, sizeof(ov));
    if (!h) {
        fprintf(stderr, "capstan top: out of memory\n");
        return 1;
    }
    if (sample(r, &ov, &locks, &have_locks, h, err)) {
        fprintf(stderr, "capstan top: %s\n", err);
        status = 1;
        goto out;
    }
    capstan_buf_t b = {0};
    render(&b, capstan_redis_name(r), &ov, have_locks ? &locks : NULL, h, 0, 0);
    if (b.p)
        fputs(b.p, stdout);
    capstan__buf_free(&b);
out:
    capstan__overview_clear(&ov);
    capstan__unique_metrics_clear(&locks);
    free(h);
    return status;
}

/* Writes frame to the terminal: each line cut to the width, cleared to its
 * end, at most rows lines, then the rest of the screen cleared. */
static void draw(const char *frame)
{
    struct winsize ws = {0};
    int cols = 120, rows = 40;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) {
        cols = ws.ws_col;
        rows = ws.ws_row;
    }
    capstan_buf_t out = {0};
    capstan__buf_puts(&out, "\033[H");
    int line = 0;
    for (const char *p = frame; *p && line < rows; line++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        capstan__buf_put(&out, p, len < (size_t)cols ? len : (size_t)cols);
        capstan__buf_puts(&out, line + 1 < rows ? "\033[K\r\n" : "\033[K");
        p += len + (nl != NULL);
    }
    capstan__buf_puts(&out, "\033[J");
    for (size_t off = 0; out.p && off < out.len;) {
        ssize_t w = write(STDOUT_FILENO, out.p + off, out.len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    capstan__buf_free(&out);
}

static void put_str(const char *s)
{
    ssize_t w = write(STDOUT_FILENO, s, strlen(s));
    (void)w;
}

static int live(capstan_redis_t *r, double interval)
{
    struct termios saved, raw;
    int have_tty_in = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
    int restore = have_tty_in;
    if (have_tty_in) {
        /* Keys arrive one at a time without echo; ISIG stays, so Ctrl-C
         * still sends SIGINT. */
        raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_stop; /* no SA_RESTART: poll returns at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_winch;
    sigaction(SIGWINCH, &sa, NULL);
    put_str("\033[?1049h\033[?25l\033[2J"); /* alternate screen, cursor hidden */

    history_t *h = calloc(1, sizeof(*h));
    char err[CAPSTAN_ERRLEN];
    while (h && !stop_flag) {
        capstan_overview_t ov;
        capstan_unique_metrics_t locks = {0};
        int have_locks = 0;
        memset(&ov, 0, sizeof(ov));
        capstan_buf_t frame = {0};
        if (sample(r, &ov, &locks, &have_locks, h, err) == 0)
            render(&frame, capstan_redis_name(r), &ov, have_locks ? &locks : NULL, h, interval, 1);
        else
            capstan__buf_printf(&frame, "capstan top  %s\n\n%s\nretrying every %gs; q quits\n",
                                capstan_redis_name(r), err, interval);
        draw(frame.p ? frame.p : "");
        capstan__buf_free(&frame);
        capstan__overview_clear(&ov);
        capstan__unique_metrics_clear(&locks);

        double until = capstan__mono() + interval;
        while (!stop_flag && !resized) {
            double left = until - capstan__mono();
            if (left <= 0)
                break;
            struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
            int n = poll(&pfd, have_tty_in ? 1 : 0, (int)(left * 1000) + 1);
            if (n > 0 && (pfd.revents & POLLIN)) {
                char c;
                ssize_t got = read(STDIN_FILENO, &c, 1);
                if (got == 1 && (c == 'q' || c == 'Q' || c == 3))
                    stop_flag = 1;
                else if (got == 0)
                    have_tty_in = 0; /* stdin closed: keep drawing, only signals quit */
            } else if (n > 0 && (pfd.revents & (POLLHUP | POLLERR))) {
                stop_flag = 1;
            }
        }
        resized = 0;
    }
    free(h);
    put_str("\033[?25h\033[?1049l");
    if (restore)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    return 0;
}

int capstan__cmd_top(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "interval", required_argument, NULL, 'i' },
        { "redis-url", required_argument, NULL, 'u' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *url = NULL;
    double interval = 1.0;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "hi:", longopts, NULL)) != -1) {
        if (opt == 'u') {
            url = optarg;
        } else if (opt == 'i') {
            if (capstan__parse_number(optarg, 0, 0.1, 3600, &interval)) {
                fprintf(stderr, "capstan top: --interval: must be a number of seconds between 0.1 "
                        "and 3600 (got \"%s\")\n", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
        } else if (opt == 'h') {
            fputs(usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "capstan top: %s: unknown option or missing value\n\n%s",
                    argv[optind - 1], usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "capstan top: unexpected argument \"%s\"\n\n%s", argv[optind], usage);
        return CAPSTAN_EXIT_USAGE;
    }
    /* A wrong URL is better said once than redrawn every second. */
    int failed = 1;
    capstan_redis_t *r = capstan__cli_connect("capstan top", url, &failed);
    if (!r)
        return failed;
    int status = isatty(STDOUT_FILENO) ? live(r, interval) : snapshot(r);
    capstan_redis_free(r);
    return status;
}
