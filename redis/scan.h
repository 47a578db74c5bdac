/* Internal: the SCAN family's cursor loop, one page at a time.
 *
 *     kiq_scan_t s;
 *     kiq__scan_init(&s, r, NULL, "uniquejobs:working:*", 1000);
 *     const redisReply *page;
 *     while ((rc = kiq__scan_next(&s, &page, err)) > 0)
 *         for (size_t i = 0; i < page->elements; i++)
 *             use(page->element[i]->str);
 *     kiq__scan_close(&s);
 *
 * Redis returns every element present for the whole scan at least once (some
 * twice), and a page may be empty before the end. */
#ifndef KIQ_REDIS_SCAN_H
#define KIQ_REDIS_SCAN_H

#include "kiq/redis.h"

typedef struct kiq_scan {
    kiq_redis_t *r;
    const char *key;    /* NULL: SCAN the key space; else ZSCAN this zset */
    const char *match;  /* MATCH pattern, or NULL for all */
    char count[24];     /* COUNT hint, "" for Redis' default */
    char cursor[32];
    int done;           /* the server returned cursor 0 */
    redisReply *reply;  /* the page last returned */
} kiq_scan_t;

/* Starts a scan of the key space (key NULL) or of the zset key (ZSCAN; a
 * page then holds member, score pairs). match and key are borrowed for the
 * life of the scan; count <= 0 leaves the COUNT hint out. */
void kiq__scan_init(kiq_scan_t *s, kiq_redis_t *r, const char *key, const char *match,
                   long count);
/* Runs the next step. Returns 1 with *page (an array reply, valid until the
 * next call or kiq__scan_close) holding its elements, 0 when the scan is
 * complete, or KIQ_EREDIS / KIQ_EREPLY with err filled. */
int kiq__scan_next(kiq_scan_t *s, const redisReply **page, char *err);
void kiq__scan_close(kiq_scan_t *s);

#endif
