/* Error texts for the CAPSTAN_E* codes. */
#include "capstan/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *capstan_strerror(int code)
{
    switch (code) {
    case CAPSTAN_OK: return "success";
    case CAPSTAN_EINVAL: return "invalid argument";
    case CAPSTAN_ENOMEM: return "out of memory";
    case CAPSTAN_EREDIS: return "Redis connection error";
    case CAPSTAN_EREPLY: return "unexpected Redis reply";
    case CAPSTAN_EPARSE: return "parse error";
    case CAPSTAN_ENOTFOUND: return "not found";
    case CAPSTAN_ECONFIG: return "configuration error";
    case CAPSTAN_EJOB: return "job failed";
    case CAPSTAN_ESYS: return "system call failed";
    case CAPSTAN_EDENIED: return "denied";
    default: return "unknown error";
    }
}

int capstan_seterr(char *buf, int code, const char *fmt, ...)
{
    if (buf) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, CAPSTAN_ERRLEN, fmt, ap);
        va_end(ap);
    }
    return code;
}
