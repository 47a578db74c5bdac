/* Jobs enqueued through Rails' ActiveJob with the Sidekiq adapter: the
 * payload's class is the adapter's wrapper, the class to run is in
 * "wrapped", and the arguments are args[0]["arguments"] in ActiveJob's
 * serialized form. */
#include "job/job.h"

#include <stdlib.h>
#include <string.h>

#include "capstan/error.h"

static int is_wrapper(const char *cls)
{
    return strcmp(cls, "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper") == 0 ||
           strcmp(cls, "Sidekiq::ActiveJob::Wrapper") == 0;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Scans args[0] of the payload into *inner, which starts at *at in the
 * payload: read from the text, not through jansson, so that an argument
 * too wide for jansson neither hides the class nor the arguments' text.
 * The adapter writes a one-element array; anything else is not scanned
 * (returns nonzero). */
static int scan_aj_job(const capstan_job_t *job, capstan_jobject_t *inner, size_t *at)
{
    const capstan_jmember_t *m = capstan__jobject_get(&job->obj, job->payload, "args");
    if (!m)
        return -1;
    size_t b = m->vstart + 1, e = m->vstart + m->vlen - 1; /* inside [ ] */
    while (b < e && is_ws(job->payload[b]))
        b++;
    while (e > b && is_ws(job->payload[e - 1]))
        e--;
    if (b >= e || job->payload[b] != '{')
        return -1;
    *at = b;
    return capstan__json_scan_object(job->payload + b, e - b, inner, NULL);
}

void capstan__aj_unwrap(capstan_job_t *job)
{
    if (!is_wrapper(job->cls))
        return;
    capstan_jobject_t inner = {0};
    size_t at = 0;
    int rc = scan_aj_job(job, &inner, &at), scanned = rc == 0;
    if (rc == CAPSTAN_ENOMEM) {
        capstan__jobject_free(&inner);
        return;
    }
    const char *itext = job->payload + at;
    char *name = NULL;
    const capstan_jmember_t *m = capstan__jobject_get(&job->obj, job->payload, "wrapped");
    if (m && job->payload[m->vstart] == '"')
        name = capstan__json_string_dup(job->payload + m->vstart, m->vlen);
    if (!name && scanned) {
        const capstan_jmember_t *jc = capstan__jobject_get(&inner, itext, "job_class");
        name = jc ? capstan__json_string_dup(itext + jc->vstart, jc->vlen) : NULL;
    }
    if (!name || !name[0]) {
        free(name);
        capstan__jobject_free(&inner);
        return;
    }
    const capstan_jmember_t *a = scanned ? capstan__jobject_get(&inner, itext, "arguments") : NULL;
    if (a && itext[a->vstart] == '[') {
        job->aj_raw = at + a->vstart;
        job->aj_rawlen = a->vlen;
    }
    capstan__jobject_free(&inner);
    job->wrapper = job->cls;
    job->cls = name;
}

/* What ActiveJob::Arguments.deserialize makes of v, as JSON: see
 * capstan_job_args in capstan/job.h. A new reference, or NULL out of memory. */
static json_t *deserialize(json_t *v)
{
    if (json_is_array(v)) {
        json_t *out = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!out || json_array_append_new(out, deserialize(e))) {
                json_decref(out);
                return NULL;
            }
        }
        return out;
    }
    if (!json_is_object(v))
        return json_incref(v);
    json_t *gid = json_object_get(v, "_aj_globalid");
    if (json_object_size(v) == 1 && json_is_string(gid))
        return json_incref(gid);
    int custom = json_object_get(v, "_aj_serialized") != NULL;
    json_t *value = json_object_get(v, "value");
    if (custom && value)
        return deserialize(value);
    json_t *out = json_object();
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e) {
        if (!custom && (strcmp(k, "_aj_symbol_keys") == 0 || strcmp(k, "_aj_ruby2_keywords") == 0 ||
                        strcmp(k, "_aj_hash_with_indifferent_access") == 0))
            continue;
        if (!out || json_object_set_new(out, k, deserialize(e))) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

json_t *capstan_job_args(capstan_job_t *job)
{
    if (!job->wrapper)
        return capstan_job_wrapper_args(job);
    if (!job->aj_tried) {
        job->aj_tried = 1;
        /* From the text capstan_job_args_raw gives, so the two agree. */
        json_t *a = job->aj_rawlen ? json_loadb(job->payload + job->aj_raw, job->aj_rawlen, 0, NULL)
                                   : NULL;
        job->aj_args = json_is_array(a) ? deserialize(a) : NULL;
        json_decref(a);
    }
    return job->aj_args;
}
