/* The settings table (config/settings.h) and the one parser, checker and
 * default of each type of row. */
#include "config/settings.h"
#include "config/bounds.h"
#include "support/number.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define OFF(m) offsetof(capstan_config_t, m)
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* A duration past ten years is a typo, and would overflow once turned into
 * milliseconds or a timespec. */
#define MAX_SECONDS (10.0 * 365 * 24 * 3600)
/* A LONG row's "no upper bound": below LONG_MAX, so the double converts back
 * exactly. */
#define NO_MAX 1e18

static const char *const fetch_words[] = { "reliable", "basic", NULL };
static const char *const ts_words[] = { "float", "millis", NULL };
static const char *const log_words[] = { "pretty", "json", NULL };
static const char *const unknown_words[] = { "fail", "requeue", "skip", NULL };
/* 1 the 7.x layout, 2 the 8.x layout, 3 both. */
static const char *const metrics_words[] = { "off", "7", "8", "both", NULL };

#define INT(k, f, s, m, lo, hi, d) \
    { .key = k, .flag = f, .short_flag = s, .type = CAPSTAN__SET_INT, .off = OFF(m), .min = lo, .max = hi, .def = d
#define LONG(k, m, lo, hi, d) \
    { .key = k, .type = CAPSTAN__SET_LONG, .off = OFF(m), .min = lo, .max = hi, .def = d
#define SECONDS(k, m, floor, o, d) \
    { .key = k, .type = CAPSTAN__SET_SECONDS, .off = OFF(m), .min = floor, .opts = o, .def = d
#define WORD(k, f, m, w, d) \
    { .key = k, .flag = f, .type = CAPSTAN__SET_WORD, .off = OFF(m), .words = w, .def = d
#define STRING(k, f, s, m, d) \
    { .key = k, .flag = f, .short_flag = s, .type = CAPSTAN__SET_STRING, .off = OFF(m), .def = d
#define OWN(k, f, s) { .key = k, .flag = f, .short_flag = s, .type = CAPSTAN__SET_OWN

/* A SECONDS row's floor: a period far below it does nothing useful and
 * harms (a housekeeper beating every microsecond floods Redis; a liveness
 * key that lives for microseconds lapses between any two refreshes, so
 * other processes take a live process's jobs). */
static const capstan__setting_t rows[] = {
    /* Flags first, in --help's order. */
    OWN("plugins", "require", 'r'), .arg = "PATH", .help = "load a handler plugin (.so); repeatable" },
    OWN(NULL, "config", 'C'), .arg = "PATH", .help = "YAML config file (sidekiq.yml keys + capstan's own)" },
    INT("concurrency", "concurrency", 'c', concurrency, 1, 1000, "10"),
        .arg = "N", .help = "processor threads (default 10)" },
    INT("processes", "processes", 0, processes, 1, CAPSTAN_MAX_PROCESSES, "1"), .arg = "N",
        .help = "worker processes, forked and watched by a supervisor\n(default 1)" },
    OWN(NULL, "no-supervisor", 0), .help = "run the worker in this process (no supervisor)" },
    { .key = "max_memory", .flag = "max-memory", .type = CAPSTAN__SET_SIZE, .off = OFF(max_memory),
      .arg = "SIZE", .help = "recycle a worker whose RSS exceeds SIZE (e.g. 512MB)" },
    OWN("queues", "queue", 'q'), .arg = "NAME[,W]", .help = "queue to fetch, with optional weight; repeatable" },
    SECONDS("timeout", timeout, 0, 0, "25"), .alias = "shutdown_timeout", .flag = "timeout",
        .short_flag = 't', .arg = "SECONDS", .help = "shutdown grace period (default 25)" },
    SECONDS("startup_timeout", startup_timeout, 0, CAPSTAN__SET_ZERO_OK, "30"),
        .flag = "startup-timeout", .arg = "S",
        .help = "give up (exit 69) when Redis stays unreachable this long\nat start (default 30; 0 = wait forever)" },
    STRING("tag", "tag", 'g', tag, ""), .arg = "TAG", .help = "tag shown in the Web UI" },
    OWN("labels", "label", 0), .arg = "LABEL", .help = "label shown in the Web UI; repeatable" },
    OWN(NULL, "environment", 'e'), .arg = "ENV", .help = "section of the config file to merge" },
    STRING("redis_url", "redis-url", 0, redis_url, "redis://127.0.0.1:6379/0"),
        .opts = CAPSTAN__SET_NONEMPTY, .explicit_off = OFF(redis_url_explicit), .arg = "URL",
        .help = "redis://[user:password@]host:port/db or unix:///path?db=N\n"
                "(default: $REDIS_URL, else redis://127.0.0.1:6379/0);\nrediss:// for TLS" },
    OWN("tls", "tls-ca-file", 0), .arg = "PATH",
        .help = "CA certificates for TLS (default the system's);\n"
                "also --tls-ca-path DIR, --tls-cert PATH, --tls-key PATH,\n"
                "--tls-server-name NAME, --tls-verify none" },
    OWN(NULL, "tls-ca-path", 0), .arg = "DIR" },
    OWN(NULL, "tls-cert", 0), .arg = "PATH" },
    OWN(NULL, "tls-key", 0), .arg = "PATH" },
    OWN(NULL, "tls-server-name", 0), .arg = "NAME" },
    OWN(NULL, "tls-verify", 0), .arg = "none" },
    WORD("fetch", "fetch", fetch, fetch_words, "reliable"), .arg = "MODE",
        .help = "reliable (default) or basic" },
    INT("prefetch", "prefetch", 0, prefetch, 0, 100000, "0"), .arg = "N",
        .help = "jobs fetched ahead at most (default 10 a processor, >= 500)" },
    WORD("timestamps", "timestamps", timestamps, ts_words, "float"), .arg = "FORMAT",
        .help = "float (Sidekiq 6/7, default) or millis (Sidekiq 8)" },
    WORD("log_format", "log-format", log_format, log_words, "pretty"), .arg = "FORMAT",
        .help = "pretty (default) or json" },
    WORD("unknown_class", "unknown-class", unknown_class, unknown_words, "fail"), .arg = "P",
        /* Even "fail", the default, said in a file or a flag outweighs
         * the fleet. */
        .explicit_off = OFF(unknown_class_explicit),
        .help = "a job whose class has no handler: fail (default: NameError,\n"
                "retried), requeue (left in its queue for Ruby) or skip\n(to the dead set, not retried)" },
    STRING("log_file", "log-file", 'L', log_file, NULL), .alias = "logfile", .flag_alias = "logfile",
        .arg = "PATH", .help = "log to PATH (reopened on USR2) instead of stderr" },
    STRING("pidfile", "pidfile", 'P', pidfile, NULL), .arg = "PATH",
        .help = "write the process id to PATH (removed at exit)" },
    INT("metrics_port", "metrics-port", 0, metrics_port, 0, 65535, "0"), .arg = "PORT",
        .help = "serve Prometheus metrics at http://127.0.0.1:PORT/metrics\n(0, the default: off)" },
    STRING("metrics_bind", "metrics-bind", 0, metrics_bind, NULL), .arg = "ADDR",
        .help = "address for --metrics-port (default 127.0.0.1)" },
    { .key = "verbose", .flag = "verbose", .short_flag = 'v', .type = CAPSTAN__SET_FLAG,
      .off = OFF(verbose), .def = "false", .help = "debug logging" },
    OWN(NULL, "help", 'h'), .help = "this help" },

    /* The file's alone. */
    INT("max_retries", NULL, 0, max_retries, 0, INT_MAX, "25") },
    LONG("dead_max_jobs", dead_max_jobs, 1, NO_MAX, "10000") },
    LONG("dead_timeout_in_seconds", dead_timeout, 1, NO_MAX, "15552000"), .opts = CAPSTAN__SET_TEN_YEARS },
    /* Each poll runs a script over retry and schedule; ten a second is
     * finer than any due time needs. */
    SECONDS("poll_interval_average", poll_interval_average, 0.1, CAPSTAN__SET_ZERO_OK, "0") },
    SECONDS("average_scheduled_poll_interval", average_scheduled_poll_interval, 0.1, 0, "5") },
    WORD("sidekiq_metrics", NULL, sidekiq_metrics, metrics_words, "both") },
    /* Each beat costs a few round trips (liveness refresh, the beat, the
     * working-list check) and, with Redis down, a reconnect: two a second
     * is cheap, and fast enough for tests that want crash recovery in
     * seconds. Sidekiq beats every 10 s, capstan every 4: with
     * liveness_ttl and recovery_interval, the chain of timers that puts
     * a dead process's jobs back in their queues within 24 s and never
     * takes a live one's for a stall under 14 s (doc/guarantees.md, "A
     * lost host"). */
    SECONDS("heartbeat_interval", heartbeat_interval, 0.5, 0, "4") },
    SECONDS("max_iteration_runtime", max_iteration_runtime, 0, CAPSTAN__SET_ZERO_OK, "0") },
    SECONDS("recovery_interval", recovery_interval, 0, 0, "4") },
    INT("max_recoveries", NULL, 0, max_recoveries, 1, INT_MAX, "3") },
    /* It must outlast a missed refresh and a slow round trip on a loaded
     * host; under 2 s, scheduling jitter alone would lose it. */
    SECONDS("liveness_ttl", liveness_ttl, 2, 0, "12") },
    SECONDS("reaper_interval", reaper_interval, 0, CAPSTAN__SET_ZERO_OK, "600") },
    LONG("reaper_count", reaper_count, 1, NO_MAX, "1000") },
    SECONDS("reaper_timeout", reaper_timeout, 0, 0, "10") },
    INT("min_replicas_ack", NULL, 0, min_replicas_ack, 0, 100, "0") },
    LONG("min_replicas_timeout", min_replicas_timeout, 1, 600000, "1000") },
};

/* Every string setting is set here, whichever reader gave it. */
int capstan_config_set_str(char **slot, const char *value)
{
    char *copy = NULL;
    if (value && !(copy = strdup(value)))
        return CAPSTAN_ENOMEM;
    free(*slot);
    *slot = copy;
    return 0;
}

const capstan__setting_t *capstan__settings(size_t *n)
{
    *n = NELEM(rows);
    return rows;
}

const capstan__setting_t *capstan__setting_by_key(const char *key)
{
    for (size_t i = 0; i < NELEM(rows); i++)
        if ((rows[i].key && !strcmp(rows[i].key, key)) || (rows[i].alias && !strcmp(rows[i].alias, key)))
            return &rows[i];
    return NULL;
}

int capstan__setting_word(const capstan__setting_t *s, const char *word)
{
    for (int i = 0; s->words && s->words[i]; i++)
        if (word && !strcmp(word, s->words[i]))
            return i;
    return -1;
}

void capstan__setting_want(const capstan__setting_t *s, char *buf, size_t size)
{
    switch (s->type) {
    case CAPSTAN__SET_INT:
    case CAPSTAN__SET_LONG:
        if (s->max >= (s->type == CAPSTAN__SET_INT ? INT_MAX : NO_MAX))
            snprintf(buf, size, "must be an integer >= %.0f", s->min);
        else
            snprintf(buf, size, "must be an integer between %.0f and %.0f", s->min, s->max);
        return;
    case CAPSTAN__SET_SECONDS: {
        int zero_ok = s->opts & CAPSTAN__SET_ZERO_OK;
        if (s->min > 0)
            snprintf(buf, size, zero_ok ? "must be 0 or a number >= %g" : "must be a number >= %g", s->min);
        else
            snprintf(buf, size, "%s", zero_ok ? "must be a number >= 0" : "must be a number greater than 0");
        return;
    }
    case CAPSTAN__SET_WORD: {
        size_t n = 0, used = 0;
        while (s->words[n])
            n++;
        used += (size_t)snprintf(buf, size, "must be ");
        for (size_t i = 0; i < n && used < size; i++)
            used += (size_t)snprintf(buf + used, size - used, "%s%s", s->words[i],
                                     i + 2 < n ? ", " : i + 1 < n ? " or " : "");
        return;
    }
    case CAPSTAN__SET_FLAG:
        snprintf(buf, size, "must be true or false");
        return;
    case CAPSTAN__SET_STRING:
        snprintf(buf, size, "%s", s->opts & CAPSTAN__SET_NONEMPTY ? "must not be empty" : "must be a string");
        return;
    case CAPSTAN__SET_SIZE:
        snprintf(buf, size, "must be a size such as 512MB or 2GB (a bare number counts megabytes)");
        return;
    case CAPSTAN__SET_OWN:
        snprintf(buf, size, "must be what its own reader takes");
        return;
    }
}

int capstan__setting_bool(const char *s, int *out)
{
    static const char *yes[] = { "true", "yes", "on" }, *no[] = { "false", "no", "off" };
    for (size_t i = 0; i < 3; i++)
        if (!strcasecmp(s, yes[i]) || !strcasecmp(s, no[i])) {
            *out = !strcasecmp(s, yes[i]);
            return 0;
        }
    return CAPSTAN_EINVAL;
}

static int seconds_ok(const capstan__setting_t *s, double v)
{
    return v >= 0 && ((s->opts & CAPSTAN__SET_ZERO_OK) || v > 0) && (v == 0 || v >= s->min);
}

/* Whether v passes the ten years every duration is held to. */
static int ten_years_ok(const capstan__setting_t *s, double v)
{
    return !(s->type == CAPSTAN__SET_SECONDS || (s->opts & CAPSTAN__SET_TEN_YEARS)) || v <= MAX_SECONDS;
}

/* The problem of a duration past ten years, after "key: " when key. */
static int too_long(const char *key, char *err)
{
    return capstan_seterr(err, CAPSTAN_ECONFIG, "%s%smust be at most %.0f seconds (ten years)",
                          key ? key : "", key ? ": " : "", MAX_SECONDS);
}

#define AT(cfg, s, type) ((type *)((char *)(cfg) + (s)->off))

int capstan__setting_set(capstan_config_t *cfg, const capstan__setting_t *s, const char *text,
                         char *why)
{
    double d = 0;
    int i = 0;
    long long bytes = 0;
    char want[CAPSTAN_ERRLEN];
    capstan__setting_want(s, want, sizeof(want));
    if (!text && s->type == CAPSTAN__SET_STRING && !(s->opts & CAPSTAN__SET_NONEMPTY))
        return capstan_config_set_str(AT(cfg, s, char *), s->def);
    if (!text && s->type == CAPSTAN__SET_FLAG)
        text = "true";
    if (!text)
        return capstan_seterr(why, CAPSTAN_ECONFIG, "%s", want);
    switch (s->type) {
    case CAPSTAN__SET_INT:
    case CAPSTAN__SET_LONG:
        if (capstan__parse_number(text, 1, s->min, s->max, &d))
            break;
        if (!ten_years_ok(s, d))
            return too_long(NULL, why);
        if (s->type == CAPSTAN__SET_INT)
            *AT(cfg, s, int) = (int)d;
        else
            *AT(cfg, s, long) = (long)d;
        return 0;
    case CAPSTAN__SET_SECONDS:
        if (capstan__parse_number(text, 0, -HUGE_VAL, HUGE_VAL, &d) || !seconds_ok(s, d))
            break;
        if (!ten_years_ok(s, d))
            return too_long(NULL, why);
        *AT(cfg, s, double) = d;
        return 0;
    case CAPSTAN__SET_WORD:
        if ((i = capstan__setting_word(s, text)) < 0)
            break;
        *AT(cfg, s, int) = i;
        return 0;
    case CAPSTAN__SET_FLAG:
        if (capstan__setting_bool(text, &i))
            break;
        *AT(cfg, s, int) = i;
        return 0;
    case CAPSTAN__SET_STRING:
        if ((s->opts & CAPSTAN__SET_NONEMPTY) && !*text)
            break;
        return capstan_config_set_str(AT(cfg, s, char *), text);
    case CAPSTAN__SET_SIZE:
        if (capstan__parse_size(text, &bytes))
            break;
        *AT(cfg, s, long long) = bytes;
        return 0;
    case CAPSTAN__SET_OWN:
        break;
    }
    return capstan_seterr(why, CAPSTAN_ECONFIG, "%s", want);
}

void capstan__setting_given(capstan_config_t *cfg, const capstan__setting_t *s)
{
    if (s->explicit_off)
        *(int *)((char *)cfg + s->explicit_off) = 1;
}

int capstan__setting_check(const capstan_config_t *cfg, const capstan__setting_t *s, char *err)
{
    int ok = 1;
    const capstan_config_t *c = cfg;
    switch (s->type) {
    case CAPSTAN__SET_INT: {
        int v = *AT(c, s, const int);
        ok = v >= s->min && v <= s->max;
        break;
    }
    case CAPSTAN__SET_LONG: {
        long v = *AT(c, s, const long);
        ok = (double)v >= s->min && (double)v <= s->max;
        if (ok && !ten_years_ok(s, (double)v))
            return too_long(s->key, err);
        break;
    }
    case CAPSTAN__SET_SECONDS: {
        double v = *AT(c, s, const double);
        ok = seconds_ok(s, v);
        if (ok && !ten_years_ok(s, v))
            return too_long(s->key, err);
        break;
    }
    case CAPSTAN__SET_WORD: {
        int v = *AT(c, s, const int), n = 0;
        while (s->words[n])
            n++;
        ok = v >= 0 && v < n;
        break;
    }
    case CAPSTAN__SET_STRING: {
        const char *v = *AT(c, s, char *const);
        ok = !(s->opts & CAPSTAN__SET_NONEMPTY) || (v && *v);
        break;
    }
    case CAPSTAN__SET_SIZE:
        ok = *AT(c, s, const long long) >= 0;
        break;
    case CAPSTAN__SET_FLAG:
    case CAPSTAN__SET_OWN:
        break;
    }
    if (ok)
        return 0;
    char want[CAPSTAN_ERRLEN];
    capstan__setting_want(s, want, sizeof(want));
    return capstan_seterr(err, CAPSTAN_ECONFIG, "%s: %s", s->key, want);
}

int capstan__settings_defaults(capstan_config_t *cfg)
{
    char why[CAPSTAN_ERRLEN];
    for (size_t i = 0; i < NELEM(rows); i++)
        if (rows[i].def && capstan__setting_set(cfg, &rows[i], rows[i].def, why) < 0)
            return CAPSTAN_ENOMEM; /* a default is valid: only memory can fail */
    return 0;
}

void capstan__settings_free(capstan_config_t *cfg)
{
    for (size_t i = 0; i < NELEM(rows); i++)
        if (rows[i].type == CAPSTAN__SET_STRING) {
            free(*AT(cfg, &rows[i], char *));
            *AT(cfg, &rows[i], char *) = NULL;
        }
}
