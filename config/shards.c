/* The shards: list of a config: its entries' life, and the checks that
 * hold however a shard was given (the file, capstan_config_add_shard). */
#include "config/shards.h"
#include "config/names.h"

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
