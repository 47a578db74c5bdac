/* The nearest of a list of names to a mistyped one, for "did you mean"
 * hints: config keys, job classes. */
#include "support/nearest.h"

#include <string.h>

/* Levenshtein distance, for names up to 63 bytes (longer ones are never
 * near anything: 99). */
static int distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[64];
    if (la > 63 || lb > 63)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *capstan__nearest(const char *name, const char *const *names, size_t n)
{
    const char *best = NULL;
    int best_d = 3;
    for (size_t i = 0; i < n; i++) {
        int d = distance(name, names[i]);
        if (d < best_d && d * 3 <= (int)strlen(name)) {
            best = names[i];
            best_d = d;
        }
    }
    return best;
}
