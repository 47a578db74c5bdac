/* The Redis URL parser and the redaction used when a URL is shown: any
 * text parses or fails cleanly, a parsed URL holds sane fields, and the
 * redacted form hides the password. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/error.h"
#include "capstan/redis.h"
#include "redis/url.h"

#define CHECK(c) ((c) ? (void)0 : abort())

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1);
    CHECK(url != NULL);
    memcpy(url, data, size);
    url[size] = '\0';

    char err[CAPSTAN_ERRLEN] = "";
    capstan_redis_url_t u;
    if (capstan__redis_url_parse(url, &u, err) == 0) {
        /* A sentinel URL names its master, not a host: discovery fills it. */
        CHECK(u.sentinel || (u.host != NULL) != (u.path != NULL));
        CHECK(u.sentinel || (u.port >= 1 && u.port <= 65535));
        CHECK(u.db >= 0 && u.db <= 100000);
        /* The redacted form (logs, capstan stats, capstan top) never shows the
         * password. Checked when the password is its own raw text (no
         * %-escape in the URL, appears once in it) and cannot reappear
         * across the "***" put in its place. */
        const char *pw = u.password;
        if (pw && strlen(pw) >= 4 && !strchr(url, '%') && !strchr(pw, '*') && strstr(url, pw)
            && !strstr(strstr(url, pw) + 1, pw)) {
            char red[4096];
            capstan__redis_url_redact(url, red, sizeof(red));
            CHECK(!strstr(red, pw));
        }
        capstan__redis_url_clear(&u);
    } else {
        CHECK(err[0] != '\0');
        CHECK(!u.host && !u.path && !u.user && !u.password && !u.sentinel);
    }

    /* Short output buffers truncate, never overrun. */
    char small[8];
    capstan__redis_url_redact(url, small, sizeof(small));
    CHECK(memchr(small, '\0', sizeof(small)) != NULL);
    free(url);
    return 0;
}
