/* The Redis scripts compiled into the library are the lua/ files, byte for
 * byte (after the shared functions they name), in the order of enum
 * capstan_script (both generated from lua/meson.build). */
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

static char *append(char *s, const char *more)
{
    size_t n = strlen(s), m = strlen(more);
    s = realloc(s, n + m + 1);
    cr_assert_not_null(s);
    memcpy(s + n, more, m + 1);
    return s;
}

/* Appends to text the lib/FUNC.lua of each line "-- uses: FUNC" of file,
 * each once (seen: the names taken, space-separated), what a lib uses
 * before it. */
static char *uses(const char *dir, const char *file, char *text, char *seen, size_t cap)
{
    static const char mark[] = "-- uses: ";
    for (const char *l = file; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, mark, sizeof(mark) - 1) != 0)
            continue;
        const char *fn = l + sizeof(mark) - 1;
        char name[64], path[1024];
        snprintf(name, sizeof(name), " %.*s ", (int)strcspn(fn, " \t\n"), fn);
        if (strstr(seen, name))
            continue;
        cr_assert_lt(strlen(seen) + strlen(name), cap);
        strcat(seen, name);
        snprintf(path, sizeof(path), "%s/lib/%.*s.lua", dir, (int)strcspn(fn, " \t\n"), fn);
        char *lib = slurp(path);
        text = append(uses(dir, lib, text, seen, cap), lib);
        free(lib);
    }
    return text;
}

/* What tools/embed_lua.py embeds for script name: the lib/ files it uses
 * (and those they use), then the script's own file. */
static char *embedded(const char *dir, const char *name)
{
    char path[1024], seen[1024] = "";
    snprintf(path, sizeof(path), "%s/%s.lua", dir, name);
    char *file = slurp(path);
    char *text = append(uses(dir, file, calloc(1, 1), seen, sizeof(seen)), file);
    free(file);
    return text;
}

Test(scripts, embedded_text_matches_the_lua_files)
{
    const char *dir = getenv("CAPSTAN_LUA_DIR");
    cr_assert_not_null(dir);
    for (int i = 0; i < CAPSTAN_SCRIPT_COUNT; i++) {
        char *want = embedded(dir, capstan__lua_names[i]);
        cr_assert_str_eq(capstan__script_text((capstan_script_t)i), want, "%s.lua differs", capstan__lua_names[i]);
        free(want);
    }
}

Test(scripts, enum_names_the_scripts_it_indexes)
{
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_FETCH], "fetch");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_ACK], "ack");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_RECOVER], "recover");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_LOCK], "lock");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_UNLOCK], "unlock");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_QLOCK_ACQUIRE], "qlock_acquire");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_REAP], "reap");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_REPLACE], "replace");
    cr_assert_str_eq(capstan__lua_names[CAPSTAN_SCRIPT_ACKS], "acks");
}
