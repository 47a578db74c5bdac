/* The redis/ helpers against a real redis-server: the SCAN iterator visits
 * every matching key once across many pages, a failed command becomes a
 * CAPSTAN_E* code with the reason in err, and a URL's query is read by one rule
 * whatever its scheme. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "capstan/redis.h"
#include "redis/reply.h"
#include "redis/scan.h"
#include "redis/url.h"

TestSuite(redis, .timeout = 60);

#define NKEYS 2500

/* Index of "<prefix><i>" in key, or -1. */
static int key_index(const char *key, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(key, prefix, n) != 0)
        return -1;
    int i = atoi(key + n);
    return i >= 1 && i <= NKEYS ? i : -1;
}

/* Runs the Lua script that writes the data, then scans key (NULL: the key
 * space) for match to the end and checks that each "<prefix><i>", i in
 * 1..NKEYS, came exactly once and nothing else came; pairs: pages hold
 * member, score pairs, the score being i. Returns the number of pages. */
static int scan_all(const char *script, const char *key, const char *match, long count,
                    const char *prefix, int pairs)
{
    freeReplyObject(kt_cmd("EVAL %s 0", script));
    capstan_redis_t *r = kt_lib_redis();
    int seen[NKEYS + 1] = {0};
    char err[CAPSTAN_ERRLEN];
    const redisReply *page;
    capstan_scan_t s;
    int pages = 0, more;
    size_t step = pairs ? 2 : 1;
    capstan__scan_init(&s, r, key, match, count);
    while ((more = capstan__scan_next(&s, &page, err)) > 0) {
        pages++;
        cr_assert_eq(page->elements % step, 0);
        for (size_t i = 0; i < page->elements; i += step) {
            int k = key_index(page->element[i]->str, prefix);
            cr_assert(k > 0, "outside the pattern: %s", page->element[i]->str);
            if (pairs)
                cr_assert_eq(atoi(page->element[i + 1]->str), k, "score of %d", k);
            seen[k]++;
        }
    }
    cr_assert_eq(more, 0, "%s", err);
    /* Another call after the end stays at the end. */
    cr_assert_eq(capstan__scan_next(&s, &page, err), 0);
    capstan__scan_close(&s);
    capstan_redis_free(r);
    for (int k = 1; k <= NKEYS; k++)
        cr_assert_eq(seen[k], 1, "%s%d seen %d times", prefix, k, seen[k]);
    return pages;
}

Test(redis, scan_visits_every_matching_key_once)
{
    int pages = scan_all("for i = 1, 2500 do redis.call('SET', 'scan:k:' .. i, i) "
                         "redis.call('SET', 'other:' .. i, i) end",
                         NULL, "scan:k:*", 50, "scan:k:", 0);
    cr_assert_gt(pages, 10, "only %d pages", pages);
}

Test(redis, zscan_pages_members_and_scores)
{
    int pages = scan_all("for i = 1, 2500 do redis.call('ZADD', 'z', i, 'm:' .. i) end",
                         "z", NULL, 100, "m:", 1);
    cr_assert_gt(pages, 1, "only %d pages", pages);
}

Test(redis, scan_of_the_wrong_type_is_a_reply_error)
{
    freeReplyObject(kt_cmd("SET z text"));
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN] = "";
    const redisReply *page;
    capstan_scan_t s;
    capstan__scan_init(&s, r, "z", NULL, 0);
    cr_assert_eq(capstan__scan_next(&s, &page, err), CAPSTAN_EREPLY);
    cr_assert_null(page);
    cr_assert(strncmp(err, "ZSCAN: WRONGTYPE", 16) == 0, "%s", err);
    cr_assert_eq(capstan__scan_next(&s, &page, err), 0, "an error ends the scan");
    capstan__scan_close(&s);
    capstan_redis_free(r);
}

Test(redis, reply_error_says_what_failed)
{
    capstan_redis_t *r = kt_lib_redis();
    char err[CAPSTAN_ERRLEN] = "";
    redisReply *rep = capstan_redis_cmdf(r, "SET onlyonearg");
    cr_assert_eq(rep->type, REDIS_REPLY_ERROR);
    cr_assert_eq(capstan__reply_error(r, rep, "SET", err), CAPSTAN_EREPLY);
    cr_assert_str_eq(err, "SET: ERR wrong number of arguments for 'set' command");
    freeReplyObject(rep);

    rep = capstan_redis_cmdf(r, "INCR n");
    cr_assert_eq(capstan__reply_error(r, rep, "INCR", err), CAPSTAN_EREPLY);
    cr_assert_str_eq(err, "INCR: unexpected reply type 3");
    freeReplyObject(rep);
    cr_assert_eq(capstan__reply_error(r, NULL, "X", NULL), CAPSTAN_EREDIS, "err may be NULL");
    capstan_redis_free(r);

    /* No server at all: the connection's own reason. */
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", kt_free_port());
    r = capstan_redis_new(url, 1, err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_eq(capstan_redis_connect(r), CAPSTAN_EREDIS);
    rep = capstan_redis_cmdf(r, "PING");
    cr_assert_null(rep);
    cr_assert_eq(capstan__reply_error(r, rep, "PING", err), CAPSTAN_EREDIS);
    char want[CAPSTAN_ERRLEN];
    snprintf(want, sizeof(want), "PING: %s", capstan_redis_error(r));
    cr_assert_str_eq(err, want);
    cr_assert_gt(strlen(err), strlen("PING: "));
    capstan_redis_free(r);
}

/* redis://host:port?db=N used to connect to db 0, the query ignored, while
 * rediss:// refused what it did not know: every scheme now honours the
 * parameters it knows and refuses the others, saying which. */
Test(redis, url_query_parameters_follow_one_rule_on_every_scheme)
{
    const char *base = kt_url(), *slash = strrchr(base, '/');
    char url[128], err[CAPSTAN_ERRLEN];
    snprintf(url, sizeof(url), "%.*s?db=%s", (int)(slash - base), base, slash + 1);
    capstan_redis_t *r = capstan_redis_new(url, 2, err);
    cr_assert_not_null(r, "%s: %s", url, err);
    cr_assert_eq(capstan_redis_connect(r), 0, "%s", capstan_redis_error(r));
    freeReplyObject(capstan_redis_cmdf(r, "SET url-query-db here"));
    capstan_redis_free(r);
    char *got = kt_str("GET url-query-db");
    cr_assert(got && strcmp(got, "here") == 0, "db= in the query of %s was not used", url);
    free(got);

    /* password= is used too: this server has none, and says so to AUTH. */
    snprintf(url, sizeof(url), "%.*s?db=%s&password=not-set", (int)(slash - base), base,
             slash + 1);
    r = capstan_redis_new(url, 2, err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_neq(capstan_redis_connect(r), 0);
    cr_assert(strstr(capstan_redis_error(r), "AUTH refused"), "%s", capstan_redis_error(r));
    cr_assert(strstr(capstan_redis_name(r), "password=***"), "%s", capstan_redis_name(r));
    capstan_redis_free(r);

    capstan_redis_url_t u;
    cr_assert_eq(capstan__redis_url_parse("unix:///run/redis.sock?db=2&password=s%40", &u, err), 0,
                 "%s", err);
    cr_assert_eq(u.db, 2);
    cr_assert_str_eq(u.password, "s@");
    capstan__redis_url_clear(&u);
    cr_assert_eq(capstan__redis_url_parse("rediss://h:6380?db=4&verify=none&password=p", &u, err),
                 0, "%s", err);
    cr_assert(u.db == 4 && u.tls.on && u.tls.verify_none && strcmp(u.password, "p") == 0);
    capstan__redis_url_clear(&u);
    cr_assert_eq(capstan__redis_url_parse("redis://h:6379/?db=5&", &u, err), 0, "%s", err);
    cr_assert_eq(u.db, 5);
    capstan__redis_url_clear(&u);

    static const char *const bad[][2] = {
        { "redis://127.0.0.1:6379?dbb=3", "unknown parameter dbb (known: db, password" },
        { "redis://127.0.0.1:6379/0?x=1", "unknown parameter x (known: db, password" },
        { "unix:///run/redis.sock?db=1&x=1", "unknown parameter x (known: db, password" },
        { "rediss://127.0.0.1:6380/0?x=1", "unknown parameter x (known: db, password, ca_file" },
        { "redis://127.0.0.1:6379/0?ca_file=/etc/ca.pem",
          "ca_file is a TLS setting: it needs a rediss:// URL" },
        { "unix:///run/redis.sock?verify=none", "verify is a TLS setting" },
        { "redis://127.0.0.1:6379/2?db=3", "the database is given twice" },
        { "rediss://127.0.0.1:6380/2?db=2", "the database is given twice" },
        { "redis://:pw@127.0.0.1:6379?password=x", "the password is given twice" },
        { "redis://127.0.0.1:6379?db=x", "bad db number" },
        { "unix:///run/redis.sock?db=", "bad db number" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        err[0] = '\0';
        r = capstan_redis_new(bad[i][0], 1, err);
        cr_assert_null(r, "%s was accepted", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
}
