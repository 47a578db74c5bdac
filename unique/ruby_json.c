/* Ruby's JSON.generate, byte for byte, over JSON text already written by
 * someone else: sidekiq-unique-jobs v9 hashes what Ruby generates, so a
 * digest only matches when the args are written again the way Ruby would
 * (compact, its escapes, its Float#to_s), not as the client happened to
 * space them. The text is checked once (capstan__json_validate) and then
 * walked without building a tree, so integers of any size and the order of
 * object keys stay as they were. */
#include "unique/ruby_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/error.h"
#include "support/json.h"

/* A walk over already validated JSON text, writing into b. */
typedef struct rj {
    const char *s;
    size_t len, i;
    capstan_buf_t *b;
    int err;
} rj_t;

static void rj_ws(rj_t *p)
{
    while (p->i < p->len && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                             p->s[p->i] == '\r'))
        p->i++;
}

static void rj_put(rj_t *p, const char *s, size_t n)
{
    if (!p->err && capstan__buf_put(p->b, s, n))
        p->err = CAPSTAN_ENOMEM;
}

static unsigned rj_u4(const char *s)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++)
        v = v << 4 | (unsigned)capstan__hexval(s[k]);
    return v;
}

static void rj_utf8(rj_t *p, unsigned cp)
{
    char o[4];
    size_t n;
    if (cp < 0x80) { o[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    rj_put(p, o, n);
}

/* One decoded byte or code point, escaped as Ruby's generator does: only
 * '"', '\\' and control characters. */
static void rj_char(rj_t *p, unsigned cp)
{
    char e[8];
    switch (cp) {
    case '"': rj_put(p, "\\\"", 2); return;
    case '\\': rj_put(p, "\\\\", 2); return;
    case '\b': rj_put(p, "\\b", 2); return;
    case '\f': rj_put(p, "\\f", 2); return;
    case '\n': rj_put(p, "\\n", 2); return;
    case '\r': rj_put(p, "\\r", 2); return;
    case '\t': rj_put(p, "\\t", 2); return;
    }
    if (cp < 0x20) {
        snprintf(e, sizeof(e), "\\u%04x", cp);
        rj_put(p, e, 6);
        return;
    }
    rj_utf8(p, cp);
}

static void rj_string(rj_t *p)
{
    rj_put(p, "\"", 1);
    p->i++; /* opening quote */
    while (p->i < p->len && p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c != '\\') {
            if (c < 0x80)
                rj_char(p, c);
            else
                rj_put(p, p->s + p->i, 1); /* UTF-8 bytes pass through */
            p->i++;
            continue;
        }
        char x = p->s[p->i + 1];
        p->i += 2;
        switch (x) {
        case 'b': rj_char(p, '\b'); break;
        case 'f': rj_char(p, '\f'); break;
        case 'n': rj_char(p, '\n'); break;
        case 'r': rj_char(p, '\r'); break;
        case 't': rj_char(p, '\t'); break;
        case 'u': {
            unsigned cp = rj_u4(p->s + p->i);
            p->i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p->i + 6 <= p->len && p->s[p->i] == '\\' &&
                p->s[p->i + 1] == 'u') {
                unsigned lo = rj_u4(p->s + p->i + 2);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p->i += 6;
                }
            }
            rj_char(p, cp);
            break;
        }
        default: rj_char(p, (unsigned char)x); break; /* \" \\ \/ */
        }
    }
    p->i++; /* closing quote */
    rj_put(p, "\"", 1);
}

/* Ruby's Float#to_s: the shortest digits that read back as v, fixed
 * notation for decimal exponents in its range, else d.ddde+XX. */
static void rj_float(rj_t *p, double v)
{
    char tmp[40], digits[24], out[64];
    if (v == 0) {
        rj_put(p, signbit(v) ? "-0.0" : "0.0", signbit(v) ? 4 : 3);
        return;
    }
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    snprintf(tmp, sizeof(tmp), "%.*e", prec, v);
    const char *q = tmp;
    int neg = *q == '-';
    if (neg)
        q++;
    size_t nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int e10 = atoi(q + 1), decpt = e10 + 1;
    int n = 0;
    const char *sign = neg ? "-" : "";
    if (decpt > 0 && decpt < (int)nd) {
        n = snprintf(out, sizeof(out), "%s%.*s.%s", sign, decpt, digits, digits + decpt);
    } else if (decpt > 0 && decpt <= 15) {
        n = snprintf(out, sizeof(out), "%s%s", sign, digits);
        for (int z = (int)nd; z < decpt; z++)
            out[n++] = '0';
        n += snprintf(out + n, sizeof(out) - (size_t)n, ".0");
    } else if (decpt <= 0 && decpt > -4) {
        n = snprintf(out, sizeof(out), "%s0.", sign);
        for (int z = decpt; z < 0; z++)
            out[n++] = '0';
        n += snprintf(out + n, sizeof(out) - (size_t)n, "%s", digits);
    } else {
        n = snprintf(out, sizeof(out), "%s%c.%se%c%02d", sign, digits[0],
                     nd > 1 ? digits + 1 : "0", e10 < 0 ? '-' : '+', abs(e10));
    }
    rj_put(p, out, (size_t)n);
}

static void rj_number(rj_t *p)
{
    size_t st = p->i;
    int is_float = 0;
    while (p->i < p->len && strchr("+-0123456789.eE", p->s[p->i])) {
        if (strchr(".eE", p->s[p->i]))
            is_float = 1;
        p->i++;
    }
    if (is_float) {
        char tmp[512];
        size_t n = p->i - st < sizeof(tmp) - 1 ? p->i - st : sizeof(tmp) - 1;
        memcpy(tmp, p->s + st, n);
        tmp[n] = '\0';
        rj_float(p, strtod(tmp, NULL));
    } else if (p->i - st == 2 && p->s[st] == '-' && p->s[st + 1] == '0') {
        rj_put(p, "0", 1); /* Ruby reads -0 as the integer 0 */
    } else {
        rj_put(p, p->s + st, p->i - st);
    }
}

static void rj_value(rj_t *p, int depth)
{
    rj_ws(p);
    if (p->i >= p->len || depth > 512) {
        p->err = CAPSTAN_EPARSE;
        return;
    }
    char c = p->s[p->i];
    if (c == '"') {
        rj_string(p);
    } else if (c == '[' || c == '{') {
        char close = c == '[' ? ']' : '}';
        rj_put(p, &c, 1);
        p->i++;
        rj_ws(p);
        int first = 1;
        while (!p->err && p->i < p->len && p->s[p->i] != close) {
            if (!first)
                rj_put(p, ",", 1);
            first = 0;
            if (c == '{') {
                rj_ws(p);
                rj_string(p);
                rj_ws(p);
                p->i++; /* ':' */
                rj_put(p, ":", 1);
            }
            rj_value(p, depth + 1);
            rj_ws(p);
            if (p->i < p->len && p->s[p->i] == ',')
                p->i++;
            rj_ws(p);
        }
        p->i++;
        rj_put(p, &close, 1);
    } else if (c == 't') {
        rj_put(p, "true", 4); p->i += 4;
    } else if (c == 'f') {
        rj_put(p, "false", 5); p->i += 5;
    } else if (c == 'n') {
        rj_put(p, "null", 4); p->i += 4;
    } else {
        rj_number(p);
    }
}

char *capstan__ruby_json_dup(const char *in, size_t len, size_t *outlen)
{
    if (!in || capstan__json_validate(in, len, NULL))
        return NULL;
    capstan_buf_t b = {0};
    rj_t p = { .s = in, .len = len, .b = &b };
    rj_value(&p, 0);
    if (p.err || capstan__buf_put(&b, "", 0)) {
        capstan__buf_free(&b);
        return NULL;
    }
    if (!b.p && capstan__buf_puts(&b, ""))
        return NULL;
    return capstan__buf_take(&b, outlen);
}

char *capstan__ruby_json_pick(const char *args, size_t len, const int *idx, size_t nidx)
{
    if (!args || capstan__json_validate(args, len, NULL))
        return NULL;
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", args[i]))
        i++;
    if (i >= len || args[i] != '[')
        return NULL;
    if (!idx)
        return capstan__ruby_json_dup(args, len, NULL);
    /* Split the top-level elements, then keep the chosen ones in the
     * order the indexes give. */
    capstan_buf_t b = {0};
    rj_t p = { .s = args, .len = len, .i = i + 1, .b = &b };
    size_t cap = 16, n = 0;
    size_t *st = malloc(cap * sizeof(*st)), *en = malloc(cap * sizeof(*en));
    char *out = NULL;
    if (!st || !en)
        goto out;
    rj_ws(&p);
    while (p.i < len && args[p.i] != ']') {
        if (n == cap) {
            cap *= 2;
            size_t *a = realloc(st, cap * sizeof(*st));
            if (a) st = a;
            size_t *z = realloc(en, cap * sizeof(*en));
            if (z) en = z;
            if (!a || !z)
                goto out;
        }
        rj_ws(&p);
        st[n] = p.i;
        capstan_buf_t scratch = {0};
        p.b = &scratch;
        rj_value(&p, 0);
        capstan__buf_free(&scratch);
        en[n++] = p.i;
        rj_ws(&p);
        if (p.i < len && args[p.i] == ',')
            p.i++;
        rj_ws(&p);
    }
    p.b = &b;
    rj_put(&p, "[", 1);
    int first = 1;
    for (size_t k = 0; k < nidx; k++) {
        if (idx[k] < 0 || (size_t)idx[k] >= n)
            continue;
        if (!first)
            rj_put(&p, ",", 1);
        first = 0;
        rj_t q = { .s = args, .len = en[idx[k]], .i = st[idx[k]], .b = &b };
        rj_value(&q, 0);
        if (q.err)
            p.err = q.err;
    }
    rj_put(&p, "]", 1);
    if (!p.err)
        out = capstan__buf_take(&b, NULL);
out:
    capstan__buf_free(&b);
    free(st);
    free(en);
    return out;
}

int capstan__ruby_json_string(capstan_buf_t *b, const char *s)
{
    rj_t p = { .b = b };
    rj_put(&p, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x80)
            rj_char(&p, c);
        else
            rj_put(&p, s, 1);
    }
    rj_put(&p, "\"", 1);
    return p.err;
}
