/* The testing kit's pushed jobs: the push sink (client/txn.h) that takes
 * what a client pushes while the kit stands in for Redis, and runs it at
 * once when inline, the capstan_test_pushed_* accessors, and
 * capstan_test_drain and capstan_test_clear_pushed. */
#include <stdlib.h>
#include <string.h>

#include "testing/testing_internal.h"

static int sink_take(void *ud, const char *payload, size_t len, const char *queue, double at)
{
    capstan_test_t *t = ud;
    pushed_t *p = realloc(t->pushed, (t->npushed + 1) * sizeof(*p));
    if (!p)
        return CAPSTAN_ENOMEM;
    t->pushed = p;
    p = &t->pushed[t->npushed];
    *p = (pushed_t){ .payload = malloc(len + 1), .queue = strdup(queue), .len = len, .at = at };
    if (!p->payload || !p->queue) {
        free(p->payload);
        free(p->queue);
        return CAPSTAN_ENOMEM;
    }
    memcpy(p->payload, payload, len);
    p->payload[len] = '\0';
    size_t i = t->npushed++;
    if (!t->inline_runs)
        return 0;
    /* Inline: run it now; the outcome of the job that pushed stays the
     * last run's. */
    result_t outer = t->last;
    char *outer_redis = t->redis_error;
    t->last = (result_t){0};
    t->redis_error = NULL;
    t->pushed[i].ran = 1;
    /* Copied as the run starts, before its handler may push (and move
     * t->pushed). */
    int rc = capstan_test_run_json(t, t->pushed[i].payload, t->pushed[i].queue);
    t->pushed[i].fate = t->last.fate;
    result_t inner = t->last;
    t->last = outer;
    free(t->redis_error);
    t->redis_error = outer_redis;
    capstan__test_result_clear(&inner);
    return rc < 0 && rc != CAPSTAN_ENOTFOUND ? rc : 0;
}

void capstan__test_sink_init(capstan_test_t *t)
{
    t->sink = (capstan_push_sink_t){ sink_take, t };
}

void capstan_test_clear_pushed(capstan_test_t *t)
{
    for (size_t i = 0; i < t->npushed; i++) {
        free(t->pushed[i].payload);
        free(t->pushed[i].queue);
    }
    free(t->pushed);
    t->pushed = NULL;
    t->npushed = 0;
}

size_t capstan_test_pushed_count(const capstan_test_t *t) { return t->npushed; }

const char *capstan_test_pushed_at(const capstan_test_t *t, size_t i, size_t *len)
{
    if (len)
        *len = i < t->npushed ? t->pushed[i].len : 0;
    return i < t->npushed ? t->pushed[i].payload : NULL;
}

const char *capstan_test_pushed_queue(const capstan_test_t *t, size_t i)
{
    return i < t->npushed ? t->pushed[i].queue : NULL;
}

double capstan_test_pushed_when(const capstan_test_t *t, size_t i)
{
    return i < t->npushed ? t->pushed[i].at : 0;
}

capstan_dispose_t capstan_test_pushed_fate(const capstan_test_t *t, size_t i)
{
    return i < t->npushed ? t->pushed[i].fate : CAPSTAN_DISPOSE_DEFAULT;
}

long capstan_test_drain(capstan_test_t *t, long max)
{
    long n = 0;
    /* By index: the jobs run may push more, which moves the array. */
    for (size_t i = 0; i < t->npushed && (max <= 0 || n < max); i++) {
        if (t->pushed[i].ran)
            continue;
        t->pushed[i].ran = 1;
        char *p = strdup(t->pushed[i].payload), *q = strdup(t->pushed[i].queue);
        int rc = p && q ? capstan_test_run_json(t, p, q) : capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
        free(p);
        free(q);
        if (rc)
            return rc;
        t->pushed[i].fate = t->last.fate;
        n++;
    }
    return n;
}
