/* Middleware chains and the accessors a middleware uses on its invocation
 * (see include/kiq/middleware.h). */
#include "middleware/mw.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/payload.h"

typedef struct entry {
    char *name;
    kiq_mw_fn fn;
    void *udata;
} entry_t;

struct kiq_chain {
    entry_t *e;
    size_t n;
};

kiq_chain_t *kiq_chain_new(void)
{
    return calloc(1, sizeof(kiq_chain_t));
}

void kiq_chain_free(kiq_chain_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->e[i].name);
    free(c->e);
    free(c);
}

static long find(const kiq_chain_t *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].name, name))
            return (long)i;
    return -1;
}

static int insert_at(kiq_chain_t *c, size_t at, const char *name, kiq_mw_fn fn, void *udata)
{
    if (!name || !*name || !fn || find(c, name) >= 0)
        return KIQ_EINVAL;
    entry_t *grown = realloc(c->e, (c->n + 1) * sizeof(*grown));
    if (!grown)
        return KIQ_ENOMEM;
    c->e = grown;
    char *copy = strdup(name);
    if (!copy)
        return KIQ_ENOMEM;
    memmove(&c->e[at + 1], &c->e[at], (c->n - at) * sizeof(*c->e));
    c->e[at] = (entry_t){ copy, fn, udata };
    c->n++;
    return 0;
}

int kiq_chain_add(kiq_chain_t *c, const char *name, kiq_mw_fn fn, void *udata)
{
    return c ? insert_at(c, c->n, name, fn, udata) : KIQ_EINVAL;
}

int kiq_chain_insert_before(kiq_chain_t *c, const char *before, const char *name,
                            kiq_mw_fn fn, void *udata)
{
    if (!c)
        return KIQ_EINVAL;
    long at = before ? find(c, before) : 0;
    if (at < 0)
        return KIQ_ENOTFOUND;
    return insert_at(c, (size_t)at, name, fn, udata);
}

int kiq_chain_remove(kiq_chain_t *c, const char *name)
{
    long at = c && name ? find(c, name) : -1;
    if (at < 0)
        return KIQ_ENOTFOUND;
    free(c->e[at].name);
    memmove(&c->e[at], &c->e[at + 1], (c->n - (size_t)at - 1) * sizeof(*c->e));
    c->n--;
    return 0;
}

size_t kiq_chain_len(const kiq_chain_t *c)
{
    return c ? c->n : 0;
}

const char *kiq_chain_name(const kiq_chain_t *c, size_t i)
{
    return c && i < c->n ? c->e[i].name : NULL;
}

int kiq__mw_run(const kiq_chain_t *c, kiq_mw_t *mw, kiq_mw_fn terminal, void *ud)
{
    mw->chain = c;
    mw->pos = 0;
    mw->terminal = terminal;
    mw->terminal_ud = ud;
    return kiq_mw_next(mw);
}

int kiq_mw_next(kiq_mw_t *mw)
{
    const kiq_chain_t *c = mw->chain;
    if (c && mw->pos < c->n) {
        const entry_t *e = &c->e[mw->pos++];
        return e->fn(mw, e->udata);
    }
    mw->pos++; /* a second call past the end runs nothing twice */
    if (mw->pos > (c ? c->n : 0) + 1)
        return 0;
    return mw->terminal ? mw->terminal(mw, mw->terminal_ud) : 0;
}

void kiq__mw_clear(kiq_mw_t *mw)
{
    free(mw->payload);
    kiq__jobject_free(&mw->obj);
    free(mw->dpayload);
    free(mw->deny);
    mw->payload = mw->dpayload = NULL;
    mw->deny = NULL;
}

int kiq_mw_is_server(const kiq_mw_t *mw) { return mw->server; }
kiq_job_t *kiq_mw_job(kiq_mw_t *mw) { return mw->server ? mw->job : NULL; }
const char *kiq_mw_class(const kiq_mw_t *mw) { return mw->cls; }
const char *kiq_mw_jid(const kiq_mw_t *mw) { return mw->jid; }
const char *kiq_mw_queue(const kiq_mw_t *mw) { return mw->queue; }
kiq_redis_t *kiq_mw_redis(kiq_mw_t *mw) { return mw->r; }
const kiq_config_t *kiq_mw_config(const kiq_mw_t *mw) { return mw->cfg; }
double kiq_mw_at(const kiq_mw_t *mw) { return mw->at; }
kiq_dispose_t kiq_mw_disposition(const kiq_mw_t *mw) { return mw->disp; }

void kiq_mw_set_at(kiq_mw_t *mw, double at)
{
    if (!mw->server)
        mw->at = at;
}

const char *kiq_mw_payload(const kiq_mw_t *mw, size_t *len)
{
    if (mw->server)
        return kiq_job_payload(mw->job, len);
    if (len)
        *len = mw->len;
    return mw->payload;
}

const char *kiq_mw_field_raw(const kiq_mw_t *mw, const char *key, size_t *len)
{
    if (mw->server)
        return kiq_job_field_raw(mw->job, key, len);
    const kiq_jmember_t *m = kiq__jobject_get(&mw->obj, mw->payload, key);
    if (!m)
        return NULL;
    if (len)
        *len = m->vlen;
    return mw->payload + m->vstart;
}

int kiq_mw_set_field(kiq_mw_t *mw, const char *key, const char *value)
{
    if (mw->server || !key || (value && kiq__json_validate(value, strlen(value), NULL)))
        return KIQ_EINVAL;
    kiq_field_t f = { key, value, 0 };
    char *out = NULL;
    size_t outlen = 0;
    int rc = kiq__payload_edit(mw->payload, &mw->obj, &f, 1, &out, &outlen);
    if (rc)
        return rc;
    kiq_jobject_t obj = {0};
    if (kiq__json_scan_object(out, outlen, &obj, NULL)) {
        free(out);
        kiq__jobject_free(&obj);
        return KIQ_ENOMEM;
    }
    free(mw->payload);
    kiq__jobject_free(&mw->obj);
    mw->payload = out;
    mw->len = outlen;
    mw->obj = obj;
    return 0;
}

int kiq_mw_dispose(kiq_mw_t *mw, kiq_dispose_t d, double score, const char *payload, size_t len)
{
    if (!mw->server || d < KIQ_DISPOSE_DEFAULT || d > KIQ_DISPOSE_KEEP)
        return KIQ_EINVAL;
    char *copy = NULL;
    if (payload) {
        if (!(copy = malloc(len + 1)))
            return KIQ_ENOMEM;
        memcpy(copy, payload, len);
        copy[len] = '\0';
    }
    free(mw->dpayload);
    mw->dpayload = copy;
    mw->dlen = payload ? len : 0;
    mw->disp = d;
    mw->score = score;
    return 0;
}

void kiq_mw_deny(kiq_mw_t *mw, const char *fmt, ...)
{
    char why[KIQ_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    free(mw->deny);
    mw->deny = strdup(why); /* NULL when out of memory: the code says why */
}

const char *kiq__mw_release_key(const kiq_mw_t *mw, kiq_dispose_t d)
{
    if (!mw->release_key[0])
        return NULL;
    if (mw->release_runtime)
        return mw->release_key;
    if ((d == KIQ_DISPOSE_DONE || d == KIQ_DISPOSE_DEFAULT) && mw->release_on_done)
        return mw->release_key;
    if ((d == KIQ_DISPOSE_DEAD || d == KIQ_DISPOSE_DROP) && mw->release_on_death)
        return mw->release_key;
    return NULL;
}
