/* The reaper's sweep (unique/reaper.c): every jid that is anywhere a job
 * can be, read in pages within the run's time, in the order jobs flow, so
 * a job moving forward while we read is seen before or after its move. */
#include "unique/reap.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/keys.h"
#include "redis/reply.h"
#include "redis/scan.h"
#include "support/time.h"

/* ---- a set of jids ---------------------------------------------------------- */

static uint64_t hash_str(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int jidset_grow(capstan_jidset_t *s)
{
    size_t cap = s->cap ? s->cap * 2 : 1024;
    char **slots = calloc(cap, sizeof(char *));
    if (!slots)
        return CAPSTAN_ENOMEM;
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->slots[i])
            continue;
        size_t j = hash_str(s->slots[i], strlen(s->slots[i])) & (cap - 1);
        while (slots[j])
            j = (j + 1) & (cap - 1);
        slots[j] = s->slots[i];
    }
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
    return 0;
}

static int jidset_has(const capstan_jidset_t *s, const char *jid, size_t len)
{
    if (!s->cap)
        return 0;
    for (size_t j = hash_str(jid, len) & (s->cap - 1); s->slots[j]; j = (j + 1) & (s->cap - 1))
        if (strlen(s->slots[j]) == len && memcmp(s->slots[j], jid, len) == 0)
            return 1;
    return 0;
}

static int jidset_add(capstan_jidset_t *s, const char *jid, size_t len)
{
    if (jidset_has(s, jid, len))
        return 0;
    if ((s->n + 1) * 2 > s->cap && jidset_grow(s))
        return CAPSTAN_ENOMEM;
    char *copy = strndup(jid, len);
    if (!copy)
        return CAPSTAN_ENOMEM;
    size_t j = hash_str(jid, len) & (s->cap - 1);
    while (s->slots[j])
        j = (j + 1) & (s->cap - 1);
    s->slots[j] = copy;
    s->n++;
    return 0;
}

static void jidset_free(capstan_jidset_t *s)
{
    for (size_t i = 0; i < s->cap; i++)
        free(s->slots[i]);
    free(s->slots);
    memset(s, 0, sizeof(*s));
}

/* Adds every value of a "jid" key in text, plain JSON or JSON held in a
 * JSON string (work hashes). Every match counts, not only the top-level
 * one: a jid in args only makes the reaper keep more, never less. Matches
 * reap.lua's pattern. */
static int add_jids(capstan_jidset_t *s, const char *text, size_t len)
{
    const char *end = text + len, *p = text;
    while (p < end && (p = memmem(p, (size_t)(end - p), "jid", 3))) {
        const char *q = p + 3;
        p = q;
        if (q < end && *q == '\\')
            q++;
        if (q >= end || *q++ != '"')
            continue;
        while (q < end && isspace((unsigned char)*q))
            q++;
        if (q >= end || *q++ != ':')
            continue;
        while (q < end && isspace((unsigned char)*q))
            q++;
        if (q < end && *q == '\\')
            q++;
        if (q >= end || *q++ != '"')
            continue;
        const char *v = q;
        while (q < end && *q != '"' && *q != '\\')
            q++;
        if (q > v && jidset_add(s, v, (size_t)(q - v)))
            return CAPSTAN_ENOMEM;
        p = q;
    }
    return 0;
}


/* Adds the jids of every string element of an array reply. */
static int add_reply(capstan_reap_sweep_t *sw, const redisReply *rep)
{
    for (size_t i = 0; i < rep->elements; i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING
            && add_jids(&sw->live, rep->element[i]->str, rep->element[i]->len))
            return CAPSTAN_ENOMEM;
    return 0;
}

/* Reads a list from the left in pages. New jobs arrive on the left and
 * fetches take from the right, so the index of a job we have not read yet
 * only grows: none is skipped (some are read twice). Returns 0, 1 when the
 * time ran out, or an error. */
static int sweep_list(capstan_redis_t *r, capstan_reap_sweep_t *sw, const char *key, char *err)
{
    for (long start = 0;; start += 1000) {
        if (capstan__mono() > sw->deadline)
            return 1;
        char s[32], e[32];
        snprintf(s, sizeof(s), "%ld", start);
        snprintf(e, sizeof(e), "%ld", start + 999);
        const char *argv[] = { "LRANGE", key, s, e };
        redisReply *rep = capstan_redis_cmd(r, 4, argv, NULL);
        if (rep && rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "WRONGTYPE", 9)) {
            freeReplyObject(rep); /* a key that only looks like a list of ours */
            return 0;
        }
        if (!rep || rep->type != REDIS_REPLY_ARRAY) {
            int rc = capstan__reply_error(r, rep, "LRANGE", err);
            freeReplyObject(rep);
            return rc;
        }
        int rc = add_reply(sw, rep);
        size_t n = rep->elements;
        freeReplyObject(rep);
        if (rc)
            return capstan_seterr(err, rc, "out of memory");
        if (n < 1000)
            return 0;
    }
}

/* The next page of s unless the sweep's time ran out: 0 with *page (NULL
 * at the end), 1 when the time ran out, or an error. */
static int sweep_page(const capstan_reap_sweep_t *sw, capstan_scan_t *s, const redisReply **page,
                      char *err)
{
    *page = NULL;
    if (capstan__mono() > sw->deadline)
        return 1;
    int more = capstan__scan_next(s, page, err);
    return more > 0 ? 0 : more;
}

/* ZSCAN returns every member present for the whole scan; one that leaves
 * meanwhile has moved on to a place swept later. */
static int sweep_zset(capstan_redis_t *r, capstan_reap_sweep_t *sw, const char *key, char *err)
{
    const redisReply *page;
    capstan_scan_t s;
    int rc;
    capstan__scan_init(&s, r, key, NULL, 1000);
    while (!(rc = sweep_page(sw, &s, &page, err)) && page) {
        /* Members and scores alternate; a score never contains "jid". */
        if (add_reply(sw, page)) {
            rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
            break;
        }
    }
    capstan__scan_close(&s);
    return rc;
}

static int sweep_queues(capstan_redis_t *r, capstan_reap_sweep_t *sw, char *err)
{
    redisReply *rep = capstan_redis_cmdf(r, "SMEMBERS %s", CAPSTAN_KEY_QUEUES);
    int rc = 0;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        rc = capstan__reply_error(r, rep, "SMEMBERS " CAPSTAN_KEY_QUEUES, err);
        goto out;
    }
    for (size_t i = 0; i < rep->elements && !rc; i++) {
        char *key = capstan__key_dup(CAPSTAN_KEY_QUEUE, rep->element[i]->str); /* any length */
        rc = key ? sweep_list(r, sw, key, err) : capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        free(key);
    }
out:
    freeReplyObject(rep);
    return rc;
}

static int sweep_working(capstan_redis_t *r, capstan_reap_sweep_t *sw, char *err)
{
    const redisReply *keys;
    capstan_scan_t s;
    int rc = 0;
    capstan__scan_init(&s, r, NULL, CAPSTAN_KEY_WORKING "*", 1000);
    while (!rc && !(rc = sweep_page(sw, &s, &keys, err)) && keys) {
        for (size_t i = 0; i < keys->elements && !rc; i++) {
            char **w = realloc(sw->working, (sw->nworking + 1) * sizeof(char *));
            if (!w || !(w[sw->nworking] = strdup(keys->element[i]->str))) {
                if (w)
                    sw->working = w;
                rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
                break;
            }
            sw->working = w;
            sw->nworking++;
            rc = sweep_list(r, sw, keys->element[i]->str, err);
        }
    }
    capstan__scan_close(&s);
    return rc;
}

/* The <identity>:work hashes of live processes (v9 checks the same). */
static int sweep_work(capstan_redis_t *r, capstan_reap_sweep_t *sw, char *err)
{
    redisReply *rep = capstan_redis_cmdf(r, "SMEMBERS %s", CAPSTAN_KEY_PROCESSES);
    int rc = 0;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        rc = capstan__reply_error(r, rep, "SMEMBERS " CAPSTAN_KEY_PROCESSES, err);
        goto out;
    }
    for (size_t i = 0; i < rep->elements && !rc; i++) {
        const char *id = rep->element[i]->str;
        redisReply *ex = capstan_redis_cmdf(r, "EXISTS %s", id);
        int alive = ex && ex->type == REDIS_REPLY_INTEGER && ex->integer == 1;
        if (!ex)
            rc = capstan__reply_error(r, ex, "EXISTS", err);
        freeReplyObject(ex);
        if (!alive || rc)
            continue;
        redisReply *w = capstan_redis_cmdf(r, "HVALS %s" CAPSTAN_KEY_WORK, id);
        if (!w || w->type != REDIS_REPLY_ARRAY)
            rc = capstan__reply_error(r, w, "HVALS", err);
        else if (add_reply(sw, w))
            rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        freeReplyObject(w);
    }
out:
    freeReplyObject(rep);
    return rc;
}

int capstan__reap_sweep_all(capstan_redis_t *r, capstan_reap_sweep_t *sw, char *err)
{
    int rc = sweep_zset(r, sw, CAPSTAN_KEY_SCHEDULE, err);
    if (!rc) rc = sweep_zset(r, sw, CAPSTAN_KEY_RETRY, err);
    if (!rc) rc = sweep_queues(r, sw, err);
    if (!rc) rc = sweep_working(r, sw, err);
    if (!rc) rc = sweep_work(r, sw, err);
    if (!rc) rc = sweep_zset(r, sw, CAPSTAN_KEY_RETRY, err);
    if (!rc) rc = sweep_zset(r, sw, CAPSTAN_KEY_SCHEDULE, err);
    return rc;
}

int capstan__reap_sweep_has(const capstan_reap_sweep_t *sw, const char *jid)
{
    return jidset_has(&sw->live, jid, strlen(jid));
}

void capstan__reap_sweep_free(capstan_reap_sweep_t *sw)
{
    jidset_free(&sw->live);
    for (size_t i = 0; i < sw->nworking; i++)
        free(sw->working[i]);
    free(sw->working);
}
