/* Reads the dashboard numbers (see overview.h). Queue sizes, latencies and
 * paused flags are pipelined, three commands per queue, so a scrape or a refresh costs a
 * few round trips whatever the number of queues. */
#include "observe/overview.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "support/json.h"
#include "redis/keys.h"
#include "support/payload.h"
#include "support/time.h"

/* An integer (or numeric string) reply; 0 for nil. */
static long long num(const redisReply *rep)
{
    return rep->type == REDIS_REPLY_INTEGER ? rep->integer
         : rep->type == REDIS_REPLY_STRING ? atoll(rep->str) : 0;
}

/* Seconds since the job in rep (a payload) was enqueued; 0 for nil. */
static double age(const redisReply *rep, double now)
{
    double lat = 0;
    if (rep->type == REDIS_REPLY_STRING) {
        capstan_jobject_t o = {0};
        if (capstan__json_scan_object(rep->str, rep->len, &o, NULL) == 0) {
            const capstan_jmember_t *m = capstan__jobject_get(&o, rep->str, "enqueued_at");
            double t = m ? capstan__ts_parse(rep->str + m->vstart, m->vlen) : 0;
            if (t > 0)
                lat = now - t;
        }
        capstan__jobject_free(&o);
    }
    return lat < 0 ? 0 : lat;
}

static int io_error(capstan_redis_t *r, char *err)
{
    return capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const capstan_overview_queue_t *)a)->name,
                  ((const capstan_overview_queue_t *)b)->name);
}

static int read_totals(capstan_redis_t *r, capstan_overview_t *o, char *err)
{
    static const char *const cmds[][2] = {
        { "GET", CAPSTAN_KEY_PROCESSED },  { "GET", CAPSTAN_KEY_FAILED }, { "ZCARD", CAPSTAN_KEY_SCHEDULE },
        { "ZCARD", CAPSTAN_KEY_RETRY },    { "ZCARD", CAPSTAN_KEY_DEAD },
    };
    long long *dst[] = { &o->processed, &o->failed, &o->scheduled, &o->retries, &o->dead };
    for (size_t i = 0; i < 5; i++)
        if (capstan_redis_append(r, 2, (const char **)cmds[i], NULL))
            return io_error(r, err);
    for (size_t i = 0; i < 5; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep)
            return io_error(r, err);
        *dst[i] = num(rep);
        freeReplyObject(rep);
    }
    return 0;
}

static int read_queues(capstan_redis_t *r, capstan_overview_t *o, char *err)
{
    int rc = 0;
    redisReply *names = capstan_redis_cmdf(r, "SMEMBERS %s", CAPSTAN_KEY_QUEUES);
    if (!names)
        return io_error(r, err);
    if (names->type != REDIS_REPLY_ARRAY || names->elements == 0)
        goto out;
    if (!(o->queues = calloc(names->elements, sizeof(*o->queues)))) {
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < names->elements; i++) {
        if (names->element[i]->type != REDIS_REPLY_STRING)
            continue;
        if (!(o->queues[o->nqueues].name = strdup(names->element[i]->str))) {
            rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            goto out;
        }
        o->nqueues++;
    }
    qsort(o->queues, o->nqueues, sizeof(*o->queues), by_name);
    for (size_t i = 0; i < o->nqueues && !rc; i++) {
        char key[600];
        capstan__key(key, sizeof(key), CAPSTAN_KEY_QUEUE, o->queues[i].name);
        const char *llen[] = { "LLEN", key };
        const char *lindex[] = { "LINDEX", key, "-1" };
        const char *paused[] = { "SISMEMBER", CAPSTAN_KEY_PAUSED, o->queues[i].name };
        if (capstan_redis_append(r, 2, llen, NULL) || capstan_redis_append(r, 3, lindex, NULL)
            || capstan_redis_append(r, 3, paused, NULL))
            rc = io_error(r, err);
    }
    double now = capstan__now();
    for (size_t i = 0; i < o->nqueues && !rc; i++) {
        redisReply *len = capstan_redis_get_reply(r);
        redisReply *old = len ? capstan_redis_get_reply(r) : NULL;
        redisReply *paused = old ? capstan_redis_get_reply(r) : NULL;
        if (!paused)
            rc = io_error(r, err);
        else {
            o->queues[i].size = num(len);
            o->queues[i].latency = age(old, now);
            o->queues[i].paused = num(paused) == 1;
        }
        freeReplyObject(len);
        freeReplyObject(old);
        freeReplyObject(paused);
    }
out:
    freeReplyObject(names);
    return rc;
}

static long long opt_int(const redisReply *v)
{
    return v->type == REDIS_REPLY_STRING ? atoll(v->str) : -1;
}

/* Adds name to p's queues unless listed. Returns 0 or -1 out of memory. */
static int add_queue(capstan_overview_process_t *p, const char *name)
{
    for (size_t i = 0; i < p->nqueues; i++)
        if (strcmp(p->queues[i], name) == 0)
            return 0;
    char **q = realloc(p->queues, (p->nqueues + 1) * sizeof(*q));
    if (!q)
        return -1;
    p->queues = q;
    if (!(q[p->nqueues] = strdup(name)))
        return -1;
    p->nqueues++;
    return 0;
}

/* What p's info says beyond its counts: who wrote it, its version and its
 * queues. The queues are info's "queues" and the weights of 8.x's
 * "capsules", which 9.0 is to keep alone. Returns 0 or -1 out of memory. */
static int read_info(capstan_overview_process_t *p, json_t *info)
{
    json_t *conc = json_object_get(info, "concurrency");
    p->concurrency = json_is_integer(conc) ? json_integer_value(conc) : -1;
    json_t *sup = json_object_get(info, "capstan_supervisor"), *slot = json_object_get(info, "capstan_worker");
    p->supervisor = json_is_integer(sup) ? json_integer_value(sup) : -1;
    p->worker = json_is_integer(slot) ? json_integer_value(slot) : -1;
    const char *v = json_string_value(json_object_get(info, "version"));
    /* Capstan 0.x wrote its version before it wrote its marker; Sidekiq's
     * own versions there start at 7. */
    p->capstan = json_object_get(info, CAPSTAN_INFO_MARKER) != NULL || (v && strncmp(v, "0.", 2) == 0);
    if (v && !(p->version = strdup(v)))
        return -1;
    size_t i;
    json_t *e, *cap;
    const char *name, *queue;
    json_array_foreach(json_object_get(info, "queues"), i, e)
        if (json_is_string(e) && add_queue(p, json_string_value(e)))
            return -1;
    json_object_foreach(json_object_get(info, "capsules"), name, cap)
        json_object_foreach(json_object_get(cap, "weights"), queue, e)
            if (add_queue(p, queue))
                return -1;
    return 0;
}

static int read_processes(capstan_redis_t *r, capstan_overview_t *o, char *err)
{
    int rc = 0;
    redisReply *ids = capstan_redis_cmdf(r, "SMEMBERS %s", CAPSTAN_KEY_PROCESSES);
    if (!ids)
        return io_error(r, err);
    if (ids->type != REDIS_REPLY_ARRAY || ids->elements == 0)
        goto out;
    if (!(o->processes = calloc(ids->elements, sizeof(*o->processes)))) {
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < ids->elements && !rc; i++) {
        const char *id = ids->element[i]->str;
        if (!id)
            continue;
        redisReply *h = capstan_redis_cmdf(r, "HMGET %s info busy beat quiet rss prefetched fetch_errors "
                                           "fetch_error", id);
        if (!h) {
            rc = io_error(r, err);
            break;
        }
        /* A member whose hash expired is a process that died without
         * leaving the set; Sidekiq's ProcessSet skips it too. */
        if (h->type == REDIS_REPLY_ARRAY && h->elements == 8
            && h->element[0]->type == REDIS_REPLY_STRING) {
            capstan_overview_process_t *p = &o->processes[o->nprocesses];
            p->identity = strdup(id);
            p->info = strdup(h->element[0]->str);
            if (!p->identity || !p->info) {
                free(p->identity);
                free(p->info);
                rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            } else {
                json_t *info = json_loads(p->info, 0, NULL);
                if (read_info(p, info))
                    rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
                json_decref(info);
                p->busy = opt_int(h->element[1]);
                p->beat = h->element[2]->type == REDIS_REPLY_STRING ? atof(h->element[2]->str) : -1;
                p->quiet = h->element[3]->type != REDIS_REPLY_STRING ? -1
                         : strcmp(h->element[3]->str, "true") == 0;
                p->rss = opt_int(h->element[4]);
                if (h->element[5]->type == REDIS_REPLY_STRING
                    && !(p->prefetched = strdup(h->element[5]->str)))
                    rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
                p->fetch_errors = opt_int(h->element[6]);
                if (h->element[7]->type == REDIS_REPLY_STRING && h->element[7]->len
                    && !(p->fetch_error = strdup(h->element[7]->str)))
                    rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
                o->nprocesses++;
            }
        }
        freeReplyObject(h);
    }
out:
    freeReplyObject(ids);
    return rc;
}

int capstan__overview_read(capstan_redis_t *r, int with_processes, capstan_overview_t *out, char *err)
{
    memset(out, 0, sizeof(*out));
    int rc = read_totals(r, out, err);
    if (!rc)
        rc = read_queues(r, out, err);
    if (!rc && with_processes)
        rc = read_processes(r, out, err);
    return rc;
}

int capstan__overview_processes(capstan_redis_t *r, capstan_overview_t *out, char *err)
{
    memset(out, 0, sizeof(*out));
    return read_processes(r, out, err);
}

void capstan__overview_clear(capstan_overview_t *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->nqueues; i++)
        free(o->queues[i].name);
    for (size_t i = 0; i < o->nprocesses; i++) {
        capstan_overview_process_t *p = &o->processes[i];
        free(p->identity);
        free(p->info);
        free(p->prefetched);
        free(p->fetch_error);
        free(p->version);
        for (size_t q = 0; q < p->nqueues; q++)
            free(p->queues[q]);
        free(p->queues);
    }
    free(o->queues);
    free(o->processes);
    memset(o, 0, sizeof(*o));
}
