/* The Lua scripts compiled into the library, with their SHA1 digests for
 * EVALSHA, computed when they were compiled in (tools/embed_lua.py), so
 * capstan needs no hash code of its own. */
#include "redis/scripts.h"

const char *capstan__script_text(capstan_script_t s)
{
    return (unsigned)s < CAPSTAN_SCRIPT_COUNT ? capstan__lua_texts[s] : NULL;
}

const char *capstan__script_sha(capstan_script_t s)
{
    return (unsigned)s < CAPSTAN_SCRIPT_COUNT ? capstan__lua_shas[s] : NULL;
}
