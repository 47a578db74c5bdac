/* Strict number parsing shared by every flag and option parser. */
#include "support/number.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "capstan/error.h"

int capstan__parse_number(const char *text, int integer, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double d = integer ? (double)strtol(text, &end, 10) : strtod(text, &end);
    if (end == text || *end || errno || !isfinite(d) || d < lo || d > hi)
        return CAPSTAN_EINVAL;
    *out = d;
    return 0;
}

int capstan__parse_digits(const char *s, size_t n, int lo, int hi, int *out)
{
    long v = 0;
    if (n == 0 || n > 9)
        return CAPSTAN_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return CAPSTAN_EINVAL;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return CAPSTAN_EINVAL;
    *out = (int)v;
    return 0;
}

int capstan__parse_size(const char *text, long long *out)
{
    char *end;
    errno = 0;
    long long n = strtoll(text, &end, 10);
    if (end == text || errno || n < 0)
        return CAPSTAN_EINVAL;
    while (*end == ' ')
        end++;
    static const struct { const char *unit; int shift; } units[] = {
        { "", 20 }, { "K", 10 }, { "KB", 10 }, { "M", 20 }, { "MB", 20 }, { "G", 30 }, { "GB", 30 },
    };
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcasecmp(end, units[i].unit) == 0) {
            if (n > (LLONG_MAX >> units[i].shift))
                return CAPSTAN_EINVAL;
            *out = n << units[i].shift;
            return 0;
        }
    return CAPSTAN_EINVAL;
}
