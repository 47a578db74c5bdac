/* The kiq binary: the command line with handlers loaded from plugins. */
#include <malloc.h>
#include <stdlib.h>

#include "kiq/runtime.h"

int main(int argc, char **argv)
{
    /* Processor threads allocate jobs that others free. glibc's default of
     * an arena per thread (up to 8 a core) keeps each thread's own peak:
     * twice the memory at concurrency 25. Two arenas are plenty for threads
     * that mostly wait on Redis; MALLOC_ARENA_MAX still decides when set. */
    if (!getenv("MALLOC_ARENA_MAX"))
        mallopt(M_ARENA_MAX, 2);
    return kiq_main(argc, argv, NULL);
}
