/* Strict numbers from text (flags, subcommand options): the whole word, no
 * trailing junk, finite, and within bounds. */
#ifndef CAPSTAN_SUPPORT_NUMBER_H
#define CAPSTAN_SUPPORT_NUMBER_H

#include <stddef.h>

/* Parses text as a number (a base-10 integer when integer is set) in
 * [lo, hi] into *out. Returns 0, or CAPSTAN_EINVAL for "", "5s", "inf", "nan",
 * an overflow or a value out of bounds (*out unchanged). */
int capstan__parse_number(const char *text, int integer, double lo, double hi, double *out);
/* Parses the n bytes at s, decimal digits only (no sign, no space), as an
 * integer in [lo, hi] into *out: the ports and database numbers of URLs and
 * Sentinel replies. Returns 0, or CAPSTAN_EINVAL (*out unchanged). */
int capstan__parse_digits(const char *s, size_t n, int lo, int hi, int *out);

/* Parses a memory size: a whole number with an optional unit KB, MB or GB
 * (K, M, G; powers of 1024), a bare number counting megabytes, into bytes
 * (*out). Returns 0, or CAPSTAN_EINVAL (*out unchanged). */
int capstan__parse_size(const char *text, long long *out);

/* floor() and ceil() for |x| < 2^63, without libm: mapped, libm would add
 * about 300 KB to every worker's resident memory for these two. */
static inline double capstan__floor(double x)
{
    double t = (double)(long long)x;
    return t > x ? t - 1 : t;
}

static inline double capstan__ceil(double x)
{
    double t = (double)(long long)x;
    return t < x ? t + 1 : t;
}

#endif
