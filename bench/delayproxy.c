/* delayproxy: a TCP proxy on loopback that delivers every byte a fixed
 * delay after it arrived, in each direction, so bench/run can measure a
 * worker whose Redis is "far away" on a kernel without tc netem.
 *
 *   delayproxy UPSTREAM_PORT DELAY_US [MAX_SECONDS]
 *
 * Listens on 127.0.0.1 on a free port, prints that port on stdout, and
 * forwards each accepted connection to 127.0.0.1:UPSTREAM_PORT. A round trip
 * through it costs 2 x DELAY_US more. One thread: epoll, a signalfd (TERM,
 * INT and HUP stop it), and one timerfd for the delay queue. The delay is
 * the same for every chunk, so chunks fall due in arrival order and one FIFO
 * serves as the timer queue. Bounded: MAX_CONNS connections, QUEUE_MAX bytes
 * in flight per direction (reading pauses beyond it), MAX_SECONDS of life
 * (default 3600), and it exits when its parent dies. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

enum { MAX_CONNS = 512, READ_MAX = 64 * 1024, QUEUE_MAX = 8 * 1024 * 1024 };

typedef struct conn conn_t;

/* One socket of a proxied pair. */
typedef struct end {
    conn_t *conn;
    int side;          /* 0 = client, 1 = upstream */
    int fd;
    int reading;       /* 0 after EOF, or while its direction is over QUEUE_MAX */
    int eof;           /* read side saw EOF */
    int watching;      /* events currently registered */
} end_t;

/* Bytes flowing towards one end: due bytes not yet written, and how many
 * bytes are still in the delay queue for it. */
typedef struct outq {
    char *buf;
    size_t off, len, cap;
    size_t delayed;
    int eof;           /* the source closed: shut the write side once flushed */
    int shut;
} outq_t;

struct conn {
    end_t end[2];
    outq_t out[2];     /* out[i]: towards end[i] */
    int refs;          /* chunks of this conn in the delay queue */
    int dead;
    conn_t *next_dead; /* closed pairs wait here until nothing refers to them */
};

typedef struct chunk {
    struct chunk *next;
    conn_t *conn;
    int to;            /* index of the destination end */
    int eof;
    double due;
    size_t len;
    char data[];
} chunk_t;

static int ep, tfd;
static chunk_t *head, *tail;
static int nconns;
static conn_t *graveyard;
static double delay_s;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void arm_timer(void)
{
    struct itimerspec its = {0};
    if (head) {
        double due = head->due;
        its.it_value.tv_sec = (time_t)due;
        its.it_value.tv_nsec = (long)((due - (double)(time_t)due) * 1e9);
        if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
            its.it_value.tv_nsec = 1;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void watch(end_t *e)
{
    if (e->fd < 0)
        return;
    outq_t *o = &e->conn->out[e->side];
    int want = (e->reading ? EPOLLIN : 0) | (o->len > o->off ? EPOLLOUT : 0);
    if (want == e->watching)
        return;
    struct epoll_event ev = { .events = (uint32_t)want, .data.ptr = e };
    epoll_ctl(ep, EPOLL_CTL_MOD, e->fd, &ev);
    e->watching = want;
}

static void conn_close(conn_t *c)
{
    if (c->dead)
        return;
    c->dead = 1;
    for (int i = 0; i < 2; i++) {
        if (c->end[i].fd >= 0)
            close(c->end[i].fd); /* also drops it from the epoll set */
        c->end[i].fd = -1;
        free(c->out[i].buf);
        c->out[i].buf = NULL;
    }
    nconns--;
    c->next_dead = graveyard;
    graveyard = c;
}

/* Frees closed pairs no queued chunk and no pending event refers to; called
 * between epoll batches only. */
static void bury(void)
{
    conn_t **pp = &graveyard;
    while (*pp) {
        conn_t *c = *pp;
        if (c->refs == 0) {
            *pp = c->next_dead;
            free(c);
        } else {
            pp = &c->next_dead;
        }
    }
}

/* Both directions closed and flushed: the pair is finished. */
static void maybe_finish(conn_t *c)
{
    if (c->out[0].shut && c->out[1].shut && !c->end[0].reading && !c->end[1].reading)
        conn_close(c);
}

/* Writes what is due towards end `to`; returns -1 when the pair broke. */
static int flush(conn_t *c, int to)
{
    outq_t *o = &c->out[to];
    end_t *e = &c->end[to];
    while (o->len > o->off) {
        ssize_t n = write(e->fd, o->buf + o->off, o->len - o->off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0)
            return -1;
        o->off += (size_t)n;
    }
    if (o->off == o->len)
        o->off = o->len = 0;
    if (o->eof && o->len == 0 && !o->shut) {
        shutdown(e->fd, SHUT_WR);
        o->shut = 1;
    }
    /* Reading from the source resumes once its direction drains. */
    end_t *src = &c->end[1 - to];
    if (!src->reading && !src->eof && o->delayed + o->len < QUEUE_MAX / 2)
        src->reading = 1;
    watch(e);
    watch(src);
    maybe_finish(c);
    return 0;
}

static int deliver(chunk_t *k)
{
    conn_t *c = k->conn;
    outq_t *o = &c->out[k->to];
    o->delayed -= k->len;
    if (k->eof) {
        o->eof = 1;
    } else if (k->len) {
        if (o->len + k->len > o->cap) {
            size_t cap = o->cap ? o->cap : 4096;
            while (cap < o->len + k->len)
                cap *= 2;
            char *nb = realloc(o->buf, cap);
            if (!nb)
                return -1;
            o->buf = nb;
            o->cap = cap;
        }
        memcpy(o->buf + o->len, k->data, k->len);
        o->len += k->len;
    }
    return flush(c, k->to);
}

static void on_timer(void)
{
    uint64_t ticks;
    if (read(tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
        return;
    double now = mono();
    while (head && head->due <= now) {
        chunk_t *k = head;
        head = k->next;
        if (!head)
            tail = NULL;
        conn_t *c = k->conn;
        if (!c->dead && deliver(k) < 0)
            conn_close(c);
        c->refs--;
        free(k);
    }
    arm_timer();
}

static int enqueue(conn_t *c, int to, const char *data, size_t len, int eof)
{
    chunk_t *k = malloc(sizeof(*k) + len);
    if (!k)
        return -1;
    k->next = NULL;
    k->conn = c;
    k->to = to;
    k->eof = eof;
    k->len = len;
    k->due = mono() + delay_s;
    memcpy(k->data, data, len);
    int was_empty = head == NULL;
    if (tail)
        tail->next = k;
    else
        head = k;
    tail = k;
    c->refs++;
    c->out[to].delayed += len;
    if (was_empty)
        arm_timer();
    return 0;
}

static void on_readable(end_t *e)
{
    static char buf[READ_MAX];
    conn_t *c = e->conn;
    int to = 1 - e->side;
    ssize_t n = read(e->fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n < 0) {
        conn_close(c);
        return;
    }
    if (n == 0) {
        e->reading = 0;
        e->eof = 1;
        if (enqueue(c, to, NULL, 0, 1) < 0)
            conn_close(c);
        else
            watch(e);
        return;
    }
    if (enqueue(c, to, buf, (size_t)n, 0) < 0) {
        conn_close(c);
        return;
    }
    if (c->out[to].delayed + c->out[to].len > QUEUE_MAX) {
        e->reading = 0;
        watch(e);
    }
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Redis replies are small: Nagle would add its own delay to ours. */
static int nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void on_accept(int lfd, int upstream_port)
{
    for (;;) {
        int cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0)
            return;
        if (nconns >= MAX_CONNS) {
            close(cfd);
            continue;
        }
        int ufd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)upstream_port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        /* A blocking connect on loopback completes at once (or fails). */
        if (ufd < 0 || connect(ufd, (struct sockaddr *)&a, sizeof(a)) < 0) {
            if (ufd >= 0)
                close(ufd);
            close(cfd);
            continue;
        }
        if (set_nonblock(ufd) < 0) {
            close(ufd);
            close(cfd);
            continue;
        }
        conn_t *c = calloc(1, sizeof(*c));
        if (!c) {
            close(ufd);
            close(cfd);
            continue;
        }
        int fds[2] = { nodelay(cfd), nodelay(ufd) };
        for (int i = 0; i < 2; i++) {
            c->end[i] = (end_t){ .conn = c, .side = i, .fd = fds[i], .reading = 1,
                                 .watching = EPOLLIN };
            struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &c->end[i] };
            epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
        }
        nconns++;
    }
}

static long arg(const char *s, long min, long max)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || v < min || v > max) {
        fprintf(stderr, "delayproxy: bad argument %s\n", s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: delayproxy UPSTREAM_PORT DELAY_US [MAX_SECONDS]\n");
        return 2;
    }
    int upstream = (int)arg(argv[1], 1, 65535);
    delay_s = (double)arg(argv[2], 0, 10000000) / 1e6;
    double life = argc > 3 ? (double)arg(argv[3], 1, 86400) : 3600;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    prctl(PR_SET_TIMERSLACK, 1UL); /* the default 50 us slack would add to the delay */

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (getppid() == 1)
        return 0; /* the parent died before prctl took effect */

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = 0,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof(a);
    if (sfd < 0 || lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0
        || listen(lfd, 128) < 0 || getsockname(lfd, (struct sockaddr *)&a, &alen) < 0) {
        perror("delayproxy");
        return 1;
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ep < 0 || tfd < 0) {
        perror("delayproxy");
        return 1;
    }
    /* Tags for the three fds that are not proxied sockets. */
    static char tag_listen, tag_timer, tag_signal;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &tag_listen };
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    ev.data.ptr = &tag_timer;
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
    ev.data.ptr = &tag_signal;
    epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev);
    printf("%d\n", ntohs(a.sin_port));
    fflush(stdout);

    double end = mono() + life;
    int running = 1;
    while (running && mono() < end) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, 1000);
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &tag_listen) {
                on_accept(lfd, upstream);
            } else if (p == &tag_timer) {
                on_timer();
            } else if (p == &tag_signal) {
                running = 0;
            } else {
                end_t *e = p;
                conn_t *c = e->conn;
                if (c->dead)
                    continue;
                if ((evs[i].events & EPOLLERR)
                    || ((evs[i].events & EPOLLHUP) && !e->reading)) {
                    conn_close(c); /* the peer is gone for good */
                    continue;
                }
                if (evs[i].events & (EPOLLIN | EPOLLHUP))
                    on_readable(e);
                if (!c->dead && (evs[i].events & EPOLLOUT) && flush(c, e->side) < 0)
                    conn_close(c);
            }
        }
        bury();
    }
    return 0;
}
