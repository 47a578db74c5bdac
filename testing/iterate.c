/* The testing kit's iteration state, what Redis's it-<jid> hashes would
 * hold: the job sandbox (job/job.h) the iteration runs read and write
 * through, with capstan_job_redis's report that the kit has no Redis, and
 * capstan_test_set_cursor, capstan_test_cursor, capstan_test_executions and
 * capstan_test_cancel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testing/testing_internal.h"

static iter_state_t *iter_find(const capstan_test_t *t, const char *jid)
{
    for (size_t i = 0; i < t->niters; i++)
        if (strcmp(t->iters[i].jid, jid) == 0)
            return &t->iters[i];
    return NULL;
}

static iter_state_t *iter_get(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = iter_find(t, jid);
    if (s)
        return s;
    s = realloc(t->iters, (t->niters + 1) * sizeof(*s));
    if (!s)
        return NULL;
    t->iters = s;
    s = &t->iters[t->niters];
    *s = (iter_state_t){ .jid = strdup(jid) };
    if (!s->jid)
        return NULL;
    t->niters++;
    return s;
}

static void iter_remove(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = iter_find(t, jid);
    if (!s)
        return;
    free(s->jid);
    json_decref(s->cursor);
    *s = t->iters[--t->niters];
}

static void sb_iter_read(void *ud, const char *jid, json_t **cursor, long *executions, int *cancelled)
{
    capstan_test_t *t = ud;
    iter_state_t *s = iter_find(t, jid);
    t->checkpoints = 0;
    if (!s)
        return;
    *cursor = s->cursor ? json_deep_copy(s->cursor) : NULL;
    *executions = s->executions;
    *cancelled = s->cancelled;
}

static void sb_iter_write(void *ud, const char *jid, const json_t *cursor, long executions)
{
    iter_state_t *s = iter_get(ud, jid);
    if (!s)
        return;
    json_decref(s->cursor);
    s->cursor = cursor ? json_deep_copy(cursor) : NULL;
    s->executions = executions;
}

static void sb_iter_drop(void *ud, const char *jid)
{
    iter_remove(ud, jid);
}

static int sb_iter_stop(void *ud, const char *jid)
{
    (void)jid;
    capstan_test_t *t = ud;
    return t->interrupt_at > 0 && ++t->checkpoints >= t->interrupt_at;
}

static void sb_no_redis(void *ud, const capstan_job_t *job)
{
    capstan_test_t *t = ud;
    if (t->redis_error || t->in_death)
        return;
    char why[CAPSTAN_ERRLEN];
    snprintf(why, sizeof(why), "capstan_job_redis: the testing kit has no Redis connection (give one "
             "with capstan_test_set_redis); %s %s", job->cls, job->jid);
    t->redis_error = strdup(why);
}

void capstan__test_sandbox_init(capstan_test_t *t)
{
    t->sandbox = (capstan_sandbox_t){ sb_no_redis, sb_iter_read, sb_iter_write, sb_iter_drop, sb_iter_stop, t };
}

void capstan__test_iters_free(capstan_test_t *t)
{
    while (t->niters)
        iter_remove(t, t->iters[0].jid);
    free(t->iters);
    free(t->cursor_text);
}

int capstan_test_set_cursor(capstan_test_t *t, const char *jid, const char *cursor, long executions)
{
    if (!jid)
        return capstan_seterr(t->err, CAPSTAN_EINVAL, "capstan_test_set_cursor: no jid");
    if (!cursor) {
        iter_remove(t, jid);
        return 0;
    }
    json_error_t jerr;
    json_t *c = json_loads(cursor, JSON_DECODE_ANY, &jerr);
    if (!c)
        return capstan_seterr(t->err, CAPSTAN_EPARSE, "cursor %s: %s", cursor, jerr.text);
    iter_state_t *s = iter_get(t, jid);
    if (!s) {
        json_decref(c);
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    }
    json_decref(s->cursor);
    s->cursor = json_is_null(c) ? NULL : c;
    if (json_is_null(c))
        json_decref(c);
    s->executions = executions;
    return 0;
}

const char *capstan_test_cursor(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = jid ? iter_find(t, jid) : NULL;
    free(t->cursor_text);
    t->cursor_text = NULL;
    if (!s)
        return NULL;
    t->cursor_text = s->cursor ? json_dumps(s->cursor, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("null");
    return t->cursor_text;
}

long capstan_test_executions(const capstan_test_t *t, const char *jid)
{
    const iter_state_t *s = jid ? iter_find(t, jid) : NULL;
    return s ? s->executions : 0;
}

int capstan_test_cancel(capstan_test_t *t, const char *jid)
{
    iter_state_t *s = jid ? iter_get(t, jid) : NULL;
    if (!s)
        return capstan_seterr(t->err, jid ? CAPSTAN_ENOMEM : CAPSTAN_EINVAL, jid ? "out of memory" : "no jid");
    s->cancelled = 1;
    return 0;
}
