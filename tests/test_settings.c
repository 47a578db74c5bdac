/* Unit tests of the settings table (config/settings.c): the file, the flags,
 * capstan_config_validate and doc/configuration.md agree on every setting,
 * because each reads the same row. No Redis. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/config.h"
#include "config/settings.h"

static char err[CAPSTAN_ERRLEN];

/* Loads yaml into a fresh config; returns load's status. */
static int load(capstan_config_t *cfg, const char *yaml)
{
    char path[] = "/tmp/capstan-settings-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    int rc = capstan_config_load_file(cfg, path, err);
    unlink(path);
    return rc;
}

static int run_flag(capstan_config_t *cfg, const char *flag, const char *value)
{
    char name[64];
    snprintf(name, sizeof(name), "--%s", flag);
    char *argv[] = { "capstan", name, (char *)value, NULL };
    return capstan_config_parse_args(cfg, value ? 3 : 2, argv, err);
}

static int numeric(const capstan__setting_t *s)
{
    return s->type == CAPSTAN__SET_INT || s->type == CAPSTAN__SET_LONG;
}

Test(settings, every_setting_is_in_the_configuration_page_with_its_flag_and_default)
{
    char file[4096];
    snprintf(file, sizeof(file), "%s/doc/configuration.md", getenv("CAPSTAN_SRC"));
    FILE *f = fopen(file, "r");
    cr_assert_not_null(f, "%s", file);
    static char page[1 << 18];
    size_t len = fread(page, 1, sizeof(page) - 1, f);
    fclose(f);
    page[len] = '\0';
    size_t n;
    const capstan__setting_t *rows = capstan__settings(&n);
    for (size_t i = 0; i < n; i++) {
        const capstan__setting_t *s = &rows[i];
        if (!s->key || s->type == CAPSTAN__SET_OWN)
            continue;
        char head[128], line[4096];
        snprintf(head, sizeof(head), "\n| `%s`", s->key);
        const char *at = strstr(page, head);
        cr_assert_not_null(at, "%s has no row in doc/configuration.md", s->key);
        const char *end = strchr(at + 1, '\n');
        snprintf(line, sizeof(line), "%.*s", (int)(end - at - 1), at + 1);
        /* | key | flag | default | meaning | */
        char *cells[5] = { 0 }, *save = NULL;
        int nc = 0;
        for (char *c = strtok_r(line, "|", &save); c && nc < 5; c = strtok_r(NULL, "|", &save))
            cells[nc++] = c;
        cr_assert_geq(nc, 4, "%s: its row has %d cells", s->key, nc);
        if (s->flag) {
            char want[64];
            if (s->short_flag)
                snprintf(want, sizeof(want), "`-%c", s->short_flag);
            else
                snprintf(want, sizeof(want), "`--%s`", s->flag);
            cr_expect_not_null(strstr(cells[1], want), "%s: the page's flag is%s, the table's %s", s->key,
                               cells[1], want);
        } else {
            cr_expect_null(strstr(cells[1], "-"), "%s: the page gives a flag (%s) it does not have", s->key,
                           cells[1]);
        }
        if (s->def && *s->def) {
            char shown[512], *o = shown;
            for (const char *c = cells[2]; *c && o < shown + sizeof(shown) - 1; c++)
                if (*c != '`')
                    *o++ = *c;
            *o = '\0';
            const char *d = shown + strspn(shown, " ");
            const char *alt = strstr(d, ", else ");
            int named = !strncmp(d, s->def, strlen(s->def)) ||
                        (alt && !strncmp(alt + 7, s->def, strlen(s->def)));
            cr_expect(named, "%s: the page's default is \"%s\", the table's \"%s\"", s->key, d, s->def);
        }
    }
}

Test(settings, a_flag_and_the_file_take_and_refuse_the_same_numbers)
{
    size_t n;
    const capstan__setting_t *rows = capstan__settings(&n);
    for (size_t i = 0; i < n; i++) {
        const capstan__setting_t *s = &rows[i];
        if (!s->key || !numeric(s))
            continue;
        char yaml[256], low[64], high[64], file_err[CAPSTAN_ERRLEN];
        snprintf(low, sizeof(low), "%.0f", s->min - 1);
        snprintf(high, sizeof(high), "%.0f", s->max);
        /* Below the least value: both refuse it, with the same words. */
        capstan_config_t *cfg = capstan_config_new();
        snprintf(yaml, sizeof(yaml), "%s: %s\n", s->key, low);
        cr_expect_eq(load(cfg, yaml), CAPSTAN_ECONFIG, "%s: %s accepted in the file", s->key, low);
        snprintf(file_err, sizeof(file_err), "%s", strstr(err, s->key) ? strstr(err, s->key) + strlen(s->key) : err);
        capstan_config_free(cfg);
        if (s->flag) {
            cfg = capstan_config_new();
            cr_expect_eq(run_flag(cfg, s->flag, low), CAPSTAN_ECONFIG, "--%s %s accepted", s->flag, low);
            cr_expect_not_null(strstr(err, file_err), "--%s says \"%s\", the file \"%s\"", s->flag, err, file_err);
            capstan_config_free(cfg);
        }
        /* The greatest value: both take it (a duration in seconds has ten
         * years for its greatest). */
        if (s->opts & CAPSTAN__SET_TEN_YEARS)
            continue;
        cfg = capstan_config_new();
        snprintf(yaml, sizeof(yaml), "%s: %s\n", s->key, high);
        cr_expect_eq(load(cfg, yaml), 0, "%s: %s refused in the file: %s", s->key, high, err);
        capstan_config_free(cfg);
        if (s->flag) {
            cfg = capstan_config_new();
            cr_expect_eq(run_flag(cfg, s->flag, high), 0, "--%s %s refused: %s", s->flag, high, err);
            capstan_config_free(cfg);
        }
    }
}

Test(settings, metrics_port_zero_is_off_in_the_file_and_as_a_flag)
{
    capstan_config_t *cfg = capstan_config_new();
    cr_assert_eq(run_flag(cfg, "metrics-port", "0"), 0, "%s", err);
    cr_assert_eq(cfg->metrics_port, 0);
    cr_assert_eq(load(cfg, "metrics_port: 0\n"), 0, "%s", err);
    cr_assert_eq(cfg->metrics_port, 0);
    capstan_config_free(cfg);
}

/* A program that builds its config in C gets the same bounds as a file:
 * each numeric setting set past its greatest value fails validation,
 * naming the setting. */
Test(settings, validate_refuses_every_number_out_of_bounds_set_from_c)
{
    size_t n;
    const capstan__setting_t *rows = capstan__settings(&n);
    for (size_t i = 0; i < n; i++) {
        const capstan__setting_t *s = &rows[i];
        if (!s->key || !numeric(s) || s->max >= 1e18 || s->max >= 2147483647)
            continue;
        capstan_config_t *cfg = capstan_config_new();
        cr_assert_eq(capstan_config_validate(cfg, err), 0, "defaults: %s", err);
        char *member = (char *)cfg + s->off;
        if (s->type == CAPSTAN__SET_INT)
            *(int *)member = (int)s->max + 1;
        else
            *(long *)member = (long)s->max + 1;
        cr_expect_eq(capstan_config_validate(cfg, err), CAPSTAN_ECONFIG, "%s = %.0f passed validation", s->key,
                     s->max + 1);
        cr_expect_eq(strncmp(err, s->key, strlen(s->key)), 0, "%s: the error names something else: %s", s->key,
                     err);
        capstan_config_free(cfg);
    }
}

Test(settings, a_word_setting_reads_its_words_in_the_file_as_a_flag_and_in_push)
{
    capstan_config_t *cfg = capstan_config_new();
    cr_assert_eq(load(cfg, "timestamps: millis\nsidekiq_metrics: 8\nunknown_class: requeue\n"), 0, "%s", err);
    cr_assert_eq(cfg->timestamps, CAPSTAN_TS_MILLIS);
    cr_assert_eq(cfg->sidekiq_metrics, 2);
    cr_assert_eq(cfg->unknown_class, CAPSTAN_UNKNOWN_REQUEUE);
    cr_assert_eq(cfg->unknown_class_explicit, 1);
    cr_assert_eq(load(cfg, "sidekiq_metrics: all\n"), CAPSTAN_ECONFIG);
    cr_assert_not_null(strstr(err, "sidekiq_metrics: must be off, 7, 8 or both"), "%s", err);
    cr_assert_eq(run_flag(cfg, "timestamps", "iso"), CAPSTAN_ECONFIG);
    cr_assert_str_eq(err, "--timestamps: must be float or millis (got \"iso\")");
    capstan_config_free(cfg);
}
