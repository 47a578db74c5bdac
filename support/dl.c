#include "support/dl.h"

#include <dlfcn.h>
#include <stdio.h>

void *capstan__dlopen_lib(const char *base, const char *version)
{
    char name[128];
    snprintf(name, sizeof(name), "%s.so.%s", base, version);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(name, sizeof(name), "%s.so", base);
        h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    }
    return h;
}
