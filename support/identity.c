/* Process identity and hostname. */
#include "support/identity.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/time.h"

void capstan__hostname(char *out, size_t n)
{
    const char *dyno = getenv("DYNO");
    if (dyno && *dyno) {
        snprintf(out, n, "%s", dyno);
        return;
    }
    if (gethostname(out, n) != 0)
        snprintf(out, n, "localhost");
    out[n - 1] = '\0';
}

void capstan__identity_make(char *out, size_t n)
{
    char host[256];
    char hex[13];
    capstan__hostname(host, sizeof(host));
    capstan__random_hex(hex, 6);
    snprintf(out, n, "%s:%d:%s", host, (int)getpid(), hex);
}
