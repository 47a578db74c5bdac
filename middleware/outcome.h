/* What a job's server chain decided for its ack: the disposition, the
 * payload to store, and the uniqueness lock the ack releases. The chain
 * writes it through its invocation (capstan_mw_t's out); the finished job
 * waiting for its ack (feed/feed.h's capstan_done_t) keeps it, and the
 * ack is made of it. Not part of the public API. */
#ifndef CAPSTAN_MIDDLEWARE_OUTCOME_H
#define CAPSTAN_MIDDLEWARE_OUTCOME_H

#include <stddef.h>

#include "capstan/middleware.h"
#include "capstan/unique.h"

typedef struct capstan_outcome {
    capstan_dispose_t disp;
    const char *skipped;         /* why the handler was not run though the
                                    job is finished ("rejected", "skipped",
                                    "rescheduled", "expired"; static), or
                                    NULL: it is not counted as processed */
    double score;
    char *dpayload;              /* owned */
    size_t dlen;

    /* A lock the ack releases for jid, depending on the disposition. */
    char release_key[CAPSTAN_DIGEST_MAX + 16];
    int release_on_done;         /* until_executed: released after success */
    int release_on_death;        /* until_* : released when the job dies */
    int release_type;            /* its capstan_lock_type_t, for the metric */
    int release_runtime;         /* a runtime lock: released whatever the
                                    disposition, the ack written promptly */
    int release_quiet;           /* no one waits for it (no lock_timeout) */
} capstan_outcome_t;

/* The lock the ack of o releases, or NULL. */
const char *capstan__outcome_release_key(const capstan_outcome_t *o);
/* Frees what o owns (the payload to store). */
void capstan__outcome_clear(capstan_outcome_t *o);

#endif
