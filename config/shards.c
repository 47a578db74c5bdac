/* The shards: list of a config: its entries' life, and the checks that
 * hold however a shard was given (the file, capstan_config_add_shard). */
#include "config/shards.h"
#include "config/names.h"
#include "periodic/periodic.h"
#include "support/shard_pick.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static void shard_clear(capstan_shard_conf_t *s)
{
    free(s->name);
    free(s->redis_url);
    for (size_t i = 0; i < s->nqueues; i++)
        free(s->queues[i]);
    free(s->queues);
    memset(s, 0, sizeof(*s));
}

void capstan__config_shards_free(capstan_config_t *cfg)
{
    for (size_t i = 0; i < cfg->nshards; i++)
        shard_clear(&cfg->shards[i]);
    free(cfg->shards);
    cfg->shards = NULL;
    cfg->nshards = 0;
}

/* A shard's name is a plain word: it names the shard in logs, metrics
 * labels and the routing hash, which Ruby computes too. */
static int name_check(const char *name, char *err)
{
    if (!name || !*name)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "shards: a shard needs a name");
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-')
            return capstan_seterr(err, CAPSTAN_ECONFIG,
                                  "shards: the name \"%s\" must be letters, digits, _ and - only", name);
    return 0;
}

int capstan_config_add_shard(capstan_config_t *cfg, const char *name, const char *url,
                             const char *const *queues, size_t nqueues, char *err)
{
    int rc = name_check(name, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < cfg->nshards; i++)
        if (!strcmp(cfg->shards[i].name, name))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "shards: %s is given twice", name);
    if (!url || !*url)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "shards: %s needs a redis_url", name);
    for (size_t i = 0; i < nqueues; i++) {
        char why[CAPSTAN_ERRLEN];
        if (capstan__config_queue_name_check(queues[i], why))
            return capstan_seterr(err, CAPSTAN_ECONFIG, "shards: %s: queues: %s", name, why);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(queues[i], queues[j]))
                return capstan_seterr(err, CAPSTAN_ECONFIG, "shards: %s: queue %s is given twice",
                                      name, queues[i]);
    }
    capstan_shard_conf_t s = { .name = strdup(name), .redis_url = strdup(url),
                               .queues = nqueues ? calloc(nqueues, sizeof(char *)) : NULL };
    int ok = s.name && s.redis_url && (!nqueues || s.queues);
    for (size_t i = 0; ok && i < nqueues; i++, s.nqueues++)
        ok = (s.queues[i] = strdup(queues[i])) != NULL;
    capstan_shard_conf_t *grown = ok ? realloc(cfg->shards, (cfg->nshards + 1) * sizeof(*grown)) : NULL;
    if (!grown) {
        shard_clear(&s);
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    }
    grown[cfg->nshards++] = s;
    cfg->shards = grown;
    return 0;
}

int capstan__config_shards_check(capstan_config_t *cfg, char *err)
{
    for (size_t i = 0; i < cfg->nclasses; i++) {
        const char *home = cfg->classes[i].limit_shard;
        size_t k = 0;
        while (home && k < cfg->nshards && strcmp(cfg->shards[k].name, home))
            k++;
        if (home && k == cfg->nshards)
            return capstan_seterr(err, CAPSTAN_ECONFIG, "classes: %s: limit.shard: %s is not a shard of "
                                  "shards:", cfg->classes[i].name, home);
    }
    if (!cfg->nshards)
        return 0;
    if (cfg->redis_url_explicit)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "redis_url: not used with shards: (each shard "
                              "gives its own redis_url)");
    /* Every other reader of one URL (commands, the supervisor's first
     * look) sees the first shard. */
    return capstan_config_set_str(&cfg->redis_url, cfg->shards[0].redis_url)
               ? capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory")
               : 0;
}

/* Shard i's queues as its own list: the names it lists (every queue of
 * cfg when it lists none), each with cfg's weight for it. */
static int shard_queues(const capstan_config_t *cfg, size_t i, capstan_queue_conf_t **out, size_t *n)
{
    const capstan_shard_conf_t *s = &cfg->shards[i];
    size_t len = s->queues ? s->nqueues : cfg->nqueues;
    capstan_queue_conf_t *q = calloc(len ? len : 1, sizeof(*q));
    if (!q)
        return CAPSTAN_ENOMEM;
    for (size_t k = 0; k < len; k++) {
        const char *name = s->queues ? s->queues[k] : cfg->queues[k].name;
        /* A queue the top-level list does not name: weight 1, or none
         * when no queue has one (strict order). */
        q[k].weight = cfg->strict ? 0 : 1;
        for (size_t j = 0; j < cfg->nqueues; j++)
            if (!strcmp(cfg->queues[j].name, name))
                q[k].weight = cfg->queues[j].weight;
        if (!(q[k].name = strdup(name))) {
            for (size_t j = 0; j < k; j++)
                free(q[j].name);
            free(q);
            return CAPSTAN_ENOMEM;
        }
    }
    *out = q;
    *n = len;
    return 0;
}

static void queues_free(capstan_queue_conf_t *q, size_t n)
{
    for (size_t k = 0; k < n; k++)
        free(q[k].name);
    free(q);
}

int capstan__config_own_shard(capstan_config_t *cfg, size_t i)
{
    capstan_queue_conf_t *q;
    size_t n;
    if (shard_queues(cfg, i, &q, &n))
        return CAPSTAN_ENOMEM;
    queues_free(cfg->queues, cfg->nqueues);
    cfg->queues = q;
    cfg->nqueues = n;
    return 0;
}

long capstan__config_shard_of(const capstan_config_t *cfg, const char *key, int open)
{
    long best = -1;
    uint32_t top = 0;
    size_t len = strlen(key);
    for (size_t i = 0; i < cfg->nshards; i++) {
        if (open && cfg->shards[i].queues)
            continue;
        uint32_t h = capstan__shard_score(cfg->shards[i].name, key, len);
        if (best < 0 || h > top) { /* the first on a tie */
            top = h;
            best = (long)i;
        }
    }
    return best;
}

/* The schedules of cfg whose home is shard i, as an array of their
 * entries, borrowed. */
static int shard_periodic(const capstan_config_t *cfg, size_t i, struct capstan_periodic_conf **out, size_t *n)
{
    *out = calloc(cfg->nperiodic ? cfg->nperiodic : 1, sizeof(**out));
    *n = 0;
    if (!*out)
        return CAPSTAN_ENOMEM;
    for (size_t k = 0; k < cfg->nperiodic; k++)
        if (capstan__config_shard_of(cfg, cfg->periodic[k].name, 0) == (long)i)
            (*out)[(*n)++] = cfg->periodic[k];
    return 0;
}

capstan_config_t *capstan__config_member(const capstan_config_t *cfg, size_t i)
{
    capstan_config_t *m = malloc(sizeof(*m));
    if (!m)
        return NULL;
    /* Every setting is cfg's, borrowed: cfg outlives its members. */
    *m = *cfg;
    m->redis_url = cfg->shards[i].redis_url;
    m->shards = NULL;
    m->nshards = 0;
    if (shard_queues(cfg, i, &m->queues, &m->nqueues)) {
        free(m);
        return NULL;
    }
    if (shard_periodic(cfg, i, &m->periodic, &m->nperiodic)) {
        queues_free(m->queues, m->nqueues);
        free(m);
        return NULL;
    }
    return m;
}

void capstan__config_member_free(capstan_config_t *m)
{
    if (!m)
        return;
    queues_free(m->queues, m->nqueues);
    free(m->periodic);
    free(m);
}

void capstan__config_shards_same_queues(capstan_config_t *cfg)
{
    for (size_t i = 0; i < cfg->nshards; i++) {
        capstan_shard_conf_t *s = &cfg->shards[i];
        for (size_t k = 0; k < s->nqueues; k++)
            free(s->queues[k]);
        free(s->queues);
        s->queues = NULL;
        s->nqueues = 0;
    }
}
