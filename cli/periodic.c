/* `capstan periodic`: the periodic schedules of a config file, each with
 * its last tick (from its record in Redis), its next tick (computed here
 * as a worker computes it) and where it was declared; then the tick
 * records in Redis that no schedule of the file owns (a schedule declared
 * in C by a program, or one removed from the file). Read-only. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "periodic/periodic.h"
#include "redis/keys.h"
#include "redis/scan.h"
#include "support/cron.h"
#include "support/time.h"
#include "support/tz.h"

static const char *usage =
    "Usage: capstan periodic -C FILE [--json]\n"
    "\n"
    "Lists the periodic schedules of FILE's periodic: section: expression, zone,\n"
    "class, queue, missed policy, the last tick enqueued by any process (from\n"
    "Redis), the next tick, and the file and line that declare it. Tick records\n"
    "in Redis that no schedule of FILE owns follow, with their last tick.\n"
    "Times are in each schedule's zone, with its offset; --json gives them as\n"
    "epoch seconds.\n"
    "\n"
    "With FILE's shards: list, the last tick is the latest any shard records,\n"
    "and a record no schedule owns is listed once; a shard that cannot be\n"
    "reached is named on stderr, the others read.\n"
    "\n"
    "  -C, --config FILE   the capstan.yml to read\n"
    "  -e, --environment ENV  the environment whose section applies\n"
    "      --json          print JSON\n"
    "      --redis-url URL default: the file's, else $REDIS_URL, else\n"
    "                      redis://127.0.0.1:6379/0 (not with a shards: list)\n"
    "      --shard NAME    with FILE's shards: list, read that shard alone\n"
    "  -h, --help          this help\n";

/* t (UTC epoch) as ISO 8601 in zone tz with its offset, or "-". */
static void format_time(char *out, size_t n, int64_t t, const capstan_tz_t *tz)
{
    if (t < 0) {
        snprintf(out, n, "-");
        return;
    }
    long off = capstan__tz_offset(tz, t);
    int64_t w = t + off, days = w / 86400 - (w % 86400 < 0), y;
    long sod = (long)(w - days * 86400);
    unsigned m, d;
    capstan__civil_from_days(days, &y, &m, &d);
    long aoff = off < 0 ? -off : off;
    snprintf(out, n, "%04" PRId64 "-%02u-%02uT%02ld:%02ld:%02ld%c%02ld:%02ld", y, m, d, sod / 3600,
             sod / 60 % 60, sod % 60, off < 0 ? '-' : '+', aoff / 3600, aoff / 60 % 60);
}

/* The last tick recorded for key in any of rs[0..n) (a shard's Redis
 * may hold it: whichever ticked last), or -1 (none, or none reachable). */
static int64_t last_tick(capstan_redis_t *const *rs, size_t n, const char *key)
{
    int64_t last = -1;
    for (size_t i = 0; i < n; i++) {
        redisReply *rep = rs[i] ? capstan_redis_cmdf(rs[i], "HGET %s last", key) : NULL;
        int64_t v = rep && rep->type == REDIS_REPLY_STRING ? strtoll(rep->str, NULL, 10) : -1;
        freeReplyObject(rep);
        last = v > last ? v : last;
    }
    return last;
}

int capstan__cmd_periodic(int argc, char **argv)
{
    enum { OPT_URL = 256, OPT_JSON, OPT_SHARD };
    static const struct option longopts[] = {
        { "config", required_argument, NULL, 'C' }, { "environment", required_argument, NULL, 'e' },
        { "redis-url", required_argument, NULL, OPT_URL }, { "json", no_argument, NULL, OPT_JSON },
        { "shard", required_argument, NULL, OPT_SHARD },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    const char *url = NULL, *conf = NULL, *env = NULL, *shard = NULL;
    int json = 0, opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "C:e:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': conf = optarg; break;
        case 'e': env = optarg; break;
        case OPT_URL: url = optarg; break;
        case OPT_JSON: json = 1; break;
        case OPT_SHARD: shard = optarg; break;
        case 'h': fputs(usage, stdout); return 0;
        default:
            fprintf(stderr, "capstan periodic: %s: unknown option or missing value\n\n%s",
                    argv[optind - 1], usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    if (!conf || optind < argc) {
        fputs(usage, stderr);
        return CAPSTAN_EXIT_USAGE;
    }
    capstan_cli_fleet_t f = { .url = url, .conf = conf, .env = env, .shard = shard };
    int failed = capstan__cli_fleet_load("capstan periodic", &f);
    if (failed >= 0) {
        capstan__cli_fleet_free(&f);
        return failed;
    }
    const capstan_config_t *cfg = f.cfg;
    char err[CAPSTAN_ERRLEN];
    /* Unreachable, the schedules are shown without their last ticks (with
     * shards, those of the shards reached); a refusal that retrying cannot
     * mend is a failure. */
    failed = 0;
    size_t nr = f.nshards ? f.nshards : 1;
    capstan_redis_t **rs = calloc(nr, sizeof(*rs));
    if (!rs) {
        fprintf(stderr, "capstan periodic: out of memory\n");
        capstan__cli_fleet_free(&f);
        return 1;
    }
    for (size_t i = 0; i < nr; i++) {
        if (!f.nshards) {
            rs[i] = capstan__cli_connect("capstan periodic", f.url, &failed);
            if (!rs[i])
                fprintf(stderr, "capstan periodic: last ticks unknown\n");
        } else if (!(rs[i] = capstan__cli_connect_err(f.shards[i].redis_url, &failed, err))) {
            fprintf(stderr, "capstan periodic: shard %s: %s; its last ticks unknown\n", f.shards[i].name, err);
        }
    }
    json_t *list = json_array();
    if (!json)
        printf("%-20s %-16s %-16s %-16s %-10s %-6s %-25s %-25s %s\n", "NAME", "CRON", "TZ", "CLASS",
               "QUEUE", "MISSED", "LAST TICK", "NEXT TICK", "FROM");
    double now = capstan__now();
    for (size_t i = 0; i < cfg->nperiodic; i++) {
        const struct capstan_periodic_conf *p = &cfg->periodic[i];
        capstan_cron_t c;
        capstan_tz_t *tz = capstan__tz_load(p->tz, err);
        char *key = capstan__key_dup(CAPSTAN_KEY_PERIODIC, p->name), last[40], next[40];
        int64_t nt = tz && !capstan__cron_parse(p->cron, &c, err) ? capstan__cron_next(&c, tz, (int64_t)now) : -1;
        int64_t lt = key ? last_tick(rs, nr, key) : -1;
        format_time(last, sizeof(last), lt, tz);
        format_time(next, sizeof(next), nt, tz);
        if (json)
            json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:o, s:o, s:s}",
                "name", p->name, "cron", p->cron, "tz", p->tz ? p->tz : "UTC", "class", p->cls,
                "queue", p->queue, "missed", capstan_periodic_missed_name(p->missed),
                "last", lt >= 0 ? json_integer(lt) : json_null(),
                "next", nt >= 0 ? json_integer(nt) : json_null(), "from", p->origin));
        else
            printf("%-20s %-16s %-16s %-16s %-10s %-6s %-25s %-25s %s\n", p->name, p->cron,
                   p->tz ? p->tz : "UTC", p->cls, p->queue, capstan_periodic_missed_name(p->missed), last,
                   next, p->origin);
        free(key);
        capstan__tz_free(tz);
    }
    /* Records no schedule of the file owns, each once however many shards
     * hold it. */
    json_t *seen = json_object();
    for (size_t k = 0; k < nr; k++) {
        capstan_redis_t *r = rs[k];
        capstan_scan_t sc;
        const redisReply *page;
        int rc = 0;
        if (r)
            capstan__scan_init(&sc, r, NULL, CAPSTAN_KEY_PERIODIC "*", 1000);
        while (r && (rc = capstan__scan_next(&sc, &page, err)) > 0)
            for (size_t i = 0; i < page->elements; i++) {
                const char *name = page->element[i]->str + strlen(CAPSTAN_KEY_PERIODIC);
                size_t p;
                for (p = 0; p < cfg->nperiodic && strcmp(cfg->periodic[p].name, name); p++)
                    ;
                if (p < cfg->nperiodic || json_object_get(seen, name))
                    continue;
                json_object_set_new(seen, name, json_true());
                char last[40];
                int64_t lt = last_tick(rs, nr, page->element[i]->str);
                format_time(last, sizeof(last), lt, NULL);
                if (json)
                    json_array_append_new(list, json_pack("{s:s, s:o, s:s}", "name", name, "last",
                                                          lt >= 0 ? json_integer(lt) : json_null(),
                                                          "from", "redis"));
                else
                    printf("%-20s %-16s %-16s %-16s %-10s %-6s %-25s %-25s %s\n", name, "?", "?", "?", "?",
                           "?", last, "-", "redis only (declared in C, or no longer in this file)");
            }
        if (r)
            capstan__scan_close(&sc);
        if (rc < 0)
            fprintf(stderr, "capstan periodic: %s\n", err);
    }
    json_decref(seen);
    if (json) {
        char *s = json_dumps(list, JSON_INDENT(2));
        if (s)
            puts(s);
        free(s);
    }
    json_decref(list);
    for (size_t i = 0; i < nr; i++)
        capstan_redis_free(rs[i]);
    free(rs);
    capstan__cli_fleet_free(&f);
    return failed;
}
