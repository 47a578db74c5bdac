/* TZif (RFC 8536) versions 1 to 4: the 64-bit data block when there is
 * one, and the POSIX TZ string of its footer for instants after the last
 * transition (Debian's "fat" files stop at 2037; a "slim" file has
 * fewer). The footer's rules take the Mm.w.d form every zone in tzdata
 * uses; a zone whose footer has another form keeps its last offset. */
#include "support/tz.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/error.h"

#define MAX_FILE (1 << 20)

typedef struct rule {
    int m, w, d;  /* Mm.w.d: month, week (5 = last), weekday (0 = Sunday) */
    long time;    /* local seconds after midnight */
} rule_t;

struct capstan_tz {
    size_t ntrans, ntypes;
    int64_t *trans;        /* UTC instants, ascending */
    unsigned char *idx;    /* the type in effect from trans[i] */
    long *utoff;           /* per type */
    unsigned char *isdst;
    int has_footer, has_dst;
    long std_off, dst_off; /* seconds east of UTC */
    rule_t start, end;
};

int64_t capstan__days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

void capstan__civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

static int64_t floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* [+-]hh[:mm[:ss]] into seconds; NULL when malformed. */
static const char *posix_time(const char *s, long *out)
{
    int sign = 1;
    if (*s == '+' || *s == '-')
        sign = *s++ == '-' ? -1 : 1;
    if (!isdigit((unsigned char)*s))
        return NULL;
    long v = strtol(s, (char **)&s, 10) * 3600;
    for (long unit = 60; *s == ':' && unit >= 1; unit /= 60) {
        s++;
        if (!isdigit((unsigned char)*s))
            return NULL;
        v += strtol(s, (char **)&s, 10) * unit;
    }
    *out = sign * v;
    return s;
}

static const char *posix_name(const char *s)
{
    if (*s == '<') {
        const char *e = strchr(s, '>');
        return e ? e + 1 : NULL;
    }
    const char *b = s;
    while (isalpha((unsigned char)*s))
        s++;
    return s - b >= 3 ? s : NULL;
}

static const char *posix_rule(const char *s, rule_t *r)
{
    if (*s++ != 'M')
        return NULL;
    char *e;
    r->m = (int)strtol(s, &e, 10);
    if (*e != '.')
        return NULL;
    r->w = (int)strtol(e + 1, &e, 10);
    if (*e != '.')
        return NULL;
    r->d = (int)strtol(e + 1, &e, 10);
    if (r->m < 1 || r->m > 12 || r->w < 1 || r->w > 5 || r->d < 0 || r->d > 6)
        return NULL;
    r->time = 7200;
    s = e;
    if (*s == '/')
        s = posix_time(s + 1, &r->time);
    return s;
}

/* "CET-1CEST,M3.5.0,M10.5.0/3": 0 when understood. */
static int parse_footer(capstan_tz_t *tz, const char *s)
{
    long off;
    if (!(s = posix_name(s)) || !(s = posix_time(s, &off)))
        return -1;
    tz->std_off = -off;
    if (!*s) {
        tz->has_footer = 1;
        return 0;
    }
    if (!(s = posix_name(s)))
        return -1;
    tz->dst_off = tz->std_off + 3600;
    if (*s && *s != ',') {
        if (!(s = posix_time(s, &off)))
            return -1;
        tz->dst_off = -off;
    }
    if (*s++ != ',' || !(s = posix_rule(s, &tz->start)) || *s++ != ',' ||
        !(s = posix_rule(s, &tz->end)) || *s)
        return -1;
    tz->has_footer = tz->has_dst = 1;
    return 0;
}

/* The UTC instant rule r takes effect in year y, its time read in the
 * local time in effect before it (offset before). */
static int64_t rule_at(const rule_t *r, int64_t y, long before)
{
    unsigned dim[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    unsigned last = dim[r->m - 1] + (r->m == 2 && y % 4 == 0 && (y % 100 != 0 || y % 400 == 0));
    int64_t first = capstan__days_from_civil(y, (unsigned)r->m, 1);
    int wd = (int)(((first + 4) % 7 + 7) % 7);
    unsigned day = 1 + (unsigned)((r->d - wd + 7) % 7) + (unsigned)(r->w - 1) * 7;
    while (day > last)
        day -= 7;
    return (first + day - 1) * 86400 + r->time - before;
}

static long footer_offset(const capstan_tz_t *tz, int64_t t)
{
    if (!tz->has_dst)
        return tz->std_off;
    int64_t y;
    unsigned m, d;
    capstan__civil_from_days(floor_div(t + tz->std_off, 86400), &y, &m, &d);
    int64_t s = rule_at(&tz->start, y, tz->std_off), e = rule_at(&tz->end, y, tz->dst_off);
    int dst = s < e ? (t >= s && t < e) : (t < e || t >= s);
    return dst ? tz->dst_off : tz->std_off;
}

long capstan__tz_offset(const capstan_tz_t *tz, int64_t t)
{
    if (!tz)
        return 0;
    if (tz->ntrans == 0 || t < tz->trans[0]) {
        if (tz->ntrans == 0 && tz->has_footer)
            return footer_offset(tz, t);
        for (size_t i = 0; i < tz->ntypes; i++)
            if (!tz->isdst[i])
                return tz->utoff[i];
        return tz->ntypes ? tz->utoff[0] : 0;
    }
    if (t >= tz->trans[tz->ntrans - 1] && tz->has_footer)
        return footer_offset(tz, t);
    size_t lo = 0, hi = tz->ntrans; /* trans[lo] <= t < trans[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (tz->trans[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return tz->utoff[tz->idx[lo]];
}

int64_t capstan__tz_from_wall(const capstan_tz_t *tz, int64_t w)
{
    long before = capstan__tz_offset(tz, w - 86400), after = capstan__tz_offset(tz, w + 86400);
    int64_t best = INT64_MAX;
    long offs[] = { before, after };
    for (int i = 0; i < 2; i++)
        if (w - offs[i] < best && capstan__tz_offset(tz, w - offs[i]) == offs[i])
            best = w - offs[i];
    if (best != INT64_MAX)
        return best;
    /* A gap: clocks went from before to after (after > before). The jump
     * is the first instant whose offset is no longer before's. */
    int64_t lo = w - after, hi = w - before;
    if (lo >= hi)
        return w - before;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (capstan__tz_offset(tz, mid) == before)
            lo = mid;
        else
            hi = mid;
    }
    return hi;
}

/* Reads the data block at p (version 1: 4-byte times, else 8) into tz;
 * returns the bytes it takes, or 0 when the file is short or inconsistent. */
static size_t read_block(capstan_tz_t *tz, const unsigned char *p, size_t len, int tsize)
{
    if (len < 44 || memcmp(p, "TZif", 4) != 0)
        return 0;
    uint64_t isutc = be(p + 20, 4), isstd = be(p + 24, 4), leap = be(p + 28, 4),
             timecnt = be(p + 32, 4), typecnt = be(p + 36, 4), charcnt = be(p + 40, 4);
    if (typecnt == 0 || typecnt > 256 || timecnt > 100000 || leap > 100000 || charcnt > 100000 ||
        isutc > 256 || isstd > 256)
        return 0;
    size_t need = 44 + timecnt * (size_t)tsize + timecnt + typecnt * 6 + charcnt +
                  leap * (size_t)(tsize + 4) + isstd + isutc;
    if (need > len)
        return 0;
    const unsigned char *q = p + 44;
    free(tz->trans);
    free(tz->idx);
    free(tz->utoff);
    free(tz->isdst);
    tz->trans = malloc((timecnt ? timecnt : 1) * sizeof(int64_t));
    tz->idx = malloc(timecnt ? timecnt : 1);
    tz->utoff = malloc(typecnt * sizeof(long));
    tz->isdst = malloc(typecnt);
    if (!tz->trans || !tz->idx || !tz->utoff || !tz->isdst)
        return 0;
    for (size_t i = 0; i < timecnt; i++, q += tsize) {
        uint64_t v = be(q, tsize);
        tz->trans[i] = tsize == 4 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
    }
    for (size_t i = 0; i < timecnt; i++) {
        tz->idx[i] = *q++;
        if (tz->idx[i] >= typecnt)
            return 0;
    }
    for (size_t i = 0; i < typecnt; i++, q += 6) {
        tz->utoff[i] = (long)(int32_t)(uint32_t)be(q, 4);
        tz->isdst[i] = q[4];
    }
    tz->ntrans = timecnt;
    tz->ntypes = typecnt;
    return need;
}

static int valid_name(const char *name)
{
    if (!*name || *name == '/' || strstr(name, ".."))
        return 0;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/_+-", *p))
            return 0;
    return 1;
}

/* Reads a whole TZif file into tz: 0, or -1 when it is truncated or
 * inconsistent. From version 2 on, the 64-bit block follows, then a footer
 * framed by newlines (RFC 8536): a file cut anywhere, the footer too, is
 * refused rather than read as the part that is left. */
static int read_tzif(capstan_tz_t *tz, unsigned char *buf, size_t len)
{
    size_t used = read_block(tz, buf, len, 4);
    if (!used)
        return -1;
    if (buf[4] < '2')
        return 0;
    size_t more = read_block(tz, buf + used, len - used, 8);
    if (!more)
        return -1;
    used += more;
    char *end = used + 1 < len && buf[used] == '\n' ? memchr(buf + used + 1, '\n', len - used - 1) : NULL;
    if (!end)
        return -1;
    *end = '\0';
    /* Not understood: the last transition's offset stays. */
    if (buf[used + 1] && parse_footer(tz, (char *)buf + used + 1))
        tz->has_footer = tz->has_dst = 0;
    return 0;
}

capstan_tz_t *capstan__tz_load(const char *name, char *err)
{
    capstan_tz_t *tz = calloc(1, sizeof(*tz));
    if (!tz) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    if (!name || !*name || !strcmp(name, "UTC") || !strcmp(name, "Etc/UTC"))
        return tz; /* no transitions, no types: offset 0 */
    if (!valid_name(name)) {
        capstan_seterr(err, CAPSTAN_ECONFIG, "unknown time zone %s", name);
        free(tz);
        return NULL;
    }
    const char *dir = getenv("TZDIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : "/usr/share/zoneinfo", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR)
            capstan_seterr(err, CAPSTAN_ECONFIG, "unknown time zone %s (no TZif file %s)", name, path);
        else
            capstan_seterr(err, CAPSTAN_ECONFIG, "time zone %s: cannot open %s: %s", name, path,
                           strerror(errno));
        free(tz);
        return NULL;
    }
    unsigned char *buf = malloc(MAX_FILE);
    size_t len = buf ? fread(buf, 1, MAX_FILE, f) : 0;
    int read_errno = ferror(f) ? errno : 0, rc = -1;
    fclose(f);
    if (!buf)
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    else if (read_errno)
        capstan_seterr(err, CAPSTAN_ECONFIG, "time zone %s: cannot read %s: %s", name, path,
                       strerror(read_errno));
    else if ((rc = read_tzif(tz, buf, len)) != 0)
        capstan_seterr(err, CAPSTAN_ECONFIG, "time zone %s: %s is corrupt (not a whole TZif file)",
                       name, path);
    free(buf);
    if (rc) {
        capstan__tz_free(tz);
        return NULL;
    }
    return tz;
}

void capstan__tz_free(capstan_tz_t *tz)
{
    if (!tz)
        return;
    free(tz->trans);
    free(tz->idx);
    free(tz->utoff);
    free(tz->isdst);
    free(tz);
}
