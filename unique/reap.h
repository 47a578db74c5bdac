/* What the uniqueness reaper's files share (unique/reaper.c): the sweep
 * that finds which jids are live anywhere (reap_sweep.c) and the calls on
 * the digest index, reading a page of digests with their holders and
 * removing suspects through reap.lua (reap_digests.c). Internal to
 * unique/. */
#ifndef CAPSTAN_UNIQUE_REAP_H
#define CAPSTAN_UNIQUE_REAP_H

#include <stddef.h>

#include "unique/admin.h"

#define CAPSTAN_REAP_PAGE 500 /* digests read per ZRANGE */

/* A set of jids (open addressing, cap a power of two). */
typedef struct capstan_jidset {
    char **slots;
    size_t cap, n;
} capstan_jidset_t;

/* The sweep of every place a job can be. */
typedef struct capstan_reap_sweep {
    capstan_jidset_t live;
    char **working;  /* working list names, passed on to reap.lua */
    size_t nworking;
    double deadline; /* monotonic */
} capstan_reap_sweep_t;

/* Sweeps, in the order jobs flow, every place a job can be into sw->live.
 * 0 when complete, 1 when sw->deadline passed first, or an error. */
int capstan__reap_sweep_all(capstan_redis_t *r, capstan_reap_sweep_t *sw, char *err);
/* Whether jid was seen by the sweep. */
int capstan__reap_sweep_has(const capstan_reap_sweep_t *sw, const char *jid);
void capstan__reap_sweep_free(capstan_reap_sweep_t *sw);

/* A digest read from uniquejobs:digests, with what its LOCKED hash held. */
typedef struct capstan_reap_cand {
    char *digest;
    char score[64];
    char **jids;
    size_t njids;
    int until_expired; /* some holder's metadata says so */
    int foreign;       /* <digest>:LOCKED is not a hash: not ours to judge */
    long long pttl;
} capstan_reap_cand_t;

void capstan__reap_cand_clear(capstan_reap_cand_t *c);
/* Reads one page of digests after the cursor (score, member), with their
 * LOCKED hashes and TTLs, into cands (CAPSTAN_REAP_PAGE of them). *n gets
 * how many; 0 means the end. */
int capstan__reap_read_page(capstan_redis_t *r, const char *cscore, const char *cmember,
                            capstan_reap_cand_t *cands, size_t *n, char *err);
/* Sends the suspects among cands[from..to) (those marked in suspect) to
 * reap.lua, with the working lists sw found, and records in out what it
 * removed. */
int capstan__reap_flush(capstan_redis_t *r, const capstan_reap_sweep_t *sw,
                        const capstan_reap_cand_t *cands, const int *suspect, size_t from, size_t to,
                        capstan_reap_result_t *out, char *err);

#endif
