/* Orphan recovery: jobs left in the working lists of processes that died
 * go back to their queues; a job that keeps killing its workers goes to the
 * dead set (a poison pill). Each job moves in a script that first checks the
 * owner's liveness key, so a live process's list is never touched. */
#include "kiq/fetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/buf.h"
#include "../runtime/json.h"
#include "../runtime/payload.h"
#include "../runtime/timeutil.h"

#define BATCH 64          /* jobs per script call */
#define WORKING_PREFIX "uniquejobs:working:"

typedef struct moved {
    char *orig; size_t olen;   /* borrowed from the LRANGE reply */
    char *next; size_t nlen;   /* owned */
    char dest[512];
} moved_t;

/* Works out where one orphan goes and what it looks like there. */
static int plan_job(const char *raw, size_t len, int max_recoveries, kiq_ts_format_t ts,
                    double now, moved_t *m)
{
    kiq_jobject_t obj = {0};
    int rc = 0;
    if (kiq_json_scan_object(raw, len, &obj, NULL) != 0) {
        /* Not JSON: hand it back unchanged; the processor that fetches it
         * sends it to the dead set with the reason. */
        snprintf(m->dest, sizeof(m->dest), "queue:default");
        m->next = malloc(len ? len : 1);
        if (!m->next)
            return KIQ_ENOMEM;
        memcpy(m->next, raw, len);
        m->nlen = len;
        goto out;
    }
    const kiq_jmember_t *q = kiq_jobject_get(&obj, raw, "queue");
    char *qname = q ? kiq_json_string_dup(raw + q->vstart, q->vlen) : NULL;
    const kiq_jmember_t *rc_m = kiq_jobject_get(&obj, raw, "recovery_count");
    long count = 1;
    if (rc_m) {
        char tmp[32];
        size_t n = rc_m->vlen < sizeof(tmp) - 1 ? rc_m->vlen : sizeof(tmp) - 1;
        memcpy(tmp, raw + rc_m->vstart, n);
        tmp[n] = '\0';
        count = strtol(tmp, NULL, 10) + 1;
    }
    char cnt[32], when[32], msg[160];
    snprintf(cnt, sizeof(cnt), "%ld", count);
    if (count >= max_recoveries) {
        kiq_ts_json(when, now, ts);
        snprintf(msg, sizeof(msg),
                 "\"recovered from crashed processes %ld times; its worker died each time\"", count);
        kiq_field_t set[] = {
            { "recovery_count", cnt, 0 },
            { "error_class", "\"Kiq::PoisonPill\"", 0 },
            { "error_message", msg, 0 },
            { "failed_at", when, 0 },
        };
        rc = kiq_payload_edit(raw, &obj, set, 4, &m->next, &m->nlen);
        snprintf(m->dest, sizeof(m->dest), "dead");
    } else {
        kiq_field_t set[] = { { "recovery_count", cnt, 0 } };
        rc = kiq_payload_edit(raw, &obj, set, 1, &m->next, &m->nlen);
        snprintf(m->dest, sizeof(m->dest), "queue:%s", qname && *qname ? qname : "default");
    }
    free(qname);
out:
    kiq_jobject_free(&obj);
    return rc;
}

/* Runs the recover script over jobs[0..n). Returns 0, 1 when the owner
 * turned out alive, or KIQ_EREDIS. */
static int apply(kiq_redis_t *r, const char *wkey, const char *lkey, moved_t *jobs, size_t n,
                 double now, kiq_recovery_t *out)
{
    size_t argc = 3 + 4 * n;
    const char **argv = calloc(argc, sizeof(*argv));
    size_t *lens = calloc(argc, sizeof(*lens));
    char score[32];
    int rc = KIQ_ENOMEM;
    if (!argv || !lens)
        goto out;
    snprintf(score, sizeof(score), "%.6f", now);
    argv[0] = wkey; argv[1] = lkey; argv[2] = "dead";
    for (size_t i = 0; i < 3; i++)
        lens[i] = strlen(argv[i]);
    for (size_t i = 0; i < n; i++) {
        size_t k = 3 + 4 * i;
        argv[k] = jobs[i].orig;     lens[k] = jobs[i].olen;
        argv[k + 1] = jobs[i].next; lens[k + 1] = jobs[i].nlen;
        argv[k + 2] = jobs[i].dest; lens[k + 2] = strlen(jobs[i].dest);
        argv[k + 3] = score;        lens[k + 3] = strlen(score);
    }
    redisReply *rep = kiq_redis_script(r, KIQ_SCRIPT_RECOVER, 3, (int)argc, argv, lens);
    rc = KIQ_EREDIS;
    if (!rep)
        goto out;
    if (rep->type == REDIS_REPLY_INTEGER && rep->integer == -1) {
        rc = 1;
    } else if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2) {
        out->recovered += rep->element[0]->integer;
        out->killed += rep->element[1]->integer;
        rc = 0;
    }
    freeReplyObject(rep);
out:
    free(argv);
    free(lens);
    return rc;
}

int kiq_fetch_recover_one(kiq_redis_t *r, const char *identity, int max_recoveries,
                          kiq_ts_format_t ts, kiq_recovery_t *out, char *err)
{
    char wkey[512], lkey[512];
    kiq_fetch_working_key(identity, wkey, sizeof(wkey));
    kiq_fetch_liveness_key(identity, lkey, sizeof(lkey));
    redisReply *list = kiq_redis_cmdf(r, "LRANGE %s 0 -1", wkey);
    if (!list)
        return kiq_seterr(err, KIQ_EREDIS, "%s", kiq_redis_error(r));
    if (list->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(list);
        return kiq_seterr(err, KIQ_EREPLY, "LRANGE %s: unexpected reply", wkey);
    }
    double now = kiq_now();
    moved_t jobs[BATCH];
    int rc = 0;
    size_t total = list->elements, done = 0;
    /* Oldest first (the right end), so they return in the order taken. */
    while (done < total && rc == 0) {
        size_t n = 0;
        for (; n < BATCH && done + n < total; n++) {
            redisReply *e = list->element[total - 1 - (done + n)];
            memset(&jobs[n], 0, sizeof(jobs[n]));
            jobs[n].orig = e->str;
            jobs[n].olen = e->len;
            if ((rc = plan_job(e->str, e->len, max_recoveries, ts, now, &jobs[n]))) {
                n++;
                break;
            }
        }
        if (rc == 0)
            rc = apply(r, wkey, lkey, jobs, n, now, out);
        for (size_t i = 0; i < n; i++)
            free(jobs[i].next);
        done += n;
    }
    freeReplyObject(list);
    if (rc == 1)
        return 0; /* alive after all: leave it */
    if (rc)
        return kiq_seterr(err, rc, "recovering %s: %s", wkey, kiq_redis_error(r));
    if (total)
        out->lists++;
    return 0;
}

int kiq_fetch_recover(kiq_redis_t *r, const char *own_identity, int max_recoveries,
                      kiq_ts_format_t ts, kiq_recovery_t *out, char *err)
{
    memset(out, 0, sizeof(*out));
    char cursor[32] = "0";
    size_t plen = strlen(WORKING_PREFIX);
    int rc = 0;
    do {
        redisReply *rep = kiq_redis_cmdf(r, "SCAN %s MATCH %s* COUNT 200", cursor, WORKING_PREFIX);
        if (!rep)
            return kiq_seterr(err, KIQ_EREDIS, "%s", kiq_redis_error(r));
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
            freeReplyObject(rep);
            return kiq_seterr(err, KIQ_EREPLY, "SCAN: unexpected reply");
        }
        snprintf(cursor, sizeof(cursor), "%s", rep->element[0]->str);
        redisReply *keys = rep->element[1];
        for (size_t i = 0; i < keys->elements && rc == 0; i++) {
            const char *id = keys->element[i]->str + plen;
            if (own_identity && strcmp(id, own_identity) == 0)
                continue;
            char lkey[512];
            kiq_fetch_liveness_key(id, lkey, sizeof(lkey));
            redisReply *ex = kiq_redis_cmdf(r, "EXISTS %s", lkey);
            if (!ex) {
                rc = kiq_seterr(err, KIQ_EREDIS, "%s", kiq_redis_error(r));
                break;
            }
            int alive = ex->type == REDIS_REPLY_INTEGER && ex->integer == 1;
            freeReplyObject(ex);
            if (!alive)
                rc = kiq_fetch_recover_one(r, id, max_recoveries, ts, out, err);
        }
        freeReplyObject(rep);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    return rc;
}
