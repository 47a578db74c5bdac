/* Unit tests of the configuration module: defaults, every YAML key and form,
 * environment sections and ${VAR} expansion, the exact wording of errors
 * (they are what a user sees before exit 78), and the flag/env helpers.
 * No Redis: each test writes its YAML to a temporary file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capstan/config.h"
#include "capstan/redis.h"
#include "redis/url.h"
#include "capstan/periodic.h"
#include "periodic/periodic.h"

static capstan_config_t *cfg;
static char *path; /* the current test's YAML file */
static char err[CAPSTAN_ERRLEN];

/* Variables a test may set; cleared around each test so that neither the
 * caller's environment nor an earlier test (under --no-fork) leaks in. */
static const char *env_vars[] = {"APP_ENV", "RAILS_ENV", "RACK_ENV", "REDIS_URL",
                                 "REDIS_PROVIDER", "MY_REDIS", "CAPSTAN_T_CONC",
                                 "CAPSTAN_T_EMPTY", "CAPSTAN_T_UNSET", "TZDIR"};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]); i++)
        unsetenv(env_vars[i]);
}

static void setup(void)
{
    clear_env();
    cfg = capstan_config_new();
    cr_assert_not_null(cfg);
    err[0] = '\0';
}

static void teardown(void)
{
    capstan_config_free(cfg);
    cfg = NULL;
    if (path) {
        unlink(path);
        free(path);
        path = NULL;
    }
    clear_env();
}

TestSuite(config, .init = setup, .fini = teardown, .timeout = 10);

/* A fresh configuration and no YAML file, for the next load in a test. */
static void fresh(void)
{
    capstan_config_free(cfg);
    cfg = capstan_config_new();
    cr_assert_not_null(cfg);
    if (path) {
        unlink(path);
        free(path);
        path = NULL;
    }
}

static char *write_yaml(const char *text)
{
    char *p = strdup("/tmp/capstan-test-config-XXXXXX");
    cr_assert_not_null(p);
    int fd = mkstemp(p);
    cr_assert(fd >= 0);
    size_t n = strlen(text);
    cr_assert_eq(write(fd, text, n), (ssize_t)n);
    close(fd);
    return p;
}

/* Writes text to a new file (path) and loads it into cfg. */
static int load(const char *text)
{
    path = write_yaml(text);
    return capstan_config_load_file(cfg, path, err);
}

/* Asserts err is exactly "PATH:LINE: rest". */
static void assert_err(int line, const char *rest)
{
    char want[CAPSTAN_ERRLEN * 2];
    snprintf(want, sizeof(want), "%s:%d: %s", path, line, rest);
    cr_assert_str_eq(err, want);
}

Test(config, defaults_match_sidekiq)
{
    cr_assert_str_eq(cfg->redis_url, "redis://127.0.0.1:6379/0");
    cr_assert_eq(cfg->concurrency, 10);
    cr_assert_eq(cfg->nqueues, 1);
    cr_assert_str_eq(cfg->queues[0].name, "default");
    cr_assert_eq(cfg->queues[0].weight, 0);
    cr_assert_eq(cfg->timeout, 25);
    cr_assert_str_eq(cfg->tag, "");
    cr_assert_eq(cfg->nlabels, 0);
    cr_assert_null(cfg->environment);
    cr_assert_eq(cfg->max_retries, 25);
    cr_assert_eq(cfg->dead_max_jobs, 10000);
    cr_assert_eq(cfg->dead_timeout, 15552000);
    cr_assert_eq(cfg->poll_interval_average, 0);
    cr_assert_eq(cfg->average_scheduled_poll_interval, 5);
    cr_assert_eq(cfg->heartbeat_interval, 4);
    cr_assert_eq(cfg->recovery_interval, 4);
    cr_assert_eq(cfg->liveness_ttl, 12);
    cr_assert_eq(cfg->max_recoveries, 3);
    cr_assert_eq(cfg->fetch, CAPSTAN_FETCH_RELIABLE);
    cr_assert_eq(cfg->timestamps, CAPSTAN_TS_FLOAT);
    cr_assert_eq(cfg->log_format, CAPSTAN_LOG_PRETTY);
    cr_assert_null(cfg->log_file);
    cr_assert_eq(cfg->verbose, 0);
    cr_assert_eq(cfg->nplugins, 0);
    cr_assert_eq(cfg->nclasses, 0);
    cr_assert_null(cfg->config_file);
    cr_assert_eq(cfg->redis_url_explicit, 0);
    cr_assert_eq(capstan_config_validate(cfg, err), 0);
    cr_assert_eq(cfg->strict, 1);
}

Test(config, free_null_is_a_no_op)
{
    capstan_config_free(NULL);
}

Test(config, load_file_parses_every_key)
{
    cr_assert_eq(load("concurrency: 20\n"
                      "queues:\n"
                      "  - critical\n"
                      "timeout: 8.5\n"
                      "tag: shop\n"
                      "labels: [blue, eu]\n"
                      "environment: production\n"
                      "max_retries: 7\n"
                      "dead_max_jobs: 500\n"
                      "dead_timeout_in_seconds: 3600\n"
                      "poll_interval_average: 12\n"
                      "average_scheduled_poll_interval: 2.5\n"
                      "verbose: true\n"
                      "require: ./app\n"
                      "strict: false\n"
                      "redis_url: redis://db:6380/2\n"
                      "plugins: [/opt/capstan/jobs.so]\n"
                      "fetch: basic\n"
                      "timestamps: millis\n"
                      "log_format: json\n"
                      "log_file: /var/log/capstan.log\n"
                      "heartbeat_interval: 2\n"
                      "recovery_interval: 30\n"
                      "max_recoveries: 5\n"
                      "classes:\n"
                      "  HardJob: {queue: critical, retry: 3}\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 20);
    cr_assert_eq(cfg->nqueues, 1);
    cr_assert_str_eq(cfg->queues[0].name, "critical");
    cr_assert_eq(cfg->timeout, 8.5);
    cr_assert_str_eq(cfg->tag, "shop");
    cr_assert_eq(cfg->nlabels, 2);
    cr_assert_str_eq(cfg->labels[0], "blue");
    cr_assert_str_eq(cfg->labels[1], "eu");
    cr_assert_null(cfg->environment, "environment is chosen before the file is read");
    cr_assert_eq(cfg->max_retries, 7);
    cr_assert_eq(cfg->dead_max_jobs, 500);
    cr_assert_eq(cfg->dead_timeout, 3600);
    cr_assert_eq(cfg->poll_interval_average, 12);
    cr_assert_eq(cfg->average_scheduled_poll_interval, 2.5);
    cr_assert_eq(cfg->verbose, 1);
    cr_assert_str_eq(cfg->redis_url, "redis://db:6380/2");
    cr_assert_eq(cfg->redis_url_explicit, 1);
    cr_assert_eq(cfg->nplugins, 1);
    cr_assert_str_eq(cfg->plugins[0], "/opt/capstan/jobs.so");
    cr_assert_eq(cfg->fetch, CAPSTAN_FETCH_BASIC);
    cr_assert_eq(cfg->timestamps, CAPSTAN_TS_MILLIS);
    cr_assert_eq(cfg->log_format, CAPSTAN_LOG_JSON);
    cr_assert_str_eq(cfg->log_file, "/var/log/capstan.log");
    cr_assert_eq(cfg->heartbeat_interval, 2);
    cr_assert_eq(cfg->recovery_interval, 30);
    cr_assert_eq(cfg->max_recoveries, 5);
    cr_assert_eq(cfg->nclasses, 1);
    cr_assert_str_eq(cfg->config_file, path);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
}

Test(config, ruby_symbol_keys_are_accepted)
{
    cr_assert_eq(load(":concurrency: 4\n"
                      ":queues:\n"
                      "  - [often, 2]\n"
                      ":verbose: no\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 4);
    cr_assert_str_eq(cfg->queues[0].name, "often");
    cr_assert_eq(cfg->queues[0].weight, 2);
    cr_assert_eq(cfg->verbose, 0);
}

Test(config, queue_forms_give_names_and_weights)
{
    cr_assert_eq(load("queues:\n"
                      "  - default\n"
                      "  - [critical, 3]\n"
                      "  - [low]\n"
                      "  - \"bulk,2\"\n"
                      "  - \"mail, 4\"\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->nqueues, 5);
    const char *names[] = {"default", "critical", "low", "bulk", "mail"};
    int weights[] = {0, 3, 0, 2, 4};
    for (size_t i = 0; i < 5; i++) {
        cr_assert_str_eq(cfg->queues[i].name, names[i]);
        cr_assert_eq(cfg->queues[i].weight, weights[i], "queue %zu", i);
    }
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert_eq(cfg->strict, 0, "a weight makes the order weighted-random");
}

Test(config, queues_without_weights_are_strict_whatever_strict_says)
{
    cr_assert_eq(load("strict: false\nqueues: [a, b, [c]]\n"), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert_eq(cfg->strict, 1);
}

Test(config, duplicate_queue_in_file_is_an_error)
{
    cr_assert_eq(load("queues:\n  - a\n  - [b, 2]\n  - [a, 3]\n"), CAPSTAN_ECONFIG);
    assert_err(4, "queues: queue a is given twice");
}

Test(config, bad_queue_weight_in_file_is_an_error)
{
    cr_assert_eq(load("queues:\n  - [a, heavy]\n"), CAPSTAN_ECONFIG);
    assert_err(2, "queues: weight of a must be an integer >= 1");
}

Test(config, empty_queue_list_is_an_error)
{
    cr_assert_eq(load("queues: []\n"), CAPSTAN_ECONFIG);
    assert_err(1, "queues: must be a non-empty list of queues");
}

Test(config, development_section_is_merged_over_top_level)
{
    cr_assert_eq(load("concurrency: 5\n"
                      "tag: top\n"
                      "development:\n"
                      "  concurrency: 2\n"
                      "production:\n"
                      "  concurrency: 50\n"
                      "  queues: [prod]\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 2);
    cr_assert_str_eq(cfg->tag, "top");
    cr_assert_str_eq(cfg->queues[0].name, "default");
}

Test(config, section_follows_cfg_environment_over_env_vars)
{
    setenv("RAILS_ENV", "staging", 1);
    capstan_config_set_str(&cfg->environment, "production");
    cr_assert_eq(load("concurrency: 5\n"
                      "staging: {concurrency: 7}\n"
                      "production: {concurrency: 50}\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 50);
}

Test(config, section_follows_app_env_then_rails_env)
{
    setenv("RAILS_ENV", "staging", 1);
    cr_assert_eq(load("staging: {concurrency: 7}\nproduction: {concurrency: 50}\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 7);

    capstan_config_free(cfg);
    cfg = capstan_config_new();
    setenv("APP_ENV", "production", 1);
    cr_assert_eq(capstan_config_load_file(cfg, path, err), 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 50);
}

Test(config, typo_inside_another_section_is_reported)
{
    cr_assert_eq(load("production:\n  concurrency: 5\n  queus: [a]\n"), CAPSTAN_ECONFIG);
    assert_err(3, "queus: unknown key; did you mean queues?");
}

Test(config, merge_key_brings_in_anchor_and_own_keys_win)
{
    cr_assert_eq(load("defaults: &defaults\n"
                      "  concurrency: 3\n"
                      "  tag: base\n"
                      "development:\n"
                      "  tag: dev\n"
                      "  <<: *defaults\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 3);
    cr_assert_str_eq(cfg->tag, "dev");
}

Test(config, env_vars_are_expanded_in_values)
{
    setenv("CAPSTAN_T_CONC", "12", 1);
    setenv("CAPSTAN_T_EMPTY", "", 1);
    cr_assert_eq(load("concurrency: ${CAPSTAN_T_CONC}\n"
                      "tag: \"${CAPSTAN_T_UNSET:-fallback}-x\"\n"
                      "labels: [\"${CAPSTAN_T_EMPTY:-was-empty}\", \"a${CAPSTAN_T_EMPTY}b\", $HOME]\n"
                      "redis_url: redis://${CAPSTAN_T_UNSET:-cache}:6379/${CAPSTAN_T_CONC}\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 12);
    cr_assert_str_eq(cfg->tag, "fallback-x");
    cr_assert_str_eq(cfg->labels[0], "was-empty");
    cr_assert_str_eq(cfg->labels[1], "ab");
    cr_assert_str_eq(cfg->labels[2], "$HOME", "only ${...} is expanded");
    cr_assert_str_eq(cfg->redis_url, "redis://cache:6379/12");
}

Test(config, unset_env_var_without_default_is_an_error)
{
    cr_assert_eq(load("concurrency: 5\nredis_url: ${CAPSTAN_T_UNSET}\n"), CAPSTAN_ECONFIG);
    assert_err(2, "redis_url: environment variable CAPSTAN_T_UNSET is not set");
}

Test(config, malformed_reference_is_an_error)
{
    cr_assert_eq(load("tag: ${OOPS\n"), CAPSTAN_ECONFIG);
    assert_err(1, "tag: malformed ${...} reference");
}

Test(config, unknown_key_names_file_line_and_key)
{
    cr_assert_eq(load("# capstan\nqueues: [a]\nconcurrncy: 5\n"), CAPSTAN_ECONFIG);
    assert_err(3, "concurrncy: unknown key; did you mean concurrency?");
}

Test(config, unknown_symbol_key_is_named_without_colon)
{
    cr_assert_eq(load(":timout: 5\n"), CAPSTAN_ECONFIG);
    assert_err(1, "timout: unknown key; did you mean timeout?");
}

Test(config, non_integer_concurrency_is_an_error)
{
    cr_assert_eq(load("tag: a\nconcurrency: abc\n"), CAPSTAN_ECONFIG);
    assert_err(2, "concurrency: must be an integer between 1 and 1000");
}

Test(config, zero_concurrency_is_an_error)
{
    cr_assert_eq(load("concurrency: 0\n"), CAPSTAN_ECONFIG);
    assert_err(1, "concurrency: must be an integer between 1 and 1000");
}

Test(config, list_for_a_number_is_an_error)
{
    cr_assert_eq(load("concurrency: [1]\n"), CAPSTAN_ECONFIG);
    assert_err(1, "concurrency: must be an integer between 1 and 1000");
}

Test(config, negative_timeout_is_an_error)
{
    cr_assert_eq(load("timeout: -1\n"), CAPSTAN_ECONFIG);
    assert_err(1, "timeout: must be a number greater than 0");
}

Test(config, other_bad_values_are_errors)
{
    static const struct {
        const char *yaml, *msg;
    } cases[] = {
        {"max_retries: -1\n", "max_retries: must be an integer >= 0"},
        {"dead_max_jobs: 0\n", "dead_max_jobs: must be an integer >= 1"},
        {"dead_timeout_in_seconds: 1.5\n", "dead_timeout_in_seconds: must be an integer >= 1"},
        {"poll_interval_average: -2\n", "poll_interval_average: must be 0 or a number >= 0.1"},
        {"heartbeat_interval: 0\n", "heartbeat_interval: must be a number >= 0.5"},
        {"max_recoveries: 0\n", "max_recoveries: must be an integer >= 1"},
        {"verbose: maybe\n", "verbose: must be true or false"},
        {"fetch: super\n", "fetch: must be reliable or basic"},
        {"timestamps: iso\n", "timestamps: must be float or millis"},
        {"log_format: xml\n", "log_format: must be pretty or json"},
        {"labels: blue\n", "labels: must be a list of strings"},
        {"redis: {hots: x}\n", "redis.hots: unknown key"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fresh();
        cr_assert_eq(load(cases[i].yaml), CAPSTAN_ECONFIG, "%s", cases[i].yaml);
        assert_err(1, cases[i].msg);
    }
}

Test(config, classes_give_queue_and_retry)
{
    cr_assert_eq(load("classes:\n"
                      "  HardJob: {queue: critical, retry: 5}\n"
                      "  Mailer:\n"
                      "    retry: false\n"
                      "  Report: {retry: true}\n"
                      "  Plain:\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->nclasses, 4);
    const capstan_class_conf_t *c = capstan_config_class(cfg, "HardJob");
    cr_assert_not_null(c);
    cr_assert_str_eq(c->queue, "critical");
    cr_assert_eq(c->retry, 5);
    c = capstan_config_class(cfg, "Mailer");
    cr_assert_null(c->queue);
    cr_assert_eq(c->retry, CAPSTAN_RETRY_NONE);
    cr_assert_eq(capstan_config_class(cfg, "Report")->retry, CAPSTAN_RETRY_DEFAULT);
    cr_assert_eq(capstan_config_class(cfg, "Plain")->retry, CAPSTAN_RETRY_UNSET);
    cr_assert_null(capstan_config_class(cfg, "Nobody"));
}

Test(config, bad_class_retry_is_an_error)
{
    cr_assert_eq(load("classes:\n  HardJob:\n    queue: q\n    retry: maybe\n"), CAPSTAN_ECONFIG);
    assert_err(4, "classes.HardJob.retry: must be true, false or an integer >= 0");
}

Test(config, unknown_class_option_is_an_error)
{
    cr_assert_eq(load("classes:\n  HardJob: {queue: q, retries: 3}\n"), CAPSTAN_ECONFIG);
    assert_err(2, "classes.HardJob.retries: unknown key");
}

Test(config, yaml_syntax_error_is_a_parse_error_with_line)
{
    cr_assert_eq(load("concurrency: 5\nqueues: [a, b\ntag: x\n"), CAPSTAN_EPARSE);
    char want[CAPSTAN_ERRLEN];
    snprintf(want, sizeof(want), "%s:3: ", path);
    cr_assert(strncmp(err, want, strlen(want)) == 0, "got %s", err);
}

Test(config, bad_indentation_is_a_parse_error)
{
    cr_assert_eq(load("concurrency: 5\n  timeout: 3\n"), CAPSTAN_EPARSE);
    char want[CAPSTAN_ERRLEN];
    snprintf(want, sizeof(want), "%s:2: mapping values are not allowed in this context",
             path);
    cr_assert_str_eq(err, want);
}

Test(config, invalid_utf8_reports_its_line)
{
    cr_assert_eq(load("concurrency: 5\ntag: \xff\n"), CAPSTAN_EPARSE);
    assert_err(2, "invalid leading UTF-8 octet");
}

Test(config, merge_into_itself_is_an_error_not_a_hang)
{
    cr_assert_eq(load("development: &a\n  concurrency: 3\n  <<: *a\n"), CAPSTAN_ECONFIG);
    assert_err(1, "<<: merges nest too deeply");
}

Test(config, unknown_mapping_key_is_not_taken_for_a_section)
{
    cr_assert_eq(load("workers:\n  single:\n    concurrency: 1\n"), CAPSTAN_ECONFIG);
    assert_err(1, "workers: unknown key");
}

Test(config, missing_file_is_not_found)
{
    cr_assert_eq(capstan_config_load_file(cfg, "/nonexistent/capstan.yml", err), CAPSTAN_ENOTFOUND);
    cr_assert_str_eq(err, "/nonexistent/capstan.yml: No such file or directory");
}

Test(config, empty_file_changes_nothing)
{
    cr_assert_eq(load(""), 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 10);
    cr_assert_str_eq(cfg->config_file, path);
}

Test(config, top_level_list_is_an_error)
{
    cr_assert_eq(load("- a\n- b\n"), CAPSTAN_ECONFIG);
    assert_err(1, "the file must be a mapping of settings");
}

Test(config, redis_mapping_sets_url)
{
    cr_assert_eq(load("redis:\n  url: redis://r:1/3\n"), 0, "%s", err);
    cr_assert_str_eq(cfg->redis_url, "redis://r:1/3");
    cr_assert_eq(cfg->redis_url_explicit, 1);
}

Test(config, file_lists_replace_earlier_values)
{
    cr_assert_eq(capstan_config_add_queue(cfg, "flagq", err), 0);
    cr_assert_eq(load("labels: [a]\nqueues: [x, y]\ntag:\nlog_file: ~\n"), 0, "%s", err);
    cr_assert_eq(cfg->nqueues, 2);
    cr_assert_str_eq(cfg->queues[1].name, "y");
    cr_assert_str_eq(cfg->tag, "");
    cr_assert_null(cfg->log_file);
}

Test(config, relative_plugin_path_is_resolved_against_config_dir)
{
    cr_assert_eq(load("plugins:\n  - plugins/jobs.so\n  - /abs/other.so\n"), 0, "%s", err);
    cr_assert_eq(cfg->nplugins, 2);
    cr_assert_str_eq(cfg->plugins[0], "/tmp/plugins/jobs.so");
    cr_assert_str_eq(cfg->plugins[1], "/abs/other.so");
}

Test(config, plugin_next_to_a_bare_config_name_gets_dot_slash)
{
    char dir[] = "/tmp/capstan-test-dir-XXXXXX", old[4096];
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_not_null(getcwd(old, sizeof(old)));
    cr_assert_eq(chdir(dir), 0);
    FILE *f = fopen("capstan.yml", "w");
    cr_assert_not_null(f);
    fputs("plugins: [jobs.so]\n", f);
    fclose(f);
    int rc = capstan_config_load_file(cfg, "capstan.yml", err);
    unlink("capstan.yml");
    cr_assert_eq(chdir(old), 0);
    rmdir(dir);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(cfg->plugins[0], "./jobs.so");
}

Test(config, add_queue_parses_name_and_weight)
{
    cr_assert_eq(capstan_config_add_queue(cfg, "critical,3", err), 0, "%s", err);
    cr_assert_eq(capstan_config_add_queue(cfg, "low", err), 0, "%s", err);
    cr_assert_eq(cfg->nqueues, 2, "the first flag replaces the default list");
    cr_assert_str_eq(cfg->queues[0].name, "critical");
    cr_assert_eq(cfg->queues[0].weight, 3);
    cr_assert_str_eq(cfg->queues[1].name, "low");
    cr_assert_eq(cfg->queues[1].weight, 0);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert_eq(cfg->strict, 0);
}

Test(config, add_queue_rejects_zero_weight)
{
    cr_assert_eq(capstan_config_add_queue(cfg, "x,0", err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "queue x,0: weight must be an integer >= 1");
    cr_assert_eq(cfg->nqueues, 1);
    cr_assert_str_eq(cfg->queues[0].name, "default", "a failed call leaves the list");
}

Test(config, add_queue_rejects_non_numeric_weight)
{
    cr_assert_eq(capstan_config_add_queue(cfg, "x,abc", err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "queue x,abc: weight must be an integer >= 1");
}

Test(config, add_queue_rejects_duplicates_and_empty_names)
{
    cr_assert_eq(capstan_config_add_queue(cfg, "a", err), 0);
    cr_assert_eq(capstan_config_add_queue(cfg, "a,2", err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "queue a is given twice");
    cr_assert_eq(capstan_config_add_queue(cfg, ",2", err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "queue ,2: name is empty");
    cr_assert_eq(cfg->nqueues, 1);
}

Test(config, apply_env_uses_redis_url)
{
    setenv("REDIS_URL", "redis://env:6379/1", 1);
    capstan_config_apply_env(cfg);
    cr_assert_str_eq(cfg->redis_url, "redis://env:6379/1");
}

Test(config, apply_env_uses_variable_named_by_redis_provider)
{
    setenv("REDIS_URL", "redis://ignored:6379/1", 1);
    setenv("REDIS_PROVIDER", "MY_REDIS", 1);
    setenv("MY_REDIS", "redis://provider:6379/4", 1);
    capstan_config_apply_env(cfg);
    cr_assert_str_eq(cfg->redis_url, "redis://provider:6379/4");
}

Test(config, apply_env_keeps_explicit_url)
{
    setenv("REDIS_URL", "redis://env:6379/1", 1);
    cr_assert_eq(load("redis_url: redis://file:6379/0\n"), 0, "%s", err);
    capstan_config_apply_env(cfg);
    cr_assert_str_eq(cfg->redis_url, "redis://file:6379/0");
}

Test(config, apply_env_without_variables_keeps_default)
{
    capstan_config_apply_env(cfg);
    cr_assert_str_eq(cfg->redis_url, "redis://127.0.0.1:6379/0");
}

Test(config, validate_rejects_out_of_range_values)
{
    cfg->concurrency = 1001;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "concurrency: must be an integer between 1 and 1000");
    cfg->concurrency = 10;
    cfg->timeout = 0;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "timeout: must be a number greater than 0");
    cfg->timeout = 1;
    cfg->recovery_interval = -1;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "recovery_interval: must be a number greater than 0");
}

/* A period far too short floods Redis (a beat every microsecond) or lets
 * the process's own liveness key lapse between refreshes, so other
 * processes take its jobs: refused where the file says it. */
Test(config, periods_below_their_floor_are_refused)
{
    static const struct {
        const char *yaml, *msg;
    } cases[] = {
        {"heartbeat_interval: 0.000001\nliveness_ttl: 0.00001\n",
         "heartbeat_interval: must be a number >= 0.5"},
        {"heartbeat_interval: 0.49\n", "heartbeat_interval: must be a number >= 0.5"},
        {"liveness_ttl: 0.00001\n", "liveness_ttl: must be a number >= 2"},
        {"liveness_ttl: 1.9\n", "liveness_ttl: must be a number >= 2"},
        {"poll_interval_average: 0.001\n", "poll_interval_average: must be 0 or a number >= 0.1"},
        {"average_scheduled_poll_interval: 0.01\n",
         "average_scheduled_poll_interval: must be a number >= 0.1"},
        {"classes:\n  J:\n    limit: {type: concurrent, size: 2, lock_timeout: 0.01}\n",
         "classes.J.limit.lock_timeout: a concurrent slot's lease must be at least 1 s"},
        {"classes:\n  J:\n    limit: {type: concurrent, size: 2, interval: 0.5}\n",
         "classes.J.limit.interval: a concurrent slot's lease must be at least 1 s"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fresh();
        cr_assert_eq(load(cases[i].yaml), CAPSTAN_ECONFIG, "%s", cases[i].yaml);
        int line = strncmp(cases[i].yaml, "classes", 7) == 0 ? 3 : 1;
        assert_err(line, cases[i].msg);
    }
}

Test(config, periods_at_their_floor_are_taken)
{
    cr_assert_eq(load("heartbeat_interval: 0.5\nliveness_ttl: 2\npoll_interval_average: 0.1\n"
                      "average_scheduled_poll_interval: 0.1\n"
                      "classes:\n"
                      "  C: {limit: {type: concurrent, size: 2, lock_timeout: 1}}\n"
                      "  W: {limit: {type: window, count: 5, interval: 0.5}}\n"),
                 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert_eq(cfg->heartbeat_interval, 0.5);
    cr_assert_eq(cfg->liveness_ttl, 2);
    cr_assert_eq(capstan_config_class(cfg, "W")->limit.seconds, 0.5, "a window is not a lease");
    fresh();
    cr_assert_eq(load("poll_interval_average: 0\n"), 0, "0 still means scaled: %s", err);
}

/* Settings made in C meet the same floors; the check of one against the
 * other names the file both came from. */
Test(config, validate_applies_the_floors)
{
    cfg->heartbeat_interval = 0.000001;
    cfg->liveness_ttl = 0.00001;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "heartbeat_interval: must be a number >= 0.5");
    cfg->heartbeat_interval = 0.5;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "liveness_ttl: must be a number >= 2");
    cfg->liveness_ttl = 2;
    cfg->poll_interval_average = 0.05;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "poll_interval_average: must be 0 or a number >= 0.1");
    cfg->poll_interval_average = 0;
    cfg->average_scheduled_poll_interval = 0.05;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "average_scheduled_poll_interval: must be a number >= 0.1");
    cfg->average_scheduled_poll_interval = 5;
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);

    cr_assert_eq(load("heartbeat_interval: 5\nliveness_ttl: 10\n"), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    char want[CAPSTAN_ERRLEN * 2];
    snprintf(want, sizeof(want), "%s: liveness_ttl: must be at least 3 times heartbeat_interval (5 s)", path);
    cr_assert_str_eq(err, want);
}

Test(config, a_class_queue_follows_the_queue_name_rule)
{
    cr_assert_eq(load("classes:\n  J:\n    queue: \"a b\"\n"), CAPSTAN_ECONFIG);
    assert_err(3, "classes.J.queue: queue name \"a b\" contains a space");
    fresh();
    cr_assert_eq(load("classes:\n  J: {queue: ''}\n"), CAPSTAN_ECONFIG);
    assert_err(2, "classes.J.queue: a queue name is empty");
}

Test(config, validate_rejects_bad_queue_lists)
{
    cr_assert_eq(capstan_config_add_queue(cfg, "two words", err), 0);
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "queues: queue name \"two words\" contains a space");
    free(cfg->queues[0].name);
    free(cfg->queues);
    cfg->queues = NULL;
    cfg->nqueues = 0;
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "queues: must list at least one queue");
}

Test(config, set_str_replaces_and_copies)
{
    char buf[] = "one";
    char *slot = NULL;
    cr_assert_eq(capstan_config_set_str(&slot, buf), 0);
    buf[0] = 'x';
    cr_assert_str_eq(slot, "one");
    cr_assert_eq(capstan_config_set_str(&slot, NULL), 0);
    cr_assert_null(slot);
}

/* What YAML refuses, the flags refuse too, naming the flag. */
static void flag_rejected(const char *flag, const char *value)
{
    capstan_config_t *c = capstan_config_new();
    char e[CAPSTAN_ERRLEN] = "";
    char *argv[] = {"capstan", (char *)flag, (char *)value, NULL};
    cr_assert_eq(capstan_config_parse_args(c, 3, argv, e), CAPSTAN_ECONFIG, "%s %s accepted", flag, value);
    cr_assert(strstr(e, flag), "%s %s: %s", flag, value, e);
    cr_assert_null(strchr(e, '\n'), "one line: %s", e);
    capstan_config_free(c);
}

Test(config, numeric_flags_refuse_what_the_file_refuses)
{
    const char *bad_seconds[] = {"inf", "-inf", "nan", "-1", "0", "1e400", "5s", "", "0x"};
    for (size_t i = 0; i < sizeof(bad_seconds) / sizeof(bad_seconds[0]); i++) {
        flag_rejected("--timeout", bad_seconds[i]);
        flag_rejected("-t", bad_seconds[i]);
    }
    const char *bad_ints[] = {"inf", "nan", "1.5", "0", "1001", "99999999999999999999", "-5"};
    for (size_t i = 0; i < sizeof(bad_ints) / sizeof(bad_ints[0]); i++)
        flag_rejected("--concurrency", bad_ints[i]);
    flag_rejected("--metrics-port", "65536");
    flag_rejected("--metrics-port", "inf");

    char *argv[] = {"capstan", "-t", "2.5", "-c", "7", NULL};
    cr_assert_eq(capstan_config_parse_args(cfg, 5, argv, err), 0, "%s", err);
    cr_assert_float_eq(cfg->timeout, 2.5, 1e-9);
    cr_assert_eq(cfg->concurrency, 7);
}

Test(config, deep_nesting_fails_fast_with_its_line)
{
    enum { DEPTH = 100000 };
    char *text = malloc(DEPTH + 64);
    cr_assert_not_null(text);
    strcpy(text, "concurrency: 5\nlabels: ");
    size_t n = strlen(text);
    memset(text + n, '[', DEPTH);
    strcpy(text + n + DEPTH, "\n");
    path = write_yaml(text);
    free(text);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(capstan_config_load_file(cfg, path, err), CAPSTAN_ECONFIG);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_assert(strstr(err, ":2: nesting deeper than"), "%s", err);
    cr_assert_lt(took, 2.0, "took %.1f s", took);
}

/* The redacted URL is what logs, capstan stats and capstan top show. A unix
 * socket's password is in the query; an '@' in the socket's path is not
 * a user-info separator and must not let the password through. */
Test(config, redacted_url_never_shows_the_password)
{
    static const struct { const char *url, *want; } cases[] = {
        { "redis://user:secret@cache:6380/2", "redis://user:***@cache:6380/2" },
        { "redis://secret@cache", "redis://***@cache" },
        { "redis://cache:6379/0", "redis://cache:6379/0" },
        { "unix:///run/redis.sock?db=2&password=secret", "unix:///run/redis.sock?db=2&password=***" },
        { "unix:///run/redis@6379/sock?password=secret", "unix:///run/redis@6379/sock?password=***" },
        { "unix:///run/a:b@c?password=secret", "unix:///run/a:b@c?password=***" },
        /* Every scheme takes password= in its query, beside user info too. */
        { "redis://cache:6379?db=3&password=secret", "redis://cache:6379?db=3&password=***" },
        { "redis://@cache?db=4&password=secret&x=1", "redis://***@cache?db=4&password=***&x=1" },
        { "rediss://u:p1@cache?password=secret", "rediss://u:***@cache?password=***" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[256];
        capstan__redis_url_redact(cases[i].url, out, sizeof(out));
        cr_expect_str_eq(out, cases[i].want, "%s", cases[i].url);
        cr_expect_null(strstr(out, "secret"), "%s -> %s", cases[i].url, out);
    }
}

/* Each level merges four copies of the one before: 4^14 merges from a
 * 600-byte file. It must fail at once, not after minutes. */
Test(config, merges_that_multiply_fail_fast)
{
    char text[2048];
    size_t n = (size_t)snprintf(text, sizeof(text), "d0: &a0 {concurrency: 1}\n");
    for (int i = 1; i < 15; i++)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "d%d: &a%d {<<: [*a%d, *a%d, *a%d, *a%d]}\n",
                              i, i, i - 1, i - 1, i - 1, i - 1);
    snprintf(text + n, sizeof(text) - n, "development:\n  <<: *a14\n");
    path = write_yaml(text);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(capstan_config_load_file(cfg, path, err), CAPSTAN_ECONFIG);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_assert(strstr(err, "<<: more than 1000 mappings merged"), "%s", err);
    cr_assert_lt(took, 2.0, "took %.1f s", took);
}

/* ---- a Rails app's sidekiq.yml ---------------------------------------- */

/* The warnings as one string, a line each. */
static char *warnings(void)
{
    static char all[4096];
    all[0] = '\0';
    for (size_t i = 0; i < cfg->nwarnings; i++) {
        strncat(all, cfg->warnings[i], sizeof(all) - strlen(all) - 2);
        strcat(all, "\n");
    }
    return all;
}

/* Asserts warning i is exactly "PATH:LINE: rest". */
static void assert_warning(size_t i, int line, const char *rest)
{
    char want[CAPSTAN_ERRLEN * 2];
    cr_assert_lt(i, cfg->nwarnings, "only %zu warnings:\n%s", cfg->nwarnings, warnings());
    snprintf(want, sizeof(want), "%s:%d: %s", path, line, rest);
    cr_assert_str_eq(cfg->warnings[i], want);
}

Test(config, a_rails_sidekiq_yml_loads_with_a_warning_per_unused_key)
{
    setenv("RAILS_ENV", "production", 1);
    cr_assert_eq(load("---\n"
                      ":concurrency: 5\n"                                   /* 2 */
                      ":pidfile: /tmp/capstan-test-sidekiq.pid\n"
                      ":logfile: ./log/sidekiq.log\n"
                      ":require: ./app\n"                                   /* 5 */
                      ":strict: false\n"
                      ":shutdown_timeout: 40\n"
                      ":queues:\n"
                      "  - [critical, 3]\n"
                      "  - default\n"                                       /* 10 */
                      "  - [mailers, 1]\n"
                      ":redis:\n"
                      "  :url: redis://cache:6379/1\n"
                      "  :size: 12\n"
                      "  :ssl_params:\n"                                    /* 15 */
                      "    :verify_mode: none\n"
                      ":lifecycle_events: {}\n"
                      ":error_handlers: []\n"
                      ":limits:\n"
                      "  mailers: 2\n"                                      /* 20 */
                      ":schedule:\n"
                      "  nightly_report:\n"
                      "    cron: '0 3 * * *'\n"
                      "    class: NightlyReportJob\n"
                      "development:\n"                                      /* 25 */
                      "  :concurrency: 2\n"
                      "staging:\n"
                      "  :concurrency: <%= ENV['STAGING_THREADS'] %>\n"
                      "production:\n"
                      "  :concurrency: 20\n"                                /* 30 */
                      "  :logfile: /var/log/sidekiq.log\n"),
                 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 20, "the production section applies");
    cr_assert_str_eq(cfg->log_file, "/var/log/sidekiq.log", "logfile is honoured");
    cr_assert_str_eq(cfg->pidfile, "/tmp/capstan-test-sidekiq.pid", "pidfile is honoured");
    cr_assert_eq(cfg->timeout, 40, "shutdown_timeout is an alias of timeout");
    cr_assert_str_eq(cfg->redis_url, "redis://cache:6379/1");
    cr_assert_eq(cfg->nqueues, 3);
    cr_assert_eq(cfg->queues[0].weight, 3);
    cr_assert_eq(cfg->nwarnings, 6, "%s", warnings());
    assert_warning(0, 5, "require: not used by capstan (Ruby code to load; capstan's handlers come from "
                         "plugins); ignored");
    assert_warning(1, 6, "strict: not used by capstan (Sidekiq drops it too: queue weights decide "
                         "the order); ignored");
    assert_warning(2, 14, "redis.size: not used by capstan (a Ruby client option); ignored");
    assert_warning(3, 15, "redis.ssl_params: not read by capstan; give TLS settings under tls: "
                            "(ca_file, cert, key, server_name, verify) with TLS in the url");
    assert_warning(4, 17, "lifecycle_events: not used by capstan (Ruby callbacks); ignored");
    assert_warning(5, 18, "error_handlers: not used by capstan (Ruby callbacks); ignored");
    /* sidekiq-limit_fetch's caps are read. */
    cr_assert_eq(cfg->nqueue_limits, 1);
    cr_assert_str_eq(cfg->queue_limits[0].queue, "mailers");
    cr_assert_eq(cfg->queue_limits[0].limit, 2);
    /* sidekiq-scheduler's section is read as periodic schedules. */
    cr_assert_eq(cfg->nperiodic, 1);
    cr_assert_str_eq(cfg->periodic[0].name, "nightly_report");
    cr_assert_str_eq(cfg->periodic[0].cls, "NightlyReportJob");
}

/* sidekiq-limit_fetch's keys: limits and process_limits are read per
 * queue (null: no cap; a section's mapping replaces the top level's),
 * blocking is warned about, and a bad cap stops the start. */
Test(config, limit_fetchs_caps_are_read_and_blocking_warned_about)
{
    setenv("RAILS_ENV", "production", 1);
    cr_assert_eq(load(":limits:\n  reports: 2\n  exports: 3\n"
                      ":process_limits:\n  reports: 1\n  imports: ~\n"
                      ":blocking:\n  - reports\n"
                      "production:\n  :limits:\n    reports: 4\n"), 0, "%s", err);
    cr_assert_eq(cfg->nwarnings, 1, "%s", warnings());
    assert_warning(0, 7, "blocking: not used by capstan (sidekiq-limit_fetch's blocking queues; the "
                         "queues' order and weights decide); ignored");
    int seen = 0;
    for (size_t i = 0; i < cfg->nqueue_limits; i++) {
        const capstan_queue_limit_t *q = &cfg->queue_limits[i];
        if (!strcmp(q->queue, "reports") && q->limit == 4 && q->process_limit == 1)
            seen |= 1;
        if (!strcmp(q->queue, "exports") && q->limit == 0)
            seen |= 2; /* the section's limits replace the top level's */
        if (!strcmp(q->queue, "imports") && q->limit == 0 && q->process_limit == 0)
            seen |= 4;
    }
    cr_assert_eq(seen, 7, "%d", seen);
    fresh();
    cr_assert_eq(load(":limits:\n  reports: 0\n"), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, ":2: limits.reports: must be an integer >= 1"), "%s", err);
    fresh();
    cr_assert_eq(load(":limits: [reports]\n"), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, "limits: must be a mapping of queue name to a number of jobs"), "%s", err);
}

Test(config, unused_keys_in_the_selected_section_warn_too)
{
    cr_assert_eq(load("development:\n  :daemon: true\n"), 0, "%s", err);
    cr_assert_eq(cfg->nwarnings, 1, "%s", warnings());
    assert_warning(0, 2, "daemon: not used by capstan (removed in Sidekiq 6; run capstan under a "
                         "supervisor); ignored");
}

/* -e with a typo, or a deploy that forgot RAILS_ENV, silently ran on the
 * top-level settings alone: the file's sections say which environments it
 * expects, so a name that has none is one warning. */
Test(config, an_environment_without_a_section_warns_once)
{
    capstan_config_set_str(&cfg->environment, "nosuch");
    cr_assert_eq(load("concurrency: 5\n"
                      "development:\n"
                      "  concurrency: 2\n"
                      "production:\n"
                      "  concurrency: 20\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 5);
    cr_assert_eq(cfg->nwarnings, 1, "%s", warnings());
    assert_warning(0, 2, "nosuch: no section for this environment (the file has development, "
                         "production); only the top-level settings apply");
}

/* A file without sections reads the same in every environment: -e there
 * has nothing to select, and warning on each start would be noise. */
Test(config, an_environment_is_not_warned_about_in_a_file_without_sections)
{
    capstan_config_set_str(&cfg->environment, "nosuch");
    cr_assert_eq(load("concurrency: 5\nqueues: [a]\n"), 0, "%s", err);
    cr_assert_eq(cfg->nwarnings, 0, "%s", warnings());
    fresh();
    capstan_config_set_str(&cfg->environment, "production");
    cr_assert_eq(load("concurrency: 5\nproduction:\n"), 0, "%s", err);
    cr_assert_eq(cfg->nwarnings, 0, "an empty section is the environment's: %s", warnings());
}

Test(config, logfile_pidfile_and_shutdown_timeout_are_honoured_without_warnings)
{
    cr_assert_eq(load("logfile: /tmp/a.log\npidfile: /tmp/a.pid\nshutdown_timeout: 9\n"
                      "startup_timeout: 4\n"),
                 0, "%s", err);
    cr_assert_str_eq(cfg->log_file, "/tmp/a.log");
    cr_assert_str_eq(cfg->pidfile, "/tmp/a.pid");
    cr_assert_eq(cfg->timeout, 9);
    cr_assert_eq(cfg->startup_timeout, 4);
    cr_assert_eq(cfg->nwarnings, 0, "%s", warnings());
}

Test(config, typo_alone_in_an_unselected_section_names_the_key)
{
    cr_assert_eq(load("concurrency: 5\nproduction:\n  :concurency: 25\n"), CAPSTAN_ECONFIG);
    assert_err(3, "concurency: unknown key; did you mean concurrency?");
}

Test(config, unknown_key_suggests_the_nearest_known_one)
{
    cr_assert_eq(load("concurency: 5\n"), CAPSTAN_ECONFIG);
    assert_err(1, "concurency: unknown key; did you mean concurrency?");
}

Test(config, unknown_key_far_from_every_key_has_no_suggestion)
{
    cr_assert_eq(load("frobnicate: 5\n"), CAPSTAN_ECONFIG);
    assert_err(1, "frobnicate: unknown key");
}

Test(config, unknown_redis_option_suggests_and_target_options_are_errors)
{
    cr_assert_eq(load("redis:\n  uri: redis://x:1/0\n"), CAPSTAN_ECONFIG);
    assert_err(2, "redis.uri: unknown key; did you mean url?");
    capstan_config_free(cfg);
    cfg = capstan_config_new();
    unlink(path);
    free(path);
    cr_assert_eq(load("redis:\n  host: cache\n"), CAPSTAN_ECONFIG);
    assert_err(2, "redis.host: not supported; give the server in url "
                  "(redis://[user:password@]host:port/db)");
}

/* A Rails sidekiq.yml reads the environment through ERB, which Sidekiq
 * renders before the YAML: each form such files use gives what Ruby gives. */
Test(config, erb_reads_the_environment_as_ruby_does)
{
    setenv("CAPSTAN_T_CONC", "12", 1);
    setenv("CAPSTAN_T_EMPTY", "", 1);
    cr_assert_eq(load("concurrency: <%= ENV[\"CAPSTAN_T_CONC\"] %>\n"
                      "tag: <%= ENV['CAPSTAN_T_CONC'] %>x\n"
                      "labels:\n"
                      "  - <%= ENV.fetch(\"CAPSTAN_T_UNSET\", \"dflt\") %>\n"
                      "  - <%= ENV.fetch('CAPSTAN_T_CONC', 3) %>\n"                     /* 5 */
                      "  - <%= ENV.fetch(\"CAPSTAN_T_UNSET\") { 'blk' } %>\n"
                      "  - <%= ENV.fetch(\"CAPSTAN_T_UNSET\", 5).to_i %>\n"
                      "  - <%= Integer(ENV[\"CAPSTAN_T_CONC\"]) %>\n"
                      "  - \"[<%= ENV.fetch(\"CAPSTAN_T_UNSET\", nil) %>]\"\n"
                      "  - <%= ENV[\"CAPSTAN_T_UNSET\"] || 'or' %>\n"                   /* 10 */
                      "  - <%= ENV.fetch( 'CAPSTAN_T_UNSET' , -1_000 ) %>\n"
                      "  - <%= Integer(ENV.fetch(\"CAPSTAN_T_UNSET\", \"0x1A\")) %>\n"
                      "  - <%= ENV[\"CAPSTAN_T_EMPTY\"].to_i %>\n"
                      "  - \"[<%= ENV['CAPSTAN_T_EMPTY'] || 'not nil' %>]\"\n"
                      "  - <%= ENV.fetch(\"CAPSTAN_T_CONC\") { ENV.fetch(\"CAPSTAN_T_UNSET\") } %>\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 12);
    cr_assert_str_eq(cfg->tag, "12x");
    const char *want[] = {"dflt", "12", "blk", "5", "12", "[]", "or", "-1000", "26", "0",
                          "[]", "12"};
    cr_assert_eq(cfg->nlabels, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < cfg->nlabels; i++)
        cr_assert_str_eq(cfg->labels[i], want[i], "label %zu", i);
}

/* <%# %> comments, Ruby comments in code tags and the -%> / <%- trimming
 * render as Sidekiq's ERB (trim_mode "-") does, and an error further down
 * still names the line of the file, not of the rendered text. */
Test(config, erb_comments_and_trimming_keep_file_lines)
{
    setenv("CAPSTAN_T_CONC", "7", 1);
    cr_assert_eq(load("<%# threads come from the environment %>\n"
                      "concurrency: <%= ENV.fetch(\"CAPSTAN_T_CONC\", 5) -%>\n"
                      "\n"
                      "<%- # a code comment -%>\n"
                      "  <%- # indented, dropped with its line -%>\n"                   /* 5 */
                      "tag: t<%# inline %>\n"
                      "labels: [\"<%%= literal %>\"]\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->concurrency, 7);
    cr_assert_str_eq(cfg->tag, "t");
    cr_assert_eq(cfg->nlabels, 1);
    cr_assert_str_eq(cfg->labels[0], "<%= literal %>");
    fresh();
    cr_assert_eq(load("<%#\n  a comment\n  on lines\n%>\n"
                      "concurrency: <%= ENV.fetch(\"CAPSTAN_T_CONC\", 5) %>\n"           /* 5 */
                      "<%- # dropped -%>\n"
                      "tag: x\n"
                      "concurrncy: 3\n"),
                 CAPSTAN_ECONFIG);
    assert_err(8, "concurrncy: unknown key; did you mean concurrency?");
    fresh();
    cr_assert_eq(load("<%- # dropped -%>\nconcurrency: [1\n"), CAPSTAN_EPARSE);
    cr_assert(strncmp(err, path, strlen(path)) == 0 && strstr(err, ":3: "), "%s", err);
}

/* A value taken from the environment is data: ERB in it is not rendered. */
Test(config, erb_in_an_environment_value_is_kept_as_it_is)
{
    setenv("CAPSTAN_T_CONC", "<%= Rails.env %>", 1);
    cr_assert_eq(load("tag: '<%= ENV[\"CAPSTAN_T_CONC\"] %>'\n"), 0, "%s", err);
    cr_assert_str_eq(cfg->tag, "<%= Rails.env %>");
}

/* Anything else is Ruby capstan cannot run: refused with one line naming
 * the file, the line and the tag, rather than a value guessed wrong. */
Test(config, erb_it_cannot_evaluate_is_refused_naming_file_line_and_tag)
{
    static const struct { const char *yaml; int line; const char *rest; } cases[] = {
        {"concurrency: 5\ntag: <%= Rails.env %>\n", 2, "unsupported ERB <%= Rails.env %>"},
        {"<% if ENV['X'] %>\nconcurrency: 5\n<% end %>\n", 1, "unsupported ERB <% if ENV['X'] %>"},
        {"tag: <%= `hostname`.strip %>\n", 1, "unsupported ERB <%= `hostname`.strip %>"},
        {"tag: <%= ENV[\"CAPSTAN_T_CONC\"].upcase %>\n", 1,
         "unsupported ERB <%= ENV[\"CAPSTAN_T_CONC\"].upcase %>"},
        {"tag: \"<%= \"#{ENV['A']}\" %>\"\n", 1, "unsupported ERB <%= \"#{ENV['A']}\" %>"},
        {"concurrency: <%= ENV.fetch('CAPSTAN_T_CONC', 2.5) %>\n", 1,
         "unsupported ERB <%= ENV.fetch('CAPSTAN_T_CONC', 2.5) %>"},
        {"a: 1\n\ntag: <%= ENV['CAPSTAN_T_CONC']\n", 3,
         "unterminated ERB tag <%= ENV['CAPSTAN_T_CONC'] "},
        {"<%#\n%>\ntag: <%= ENV.fetch(\"CAPSTAN_T_UNSET\") %>\n", 3,
         "ERB <%= ENV.fetch(\"CAPSTAN_T_UNSET\") %>: key not found: \"CAPSTAN_T_UNSET\" "
         "(the environment variable is not set)"},
        {"concurrency: <%= Integer(ENV['CAPSTAN_T_EMPTY']) %>\n", 1,
         "ERB <%= Integer(ENV['CAPSTAN_T_EMPTY']) %>: invalid value for Integer(): \"\""},
        {"concurrency: <%= Integer(ENV['CAPSTAN_T_UNSET']) %>\n", 1,
         "ERB <%= Integer(ENV['CAPSTAN_T_UNSET']) %>: can't convert nil into Integer"},
        {"tag: <%= ((((((((((((((((((((1)))))))))))))))))))) %>\n", 1,
         "unsupported ERB <%= ((((((((((((((((((((1)))))))))))))))))))) %>"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fresh();
        setenv("CAPSTAN_T_EMPTY", "", 1);
        cr_assert_eq(load(cases[i].yaml), CAPSTAN_ECONFIG, "case %zu: %s", i, err);
        assert_err(cases[i].line, cases[i].rest);
    }
}

Test(config, missing_or_unreadable_file_given_to_C_is_a_config_error)
{
    char *argv[] = {"capstan", "-C", "/nonexistent/sidekiq.yml", NULL};
    cr_assert_eq(capstan_config_parse_args(cfg, 3, argv, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "cannot read the config file /nonexistent/sidekiq.yml: "
                          "No such file or directory");
    char *dir_argv[] = {"capstan", "-C", "/tmp", NULL};
    cr_assert_eq(capstan_config_parse_args(cfg, 3, dir_argv, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "cannot read the config file /tmp: Is a directory");
}

Test(config, startup_timeout_flag_and_pidfile_flag)
{
    char *argv[] = {"capstan", "--startup-timeout", "0", "-P", "/tmp/x.pid", NULL};
    cr_assert_eq(capstan_config_parse_args(cfg, 5, argv, err), 0, "%s", err);
    cr_assert_eq(cfg->startup_timeout, 0);
    cr_assert_str_eq(cfg->pidfile, "/tmp/x.pid");
    flag_rejected("--startup-timeout", "-1");
    flag_rejected("--startup-timeout", "inf");
}

/* The periodic: section: every option read, args and options as JSON, the
 * line each schedule came from; errors at the line of what is wrong. */
Test(config, periodic_section_and_its_errors)
{
    cr_assert_eq(load("periodic:\n"
                      "  nightly_report:\n"
                      "    cron: \"0 30 2 * * *\"\n"
                      "    tz: Europe/Berlin\n"
                      "    class: ReportJob\n"
                      "    queue: reports\n"
                      "    args: [7, \"7\", true, ~, 1.5, {a: [x]}]\n"
                      "    retry: 3\n"
                      "    missed: last\n"
                      "    tags: [cron]\n"
                      "  hourly: {cron: \"@hourly\", class: H}\n"
                      "  berlin: {cron: \"0 9 * * mon#1 Europe/Berlin\", class: B}\n"),
                 0, "%s", err);
    cr_assert_eq(cfg->nperiodic, 3);
    const struct capstan_periodic_conf *p = cfg->periodic;
    cr_assert_str_eq(p->name, "nightly_report");
    cr_assert_str_eq(p->tz, "Europe/Berlin");
    cr_assert_str_eq(p->queue, "reports");
    cr_assert_str_eq(p->args, "[7,\"7\",true,null,1.5,{\"a\":[\"x\"]}]");
    cr_assert_str_eq(p->extra, "{\"tags\":[\"cron\"]}");
    cr_assert_eq(p->retry, 3);
    cr_assert_eq(p->missed, CAPSTAN_MISSED_LAST);
    char origin[512];
    snprintf(origin, sizeof(origin), "%s:2", path);
    cr_assert_str_eq(p->origin, origin);
    cr_assert_str_eq(p[1].queue, "default");
    cr_assert_str_eq(p[1].args, "[]");
    cr_assert_null(p[1].tz);
    cr_assert_eq(p[1].missed, CAPSTAN_MISSED_SKIP);
    /* A zone after the fields, as fugit reads it, is the schedule's. */
    cr_assert_str_eq(p[2].tz, "Europe/Berlin");
    cr_assert_str_eq(p[2].cron, "0 9 * * mon#1 Europe/Berlin");

    static const struct { const char *yaml; int line; const char *rest; } bad[] = {
        { "periodic:\n  a:\n    class: A\n    cron: \"* * *\"\n", 4,
          "periodic.a: cron: \"* * *\": expected five fields (minute hour day month weekday) or six "
          "(seconds first), then a zone if any" },
        { "periodic:\n  a:\n    class: A\n    cron: \"0 9 * * * Europe/Berlin\"\n    tz: UTC\n", 5,
          "periodic.a: tz: UTC differs from the zone cron: names (Europe/Berlin)" },
        { "periodic:\n  a:\n    class: A\n", 2, "periodic.a: cron: must be given" },
        { "periodic:\n  a: {cron: \"@daily\", class: A, missed: some}\n", 2,
          "periodic.a.missed: must be skip, last or all" },
        { "periodic:\n  a: {cron: \"@daily\", class: A, quue: q}\n", 2,
          "periodic.a.quue: unknown key (cron, tz, class, queue, args, retry, missed, tags, backtrace, "
          "dead, retry_for, retry_queue)" },
        { "periodic:\n  a: {cron: \"@daily\", class: A, args: 7}\n", 2, "periodic.a.args: must be a list" },
        { "periodic:\n  a: {cron: \"0 0 30 2 *\", class: A}\n", 2,
          "periodic.a: cron: \"0 0 30 2 *\" never fires" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        fresh();
        cr_assert_eq(load(bad[i].yaml), CAPSTAN_ECONFIG, "%s", bad[i].yaml);
        assert_err(bad[i].line, bad[i].rest);
    }
    /* A zone after the fields that does not exist: the cron: line says so. */
    fresh();
    cr_assert_eq(load("periodic:\n  a:\n    class: A\n    cron: \"0 9 * * * Nowhere/Special\"\n"),
                 CAPSTAN_ECONFIG);
    cr_assert(strstr(err, ":4: periodic.a: cron: unknown time zone Nowhere/Special"), "%s", err);
}

/* A zone directory for $TZDIR holding Bad/Cut: Europe/Berlin without its
 * last byte (the newline closing its footer), as a short write leaves a
 * file. Returns the directory (the caller frees it). */
static char *tzdir_with_a_cut_file(void)
{
    char *dir = strdup("/tmp/capstan-test-tzdir-XXXXXX"), sub[512], file[512];
    cr_assert(dir && mkdtemp(dir));
    snprintf(sub, sizeof(sub), "%s/Bad", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    snprintf(file, sizeof(file), "%s/Cut", sub);
    FILE *in = fopen("/usr/share/zoneinfo/Europe/Berlin", "rb"), *out = fopen(file, "wb");
    cr_assert(in && out);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf), in);
    cr_assert(n > 1 && buf[n - 1] == '\n');
    cr_assert_eq(fwrite(buf, 1, n - 1, out), n - 1);
    fclose(in);
    fclose(out);
    return dir;
}

static void tzdir_free(char *dir)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/Bad/Cut", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/Bad", dir);
    rmdir(p);
    rmdir(dir);
    free(dir);
}

/* A NUL in cron: or tz: (it cut the value short), an empty tz: (it read
 * as UTC) and a corrupt zone file (taken for a missing one, or read in
 * part) stop the load at their line. */
Test(config, periodic_zone_refuses_nul_empty_and_corrupt)
{
    char *dir = tzdir_with_a_cut_file();
    setenv("TZDIR", dir, 1);
    char cut[600];
    snprintf(cut, sizeof(cut), "periodic.a: tz: time zone Bad/Cut: %s/Bad/Cut is corrupt (not a whole "
                               "TZif file)", dir);
    const struct { const char *yaml; int line; const char *rest; } bad[] = {
        { "periodic:\n  a:\n    class: A\n    cron: \"0 9 * * *\\0 junk\"\n", 4,
          "periodic.a.cron: must not hold a NUL byte (\"\\0\")" },
        { "periodic:\n  a:\n    class: A\n    cron: \"0 9 * * *\"\n    tz: \"UTC\\0junk\"\n", 5,
          "periodic.a.tz: must not hold a NUL byte (\"\\0\")" },
        { "periodic:\n  a:\n    class: A\n    cron: \"0 9 * * *\"\n    tz: \"\"\n", 5,
          "periodic.a: tz: is empty (leave it out for UTC)" },
        { "periodic:\n  a:\n    class: A\n    cron: \"0 9 * * *\"\n    tz: Bad/Cut\n", 5, cut },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        fresh();
        cr_assert_eq(load(bad[i].yaml), CAPSTAN_ECONFIG, "%s", bad[i].yaml);
        assert_err(bad[i].line, bad[i].rest);
    }
    /* The C call refuses the same. */
    fresh();
    capstan_periodic_opts_t o = CAPSTAN_PERIODIC_OPTS_INIT;
    o.name = "a";
    o.cron = "0 9 * * *";
    o.cls = "A";
    o.tz = "";
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "periodic a: tz: is empty (leave it out for UTC)");
    o.tz = "Bad/Cut";
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, "is corrupt (not a whole TZif file)"), "%s", err);
    cr_assert_eq(cfg->nperiodic, 0);
    unsetenv("TZDIR");
    tzdir_free(dir);
}

/* capstan_periodic_add: the C call checks what the file's reader checks. */
Test(config, periodic_add_from_c)
{
    capstan_periodic_opts_t o = CAPSTAN_PERIODIC_OPTS_INIT;
    o.name = "report";
    o.cron = "*/5 * * * *";
    o.cls = "ReportJob";
    o.args = "[1]";
    o.missed = CAPSTAN_MISSED_ALL;
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), 0, "%s", err);
    cr_assert_eq(cfg->nperiodic, 1);
    cr_assert_str_eq(cfg->periodic[0].origin, "C");
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "periodic report: the name is given twice");
    o.name = "other";
    o.tz = "Nowhere/Special";
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, "periodic other: tz: unknown time zone Nowhere/Special"), "%s", err);
    o.cron = "*/5 * * * * Europe/Berlin";
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "periodic other: tz: Nowhere/Special differs from the zone cron: names "
                          "(Europe/Berlin)");
    o.tz = NULL;
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), 0, "%s", err);
    cr_assert_str_eq(cfg->periodic[1].tz, "Europe/Berlin");
    o.name = "third";
    o.cron = "*/5 * * * *";
    o.args = "{}";
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "periodic third: args: must be a JSON array");
    o.args = NULL;
    o.cron = "* * * * * * *";
    cr_assert_eq(capstan_periodic_add(cfg, &o, err), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, "periodic third: cron:"), "%s", err);
    cr_assert_eq(cfg->nperiodic, 2, "a refused schedule leaves the config as it was");
}

/* shards: names each Redis of a sharded fleet; the first shard's URL is
 * the one every single-URL reader sees, and TLS settings reach the shards
 * that speak TLS. */
Test(config, shards_list_each_redis_with_its_own_queues)
{
    cr_assert_eq(load("queues: [default, reports]\n"
                      "tls:\n  ca_file: /etc/ca.pem\n"
                      "shards:\n"
                      "  - name: a\n    redis_url: redis://10.0.0.1:6379/0\n"
                      "  - name: b-2\n    url: rediss://10.0.0.2:6380/1\n    queues: [reports]\n"),
                 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert_eq(cfg->nshards, 2);
    cr_assert_str_eq(cfg->shards[0].name, "a");
    cr_assert_eq(cfg->shards[0].nqueues, 0);
    cr_assert_str_eq(cfg->shards[1].name, "b-2");
    cr_assert_str_eq(cfg->shards[1].redis_url, "rediss://10.0.0.2:6380/1?ca_file=/etc/ca.pem");
    cr_assert_eq(cfg->shards[1].nqueues, 1);
    cr_assert_str_eq(cfg->shards[1].queues[0], "reports");
    cr_assert_str_eq(cfg->redis_url, "redis://10.0.0.1:6379/0");
    /* Validating again (the runtime does) changes nothing. */
    cr_assert_eq(capstan_config_validate(cfg, err), 0, "%s", err);
    cr_assert_str_eq(cfg->shards[1].redis_url, "rediss://10.0.0.2:6380/1?ca_file=/etc/ca.pem");
}

Test(config, shard_mistakes_name_the_line_and_the_problem)
{
    static const struct { const char *yaml; int line; const char *rest; } bad[] = {
        {"shards:\n  - name: a\n    redis_url: redis://h:1/0\n  - name: a\n    redis_url: redis://h:2/0\n", 4,
         "shards: a is given twice"},
        {"shards:\n  - name: a\n", 2, "shards: a needs a redis_url"},
        {"shards:\n  - name: a b\n    redis_url: redis://h:1/0\n", 2,
         "shards: the name \"a b\" must be letters, digits, _ and - only"},
        {"shards:\n  - name: a\n    redis_url: redis://h:1/0\n    host: h\n", 4,
         "shards.host: unknown key (a shard has name, redis_url and queues)"},
        {"shards: redis://h:1/0\n", 1, "shards: must be a list of shards (name, redis_url, queues)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fresh();
        cr_assert_eq(load(bad[i].yaml), CAPSTAN_ECONFIG, "case %zu: %s", i, err);
        assert_err(bad[i].line, bad[i].rest);
    }
    fresh();
    cr_assert_eq(load("redis_url: redis://h:9/0\nshards:\n  - name: a\n    redis_url: redis://h:1/0\n"), 0,
                 "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "redis_url: not used with shards: (each shard gives its own redis_url)");
    fresh();
    cr_assert_eq(load("tls:\n  verify: none\nshards:\n  - name: a\n    redis_url: redis://h:1/0\n"), 0, "%s", err);
    cr_assert_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG);
    cr_assert(strstr(err, "need a shard whose URL speaks TLS"), "%s", err);
}
