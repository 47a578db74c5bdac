/* Error codes shared by every capstan module.
 *
 * A library function returns 0 on success or one of the negative CAPSTAN_E* codes
 * below; where a caller needs detail, the function also fills a caller-owned
 * buffer of CAPSTAN_ERRLEN bytes. Nothing in the library exits or aborts on bad
 * input. */
#ifndef CAPSTAN_ERROR_H
#define CAPSTAN_ERROR_H

#include <stddef.h>

#define CAPSTAN_API __attribute__((visibility("default")))

#define CAPSTAN_ERRLEN 256

enum capstan_error {
    CAPSTAN_OK = 0,
    CAPSTAN_EINVAL = -1, /* bad argument or malformed input */
    CAPSTAN_ENOMEM = -2, /* allocation failed */
    CAPSTAN_EREDIS = -3, /* Redis connection or I/O error */
    CAPSTAN_EREPLY = -4, /* Redis answered with an error or an unexpected type */
    CAPSTAN_EPARSE = -5, /* JSON or YAML could not be parsed */
    CAPSTAN_ENOTFOUND = -6, /* no such key, class, file or handler */
    CAPSTAN_ECONFIG = -7, /* configuration value out of range */
    CAPSTAN_EJOB = -8,  /* a job handler reported failure */
    CAPSTAN_ESYS = -9,  /* a system call failed (errno has the detail) */
    CAPSTAN_EDENIED = -10, /* a lock or push was refused */
};

/* Returns a static English description of code; never NULL. */
CAPSTAN_API const char *capstan_strerror(int code);

/* Formats into buf (CAPSTAN_ERRLEN bytes, may be NULL) and returns code, so that
 * `return capstan_seterr(err, CAPSTAN_EINVAL, "bad %s", x);` reads naturally. */
CAPSTAN_API int capstan_seterr(char *buf, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
