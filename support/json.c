/* Validating JSON scanner that records top-level member spans without
 * converting any value, so payloads keep every byte (see json.h). */
#include "support/json.h"

#include <stdint.h>
#include <stdio.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "capstan/error.h"

#define MAX_DEPTH 512

/* The scanner runs once over every payload fetched, so it walks the text
 * with a local pointer in one loop instead of a call per token; the grammar
 * and each error (its message and byte) are those of a plain recursive
 * descent. */
typedef struct scanner {
    const char *s, *end;
    char *err;
} scanner_t;

static int fail(const scanner_t *sc, const char *at, const char *what)
{
    return capstan_seterr(sc->err, CAPSTAN_EPARSE, "invalid JSON at byte %zu: %s",
                          (size_t)(at - sc->s), what);
}

static const char *skip_ws(const char *p, const char *end)
{
    /* Most bytes are above ' ': one test for them. */
    while (p < end && (unsigned char)*p <= ' ' && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

int capstan__hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* The bytes of w that end a run of plain string bytes (a quote, a backslash,
 * a control character), as high bits. Each test ("a byte is below n") can
 * also mark bytes above the first it finds, never one below it: the lowest
 * mark is exact. */
static uint64_t run_stops(uint64_t w)
{
    uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
    return (((q - ONES) & ~q) | ((b - ONES) & ~b) | ((w - ONES * 0x20) & ~w)) & HIGHS;
}

/* The first byte at or after p that is no plain string byte, or end. */
static const char *plain_run(const char *p, const char *end)
{
#if defined(__SSE2__)
    /* 16 bytes at a time: most keys and values of a payload end in the
     * first step. A byte is below 0x20 when the larger of it and 0x1f,
     * unsigned, is 0x1f. */
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1f);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl));
        unsigned m = (unsigned)_mm_movemask_epi8(hit);
        if (m)
            return p + __builtin_ctz(m);
        p += 16;
    }
#endif
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* 8 bytes at a time: the lowest mark is the first byte in memory. */
    while (end - p >= 8) {
        uint64_t w, stops;
        memcpy(&w, p, 8);
        if ((stops = run_stops(w)) != 0)
            return p + __builtin_ctzll(stops) / 8;
        p += 8;
    }
#endif
    while (p < end && (unsigned char)*p >= 0x20 && *p != '"' && *p != '\\')
        p++;
    return p;
}

/* The string whose opening quote is at *pp; *pp then is past its closing
 * quote. Inlined in both its places (a key, a value): a payload is mostly
 * short strings, and the call cost as much as their bytes. */
static inline __attribute__((always_inline)) int scan_string(const scanner_t *sc, const char **pp)
{
    const char *p = *pp + 1, *end = sc->end;
    for (;;) {
        p = plain_run(p, end);
        if (p >= end)
            break;
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            *pp = p + 1;
            return 0;
        }
        if (c < 0x20)
            return fail(sc, p, "control character in string");
        if (c == '\\') {
            if (++p >= end)
                break;
            char e = *p;
            if (e == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (end - p <= i || capstan__hexval(p[i]) < 0)
                        return fail(sc, p, "bad \\u escape");
                p += 4;
            } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                return fail(sc, p, "bad escape");
            }
        }
        p++;
    }
    return fail(sc, end, "unterminated string");
}

static const char *skip_digits(const char *p, const char *end)
{
    while (p < end && (unsigned char)(*p - '0') < 10)
        p++;
    return p;
}

/* The number at *pp (a '-' or a digit). */
static int scan_number(const scanner_t *sc, const char **pp)
{
    const char *p = *pp, *end = sc->end, *d;
    if (*p == '-')
        p++;
    if (p < end && *p == '0')
        p++;
    else if ((d = skip_digits(p, end)) == p)
        return fail(sc, p, "digit expected");
    else
        p = d;
    if (p < end && *p == '.') {
        p++;
        if ((d = skip_digits(p, end)) == p)
            return fail(sc, p, "digit expected");
        p = d;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if ((d = skip_digits(p, end)) == p)
            return fail(sc, p, "digit expected");
        p = d;
    }
    *pp = p;
    return 0;
}

static int scan_literal(const scanner_t *sc, const char **pp, const char *lit, size_t n)
{
    if ((size_t)(sc->end - *pp) < n || memcmp(*pp, lit, n) != 0)
        return fail(sc, *pp, "unexpected token");
    *pp += n;
    return 0;
}

static int add_member(capstan_jobject_t *obj, const char *s, capstan_jmember_t m)
{
    if (obj->n == obj->cap) {
        size_t cap = obj->cap ? obj->cap * 2 : 16;
        capstan_jmember_t *p = realloc(obj->lent ? NULL : obj->m, cap * sizeof(*p));
        if (!p)
            return CAPSTAN_ENOMEM;
        if (obj->lent)
            memcpy(p, obj->m, obj->n * sizeof(*p));
        obj->m = p;
        obj->cap = cap;
        obj->lent = 0;
    }
    obj->m[obj->n++] = m;
    obj->keys |= capstan__jkey_bit(s + m.kstart, m.klen);
    return 0;
}

/* One JSON value (with top: an object, whose members go to top) filling
 * s[0..len) but for whitespace. */
static int scan_whole(const char *s, size_t len, capstan_jobject_t *top, char *err)
{
    const scanner_t sc = { .s = s, .end = s + len, .err = err };
    const char *p = skip_ws(s, sc.end), *end = sc.end;
    /* The containers around the value at p, outermost first: '{' or '['. */
    char open[MAX_DEPTH + 1];
    size_t depth = 0;
    capstan_jmember_t m = { 0 }; /* the top object's member being read */
    if (top && (p >= end || *p != '{'))
        return fail(&sc, p, "a JSON object is expected");

value: /* p is at a value (whitespace skipped) */
    if (depth > MAX_DEPTH)
        return fail(&sc, p, "nested too deeply");
    if (p >= end)
        return fail(&sc, p, "value expected");
    switch (*p) {
    case '{':
        open[depth++] = '{';
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}') {
            p++;
            depth--;
            goto value_done;
        }
        goto key;
    case '[':
        open[depth++] = '[';
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']') {
            p++;
            depth--;
            goto value_done;
        }
        goto value;
    case '"':
        if (scan_string(&sc, &p))
            return CAPSTAN_EPARSE;
        goto value_done;
    case 't':
        if (scan_literal(&sc, &p, "true", 4))
            return CAPSTAN_EPARSE;
        goto value_done;
    case 'f':
        if (scan_literal(&sc, &p, "false", 5))
            return CAPSTAN_EPARSE;
        goto value_done;
    case 'n':
        if (scan_literal(&sc, &p, "null", 4))
            return CAPSTAN_EPARSE;
        goto value_done;
    default:
        if (*p != '-' && (*p < '0' || *p > '9'))
            return fail(&sc, p, "value expected");
        if (scan_number(&sc, &p))
            return CAPSTAN_EPARSE;
        goto value_done;
    }

value_done: /* a value ends at p, inside depth containers */
    if (depth == 0) {
        p = skip_ws(p, end);
        if (p != end)
            return fail(&sc, p, "trailing bytes after the value");
        return 0;
    }
    if (depth == 1 && top) {
        m.vlen = (size_t)(p - s) - m.vstart;
        if (add_member(top, s, m))
            return CAPSTAN_ENOMEM;
    }
    p = skip_ws(p, end);
    if (open[depth - 1] == '{') {
        if (p >= end)
            return fail(&sc, p, "unterminated object");
        if (*p == '}') {
            p++;
            depth--;
            goto value_done;
        }
        if (*p != ',')
            return fail(&sc, p, "',' or '}' expected");
        p = skip_ws(p + 1, end);
        goto key;
    }
    if (p >= end)
        return fail(&sc, p, "unterminated array");
    if (*p == ']') {
        p++;
        depth--;
        goto value_done;
    }
    if (*p != ',')
        return fail(&sc, p, "',' or ']' expected");
    p = skip_ws(p + 1, end);
    goto value;

key: /* p is at a member's key, inside an object (whitespace skipped) */
    if (p >= end || *p != '"')
        return fail(&sc, p, "object key expected");
    const char *k = p; /* the key's quotes: k and kend - 1 */
    if (scan_string(&sc, &p))
        return CAPSTAN_EPARSE;
    const char *kend = p;
    p = skip_ws(p, end);
    if (p >= end || *p != ':')
        return fail(&sc, p, "':' expected");
    p = skip_ws(p + 1, end);
    if (depth == 1)
        m = (capstan_jmember_t){ .kstart = (size_t)(k - s) + 1, .klen = (size_t)(kend - k) - 2,
                                 .vstart = (size_t)(p - s) };
    goto value;
}

int capstan__json_validate(const char *s, size_t len, char *err)
{
    return scan_whole(s, len, NULL, err);
}

int capstan__json_scan_object(const char *s, size_t len, capstan_jobject_t *obj, char *err)
{
    obj->n = 0;
    obj->keys = 0;
    return scan_whole(s, len, obj, err);
}

void capstan__jobject_free(capstan_jobject_t *obj)
{
    if (!obj)
        return;
    if (!obj->lent)
        free(obj->m);
    obj->m = NULL;
    obj->n = obj->cap = 0;
    obj->keys = 0;
    obj->lent = 0;
}

const capstan_jmember_t *capstan__jobject_getn(const capstan_jobject_t *obj, const char *s,
                                               const char *key, size_t klen)
{
    if (!(obj->keys & capstan__jkey_bit(key, klen)))
        return NULL;
    /* The first byte before the call: a payload's keys of one length
     * (class, queue, retry) differ there, and this runs a dozen times a job. */
    for (size_t i = obj->n; i-- > 0;) {
        const capstan_jmember_t *m = &obj->m[i];
        if (m->klen == klen && (!klen || s[m->kstart] == key[0]) && memcmp(s + m->kstart, key, klen) == 0)
            return m;
    }
    return NULL;
}

static void put_utf8(char **o, uint32_t cp)
{
    unsigned char *p = (unsigned char *)*o;
    if (cp < 0x80) {
        *p++ = (unsigned char)cp;
    } else if (cp < 0x800) {
        *p++ = (unsigned char)(0xC0 | (cp >> 6));
        *p++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *p++ = (unsigned char)(0xE0 | (cp >> 12));
        *p++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *p++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        *p++ = (unsigned char)(0xF0 | (cp >> 18));
        *p++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        *p++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *p++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    *o = (char *)p;
}

static uint32_t hex4(const char *p)
{
    return (uint32_t)(capstan__hexval(p[0]) << 12 | capstan__hexval(p[1]) << 8 |
                      capstan__hexval(p[2]) << 4 | capstan__hexval(p[3]));
}

size_t capstan__json_string_decode(const char *v, size_t len, char *out)
{
    if (len < 2 || v[0] != '"' || v[len - 1] != '"')
        return (size_t)-1;
    char *o = out; /* decoding never grows the text */
    /* Up to the first escape (usually the whole string) in one copy. */
    const char *bs = memchr(v + 1, '\\', len - 2);
    size_t plain = bs ? (size_t)(bs - (v + 1)) : len - 2;
    memcpy(o, v + 1, plain);
    o += plain;
    for (size_t i = 1 + plain; i < len - 1; i++) {
        if (v[i] != '\\') {
            *o++ = v[i];
            continue;
        }
        char e = v[++i];
        switch (e) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            uint32_t cp = hex4(v + i + 1);
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 < len && v[i + 1] == '\\' && v[i + 2] == 'u') {
                uint32_t lo = hex4(v + i + 3);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000)
                cp = 0xFFFD;
            put_utf8(&o, cp);
            break;
        }
        default: *o++ = e; break;
        }
    }
    *o = '\0';
    return (size_t)(o - out);
}

char *capstan__json_string_dup(const char *v, size_t len)
{
    char *out = len >= 2 ? malloc(len) : NULL;
    if (out && capstan__json_string_decode(v, len, out) == (size_t)-1) {
        free(out);
        out = NULL;
    }
    return out;
}

size_t capstan__utf8_seq(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] < 0x80) return 1;
    size_t need;
    uint32_t cp;
    if ((s[0] & 0xE0) == 0xC0) { need = 2; cp = s[0] & 0x1F; }
    else if ((s[0] & 0xF0) == 0xE0) { need = 3; cp = s[0] & 0x0F; }
    else if ((s[0] & 0xF8) == 0xF0) { need = 4; cp = s[0] & 0x07; }
    else return 0;
    if (n < need) return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((need == 2 && cp < 0x80) || (need == 3 && cp < 0x800) || (need == 4 && cp < 0x10000)
        || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
        return 0;
    return need;
}

int capstan__utf8_valid(const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        size_t k = capstan__utf8_seq(s + i, len - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

int capstan__json_quote(capstan_buf_t *b, const char *s, size_t len)
{
    int rc = capstan__buf_put(b, "\"", 1);
    size_t run = 0; /* start of the pending run of bytes copied verbatim */
    for (size_t i = 0; i < len && !rc;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = capstan__utf8_seq(s + i, len - i);
        const char *rep = NULL;
        char tmp[8];
        if (k == 0) rep = "\xEF\xBF\xBD";
        else if (c == '"') rep = "\\\"";
        else if (c == '\\') rep = "\\\\";
        else if (c == '\n') rep = "\\n";
        else if (c == '\r') rep = "\\r";
        else if (c == '\t') rep = "\\t";
        else if (c < 0x20) { snprintf(tmp, sizeof(tmp), "\\u%04x", c); rep = tmp; }
        if (rep) {
            rc = capstan__buf_put(b, s + run, i - run);
            if (!rc)
                 rc = capstan__buf_puts(b, rep);
            i += k ? k : 1;
            run = i;
        } else {
            i += k;
        }
    }
    if (!rc)
        rc = capstan__buf_put(b, s + run, len - run);
    if (!rc)
        rc = capstan__buf_put(b, "\"", 1);
    return rc;
}
