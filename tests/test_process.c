/* The thin path end to end: Ruby Sidekiq pushes, the capstan binary runs the
 * jobs with the example handlers, and Sidekiq's API reads the results. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

TestSuite(process, .timeout = 120, .fini = kt_kill_children);

Test(process, ruby_pushed_jobs_run_and_stats_show_them)
{
    char *jid = NULL;
    const char *push[] = { "{\"class\":\"RecordJob\",\"args\":[\"rec\"]}", NULL };
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push", push[0], NULL }, &jid), 0, "%s", jid);
    const char *bulk = "{\"class\":\"RecordJob\",\"args\":[[\"rec\"],[\"rec\"],[\"rec\"]]}";
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "push_bulk", bulk, NULL }, NULL), 0);

    pid_t pid = kt_capstan_start((const char *[]){ "-c", "4", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == 4, 20), "jobs did not run: %s", kt_capstan_log(pid));
    jid[strcspn(jid, "\n")] = '\0';
    char *want = jid + 1; /* the jid printed as a JSON string */
    want[strlen(want) - 1] = '\0';
    cr_assert_eq(kt_int("SISMEMBER rec %s", want), 1);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);

    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "graceful stop exits 0: %s", kt_capstan_log(pid));
    char *stats = NULL;
    cr_assert_eq(kt_ruby("sidekiq.rb", (const char *[]){ "stats", NULL }, &stats), 0);
    cr_assert(strstr(stats, "\"processed\":4"), "%s", stats);
    cr_assert(strstr(stats, "\"failed\":0"), "%s", stats);
    cr_assert(strstr(stats, "\"history_processed\":4"), "%s", stats);
    cr_assert(strstr(stats, "\"processes_size\":0"), "a stopped process leaves the set: %s", stats);
    char *log = kt_capstan_log(pid);
    cr_assert(strstr(log, "class=RecordJob jid="), "%s", log);
    cr_assert(strstr(log, "INFO: done"), "%s", log);
    cr_assert(strstr(log, "Bye!"), "%s", log);
    free(log);
    free(stats);
    free(jid);
}

/* GLIBC_TUNABLES as /proc shows it for pid, or NULL (malloc'd). */
static char *tunables_of(pid_t pid)
{
    char path[64], *env = NULL, *out = NULL;
    snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    size_t n = 0;
    while (getdelim(&env, &n, '\0', f) > 0 && !out)
        if (strncmp(env, "GLIBC_TUNABLES=", 15) == 0)
            out = strdup(env + 15);
    free(env);
    fclose(f);
    return out;
}

/* The basic fetch (BRPOP) has a path of its own through the processor: no
 * feed, each ack written as its job ends. Every job runs once, a failure
 * reaches the retry set, and no working list is made. */
Test(process, the_basic_fetch_runs_each_job_once_and_stores_failures)
{
    kt_push_jobs("RecordJob", "[\"bas\"]", 1, 60);
    kt_push_jobs("FailJob", "[]", 2, 1);
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "4", "--fetch", "basic", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD bas") == 60 && kt_int("ZCARD retry") == 1, 30), "%s",
              kt_capstan_log(pid));
    cr_assert_eq(kt_int("LLEN bas:log"), 60, "a job ran twice");
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    redisReply *w = kt_cmd("KEYS uniquejobs:working:*");
    cr_assert(w && w->type == REDIS_REPLY_ARRAY && w->elements == 0, "the basic fetch keeps no working list");
    freeReplyObject(w);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "graceful stop exits 0: %s", kt_capstan_log(pid));
}

/* `capstan run` starts itself again once without glibc's per-thread caches of
 * freed blocks (a megabyte at concurrency 25), keeping its pid; a
 * GLIBC_TUNABLES the user set is left as it is. */
Test(process, run_turns_glibc_thread_caches_off_unless_tunables_are_set)
{
    pid_t pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "Starting processing"), 20), "%s", kt_capstan_log(pid));
    char *t = tunables_of(pid);
    cr_assert(t && strcmp(t, "glibc.malloc.tcache_count=0") == 0, "GLIBC_TUNABLES=%s",
              t ? t : "(unset)");
    free(t);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "the pid kt_capstan_start saw is capstan's: %s",
                 kt_capstan_log(pid));

    setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=3", 1);
    pid = kt_capstan_start((const char *[]){ "-c", "2", NULL });
    unsetenv("GLIBC_TUNABLES");
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "Starting processing"), 20), "%s", kt_capstan_log(pid));
    t = tunables_of(pid);
    cr_assert(t && strcmp(t, "glibc.malloc.arena_max=3") == 0, "GLIBC_TUNABLES=%s",
              t ? t : "(unset)");
    free(t);
    cr_assert_eq(kt_capstan_stop(pid, SIGTERM, 30), 0, "%s", kt_capstan_log(pid));
}
