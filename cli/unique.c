/* `capstan locks`: what sidekiq-unique-jobs v9's web UI and CLI show and do,
 * from the shell and on v9's own keys, so it works the same on locks Ruby
 * took: list, info, delete, the metrics table, a reaper run and the v8 -> v9
 * migration. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "support/number.h"
#include "support/time.h"
#include "capstan/redis.h"
#include "unique/admin.h"
#include "unique/admin_internal.h"
#include "redis/keys.h"
#include "redis/scan.h"

static const char *usage =
    "Usage: capstan locks COMMAND [options]\n"
    "\n"
    "Uniqueness locks (sidekiq-unique-jobs v9 keys, whoever took them):\n"
    "  list [PATTERN] [--json] [--limit N]\n"
    "                  digests matching PATTERN (glob, default *): type, holder\n"
    "                  jids, TTL and age; at most N (default 1000)\n"
    "  info DIGEST [--json]\n"
    "                  one lock and its runtime lock (DIGEST:RUN), with metadata\n"
    "  delete DIGEST   remove the lock, every holder, and its runtime lock\n"
    "  metrics [--json] [--minutes N]\n"
    "                  acquired, denied, released and failures per lock type over\n"
    "                  the last N minutes (default 60)\n"
    "  reap [--count N] [--timeout S] [--grace S] [--force] [--json]\n"
    "                  run the reaper once and print the digests it removed;\n"
    "                  --force runs even while another reaper runs\n"
    "  upgrade         migrate sidekiq-unique-jobs v8 keys to v9 (once)\n"
    "\n"
    "Every command takes --redis-url URL (default $REDIS_URL) and --help, or\n"
    "-C FILE (-e ENV) for FILE's redis_url or shards: list. With shards, info and\n"
    "delete look in the digest's shard, the rendezvous pick among the shards\n"
    "without a queues: list as pushes are routed (a job of a queue with a home\n"
    "shard has its lock there: give --shard NAME); list, metrics, reap and\n"
    "upgrade need --shard NAME (without it, exit 64).\n"
    "Exit status: 0 done, 1 failure or no such lock, 3 another reaper is running,\n"
    "64 bad usage or a malformed digest.\n";

typedef struct args {
    capstan_cli_fleet_t f; /* --redis-url, -C, -e, --shard */
    int json, force;
    long limit, count, minutes;
    double timeout, grace;
    const char *pos; /* the one positional argument */
} args_t;

/* Parses sub's options; returns -1 to go on, else an exit status. */
static int parse(const char *sub, int argc, char **argv, args_t *a, int want_pos)
{
    static const struct option longopts[] = {
        { "json", no_argument, NULL, 'j' },        { "redis-url", required_argument, NULL, 'u' },
        { "help", no_argument, NULL, 'h' },        { "limit", required_argument, NULL, 'l' },
        { "count", required_argument, NULL, 'c' }, { "timeout", required_argument, NULL, 't' },
        { "grace", required_argument, NULL, 'g' }, { "minutes", required_argument, NULL, 'm' },
        { "force", no_argument, NULL, 'f' },       { "config", required_argument, NULL, 'C' },
        { "environment", required_argument, NULL, 'e' }, { "shard", required_argument, NULL, 's' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "hC:e:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': a->f.conf = optarg; break;
        case 'e': a->f.env = optarg; break;
        case 's': a->f.shard = optarg; break;
        case 'j': a->json = 1; break;
        case 'f': a->force = 1; break;
        case 'u': a->f.url = optarg; break;
        case 'h': fputs(usage, stdout); return 0;
        case 'l': case 'c': case 'm': {
            double v;
            if (capstan__parse_number(optarg, 1, 1, 1e15, &v)) {
                fprintf(stderr, "capstan locks %s: %s: must be an integer >= 1\n", sub, argv[optind - 1]);
                return CAPSTAN_EXIT_USAGE;
            }
            *(opt == 'l' ? &a->limit : opt == 'c' ? &a->count : &a->minutes) = (long)v;
            break;
        }
        case 't': case 'g': {
            double v;
            if (capstan__parse_number(optarg, 0, 0, 1e9, &v)) {
                fprintf(stderr, "capstan locks %s: %s: must be a number of seconds >= 0\n", sub,
                        argv[optind - 1]);
                return CAPSTAN_EXIT_USAGE;
            }
            *(opt == 't' ? &a->timeout : &a->grace) = v;
            break;
        }
        default:
            fprintf(stderr, "capstan locks %s: %s: unknown option or missing value\n\n%s", sub,
                    argv[optind - 1], usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    int npos = argc - optind;
    if (npos > 1 || (npos == 1 && !want_pos)) {
        fprintf(stderr, "capstan locks %s: unexpected argument \"%s\"\n", sub,
                argv[optind + (npos > 1 ? 1 : 0)]);
        return CAPSTAN_EXIT_USAGE;
    }
    if (npos == 1)
        a->pos = argv[optind];
    return -1;
}

static void print_json(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s)
        printf("%s\n", s);
    free(s);
}

/* What a lock hash holds: {"key", "ttl" (s or null), "holders": {jid: meta}}
 * with meta the parsed JSON (or v8's time string), or NULL when there is no
 * such hash. *type and *locked_at come from the first holder's metadata. */
static json_t *lock_json(capstan_redis_t *r, const char *key, const char **type, double *locked_at)
{
    redisReply *h = capstan_redis_cmdf(r, "HGETALL %s", key);
    redisReply *t = capstan_redis_cmdf(r, "PTTL %s", key);
    json_t *o = NULL;
    if (h && h->type == REDIS_REPLY_ARRAY && h->elements >= 2) {
        o = json_object();
        json_t *holders = json_object();
        json_object_set_new(o, "key", json_string(key));
        json_object_set_new(o, "ttl", t && t->type == REDIS_REPLY_INTEGER && t->integer >= 0
                                          ? json_real((double)t->integer / 1000.0)
                                          : json_null());
        for (size_t k = 0; k + 1 < h->elements; k += 2) {
            json_t *meta = json_loads(h->element[k + 1]->str, JSON_DECODE_ANY, NULL);
            if (!meta)
                meta = json_string(h->element[k + 1]->str);
            if (type && !*type && json_is_string(json_object_get(meta, "type")))
                *type = json_string_value(json_object_get(meta, "type"));
            if (locked_at && *locked_at == 0 && json_is_number(json_object_get(meta, "time")))
                *locked_at = json_number_value(json_object_get(meta, "time"));
            else if (locked_at && *locked_at == 0 && json_is_number(meta))
                *locked_at = json_number_value(meta); /* v8: the value is the time */
            json_object_set_new(holders, h->element[k]->str, meta);
        }
        json_object_set_new(o, "holders", holders);
    }
    freeReplyObject(h);
    freeReplyObject(t);
    return o;
}

/* One row of `list`: digest, type, holders, ttl, age. */
static json_t *row_json(capstan_redis_t *r, const char *digest, double score)
{
    char key[1100];
    const char *type = NULL;
    double at = 0, now = capstan__now();
    capstan__key(key, sizeof(key), digest, CAPSTAN_KEY_LOCKED);
    json_t *lock = lock_json(r, key, &type, &at);
    json_t *o = json_object();
    json_object_set_new(o, "digest", json_string(digest));
    json_object_set_new(o, "type", type ? json_string(type) : json_null());
    json_t *jids = json_array();
    const char *jid;
    json_t *v;
    json_object_foreach(json_object_get(lock, "holders"), jid, v)
        json_array_append_new(jids, json_string(jid));
    json_object_set_new(o, "holders", jids);
    json_object_set(o, "ttl", lock ? json_object_get(lock, "ttl") : json_null());
    /* The metadata's time, else the index score, unless that is v9's
     * until_expired score (time + ttl in ms), which lies in the future. */
    if (at <= 0 && score <= now)
        at = score;
    json_object_set_new(o, "age", at > 0 ? json_real(now - at) : json_null());
    json_object_set_new(o, "locked", json_boolean(lock != NULL));
    json_decref(lock);
    return o;
}

static void fmt_secs(char *out, size_t n, json_t *v, const char *none)
{
    if (!json_is_number(v)) {
        snprintf(out, n, "%s", none);
        return;
    }
    double s = json_number_value(v);
    if (s >= 86400)
        snprintf(out, n, "%.1fd", s / 86400);
    else if (s >= 3600)
        snprintf(out, n, "%.1fh", s / 3600);
    else
        snprintf(out, n, "%.0fs", s);
}

static int cmd_list(capstan_redis_t *r, const args_t *a)
{
    const char *pattern = a->pos ? a->pos : "*";
    long limit = a->limit > 0 ? a->limit : 1000;
    json_t *rows = json_array();
    const redisReply *items;
    char err[CAPSTAN_ERRLEN];
    capstan_scan_t s;
    int rc = 0, more = 0;
    capstan__scan_init(&s, r, CAPSTAN_UNIQUE_DIGESTS, pattern, 500);
    while ((long)json_array_size(rows) < limit && (more = capstan__scan_next(&s, &items, err)) > 0)
        for (size_t i = 0; i + 1 < items->elements && (long)json_array_size(rows) < limit; i += 2)
            json_array_append_new(rows, row_json(r, items->element[i]->str,
                                                 strtod(items->element[i + 1]->str, NULL)));
    capstan__scan_close(&s);
    if (more < 0) {
        fprintf(stderr, "capstan locks list: %s\n", err);
        rc = 1;
        goto out;
    }

    if (a->json) {
        print_json(rows);
        goto out;
    }
    printf("%-50s %-26s %-8s %-8s %s\n", "DIGEST", "TYPE", "TTL", "AGE", "HOLDERS");
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        char ttl[32], age[32];
        const char *type = json_string_value(json_object_get(row, "type"));
        fmt_secs(ttl, sizeof(ttl), json_object_get(row, "ttl"), "-");
        fmt_secs(age, sizeof(age), json_object_get(row, "age"), "?");
        printf("%-50s %-26s %-8s %-8s ", json_string_value(json_object_get(row, "digest")),
               json_is_true(json_object_get(row, "locked")) ? (type ? type : "?")
                                                            : "(orphan: no LOCKED hash)",
               ttl, age);
        size_t k;
        json_t *jid;
        json_array_foreach(json_object_get(row, "holders"), k, jid)
            printf("%s%s", k ? "," : "", json_string_value(jid));
        printf("\n");
    }
    printf("%zu lock%s\n", json_array_size(rows), json_array_size(rows) == 1 ? "" : "s");
out:
    json_decref(rows);
    return rc;
}

/* The digest argument, checked; prints why not and returns 64 when bad. */
static int digest_arg(const char *sub, const args_t *a, char *out, size_t n)
{
    char err[CAPSTAN_ERRLEN];
    if (!a->pos) {
        fprintf(stderr, "capstan locks %s: missing DIGEST (see capstan locks list)\n", sub);
        return CAPSTAN_EXIT_USAGE;
    }
    if (capstan__unique_digest_parse(a->pos, out, n, err)) {
        fprintf(stderr, "capstan locks %s: %s\n", sub, err);
        return CAPSTAN_EXIT_USAGE;
    }
    return 0;
}

static json_t *index_json(capstan_redis_t *r, const char *member)
{
    redisReply *z = capstan_redis_cmdf(r, "ZSCORE %s %s", CAPSTAN_UNIQUE_DIGESTS, member);
    json_t *v = z && z->type == REDIS_REPLY_STRING ? json_real(strtod(z->str, NULL)) : json_null();
    freeReplyObject(z);
    return v;
}

static int cmd_info(capstan_redis_t *r, const char *digest, const args_t *a)
{
    char key[1100], run[1100], run_key[1100];
    int is_run = capstan__key_base(digest, CAPSTAN_KEY_RUN) > 0;
    capstan__key(key, sizeof(key), digest, CAPSTAN_KEY_LOCKED);
    capstan__key(run, sizeof(run), digest, CAPSTAN_KEY_RUN);
    capstan__key(run_key, sizeof(run_key), run, CAPSTAN_KEY_LOCKED);
    const char *type = NULL;
    double at = 0;
    json_t *o = json_object();
    json_object_set_new(o, "digest", json_string(digest));
    json_object_set_new(o, "score", index_json(r, digest));
    json_t *lock = lock_json(r, key, &type, &at);
    json_object_set_new(o, "lock", lock ? lock : json_null());
    json_t *rlock = NULL;
    if (!is_run) {
        json_object_set_new(o, "run_score", index_json(r, run));
        rlock = lock_json(r, run_key, NULL, NULL);
        json_object_set_new(o, "run_lock", rlock ? rlock : json_null());
    }
    int found = lock || rlock || !json_is_null(json_object_get(o, "score"))
             || !json_is_null(json_object_get(o, "run_score"));
    if (!found) {
        fprintf(stderr, "capstan locks info: no lock with digest %s\n", digest);
        json_decref(o);
        return 1;
    }
    if (a->json) {
        print_json(o);
        json_decref(o);
        return 0;
    }
    printf("digest:  %s\n", digest);
    json_t *score = json_object_get(o, "score");
    if (json_is_number(score))
        printf("indexed: %s score %.6f\n", CAPSTAN_UNIQUE_DIGESTS, json_number_value(score));
    else
        printf("indexed: no\n");
    const char *names[] = { "lock", "run_lock" };
    for (int i = 0; i < (is_run ? 1 : 2); i++) {
        json_t *l = json_object_get(o, names[i]);
        if (!l || json_is_null(l)) {
            printf("%s: none (no %s)\n", i ? "runtime lock" : "lock", i ? run_key : key);
            continue;
        }
        char ttl[32];
        fmt_secs(ttl, sizeof(ttl), json_object_get(l, "ttl"), "none");
        printf("%s: %s  ttl %s\n", i ? "runtime lock" : "lock",
               json_string_value(json_object_get(l, "key")), ttl);
        const char *jid;
        json_t *meta;
        json_object_foreach(json_object_get(l, "holders"), jid, meta) {
            /* 16 digits print a Ruby float time as Ruby wrote it. */
            char *m = json_dumps(meta, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY
                                           | JSON_REAL_PRECISION(16));
            printf("  holder %s  %s\n", jid, m ? m : "?");
            free(m);
        }
    }
    if (type)
        printf("type:    %s\n", type);
    if (at > 0) {
        char age[32];
        json_t *secs = json_real(capstan__now() - at);
        fmt_secs(age, sizeof(age), secs, "?");
        json_decref(secs);
        printf("age:     %s\n", age);
    }
    json_decref(o);
    return 0;
}

static int cmd_delete(capstan_redis_t *r, const char *digest)
{
    char err[CAPSTAN_ERRLEN];
    long n = 0;
    int rc = capstan__unique_lock_delete(r, digest, &n, err);
    if (rc == CAPSTAN_ENOTFOUND) {
        fprintf(stderr, "capstan locks delete: %s\n", err);
        return 1;
    }
    if (rc) {
        fprintf(stderr, "capstan locks delete: %s\n", err);
        return 1;
    }
    printf("deleted %s (%ld keys and index entries)\n", digest, n);
    return 0;
}

static int cmd_metrics(capstan_redis_t *r, const args_t *a)
{
    capstan_unique_metrics_t m;
    char err[CAPSTAN_ERRLEN];
    int minutes = a->minutes > 0 ? (int)(a->minutes > 100000 ? 100000 : a->minutes) : 60;
    if (capstan__unique_metrics_read(r, minutes, &m, err)) {
        fprintf(stderr, "capstan locks metrics: %s\n", err);
        return 1;
    }
    if (a->json) {
        json_t *rows = json_array();
        for (size_t i = 0; i < m.n; i++)
            json_array_append_new(rows, json_pack("{s:s, s:I, s:I, s:I, s:I}", "type",
                                                  m.rows[i].type, "acquired", m.rows[i].acquired,
                                                  "denied", m.rows[i].denied, "released",
                                                  m.rows[i].released, "failures",
                                                  m.rows[i].failures));
        json_t *o = json_pack("{s:i, s:o}", "minutes", minutes, "types", rows);
        print_json(o);
        json_decref(o);
    } else {
        printf("Lock metrics, last %d minutes\n", minutes);
        printf("%-28s %10s %10s %10s %10s\n", "TYPE", "ACQUIRED", "DENIED", "RELEASED", "FAILURES");
        for (size_t i = 0; i < m.n; i++)
            printf("%-28s %10lld %10lld %10lld %10lld\n", m.rows[i].type, m.rows[i].acquired,
                   m.rows[i].denied, m.rows[i].released, m.rows[i].failures);
        if (m.n == 0)
            printf("(no lock events recorded)\n");
    }
    capstan__unique_metrics_clear(&m);
    return 0;
}

static int cmd_reap(capstan_redis_t *r, const args_t *a)
{
    capstan_reap_opts_t o = CAPSTAN_REAP_OPTS_INIT;
    capstan_reap_result_t res;
    char err[CAPSTAN_ERRLEN];
    if (a->count > 0)
        o.count = a->count;
    if (a->timeout > 0)
        o.timeout = a->timeout;
    if (a->grace >= 0)
        o.grace = a->grace;
    o.force = a->force;
    int rc = capstan__unique_reap(r, &o, &res, err);
    int status = 0;
    if (rc) {
        fprintf(stderr, "capstan locks reap: %s\n", err);
        status = 1;
    } else if (res.busy) {
        fprintf(stderr, "capstan locks reap: another reaper is running (%s); --force runs anyway\n",
                res.holder);
        status = CAPSTAN_EXIT_DENIED;
    } else if (a->json) {
        json_t *d = json_array();
        for (size_t i = 0; i < res.ndigests; i++)
            json_array_append_new(d, json_string(res.digests[i]));
        json_t *o2 = json_pack("{s:I, s:I, s:I, s:b, s:b, s:b, s:o}", "examined",
                               (json_int_t)res.examined, "removed", (json_int_t)res.removed,
                               "stale", (json_int_t)res.stale, "wrapped", res.wrapped,
                               "timed_out", res.timed_out, "incomplete", res.incomplete,
                               "digests", d);
        print_json(o2);
        json_decref(o2);
    } else {
        for (size_t i = 0; i < res.ndigests; i++)
            printf("%s\n", res.digests[i]);
        printf("removed %ld orphaned lock%s (%ld without a LOCKED hash) of %ld examined%s%s\n",
               res.removed, res.removed == 1 ? "" : "s", res.stale, res.examined,
               res.timed_out ? "; stopped by the time budget" : "",
               res.incomplete ? "; the job sweep did not finish, locks with holders kept" : "");
    }
    capstan__reap_result_clear(&res);
    return status;
}

static int cmd_upgrade(capstan_redis_t *r)
{
    capstan_upgrade_result_t u;
    char err[CAPSTAN_ERRLEN];
    if (capstan__unique_upgrade(r, &u, err)) {
        fprintf(stderr, "capstan locks upgrade: %s\n", err);
        return 1;
    }
    if (u.already)
        printf("already upgraded (%s has %s)\n", CAPSTAN_UNIQUE_UPGRADED_KEY,
               CAPSTAN_UNIQUE_UPGRADE_VERSION);
    else if (u.legacy)
        printf("skipped: " CAPSTAN_KEY_UNIQUE_V8_DEAD " exists (a pre-v7 layout; v9 skips it too)\n");
    else
        printf("upgraded: %ld locks, %ld v8 keys removed, %ld expiring digests merged, "
               "%ld runtime locks indexed\n", u.locks, u.deleted, u.merged, u.indexed);
    return 0;
}

int capstan__cmd_locks(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")
        || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? CAPSTAN_EXIT_USAGE : 0;
    }
    const char *sub = argv[1];
    static const char *const subs[] = { "list", "info", "delete", "metrics", "reap", "upgrade" };
    int known = 0;
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
        known |= !strcmp(sub, subs[i]);
    if (!known) {
        fprintf(stderr, "capstan locks: unknown command \"%s\"\n\n%s", sub, usage);
        return CAPSTAN_EXIT_USAGE;
    }
    args_t a = { .grace = -1 };
    int want_pos = !strcmp(sub, "list") || !strcmp(sub, "info") || !strcmp(sub, "delete");
    int st = parse(sub, argc - 1, argv + 1, &a, want_pos);
    if (st >= 0)
        return st;
    char digest[600] = "";
    if (!strcmp(sub, "info") || !strcmp(sub, "delete"))
        if ((st = digest_arg(sub, &a, digest, sizeof(digest))))
            return st;
    char who[128];
    snprintf(who, sizeof(who), "capstan locks %s", sub);
    /* With shards, a digest's lock is in the shard its pushes are routed
     * to by it: the pick among the shards without a queues: list (a job of
     * a queue with a home shard has its lock there: --shard names it). */
    const char *url, *shard;
    size_t base = capstan__key_base(digest, CAPSTAN_KEY_RUN);
    char key[600];
    snprintf(key, sizeof(key), "%.*s", (int)(base ? base : strlen(digest)), digest);
    int failed = capstan__cli_fleet_load(who, &a.f);
    if (failed < 0)
        failed = capstan__cli_fleet_one(who, &a.f, *digest ? CAPSTAN_CLI_PICK_OPEN : CAPSTAN_CLI_PICK_NONE, key,
                                        &url, &shard);
    capstan_redis_t *r = NULL;
    if (failed < 0) {
        if (shard) /* a shard that cannot be reached is named */
            snprintf(who, sizeof(who), "capstan locks %s: shard %s", sub, shard);
        failed = 1;
        r = capstan__cli_connect(who, url, &failed);
    }
    if (!r) {
        capstan__cli_fleet_free(&a.f);
        return failed;
    }
    if (!strcmp(sub, "list"))
        st = cmd_list(r, &a);
    else if (!strcmp(sub, "info"))
        st = cmd_info(r, digest, &a);
    else if (!strcmp(sub, "delete"))
        st = cmd_delete(r, digest);
    else if (!strcmp(sub, "metrics"))
        st = cmd_metrics(r, &a);
    else if (!strcmp(sub, "reap"))
        st = cmd_reap(r, &a);
    else
        st = cmd_upgrade(r);
    capstan_redis_free(r);
    capstan__cli_fleet_free(&a.f);
    return st;
}
