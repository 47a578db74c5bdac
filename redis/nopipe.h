/* Internal: keeps the SIGPIPE that a write to a connection the peer has
 * closed raises from reaching the program. The worker ignores SIGPIPE,
 * but a program using the client API need not, and a commit after Redis
 * dropped the connection (a restart, CLIENT KILL, its idle timeout) would
 * kill it (exit 141) instead of returning an error. A plain connection
 * sends with send(2) and MSG_NOSIGNAL (redis/connection.c), but hiredis
 * 0.14 (the queries to sentinels) and OpenSSL (TLS sessions) write with
 * write(2), which takes no such flag: around those writes SIGPIPE is
 * blocked in the calling thread, and one they raised is taken off the
 * pending signals before it is unblocked.
 * A signal raised by a write goes to the thread that wrote, so nothing
 * another thread does is touched. */
#ifndef CAPSTAN_REDIS_NOPIPE_H
#define CAPSTAN_REDIS_NOPIPE_H

#include <signal.h>

typedef struct capstan_nopipe {
    sigset_t old;      /* the thread's mask before */
    int was_pending;   /* a SIGPIPE of the caller's was pending already: it stays */
} capstan_nopipe_t;

/* Blocks SIGPIPE in the calling thread until capstan__nopipe_end. */
void capstan__nopipe_begin(capstan_nopipe_t *p);
/* Restores the thread's mask. failed: a write since capstan__nopipe_begin
 * failed, and may have raised SIGPIPE (a write that succeeded raises
 * none), which is discarded first. errno is left as it was. */
void capstan__nopipe_end(capstan_nopipe_t *p, int failed);

#endif
