/* Unit tests of the schedule: section as sidekiq-scheduler and sidekiq-cron
 * write it in a sidekiq.yml: what each entry becomes as a periodic
 * schedule, what is warned about, and what still stops the start. No
 * Redis: the ticks themselves are tests/test_periodic.c's. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/config.h"
#include "periodic/periodic.h"

static char err[CAPSTAN_ERRLEN];

static capstan_config_t *load(const char *yaml, int *rc)
{
    char path[] = "/tmp/capstan-schedule-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    capstan_config_t *cfg = capstan_config_new();
    *rc = capstan_config_load_file(cfg, path, err);
    unlink(path);
    return cfg;
}

static const struct capstan_periodic_conf *find(const capstan_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nperiodic; i++)
        if (!strcmp(cfg->periodic[i].name, name))
            return &cfg->periodic[i];
    return NULL;
}

static int warned(const capstan_config_t *cfg, const char *what)
{
    for (size_t i = 0; i < cfg->nwarnings; i++)
        if (strstr(cfg->warnings[i], what))
            return 1;
    return 0;
}

/* A Rails team's file as it is: a sidekiq-scheduler cron: entry, an
 * every: entry with a description and its args as a hash, a sidekiq-cron
 * entry switched off, beside periodic:. */
Test(schedule, a_rails_files_schedule_section_becomes_periodic_schedules)
{
    int rc;
    capstan_config_t *cfg = load(":concurrency: 5\n"
                                 ":schedule:\n"
                                 "  nightly_report:\n"
                                 "    cron: '0 3 * * * Europe/Berlin'\n"
                                 "    class: ReportJob\n"
                                 "    queue: reports\n"
                                 "  heartbeat:\n"
                                 "    every: '1s'\n"
                                 "    description: 'pings the partner API'\n"
                                 "    class: PingJob\n"
                                 "    args: {region: eu, retries: 2}\n"
                                 "  old_cleanup:\n"
                                 "    cron: '*/5 * * * *'\n"
                                 "    class: CleanupJob\n"
                                 "    status: disabled\n"
                                 "  SweepJob:\n"
                                 "    every: ['30m', first_in: '5m']\n"
                                 "    args: 7\n"
                                 "  launch:\n"
                                 "    at: '2030-01-01 00:00:00'\n"
                                 "    class: LaunchJob\n"
                                 "periodic:\n"
                                 "  own:\n"
                                 "    cron: '@hourly'\n"
                                 "    class: OwnJob\n", &rc);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(cfg->nperiodic, 4);
    const struct capstan_periodic_conf *p = find(cfg, "nightly_report");
    cr_assert(p);
    cr_assert_str_eq(p->cron, "0 3 * * * Europe/Berlin");
    cr_assert_str_eq(p->cls, "ReportJob");
    cr_assert_str_eq(p->queue, "reports");
    p = find(cfg, "heartbeat");
    cr_assert(p);
    cr_assert_str_eq(p->cron, "@every 1s");
    cr_assert_str_eq(p->args, "[{\"region\":\"eu\",\"retries\":2}]", "%s", p->args);
    cr_assert_str_eq(p->queue, "default");
    cr_assert_null(find(cfg, "old_cleanup"), "a disabled entry does not run");
    cr_assert_null(find(cfg, "launch"), "a one-shot entry does not run");
    p = find(cfg, "SweepJob");
    cr_assert(p);
    cr_assert_str_eq(p->cls, "SweepJob", "the entry's name is its class when it names none");
    cr_assert_str_eq(p->cron, "@every 30m");
    cr_assert_str_eq(p->args, "[7]");
    cr_assert(find(cfg, "own"));
    /* What is not honoured is said, with its line; description is not. */
    cr_assert(warned(cfg, ":17: schedule.SweepJob.every.first_in: not honoured"), "%zu warnings", cfg->nwarnings);
    cr_assert(warned(cfg, ":20: schedule.launch.at: a one-shot job"));
    cr_assert(!warned(cfg, "description"));
    cr_assert(!warned(cfg, "not used by capstan (recurring jobs"), "the section is read, not warned about");
    capstan_config_free(cfg);
}

Test(schedule, sidekiq_scheduler_5_nests_it_under_scheduler)
{
    int rc;
    capstan_config_t *cfg = load(":scheduler:\n"
                                 "  :dynamic: true\n"
                                 "  :schedule:\n"
                                 "    hello_world:\n"
                                 "      cron: '0 * * * * *'\n"
                                 "      class: HelloWorld\n"
                                 "      active_job: true\n"
                                 "      rails_env: production\n", &rc);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(cfg->nperiodic, 1);
    cr_assert_str_eq(cfg->periodic[0].cron, "0 * * * * *");
    cr_assert(warned(cfg, "scheduler.dynamic: not used by capstan"));
    cr_assert(warned(cfg, "schedule.hello_world.active_job: not honoured"));
    cr_assert(warned(cfg, "schedule.hello_world.rails_env: not used by capstan"));
    capstan_config_free(cfg);
    cfg = load(":scheduler:\n  :enabled: false\n  :schedule:\n    a: {every: 1m, class: A}\n", &rc);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(cfg->nperiodic, 0);
    cr_assert(warned(cfg, "enabled: false"));
    capstan_config_free(cfg);
}

/* A value that means nothing is still an error at its line: a warning is
 * for what a gem has and capstan does not. */
Test(schedule, a_wrong_value_stops_the_start_at_its_line)
{
    const struct { const char *yaml, *want; } cases[] = {
        { "schedule:\n  a:\n    every: 1M\n    class: A\n", ":3: schedule.a.every: \"1M\": months and years" },
        { "schedule:\n  a:\n    cron: '61 * * * *'\n    class: A\n", ":3: schedule.a: cron: minutes field" },
        { "schedule:\n  a:\n    class: A\n", ":2: schedule.a: cron or every: must be given" },
        { "schedule:\n  a:\n    every: 5s\n    status: paused\n", ":4: schedule.a.status: must be enabled or disabled" },
        { "schedule: [a, b]\n", ":1: schedule: must be a mapping" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        int rc;
        capstan_config_t *cfg = load(cases[i].yaml, &rc);
        cr_expect_eq(rc, CAPSTAN_ECONFIG, "%s", cases[i].yaml);
        cr_expect(strstr(err, cases[i].want), "%s: %s", cases[i].want, err);
        capstan_config_free(cfg);
    }
}

/* An environment's section replaces the top level's schedules of its own
 * kind only. */
Test(schedule, an_environment_section_replaces_its_own_kind)
{
    int rc;
    setenv("RAILS_ENV", "production", 1);
    capstan_config_t *cfg = load("schedule:\n  a: {every: 1m, class: A}\n"
                                 "periodic:\n  p: {cron: '@daily', class: P}\n"
                                 "production:\n  schedule:\n    b: {every: 2m, class: B}\n", &rc);
    unsetenv("RAILS_ENV");
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(cfg->nperiodic, 2);
    cr_assert(find(cfg, "b") && find(cfg, "p") && !find(cfg, "a"));
    capstan_config_free(cfg);
}

/* A key given twice in one schedule: the later wins, as with any YAML key
 * (and the earlier value is not kept, nor leaked: ASan checks). */
Test(schedule, a_key_given_twice_in_a_schedule_takes_the_later)
{
    int rc;
    capstan_config_t *cfg = load("periodic:\n  a:\n    cron: '@daily'\n    class: A\n    args: [7]\n    args: [8]\n"
                                 "schedule:\n  b:\n    every: 1m\n    args: [1]\n    args: {x: 2}\n", &rc);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(find(cfg, "a")->args, "[8]");
    cr_assert_str_eq(find(cfg, "b")->args, "[{\"x\":2}]");
    capstan_config_free(cfg);
}
