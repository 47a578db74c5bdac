/* The reaper's calls on the digest index (unique/reaper.c): a page of
 * uniquejobs:digests with each digest's holders, and reap.lua, which
 * removes the suspects whose holders are still nowhere, checking again
 * atomically what a job can move into behind the sweep's back. */
#include "unique/reap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "redis/keys.h"
#include "redis/reply.h"
#include "redis/scripts.h"

#define QUEUE_TAIL "100" /* jobs at the fetched end of a queue reap.lua reads */

void capstan__reap_cand_clear(capstan_reap_cand_t *c)
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

int capstan__reap_flush(capstan_redis_t *r, const capstan_reap_sweep_t *sw,
                        const capstan_reap_cand_t *cands, const int *suspect, size_t from, size_t to,
                        capstan_reap_result_t *out, char *err)
{
    batch_t b = {0};
    char counts[CAPSTAN_REAP_PAGE][24];
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
        const capstan_reap_cand_t *c = &cands[i];
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

int capstan__reap_read_page(capstan_redis_t *r, const char *cscore, const char *cmember,
                            capstan_reap_cand_t *cands, size_t *n, char *err)
{
    int rc = 0;
    redisReply *page = NULL;
    *n = 0;
    /* Members with the cursor's own score come in member order: skip those
     * up to the cursor, paging on when a whole page is such ties. */
    for (long offset = 0;; offset += CAPSTAN_REAP_PAGE) {
        char min[80], off[32], cnt[32];
        snprintf(min, sizeof(min), "%s", *cscore ? cscore : "-inf");
        snprintf(off, sizeof(off), "%ld", offset);
        snprintf(cnt, sizeof(cnt), "%d", CAPSTAN_REAP_PAGE);
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
            capstan_reap_cand_t *c = &cands[(*n)++];
            if (!(c->digest = strdup(m))) {
                rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
                goto out;
            }
            snprintf(c->score, sizeof(c->score), "%s", s);
        }
        if (*n || page->elements < 2 * CAPSTAN_REAP_PAGE)
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
        capstan_reap_cand_t *c = &cands[i];
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
