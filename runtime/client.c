/* Pushing jobs: payloads built the way Ruby's Sidekiq::Client writes them
 * (retry, queue, options, args, class, jid, created_at, enqueued_at), so
 * every Sidekiq version reads them. */
#include "kiq/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "json.h"
#include "payload.h"
#include "timeutil.h"
#include "kiq/redis.h"

struct kiq_client {
    kiq_redis_t *r;
    char err[KIQ_ERRLEN];
};

kiq_push_opts_t kiq_push_opts_default(void)
{
    kiq_push_opts_t o = { .queue = NULL, .retry = KIQ_RETRY_UNSET, .at = 0,
                          .timestamps = KIQ_TS_FLOAT, .extra = NULL };
    return o;
}

kiq_client_t *kiq_client_new(const char *url, char *err)
{
    if (!url)
        url = getenv("REDIS_URL");
    if (!url || !*url)
        url = "redis://127.0.0.1:6379/0";
    kiq_client_t *c = calloc(1, sizeof(*c));
    if (!c) {
        kiq_seterr(err, KIQ_ENOMEM, "out of memory");
        return NULL;
    }
    c->r = kiq_redis_new(url, 10, err);
    if (!c->r) {
        free(c);
        return NULL;
    }
    if (kiq_redis_connect(c->r)) {
        kiq_seterr(err, KIQ_EREDIS, "%s", kiq_redis_error(c->r));
        kiq_client_free(c);
        return NULL;
    }
    return c;
}

void kiq_client_free(kiq_client_t *c)
{
    if (!c)
        return;
    kiq_redis_free(c->r);
    free(c);
}

const char *kiq_client_error(const kiq_client_t *c)
{
    return c->err;
}

/* Appends the payload of one job to b. */
static int build(kiq_client_t *c, kiq_buf_t *b, const char *cls, const char *args,
                 const kiq_push_opts_t *o, const char *queue, double now, char jid[25])
{
    kiq_jobject_t extra = {0};
    int rc = 0;
    if (!args)
        args = "[]";
    size_t alen = strlen(args);
    while (alen && (args[0] == ' ' || args[0] == '\n')) { args++; alen--; }
    if (alen == 0 || args[0] != '[' || kiq_json_validate(args, alen, c->err))
        return kiq_seterr(c->err, KIQ_EINVAL, "args must be a JSON array, got: %.60s", args);
    if (o->extra && kiq_json_scan_object(o->extra, strlen(o->extra), &extra, c->err))
        return kiq_seterr(c->err, KIQ_EINVAL, "extra fields must be a JSON object");
    char ts[32];
    kiq_ts_json(ts, now, o->timestamps);
    kiq_new_jid(jid);
    if (o->retry == KIQ_RETRY_UNSET || o->retry == KIQ_RETRY_DEFAULT)
        rc = kiq_buf_puts(b, "{\"retry\":true");
    else if (o->retry == KIQ_RETRY_NONE)
        rc = kiq_buf_puts(b, "{\"retry\":false");
    else
        rc = kiq_buf_printf(b, "{\"retry\":%d", o->retry);
    if (!rc) rc = kiq_buf_puts(b, ",\"queue\":");
    if (!rc) rc = kiq_json_quote(b, queue, strlen(queue));
    for (size_t i = 0; i < extra.n && !rc; i++) {
        const kiq_jmember_t *m = &extra.m[i];
        rc = kiq_buf_printf(b, ",\"%.*s\":%.*s", (int)m->klen, o->extra + m->kstart,
                            (int)m->vlen, o->extra + m->vstart);
    }
    if (!rc) rc = kiq_buf_puts(b, ",\"args\":");
    if (!rc) rc = kiq_buf_put(b, args, alen);
    if (!rc) rc = kiq_buf_puts(b, ",\"class\":");
    if (!rc) rc = kiq_json_quote(b, cls, strlen(cls));
    if (!rc) rc = kiq_buf_printf(b, ",\"jid\":\"%s\",\"created_at\":%s", jid, ts);
    if (!rc && !(o->at > now))
        rc = kiq_buf_printf(b, ",\"enqueued_at\":%s", ts);
    if (!rc) rc = kiq_buf_puts(b, "}");
    kiq_jobject_free(&extra);
    return rc;
}

int kiq_client_push_bulk(kiq_client_t *c, const char *cls, const char *const *args, size_t n,
                         const kiq_push_opts_t *opts, char (*jids)[25])
{
    kiq_push_opts_t o = opts ? *opts : kiq_push_opts_default();
    const char *queue = o.queue && *o.queue ? o.queue : "default";
    c->err[0] = '\0';
    if (!cls || !*cls)
        return kiq_seterr(c->err, KIQ_EINVAL, "a job class is required");
    if (n == 0)
        return 0;
    double now = kiq_now();
    if (o.at > 0 && o.at < 1e9)
        o.at += now; /* small values mean "seconds from now", as Sidekiq */
    int scheduled = o.at > now;
    kiq_buf_t *bufs = calloc(n, sizeof(*bufs));
    const char **argv = calloc(2 * n + 2, sizeof(*argv));
    size_t *lens = calloc(2 * n + 2, sizeof(*lens));
    char qkey[512], score[32];
    int rc = (bufs && argv && lens) ? 0 : kiq_seterr(c->err, KIQ_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        char jid[25];
        rc = build(c, &bufs[i], cls, args ? args[i] : NULL, &o, queue, now, jid);
        if (!rc && jids)
            memcpy(jids[i], jid, 25);
    }
    if (rc)
        goto out;
    snprintf(qkey, sizeof(qkey), "queue:%s", queue);
    snprintf(score, sizeof(score), "%.6f", o.at);
    size_t argc = 2;
    if (scheduled) {
        argv[0] = "ZADD";
        argv[1] = "schedule";
        for (size_t i = 0; i < n; i++) {
            argv[argc] = score; lens[argc++] = strlen(score);
            argv[argc] = bufs[i].p; lens[argc++] = bufs[i].len;
        }
    } else {
        argv[0] = "LPUSH";
        argv[1] = qkey;
        for (size_t i = 0; i < n; i++) {
            argv[argc] = bufs[i].p; lens[argc++] = bufs[i].len;
        }
    }
    lens[0] = strlen(argv[0]);
    lens[1] = strlen(argv[1]);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!kiq_redis_ok(c->r) && kiq_redis_connect(c->r)) {
            rc = kiq_seterr(c->err, KIQ_EREDIS, "%s", kiq_redis_error(c->r));
            continue;
        }
        const char *multi[] = { "MULTI" }, *exec[] = { "EXEC" };
        const char *sadd[] = { "SADD", "queues", queue };
        rc = kiq_redis_append(c->r, 1, multi, NULL);
        if (!rc && !scheduled) rc = kiq_redis_append(c->r, 3, sadd, NULL);
        if (!rc) rc = kiq_redis_append(c->r, (int)argc, argv, lens);
        if (!rc) rc = kiq_redis_append(c->r, 1, exec, NULL);
        int replies = scheduled ? 3 : 4;
        redisReply *last = NULL;
        for (int i = 0; i < replies && !rc; i++) {
            redisReply *rep = kiq_redis_get_reply(c->r);
            if (!rep)
                rc = KIQ_EREDIS;
            else if (i == replies - 1)
                last = rep;
            else
                freeReplyObject(rep);
        }
        if (!rc && (!last || last->type != REDIS_REPLY_ARRAY))
            rc = kiq_seterr(c->err, KIQ_EREPLY, "push failed: %s",
                            last && last->type == REDIS_REPLY_ERROR ? last->str : "transaction aborted");
        freeReplyObject(last);
        if (rc == KIQ_EREDIS)
            kiq_seterr(c->err, KIQ_EREDIS, "%s", kiq_redis_error(c->r));
        else
            break;
    }
out:
    for (size_t i = 0; bufs && i < n; i++)
        kiq_buf_free(&bufs[i]);
    free(bufs);
    free(argv);
    free(lens);
    return rc;
}

int kiq_client_push(kiq_client_t *c, const char *cls, const char *args,
                    const kiq_push_opts_t *opts, char jid[25])
{
    const char *one[] = { args };
    char jids[1][25];
    int rc = kiq_client_push_bulk(c, cls, one, 1, opts, jids);
    if (!rc && jid)
        memcpy(jid, jids[0], 25);
    return rc;
}
