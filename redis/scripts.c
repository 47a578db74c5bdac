/* The Lua scripts compiled into the library, and their SHA1 digests for
 * EVALSHA as Redis reported them when it loaded them (every connection
 * loads them all first), so kiq needs no hash code of its own. */
#include "redis/scripts.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

static char shas[KIQ_SCRIPT_COUNT][41];
static atomic_int known[KIQ_SCRIPT_COUNT];
static pthread_mutex_t shas_lock = PTHREAD_MUTEX_INITIALIZER;

const char *kiq_script_text(kiq_script_t s)
{
    return (unsigned)s < KIQ_SCRIPT_COUNT ? kiq_lua_texts[s] : NULL;
}

const char *kiq_script_sha(kiq_script_t s)
{
    if ((unsigned)s >= KIQ_SCRIPT_COUNT || !atomic_load(&known[s]))
        return NULL;
    return shas[s];
}

void kiq_script_learn_sha(kiq_script_t s, const char *sha, size_t len)
{
    if ((unsigned)s >= KIQ_SCRIPT_COUNT || len != 40)
        return;
    pthread_mutex_lock(&shas_lock);
    if (!atomic_load(&known[s])) {
        memcpy(shas[s], sha, 40);
        shas[s][40] = '\0';
        atomic_store(&known[s], 1);
    }
    pthread_mutex_unlock(&shas_lock);
}
