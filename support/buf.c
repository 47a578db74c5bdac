/* Growable byte buffer. */
#include "support/buf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/error.h"
#include "support/fmt.h"

static int reserve(capstan_buf_t *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = b->on ? malloc(cap) : realloc(b->p, cap);
    if (!p)
        return CAPSTAN_ENOMEM;
    if (b->on)
        memcpy(p, b->p, b->len + 1);
    b->p = p;
    b->cap = cap;
    b->on = 0;
    return 0;
}

void capstan__buf_on(capstan_buf_t *b, char *storage, size_t size)
{
    b->p = storage;
    b->p[0] = '\0';
    b->len = 0;
    b->cap = size;
    b->on = 1;
}

int capstan__buf_put_grow(capstan_buf_t *b, const char *s, size_t len)
{
    if (reserve(b, len))
        return CAPSTAN_ENOMEM;
    if (len)
        memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = '\0';
    return 0;
}

int capstan__buf_puts(capstan_buf_t *b, const char *s)
{
    return capstan__buf_put(b, s, strlen(s));
}

int capstan__buf_put_int(capstan_buf_t *b, long long v)
{
    char t[CAPSTAN_FMT_INT];
    return capstan__buf_put(b, t, capstan__fmt_int(t, v));
}

int capstan__buf_put_fixed(capstan_buf_t *b, double v, int places)
{
    char t[64];
    return capstan__buf_put(b, t, capstan__fmt_fixed(t, sizeof(t), v, places));
}

int capstan__buf_printf(capstan_buf_t *b, const char *fmt, ...)
{
    /* Format straight into the free space; only a line that does not fit
     * is formatted a second time, after growing (log lines and payload
     * edits are on every job's path). */
    if (reserve(b, 64))
        return CAPSTAN_ENOMEM;
    size_t room = b->cap - b->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        return CAPSTAN_ENOMEM;
    if ((size_t)n >= room) {
        if (reserve(b, (size_t)n)) {
            b->p[b->len] = '\0'; /* drop the truncated attempt */
            return CAPSTAN_ENOMEM;
        }
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
    return 0;
}

char *capstan__buf_take(capstan_buf_t *b, size_t *len)
{
    /* An empty buffer was never written to: it is handed over as "". */
    if (!b->p) {
        if (reserve(b, 0))
            return NULL;
        b->p[0] = '\0';
    }
    char *p = b->p;
    if (b->on) {
        if (!(p = malloc(b->len + 1)))
            return NULL;
        memcpy(p, b->p, b->len + 1);
    }
    if (len)
        *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    b->on = 0;
    return p;
}

void capstan__buf_free(capstan_buf_t *b)
{
    if (!b->on)
        free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->on = 0;
}

void capstan__write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}
