/* Internal: Redis Sentinel. A redis+sentinel:// URL names sentinels and a
 * master; every connect asks the sentinels where the master is now, so a
 * reconnect after a failover finds the new one. */
#ifndef CAPSTAN_REDIS_SENTINEL_H
#define CAPSTAN_REDIS_SENTINEL_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "redis/url.h"

/* The sentinels and the master's name of a sentinel URL. */
typedef struct capstan_sentinel capstan_sentinel_t;

/* Whether url has a sentinel scheme (redis+sentinel://, rediss+sentinel://). */
int capstan__sentinel_scheme(const char *url);

/* Parses
 *   redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER[/DB]
 *     [?sentinel_username=U&sentinel_password=P&sentinel_ssl=true&TLS settings]
 * (rediss+sentinel:// sets u->tls.on; the TLS settings are a rediss://
 * URL's, for the master and, with sentinel_ssl=true, the sentinels) into
 * u: user, password, db and TLS settings are the master's, u->sentinel the
 * rest. An unknown parameter is an error. Returns 0 or CAPSTAN_EINVAL / CAPSTAN_ENOMEM
 * with err filled. */
int capstan__sentinel_parse(const char *url, capstan_redis_url_t *u, char *err);
void capstan__sentinel_free(capstan_sentinel_t *s);

/* Asks the sentinels in turn where the master is and writes it into
 * u->host and u->port; the sentinel that answered is asked for its peers
 * too, and those not in the list yet are added to it for the next time.
 * Returns 0, CAPSTAN_EREDIS when no sentinel answered (or
 * none knows a master yet), or CAPSTAN_ECONFIG when every sentinel that
 * answered knows no master of that name or refused the sentinel
 * credentials; errstr (CAPSTAN_ERRLEN) says why, prefixed with name. */
int capstan__sentinel_resolve(capstan_redis_url_t *u, const char *name, char *errstr);

/* Checks that c is a master (a replica is what a stale sentinel, an
 * unfinished failover or a failover name not yet moved gives).
 * A ROLE refused by ACL counts as a master: a READONLY reply will tell.
 * Returns 0 or CAPSTAN_EREDIS with errstr filled. */
int capstan__sentinel_check_role(redisContext *c, const char *name, char *errstr);

/* A subscription to the sentinels' +switch-master announcements, which
 * every sentinel publishes as it takes a new master for one it monitors:
 * capstan learns of a SENTINEL FAILOVER at once rather than at its next
 * question to the sentinels. Owns one connection to one sentinel at a
 * time; not thread-safe (one thread waits on it). */
typedef struct capstan_sentinel_watch capstan_sentinel_watch_t;

/* A watcher for the master of sentinel URL url; nothing is connected yet
 * (the first wait subscribes). Returns NULL with err (CAPSTAN_ERRLEN)
 * filled when url is no sentinel URL, is malformed, or memory ran out.
 * Free it with capstan__sentinel_watch_free. */
capstan_sentinel_watch_t *capstan__sentinel_watch_new(const char *url, char *err);

/* Waits up to timeout_s seconds for a +switch-master about this URL's
 * master. Unsubscribed (at first, or when the connection was lost) it
 * subscribes first, asking the sentinels in turn. Returns 1 when such an
 * announcement arrived, or when a subscription was made again after one
 * was lost (one may have been missed in between: worth asking the
 * sentinels); 0 when the time passed without one; CAPSTAN_EREDIS with
 * errstr (CAPSTAN_ERRLEN) filled when no sentinel could be subscribed
 * (the next call tries them again). */
int capstan__sentinel_watch_wait(capstan_sentinel_watch_t *w, double timeout_s, char *errstr);

/* Closes the subscription and frees w (NULL is fine). */
void capstan__sentinel_watch_free(capstan_sentinel_watch_t *w);

/* Replaces the value of sentinel_password= in the redacted URL out (n
 * bytes) by "***". */
void capstan__sentinel_redact(char *out, size_t n);

#endif
