/* A growable byte buffer, used to build payloads and commands. */
#ifndef KIQ_SUPPORT_BUF_H
#define KIQ_SUPPORT_BUF_H

#include <stddef.h>

typedef struct kiq_buf {
    char *p;      /* always NUL-terminated when non-NULL; owned unless on */
    size_t len, cap;
    int on;       /* p is the caller's storage (kiq__buf_on) until it grows */
} kiq_buf_t;

/* Starts b empty in the caller's storage of size bytes (at least 1), so
 * that a short string is built without allocating; it moves to the heap
 * when it outgrows it. kiq__buf_free is still needed after. */
void kiq__buf_on(kiq_buf_t *b, char *storage, size_t size);

/* Each returns 0 or KIQ_ENOMEM (the buffer is then unchanged). */
int kiq__buf_put(kiq_buf_t *b, const char *s, size_t len);
int kiq__buf_puts(kiq_buf_t *b, const char *s);
int kiq__buf_printf(kiq_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* v in decimal, and v as "%.*f" with places decimals, without printf
 * (support/fmt.h). */
int kiq__buf_put_int(kiq_buf_t *b, long long v);
int kiq__buf_put_fixed(kiq_buf_t *b, double v, int places);
/* Hands the bytes to the caller (free()) and resets b: always a NUL-terminated
 * string ("" when nothing was put), or NULL when out of memory. */
char *kiq__buf_take(kiq_buf_t *b, size_t *len);
void kiq__buf_free(kiq_buf_t *b);

#endif
