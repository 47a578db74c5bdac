/* Cron expressions: five fields (minute hour day-of-month month
 * day-of-week), or six with seconds first as sidekiq-cron writes them, or
 * a shorthand (@yearly, @annually, @monthly, @weekly, @daily, @midnight,
 * @hourly); then, as fugit (sidekiq-cron, sidekiq-scheduler) reads them,
 * an optional zone ("0 9 * * * Europe/Berlin"). A field is *, ? (as *), a
 * value, a range a-b, a step * /n (written without the space), a-b/n or
 * a/n, or a comma list of those; months and weekdays take their
 * three-letter English names, and weekday 7 is Sunday as 0 is. The day of
 * month also takes L (or last) for the month's last day, -n for its n-th
 * day from the end (-1 is L) and -n-L for the last n days; the day of week
 * takes d#n for the month's n-th weekday d (1 to 5) and d#-n, d#L or
 * d#last counted from the end. When both day fields are restricted a day
 * matches either, as in cron.
 *
 * "@every DURATION" (DURATION as capstan__cron_duration reads it) ticks
 * each time the seconds since the epoch are a multiple of it, whatever the
 * zone: the same instants in every process, as exactly-once ticks need. */
#ifndef CAPSTAN_SUPPORT_CRON_H
#define CAPSTAN_SUPPORT_CRON_H

#include <stdint.h>

#include "support/tz.h"

typedef struct capstan_cron {
    uint64_t sec, min;   /* bit n set: value n matches */
    uint32_t hour, dom;  /* dom: bits 1..31 */
    uint32_t dom_last;   /* bit n: the n-th day from the month's end (1: the last) */
    uint16_t mon;        /* bits 1..12 */
    uint8_t dow;         /* bits 0..6, Sunday 0 */
    uint16_t nth[7];     /* per weekday, bit n (1..5): the month's n-th one;
                            bit 8 + n: the n-th from the end */
    int dom_any, dow_any; /* the field was * or ? */
    char zone[64];       /* the zone written after the fields, or "" */
    int64_t every;       /* @every: seconds between ticks; 0 for the fields */
} capstan_cron_t;

/* Parses a duration as fugit writes one, "30s", "5m", "1h30m", "2d",
 * "1w" (s, m, h, d and w; a bare number counts seconds), into *secs.
 * Returns 0, or CAPSTAN_ECONFIG with err (CAPSTAN_ERRLEN) saying why: a
 * month or a year has no fixed length, so M and y are refused. */
int capstan__cron_duration(const char *text, int64_t *secs, char *err);

/* Parses expr into *out. Returns 0, or CAPSTAN_ECONFIG with err
 * (CAPSTAN_ERRLEN) saying which field is wrong and why. */
int capstan__cron_parse(const char *expr, capstan_cron_t *out, char *err);

/* The first tick strictly after the UTC instant after, in zone tz (NULL =
 * UTC), as a UTC instant; -1 when there is none within ten years (a
 * February 30th). A local time that does not exist (clocks turned
 * forward) ticks at the instant of the jump; one that occurs twice (clocks
 * turned back) ticks once, at its first occurrence. */
int64_t capstan__cron_next(const capstan_cron_t *c, const capstan_tz_t *tz, int64_t after);

#endif
