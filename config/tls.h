/* The TLS settings of the config (cfg->tls): the file's tls: mapping, the
 * --tls-* flags, and their move into redis_url. Not public. */
#ifndef KIQ_CONFIG_TLS_H
#define KIQ_CONFIG_TLS_H

#include "kiq/config.h"

/* Applies one --tls-NAME flag (flag is its long name, "tls-ca-file").
 * Returns 0 or KIQ_ECONFIG/KIQ_ENOMEM with err filled. */
int kiq__config_tls_flag(kiq_config_t *cfg, const char *flag, const char *v, char *err);
/* Appends cfg->tls to cfg->redis_url as query parameters and clears it, so a
 * second call does nothing. Returns KIQ_ECONFIG when the URL is not
 * rediss://. */
int kiq__config_tls_into_url(kiq_config_t *cfg, char *err);
void kiq__config_tls_clear(kiq_tls_conf_t *t);

#endif
