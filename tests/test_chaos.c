/* Hostile conditions a worker meets in production, end to end with the capstan
 * binary: its Redis connections killed over and over while jobs flow, and a
 * job that crashes the process fetched together with innocent ones. What a
 * user checks afterwards: the worker did not crash, every job ran, and only
 * the job at fault is in the dead set. */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

TestSuite(chaos, .timeout = 240, .fini = kt_kill_children);

/* Due now: what failed and waits in "retry" runs again at the next poll,
 * rather than in 15 s or more. */
static void retry_now(void)
{
    redisReply *r = kt_cmd("ZRANGE retry 0 -1");
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        freeReplyObject(kt_cmd("ZADD retry XX 0 %b", r->element[i]->str, r->element[i]->len));
    freeReplyObject(r);
}

/* Kills every connection of one Redis user every 0.1 s until told to stop. */
typedef struct killer {
    pthread_t thread;
    const char *user;
    atomic_int stop;
    long rounds, killed;
} killer_t;

static void *kill_loop(void *arg)
{
    killer_t *k = arg;
    redisContext *c = redisConnect("127.0.0.1", atoi(getenv("KT_REDIS_PORT")));
    while (c && !c->err && !atomic_load(&k->stop)) {
        redisReply *r = redisCommand(c, "CLIENT KILL USER %s", k->user);
        if (!r)
            break;
        if (r->type == REDIS_REPLY_INTEGER)
            k->killed += r->integer;
        freeReplyObject(r);
        k->rounds++;
        kt_sleep(0.1);
    }
    redisFree(c);
    return NULL;
}

/* The acks of finished jobs share a round trip with the next fetch; a
 * connection killed in it must not reach a handler (capstan_job_redis is never
 * NULL: RecordJob uses it unchecked, as the README's example does). Only a
 * command of the handler's own, cut by a kill, may fail a job. */
Test(chaos, handlers_get_a_connected_redis_while_connections_are_killed)
{
    enum { N = 20000 };
    char user[64], url[256];
    snprintf(user, sizeof(user), "chaos%s", strrchr(kt_url(), '/') + 1);
    freeReplyObject(kt_cmd("ACL SETUSER %s on >pw ~* &* +@all", user));
    snprintf(url, sizeof(url), "redis://%s:pw@127.0.0.1:%s/%s", user, getenv("KT_REDIS_PORT"),
             strrchr(kt_url(), '/') + 1);
    char **p = calloc(N, sizeof(char *));
    for (unsigned i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 1, i);
        p[i] = kt_payload("RecordJob", "[\"rec\"]", jid, "default");
    }
    kt_push_all(kt_redis(), "default", p, N);
    for (unsigned i = 0; i < N; i++)
        free(p[i]);
    free(p);
    char *y = kt_write_file("kill.yml", "heartbeat_interval: 0.5\nliveness_ttl: 2\n"
                                        "recovery_interval: 1\n"
                                        "average_scheduled_poll_interval: 0.5\n");
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "8", "--redis-url", url, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "Starting processing"), 10), "%s", kt_capstan_log(pid));

    killer_t k = { .user = user };
    cr_assert_eq(pthread_create(&k.thread, NULL, kill_loop, &k), 0);
    double t0 = kt_now();
    int alive = 1;
    /* Kills for as long as the drain takes, at most 60 s; then it finishes
     * in peace. */
    KT_WAIT_UNTIL(({
        retry_now();
        alive = waitpid(pid, NULL, WNOHANG) == 0;
        !alive || kt_int("SCARD rec") == N || kt_now() - t0 > 60; }), 70);
    atomic_store(&k.stop, 1);
    pthread_join(k.thread, NULL);
    long done_under_fire = (long)kt_int("SCARD rec");
    cr_assert(alive, "the worker crashed after %ld jobs:\n%s", done_under_fire, kt_capstan_log(pid));
    cr_assert(KT_WAIT_UNTIL(({ retry_now(); kt_int("SCARD rec") == N; }), 60),
              "%lld of %d jobs ran: %s", kt_int("SCARD rec"), N, kt_capstan_log(pid));
    int cut = kt_log_count(pid, "Redis::CommandError: recording");
    fprintf(stderr, "[kill] %ld kill rounds (%ld connections) in %.1f s, %ld of %d jobs done "
            "meanwhile; %d handler commands cut\n", k.rounds, k.killed, kt_now() - t0,
            done_under_fire, N, cut);
    cr_assert_gt(k.killed, 0);
    cr_assert_eq(kt_int("ZCARD dead"), 0);
    /* Each failure is a handler's own command cut by a kill, nothing else. */
    cr_assert_eq(kt_log_count(pid, "INFO: fail"), cut, "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    freeReplyObject(kt_cmd("ACL DELUSER %s", user));
    free(y);
}

/* Whether an element of a list, zset or KEYS reply contains needle. */
static int in_list(const char *cmd, const char *key, const char *needle)
{
    redisReply *r = strcmp(cmd, "KEYS") == 0 ? kt_cmd("KEYS %s", key)
                                             : kt_cmd("%s %s 0 -1", cmd, key);
    int found = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        found |= strstr(r->element[i]->str, needle) != NULL;
    freeReplyObject(r);
    return found;
}

/* A job that kills the process, fetched in one batch with innocent jobs
 * (some running, some finished with their acks waiting) on a worker with
 * conc processors, restarted after each crash until the crasher is dead.
 * Every job of the crashed process's working list comes back as a suspect;
 * only the one at fault may end in the dead set. */
static void crasher_among_innocents(int conc)
{
    enum { SLOW = 2 };
    int nrec = 3 * conc, n = 0;
    char crash[25], conc_s[8], (*rec)[25] = calloc((size_t)nrec, 25), slow[SLOW][25];
    char **p = calloc((size_t)(nrec + SLOW + 1), sizeof(char *));
    /* Fetched first: two slow jobs, then quick ones and the crasher last
     * of the first batch (a batch is one job per idle processor). */
    for (unsigned i = 0; i < SLOW; i++) {
        kt_make_jid(slow[i], 2, i);
        p[n++] = kt_payload("OverlapJob", "[\"slow\",400]", slow[i], "default");
    }
    for (int i = 0; i < nrec; i++) {
        kt_make_jid(rec[i], 3, (unsigned)i);
        if (n == conc - 1) {
            kt_make_jid(crash, 4, 0);
            p[n++] = kt_payload("CrashJob", "[]", crash, "default");
        }
        p[n++] = kt_payload("RecordJob", "[\"rec\"]", rec[i], "default");
    }
    kt_push_all(kt_redis(), "default", p, (size_t)n);
    for (int i = 0; i < n; i++)
        free(p[i]);
    free(p);

    char *y = kt_write_file("pill.yml", "heartbeat_interval: 0.5\nliveness_ttl: 2\n"
                                        "recovery_interval: 1\n");
    snprintf(conc_s, sizeof(conc_s), "%d", conc);
    const char *args[] = { "--no-supervisor", "-C", y, "-c", conc_s, NULL };
    int crashes = 0;
    pid_t pid = kt_capstan_start(args);
    for (int round = 0; round < 6; round++) {
        int st = -1;
        KT_WAIT_UNTIL(({
            pid_t w = waitpid(pid, &st, WNOHANG);
            w == pid || in_list("ZRANGE", "dead", crash); }), 20);
        if (waitpid(pid, &st, WNOHANG) == 0)
            break; /* alive: the crasher went dead */
        kt_untrack(pid);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "worker %d should have crashed: %s",
                  (int)pid, kt_capstan_log(pid));
        crashes++;
        pid = kt_capstan_start(args);
    }
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == nrec && kt_int("LLEN slow:log") >= SLOW, 20),
              "%lld of %d quick and %lld of %d slow innocent jobs ran; dead: %lld\n%s",
              kt_int("SCARD rec"), nrec, kt_int("LLEN slow:log"), SLOW, kt_int("ZCARD dead"),
              kt_capstan_log(pid));
    long dead = (long)kt_int("ZCARD dead");
    fprintf(stderr, "[pill -c %d] %d crashes; %ld in the dead set\n", conc, crashes, dead);
    cr_assert_eq(dead, 1, "only the crasher is dead, not %ld jobs", dead);
    cr_assert_eq(crashes, 3, "the crasher ran (and crashed a worker) three times");
    redisReply *entry = kt_cmd("ZRANGE dead 0 0");
    cr_assert(entry->type == REDIS_REPLY_ARRAY && entry->elements == 1);
    json_t *j = json_loads(entry->element[0]->str, 0, NULL);
    cr_assert(j, "%s", entry->element[0]->str);
    cr_assert_str_eq(json_string_value(json_object_get(j, "jid")), crash);
    cr_assert_str_eq(json_string_value(json_object_get(j, "class")), "CrashJob");
    cr_assert_str_eq(json_string_value(json_object_get(j, "error_class")), "Capstan::PoisonPill");
    json_decref(j);
    freeReplyObject(entry);
    for (int i = 0; i < nrec; i++)
        cr_assert(kt_int("SISMEMBER rec %s", rec[i]), "%s ran", rec[i]);
    for (int i = 0; i < SLOW; i++)
        cr_assert(in_list("LRANGE", "slow:log", slow[i]), "%s ran", slow[i]);
    cr_assert(kt_log_has(pid, "1 poison pills sent to the dead set"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("ZCARD retry"), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert(KT_WAIT_UNTIL(!in_list("KEYS", "uniquejobs:working:*", ""), 10),
              "no working list is left");
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 20), 0, "%s", kt_capstan_log(pid));
    free(rec);
    free(y);
}

Test(chaos, only_the_crasher_goes_dead_beside_innocent_jobs_c4)
{
    crasher_among_innocents(4);
}

Test(chaos, only_the_crasher_goes_dead_beside_innocent_jobs_c8)
{
    crasher_among_innocents(8);
}
