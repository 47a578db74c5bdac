/* The runtime's look at its fleet: which of its queues a Ruby Sidekiq
 * process reads too. A job of a class without a handler here is Ruby's
 * job there, and failing it with NameError would take it from the process
 * that can run it; so unless the config sets unknown_class, such a queue's
 * unknown classes go back for Ruby (unknown_class: requeue), and the
 * others fail as Sidekiq fails them. Looked at at start, before the first
 * fetch, and every recovery_interval by the housekeeper. */
#include "runtime/rt.h"

#include <stdlib.h>
#include <string.h>

#include "observe/overview.h"
#include "support/buf.h"
#include "support/log.h"
#include "support/time.h"

/* How long a queue stays shared after the last look that saw a Ruby
 * process read it. A deploy stops Ruby's processes and starts new ones
 * (a clean stop leaves the process set at once), and a look that falls in
 * between must not hand Ruby's jobs to NameError; a deploy takes less. */
#define SHARED_HOLD 600.0

/* Ruby processes a line names before "and N more". */
#define NAMED 3

struct capstan_fleet {
    size_t n;                /* rt->cfg->nqueues */
    _Atomic double *seen;    /* capstan__mono() of the last look that saw a
                                Ruby process read queue i; 0 never */
    unsigned char *said;     /* queue i was last logged as shared; only
                                the looking thread (start, then the
                                housekeeper) touches it */
};

int capstan__fleet_new(capstan_runtime_t *rt)
{
    size_t n = rt->cfg->nqueues;
    struct capstan_fleet *f = calloc(1, sizeof(*f));
    if (f) {
        f->n = n;
        f->seen = calloc(n ? n : 1, sizeof(*f->seen));
        f->said = calloc(n ? n : 1, 1);
    }
    if (!f || !f->seen || !f->said) {
        capstan__fleet_free(f);
        return CAPSTAN_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        atomic_init(&f->seen[i], 0.0);
    rt->fleet = f;
    return 0;
}

void capstan__fleet_free(struct capstan_fleet *f)
{
    if (!f)
        return;
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

static int shared_at(const struct capstan_fleet *f, size_t i, double now)
{
    double seen = atomic_load(&f->seen[i]);
    return seen > 0 && now - seen < SHARED_HOLD;
}

int capstan__fleet_shared(const capstan_runtime_t *rt, const char *queue)
{
    long i = rt->fleet && queue ? queue_index(rt->cfg, queue) : -1;
    return i >= 0 && (size_t)i < rt->fleet->n && shared_at(rt->fleet, (size_t)i, capstan__mono());
}

capstan_unknown_class_t capstan__unknown_policy(const capstan_runtime_t *rt, const char *queue)
{
    const capstan_config_t *c = rt->cfg;
    if (!c->unknown_class_explicit && capstan__fleet_shared(rt, queue))
        return CAPSTAN_UNKNOWN_REQUEUE;
    return c->unknown_class;
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
static void say_shared(const capstan_runtime_t *rt, const capstan_overview_t *ov, const unsigned char *ruby,
                       const unsigned char *fresh)
{
    const capstan_config_t *c = rt->cfg;
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
    capstan__buf_printf(&b, " read%s queues ", n == 1 ? "s" : "");
    name_queues(&b, c, fresh);
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
            capstan_warn("Ruby Sidekiq process%s %s", n == 1 ? "" : "es", b.p);
        else
            capstan_info("Ruby Sidekiq process%s %s", n == 1 ? "" : "es", b.p);
    }
    capstan__buf_free(&b);
}

void capstan__fleet_look(capstan_runtime_t *rt, capstan_redis_t *r)
{
    struct capstan_fleet *f = rt->fleet;
    const capstan_config_t *c = rt->cfg;
    if (!f || !f->n)
        return;
    capstan_overview_t ov;
    char err[CAPSTAN_ERRLEN];
    /* A look that fails changes nothing: the hold covers the next. */
    if (capstan__overview_processes(r, &ov, err)) {
        capstan_debug("fleet look: %s", err);
        capstan__overview_clear(&ov);
        return;
    }
    unsigned char *ruby = calloc(ov.nprocesses ? ov.nprocesses : 1, 1);
    unsigned char *fresh = calloc(f->n, 1), *gone = calloc(f->n, 1);
    if (!ruby || !fresh || !gone)
        goto out;
    double now = capstan__mono();
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
            ruby[p] = 1;
        }
    }
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
        say_shared(rt, &ov, ruby, fresh);
    if (any_gone) {
        capstan_buf_t b = {0};
        name_queues(&b, c, gone);
        if (c->unknown_class_explicit)
            capstan_info("no Ruby Sidekiq process has read queues %s for %.0f minutes",
                         b.p ? b.p : "", SHARED_HOLD / 60);
        else
            capstan_info("no Ruby Sidekiq process has read queues %s for %.0f minutes: jobs there of "
                         "classes without a handler here follow unknown_class: %s again",
                         b.p ? b.p : "", SHARED_HOLD / 60,
                         capstan_config_unknown_class_name(c->unknown_class));
        capstan__buf_free(&b);
    }
    capstan_debug("fleet: %zu processes, %zu of them Ruby Sidekiq", ov.nprocesses, nruby);
out:
    free(ruby);
    free(fresh);
    free(gone);
    capstan__overview_clear(&ov);
}
