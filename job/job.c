/* The job a handler sees: a payload kept byte-exact plus the few decoded
 * fields the runtime and handlers read. */
#include "job/job.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/error.h"
#include "support/trace.h"

static char *member_str(const capstan_job_t *job, const char *key)
{
    const capstan_jmember_t *m = capstan__jobject_get(&job->obj, job->payload, key);
    return m ? capstan__json_string_dup(job->payload + m->vstart, m->vlen) : NULL;
}

/* The W3C trace context of the payload, kept only when valid. */
static void read_trace(capstan_job_t *job)
{
    char *tp = member_str(job, "traceparent");
    if (!tp || !capstan__traceparent_valid(tp, strlen(tp))) {
        free(tp);
        return;
    }
    job->traceparent = tp;
    memcpy(job->trace_id, tp + 3, 32);
    job->trace_id[32] = '\0';
    char *ts = member_str(job, "tracestate");
    if (ts && capstan__tracestate_valid(ts, strlen(ts)))
        job->tracestate = ts;
    else
        free(ts);
}

/* job->cls and job->jid: the payload's "class" and "jid" when they are
 * strings, decoded into one block (the job's room when they fit). Out of
 * memory both stay NULL. */
static void read_names(capstan_job_t *job)
{
    const capstan_jmember_t *c = capstan__jobject_get(&job->obj, job->payload, "class");
    const capstan_jmember_t *j = capstan__jobject_get(&job->obj, job->payload, "jid");
    /* A literal's quotes leave room for the decoded text's NUL. */
    size_t need = (c ? c->vlen : 0) + (j ? j->vlen : 0), n;
    char *p = !need ? NULL : need <= sizeof(job->names_room) ? job->names_room : (job->names = malloc(need));
    if (!p)
        return;
    if (c && (n = capstan__json_string_decode(job->payload + c->vstart, c->vlen, p)) != (size_t)-1) {
        job->cls = p;
        p += n + 1;
    }
    if (j && capstan__json_string_decode(job->payload + j->vstart, j->vlen, p) != (size_t)-1)
        job->jid = p;
}

int capstan__job_init(capstan_job_t *job, char *payload, size_t len, const char *queue, char *err)
{
    memset(job, 0, sizeof(*job));
    job->payload = payload;
    job->len = len;
    job->queue = queue ? queue : "default";
    job->retry_count = -1;
    capstan__jobject_lend(&job->obj, job->members, CAPSTAN_JOB_MEMBERS);
    int rc = capstan__json_scan_object(payload, len, &job->obj, err);
    if (rc)
        return rc;
    if (!queue && (job->own_queue = member_str(job, "queue")))
        job->queue = job->own_queue;
    read_names(job);
    if (!job->cls || !job->cls[0])
        return capstan_seterr(err, CAPSTAN_EINVAL, "the payload has no \"class\" string");
    if (!job->jid || !job->jid[0])
        return capstan_seterr(err, CAPSTAN_EINVAL, "the payload has no \"jid\" string");
    /* A bid that is not a short string names no batch capstan made; the job
     * then runs as a plain one. */
    job->bid = member_str(job, "bid");
    if (job->bid && (!job->bid[0] || strlen(job->bid) > 64)) {
        free(job->bid);
        job->bid = NULL;
    }
    /* Sidekiq's client refuses such a job; a handler is promised an array. */
    const capstan_jmember_t *am = capstan__jobject_get(&job->obj, payload, "args");
    if (am && payload[am->vstart] != '[')
        return capstan_seterr(err, CAPSTAN_EINVAL, "the payload's \"args\" is not an array");
    capstan__aj_unwrap(job);
    read_trace(job);
    const capstan_jmember_t *rcm = capstan__jobject_get(&job->obj, payload, "retry_count");
    if (rcm) {
        char tmp[32];
        size_t n = rcm->vlen < sizeof(tmp) - 1 ? rcm->vlen : sizeof(tmp) - 1;
        memcpy(tmp, payload + rcm->vstart, n);
        tmp[n] = '\0';
        char *end;
        long v = strtol(tmp, &end, 10);
        if (end != tmp && v >= 0)
            job->retry_count = v;
    }
    return 0;
}

void capstan__job_clear(capstan_job_t *job)
{
    free(job->payload);
    capstan__jobject_free(&job->obj);
    if (job->wrapper) /* cls is the wrapped class's own copy */
        free(job->cls);
    free(job->names);
    free(job->bid);
    free(job->own_queue);
    free(job->traceparent);
    free(job->tracestate);
    json_decref(job->wrapper_args);
    json_decref(job->aj_args);
    free(job->err_class);
    free(job->err_msg);
    for (size_t i = 0; i < job->nbacktrace; i++)
        free(job->backtrace[i]);
    free(job->backtrace);
    capstan__job_iter_free(job);
    memset(job, 0, sizeof(*job));
}

/* p, a pointer into src's names room, at the same place in dst's. */
static char *rebase(capstan_job_t *dst, const capstan_job_t *src, char *p)
{
    uintptr_t at = (uintptr_t)p, room = (uintptr_t)src->names_room;
    if (!p || at < room || at >= room + sizeof(src->names_room))
        return p;
    return dst->names_room + (at - room);
}

void capstan__job_move(capstan_job_t *dst, capstan_job_t *src)
{
    *dst = *src;
    if (src->obj.lent)
        dst->obj.m = dst->members;
    dst->cls = rebase(dst, src, src->cls);
    dst->jid = rebase(dst, src, src->jid);
    dst->wrapper = rebase(dst, src, src->wrapper);
    memset(src, 0, sizeof(*src));
}

const char *capstan_job_class(const capstan_job_t *job) { return job->cls; }
const char *capstan_job_jid(const capstan_job_t *job) { return job->jid; }
const char *capstan_job_bid(const capstan_job_t *job) { return job->bid; }
const char *capstan_job_queue(const capstan_job_t *job) { return job->queue; }
const char *capstan_job_traceparent(const capstan_job_t *job) { return job->traceparent; }
const char *capstan_job_tracestate(const capstan_job_t *job) { return job->tracestate; }
long capstan_job_retry_count(const capstan_job_t *job) { return job->retry_count; }
redisContext *capstan_job_redis(capstan_job_t *job)
{
    if (!job->redis && job->sandbox && job->sandbox->no_redis)
        job->sandbox->no_redis(job->sandbox->ud, job);
    return job->redis;
}

const char *capstan_job_payload(const capstan_job_t *job, size_t *len)
{
    if (len)
        *len = job->len;
    return job->payload;
}

const char *capstan_job_field_raw(const capstan_job_t *job, const char *key, size_t *len)
{
    const capstan_jmember_t *m = capstan__jobject_get(&job->obj, job->payload, key);
    if (!m)
        return NULL;
    if (len)
        *len = m->vlen;
    return job->payload + m->vstart;
}

/* The payload's own "args" text, "[]" when absent. */
static const char *payload_args(const capstan_job_t *job, size_t *len)
{
    const char *v = capstan_job_field_raw(job, "args", len);
    if (!v) {
        v = "[]";
        *len = 2;
    }
    return v;
}

const char *capstan_job_args_raw(const capstan_job_t *job, size_t *len)
{
    size_t n;
    const char *v;
    /* A handler reads the arguments perform receives, whatever the
     * wrapper around them; an ActiveJob payload without them has none. */
    if (job->wrapper) {
        v = job->aj_rawlen ? job->payload + job->aj_raw : "[]";
        n = job->aj_rawlen ? job->aj_rawlen : 2;
    } else {
        v = payload_args(job, &n);
    }
    if (len)
        *len = n;
    return v;
}

json_t *capstan_job_wrapper_args(capstan_job_t *job)
{
    if (!job->wrapper_args_tried) {
        job->wrapper_args_tried = 1;
        size_t len;
        const char *v = payload_args(job, &len);
        job->wrapper_args = json_loadb(v, len, JSON_DECODE_ANY, NULL);
    }
    return job->wrapper_args;
}

int capstan_job_fail(capstan_job_t *job, const char *error_class, const char *fmt, ...)
{
    char msg[10240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    free(job->err_class);
    free(job->err_msg);
    job->err_class = strdup(error_class && *error_class ? error_class : "RuntimeError");
    job->err_msg = strdup(msg);
    return CAPSTAN_EJOB;
}

int capstan_job_set_backtrace(capstan_job_t *job, const char *const *lines, size_t n)
{
    if (!job || (n && !lines))
        return CAPSTAN_EINVAL;
    char **copy = n ? calloc(n, sizeof(*copy)) : NULL;
    int rc = n && !copy ? CAPSTAN_ENOMEM : 0;
    for (size_t i = 0; i < n && !rc; i++)
        if (!(copy[i] = strdup(lines[i] ? lines[i] : "")))
            rc = CAPSTAN_ENOMEM;
    char **old = rc ? copy : job->backtrace;
    size_t nold = rc ? n : job->nbacktrace;
    for (size_t i = 0; i < nold; i++)
        free(old[i]);
    free(old);
    if (!rc) {
        job->backtrace = copy;
        job->nbacktrace = n;
    }
    return rc;
}

const char *capstan_job_error_class(const capstan_job_t *job) { return job->err_class; }
const char *capstan_job_error_message(const capstan_job_t *job) { return job->err_msg; }

int capstan_job_stopping(const capstan_job_t *job)
{
    return job->stopping ? atomic_load(job->stopping) : 0;
}

double capstan__job_expires_at(const capstan_job_t *job)
{
    size_t len = 0;
    const char *v = capstan_job_field_raw(job, "expires_at", &len);
    char tmp[64];
    if (!v || len == 0 || len >= sizeof(tmp))
        return 0;
    memcpy(tmp, v, len);
    tmp[len] = '\0';
    char *end;
    double at = strtod(tmp, &end);
    if (end == tmp || *end || !(at > 0))
        return 0;
    /* The convention is float seconds; a client that wrote milliseconds
     * (as Sidekiq 8 stamps its own times) is read as it meant. */
    return at > 1e11 ? at / 1000.0 : at;
}
