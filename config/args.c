/* The flags of `capstan run`, applied over the config file: each is a row
 * of the settings table (config/settings.c), read by the same parser as
 * the file's key. */
#include "capstan/config.h"
#include "redis/url.h"
#include "config/settings.h"
#include "config/tls.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* getopt's table, made from the settings table once: a row's index is its
 * option's value, past the short flags' characters. */
enum { ROW_BASE = 1000, MAX_FLAGS = 64 };

static struct option longopts[MAX_FLAGS + 1];
static char shortopts[2 * MAX_FLAGS + 2];

static void make_options(void)
{
    size_t n, nlong = 0, nshort = 0;
    const capstan__setting_t *rows = capstan__settings(&n);
    if (longopts[0].name)
        return;
    shortopts[nshort++] = '+'; /* stop at the first word that is not a flag */
    for (size_t i = 0; i < n && nlong + 2 <= MAX_FLAGS; i++) {
        const capstan__setting_t *s = &rows[i];
        int has_arg = s->arg ? required_argument : no_argument;
        int val = s->short_flag ? s->short_flag : ROW_BASE + (int)i;
        if (!s->flag)
            continue;
        longopts[nlong++] = (struct option){ s->flag, has_arg, NULL, val };
        if (s->flag_alias)
            longopts[nlong++] = (struct option){ s->flag_alias, has_arg, NULL, val };
        if (s->short_flag) {
            shortopts[nshort++] = s->short_flag;
            if (s->arg)
                shortopts[nshort++] = ':';
        }
    }
}

/* The row of an option getopt returned. */
static const capstan__setting_t *row_of(int opt)
{
    size_t n;
    const capstan__setting_t *rows = capstan__settings(&n);
    if (opt >= ROW_BASE && (size_t)(opt - ROW_BASE) < n)
        return &rows[opt - ROW_BASE];
    for (size_t i = 0; i < n; i++)
        if (rows[i].short_flag && rows[i].short_flag == opt)
            return &rows[i];
    return NULL;
}

static int is_flag(const capstan__setting_t *s, const char *flag)
{
    return s && s->flag && !strcmp(s->flag, flag);
}

const char *capstan_config_usage(void)
{
    static char text[8192];
    size_t n, used = 0;
    const capstan__setting_t *rows = capstan__settings(&n);
    if (text[0])
        return text;
    used += (size_t)snprintf(text, sizeof(text), "Usage: capstan [run] [options]\n\n"
                             "Runs the jobs of Sidekiq-format Redis queues with C handlers.\n\n");
    for (size_t i = 0; i < n && used < sizeof(text); i++) {
        const capstan__setting_t *s = &rows[i];
        char head[64];
        if (!s->flag || !s->help)
            continue;
        snprintf(head, sizeof(head), "%c%c%c --%s%s%s", s->short_flag ? '-' : ' ',
                 s->short_flag ? s->short_flag : ' ', s->short_flag ? ',' : ' ', s->flag,
                 s->arg ? " " : "", s->arg ? s->arg : "");
        used += (size_t)snprintf(text + used, sizeof(text) - used, "  %-24s ", head);
        for (const char *h = s->help; *h && used < sizeof(text); h++) {
            used += (size_t)snprintf(text + used, sizeof(text) - used, "%c", *h);
            if (*h == '\n')
                used += (size_t)snprintf(text + used, sizeof(text) - used, "%27s", "");
        }
        if (used < sizeof(text))
            used += (size_t)snprintf(text + used, sizeof(text) - used, "\n");
    }
    return text;
}

static int push_str(char ***arr, size_t *n, const char *v)
{
    char **p = realloc(*arr, (*n + 1) * sizeof(char *));
    if (!p)
        return CAPSTAN_ENOMEM;
    *arr = p;
    if (!(p[*n] = strdup(v)))
        return CAPSTAN_ENOMEM;
    (*n)++;
    return 0;
}

/* A flag of a row of the settings table, or of a setting with its own
 * reader. */
static int apply(capstan_config_t *cfg, const capstan__setting_t *s, const char *v, char *err)
{
    char why[CAPSTAN_ERRLEN];
    if (s->type != CAPSTAN__SET_OWN) {
        int rc = capstan__setting_set(cfg, s, v, why);
        if (rc == CAPSTAN_ECONFIG)
            return capstan_seterr(err, rc, "--%s: %s (got \"%s\")", s->flag, why, v ? v : "");
        if (rc == 0)
            capstan__setting_given(cfg, s);
        return rc;
    }
    if (is_flag(s, "queue"))
        return capstan_config_add_queue(cfg, v, err);
    if (is_flag(s, "require"))
        return push_str(&cfg->plugins, &cfg->nplugins, v);
    if (is_flag(s, "label"))
        return push_str(&cfg->labels, &cfg->nlabels, v);
    if (is_flag(s, "no-supervisor"))
        return cfg->no_supervisor = 1, 0;
    if (!strncmp(s->flag, "tls-", 4))
        return capstan__config_tls_flag(cfg, s->flag, v, err);
    return 0; /* -C, -e and -h: the first pass's */
}

int capstan_config_parse_args(capstan_config_t *cfg, int argc, char **argv, char *err)
{
    const char *file = NULL;
    int opt, rc = 0;
    make_options();
    /* Pass 1: the file and environment, which the flags then override. */
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (opt == 'C')
            file = optarg;
        else if (opt == 'e' && (rc = capstan_config_set_str(&cfg->environment, optarg)))
            return rc;
        else if (opt == 'h')
            return CAPSTAN_ENOTFOUND;
        else if (opt == '?')
            return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: unknown option or missing value (see --help)",
                                  argv[optind - 1]);
    }
    if (optind < argc) {
        /* A stray URL may hold a password: never echo it. */
        char shown[512];
        capstan__redis_url_redact(argv[optind], shown, sizeof(shown));
        return capstan_seterr(err, CAPSTAN_ECONFIG, "unexpected argument \"%s\" (see --help)", shown);
    }
    /* A -C file that cannot be read is a configuration error (78), said in
     * one line, never mistaken for --help. */
    if (file && (rc = capstan_config_load_file(cfg, file, err)) == CAPSTAN_ENOTFOUND) {
        char reason[CAPSTAN_ERRLEN];
        snprintf(reason, sizeof(reason), "%s", err);
        return capstan_seterr(err, CAPSTAN_ECONFIG, "cannot read the config file %s", reason);
    }
    if (rc)
        return rc;
    /* Pass 2: every flag, in order. Queues given as flags replace the
     * file's (capstan_config_add_queue's first call starts a new list). */
    optind = 1;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        const capstan__setting_t *s = row_of(opt);
        if (s && (rc = apply(cfg, s, optarg, err)))
            return rc;
    }
    capstan_config_apply_env(cfg);
    return 0;
}
