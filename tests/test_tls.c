/* rediss://: capstan run, push and stats against a real redis-server that
 * speaks TLS (certificates made here with the openssl command), beside a
 * plain port for the test's own connection, as Ruby clients would use. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/config.h"

TestSuite(tls, .timeout = 90, .fini = kt_kill_children);

typedef struct tls_server {
    char dir[400];
    int port, tls_port;
    pid_t pid;
    redisContext *plain;   /* the test's own connection, on the plain port */
} tls_server_t;

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    cr_assert(st == 0, "failed (%d): %s", st, cmd);
}

/* A CA (name), signing a server certificate for 127.0.0.1 and localhost
 * and a client certificate, under dir; EC keys, as they are quick to make. */
static void make_ca(const char *dir, const char *name)
{
    sh("cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
       "-keyout %s.key -out %s.crt -days 2 -subj /CN=%s-test-ca 2>/dev/null",
       dir, name, name, name);
}

static void make_certs(const char *dir)
{
    make_ca(dir, "ca");
    make_ca(dir, "otherca");
    sh("cd %s && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.cnf && "
       "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key "
       "-out server.csr -subj /CN=localhost 2>/dev/null && "
       "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
       "-out server.crt -days 2 -extfile san.cnf 2>/dev/null && "
       "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout client.key "
       "-out client.csr -subj /CN=capstan-client 2>/dev/null && "
       "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
       "-out client.crt -days 2 2>/dev/null", dir);
}

static redisContext *plain_connect(int port)
{
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = c && !c->err ? redisCommand(c, "PING") : NULL;
    int ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (ok)
        return c;
    redisFree(c);
    return NULL;
}

/* Starts redis-server with a plain port and a TLS port; auth_clients: a
 * client certificate is required (mutual TLS). */
static void server_start(tls_server_t *s, const char *name, int auth_clients)
{
    memset(s, 0, sizeof(*s));
    char *d = kt_tmp(name);
    snprintf(s->dir, sizeof(s->dir), "%s", d);
    free(d);
    sh("rm -rf %s && mkdir -p %s", s->dir, s->dir);
    make_certs(s->dir);
    s->port = kt_free_port();
    s->tls_port = kt_free_port();
    char port[16], tport[16], cert[500], key[500], ca[500], logf[500];
    snprintf(port, sizeof(port), "%d", s->port);
    snprintf(tport, sizeof(tport), "%d", s->tls_port);
    snprintf(cert, sizeof(cert), "%s/server.crt", s->dir);
    snprintf(key, sizeof(key), "%s/server.key", s->dir);
    snprintf(ca, sizeof(ca), "%s/ca.crt", s->dir);
    snprintf(logf, sizeof(logf), "%s/redis.log", s->dir);
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        execlp("redis-server", "redis-server", "--port", port, "--tls-port", tport, "--bind",
               "127.0.0.1", "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file",
               ca, "--tls-auth-clients", auth_clients ? "yes" : "no", "--save", "", "--dir",
               s->dir, "--logfile", logf, (char *)NULL);
        _exit(127);
    }
    kt_track(s->pid);
    cr_assert(KT_WAIT_UNTIL((s->plain = plain_connect(s->port)) != NULL, 20),
              "redis-server with TLS did not start (see %s)", logf);
}

/* rediss://127.0.0.1:TLS_PORT/0?query */
static const char *url(const tls_server_t *s, const char *query)
{
    static char u[1024];
    snprintf(u, sizeof(u), "rediss://127.0.0.1:%d/0%s%s", s->tls_port, *query ? "?" : "", query);
    return u;
}

static const char *ca_q(const tls_server_t *s, const char *file)
{
    static char q[600];
    snprintf(q, sizeof(q), "ca_file=%s/%s", s->dir, file);
    return q;
}

Test(tls, jobs_pushed_and_run_over_tls_and_after_a_dropped_connection)
{
    tls_server_t s;
    server_start(&s, "tls-run", 0);
    char u[1024];
    snprintf(u, sizeof(u), "%s", url(&s, ca_q(&s, "ca.crt")));

    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"done\"]", "--redis-url", u,
                                             NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int_on(s.plain, "LLEN queue:default"), 1, "capstan push over TLS enqueued it");

    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD done") == 1, 20), "%s", kt_capstan_log(pid));

    /* Every client of the worker is cut off; it connects again, over TLS. */
    freeReplyObject(redisCommand(s.plain, "CLIENT KILL TYPE normal SKIPME yes"));
    char *jid = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"done\"]", "--redis-url", u,
                                             NULL }, &jid), 0, "%s", jid);
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD done") == 2, 30), "%s", kt_capstan_log(pid));
    free(jid);

    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", "--redis-url", u, NULL }, &out),
                 0, "%s", out);
    cr_assert(strstr(out, "\"concurrency\":2"), "the worker's process is listed: %s", out);
    free(out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    cr_assert_eq(kt_log_count(pid, "verify"), 0, "no warning while verifying");
    redisFree(s.plain);
}

/* Jobs of a few milliseconds make the processors send their round trips
 * (acks, and sweeps of more jobs) on a second connection and read them
 * after their job; over TLS those connections are sessions of their own.
 * Every job runs, one cut of every connection mid-drain included, and
 * nothing stays in a working list or the queue. */
Test(tls, round_trips_read_after_jobs_over_tls)
{
    enum { N = 400 };
    tls_server_t s;
    server_start(&s, "tls-defer", 0);
    char u[1024];
    snprintf(u, sizeof(u), "%s", url(&s, ca_q(&s, "ca.crt")));
    char *p[N];
    for (unsigned i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 11, i);
        p[i] = i % 2 ? kt_payload("SleepJob", "[3]", jid, "default")
                     : kt_payload("RecordJob", "[\"done\"]", jid, "default");
    }
    kt_push_all(s.plain, "default", p, N);
    /* A short heartbeat: a job stranded in the working list goes back
     * after two checks a heartbeat apart. */
    char *yml = kt_write_file("tls-defer.yml", "heartbeat_interval: 0.5\n");
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, "-c", "5", "-C", yml, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD done") >= N / 8, 30), "%s",
              kt_capstan_log(pid));
    freeReplyObject(redisCommand(s.plain, "CLIENT KILL TYPE normal SKIPME yes"));
    /* A RecordJob cut off in its own commands fails and waits in retry:
     * it is made due at once. A job whose ack the cut lost goes back from
     * the working list (and may run twice); none is lost or left behind. */
    cr_assert(KT_WAIT_UNTIL(({ redisReply *w = redisCommand(s.plain, "KEYS uniquejobs:working:*");
                               long long left = kt_int_on(s.plain, "LLEN queue:default");
                               for (size_t i = 0; w && i < w->elements; i++)
                                   left += kt_int_on(s.plain, "LLEN %s", w->element[i]->str);
                               freeReplyObject(w);
                               redisReply *r = redisCommand(s.plain, "ZRANGE retry 0 -1");
                               for (size_t i = 0; r && i < r->elements; i++)
                                   freeReplyObject(redisCommand(s.plain, "ZADD retry XX 0 %s",
                                                                r->element[i]->str));
                               left += r ? (long long)r->elements : 1;
                               freeReplyObject(r);
                               left == 0 && kt_int_on(s.plain, "SCARD done") == N / 2; }), 60),
              "%lld of %d recorded: %s", kt_int_on(s.plain, "SCARD done"), N / 2,
              kt_capstan_log(pid));
    cr_assert_geq(kt_int_on(s.plain, "LLEN done:log"), N / 2);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    for (unsigned i = 0; i < N; i++)
        free(p[i]);
    free(yml);
    redisFree(s.plain);
}

/* A mixed fleet: Ruby Sidekiq pushes over plain TCP to the server's other
 * port, capstan runs the jobs over TLS, and Ruby's API reads the process. */
Test(tls, ruby_pushes_over_plain_tcp_and_capstan_runs_them_over_tls)
{
    tls_server_t s;
    server_start(&s, "tls-ruby", 0);
    char u[1024], plain[64], *out = NULL;
    snprintf(u, sizeof(u), "%s", url(&s, ca_q(&s, "ca.crt")));
    snprintf(plain, sizeof(plain), "redis://127.0.0.1:%d/0", s.port);
    const char *bulk = "{\"class\":\"RecordJob\",\"args\":[[\"done\"],[\"done\"],[\"done\"]]}";
    cr_assert_eq(kt_ruby("at_url.rb", (const char *[]){ plain, "push_bulk", bulk, NULL }, &out),
                 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int_on(s.plain, "LLEN queue:default"), 3);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD done") == 3, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int_on(s.plain, "LLEN queue:default"), 0);
    /* The counters are flushed with the beat. */
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "EVAL %s 0",
                                      "return tonumber(redis.call('GET', 'stat:processed'))"
                                      " or 0") == 3, 20));
    cr_assert_eq(kt_ruby("at_url.rb", (const char *[]){ plain, "stats", NULL }, &out), 0, "%s",
                 out);
    cr_assert(strstr(out, "\"processed\":3"), "Sidekiq::Stats over plain TCP: %s", out);
    cr_assert(strstr(out, "\"processes_size\":1"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    redisFree(s.plain);
}

/* capstan run against u exits 78 at once, its log saying what. */
static void refused_at_start(const char *u, const char *what)
{
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, NULL });
    int st = kt_wait_exit(pid, 30);
    char *log = kt_capstan_log(pid);
    cr_assert_eq(st, 78, "exit %d: %s", st, log);
    cr_assert(strstr(log, what), "the log says %s: %s", what, log);
    free(log);
}

Test(tls, a_wrong_ca_or_host_name_is_a_configuration_error_at_start)
{
    tls_server_t s;
    server_start(&s, "tls-ca", 0);
    char u[1024];
    snprintf(u, sizeof(u), "%s", url(&s, ca_q(&s, "otherca.crt")));
    refused_at_start(u, "TLS: certificate verify failed: ");
    /* No CA given: the system's, which do not know the test CA. */
    snprintf(u, sizeof(u), "%s", url(&s, ""));
    refused_at_start(u, "TLS: certificate verify failed: ");
    char q[700];
    snprintf(q, sizeof(q), "%s&server_name=redis.example.com", ca_q(&s, "ca.crt"));
    snprintf(u, sizeof(u), "%s", url(&s, q));
    refused_at_start(u, "TLS: certificate verify failed: hostname mismatch");

    /* A password in the URL is never in the log or the command line. */
    snprintf(u, sizeof(u), "rediss://app:tls-s3cret@127.0.0.1:%d/0?%s", s.tls_port,
             ca_q(&s, "otherca.crt"));
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, NULL });
    char path[64], *cmdline = NULL;
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "starting") > 0, 20));
    size_t n = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        char buf[4096];
        n = fread(buf, 1, sizeof(buf), f);
        cmdline = memmem(buf, n, "tls-s3cret", 10);
        fclose(f);
    }
    cr_assert_null(cmdline, "the password is in ps");
    cr_assert_eq(kt_wait_exit(pid, 30), 78);
    cr_assert_eq(kt_log_count(pid, "tls-s3cret"), 0, "the password is not logged");
    cr_assert_gt(kt_log_count(pid, "rediss://app:***@127.0.0.1"), 0);

    char *out = NULL; /* a configuration error for every command, as for run */
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--redis-url", url(&s, ca_q(&s, "otherca.crt")),
                                             NULL }, &out), 78);
    cr_assert(strstr(out, "TLS: certificate verify failed"), "%s", out);
    free(out);
    cr_assert_eq(kt_int_on(s.plain, "DBSIZE"), 0);
    redisFree(s.plain);
}

/* As in test_client.c, over TLS: the server closes the connection before
 * a commit, whose writes through the TLS session must fail with an error,
 * not raise SIGPIPE in the program. */
Test(tls, a_commit_on_a_connection_the_server_closed_fails_without_sigpipe)
{
    tls_server_t s;
    server_start(&s, "tls-sigpipe", 0);
    int st = kt_commit_after_client_kill(url(&s, ca_q(&s, "ca.crt")), s.port);
    cr_assert_neq(st, 128 + SIGPIPE, "the client library killed its caller with SIGPIPE");
    cr_assert_eq(st, 0, "the commit did not fail with CAPSTAN_EREDIS (step %d, see helpers.c)", st);
    cr_assert_eq(kt_int_on(s.plain, "LLEN queue:default"), 0);
    redisFree(s.plain);
}

/* capstan_redis_connect to u fails (code want), its error holding what. */
static void connect_fails(const char *u, int want, const char *what)
{
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(u, 1, err);
    cr_assert_not_null(r, "%s", err);
    int rc = capstan_redis_connect(r);
    cr_assert_eq(rc, want, "%s: %d: %s", u, rc, capstan_redis_error(r));
    cr_assert(strstr(capstan_redis_error(r), what), "%s: the error does not say \"%s\": %s", u,
              what, capstan_redis_error(r));
    capstan_redis_free(r);
}

/* A TLS connection that cannot be made says why in words that lead to the
 * fix: a rediss:// URL to a plain port used to say "Resource temporarily
 * unavailable" on every try, and a missing CA file "system lib". */
Test(tls, tls_failures_name_their_cause)
{
    tls_server_t s;
    server_start(&s, "tls-why", 0);
    /* The server's plain port: Redis waits for the end of what it takes
     * for an inline command (no answer), or, when the ClientHello holds a
     * newline, answers "-ERR" (no TLS). Either way the message names it. */
    char u[1024], err[CAPSTAN_ERRLEN];
    snprintf(u, sizeof(u), "rediss://127.0.0.1:%d/0?%s", s.port, ca_q(&s, "ca.crt"));
    for (int i = 0; i < 3; i++) {
        capstan_redis_t *r = capstan_redis_new(u, 0.5, err);
        cr_assert_not_null(r, "%s", err);
        int rc = capstan_redis_connect(r);
        const char *e = capstan_redis_error(r);
        cr_assert(rc == CAPSTAN_EREDIS || rc == CAPSTAN_ECONFIG, "%d: %s", rc, e);
        cr_assert(strstr(e, "TLS: the server did not answer the TLS handshake within 0.5 s: "
                            "is it a TLS port?")
                  || strstr(e, "TLS: the server answered the TLS handshake with something else "
                               "than TLS ("), "%s", e);
        cr_assert(strstr(e, "is it a TLS port?") && !strstr(e, "temporarily"), "%s", e);
        capstan_redis_free(r);
    }

    connect_fails(url(&s, "ca_file=/nonexistent/ca.pem"), CAPSTAN_ECONFIG,
                  "TLS: cannot load ca_file /nonexistent/ca.pem: No such file or directory");
    connect_fails(url(&s, "ca_path=/nonexistent/certs"), CAPSTAN_ECONFIG,
                  "TLS: cannot load ca_path /nonexistent/certs: No such file or directory");
    char q[1400];
    snprintf(q, sizeof(q), "ca_file=%s", s.dir);
    connect_fails(url(&s, q), CAPSTAN_ECONFIG, "TLS: cannot load ca_file ");
    connect_fails(url(&s, q), CAPSTAN_ECONFIG, ": Is a directory");
    /* (No ca_file: the error, after the URL, must fit in CAPSTAN_ERRLEN.) */
    snprintf(q, sizeof(q), "cert=%s/none.crt&key=%s/client.key", s.dir, s.dir);
    connect_fails(url(&s, q), CAPSTAN_ECONFIG, "/none.crt: No such file or directory");
    /* A file that is there but holds no certificate: OpenSSL's reason, with
     * the file's name. */
    snprintf(q, sizeof(q), "ca_file=%s/san.cnf", s.dir);
    connect_fails(url(&s, q), CAPSTAN_ECONFIG, "/san.cnf: ");
    redisFree(s.plain);
}

Test(tls, mutual_tls_needs_the_client_certificate)
{
    tls_server_t s;
    server_start(&s, "tls-mutual", 1);
    char q[1400], u[2048];
    snprintf(q, sizeof(q), "%s&cert=%s/client.crt&key=%s/client.key", ca_q(&s, "ca.crt"), s.dir,
             s.dir);
    snprintf(u, sizeof(u), "%s", url(&s, q));
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"done\"]", "--redis-url", u,
                                             NULL }, &out), 0, "%s", out);
    free(out);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD done") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);

    refused_at_start(url(&s, ca_q(&s, "ca.crt")), "TLS: the server refused this client: ");
    redisFree(s.plain);
}

Test(tls, verify_none_connects_and_warns)
{
    tls_server_t s;
    server_start(&s, "tls-none", 0);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", url(&s, "verify=none"), NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD processes") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);
    cr_assert_eq(kt_log_count(pid, "TLS: verify=none"), 1, "warned once: %s", kt_capstan_log(pid));
    redisFree(s.plain);
}

Test(tls, settings_from_the_file_or_flags_apply_to_a_rediss_url)
{
    tls_server_t s;
    server_start(&s, "tls-conf", 1);
    char yml[2048], u[128], cafile[600];
    snprintf(yml, sizeof(yml),
             "concurrency: 2\n"
             "tls:\n"
             "  ca_file: %s/ca.crt\n"
             "  cert: %s/client.crt\n"
             "  key: %s/client.key\n"
             "  server_name: localhost\n", s.dir, s.dir, s.dir);
    char *file = kt_write_file("tls.yml", yml);
    snprintf(u, sizeof(u), "rediss://127.0.0.1:%d/0", s.tls_port);
    char *job = kt_payload("RecordJob", "[\"done\"]", "0123456789abcdef01234567", "default");
    cr_assert_eq(kt_int_on(s.plain, "RPUSH queue:default %s", job), 1);
    free(job);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, "-C", file, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD done") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0);

    /* Flags: the CA alone is not enough for this server (no client cert). */
    snprintf(cafile, sizeof(cafile), "%s/ca.crt", s.dir);
    pid = kt_capstan_start((const char *[]){ "--redis-url", u, "--tls-ca-file", cafile, NULL });
    cr_assert_eq(kt_wait_exit(pid, 30), 78, "%s", kt_capstan_log(pid));
    cr_assert_gt(kt_log_count(pid, "TLS: the server refused this client"), 0);

    /* TLS settings with a plain redis:// URL are a mistake, said at once. */
    snprintf(u, sizeof(u), "redis://127.0.0.1:%d/0", s.port);
    pid = kt_capstan_start((const char *[]){ "--redis-url", u, "--tls-ca-file", cafile, NULL });
    cr_assert_eq(kt_wait_exit(pid, 30), 78);
    cr_assert_gt(kt_log_count(pid, "tls: settings need a URL that speaks TLS"), 0, "%s",
                 kt_capstan_log(pid));
    free(file);
    redisFree(s.plain);
}

/* A sentinel with a TLS port (its plain one is for the test), monitoring
 * the server's TLS port with the test's certificates. Returns the TLS
 * port once it knows the master. */
static int sentinel_start(const tls_server_t *s)
{
    int port = kt_free_port(), tport = kt_free_port();
    char conf[600], body[2400], logf[500];
    snprintf(conf, sizeof(conf), "%s/sentinel.conf", s->dir);
    snprintf(logf, sizeof(logf), "%s/sentinel.log", s->dir);
    snprintf(body, sizeof(body),
             "port %d\nbind 127.0.0.1\ntls-port %d\ntls-cert-file %s/server.crt\n"
             "tls-key-file %s/server.key\ntls-ca-cert-file %s/ca.crt\ntls-auth-clients no\n"
             "tls-replication yes\nsentinel monitor mymaster 127.0.0.1 %d 1\n",
             port, tport, s->dir, s->dir, s->dir, s->tls_port);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fputs(body, f);
    fclose(f);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execlp("redis-server", "redis-server", conf, "--sentinel", "--logfile", logf,
               (char *)NULL);
        _exit(127);
    }
    kt_track(pid);
    cr_assert(KT_WAIT_UNTIL(({ redisContext *c = plain_connect(port);
                               redisReply *r = c ? redisCommand(c, "SENTINEL "
                                                                "get-master-addr-by-name "
                                                                "mymaster") : NULL;
                               int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2
                                        && atoi(r->element[1]->str) == s->tls_port;
                               freeReplyObject(r);
                               redisFree(c);
                               ok; }), 20), "the sentinel did not start (see %s)", logf);
    return tport;
}

/* sentinel_ssl=true: TLS to the sentinels as well as to the master, with
 * the same settings, the sentinels' certificates checked. */
Test(tls, sentinels_over_tls_with_sentinel_ssl)
{
    tls_server_t s;
    server_start(&s, "tls-sentinel", 0);
    int tport = sentinel_start(&s);
    char u[1200], *out = NULL;
    snprintf(u, sizeof(u), "rediss+sentinel://127.0.0.1:%d/mymaster?sentinel_ssl=true&%s", tport,
             ca_q(&s, "ca.crt"));
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"done\"]", "--redis-url", u,
                                             NULL }, &out), 0, "%s", out);
    free(out);
    pid_t pid = kt_capstan_start((const char *[]){ "--redis-url", u, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int_on(s.plain, "SCARD done") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));

    /* The same from the file: sentinels: with ssl, and the tls: mapping
     * (read into the query of the sentinel URL it makes). */
    char yml[1200];
    snprintf(yml, sizeof(yml),
             "redis:\n  sentinels: [{host: 127.0.0.1, port: %d}]\n  name: mymaster\n"
             "  ssl: true\n  sentinel_ssl: true\ntls:\n  ca_file: %s/ca.crt\n",
             tport, s.dir);
    char *y = kt_write_file("tls-sentinel.yml", yml), err[CAPSTAN_ERRLEN] = "";
    capstan_config_t *cfg = capstan_config_new();
    cr_assert_eq(capstan_config_load_file(cfg, y, err), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    capstan_redis_t *r = capstan_redis_new(cfg->redis_url, 5, err);
    cr_assert(r, "%s", err);
    cr_assert_eq(capstan_redis_connect(r), 0, "through the file's sentinels: %s", capstan_redis_error(r));
    redisReply *pong = capstan_redis_cmdf(r, "PING");
    cr_assert(pong && pong->type == REDIS_REPLY_STATUS);
    freeReplyObject(pong);
    capstan_redis_free(r);
    capstan_config_free(cfg);
    free(y);

    /* The sentinel's certificate is verified like the master's. */
    snprintf(u, sizeof(u), "rediss+sentinel://127.0.0.1:%d/mymaster?sentinel_ssl=true&%s", tport,
             ca_q(&s, "otherca.crt"));
    refused_at_start(u, "TLS: certificate verify failed: ");
    /* Without sentinel_ssl, the sentinel's TLS port is spoken to in plain
     * and never answers. */
    snprintf(u, sizeof(u), "rediss+sentinel://127.0.0.1:%d/mymaster?%s", tport,
             ca_q(&s, "ca.crt"));
    cr_assert_neq(kt_capstan_run((const char *[]){ "stats", "--redis-url", u, NULL }, &out), 0,
                  "%s", out);
    free(out);
    redisFree(s.plain);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec)
           + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* capstan's own commands go through the session from the calling thread, a
 * handler's through hiredis and the copying thread, in turns on one
 * connection; a connection the server reset costs no CPU until it is
 * made again. */
Test(tls, own_and_hiredis_commands_in_turns_and_a_reset_connection)
{
    tls_server_t s;
    server_start(&s, "tls-turns", 0);
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = capstan_redis_new(url(&s, ca_q(&s, "ca.crt")), 2, err);
    cr_assert(r, "%s", err);
    cr_assert_eq(capstan_redis_connect(r), 0, "%s", capstan_redis_error(r));
    for (int i = 0; i < 50; i++) {
        redisReply *a = capstan_redis_cmdf(r, "INCR own");
        cr_assert(a && a->type == REDIS_REPLY_INTEGER && a->integer == i + 1);
        freeReplyObject(a);
        redisReply *b = redisCommand(capstan_redis_ctx(r), "INCR raw");
        cr_assert(b && b->type == REDIS_REPLY_INTEGER && b->integer == i + 1);
        freeReplyObject(b);
    }
    /* The last command capstan's own: the session is the owner's. */
    redisReply *pong = capstan_redis_cmdf(r, "PING");
    cr_assert(pong && pong->type == REDIS_REPLY_STATUS);
    freeReplyObject(pong);
    freeReplyObject(redisCommand(s.plain, "CLIENT KILL TYPE normal SKIPME yes"));
    redisReply *gone = capstan_redis_cmdf(r, "GET own");
    cr_assert_null(gone);
    cr_assert(!capstan_redis_ok(r));
    /* The server reset the connection; until the owner makes it again
     * (after a backoff, in a worker), nothing runs for it. */
    double before = cpu_seconds();
    usleep(500000);
    cr_assert_lt(cpu_seconds() - before, 0.1, "the process spun while the connection was down");
    cr_assert_eq(capstan_redis_connect(r), 0, "%s", capstan_redis_error(r));
    redisReply *back = capstan_redis_cmdf(r, "GET own");
    cr_assert(back && back->type == REDIS_REPLY_STRING && !strcmp(back->str, "50"));
    freeReplyObject(back);
    capstan_redis_free(r);
    redisFree(s.plain);
}
