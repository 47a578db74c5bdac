/* The kiq binary: the command line with handlers loaded from plugins. */
#include "kiq/runtime.h"

int main(int argc, char **argv)
{
    return kiq_main(argc, argv, NULL);
}
