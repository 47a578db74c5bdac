/* The config's shards: list (capstan_shard_conf_t): freeing it, and its
 * check at validation. Not public. */
#ifndef CAPSTAN_CONFIG_SHARDS_H
#define CAPSTAN_CONFIG_SHARDS_H

#include "capstan/config.h"

void capstan__config_shards_free(capstan_config_t *cfg);
/* With shards: no redis_url of its own, and the first shard's URL made
 * cfg->redis_url. 0 or CAPSTAN_ECONFIG/CAPSTAN_ENOMEM with err filled. */
int capstan__config_shards_check(capstan_config_t *cfg, char *err);

/* The index in cfg->shards of key's shard by the placing rule
 * (support/shard_pick.h): among every shard, or (open) among those
 * without a queues: list, which read every queue. -1 when there is none
 * to pick from. */
long capstan__config_shard_of(const capstan_config_t *cfg, const char *key, int open);

/* Gives cfg the queues of its shard i alone (with cfg's weights): the
 * front of a sharded process serves shard i's. 0 or CAPSTAN_ENOMEM, cfg
 * unchanged then. */
int capstan__config_own_shard(capstan_config_t *cfg, size_t i);
/* The config a sharded process's member for shard i runs: cfg's settings,
 * borrowed, with shard i's redis_url and queues, the schedules whose home
 * is shard i (capstan__config_shard_of their names), so that each ticks in
 * one shard, and no shards. Valid while cfg is; NULL when out of memory.
 * Freed with capstan__config_member_free, never capstan_config_free. */
capstan_config_t *capstan__config_member(const capstan_config_t *cfg, size_t i);
void capstan__config_member_free(capstan_config_t *m);
/* Every shard reads cfg's queues: its own queues: lists dropped (the
 * supervisor's quarantine worker reads only the quarantine, in each). */
void capstan__config_shards_same_queues(capstan_config_t *cfg);

#endif
