/* A growable byte buffer, used to build payloads and commands. */
#ifndef CAPSTAN_SUPPORT_BUF_H
#define CAPSTAN_SUPPORT_BUF_H

#include <stddef.h>
#include <string.h>

typedef struct capstan_buf {
    char *p;      /* always NUL-terminated when non-NULL; owned unless on */
    size_t len, cap;
    int on;       /* p is the caller's storage (capstan__buf_on) until it grows */
} capstan_buf_t;

/* Starts b empty in the caller's storage of size bytes (at least 1), so
 * that a short string is built without allocating; it moves to the heap
 * when it outgrows it. capstan__buf_free is still needed after. */
void capstan__buf_on(capstan_buf_t *b, char *storage, size_t size);

/* Each returns 0 or CAPSTAN_ENOMEM (the buffer is then unchanged). */
int capstan__buf_put_grow(capstan_buf_t *b, const char *s, size_t len);
/* Inline when it fits (a log line takes a dozen a job); grows otherwise. */
static inline int capstan__buf_put(capstan_buf_t *b, const char *s, size_t len)
{
    if (b->len + len + 1 > b->cap)
        return capstan__buf_put_grow(b, s, len);
    if (len)
        memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = '\0';
    return 0;
}
int capstan__buf_puts(capstan_buf_t *b, const char *s);
int capstan__buf_printf(capstan_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* v in decimal, and v as "%.*f" with places decimals, without printf
 * (support/fmt.h). */
int capstan__buf_put_int(capstan_buf_t *b, long long v);
int capstan__buf_put_fixed(capstan_buf_t *b, double v, int places);
/* Hands the bytes to the caller (free()) and resets b: always a NUL-terminated
 * string ("" when nothing was put), or NULL when out of memory. */
char *capstan__buf_take(capstan_buf_t *b, size_t *len);
void capstan__buf_free(capstan_buf_t *b);

/* Writes n bytes at p to descriptor fd, again after a short write or an
 * interrupted one; stops at an error or a write of nothing (the rest is
 * lost). */
void capstan__write_all(int fd, const char *p, size_t n);

#endif
