/* Jobs enqueued through Rails' ActiveJob with the Sidekiq adapter: the
 * payload's class is the adapter's wrapper, the class to run is in
 * "wrapped", and the arguments are args[0]["arguments"] in ActiveJob's
 * serialized form. */
#include "job/job.h"

#include <stdlib.h>
#include <string.h>

static int is_wrapper(const char *cls)
{
    return strcmp(cls, "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper") == 0 ||
           strcmp(cls, "Sidekiq::ActiveJob::Wrapper") == 0;
}

/* args[0], the serialized job, when it is an object. Borrowed. */
static json_t *aj_job(capstan_job_t *job)
{
    json_t *j = json_array_get(capstan_job_args(job), 0);
    return json_is_object(j) ? j : NULL;
}

void capstan__aj_unwrap(capstan_job_t *job)
{
    if (!is_wrapper(job->cls))
        return;
    char *name = NULL;
    const capstan_jmember_t *m = capstan__jobject_get(&job->obj, job->payload, "wrapped");
    if (m && job->payload[m->vstart] == '"')
        name = capstan__json_string_dup(job->payload + m->vstart, m->vlen);
    if (!name) {
        const char *jc = json_string_value(json_object_get(aj_job(job), "job_class"));
        name = jc ? strdup(jc) : NULL;
    }
    if (!name || !name[0]) {
        free(name);
        return;
    }
    job->wrapper = job->cls;
    job->cls = name;
}

/* What ActiveJob::Arguments.deserialize makes of v, as JSON: see
 * capstan_job_aj_args in capstan/job.h. A new reference, or NULL out of memory. */
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

json_t *capstan_job_aj_args(capstan_job_t *job)
{
    if (!job->wrapper)
        return capstan_job_args(job);
    if (!job->aj_tried) {
        job->aj_tried = 1;
        json_t *a = json_object_get(aj_job(job), "arguments");
        job->aj_args = json_is_array(a) ? deserialize(a) : NULL;
    }
    return job->aj_args;
}
