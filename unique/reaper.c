/* The uniqueness reaper: frees locks whose jobs no longer exist anywhere,
 * a bounded piece of work per run, one run at a time across the fleet.
 *
 * Finding out whether a jid is anywhere means reading every queue, the
 * schedule and retry sets, the working lists and the work hashes: too much
 * to do inside one script without stalling Redis. So the sweep runs here,
 * in pages, in the order jobs flow (schedule, retry, queues, working lists,
 * work hashes, then retry and schedule again, which failed and rescheduled
 * jobs flow back into), so a job moving forward while we read is seen
 * before or after its move. What a job can move into behind the sweep's
 * back (a working list, a work hash, the fetched end of a queue) is checked
 * again together with the removal in lua/reap.lua, atomically. */
#include "unique/admin.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "unique/admin_internal.h"
#include "redis/keys.h"
#include "redis/reply.h"
#include "redis/scan.h"
#include "redis/scripts.h"
#include "support/identity.h"
#include "support/number.h"
#include "support/time.h"

#define CURSOR_TTL "86400"
#define PAGE 500           /* digests read per ZRANGE */
#define BATCH 100          /* digests per reap.lua call */
#define QUEUE_TAIL "100"   /* jobs at the fetched end of a queue reap.lua reads */

/* ---- a set of jids ---------------------------------------------------------- */

typedef struct jidset {
    char **slots;
    size_t cap, n;
} jidset_t;

static uint64_t hash_str(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int jidset_grow(jidset_t *s)
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

static int jidset_has(const jidset_t *s, const char *jid, size_t len)
{
    if (!s->cap)
        return 0;
    for (size_t j = hash_str(jid, len) & (s->cap - 1); s->slots[j]; j = (j + 1) & (s->cap - 1))
        if (strlen(s->slots[j]) == len && memcmp(s->slots[j], jid, len) == 0)
            return 1;
    return 0;
}

static int jidset_add(jidset_t *s, const char *jid, size_t len)
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

static void jidset_free(jidset_t *s)
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
static int add_jids(jidset_t *s, const char *text, size_t len)
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

/* ---- the sweep ------------------------------------------------------------ */

typedef struct sweep {
    jidset_t live;
    char **working;  /* working list names, passed on to reap.lua */
    size_t nworking;
    double deadline; /* monotonic */
} sweep_t;

/* Adds the jids of every string element of an array reply. */
static int add_reply(sweep_t *sw, const redisReply *rep)
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
static int sweep_list(capstan_redis_t *r, sweep_t *sw, const char *key, char *err)
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
static int sweep_page(const sweep_t *sw, capstan_scan_t *s, const redisReply **page, char *err)
{
    *page = NULL;
    if (capstan__mono() > sw->deadline)
        return 1;
    int more = capstan__scan_next(s, page, err);
    return more > 0 ? 0 : more;
}

/* ZSCAN returns every member present for the whole scan; one that leaves
 * meanwhile has moved on to a place swept later. */
static int sweep_zset(capstan_redis_t *r, sweep_t *sw, const char *key, char *err)
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

static int sweep_queues(capstan_redis_t *r, sweep_t *sw, char *err)
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

static int sweep_working(capstan_redis_t *r, sweep_t *sw, char *err)
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
static int sweep_work(capstan_redis_t *r, sweep_t *sw, char *err)
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

/* 0 when complete, 1 when the time ran out, or an error. */
static int sweep_all(capstan_redis_t *r, sweep_t *sw, char *err)
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

static void sweep_free(sweep_t *sw)
{
    jidset_free(&sw->live);
    for (size_t i = 0; i < sw->nworking; i++)
        free(sw->working[i]);
    free(sw->working);
}

/* ---- leases ------------------------------------------------------------------ */

/* Takes key for owner, or keeps it when owner already holds it. Returns 1
 * when owner holds it, 0 when another does (holder copied), or an error. */
static int lease(capstan_redis_t *r, const char *key, const char *owner, long ttl_ms,
                 char *holder, size_t hn, char *err)
{
    char px[32];
    snprintf(px, sizeof(px), "%ld", ttl_ms);
    for (int attempt = 0; attempt < 2; attempt++) {
        const char *set[] = { "SET", key, owner, "NX", "PX", px };
        redisReply *rep = capstan_redis_cmd(r, 6, set, NULL);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            int rc = capstan__reply_error(r, rep, "SET", err);
            freeReplyObject(rep);
            return rc;
        }
        int won = rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        if (won)
            return 1;
        const char *get[] = { "GET", key };
        rep = capstan_redis_cmd(r, 2, get, NULL);
        if (!rep)
            return capstan__reply_error(r, rep, "GET", err);
        if (rep->type != REDIS_REPLY_STRING) {
            freeReplyObject(rep); /* lapsed between SET and GET */
            continue;
        }
        int mine = strcmp(rep->str, owner) == 0;
        snprintf(holder, hn, "%s", rep->str);
        freeReplyObject(rep);
        if (!mine)
            return 0;
        const char *pexp[] = { "PEXPIRE", key, px };
        rep = capstan_redis_cmd(r, 3, pexp, NULL);
        int kept = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
        freeReplyObject(rep);
        if (kept)
            return 1;
    }
    return 0;
}

/* Deletes key if owner holds it. Not atomic: the run lease outlives the run
 * by 30 s, so it cannot have changed hands in between. */
static int unlease(capstan_redis_t *r, const char *key, const char *owner)
{
    const char *get[] = { "GET", key };
    redisReply *rep = capstan_redis_cmd(r, 2, get, NULL);
    if (!rep)
        return CAPSTAN_EREDIS;
    int mine = rep->type == REDIS_REPLY_STRING && strcmp(rep->str, owner) == 0;
    freeReplyObject(rep);
    if (!mine)
        return 0;
    const char *del[] = { "DEL", key };
    rep = capstan_redis_cmd(r, 2, del, NULL);
    int rc = rep ? 0 : CAPSTAN_EREDIS;
    freeReplyObject(rep);
    return rc;
}

int capstan__unique_reaper_release(capstan_redis_t *r, const char *owner)
{
    return unlease(r, CAPSTAN_UNIQUE_REAPER_KEY, owner);
}

/* ---- the run -------------------------------------------------------------- */

/* A digest read from uniquejobs:digests, with what its LOCKED hash held. */
typedef struct cand {
    char *digest;
    char score[64];
    char **jids;
    size_t njids;
    int until_expired; /* some holder's metadata says so */
    int foreign;       /* <digest>:LOCKED is not a hash: not ours to judge */
    long long pttl;
} cand_t;

static void cand_clear(cand_t *c)
{
    free(c->digest);
    for (size_t i = 0; i < c->njids; i++)
        free(c->jids[i]);
    free(c->jids);
    memset(c, 0, sizeof(*c));
}

/* A batch of suspects for reap.lua. */
typedef struct batch {
    const char **argv;
    size_t argc, cap;
} batch_t;

static int batch_push(batch_t *b, const char *s)
{
    if (b->argc == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        const char **a = realloc(b->argv, cap * sizeof(char *));
        if (!a)
            return CAPSTAN_ENOMEM;
        b->argv = a;
        b->cap = cap;
    }
    b->argv[b->argc++] = s;
    return 0;
}

static int result_add(capstan_reap_result_t *out, const char *digest)
{
    char **d = realloc(out->digests, (out->ndigests + 1) * sizeof(char *));
    if (!d)
        return CAPSTAN_ENOMEM;
    out->digests = d;
    if (!(d[out->ndigests] = strdup(digest)))
        return CAPSTAN_ENOMEM;
    out->ndigests++;
    return 0;
}

/* Sends the batch's suspects (cands[from..to) marked in `suspect`) to
 * reap.lua and records what it removed. */
static int flush(capstan_redis_t *r, sweep_t *sw, cand_t *cands, const int *suspect, size_t from,
                 size_t to, capstan_reap_result_t *out, char *err)
{
    batch_t b = {0};
    char counts[PAGE][24];
    int rc = 0, any = 0;
    /* Every key the script touches that can be known here is declared
     * (Dragonfly, cluster proxies): with the working lists, "processes",
     * "queues" and each suspect's lock hash. What the script reads from
     * those sets (live processes' keys, queues) cannot be: doc/internals.md. */
    char **locked = calloc(to > from ? to - from : 1, sizeof(*locked));
    if (!locked)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    rc = batch_push(&b, CAPSTAN_UNIQUE_DIGESTS);
    if (!rc)
        rc = batch_push(&b, CAPSTAN_KEY_PROCESSES);
    if (!rc)
        rc = batch_push(&b, CAPSTAN_KEY_QUEUES);
    for (size_t i = 0; !rc && i < sw->nworking; i++)
        rc = batch_push(&b, sw->working[i]);
    for (size_t i = from; !rc && i < to; i++) {
        if (!suspect[i])
            continue;
        size_t n = strlen(cands[i].digest) + sizeof(":LOCKED");
        if (!(locked[i - from] = malloc(n)))
            rc = CAPSTAN_ENOMEM;
        else {
            snprintf(locked[i - from], n, "%s:LOCKED", cands[i].digest);
            rc = batch_push(&b, locked[i - from]);
        }
    }
    int nkeys = (int)b.argc;
    if (!rc)
        rc = batch_push(&b, QUEUE_TAIL);
    for (size_t i = from; !rc && i < to; i++) {
        if (!suspect[i])
            continue;
        any = 1;
        cand_t *c = &cands[i];
        snprintf(counts[i], sizeof(counts[i]), "%zu", c->njids);
        rc = batch_push(&b, c->digest);
        if (!rc)
            rc = batch_push(&b, counts[i]);
        for (size_t k = 0; !rc && k < c->njids; k++)
            rc = batch_push(&b, c->jids[k]);
    }
    if (rc) {
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        goto out;
    }
    if (!any)
        goto out;
    redisReply *rep = capstan__redis_script(r, CAPSTAN_SCRIPT_REAP, nkeys, (int)b.argc, b.argv, NULL);
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        rc = capstan__reply_error(r, rep, "reap.lua", err);
        freeReplyObject(rep);
        goto out;
    }
    for (size_t k = 0; !rc && k < rep->elements; k++) {
        const char *d = rep->element[k]->str;
        if (!d)
            continue;
        out->removed++;
        for (size_t i = from; i < to; i++)
            if (suspect[i] && cands[i].njids == 0 && strcmp(cands[i].digest, d) == 0) {
                out->stale++;
                break;
            }
        if (result_add(out, d))
            rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    }
    freeReplyObject(rep);
out:
    for (size_t i = from; i < to; i++)
        free(locked[i - from]);
    free(locked);
    free(b.argv);
    return rc;
}

/* Reads one page of digests after the cursor (score, member), with their
 * LOCKED hashes and TTLs. *n gets how many; 0 means the end. */
static int read_page(capstan_redis_t *r, const char *cscore, const char *cmember, cand_t *cands,
                     size_t *n, char *err)
{
    int rc = 0;
    redisReply *page = NULL;
    *n = 0;
    /* Members with the cursor's own score come in member order: skip those
     * up to the cursor, paging on when a whole page is such ties. */
    for (long offset = 0;; offset += PAGE) {
        char min[80], off[32], cnt[32];
        snprintf(min, sizeof(min), "%s", *cscore ? cscore : "-inf");
        snprintf(off, sizeof(off), "%ld", offset);
        snprintf(cnt, sizeof(cnt), "%d", PAGE);
        const char *argv[] = { "ZRANGE", CAPSTAN_UNIQUE_DIGESTS, min, "+inf", "BYSCORE",
                               "LIMIT", off, cnt, "WITHSCORES" };
        freeReplyObject(page);
        page = capstan_redis_cmd(r, 9, argv, NULL);
        if (!page || page->type != REDIS_REPLY_ARRAY) {
            rc = capstan__reply_error(r, page, "ZRANGE " CAPSTAN_UNIQUE_DIGESTS, err);
            goto out;
        }
        if (page->elements == 0)
            goto out;
        double cs = *cscore ? strtod(cscore, NULL) : 0;
        for (size_t i = 0; i + 1 < page->elements; i += 2) {
            const char *m = page->element[i]->str, *s = page->element[i + 1]->str;
            if (*cscore && strtod(s, NULL) == cs && strcmp(m, cmember) <= 0)
                continue;
            cand_t *c = &cands[(*n)++];
            if (!(c->digest = strdup(m))) {
                rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
                goto out;
            }
            snprintf(c->score, sizeof(c->score), "%s", s);
        }
        if (*n || page->elements < 2 * PAGE)
            break;
    }
    /* The holders and TTL of each, pipelined. */
    for (size_t i = 0; i < *n; i++) {
        char key[1100];
        capstan__key(key, sizeof(key), cands[i].digest, CAPSTAN_KEY_LOCKED);
        const char *hg[] = { "HGETALL", key };
        const char *pt[] = { "PTTL", key };
        if (capstan_redis_append(r, 2, hg, NULL) || capstan_redis_append(r, 2, pt, NULL)) {
            rc = capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
            goto out;
        }
    }
    for (size_t i = 0; i < *n; i++) {
        cand_t *c = &cands[i];
        redisReply *h = capstan_redis_get_reply(r);
        redisReply *t = h ? capstan_redis_get_reply(r) : NULL;
        if (!h || !t) {
            freeReplyObject(h);
            rc = capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
            goto out;
        }
        c->pttl = t->type == REDIS_REPLY_INTEGER ? t->integer : -1;
        if (h->type == REDIS_REPLY_ARRAY && h->elements >= 2) {
            c->jids = calloc(h->elements / 2, sizeof(char *));
            for (size_t k = 0; c->jids && k + 1 < h->elements; k += 2) {
                if (!(c->jids[c->njids] = strdup(h->element[k]->str)))
                    break;
                c->njids++;
                /* v8 wrote a float time here instead of JSON metadata. */
                json_t *meta = json_loads(h->element[k + 1]->str, 0, NULL);
                const char *type = json_string_value(json_object_get(meta, "type"));
                if (type && !strcmp(type, "until_expired"))
                    c->until_expired = 1;
                json_decref(meta);
            }
            if (c->njids != h->elements / 2)
                rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        } else if (h->type == REDIS_REPLY_ERROR) {
            /* A key of another type at <digest>:LOCKED: not a lock we know;
             * leave it alone rather than delete someone's data. */
            c->foreign = 1;
        }
        freeReplyObject(h);
        freeReplyObject(t);
        if (rc)
            goto out;
    }
out:
    freeReplyObject(page);
    return rc;
}

/* The same hostname as the process identity ($DYNO when set). */
static void default_owner(char *out, size_t n)
{
    char host[256];
    capstan__hostname(host, sizeof(host));
    snprintf(out, n, "%s:%ld", host, (long)getpid());
}

void capstan__reap_result_clear(capstan_reap_result_t *out)
{
    if (!out)
        return;
    for (size_t i = 0; i < out->ndigests; i++)
        free(out->digests[i]);
    free(out->digests);
    out->digests = NULL;
    out->ndigests = 0;
}

/* One run: its limits, the job sweep (done at most once, when the first
 * digest with holders needs it) and the walk's position. */
typedef struct run {
    capstan_redis_t *r;
    capstan_reap_result_t *out;
    long count;
    double grace;
    double cutoff;     /* digests locked after this keep their holders unchecked */
    sweep_t sw;
    int swept;         /* 0 not yet, 1 complete, -1 ran out of time */
    cand_t *cands;     /* PAGE of them */
    int *suspect;      /* PAGE flags: send to reap.lua */
    char cscore[64], cmember[1024]; /* the last digest decided, or "" */
} run_t;

/* Takes v9's fleet role (when asked) and the per-run lease (unless forced).
 * Returns 1 when the run may go on, 0 when another reaper holds one
 * (out->busy, out->holder), or an error. *leased says whether the run lease
 * must be given back. */
static int take_leases(run_t *run, const capstan_reap_opts_t *o, double timeout, const char *owner,
                       int *leased, char *err)
{
    capstan_reap_result_t *out = run->out;
    int rc;
    if (o->role_ttl > 0) {
        /* v9 keeps the role (its reaper mutex) for interval + 2 %, in whole
         * seconds, and renews it every cycle. */
        long ms = (long)capstan__ceil(o->role_ttl) * 1000;
        rc = lease(run->r, CAPSTAN_UNIQUE_REAPER_KEY, owner, ms, out->holder, sizeof(out->holder),
                   err);
        if (rc <= 0) {
            out->busy = rc == 0;
            return rc;
        }
    }
    if (!o->force) {
        rc = lease(run->r, CAPSTAN_KEY_REAPER_RUNNING, owner, (long)((timeout + 30) * 1000),
                   out->holder, sizeof(out->holder), err);
        if (rc <= 0) {
            out->busy = rc == 0;
            return rc;
        }
        *leased = 1;
    }
    return 1;
}

/* Where the previous run stopped: "score member", or nothing. */
static int load_cursor(run_t *run, char *err)
{
    redisReply *cur = capstan_redis_cmdf(run->r, "GET %s", CAPSTAN_KEY_REAPER_CURSOR);
    if (!cur)
        return capstan__reply_error(run->r, cur, "GET " CAPSTAN_KEY_REAPER_CURSOR, err);
    if (cur->type == REDIS_REPLY_STRING) {
        const char *sp = strchr(cur->str, ' ');
        if (sp && (size_t)(sp - cur->str) < sizeof(run->cscore)) {
            snprintf(run->cscore, sizeof(run->cscore), "%.*s", (int)(sp - cur->str), cur->str);
            snprintf(run->cmember, sizeof(run->cmember), "%s", sp + 1);
        }
    }
    freeReplyObject(cur);
    return 0;
}

/* Where the next run starts; failures only cost that run a repeat. */
static void save_cursor(run_t *run)
{
    if (run->out->wrapped) {
        redisReply *d = capstan_redis_cmdf(run->r, "DEL %s", CAPSTAN_KEY_REAPER_CURSOR);
        freeReplyObject(d);
    } else if (*run->cscore) {
        char val[1200];
        snprintf(val, sizeof(val), "%s %s", run->cscore, run->cmember);
        const char *set[] = { "SET", CAPSTAN_KEY_REAPER_CURSOR, val, "EX", CURSOR_TTL };
        redisReply *s = capstan_redis_cmd(run->r, 5, set, NULL);
        freeReplyObject(s);
    }
}

/* Whether c goes to reap.lua: 1 yes, 0 no, or an error. */
static int judge(run_t *run, const cand_t *c, char *err)
{
    if (c->foreign)
        return 0;
    if (c->njids == 0)
        return 1;
    /* Locked within the grace period, or an until_expired lock Redis will
     * expire: leave it. */
    if (strtod(c->score, NULL) > run->cutoff || (c->until_expired && c->pttl > 0))
        return 0;
    /* Are its holders anywhere? */
    if (!run->swept) {
        int rc = sweep_all(run->r, &run->sw, err);
        if (rc < 0)
            return rc;
        run->swept = rc == 0 ? 1 : -1;
    }
    if (run->swept < 0) {
        run->out->incomplete = 1;
        return 0;
    }
    for (size_t k = 0; k < c->njids; k++)
        if (jidset_has(&run->sw.live, c->jids[k], strlen(c->jids[k])))
            return 0;
    return 1;
}

/* Decides the n digests of a page in order, sending suspects to reap.lua
 * in batches, and moves the cursor past the last one decided. *stop: the
 * time or the count ran out within the page. */
static int reap_page(run_t *run, size_t n, int *stop, char *err)
{
    capstan_reap_result_t *out = run->out;
    size_t from = 0, pending = 0, last = n; /* last: index decided last */
    int rc = 0;
    memset(run->suspect, 0, PAGE * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        if (capstan__mono() > run->sw.deadline) {
            out->timed_out = *stop = 1;
            break;
        }
        out->examined++;
        last = i;
        if ((rc = judge(run, &run->cands[i], err)) < 0)
            return rc;
        run->suspect[i] = rc;
        pending += (size_t)rc;
        rc = 0;
        long room = run->count - out->removed;
        if (pending && ((long)pending >= room || pending >= BATCH)) {
            rc = flush(run->r, &run->sw, run->cands, run->suspect, from, i + 1, out, err);
            if (rc)
                return rc;
            from = i + 1;
            pending = 0;
            if (out->removed >= run->count) {
                *stop = 1;
                break;
            }
        }
    }
    /* Only what was decided: items up to and including `last`. */
    if (pending && (rc = flush(run->r, &run->sw, run->cands, run->suspect, from, last + 1, out,
                               err)))
        return rc;
    if (last < n) {
        snprintf(run->cscore, sizeof(run->cscore), "%s", run->cands[last].score);
        snprintf(run->cmember, sizeof(run->cmember), "%s", run->cands[last].digest);
    }
    return 0;
}

/* Walks uniquejobs:digests page by page from the cursor until the count,
 * the time or the index runs out. */
static int walk(run_t *run, char *err)
{
    capstan_reap_result_t *out = run->out;
    int stop = 0, rc = 0;
    run->cutoff = capstan__now() - run->grace;
    while (!stop && !rc && out->removed < run->count) {
        if (capstan__mono() > run->sw.deadline) {
            out->timed_out = 1;
            break;
        }
        size_t n = 0;
        rc = read_page(run->r, run->cscore, run->cmember, run->cands, &n, err);
        if (!rc && n == 0)
            out->wrapped = 1;
        if (rc || n == 0)
            break;
        rc = reap_page(run, n, &stop, err);
        for (size_t i = 0; i < n; i++)
            cand_clear(&run->cands[i]);
    }
    return rc;
}

int capstan__unique_reap(capstan_redis_t *r, const capstan_reap_opts_t *opts, capstan_reap_result_t *out,
                         char *err)
{
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    if (opts)
        o = *opts;
    memset(out, 0, sizeof(*out));
    double timeout = o.timeout > 0 ? o.timeout : 10;
    char owner[320];
    if (o.owner && *o.owner)
        snprintf(owner, sizeof(owner), "%s", o.owner);
    else
        default_owner(owner, sizeof(owner));
    run_t run = {
        .r = r,
        .out = out,
        .count = o.count > 0 ? o.count : 1000,
        .grace = o.grace >= 0 ? o.grace : timeout + 10,
        .sw = { .deadline = capstan__mono() + timeout },
        .cands = calloc(PAGE, sizeof(cand_t)),
        .suspect = calloc(PAGE, sizeof(int)),
    };

    int rc, leased = 0;
    if (!run.cands || !run.suspect)
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    else
        rc = take_leases(&run, &o, timeout, owner, &leased, err);
    if (rc > 0) {
        rc = load_cursor(&run, err);
        if (!rc)
            rc = walk(&run, err);
        if (!rc)
            save_cursor(&run);
    }

    if (run.cands)
        for (size_t i = 0; i < PAGE; i++)
            cand_clear(&run.cands[i]);
    free(run.cands);
    free(run.suspect);
    sweep_free(&run.sw);
    if (leased && capstan_redis_ok(r))
        unlease(r, CAPSTAN_KEY_REAPER_RUNNING, owner);
    return rc;
}
