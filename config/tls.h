/* The TLS settings of the config (cfg->tls): the file's tls: mapping, the
 * --tls-* flags, and their move into redis_url. Not public. */
#ifndef CAPSTAN_CONFIG_TLS_H
#define CAPSTAN_CONFIG_TLS_H

#include "capstan/config.h"

/* Applies one --tls-NAME flag (flag is its long name, "tls-ca-file").
 * Returns 0 or CAPSTAN_ECONFIG/CAPSTAN_ENOMEM with err filled. */
int capstan__config_tls_flag(capstan_config_t *cfg, const char *flag, const char *v, char *err);
/* Appends cfg->tls to cfg->redis_url as query parameters and clears it, so a
 * second call does nothing. Returns CAPSTAN_ECONFIG when the URL is not
 * rediss://. With shards: to each shard's URL that speaks TLS (one must). */
int capstan__config_tls_into_url(capstan_config_t *cfg, char *err);
void capstan__config_tls_clear(capstan_tls_conf_t *t);

#endif
