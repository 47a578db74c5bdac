/* The Prometheus endpoint: a scrape during a run counts what ran, passes
 * `promtool check metrics`, and reads queue sizes and latency; a port in
 * use stops the start; the registry escapes labels and fills buckets; the
 * config keys and flag. */
#include <arpa/inet.h>
#include <jansson.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/config.h"
#include "support/buf.h"
#include "observe/prometheus.h"

TestSuite(metrics, .timeout = 60, .fini = kt_kill_children);

/* A listening socket on 127.0.0.1 (port 0: any); *port gets its port. */
static int listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)*port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 4) == 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

/* GET path over a plain socket; returns the whole response (headers and
 * body, malloc'd) or NULL when nothing listens. *status gets the code. */
static char *http_get(int port, const char *path, int *status)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = { 5, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    cr_assert_eq(write(fd, req, (size_t)n), n);
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (cap - len < 1024)
            buf = realloc(buf, cap *= 2);
    }
    close(fd);
    buf[len] = '\0';
    *status = 0;
    sscanf(buf, "HTTP/1.%*d %d", status);
    return buf;
}

static const char *body_of(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : resp;
}

/* The value of the sample whose name and labels are exactly series, or -1. */
static double value(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

/* Exit status of `promtool check metrics` fed text on its stdin. */
static int promtool(const char *text)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        cr_skip_test("promtool not found (Debian package prometheus; scripts/deps.sh)");
    FILE *p = popen("promtool check metrics", "w");
    cr_assert_not_null(p);
    fputs(text, p);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(metrics, scrape_counts_what_ran_and_passes_promtool)
{
    /* Three jobs in a queue nobody fetches, enqueued 100 s ago. */
    char payload[256];
    double t = (double)time(NULL) - 100;
    for (int i = 0; i < 3; i++) {
        snprintf(payload, sizeof(payload),
                 "{\"class\":\"NoopJob\",\"args\":[],\"jid\":\"idle%018d\",\"queue\":\"idle\","
                 "\"enqueued_at\":%.3f,\"created_at\":%.3f}", i, t, t);
        freeReplyObject(kt_cmd("LPUSH queue:idle %s", payload));
    }
    freeReplyObject(kt_cmd("SADD queues idle"));
    freeReplyObject(kt_cmd("SADD paused idle")); /* as Sidekiq Pro pauses it */
    for (int i = 0; i < 5; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", NULL }, NULL), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "FailJob", NULL }, NULL), 0);

    int port = kt_free_port(), status = 0;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    pid_t pid = kt_capstan_start((const char *[]){ "-q", "default", "-c", "3", "--metrics-port",
                                               portstr, NULL });
    char *resp = NULL;
    bool done = KT_WAIT_UNTIL(
        (free(resp), resp = http_get(port, "/metrics", &status),
         resp && value(body_of(resp),
                       "capstan_jobs_processed_total{class=\"NoopJob\",queue=\"default\"}") == 5
              && value(body_of(resp),
                       "capstan_jobs_processed_total{class=\"FailJob\",queue=\"default\"}") == 2),
        15);
    char *log = kt_capstan_log(pid);
    cr_assert(done, "scrape never showed 5 NoopJob + 2 FailJob:\n%s\nlog:\n%s",
              resp ? resp : "(no answer)", log);
    free(log);
    const char *body = body_of(resp);
    cr_assert_eq(status, 200);
    cr_assert(strstr(resp, "text/plain; version=0.0.4"), "%s", resp);

    cr_assert_eq(value(body, "capstan_jobs_failed_total{class=\"FailJob\",queue=\"default\"}"), 2);
    cr_assert_leq(value(body, "capstan_jobs_failed_total{class=\"NoopJob\",queue=\"default\"}"), 0);
    cr_assert_eq(value(body, "capstan_job_duration_seconds_count{class=\"NoopJob\"}"), 5);
    cr_assert_eq(value(body, "capstan_job_duration_seconds_count{class=\"FailJob\"}"), 2);
    cr_assert_eq(value(body, "capstan_job_duration_seconds_bucket{class=\"NoopJob\",le=\"+Inf\"}"), 5);
    cr_assert_eq(value(body, "capstan_job_duration_seconds_bucket{class=\"FailJob\",le=\"60\"}"), 2);
    cr_assert_geq(value(body, "capstan_job_duration_seconds_sum{class=\"NoopJob\"}"), 0);
    cr_assert_eq(value(body, "capstan_threads"), 3);
    cr_assert_eq(value(body, "capstan_busy_threads"), 0);
    cr_assert_eq(value(body, "capstan_redis_up"), 1);
    cr_assert_geq(value(body, "capstan_redis_rtt_seconds"), 0);
    cr_assert_eq(value(body, "capstan_queue_size{queue=\"idle\"}"), 3);
    cr_assert_eq(value(body, "capstan_queue_size{queue=\"default\"}"), 0);
    cr_assert_eq(value(body, "capstan_queue_paused{queue=\"idle\"}"), 1);
    cr_assert_eq(value(body, "capstan_queue_paused{queue=\"default\"}"), 0);
    double lat = value(body, "capstan_queue_latency_seconds{queue=\"idle\"}");
    cr_assert(lat >= 99 && lat < 130, "latency %f", lat);
    cr_assert_eq(value(body, "capstan_retry_size"), 2, "FailJob retries by default");
    cr_assert_eq(value(body, "capstan_dead_size"), 0);
    cr_assert_eq(value(body, "capstan_schedule_size"), 0);
    cr_assert_eq(value(body, "capstan_orphans_recovered_total"), 0);
    cr_assert_eq(value(body, "capstan_poison_pills_total"), 0);
    cr_assert_eq(value(body, "capstan_redis_reconnects_total"), 0);
    cr_assert(strstr(body, "# TYPE capstan_job_duration_seconds histogram"), "%s", body);
    cr_assert(strstr(body, "# TYPE capstan_lock_events_total counter"), "%s", body);
    cr_assert_eq(promtool(body), 0, "promtool rejected:\n%s", body);

    free(resp);
    resp = http_get(port, "/other", &status);
    cr_assert_eq(status, 404, "%s", resp);
    free(resp);

    /* Its connections cut by the server: each made again is counted, and
     * a job pushed after runs. */
    freeReplyObject(kt_cmd("CLIENT KILL TYPE normal SKIPME yes"));
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", NULL }, NULL), 0);
    resp = NULL;
    done = KT_WAIT_UNTIL(
        (free(resp), resp = http_get(port, "/metrics", &status),
         resp && value(body_of(resp), "capstan_redis_reconnects_total") >= 1
              && value(body_of(resp),
                       "capstan_jobs_processed_total{class=\"NoopJob\",queue=\"default\"}") == 6),
        30);
    cr_assert(done, "no reconnect counted, or the job pushed after did not run:\n%s", resp ? resp : "");
    free(resp);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    cr_assert_null(http_get(port, "/metrics", &status), "the server stops with the worker");
}

/* Clients that connect and then send one header line a second, forever
 * (bounded here to 20 s), as a slowloris does. */
#define NSLOW 64
typedef struct slow {
    int fd[NSLOW];
    atomic_int stop;
} slow_t;

static void *drip(void *arg)
{
    slow_t *s = arg;
    double end = kt_now() + 20;
    while (!atomic_load(&s->stop) && kt_now() < end) {
        for (int i = 0; i < NSLOW; i++)
            (void)send(s->fd[i], "X-Slow: 1\r\n", 11, MSG_NOSIGNAL);
        kt_sleep(1);
    }
    return NULL;
}

/* 1 when the server closed fd (end of file or reset), without waiting. */
static int closed_by_server(int fd)
{
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static int count_closed(const slow_t *s)
{
    int n = 0;
    for (int i = 0; i < NSLOW; i++)
        n += closed_by_server(s->fd[i]);
    return n;
}

Test(metrics, slow_clients_neither_block_a_scrape_nor_stay_connected)
{
    int port = kt_free_port(), status = 0;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "1", "--metrics-port", portstr, NULL });
    char *resp = NULL;
    cr_assert(KT_WAIT_UNTIL((free(resp), resp = http_get(port, "/metrics", &status)) != NULL, 10),
              "no answer: %s", kt_capstan_log(pid));
    free(resp);

    slow_t s = {0};
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    double t0 = kt_now();
    for (int i = 0; i < NSLOW; i++) {
        s.fd[i] = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert(s.fd[i] >= 0 && connect(s.fd[i], (struct sockaddr *)&a, sizeof(a)) == 0);
        cr_assert_eq(send(s.fd[i], "GET /metrics HTTP/1.1\r\n", 23, MSG_NOSIGNAL), 23);
    }
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, drip, &s), 0);
    kt_sleep(0.5); /* the server has seen them all */

    double t1 = kt_now();
    resp = http_get(port, "/metrics", &status);
    double took = kt_now() - t1;
    cr_assert(status == 200 && took < 2.0, "a scrape next to %d slow clients: status %d after "
              "%.2f s: %s", NSLOW, status, took, resp ? resp : "(nothing)");
    free(resp);

    /* Each is cut off once its headers are late, dripping or not. */
    int all = KT_WAIT_UNTIL(count_closed(&s) == NSLOW, 12);
    double gone = kt_now() - t0;
    int n = count_closed(&s);
    atomic_store(&s.stop, 1);
    pthread_join(th, NULL);
    for (int i = 0; i < NSLOW; i++)
        close(s.fd[i]);
    cr_assert(all && gone < 9.0, "%d of %d slow clients disconnected after %.1f s", n, NSLOW,
              gone);
}

/* A label value from a payload (a class) or from Redis (a queue name) that
 * is not valid UTF-8, or holds a quote, backslash or newline, must not make
 * the text unparseable: Prometheus would drop every scrape from then on. */
Test(metrics, bad_label_bytes_keep_the_scrape_valid)
{
    static const struct { const char *json, *label; } cls[] = {
        { "Bad\xff\xfeJob", "Bad\xEF\xBF\xBD\xEF\xBF\xBDJob" },      /* not UTF-8 at all */
        { "Over\xc0\xafLong", "Over\xEF\xBF\xBD\xEF\xBF\xBDLong" },  /* overlong '/' */
        { "Lone\x80" "Cont", "Lone\xEF\xBF\xBD" "Cont" },            /* stray continuation */
        { "Cut\xe2\x82", "Cut\xEF\xBF\xBD\xEF\xBF\xBD" },            /* truncated sequence */
        { "Q\\\"B\\\\S\\nN", "Q\\\"B\\\\S\\nN" },                    /* JSON escapes decoded */
    };
    size_t ncls = sizeof(cls) / sizeof(cls[0]);
    char payload[256];
    for (size_t i = 0; i < ncls; i++) {
        int n = snprintf(payload, sizeof(payload),
                         "{\"class\":\"%s\",\"args\":[],\"jid\":\"bad%021zu\",\"queue\":\"default\","
                         "\"retry\":false}", cls[i].json, i);
        freeReplyObject(kt_cmd("LPUSH queue:default %b", payload, (size_t)n));
    }
    static const char badq[] = "bad\xffq", badkey[] = "queue:bad\xffq";
    freeReplyObject(kt_cmd("SADD queues default %b", badq, sizeof(badq) - 1));
    freeReplyObject(kt_cmd("LPUSH %b {}", badkey, sizeof(badkey) - 1));

    int port = kt_free_port(), status = 0;
    char portstr[16], series[256];
    snprintf(portstr, sizeof(portstr), "%d", port);
    /* Unknown classes fail at once (not held for a Ruby process that may
     * be starting). */
    pid_t pid = kt_capstan_start((const char *[]){ "-q", "default", "--metrics-port", portstr,
                                                   "--unknown-class", "fail", NULL });
    char *resp = NULL;
    bool done = KT_WAIT_UNTIL(
        (free(resp), resp = http_get(port, "/metrics", &status),
         resp && strstr(resp, "class=\"Cut") && strstr(resp, "class=\"Q\\\"B")
              && kt_int("LLEN queue:default") == 0),
        15);
    char *log = kt_capstan_log(pid);
    cr_assert(done, "the bad classes never showed:\n%s\nlog:\n%s", resp ? resp : "(no answer)", log);
    free(log);
    const char *body = body_of(resp);
    cr_assert_eq(promtool(body), 0, "promtool rejected:\n%s", body);
    for (size_t i = 0; i < ncls; i++) {
        snprintf(series, sizeof(series),
                 "capstan_jobs_processed_total{class=\"%s\",queue=\"default\"}", cls[i].label);
        cr_assert_eq(value(body, series), 1, "%s missing:\n%s", series, body);
    }
    cr_assert_eq(value(body, "capstan_queue_size{queue=\"bad\xEF\xBF\xBDq\"}"), 1, "%s", body);
    free(resp);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
}

/* A limited class: the scrape counts each acquisition that took a slot and
 * each that found the limit full (one per reschedule the log shows), their
 * waits, and the slots held right now; the limiter's name is a label. */
Test(metrics, limiter_series_count_acquisitions_waits_and_holds)
{
    /* No wait, so the jobs over the limit are rescheduled; -v logs each. */
    char *y = kt_write_file("lim.yml", "poll_interval_average: 0.3\nclasses:\n  LimitJob:\n"
                                       "    limit: { type: concurrent, name: 'we\"b', size: 1, "
                                       "wait_timeout: 0 }\n");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "LimitJob", "[\"lm\", 1000]", NULL },
                                    NULL), 0);
    int port = kt_free_port(), status = 0;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "3", "--metrics-port", portstr,
                                               "-v", NULL });
    const char *held = "capstan_limiter_held{limiter=\"we\\\"b\"}";
    const char *acq = "capstan_limiter_acquired_total{limiter=\"we\\\"b\"}";
    char *resp = NULL;
    cr_assert(KT_WAIT_UNTIL((free(resp), resp = http_get(port, "/metrics", &status),
                             resp && value(body_of(resp), held) == 1), 10),
              "no slot held while a job ran:\n%s", resp ? resp : "(no answer)");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD lm:jids") == 3, 20), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL((free(resp), resp = http_get(port, "/metrics", &status),
                             resp && value(body_of(resp), acq) == 3
                                  && value(body_of(resp), held) == 0), 5),
              "%s", resp ? resp : "(no answer)");
    const char *body = body_of(resp);
    double over = value(body, "capstan_limiter_over_limit_total{limiter=\"we\\\"b\"}");
    cr_assert_geq(over, 1, "three jobs, one slot, no wait: some found it full\n%s", body);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "limiter we\"b is over its limit") == (int)over, 5),
              "%d reschedules logged, %g counted", kt_log_count(pid, "is over its limit"), over);
    cr_assert_eq(value(body, "capstan_limiter_wait_seconds_count{limiter=\"we\\\"b\"}"), 3 + over,
                 "%s", body);
    cr_assert_eq(value(body, "capstan_limiter_wait_seconds_bucket{limiter=\"we\\\"b\",le=\"+Inf\"}"),
                 3 + over, "%s", body);
    cr_assert(strstr(body, "# TYPE capstan_limiter_held gauge"), "%s", body);
    cr_assert_eq(promtool(body), 0, "promtool rejected:\n%s", body);
    free(resp);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(y);
}

Test(metrics, port_in_use_stops_the_start_with_one_line)
{
    int port = 0;
    int fd = listener(&port);
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    pid_t pid = kt_capstan_start((const char *[]){ "--metrics-port", portstr, NULL });
    int st = kt_wait_exit(pid, 15);
    char *log = kt_capstan_log(pid);
    close(fd);
    cr_assert(st != 0 && st != -1, "exit %d:\n%s", st, log);
    char want[64];
    snprintf(want, sizeof(want), "metrics_port %d", port);
    cr_assert(strstr(log, want) && strstr(log, "in use"), "%s", log);
    cr_assert_eq(strchr(log, '\n'), log + strlen(log) - 1, "one line:\n%s", log);
    cr_assert_eq(kt_int("SCARD processes"), 0, "never started as a worker");
    free(log);
}

Test(metrics, bad_port_flag_is_a_config_error)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "--metrics-port", "70000", NULL }, &out), 78,
                 "%s", out);
    cr_assert(strstr(out, "--metrics-port"), "%s", out);
    free(out);
}

Test(metrics, yaml_keys_set_port_and_bind)
{
    char *path = kt_write_file("metrics.yml", "metrics_port: 9394\nmetrics_bind: 0.0.0.0\n");
    char err[CAPSTAN_ERRLEN] = "";
    capstan_config_t *cfg = capstan_config_new();
    cr_assert_eq(capstan_config_load_file(cfg, path, err), 0, "%s", err);
    cr_assert_eq(cfg->metrics_port, 9394);
    cr_assert_str_eq(cfg->metrics_bind, "0.0.0.0");
    capstan_config_free(cfg);

    free(kt_write_file("metrics.yml", "metrics_port: 70000\n"));
    cfg = capstan_config_new();
    cr_assert_neq(capstan_config_load_file(cfg, path, err), 0);
    cr_assert(strstr(err, "metrics_port"), "%s", err);
    capstan_config_free(cfg);
    free(path);
}

Test(metrics, registry_escapes_labels_fills_buckets_and_maps_lock_events)
{
    capstan_metrics_t *m = capstan__metrics_new();
    capstan__metrics_job(m, "We\"ird\\Job\nX", "q", 0.003, 0, NULL);
    capstan__metrics_job(m, "We\"ird\\Job\nX", "q", 0.2, 1, NULL);
    capstan__metrics_job(m, "We\"ird\\Job\nX", "q", 100, 0, NULL);
    capstan__metrics_lock_event(m, "until_executed", "lock_failed");
    capstan__metrics_lock_event(m, "until_executed", "lock_failed");
    capstan__metrics_lock_event(m, "until_executed", "locked");
    capstan__metrics_lock_event(m, "while_executing", "execution_failed");
    capstan__metrics_lock_event(m, "while_executing", "unlock_failed");
    capstan__metrics_lock_event(m, "while_executing", "no_such_event");
    capstan__metrics_add(m, CAPSTAN_METRIC_POISON_PILLS, 2);
    /* Different bytes that read alike are one series, not two with the
     * same labels. */
    capstan__metrics_job(m, "X\xff", "q", 1, 0, NULL);
    capstan__metrics_job(m, "X\xfe", "q", 1, 0, NULL);
    capstan__metrics_lock_event(m, "t\xc0", "locked");
    capstan_buf_t b = {0};
    cr_assert_eq(capstan__metrics_render(m, &b), 0);
    const char *t = b.p;
    const char *cls = "class=\"We\\\"ird\\\\Job\\nX\"";
    char s[256];
    snprintf(s, sizeof(s), "capstan_jobs_processed_total{%s,queue=\"q\"}", cls);
    cr_assert_eq(value(t, s), 3, "%s", t);
    snprintf(s, sizeof(s), "capstan_jobs_failed_total{%s,queue=\"q\"}", cls);
    cr_assert_eq(value(t, s), 1, "%s", t);
    const struct { const char *le; int n; } want[] = {
        { "0.005", 1 }, { "0.1", 1 }, { "0.25", 2 }, { "60", 2 }, { "+Inf", 3 },
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        snprintf(s, sizeof(s), "capstan_job_duration_seconds_bucket{%s,le=\"%s\"}", cls, want[i].le);
        cr_assert_eq(value(t, s), want[i].n, "%s\n%s", s, t);
    }
    snprintf(s, sizeof(s), "capstan_job_duration_seconds_sum{%s}", cls);
    cr_assert_float_eq(value(t, s), 100.203, 1e-6);
    cr_assert_eq(value(t, "capstan_lock_events_total{type=\"until_executed\",event=\"denied\"}"), 2);
    cr_assert_eq(value(t, "capstan_lock_events_total{type=\"until_executed\",event=\"acquired\"}"), 1);
    cr_assert_eq(value(t, "capstan_lock_events_total{type=\"while_executing\",event=\"failures\"}"), 2);
    cr_assert_eq(value(t, "capstan_poison_pills_total"), 2);
    cr_assert_null(strstr(t, "no_such_event"));
    cr_assert_eq(value(t, "capstan_jobs_processed_total{class=\"X\xEF\xBF\xBD\",queue=\"q\"}"), 2,
                 "%s", t);
    cr_assert_eq(value(t, "capstan_job_duration_seconds_count{class=\"X\xEF\xBF\xBD\"}"), 2, "%s", t);
    cr_assert_eq(value(t, "capstan_lock_events_total{type=\"t\xEF\xBF\xBD\",event=\"acquired\"}"), 1,
                 "%s", t);
    cr_assert_eq(promtool(t), 0, "promtool rejected:\n%s", t);
    capstan__buf_free(&b);
    capstan__metrics_free(m);
}

/* Sidekiq's execution metrics take a job only under its handler's name,
 * one the Metrics page can split on '|'; a handler's series are never
 * folded into "_other", so those names stay apart past the cap. */
Test(metrics, execution_counts_take_registered_names_past_the_cap)
{
    capstan_metrics_t *m = capstan__metrics_new();
    char name[32];
    for (int i = 0; i < CAPSTAN_METRICS_MAX_SERIES; i++) {
        snprintf(name, sizeof(name), "Made%dJob", i);
        capstan__metrics_job(m, name, "q", 0.01, 1, NULL);
    }
    capstan__metrics_job(m, "GoodJob", "q", 0.01, 0, "GoodJob");
    capstan__metrics_job(m, "Bad|Job", "q", 0.01, 0, "Bad|Job");
    capstan__metrics_job(m, "Bad\tJob", "q", 0.01, 0, "Bad\tJob");
    capstan_exec_t *e;
    size_t n = capstan__metrics_exec_take(m, &e);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(e[0].cls, "GoodJob");
    cr_assert_eq(e[0].processed, 1);
    capstan__exec_free(e, n);
    capstan_buf_t b = {0};
    cr_assert_eq(capstan__metrics_render(m, &b), 0);
    cr_assert_eq(value(b.p, "capstan_jobs_processed_total{class=\"GoodJob\",queue=\"q\"}"), 1,
                 "GoodJob folded into _other");
    capstan__buf_free(&b);
    capstan__metrics_free(m);
}

/* Sidekiq 7 and 8 keep execution metrics in Redis (the Web UI's Metrics
 * tab, Sidekiq::Metrics::Query); capstan writes them, in both layouts by
 * default, so the classes a team runs in C show there. Each version's own
 * API reads what capstan counted: jobs, failures, the successful jobs'
 * milliseconds and their histogram. */
static void metrics_tab_shows_c_jobs(const char *sidekiq)
{
    for (int i = 0; i < 20; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", NULL }, NULL), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "SleepJob", "[30]", NULL }, NULL), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "FailJob", NULL }, NULL), 0);
    int port = kt_free_port();
    char yml[128];
    snprintf(yml, sizeof(yml), "heartbeat_interval: 0.5\nliveness_ttl: 2\nmetrics_port: %d\n", port);
    char *y = kt_write_file("exec.yml", yml);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-q", "default", "-c", "3", NULL });
    char *out = NULL;
    const char *args[] = { "NoopJob", "SleepJob", "FailJob", NULL };
    bool done = KT_WAIT_UNTIL((free(out), out = NULL, kt_ruby_v(sidekiq, "metrics_query.rb", args, &out),
                               out && strstr(out, "NoopJob p=20 ") && strstr(out, "FailJob p=3 ")
                                   && strstr(out, "SleepJob p=4 ")),
                              15);
    cr_assert(done, "Sidekiq %s's Metrics API read:\n%s\ncapstan's log:\n%s", sidekiq,
              out ? out : "(nothing)", kt_capstan_log(pid));
    fprintf(stderr, "[metrics tab, Sidekiq %s]\n%s", sidekiq, out);
    /* capstan's own counters say the same. */
    char *m = kt_scrape(port);
    cr_assert(m, "no /metrics page");
    for (const char **c = args; *c; c++) {
        char want[128];
        snprintf(want, sizeof(want), "class=\"%s\"", *c);
        for (const char *l = m; (l = strstr(l, "\ncapstan_jobs_")) != NULL; l++)
            if (strstr(l, want) && strstr(l, want) < strchr(l + 1, '\n'))
                fprintf(stderr, "[capstan /metrics] %.*s\n", (int)(strchr(l + 1, '\n') - l - 1), l + 1);
    }
    cr_assert(strstr(m, "capstan_jobs_processed_total{class=\"NoopJob\",queue=\"default\"} 20"), "%s", m);
    cr_assert(strstr(m, "capstan_jobs_failed_total{class=\"FailJob\",queue=\"default\"} 3"), "%s", m);
    free(m);
    cr_assert(strstr(out, "NoopJob p=20 f=0 "), "%s", out);
    cr_assert(strstr(out, " hist=20\n"), "every successful NoopJob in the histogram: %s", out);
    cr_assert(strstr(out, "FailJob p=3 f=3 ms=0 hist=0"), "failures count no time: %s", out);
    /* 4 jobs of 30 ms: at least 120 ms, in the 30-45 ms bucket or above. */
    const char *sl = strstr(out, "SleepJob p=4 f=0 ms=");
    cr_assert(sl, "%s", out);
    long ms = strtol(sl + strlen("SleepJob p=4 f=0 ms="), NULL, 10);
    cr_assert(ms >= 120 && ms < 4000, "SleepJob ms=%ld: %s", ms, out);
    cr_assert(strstr(out, "top FailJob,NoopJob,SleepJob"), "the Metrics tab lists them: %s", out);
    if (strcmp(sidekiq, "7.3.10") != 0) {
        /* 8.x's periods of a day or more: the 10-minute rollups. */
        cr_assert(strstr(out, "NoopJob 24h p=20 f=0 ") && strstr(out, "FailJob 24h p=3 f=3 ms=0\n")
                      && strstr(out, "SleepJob 24h p=4 f=0 "), "%s", out);
        cr_assert(strstr(out, "top 24h FailJob,NoopJob,SleepJob"), "%s", out);
    }
    if (strcmp(sidekiq, "8.0.10") != 0) {
        /* 7.3's Web UI runs on Debian's rack, 8.1's on the rack 3 vendored
         * with it (8.0's needs rack 3 and has none here): their Metrics
         * pages list and chart the C classes. */
        char *web = NULL;
        cr_assert_eq(kt_ruby_v(sidekiq, "metrics_web.rb", args, &web), 0, "%s", web ? web : "");
        fprintf(stderr, "%s", web);
        cr_assert(strstr(web, "metrics 200 NoopJob=true SleepJob=true FailJob=true"), "%s", web);
        cr_assert(strstr(web, "metrics/NoopJob 200 true") && strstr(web, "metrics/FailJob 200 true"),
                  "%s", web);
        free(web);
    }
    /* Both layouts by default, each with its expiry. */
    redisReply *k7 = kt_cmd("KEYS j|20*");
    redisReply *k8 = kt_cmd("KEYS h|NoopJob-*");
    cr_assert(k7->elements >= 1 && k8->elements >= 1, "7.x and 8.x layouts both written");
    cr_assert_gt(kt_int("TTL %s", k7->element[0]->str), 7 * 3600);
    freeReplyObject(k7);
    freeReplyObject(k8);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(out);
    free(y);
}

Test(metrics, sidekiq_7_3_metrics_tab_shows_c_jobs)
{
    kt_sidekiq_need("7.3.10");
    metrics_tab_shows_c_jobs("7.3.10");
}

Test(metrics, sidekiq_8_0_metrics_tab_shows_c_jobs)
{
    kt_sidekiq_need("8.0.10");
    metrics_tab_shows_c_jobs("8.0.10");
}

Test(metrics, sidekiq_8_1_metrics_tab_shows_c_jobs)
{
    kt_sidekiq_need("8.1.7");
    metrics_tab_shows_c_jobs("8.1.7");
}

/* Sidekiq's Metrics page splits each field of the j|... hashes on '|' and
 * keeps no bound on their number: jobs of classes capstan has no handler
 * for (a '|' or a newline in the name, 5,000 characters) fail and count in
 * /metrics, not there; a registered class still does, and Sidekiq 8.0's
 * own Metrics::Query reads it. */
Test(metrics, sidekiq_metrics_count_only_registered_classes)
{
    char *longname = malloc(5001);
    memset(longname, 'L', 5000);
    longname[5000] = '\0';
    const char *unknown[] = { "Evil|Job", "Evil\\nJob", longname };
    char jid[25];
    for (unsigned i = 0; i < 3; i++) {
        kt_make_jid(jid, 6, i);
        char *p = kt_payload(unknown[i], "[]", jid, "default");
        kt_push_all(kt_redis(), "default", &p, 1);
        free(p);
    }
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", NULL }, NULL), 0);
    char *y = kt_write_file("reg.yml", "heartbeat_interval: 0.5\nliveness_ttl: 2\n");
    /* One processor, in queue order: the unknown jobs are counted before
     * NoopJob, so once NoopJob shows every count has been written. */
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-q", "default", "-c", "1", "--unknown-class",
                                                   "fail", NULL });
    cr_assert(KT_WAIT_UNTIL(({
                  redisReply *k = kt_cmd("KEYS j|*");
                  size_t n = 0;
                  for (size_t i = 0; i < k->elements; i++)
                      n += kt_int("HEXISTS %s NoopJob|p", k->element[i]->str) == 1;
                  freeReplyObject(k);
                  n; }) == 3, 15), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("ZCARD retry"), 3, "the unknown classes failed: %s", kt_capstan_log(pid));
    redisReply *k = kt_cmd("KEYS j|*");
    long foreign = 0;
    for (size_t i = 0; i < k->elements; i++) {
        redisReply *f = kt_cmd("HKEYS %s", k->element[i]->str);
        for (size_t j = 0; j < f->elements; j++)
            if (strncmp(f->element[j]->str, "NoopJob|", 8) != 0 && !foreign++)
                fprintf(stderr, "[metrics] a field of %s: %.60s\n", k->element[i]->str, f->element[j]->str);
        freeReplyObject(f);
    }
    freeReplyObject(k);
    cr_assert_eq(foreign, 0, "%ld fields of unknown classes in the j| hashes", foreign);
    char *out = NULL;
    cr_assert_eq(kt_ruby_v("8.0.10", "metrics_query.rb", (const char *[]){ "NoopJob", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "NoopJob p=1 f=0 ") && strstr(out, "top NoopJob\n"), "Sidekiq 8.0 read:\n%s", out);
    free(out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    free(y);
    free(longname);
}

/* sidekiq_metrics: off writes none; 8 writes only Sidekiq 8's layout. */
Test(metrics, sidekiq_metrics_setting_picks_the_layouts)
{
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", NULL }, NULL), 0);
    char *y = kt_write_file("exec8.yml", "heartbeat_interval: 0.5\nliveness_ttl: 2\n"
                                         "sidekiq_metrics: 8\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-q", "default", NULL });
    cr_assert(KT_WAIT_UNTIL(({
                  redisReply *k = kt_cmd("KEYS h|NoopJob-*");
                  size_t n = k->elements;
                  freeReplyObject(k);
                  n; }) == 1, 10), "%s", kt_capstan_log(pid));
    redisReply *k7 = kt_cmd("KEYS j|20*");
    redisReply *h7 = kt_cmd("KEYS NoopJob-*");
    cr_assert_eq(k7->elements + h7->elements, 0, "no 7.x keys");
    freeReplyObject(k7);
    freeReplyObject(h7);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    char *bad = kt_write_file("execbad.yml", "sidekiq_metrics: 9\n");
    char *log = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "run", "-C", bad, NULL }, &log), 78);
    cr_assert(strstr(log, "sidekiq_metrics") && strstr(log, "must be off, 7, 8 or both"), "%s", log);
    free(log);
    free(bad);
    free(y);
}

/* capstan stats --json into *out (replaced), and its entry for queue into
 * *q (replaced) once it counts some prefetched jobs: 1 then, else 0. */
static int stats_queue(char **out, const char *queue, json_t **q)
{
    free(*out);
    *out = NULL;
    json_decref(*q);
    *q = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--json", "--redis-url", kt_url(), NULL }, out),
                 0, "%s", *out);
    json_t *o = json_loads(*out, 0, NULL), *e;
    size_t i;
    cr_assert(o, "%s", *out);
    json_array_foreach(json_object_get(o, "queues"), i, e)
        if (strcmp(json_string_value(json_object_get(e, "name")), queue) == 0)
            *q = json_incref(e);
    json_decref(o);
    return *q && json_integer_value(json_object_get(*q, "prefetched")) > 0;
}

/* Jobs a process fetched ahead sit in its working list, out of the queue's
 * size: /metrics and `capstan stats` count them by queue. Two processors
 * start on a full queue and each runs a long job; the one that took the
 * second fetched more ahead (for the next free processor) before it ran its
 * own: one, or two when it looked before the first had marked itself busy.
 * Until both run, a scrape may catch a job fetched ahead for the other one,
 * about to be taken: the counts are read once both run, from one scrape. */
Test(metrics, jobs_fetched_ahead_show_by_queue_in_metrics_and_stats)
{
    enum { N = 10 };
    int port = kt_free_port(), status = 0;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    char *p[N];
    for (int i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 9, (unsigned)i);
        p[i] = kt_payload("SleepJob", "[60000]", jid, "slow");
    }
    kt_push_all(kt_redis(), "slow", p, N);
    for (int i = 0; i < N; i++)
        free(p[i]);
    char *conf = kt_write_conf("heartbeat_interval: 0.5\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", conf, "-q", "slow", "-c", "2", "--metrics-port",
                                                   portstr, NULL });
    free(conf);
    char *resp = NULL;
    const char *m = "";
    long long ahead = 0;
    cr_assert(KT_WAIT_UNTIL((free(resp), resp = http_get(port, "/metrics", &status),
                             m = resp ? body_of(resp) : "",
                             ahead = (long long)value(m, "capstan_prefetched_jobs{queue=\"slow\"}"),
                             value(m, "capstan_busy_threads") == 2 && ahead > 0
                                 && value(m, "capstan_queue_size{queue=\"slow\"}") == N - 2 - ahead),
                            20),
              "%s\n%s", resp ? resp : "(no answer)", kt_capstan_log(pid));
    free(resp);
    cr_assert_leq(ahead, 2);
    /* Two running, the rest ahead or in the queue; stats counts as of the
     * last heartbeat. */
    cr_assert_eq(kt_int("LLEN queue:slow"), N - 2 - ahead);
    char *out = NULL;
    json_t *slow = NULL;
    cr_assert(KT_WAIT_UNTIL(stats_queue(&out, "slow", &slow)
                            && json_integer_value(json_object_get(slow, "prefetched")) == ahead, 20),
              "%s", out);
    cr_assert_eq(json_integer_value(json_object_get(slow, "size")), N - 2 - ahead, "%s", out);
    json_decref(slow);
    free(out);
    out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", "--redis-url", kt_url(), NULL }, &out), 0);
    cr_assert(strstr(out, "Prefetched"), "%s", out);
    free(out);
    kt_capstan_stop(pid, SIGKILL, 5);
}

/* Jobs whose expires_at has passed when their turn comes (pushed by
 * `capstan push --expires-in` and by Ruby, as Sidekiq Pro's expiry and the
 * sidekiq-expiring-jobs gem write it) are dropped unrun: logged, counted
 * apart from the processed ones, kept nowhere; those still in time run. */
Test(metrics, expired_jobs_are_dropped_unrun_and_counted_apart)
{
    char *out = NULL, ruby[160];
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"ex\"]", "--expires-in", "0.001",
                                                  NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "push", "RecordJob", "[\"ex\"]", "--expires-in", "600",
                                                  NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "expires_at") == NULL, "prints the jid only: %s", out);
    free(out);
    char *p = kt_str("LINDEX queue:default 0");
    cr_assert(p && strstr(p, "\"expires_at\":"), "the push wrote expires_at: %s", p);
    free(p);
    for (int late = 0; late < 2; late++) {
        snprintf(ruby, sizeof(ruby), "{\"class\":\"RecordJob\",\"args\":[\"ex\"],\"expires_at\":%.3f}",
                 kt_wall() + (late ? -5 : 600));
        cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push", ruby, NULL }, NULL), 0);
    }
    kt_sleep(0.01); /* the first push's 1 ms has passed */
    char *conf = kt_write_conf(NULL);
    int port = kt_free_port(), status = 0;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", conf, "-c", "2", "--metrics-port", portstr, NULL });
    char *resp = NULL;
    bool done = KT_WAIT_UNTIL(
        (free(resp), resp = http_get(port, "/metrics", &status),
         resp && value(body_of(resp), "capstan_jobs_skipped_total{class=\"RecordJob\",reason=\"expired\"}") == 2
              && value(body_of(resp), "capstan_jobs_processed_total{class=\"RecordJob\",queue=\"default\"}") == 2),
        15);
    cr_assert(done, "%s\n%s", resp ? resp : "(no answer)", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD ex"), 2, "only the two in time ran");
    /* Job lines are written in batches, soon after. */
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "INFO: expired\n") == 2, 5), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "s ago (expires_at "), 2, "how late: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
    cr_assert_eq(kt_int("GET stat:processed"), 2, "the expired jobs are not processed");
    cr_assert_eq(kt_int("GET stat:failed"), 0);
    cr_assert_eq(kt_int("LLEN queue:default") + kt_int("ZCARD retry") + kt_int("ZCARD dead"), 0, "kept nowhere");
    free(resp);
    free(conf);
}

/* The status of GET path on 127.0.0.1:port (0 when nothing answers); the
 * body into *body when it is not NULL (malloc'd). */
static int probe_status(int port, const char *path, char **body)
{
    int status = 0;
    char *resp = http_get(port, path, &status);
    if (body)
        *body = strdup(resp ? body_of(resp) : "");
    free(resp);
    return status;
}

/* The probes an orchestrator asks on the metrics port: /readyz turns 503,
 * with the reason, within 2 s of Redis being frozen (SIGSTOP), and 200
 * again within 2 s of it going on; /livez stays 200 all along, since a
 * Redis outage is no reason to restart the process. */
Test(metrics, readyz_follows_a_frozen_redis_and_livez_does_not)
{
    kt_aof_redis_t srv;
    kt_aof_init(&srv, "probe-redis");
    kt_aof_start(&srv);
    int port = kt_free_port();
    char portstr[16], *why = NULL;
    snprintf(portstr, sizeof(portstr), "%d", port);
    char *conf = kt_write_conf("heartbeat_interval: 0.5\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", conf, "-c", "2", "--metrics-port", portstr,
                                                   "--redis-url", srv.url, NULL });
    cr_assert(KT_WAIT_UNTIL(probe_status(port, "/readyz", NULL) == 200, 20), "%s", kt_capstan_log(pid));
    cr_assert_eq(probe_status(port, "/livez", NULL), 200);
    for (int round = 0; round < 2; round++) {
        kill(srv.pid, SIGSTOP);
        double t0 = kt_now();
        int down = KT_WAIT_UNTIL(probe_status(port, "/readyz", NULL) == 503, 10);
        double took = kt_now() - t0;
        int st = probe_status(port, "/readyz", &why), live = probe_status(port, "/livez", NULL);
        kt_sleep(3); /* longer than the housekeeper may miss turns */
        int live_later = probe_status(port, "/livez", NULL);
        kill(srv.pid, SIGCONT);
        fprintf(stderr, "[probes] /readyz 503 %.2f s after SIGSTOP (%s)\n", took, why);
        cr_assert(down && took < 2.0, "/readyz %s %.2f s after SIGSTOP", down ? "turned 503" : "stayed",
                  took);
        cr_assert(st == 503 && strstr(why, "Redis"), "%d: %s", st, why);
        free(why);
        cr_assert(live == 200 && live_later == 200, "/livez during a Redis stop: %d, %d", live, live_later);
        t0 = kt_now();
        int up = KT_WAIT_UNTIL(probe_status(port, "/readyz", NULL) == 200, 10);
        took = kt_now() - t0;
        fprintf(stderr, "[probes] /readyz 200 %.2f s after SIGCONT\n", took);
        cr_assert(up && took < 2.0, "/readyz %s %.2f s after SIGCONT", up ? "turned 200" : "stayed 503", took);
    }
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
    free(conf);
}

/* Pushes cls(args) with retry: false, so that a failure is its end. */
static void push_once(const char *cls, const char *args, unsigned i)
{
    char jid[25];
    kt_make_jid(jid, 40, i);
    char *p = kt_payload(cls, args, jid, "default");
    memcpy(strstr(p, "\"retry\":true"), "\"retry\":0   ", 12); /* 0: no retries */
    freeReplyObject(kt_cmd("LPUSH queue:default %s", p));
    freeReplyObject(kt_cmd("SADD queues default"));
    free(p);
}

/* Jobs that end without their handler returning count as Sidekiq counts a
 * job that raised, in stat:processed and stat:failed (and the day's keys),
 * and in the Metrics tab: one failed by its hard timeout (its handler
 * never returns) and a poison pill (its worker died under it, and crash
 * recovery sent it to the dead set), beside one that raised. What the
 * version's own API reads. */
static void misbehaving_jobs_count_as_failures(const char *sidekiq)
{
    char *y = kt_write_conf("heartbeat_interval: 0.5\nliveness_ttl: 2\nmax_recoveries: 1\n"
                            "classes:\n  HangJob:\n    timeout: 1\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    /* The crasher alone first: its crash would take the others with it. */
    push_once("SegfaultJob", "[]", 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1, 20), "%s", kt_capstan_log(pid));
    push_once("HangJob", "[\"hung\"]", 1);
    push_once("FailJob", "[]", 2);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 3, 20), "%s", kt_capstan_log(pid));
    char day[16];
    time_t now = time(NULL);
    strftime(day, sizeof(day), "%Y-%m-%d", gmtime(&now));
    bool counted = KT_WAIT_UNTIL(kt_int("GET stat:processed") == 3 && kt_int("GET stat:failed") == 3, 10);
    fprintf(stderr, "[misbehaving jobs, Sidekiq %s] stat:processed %lld, stat:failed %lld (of 3 failures)\n",
            sidekiq, kt_int("GET stat:processed"), kt_int("GET stat:failed"));
    cr_assert(counted, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("GET stat:processed:%s", day), 3);
    cr_assert_eq(kt_int("GET stat:failed:%s", day), 3);
    char *out = NULL;
    const char *args[] = { "FailJob", "HangJob", "SegfaultJob", NULL };
    bool shown = KT_WAIT_UNTIL((free(out), out = NULL, kt_ruby_v(sidekiq, "metrics_query.rb", args, &out),
                                out && strstr(out, "FailJob p=1 f=1 ") && strstr(out, "HangJob p=1 f=1 ")
                                    && strstr(out, "SegfaultJob p=1 f=1 ")), 10);
    fprintf(stderr, "[misbehaving jobs, Sidekiq %s's Metrics API]\n%s", sidekiq, out ? out : "(nothing)\n");
    cr_assert(shown, "%s", kt_capstan_log(pid));
    free(out);
    out = NULL;
    cr_assert_eq(kt_ruby_v(sidekiq, "sidekiq.rb", (const char *[]){ "stats", NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "\"processed\":3") && strstr(out, "\"failed\":3"), "Sidekiq::Stats: %s", out);
    free(out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    free(y);
}

Test(metrics, sidekiq_7_3_counts_timed_out_jobs_and_poison_pills)
{
    kt_sidekiq_need("7.3.10");
    misbehaving_jobs_count_as_failures("7.3.10");
}

Test(metrics, sidekiq_8_1_counts_timed_out_jobs_and_poison_pills)
{
    kt_sidekiq_need("8.1.7");
    misbehaving_jobs_count_as_failures("8.1.7");
}
