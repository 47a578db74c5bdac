/* Middleware chains and the accessors a middleware uses on its invocation
 * (see include/capstan/middleware.h). */
#include "middleware/mw.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/payload.h"

typedef struct entry {
    char *name;
    capstan_mw_fn fn;
    void *udata;
} entry_t;

struct capstan_chain {
    entry_t *e;
    size_t n;
};

capstan_chain_t *capstan_chain_new(void)
{
    return calloc(1, sizeof(capstan_chain_t));
}

void capstan_chain_free(capstan_chain_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->e[i].name);
    free(c->e);
    free(c);
}

static long find(const capstan_chain_t *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].name, name))
            return (long)i;
    return -1;
}

static int insert_at(capstan_chain_t *c, size_t at, const char *name, capstan_mw_fn fn, void *udata)
{
    if (!name || !*name || !fn || find(c, name) >= 0)
        return CAPSTAN_EINVAL;
    entry_t *grown = realloc(c->e, (c->n + 1) * sizeof(*grown));
    if (!grown)
        return CAPSTAN_ENOMEM;
    c->e = grown;
    char *copy = strdup(name);
    if (!copy)
        return CAPSTAN_ENOMEM;
    memmove(&c->e[at + 1], &c->e[at], (c->n - at) * sizeof(*c->e));
    c->e[at] = (entry_t){ copy, fn, udata };
    c->n++;
    return 0;
}

int capstan_chain_add(capstan_chain_t *c, const char *name, capstan_mw_fn fn, void *udata)
{
    return c ? insert_at(c, c->n, name, fn, udata) : CAPSTAN_EINVAL;
}

int capstan_chain_insert_before(capstan_chain_t *c, const char *before, const char *name,
                                capstan_mw_fn fn, void *udata)
{
    if (!c)
        return CAPSTAN_EINVAL;
    long at = before ? find(c, before) : 0;
    if (at < 0)
        return CAPSTAN_ENOTFOUND;
    return insert_at(c, (size_t)at, name, fn, udata);
}

int capstan_chain_remove(capstan_chain_t *c, const char *name)
{
    long at = c && name ? find(c, name) : -1;
    if (at < 0)
        return CAPSTAN_ENOTFOUND;
    free(c->e[at].name);
    memmove(&c->e[at], &c->e[at + 1], (c->n - (size_t)at - 1) * sizeof(*c->e));
    c->n--;
    return 0;
}

capstan_chain_t *capstan__chain_copy(const capstan_chain_t *c, const void *from, void *to)
{
    capstan_chain_t *copy = capstan_chain_new();
    for (size_t i = 0; copy && c && i < c->n; i++)
        if (capstan_chain_add(copy, c->e[i].name, c->e[i].fn, c->e[i].udata == from ? to : c->e[i].udata)) {
            capstan_chain_free(copy);
            return NULL;
        }
    return copy;
}

size_t capstan_chain_len(const capstan_chain_t *c)
{
    return c ? c->n : 0;
}

const char *capstan_chain_name(const capstan_chain_t *c, size_t i)
{
    return c && i < c->n ? c->e[i].name : NULL;
}

int capstan__mw_run(const capstan_chain_t *c, capstan_mw_t *mw, capstan_mw_fn terminal, void *ud)
{
    mw->chain = c;
    mw->pos = 0;
    mw->terminal = terminal;
    mw->terminal_ud = ud;
    return capstan_mw_next(mw);
}

int capstan_mw_next(capstan_mw_t *mw)
{
    const capstan_chain_t *c = mw->chain;
    if (c && mw->pos < c->n) {
        const entry_t *e = &c->e[mw->pos++];
        return e->fn(mw, e->udata);
    }
    mw->pos++; /* a second call past the end runs nothing twice */
    if (mw->pos > (c ? c->n : 0) + 1)
        return 0;
    return mw->terminal ? mw->terminal(mw, mw->terminal_ud) : 0;
}

void capstan__mw_clear(capstan_mw_t *mw)
{
    free(mw->payload);
    capstan__jobject_free(&mw->obj);
    free(mw->deny);
    mw->payload = NULL;
    mw->deny = NULL;
}

capstan_job_t *capstan_mw_job(capstan_mw_t *mw) { return mw->server ? mw->job : NULL; }
const char *capstan_mw_class(const capstan_mw_t *mw) { return mw->cls; }
const char *capstan_mw_jid(const capstan_mw_t *mw) { return mw->jid; }
const char *capstan_mw_queue(const capstan_mw_t *mw) { return mw->queue; }
capstan_redis_t *capstan_mw_redis(capstan_mw_t *mw) { return mw->r; }
const capstan_config_t *capstan_mw_config(const capstan_mw_t *mw) { return mw->cfg; }
double capstan_mw_at(const capstan_mw_t *mw) { return mw->at; }
capstan_dispose_t capstan_mw_disposition(const capstan_mw_t *mw)
{
    return mw->out ? mw->out->disp : CAPSTAN_DISPOSE_DEFAULT;
}

void capstan_mw_set_at(capstan_mw_t *mw, double at)
{
    if (!mw->server)
        mw->at = at;
}

const char *capstan_mw_payload(const capstan_mw_t *mw, size_t *len)
{
    if (mw->server)
        return capstan_job_payload(mw->job, len);
    if (len)
        *len = mw->len;
    return mw->payload;
}

const char *capstan_mw_field_raw(const capstan_mw_t *mw, const char *key, size_t *len)
{
    if (mw->server)
        return capstan_job_field_raw(mw->job, key, len);
    const capstan_jmember_t *m = capstan__jobject_get(&mw->obj, mw->payload, key);
    if (!m)
        return NULL;
    if (len)
        *len = m->vlen;
    return mw->payload + m->vstart;
}

int capstan_mw_set_field(capstan_mw_t *mw, const char *key, const char *value)
{
    if (mw->server || !key || (value && capstan__json_validate(value, strlen(value), NULL)))
        return CAPSTAN_EINVAL;
    capstan_field_t f = { key, value, 0 };
    char *out = NULL;
    size_t outlen = 0;
    int rc = capstan__payload_edit(mw->payload, &mw->obj, &f, 1, &out, &outlen);
    if (rc)
        return rc;
    capstan_jobject_t obj = {0};
    if (capstan__json_scan_object(out, outlen, &obj, NULL)) {
        free(out);
        capstan__jobject_free(&obj);
        return CAPSTAN_ENOMEM;
    }
    free(mw->payload);
    capstan__jobject_free(&mw->obj);
    mw->payload = out;
    mw->len = outlen;
    mw->obj = obj;
    return 0;
}

int capstan_mw_dispose(capstan_mw_t *mw, capstan_dispose_t d, double score, const char *payload, size_t len)
{
    if (!mw->out || d < CAPSTAN_DISPOSE_DEFAULT || d > CAPSTAN_DISPOSE_REQUEUE)
        return CAPSTAN_EINVAL;
    char *copy = NULL;
    if (payload) {
        if (!(copy = malloc(len + 1)))
            return CAPSTAN_ENOMEM;
        memcpy(copy, payload, len);
        copy[len] = '\0';
    }
    capstan_outcome_t *o = mw->out;
    free(o->dpayload);
    o->dpayload = copy;
    o->dlen = payload ? len : 0;
    o->disp = d;
    o->score = score;
    return 0;
}

void capstan_mw_deny(capstan_mw_t *mw, const char *fmt, ...)
{
    char why[CAPSTAN_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    free(mw->deny);
    mw->deny = strdup(why); /* NULL when out of memory: the code says why */
}

void capstan__mw_waiting(void *ud)
{
    capstan_mw_t *mw = ud;
    if (mw->trip.prompt)
        mw->trip.prompt(mw->trip.ud, mw->r, 1);
}
