/* The redis/ helpers against a real redis-server: the SCAN iterator visits
 * every matching key once across many pages, and a failed command becomes a
 * KIQ_E* code with the reason in err. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "kiq/redis.h"
#include "redis/reply.h"
#include "redis/scan.h"

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

Test(redis, scan_visits_every_matching_key_once)
{
    freeReplyObject(kt_cmd("EVAL %s 0", "for i = 1, 2500 do redis.call('SET', 'scan:k:' .. i, i) "
                                        "redis.call('SET', 'other:' .. i, i) end"));
    kiq_redis_t *r = kt_lib_redis();
    int seen[NKEYS + 1] = {0};
    char err[KIQ_ERRLEN];
    const redisReply *page;
    kiq_scan_t s;
    int pages = 0, more;
    kiq_scan_init(&s, r, NULL, "scan:k:*", 50);
    while ((more = kiq_scan_next(&s, &page, err)) > 0) {
        pages++;
        for (size_t i = 0; i < page->elements; i++) {
            int k = key_index(page->element[i]->str, "scan:k:");
            cr_assert(k > 0, "a key outside the pattern: %s", page->element[i]->str);
            seen[k]++;
        }
    }
    kiq_scan_close(&s);
    cr_assert_eq(more, 0, "%s", err);
    cr_assert_gt(pages, 10, "only %d pages", pages);
    for (int k = 1; k <= NKEYS; k++)
        cr_assert_eq(seen[k], 1, "scan:k:%d seen %d times", k, seen[k]);
    /* Another call after the end stays at the end. */
    cr_assert_eq(kiq_scan_next(&s, &page, err), 0);
    kiq_redis_free(r);
}

Test(redis, zscan_pages_members_and_scores)
{
    freeReplyObject(kt_cmd("EVAL %s 0", "for i = 1, 2500 do "
                                        "redis.call('ZADD', 'z', i, 'm:' .. i) end"));
    kiq_redis_t *r = kt_lib_redis();
    int seen[NKEYS + 1] = {0};
    char err[KIQ_ERRLEN];
    const redisReply *page;
    kiq_scan_t s;
    int pages = 0, more;
    kiq_scan_init(&s, r, "z", NULL, 100);
    while ((more = kiq_scan_next(&s, &page, err)) > 0) {
        pages++;
        cr_assert_eq(page->elements % 2, 0);
        for (size_t i = 0; i + 1 < page->elements; i += 2) {
            int k = key_index(page->element[i]->str, "m:");
            cr_assert(k > 0, "%s", page->element[i]->str);
            cr_assert_eq(atoi(page->element[i + 1]->str), k, "score of m:%d", k);
            seen[k]++;
        }
    }
    kiq_scan_close(&s);
    cr_assert_eq(more, 0, "%s", err);
    cr_assert_gt(pages, 1);
    for (int k = 1; k <= NKEYS; k++)
        cr_assert_eq(seen[k], 1, "m:%d seen %d times", k, seen[k]);
    kiq_redis_free(r);
}

Test(redis, scan_of_the_wrong_type_is_a_reply_error)
{
    freeReplyObject(kt_cmd("SET z text"));
    kiq_redis_t *r = kt_lib_redis();
    char err[KIQ_ERRLEN] = "";
    const redisReply *page;
    kiq_scan_t s;
    kiq_scan_init(&s, r, "z", NULL, 0);
    cr_assert_eq(kiq_scan_next(&s, &page, err), KIQ_EREPLY);
    cr_assert_null(page);
    cr_assert(strncmp(err, "ZSCAN: WRONGTYPE", 16) == 0, "%s", err);
    cr_assert_eq(kiq_scan_next(&s, &page, err), 0, "an error ends the scan");
    kiq_scan_close(&s);
    kiq_redis_free(r);
}

Test(redis, reply_error_says_what_failed)
{
    kiq_redis_t *r = kt_lib_redis();
    char err[KIQ_ERRLEN] = "";
    redisReply *rep = kiq_redis_cmdf(r, "SET onlyonearg");
    cr_assert_eq(rep->type, REDIS_REPLY_ERROR);
    cr_assert_eq(kiq_reply_error(r, rep, "SET", err), KIQ_EREPLY);
    cr_assert_str_eq(err, "SET: ERR wrong number of arguments for 'set' command");
    freeReplyObject(rep);

    rep = kiq_redis_cmdf(r, "INCR n");
    cr_assert_eq(kiq_reply_error(r, rep, "INCR", err), KIQ_EREPLY);
    cr_assert_str_eq(err, "INCR: unexpected reply type 3");
    freeReplyObject(rep);
    cr_assert_eq(kiq_reply_error(r, NULL, "X", NULL), KIQ_EREDIS, "err may be NULL");
    kiq_redis_free(r);

    /* No server at all: the connection's own reason. */
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", kt_free_port());
    r = kiq_redis_new(url, 1, err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_eq(kiq_redis_connect(r), KIQ_EREDIS);
    rep = kiq_redis_cmdf(r, "PING");
    cr_assert_null(rep);
    cr_assert_eq(kiq_reply_error(r, rep, "PING", err), KIQ_EREDIS);
    char want[KIQ_ERRLEN];
    snprintf(want, sizeof(want), "PING: %s", kiq_redis_error(r));
    cr_assert_str_eq(err, want);
    cr_assert_gt(strlen(err), strlen("PING: "));
    kiq_redis_free(r);
}
