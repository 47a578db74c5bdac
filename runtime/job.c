/* The job a handler sees: a payload kept byte-exact plus the few decoded
 * fields the runtime and handlers read. */
#include "runtime/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiq/error.h"

static char *member_str(const kiq_job_t *job, const char *key)
{
    const kiq_jmember_t *m = kiq__jobject_get(&job->obj, job->payload, key);
    return m ? kiq__json_string_dup(job->payload + m->vstart, m->vlen) : NULL;
}

int kiq_job_init(kiq_job_t *job, char *payload, size_t len, const char *queue, char *err)
{
    memset(job, 0, sizeof(*job));
    job->payload = payload;
    job->len = len;
    job->queue = queue;
    job->retry_count = -1;
    int rc = kiq__json_scan_object(payload, len, &job->obj, err);
    if (rc)
        return rc;
    job->cls = member_str(job, "class");
    job->jid = member_str(job, "jid");
    if (!job->cls || !job->cls[0])
        return kiq_seterr(err, KIQ_EINVAL, "the payload has no \"class\" string");
    if (!job->jid || !job->jid[0])
        return kiq_seterr(err, KIQ_EINVAL, "the payload has no \"jid\" string");
    /* A bid that is not a short string names no batch kiq made; the job
     * then runs as a plain one. */
    job->bid = member_str(job, "bid");
    if (job->bid && (!job->bid[0] || strlen(job->bid) > 64)) {
        free(job->bid);
        job->bid = NULL;
    }
    /* Sidekiq's client refuses such a job; a handler is promised an array. */
    const kiq_jmember_t *am = kiq__jobject_get(&job->obj, payload, "args");
    if (am && payload[am->vstart] != '[')
        return kiq_seterr(err, KIQ_EINVAL, "the payload's \"args\" is not an array");
    kiq__aj_unwrap(job);
    const kiq_jmember_t *rcm = kiq__jobject_get(&job->obj, payload, "retry_count");
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

void kiq_job_clear(kiq_job_t *job)
{
    free(job->payload);
    kiq__jobject_free(&job->obj);
    free(job->cls);
    free(job->jid);
    free(job->bid);
    free(job->wrapper);
    json_decref(job->args);
    json_decref(job->aj_args);
    free(job->err_class);
    free(job->err_msg);
    for (size_t i = 0; i < job->nbacktrace; i++)
        free(job->backtrace[i]);
    free(job->backtrace);
    memset(job, 0, sizeof(*job));
}

const char *kiq_job_class(const kiq_job_t *job) { return job->cls; }
const char *kiq_job_jid(const kiq_job_t *job) { return job->jid; }
const char *kiq_job_bid(const kiq_job_t *job) { return job->bid; }
const char *kiq_job_queue(const kiq_job_t *job) { return job->queue; }
long kiq_job_retry_count(const kiq_job_t *job) { return job->retry_count; }
redisContext *kiq_job_redis(kiq_job_t *job) { return job->redis; }

const char *kiq_job_payload(const kiq_job_t *job, size_t *len)
{
    if (len)
        *len = job->len;
    return job->payload;
}

const char *kiq_job_field_raw(const kiq_job_t *job, const char *key, size_t *len)
{
    const kiq_jmember_t *m = kiq__jobject_get(&job->obj, job->payload, key);
    if (!m)
        return NULL;
    if (len)
        *len = m->vlen;
    return job->payload + m->vstart;
}

const char *kiq_job_args_raw(const kiq_job_t *job, size_t *len)
{
    const char *v = kiq_job_field_raw(job, "args", len);
    if (!v) {
        v = "[]";
        if (len)
            *len = 2;
    }
    return v;
}

json_t *kiq_job_args(kiq_job_t *job)
{
    if (!job->args_tried) {
        job->args_tried = 1;
        size_t len;
        const char *v = kiq_job_args_raw(job, &len);
        job->args = json_loadb(v, len, JSON_DECODE_ANY, NULL);
    }
    return job->args;
}

int kiq_job_fail(kiq_job_t *job, const char *error_class, const char *fmt, ...)
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
    return KIQ_EJOB;
}

int kiq_job_set_backtrace(kiq_job_t *job, const char *const *lines, size_t n)
{
    if (!job || (n && !lines))
        return KIQ_EINVAL;
    char **copy = n ? calloc(n, sizeof(*copy)) : NULL;
    int rc = n && !copy ? KIQ_ENOMEM : 0;
    for (size_t i = 0; i < n && !rc; i++)
        if (!(copy[i] = strdup(lines[i] ? lines[i] : "")))
            rc = KIQ_ENOMEM;
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

const char *kiq_job_error_class(const kiq_job_t *job) { return job->err_class; }
const char *kiq_job_error_message(const kiq_job_t *job) { return job->err_msg; }

int kiq_job_stopping(const kiq_job_t *job)
{
    return job->stopping ? atomic_load(job->stopping) : 0;
}
