/* The supervisor end to end: `capstan run --processes N` forks N workers
 * and watches them. A worker that crashes or is killed has its jobs back in
 * their queues at once (the supervisor reaped it: no lease to wait for) and
 * a replacement running; a job over its class's timeout fails with
 * Capstan::Timeout and its worker is replaced; a worker over max_memory is
 * recycled without losing a job; TERM reaches every worker, and the death
 * of the supervisor makes its workers leave gracefully.
 *
 * Ledgers: LedgerJob counts its starts per jid (HINCRBY at its start), so
 * "ran once" means started once. Recovery times are printed for the
 * record, read from the log's timestamps. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

/* 120 s: a killed tree's jobs wait some 24 s for the fleet's recovery
 * (a per-test .timeout would leak in Criterion's runner under ASan). */
TestSuite(supervisor, .timeout = 120, .fini = kt_kill_children);

/* Pushes n LedgerJobs recording into key (each sleeping ms), with the job
 * extra (a payload, or NULL) after the first at jobs. */
static void push_ledger(const char *key, int n, int ms, const char *extra, int at, unsigned tag)
{
    char **p = calloc((size_t)n + 1, sizeof(char *));
    char args[128];
    snprintf(args, sizeof(args), "[\"%s\", %d]", key, ms);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (extra && i == at)
            p[k++] = strdup(extra);
        char jid[25];
        kt_make_jid(jid, tag, (unsigned)i);
        p[k++] = kt_payload("LedgerJob", args, jid, "default");
    }
    kt_push_all(kt_redis(), "default", p, (size_t)k);
    for (int i = 0; i < k; i++)
        free(p[i]);
    free(p);
}

/* How many jids of the ledger key started more than once (and, in *n, how
 * many started at all). */
static long started_twice(const char *key, long *n)
{
    redisReply *r = kt_cmd("HVALS %s", key);
    long twice = 0;
    *n = r->type == REDIS_REPLY_ARRAY ? (long)r->elements : 0;
    for (long i = 0; i < *n; i++)
        twice += atol(r->element[i]->str) > 1;
    freeReplyObject(r);
    return twice;
}

/* The members of zset key, one a line (malloc'd). */
static char *members(const char *key)
{
    redisReply *r = kt_cmd("ZRANGE %s 0 -1", key);
    size_t len = 1;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        len += r->element[i]->len + 1;
    char *out = calloc(1, len);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        strcat(out, r->element[i]->str);
        strcat(out, "\n");
    }
    freeReplyObject(r);
    return out;
}

/* Seconds of the day of the log line's ISO timestamp. */
static double line_time(const char *line)
{
    const char *t = strchr(line, 'T');
    int h, m;
    double s;
    if (!t || sscanf(t + 1, "%d:%d:%lf", &h, &m, &s) != 3)
        return -1;
    return h * 3600 + m * 60 + s;
}

/* The time of the first line of pid's log holding needle at or after
 * since (seconds of the day), or -1. */
static double log_time(pid_t pid, const char *needle, double since)
{
    char *log = kt_capstan_log(pid), *save = NULL;
    double at = -1;
    for (char *line = strtok_r(log, "\n", &save); line && at < 0; line = strtok_r(NULL, "\n", &save))
        if (strstr(line, needle) && line_time(line) >= since)
            at = line_time(line);
    free(log);
    return at;
}

/* The body of GET /metrics on 127.0.0.1:port (malloc'd; "" when nothing
 * answers). */
static char *scrape(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = { 5, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && write(fd, req, sizeof(req) - 1) > 0) {
        ssize_t got;
        while ((got = read(fd, buf + len, cap - len - 1)) > 0)
            if ((len += (size_t)got) + 1024 > cap)
                buf = realloc(buf, cap *= 2);
        buf[len] = '\0';
    }
    close(fd);
    return buf;
}

/* Whether pid is gone (or a zombie nobody reaped: it has exited). */
static int gone(pid_t pid)
{
    char path[64], buf[512] = "";
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return !paren || (paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

/* A segfault among jobs, at processes 2 with one processor each: every
 * processor of the crashed worker ran the crasher, so each other job of its
 * list had been fetched ahead and not started (bar one at most a crash: a
 * job finished just before whose ack was still to be written, which counts
 * as started and runs again). They go back at once, untouched, and start
 * once in all; the crasher is a poison pill at its third crash. */
Test(supervisor, a_segfault_gives_the_workers_jobs_back_at_once_and_buries_the_crasher)
{
    enum { N = 300 };
    char jid[25];
    kt_make_jid(jid, 9, 0);
    char *crasher = kt_payload("SegfaultJob", "[]", jid, "default");
    push_ledger("seg", N, 2, crasher, 20, 1);
    free(crasher);
    /* No core files; and a sanitizer's SEGV handler would exit 1 instead
     * of letting the worker die of the signal. */
    setrlimit(RLIMIT_CORE, &(struct rlimit){ 0, 0 });
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof(opts), "%s%shandle_segv=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    pid_t pid = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "1", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1 && kt_int("LLEN seg:done") == N, 60),
              "%lld dead, %lld of %d done: %s", kt_int("ZCARD dead"), kt_int("LLEN seg:done"), N,
              kt_capstan_log(pid));
    long n, twice = started_twice("seg", &n);
    fprintf(stderr, "[segfault] %ld of %d jobs started twice (finished, their ack not yet written)\n",
            twice, N);
    cr_assert_eq(n, N);
    cr_assert_leq(twice, 3, "%ld jobs started twice", twice);
    char *dead = members("dead");
    cr_assert(strstr(dead, "Capstan::PoisonPill") && strstr(dead, "SegfaultJob"), "%s", dead);
    free(dead);
    cr_assert_eq(kt_log_count(pid, "was killed by signal 11"), 3, "%s", kt_capstan_log(pid));
    /* The first crash: its jobs back and its replacement processing. */
    double crash = log_time(pid, "received SIGSEGV", 0);
    double back = log_time(pid, "back in their queues", crash);
    double replaced = log_time(pid, "Starting processing", crash);
    fprintf(stderr, "[segfault] crash report to jobs back: %.0f ms; to a replacement processing: %.0f ms\n",
            (back - crash) * 1000, (replaced - crash) * 1000);
    cr_assert(crash > 0 && back >= crash && back - crash < 1.0, "%s", kt_capstan_log(pid));
    cr_assert(replaced >= crash && replaced - crash < 1.0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
}

/* A handler that calls exit(0), among jobs at processes 2: the worker it
 * ends was not told to leave, so it is a crash like a segfault: replaced
 * at once, the job's start counted, the job a poison pill at its third
 * exit; every other job runs and the supervisor stays up. */
Test(supervisor, a_handler_calling_exit_0_is_a_crash_and_its_job_a_poison_pill)
{
    enum { N = 60 };
    char jid[25];
    kt_make_jid(jid, 10, 0);
    char *exiter = kt_payload("ExitJob", "[0]", jid, "default");
    push_ledger("ex", N, 100, exiter, 10, 11);
    free(exiter);
    pid_t pid = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "4", NULL });
    /* A job another processor of an exiting worker had finished, its ack
     * still to be written, counts as started and runs again (as after a
     * segfault): at most one a processor a crash. */
    int all = KT_WAIT_UNTIL(kt_int("ZCARD dead") == 1 && kt_int("HLEN ex") == N && kt_int("LLEN ex:done") >= N
                                && kt_int("LLEN queue:default") == 0, 60);
    long n, twice = started_twice("ex", &n);
    long long left = kt_int("LLEN queue:default");
    fprintf(stderr, "[exit 0] %lld of %d jobs left unrun, %lld in the dead set, the supervisor %s\n",
            left, N + 1, kt_int("ZCARD dead"), gone(pid) ? "gone" : "up");
    cr_assert(all, "%lld dead, %lld of %d done: %s", kt_int("ZCARD dead"), kt_int("LLEN ex:done"), N,
              kt_capstan_log(pid));
    cr_assert(!gone(pid), "%s", kt_capstan_log(pid));
    cr_assert_eq(n, N);
    cr_assert_leq(twice, 3 * 3, "%ld jobs started twice", twice);
    char *dead = members("dead");
    cr_assert(strstr(dead, "Capstan::PoisonPill") && strstr(dead, "ExitJob"), "%s", dead);
    free(dead);
    cr_assert_eq(left, 0);
    cr_assert_eq(kt_log_has(pid, "it is not replaced"), 0, "%s", kt_capstan_log(pid));
    cr_assert_geq(kt_log_count(pid, ") exited with status "), 3, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
}

/* Sidekiq's Stop (TERM pushed on a worker's signals list) ends that worker
 * for good: it is not replaced, the other goes on, and once both are
 * stopped so `capstan run` exits 0. */
Test(supervisor, sidekiqs_stop_ends_a_worker_without_a_replacement)
{
    char *y = kt_write_conf(NULL); /* beats that pick up the signal soon */
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "--processes", "2", "-c", "2", NULL });
    free(y);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 2 workers ready"), 10), "%s", kt_capstan_log(pid));
    for (int slot = 0; slot < 2; slot++) {
        pid_t w = kt_worker_pid(pid, slot);
        char *id = NULL, want[32], line[64];
        snprintf(want, sizeof(want), ":%d:", (int)w);
        redisReply *r = kt_cmd("SMEMBERS processes");
        for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
            if (strstr(r->element[i]->str, want))
                id = strdup(r->element[i]->str);
        freeReplyObject(r);
        cr_assert(id, "no process of pid %d", (int)w);
        freeReplyObject(kt_cmd("LPUSH %s-signals TERM", id));
        free(id);
        snprintf(line, sizeof(line), "worker %d was stopped (Web UI or API); it is not replaced", slot);
        cr_assert(KT_WAIT_UNTIL(gone(w) && kt_log_has(pid, line), 15), "%s", kt_capstan_log(pid));
        if (slot == 0) {
            /* Time enough for a replacement to show, were one started. */
            kt_sleep(1.5);
            cr_assert(!gone(pid) && !gone(kt_worker_pid(pid, 1)), "%s", kt_capstan_log(pid));
        }
    }
    cr_assert_eq(kt_wait_exit(pid, 20), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "worker 0 started (pid "), 1, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "worker 1 started (pid "), 1, "%s", kt_capstan_log(pid));
}

/* kill -9 of a worker mid-drain: its list is back in its queue within a
 * second (no liveness lease to wait for), nothing is lost, and only
 * jobs it had started run again: those running, and those finished whose
 * ack was still to ride a round trip (a few a processor at most). */
Test(supervisor, kill_9_of_a_worker_gives_its_jobs_back_within_a_second)
{
    enum { N = 2000, C = 4 };
    push_ledger("k9", N, 2, NULL, 0, 2);
    char port[16];
    snprintf(port, sizeof(port), "%d", kt_free_port());
    pid_t pid = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "4", "--metrics-port", port, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN k9:done") > 200, 15), "%s", kt_capstan_log(pid));
    pid_t victim = kt_worker_pid(pid, 0);
    cr_assert_gt(victim, 0);
    char *wkey = NULL;
    redisReply *keys = kt_cmd("KEYS uniquejobs:working:*:%d:*", (int)victim);
    cr_assert(keys->type == REDIS_REPLY_ARRAY && keys->elements == 1, "no working list of pid %d", (int)victim);
    wkey = strdup(keys->element[0]->str);
    freeReplyObject(keys);
    cr_assert_gt(kt_int("LLEN %s", wkey), 0);
    double t0 = kt_now();
    kill(victim, SIGKILL);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s", wkey) == 0, 5), "%s", kt_capstan_log(pid));
    double back = kt_now() - t0;
    double t1 = kt_now();
    cr_assert(KT_WAIT_UNTIL(kt_worker_pid(pid, 0) != victim && kt_log_count(pid, "Starting processing") >= 3, 5),
              "%s", kt_capstan_log(pid));
    double replaced = kt_now() - t1 + back;
    fprintf(stderr, "[kill -9] jobs back in %.0f ms, a replacement processing %.0f ms after the kill\n",
            back * 1000, replaced * 1000);
    cr_assert_lt(back, 1.0);
    /* The replacement of worker 0 serves /metrics, with the restart. */
    cr_assert(KT_WAIT_UNTIL(({ char *m = scrape(atoi(port));
                               int ok = strstr(m, "capstan_worker_restarts_total{slot=\"0\",cause=\"crash\"} 1\n") &&
                                        strstr(m, "capstan_worker_restarts_total{slot=\"1\",cause=\"crash\"} 0\n");
                               free(m); ok; }), 5), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN k9:done") >= N, 30), "%lld of %d: %s", kt_int("LLEN k9:done"), N,
              kt_capstan_log(pid));
    long n, twice = started_twice("k9", &n);
    fprintf(stderr, "[kill -9] %ld of %d jobs started twice (the killed worker ran %d at a time)\n", twice,
            N, C);
    cr_assert_eq(n, N);
    cr_assert_leq(twice, 4 * C);
    cr_assert_eq(kt_int("ZCARD dead") + kt_int("ZCARD retry"), 0);
    free(wkey);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
}

/* A job that never returns, with timeout: 2, beside jobs that outlast it:
 * it is in the retry set with Capstan::Timeout after 2-3 s, the others
 * finish, and its worker is replaced. */
Test(supervisor, a_job_over_its_timeout_fails_with_capstan_timeout_and_its_worker_is_replaced)
{
    char *y = kt_write_conf("classes:\n  HangJob:\n    timeout: 2\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "3", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 1 workers ready"), 10), "%s", kt_capstan_log(pid));
    char jid[25];
    kt_make_jid(jid, 3, 0);
    char *hang = kt_payload("HangJob", "[\"hung\"]", jid, "default");
    push_ledger("tl", 2, 2600, hang, 0, 4);
    free(hang);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN hung") == 1, 5), "%s", kt_capstan_log(pid));
    double t0 = kt_now();
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 5), "%s", kt_capstan_log(pid));
    double took = kt_now() - t0;
    fprintf(stderr, "[timeout] the hung job was in the retry set %.2f s after it started\n", took);
    cr_assert(took > 1.5 && took < 3.0, "%.2f s", took);
    char *retry = members("retry");
    cr_assert(strstr(retry, "\"error_class\":\"Capstan::Timeout\"") && strstr(retry, jid), "%s", retry);
    free(retry);
    /* The others finished where they ran, once. */
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN tl:done") == 2, 5), "%s", kt_capstan_log(pid));
    long n, twice = started_twice("tl", &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(twice, 0);
    cr_assert(KT_WAIT_UNTIL(kt_log_count(pid, "Starting processing") == 2 &&
                            kt_log_has(pid, "worker 0 (pid "), 10), "%s", kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "is leaving (timeout)"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN hung"), 1, "the hung job ran again");
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    free(y);
}

/* A leaking handler: its worker goes over max_memory, finishes its jobs,
 * leaves, and a fresh one carries on; no job is lost, failed or run
 * twice. */
Test(supervisor, a_worker_over_max_memory_is_recycled_without_losing_a_job)
{
    enum { N = 60 };
    char **p = calloc(12, sizeof(char *));
    for (unsigned i = 0; i < 12; i++) {
        char jid[25];
        kt_make_jid(jid, 5, i);
        p[i] = kt_payload("LeakJob", "[20]", jid, "default");
    }
    kt_push_all(kt_redis(), "default", p, 12);
    for (unsigned i = 0; i < 12; i++)
        free(p[i]);
    free(p);
    push_ledger("mem", N, 50, NULL, 0, 6);
    pid_t pid = kt_capstan_start((const char *[]){ "--max-memory", "160MB", "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN mem:done") == N && kt_int("LLEN queue:default") == 0, 30),
              "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("EVAL \"local n = 0 for _, k in ipairs(redis.call('KEYS', "
                                   "'uniquejobs:working:*')) do n = n + redis.call('LLEN', k) end "
                                   "return n\" 0") == 0, 10), "%s", kt_capstan_log(pid));
    cr_assert_geq(kt_log_count(pid, "is leaving (memory)"), 1, "%s", kt_capstan_log(pid));
    long n, twice = started_twice("mem", &n);
    cr_assert_eq(n, N);
    cr_assert_eq(twice, 0);
    cr_assert_eq(kt_int("ZCARD dead") + kt_int("ZCARD retry"), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
}

/* TERM to the supervisor reaches every worker; it exits once they all
 * have finished. */
Test(supervisor, term_to_the_supervisor_ends_every_worker)
{
    pid_t pid = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 2 workers ready"), 10), "%s", kt_capstan_log(pid));
    pid_t a = kt_worker_pid(pid, 0), b = kt_worker_pid(pid, 1);
    cr_assert(a > 0 && b > 0);
    cr_assert_eq(kt_int("SCARD processes"), 2);
    /* capstan stats names each worker's slot and supervisor. */
    char *out = NULL, want[64];
    cr_assert_eq(kt_capstan_run((const char *[]){ "stats", NULL }, &out), 0, "%s", out);
    for (int slot = 0; slot < 2; slot++) {
        snprintf(want, sizeof(want), "worker %d of supervisor %d", slot, (int)pid);
        cr_assert(strstr(out, want), "%s", out);
    }
    free(out);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    cr_assert(gone(a) && gone(b));
    cr_assert_eq(kt_log_count(pid, "Bye!"), 2, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD processes"), 0);
}

/* The name the kernel gives pid (what ps, top and pgrep -x match), malloc'd. */
static char *comm_of(pid_t pid)
{
    char path[64], name[32] = "";
    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(name, sizeof(name), f))
            name[0] = '\0';
        fclose(f);
    }
    name[strcspn(name, "\n")] = '\0';
    return strdup(name);
}

/* `pgrep -x capstan` finds the supervisor and its workers, forked or
 * started again from the binary on disk (a reload): the start that turns
 * glibc's thread caches off must not rename the process. */
Test(supervisor, the_supervisor_and_its_workers_are_named_capstan)
{
    pid_t pid = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 2 workers ready"), 10), "%s", kt_capstan_log(pid));
    for (int round = 0; round < 2; round++) {
        pid_t procs[] = { pid, kt_worker_pid(pid, 0), kt_worker_pid(pid, 1) };
        for (int i = 0; i < 3; i++) {
            char *name = comm_of(procs[i]);
            cr_expect_str_eq(name, "capstan", "process %d (%s) is named %s", (int)procs[i],
                             i == 0 ? "the supervisor" : round ? "a reloaded worker" : "a worker", name);
            free(name);
        }
        if (round == 0) {
            kill(pid, SIGHUP);
            cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "reload done: 2 workers"), 15), "%s", kt_capstan_log(pid));
        }
    }
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
}

/* kill -9 of the supervisor: each worker notices and shuts down
 * gracefully, leaving the process set. */
Test(supervisor, a_killed_supervisor_has_its_workers_leave_gracefully)
{
    pid_t pid = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 2 workers ready"), 10), "%s", kt_capstan_log(pid));
    pid_t a = kt_worker_pid(pid, 0), b = kt_worker_pid(pid, 1);
    kill(pid, SIGKILL);
    kt_wait_exit(pid, 5);
    cr_assert(KT_WAIT_UNTIL(gone(a) && gone(b), 10), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, "Bye!"), 2, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD processes"), 0);
}

/* HUP during a drain: each worker is replaced in turn by one started from
 * the binary on disk, ready before the old one is told to leave; nothing
 * is lost and nothing runs twice. */
Test(supervisor, hup_replaces_the_workers_one_at_a_time_without_losing_or_repeating_a_job)
{
    enum { N = 3000 };
    push_ledger("hup", N, 2, NULL, 0, 7);
    pid_t pid = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "4", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN hup:done") > 300, 15), "%s", kt_capstan_log(pid));
    pid_t a = kt_worker_pid(pid, 0), b = kt_worker_pid(pid, 1);
    double t0 = kt_now();
    kill(pid, SIGHUP);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "reload done: 2 workers"), 15), "%s", kt_capstan_log(pid));
    fprintf(stderr, "[hup] both workers replaced in %.2f s, %lld of %d jobs done by then\n", kt_now() - t0,
            kt_int("LLEN hup:done"), N);
    cr_assert(KT_WAIT_UNTIL(gone(a) && gone(b), 15), "%s", kt_capstan_log(pid));
    cr_assert(kt_worker_pid(pid, 0) != a && kt_worker_pid(pid, 1) != b);
    cr_assert_eq(kt_log_count(pid, ") from the binary on disk"), 2, "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN hup:done") >= N, 30), "%lld of %d: %s", kt_int("LLEN hup:done"), N,
              kt_capstan_log(pid));
    long n, twice = started_twice("hup", &n);
    cr_assert_eq(n, N);
    cr_assert_eq(twice, 0, "%ld jobs started twice", twice);
    cr_assert_eq(kt_int("ZCARD dead") + kt_int("ZCARD retry"), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD processes"), 0);
}

/* A hung job that holds a runtime lock: its Capstan::Timeout failure,
 * written while its handler still runs, releases the lock too (the handler
 * never returns to release it; before, the digest stayed locked until the
 * reaper). */
Test(supervisor, a_timed_out_job_releases_its_runtime_lock)
{
    char *y = kt_write_conf("classes:\n  HangJob:\n    timeout: 2\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 1 workers ready"), 10), "%s", kt_capstan_log(pid));
    char jid[25];
    kt_make_jid(jid, 7, 0);
    char *p = kt_payload_locked("HangJob", "[\"hunglock\"]", jid, "default", "while_executing",
                                "hanglockdigest");
    kt_push_all(kt_redis(), "default", &p, 1);
    free(p);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS uniquejobs:hanglockdigest:RUN:LOCKED") == 1, 5), "%s",
              kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == 1, 5), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("EXISTS uniquejobs:hanglockdigest:RUN:LOCKED"), 0, "the runtime lock outlived the job");
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    free(y);
}

/* A HUP's configuration gives the workers started after it their shutdown
 * grace: started with timeout: 1, then HUP'd with timeout: 40, a worker
 * leaving after a hung job's hard timeout lets a job of 16 s beside it
 * finish (its own grace, 40 s), and the supervisor, which kills a worker
 * past its grace and 10 s, does not kill it at 1 + 10 s. */
Test(supervisor, a_hup_gives_the_workers_after_it_the_new_timeout_as_their_grace)
{
    char *y = kt_write_conf("timeout: 1\nclasses:\n  HangJob:\n    timeout: 2\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "3", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 1 workers ready"), 20), "%s", kt_capstan_log(pid));
    char *longer = kt_write_conf("timeout: 40\nclasses:\n  HangJob:\n    timeout: 2\n");
    cr_assert_eq(rename(longer, y), 0);
    kill(pid, SIGHUP);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "reload done: 1 workers"), 30), "%s", kt_capstan_log(pid));
    char jid[25];
    kt_make_jid(jid, 9, 0);
    char *hang = kt_payload("HangJob", "[\"hung_grace\"]", jid, "default");
    push_ledger("grace", 1, 16000, hang, 0, 10);
    free(hang);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN hung_grace") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "is leaving (timeout)"), 20), "%s", kt_capstan_log(pid));
    double t0 = kt_now();
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN grace:done") >= 1, 60), "%s", kt_capstan_log(pid));
    long n, twice = started_twice("grace", &n);
    int killed = kt_log_has(pid, "outstayed its shutdown grace");
    fprintf(stderr, "[grace] after a HUP to timeout: 40, the 16 s job beside a timed-out one ended %.1f s "
            "after its worker began to leave; started %ld time%s; worker killed: %s\n", kt_now() - t0,
            n + twice, n + twice == 1 ? "" : "s", killed ? "yes" : "no");
    cr_assert_eq(killed, 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(n, 1);
    cr_assert_eq(twice, 0, "the long job was killed and ran again: %s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 60), 0, "%s", kt_capstan_log(pid));
    free(longer);
    free(y);
}

/* `capstan run ARGS` under the supervisor, then with --no-supervisor:
 * returns the supervisor's log (malloc'd), with the exit status of each in
 * *sup and *alone and the last line of the one alone in *alone_last
 * (malloc'd). */
static char *run_both(const char *const *args, int *sup, int *alone, char **alone_last)
{
    const char *argv[32] = { "run", "-r", getenv("CAPSTAN_PLUGIN") };
    int n = 3;
    for (int i = 0; args[i] && n < 30; i++)
        argv[n++] = args[i];
    char *out = NULL, *one = NULL;
    *sup = kt_capstan_run(argv, &out);
    argv[n++] = "--no-supervisor";
    *alone = kt_capstan_run(argv, &one);
    *alone_last = kt_last_line(one);
    free(one);
    return out;
}

/* A worker that cannot start: the supervisor exits with the worker's
 * status and its last line is the worker's reason, as without the
 * supervisor; the worker fetched nothing, so no "jobs wait" line. Here a
 * missing ca_file (78) and a Redis that never answers (69). */
Test(supervisor, a_worker_that_cannot_start_leaves_its_reason_last_and_its_status)
{
    char url[64], tls_url[64];
    int port = kt_free_port();
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
    snprintf(tls_url, sizeof(tls_url), "rediss://127.0.0.1:%d", port);
    struct {
        const char *args[8];
        int status;
        const char *reason;
    } cases[] = {
        { { "--redis-url", tls_url, "--tls-ca-file", "/nonexistent/ca.pem", NULL }, 78,
          "cannot load ca_file /nonexistent/ca.pem" },
        { { "--redis-url", url, "--startup-timeout", "1", NULL }, 69, "gave up after startup_timeout" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int sup, alone;
        char *alone_last, *out = run_both(cases[i].args, &sup, &alone, &alone_last);
        char *last = kt_last_line(out);
        fprintf(stderr, "[cannot start] status %d, last line: %s\n", sup, last);
        cr_assert_eq(alone, cases[i].status, "%s", alone_last);
        cr_assert(strstr(alone_last, cases[i].reason), "%s", alone_last);
        cr_assert_eq(sup, cases[i].status, "%s", out);
        cr_assert_str_eq(last, alone_last, "%s", out);
        cr_assert(!strstr(out, "wait for orphan recovery"), "%s", out);
        free(last);
        free(alone_last);
        free(out);
    }
}

/* Starts and ends per jid in a FileLedgerJob's file: starts[i] and ends[i]
 * for jid i of tag (kt_make_jid). */
static void read_ledger(const char *path, unsigned tag, int n, int *starts, int *ends)
{
    memset(starts, 0, sizeof(int) * (size_t)n);
    memset(ends, 0, sizeof(int) * (size_t)n);
    char *s = kt_read_file(path), *save = NULL;
    for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char what[8], jid[32];
        if (sscanf(line, "%7s %31s", what, jid) != 2)
            continue;
        char want[25];
        kt_make_jid(want, tag, 0);
        unsigned i;
        /* kt_make_jid: the last 8 hex digits are the index. */
        if (strlen(jid) == 24 && strncmp(jid, want, 16) == 0 && sscanf(jid + 16, "%8x", &i) == 1
            && i < (unsigned)n)
            (strcmp(what, "start") == 0 ? starts : ends)[i]++;
    }
    free(s);
}

/* kill -9 of a whole supervised tree at once (a container OOM-killed: no
 * supervisor is left to recover its workers' lists) during a drain, with a
 * second capstan running, all with the default config: the other capstan
 * recovers the dead workers' lists and runs their jobs (doc/guarantees.md,
 * "A lost host": at most about 24 s), the dead workers have left the Busy
 * page by then (Sidekiq's ProcessSet skips a process without its hash),
 * and every job ran. The ledger is a local file, which the kill cannot
 * cut short. */
Test(supervisor, a_killed_tree_has_its_jobs_run_elsewhere_within_half_a_minute)
{
    enum { N = 2000 };
    char *path = kt_tmp("tree-ledger.txt");
    unlink(path);
    char **p = calloc(N, sizeof(char *)), args[600];
    snprintf(args, sizeof(args), "[\"%s\", 5]", path);
    for (int i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 31, (unsigned)i);
        p[i] = kt_payload("FileLedgerJob", args, jid, "default");
    }
    kt_push_all(kt_redis(), "default", p, N);
    for (int i = 0; i < N; i++)
        free(p[i]);
    free(p);
    pid_t tree = kt_capstan_start((const char *[]){ "--processes", "2", "-c", "4", NULL });
    pid_t other = kt_capstan_start((const char *[]){ "--no-supervisor", "-c", "4", NULL });
    int *starts = calloc(N, sizeof(int)), *ends = calloc(N, sizeof(int));
    /* Both workers of the tree hold jobs, and some are done. */
    pid_t w[2];
    char *ids[2] = { NULL, NULL };
    cr_assert(KT_WAIT_UNTIL((w[0] = kt_worker_pid(tree, 0)) > 0 && (w[1] = kt_worker_pid(tree, 1)) > 0
                                && ({ int done = 0; read_ledger(path, 31, N, starts, ends);
                                      for (int i = 0; i < N; i++) done += ends[i] > 0; done > 200; }), 30),
              "%s", kt_capstan_log(tree));
    for (int k = 0; k < 2; k++) {
        redisReply *keys = kt_cmd("KEYS uniquejobs:working:*:%d:*", (int)w[k]);
        cr_assert(keys->type == REDIS_REPLY_ARRAY && keys->elements == 1, "no working list of pid %d", (int)w[k]);
        ids[k] = strdup(keys->element[0]->str + strlen("uniquejobs:working:"));
        freeReplyObject(keys);
    }
    /* Together: the supervisor stopped first, so it reaps no worker. */
    kill(tree, SIGSTOP);
    kill(w[0], SIGKILL);
    kill(w[1], SIGKILL);
    kill(tree, SIGKILL);
    double t0 = kt_now();
    cr_assert_eq(kt_wait_exit(tree, 10), 128 + SIGKILL);
    /* The jobs the dead workers held, and how often each had ended: each
     * runs (again, if it had ended with its ack unwritten) elsewhere. */
    int *held_ends = calloc(N, sizeof(int)), *was = calloc(N, sizeof(int));
    long held = 0;
    read_ledger(path, 31, N, starts, was);
    for (int k = 0; k < 2; k++) {
        redisReply *l = kt_cmd("LRANGE uniquejobs:working:%s 0 -1", ids[k]);
        for (size_t j = 0; l->type == REDIS_REPLY_ARRAY && j < l->elements; j++) {
            const char *at = strstr(l->element[j]->str, "\"jid\":\"");
            unsigned i;
            if (at && sscanf(at + 7 + 16, "%8x", &i) == 1 && i < N) {
                held_ends[i] = was[i] + 1;
                held++;
            }
        }
        freeReplyObject(l);
    }
    cr_assert_gt(held, 0, "the killed workers held no jobs");
    double busy_left = -1, moved = -1, back = -1;
    int ok = KT_WAIT_UNTIL(({
        double now = kt_now() - t0;
        if (busy_left < 0 && !kt_int("EXISTS %s", ids[0]) && !kt_int("EXISTS %s", ids[1]))
            busy_left = now;
        if (moved < 0 && !kt_int("EXISTS uniquejobs:working:%s", ids[0])
            && !kt_int("EXISTS uniquejobs:working:%s", ids[1]))
            moved = now;
        int done = 0, held_done = 1;
        read_ledger(path, 31, N, starts, ends);
        for (int i = 0; i < N; i++) {
            done += ends[i] > 0;
            held_done = held_done && ends[i] >= held_ends[i];
        }
        if (back < 0 && held_done)
            back = now;
        done == N && back >= 0; }), 90);
    int lost = 0, twice = 0;
    for (int i = 0; i < N; i++) {
        lost += ends[i] == 0;
        twice += starts[i] > 1;
    }
    fprintf(stderr, "[killed tree] %ld jobs held by the dead workers: back in their queue %.1f s after the "
            "kill, all run elsewhere after %.1f s; the dead workers left Busy after %.1f s; %d of %d jobs "
            "lost, %d started twice\n", held, moved, back, busy_left, lost, N, twice);
    cr_assert(ok, "%d of %d jobs not run, the dead workers' jobs %s: %s", lost, N,
              back < 0 ? "not back" : "back", kt_capstan_log(other));
    cr_assert_eq(lost, 0);
    cr_assert_lt(back, 60.0, "%s", kt_capstan_log(other));
    /* Busy no longer lists the dead workers by then: the fleet takes a
     * process for dead no sooner than its record lapses (a second's leeway:
     * the record is written just after the liveness key is refreshed). */
    cr_assert(KT_WAIT_UNTIL(!kt_int("EXISTS %s", ids[0]) && !kt_int("EXISTS %s", ids[1]), 1.0),
              "the dead workers still on Busy %.1f s after the kill", kt_now() - t0);
    if (busy_left < 0)
        busy_left = kt_now() - t0;
    cr_assert(kt_log_has(other, "orphaned jobs"), "%s", kt_capstan_log(other));
    free(ids[0]);
    free(ids[1]);
    free(starts);
    free(ends);
    free(held_ends);
    free(was);
    free(path);
    cr_assert_eq(kt_capstan_stop(other, SIGTERM, 20), 0, "%s", kt_capstan_log(other));
}

/* A FileLedgerJob's ledger at path, read in the order it was written: one
 * run a start line, its end (-1 while none) the index of its end line. */
typedef struct run {
    unsigned jid;   /* kt_make_jid's index */
    pid_t pid;
    int start, end; /* line numbers */
} run_t;

static size_t read_runs(const char *path, unsigned tag, run_t *runs, size_t max)
{
    char *s = kt_read_file(path), *save = NULL, want[25];
    kt_make_jid(want, tag, 0);
    size_t n = 0;
    int at = 0;
    for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save), at++) {
        char what[8], jid[32];
        int pid;
        unsigned i;
        if (sscanf(line, "%7s %31s %d", what, jid, &pid) != 3 || strlen(jid) != 24
            || strncmp(jid, want, 16) || sscanf(jid + 16, "%8x", &i) != 1)
            continue;
        if (strcmp(what, "start") == 0 && n < max) {
            runs[n++] = (run_t){ .jid = i, .pid = pid, .start = at, .end = -1 };
            continue;
        }
        for (size_t k = n; k-- > 0;)
            if (runs[k].jid == i && runs[k].pid == pid && runs[k].end < 0) {
                runs[k].end = at;
                break;
            }
    }
    free(s);
    return n;
}

/* How many jobs of runs[0..n) ended. */
static int ended(const run_t *runs, size_t n)
{
    int e = 0;
    for (size_t i = 0; i < n; i++)
        e += runs[i].end >= 0;
    return e;
}

/* A segfault among jobs at processes 2, -c 5, pushed before the start so
 * that the first worker to sweep fetches the oldest together: a 40 s job,
 * the crasher (0.3 s after it starts), 8 jobs of 2 s, then a queue of TAIL
 * short jobs behind them (the ledger: FileLedgerJob's file). The jobs
 * running beside the crasher are recovered with a recovery_count (its
 * suspects); they run one at a time in the quarantine worker while the
 * queue behind drains on the normal workers at full concurrency (so while
 * a suspect runs, more jobs run beside it than one worker's threads),
 * every job that had not started in the crashed worker starts once, and
 * the crasher is a poison pill at its third crash. The queue's drain rate
 * after the crash against one without is printed, not asserted. */
Test(supervisor, a_crashs_recovered_jobs_run_in_quarantine_while_the_queue_drains_at_full_concurrency)
{
    enum { TAIL = 400, N = 10 + TAIL, JIDS = 100 + TAIL, MAXRUNS = 4 * N };
    char *path = kt_tmp("quarantine-ledger.txt"), args[600], jid[25];
    unlink(path);
    setrlimit(RLIMIT_CORE, &(struct rlimit){ 0, 0 });
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof(opts), "%s%shandle_segv=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    const char *const run_args[] = { "--processes", "2", "-c", "5", NULL };
    run_t *runs = calloc(MAXRUNS, sizeof(*runs));
    size_t n;

    /* Without a crash: the queue alone, on two running workers. */
    pid_t pid = kt_capstan_start(run_args);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "all 2 workers ready"), 30), "%s", kt_capstan_log(pid));
    snprintf(args, sizeof(args), "[\"%s\", 150]", path);
    char **p = calloc(N, sizeof(char *));
    for (int i = 0; i < TAIL; i++) {
        kt_make_jid(jid, 41, (unsigned)i);
        p[i] = kt_payload("FileLedgerJob", args, jid, "default");
    }
    double t0 = kt_now();
    kt_push_all(kt_redis(), "default", p, TAIL);
    cr_assert(KT_WAIT_UNTIL((n = read_runs(path, 41, runs, MAXRUNS), ended(runs, n) == TAIL), 60));
    double calm = TAIL / (kt_now() - t0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    for (int i = 0; i < TAIL; i++)
        free(p[i]);

    /* The crash: pushed before the start, so that the first sweep takes
     * the long job and the crasher together (the oldest first). */
    unlink(path);
    int k = 0;
    snprintf(args, sizeof(args), "[\"%s\", 40000]", path);
    kt_make_jid(jid, 42, 0);
    p[k++] = kt_payload("FileLedgerJob", args, jid, "default");
    kt_make_jid(jid, 43, 0);
    char *cj = strdup(jid);
    p[k++] = kt_payload("SegfaultJob", "[\"\", 300]", jid, "default");
    snprintf(args, sizeof(args), "[\"%s\", 2000]", path);
    for (unsigned i = 1; i <= 8; i++) {
        kt_make_jid(jid, 42, i);
        p[k++] = kt_payload("FileLedgerJob", args, jid, "default");
    }
    snprintf(args, sizeof(args), "[\"%s\", 150]", path);
    for (unsigned i = 0; i < TAIL; i++) {
        kt_make_jid(jid, 42, 100 + i);
        p[k++] = kt_payload("FileLedgerJob", args, jid, "default");
    }
    kt_push_all(kt_redis(), "default", p, (size_t)k);
    for (int i = 0; i < k; i++)
        free(p[i]);
    free(p);
    pid = kt_capstan_start(run_args);
    double crash = -1, drained = -1;
    int tail_ended = 0;
    /* Every job run and the crasher dead. */
    int ok = KT_WAIT_UNTIL(({
        if (crash < 0 && kt_log_has(pid, "was killed by signal 11"))
            crash = kt_now();
        n = read_runs(path, 42, runs, MAXRUNS);
        tail_ended = 0;
        for (size_t i = 0; i < n; i++)
            tail_ended += runs[i].jid >= 100 && runs[i].end >= 0;
        if (drained < 0 && crash > 0 && tail_ended >= TAIL)
            drained = kt_now();
        int all[9] = { 0 }, every = 1;
        for (size_t i = 0; i < n; i++)
            if (runs[i].jid < 9 && runs[i].end >= 0)
                all[runs[i].jid] = 1;
        for (int i = 0; i < 9; i++)
            every = every && all[i];
        every && tail_ended >= TAIL && kt_int("ZCARD dead") == 1; }), 100);
    cr_assert(ok, "%d of %d queued jobs done, %lld dead: %s", tail_ended, TAIL, kt_int("ZCARD dead"),
              kt_capstan_log(pid));
    /* The worker that crashed first: its jobs that had started are the
     * suspects. */
    char *log = kt_capstan_log(pid);
    const char *at = strstr(log, ") was killed by signal 11");
    cr_assert(at, "%s", log);
    while (at > log && at[-1] != '(')
        at--;
    pid_t crashed = (pid_t)atoi(at + strlen("pid "));
    /* The crash report's first job line names the crasher. */
    char want[128];
    snprintf(want, sizeof(want), "FATAL: running SegfaultJob jid=%s", cj);
    const char *first = strstr(log, "FATAL: running ");
    cr_assert(first && !strncmp(first, want, strlen(want)), "%s", log);
    cr_assert(strstr(log, "starting the quarantine worker"), "%s", log);
    free(log);
    int suspect[JIDS] = { 0 }, nsuspects = 0, twice = 0, neighbours_twice = 0;
    for (size_t i = 0; i < n; i++)
        if (runs[i].pid == crashed && !suspect[runs[i].jid]) {
            suspect[runs[i].jid] = 1;
            nsuspects++;
        }
    cr_assert(suspect[0] && nsuspects >= 2, "the long job and others did not start beside the crasher "
              "(%d jobs did)", nsuspects);
    /* Concurrency while each suspect runs again: the most runs of the
     * live workers at once, besides it. */
    int most = 0, starts[JIDS] = { 0 };
    for (size_t i = 0; i < n; i++) {
        starts[runs[i].jid]++;
        if (!suspect[runs[i].jid] || runs[i].pid == crashed)
            continue;
        int end = runs[i].end;
        for (int line = runs[i].start; line <= end; line++) {
            int running = 0;
            for (size_t j = 0; j < n; j++)
                running += j != i && runs[j].pid != crashed && runs[j].start <= line
                           && (runs[j].end < 0 || runs[j].end > line);
            if (running > most)
                most = running;
        }
    }
    for (unsigned i = 0; i < JIDS; i++) {
        twice += starts[i] > 1;
        neighbours_twice += starts[i] > 1 && !suspect[i];
    }
    double rate = drained > 0 ? TAIL / (drained - crash) : 0;
    fprintf(stderr, "[quarantine] %d jobs started beside the crasher; while one ran again, at most %d other "
            "jobs ran at once; %d jobs started twice, %d of them had not started beside the crasher; the "
            "queue drained at %.1f jobs/s after the crash, %.1f without (%.0f%%)\n",
            nsuspects, most, twice, neighbours_twice, rate, calm, 100 * rate / calm);
    cr_assert_gt(most, 5, "a recovered job ran with at most %d others beside it: one worker's threads", most);
    cr_assert_eq(neighbours_twice, 0);
    char *dead = members("dead");
    cr_assert(strstr(dead, "Capstan::PoisonPill") && strstr(dead, cj), "%s", dead);
    free(dead);
    free(cj);
    cr_assert_geq(kt_log_count(pid, "was killed by signal 11"), 3, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert_eq(kt_int("LLEN queue:capstan:quarantine"), 0);
    cr_assert_eq(kt_int("SISMEMBER queues capstan:quarantine"), 0);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    free(runs);
    free(path);
}

/* Pushes a LedgerJob [key] of jid to the quarantine, recovered once, as a
 * worker moves it: not in the set of queues Sidekiq's Web UI lists. */
static void push_quarantined(const char *key, const char *jid)
{
    char *p = NULL;
    cr_assert(asprintf(&p, "{\"retry\":true,\"queue\":\"default\",\"args\":[\"%s\"],\"class\":\"LedgerJob\","
                           "\"recovery_count\":1,\"jid\":\"%s\",\"created_at\":1767225600.1,"
                           "\"enqueued_at\":1767225600.2}", key, jid) > 0);
    freeReplyObject(kt_cmd("LPUSH queue:capstan:quarantine %s", p));
    free(p);
}

/* A job left in the quarantine (by a stop while it waited there, or by
 * another host's workers) when no worker of this supervisor moved one
 * there: a recovery pass sees it, the quarantine worker starts and runs
 * it once. A HUP replaces the quarantine worker too, and the new one runs
 * the next. */
Test(supervisor, a_job_left_in_the_quarantine_runs)
{
    char jid[25];
    kt_make_jid(jid, 44, 0);
    push_quarantined("left", jid);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN left:done") == 1, 30), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("HGET left %s", jid), 1);
    cr_assert_eq(kt_int("LLEN queue:capstan:quarantine"), 0);
    cr_assert(kt_log_has(pid, "quarantine worker 1 started"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SISMEMBER queues capstan:quarantine"), 0);
    pid_t q = kt_worker_pid(pid, 1);
    kill(pid, SIGHUP);
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "reload done: 1 workers"), 30), "%s", kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(gone(q), 15), "%s", kt_capstan_log(pid));
    kt_make_jid(jid, 44, 1);
    push_quarantined("left", jid);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN left:done") == 2, 30), "%s", kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "quarantine worker 1 started (pid"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_log_count(pid, ") from the binary on disk"), 2, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD processes"), 0);
}
