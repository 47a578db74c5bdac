/* The in-memory metrics registry (see prometheus.h): labelled series in a
 * small chained hash table under one mutex, copied out for rendering so a
 * scrape never holds processor threads up while it formats. Labels are
 * kept escaped, so values that escape alike (two different invalid byte
 * sequences) are one series rather than two with the same labels. */
#include "observe/prometheus.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/json.h"
#include "capstan/error.h"

#define NBUCKETS_TABLE 256
#define NB 13

const double capstan__metrics_buckets[NB] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                         1,     2.5,  5,     10,   30,  60 };
const size_t capstan__metrics_nbuckets = NB;

/* What a series is; also the order families are rendered in. */
typedef enum kind { K_JOB = 0, K_DURATION, K_LOCK, K_LIMITER, K_CALLBACK, K_SKIP, K_PERIODIC, K_COUNT } kind_t;

typedef struct series {
    struct series *next;
    kind_t kind;
    char *a, *b;             /* escaped labels: class+queue, class, type+event, limiter,
                                batch event, class+reason, schedule */
    unsigned long long n1;   /* processed / histogram count / lock events / acquired /
                                skipped / ticks enqueued */
    unsigned long long n2;   /* failed / over limit / ticks missed */
    long long held;          /* a limiter's slots held now */
    unsigned long long bucket[NB]; /* non-cumulative; +Inf is n1 */
    double sum;
    /* K_DURATION of a class with a handler only: its registered name, and
     * what it did since the last capstan__metrics_exec_take, as Sidekiq's
     * execution metrics count it (observe/execution.h). */
    char *raw;
    capstan_exec_t exec;
    /* In a copy being rendered: the escaped name of the shard whose
     * registry it came from, or NULL (capstan__metrics_render_shards). */
    const char *shard;
} series_t;

struct capstan_metrics {
    pthread_mutex_t mu;
    series_t *table[NBUCKETS_TABLE];
    size_t nseries;
    atomic_long counters[CAPSTAN_METRIC_COUNTER_COUNT];
    /* The supervisor's restart counts (capstan__metrics_restarts), or NULL. */
    const atomic_long *restarts;
    int restart_slots, restart_causes;
    const char *const *restart_cause_names;
    _Atomic double clock_offset;
    atomic_int clock_known;
};

capstan_metrics_t *capstan__metrics_new(void)
{
    capstan_metrics_t *m = calloc(1, sizeof(*m));
    if (m)
        pthread_mutex_init(&m->mu, NULL);
    return m;
}

void capstan__metrics_free(capstan_metrics_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < NBUCKETS_TABLE; i++) {
        series_t *s = m->table[i];
        while (s) {
            series_t *next = s->next;
            free(s->a);
            free(s->b);
            free(s->raw);
            free(s);
            s = next;
        }
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static capstan_metrics_t *default_registry;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void make_default(void)
{
    default_registry = capstan__metrics_new();
}

void capstan__metrics_restarts(capstan_metrics_t *m, const atomic_long *counts, int nslots,
                               const char *const *causes, int ncauses)
{
    m->restarts = counts;
    m->restart_slots = nslots;
    m->restart_causes = ncauses;
    m->restart_cause_names = causes;
}

capstan_metrics_t *capstan__metrics_default(void)
{
    pthread_once(&default_once, make_default);
    return default_registry;
}

/* The registry of the shard the calling thread serves (capstan__metrics_use). */
static _Thread_local capstan_metrics_t *thread_registry;

capstan_metrics_t *capstan__metrics_use(capstan_metrics_t *m)
{
    capstan_metrics_t *was = thread_registry;
    thread_registry = m;
    return was;
}

capstan_metrics_t *capstan__metrics_here(void)
{
    return thread_registry ? thread_registry : capstan__metrics_default();
}

static uint32_t hash(kind_t k, const char *a, const char *b)
{
    uint32_t h = 2166136261u ^ (uint32_t)k;
    for (const char *p = a; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    h = (h ^ 0xff) * 16777619u;
    for (const char *p = b; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h;
}

/* The series for (k, a, b), added when missing. Called with m->mu held.
 * NULL when out of memory. */
static series_t *find(capstan_metrics_t *m, kind_t k, const char *a, const char *b)
{
    uint32_t h = hash(k, a, b) % NBUCKETS_TABLE;
    for (series_t *s = m->table[h]; s; s = s->next)
        if (s->kind == k && !strcmp(s->a, a) && !strcmp(s->b, b))
            return s;
    series_t *s = calloc(1, sizeof(*s));
    if (!s || !(s->a = strdup(a)) || !(s->b = strdup(b))) {
        if (s)
            free(s->a);
        free(s);
        return NULL;
    }
    s->kind = k;
    s->next = m->table[h];
    m->table[h] = s;
    m->nseries++;
    return s;
}

/* find(), folding new class labels into "_other" once the table is full. */
static series_t *find_capped(capstan_metrics_t *m, kind_t k, const char *a, const char *b)
{
    if (m->nseries >= CAPSTAN_METRICS_MAX_SERIES) {
        uint32_t h = hash(k, a, b) % NBUCKETS_TABLE;
        for (series_t *s = m->table[h]; s; s = s->next)
            if (s->kind == k && !strcmp(s->a, a) && !strcmp(s->b, b))
                return s;
        a = "_other";
    }
    return find(m, k, a, b);
}

/* One observation into a histogram series (NULL: none). Under m->mu. */
static void observe(series_t *d, double seconds)
{
    if (!d)
        return;
    size_t i = 0;
    while (i < NB && seconds > capstan__metrics_buckets[i])
        i++;
    if (i < NB)
        d->bucket[i]++;
    d->n1++;
    d->sum += seconds;
}

/* Whether capstan__metrics_escape would keep s as it is. */
static int plain(const char *s)
{
    /* The ASCII bytes that need escaping, and the NUL that ends s: one
     * load per byte (this runs on a job's class and queue). */
    static const unsigned char stop[128] = { [0] = 1, ['\n'] = 1, ['"'] = 1, ['\\'] = 1 };
    const unsigned char *c = (const unsigned char *)s;
    while (*c < 0x80 && !stop[*c])
        c++;
    return *c == '\0';
}

void capstan__metrics_job(capstan_metrics_t *m, const char *cls, const char *queue, double seconds,
                          int failed, const char *handler)
{
    /* Once a job: a plain name (the usual one) is used as it is, another
     * escaped on the stack. */
    char cstore[128], qstore[128];
    capstan_buf_t c, q;
    capstan__buf_on(&c, cstore, sizeof(cstore));
    capstan__buf_on(&q, qstore, sizeof(qstore));
    cls = cls ? cls : "";
    queue = queue ? queue : "";
    int cplain = plain(cls), qplain = plain(queue);
    if (!m || (!cplain && capstan__metrics_escape(&c, cls)) || (!qplain && capstan__metrics_escape(&q, queue)))
        goto out;
    if (!cplain)
        cls = c.p;
    if (!qplain)
        queue = q.p;
    if (!(seconds >= 0))
        seconds = 0;
    /* A class with a handler is never folded into "_other": there are no
     * more of them than handlers, and its Sidekiq metrics need a series of
     * its own. */
    series_t *(*get)(capstan_metrics_t *, kind_t, const char *, const char *) = handler ? find : find_capped;
    pthread_mutex_lock(&m->mu);
    series_t *j = get(m, K_JOB, cls, queue);
    if (j) {
        j->n1++;
        j->n2 += failed != 0;
    }
    series_t *d = get(m, K_DURATION, cls, "");
    observe(d, seconds);
    if (d && handler && capstan__exec_class_ok(handler) && (d->raw || (d->raw = strdup(handler))))
        capstan__exec_count(&d->exec, seconds, failed);
    pthread_mutex_unlock(&m->mu);
out:
    capstan__buf_free(&c);
    capstan__buf_free(&q);
}

void capstan__metrics_skipped(capstan_metrics_t *m, const char *cls, const char *reason)
{
    char store[128];
    capstan_buf_t c;
    capstan__buf_on(&c, store, sizeof(store));
    if (!m || !reason || capstan__metrics_escape(&c, cls ? cls : ""))
        goto out;
    pthread_mutex_lock(&m->mu);
    series_t *s = find_capped(m, K_SKIP, c.p, reason);
    if (s)
        s->n1++;
    pthread_mutex_unlock(&m->mu);
out:
    capstan__buf_free(&c);
}

void capstan__metrics_batch_callback(capstan_metrics_t *m, const char *event, double seconds)
{
    capstan_buf_t e = {0};
    if (!m || capstan__metrics_escape(&e, event ? event : ""))
        goto out;
    if (!(seconds >= 0))
        seconds = 0;
    pthread_mutex_lock(&m->mu);
    observe(find_capped(m, K_CALLBACK, e.p, ""), seconds);
    pthread_mutex_unlock(&m->mu);
out:
    capstan__buf_free(&e);
}

void capstan__metrics_periodic(capstan_metrics_t *m, const char *schedule, long enqueued, long missed)
{
    capstan_buf_t e = {0};
    if (!m || capstan__metrics_escape(&e, schedule ? schedule : ""))
        goto out;
    pthread_mutex_lock(&m->mu);
    series_t *s = find_capped(m, K_PERIODIC, e.p, "");
    if (s) {
        s->n1 += enqueued > 0 ? (unsigned long long)enqueued : 0;
        s->n2 += missed > 0 ? (unsigned long long)missed : 0;
    }
    pthread_mutex_unlock(&m->mu);
out:
    capstan__buf_free(&e);
}

void capstan__metrics_lock_event(capstan_metrics_t *m, const char *lock_type, const char *event)
{
    static const char *const map[][2] = {
        { "locked", "acquired" },         { "lock_failed", "denied" },
        { "unlocked", "released" },       { "unlock_failed", "failures" },
        { "execution_failed", "failures" },
    };
    if (!m || !event)
        return;
    const char *ev = NULL;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]) && !ev; i++)
        if (!strcmp(event, map[i][0]))
            ev = map[i][1];
    char store[64]; /* a lock type's name fits: no allocation per event */
    capstan_buf_t t;
    capstan__buf_on(&t, store, sizeof(store));
    if (!ev || capstan__metrics_escape(&t, lock_type && *lock_type ? lock_type : "unknown"))
        goto out;
    pthread_mutex_lock(&m->mu);
    series_t *s = find_capped(m, K_LOCK, t.p, ev);
    if (s)
        s->n1++;
    pthread_mutex_unlock(&m->mu);
out:
    capstan__buf_free(&t);
}

void capstan__metrics_limiter(capstan_metrics_t *m, const char *name, capstan_metric_limiter_t ev,
                              double seconds, int held)
{
    capstan_buf_t l = {0};
    if (!m || capstan__metrics_escape(&l, name ? name : ""))
        goto out;
    if (!(seconds >= 0))
        seconds = 0;
    pthread_mutex_lock(&m->mu);
    series_t *s = find_capped(m, K_LIMITER, l.p, "");
    if (s && ev == CAPSTAN_LIMITER_RELEASED) {
        /* Not below 0: a release of a token some other process took. */
        s->held -= s->held > 0;
    } else if (s) {
        /* The wait histogram's count is acquired + over limit. */
        if (ev == CAPSTAN_LIMITER_ACQUIRED)
            s->n1++;
        else
            s->n2++;
        size_t i = 0;
        while (i < NB && seconds > capstan__metrics_buckets[i])
            i++;
        if (i < NB)
            s->bucket[i]++;
        s->sum += seconds;
        s->held += ev == CAPSTAN_LIMITER_ACQUIRED && held;
    }
    pthread_mutex_unlock(&m->mu);
out:
    capstan__buf_free(&l);
}

void capstan__metrics_batch_fired(capstan_metrics_t *m, long long flags)
{
    capstan__metrics_add(m, CAPSTAN_METRIC_BATCHES_COMPLETED, (long)((flags >> 2) & 1023));
    capstan__metrics_add(m, CAPSTAN_METRIC_BATCHES_SUCCEEDED, (long)((flags >> 12) & 1023));
    capstan__metrics_add(m, CAPSTAN_METRIC_BATCHES_DIED, (long)((flags >> 22) & 1023));
}

void capstan__metrics_add(capstan_metrics_t *m, capstan_metric_counter_t c, long n)
{
    if (m && c >= 0 && c < CAPSTAN_METRIC_COUNTER_COUNT && n > 0)
        atomic_fetch_add(&m->counters[c], n);
}

void capstan__metrics_clock_offset(capstan_metrics_t *m, double seconds)
{
    if (!m)
        return;
    atomic_store(&m->clock_offset, seconds);
    atomic_store(&m->clock_known, 1);
}

size_t capstan__metrics_exec_take(capstan_metrics_t *m, capstan_exec_t **out)
{
    *out = NULL;
    if (!m)
        return 0;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < NBUCKETS_TABLE; i++)
        for (series_t *s = m->table[i]; s; s = s->next)
            cap += s->kind == K_DURATION && s->exec.processed;
    capstan_exec_t *e = cap ? calloc(cap, sizeof(*e)) : NULL;
    for (size_t i = 0; e && i < NBUCKETS_TABLE; i++)
        for (series_t *s = m->table[i]; s; s = s->next) {
            if (s->kind != K_DURATION || !s->exec.processed || !(e[n].cls = strdup(s->raw)))
                continue;
            char *cls = e[n].cls;
            e[n] = s->exec;
            e[n++].cls = cls;
            memset(&s->exec, 0, sizeof(s->exec));
        }
    pthread_mutex_unlock(&m->mu);
    *out = e;
    return n;
}

long capstan__metrics_get(capstan_metrics_t *m, capstan_metric_counter_t c)
{
    return m && c >= 0 && c < CAPSTAN_METRIC_COUNTER_COUNT ? (long)atomic_load(&m->counters[c]) : 0;
}

int capstan__metrics_escape(capstan_buf_t *b, const char *s)
{
    size_t len = strlen(s), run = 0; /* run: start of bytes not yet copied */
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x80 && ch != '\\' && ch != '"' && ch != '\n') {
            i++; /* the usual byte, kept */
            continue;
        }
        size_t k = capstan__utf8_seq(s + i, len - i);
        const char *rep = !k ? "\xEF\xBF\xBD" /* U+FFFD for a byte outside UTF-8 */
                        : s[i] == '\\' ? "\\\\"
                        : s[i] == '"' ? "\\\""
                        : s[i] == '\n' ? "\\n"
                        : NULL;
        if (!rep) {
            i += k;
            continue;
        }
        rc = capstan__buf_put(b, s + run, i - run);
        if (!rc)
            rc = capstan__buf_puts(b, rep);
        i += k ? k : 1;
        run = i;
    }
    return rc ? rc : capstan__buf_put(b, s + run, len - run);
}

static int by_labels(const void *x, const void *y)
{
    const series_t *a = x, *b = y;
    if (a->kind != b->kind)
        return (int)a->kind - (int)b->kind;
    if (a->shard != b->shard) {
        int c = !a->shard ? -1 : !b->shard ? 1 : strcmp(a->shard, b->shard);
        if (c)
            return c;
    }
    int c = strcmp(a->a, b->a);
    return c ? c : strcmp(a->b, b->b);
}

/* Appends a copy of every series of m to *s (*n of them; the labels fresh
 * strdups, shard borrowed), grown as needed. 0 or CAPSTAN_ENOMEM; what
 * was copied is in *s either way, for free_copy. */
static int copy_all(capstan_metrics_t *m, const char *shard, series_t **s, size_t *n)
{
    pthread_mutex_lock(&m->mu);
    series_t *out = realloc(*s, (*n + m->nseries + 1) * sizeof(*out));
    int rc = out ? 0 : CAPSTAN_ENOMEM;
    for (size_t i = 0; out && i < NBUCKETS_TABLE; i++)
        for (series_t *e = m->table[i]; e; e = e->next) {
            series_t *c = &out[(*n)++];
            *c = *e;
            c->next = NULL;
            c->raw = NULL;
            c->shard = shard;
            c->a = strdup(e->a);
            c->b = strdup(e->b);
            if (!c->a || !c->b)
                rc = CAPSTAN_ENOMEM;
        }
    pthread_mutex_unlock(&m->mu);
    if (out)
        *s = out;
    return rc;
}

static void free_copy(series_t *s, size_t n)
{
    for (size_t i = 0; s && i < n; i++) {
        free(s[i].a);
        free(s[i].b);
    }
    free(s);
}

static int family(capstan_buf_t *b, const char *name, const char *type, const char *help)
{
    return capstan__buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{[shard="s",]l1="v1"[,l2="v2"]}; the values are escaped already. */
static int sample_head(capstan_buf_t *b, const char *name, const char *shard, const char *l1,
                       const char *v1, const char *l2, const char *v2)
{
    int rc = shard ? capstan__buf_printf(b, "%s{shard=\"%s\",", name, shard)
                   : capstan__buf_printf(b, "%s{", name);
    if (!rc && l2)
        return capstan__buf_printf(b, "%s=\"%s\",%s=\"%s\"", l1, v1, l2, v2);
    return rc ? rc : capstan__buf_printf(b, "%s=\"%s\"", l1, v1);
}

static int render_jobs(capstan_buf_t *b, const series_t *s, size_t n, int failed)
{
    const char *name = failed ? "capstan_jobs_failed_total" : "capstan_jobs_processed_total";
    int rc = family(b, name, "counter",
                    failed ? "Jobs that failed, by class and queue."
                           : "Jobs run to the end (failed ones included), by class and queue.");
    for (size_t i = 0; i < n && !rc; i++) {
        if (s[i].kind != K_JOB)
            continue;
        rc = sample_head(b, name, s[i].shard, "class", s[i].a, "queue", s[i].b);
        if (!rc) rc = capstan__buf_printf(b, "} %llu\n", failed ? s[i].n2 : s[i].n1);
    }
    return rc;
}

static int render_skipped(capstan_buf_t *b, const series_t *s, size_t n)
{
    const char *name = "capstan_jobs_skipped_total";
    int rc = family(b, name, "counter",
                    "Jobs finished without their handler running, by class and reason: "
                    "rejected, skipped or rescheduled by a uniqueness conflict, or expired "
                    "(expires_at passed); not in capstan_jobs_processed_total.");
    for (size_t i = 0; i < n && !rc; i++) {
        if (s[i].kind != K_SKIP)
            continue;
        rc = sample_head(b, name, s[i].shard, "class", s[i].a, "reason", s[i].b);
        if (!rc) rc = capstan__buf_printf(b, "} %llu\n", s[i].n1);
    }
    return rc;
}

/* The histograms of kind, one per value of its label. */
static int render_histograms(capstan_buf_t *b, const series_t *s, size_t n, kind_t kind,
                             const char *name, const char *label, const char *help)
{
    int rc = family(b, name, "histogram", help);
    char sample[96];
    for (size_t i = 0; i < n && !rc; i++) {
        if (s[i].kind != kind)
            continue;
        unsigned long long cum = 0;
        for (size_t k = 0; k <= NB && !rc; k++) {
            char le[32];
            if (k < NB) {
                cum += s[i].bucket[k];
                snprintf(le, sizeof(le), "%g", capstan__metrics_buckets[k]);
            } else {
                cum = s[i].n1;
                snprintf(le, sizeof(le), "+Inf");
            }
            snprintf(sample, sizeof(sample), "%s_bucket", name);
            rc = sample_head(b, sample, s[i].shard, label, s[i].a, "le", le);
            if (!rc) rc = capstan__buf_printf(b, "} %llu\n", cum);
        }
        snprintf(sample, sizeof(sample), "%s_sum", name);
        if (!rc) rc = sample_head(b, sample, s[i].shard, label, s[i].a, NULL, NULL);
        if (!rc) rc = capstan__buf_printf(b, "} %.9g\n", s[i].sum);
        snprintf(sample, sizeof(sample), "%s_count", name);
        if (!rc) rc = sample_head(b, sample, s[i].shard, label, s[i].a, NULL, NULL);
        if (!rc) rc = capstan__buf_printf(b, "} %llu\n", s[i].n1);
    }
    return rc;
}

static int render_locks(capstan_buf_t *b, const series_t *s, size_t n)
{
    const char *name = "capstan_lock_events_total";
    int rc = family(b, name, "counter",
                    "Uniqueness lock events of this process by lock type: acquired, denied, "
                    "released, failures (v9's locked, lock_failed, unlocked, "
                    "unlock_failed + execution_failed).");
    for (size_t i = 0; i < n && !rc; i++) {
        if (s[i].kind != K_LOCK)
            continue;
        rc = sample_head(b, name, s[i].shard, "type", s[i].a, "event", s[i].b);
        if (!rc) rc = capstan__buf_printf(b, "} %llu\n", s[i].n1);
    }
    return rc;
}

static int render_limiters(capstan_buf_t *b, const series_t *s, size_t n)
{
    static const struct { const char *name, *type, *help; } fam[] = {
        { "capstan_limiter_acquired_total", "counter",
          "Acquisitions of a rate limiter by this process that took a slot." },
        { "capstan_limiter_over_limit_total", "counter",
          "Acquisitions of a rate limiter by this process that found it over its limit "
          "for their whole wait." },
        { "capstan_limiter_held", "gauge", "Concurrent limiter slots this process holds now." },
        { "capstan_limiter_wait_seconds", "histogram",
          "Time acquisitions of a rate limiter took, taken or not." },
    };
    int rc = 0;
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]) && !rc; f++) {
        rc = family(b, fam[f].name, fam[f].type, fam[f].help);
        for (size_t i = 0; i < n && !rc; i++) {
            if (s[i].kind != K_LIMITER)
                continue;
            if (f < 3) {
                rc = sample_head(b, fam[f].name, s[i].shard, "limiter", s[i].a, NULL, NULL);
                if (!rc)
                    rc = capstan__buf_printf(b, "} %lld\n", f == 0 ? (long long)s[i].n1
                                                     : f == 1 ? (long long)s[i].n2 : s[i].held);
                continue;
            }
            unsigned long long cum = 0, count = s[i].n1 + s[i].n2;
            for (size_t k = 0; k <= NB && !rc; k++) {
                char le[32];
                cum = k < NB ? cum + s[i].bucket[k] : count;
                if (k < NB)
                    snprintf(le, sizeof(le), "%g", capstan__metrics_buckets[k]);
                else
                    snprintf(le, sizeof(le), "+Inf");
                rc = sample_head(b, "capstan_limiter_wait_seconds_bucket", s[i].shard, "limiter", s[i].a,
                                 "le", le);
                if (!rc) rc = capstan__buf_printf(b, "} %llu\n", cum);
            }
            if (!rc) rc = sample_head(b, "capstan_limiter_wait_seconds_sum", s[i].shard, "limiter", s[i].a, NULL, NULL);
            if (!rc) rc = capstan__buf_printf(b, "} %.9g\n", s[i].sum);
            if (!rc) rc = sample_head(b, "capstan_limiter_wait_seconds_count", s[i].shard, "limiter", s[i].a, NULL, NULL);
            if (!rc) rc = capstan__buf_printf(b, "} %llu\n", count);
        }
    }
    return rc;
}

static int render_periodic(capstan_buf_t *b, const series_t *s, size_t n)
{
    static const struct { const char *name, *help; } fam[] = {
        { "capstan_periodic_enqueued_total",
          "Ticks of a periodic schedule this process enqueued (each tick is enqueued by one "
          "process of the fleet)." },
        { "capstan_periodic_missed_total",
          "Ticks of a periodic schedule no process enqueued at their time, that this process "
          "found and let go by the schedule's missed policy." },
    };
    int rc = 0;
    for (size_t f = 0; f < 2 && !rc; f++) {
        rc = family(b, fam[f].name, "counter", fam[f].help);
        for (size_t i = 0; i < n && !rc; i++) {
            if (s[i].kind != K_PERIODIC)
                continue;
            rc = sample_head(b, fam[f].name, s[i].shard, "schedule", s[i].a, NULL, NULL);
            if (!rc) rc = capstan__buf_printf(b, "} %llu\n", f == 0 ? s[i].n1 : s[i].n2);
        }
    }
    return rc;
}

/* The clock offset gauge: m's, then each shard's (labelled), as measured;
 * absent until a first measure. */
static int render_clock(capstan_buf_t *b, capstan_metrics_t *m, capstan_metrics_t *const *shards,
                        char *const *shard, size_t nshards)
{
    int known = atomic_load(&m->clock_known), rc = 0;
    for (size_t i = 0; i < nshards; i++)
        known |= shards[i] && atomic_load(&shards[i]->clock_known);
    if (known)
        rc = family(b, "capstan_clock_offset_seconds", "gauge",
                    "How far this process's clock is ahead of Redis's (negative: behind), as its "
                    "last heartbeat measured; periodic ticks follow Redis's.");
    if (!rc && atomic_load(&m->clock_known))
        rc = capstan__buf_printf(b, "capstan_clock_offset_seconds %.3f\n", atomic_load(&m->clock_offset));
    for (size_t i = 0; i < nshards && !rc; i++)
        if (shards[i] && atomic_load(&shards[i]->clock_known))
            rc = capstan__buf_printf(b, "capstan_clock_offset_seconds{shard=\"%s\"} %.3f\n", shard[i],
                                     atomic_load(&shards[i]->clock_offset));
    return rc;
}

int capstan__metrics_render(capstan_metrics_t *m, capstan_buf_t *b)
{
    return capstan__metrics_render_shards(m, NULL, NULL, 0, b);
}

int capstan__metrics_render_shards(capstan_metrics_t *m, capstan_metrics_t *const *shards,
                                   const char *const *names, size_t nshards, capstan_buf_t *b)
{
    static const struct { const char *name, *help; } counters[CAPSTAN_METRIC_COUNTER_COUNT] = {
        [CAPSTAN_METRIC_ORPHANS_RECOVERED] = { "capstan_orphans_recovered_total",
            "Jobs this process put back from the working lists of dead processes." },
        [CAPSTAN_METRIC_POISON_PILLS] = { "capstan_poison_pills_total",
            "Jobs this process sent to the dead set after max_recoveries recoveries." },
        [CAPSTAN_METRIC_REDIS_RECONNECTS] = { "capstan_redis_reconnects_total",
            "Redis connections this process re-established after they broke." },
        [CAPSTAN_METRIC_BATCHES_COMPLETED] = { "capstan_batches_completed_total",
            "Batches whose complete callback an ack or commit of this process fired." },
        [CAPSTAN_METRIC_BATCHES_SUCCEEDED] = { "capstan_batches_succeeded_total",
            "Batches whose success callback an ack or commit of this process fired." },
        [CAPSTAN_METRIC_BATCHES_DIED] = { "capstan_batches_died_total",
            "Batches whose death callback an ack or commit of this process fired." },
        [CAPSTAN_METRIC_LATE_ACKS] = { "capstan_late_acks_total",
            "Finished jobs that were no longer in this process's working list when it acked "
            "them: given back for another run meanwhile, by this process or by another's "
            "recovery (they may run again), or acked by an earlier try whose reply was lost." },
        [CAPSTAN_METRIC_ITERATIONS_INTERRUPTED] = { "capstan_iterations_interrupted_total",
            "Runs of iterable jobs stopped between two steps (quiet, shutdown or "
            "max_iteration_runtime) and put back in their queue." },
        [CAPSTAN_METRIC_FETCH_ERRORS] = { "capstan_fetch_errors_total",
            "Fetches Redis answered with an error (NOPERM from an ACL, OOM, a queue of another "
            "type): each is retried a second later, and a count that keeps growing means the "
            "process fetches little or nothing." },
        [CAPSTAN_METRIC_ITERATIONS_RESUMED] = { "capstan_iterations_resumed_total",
            "Runs of iterable jobs that went on from a saved cursor." },
        [CAPSTAN_METRIC_ITERATIONS_CANCELLED] = { "capstan_iterations_cancelled_total",
            "Runs of iterable jobs that stopped because the job was cancelled." },
    };
    if (!m)
        return CAPSTAN_EINVAL;
    /* One copy of all the series, each shard's labelled with its name, so
     * that each family is rendered once. */
    size_t n = 0;
    series_t *s = NULL;
    char **shard = nshards ? calloc(nshards, sizeof(*shard)) : NULL;
    int rc = nshards && !shard ? CAPSTAN_ENOMEM : copy_all(m, NULL, &s, &n);
    for (size_t i = 0; i < nshards && !rc; i++) {
        capstan_buf_t e = { 0 };
        rc = capstan__metrics_escape(&e, names[i]);
        if (!rc && !(shard[i] = capstan__buf_take(&e, NULL)))
            rc = CAPSTAN_ENOMEM;
        capstan__buf_free(&e);
        if (!rc && shards[i])
            rc = copy_all(shards[i], shard[i], &s, &n);
    }
    if (!rc)
        qsort(s, n, sizeof(*s), by_labels);
    if (!rc) rc = render_jobs(b, s, n, 0);
    if (!rc) rc = render_jobs(b, s, n, 1);
    if (!rc) rc = render_skipped(b, s, n);
    if (!rc) rc = render_histograms(b, s, n, K_DURATION, "capstan_job_duration_seconds", "class",
                                    "Time jobs took in the middleware chain and handler.");
    if (!rc) rc = render_locks(b, s, n);
    if (!rc) rc = render_limiters(b, s, n);
    if (!rc) rc = render_histograms(b, s, n, K_CALLBACK, "capstan_batch_callback_latency_seconds",
                                    "event", "Time from a batch being done to its callback "
                                    "starting here, by event (complete, success, death).");
    if (!rc) rc = render_periodic(b, s, n);
    if (!rc)
        rc = render_clock(b, m, shards, shard, nshards);
    for (int c = 0; c < CAPSTAN_METRIC_COUNTER_COUNT && !rc; c++) {
        rc = family(b, counters[c].name, "counter", counters[c].help);
        /* With shards each counts its own; the process's line stays out
         * unless a thread of no shard's counted something (a program's
         * own thread). */
        long own = atomic_load(&m->counters[c]);
        if (!rc && (!nshards || own))
            rc = capstan__buf_printf(b, "%s %ld\n", counters[c].name, own);
        for (size_t i = 0; i < nshards && !rc; i++)
            if (shards[i])
                rc = capstan__buf_printf(b, "%s{shard=\"%s\"} %ld\n", counters[c].name, shard[i],
                                         atomic_load(&shards[i]->counters[c]));
    }
    if (!rc && m->restarts)
        rc = family(b, "capstan_worker_restarts_total", "counter",
                    "Worker processes the supervisor replaced, by worker slot and cause (crash, "
                    "timeout, memory, reload).");
    for (int i = 0; !rc && m->restarts && i < m->restart_slots; i++)
        for (int c = 0; !rc && c < m->restart_causes; c++)
            rc = capstan__buf_printf(b, "capstan_worker_restarts_total{slot=\"%d\",cause=\"%s\"} %ld\n", i,
                                     m->restart_cause_names[c],
                                     atomic_load(&m->restarts[i * m->restart_causes + c]));
    free_copy(s, n);
    for (size_t i = 0; shard && i < nshards; i++)
        free(shard[i]);
    free(shard);
    return rc;
}
