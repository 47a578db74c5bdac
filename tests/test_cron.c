/* Cron expressions and time zones for periodic jobs: parsing, next ticks,
 * and the daylight-saving changes of a zone driven by explicit instants
 * (no clock, no sleeps). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/error.h"
#include "support/cron.h"
#include "support/tz.h"

static capstan_cron_t parse(const char *expr)
{
    capstan_cron_t c;
    char err[CAPSTAN_ERRLEN] = "";
    cr_assert_eq(capstan__cron_parse(expr, &c, err), 0, "%s: %s", expr, err);
    return c;
}

static capstan_tz_t *zone(const char *name)
{
    char err[CAPSTAN_ERRLEN] = "";
    capstan_tz_t *tz = capstan__tz_load(name, err);
    cr_assert(tz, "%s: %s", name, err);
    return tz;
}

/* The n ticks after t, in UTC instants. */
static void ticks(const char *expr, const capstan_tz_t *tz, int64_t t, int64_t *out, int n)
{
    capstan_cron_t c = parse(expr);
    for (int i = 0; i < n; i++)
        t = out[i] = capstan__cron_next(&c, tz, t);
}

Test(cron, five_and_six_fields_steps_lists_and_names)
{
    const int64_t t = 1795687620; /* 2026-11-26T10:07:00Z, a Thursday */
    int64_t got[3];
    ticks("*/15 * * * *", NULL, t, got, 3);
    cr_assert_eq(got[0], t + 8 * 60);
    cr_assert_eq(got[1], t + 23 * 60);
    cr_assert_eq(got[2], t + 38 * 60);
    ticks("*/20 * * * * *", NULL, t, got, 3); /* seconds first */
    cr_assert_eq(got[0], t + 20);
    cr_assert_eq(got[2], t + 60);
    ticks("5,10-12 3/10 * * * *", NULL, t, got, 3); /* 10:13:05, 10:13:10, 10:13:11 */
    cr_assert_eq(got[0], t + 6 * 60 + 5);
    cr_assert_eq(got[1], t + 6 * 60 + 10);
    cr_assert_eq(got[2], t + 6 * 60 + 11);
    ticks("0 9 * jan-mar MON", NULL, t, got, 1); /* Monday 2027-01-04 09:00 */
    cr_assert_eq(got[0], 1799053200);
    ticks("@monthly", NULL, t, got, 2);
    cr_assert_eq(got[0], 1796083200); /* 2026-12-01T00:00Z */
    cr_assert_eq(got[1], 1796083200 + 31 * 86400);
    ticks("0 0 * * 7", NULL, t, got, 1); /* Sunday as 7 */
    cr_assert_eq(got[0], 1795910400);    /* 2026-11-29T00:00Z */
    /* Both day fields restricted: either matches (the 13th or a Friday). */
    ticks("0 0 13 * fri", NULL, t, got, 2);
    cr_assert_eq(got[0], 1795737600); /* Friday 2026-11-27 */
    cr_assert_eq(got[1], 1796342400); /* Friday 2026-12-04 */
    ticks("@hourly", NULL, t, got, 1);
    cr_assert_eq(got[0], t + 53 * 60);
}

Test(cron, bad_expressions_say_which_field)
{
    static const struct { const char *expr, *says; } bad[] = {
        { "* * * *", "five fields" },
        { "* * * * * * *", "more than six" },
        { "60 * * * *", "minutes field \"60\": values must be between 0 and 59" },
        { "* 24 * * *", "hours field" },
        { "* * 0 * *", "day of month field" },
        { "* * * 13 *", "month field" },
        { "* * * * 8", "day of week field" },
        { "*/0 * * * *", "step" },
        { "5-1 * * * *", "must go up" },
        { "* * * foo *", "month field" },
        { "@every_minute", "unknown shorthand" },
        { "1,,2 * * * *", "minutes field" },
        { "L * * * *", "minutes field" },
        { "0 0 15W * *", "W (the nearest weekday) is not supported" },
        { "0 0 LW * *", "W (the nearest weekday) is not supported" },
        { "0 0 L/2 * *", "no step" },
        { "0 0 -32 * *", "n from 1 to 31" },
        { "0 0 -3-5 * *", "-n-L" },
        { "0 0 * * 5L", "fri#L" },
        { "0 0 * * mon#6", "n from 1 to 5" },
        { "0 0 * * mon-fri#1", "day of week field" },
        { "* * * * foo", "day of week field" },
        { "* * * * * * * UTC", "more than six" },
        { "* * * * Europe/Berlin", "day of week field" },
        { "0 30 8 * * Monday", "day of week field \"Monday\"" },
        { "0 0 12 * * 5L", "fri#L" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        capstan_cron_t c;
        char err[CAPSTAN_ERRLEN] = "";
        cr_assert_eq(capstan__cron_parse(bad[i].expr, &c, err), CAPSTAN_ECONFIG, "%s", bad[i].expr);
        cr_assert(strstr(err, bad[i].says), "%s: %s", bad[i].expr, err);
    }
    capstan_cron_t c = parse("0 0 30 2 *"); /* never: February 30th */
    cr_assert_eq(capstan__cron_next(&c, NULL, 1795687620), -1);
}

/* What fugit (sidekiq-cron, sidekiq-scheduler) reads beside cron's five
 * fields: the month's last days (L, -n, -n-L), its n-th weekdays (d#n,
 * d#-n, d#L) and a zone after the fields. */
Test(cron, last_days_nth_weekdays_and_a_zone_after_the_fields)
{
    const int64_t t = 1795687620; /* 2026-11-26T10:07:00Z, a Thursday */
    int64_t got[4];
    ticks("0 0 L * *", NULL, t, got, 4);
    cr_assert_eq(got[0], 1795996800); /* 2026-11-30 */
    cr_assert_eq(got[1], 1798675200); /* 2026-12-31 */
    cr_assert_eq(got[2], 1801353600); /* 2027-01-31 */
    cr_assert_eq(got[3], 1803772800); /* 2027-02-28 */
    ticks("0 0 last * *", NULL, t, got, 1);
    cr_assert_eq(got[0], 1795996800);
    ticks("0 0 -3-L * *", NULL, t, got, 4); /* the last three days */
    cr_assert_eq(got[0], 1795824000);       /* 2026-11-28 */
    cr_assert_eq(got[1], 1795910400);
    cr_assert_eq(got[2], 1795996800);
    cr_assert_eq(got[3], 1798502400); /* 2026-12-29 */
    ticks("0 0 -2 * *", NULL, t, got, 2);
    cr_assert_eq(got[0], 1795910400); /* 2026-11-29 */
    cr_assert_eq(got[1], 1798588800); /* 2026-12-30 */
    ticks("0 0 28-L 2 *", NULL, t, got, 2);
    cr_assert_eq(got[0], 1803772800); /* 2027-02-28: no 29th */
    cr_assert_eq(got[1], 1835308800); /* 2028-02-28, then the 29th */
    ticks("0 5 * * mon#1", NULL, t, got, 2);
    cr_assert_eq(got[0], 1796619600); /* Monday 2026-12-07 05:00 */
    cr_assert_eq(got[1], 1799038800); /* Monday 2027-01-04 05:00 */
    ticks("0 7 * * fri#L", NULL, t, got, 2);
    cr_assert_eq(got[0], 1795762800); /* Friday 2026-11-27 07:00 */
    cr_assert_eq(got[1], 1798182000); /* Friday 2026-12-25 07:00 */
    ticks("0 7 * * 5#last", NULL, t, got, 1);
    cr_assert_eq(got[0], 1795762800);
    ticks("0 7 * * fri#-2", NULL, t, got, 1);
    cr_assert_eq(got[0], 1797577200); /* Friday 2026-12-18 07:00 */
    ticks("0 6 * * 5#4,5#5", NULL, t, got, 4);
    cr_assert_eq(got[0], 1795759200); /* 2026-11-27, the 4th */
    cr_assert_eq(got[1], 1798178400); /* 2026-12-25, the 4th */
    cr_assert_eq(got[2], 1800597600); /* 2027-01-22, the 4th */
    cr_assert_eq(got[3], 1801202400); /* 2027-01-29, the 5th */
    ticks("0 0 * * sun#1,wed", NULL, t, got, 2);
    cr_assert_eq(got[0], 1796169600); /* Wednesday 2026-12-02 */
    cr_assert_eq(got[1], 1796515200); /* Sunday 2026-12-06, the 1st */
    /* Both day fields restricted: either matches (the last day or a Friday). */
    ticks("0 0 L * fri", NULL, t, got, 2);
    cr_assert_eq(got[0], 1795737600); /* Friday 2026-11-27 */
    cr_assert_eq(got[1], 1795996800); /* Monday 2026-11-30, the last */

    capstan_cron_t c = parse("0 9 * * * Europe/Berlin");
    cr_assert_str_eq(c.zone, "Europe/Berlin");
    cr_assert_eq(c.hour, 1U << 9);
    c = parse("0 30 2 * * * America/New_York"); /* six fields, then the zone */
    cr_assert_str_eq(c.zone, "America/New_York");
    cr_assert_eq(c.sec, 1U);
    cr_assert_eq(c.min, 1ULL << 30);
    c = parse("@daily Asia/Tokyo");
    cr_assert_str_eq(c.zone, "Asia/Tokyo");
    cr_assert_eq(c.hour, 1U);
    c = parse("0 0 * * mon UTC");
    cr_assert_str_eq(c.zone, "UTC");
    cr_assert_eq(c.dow, 1U << 1);
    c = parse("0 0 0 * * mon"); /* six fields: mon is the day of week */
    cr_assert_str_eq(c.zone, "");
    cr_assert_eq(c.dow, 1U << 1);
}

Test(cron, zones_from_tzif_files_and_their_footer_rules)
{
    capstan_tz_t *berlin = zone("Europe/Berlin"), *sydney = zone("Australia/Sydney"),
                 *ny = zone("America/New_York");
    cr_assert_eq(capstan__tz_offset(berlin, 1768435200), 3600);  /* January */
    cr_assert_eq(capstan__tz_offset(berlin, 1784073600), 7200);  /* July */
    cr_assert_eq(capstan__tz_offset(sydney, 1768435200), 39600); /* southern summer */
    cr_assert_eq(capstan__tz_offset(sydney, 1784073600), 36000);
    cr_assert_eq(capstan__tz_offset(ny, 1772953200 - 1), -5 * 3600); /* 2026-03-08 07:00Z */
    cr_assert_eq(capstan__tz_offset(ny, 1772953200), -4 * 3600);
    /* Past the file's last transition the footer's rule applies. */
    cr_assert_eq(capstan__tz_offset(berlin, 2216250000 - 1), 3600); /* 2040-03-25T01:00Z */
    cr_assert_eq(capstan__tz_offset(berlin, 2216250000), 7200);
    capstan__tz_free(berlin);
    capstan__tz_free(sydney);
    capstan__tz_free(ny);
    char err[CAPSTAN_ERRLEN] = "";
    cr_assert_null(capstan__tz_load("Mars/Olympus_Mons", err));
    cr_assert(strstr(err, "unknown time zone Mars/Olympus_Mons"), "%s", err);
    cr_assert_null(capstan__tz_load("../../etc/passwd", err));
    capstan_tz_t *utc = zone("UTC");
    cr_assert_eq(capstan__tz_offset(utc, 1784073600), 0);
    capstan__tz_free(utc);
}

/* Berlin, 2026-03-29: clocks go from 02:00 CET to 03:00 CEST at 01:00Z. */
Test(cron, dst_gap_ticks_at_the_jump_once)
{
    capstan_tz_t *tz = zone("Europe/Berlin");
    const int64_t jump = 1774746000;
    int64_t got[3];
    ticks("0 30 2 * * *", tz, jump - 3600, got, 3);
    cr_assert_eq(got[0], jump); /* 02:30 does not exist: at the jump, 03:00 CEST */
    cr_assert_eq(got[1], 1774830600); /* 2026-03-30 02:30 CEST = 00:30Z */
    cr_assert_eq(got[2], 1774830600 + 86400);
    /* Hourly: 02:00 is folded into the jump, and 03:00 is that same
     * instant: one tick, none doubled, none lost. */
    int64_t h[4];
    ticks("0 * * * *", tz, jump - 2 * 3600 - 1, h, 4);
    cr_assert_eq(h[0], jump - 2 * 3600); /* 00:00 CET */
    cr_assert_eq(h[1], jump - 3600);     /* 01:00 CET */
    cr_assert_eq(h[2], jump);            /* 03:00 CEST */
    cr_assert_eq(h[3], jump + 3600);     /* 04:00 CEST */
    /* Every minute through the gap: the skipped hour's minutes are one
     * tick at the jump, then 03:01. */
    ticks("* * * * *", tz, jump - 61, h, 4);
    cr_assert_eq(h[0], jump - 60); /* 01:59 CET */
    cr_assert_eq(h[1], jump);
    cr_assert_eq(h[2], jump + 60);
    capstan__tz_free(tz);
}

/* Berlin, 2026-10-25: clocks go from 03:00 CEST back to 02:00 CET at
 * 01:00Z; the hour 02:00-03:00 occurs twice and ticks once, the first
 * time. */
Test(cron, dst_repeat_ticks_once)
{
    capstan_tz_t *tz = zone("Europe/Berlin");
    const int64_t back = 1792890000;
    int64_t got[2];
    ticks("0 30 2 * * *", tz, back - 3 * 3600, got, 2);
    cr_assert_eq(got[0], 1792888200); /* 02:30 CEST = 00:30Z */
    cr_assert_eq(got[1], 1792978200); /* the next day's 02:30 CET, not 01:30Z today */
    int64_t h[4];
    ticks("0 * * * *", tz, back - 2 * 3600 - 1, h, 4);
    cr_assert_eq(h[0], back - 2 * 3600); /* 01:00 CEST */
    cr_assert_eq(h[1], back - 3600);     /* 02:00 CEST */
    cr_assert_eq(h[2], back + 3600);     /* 03:00 CET: 02:00 CET is not run again */
    cr_assert_eq(h[3], back + 7200);
    /* Started inside the repeated hour (its second pass), nothing ticks
     * until the wall clock passes it. */
    ticks("*/10 * * * *", tz, back + 5 * 60, h, 1);
    cr_assert_eq(h[0], back + 3600);
    capstan__tz_free(tz);
}

/* Zone files under $TZDIR: a copy of Europe/Berlin loads from there; one
 * cut short anywhere (its footer too: it was read as the part that was
 * left) or with a broken header is said to be corrupt, not missing. */
Test(cron, corrupt_zone_files_are_refused_as_corrupt)
{
    static unsigned char berlin[1 << 16];
    FILE *f = fopen("/usr/share/zoneinfo/Europe/Berlin", "rb");
    cr_assert(f);
    size_t n = fread(berlin, 1, sizeof(berlin), f);
    fclose(f);
    size_t footer = n - 1; /* the newline opening the footer */
    while (footer > 0 && berlin[footer - 1] != '\n')
        footer--;
    cr_assert(n > 100 && footer > 1 && berlin[n - 1] == '\n');
    footer--;
    unsigned char header[1 << 16];
    memcpy(header, berlin, n);
    header[0] = 'X';
    const struct { const char *name; const unsigned char *data; size_t len; } files[] = {
        { "Good", berlin, n }, { "Half", berlin, n / 2 }, { "NoFooter", berlin, footer },
        { "OpenFooter", berlin, n - 1 }, { "Header", header, n }, { "Empty", berlin, 0 },
    };
    char dir[] = "/tmp/capstan-test-tzdir-XXXXXX", p[512], err[CAPSTAN_ERRLEN];
    cr_assert(mkdtemp(dir));
    for (size_t i = 0; i < sizeof(files) / sizeof(*files); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[i].name);
        f = fopen(p, "wb");
        cr_assert(f);
        cr_assert_eq(fwrite(files[i].data, 1, files[i].len, f), files[i].len);
        fclose(f);
    }
    setenv("TZDIR", dir, 1);
    capstan_tz_t *good = zone("Good");
    cr_assert_eq(capstan__tz_offset(good, 1768435200), 3600);
    cr_assert_eq(capstan__tz_offset(good, 2216250000), 7200); /* its footer's rule */
    capstan__tz_free(good);
    for (size_t i = 1; i < sizeof(files) / sizeof(*files); i++) {
        err[0] = '\0';
        cr_assert_null(capstan__tz_load(files[i].name, err), "%s loaded", files[i].name);
        snprintf(p, sizeof(p), "time zone %s: %s/%s is corrupt (not a whole TZif file)", files[i].name, dir,
                 files[i].name);
        cr_assert_str_eq(err, p);
    }
    cr_assert_null(capstan__tz_load("Missing", err));
    snprintf(p, sizeof(p), "unknown time zone Missing (no TZif file %s/Missing)", dir);
    cr_assert_str_eq(err, p);
    unsetenv("TZDIR");
    for (size_t i = 0; i < sizeof(files) / sizeof(*files); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[i].name);
        unlink(p);
    }
    rmdir(dir);
}

/* @every DURATION ticks on multiples of it since the epoch, so every
 * process computes the same instants, in any zone. */
Test(cron, every_duration_ticks_on_its_multiples_since_the_epoch)
{
    const int64_t t = 1795687627; /* 2026-11-26T10:07:07Z */
    int64_t got[3];
    ticks("@every 30s", NULL, t, got, 3);
    cr_assert_eq(got[0], 1795687650);
    cr_assert_eq(got[1], 1795687680);
    cr_assert_eq(got[2], 1795687710);
    capstan_tz_t *berlin = zone("Europe/Berlin");
    ticks("@every 1h30m", berlin, t, got, 2);
    capstan__tz_free(berlin);
    cr_assert_eq(got[0] % 5400, 0);
    cr_assert(got[0] > t && got[0] - t <= 5400);
    cr_assert_eq(got[1] - got[0], 5400);
    ticks("@every 1", NULL, t, got, 2);
    cr_assert_eq(got[0], t + 1);
    int64_t s;
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__cron_duration("2d", &s, err), 0);
    cr_assert_eq(s, 2 * 86400);
    cr_assert_eq(capstan__cron_duration("1w1d1h1m1s", &s, err), 0);
    cr_assert_eq(s, 7 * 86400 + 86400 + 3600 + 61);
    const struct { const char *text, *why; } bad[] = {
        { "", "an empty duration" },
        { "1M", "months and years have no fixed length" },
        { "1y", "months and years have no fixed length" },
        { "5x", "not a duration" },
        { "m", "not a duration" },
        { "0s", "at least a second" },
        { "99999999999s", "too long" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        cr_expect_eq(capstan__cron_duration(bad[i].text, &s, err), CAPSTAN_ECONFIG, "%s", bad[i].text);
        cr_expect(strstr(err, bad[i].why), "%s: %s", bad[i].text, err);
    }
    capstan_cron_t c;
    cr_assert_eq(capstan__cron_parse("@every 10q", &c, err), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, "not a duration"), "%s", err);
}
