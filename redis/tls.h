/* Internal: TLS for rediss:// URLs under hiredis 0.14, which speaks only
 * plain sockets. kiq makes the TCP connection and the OpenSSL session
 * itself and hands hiredis one end of a socketpair; a thread per
 * connection copies bytes between the other end and the session. */
#ifndef KIQ_REDIS_TLS_H
#define KIQ_REDIS_TLS_H

#include "redis/url.h"

typedef struct kiq_tls kiq_tls_t;

/* Connects to u->host:u->port, runs the TLS handshake (chain and host name
 * verified unless u->tls.verify_none) and checks that the server accepts
 * this client, within timeout seconds. On success returns 0, *out owns the
 * session and its thread, and *fd is the plain end for redisConnectFd
 * (hiredis owns and closes it). Returns KIQ_EREDIS when it may work later
 * (no answer, refused, reset) or KIQ_ECONFIG when the TLS settings or the
 * server's certificate are wrong ("TLS: certificate verify failed: ..."),
 * with err filled. */
int kiq__tls_connect(const kiq_redis_url_t *u, double timeout, kiq_tls_t **out, int *fd,
                     char *err);
/* Waits for the copying thread to end and frees the session. Call after
 * hiredis has closed its end (redisFree), which is what stops the thread. */
void kiq__tls_free(kiq_tls_t *t);

#endif
