/* Text made without the printf family, for what runs once a job or more:
 * there printf's parsing of its format costs more than the rest of the
 * work. Each writes a NUL-terminated string and returns its length. */
#ifndef CAPSTAN_SUPPORT_FMT_H
#define CAPSTAN_SUPPORT_FMT_H

#include <stddef.h>

/* v in decimal; out holds CAPSTAN_FMT_INT bytes. */
#define CAPSTAN_FMT_INT 21
size_t capstan__fmt_uint(char *out, unsigned long long v);
size_t capstan__fmt_int(char *out, long long v);

/* v with places decimals, as "%.*f" writes it, into out of n bytes. Fast
 * for 0 <= v < 1e15, 1 to 9 places and n >= 32; anything else goes
 * through snprintf. */
size_t capstan__fmt_fixed(char *out, size_t n, double v, int places);

/* The strings after n, up to a NULL, one after another into out of n bytes
 * (n > 0), cut at n - 1 bytes as snprintf would cut them. */
size_t capstan__fmt_cat(char *out, size_t n, ...);

#endif
