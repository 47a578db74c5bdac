/* The Redis scripts compiled into the library are the lua/ files, byte for
 * byte, in the order of enum kiq_script (both generated from lua/meson.build). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis/scripts.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return s;
}

Test(scripts, embedded_text_matches_the_lua_files)
{
    const char *dir = getenv("KIQ_LUA_DIR");
    cr_assert_not_null(dir);
    for (int i = 0; i < KIQ_SCRIPT_COUNT; i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s.lua", dir, kiq_lua_names[i]);
        char *file = slurp(path);
        cr_assert_str_eq(kiq_script_text((kiq_script_t)i), file, "%s differs", path);
        free(file);
    }
}

Test(scripts, enum_names_the_scripts_it_indexes)
{
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_FETCH], "fetch");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_ACK], "ack");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_RECOVER], "recover");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_LOCK], "lock");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_UNLOCK], "unlock");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_QLOCK_ACQUIRE], "qlock_acquire");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_REAP], "reap");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_REPLACE], "replace");
    cr_assert_str_eq(kiq_lua_names[KIQ_SCRIPT_ACKS], "acks");
}
