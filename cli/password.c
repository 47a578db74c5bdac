/* Blanks passwords from the command line as the kernel shows it, so a
 * --redis-url with a password does not stay readable by every user. */
#include "cli/password.h"

#include <stdlib.h>
#include <string.h>

const char capstan__cli_password_warning[] =
    "a password on the command line is visible to every user (ps); it was blanked there, but "
    "pass it in REDIS_URL or the config file instead";

/* Set when a password was blanked, for `capstan run` to warn in its log. */
static int had_password;

/* The password of s when it is a redis://, rediss:// or unix:// URL, or a
 * --flag=URL (as url.c reads it: the userinfo up to the last '@', or the
 * password= of a socket URL); its length, 0 when there is none. Other
 * words (a job's arguments) are left alone. */
static size_t password_in(char *s, char **at)
{
    if (strncmp(s, "--", 2) == 0 && strchr(s, '='))
        s = strchr(s, '=') + 1;
    if (strncmp(s, "redis://", 8) != 0 && strncmp(s, "rediss://", 9) != 0
        && strncmp(s, "unix://", 7) != 0)
        return 0;
    char *auth = strstr(s, "://") + 3;
    char *end = strrchr(auth, '@');
    if (end) {
        char *colon = memchr(auth, ':', (size_t)(end - auth));
        *at = colon ? colon + 1 : auth;
        return (size_t)(end - *at);
    }
    char *q = strstr(auth, "password=");
    if (!q)
        return 0;
    *at = q + 9;
    return strcspn(*at, "&");
}

void capstan__cli_hide_passwords(int argc, char **argv)
{
    static char *copies[8]; /* kept for the life of the process */
    static size_t ncopies;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        char *at = NULL;
        size_t len = password_in(argv[i], &at);
        char *copy = len && ncopies < sizeof(copies) / sizeof(copies[0]) ? strdup(argv[i]) : NULL;
        if (!copy)
            continue;
        copies[ncopies++] = copy;
        memset(at, '*', len);
        argv[i] = copy;
        had_password = 1;
    }
}

int capstan__cli_password_hidden(void)
{
    return had_password;
}
