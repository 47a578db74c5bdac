/* Validating JSON scanner that records top-level member spans without
 * converting any value, so payloads keep every byte (see json.h). */
#include "support/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "capstan/error.h"

#define MAX_DEPTH 512

typedef struct scanner {
    const char *s;
    size_t len, pos;
    char *err;
} scanner_t;

static int fail(scanner_t *sc, const char *what)
{
    return capstan_seterr(sc->err, CAPSTAN_EPARSE, "invalid JSON at byte %zu: %s",
                          sc->pos, what);
}

static void skip_ws(scanner_t *sc)
{
    while (sc->pos < sc->len) {
        char c = sc->s[sc->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        sc->pos++;
    }
}

int capstan__hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int scan_string(scanner_t *sc)
{
    sc->pos++; /* opening quote */
    while (sc->pos < sc->len) {
        /* Most bytes are plain: skipped in a tight loop of locals. */
        const unsigned char *s = (const unsigned char *)sc->s;
        size_t pos = sc->pos, len = sc->len;
        while (pos < len && s[pos] > '"' && s[pos] != '\\')
            pos++;
        sc->pos = pos;
        if (pos >= len)
            break;
        unsigned char c = s[pos];
        if (c == '"') {
            sc->pos++;
            return 0;
        }
        if (c < 0x20)
            return fail(sc, "control character in string");
        if (c == '\\') {
            if (++sc->pos >= sc->len)
                break;
            char e = sc->s[sc->pos];
            if (e == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (sc->pos + i >= sc->len || capstan__hexval(sc->s[sc->pos + i]) < 0)
                        return fail(sc, "bad \\u escape");
                sc->pos += 4;
            } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                return fail(sc, "bad escape");
            }
        }
        sc->pos++;
    }
    return fail(sc, "unterminated string");
}

static int scan_digits(scanner_t *sc)
{
    size_t start = sc->pos;
    while (sc->pos < sc->len && sc->s[sc->pos] >= '0' && sc->s[sc->pos] <= '9')
        sc->pos++;
    return sc->pos > start ? 0 : fail(sc, "digit expected");
}

static int scan_number(scanner_t *sc)
{
    if (sc->s[sc->pos] == '-')
        sc->pos++;
    if (sc->pos < sc->len && sc->s[sc->pos] == '0')
        sc->pos++;
    else if (scan_digits(sc))
        return CAPSTAN_EPARSE;
    if (sc->pos < sc->len && sc->s[sc->pos] == '.') {
        sc->pos++;
        if (scan_digits(sc))
            return CAPSTAN_EPARSE;
    }
    if (sc->pos < sc->len && (sc->s[sc->pos] == 'e' || sc->s[sc->pos] == 'E')) {
        sc->pos++;
        if (sc->pos < sc->len && (sc->s[sc->pos] == '+' || sc->s[sc->pos] == '-'))
            sc->pos++;
        if (scan_digits(sc))
            return CAPSTAN_EPARSE;
    }
    return 0;
}

static int scan_literal(scanner_t *sc, const char *lit)
{
    size_t n = strlen(lit);
    if (sc->len - sc->pos < n || memcmp(sc->s + sc->pos, lit, n) != 0)
        return fail(sc, "unexpected token");
    sc->pos += n;
    return 0;
}

static int scan_value(scanner_t *sc, int depth, capstan_jobject_t *top);

static int add_member(capstan_jobject_t *obj, capstan_jmember_t m)
{
    if (obj->n == obj->cap) {
        size_t cap = obj->cap ? obj->cap * 2 : 16;
        capstan_jmember_t *p = realloc(obj->m, cap * sizeof(*p));
        if (!p)
            return CAPSTAN_ENOMEM;
        obj->m = p;
        obj->cap = cap;
    }
    obj->m[obj->n++] = m;
    return 0;
}

static int scan_object(scanner_t *sc, int depth, capstan_jobject_t *top)
{
    sc->pos++; /* { */
    skip_ws(sc);
    if (sc->pos < sc->len && sc->s[sc->pos] == '}') {
        sc->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(sc);
        if (sc->pos >= sc->len || sc->s[sc->pos] != '"')
            return fail(sc, "object key expected");
        capstan_jmember_t m = { .kstart = sc->pos + 1 };
        if (scan_string(sc))
            return CAPSTAN_EPARSE;
        m.klen = sc->pos - 1 - m.kstart;
        skip_ws(sc);
        if (sc->pos >= sc->len || sc->s[sc->pos] != ':')
            return fail(sc, "':' expected");
        sc->pos++;
        skip_ws(sc);
        m.vstart = sc->pos;
        int rc = scan_value(sc, depth + 1, NULL);
        if (rc)
            return rc;
        m.vlen = sc->pos - m.vstart;
        if (top && add_member(top, m))
            return CAPSTAN_ENOMEM;
        skip_ws(sc);
        if (sc->pos >= sc->len)
            return fail(sc, "unterminated object");
        if (sc->s[sc->pos] == '}') {
            sc->pos++;
            return 0;
        }
        if (sc->s[sc->pos] != ',')
            return fail(sc, "',' or '}' expected");
        sc->pos++;
    }
}

static int scan_array(scanner_t *sc, int depth)
{
    sc->pos++; /* [ */
    skip_ws(sc);
    if (sc->pos < sc->len && sc->s[sc->pos] == ']') {
        sc->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(sc);
        int rc = scan_value(sc, depth + 1, NULL);
        if (rc)
            return rc;
        skip_ws(sc);
        if (sc->pos >= sc->len)
            return fail(sc, "unterminated array");
        if (sc->s[sc->pos] == ']') {
            sc->pos++;
            return 0;
        }
        if (sc->s[sc->pos] != ',')
            return fail(sc, "',' or ']' expected");
        sc->pos++;
    }
}

static int scan_value(scanner_t *sc, int depth, capstan_jobject_t *top)
{
    if (depth > MAX_DEPTH)
        return fail(sc, "nested too deeply");
    if (sc->pos >= sc->len)
        return fail(sc, "value expected");
    switch (sc->s[sc->pos]) {
    case '{': return scan_object(sc, depth, top);
    case '[': return scan_array(sc, depth);
    case '"': return scan_string(sc);
    case 't': return scan_literal(sc, "true");
    case 'f': return scan_literal(sc, "false");
    case 'n': return scan_literal(sc, "null");
    default:
        if (sc->s[sc->pos] == '-' || (sc->s[sc->pos] >= '0' && sc->s[sc->pos] <= '9'))
            return scan_number(sc);
        return fail(sc, "value expected");
    }
}

static int scan_whole(const char *s, size_t len, capstan_jobject_t *top, char *err)
{
    scanner_t sc = { .s = s, .len = len, .err = err };
    skip_ws(&sc);
    if (top && (sc.pos >= len || s[sc.pos] != '{'))
        return fail(&sc, "a JSON object is expected");
    int rc = scan_value(&sc, 0, top);
    if (rc)
        return rc;
    skip_ws(&sc);
    if (sc.pos != len)
        return fail(&sc, "trailing bytes after the value");
    return 0;
}

int capstan__json_validate(const char *s, size_t len, char *err)
{
    return scan_whole(s, len, NULL, err);
}

int capstan__json_scan_object(const char *s, size_t len, capstan_jobject_t *obj, char *err)
{
    obj->n = 0;
    return scan_whole(s, len, obj, err);
}

void capstan__jobject_free(capstan_jobject_t *obj)
{
    if (!obj)
        return;
    free(obj->m);
    obj->m = NULL;
    obj->n = obj->cap = 0;
}

const capstan_jmember_t *capstan__jobject_get(const capstan_jobject_t *obj, const char *s,
                                              const char *key)
{
    size_t klen = strlen(key);
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

char *capstan__json_string_dup(const char *v, size_t len)
{
    if (len < 2 || v[0] != '"' || v[len - 1] != '"')
        return NULL;
    char *out = malloc(len), *o = out; /* decoding never grows the text */
    if (!out)
        return NULL;
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
