/* Redis connections: URL, connect with AUTH/SELECT (refusing a Redis
 * Cluster node, or a user who may not run scripts), commands that mark the
 * connection broken on I/O errors, and EVALSHA that, on NOSCRIPT, loads the
 * scripts again and resends, in a pipeline too. */
#include "capstan/redis.h"
#include "redis/nopipe.h"
#include "redis/objects.h"
#include "redis/scripts.h"
#include "redis/sentinel.h"
#include "redis/tls.h"
#include "redis/url.h"
#include "support/fmt.h"
#include "support/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_ARGS 64
#define READ_CHUNK 4096 /* bytes a TLS read takes at most; a read buffer
                           larger than this is given back after a reply */
#define READ_ROOM 16384 /* bytes a socket read takes at most */

/* A command whose reply the caller has not read yet. */
typedef struct sent {
    char *cmd;            /* an EVALSHA as formatted, to send again after NOSCRIPT; else NULL */
    size_t len;
    redisReply *early;    /* its reply, read ahead while another was sent again */
} sent_t;

struct capstan_redis {
    capstan_redis_url_t url;
    char name[512];       /* URL with the password redacted */
    char who[600];        /* what its errors name: name, and through the
                             sentinels the master they named */
    double timeout;
    redisContext *c;
    capstan_tls_t *tls;   /* the TLS session under c for rediss://, else NULL */
    int broken;
    sent_t *q;            /* the unread replies' commands, oldest at q[qhead] */
    size_t qhead, qlen, qcap;
    int need_load;        /* a NOSCRIPT reached a caller: load before the next command */
    int era;              /* the value of demotions when this connection was made */
    long connects;        /* how many times it was made: from the second on, a reconnect */
    char errstr[CAPSTAN_ERRLEN];
};

/* How many times a server of this process answered READONLY on a plain
 * URL: it was demoted to a replica behind an address that stays (a
 * managed service's failover name); or, through sentinels, a connection
 * found another master than before. Every connection made before the last
 * such change reconnects, the address's new master or not, and then checks
 * with ROLE that it found a master. */
static atomic_int demotions;
/* Set from the first READONLY until a connect finds a master again: the
 * episode is logged once, not by every connection. */
static atomic_int demoted;

/* The master of r's era is gone: the first connection of the era to find
 * so starts the next, and the others made in it are stale already.
 * Returns 1 when r started it. */
static int end_era(const capstan_redis_t *r)
{
    int era = r->era;
    return atomic_compare_exchange_strong(&demotions, &era, era + 1);
}

/* Forgets every unread reply (the connection is dropped or replaced). */
static void forget_sent(capstan_redis_t *r)
{
    for (size_t i = 0; i < r->qlen; i++) {
        free(r->q[r->qhead + i].cmd);
        freeReplyObject(r->q[r->qhead + i].early);
    }
    r->qhead = r->qlen = 0;
}

static int remember_sent(capstan_redis_t *r, char *cmd, size_t len)
{
    if (r->qhead + r->qlen == r->qcap) {
        if (r->qhead) {
            memmove(r->q, r->q + r->qhead, r->qlen * sizeof(*r->q));
            r->qhead = 0;
        } else {
            size_t cap = r->qcap ? 2 * r->qcap : 16;
            sent_t *q = realloc(r->q, cap * sizeof(*q));
            if (!q)
                return CAPSTAN_ENOMEM;
            r->q = q;
            r->qcap = cap;
        }
    }
    r->q[r->qhead + r->qlen++] = (sent_t){ .cmd = cmd, .len = len };
    return 0;
}

capstan_redis_t *capstan_redis_new(const char *url, double timeout, char *err)
{
    capstan_redis_t *r = calloc(1, sizeof(*r));
    if (!r) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    if (capstan__redis_url_parse(url, &r->url, err)) {
        free(r);
        return NULL;
    }
    capstan__redis_url_redact(url, r->name, sizeof(r->name));
    snprintf(r->who, sizeof(r->who), "%s", r->name);
    r->timeout = timeout > 0 ? timeout : 10;
    r->broken = 1;
    return r;
}

void capstan_redis_free(capstan_redis_t *r)
{
    if (!r)
        return;
    redisFree(r->c);
    capstan__tls_free(r->tls);
    forget_sent(r);
    free(r->q);
    capstan__redis_url_clear(&r->url);
    free(r);
}

static struct timeval tv_of(double s)
{
    struct timeval tv = { .tv_sec = (time_t)s,
                          .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6) };
    return tv;
}

static int fail_io(capstan_redis_t *r, const char *what)
{
    r->broken = 1;
    forget_sent(r);
    snprintf(r->errstr, sizeof(r->errstr), "%s: %s (%s)", r->who, what,
             r->c && r->c->errstr[0] ? r->c->errstr : "connection lost");
    return CAPSTAN_EREDIS;
}

/* An error reply while setting up a connection that may pass by itself
 * (the server is loading its data, busy, or full); any other (WRONGPASS,
 * NOAUTH, NOPERM, a bad DB index) will not, whatever the wait. */
static int transient_reply(const char *msg)
{
    static const char *const passing[] = { "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN",
                                           "CLUSTERDOWN", "ERR max number of clients" };
    for (size_t i = 0; i < sizeof(passing) / sizeof(passing[0]); i++)
        if (strncmp(msg, passing[i], strlen(passing[i])) == 0)
            return 1;
    return 0;
}

/* The code for a connection that the server refused with reply msg. */
static int refused(const char *msg)
{
    return transient_reply(msg) ? CAPSTAN_EREDIS : CAPSTAN_ECONFIG;
}

static int get_reply(capstan_redis_t *r, void **rep);

/* A command in Redis's protocol, as redisFormatCommandArgv writes it but
 * without a sprintf per argument (most of what formatting costs). */
static size_t resp_len(int argc, const size_t *lens)
{
    char t[CAPSTAN_FMT_INT];
    size_t n = 3 + capstan__fmt_uint(t, (unsigned long long)argc);
    for (int i = 0; i < argc; i++)
        n += 5 + capstan__fmt_uint(t, lens[i]) + lens[i];
    return n;
}

static void resp_put(char *p, int argc, const char **argv, const size_t *lens)
{
    *p++ = '*';
    p += capstan__fmt_uint(p, (unsigned long long)argc);
    *p++ = '\r';
    *p++ = '\n';
    for (int i = 0; i < argc; i++) {
        *p++ = '$';
        p += capstan__fmt_uint(p, lens[i]);
        *p++ = '\r';
        *p++ = '\n';
        memcpy(p, argv[i], lens[i]);
        p += lens[i];
        *p++ = '\r';
        *p++ = '\n';
    }
}

/* Formats a command into a new buffer (free it); NULL when out of memory. */
static char *resp_format(int argc, const char **argv, const size_t *lens, size_t *len)
{
    *len = resp_len(argc, lens);
    char *cmd = malloc(*len);
    if (cmd)
        resp_put(cmd, argc, argv, lens);
    return cmd;
}

/* Appends a command to what hiredis sends next. */
static int put_command(redisContext *c, int argc, const char **argv, const size_t *lens)
{
    size_t len = resp_len(argc, lens);
    sds buf = sdsMakeRoomFor(c->obuf, len);
    if (!buf)
        return REDIS_ERR;
    c->obuf = buf;
    resp_put(buf + sdslen(buf), argc, argv, lens);
    sdsIncrLen(buf, (int)len);
    return REDIS_OK;
}

/* redisCommand, with the reply read by get_reply: hiredis's own read puts
 * 16 KB on the stack, which every thread that connects would keep
 * resident. NULL on an I/O error (r->c->err set). */
static redisReply *command(capstan_redis_t *r, int argc, const char **argv)
{
    size_t lens[8];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    void *rep = NULL;
    if (put_command(r->c, argc, argv, lens) != REDIS_OK || get_reply(r, &rep) != REDIS_OK)
        return NULL;
    return rep;
}

/* Says in r->errstr that the server refused cmd with msg; an ACL's refusal
 * names the user, whose rights are what to change. */
static void refusal(capstan_redis_t *r, const char *cmd, const char *msg)
{
    if (strncmp(msg, "NOPERM", 6) == 0)
        snprintf(r->errstr, sizeof(r->errstr), "%s: the ACL of user %s does not allow %s, which "
                 "capstan needs: %s", r->who, r->url.user ? r->url.user : "default", cmd, msg);
    else
        snprintf(r->errstr, sizeof(r->errstr), "%s: %s: %s", r->who, cmd, msg);
}

/* Returns 0, CAPSTAN_EREDIS on an I/O error, or for an error reply CAPSTAN_EREPLY
 * (*permanent set when waiting will not help: NOAUTH, NOPERM, a cluster).
 *
 * With probe (a new connection), two questions ride in the same round trip.
 * CLUSTER INFO, which any user may ask and a standalone server answers with
 * an error: a Redis Cluster node is refused, as Sidekiq refuses it, since
 * capstan's scripts move jobs between keys of different slots. And an
 * EVALSHA of lua/probe.lua, loaded just before, which does nothing: a user
 * who may load the scripts but not run them would otherwise fetch and ack
 * almost nothing, one error a second. */
static int load_scripts_why(capstan_redis_t *r, int probe, int *permanent)
{
    /* All sent, then all read: one round trip, not one a script (every
     * connection of a process makes them again after a restart). */
    for (int i = 0; i < CAPSTAN_SCRIPT_COUNT; i++) {
        const char *text = capstan__script_text((capstan_script_t)i);
        const char *argv[] = { "SCRIPT", "LOAD", text };
        size_t lens[] = { 6, 4, strlen(text) };
        if (put_command(r->c, 3, argv, lens) != REDIS_OK)
            return fail_io(r, "SCRIPT LOAD");
    }
    const char *cluster[] = { "CLUSTER", "INFO" }, *evalsha[] = { "EVALSHA", capstan__script_sha(CAPSTAN_SCRIPT_PROBE), "0" };
    if (probe && (put_command(r->c, 2, cluster, (size_t[]){ 7, 4 }) != REDIS_OK
                  || put_command(r->c, 3, evalsha, (size_t[]){ 7, 40, 1 }) != REDIS_OK))
        return fail_io(r, "SCRIPT LOAD");
    int rc = 0, nreplies = CAPSTAN_SCRIPT_COUNT + (probe ? 2 : 0);
    for (int i = 0; i < nreplies; i++) {
        void *got = NULL;
        if (get_reply(r, &got) != REDIS_OK || !got)
            return fail_io(r, "SCRIPT LOAD");
        redisReply *rep = got;
        if (i == CAPSTAN_SCRIPT_COUNT) { /* CLUSTER INFO's: said first, whatever else failed */
            if (rep->type == REDIS_REPLY_STRING && strstr(rep->str, "cluster_state:")) {
                snprintf(r->errstr, sizeof(r->errstr), "%s is a Redis Cluster node; capstan, like "
                         "Sidekiq, needs a standalone (or Sentinel-managed) Redis", r->who);
                *permanent = 1;
                rc = CAPSTAN_EREPLY;
            }
        } else if (rep->type == REDIS_REPLY_ERROR && !rc) {
            refusal(r, i < CAPSTAN_SCRIPT_COUNT ? "SCRIPT LOAD" : "EVALSHA", rep->str);
            *permanent = !transient_reply(rep->str);
            rc = CAPSTAN_EREPLY;
        }
        freeReplyObject(rep);
    }
    if (!rc)
        r->need_load = 0;
    return rc;
}

static int load_scripts(capstan_redis_t *r)
{
    int permanent = 0;
    return load_scripts_why(r, 0, &permanent);
}

int capstan_redis_connect(capstan_redis_t *r)
{
    redisFree(r->c);   /* closes hiredis's end, which ends the TLS thread */
    r->c = NULL;
    capstan__tls_free(r->tls);
    r->tls = NULL;
    forget_sent(r);
    r->broken = 1;
    char was[256] = "";
    int was_port = r->url.port;
    if (r->url.sentinel && r->url.host)
        snprintf(was, sizeof(was), "%s", r->url.host);
    int found = r->url.sentinel ? capstan__sentinel_resolve(&r->url, r->name, r->errstr) : 0;
    if (found)
        return found;
    /* From here on a failure is the master's, not the sentinels'. */
    if (r->url.sentinel)
        snprintf(r->who, sizeof(r->who), "%s: master %s:%d (named by the sentinels)", r->name, r->url.host,
                 r->url.port);
    /* The sentinels name another master than this connection's last one:
     * every connection of the process made before is to be made again (as
     * after a READONLY), and what ran on the old master is known to be
     * from another era (capstan__redis_era). */
    if (was[0] && (strcmp(was, r->url.host) != 0 || was_port != r->url.port))
        end_era(r);
    struct timeval ctv = tv_of(r->timeout < 5 ? r->timeout : 5);
    if (r->url.tls.on) {
        char why[CAPSTAN_ERRLEN];
        int fd = -1, rc = capstan__tls_connect(&r->url, r->timeout < 5 ? r->timeout : 5, &r->tls,
                                               &fd, why);
        if (rc) {
            snprintf(r->errstr, sizeof(r->errstr), "%s: %s", r->who, why);
            return rc == CAPSTAN_ECONFIG ? CAPSTAN_ECONFIG : CAPSTAN_EREDIS;
        }
        if (!(r->c = redisConnectFd(fd)))
            close(fd);
    } else if (r->url.path)
        r->c = redisConnectUnixWithTimeout(r->url.path, ctv);
    else
        r->c = redisConnectWithTimeout(r->url.host, r->url.port, ctv);
    if (!r->c) {
        snprintf(r->errstr, sizeof(r->errstr), "%s: cannot allocate a connection", r->who);
        return CAPSTAN_EREDIS;
    }
    if (r->c->err)
        return fail_io(r, "connect");
    capstan__redis_objects(r->c->reader);
    redisSetTimeout(r->c, tv_of(r->timeout));
    redisReply *rep = NULL;
    if (r->url.password) {
        if (r->url.user)
            rep = command(r, 3, (const char *[]){ "AUTH", r->url.user, r->url.password });
        else
            rep = command(r, 2, (const char *[]){ "AUTH", r->url.password });
        if (!rep)
            return fail_io(r, "AUTH");
        if (rep->type == REDIS_REPLY_ERROR) {
            snprintf(r->errstr, sizeof(r->errstr), "%s: AUTH refused: %s", r->who, rep->str);
            int code = refused(rep->str);
            freeReplyObject(rep);
            return code;
        }
        freeReplyObject(rep);
    }
    if (r->url.db) {
        char db[CAPSTAN_FMT_INT];
        capstan__fmt_int(db, r->url.db);
        rep = command(r, 2, (const char *[]){ "SELECT", db });
        if (!rep)
            return fail_io(r, "SELECT");
        int code = rep->type == REDIS_REPLY_ERROR ? refused(rep->str) : 0;
        if (code)
            snprintf(r->errstr, sizeof(r->errstr), "%s: SELECT %d: %s", r->who, r->url.db, rep->str);
        freeReplyObject(rep);
        if (code)
            return code;
    }
    if (!r->url.password && !r->url.db) {
        /* Nothing sent yet would say NOAUTH: a Redis that wants a password
         * drops an unauthenticated client's command over 16 KB (a script)
         * without a reply, so ask with a small one first. */
        rep = command(r, 1, (const char *[]){ "PING" });
        if (!rep)
            return fail_io(r, "PING");
        int code = rep->type == REDIS_REPLY_ERROR ? refused(rep->str) : 0;
        if (code)
            snprintf(r->errstr, sizeof(r->errstr), "%s: PING: %s", r->who, rep->str);
        freeReplyObject(rep);
        if (code)
            return code;
    }
    int era = atomic_load(&demotions);
    if ((r->url.sentinel || era) && capstan__sentinel_check_role(r->c, r->who, r->errstr))
        return CAPSTAN_EREDIS;
    int permanent = 0, rc = load_scripts_why(r, 1, &permanent);
    if (rc == CAPSTAN_EREPLY)
        return permanent ? CAPSTAN_ECONFIG : CAPSTAN_EREDIS;
    if (rc)
        return rc;
    r->broken = 0;
    r->era = era;
    r->connects++;
    r->errstr[0] = '\0';
    if (era && atomic_exchange(&demoted, 0))
        capstan_info("%s is a master again", r->name);
    return 0;
}

int capstan__redis_era(const capstan_redis_t *r)
{
    return r ? r->era : -1;
}

long capstan__redis_connects(const capstan_redis_t *r)
{
    return r->connects;
}

int capstan__redis_follow_master(capstan_redis_t *r)
{
    if (!r->url.sentinel || !r->url.host || r->broken || !r->c)
        return 0;
    capstan_redis_url_t u = r->url;
    u.host = NULL; /* the resolve sets its own */
    char err[CAPSTAN_ERRLEN];
    if (capstan__sentinel_resolve(&u, r->name, err))
        return 0;
    /* Said once: by the call that ends the era, not by one that finds
     * another connection ended it first. */
    int ended = (strcmp(u.host, r->url.host) != 0 || u.port != r->url.port) && end_era(r);
    if (ended)
        capstan_warn("%s: the sentinels name another master (%s:%d); every connection moves to it",
                     r->name, u.host, u.port);
    free(u.host);
    return ended;
}

int capstan__redis_time(capstan_redis_t *r, double *now)
{
    redisReply *rep = capstan_redis_cmdf(r, "TIME");
    if (!rep)
        return CAPSTAN_EREDIS;
    int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 && rep->element[0]->type == REDIS_REPLY_STRING &&
             rep->element[1]->type == REDIS_REPLY_STRING;
    if (ok)
        *now = (double)strtoll(rep->element[0]->str, NULL, 10) + (double)strtoll(rep->element[1]->str, NULL, 10) / 1e6;
    freeReplyObject(rep);
    return ok ? 0 : CAPSTAN_EREPLY;
}

/* Made before the last demotion: to be made again. */
static int stale(const capstan_redis_t *r) { return r->era != atomic_load(&demotions); }

int capstan_redis_ok(const capstan_redis_t *r)
{
    return r && r->c && !r->broken && !r->c->err && !stale(r);
}
const char *capstan_redis_error(const capstan_redis_t *r) { return r->errstr; }
const char *capstan_redis_name(const capstan_redis_t *r) { return r->name; }
redisContext *capstan_redis_ctx(capstan_redis_t *r) { return r->broken ? NULL : r->c; }

static int ensure(capstan_redis_t *r)
{
    if (!r->broken && r->c && r->c->err)
        fail_io(r, "connection"); /* a handler's own command on capstan_job_redis() failed */
    if (!r->broken && stale(r)) {
        r->broken = 1;
        forget_sent(r);
        snprintf(r->errstr, sizeof(r->errstr), "%s: reconnecting: the server was demoted to a "
                 "replica (READONLY)", r->name);
    }
    if (r->broken || !r->c) {
        if (!r->errstr[0])
            snprintf(r->errstr, sizeof(r->errstr), "%s: not connected", r->name);
        return CAPSTAN_EREDIS;
    }
    if (r->need_load && r->qlen == 0)
        return load_scripts(r) ? CAPSTAN_EREDIS : 0;
    return 0;
}

int capstan_redis_append(capstan_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    if (ensure(r))
        return CAPSTAN_EREDIS;
    size_t l[MAX_ARGS];
    if (!lens) {
        if (argc > MAX_ARGS)
            return CAPSTAN_EINVAL;
        for (int i = 0; i < argc; i++)
            l[i] = strlen(argv[i]);
        lens = l;
    }
    if (remember_sent(r, NULL, 0))
        return CAPSTAN_ENOMEM;
    return put_command(r->c, argc, argv, lens) == REDIS_OK ? 0 : fail_io(r, "append");
}

static int is_noscript(const redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0;
}

/* A reply that says this server is no longer the master drops the
 * connection, so its owner reconnects instead of taking it for a refusal.
 * Through sentinels, the reconnect asks them where the master is now (and
 * LOADING, a server that cannot serve yet, does the same). On a plain URL
 * the address may now lead to the new master (a managed service's
 * failover name), and every connection of the process reconnects, since
 * all were made to the demoted server. */
static void drop_if_demoted(capstan_redis_t *r, const redisReply *rep)
{
    if (!rep || rep->type != REDIS_REPLY_ERROR)
        return;
    int readonly = strncmp(rep->str, "READONLY", 8) == 0;
    if (!readonly && !(r->url.sentinel && strncmp(rep->str, "LOADING", 7) == 0))
        return;
    r->broken = 1;
    forget_sent(r);
    if (r->url.sentinel)
        return;
    /* A reply read late (a round trip read after a job) on a connection of
     * an earlier era starts nothing: the server may be a master again by
     * now. */
    if (end_era(r) && !atomic_exchange(&demoted, 1))
        capstan_warn("%s answered READONLY: it is a replica now; every connection reconnects, "
                     "with backoff until the address leads to a master", r->name);
}

/* Marks a connection failed as hiredis marks a socket's, after a read or
 * write that went wrong (errno 0: the server closed it). */
static int io_error(redisContext *c)
{
    c->err = REDIS_ERR_IO;
    snprintf(c->errstr, sizeof(c->errstr), "%s",
             errno == EAGAIN ? "Resource temporarily unavailable (timeout)"
             : errno ? strerror(errno) : "Server closed the connection");
    return REDIS_ERR;
}

static int tls_ms(const capstan_redis_t *r)
{
    return r->timeout < 2e6 ? (int)(r->timeout * 1000) : 2000000000;
}

/* Sends what hiredis holds: through the TLS session, or the socket. A
 * server that closed the connection makes the write fail with EPIPE, never
 * kill the program with SIGPIPE (nopipe.h). */
static int send_held(capstan_redis_t *r)
{
    redisContext *c = r->c;
    size_t len = sdslen(c->obuf);
    if (len == 0)
        return REDIS_OK;
    if (!r->tls) {
        /* send(2) takes MSG_NOSIGNAL: no signal mask to change on every
         * round trip of the plain path. */
        for (size_t off = 0; off < len;) {
            ssize_t n = send(c->fd, c->obuf + off, len - off, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return io_error(c);
            off += (size_t)n;
        }
        sdsclear(c->obuf);
        return REDIS_OK;
    }
    capstan_nopipe_t np;
    capstan__nopipe_begin(&np);
    int rc = REDIS_OK;
    if (capstan__tls_send(r->tls, c->obuf, len, tls_ms(r)) != 0)
        rc = io_error(c);
    else
        sdsclear(c->obuf);
    capstan__nopipe_end(&np, rc != REDIS_OK);
    return rc;
}

/* Reads what the server sent into buf (at least a byte, waiting up to the
 * connection's timeout); 0 or less with errno set on failure. */
static long recv_some(capstan_redis_t *r, char *buf, size_t len)
{
    if (r->tls)
        return capstan__tls_recv(r->tls, buf, len, tls_ms(r));
    ssize_t n;
    do {
        errno = 0;
        n = read(r->c->fd, buf, len);
    } while (n < 0 && errno == EINTR);
    return n;
}

/* After the last reply a caller waited for, a read buffer left large (a
 * sweep's reply of a hundred jobs) is given back: hiredis would keep it
 * until the connection's next read, on every connection of the process. */
static void trim_reader(redisReader *rd)
{
    if (rd->pos != rd->len || sdsalloc(rd->buf) <= READ_CHUNK)
        return;
    sds empty = sdsempty();
    if (!empty)
        return;
    sdsfree(rd->buf);
    rd->buf = empty;
    rd->pos = rd->len = 0;
}

/* Reads what the server sent into the connection's reader: 1; 0 when the
 * read failed (errno set, as recv_some leaves it); -1 when the reader
 * refused the bytes (its error, or no memory). A socket's bytes go
 * straight into the reader's buffer, READ_ROOM at a time: a sweep's reply
 * of many jobs comes in one read rather than in pieces copied through the
 * stack. A TLS session's go through a chunk on the stack. */
static int feed_reader(capstan_redis_t *r)
{
    redisReader *rd = r->c->reader;
    long n;
    if (r->tls) {
        char buf[READ_CHUNK];
        if ((n = recv_some(r, buf, sizeof(buf))) <= 0)
            return 0;
        return redisReaderFeed(rd, buf, (size_t)n) == REDIS_OK ? 1 : -1;
    }
    sds b = rd->err ? NULL : sdsMakeRoomFor(rd->buf, READ_ROOM);
    if (!b)
        return -1;
    rd->buf = b;
    if ((n = recv_some(r, b + sdslen(b), READ_ROOM)) <= 0)
        return 0;
    sdsIncrLen(b, (int)n);
    rd->len = sdslen(b);
    return 1;
}

/* redisGetReply, with the commands hiredis holds sent and the reply read
 * by this thread (for TLS, through the session, not the socketpair and
 * the copying thread), and read in chunks small enough that a thread's
 * stack stays small. On failure c->err is set, as hiredis would. */
static int get_reply(capstan_redis_t *r, void **rep)
{
    redisContext *c = r->c;
    if (c->err || redisGetReplyFromReader(c, rep) != REDIS_OK)
        return REDIS_ERR;
    if (*rep)
        return REDIS_OK;
    if (send_held(r) != REDIS_OK)
        return REDIS_ERR;
    while (!*rep) {
        int fed = feed_reader(r);
        if (fed == 0)
            return io_error(c);
        if (fed < 0) {
            c->err = c->reader->err ? c->reader->err : REDIS_ERR_OOM;
            snprintf(c->errstr, sizeof(c->errstr), "%s",
                     c->reader->err ? c->reader->errstr : "Out of memory");
            return REDIS_ERR;
        }
        if (redisGetReplyFromReader(c, rep) != REDIS_OK)
            return REDIS_ERR;
    }
    return REDIS_OK;
}

int capstan__redis_flush(capstan_redis_t *r)
{
    if (r->broken || !r->c)
        return CAPSTAN_EREDIS;
    return send_held(r) == REDIS_OK ? 0 : fail_io(r, "write");
}

static int read_wire(capstan_redis_t *r, redisReply **out)
{
    void *rep = NULL;
    if (get_reply(r, &rep) != REDIS_OK || !rep)
        return fail_io(r, "read");
    if (r->qlen == 0)
        trim_reader(r->c->reader);
    *out = rep;
    return 0;
}

/* e's EVALSHA met NOSCRIPT: Redis lost its scripts (SCRIPT FLUSH, or a
 * restart or failover behind a proxy) and did not run it. It is sent again
 * once the scripts are loaded, which needs the connection idle: the
 * replies to the commands sent after it are read first and kept for their
 * turn. fresh: rep came off the wire now, so the scripts are surely gone;
 * a kept one is first sent again as it is, as they were loaded since. */
static redisReply *send_again(capstan_redis_t *r, const sent_t *e, redisReply *rep, int fresh)
{
    for (size_t i = 0; i < r->qlen; i++) {
        sent_t *x = &r->q[r->qhead + i];
        if (!x->early && read_wire(r, &x->early))
            goto fail;
    }
    for (int attempt = 0; attempt < 2 && is_noscript(rep); attempt++) {
        if ((fresh || attempt > 0) && load_scripts(r))
            goto fail;
        freeReplyObject(rep);
        rep = NULL;
        if (redisAppendFormattedCommand(r->c, e->cmd, e->len) != REDIS_OK) {
            fail_io(r, "append");
            return NULL;
        }
        if (read_wire(r, &rep))
            return NULL;
    }
    return rep;
fail:
    freeReplyObject(rep);
    return NULL;
}

redisReply *capstan_redis_get_reply(capstan_redis_t *r)
{
    if (r->broken || !r->c)
        return NULL;
    sent_t e = { 0 };
    if (r->qlen > 0) {
        e = r->q[r->qhead++];
        if (--r->qlen == 0)
            r->qhead = 0;
    }
    redisReply *rr = e.early;
    if (rr || read_wire(r, &rr) == 0) {
        if (e.cmd && is_noscript(rr))
            rr = send_again(r, &e, rr, !e.early);
        if (is_noscript(rr))
            r->need_load = 1;
        if (rr && rr->type == REDIS_REPLY_ERROR) /* so callers that only see a code can say why */
            snprintf(r->errstr, sizeof(r->errstr), "%s: %s", r->name, rr->str);
        drop_if_demoted(r, rr);
    }
    free(e.cmd);
    return rr;
}

redisReply *capstan_redis_cmd(capstan_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    if (capstan_redis_append(r, argc, argv, lens))
        return NULL;
    return capstan_redis_get_reply(r);
}

redisReply *capstan_redis_cmdf(capstan_redis_t *r, const char *fmt, ...)
{
    if (ensure(r))
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(r->c, fmt, ap);
    va_end(ap);
    if (rc != REDIS_OK) {
        fail_io(r, "append");
        return NULL;
    }
    if (remember_sent(r, NULL, 0)) {
        /* The command is in hiredis's buffer with no place in the queue. */
        fail_io(r, "out of memory");
        return NULL;
    }
    return capstan_redis_get_reply(r);
}

/* Appends EVALSHA sha nkeys args... (stack arrays for the usual short
 * calls, heap for long recovery batches). */
int capstan__redis_append_script(capstan_redis_t *r, capstan_script_t s, int nkeys, int argc,
                                 const char **argv, const size_t *lens)
{
    const char *sav[MAX_ARGS + 3], **av = sav;
    size_t sal[MAX_ARGS + 3], *al = sal;
    char nk[CAPSTAN_FMT_INT];
    if (argc < 0)
        return CAPSTAN_EINVAL;
    if (argc > MAX_ARGS) {
        av = malloc((size_t)(argc + 3) * sizeof(*av));
        al = malloc((size_t)(argc + 3) * sizeof(*al));
    }
    int rc = av && al ? ensure(r) : CAPSTAN_ENOMEM;
    /* ensure() has connected, and so loaded the scripts and learnt their
     * digests. */
    const char *sha = rc ? NULL : capstan__script_sha(s);
    if (!rc && !sha)
        rc = CAPSTAN_EINVAL;
    if (!rc) {
        capstan__fmt_int(nk, nkeys);
        av[0] = "EVALSHA";
        av[1] = sha;
        av[2] = nk;
        for (int i = 0; i < 3; i++)
            al[i] = strlen(av[i]);
        for (int i = 0; i < argc; i++) {
            av[3 + i] = argv[i];
            al[3 + i] = lens ? lens[i] : strlen(argv[i]);
        }
        /* Formatted here and kept until its reply is read, to be sent
         * again should it meet NOSCRIPT. */
        size_t len;
        char *cmd = resp_format(argc + 3, av, al, &len);
        if (!cmd || remember_sent(r, cmd, len)) {
            free(cmd);
            rc = CAPSTAN_ENOMEM;
        } else if (redisAppendFormattedCommand(r->c, cmd, len) != REDIS_OK) {
            rc = fail_io(r, "append");
        }
    }
    if (av != sav)
        free(av);
    if (al != sal)
        free(al);
    return rc;
}

redisReply *capstan__redis_script(capstan_redis_t *r, capstan_script_t s, int nkeys, int argc,
                                  const char **argv, const size_t *lens)
{
    /* A NOSCRIPT is dealt with by capstan_redis_get_reply. */
    if (capstan__redis_append_script(r, s, nkeys, argc, argv, lens))
        return NULL;
    return capstan_redis_get_reply(r);
}
