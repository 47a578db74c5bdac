/* Strict number parsing shared by every flag and option parser. */
#include "support/number.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

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
