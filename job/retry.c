/* Sidekiq's retry rules, applied to the payload text (see job.h). */
#include "job/job.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "capstan/error.h"
#include "support/buf.h"
#include "support/dl.h"
#include "support/number.h"
#include "support/payload.h"
#include "support/time.h"

#define MAX_ERROR_MESSAGE 10000

double capstan__retry_delay(long count)
{
    double c = (double)count;
    return c * c * c * c + 15 + capstan__floor(capstan__rand() * 10) * (c + 1);
}

void capstan__failure_clear(capstan_failure_t *f)
{
    free(f->payload);
    memset(f, 0, sizeof(*f));
}

static int member_is(const capstan_job_t *job, const capstan_jmember_t *m, const char *lit)
{
    return m && m->vlen == strlen(lit) && memcmp(job->payload + m->vstart, lit, m->vlen) == 0;
}

/* The payload's "retry" as CAPSTAN_RETRY_NONE, CAPSTAN_RETRY_DEFAULT or a count;
 * CAPSTAN_RETRY_UNSET when absent. */
static int payload_retry(const capstan_job_t *job)
{
    const capstan_jmember_t *m = capstan__jobject_get(&job->obj, job->payload, "retry");
    if (!m)
        return CAPSTAN_RETRY_UNSET;
    if (member_is(job, m, "false") || member_is(job, m, "null"))
        return CAPSTAN_RETRY_NONE;
    if (member_is(job, m, "true"))
        return CAPSTAN_RETRY_DEFAULT;
    char tmp[32];
    size_t n = m->vlen < sizeof(tmp) - 1 ? m->vlen : sizeof(tmp) - 1;
    memcpy(tmp, job->payload + m->vstart, n);
    tmp[n] = '\0';
    char *end;
    long v = strtol(tmp, &end, 10);
    if (end == tmp || (*end && *end != '.'))
        return CAPSTAN_RETRY_DEFAULT; /* a string or other truthy value */
    return v < 0 ? 0 : (int)(v > 1000000 ? 1000000 : v);
}

/* Appends strict base64 (no line breaks: every Sidekiq version decodes it,
 * 6.x with Base64.decode64, 7.3+ writes it). */
static int base64(capstan_buf_t *b, const unsigned char *p, size_t len)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int rc = 0;
    for (size_t i = 0; i < len && !rc; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < len) v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < len) v |= p[i + 2];
        char quad[4] = { tbl[v >> 18 & 63], tbl[v >> 12 & 63],
                         i + 1 < len ? tbl[v >> 6 & 63] : '=', i + 2 < len ? tbl[v & 63] : '=' };
        rc = capstan__buf_put(b, quad, 4);
    }
    return rc;
}

/* How many backtrace lines the payload's "backtrace" option keeps: all
 * unless it is false (none) or an integer N. */
static size_t backtrace_lines(const capstan_job_t *job)
{
    const capstan_jmember_t *m = capstan__jobject_get(&job->obj, job->payload, "backtrace");
    if (m && m->vlen == 5 && memcmp(job->payload + m->vstart, "false", 5) == 0)
        return 0;
    if (m && (job->payload[m->vstart] >= '0' && job->payload[m->vstart] <= '9')) {
        size_t n = (size_t)strtoul(job->payload + m->vstart, NULL, 10);
        return n < job->nbacktrace ? n : job->nbacktrace;
    }
    return job->nbacktrace;
}

/* zlib, opened the first time a backtrace is written (support/dl.h). */
static struct {
    __typeof__(&compressBound) bound;
    __typeof__(&compress2) compress;
} zlib_fn;
static int zlib_ok;
static pthread_once_t zlib_once = PTHREAD_ONCE_INIT;

static void zlib_load(void)
{
    void *h = capstan__dlopen_lib("libz", "1");
    if (!h)
        return;
    zlib_fn.bound = (__typeof__(&compressBound))(uintptr_t)dlsym(h, "compressBound");
    zlib_fn.compress = (__typeof__(&compress2))(uintptr_t)dlsym(h, "compress2");
    zlib_ok = zlib_fn.bound && zlib_fn.compress;
}

/* The "error_backtrace" value as Sidekiq writes it: a JSON string holding
 * base64(zlib deflate(JSON array of the lines)), zlib with its header.
 * Nothing is written when zlib cannot be opened: the job is still retried,
 * without its backtrace. */
static int backtrace_field(const capstan_job_t *job, size_t n, capstan_buf_t *out)
{
    pthread_once(&zlib_once, zlib_load);
    if (!zlib_ok)
        return 0;
    capstan_buf_t json = {0};
    unsigned char *z = NULL;
    int rc = capstan__buf_puts(&json, "[");
    for (size_t i = 0; i < n && !rc; i++) {
        if (i)
            rc = capstan__buf_puts(&json, ",");
        if (!rc)
            rc = capstan__json_quote(&json, job->backtrace[i], strlen(job->backtrace[i]));
    }
    if (!rc)
        rc = capstan__buf_puts(&json, "]");
    uLongf zlen = zlib_fn.bound((uLong)json.len);
    if (!rc && !(z = malloc(zlen)))
        rc = CAPSTAN_ENOMEM;
    if (!rc
        && zlib_fn.compress(z, &zlen, (const Bytef *)json.p, (uLong)json.len,
                            Z_DEFAULT_COMPRESSION) != Z_OK)
        rc = CAPSTAN_ENOMEM; /* Z_MEM_ERROR; the buffer is large enough */
    if (!rc) rc = capstan__buf_puts(out, "\"");
    if (!rc) rc = base64(out, z, zlen);
    if (!rc) rc = capstan__buf_puts(out, "\"");
    free(z);
    capstan__buf_free(&json);
    return rc;
}

static int quoted(capstan_buf_t *b, const char *s)
{
    size_t n = strlen(s);
    return capstan__json_quote(b, s, n > MAX_ERROR_MESSAGE ? MAX_ERROR_MESSAGE : n);
}

int capstan__retry_decide(const capstan_job_t *job, const char *err_class, const char *err_msg,
                          int class_retry, const capstan_retry_conf_t *conf, double now,
                          capstan_failure_t *out)
{
    memset(out, 0, sizeof(*out));
    int retry = payload_retry(job);
    if (retry == CAPSTAN_RETRY_UNSET)
        retry = class_retry == CAPSTAN_RETRY_UNSET ? CAPSTAN_RETRY_DEFAULT : class_retry;
    if (retry == CAPSTAN_RETRY_NONE) {
        out->fate = CAPSTAN_FATE_DROP;
        return 0;
    }
    /* A negative retry_count was ignored when the job was read (a first
     * failure); one at the top of the range stays there, past every limit,
     * where Ruby's Integer would have grown. */
    long count = job->retry_count < 0 ? 0
                 : job->retry_count < LONG_MAX ? job->retry_count + 1 : LONG_MAX;
    long max = retry == CAPSTAN_RETRY_DEFAULT ? conf->max_retries : retry;
    int exhausted = count >= max;

    const capstan_jmember_t *rf = capstan__jobject_get(&job->obj, job->payload, "retry_for");
    const capstan_jmember_t *fa = capstan__jobject_get(&job->obj, job->payload, "failed_at");
    if (!exhausted && rf) {
        char tmp[32];
        size_t n = rf->vlen < sizeof(tmp) - 1 ? rf->vlen : sizeof(tmp) - 1;
        memcpy(tmp, job->payload + rf->vstart, n);
        tmp[n] = '\0';
        double window = strtod(tmp, NULL); /* seconds, relative */
        double first = fa ? capstan__ts_parse(job->payload + fa->vstart, fa->vlen) : now;
        if (window > 0 && now > first + window)
            exhausted = 1;
    }

    char ts[32], cnt[32];
    capstan__ts_json(ts, now, capstan__ts_format_of(job->payload, &job->obj, conf->timestamps));
    snprintf(cnt, sizeof(cnt), "%ld", count);
    capstan_buf_t cls = {0}, msg = {0}, q = {0}, bt = {0};
    size_t nbt = backtrace_lines(job);
    const capstan_jmember_t *rq = capstan__jobject_get(&job->obj, job->payload, "retry_queue");
    int rc = quoted(&cls, err_class ? err_class : "RuntimeError");
    if (!rc)
        rc = quoted(&msg, err_msg ? err_msg : "");
    if (!rc)
        rc = rq ? capstan__buf_put(&q, job->payload + rq->vstart, rq->vlen)
                : capstan__json_quote(&q, job->queue ? job->queue : "default",
                                      strlen(job->queue ? job->queue : "default"));
    if (!rc && nbt)
        rc = backtrace_field(job, nbt, &bt);
    capstan_field_t set[7] = {
        { "queue", q.p, q.len },
        { "error_message", msg.p, msg.len },
        { "error_class", cls.p, cls.len },
        { count == 0 ? "failed_at" : "retried_at", ts, 0 },
        { "retry_count", cnt, 0 },
        /* Its handler returned, so it did not crash the process: no
         * suspect any more, it need not run alone on its next attempt. */
        { "recovery_count", NULL, 0 },
        { "error_backtrace", bt.p, bt.len },
    };
    if (!rc)
        rc = capstan__payload_edit(job->payload, &job->obj, set, bt.len ? 7 : 6, &out->payload,
                                   &out->len);
    capstan__buf_free(&cls);
    capstan__buf_free(&msg);
    capstan__buf_free(&q);
    capstan__buf_free(&bt);
    if (rc)
        return rc;

    if (!exhausted) {
        out->fate = CAPSTAN_FATE_RETRY;
        out->score = now + capstan__retry_delay(count);
    } else if (member_is(job, capstan__jobject_get(&job->obj, job->payload, "dead"), "false")) {
        capstan__failure_clear(out);
        out->fate = CAPSTAN_FATE_DROP;
    } else {
        out->fate = CAPSTAN_FATE_DEAD;
        out->score = now;
    }
    return 0;
}

int capstan__retry_invalid(const char *raw, size_t len, const char *queue, const char *why,
                           const capstan_retry_conf_t *conf, double now, capstan_failure_t *out)
{
    memset(out, 0, sizeof(*out));
    out->fate = CAPSTAN_FATE_DEAD;
    out->score = now;
    char ts[32], jid[25];
    capstan_jobject_t obj = {0};
    capstan_buf_t b = {0}, msg = {0};
    int rc = capstan__json_quote(&msg, why, strlen(why));
    int scanned = !rc && capstan__json_scan_object(raw, len, &obj, NULL) == 0;
    capstan__ts_json(ts, now, scanned ? capstan__ts_format_of(raw, &obj, conf->timestamps)
                                      : conf->timestamps);
    if (scanned) {
        /* Valid JSON without class or jid: keep every byte and add why. */
        char jidq[32];
        capstan__new_jid(jid);
        snprintf(jidq, sizeof(jidq), "\"%s\"", jid);
        const capstan_jmember_t *j = capstan__jobject_get(&obj, raw, "jid");
        capstan_field_t set[4] = {
            { "error_class", "\"Capstan::InvalidPayload\"", 0 },
            { "error_message", msg.p, msg.len },
            { "failed_at", ts, 0 },
            { "jid", j ? raw + j->vstart : jidq, j ? j->vlen : 0 },
        };
        rc = capstan__payload_edit(raw, &obj, set, 4, &out->payload, &out->len);
        goto out;
    }
    /* Not JSON at all: an envelope the Web UI can show, holding the text
     * (as the one argument, or base64 when it is not UTF-8). */
    capstan__new_jid(jid);
    if (!rc)
        rc = capstan__buf_printf(&b, "{\"class\":\"Capstan::InvalidPayload\",\"queue\":");
    if (!rc)
        rc = capstan__json_quote(&b, queue ? queue : "default", strlen(queue ? queue : "default"));
    if (!rc && capstan__utf8_valid(raw, len)) {
        rc = capstan__buf_puts(&b, ",\"args\":[");
        if (!rc) rc = capstan__json_quote(&b, raw, len);
        if (!rc) rc = capstan__buf_puts(&b, "]");
    } else if (!rc) {
        rc = capstan__buf_puts(&b, ",\"args\":[],\"payload_base64\":\"");
        if (!rc) rc = base64(&b, (const unsigned char *)raw, len);
        if (!rc) rc = capstan__buf_puts(&b, "\"");
    }
    if (!rc)
        rc = capstan__buf_printf(&b, ",\"jid\":\"%s\",\"retry\":false,\"created_at\":%s,\"failed_at\":%s,"
                                 "\"error_class\":\"Capstan::InvalidPayload\",\"error_message\":%s}",
                                 jid, ts, ts, msg.p);
    if (!rc)
        out->payload = capstan__buf_take(&b, &out->len);
out:
    capstan__jobject_free(&obj);
    capstan__buf_free(&b);
    capstan__buf_free(&msg);
    return rc;
}
