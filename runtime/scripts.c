/* The Lua scripts compiled into the library, with their SHA1 digests for
 * EVALSHA, computed once. */
#include "kiq/redis.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <openssl/sha.h>

extern const char *const kiq_lua_names[];
extern const char *const kiq_lua_texts[];
extern const size_t kiq_lua_count;

static char shas[KIQ_SCRIPT_COUNT][41];
static pthread_once_t shas_once = PTHREAD_ONCE_INIT;

static void compute_shas(void)
{
    for (size_t i = 0; i < KIQ_SCRIPT_COUNT && i < kiq_lua_count; i++) {
        unsigned char d[SHA_DIGEST_LENGTH];
        SHA1((const unsigned char *)kiq_lua_texts[i], strlen(kiq_lua_texts[i]), d);
        for (int k = 0; k < SHA_DIGEST_LENGTH; k++)
            snprintf(shas[i] + 2 * k, 3, "%02x", d[k]);
    }
}

const char *kiq_script_text(kiq_script_t s)
{
    return (size_t)s < kiq_lua_count ? kiq_lua_texts[s] : NULL;
}

const char *kiq_script_sha(kiq_script_t s)
{
    pthread_once(&shas_once, compute_shas);
    return (unsigned)s < KIQ_SCRIPT_COUNT ? shas[s] : NULL;
}
