/* Error codes shared by every kiq module.
 *
 * A library function returns 0 on success or one of the negative KIQ_E* codes
 * below; where a caller needs detail, the function also fills a caller-owned
 * buffer of KIQ_ERRLEN bytes. Nothing in the library exits or aborts on bad
 * input. */
#ifndef KIQ_ERROR_H
#define KIQ_ERROR_H

#include <stddef.h>

#define KIQ_API __attribute__((visibility("default")))

#define KIQ_ERRLEN 256

enum kiq_error {
    KIQ_OK = 0,
    KIQ_EINVAL = -1,    /* bad argument or malformed input */
    KIQ_ENOMEM = -2,    /* allocation failed */
    KIQ_EREDIS = -3,    /* Redis connection or I/O error */
    KIQ_EREPLY = -4,    /* Redis answered with an error or an unexpected type */
    KIQ_EPARSE = -5,    /* JSON or YAML could not be parsed */
    KIQ_ENOTFOUND = -6, /* no such key, class, file or handler */
    KIQ_ECONFIG = -7,   /* configuration value out of range */
    KIQ_EJOB = -8,      /* a job handler reported failure */
    KIQ_ESYS = -9,      /* a system call failed (errno has the detail) */
    KIQ_EDENIED = -10,  /* a lock or push was refused */
};

/* Returns a static English description of code; never NULL. */
KIQ_API const char *kiq_strerror(int code);

/* Formats into buf (KIQ_ERRLEN bytes, may be NULL) and returns code, so that
 * `return kiq_seterr(err, KIQ_EINVAL, "bad %s", x);` reads naturally. */
KIQ_API int kiq_seterr(char *buf, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
