/* The runtime's look at its fleet: which of its queues a Ruby Sidekiq
 * process reads too. A job of a class without a handler here is Ruby's
 * job there, and failing it with NameError would take it from the process
 * that can run it; so unless the config sets unknown_class, such a queue's
 * unknown classes go back for Ruby (unknown_class: requeue), and the
 * others fail as Sidekiq fails them. Looked at at start, before the first
 * fetch, every recovery_interval by the housekeeper, and by a processor
 * about to fail a job for its class (at most once a second). What a look
 * sees is also kept in Redis (CAPSTAN_KEY_RUBY_READ), so that a capstan
 * that starts while Ruby's processes restart knows what the others saw. */
#include "fleet/fleet.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe/overview.h"
#include "redis/keys.h"
#include "support/buf.h"
#include "support/log.h"
#include "support/time.h"

/* How long a queue stays shared after the last look that saw a Ruby
 * process read it. A deploy stops Ruby's processes and starts new ones
 * (a clean stop leaves the process set at once), and a look that falls in
 * between must not hand Ruby's jobs to NameError; a deploy takes less. */
#define SHARED_HOLD 600.0

/* A deploy starts Ruby's processes with capstan's, and a Ruby process is
 * in the process set only from its first beat, after its boot (seconds,
 * tens of them for a large app). Until then no look tells a Ruby job from
 * a truly unknown one: for its first minute a capstan gives those jobs
 * back to their queue instead of failing them. */
#define YOUNG 60.0

/* Seconds between two looks made for a job about to fail. */
#define RELOOK 1.0

/* Ruby processes a line names before "and N more". */
#define NAMED 3

struct capstan_fleet {
    const capstan_config_t *c;
    size_t n;                /* c->nqueues */
    _Atomic double *seen;    /* capstan__mono() of the last look that saw a
                                Ruby process read queue i; 0 never */
    pthread_mutex_t mu;      /* one look at a time; guards what follows */
    unsigned char *said;     /* queue i was last logged as shared */
    double born;             /* capstan__mono() of the first look */
    double looked;           /* and of the last */
    char where[80];          /* "shard NAME: " before its lines, or "" */
};

capstan_fleet_t *capstan__fleet_new(const capstan_config_t *c, const char *shard)
{
    size_t n = c->nqueues;
    struct capstan_fleet *f = calloc(1, sizeof(*f));
    if (f) {
        pthread_mutex_init(&f->mu, NULL);
        f->c = c;
        f->n = n;
        f->seen = calloc(n ? n : 1, sizeof(*f->seen));
        f->said = calloc(n ? n : 1, 1);
        /* Each shard's Redis has its own fleet: the log says whose. */
        if (shard)
            snprintf(f->where, sizeof(f->where), "shard %s: ", shard);
    }
    if (!f || !f->seen || !f->said) {
        capstan__fleet_free(f);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        atomic_init(&f->seen[i], 0.0);
    return f;
}

void capstan__fleet_free(capstan_fleet_t *f)
{
    if (!f)
        return;
    pthread_mutex_destroy(&f->mu);
    free((void *)f->seen);
    free(f->said);
    free(f);
}

static long queue_index(const capstan_config_t *c, const char *queue)
{
    for (size_t i = 0; i < c->nqueues; i++)
        if (strcmp(c->queues[i].name, queue) == 0)
            return (long)i;
    return -1;
}

static int shared_at(const capstan_fleet_t *f, size_t i, double now)
{
    double seen = atomic_load(&f->seen[i]);
    return seen > 0 && now - seen < SHARED_HOLD;
}

int capstan__fleet_shared(const capstan_fleet_t *f, const char *queue)
{
    long i = f && queue ? queue_index(f->c, queue) : -1;
    return i >= 0 && (size_t)i < f->n && shared_at(f, (size_t)i, capstan__mono());
}

/* "id (Sidekiq 7.3.10)" for the log line. */
static void name_process(capstan_buf_t *b, const capstan_overview_process_t *p)
{
    capstan__buf_printf(b, "%s (Sidekiq%s%s)", p->identity, p->version ? " " : "",
                        p->version ? p->version : "");
}

/* "[a, b]" of the queues i whose flag in on[] is set. */
static void name_queues(capstan_buf_t *b, const capstan_config_t *c, const unsigned char *on)
{
    int first = 1;
    capstan__buf_puts(b, "[");
    for (size_t i = 0; i < c->nqueues; i++)
        if (on[i]) {
            capstan__buf_printf(b, "%s%s", first ? "" : ", ", c->queues[i].name);
            first = 0;
        }
    capstan__buf_puts(b, "]");
}

/* The one line for queues that became shared (fresh[]), naming the Ruby
 * processes reading them (ruby[], those of ov reading one of them) and
 * what happens to their jobs of classes without a handler here. */
static void say_shared(const capstan_fleet_t *f, const capstan_overview_t *ov, const unsigned char *ruby,
                       const unsigned char *fresh)
{
    const capstan_config_t *c = f->c;
    capstan_buf_t b = {0};
    size_t n = 0;
    for (size_t p = 0; p < ov->nprocesses; p++)
        if (ruby[p]) {
            if (n < NAMED) {
                capstan__buf_puts(&b, n ? ", " : "");
                name_process(&b, &ov->processes[p]);
            }
            n++;
        }
    if (n > NAMED)
        capstan__buf_printf(&b, " and %zu more", n - NAMED);
    capstan__buf_printf(&b, "%sread%s queues ", n ? " " : "", n == 1 ? "s" : "");
    name_queues(&b, c, fresh);
    /* None in the process set: another capstan saw them (remember()). */
    if (!n)
        capstan__buf_printf(&b, " less than %.0f minutes ago (a capstan saw them, %s<queue>)",
                            SHARED_HOLD / 60, CAPSTAN_KEY_RUBY_READ);
    capstan__buf_puts(&b, " as capstan does: ");
    int fails = c->unknown_class_explicit && c->unknown_class != CAPSTAN_UNKNOWN_REQUEUE;
    if (fails)
        capstan__buf_printf(&b, "unknown_class: %s is set, so jobs there of classes without a handler "
                            "here %s instead of reaching Ruby (a job's earlier error is kept); route "
                            "C classes to queues of their own, or set unknown_class: requeue",
                            capstan_config_unknown_class_name(c->unknown_class),
                            c->unknown_class == CAPSTAN_UNKNOWN_SKIP ? "go to the dead set" : "fail with NameError");
    else
        capstan__buf_printf(&b, "jobs there of classes without a handler here go back to their queue "
                            "for Ruby (unknown_class: requeue%s)",
                            c->unknown_class_explicit ? "" : ", as the config does not set unknown_class");
    if (b.p) {
        if (fails)
            capstan_warn("%sRuby Sidekiq process%s %s", f->where, n == 1 ? "" : "es", b.p);
        else
            capstan_info("%sRuby Sidekiq process%s %s", f->where, n == 1 ? "" : "es", b.p);
    }
    capstan__buf_free(&b);
}

/* Keeps in Redis, for SHARED_HOLD, the queues a Ruby process was seen
 * reading at this look (now[i]), and takes in what the looks of every
 * capstan saw: a capstan started while no Ruby process is in the process
 * set (Ruby's restart in a deploy) knows the queues Ruby read before it. */
static void remember(capstan_fleet_t *f, capstan_redis_t *r, const unsigned char *now, double mono)
{
    const capstan_config_t *c = f->c;
    double wall = capstan__now();
    char ts[32];
    snprintf(ts, sizeof(ts), "%.3f", wall);
    const char **argv = calloc(f->n + 1, sizeof(*argv));
    size_t k = 0;
    for (; argv && k < f->n && (argv[k + 1] = capstan__key_dup(CAPSTAN_KEY_RUBY_READ, c->queues[k].name)); k++)
        if (now[k])
            freeReplyObject(capstan_redis_cmdf(r, "SET %s %s EX %d", argv[k + 1], ts, (int)SHARED_HOLD));
    redisReply *got = NULL;
    if (argv && k == f->n) {
        argv[0] = "MGET";
        got = capstan_redis_cmd(r, (int)f->n + 1, argv, NULL);
    }
    for (size_t i = 0; got && got->type == REDIS_REPLY_ARRAY && i < got->elements && i < f->n; i++) {
        if (got->element[i]->type != REDIS_REPLY_STRING)
            continue;
        /* Another machine's clock may run a little ahead of ours. */
        double ago = wall - atof(got->element[i]->str), seen = mono - (ago > 0 ? ago : 0);
        if (ago < SHARED_HOLD && seen > atomic_load(&f->seen[i]))
            atomic_store(&f->seen[i], seen);
    }
    if (argv && !got)
        capstan_debug("fleet look: %s", capstan_redis_error(r));
    freeReplyObject(got);
    for (size_t i = 0; argv && i < k; i++)
        free((void *)argv[i + 1]);
    free(argv);
}

/* capstan__fleet_look, with f->mu held. */
static void look(capstan_fleet_t *f, capstan_redis_t *r)
{
    const capstan_config_t *c = f->c;
    double now = capstan__mono();
    f->looked = now;
    if (!f->born)
        f->born = now;
    capstan_overview_t ov;
    char err[CAPSTAN_ERRLEN];
    /* A look that fails changes nothing: the hold covers the next. */
    if (capstan__overview_processes(r, &ov, err)) {
        capstan_debug("fleet look: %s", err);
        capstan__overview_clear(&ov);
        return;
    }
    unsigned char *ruby = calloc(ov.nprocesses ? ov.nprocesses : 1, 1), *read = calloc(f->n, 1);
    unsigned char *fresh = calloc(f->n, 1), *gone = calloc(f->n, 1);
    if (!ruby || !read || !fresh || !gone)
        goto out;
    size_t nruby = 0;
    for (size_t p = 0; p < ov.nprocesses; p++) {
        const capstan_overview_process_t *pr = &ov.processes[p];
        if (pr->capstan)
            continue;
        nruby++;
        for (size_t q = 0; q < pr->nqueues; q++) {
            long i = queue_index(c, pr->queues[q]);
            if (i < 0)
                continue;
            atomic_store(&f->seen[i], now);
            read[i] = 1;
            ruby[p] = 1;
        }
    }
    remember(f, r, read, now);
    int any_fresh = 0, any_gone = 0;
    for (size_t i = 0; i < f->n; i++) {
        int shared = shared_at(f, i, now);
        fresh[i] = shared && !f->said[i];
        gone[i] = !shared && f->said[i];
        any_fresh |= fresh[i];
        any_gone |= gone[i];
        f->said[i] = (unsigned char)shared;
    }
    /* Name only the processes reading a queue that is new to the log. */
    for (size_t p = 0; p < ov.nprocesses && any_fresh; p++) {
        int reads = 0;
        for (size_t q = 0; ruby[p] && q < ov.processes[p].nqueues && !reads; q++) {
            long i = queue_index(c, ov.processes[p].queues[q]);
            reads = i >= 0 && fresh[i];
        }
        ruby[p] = (unsigned char)reads;
    }
    if (any_fresh)
        say_shared(f, &ov, ruby, fresh);
    if (any_gone) {
        capstan_buf_t b = {0};
        name_queues(&b, c, gone);
        if (c->unknown_class_explicit)
            capstan_info("%sno Ruby Sidekiq process has read queues %s for %.0f minutes", f->where,
                         b.p ? b.p : "", SHARED_HOLD / 60);
        else
            capstan_info("%sno Ruby Sidekiq process has read queues %s for %.0f minutes: jobs there of "
                         "classes without a handler here follow unknown_class: %s again",
                         f->where, b.p ? b.p : "", SHARED_HOLD / 60,
                         capstan_config_unknown_class_name(c->unknown_class));
        capstan__buf_free(&b);
    }
    capstan_debug("fleet: %zu processes, %zu of them Ruby Sidekiq", ov.nprocesses, nruby);
out:
    free(ruby);
    free(read);
    free(fresh);
    free(gone);
    capstan__overview_clear(&ov);
}

void capstan__fleet_look(capstan_fleet_t *f, capstan_redis_t *r)
{
    if (!f || !f->n)
        return;
    pthread_mutex_lock(&f->mu);
    look(f, r);
    pthread_mutex_unlock(&f->mu);
}

capstan_unknown_class_t capstan__unknown_policy(capstan_fleet_t *f, const capstan_config_t *c, capstan_redis_t *r,
                                                const char *queue, const char **why)
{
    *why = NULL;
    if (c->unknown_class_explicit || !f || !f->n)
        return c->unknown_class;
    /* A Ruby process may have come since the last look. */
    int shared = capstan__fleet_shared(f, queue);
    pthread_mutex_lock(&f->mu);
    if (!shared && capstan__mono() - f->looked >= RELOOK) {
        look(f, r);
        shared = capstan__fleet_shared(f, queue);
    }
    int young = capstan__mono() - f->born < YOUNG;
    pthread_mutex_unlock(&f->mu);
    if (shared)
        *why = "a Ruby Sidekiq process reads the queue";
    else if (young)
        *why = "capstan started less than a minute ago, and a Ruby Sidekiq process that started with it "
               "may not be in the process set yet; after that minute, unknown_class: fail unless one reads "
               "the queue";
    return *why ? CAPSTAN_UNKNOWN_REQUEUE : c->unknown_class;
}
