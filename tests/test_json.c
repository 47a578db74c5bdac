/* The payload scanner: accepts what JSON allows (big integers included),
 * refuses the rest, and finds top-level members without converting them. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "support/buf.h"
#include "support/fmt.h"
#include "support/json.h"
#include "capstan/error.h"

static int valid(const char *s)
{
    return capstan__json_validate(s, strlen(s), NULL) == 0;
}

Test(json, accepts_every_json_value_kind)
{
    cr_assert(valid("{\"a\":[1,-2.5e+3,true,false,null,\"x\\u00e9\\n\"],\"b\":{}}"));
    cr_assert(valid(" [ ] "));
    cr_assert(valid("123456789012345678901234567890"));
}

Test(json, refuses_malformed_text)
{
    const char *bad[] = { "", "{", "{\"a\":}", "{\"a\" 1}", "[1,]", "{\"a\":1,}", "01", "1.",
                          "\"abc", "{\"a\":tru}", "{} x", "\"\\x\"", "\"a\tb\"", "[1 2]" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert(!valid(bad[i]), "accepted: %s", bad[i]);
}

Test(json, error_names_the_byte_offset)
{
    char err[CAPSTAN_ERRLEN];
    cr_assert_eq(capstan__json_validate("{\"a\":x}", 7, err), CAPSTAN_EPARSE);
    cr_assert(strstr(err, "byte 5"), "%s", err);
}

/* Strings are skipped 8 bytes at a time: what ends one is found wherever
 * it lies in such a stretch, and so is the byte an error names. */
Test(json, long_strings_end_and_fail_where_their_bytes_say)
{
    cr_assert(valid("[\"0123456789abcdef\",\"0123456\\\"789abcdef\\\\\",\"\\u00e9 !#~\x7f\xc3\xa9\"]"));
    char err[CAPSTAN_ERRLEN];
    const char *ctl = "[\"0123456789ab\x01" "cdef\"]";
    cr_assert_eq(capstan__json_validate(ctl, strlen(ctl), err), CAPSTAN_EPARSE);
    cr_assert(strstr(err, "byte 14: control character"), "%s", err);
    const char *open = "[\"0123456789abcdefghij";
    cr_assert_eq(capstan__json_validate(open, strlen(open), err), CAPSTAN_EPARSE);
    cr_assert(strstr(err, "byte 22: unterminated string"), "%s", err);
}

/* A value may lie inside 512 containers, not more. */
Test(json, nesting_stops_past_512)
{
    char s[2 * 513 + 1];
    for (int deep = 512; deep <= 513; deep++) {
        memset(s, '[', (size_t)deep);
        s[deep] = '1';
        memset(s + deep + 1, ']', (size_t)deep);
        int rc = capstan__json_validate(s, 2 * (size_t)deep + 1, NULL);
        cr_assert_eq(rc, deep == 512 ? 0 : CAPSTAN_EPARSE, "%d deep", deep);
    }
}

Test(json, scan_keeps_member_text_byte_exact)
{
    const char *s = "{\"args\":[123456789012345678901234567890,1.50],\"class\":\"A\",\"class\":\"B\"}";
    capstan_jobject_t o = {0};
    cr_assert_eq(capstan__json_scan_object(s, strlen(s), &o, NULL), 0);
    cr_assert_eq(o.n, 3);
    const capstan_jmember_t *a = capstan__jobject_get(&o, s, "args");
    cr_assert_not_null(a);
    cr_assert_eq(a->vlen, strlen("[123456789012345678901234567890,1.50]"));
    cr_assert(strncmp(s + a->vstart, "[123456789012345678901234567890,1.50]", a->vlen) == 0);
    const capstan_jmember_t *c = capstan__jobject_get(&o, s, "class");
    cr_assert(strncmp(s + c->vstart, "\"B\"", c->vlen) == 0, "the last duplicate wins");
    cr_assert_null(capstan__jobject_get(&o, s, "jid"));
    capstan__jobject_free(&o);
}

Test(json, scan_refuses_non_objects)
{
    capstan_jobject_t o = {0};
    cr_assert_eq(capstan__json_scan_object("[1]", 3, &o, NULL), CAPSTAN_EPARSE);
    capstan__jobject_free(&o);
}

Test(json, string_dup_decodes_escapes_and_surrogates)
{
    const char *v = "\"a\\\"b\\\\c\\u00e9\\ud83d\\ude00\"";
    char *s = capstan__json_string_dup(v, strlen(v));
    cr_assert_str_eq(s, "a\"b\\c\xc3\xa9\xf0\x9f\x98\x80");
    free(s);
    cr_assert_null(capstan__json_string_dup("12", 2));
}

Test(json, quote_escapes_and_replaces_invalid_utf8)
{
    capstan_buf_t b = {0};
    const char in[] = "a\"b\n\x01\xff\xc3\xa9";
    cr_assert_eq(capstan__json_quote(&b, in, sizeof(in) - 1), 0);
    cr_assert_str_eq(b.p, "\"a\\\"b\\n\\u0001\xef\xbf\xbd\xc3\xa9\"");
    cr_assert(valid(b.p));
    capstan__buf_free(&b);
    cr_assert(capstan__utf8_valid("\xc3\xa9", 2));
    cr_assert(!capstan__utf8_valid("\xc3", 1));
    cr_assert(!capstan__utf8_valid("\xed\xa0\x80", 3), "surrogates are not UTF-8");
}

/* The text the hot path writes without printf (support/fmt.h) is the text
 * printf writes: lock scores and metadata times, lengths in commands. */
Test(fmt, numbers_read_as_printf_writes_them)
{
    char a[64], b[64];
    const unsigned long long u[] = { 0, 7, 10, 999999, 18446744073709551615ULL };
    for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++) {
        snprintf(b, sizeof(b), "%llu", u[i]);
        cr_assert_eq(capstan__fmt_uint(a, u[i]), strlen(b));
        cr_assert_str_eq(a, b);
    }
    const long long s[] = { -1, -9223372036854775807LL - 1, 42 };
    for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
        snprintf(b, sizeof(b), "%lld", s[i]);
        cr_assert_eq(capstan__fmt_int(a, s[i]), strlen(b));
        cr_assert_str_eq(a, b);
    }
    /* Exact halves round to even, as printf's; so do values a hair off. */
    const double d[] = { 0, 0.5, 1763880000.123456, 1763880000.0000004, 1763880000.9999996,
                         12.25, -3.5, 1e15, -0.0, 1700000000.0078125, 0.0000005, 2.5e-6,
                         3.5e-6, 0.9999995, 1.0000005, 999999.9999995 };
    for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++) {
        snprintf(b, sizeof(b), "%.6f", d[i]);
        cr_assert_eq(capstan__fmt_fixed(a, sizeof(a), d[i], 6), strlen(b), "%s", b);
        cr_assert_str_eq(a, b);
    }
    const double d3[] = { 0.0625, 0.1875, 1.0005, 2.5e-4, 0, 59.9995, 0.0015 };
    for (size_t i = 0; i < sizeof(d3) / sizeof(d3[0]); i++) {
        snprintf(b, sizeof(b), "%.3f", d3[i]);
        cr_assert_eq(capstan__fmt_fixed(a, sizeof(a), d3[i], 3), strlen(b), "%s", b);
        cr_assert_str_eq(a, b);
    }
    /* Times as the locks write them, and binary fractions (ties). */
    unsigned long long x = 88172645463325252ULL;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double v = i % 2 ? 1.7e9 + (double)(x % 100000000000ULL) / 1e3
                         : (double)(x % 4000000000ULL) + (double)(x >> 54) / 1024.0;
        snprintf(b, sizeof(b), "%.6f", v);
        capstan__fmt_fixed(a, sizeof(a), v, 6);
        cr_assert_str_eq(a, b, "%.17g", v);
        /* And with 3 places, as log lines give a job's seconds. */
        snprintf(b, sizeof(b), "%.3f", v / 1e6);
        capstan__fmt_fixed(a, sizeof(a), v / 1e6, 3);
        cr_assert_str_eq(a, b, "%.17g", v / 1e6);
    }
}

Test(fmt, cat_cuts_as_snprintf_cuts)
{
    char a[8];
    cr_assert_eq(capstan__fmt_cat(a, sizeof(a), "abc", "", "de", NULL), 5);
    cr_assert_str_eq(a, "abcde");
    cr_assert_eq(capstan__fmt_cat(a, sizeof(a), "abcd", "efgh", "ij", NULL), 7);
    cr_assert_str_eq(a, "abcdefg");
    cr_assert_eq(capstan__fmt_cat(a, sizeof(a), NULL), 0);
    cr_assert_str_eq(a, "");
}
