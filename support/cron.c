/* Cron expressions matched against local wall time: the next matching
 * wall time is found field by field (month, day, hour, minute, second),
 * then turned into a UTC instant through the zone (support/tz.c). */
#include "support/cron.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>

#include "capstan/error.h"

static const char *const month_names[] = { "jan", "feb", "mar", "apr", "may", "jun",
                                           "jul", "aug", "sep", "oct", "nov", "dec" };
static const char *const day_names[] = { "sun", "mon", "tue", "wed", "thu", "fri", "sat" };

typedef enum { PLAIN, DAY_OF_MONTH, DAY_OF_WEEK } field_kind_t;

typedef struct field_def {
    const char *name;
    int lo, hi;
    const char *const *names; /* names[i] is value i + name_base */
    int nnames, name_base;
    field_kind_t kind;
} field_def_t;

static const field_def_t fields[] = {
    { "seconds", 0, 59, NULL, 0, 0, PLAIN },
    { "minutes", 0, 59, NULL, 0, 0, PLAIN },
    { "hours", 0, 23, NULL, 0, 0, PLAIN },
    { "day of month", 1, 31, NULL, 0, 0, DAY_OF_MONTH },
    { "month", 1, 12, month_names, 12, 1, PLAIN },
    { "day of week", 0, 7, day_names, 7, 0, DAY_OF_WEEK },
};

/* What a field adds beside its mask: the day of month's days counted from
 * the end, the day of week's n-th weekdays. */
typedef struct field_extra {
    uint32_t last;
    uint16_t nth[7];
} field_extra_t;

/* A number at *s (at most 1000); advances *s. -1 when none. */
static int number(const char **s)
{
    const char *p = *s;
    if (!isdigit((unsigned char)*p))
        return -1;
    long v = 0;
    while (isdigit((unsigned char)*p) && v < 1000)
        v = v * 10 + (*p++ - '0');
    *s = p;
    return (int)v;
}

/* The word w (case aside) at *s, not followed by a letter; advances *s. */
static int word(const char **s, const char *w)
{
    size_t n = strlen(w);
    if (strncasecmp(*s, w, n) || isalpha((unsigned char)(*s)[n]))
        return 0;
    *s += n;
    return 1;
}

/* L or last at *s, as the day fields write the month's end; advances *s. */
static int last(const char **s)
{
    return word(s, "last") || word(s, "l");
}

/* A value (a number or a name) at *s; advances *s. -1 when none. */
static int value(const char **s, const field_def_t *f)
{
    int v = number(s);
    if (v >= 0)
        return v;
    for (int i = 0; i < f->nnames; i++)
        if (word(s, f->names[i]))
            return i + f->name_base;
    return -1;
}

static int field_err(char *err, const field_def_t *f, const char *text, const char *why)
{
    return capstan_seterr(err, CAPSTAN_ECONFIG, "%s field \"%s\": %s", f->name, text, why);
}

/* The day of month's days from the end at *s: L or last (the last day),
 * -n (the n-th from the end) or -n-L (the last n days), into x->last.
 * Returns 1 when there was one (*s advanced), 0 when not, -1 on error. */
static int days_from_end(const char **s, const field_def_t *f, const char *text, field_extra_t *x,
                         char *err)
{
    const char *p = *s;
    int n = 1, upto = 0;
    if (!strncasecmp(p, "lw", 2))
        return field_err(err, f, text, "W (the nearest weekday) is not supported"), -1;
    if (!last(&p)) {
        if (*p != '-')
            return 0;
        p++;
        if ((n = number(&p)) < 1 || n > 31)
            return field_err(err, f, text, "-n counts days from the month's end: n from 1 to 31"), -1;
        if (*p == '-') {
            p++;
            if (!last(&p))
                return field_err(err, f, text, "-n-L is the month's last n days"), -1;
            upto = 1;
        }
    }
    if (*p == '/' || *p == 'w' || *p == 'W')
        return field_err(err, f, text, "L and -n take no step or W"), -1;
    for (int k = upto ? 1 : n; k <= n; k++)
        x->last |= 1U << k;
    *s = p;
    return 1;
}

/* The day of week's #n after weekday d at *s (just past the '#'): 1 to 5,
 * or -1 to -5, L or last from the end, into x->nth. */
static int nth_weekday(const char **s, int d, const field_def_t *f, const char *text, field_extra_t *x,
                       char *err)
{
    const char *p = *s;
    int from_end = 0, n;
    if (last(&p)) {
        from_end = 1;
        n = 1;
    } else {
        from_end = *p == '-';
        p += from_end;
        n = number(&p);
    }
    if (n < 1 || n > 5)
        return field_err(err, f, text, "d#n is the month's n-th weekday d: n from 1 to 5, or -1 to -5, "
                         "L or last from the end");
    x->nth[d % 7] |= (uint16_t)(1U << (from_end ? 8 + n : n));
    *s = p;
    return 0;
}

/* One field's text (NUL-terminated) into mask and x; *any when it is * or
 * ?. */
static int parse_field(const char *text, const field_def_t *f, uint64_t *mask, field_extra_t *x, int *any,
                       char *err)
{
    *mask = 0;
    memset(x, 0, sizeof(*x));
    *any = !strcmp(text, "*") || !strcmp(text, "?");
    const char *s = text;
    for (;;) {
        int a, b, step = 1, single = 0, done = 0;
        if (f->kind == DAY_OF_MONTH) {
            int r = days_from_end(&s, f, text, x, err);
            if (r < 0)
                return CAPSTAN_ECONFIG;
            done = r;
        }
        if (done) {
            a = b = 0; /* nothing for the mask */
        } else if (*s == '*' || *s == '?') {
            a = f->lo;
            b = f->hi;
            s++;
        } else {
            if ((a = value(&s, f)) < 0)
                return field_err(err, f, text, "expected a value, *, a range or a list");
            b = a;
            single = *s != '-';
            if (*s == '#' && f->kind == DAY_OF_WEEK) {
                s++;
                if (a > f->hi || nth_weekday(&s, a, f, text, x, err))
                    return a > f->hi ? field_err(err, f, text, "values must be between 0 and 7")
                                     : CAPSTAN_ECONFIG;
                done = 1;
            } else if (*s == '-') {
                s++;
                if (f->kind == DAY_OF_MONTH && last(&s))
                    b = f->hi; /* a-L: from a to the month's end */
                else if ((b = value(&s, f)) < 0)
                    return field_err(err, f, text, "a range needs an end");
            }
        }
        if (!done && *s == '/') {
            s++;
            if (!isdigit((unsigned char)*s) || (step = value(&s, f)) < 1)
                return field_err(err, f, text, "a step must be a number >= 1");
            if (single)
                b = f->hi; /* a/n: from a to the end */
        }
        if (done) {
            ;
        } else if (f->kind == DAY_OF_MONTH && (*s == 'w' || *s == 'W')) {
            return field_err(err, f, text, "W (the nearest weekday) is not supported");
        } else if (f->kind == DAY_OF_WEEK && (*s == 'l' || *s == 'L')) {
            return field_err(err, f, text, "for the month's last weekday d write d#L (fri#L)");
        } else if (a < f->lo || b > f->hi || a > f->hi || b < f->lo) {
            char why[64];
            snprintf(why, sizeof(why), "values must be between %d and %d", f->lo, f->hi);
            return field_err(err, f, text, why);
        } else if (a > b) {
            return field_err(err, f, text, "a range must go up");
        } else {
            for (int v = a; v <= b; v += step)
                *mask |= 1ULL << v;
        }
        if (!*s)
            return 0;
        if (*s++ != ',' || !*s)
            return field_err(err, f, text, "unexpected character");
    }
}

/* Whether word, the last of an expression's words, is a zone written after
 * the fields (fugit's "0 9 * * * Europe/Berlin") rather than the day of
 * week: it is no day of week, and it names an area ("Europe/Nowhere":
 * capstan__tz_load then says the zone is unknown) or a zone that exists
 * ("UTC", "Japan"). A mistyped day of week ("Monday") stays the day of
 * week's error. */
static int is_zone(const char *w)
{
    int letter = 0;
    for (const char *p = w; *p; p++) {
        if (!isalnum((unsigned char)*p) && !strchr("/_+-", *p))
            return 0;
        letter |= isalpha((unsigned char)*p);
    }
    uint64_t m;
    field_extra_t x;
    int any;
    char err[CAPSTAN_ERRLEN];
    if (!letter || parse_field(w, &fields[5], &m, &x, &any, err) == 0)
        return 0;
    if (strchr(w, '/'))
        return 1;
    capstan_tz_t *tz = capstan__tz_load(w, err);
    capstan__tz_free(tz);
    return tz != NULL;
}

int capstan__cron_duration(const char *text, int64_t *secs, char *err)
{
    static const struct { char unit; int64_t secs; } units[] = {
        { 's', 1 }, { 'm', 60 }, { 'h', 3600 }, { 'd', 86400 }, { 'w', 7 * 86400 },
    };
    const char *p = text ? text : "";
    int64_t total = 0;
    if (!*p)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "an empty duration");
    while (*p) {
        if (!isdigit((unsigned char)*p))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": not a duration (30s, 5m, 1h30m, 2d, 1w)",
                                  text);
        int64_t n = 0;
        while (isdigit((unsigned char)*p) && n < 100000000)
            n = n * 10 + (*p++ - '0');
        if (isdigit((unsigned char)*p))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": too long", text);
        int64_t unit = 0;
        if (!*p && p > text && total == 0)
            unit = 1; /* a bare number: seconds */
        for (size_t i = 0; *p && i < sizeof(units) / sizeof(*units); i++)
            if (*p == units[i].unit)
                unit = units[i].secs;
        if (!unit)
            return capstan_seterr(err, CAPSTAN_ECONFIG, *p == 'M' || *p == 'y'
                                  ? "\"%s\": months and years have no fixed length; give days or a cron expression"
                                  : "\"%s\": not a duration (30s, 5m, 1h30m, 2d, 1w)", text);
        if (*p)
            p++;
        total += n * unit;
        if (total > 10LL * 366 * 86400)
            return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": longer than ten years", text);
    }
    if (total < 1)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": must be at least a second", text);
    *secs = total;
    return 0;
}

int capstan__cron_parse(const char *expr, capstan_cron_t *out, char *err)
{
    static const struct { const char *name, *expr; } shorthands[] = {
        { "@yearly", "0 0 1 1 *" }, { "@annually", "0 0 1 1 *" }, { "@monthly", "0 0 1 * *" },
        { "@weekly", "0 0 * * 0" }, { "@daily", "0 0 * * *" },   { "@midnight", "0 0 * * *" },
        { "@hourly", "0 * * * *" },
    };
    if (!expr)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "no cron expression");
    while (isspace((unsigned char)*expr))
        expr++;
    char words[7][64];
    int n = 0;
    for (const char *p = expr; *p;) {
        size_t len = strcspn(p, " \t");
        if (n == 7)
            return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": more than six fields", expr);
        if (len >= sizeof(words[0]))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": a field is too long", expr);
        memcpy(words[n], p, len);
        words[n++][len] = '\0';
        p += len;
        p += strspn(p, " \t");
    }
    char zone[64] = "";
    /* A zone follows a shorthand, five fields or six. */
    if ((n == 2 || n == 6 || n == 7) && is_zone(words[n - 1]))
        memcpy(zone, words[--n], sizeof(zone));
    if (n == 2 && !strcasecmp(words[0], "@every") && !*zone) {
        int64_t every;
        if (capstan__cron_duration(words[1], &every, err))
            return CAPSTAN_ECONFIG;
        memset(out, 0, sizeof(*out));
        out->every = every;
        return 0;
    }
    if (n == 1 && *expr == '@') {
        for (size_t i = 0; i < sizeof(shorthands) / sizeof(*shorthands); i++)
            if (!strcasecmp(words[0], shorthands[i].name)) {
                int rc = capstan__cron_parse(shorthands[i].expr, out, err);
                memcpy(out->zone, zone, sizeof(zone));
                return rc;
            }
        return capstan_seterr(err, CAPSTAN_ECONFIG, "unknown shorthand %s (@yearly, @annually, "
                              "@monthly, @weekly, @daily, @midnight, @hourly, @every DURATION)", words[0]);
    }
    if (n == 7)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": more than six fields", expr);
    if (n != 5 && n != 6)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "\"%s\": expected five fields (minute hour day month weekday) or six "
                              "(seconds first), then a zone if any", expr);
    uint64_t m[6];
    field_extra_t x[6];
    int any[6];
    m[0] = 1; /* five fields: at second 0 */
    any[0] = 0;
    for (int i = 0; i < n; i++) {
        int fi = i + (n == 5);
        if (parse_field(words[i], &fields[fi], &m[fi], &x[fi], &any[fi], err))
            return CAPSTAN_ECONFIG;
    }
    memset(out, 0, sizeof(*out));
    out->sec = m[0];
    out->min = m[1];
    out->hour = (uint32_t)m[2];
    out->dom = (uint32_t)m[3];
    out->dom_last = x[3].last;
    out->mon = (uint16_t)m[4];
    out->dow = (uint8_t)((m[5] | m[5] >> 7) & 0x7f);
    memcpy(out->nth, x[5].nth, sizeof(out->nth));
    out->dom_any = any[3];
    out->dow_any = any[5];
    memcpy(out->zone, zone, sizeof(zone));
    return 0;
}

/* Whether day mday of a month of mlen days, days since 1970-01-01,
 * matches. */
static int day_matches(const capstan_cron_t *c, int64_t days, unsigned mday, unsigned mlen)
{
    int wd = (int)(((days + 4) % 7 + 7) % 7);
    unsigned from_end = mlen - mday + 1;
    int dom = ((c->dom >> mday) & 1) || ((c->dom_last >> from_end) & 1);
    int dow = ((c->dow >> wd) & 1) || ((c->nth[wd] >> ((mday - 1) / 7 + 1)) & 1)
              || ((c->nth[wd] >> (8 + (from_end - 1) / 7 + 1)) & 1);
    if (c->dom_any || c->dow_any)
        return dom && dow;
    return dom || dow;
}

static int64_t floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* The first wall time after w that matches, or -1 within ten years. */
static int64_t next_wall(const capstan_cron_t *c, int64_t w)
{
    int64_t s = w + 1, y0;
    unsigned m, d;
    capstan__civil_from_days(floor_div(s, 86400), &y0, &m, &d);
    for (;;) {
        int64_t days = floor_div(s, 86400), y;
        long sod = (long)(s - days * 86400);
        capstan__civil_from_days(days, &y, &m, &d);
        if (y > y0 + 10)
            return -1;
        if (!((c->mon >> m) & 1)) {
            s = capstan__days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1) * 86400;
            continue;
        }
        unsigned mlen = (unsigned)(capstan__days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1)
                                   - capstan__days_from_civil(y, m, 1));
        if (!day_matches(c, days, d, mlen)) {
            s = (days + 1) * 86400;
            continue;
        }
        long h = sod / 3600, mi = sod / 60 % 60, se = sod % 60;
        if (!((c->hour >> h) & 1)) {
            s = days * 86400 + (h + 1) * 3600;
            continue;
        }
        if (!((c->min >> mi) & 1)) {
            s = days * 86400 + h * 3600 + (mi + 1) * 60;
            continue;
        }
        if (!((c->sec >> se) & 1)) {
            s++;
            continue;
        }
        return s;
    }
}

int64_t capstan__cron_next(const capstan_cron_t *c, const capstan_tz_t *tz, int64_t after)
{
    if (c->every > 0) /* floor division: after may be before the epoch */
        return (after >= 0 ? after / c->every : (after - c->every + 1) / c->every) * c->every + c->every;
    int64_t w = after + capstan__tz_offset(tz, after);
    /* A wall time whose first instant is not after `after` was ticked
     * already (the repeated hour after clocks turn back) or was folded
     * into the jump (the skipped hour): the next one is tried. */
    for (int i = 0; i < 200000; i++) {
        if ((w = next_wall(c, w)) < 0)
            return -1;
        int64_t u = capstan__tz_from_wall(tz, w);
        if (u > after)
            return u;
    }
    return -1;
}
