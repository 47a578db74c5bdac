/* Queued locks seen from outside: lock and queue info, SCAN listings, and
 * the admin steps (force unlock, clear all, clear dead requests). These work
 * on any lock in the layout, whether capstan or the Ruby gem took it. */
#include "capstan/qlock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "locks/qlock_internal.h"
#include "redis/reply.h"
#include "redis/scan.h"
#include "redis/scripts.h"
#include "support/time.h"

#define QL_LOCK_PATTERN CAPSTAN_KEY_QLOCK "*"
#define QL_QUEUE_PATTERN CAPSTAN_KEY_QLOCK_QUEUE "*"

/* The gem returns ts as a Float and the counters as Integers; everything
 * else (metadata included) stays a string. */
static json_t *field_value(const char *k, const char *v)
{
    if (strcmp(k, "ts") == 0 || strcmp(k, "l_spc_ts") == 0 || strcmp(k, "l_spc_ext_ts") == 0)
        return json_real(atof(v));
    if (strcmp(k, "ini_ttl") == 0 || strcmp(k, "capstan_fence") == 0 || strcmp(k, "spc_cnt") == 0 ||
        strcmp(k, "spc_ext_ttl") == 0 || strcmp(k, "l_spc_ext_ini_ttl") == 0)
        return json_integer(atoll(v));
    return json_string(v);
}

/* HGETALL and PTTL of a lock key in one MULTI; *out = info object, or NULL
 * when the key is gone. */
static int lock_info_key(capstan_redis_t *r, const char *key, json_t **out, char *err)
{
    const char *multi[] = { "MULTI" }, *exec[] = { "EXEC" };
    const char *hg[] = { "HGETALL", key }, *pt[] = { "PTTL", key };
    redisReply *rep = NULL;
    int rc = 0;
    *out = NULL;
    if (capstan_redis_append(r, 1, multi, NULL) || capstan_redis_append(r, 2, hg, NULL) ||
        capstan_redis_append(r, 2, pt, NULL) || capstan_redis_append(r, 1, exec, NULL))
        return capstan__reply_error(r, NULL, "lock info", err);
    for (int i = 0; i < 4; i++) {
        freeReplyObject(rep);
        if (!(rep = capstan_redis_get_reply(r)))
            return capstan__reply_error(r, NULL, "lock info", err);
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_ARRAY || rep->element[1]->type != REDIS_REPLY_INTEGER) {
        rc = capstan__reply_error(r, rep, "lock info", err);
        goto out;
    }
    redisReply *h = rep->element[0];
    if (h->elements == 0)
        goto out;
    json_t *o = json_object();
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        json_object_set_new(o, h->element[i]->str, field_value(h->element[i]->str, h->element[i + 1]->str));
    json_object_set_new(o, "lock_key", json_string(key));
    json_object_set_new(o, "rem_ttl", json_integer(rep->element[1]->integer));
    *out = o;
out:
    freeReplyObject(rep);
    return rc;
}

int capstan_qlock_info(capstan_redis_t *r, const char *name, json_t **out, char *err)
{
    ql_keys_t k;
    int rc = capstan__qlock_keys(name, &k, err);
    *out = NULL;
    return rc ? rc : lock_info_key(r, k.lock, out, err);
}

static int queue_requests(capstan_redis_t *r, const char *key, json_t **out, char *err)
{
    const char *argv[] = { "ZRANGE", key, "0", "-1", "WITHSCORES" };
    redisReply *rep = capstan_redis_cmd(r, 5, argv, NULL);
    *out = NULL;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        int rc = capstan__reply_error(r, rep, "queue info", err);
        freeReplyObject(rep);
        return rc;
    }
    json_t *a = json_array();
    for (size_t i = 0; i + 1 < rep->elements; i += 2)
        json_array_append_new(a, json_pack("{s:s, s:f}", "acq_id", rep->element[i]->str,
                                           "score", atof(rep->element[i + 1]->str)));
    freeReplyObject(rep);
    *out = a;
    return 0;
}

int capstan_qlock_queue_info(capstan_redis_t *r, const char *name, json_t **out, char *err)
{
    ql_keys_t k;
    json_t *reqs = NULL;
    int rc = capstan__qlock_keys(name, &k, err);
    *out = NULL;
    if (rc || (rc = queue_requests(r, k.queue, &reqs, err)))
        return rc;
    if (json_array_size(reqs) == 0) {
        json_decref(reqs);
        return 0;
    }
    *out = json_pack("{s:s, s:o}", "lock_queue", k.queue, "queue", reqs);
    return 0;
}

static int exists(capstan_redis_t *r, const char *name, int queue, char *err)
{
    ql_keys_t k;
    int rc = capstan__qlock_keys(name, &k, err);
    if (rc)
        return rc;
    const char *argv[] = { "EXISTS", queue ? k.queue : k.lock };
    redisReply *rep = capstan_redis_cmd(r, 2, argv, NULL);
    rc = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer > 0
                                                 : capstan__reply_error(r, rep, "EXISTS", err);
    freeReplyObject(rep);
    return rc;
}

int capstan_qlock_locked(capstan_redis_t *r, const char *name, char *err) { return exists(r, name, 0, err); }
int capstan_qlock_queued(capstan_redis_t *r, const char *name, char *err) { return exists(r, name, 1, err); }

/* SCANs pattern into a new array of distinct key names. */
static int scan(capstan_redis_t *r, const char *pattern, size_t count, json_t **out, char *err)
{
    json_t *seen = json_object();
    const redisReply *page;
    capstan_scan_t s;
    int rc;
    *out = NULL;
    capstan__scan_init(&s, r, NULL, pattern, count ? (long)count : 500);
    while ((rc = capstan__scan_next(&s, &page, err)) > 0)
        for (size_t i = 0; i < page->elements; i++)
            json_object_set_new(seen, page->element[i]->str, json_true());
    capstan__scan_close(&s);
    if (rc)
        goto out;
    json_t *a = json_array();
    const char *key;
    json_t *v;
    json_object_foreach(seen, key, v)
        json_array_append_new(a, json_string(key));
    *out = a;
out:
    json_decref(seen);
    return rc;
}

int capstan_qlock_locks(capstan_redis_t *r, size_t n, json_t **out, char *err) { return scan(r, QL_LOCK_PATTERN, n, out, err); }
int capstan_qlock_queues(capstan_redis_t *r, size_t n, json_t **out, char *err) { return scan(r, QL_QUEUE_PATTERN, n, out, err); }
int capstan_qlock_keys(capstan_redis_t *r, size_t n, json_t **out, char *err)
{
    return scan(r, CAPSTAN_KEY_QLOCK_ANY, n, out, err);
}

int capstan_qlock_locks_info(capstan_redis_t *r, size_t scan_size, json_t **out, char *err)
{
    json_t *keys = NULL, *a = NULL, *v;
    size_t i;
    int rc = scan(r, QL_LOCK_PATTERN, scan_size, &keys, err);
    *out = NULL;
    if (rc)
        return rc;
    a = json_array();
    json_array_foreach(keys, i, v) {
        json_t *info = NULL;
        if ((rc = lock_info_key(r, json_string_value(v), &info, err)))
            goto out;
        /* A lock may expire between SCAN and the read: the gem calls that
         * "released". */
        json_array_append_new(a, json_pack("{s:O, s:s, s:o}", "lock", v, "status",
                                           info ? "alive" : "released", "info", info ? info : json_object()));
    }
    *out = a;
    a = NULL;
out:
    json_decref(a);
    json_decref(keys);
    return rc;
}

int capstan_qlock_queues_info(capstan_redis_t *r, size_t scan_size, json_t **out, char *err)
{
    json_t *keys = NULL, *a = NULL, *v;
    size_t i;
    int rc = scan(r, QL_QUEUE_PATTERN, scan_size, &keys, err);
    *out = NULL;
    if (rc)
        return rc;
    a = json_array();
    json_array_foreach(keys, i, v) {
        json_t *reqs = NULL;
        if ((rc = queue_requests(r, json_string_value(v), &reqs, err)))
            goto out;
        json_array_append_new(a, json_pack("{s:O, s:o}", "queue", v, "requests", reqs));
    }
    *out = a;
    a = NULL;
out:
    json_decref(a);
    json_decref(keys);
    return rc;
}

int capstan_qlock_force_unlock(capstan_qlock_client_t *c, capstan_redis_t *r, const char *name,
                               int *lock_released, int *queue_released, char *err)
{
    ql_keys_t k;
    redisReply *rep = NULL;
    int rc = capstan__qlock_keys(name, &k, err);
    if (rc)
        return rc;
    double t0 = capstan__mono();
    const char *multi[] = { "MULTI" }, *exec[] = { "EXEC" };
    const char *dq[] = { "DEL", k.queue }, *dl[] = { "DEL", k.lock }, *ds[] = { "DEL", k.seen };
    if (capstan_redis_append(r, 1, multi, NULL) || capstan_redis_append(r, 2, dq, NULL) ||
        capstan_redis_append(r, 2, dl, NULL) || capstan_redis_append(r, 2, ds, NULL) ||
        capstan_redis_append(r, 1, exec, NULL))
        return capstan__reply_error(r, NULL, "unlock", err);
    for (int i = 0; i < 5; i++) {
        freeReplyObject(rep);
        if (!(rep = capstan_redis_get_reply(r)))
            return capstan__reply_error(r, NULL, "unlock", err);
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3) {
        rc = capstan__reply_error(r, rep, "unlock", err);
        goto out;
    }
    if (queue_released)
        *queue_released = rep->element[0]->integer > 0;
    if (lock_released)
        *lock_released = rep->element[1]->integer > 0;
    capstan_qlock_event_t ev = { .name = "redis_queued_locks.explicit_lock_release", .lock_key = k.lock,
                             .lock_key_queue = k.queue, .rel_time = (capstan__mono() - t0) * 1000.0,
                             .at = capstan__now() };
    capstan__qlock_emit(c, &ev);
out:
    freeReplyObject(rep);
    return rc;
}

/* DELs keys[from, to) and, for queues, capstan's side hash; returns the number
 * of lock and queue keys that existed, or a negative code. */
static long long del_batch(capstan_redis_t *r, json_t *keys, size_t from, size_t to, char *err)
{
    long long n = 0;
    for (size_t i = from; i < to; i++) {
        const char *key = json_string_value(json_array_get(keys, i));
        const char *del[] = { "DEL", key };
        char seen[QL_KEY_MAX + 32];
        if (capstan_redis_append(r, 2, del, NULL))
            return capstan__reply_error(r, NULL, "clear locks", err);
        if (strncmp(key, CAPSTAN_KEY_QLOCK_QUEUE, strlen(CAPSTAN_KEY_QLOCK_QUEUE)) == 0) {
            capstan__key(seen, sizeof(seen), CAPSTAN_KEY_QLOCK_SEEN, key + strlen(CAPSTAN_KEY_QLOCK_QUEUE));
            const char *ds[] = { "DEL", seen };
            if (capstan_redis_append(r, 2, ds, NULL))
                return capstan__reply_error(r, NULL, "clear locks", err);
        }
    }
    int rc = 0;
    for (size_t i = from; i < to; i++) {
        const char *key = json_string_value(json_array_get(keys, i));
        int queue = strncmp(key, CAPSTAN_KEY_QLOCK_QUEUE, strlen(CAPSTAN_KEY_QLOCK_QUEUE)) == 0;
        for (int j = 0; j <= queue; j++) {
            redisReply *rep = capstan_redis_get_reply(r);
            if (!rep)
                return capstan__reply_error(r, NULL, "clear locks", err);
            if (rep->type != REDIS_REPLY_INTEGER && !rc)
                rc = capstan__reply_error(r, rep, "clear locks", err);
            else if (j == 0 && rep->type == REDIS_REPLY_INTEGER)
                n += rep->integer;
            freeReplyObject(rep);
        }
    }
    return rc ? rc : n;
}

int capstan_qlock_clear_locks(capstan_qlock_client_t *c, capstan_redis_t *r, size_t batch, long long *count, char *err)
{
    json_t *keys = NULL;
    double t0 = capstan__mono();
    long long n = 0;
    int rc = scan(r, CAPSTAN_KEY_QLOCK_ANY, batch, &keys, err);
    if (rc)
        return rc;
    size_t step = batch ? batch : 100, total = json_array_size(keys);
    for (size_t i = 0; i < total; i += step) {
        long long got = del_batch(r, keys, i, i + step < total ? i + step : total, err);
        if (got < 0) {
            rc = (int)got;
            goto out;
        }
        n += got;
    }
    if (count)
        *count = n;
    capstan_qlock_event_t ev = { .name = "redis_queued_locks.explicit_all_locks_release",
                             .rel_time = (capstan__mono() - t0) * 1000.0, .at = capstan__now(),
                             .rel_key_cnt = n };
    capstan__qlock_emit(c, &ev);
out:
    json_decref(keys);
    return rc;
}

int capstan_qlock_clear_dead_requests(capstan_redis_t *r, long long dead_ttl, size_t scan_size,
                                      json_t **processed, long long *dropped, char *err)
{
    json_t *keys = NULL, *done = json_array(), *v;
    long long total = 0;
    size_t i;
    int rc = scan(r, QL_QUEUE_PATTERN, scan_size, &keys, err);
    if (rc)
        goto out;
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%lld", dead_ttl < 0 ? 86400000LL : dead_ttl);
    json_array_foreach(keys, i, v) {
        ql_keys_t k;
        const char *key = json_string_value(v);
        if (capstan__qlock_keys(key + strlen(CAPSTAN_KEY_QLOCK_QUEUE), &k, NULL))
            continue; /* a name too long to be ours: leave it */
        const char *argv[] = { k.queue, k.seen, ttl };
        redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_QLOCK_PURGE, 2, 3, argv, NULL);
        if (!rep || rep->type != REDIS_REPLY_INTEGER) {
            /* A key of another type under the pattern is not a queue. */
            if (rep && rep->type == REDIS_REPLY_ERROR && strstr(rep->str, "WRONGTYPE")) {
                freeReplyObject(rep);
                continue;
            }
            rc = capstan__reply_error(r, rep, "clear dead requests", err);
            freeReplyObject(rep);
            goto out;
        }
        if (rep->integer > 0) {
            json_array_append(done, v);
            total += rep->integer;
        }
        freeReplyObject(rep);
    }
    if (processed) {
        *processed = done;
        done = NULL;
    }
    if (dropped)
        *dropped = total;
out:
    json_decref(done);
    json_decref(keys);
    return rc;
}
