/* The outcome a server chain leaves for its job's ack (middleware/outcome.h). */
#include "middleware/outcome.h"

#include <stdlib.h>

const char *capstan__outcome_release_key(const capstan_outcome_t *o)
{
    capstan_dispose_t d = o->disp;
    if (!o->release_key[0])
        return NULL;
    if (o->release_runtime)
        return o->release_key;
    if ((d == CAPSTAN_DISPOSE_DONE || d == CAPSTAN_DISPOSE_DEFAULT) && o->release_on_done)
        return o->release_key;
    if ((d == CAPSTAN_DISPOSE_DEAD || d == CAPSTAN_DISPOSE_DROP) && o->release_on_death)
        return o->release_key;
    return NULL;
}

void capstan__outcome_clear(capstan_outcome_t *o)
{
    free(o->dpayload);
    o->dpayload = NULL;
}
