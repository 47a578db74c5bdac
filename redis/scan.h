/* Internal: the SCAN family's cursor loop, one page at a time.
 *
 *     capstan_scan_t s;
 *     capstan__scan_init(&s, r, NULL, "uniquejobs:working:*", 1000);
 *     const redisReply *page;
 *     while ((rc = capstan__scan_next(&s, &page, err)) > 0)
 *         for (size_t i = 0; i < page->elements; i++)
 *             use(page->element[i]->str);
 *     capstan__scan_close(&s);
 *
 * Redis returns every element present for the whole scan at least once (some
 * twice), and a page may be empty before the end. */
#ifndef CAPSTAN_REDIS_SCAN_H
#define CAPSTAN_REDIS_SCAN_H

#include "capstan/redis.h"

typedef struct capstan_scan {
    capstan_redis_t *r;
    const char *key;    /* NULL: SCAN the key space; else ZSCAN this zset */
    const char *match;  /* MATCH pattern, or NULL for all */
    char count[24];     /* COUNT hint, "" for Redis' default */
    char cursor[32];
    int done;           /* the server returned cursor 0 */
    redisReply *reply;  /* the page last returned */
} capstan_scan_t;

/* Starts a scan of the key space (key NULL) or of the zset key (ZSCAN; a
 * page then holds member, score pairs). match and key are borrowed for the
 * life of the scan; count <= 0 leaves the COUNT hint out. */
void capstan__scan_init(capstan_scan_t *s, capstan_redis_t *r, const char *key, const char *match,
                        long count);
/* Runs the next step. Returns 1 with *page (an array reply, valid until the
 * next call or capstan__scan_close) holding its elements, 0 when the scan is
 * complete, or CAPSTAN_EREDIS / CAPSTAN_EREPLY with err filled. */
int capstan__scan_next(capstan_scan_t *s, const redisReply **page, char *err);
void capstan__scan_close(capstan_scan_t *s);

#endif
