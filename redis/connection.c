/* Redis connections: URL, connect with AUTH/SELECT, commands that mark the
 * connection broken on I/O errors, and EVALSHA with NOSCRIPT fallback. */
#include "kiq/redis.h"
#include "redis/scripts.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define MAX_ARGS 64

struct kiq_redis {
    kiq_redis_url_t url;
    char name[512];       /* URL with the password redacted */
    double timeout;
    redisContext *c;
    int broken;
    int pending;          /* appended commands whose replies are unread */
    int need_load;        /* a pipelined EVALSHA met NOSCRIPT */
    char errstr[KIQ_ERRLEN];
};

kiq_redis_t *kiq_redis_new(const char *url, double timeout, char *err)
{
    kiq_redis_t *r = calloc(1, sizeof(*r));
    if (!r) {
        kiq_seterr(err, KIQ_ENOMEM, "out of memory");
        return NULL;
    }
    if (kiq_redis_url_parse(url, &r->url, err)) {
        free(r);
        return NULL;
    }
    kiq_redis_url_redact(url, r->name, sizeof(r->name));
    r->timeout = timeout > 0 ? timeout : 10;
    r->broken = 1;
    return r;
}

void kiq_redis_free(kiq_redis_t *r)
{
    if (!r)
        return;
    redisFree(r->c);
    kiq_redis_url_clear(&r->url);
    free(r);
}

static struct timeval tv_of(double s)
{
    struct timeval tv = { .tv_sec = (time_t)s,
                          .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6) };
    return tv;
}

static int fail_io(kiq_redis_t *r, const char *what)
{
    r->broken = 1;
    r->pending = 0;
    snprintf(r->errstr, sizeof(r->errstr), "%s: %s (%s)", r->name, what,
             r->c && r->c->errstr[0] ? r->c->errstr : "connection lost");
    return KIQ_EREDIS;
}

static int load_scripts(kiq_redis_t *r)
{
    for (int i = 0; i < KIQ_SCRIPT_COUNT; i++) {
        redisReply *rep = redisCommand(r->c, "SCRIPT LOAD %s", kiq_script_text((kiq_script_t)i));
        if (!rep)
            return fail_io(r, "SCRIPT LOAD");
        int bad = rep->type == REDIS_REPLY_ERROR;
        if (bad)
            snprintf(r->errstr, sizeof(r->errstr), "%s: SCRIPT LOAD: %s", r->name, rep->str);
        else if (rep->type == REDIS_REPLY_STRING)
            kiq_script_learn_sha((kiq_script_t)i, rep->str, rep->len);
        freeReplyObject(rep);
        if (bad)
            return KIQ_EREPLY;
    }
    r->need_load = 0;
    return 0;
}

int kiq_redis_connect(kiq_redis_t *r)
{
    redisFree(r->c);
    r->c = NULL;
    r->pending = 0;
    r->broken = 1;
    struct timeval ctv = tv_of(r->timeout < 5 ? r->timeout : 5);
    if (r->url.path)
        r->c = redisConnectUnixWithTimeout(r->url.path, ctv);
    else
        r->c = redisConnectWithTimeout(r->url.host, r->url.port, ctv);
    if (!r->c) {
        snprintf(r->errstr, sizeof(r->errstr), "%s: cannot allocate a connection", r->name);
        return KIQ_EREDIS;
    }
    if (r->c->err)
        return fail_io(r, "connect");
    redisSetTimeout(r->c, tv_of(r->timeout));
    redisReply *rep = NULL;
    if (r->url.password) {
        if (r->url.user)
            rep = redisCommand(r->c, "AUTH %s %s", r->url.user, r->url.password);
        else
            rep = redisCommand(r->c, "AUTH %s", r->url.password);
        if (!rep)
            return fail_io(r, "AUTH");
        if (rep->type == REDIS_REPLY_ERROR) {
            snprintf(r->errstr, sizeof(r->errstr), "%s: AUTH refused: %s", r->name, rep->str);
            freeReplyObject(rep);
            return KIQ_EREDIS;
        }
        freeReplyObject(rep);
    }
    if (r->url.db) {
        rep = redisCommand(r->c, "SELECT %d", r->url.db);
        if (!rep)
            return fail_io(r, "SELECT");
        int bad = rep->type == REDIS_REPLY_ERROR;
        if (bad)
            snprintf(r->errstr, sizeof(r->errstr), "%s: SELECT %d: %s", r->name, r->url.db, rep->str);
        freeReplyObject(rep);
        if (bad)
            return KIQ_EREDIS;
    }
    int rc = load_scripts(r);
    if (rc)
        return rc == KIQ_EREPLY ? KIQ_EREDIS : rc;
    r->broken = 0;
    r->errstr[0] = '\0';
    return 0;
}

int kiq_redis_ok(const kiq_redis_t *r) { return r && r->c && !r->broken && !r->c->err; }
const char *kiq_redis_error(const kiq_redis_t *r) { return r->errstr; }
const char *kiq_redis_name(const kiq_redis_t *r) { return r->name; }
redisContext *kiq_redis_ctx(kiq_redis_t *r) { return r->broken ? NULL : r->c; }

static int ensure(kiq_redis_t *r)
{
    if (!r->broken && r->c && r->c->err)
        fail_io(r, "connection"); /* a handler's own command on kiq_job_redis() failed */
    if (r->broken || !r->c) {
        if (!r->errstr[0])
            snprintf(r->errstr, sizeof(r->errstr), "%s: not connected", r->name);
        return KIQ_EREDIS;
    }
    if (r->need_load && r->pending == 0)
        return load_scripts(r) ? KIQ_EREDIS : 0;
    return 0;
}

int kiq_redis_append(kiq_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    if (ensure(r))
        return KIQ_EREDIS;
    size_t l[MAX_ARGS];
    if (!lens) {
        if (argc > MAX_ARGS)
            return KIQ_EINVAL;
        for (int i = 0; i < argc; i++)
            l[i] = strlen(argv[i]);
        lens = l;
    }
    if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK)
        return fail_io(r, "append");
    r->pending++;
    return 0;
}

redisReply *kiq_redis_get_reply(kiq_redis_t *r)
{
    void *rep = NULL;
    if (r->broken || !r->c)
        return NULL;
    if (redisGetReply(r->c, &rep) != REDIS_OK || !rep) {
        fail_io(r, "read");
        return NULL;
    }
    if (r->pending > 0)
        r->pending--;
    redisReply *rr = rep;
    if (rr->type == REDIS_REPLY_ERROR && strncmp(rr->str, "NOSCRIPT", 8) == 0)
        r->need_load = 1;
    else if (rr->type == REDIS_REPLY_ERROR) /* so callers that only see a code can say why */
        snprintf(r->errstr, sizeof(r->errstr), "%s: %s", r->name, rr->str);
    return rr;
}

redisReply *kiq_redis_cmd(kiq_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    if (kiq_redis_append(r, argc, argv, lens))
        return NULL;
    return kiq_redis_get_reply(r);
}

redisReply *kiq_redis_cmdf(kiq_redis_t *r, const char *fmt, ...)
{
    if (ensure(r))
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(r->c, fmt, ap);
    va_end(ap);
    if (rc != REDIS_OK) {
        fail_io(r, "append");
        return NULL;
    }
    r->pending++;
    return kiq_redis_get_reply(r);
}

/* Appends EVALSHA sha nkeys args... (stack arrays for the usual short
 * calls, heap for long recovery batches). */
int kiq_redis_append_script(kiq_redis_t *r, kiq_script_t s, int nkeys, int argc,
                            const char **argv, const size_t *lens)
{
    const char *sav[MAX_ARGS + 3], **av = sav;
    size_t sal[MAX_ARGS + 3], *al = sal;
    char nk[16];
    if (argc < 0)
        return KIQ_EINVAL;
    if (argc > MAX_ARGS) {
        av = malloc((size_t)(argc + 3) * sizeof(*av));
        al = malloc((size_t)(argc + 3) * sizeof(*al));
    }
    int rc = av && al ? ensure(r) : KIQ_ENOMEM;
    /* ensure() has connected, and so loaded the scripts and learnt their
     * digests. */
    const char *sha = rc ? NULL : kiq_script_sha(s);
    if (!rc && !sha)
        rc = KIQ_EINVAL;
    if (!rc) {
        snprintf(nk, sizeof(nk), "%d", nkeys);
        av[0] = "EVALSHA";
        av[1] = sha;
        av[2] = nk;
        for (int i = 0; i < 3; i++)
            al[i] = strlen(av[i]);
        for (int i = 0; i < argc; i++) {
            av[3 + i] = argv[i];
            al[3 + i] = lens ? lens[i] : strlen(argv[i]);
        }
        if (redisAppendCommandArgv(r->c, argc + 3, av, al) == REDIS_OK)
            r->pending++;
        else
            rc = fail_io(r, "append");
    }
    if (av != sav)
        free(av);
    if (al != sal)
        free(al);
    return rc;
}

redisReply *kiq_redis_script(kiq_redis_t *r, kiq_script_t s, int nkeys, int argc,
                             const char **argv, const size_t *lens)
{
    redisReply *rep = NULL;
    /* A NOSCRIPT (SCRIPT FLUSH, or a Redis that restarted behind a proxy)
     * marks the scripts for reloading; the second try runs after the load. */
    for (int attempt = 0; attempt < 2; attempt++) {
        freeReplyObject(rep);
        rep = NULL;
        if (kiq_redis_append_script(r, s, nkeys, argc, argv, lens) == 0)
            rep = kiq_redis_get_reply(r);
        if (!rep || rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "NOSCRIPT", 8) != 0)
            break;
    }
    return rep;
}
