/* `capstan top`: a live view of the whole fleet, redrawn every interval on a
 * terminal (like sidekiqmon, but live): queues with size, latency and whether paused,
 * processes (capstan or Ruby) with busy/total and RSS, throughput over the last minute,
 * schedule/retry/dead sizes and the most contended uniqueness lock types.
 * With stdout not a terminal it prints one plain snapshot and exits, so it
 * can be piped or run from cron. */
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
    "Usage: capstan top [--interval SECONDS] [--redis-url URL | -C FILE [--shard NAME]]\n"
    "\n"
    "A live view of the queues (size, latency, paused), the processes (capstan or\n"
    "Ruby Sidekiq, busy/total threads, RSS), throughput over the last minute, the schedule/retry/dead\n"
    "sizes and the uniqueness lock types denied most in the last hour.\n"
    "Redrawn every SECONDS (default 1) on a terminal; q or Ctrl-C quits.\n"
    "When stdout is not a terminal, prints one snapshot and exits.\n"
    "\n"
    "With -C FILE's shards: list, a section a shard (\"== SHARD NAME\"), then the\n"
    "TOTAL of the shards: counts, throughput and threads busy added up. A shard\n"
    "that cannot be read shows why in its section and is retried; the snapshot\n"
    "then exits 1, the others shown.\n"
    "\n"
    CAPSTAN_CLI_FLEET_USAGE("that shard alone")
    "  -i, --interval SECONDS  redraw every SECONDS (default 1)\n";

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

/* A frame's first line: what it shows (name) and when. */
static void render_header(capstan_buf_t *b, const char *name, double interval, int live)
{
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(when, sizeof(when), "%H:%M:%S", &tm);
    capstan__buf_printf(b, "capstan top  %s  %s", name, when);
    if (live)
        capstan__buf_printf(b, "  (every %gs; q quits)", interval);
    capstan__buf_puts(b, "\n");
}

/* One Redis's part of a frame into b. */
static void render(capstan_buf_t *b, const capstan_overview_t *ov, capstan_unique_metrics_t *locks,
                   const history_t *h)
{
    char lat[32];
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

/* What one Redis of the view shows: the one URL, or a shard. */
typedef struct view {
    const char *shard;             /* NULL without shards */
    capstan_redis_t *r;
    history_t h;
    capstan_overview_t ov;         /* the last sample */
    capstan_unique_metrics_t locks;
    int ok, have_locks;
    char err[CAPSTAN_ERRLEN];      /* why not ok */
} view_t;

/* Reads everything a frame shows into v (v->ok, else v->err). */
static void sample(view_t *v)
{
    capstan__overview_clear(&v->ov);
    capstan__unique_metrics_clear(&v->locks);
    memset(&v->ov, 0, sizeof(v->ov));
    memset(&v->locks, 0, sizeof(v->locks));
    v->ok = v->have_locks = 0;
    if (!capstan_redis_ok(v->r) && capstan_redis_connect(v->r)) {
        snprintf(v->err, sizeof(v->err), "%s", capstan_redis_error(v->r));
        return;
    }
    if (capstan__overview_read(v->r, 1, &v->ov, v->err))
        return;
    v->ok = 1;
    history_add(&v->h, capstan__mono(), v->ov.processed, v->ov.failed);
    char lerr[CAPSTAN_ERRLEN];
    v->have_locks = capstan__unique_metrics_read(v->r, 60, &v->locks, lerr) == 0;
}

/* The last line of a sharded frame: the counts and rates of the shards
 * read, added up, with the threads busy. */
static void render_total(capstan_buf_t *b, view_t *views, size_t n)
{
    long long processed = 0, failed = 0, scheduled = 0, retries = 0, dead = 0, busy = 0, threads = 0;
    double rp = 0, rf = 0;
    size_t down = 0, measured = 0;
    for (size_t i = 0; i < n; i++) {
        const capstan_overview_t *ov = &views[i].ov;
        if (!views[i].ok) {
            down++;
            continue;
        }
        processed += ov->processed;
        failed += ov->failed;
        scheduled += ov->scheduled;
        retries += ov->retries;
        dead += ov->dead;
        for (size_t k = 0; k < ov->nprocesses; k++) {
            busy += ov->processes[k].busy > 0 ? ov->processes[k].busy : 0;
            threads += ov->processes[k].concurrency > 0 ? ov->processes[k].concurrency : 0;
        }
        double p, f, span;
        history_rate(&views[i].h, &p, &f, &span);
        if (span > 0) {
            rp += p;
            rf += f;
            measured++;
        }
    }
    capstan__buf_printf(b, "\nTOTAL of %zu shards", n);
    if (down)
        capstan__buf_printf(b, " (%zu unreachable, not counted)", down);
    capstan__buf_printf(b, "\nProcessed: %lld  Failed: %lld  ", processed, failed);
    if (measured && measured == n - down)
        capstan__buf_printf(b, "Throughput: %.1f jobs/s, %.1f failed/s\n", rp, rf);
    else
        capstan__buf_puts(b, "Throughput: - (measured over the next minute)\n");
    capstan__buf_printf(b, "Scheduled: %lld  Retries: %lld  Dead: %lld  Busy: %lld/%lld\n", scheduled,
                        retries, dead, busy, threads);
}

/* One frame of every view (n of them; views[0].shard NULL: the one
 * Redis, as before shards). */
static void render_all(capstan_buf_t *b, view_t *views, size_t n, double interval, int live)
{
    if (!views[0].shard && !views[0].ok) {
        capstan__buf_printf(b, "capstan top  %s\n\n%s\nretrying every %gs; q quits\n",
                            capstan_redis_name(views[0].r), views[0].err, interval);
        return;
    }
    if (!views[0].shard) {
        render_header(b, capstan_redis_name(views[0].r), interval, live);
        render(b, &views[0].ov, views[0].have_locks ? &views[0].locks : NULL, &views[0].h);
        return;
    }
    char name[32];
    snprintf(name, sizeof(name), "%zu shard%s", n, n == 1 ? "" : "s");
    render_header(b, name, interval, live);
    for (size_t i = 0; i < n; i++) {
        if (!views[i].ok) {
            capstan__buf_printf(b, "\n== SHARD %s  UNREACHABLE: %s\n", views[i].shard, views[i].err);
            continue;
        }
        capstan__buf_printf(b, "\n== SHARD %s  %s\n", views[i].shard, capstan_redis_name(views[i].r));
        render(b, &views[i].ov, views[i].have_locks ? &views[i].locks : NULL, &views[i].h);
    }
    if (n > 1)
        render_total(b, views, n);
}

/* One plain frame: exits 1 when a Redis could not be read (after
 * showing the others). The one Redis of a fleet without shards that
 * cannot be read gives its error alone, as it always did. */
static int snapshot(view_t *views, size_t n)
{
    int status = 0;
    for (size_t i = 0; i < n; i++) {
        sample(&views[i]);
        if (views[i].ok)
            continue;
        if (views[i].shard)
            fprintf(stderr, "capstan top: shard %s: %s\n", views[i].shard, views[i].err);
        else
            fprintf(stderr, "capstan top: %s\n", views[i].err);
        status = 1;
    }
    if (status && !views[0].shard)
        return status;
    capstan_buf_t b = {0};
    render_all(&b, views, n, 0, 0);
    if (b.p)
        fputs(b.p, stdout);
    capstan__buf_free(&b);
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
    if (out.p)
        capstan__write_all(STDOUT_FILENO, out.p, out.len);
    capstan__buf_free(&out);
}

static void put_str(const char *s)
{
    ssize_t w = write(STDOUT_FILENO, s, strlen(s));
    (void)w;
}

static int live(view_t *views, size_t n, double interval)
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

    while (!stop_flag) {
        capstan_buf_t frame = {0};
        for (size_t i = 0; i < n; i++)
            sample(&views[i]);
        render_all(&frame, views, n, interval, 1);
        draw(frame.p ? frame.p : "");
        capstan__buf_free(&frame);

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
    put_str("\033[?25h\033[?1049l");
    if (restore)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    return 0;
}

int capstan__cmd_top(int argc, char **argv)
{
    enum { OPT_SHARD = 256 };
    static const struct option longopts[] = {
        { "interval", required_argument, NULL, 'i' },
        { "redis-url", required_argument, NULL, 'u' },
        { "config", required_argument, NULL, 'C' }, { "environment", required_argument, NULL, 'e' },
        { "shard", required_argument, NULL, OPT_SHARD },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    capstan_cli_fleet_t f = {0};
    double interval = 1.0;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "hi:C:e:", longopts, NULL)) != -1) {
        if (opt == 'u') {
            f.url = optarg;
        } else if (opt == 'C') {
            f.conf = optarg;
        } else if (opt == 'e') {
            f.env = optarg;
        } else if (opt == OPT_SHARD) {
            f.shard = optarg;
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
    int status = capstan__cli_fleet_load("capstan top", &f);
    if (status >= 0) {
        capstan__cli_fleet_free(&f);
        return status;
    }
    size_t n = f.nshards ? f.nshards : 1;
    view_t *views = calloc(n, sizeof(*views));
    status = views ? 0 : 1;
    if (!views)
        fprintf(stderr, "capstan top: out of memory\n");
    /* A wrong URL is better said once than redrawn every second; a shard
     * that does not answer yet is shown as such, and retried. */
    char err[CAPSTAN_ERRLEN];
    for (size_t i = 0; views && !status && i < n; i++) {
        if (!f.nshards) {
            status = 1;
            views[i].r = capstan__cli_connect("capstan top", f.url, &status);
            status = views[i].r ? 0 : status;
        } else if (!(views[i].r = capstan_redis_new(f.shards[i].redis_url, 10, err))) {
            fprintf(stderr, "capstan top: shard %s: %s\n", f.shards[i].name, err);
            status = CAPSTAN_EXIT_CONFIG;
        } else {
            views[i].shard = f.shards[i].name;
        }
    }
    if (!status)
        status = isatty(STDOUT_FILENO) ? live(views, n, interval) : snapshot(views, n);
    for (size_t i = 0; views && i < n; i++) {
        capstan__overview_clear(&views[i].ov);
        capstan__unique_metrics_clear(&views[i].locks);
        capstan_redis_free(views[i].r);
    }
    free(views);
    capstan__cli_fleet_free(&f);
    return status;
}
