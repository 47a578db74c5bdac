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

typedef struct field_def {
    const char *name;
    int lo, hi;
    const char *const *names; /* names[i] is value i + name_base */
    int nnames, name_base;
} field_def_t;

static const field_def_t fields[] = {
    { "seconds", 0, 59, NULL, 0, 0 },
    { "minutes", 0, 59, NULL, 0, 0 },
    { "hours", 0, 23, NULL, 0, 0 },
    { "day of month", 1, 31, NULL, 0, 0 },
    { "month", 1, 12, month_names, 12, 1 },
    { "day of week", 0, 7, day_names, 7, 0 },
};

/* A value (a number or a name) at *s; advances *s. -1 when none. */
static int value(const char **s, const field_def_t *f)
{
    const char *p = *s;
    if (isdigit((unsigned char)*p)) {
        long v = 0;
        while (isdigit((unsigned char)*p) && v < 1000)
            v = v * 10 + (*p++ - '0');
        *s = p;
        return (int)v;
    }
    for (int i = 0; i < f->nnames; i++)
        if (!strncasecmp(p, f->names[i], 3) && !isalpha((unsigned char)p[3])) {
            *s = p + 3;
            return i + f->name_base;
        }
    return -1;
}

static int field_err(char *err, const field_def_t *f, const char *text, const char *why)
{
    return capstan_seterr(err, CAPSTAN_ECONFIG, "%s field \"%s\": %s", f->name, text, why);
}

/* One field's text (NUL-terminated) into mask; *any when it is * or ?. */
static int parse_field(const char *text, const field_def_t *f, uint64_t *mask, int *any, char *err)
{
    *mask = 0;
    *any = !strcmp(text, "*") || !strcmp(text, "?");
    const char *s = text;
    for (;;) {
        int a, b, step = 1, single = 0;
        if (*s == '*' || *s == '?') {
            a = f->lo;
            b = f->hi;
            s++;
        } else {
            if ((a = value(&s, f)) < 0)
                return field_err(err, f, text, "expected a value, *, a range or a list");
            b = a;
            single = *s != '-';
            if (*s == '-') {
                s++;
                if ((b = value(&s, f)) < 0)
                    return field_err(err, f, text, "a range needs an end");
            }
        }
        if (*s == '/') {
            s++;
            if (!isdigit((unsigned char)*s) || (step = value(&s, f)) < 1)
                return field_err(err, f, text, "a step must be a number >= 1");
            if (single)
                b = f->hi; /* a/n: from a to the end */
        }
        if (a < f->lo || b > f->hi || a > f->hi || b < f->lo) {
            char why[64];
            snprintf(why, sizeof(why), "values must be between %d and %d", f->lo, f->hi);
            return field_err(err, f, text, why);
        }
        if (a > b)
            return field_err(err, f, text, "a range must go up");
        for (int v = a; v <= b; v += step)
            *mask |= 1ULL << v;
        if (!*s)
            return 0;
        if (*s++ != ',' || !*s)
            return field_err(err, f, text, "unexpected character");
    }
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
    if (*expr == '@') {
        for (size_t i = 0; i < sizeof(shorthands) / sizeof(*shorthands); i++) {
            size_t n = strlen(shorthands[i].name);
            if (!strncasecmp(expr, shorthands[i].name, n) && !expr[n + strspn(expr + n, " \t")])
                return capstan__cron_parse(shorthands[i].expr, out, err);
        }
        return capstan_seterr(err, CAPSTAN_ECONFIG, "unknown shorthand %s (@yearly, @annually, "
                              "@monthly, @weekly, @daily, @midnight, @hourly)", expr);
    }
    char words[6][64];
    int n = 0;
    for (const char *p = expr; *p;) {
        size_t len = strcspn(p, " \t");
        if (n == 6)
            return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": more than six fields", expr);
        if (len >= sizeof(words[0]))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "\"%s\": a field is too long", expr);
        memcpy(words[n], p, len);
        words[n++][len] = '\0';
        p += len;
        p += strspn(p, " \t");
    }
    if (n != 5 && n != 6)
        return capstan_seterr(err, CAPSTAN_ECONFIG,
                              "\"%s\": expected five fields (minute hour day month weekday) or six "
                              "(seconds first)", expr);
    uint64_t m[6];
    int any[6];
    m[0] = 1; /* five fields: at second 0 */
    any[0] = 0;
    for (int i = 0; i < n; i++) {
        int fi = i + (n == 5);
        if (parse_field(words[i], &fields[fi], &m[fi], &any[fi], err))
            return CAPSTAN_ECONFIG;
    }
    memset(out, 0, sizeof(*out));
    out->sec = m[0];
    out->min = m[1];
    out->hour = (uint32_t)m[2];
    out->dom = (uint32_t)m[3];
    out->mon = (uint16_t)m[4];
    out->dow = (uint8_t)((m[5] | m[5] >> 7) & 0x7f);
    out->dom_any = any[3];
    out->dow_any = any[5];
    return 0;
}

static int day_matches(const capstan_cron_t *c, int64_t days, unsigned mday)
{
    int wd = (int)(((days + 4) % 7 + 7) % 7);
    int dom = (c->dom >> mday) & 1, dow = (c->dow >> wd) & 1;
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
        if (!day_matches(c, days, d)) {
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
