/* The capstan binary: the command line with handlers loaded from plugins. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/runtime.h"

/* glibc keeps freed blocks in a cache per thread, up to 7 of each size:
 * with 25 processor threads that held 1.3 MB of a 6.8 MB peak, for no
 * measurable speed. The cache can only be sized from the environment as
 * the process starts, so `capstan run` starts itself again once with it off,
 * unless GLIBC_TUNABLES is set already (then it is the user's choice) or
 * it runs under valgrind (which would lose it). The process keeps its pid;
 * if the new start fails, it goes on as it is. It starts the file itself,
 * not /proc/self/exe: the kernel names a process after the file it starts
 * (ps, top, pgrep -x), and that one is named "exe". */
static void without_thread_caches(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "run";
    const char *preload = getenv("LD_PRELOAD");
    if (getenv("GLIBC_TUNABLES") || (preload && strstr(preload, "vgpreload"))
        || (strcmp(cmd, "run") != 0 && cmd[0] != '-'))
        return;
    char *exe = realpath("/proc/self/exe", NULL);
    if (!exe)
        return;
    if (setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0", 1) == 0) {
        execv(exe, argv);
        unsetenv("GLIBC_TUNABLES");
    }
    free(exe);
}

int main(int argc, char **argv)
{
    without_thread_caches(argc, argv);
    /* Processor threads allocate jobs that others free. glibc's default of
     * an arena per thread (up to 8 a core) keeps each thread's own peak:
     * twice the memory at concurrency 25. Two arenas are plenty for threads
     * that mostly wait on Redis; MALLOC_ARENA_MAX still decides when set. */
    if (!getenv("MALLOC_ARENA_MAX"))
        mallopt(M_ARENA_MAX, 2);
    return capstan_main(argc, argv, NULL);
}
