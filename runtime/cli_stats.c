/* `kiq stats`: filled in below. */
#include "cli.h"
#include <stdio.h>
int kiq_cmd_stats(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kiq stats: not yet available\n");
    return 1;
}
