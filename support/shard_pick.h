/* The one rule that places a key (a unique digest, a jid, a limiter's or
 * a batch's name) in one shard of a sharded fleet: rendezvous hashing over
 * the shards' names, each scored by MurmurHash3's 32-bit finalizer of the
 * CRC-32 (IEEE, zlib's) of "name:key" and the highest winning, the first
 * on a tie. Adding a shard
 * moves only the keys it now wins. The Ruby module
 * (share/capstan/ruby/capstan_shards.rb) computes the same. Not public. */
#ifndef CAPSTAN_SUPPORT_SHARD_PICK_H
#define CAPSTAN_SUPPORT_SHARD_PICK_H

#include <stddef.h>
#include <stdint.h>

/* zlib's crc32(crc, p, n): pass 0 first, then the last value to go on. */
uint32_t capstan__crc32(uint32_t crc, const void *p, size_t n);

/* Shard name's score for key (key[0..len)): the highest wins. */
uint32_t capstan__shard_score(const char *name, const char *key, size_t len);

/* The index in names[0..n) of key's shard (key[0..len)); 0 when n is 0. */
size_t capstan__shard_pick(const char *const *names, size_t n, const char *key, size_t len);

#endif
