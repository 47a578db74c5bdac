#include "support/fmt.h"

#include <math.h> /* signbit, a macro: no libm */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

size_t capstan__fmt_uint(char *out, unsigned long long v)
{
    char t[CAPSTAN_FMT_INT];
    size_t n = 0;
    do {
        t[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = t[n - 1 - i];
    out[n] = '\0';
    return n;
}

size_t capstan__fmt_int(char *out, long long v)
{
    if (v >= 0)
        return capstan__fmt_uint(out, (unsigned long long)v);
    out[0] = '-';
    return 1 + capstan__fmt_uint(out + 1, 0 - (unsigned long long)v);
}

/* a * b exactly, as *hi + *lo (Dekker's product: each factor split into
 * halves whose products are exact). */
static void exact_product(double a, double b, double *hi, double *lo)
{
    const double split = 134217729.0; /* 2^27 + 1 */
    double ca = split * a, cb = split * b;
    double ah = ca - (ca - a), al = a - ah, bh = cb - (cb - b), bl = b - bh;
    *hi = a * b;
    *lo = ((ah * bh - *hi) + ah * bl + al * bh) + al * bl;
}

size_t capstan__fmt_fixed(char *out, size_t n, double v, int places)
{
    static const double scale[] = { 1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9 };
    if (!(v >= 0 && v < 1e15) || signbit(v) || n < 32 || places < 1 || places > 9) {
        int w = snprintf(out, n, "%.*f", places, v);
        return w < 0 ? 0 : (size_t)w < n ? (size_t)w : n - 1;
    }
    /* The whole part, and the fraction (exact after the subtraction) in
     * units of the last place, rounded as printf rounds: to nearest, an
     * exact half to even. */
    unsigned long long whole = (unsigned long long)v;
    unsigned long one = (unsigned long)scale[places];
    double hi, lo;
    exact_product(v - (double)whole, scale[places], &hi, &lo);
    unsigned long frac = (unsigned long)hi;
    double rest = hi - (double)frac; /* exact: both are below 1e9 */
    /* rest is a multiple of hi's last bit, as is 0.5, and lo is under half
     * of it: only at rest == 0.5 does lo decide. */
    if (rest > 0.5 || (rest == 0.5 && (lo > 0 || (lo == 0 && (frac & 1)))))
        frac++;
    if (frac >= one) {
        whole++;
        frac -= one;
    }
    size_t len = capstan__fmt_uint(out, whole);
    out[len++] = '.';
    for (int i = places - 1; i >= 0; i--, frac /= 10)
        out[len + (size_t)i] = (char)('0' + frac % 10);
    len += (size_t)places;
    out[len] = '\0';
    return len;
}

size_t capstan__fmt_cat(char *out, size_t n, ...)
{
    va_list ap;
    va_start(ap, n);
    size_t len = 0;
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *)) {
        size_t k = strlen(s);
        if (k > n - 1 - len)
            k = n - 1 - len;
        memcpy(out + len, s, k);
        len += k;
    }
    va_end(ap);
    out[len] = '\0';
    return len;
}
