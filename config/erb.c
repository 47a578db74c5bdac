/* Renders the ERB of a sidekiq.yml before the YAML is read (config/erb.h).
 *
 * Sidekiq renders its config file with ERB (trim_mode "-") and Rails apps
 * use that to read the environment: concurrency from RAILS_MAX_THREADS, the
 * Redis URL from REDIS_URL. capstan cannot run Ruby, so it evaluates the few
 * expressions such files hold, exactly as Ruby would, and refuses any other
 * with one line naming the file, line and tag: a value guessed wrong would
 * be worse than a refusal. The rendered text keeps a map of its lines to the
 * file's, so YAML errors still name the line the user wrote. */
#include "config/erb.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/error.h"
#include "support/buf.h"

/* A Ruby value as the supported expressions produce them. */
typedef enum { V_NIL, V_STR, V_INT } vkind_t;

typedef struct val {
    vkind_t k;
    char *s; /* V_STR: owned, NUL-terminated */
    size_t n;
    long long i; /* V_INT */
} val_t;

/* The expression of one tag being parsed (and, where live, evaluated). */
typedef struct parse {
    const char *p, *end;
    int depth;                /* nested expressions, bounded */
    int rc;                   /* 0, CAPSTAN_ECONFIG or CAPSTAN_ENOMEM */
    char why[CAPSTAN_ERRLEN]; /* what Ruby would raise; "" = not supported */
} parse_t;

static void val_free(val_t *v)
{
    free(v->s);
    memset(v, 0, sizeof(*v));
}

static int fail(parse_t *st)
{
    if (!st->rc)
        st->rc = CAPSTAN_ECONFIG;
    return -1;
}

/* An error Ruby would raise while evaluating (KeyError, ArgumentError...). */
static int ruby_raise(parse_t *st, const char *fmt, const char *arg)
{
    if (!st->rc) {
        snprintf(st->why, sizeof(st->why), fmt, arg);
        st->rc = CAPSTAN_ECONFIG;
    }
    return -1;
}

static int nomem(parse_t *st)
{
    st->rc = CAPSTAN_ENOMEM;
    return -1;
}

static void skip_ws(parse_t *st)
{
    while (st->p < st->end && isspace((unsigned char)*st->p))
        st->p++;
}

static int ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_';
}

/* Consumes the punctuation s if it comes next. */
static int punct(parse_t *st, const char *s)
{
    size_t n = strlen(s);
    skip_ws(st);
    if ((size_t)(st->end - st->p) < n || memcmp(st->p, s, n) != 0)
        return 0;
    st->p += n;
    return 1;
}

/* Consumes the identifier w if it comes next, whole. */
static int word(parse_t *st, const char *w)
{
    size_t n = strlen(w);
    skip_ws(st);
    if ((size_t)(st->end - st->p) < n || memcmp(st->p, w, n) != 0 ||
        (st->p + n < st->end && ident_char(st->p[n])))
        return 0;
    st->p += n;
    return 1;
}

/* A Ruby string literal: '...' (only \\ and \' are escapes) or "..." with
 * the common escapes and no interpolation. */
static int string_lit(parse_t *st, val_t *out)
{
    skip_ws(st);
    if (st->p >= st->end || (*st->p != '"' && *st->p != '\''))
        return fail(st);
    char q = *st->p++;
    capstan_buf_t b = {0};
    int rc = 0;
    while (!rc) {
        if (st->p >= st->end) {
            capstan__buf_free(&b);
            return fail(st);
        }
        char c = *st->p++, put = c;
        if (c == q)
            break;
        if (q == '"' && c == '#' && st->p < st->end && strchr("{@$", *st->p)) {
            capstan__buf_free(&b);
            return fail(st); /* interpolation */
        }
        if (c == '\\' && st->p < st->end) {
            char e = *st->p;
            if (q == '\'') {
                if (e == '\\' || e == '\'') {
                    put = e;
                    st->p++;
                }
            } else {
                const char *from = "\\\"ntr", *to = "\\\"\n\t\r";
                const char *at = strchr(from, e);
                if (!at || !e) {
                    capstan__buf_free(&b);
                    return fail(st);
                }
                put = to[at - from];
                st->p++;
            }
        }
        rc = capstan__buf_put(&b, &put, 1);
    }
    out->k = V_STR;
    if (rc || !(out->s = capstan__buf_take(&b, &out->n))) {
        capstan__buf_free(&b);
        return nomem(st);
    }
    return 0;
}

/* Appends decimal digit d in base to *v; -1 on overflow. */
static int accumulate(unsigned long long *v, int d, int base)
{
    if (*v > (ULLONG_MAX - (unsigned long long)d) / (unsigned long long)base)
        return -1;
    *v = *v * (unsigned long long)base + (unsigned long long)d;
    return 0;
}

static int digit_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'Z')
        return c - 'A' + 10;
    return 99;
}

/* Signs and bounds a magnitude into a long long; -1 when out of range. */
static int signed_value(unsigned long long mag, int neg, long long *out)
{
    if (neg ? mag > (unsigned long long)LLONG_MAX + 1 : mag > (unsigned long long)LLONG_MAX)
        return -1;
    *out = neg ? (long long)(0 - mag) : (long long)mag;
    return 0;
}

/* A Ruby integer literal: decimal digits with single underscores between
 * them, optionally negative. 012 (octal in Ruby) and 0x.. are not taken. */
static int int_lit(parse_t *st, val_t *out)
{
    skip_ws(st);
    int neg = 0;
    if (st->p < st->end && (*st->p == '-' || *st->p == '+'))
        neg = *st->p++ == '-';
    const char *start = st->p;
    unsigned long long mag = 0;
    while (st->p < st->end && (isdigit((unsigned char)*st->p) ||
                               (*st->p == '_' && st->p > start && st->p + 1 < st->end &&
                                isdigit((unsigned char)st->p[1]) && st->p[-1] != '_'))) {
        if (*st->p != '_' && accumulate(&mag, *st->p - '0', 10))
            return ruby_raise(st, "integer %s is out of range", "literal");
        st->p++;
    }
    if (st->p == start || (*start == '0' && st->p - start > 1) ||
        (st->p < st->end && ident_char(*st->p)))
        return fail(st);
    out->k = V_INT;
    if (signed_value(mag, neg, &out->i))
        return ruby_raise(st, "integer %s is out of range", "literal");
    return 0;
}

/* String#to_i: leading blanks, a sign, the digits up to the first other
 * character (single underscores between them); 0 when there are none. */
static int str_to_i(const char *s, long long *out)
{
    while (isspace((unsigned char)*s))
        s++;
    int neg = 0;
    if (*s == '-' || *s == '+')
        neg = *s++ == '-';
    unsigned long long mag = 0;
    for (const char *start = s;
         isdigit((unsigned char)*s) || (*s == '_' && s > start && isdigit((unsigned char)s[-1]) &&
                                        isdigit((unsigned char)s[1]));
         s++)
        if (*s != '_' && accumulate(&mag, *s - '0', 10))
            return -1;
    return signed_value(mag, neg, out);
}

/* Kernel#Integer of a string: blanks around, a sign, 0x/0b/0o/0d or a
 * leading 0 (octal) prefix, digits with single underscores between them,
 * nothing else. */
static int str_integer(const char *s, size_t n, long long *out)
{
    const char *e = s + n;
    while (s < e && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        e--;
    int neg = 0, base = 10;
    if (s < e && (*s == '-' || *s == '+'))
        neg = *s++ == '-';
    if (e - s >= 2 && s[0] == '0') {
        switch (s[1]) {
        case 'x': case 'X': base = 16; s += 2; break;
        case 'b': case 'B': base = 2; s += 2; break;
        case 'o': case 'O': base = 8; s += 2; break;
        case 'd': case 'D': base = 10; s += 2; break;
        default: base = 8; break;
        }
    }
    unsigned long long mag = 0;
    const char *start = s;
    for (; s < e; s++) {
        if (*s == '_' && s > start && s[-1] != '_' && s + 1 < e)
            continue;
        int d = digit_value(*s);
        if (d >= base || accumulate(&mag, d, base))
            return -1;
    }
    if (s == start)
        return -1;
    return signed_value(mag, neg, out);
}

static int expr(parse_t *st, int live, val_t *out);
static int or_expr(parse_t *st, int live, val_t *out);

/* ENV[...] and ENV.fetch(...), after the word ENV. */
static int env_ref(parse_t *st, int live, val_t *out)
{
    val_t name = {0}, def = {0}, blk = {0};
    int has_def = 0, has_blk = 0, rc = -1;
    if (punct(st, "[")) {
        if (string_lit(st, &name) || !punct(st, "]"))
            goto out;
    } else if (punct(st, ".") && word(st, "fetch") && punct(st, "(")) {
        if (string_lit(st, &name))
            goto out;
        const char *set = memchr(name.s, '\0', name.n) ? NULL : getenv(name.s);
        /* The default argument is evaluated whatever; the block only when
         * the variable is unset (and it supersedes the argument). */
        if (punct(st, ",")) {
            has_def = 1;
            if (expr(st, live, &def))
                goto out;
        }
        if (!punct(st, ")"))
            goto out;
        if (punct(st, "{")) {
            has_blk = 1;
            if (expr(st, live && !set, &blk) || !punct(st, "}"))
                goto out;
        }
        if (live && !set && !has_def && !has_blk) {
            ruby_raise(st, "key not found: \"%s\" (the environment variable is not set)", name.s);
            goto out;
        }
        if (live && !set) {
            *out = has_blk ? blk : def;
            memset(has_blk ? &blk : &def, 0, sizeof(val_t));
            rc = 0;
            goto out;
        }
    } else {
        fail(st);
        goto out;
    }
    if (live) {
        const char *v = memchr(name.s, '\0', name.n) ? NULL : getenv(name.s);
        if (v && !(out->s = strdup(v))) {
            nomem(st);
            goto out;
        }
        out->k = v ? V_STR : V_NIL;
        out->n = v ? strlen(v) : 0;
    }
    rc = 0;
out:
    val_free(&name);
    val_free(&def);
    val_free(&blk);
    return rc;
}

static int primary(parse_t *st, int live, val_t *out)
{
    skip_ws(st);
    if (word(st, "ENV"))
        return env_ref(st, live, out);
    if (word(st, "Integer")) {
        if (!punct(st, "(") || expr(st, live, out) || !punct(st, ")"))
            return fail(st);
        if (!live || out->k == V_INT)
            return 0;
        if (out->k == V_NIL)
            return ruby_raise(st, "%s", "can't convert nil into Integer");
        long long i;
        if (memchr(out->s, '\0', out->n) || str_integer(out->s, out->n, &i))
            return ruby_raise(st, "invalid value for Integer(): \"%s\"", out->s);
        val_free(out);
        out->k = V_INT;
        out->i = i;
        return 0;
    }
    if (punct(st, "(")) {
        if (expr(st, live, out) || !punct(st, ")"))
            return fail(st);
        return 0;
    }
    if (word(st, "nil")) {
        out->k = V_NIL;
        return 0;
    }
    if (st->p < st->end && (*st->p == '"' || *st->p == '\''))
        return string_lit(st, out);
    return int_lit(st, out);
}

/* primary, then .to_i / .to_s calls. */
static int postfix(parse_t *st, int live, val_t *out)
{
    if (primary(st, live, out))
        return -1;
    while (punct(st, ".")) {
        if (word(st, "to_i")) {
            long long i = out->k == V_INT ? out->i : 0;
            if (live && out->k == V_STR && str_to_i(out->s, &i))
                return ruby_raise(st, "\"%s\".to_i is out of range", out->s);
            val_free(out);
            out->k = V_INT;
            out->i = i;
        } else if (word(st, "to_s")) {
            if (out->k == V_STR)
                continue;
            char num[32] = "";
            if (out->k == V_INT)
                snprintf(num, sizeof(num), "%lld", out->i);
            val_free(out);
            if (!(out->s = strdup(num)))
                return nomem(st);
            out->k = V_STR;
            out->n = strlen(num);
        } else {
            return fail(st);
        }
    }
    return 0;
}

/* Deeper than any real default needs; a file of "((((" must not exhaust
 * the stack. */
#define MAX_NESTING 16

/* a || b: b (evaluated only then) when a is nil. */
static int expr(parse_t *st, int live, val_t *out)
{
    if (st->depth >= MAX_NESTING)
        return fail(st);
    st->depth++;
    int rc = or_expr(st, live, out);
    st->depth--;
    return rc;
}

static int or_expr(parse_t *st, int live, val_t *out)
{
    if (postfix(st, live, out))
        return -1;
    while (punct(st, "||")) {
        val_t rhs = {0};
        int need = live && out->k == V_NIL;
        if (postfix(st, need, &rhs)) {
            val_free(&rhs);
            return -1;
        }
        if (need) {
            val_free(out);
            *out = rhs;
        } else {
            val_free(&rhs);
        }
    }
    return 0;
}

/* The render in progress. */
typedef struct render {
    capstan_buf_t out;
    unsigned long *lines;
    size_t nlines, cap;
    unsigned long line; /* the file's line being read */
    int rc;
} render_t;

static void push_line(render_t *r, unsigned long line)
{
    if (r->rc)
        return;
    if (r->nlines == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        unsigned long *p = realloc(r->lines, cap * sizeof(*p));
        if (!p) {
            r->rc = CAPSTAN_ENOMEM;
            return;
        }
        r->lines = p;
        r->cap = cap;
    }
    r->lines[r->nlines++] = line;
}

/* Appends n bytes; a newline among them starts a rendered line that comes
 * from the file's line `from`, or from the next file line when from is 0
 * (text copied as it is). */
static void emit(render_t *r, const char *s, size_t n, unsigned long from)
{
    if (r->rc || !n)
        return;
    if (capstan__buf_put(&r->out, s, n)) {
        r->rc = CAPSTAN_ENOMEM;
        return;
    }
    for (const char *p = s; (p = memchr(p, '\n', n - (size_t)(p - s))); p++) {
        if (!from)
            r->line++;
        push_line(r, from ? from : r->line);
    }
}

/* The tag as the user wrote it, on one line and cut if long, for errors. */
static void show_tag(const char *s, size_t n, char *buf, size_t size)
{
    size_t max = size - 4, k = 0;
    for (size_t i = 0; i < n && k < max; i++)
        buf[k++] = (unsigned char)s[i] < 0x20 ? ' ' : s[i];
    buf[k] = '\0';
    if (n > max)
        strcpy(buf + k, "...");
}

/* A <% %> code tag is accepted only when it holds nothing but Ruby
 * comments (a <%- # note -%> line renders to nothing). */
static int only_comments(const char *s, size_t n)
{
    int in_comment = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n')
            in_comment = 0;
        else if (s[i] == '#')
            in_comment = 1;
        else if (!in_comment && !isspace((unsigned char)s[i]))
            return 0;
    }
    return 1;
}

/* Evaluates one <%= %> expression (content [s, s + n)) and emits its value. */
static int output_tag(render_t *r, const char *s, size_t n, unsigned long line, char *why)
{
    parse_t st = {.p = s, .end = s + n};
    val_t v = {0};
    if (!expr(&st, 1, &v)) {
        skip_ws(&st);
        if (st.p != st.end)
            fail(&st);
    }
    if (!st.rc) {
        char num[32];
        if (v.k == V_INT) {
            snprintf(num, sizeof(num), "%lld", v.i);
            emit(r, num, strlen(num), line);
        } else if (v.k == V_STR) {
            emit(r, v.s, v.n, line);
        }
    }
    val_free(&v);
    snprintf(why, CAPSTAN_ERRLEN, "%s", st.why);
    return st.rc;
}

int capstan__erb_render(const char *path, const char *src, size_t len, capstan_erb_t *out,
                        char *err)
{
    render_t r = {.line = 1};
    char tag[128], why[CAPSTAN_ERRLEN];
    int rc = 0;
    memset(out, 0, sizeof(*out));
    push_line(&r, 1);
    size_t i = 0;
    while (!r.rc && !rc) {
        const char *open = memmem(src + i, len - i, "<%", 2);
        size_t pos = open ? (size_t)(open - src) : len;
        emit(&r, src + i, pos - i, 0);
        if (!open)
            break;
        if (pos + 2 < len && src[pos + 2] == '%') { /* <%% is a literal <% */
            emit(&r, "<%", 2, 0);
            i = pos + 3;
            continue;
        }
        unsigned long line = r.line;
        size_t cstart = pos + 2;
        char kind = 'c';
        if (cstart < len && src[cstart] && strchr("=#-", src[cstart]))
            kind = src[cstart++];
        if (kind == '-') {
            /* <%- drops the indentation before it when it starts a line:
             * the blanks just emitted. */
            size_t b = pos;
            while (b > i && (src[b - 1] == ' ' || src[b - 1] == '\t'))
                b--;
            if (b == 0 || src[b - 1] == '\n') {
                r.out.len -= pos - b;
                if (r.out.p)
                    r.out.p[r.out.len] = '\0';
            }
            kind = 'c';
        }
        /* The first %> closes the tag (%%> is a literal %> in Ruby code). */
        size_t close = len, j = cstart;
        const char *found;
        while ((found = memmem(src + j, len - j, "%>", 2))) {
            size_t q = (size_t)(found - src);
            if (q > cstart && src[q - 1] == '%') {
                j = q + 2;
                continue;
            }
            close = q;
            break;
        }
        if (close == len) {
            show_tag(src + pos, len - pos, tag, sizeof(tag));
            rc = capstan_seterr(err, CAPSTAN_ECONFIG, "%s:%lu: unterminated ERB tag %s", path, line, tag);
            break;
        }
        size_t cend = close, next = close + 2;
        int trim = cend > cstart && src[cend - 1] == '-';
        if (trim)
            cend--;
        for (size_t k = pos; k < next; k++)
            if (src[k] == '\n')
                r.line++;
        show_tag(src + pos, next - pos, tag, sizeof(tag));
        why[0] = '\0';
        if (kind == '=')
            rc = output_tag(&r, src + cstart, cend - cstart, line, why);
        else if (kind == 'c' && !only_comments(src + cstart, cend - cstart))
            rc = CAPSTAN_ECONFIG;
        if (rc == CAPSTAN_ENOMEM)
            break;
        if (rc && why[0])
            rc = capstan_seterr(err, CAPSTAN_ECONFIG, "%s:%lu: ERB %s: %s", path, line, tag, why);
        else if (rc)
            rc = capstan_seterr(err, CAPSTAN_ECONFIG, "%s:%lu: unsupported ERB %s", path, line, tag);
        /* -%> also eats the newline right after it. */
        if (trim && next < len && src[next] == '\n') {
            next++;
            r.line++;
        }
        i = next;
    }
    if (!rc && r.rc)
        rc = r.rc;
    if (!rc && !(out->text = capstan__buf_take(&r.out, &out->len)))
        rc = CAPSTAN_ENOMEM;
    if (rc == CAPSTAN_ENOMEM)
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    capstan__buf_free(&r.out);
    if (rc) {
        free(r.lines);
        return rc;
    }
    out->lines = r.lines;
    out->nlines = r.nlines;
    return 0;
}

unsigned long capstan__erb_line(const capstan_erb_t *e, unsigned long line)
{
    if (!e || !e->nlines || line == 0)
        return line;
    if (line <= e->nlines)
        return e->lines[line - 1];
    return e->lines[e->nlines - 1] + (line - e->nlines);
}

void capstan__erb_clear(capstan_erb_t *e)
{
    if (!e)
        return;
    free(e->text);
    free(e->lines);
    memset(e, 0, sizeof(*e));
}
