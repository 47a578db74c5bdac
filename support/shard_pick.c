/* Rendezvous hashing of keys over shard names (see shard_pick.h). */
#include "support/shard_pick.h"

#include <string.h>

uint32_t capstan__crc32(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *b = p;
    crc = ~crc;
    while (n--) {
        crc ^= *b++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* MurmurHash3's 32-bit finalizer. A CRC is linear: two shards' CRCs of
 * "name:key" differ by a constant XOR for every key of a length, so
 * comparing them raw lets one shard win far more than its share (of
 * three shards, one took half the keys); mixed, each takes its share. */
static uint32_t mix(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

uint32_t capstan__shard_score(const char *name, const char *key, size_t len)
{
    uint32_t h = capstan__crc32(0, name, strlen(name));
    h = capstan__crc32(h, ":", 1);
    return mix(capstan__crc32(h, key, len));
}

size_t capstan__shard_pick(const char *const *names, size_t n, const char *key, size_t len)
{
    size_t best = 0;
    uint32_t top = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t h = capstan__shard_score(names[i], key, len);
        if (i == 0 || h > top) {
            top = h;
            best = i;
        }
    }
    return best;
}
