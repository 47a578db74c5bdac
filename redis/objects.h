/* Internal: hiredis's reply objects, made with malloc. */
#ifndef CAPSTAN_REDIS_OBJECTS_H
#define CAPSTAN_REDIS_OBJECTS_H

#include <hiredis/hiredis.h>

/* Has reader make its replies' strings, integers, nils and arrays as
 * hiredis does (freeReplyObject frees them, a caller may take a string's
 * str), but with malloc rather than calloc: glibc's calloc skips the
 * per-thread cache, and a sweep's reply makes a few objects a job. */
void capstan__redis_objects(redisReader *reader);

#endif
