/* Field edits on raw payload text (see payload.h). */
#include "support/payload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/time.h"
#include "capstan/error.h"

static const capstan_field_t *find_set(const char *s, const capstan_jmember_t *m,
                                       const capstan_field_t *set, size_t nset, size_t *idx)
{
    for (size_t i = 0; i < nset; i++) {
        size_t kl = strlen(set[i].key);
        if (kl == m->klen && memcmp(s + m->kstart, set[i].key, kl) == 0) {
            *idx = i;
            return &set[i];
        }
    }
    return NULL;
}

static int put_member(capstan_buf_t *b, int *first, const char *key, size_t klen,
                      const char *v, size_t vlen)
{
    int rc = 0;
    if (!*first)
        rc = capstan__buf_put(b, ",", 1);
    *first = 0;
    if (!rc) rc = capstan__buf_put(b, "\"", 1);
    if (!rc) rc = capstan__buf_put(b, key, klen);
    if (!rc) rc = capstan__buf_put(b, "\":", 2);
    if (!rc) rc = capstan__buf_put(b, v, vlen);
    return rc;
}

int capstan__payload_edit(const char *s, const capstan_jobject_t *obj,
                          const capstan_field_t *set, size_t nset,
                          char **out, size_t *outlen)
{
    capstan_buf_t b = {0};
    unsigned char *done = calloc(nset ? nset : 1, 1);
    int first = 1, rc = done ? capstan__buf_put(&b, "{", 1) : CAPSTAN_ENOMEM;
    for (size_t i = 0; i < obj->n && !rc; i++) {
        const capstan_jmember_t *m = &obj->m[i];
        size_t idx;
        const capstan_field_t *f = find_set(s, m, set, nset, &idx);
        if (!f) {
            rc = put_member(&b, &first, s + m->kstart, m->klen, s + m->vstart, m->vlen);
        } else if (!done[idx]) {
            done[idx] = 1;
            if (f->value)
                rc = put_member(&b, &first, f->key, strlen(f->key), f->value,
                                f->vlen ? f->vlen : strlen(f->value));
        }
    }
    for (size_t i = 0; i < nset && !rc; i++)
        if (!done[i] && set[i].value)
            rc = put_member(&b, &first, set[i].key, strlen(set[i].key), set[i].value,
                            set[i].vlen ? set[i].vlen : strlen(set[i].value));
    if (!rc)
        rc = capstan__buf_put(&b, "}", 1);
    free(done);
    if (rc) {
        capstan__buf_free(&b);
        return rc;
    }
    *out = capstan__buf_take(&b, outlen);
    return 0;
}

void capstan__ts_json(char *buf, double now, capstan_ts_format_t fmt)
{
    if (fmt == CAPSTAN_TS_MILLIS)
        snprintf(buf, 32, "%lld", (long long)(now * 1000.0));
    else
        snprintf(buf, 32, "%.6f", now);
}

capstan_ts_format_t capstan__ts_format_of(const char *s, const capstan_jobject_t *obj,
                                          capstan_ts_format_t fallback)
{
    /* created_at first: the client that made the job wrote it and nothing
     * rewrites it, so it names the Sidekiq line that pushed the job. */
    static const char *const keys[] = { "created_at", "enqueued_at", "failed_at", "retried_at" };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const capstan_jmember_t *m = capstan__jobject_get(obj, s, keys[i]);
        if (!m || !m->vlen || !(s[m->vstart] == '-' || (s[m->vstart] >= '0' && s[m->vstart] <= '9')))
            continue;
        const char *v = s + m->vstart;
        for (size_t k = 0; k < m->vlen; k++)
            if (v[k] == '.' || v[k] == 'e' || v[k] == 'E')
                return CAPSTAN_TS_FLOAT;
        return CAPSTAN_TS_MILLIS;
    }
    return fallback;
}

double capstan__ts_parse(const char *v, size_t len)
{
    char tmp[64];
    if (len == 0 || len >= sizeof(tmp))
        return 0;
    memcpy(tmp, v, len);
    tmp[len] = '\0';
    char *end;
    double d = strtod(tmp, &end);
    if (end == tmp || *end)
        return 0;
    if (strpbrk(tmp, ".eE"))
        return d;
    return d / 1000.0;
}

void capstan__new_jid(char out[25])
{
    capstan__random_hex(out, 12);
}
