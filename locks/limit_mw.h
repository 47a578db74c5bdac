/* The limiter's server middleware (locks/limit_mw.c), which the runtime
 * puts in every server chain. Not part of the public API. */
#ifndef CAPSTAN_LOCKS_LIMIT_MW_H
#define CAPSTAN_LOCKS_LIMIT_MW_H

#include "middleware/mw.h"

/* The "limit" server middleware (locks/limit_mw.c). */
int capstan__limit_mw(capstan_mw_t *mw, void *udata);

#endif
