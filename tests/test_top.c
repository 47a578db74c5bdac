/* `capstan top`: one plain snapshot when stdout is a pipe, a live view under a
 * real terminal (tmux) that `q` quits, the lock types ranked by denials,
 * and its flags. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/redis.h"
#include "unique/admin.h"
#include "unique/admin_internal.h"

TestSuite(top, .timeout = 30, .fini = kt_kill_children);

/* A queue nobody fetches, one retry, two dead, and a running worker.
 * Returns the worker's pid; *identity gets its identity (malloc'd). */
static pid_t fleet(char **identity)
{
    for (int i = 0; i < 2; i++)
        cr_assert_eq(kt_capstan_run((const char *[]){ "push", "NoopJob", "-q", "waiting", NULL },
                                    NULL), 0);
    freeReplyObject(kt_cmd("ZADD retry 2000000000 %s", "{\"class\":\"FailJob\",\"jid\":\"r1\"}"));
    freeReplyObject(kt_cmd("ZADD dead 1 %s", "{\"class\":\"FailJob\",\"jid\":\"d1\"}"));
    freeReplyObject(kt_cmd("ZADD dead 2 %s", "{\"class\":\"FailJob\",\"jid\":\"d2\"}"));
    pid_t pid = kt_capstan_start((const char *[]){ "-q", "default", "-c", "4", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD processes") == 1, 10), "the worker never beat");
    *identity = kt_str("SRANDMEMBER processes");
    return pid;
}

Test(top, snapshot_to_a_pipe_is_plain_and_exits)
{
    char *id = NULL;
    pid_t pid = fleet(&id);
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", "--redis-url", kt_url(), NULL }, &out), 0,
                 "%s", out);
    cr_assert(strstr(out, "waiting"), "%s", out);
    cr_assert(strstr(out, id), "the process %s:\n%s", id, out);
    cr_assert(strstr(out, "/4"), "busy/total threads:\n%s", out);
    char sup[64];
    snprintf(sup, sizeof(sup), "worker 0 of supervisor %d", (int)pid);
    cr_assert(strstr(out, sup), "the process's supervisor (%s):\n%s", sup, out);
    cr_assert(strstr(out, "Retries: 1") && strstr(out, "Dead: 2"), "%s", out);
    cr_assert(strstr(out, "CONTENDED LOCKS"), "%s", out);
    cr_assert_null(strchr(out, '\033'), "no terminal escapes in a snapshot:\n%s", out);
    free(out);
    free(id);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
}

/* Runs a tmux command on the test's private server; returns its exit
 * status, its stdout in *out when out is not NULL. */
static int tmux(const char *sock, const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "tmux -L %s %s 2>/dev/null", sock, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0)
        len += got;
    buf[len] = '\0';
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(top, live_under_tmux_shows_queues_and_process_and_q_quits)
{
    if (system("command -v tmux >/dev/null 2>&1") != 0)
        cr_skip_test("tmux not found");
    char *id = NULL;
    pid_t pid = fleet(&id);
    char sock[64], args[1536];
    snprintf(sock, sizeof(sock), "capstan-top-test-%d", (int)getpid());
    snprintf(args, sizeof(args), "new-session -d -x 120 -y 40 '%s top --redis-url %s'",
             getenv("CAPSTAN_BIN"), kt_url());
    cr_assert_eq(tmux(sock, args, NULL), 0);
    char *screen = NULL;
    bool shown = KT_WAIT_UNTIL(
        (free(screen), tmux(sock, "capture-pane -p", &screen),
         strstr(screen, "waiting") && strstr(screen, id) && strstr(screen, "q quits")),
        10);
    if (!shown)
        tmux(sock, "kill-server", NULL);
    cr_assert(shown, "screen:\n%s", screen);
    free(screen);
    tmux(sock, "send-keys q", NULL);
    bool quit = KT_WAIT_UNTIL(tmux(sock, "has-session", NULL) != 0, 5);
    tmux(sock, "kill-server", NULL);
    cr_assert(quit, "q did not quit capstan top");
    free(id);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 15), 0);
}

Test(top, contended_locks_ranked_by_denials)
{
    capstan_redis_t *r = kt_lib_redis();
    for (int i = 0; i < 3; i++)
        cr_assert_eq(capstan__unique_metric(r, "until_executed", "lock_failed"), 0);
    cr_assert_eq(capstan__unique_metric(r, "while_executing", "lock_failed"), 0);
    cr_assert_eq(capstan__unique_metric(r, "until_expired", "locked"), 0);
    capstan_redis_free(r);
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", "--redis-url", kt_url(), NULL }, &out), 0);
    const char *sec = strstr(out, "CONTENDED LOCKS");
    cr_assert_not_null(sec, "%s", out);
    const char *a = strstr(sec, "until_executed"), *b = strstr(sec, "while_executing");
    cr_assert(a && b && a < b, "most denied first:\n%s", out);
    cr_assert_null(strstr(sec, "until_expired"), "never denied, not contended:\n%s", out);
    free(out);
}

Test(top, flags_and_an_unreachable_redis)
{
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", "--help", NULL }, &out), 0);
    cr_assert(strstr(out, "Usage: capstan top") && strstr(out, "--interval"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", "--interval", "0", NULL }, &out), 64);
    cr_assert(strstr(out, "--interval"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", "--bogus", NULL }, &out), 64);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "top", "--redis-url", "redis://127.0.0.1:1/0",
                                              NULL }, &out), 1);
    cr_assert(strstr(out, "127.0.0.1:1"), "%s", out);
    free(out);
}
