/* Internal: kiq's Lua scripts (lua/, compiled into the library) and how
 * they are run. Not part of the public API: the scripts' keys and
 * arguments change with kiq. */
#ifndef KIQ_REDIS_SCRIPTS_H
#define KIQ_REDIS_SCRIPTS_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "kiq/redis.h"
#include "lua/kiq_lua.h" /* kiq_script_t, generated from lua/meson.build */

/* Runs script s with nkeys keys followed by the other args. Same reply
 * rules as kiq_redis_cmd. */
redisReply *kiq__redis_script(kiq_redis_t *r, kiq_script_t s, int nkeys, int argc,
                             const char **argv, const size_t *lens);

/* Appends script s to the pipeline as EVALSHA (see kiq_redis_append);
 * kiq_redis_get_reply reads its reply. A NOSCRIPT reply makes the
 * connection load the scripts again before its next command. */
int kiq__redis_append_script(kiq_redis_t *r, kiq_script_t s, int nkeys, int argc,
                            const char **argv, const size_t *lens);

/* Which master r was made to, as a count of the masters this process has
 * seen replaced (a READONLY on a plain URL, another master named by the
 * sentinels): what a job wrote through a connection of one era may be lost
 * with that master, so its ack does not go to another (runtime/feed.c). */
int kiq_redis_era(const kiq_redis_t *r);

/* Writes the commands appended so far without reading a reply (their
 * replies are read later with kiq_redis_get_reply). Returns 0 or
 * KIQ_EREDIS. */
int kiq__redis_flush(kiq_redis_t *r);

/* A script call that rides a round trip made for something else (see
 * kiq__fetch_exchange_calls): its reply, owned by the caller, is NULL when
 * the round trip failed. */
typedef struct kiq_script_call {
    kiq_script_t script;
    int nkeys, argc;
    const char **argv;
    redisReply *reply;
} kiq_script_call_t;

/* The text of a script, and its SHA1 as Redis reported it (NULL until a
 * connection has loaded the scripts). */
const char *kiq_script_text(kiq_script_t s);
const char *kiq_script_sha(kiq_script_t s);

/* Records the SHA1 (40 hex chars) SCRIPT LOAD returned for s. */
void kiq_script_learn_sha(kiq_script_t s, const char *sha, size_t len);

#endif
