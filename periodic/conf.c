/* capstan_periodic_add: a schedule checked whole (its expression parsed and
 * seen to fire, its zone loaded, its args and extra fields JSON of the
 * right kind) before it joins the config, so a bad one stops the start. */
#include "periodic/periodic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/cron.h"
#include "support/json.h"
#include "support/time.h"
#include "support/tz.h"

static const char *const missed_names[] = {
    [CAPSTAN_MISSED_SKIP] = "skip", [CAPSTAN_MISSED_LAST] = "last", [CAPSTAN_MISSED_ALL] = "all",
};

int capstan_periodic_missed(const char *word, capstan_missed_t *out)
{
    for (size_t i = 0; i < sizeof(missed_names) / sizeof(*missed_names); i++)
        if (word && !strcmp(word, missed_names[i])) {
            *out = (capstan_missed_t)i;
            return 0;
        }
    return CAPSTAN_ECONFIG;
}

const char *capstan_periodic_missed_name(capstan_missed_t m)
{
    return (unsigned)m < sizeof(missed_names) / sizeof(*missed_names) ? missed_names[m] : "skip";
}

static void conf_clear(struct capstan_periodic_conf *p)
{
    free(p->name);
    free(p->cron);
    free(p->tz);
    free(p->cls);
    free(p->queue);
    free(p->args);
    free(p->extra);
    free(p->origin);
}

void capstan__periodic_conf_free(capstan_config_t *cfg)
{
    for (size_t i = 0; i < cfg->nperiodic; i++)
        conf_clear(&cfg->periodic[i]);
    free(cfg->periodic);
    cfg->periodic = NULL;
    cfg->nperiodic = 0;
}

void capstan__periodic_conf_drop(capstan_config_t *cfg, int gem)
{
    size_t kept = 0;
    for (size_t i = 0; i < cfg->nperiodic; i++)
        if (cfg->periodic[i].gem == gem)
            conf_clear(&cfg->periodic[i]);
        else
            cfg->periodic[kept++] = cfg->periodic[i];
    cfg->nperiodic = kept;
}

static char *dup_or(const char *s, const char *dflt, int *oom)
{
    const char *v = s ? s : dflt;
    char *d = v ? strdup(v) : NULL;
    if (v && !d)
        *oom = 1;
    return d;
}

/* JSON text whose first non-blank byte is open: one value of that kind. */
static int json_of_kind(const char *s, char open)
{
    s += strspn(s, " \t\r\n");
    return *s == open && capstan__json_validate(s, strlen(s), NULL) == 0;
}

capstan_tz_t *capstan__periodic_zone(const capstan_cron_t *c, const char *tz, const char **zone,
                                     const char **bad, char *why)
{
    *bad = "tz";
    if (tz && !*tz) {
        capstan_seterr(why, CAPSTAN_ECONFIG, "is empty (leave it out for UTC)");
        return NULL;
    }
    if (c->zone[0] && tz && strcmp(c->zone, tz)) {
        capstan_seterr(why, CAPSTAN_ECONFIG, "%s differs from the zone cron: names (%s)", tz, c->zone);
        return NULL;
    }
    if (c->zone[0])
        *bad = "cron"; /* "0 9 * * * Europe/Berlin", as fugit reads it */
    *zone = c->zone[0] ? c->zone : tz;
    return capstan__tz_load(*zone, why);
}

int capstan__periodic_add(capstan_config_t *cfg, const capstan_periodic_opts_t *o, const char *origin,
                          char *err)
{
    char why[CAPSTAN_ERRLEN];
    const char *name = o->name ? o->name : "";
    if (!*name)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic: a schedule has no name");
    for (size_t i = 0; i < cfg->nperiodic; i++)
        if (!strcmp(cfg->periodic[i].name, name))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: the name is given twice", name);
    if (!o->cls || !*o->cls)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: class: must be given", name);
    capstan_cron_t c;
    if (capstan__cron_parse(o->cron, &c, why))
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: cron: %s", name, why);
    const char *zone, *bad;
    capstan_tz_t *tz = capstan__periodic_zone(&c, o->tz, &zone, &bad, why);
    if (!tz)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: %s: %s", name, bad, why);
    int64_t next = capstan__cron_next(&c, tz, (int64_t)capstan__now());
    capstan__tz_free(tz);
    if (next < 0)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: cron: \"%s\" never fires", name,
                              o->cron);
    if (o->args && !json_of_kind(o->args, '['))
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: args: must be a JSON array", name);
    if (o->extra && !json_of_kind(o->extra, '{'))
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: options must be a JSON object",
                              name);
    if ((unsigned)o->missed > CAPSTAN_MISSED_ALL)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "periodic %s: missed: must be skip, last or all",
                              name);
    struct capstan_periodic_conf p = { 0 };
    int oom = 0;
    p.name = dup_or(name, NULL, &oom);
    p.cron = dup_or(o->cron, NULL, &oom);
    p.tz = dup_or(zone, NULL, &oom);
    p.cls = dup_or(o->cls, NULL, &oom);
    p.queue = dup_or(o->queue && *o->queue ? o->queue : NULL, "default", &oom);
    p.args = dup_or(o->args, "[]", &oom);
    p.extra = dup_or(o->extra, NULL, &oom);
    p.origin = dup_or(origin, "C", &oom);
    p.retry = o->retry;
    p.missed = o->missed;
    struct capstan_periodic_conf *grown =
        oom ? NULL : realloc(cfg->periodic, (cfg->nperiodic + 1) * sizeof(*grown));
    if (!grown) {
        conf_clear(&p);
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    }
    grown[cfg->nperiodic++] = p;
    cfg->periodic = grown;
    return 0;
}

int capstan_periodic_add(capstan_config_t *cfg, const capstan_periodic_opts_t *o, char *err)
{
    return capstan__periodic_add(cfg, o, NULL, err);
}
