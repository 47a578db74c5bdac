/* Suggestions for typos. */
#ifndef CAPSTAN_SUPPORT_NEAREST_H
#define CAPSTAN_SUPPORT_NEAREST_H

#include <stddef.h>

/* The name among names[0..n) closest to name (Levenshtein): at most 2
 * edits, and fewer than a third of name's length, so "tga" does not
 * become "tag" by accident of length. NULL when nothing is that close. */
const char *capstan__nearest(const char *name, const char *const *names, size_t n);

#endif
