/* Error texts for the KIQ_E* codes. */
#include "kiq/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *kiq_strerror(int code)
{
    switch (code) {
    case KIQ_OK: return "success";
    case KIQ_EINVAL: return "invalid argument";
    case KIQ_ENOMEM: return "out of memory";
    case KIQ_EREDIS: return "Redis connection error";
    case KIQ_EREPLY: return "unexpected Redis reply";
    case KIQ_EPARSE: return "parse error";
    case KIQ_ENOTFOUND: return "not found";
    case KIQ_ECONFIG: return "configuration error";
    case KIQ_EJOB: return "job failed";
    case KIQ_ESYS: return "system call failed";
    case KIQ_EDENIED: return "denied";
    default: return "unknown error";
    }
}

int kiq_seterr(char *buf, int code, const char *fmt, ...)
{
    if (buf) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, KIQ_ERRLEN, fmt, ap);
        va_end(ap);
    }
    return code;
}
