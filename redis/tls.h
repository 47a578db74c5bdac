/* Internal: TLS for rediss:// URLs under hiredis 0.14, which speaks only
 * plain sockets. capstan makes the TCP connection and the OpenSSL session
 * itself and hands hiredis one end of a socketpair; a thread per
 * connection copies bytes between the other end and the session. capstan's
 * own commands skip that hop: the connection's owner writes and reads
 * them through the session itself (capstan__tls_send, capstan__tls_recv), and
 * only what goes through hiredis's own I/O takes the socketpair. */
#ifndef CAPSTAN_REDIS_TLS_H
#define CAPSTAN_REDIS_TLS_H

#include "redis/url.h"

typedef struct capstan_tls capstan_tls_t;

/* Connects to u->host:u->port, runs the TLS handshake (chain and host name
 * verified unless u->tls.verify_none) and checks that the server accepts
 * this client, within timeout seconds. On success returns 0, *out owns the
 * session and its thread, and *fd is the plain end for redisConnectFd
 * (hiredis owns and closes it). Returns CAPSTAN_EREDIS when it may work later
 * (no answer, refused, reset) or CAPSTAN_ECONFIG when the TLS settings or the
 * server's certificate are wrong ("TLS: certificate verify failed: ..."),
 * with err filled. */
int capstan__tls_connect(const capstan_redis_url_t *u, double timeout, capstan_tls_t **out, int *fd,
                         char *err);
/* Sends all of buf through the session from the calling thread, waiting
 * up to timeout_ms each time the socket is full. Returns 0, or -1 with
 * errno set (0: the server closed the connection). */
int capstan__tls_send(capstan_tls_t *t, const char *buf, size_t len, int timeout_ms);
/* Reads at least one byte and at most cap of what the server sent,
 * waiting up to timeout_ms (then -1 with errno EAGAIN). Returns the count,
 * or -1 with errno set (0: the server closed the connection). A command
 * sent through hiredis's own I/O must have had its reply read before. */
long capstan__tls_recv(capstan_tls_t *t, char *buf, size_t cap, int timeout_ms);
/* Waits for the copying thread to end and frees the session. Call after
 * hiredis has closed its end (redisFree), which is what stops the thread. */
void capstan__tls_free(capstan_tls_t *t);

#endif
