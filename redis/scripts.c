/* The Lua scripts compiled into the library, and their SHA1 digests for
 * EVALSHA as Redis reported them when it loaded them (every connection
 * loads them all first), so capstan needs no hash code of its own. */
#include "redis/scripts.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

static char shas[CAPSTAN_SCRIPT_COUNT][41];
static atomic_int known[CAPSTAN_SCRIPT_COUNT];
static pthread_mutex_t shas_lock = PTHREAD_MUTEX_INITIALIZER;

const char *capstan__script_text(capstan_script_t s)
{
    return (unsigned)s < CAPSTAN_SCRIPT_COUNT ? capstan__lua_texts[s] : NULL;
}

const char *capstan__script_sha(capstan_script_t s)
{
    if ((unsigned)s >= CAPSTAN_SCRIPT_COUNT || !atomic_load(&known[s]))
        return NULL;
    return shas[s];
}

void capstan__script_learn_sha(capstan_script_t s, const char *sha, size_t len)
{
    if ((unsigned)s >= CAPSTAN_SCRIPT_COUNT || len != 40)
        return;
    pthread_mutex_lock(&shas_lock);
    if (!atomic_load(&known[s])) {
        memcpy(shas[s], sha, 40);
        shas[s][40] = '\0';
        atomic_store(&known[s], 1);
    }
    pthread_mutex_unlock(&shas_lock);
}
