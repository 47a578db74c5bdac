/* Periodic jobs: cron schedules whose ticks every capstan process with the
 * schedule tries to enqueue, and exactly one enqueues (one atomic Redis
 * step records the tick and pushes its job). A schedule comes from the
 * periodic: section of the YAML file, or from a program through
 * capstan_periodic_add before capstan_runtime_run:
 *
 *   capstan_periodic_opts_t p = CAPSTAN_PERIODIC_OPTS_INIT;
 *   p.name = "nightly_report";
 *   p.cron = "0 30 2 * * *";        // seconds first; five fields work too
 *   p.tz = "Europe/Berlin";
 *   p.cls = "ReportJob";
 *   p.queue = "reports";
 *   p.args = "[7]";
 *   p.missed = CAPSTAN_MISSED_LAST;
 *   if (capstan_periodic_add(cfg, &p, err) < 0) ...
 *
 * doc/features.md ("Periodic jobs") gives the rules: daylight-saving
 * changes, missed ticks, the jid of a tick. */
#ifndef CAPSTAN_PERIODIC_H
#define CAPSTAN_PERIODIC_H

#include "config.h"
#include "error.h"

/* What becomes of the ticks no process enqueued at their time (every
 * process down, Redis unreachable), once one can: none (SKIP, the
 * default), the latest once (LAST), or each (ALL) of those of the last
 * CAPSTAN_PERIODIC_ALL_WINDOW seconds, at most CAPSTAN_PERIODIC_ALL_MAX of
 * them, the latest. */
typedef enum {
    CAPSTAN_MISSED_SKIP = 0,
    CAPSTAN_MISSED_LAST = 1,
    CAPSTAN_MISSED_ALL = 2
} capstan_missed_t;
#define CAPSTAN_PERIODIC_ALL_WINDOW (24 * 3600)
#define CAPSTAN_PERIODIC_ALL_MAX 100

typedef struct capstan_periodic_opts {
    const char *name;  /* unique among the schedules; names its tick record */
    const char *cron;  /* cron expression (capstan periodic shows the syntax) */
    const char *tz;    /* IANA zone ("Europe/Berlin"); NULL = UTC, "" an error */
    const char *cls;   /* job class */
    const char *queue; /* NULL = "default" */
    const char *args;  /* JSON array text; NULL = [] */
    int retry;         /* CAPSTAN_RETRY_UNSET (true), _DEFAULT, _NONE or a count */
    capstan_missed_t missed;
    const char *extra; /* further job fields as a JSON object text
                          ({"tags":["cron"]}), or NULL */
} capstan_periodic_opts_t;

#define CAPSTAN_PERIODIC_OPTS_INIT \
    { NULL, NULL, NULL, NULL, NULL, NULL, CAPSTAN_RETRY_UNSET, CAPSTAN_MISSED_SKIP, NULL }

/* Adds a schedule (every string copied) to cfg. Returns 0, CAPSTAN_ENOMEM,
 * or CAPSTAN_ECONFIG with err (CAPSTAN_ERRLEN) naming the schedule and what
 * is wrong: a missing name or class, a name given twice, a bad cron
 * expression or one that never fires, an unknown zone, args that are not a
 * JSON array, extra that is not a JSON object. cfg is unchanged on error. */
CAPSTAN_API int capstan_periodic_add(capstan_config_t *cfg, const capstan_periodic_opts_t *o,
                                     char *err);

/* Parses "skip", "last" or "all" into *out. Returns 0 or CAPSTAN_ECONFIG. */
CAPSTAN_API int capstan_periodic_missed(const char *word, capstan_missed_t *out);
/* The word for a policy (static). */
CAPSTAN_API const char *capstan_periodic_missed_name(capstan_missed_t m);

#endif
