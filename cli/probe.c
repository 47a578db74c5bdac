/* `capstan probe`: asks a running capstan's /readyz or /livez on its
 * metrics port, for a container's health check where no curl or wget is
 * installed. The port and address are the ones `capstan run` would serve,
 * read through the same config file and settings table. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "capstan/config.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "config/settings.h"
#include "support/time.h"

/* Nothing answered on the port (EX_UNAVAILABLE would say Redis; this is
 * the probe's own "no answer"). */
#define EXIT_NO_ANSWER 2

static const char *usage =
    "Usage: capstan probe [live|ready] [options]\n"
    "\n"
    "Asks the capstan serving the metrics port for GET /readyz (ready, the\n"
    "default) or /livez (live), and prints the first line of its answer.\n"
    "Exits 0 on 200, 1 on any other status (503, with the reason), 2 when\n"
    "nothing answers within the timeout, 78 when no port is configured.\n"
    "\n"
    "  -C, --config FILE   the capstan.yml whose metrics_port and metrics_bind\n"
    "                      apply\n"
    "  -e, --environment ENV  the environment whose section applies\n"
    "      --port PORT     the metrics port (default: the file's metrics_port)\n"
    "      --bind ADDR     its address (default: the file's metrics_bind,\n"
    "                      else 127.0.0.1)\n"
    "      --timeout SECONDS  give up after this long (default 3)\n"
    "  -h, --help          this help\n";

/* Sets setting key of cfg from a flag's text, through its row of the
 * settings table; 0, or a usage error said on stderr. */
static int set_flag(capstan_config_t *cfg, const char *key, const char *flag, const char *text)
{
    char why[CAPSTAN_ERRLEN];
    const capstan__setting_t *s = capstan__setting_by_key(key);
    int rc = capstan__setting_set(cfg, s, text, why);
    if (rc == 0)
        return 0;
    fprintf(stderr, "capstan probe: --%s: %s (got \"%s\")\n", flag, rc == CAPSTAN_ECONFIG ? why : "out of memory",
            text);
    return CAPSTAN_EXIT_USAGE;
}

/* A socket connected to addr:port within the deadline, or -1 with the
 * reason in err. */
static int dial(const char *addr, int port, double deadline, char *err, size_t errlen)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV }, *res, *ai;
    char portstr[8];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int rc = getaddrinfo(addr, portstr, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "%s", gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    snprintf(err, errlen, "no address");
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            snprintf(err, errlen, "%s", strerror(errno));
            continue;
        }
        int e = connect(fd, ai->ai_addr, ai->ai_addrlen) ? errno : 0;
        if (e == EINPROGRESS) {
            struct pollfd p = { .fd = fd, .events = POLLOUT };
            double left = deadline - capstan__now();
            int n = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
            socklen_t len = sizeof(e);
            if (n == 0)
                e = ETIMEDOUT;
            else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len))
                e = errno;
        }
        if (e) {
            snprintf(err, errlen, "%s", strerror(e));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

/* Sends the request and reads the whole answer (the server closes after
 * one) into buf, NUL-terminated. Returns its length, or -1 with err set. */
static long exchange(int fd, const char *path, double deadline, char *buf, size_t size, char *err,
                     size_t errlen)
{
    char req[128];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nConnection: close\r\n\r\n", path);
    size_t sent = 0, got = 0;
    while (1) {
        struct pollfd p = { .fd = fd, .events = sent < (size_t)n ? POLLOUT : POLLIN };
        double left = deadline - capstan__now();
        int r = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
        if (r == 0) {
            snprintf(err, errlen, "no answer within the timeout");
            return -1;
        }
        if (r < 0 && errno == EINTR)
            continue;
        ssize_t k = r < 0 ? -1
                    : sent < (size_t)n ? send(fd, req + sent, (size_t)n - sent, MSG_NOSIGNAL)
                                       : recv(fd, buf + got, size - 1 - got, 0);
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (k < 0) {
            snprintf(err, errlen, "%s", strerror(errno));
            return -1;
        }
        if (sent < (size_t)n) {
            sent += (size_t)k;
            continue;
        }
        got += (size_t)k;
        if (k == 0 || got == size - 1) /* closed, or more than a probe says */
            break;
    }
    buf[got] = '\0';
    return (long)got;
}

int capstan__cmd_probe(int argc, char **argv)
{
    enum { OPT_PORT = 256, OPT_BIND, OPT_TIMEOUT };
    static const struct option longopts[] = {
        { "config", required_argument, NULL, 'C' }, { "environment", required_argument, NULL, 'e' },
        { "port", required_argument, NULL, OPT_PORT }, { "bind", required_argument, NULL, OPT_BIND },
        { "timeout", required_argument, NULL, OPT_TIMEOUT }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *conf = NULL, *env = NULL, *port = NULL, *bind = NULL;
    double timeout = 3;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "C:e:h", longopts, NULL)) != -1) {
        char *end;
        switch (opt) {
        case 'C': conf = optarg; break;
        case 'e': env = optarg; break;
        case OPT_PORT: port = optarg; break;
        case OPT_BIND: bind = optarg; break;
        case OPT_TIMEOUT:
            timeout = strtod(optarg, &end);
            if (end == optarg || *end || !(timeout > 0 && timeout <= 3600)) {
                fprintf(stderr, "capstan probe: --timeout: must be a number of seconds above 0, at most "
                                "3600 (got \"%s\")\n", optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            break;
        case 'h': fputs(usage, stdout); return 0;
        default:
            fprintf(stderr, "capstan probe: %s: unknown option or missing value\n\n%s", argv[optind - 1],
                    usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    const char *what = optind < argc ? argv[optind++] : "ready";
    if (optind < argc || (strcmp(what, "ready") && strcmp(what, "live"))) {
        fprintf(stderr, "capstan probe: unexpected argument \"%s\"\n\n%s", optind < argc ? argv[optind] : what,
                usage);
        return CAPSTAN_EXIT_USAGE;
    }
    const char *path = !strcmp(what, "ready") ? "/readyz" : "/livez";

    /* The file first, then the flags over it, as `capstan run` reads them. */
    char err[CAPSTAN_ERRLEN];
    capstan_config_t *cfg = capstan_config_new();
    if (cfg && env)
        capstan_config_set_str(&cfg->environment, env);
    if (!cfg || (conf && capstan_config_load_file(cfg, conf, err))) {
        fprintf(stderr, "capstan probe: %s\n", cfg ? err : "out of memory");
        capstan_config_free(cfg);
        return CAPSTAN_EXIT_CONFIG;
    }
    int status = 0;
    if ((port && (status = set_flag(cfg, "metrics_port", "port", port))) ||
        (bind && (status = set_flag(cfg, "metrics_bind", "bind", bind)))) {
        capstan_config_free(cfg);
        return status;
    }
    if (cfg->metrics_port == 0) {
        fprintf(stderr, "capstan probe: no metrics port configured: pass --port PORT, or -C FILE whose "
                        "metrics_port is set (as `capstan run --metrics-port PORT` serves the probes)\n");
        capstan_config_free(cfg);
        return CAPSTAN_EXIT_CONFIG;
    }
    const char *addr = cfg->metrics_bind && *cfg->metrics_bind ? cfg->metrics_bind : "127.0.0.1";
    double deadline = capstan__now() + timeout;
    char buf[4096];
    long len = -1;
    int fd = dial(addr, cfg->metrics_port, deadline, err, sizeof(err));
    if (fd >= 0) {
        len = exchange(fd, path, deadline, buf, sizeof(buf), err, sizeof(err));
        close(fd);
    }
    int code = 0;
    if (len >= 0 && sscanf(buf, "HTTP/1.%*1[0-9] %3d", &code) != 1)
        snprintf(err, sizeof(err), "not an HTTP answer");
    if (code == 0) {
        fprintf(stderr, "capstan probe: no capstan probe on %s:%d: %s\n", addr, cfg->metrics_port, err);
        capstan_config_free(cfg);
        return EXIT_NO_ANSWER;
    }
    char *body = strstr(buf, "\r\n\r\n");
    body = body ? body + 4 : buf + len;
    body[strcspn(body, "\r\n")] = '\0';
    if (code == 200)
        printf("%s\n", body);
    else
        printf("%s %d: %s\n", path, code, body);
    capstan_config_free(cfg);
    return code == 200 ? 0 : 1;
}
