/* Internal: capstan's Lua scripts (lua/, compiled into the library) and how
 * they are run. Not part of the public API: the scripts' keys and
 * arguments change with capstan. */
#ifndef CAPSTAN_REDIS_SCRIPTS_H
#define CAPSTAN_REDIS_SCRIPTS_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "capstan/redis.h"
#include "lua/capstan_lua.h" /* capstan_script_t, generated from lua/meson.build */

/* Runs script s with nkeys keys followed by the other args. Same reply
 * rules as capstan_redis_cmd. */
redisReply *capstan__redis_script(capstan_redis_t *r, capstan_script_t s, int nkeys, int argc,
                                  const char **argv, const size_t *lens);

/* Appends script s to the pipeline as EVALSHA (see capstan_redis_append);
 * capstan_redis_get_reply reads its reply. A NOSCRIPT reply makes the
 * connection load the scripts again before its next command. */
int capstan__redis_append_script(capstan_redis_t *r, capstan_script_t s, int nkeys, int argc,
                                 const char **argv, const size_t *lens);

/* Which master r was made to, as a count of the masters this process has
 * seen replaced (a READONLY on a plain URL, another master named by the
 * sentinels): what a job wrote through a connection of one era may be lost
 * with that master, so its ack does not go to another (feed/acks.c). */
int capstan__redis_era(const capstan_redis_t *r);
/* How many times r was connected: from the second, each was a reconnect. */
long capstan__redis_connects(const capstan_redis_t *r);

/* Through sentinels: asks them which master they name now, and when it is
 * not r's, ends r's era, so every connection of the process reconnects to
 * the new master at its next command (one still taking writes after a
 * SENTINEL FAILOVER, until the sentinels demote it, would otherwise keep
 * the process on it for seconds). Returns 1 when it ended the era, else 0
 * (not through sentinels, none answered, or the same master). */
int capstan__redis_follow_master(capstan_redis_t *r);

/* Redis's clock (TIME), epoch seconds, into *now: the one clock of the
 * fleet, where each host's may be off. Returns 0, CAPSTAN_EREDIS (the
 * connection failed) or CAPSTAN_EREPLY. */
int capstan__redis_time(capstan_redis_t *r, double *now);

/* Writes the commands appended so far without reading a reply (their
 * replies are read later with capstan_redis_get_reply). Returns 0 or
 * CAPSTAN_EREDIS. */
int capstan__redis_flush(capstan_redis_t *r);

/* A script call that rides a round trip made for something else (see
 * capstan__fetch_exchange_calls): its reply, owned by the caller, is NULL when
 * the round trip failed. */
typedef struct capstan_script_call {
    capstan_script_t script;
    int nkeys, argc;
    const char **argv;
    redisReply *reply;
} capstan_script_call_t;

/* The text of a script, and its SHA1 (40 hex characters); NULL for no
 * script. */
const char *capstan__script_text(capstan_script_t s);
const char *capstan__script_sha(capstan_script_t s);

#endif
