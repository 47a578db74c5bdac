/* SCAN and ZSCAN cursor loops. */
#include "redis/scan.h"

#include <stdio.h>
#include <string.h>

#include "redis/reply.h"

void capstan__scan_init(capstan_scan_t *s, capstan_redis_t *r, const char *key, const char *match,
                        long count)
{
    memset(s, 0, sizeof(*s));
    s->r = r;
    s->key = key;
    s->match = match;
    if (count > 0)
        snprintf(s->count, sizeof(s->count), "%ld", count);
    strcpy(s->cursor, "0");
}

int capstan__scan_next(capstan_scan_t *s, const redisReply **page, char *err)
{
    freeReplyObject(s->reply);
    s->reply = NULL;
    *page = NULL;
    if (s->done)
        return 0;
    const char *argv[8];
    int argc = 0;
    argv[argc++] = s->key ? "ZSCAN" : "SCAN";
    if (s->key)
        argv[argc++] = s->key;
    argv[argc++] = s->cursor;
    if (s->match) {
        argv[argc++] = "MATCH";
        argv[argc++] = s->match;
    }
    if (*s->count) {
        argv[argc++] = "COUNT";
        argv[argc++] = s->count;
    }
    redisReply *rep = capstan_redis_cmd(s->r, argc, argv, NULL);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2
        || rep->element[0]->type != REDIS_REPLY_STRING
        || rep->element[1]->type != REDIS_REPLY_ARRAY) {
        int rc = capstan__reply_error(s->r, rep, argv[0], err);
        freeReplyObject(rep);
        s->done = 1;
        return rc;
    }
    snprintf(s->cursor, sizeof(s->cursor), "%s", rep->element[0]->str);
    s->done = strcmp(s->cursor, "0") == 0;
    s->reply = rep;
    *page = rep->element[1];
    return 1;
}

void capstan__scan_close(capstan_scan_t *s)
{
    freeReplyObject(s->reply);
    s->reply = NULL;
    s->done = 1;
}
