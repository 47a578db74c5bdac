/* Time zones read from the system's TZif files (/usr/share/zoneinfo, or
 * $TZDIR), without setenv("TZ")/localtime_r: TZ is process-wide and
 * changing it is not thread-safe, and a periodic schedule needs many zones
 * at once. Also the calendar arithmetic that cron matching needs. */
#ifndef CAPSTAN_SUPPORT_TZ_H
#define CAPSTAN_SUPPORT_TZ_H

#include <stdint.h>

typedef struct capstan_tz capstan_tz_t;

/* Loads zone name ("Europe/Berlin"; NULL, "" or "UTC" need no file).
 * Returns a zone owned by the caller (capstan__tz_free), or NULL with err
 * (CAPSTAN_ERRLEN) filled: an unknown zone (no file), or a file that cannot
 * be read or is not a whole TZif file (said to be corrupt). */
capstan_tz_t *capstan__tz_load(const char *name, char *err);
void capstan__tz_free(capstan_tz_t *tz);

/* Seconds east of UTC in effect at the UTC instant t. */
long capstan__tz_offset(const capstan_tz_t *tz, int64_t t);

/* The UTC instant of the local wall time w (seconds since 1970-01-01T00:00
 * local, as if it were UTC). A wall time that occurs twice (clocks turned
 * back) gives its first instant; one that does not occur (clocks turned
 * forward) gives the instant the clocks jumped, the first valid one after
 * it. */
int64_t capstan__tz_from_wall(const capstan_tz_t *tz, int64_t w);

/* Days since 1970-01-01 of a proleptic Gregorian date, and back. */
int64_t capstan__days_from_civil(int64_t y, unsigned m, unsigned d);
void capstan__civil_from_days(int64_t days, int64_t *y, unsigned *m, unsigned *d);

#endif
