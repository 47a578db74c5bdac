/* Strict numbers from text (flags, subcommand options): the whole word, no
 * trailing junk, finite, and within bounds. */
#ifndef KIQ_SUPPORT_NUMBER_H
#define KIQ_SUPPORT_NUMBER_H

/* Parses text as a number (a base-10 integer when integer is set) in
 * [lo, hi] into *out. Returns 0, or KIQ_EINVAL for "", "5s", "inf", "nan",
 * an overflow or a value out of bounds (*out unchanged). */
int kiq__parse_number(const char *text, int integer, double lo, double hi, double *out);

#endif
