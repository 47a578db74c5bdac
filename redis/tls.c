/* TLS for rediss:// URLs: capstan's own TCP connection and OpenSSL session,
 * with a socketpair between them and hiredis and a thread copying bytes
 * between the socketpair and the session (see tls.h and the README). */
#include "redis/tls.h"
#include "redis/nopipe.h"
#include "support/dl.h"
#include "support/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <dlfcn.h>
#include <stdint.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

/* libssl is opened with dlopen the first time a rediss:// URL connects:
 * linked, it and libcrypto would add a third to the resident memory of
 * every worker, most of which never use TLS (the uniqueness digests load
 * libcrypto the same way). Each function below is called through a
 * pointer of its own type; OpenSSL's macros (SSL_CTX_set_mode, ...) expand
 * to SSL_CTX_ctrl and SSL_ctrl, listed too. */
#define TLS_FUNCTIONS(X)                                                                    \
    X(TLS_client_method) X(SSL_CTX_new) X(SSL_CTX_free) X(SSL_CTX_ctrl)                     \
    X(SSL_CTX_set_default_passwd_cb) X(SSL_CTX_load_verify_locations)                       \
    X(SSL_CTX_set_default_verify_paths) X(SSL_CTX_use_certificate_chain_file)               \
    X(SSL_CTX_use_PrivateKey_file) X(SSL_CTX_check_private_key) X(SSL_CTX_set_verify)       \
    X(SSL_new) X(SSL_free) X(SSL_set_fd) X(SSL_ctrl) X(SSL_get0_param) X(SSL_set1_host)     \
    X(SSL_connect) X(SSL_read) X(SSL_write) X(SSL_has_pending) X(SSL_get_error) X(SSL_get_verify_result)       \
    X(X509_VERIFY_PARAM_set_hostflags) X(X509_VERIFY_PARAM_set1_ip_asc)                     \
    X(X509_verify_cert_error_string) X(ERR_peek_last_error) X(ERR_reason_error_string)      \
    X(ERR_clear_error)

#define TLS_FN_FIELD(f) __typeof__(&f) f;
static struct { TLS_FUNCTIONS(TLS_FN_FIELD) } ssl_fn;
static int ssl_loaded;
static pthread_once_t ssl_once = PTHREAD_ONCE_INIT;

static void ssl_load(void)
{
    void *h = capstan__dlopen_lib("libssl", "3");
    if (!h)
        return;
    int ok = 1;
    /* dlsym on libssl's handle finds libcrypto's functions too (a
     * dependency it loaded). */
#define TLS_FN_LOAD(f) ok &= (ssl_fn.f = (__typeof__(&f))(uintptr_t)dlsym(h, #f)) != NULL;
    TLS_FUNCTIONS(TLS_FN_LOAD)
    ssl_loaded = ok;
}

/* From here on each name calls through its pointer (a macro does not
 * expand inside its own expansion, so ssl_fn.NAME stays). */
#define TLS_client_method (*ssl_fn.TLS_client_method)
#define SSL_CTX_new (*ssl_fn.SSL_CTX_new)
#define SSL_CTX_free (*ssl_fn.SSL_CTX_free)
#define SSL_CTX_ctrl (*ssl_fn.SSL_CTX_ctrl)
#define SSL_CTX_set_default_passwd_cb (*ssl_fn.SSL_CTX_set_default_passwd_cb)
#define SSL_CTX_load_verify_locations (*ssl_fn.SSL_CTX_load_verify_locations)
#define SSL_CTX_set_default_verify_paths (*ssl_fn.SSL_CTX_set_default_verify_paths)
#define SSL_CTX_use_certificate_chain_file (*ssl_fn.SSL_CTX_use_certificate_chain_file)
#define SSL_CTX_use_PrivateKey_file (*ssl_fn.SSL_CTX_use_PrivateKey_file)
#define SSL_CTX_check_private_key (*ssl_fn.SSL_CTX_check_private_key)
#define SSL_CTX_set_verify (*ssl_fn.SSL_CTX_set_verify)
#define SSL_new (*ssl_fn.SSL_new)
#define SSL_free (*ssl_fn.SSL_free)
#define SSL_set_fd (*ssl_fn.SSL_set_fd)
#define SSL_ctrl (*ssl_fn.SSL_ctrl)
#define SSL_get0_param (*ssl_fn.SSL_get0_param)
#define SSL_set1_host (*ssl_fn.SSL_set1_host)
#define SSL_connect (*ssl_fn.SSL_connect)
#define SSL_read (*ssl_fn.SSL_read)
#define SSL_write (*ssl_fn.SSL_write)
#define SSL_has_pending (*ssl_fn.SSL_has_pending)
#define SSL_get_error (*ssl_fn.SSL_get_error)
#define SSL_get_verify_result (*ssl_fn.SSL_get_verify_result)
#define X509_VERIFY_PARAM_set_hostflags (*ssl_fn.X509_VERIFY_PARAM_set_hostflags)
#define X509_VERIFY_PARAM_set1_ip_asc (*ssl_fn.X509_VERIFY_PARAM_set1_ip_asc)
#define X509_verify_cert_error_string (*ssl_fn.X509_verify_cert_error_string)
#define ERR_peek_last_error (*ssl_fn.ERR_peek_last_error)
#define ERR_reason_error_string (*ssl_fn.ERR_reason_error_string)
#define ERR_clear_error (*ssl_fn.ERR_clear_error)

struct capstan_tls {
    SSL *ssl;
    int sock;      /* the TCP connection under ssl */
    int pair;      /* our end of the socketpair; hiredis holds the other */
    pthread_t thread;
    /* Held by whoever uses ssl: the pump, or the connection's owner
     * through capstan__tls_send and capstan__tls_recv. */
    pthread_mutex_t lock;
    /* Set by the owner's direct use, cleared when hiredis writes to the
     * socketpair: while set, the server's bytes are the owner's to read
     * and the pump leaves the socket alone. */
    int direct;
};

/* OpenSSL's reason for the last failure, or what the system said. */
static const char *ssl_reason(char *buf, size_t n, SSL *ssl)
{
    unsigned long e = ERR_peek_last_error();
    long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (ssl && vr != X509_V_OK)
        snprintf(buf, n, "certificate verify failed: %s", X509_verify_cert_error_string(vr));
    else if (e)
        snprintf(buf, n, "%s", ERR_reason_error_string(e) ? ERR_reason_error_string(e)
                                                            : "error");
    else
        snprintf(buf, n, "%s", errno ? strerror(errno) : "connection closed");
    ERR_clear_error();
    return buf;
}

static void set_timeouts(int fd, double s)
{
    struct timeval tv = { .tv_sec = (time_t)s,
                          .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6) };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* A blocking TCP connection to host:port within timeout seconds, or -1. */
static int tcp_connect(const char *host, int port, double timeout, char *err)
{
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai, *a;
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai) {
        capstan_seterr(err, CAPSTAN_EREDIS, "connect: %s", gai_strerror(gai));
        return -1;
    }
    int fd = -1, saved = 0;
    for (a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0)
            continue;
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd p = { .fd = fd, .events = POLLOUT };
            socklen_t sl = sizeof(saved);
            rc = poll(&p, 1, (int)(timeout * 1000));
            if (rc == 0)
                saved = ETIMEDOUT;
            else if (rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &saved, &sl) == 0 && !saved)
                rc = 0;
            else
                rc = -1;
            if (saved)
                rc = -1;
        } else if (rc < 0) {
            saved = errno;
        }
        if (rc < 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        capstan_seterr(err, CAPSTAN_EREDIS, "connect: %s", strerror(saved ? saved : ECONNREFUSED));
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    set_timeouts(fd, timeout);
    /* As hiredis does for its own TCP connections: a command goes out at
     * once, not after the ack of the one before. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* The passphrase of an encrypted key is never asked on a terminal: such a
 * key fails to load, with OpenSSL's reason. */
static int no_passphrase(char *buf, int size, int rw, void *u)
{
    (void)buf, (void)size, (void)rw, (void)u;
    return 0;
}

/* Why path cannot be read as a file (dir: as a directory), from the
 * system, or NULL when it can. */
static const char *unreadable(const char *path, int dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
    if (fd < 0)
        return strerror(errno);
    struct stat st;
    int is_dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    close(fd);
    return !dir && is_dir ? strerror(EISDIR) : NULL;
}

static SSL_CTX *make_ctx(const capstan_redis_tls_conf_t *t, char *err)
{
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "TLS: %s", ssl_reason(why, sizeof(why), NULL));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* One read takes all the socket holds, not a record's header and then
     * its body (see pump). */
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    /* What did not load, and its path: OpenSSL's reason for a file it
     * cannot open is only "system lib". */
    const char *bad = NULL, *path = NULL, *note = "";
    int dir = 0;
    /* OpenSSL reads a ca_path only when a certificate is verified, and a
     * directory that is not there then fails as an unknown issuer. */
    if (t->ca_path && unreadable(t->ca_path, 1)) {
        bad = "ca_path";
        path = t->ca_path;
        dir = 1;
    } else if (t->ca_file || t->ca_path) {
        if (SSL_CTX_load_verify_locations(ctx, t->ca_file, t->ca_path) != 1) {
            bad = t->ca_file ? "ca_file" : "ca_path";
            path = t->ca_file ? t->ca_file : t->ca_path;
            dir = !t->ca_file;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        bad = "the system's CA certificates";
    }
    if (!bad && t->cert && SSL_CTX_use_certificate_chain_file(ctx, t->cert) != 1) {
        bad = "cert";
        path = t->cert;
    }
    if (!bad && t->key && SSL_CTX_use_PrivateKey_file(ctx, t->key, SSL_FILETYPE_PEM) != 1) {
        bad = "key";
        path = t->key;
    }
    if (!bad && t->cert && t->key && SSL_CTX_check_private_key(ctx) != 1) {
        bad = "key";
        path = t->key;
        note = " (it does not match cert)";
    }
    if (bad) {
        const char *sys = path ? unreadable(path, dir) : NULL;
        ssl_reason(why, sizeof(why), NULL);   /* and clears OpenSSL's errors */
        capstan_seterr(err, CAPSTAN_ECONFIG, "TLS: cannot load %s%s%s%s: %s", bad, path ? " " : "",
                       path ? path : "", note, sys ? sys : why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_verify(ctx, t->verify_none ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    return ctx;
}

/* Writes all of buf through ssl (blocking socket with timeouts). */
static int ssl_write_all(SSL *ssl, const char *buf, int n)
{
    while (n > 0) {
        int w = SSL_write(ssl, buf, n);
        if (w <= 0)
            return -1;
        buf += w;
        n -= w;
    }
    return 0;
}

/* With TLS 1.3 the server checks a client certificate after the client's
 * handshake is done, and says no on the first read: a PING now makes that
 * refusal a failure of the connect, with its reason, and not of whatever
 * command comes first. Any reply (+PONG, -NOAUTH) means accepted. */
static int accepted(SSL *ssl)
{
    char c;
    /* A server that refused us may be gone before the PING goes out (the
     * write then fails with EPIPE): its alert is still there to read. */
    int wrote = ssl_write_all(ssl, "PING\r\n", 6) == 0;
    do {
        if (SSL_read(ssl, &c, 1) != 1)
            return -1;
    } while (c != '\n');
    return wrote ? 0 : -1;
}

/* Copies bytes both ways between the socketpair and the TLS session until
 * either side ends or fails, then closes both, so that hiredis sees a
 * broken connection and capstan connects afresh. It carries what goes through
 * hiredis's own I/O (the connect's AUTH, SELECT and SCRIPT LOAD, and a
 * handler's commands on capstan_job_redis()); capstan's own commands go through
 * capstan__tls_send and capstan__tls_recv in the calling thread, with no hop
 * through here.
 *
 * It reads a side only when poll says it is readable (poll is
 * level-triggered: nothing left unread goes unseen), never to find
 * EAGAIN, and with read-ahead OpenSSL takes whole records, header and
 * body, in one read. */
static void *pump(void *arg)
{
    capstan_tls_t *t = arg;
    /* A write to a server that has gone fails with EPIPE here, rather
     * than killing a process that did not ignore SIGPIPE. */
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    char up[16384], down[16384];   /* hiredis -> server, server -> hiredis */
    size_t ulen = 0, uoff = 0, dlen = 0, doff = 0;
    /* What the session waits for on the socket before SSL_write or
     * SSL_read can go on (0: SSL_write is not stuck). */
    short wwait = 0, rwait = POLLIN;
    /* The sides' readiness as poll last said; both are tried at first. */
    short pev = POLLIN, sev = POLLIN;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        if (ulen == 0 && (pev & POLLIN)) {
            ssize_t n = recv(t->pair, up, sizeof(up), 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                break;
            if (n > 0) {
                ulen = (size_t)n;
                uoff = 0;
                wwait = 0;
                t->direct = 0;   /* its reply comes back this way */
            }
        }
        while (ulen > 0 && (wwait == 0 || (sev & wwait))) {
            int w = SSL_write(t->ssl, up + uoff, (int)(ulen - uoff));
            if (w <= 0) {
                int e = SSL_get_error(t->ssl, w);
                if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                    goto out;
                wwait = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
                break;
            }
            uoff += (size_t)w;
            if (uoff == ulen)
                ulen = 0;
        }
        /* Records OpenSSL has read ahead are read from its buffer without
         * a system call, before the next poll. */
        while (!t->direct && dlen == 0
               && ((sev & (rwait | POLLHUP | POLLERR)) || SSL_has_pending(t->ssl))) {
            int r = SSL_read(t->ssl, down, sizeof(down));
            if (r <= 0) {
                int e = SSL_get_error(t->ssl, r);
                if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                    goto out;   /* closed by the server, or a TLS error */
                rwait = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
                break;
            }
            rwait = POLLIN;
            dlen = (size_t)r;
            doff = 0;
            while (dlen > 0) {
                ssize_t n = send(t->pair, down + doff, dlen - doff, MSG_NOSIGNAL);
                if (n < 0 && errno != EINTR) {
                    if (errno != EAGAIN)
                        goto out;
                    break;   /* hiredis has not read enough yet: wait for room */
                }
                if (n > 0 && (doff += (size_t)n) == dlen)
                    dlen = 0;
            }
            sev &= (short)~POLLIN;   /* the next read waits for poll, or for the buffer */
        }
        short sock_ev = (short)((ulen > 0 ? wwait : 0) | (!t->direct && dlen == 0 ? rwait : 0));
        /* A socket polled for nothing would still report a hang-up, and
         * wake this loop for it over and over while the owner has the
         * session: it is left out (a negative fd is skipped). */
        struct pollfd p[2] = {
            { .fd = t->pair, .events = (short)((ulen == 0 ? POLLIN : 0) | (dlen > 0 ? POLLOUT : 0)) },
            { .fd = sock_ev ? t->sock : -1, .events = sock_ev },
        };
        pthread_mutex_unlock(&t->lock);
        int rc = poll(p, 2, -1);
        pthread_mutex_lock(&t->lock);
        if (rc < 0) {
            if (errno != EINTR)
                break;
            p[0].revents = p[1].revents = 0;
        }
        if (p[0].revents & (POLLHUP | POLLERR))
            break;   /* hiredis closed its end */
        pev = p[0].revents;
        sev = p[1].revents;
        if ((pev & POLLOUT) && dlen > 0) {
            ssize_t n = send(t->pair, down + doff, dlen - doff, MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                break;
            if (n > 0 && (doff += (size_t)n) == dlen)
                dlen = 0;
        }
    }
out:
    ERR_clear_error();
    shutdown(t->sock, SHUT_RDWR);
    shutdown(t->pair, SHUT_RDWR);
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* Waits up to timeout_ms for the socket to be ready for ev; -1 with errno
 * EAGAIN on a timeout, as hiredis reports one. */
static int wait_sock(const capstan_tls_t *t, short ev, int timeout_ms)
{
    struct pollfd p = { .fd = t->sock, .events = ev };
    int rc;
    do
        rc = poll(&p, 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc == 0)
        errno = EAGAIN;
    return rc > 0 ? 0 : -1;
}

/* SSL_write or SSL_read's result r: 0 to try again once the socket is
 * ready, else -1 (errno set; 0 for a connection the server closed). */
static int retry_after(capstan_tls_t *t, int r, int timeout_ms)
{
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return wait_sock(t, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, timeout_ms);
    if (e != SSL_ERROR_SYSCALL || !errno)
        errno = e == SSL_ERROR_ZERO_RETURN || e == SSL_ERROR_SYSCALL ? 0 : EPROTO;
    ERR_clear_error();
    return -1;
}

int capstan__tls_send(capstan_tls_t *t, const char *buf, size_t len, int timeout_ms)
{
    int rc = 0;
    pthread_mutex_lock(&t->lock);
    t->direct = 1;
    while (len > 0 && rc == 0) {
        errno = 0;
        int w = SSL_write(t->ssl, buf, len > 1 << 30 ? 1 << 30 : (int)len);
        if (w > 0) {
            buf += w;
            len -= (size_t)w;
        } else {
            rc = retry_after(t, w, timeout_ms);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

long capstan__tls_recv(capstan_tls_t *t, char *buf, size_t cap, int timeout_ms)
{
    int r = -1;
    pthread_mutex_lock(&t->lock);
    t->direct = 1;
    /* Wait first: the reply is seldom there the moment the command has
     * gone, and a read that finds nothing is a system call for naught. */
    if (SSL_has_pending(t->ssl) || wait_sock(t, POLLIN, timeout_ms) == 0) {
        /* SSL_read writes too (the answer to a server's key update), to a
         * server that may have gone (nopipe.h). */
        capstan_nopipe_t np;
        capstan__nopipe_begin(&np);
        do {
            errno = 0;
            r = SSL_read(t->ssl, buf, cap > 1 << 30 ? 1 << 30 : (int)cap);
        } while (r <= 0 && retry_after(t, r, timeout_ms) == 0);
        capstan__nopipe_end(&np, r <= 0);
    }
    pthread_mutex_unlock(&t->lock);
    return r > 0 ? r : -1;
}

static void free_parts(capstan_tls_t *t)
{
    if (!t)
        return;
    SSL_free(t->ssl);
    if (t->sock >= 0)
        close(t->sock);
    if (t->pair >= 0)
        close(t->pair);
    free(t);
}

void capstan__tls_free(capstan_tls_t *t)
{
    if (!t)
        return;
    pthread_join(t->thread, NULL);
    pthread_mutex_destroy(&t->lock);
    free_parts(t);
}

/* Whether OpenSSL's error e says the peer's bytes were no TLS record at
 * all: a plain Redis port answers a ClientHello that happens to hold a
 * newline with "-ERR ...", an HTTP server with "HTTP/1.1 ...". */
static int not_tls(unsigned long e)
{
    int r = ERR_GET_REASON(e);
    return ERR_GET_LIB(e) == ERR_LIB_SSL
           && (r == SSL_R_WRONG_VERSION_NUMBER || r == SSL_R_PACKET_LENGTH_TOO_LONG
               || r == SSL_R_HTTP_REQUEST || r == SSL_R_HTTPS_PROXY_REQUEST);
}

/* Warned once a process: every connection would say it again. */
static atomic_int warned_verify_none;

int capstan__tls_connect(const capstan_redis_url_t *u, double timeout, capstan_tls_t **out, int *fd,
                         char *err)
{
    const capstan_redis_tls_conf_t *conf = &u->tls;
    const char *name = conf->server_name ? conf->server_name : u->host;
    char why[256];
    err[0] = '\0';
    pthread_once(&ssl_once, ssl_load);
    if (!ssl_loaded)
        return capstan_seterr(err, CAPSTAN_ECONFIG, "TLS: cannot load libssl.so.3 (install libssl3)");
    if (conf->verify_none && !atomic_exchange(&warned_verify_none, 1))
        capstan_warn("TLS: verify=none: the Redis server's certificate is not checked; "
                     "anyone on the path can read and change the traffic");
    SSL_CTX *ctx = make_ctx(conf, err);
    if (!ctx)
        return CAPSTAN_ECONFIG;
    capstan_tls_t *t = calloc(1, sizeof(*t));
    int pair[2] = { -1, -1 };
    int rc = CAPSTAN_ENOMEM;
    if (!t)
        goto fail;
    t->sock = t->pair = -1;
    t->sock = tcp_connect(u->host, u->port, timeout, err);
    if (t->sock < 0) {
        rc = CAPSTAN_EREDIS;
        goto fail;
    }
    t->ssl = SSL_new(ctx);
    if (!t->ssl)
        goto fail;
    SSL_set_fd(t->ssl, t->sock);
    /* SNI is for names only; an address is verified as one (IP SAN). */
    struct in6_addr a6;
    int is_ip = inet_pton(AF_INET, name, &a6) == 1 || inet_pton(AF_INET6, name, &a6) == 1;
    if (!is_ip)
        SSL_set_tlsext_host_name(t->ssl, name);
    if (!conf->verify_none) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(t->ssl);
        X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, name) != 1 : SSL_set1_host(t->ssl, name) != 1)
            goto fail;
    }
    ERR_clear_error();
    errno = 0;
    /* The handshake and the PING write from the caller's thread, to a
     * server that may drop the connection midway (nopipe.h). */
    capstan_nopipe_t np;
    capstan__nopipe_begin(&np);
    int hs = SSL_connect(t->ssl);
    int hs_err = hs == 1 ? SSL_ERROR_NONE : SSL_get_error(t->ssl, hs), refused = 0;
    if (hs == 1) {
        ERR_clear_error();
        errno = 0;
        refused = accepted(t->ssl) != 0;
    }
    capstan__nopipe_end(&np, hs != 1 || refused);
    if (hs != 1) {
        /* A TLS-level failure (a bad certificate, no common protocol, a
         * server not speaking TLS) stays until the settings change; a
         * dropped or silent connection may pass. */
        rc = hs_err == SSL_ERROR_SSL ? CAPSTAN_ECONFIG : CAPSTAN_EREDIS;
        if (hs_err == SSL_ERROR_WANT_READ || hs_err == SSL_ERROR_WANT_WRITE
            || (hs_err == SSL_ERROR_SYSCALL && errno == EAGAIN)) {
            /* The socket's timeout ran out. A plain Redis port reads the
             * ClientHello as the start of an inline command and waits for
             * its end: the system's "Resource temporarily unavailable"
             * would not lead anyone there. A slow server may pass. */
            ERR_clear_error();
            capstan_seterr(err, rc, "TLS: the server did not answer the TLS handshake within %g s: "
                           "is it a TLS port?", timeout);
        } else if (hs_err == SSL_ERROR_SSL && not_tls(ERR_peek_last_error())) {
            capstan_seterr(err, rc, "TLS: the server answered the TLS handshake with something "
                           "else than TLS (%s): is it a TLS port?",
                           ssl_reason(why, sizeof(why), t->ssl));
        } else {
            capstan_seterr(err, rc, "TLS: %s", ssl_reason(why, sizeof(why), t->ssl));
        }
        goto fail;
    }
    if (refused) {
        int ssl_err = ERR_peek_last_error() != 0;
        rc = ssl_err ? CAPSTAN_ECONFIG : CAPSTAN_EREDIS;
        capstan_seterr(err, rc, "TLS: the server refused this client: %s",
                       ssl_reason(why, sizeof(why), NULL));
        goto fail;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0) {
        rc = capstan_seterr(err, CAPSTAN_ESYS, "TLS: socketpair: %s", strerror(errno));
        goto fail;
    }
    t->pair = pair[0];
    fcntl(t->pair, F_SETFL, fcntl(t->pair, F_GETFL) | O_NONBLOCK);
    fcntl(t->sock, F_SETFL, fcntl(t->sock, F_GETFL) | O_NONBLOCK);
    if (pthread_mutex_init(&t->lock, NULL) || pthread_create(&t->thread, NULL, pump, t)) {
        rc = capstan_seterr(err, CAPSTAN_ESYS, "TLS: cannot start a thread");
        goto fail;
    }
    SSL_CTX_free(ctx);   /* the session holds its own reference */
    *out = t;
    *fd = pair[1];
    return 0;
fail:
    if (rc == CAPSTAN_ENOMEM && !err[0])
        capstan_seterr(err, rc, "TLS: %s", ssl_reason(why, sizeof(why), NULL));
    if (pair[1] >= 0)
        close(pair[1]);
    free_parts(t);
    SSL_CTX_free(ctx);
    return rc;
}
