/* The logger under many threads: job lines go out in batches, through one
 * process-wide buffer, yet every line arrives once and whole, each thread's
 * lines (job lines and the warnings written at once among them) in the
 * order the thread wrote them, and a flush or a reopen leaves nothing
 * behind. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/log.h"

enum { THREADS = 8, LINES = 5000, WARN_EVERY = 997 };

static void *writer(void *arg)
{
    int t = (int)(long)arg;
    char jid[32];
    for (int i = 0; i < LINES; i++) {
        snprintf(jid, sizeof(jid), "t%d-%d", t, i);
        capstan_logctx_t ctx = { .cls = "LogJob", .jid = jid, .elapsed = -1 };
        if (i % WARN_EVERY == 0)
            capstan__log(CAPSTAN_WARN, &ctx, "seq %d %d", t, i);
        else
            capstan__log(CAPSTAN_INFO, &ctx, "seq %d %d", t, i);
    }
    return NULL;
}

/* Reads path's lines: each must be a whole line of the writers, each
 * thread's seq numbers one after another from 0. Returns the lines. */
static int check_file(const char *path, int expect_all)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    int next[THREADS] = {0}, lines = 0;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        size_t n = strlen(line);
        cr_assert(n && line[n - 1] == '\n', "a whole line: %s", line);
        const char *at = strstr(line, ": seq ");
        int t, i;
        cr_assert(at && sscanf(at, ": seq %d %d", &t, &i) == 2 && t >= 0 && t < THREADS, "%s", line);
        cr_assert_eq(i, next[t], "thread %d: line %d after %d", t, i, next[t] - 1);
        char want[32];
        snprintf(want, sizeof(want), "jid=t%d-%d ", t, i);
        cr_assert(strstr(line, want), "the line's own jid: %s", line);
        next[t]++;
        lines++;
    }
    fclose(f);
    for (int t = 0; expect_all && t < THREADS; t++)
        cr_assert_eq(next[t], LINES, "thread %d: %d of %d lines", t, next[t], LINES);
    return lines;
}

Test(log, many_threads_lines_arrive_once_whole_and_in_each_threads_order)
{
    char dir[] = "/tmp/capstan-log.XXXXXX", path[64], rotated[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/a.log", dir);
    snprintf(rotated, sizeof(rotated), "%s/a.log.1", dir);
    cr_assert_eq(capstan__log_setup(CAPSTAN_LOG_PRETTY, 0, path), 0);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, writer, (void *)(long)t), 0);
    /* A rotation in the middle: what was logged before goes to the old
     * file, the rest to the new one, nothing to neither. */
    usleep(2000);
    cr_assert_eq(rename(path, rotated), 0);
    cr_assert_eq(capstan__log_reopen(), 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    capstan__log_flush();
    /* Both files together hold every line once; each alone holds a run of
     * each thread's lines in order (the old one from the first). */
    int before = check_file(rotated, 0);
    FILE *cat = fopen(rotated, "a");
    FILE *rest = fopen(path, "r");
    cr_assert(cat && rest);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), rest)) > 0)
        cr_assert_eq(fwrite(buf, 1, n, cat), n);
    fclose(rest);
    fclose(cat);
    int all = check_file(rotated, 1);
    printf("log: %d lines before the rotation, %d after\n", before, all - before);
    cr_assert_eq(all, THREADS * LINES);
    capstan__log_close();
    unlink(path);
    unlink(rotated);
    rmdir(dir);
}
