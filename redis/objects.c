/* hiredis's reply objects made with malloc (see objects.h). Each is what
 * hiredis's own would be, field for field, so that freeReplyObject and
 * every reader of a reply see no difference; any other kind of reply
 * (those of RESP3) is left to hiredis's own functions. */
#include "redis/objects.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static redisReplyObjectFunctions fns, own;
static pthread_once_t made = PTHREAD_ONCE_INIT;

/* A zeroed object of type, or NULL. A copy of a zeroed one, not calloc or
 * a memset the compiler would turn into calloc. */
static redisReply *object(int type)
{
    static const redisReply zero;
    redisReply *r = malloc(sizeof(*r));
    if (r) {
        *r = zero;
        r->type = type;
    }
    return r;
}

/* r is the element task->idx of its parent array, when it has one. */
static void *place(const redisReadTask *task, redisReply *r)
{
    if (task->parent)
        ((redisReply *)task->parent->obj)->element[task->idx] = r;
    return r;
}

static void *make_string(const redisReadTask *task, char *str, size_t len)
{
    if (task->type != REDIS_REPLY_STRING && task->type != REDIS_REPLY_STATUS
        && task->type != REDIS_REPLY_ERROR)
        return own.createString(task, str, len);
    redisReply *r = object(task->type);
    char *buf = r ? malloc(len + 1) : NULL;
    if (!buf) {
        free(r);
        return NULL;
    }
    memcpy(buf, str, len);
    buf[len] = '\0';
    r->str = buf;
    r->len = len;
    return place(task, r);
}

#if HIREDIS_MAJOR >= 1
static void *make_array(const redisReadTask *task, size_t elements)
#else
static void *make_array(const redisReadTask *task, int elements)
#endif
{
    if (task->type != REDIS_REPLY_ARRAY)
        return own.createArray(task, elements);
    redisReply *r = object(REDIS_REPLY_ARRAY);
    if (!r)
        return NULL;
    if (elements > 0 && !(r->element = calloc((size_t)elements, sizeof(*r->element)))) {
        free(r);
        return NULL;
    }
    r->elements = elements;
    return place(task, r);
}

static void *make_integer(const redisReadTask *task, long long value)
{
    redisReply *r = object(REDIS_REPLY_INTEGER);
    if (!r)
        return NULL;
    r->integer = value;
    return place(task, r);
}

static void *make_nil(const redisReadTask *task)
{
    redisReply *r = object(REDIS_REPLY_NIL);
    return r ? place(task, r) : NULL;
}

/* hiredis's own functions, as a new reader of its has them. */
static void make_fns(void)
{
    redisReader *rd = redisReaderCreate();
    if (!rd)
        return;
    if (!rd->fn) {
        redisReaderFree(rd);
        return;
    }
    own = *rd->fn;
    redisReaderFree(rd);
    fns = own;
    fns.createString = make_string;
    fns.createArray = make_array;
    fns.createInteger = make_integer;
    fns.createNil = make_nil;
}

void capstan__redis_objects(redisReader *reader)
{
    pthread_once(&made, make_fns);
    /* Only a reader with hiredis's own set: another was chosen on purpose. */
    if (reader && reader->fn && fns.createString && reader->fn->createString == own.createString)
        reader->fn = &fns;
}
