/* The config's shards: list (capstan_shard_conf_t): freeing it, and its
 * check at validation. Not public. */
#ifndef CAPSTAN_CONFIG_SHARDS_H
#define CAPSTAN_CONFIG_SHARDS_H

#include "capstan/config.h"

void capstan__config_shards_free(capstan_config_t *cfg);
/* With shards: no redis_url of its own, and the first shard's URL made
 * cfg->redis_url. 0 or CAPSTAN_ECONFIG/CAPSTAN_ENOMEM with err filled. */
int capstan__config_shards_check(capstan_config_t *cfg, char *err);

#endif
