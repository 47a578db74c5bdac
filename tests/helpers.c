/* The shared test fixture (see helpers.h). */
#include "helpers.h"

#include "fetch/fetch.h"
#include "capstan/client.h"
#include "capstan/config.h"
#include "capstan/runtime.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t server_pid;
static char server_dir[256];

double kt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double kt_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

char *kt_write_conf(const char *extra)
{
    char *body = NULL;
    cr_assert(asprintf(&body, "poll_interval_average: 1\nheartbeat_interval: 1\n%s",
                       extra ? extra : "") > 0);
    char *path = kt_write_file("capstan.yml", body);
    free(body);
    return path;
}

void kt_sleep(double s)
{
    struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

/* Ports are drawn below the kernel's ephemeral range (32768 on): a port
 * from bind(0) is one an outgoing connection may take before the server
 * binds it. Never the same one twice in a process, so two servers of one
 * test never get one port; at random, so test programs running at once
 * rarely meet (kt_server_start also checks the server is its own). */
enum { PORT_LO = 10000, PORT_HI = 32000 };

int kt_free_port(void)
{
    static unsigned char given[PORT_HI - PORT_LO];
    static unsigned seed;
    static pid_t seeded_by; /* a test forked from the runner draws its own */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (seeded_by != getpid()) {
        seeded_by = getpid();
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^ (unsigned)(kt_now() * 1e6);
    }
    int port = -1;
    for (int tries = 0; tries < 1000 && port < 0; tries++) {
        int p = PORT_LO + (int)(rand_r(&seed) % (PORT_HI - PORT_LO));
        if (given[p - PORT_LO])
            continue;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
            given[p - PORT_LO] = 1;
            port = p;
        }
        if (fd >= 0)
            close(fd);
    }
    pthread_mutex_unlock(&mu);
    return port;
}

/* Whether the server on port is the process pid (INFO's process_id): a
 * server that failed to bind leaves the port to whoever holds it. */
static int server_is(redisContext *c, pid_t pid)
{
    redisReply *r = redisCommand(c, "INFO server");
    const char *at = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "process_id:") : NULL;
    int mine = at && atol(at + 11) == (long)pid;
    freeReplyObject(r);
    return mine;
}

static int server_start_on(int port)
{
    char portbuf[16], logf[300];
    snprintf(portbuf, sizeof(portbuf), "%d", port);
    snprintf(logf, sizeof(logf), "%s/redis.log", server_dir);
    server_pid = fork();
    if (server_pid == 0) {
        execlp("redis-server", "redis-server", "--port", portbuf, "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--databases", "10000", "--dir", server_dir,
               "--logfile", logf, (char *)NULL);
        perror("redis-server");
        _exit(127);
    }
    for (int i = 0; i < 250; i++) {
        if (waitpid(server_pid, NULL, WNOHANG) == server_pid)
            return -1; /* it could not have the port */
        redisContext *c = redisConnect("127.0.0.1", port);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS && server_is(c, server_pid);
            freeReplyObject(r);
            if (ok && getenv("KT_RESTRICTED_USER")) {
                /* What managed services allow: everything but @dangerous. */
                r = redisCommand(c, "ACL SETUSER capstan on >capstan-secret ~* &* +@all -@dangerous");
                ok = r && r->type == REDIS_REPLY_STATUS;
                freeReplyObject(r);
            }
            redisFree(c);
            if (ok) {
                setenv("KT_REDIS_PORT", portbuf, 1);
                setenv("KT_TMP", server_dir, 1);
                return 0;
            }
        } else {
            redisFree(c);
        }
        kt_sleep(0.02);
    }
    fprintf(stderr, "redis-server did not start on port %d (see %s)\n", port, logf);
    exit(1);
}

void kt_server_start(void)
{
    if (getenv("KT_REDIS_PORT"))
        return;
    snprintf(server_dir, sizeof(server_dir), "/tmp/capstan-test-XXXXXX");
    if (!mkdtemp(server_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    for (int tries = 0; tries < 5; tries++)
        if (server_start_on(kt_free_port()) == 0)
            return;
    fprintf(stderr, "redis-server did not start on 5 ports (see %s/redis.log)\n", server_dir);
    exit(1);
}

void kt_server_stop(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGTERM);
        waitpid(server_pid, NULL, 0);
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", server_dir);
        if (getenv("KT_KEEP")) /* to read the servers' logs after a failure */
            fprintf(stderr, "kept %s\n", server_dir);
        else if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", server_dir);
    }
}

ReportHook(PRE_ALL)(struct criterion_test_set *set)
{
    (void)set;
    kt_server_start();
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    (void)stats;
    kt_server_stop();
}

static int port(void)
{
    const char *p = getenv("KT_REDIS_PORT");
    cr_assert(p, "the redis fixture is not running (KT_FIXTURE missing?)");
    return atoi(p);
}

static int test_db = -1;
static redisContext *conn;
static char url[128];

static int db(void)
{
    if (test_db < 0) {
        redisContext *c = redisConnect("127.0.0.1", port());
        cr_assert(c && !c->err, "cannot connect to the test redis");
        redisReply *r = redisCommand(c, "INCR kt:next-db");
        cr_assert(r && r->type == REDIS_REPLY_INTEGER);
        test_db = (int)r->integer;
        freeReplyObject(r);
        redisFree(c);
    }
    return test_db;
}

const char *kt_url(void)
{
    /* capstan and Ruby connect as the restricted user when there is one; the
     * fixture's own connection (kt_redis) stays the default user. */
    if (!url[0])
        snprintf(url, sizeof(url), "redis://%s127.0.0.1:%d/%d",
                 getenv("KT_RESTRICTED_USER") ? "capstan:capstan-secret@" : "", port(), db());
    return url;
}

const char *kt_admin_url(void)
{
    static char admin[128];
    if (!admin[0])
        snprintf(admin, sizeof(admin), "redis://127.0.0.1:%d/%d", port(), db());
    return admin;
}

redisContext *kt_redis(void)
{
    if (!conn) {
        conn = redisConnect("127.0.0.1", port());
        cr_assert(conn && !conn->err, "cannot connect to the test redis");
        redisReply *r = redisCommand(conn, "SELECT %d", db());
        cr_assert(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
    }
    return conn;
}

static redisReply *vcmd(const char *fmt, va_list ap)
{
    redisReply *r = redisvCommand(kt_redis(), fmt, ap);
    cr_assert(r, "redis command failed: %s", kt_redis()->errstr);
    return r;
}

redisReply *kt_cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(fmt, ap);
    va_end(ap);
    return r;
}

static long long vint_on(redisContext *c, const char *fmt, va_list ap)
{
    redisReply *r = redisvCommand(c, fmt, ap);
    cr_assert(r, "redis command failed: %s", c->errstr);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer
                : r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
    freeReplyObject(r);
    return v;
}

long long kt_int(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    long long v = vint_on(kt_redis(), fmt, ap);
    va_end(ap);
    return v;
}

long long kt_int_on(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    long long v = vint_on(c, fmt, ap);
    va_end(ap);
    return v;
}

void kt_aof_init(kt_aof_redis_t *s, const char *name)
{
    memset(s, 0, sizeof(*s));
    s->port = kt_free_port();
    char *d = kt_tmp(name);
    snprintf(s->dir, sizeof(s->dir), "%s", d);
    free(d);
    cr_assert(mkdir(s->dir, 0700) == 0 || errno == EEXIST, "mkdir %s", s->dir);
    snprintf(s->url, sizeof(s->url), "redis://127.0.0.1:%d/0", s->port);
}

redisContext *kt_aof_connect(const kt_aof_redis_t *s)
{
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "PING");
        int ok = r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (ok)
            return c;
    }
    redisFree(c);
    return NULL;
}

void kt_aof_start(kt_aof_redis_t *s)
{
    char port[16], logf[500];
    snprintf(port, sizeof(port), "%d", s->port);
    snprintf(logf, sizeof(logf), "%s/redis.log", s->dir);
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "yes", "--appendfsync", "always", "--dir", s->dir,
               "--logfile", logf, (char *)NULL);
        _exit(127);
    }
    kt_track(s->pid);
    redisContext *c = NULL;
    cr_assert(KT_WAIT_UNTIL((c = kt_aof_connect(s)) != NULL, 20),
              "private redis-server on %d did not start", s->port);
    redisFree(c);
}

void kt_aof_kill(kt_aof_redis_t *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        kt_untrack(s->pid);
        s->pid = 0;
    }
}

char *kt_str(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcmd(fmt, ap);
    va_end(ap);
    char *s = r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ? strndup(r->str, r->len) : NULL;
    freeReplyObject(r);
    return s;
}

char *kt_tmp(const char *name)
{
    const char *dir = getenv("KT_TMP");
    char *p = malloc(512);
    snprintf(p, 512, "%s/%d-%s", dir ? dir : "/tmp", db(), name);
    return p;
}

char *kt_write_file(const char *name, const char *body)
{
    char *path = kt_tmp(name);
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(body, f);
    fclose(f);
    return path;
}

capstan_redis_t *kt_lib_redis(void)
{
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(kt_url(), 10, err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_eq(capstan_redis_connect(r), 0, "%s", capstan_redis_error(r));
    return r;
}

struct capstan_config *kt_config(int concurrency)
{
    capstan_config_t *cfg = capstan_config_new();
    cr_assert(cfg);
    cr_assert_eq(capstan_config_set_str(&cfg->redis_url, kt_url()), 0);
    cfg->redis_url_explicit = 1;
    cfg->concurrency = concurrency;
    return cfg;
}

/* The one embedded runtime of this test and its thread. */
static pthread_t rt_thread;

static void *rt_main(void *rt)
{
    char err[CAPSTAN_ERRLEN];
    return (void *)(intptr_t)capstan_runtime_run(rt, err);
}

void kt_runtime_start(struct capstan_runtime *rt)
{
    cr_assert_eq(pthread_create(&rt_thread, NULL, rt_main, rt), 0);
}

void kt_runtime_end(struct capstan_runtime *rt)
{
    capstan_runtime_stop(rt);
    void *rc;
    pthread_join(rt_thread, &rc);
    cr_assert_eq((intptr_t)rc, 0);
    capstan_runtime_free(rt);
}

char *kt_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static char *log_path(pid_t pid)
{
    char name[64];
    snprintf(name, sizeof(name), "capstan-%d.log", (int)pid);
    return kt_tmp(name);
}

/* Runs argv with stdout to out_path, and stderr there too unless
 * keep_stderr (then it goes to the test's own stderr, shown on failure). */
static pid_t spawn_env(const char *const *argv, const char *out_path, const char *redis_url,
                       int keep_stderr, const char *const *env);

static pid_t spawn(const char *const *argv, const char *out_path, const char *redis_url,
                   int keep_stderr)
{
    return spawn_env(argv, out_path, redis_url, keep_stderr, NULL);
}

/* spawn, with env (NAME, VALUE pairs, NULL-terminated; NULL for none) set
 * in the child. */
static pid_t spawn_env(const char *const *argv, const char *out_path, const char *redis_url,
                       int keep_stderr, const char *const *env)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        char path[600];
        /* "%d" in out_path stands for the child's pid (known only here). */
        snprintf(path, sizeof(path), out_path, (int)getpid());
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            if (!keep_stderr)
                dup2(fd, 2);
            close(fd);
        }
        if (redis_url)
            setenv("REDIS_URL", redis_url, 1);
        else
            unsetenv("REDIS_URL");
        for (int i = 0; env && env[i] && env[i + 1]; i += 2)
            setenv(env[i], env[i + 1], 1);
        execvp(argv[0], (char *const *)argv);
        perror(argv[0]);
        _exit(127);
    }
    return pid;
}

static pid_t children[64];

pid_t kt_track(pid_t pid)
{
    for (size_t i = 0; i < sizeof(children) / sizeof(children[0]); i++)
        if (!children[i]) {
            children[i] = pid;
            break;
        }
    return pid;
}

void kt_untrack(pid_t pid)
{
    for (size_t i = 0; i < sizeof(children) / sizeof(children[0]); i++)
        if (children[i] == pid)
            children[i] = 0;
}

void kt_kill_children(void)
{
    for (size_t i = 0; i < sizeof(children) / sizeof(children[0]); i++) {
        /* waitpid answers 0 only for a child still running (not yet reaped). */
        if (children[i] > 0 && waitpid(children[i], NULL, WNOHANG) == 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
        }
        children[i] = 0;
    }
}

pid_t kt_capstan_start(const char *const *args)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = getenv("CAPSTAN_BIN");
    argv[n++] = "run";
    argv[n++] = "-r";
    argv[n++] = getenv("CAPSTAN_PLUGIN");
    argv[n++] = "--redis-url";
    argv[n++] = kt_url();
    for (int i = 0; args && args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    cr_assert(argv[0] && argv[3], "CAPSTAN_BIN and CAPSTAN_PLUGIN must be set (run through meson test)");
    char *pattern = kt_tmp("capstan-%d.log");
    pid_t pid = spawn(argv, pattern, kt_url(), 0);
    free(pattern);
    return kt_track(pid);
}

pid_t kt_capstan_shards_start(const char *conf, const char *ledger_dir, const char *const *args)
{
    const char *argv[64] = { getenv("CAPSTAN_BIN"), "run", "-r", getenv("CAPSTAN_SHARDS_PLUGIN"), "-C", conf };
    int n = 6;
    for (int i = 0; args && args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    cr_assert(argv[0] && argv[3], "CAPSTAN_BIN and CAPSTAN_SHARDS_PLUGIN must be set (run through meson test)");
    char *pattern = kt_tmp("capstan-%d.log");
    pid_t pid = spawn_env(argv, pattern, NULL, 0, (const char *const[]){ "CAPSTAN_LEDGER_DIR", ledger_dir, NULL });
    free(pattern);
    return kt_track(pid);
}

void kt_own_server_start(kt_own_server_t *s, const char *name)
{
    char port[16];
    s->port = kt_free_port();
    snprintf(port, sizeof(port), "%d", s->port);
    char *dir = kt_tmp(name);
    cr_assert(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    snprintf(s->url, sizeof(s->url), "redis://127.0.0.1:%d/0", s->port);
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--dir", dir, "--logfile", "redis.log", (char *)NULL);
        _exit(127);
    }
    kt_track(s->pid);
    free(dir);
    struct timeval tv = { 2, 0 };
    s->conn = NULL;
    cr_assert(KT_WAIT_UNTIL(({
        redisFree(s->conn);
        s->conn = redisConnectWithTimeout("127.0.0.1", s->port, tv);
        redisReply *r = s->conn && !s->conn->err ? redisCommand(s->conn, "PING") : NULL;
        int ok = r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        ok; }), 20), "redis-server on port %d did not start", s->port);
}

char *kt_shards_up(kt_aof_redis_t *s, redisContext **c, int n, const char *dir, const char *head, const char *tail)
{
    char yml[4096];
    int len = snprintf(yml, sizeof(yml), "%sshards:\n", head);
    for (int k = 0; k < n; k++) {
        char name[64];
        snprintf(name, sizeof(name), "%s%d", dir, k + 1);
        kt_aof_init(&s[k], name);
        kt_aof_start(&s[k]);
        cr_assert((c[k] = kt_aof_connect(&s[k])) != NULL, "%s does not answer", s[k].url);
        len += snprintf(yml + len, sizeof(yml) - (size_t)len, "  - name: s%d\n    redis_url: %s\n", k + 1, s[k].url);
    }
    snprintf(yml + len, sizeof(yml) - (size_t)len, "%s", tail ? tail : "");
    return kt_write_conf(yml);
}

long kt_ledger_runs(const char *dir, kt_ledger_run_t **runs, long *bad)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/ledger", dir);
    char *text = kt_read_file(path);
    long n = 0, cap = 0;
    *runs = NULL;
    *bad = 0;
    for (char *line = text, *next; line && *line; line = next) {
        if (!(next = strchr(line, '\n')))
            break; /* a line still being written */
        *next++ = '\0';
        kt_ledger_run_t r = { 0 };
        if (sscanf(line, "%8x%16llx %d %lld %lld", &r.tag, &r.i, &r.port, &r.start, &r.end) != 5) {
            ++*bad;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            *runs = realloc(*runs, (size_t)cap * sizeof(**runs));
            cr_assert(*runs);
        }
        (*runs)[n++] = r;
    }
    free(text);
    return n;
}

char *kt_ledger_dir(void)
{
    char *dir = kt_tmp("ledger"), path[600];
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST, "mkdir %s", dir);
    snprintf(path, sizeof(path), "%s/ledger", dir);
    unlink(path);
    return dir;
}

char *kt_capstan_log(pid_t pid)
{
    char *path = log_path(pid);
    char *s = kt_read_file(path);
    free(path);
    return s;
}

pid_t kt_parent_pid(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    char state;
    int ppid;
    return paren && sscanf(paren + 1, " %c %d", &state, &ppid) == 2 ? (pid_t)ppid : -1;
}

int kt_wait_exit(pid_t pid, double timeout)
{
    double end = kt_now() + timeout;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            kt_untrack(pid);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        if (r < 0)
            return -1;
        if (kt_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            kt_untrack(pid);
            return -1;
        }
        kt_sleep(0.02);
    }
}

int kt_capstan_stop(pid_t pid, int sig, double timeout)
{
    kill(pid, sig);
    return kt_wait_exit(pid, timeout);
}

static int run_capture_env(const char *const *argv, char **out, double timeout, int keep_stderr,
                           const char *const *env)
{
    char *path = kt_tmp("run-XXXXXX");
    int fd = mkstemp(path);
    if (fd >= 0)
        close(fd);
    pid_t pid = spawn_env(argv, path, kt_url(), keep_stderr, env);
    int st = kt_wait_exit(pid, timeout);
    if (out)
        *out = kt_read_file(path);
    unlink(path);
    free(path);
    return st;
}

static int run_capture(const char *const *argv, char **out, double timeout, int keep_stderr)
{
    return run_capture_env(argv, out, timeout, keep_stderr, NULL);
}

int kt_capstan_run(const char *const *args, char **out)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = getenv("CAPSTAN_BIN");
    for (int i = 0; args && args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return run_capture(argv, out, 60, 0);
}

static const char *const sidekiq_versions[] = { KT_SIDEKIQ_DEBIAN, "7.3.10", "8.0.10", "8.1.7", NULL };

const char *const *kt_sidekiq_versions(void)
{
    return sidekiq_versions;
}

/* What tests/vendor.sh said for each vendored version, once per process:
 * the RUBYLIB, or (missing set) the line saying why it cannot run. */
static struct {
    int known, missing;
    char line[4096];
} vendored[sizeof(sidekiq_versions) / sizeof(sidekiq_versions[0])];

static int version_index(const char *version)
{
    for (int i = 0; sidekiq_versions[i]; i++)
        if (strcmp(sidekiq_versions[i], version) == 0)
            return i;
    cr_assert_fail("no Sidekiq %s in the tests (kt_sidekiq_versions)", version);
    return -1;
}

const char *kt_sidekiq_rubylib(const char *version)
{
    int i = version_index(version);
    if (strcmp(version, KT_SIDEKIQ_DEBIAN) == 0)
        return "";
    if (!vendored[i].known) {
        const char *src = getenv("CAPSTAN_SRC"), *dest = getenv("KT_VENDOR_DIR");
        cr_assert(src, "CAPSTAN_SRC must be set (run through meson test)");
        char cmd[2048], *line = vendored[i].line;
        snprintf(cmd, sizeof(cmd), "bash '%s/tests/vendor.sh' '%s' '%s'", src,
                 dest ? dest : "/tmp/capstan-test-vendor", version);
        FILE *p = popen(cmd, "r");
        cr_assert(p, "%s: %s", cmd, strerror(errno));
        size_t got = fread(line, 1, sizeof(vendored[i].line) - 1, p);
        line[got] = '\0';
        line[strcspn(line, "\n")] = '\0';
        int st = pclose(p);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        cr_assert(code == 0 || code == 77, "%s exited %d: %s", cmd, code, line);
        vendored[i].missing = code == 77;
        vendored[i].known = 1;
    }
    if (vendored[i].missing)
        cr_skip_test("%s", vendored[i].line);
    return vendored[i].line;
}

void kt_sidekiq_need(const char *version)
{
    (void)kt_sidekiq_rubylib(version);
}

/* The argv of `ruby` running tests/ruby/SCRIPT under version (the prelude
 * that checks it first for a vendored one) into argv, with the
 * environment it needs in env (pairs, see spawn_env). Returns argc. */
static int ruby_argv(const char *version, const char *script, const char **argv, char *path,
                     char *prelude, size_t size, const char **env, char *rubylib, size_t libsize)
{
    const char *lib = kt_sidekiq_rubylib(version);
    const char *src = getenv("CAPSTAN_SRC");
    int n = 0, e = 0;
    snprintf(path, size, "%s/tests/ruby/%s", src, script);
    argv[n++] = "ruby";
    env[e++] = "KT_SIDEKIQ_VERSION";
    env[e++] = version;
    if (*lib) {
        snprintf(prelude, size, "%s/tests/ruby/sidekiq_version.rb", src);
        argv[n++] = "-r";
        argv[n++] = prelude;
        const char *was = getenv("RUBYLIB");
        snprintf(rubylib, libsize, "%s%s%s", lib, was && *was ? ":" : "", was && *was ? was : "");
        env[e++] = "RUBYLIB";
        env[e++] = rubylib;
    }
    env[e] = NULL;
    argv[n++] = path;
    return n;
}

int kt_ruby_v(const char *version, const char *script, const char *const *args, char **out)
{
    char path[1024], prelude[1024], rubylib[8192];
    const char *argv[64], *env[8];
    int n = ruby_argv(version, script, argv, path, prelude, sizeof(path), env, rubylib,
                      sizeof(rubylib));
    for (int i = 0; args && args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return run_capture_env(argv, out, 120, 1, env);
}

int kt_ruby(const char *script, const char *const *args, char **out)
{
    return kt_ruby_v(KT_SIDEKIQ_DEBIAN, script, args, out);
}

char *kt_wait_identity(pid_t pid)
{
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 20), "capstan did not start: %s",
              kt_capstan_log(pid));
    char *id = kt_str("SRANDMEMBER processes");
    cr_assert(id);
    return id;
}

char *kt_log_identity(pid_t pid)
{
    char *found = NULL;
    KT_WAIT_UNTIL(({
        char *log = kt_capstan_log(pid);
        char *at = log ? strstr(log, ", identity ") : NULL;
        if (at) {
            at += strlen(", identity ");
            found = strndup(at, strcspn(at, "\n"));
        }
        free(log);
        found != NULL; }), 10);
    cr_assert(found, "no identity in the log of %d", (int)pid);
    return found;
}

char *kt_working_key(const char *identity)
{
    char *k = malloc(512);
    cr_assert(k);
    capstan__fetch_working_key(identity, k, 512);
    return k;
}

pid_t kt_sidekiq_start(const char *jobs, const char *queue)
{
    return kt_sidekiq_start_v(KT_SIDEKIQ_DEBIAN, jobs, queue);
}

pid_t kt_sidekiq_start_v(const char *version, const char *jobs, const char *queue)
{
    char path[1024], server[1024], prelude[1024], rubylib[8192];
    const char *argv[32], *env[8];
    snprintf(path, sizeof(path), "%s/tests/ruby/%s", getenv("CAPSTAN_SRC"), jobs);
    /* Debian's own `sidekiq` command for its version; for a vendored one,
     * the same command line in tests/ruby/sidekiq_server.rb (Debian's
     * command would activate its own gem). */
    int n = ruby_argv(version, "sidekiq_server.rb", argv, server, prelude, sizeof(server), env,
                      rubylib, sizeof(rubylib));
    if (strcmp(version, KT_SIDEKIQ_DEBIAN) == 0) {
        n = 0;
        argv[n++] = "sidekiq";
    }
    const char *rest[] = { "-r", path, "-c", "2", "-q", queue, "-t", "5", NULL };
    for (int i = 0; rest[i]; i++)
        argv[n++] = rest[i];
    argv[n] = NULL;
    char *logp = kt_tmp("sidekiq.log");
    pid_t pid = spawn_env(argv, logp, kt_admin_url(), 0, env);
    free(logp);
    return kt_track(pid);
}

char *kt_sidekiq_log(void)
{
    char *path = kt_tmp("sidekiq.log");
    char *s = kt_read_file(path);
    free(path);
    return s;
}

int kt_log_has(pid_t pid, const char *needle)
{
    return kt_log_count(pid, needle) > 0;
}

int kt_log_count(pid_t pid, const char *needle)
{
    char *log = kt_capstan_log(pid);
    int n = 0;
    for (const char *at = log; (at = strstr(at, needle)); at += strlen(needle))
        n++;
    free(log);
    return n;
}

pid_t kt_worker_pid(pid_t sup, int slot)
{
    char *log = kt_capstan_log(sup), want[64];
    snprintf(want, sizeof(want), "worker %d started (pid ", slot);
    pid_t pid = 0;
    for (char *at = strstr(log, want); at; at = strstr(at + 1, want))
        pid = (pid_t)atoi(at + strlen(want));
    free(log);
    return pid;
}

char *kt_last_line(const char *out)
{
    size_t n = out ? strlen(out) : 0;
    while (n > 0 && out[n - 1] == '\n')
        n--;
    size_t start = n;
    while (start > 0 && out[start - 1] != '\n')
        start--;
    char *line = strndup(out ? out + start : "", n - start);
    cr_assert(line);
    /* "... pid=N tid=T LEVEL: message": the message alone. */
    const char *tid = strstr(line, " tid=");
    const char *msg = tid ? strstr(tid, ": ") : NULL;
    if (msg)
        memmove(line, msg + 2, strlen(msg + 2) + 1);
    return line;
}

void kt_make_jid(char out[25], unsigned tag, unsigned i)
{
    static unsigned salt;
    if (!salt)
        salt = (unsigned)getpid() * 2654435761u;
    snprintf(out, 25, "%08x%08x%08x", salt, tag, i);
}

char *kt_payload(const char *cls, const char *args, const char *jid, const char *queue)
{
    char *p = NULL;
    cr_assert(asprintf(&p,
                       "{\"retry\":true,\"queue\":\"%s\",\"args\":%s,\"class\":\"%s\","
                       "\"jid\":\"%s\",\"created_at\":1767225600.123456,"
                       "\"enqueued_at\":1767225600.123789}",
                       queue, args, cls, jid) > 0);
    return p;
}

char *kt_payload_locked(const char *cls, const char *args, const char *jid, const char *queue,
                        const char *lock, const char *key)
{
    char *p = kt_payload(cls, args, jid, queue), *out = NULL;
    cr_assert(asprintf(&out, "{\"lock\":\"%s\",\"lock_digest\":\"uniquejobs:%s\",%s", lock, key,
                       p + 1) > 0);
    free(p);
    return out;
}

void kt_push_all(redisContext *c, const char *queue, char **p, size_t n)
{
    char *key = NULL;
    cr_assert(asprintf(&key, "queue:%s", queue) > 0);
    const char *argv[1002];
    size_t lens[1002];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 1000 ? n - done : 1000;
        argv[0] = "LPUSH";
        lens[0] = 5;
        argv[1] = key;
        lens[1] = strlen(key);
        for (size_t i = 0; i < k; i++) {
            argv[2 + i] = p[done + i];
            lens[2 + i] = strlen(p[done + i]);
        }
        redisReply *r = redisCommandArgv(c, (int)k + 2, argv, lens);
        cr_assert(r && r->type == REDIS_REPLY_INTEGER, "LPUSH failed");
        freeReplyObject(r);
        done += k;
    }
    free(key);
    freeReplyObject(redisCommand(c, "SADD queues %s", queue));
}

void kt_push_jobs(const char *cls, const char *args, unsigned tag, size_t n)
{
    char **p = calloc(n, sizeof(*p)), jid[25];
    cr_assert(p);
    for (size_t i = 0; i < n; i++) {
        kt_make_jid(jid, tag, (unsigned)i);
        p[i] = kt_payload(cls, args, jid, "default");
    }
    kt_push_all(kt_redis(), "default", p, n);
    for (size_t i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

int kt_working_has(const char *identity, const char *jid)
{
    char *key = kt_working_key(identity);
    redisReply *l = kt_cmd("LRANGE %s 0 -1", key);
    int found = 0;
    for (size_t k = 0; l->type == REDIS_REPLY_ARRAY && k < l->elements && !found; k++)
        found = strstr(l->element[k]->str, jid) != NULL;
    freeReplyObject(l);
    free(key);
    return found;
}

int kt_commit_after_client_kill(const char *url, int kill_port)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* Criterion or the shell may have left SIGPIPE ignored or blocked;
         * the program this stands for did neither. */
        signal(SIGPIPE, SIG_DFL);
        sigset_t pipe_set;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        sigprocmask(SIG_UNBLOCK, &pipe_set, NULL);
        char err[CAPSTAN_ERRLEN];
        capstan_client_t *c = capstan_client_new(url, err);
        if (!c)
            _exit(2);
        redisReply *id = capstan_redis_cmdf(capstan_client_redis(c), "CLIENT ID");
        if (!id || id->type != REDIS_REPLY_INTEGER)
            _exit(3);
        redisContext *k = redisConnect("127.0.0.1", kill_port);
        redisReply *kr = k && !k->err ? redisCommand(k, "CLIENT KILL ID %lld", id->integer)
                                      : NULL;
        if (!kr || kr->type != REDIS_REPLY_INTEGER || kr->integer != 1)
            _exit(4);
        /* The server's FIN has arrived: the commit's first write draws a
         * reset, and the next one EPIPE. */
        kt_sleep(0.2);
        char arg[2048];
        memset(arg, 'x', sizeof(arg));
        memcpy(arg, "[\"", 2);
        memcpy(arg + sizeof(arg) - 3, "\"]", 3);
        if (capstan_client_begin(c))
            _exit(5);
        for (int i = 0; i < 2000; i++)
            if (capstan_client_push(c, "TxJob", arg, NULL, NULL))
                _exit(6);
        _exit(capstan_client_commit(c) == CAPSTAN_EREDIS ? 0 : 7);
    }
    kt_track(pid);
    return kt_wait_exit(pid, 60);
}

char *kt_scrape(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return NULL;
    }
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    cr_assert_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (len < cap - 1 && (got = read(fd, buf + len, cap - len - 1)) > 0)
        len += (size_t)got;
    close(fd);
    buf[len] = '\0';
    return buf;
}
