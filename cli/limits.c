/* `capstan limits`: the rate limiters on a Redis (include/capstan/limiter.h). list
 * shows each name with the type and parameters of its limiter:NAME:meta;
 * info NAME adds what it holds now and the wait until its next free slot,
 * computed as lua/limit_acquire.lua would on the server's clock. Read-only:
 * nothing here takes or frees a slot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "capstan/limiter.h"
#include "redis/keys.h"
#include "redis/scan.h"
#include "support/number.h"

#define EXIT_REDIS 69

static const char *usage =
    "Usage: capstan limits [list] [--json] [--redis-url URL | -C FILE [--shard NAME]]\n"
    "       capstan limits info NAME [--json]\n"
    "\n"
    "list shows every rate limiter: its name, type and parameters. info NAME\n"
    "adds its state: the holders of a concurrent limiter and their lease left,\n"
    "the acquisitions in the current window (window, sliding), the tokens left\n"
    "(bucket, leaky, points), and how long until the next free slot.\n"
    "\n"
    "  --json              print JSON\n"
    "  --redis-url URL     default: FILE's, else $REDIS_URL, else\n"
    "                      redis://127.0.0.1:6379/0\n"
    "  -C, --config FILE   read redis_url, or the shards: list, from FILE (-e ENV:\n"
    "                      its section); with shards, each shard's: a class's\n"
    "                      limiter in its home shard (JSON: an object by shard;\n"
    "                      a shard that cannot be read has {\"error\": ...}, is\n"
    "                      named on stderr, and the exit status is 69)\n"
    "  --shard NAME        with FILE's shards: list, that shard alone\n"
    "  -h, --help          this help\n";

/* The limiter named name as its meta records it ("concurrent size=N" or
 * "TYPE count=N interval_ms=M"), or NULL when there is none; err says why
 * when Redis failed (rc). */
static json_t *read_meta(capstan_redis_t *r, const char *name, int *rc, char *err)
{
    redisReply *rep = capstan_redis_cmdf(r, "GET %s%s:meta", CAPSTAN_KEY_LIMITER, name);
    *rc = 0;
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, CAPSTAN_ERRLEN, "%s", rep ? rep->str : capstan_redis_error(r));
        *rc = CAPSTAN_EREDIS;
        freeReplyObject(rep);
        return NULL;
    }
    json_t *o = NULL;
    char type[16];
    long count = 0;
    long long ms = 0;
    if (rep->type == REDIS_REPLY_STRING) {
        capstan_limit_type_t t;
        if (sscanf(rep->str, "concurrent size=%ld", &count) == 1)
            o = json_pack("{s:s, s:s, s:I}", "name", name, "type", "concurrent", "size",
                          (json_int_t)count);
        else if (sscanf(rep->str, "%15s count=%ld interval_ms=%lld", type, &count, &ms) == 3
                 && capstan_limit_type_parse(type, &t) == 0)
            o = json_pack("{s:s, s:s, s:I, s:f}", "name", name, "type", type, "count",
                          (json_int_t)count, "interval", (double)ms / 1000);
        else
            o = json_pack("{s:s, s:s, s:s}", "name", name, "type", "unknown", "meta", rep->str);
    }
    freeReplyObject(rep);
    return o;
}

/* The reply to argv, or NULL with err filled. */
static redisReply *run(capstan_redis_t *r, int argc, const char **argv, char *err)
{
    redisReply *rep = capstan_redis_cmd(r, argc, argv, NULL);
    if (!rep || rep->type == REDIS_REPLY_ERROR) {
        snprintf(err, CAPSTAN_ERRLEN, "%s", rep ? rep->str : capstan_redis_error(r));
        freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

static long long num(const redisReply *e)
{
    return !e ? 0 : e->type == REDIS_REPLY_STRING ? atoll(e->str)
           : e->type == REDIS_REPLY_INTEGER ? e->integer : 0;
}

/* Adds the limiter's state to o (from read_meta): holders (concurrent),
 * used (concurrent, window, sliding), left (slots or tokens) and
 * wait_seconds until the next is free (0: one is free now). Returns 0 or
 * CAPSTAN_EREDIS. */
static int add_state(capstan_redis_t *r, json_t *o, char *err)
{
    const char *name = json_string_value(json_object_get(o, "name"));
    const char *type = json_string_value(json_object_get(o, "type"));
    json_t *n = json_object_get(o, strcmp(type, "concurrent") == 0 ? "size" : "count");
    if (!n)
        return 0; /* an unknown meta: nothing to read */
    long long size = json_integer_value(n);
    long long ms = (long long)(json_real_value(json_object_get(o, "interval")) * 1000 + 0.5);
    redisReply *t = run(r, 1, (const char *[]){ "TIME" }, err);
    if (!t)
        return CAPSTAN_EREDIS;
    long long now = t->elements == 2 ? num(t->element[0]) * 1000 + num(t->element[1]) / 1000 : 0;
    freeReplyObject(t);
    char key[CAPSTAN_LIMIT_NAME_MAX + 64], lo[32];
    long long used = 0, left = 0, wait = 0;
    if (strcmp(type, "concurrent") == 0 || strcmp(type, "sliding") == 0) {
        int conc = type[0] == 'c';
        snprintf(key, sizeof(key), "%s%s:%s", CAPSTAN_KEY_LIMITER, name, conc ? "held" : "sliding");
        snprintf(lo, sizeof(lo), "(%lld", conc ? now : now - ms);
        redisReply *z = run(r, 5, (const char *[]){ "ZRANGEBYSCORE", key, lo, "+inf", "WITHSCORES" },
                            err);
        if (!z)
            return CAPSTAN_EREDIS;
        used = (long long)z->elements / 2;
        if (conc) {
            json_t *holders = json_array();
            for (size_t i = 0; i + 1 < z->elements; i += 2)
                json_array_append_new(holders, json_pack("{s:s, s:f}", "id", z->element[i]->str,
                                                         "lease_left",
                                                         (double)(num(z->element[i + 1]) - now) / 1000));
            json_object_set_new(o, "holders", holders);
        }
        /* The first entry frees the next slot: its lease end, or its
         * time plus the interval. */
        if (used >= size && z->elements >= 2)
            wait = num(z->element[1]) + (conc ? 0 : ms) - now;
        freeReplyObject(z);
        left = size - used;
    } else if (strcmp(type, "window") == 0) {
        long long start = now - now % ms;
        snprintf(key, sizeof(key), "%s%s:w:%lld", CAPSTAN_KEY_LIMITER, name, start);
        redisReply *g = run(r, 2, (const char *[]){ "GET", key }, err);
        if (!g)
            return CAPSTAN_EREDIS;
        used = num(g);
        freeReplyObject(g);
        left = size - used;
        if (left <= 0)
            wait = start + ms - now;
    } else {
        int bucket = strcmp(type, "bucket") == 0;
        snprintf(key, sizeof(key), "%s%s:%s", CAPSTAN_KEY_LIMITER, name, type);
        redisReply *h = run(r, 4, (const char *[]){ "HMGET", key, bucket ? "tokens" : "level",
                                                    bucket ? "refill_at" : "at" }, err);
        if (!h)
            return CAPSTAN_EREDIS;
        int fresh = h->elements != 2 || h->element[0]->type != REDIS_REPLY_STRING;
        if (bucket) {
            long long refill = fresh ? 0 : num(h->element[1]);
            left = fresh || now >= refill ? size : num(h->element[0]);
            if (left < 1)
                wait = refill - now;
        } else {
            /* The level drains at size per interval (limit_acquire.lua). */
            double level = fresh ? 0 : atof(h->element[0]->str);
            long long at = fresh ? now : num(h->element[1]);
            level -= (double)(now - at) * (double)size / (double)ms;
            if (level < 0)
                level = 0;
            left = (long long)capstan__floor((double)size - level);
            if (level + 1 > (double)size)
                wait = (long long)capstan__ceil((level + 1 - (double)size) * (double)ms / (double)size);
        }
        freeReplyObject(h);
    }
    if (strcmp(type, "concurrent") == 0 || strcmp(type, "window") == 0
        || strcmp(type, "sliding") == 0)
        json_object_set_new(o, "used", json_integer(used));
    json_object_set_new(o, "left", json_integer(left > 0 ? left : 0));
    json_object_set_new(o, "wait_seconds", json_real(wait > 0 ? (double)wait / 1000 : 0));
    return 0;
}

/* "concurrent size=5" or "window count=10 interval=1s", for the text form. */
static void print_params(const json_t *o)
{
    const char *type = json_string_value(json_object_get(o, "type"));
    if (json_object_get(o, "size"))
        printf("%s\tsize=%lld", type, (long long)json_integer_value(json_object_get(o, "size")));
    else if (json_object_get(o, "count"))
        printf("%s\tcount=%lld\tinterval=%gs", type,
               (long long)json_integer_value(json_object_get(o, "count")),
               json_real_value(json_object_get(o, "interval")));
    else
        printf("%s\tmeta=%s", type, json_string_value(json_object_get(o, "meta")));
}

static void print_json(json_t *o)
{
    json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    putchar('\n');
}

/* The limiter name with its state, or NULL: none such (*rc 0), or *rc
 * the error with err filled. */
static json_t *read_info(capstan_redis_t *r, const char *name, int *rc, char *err)
{
    json_t *o = read_meta(r, name, rc, err);
    if (!*rc && o && (*rc = add_state(r, o, err))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void print_info(const char *name, json_t *o)
{
    printf("%s\t", name);
    print_params(o);
    if (json_object_get(o, "used"))
        printf("\tused=%lld", (long long)json_integer_value(json_object_get(o, "used")));
    printf("\tleft=%lld\twait=%.3fs\n", (long long)json_integer_value(json_object_get(o, "left")),
           json_real_value(json_object_get(o, "wait_seconds")));
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(o, "holders"), i, h)
        printf("  holder %s\tlease_left=%.3fs\n", json_string_value(json_object_get(h, "id")),
               json_real_value(json_object_get(h, "lease_left")));
}

static int cmd_info(capstan_redis_t *r, const char *name, int as_json)
{
    char err[CAPSTAN_ERRLEN] = "";
    int rc;
    json_t *o = read_info(r, name, &rc, err);
    if (!rc && !o) {
        fprintf(stderr, "capstan limits info: no limiter named %s\n", name);
        return 1;
    }
    if (rc) {
        fprintf(stderr, "capstan limits info: %s\n", err);
        return EXIT_REDIS;
    }
    if (as_json)
        print_json(o);
    else
        print_info(name, o);
    json_decref(o);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every limiter of r, sorted by name, or NULL with err filled. */
static json_t *read_list(capstan_redis_t *r, char *err)
{
    json_t *names = json_object(); /* a set: SCAN may return a key twice */
    capstan_scan_t s;
    const redisReply *page;
    int rc;
    size_t pre = strlen(CAPSTAN_KEY_LIMITER), suf = strlen(":meta");
    capstan__scan_init(&s, r, NULL, CAPSTAN_KEY_LIMITER "*:meta", 1000);
    while ((rc = capstan__scan_next(&s, &page, err)) > 0)
        for (size_t i = 0; i < page->elements; i++) {
            const char *k = page->element[i]->str;
            size_t len = strlen(k);
            if (len > pre + suf) {
                char *name = strndup(k + pre, len - pre - suf);
                json_object_set_new(names, name, json_true());
                free(name);
            }
        }
    capstan__scan_close(&s);
    size_t n = json_object_size(names), i = 0;
    const char **sorted = calloc(n ? n : 1, sizeof(*sorted));
    const char *name;
    json_t *v;
    json_object_foreach(names, name, v)
        sorted[i++] = name;
    qsort(sorted, n, sizeof(*sorted), by_name);
    json_t *out = json_array();
    for (i = 0; !rc && i < n; i++) {
        json_t *o = read_meta(r, sorted[i], &rc, err);
        if (o)
            json_array_append_new(out, o); /* NULL: deleted since the scan */
    }
    free(sorted);
    json_decref(names);
    if (rc) {
        json_decref(out);
        return NULL;
    }
    return out;
}

static void print_list(json_t *out)
{
    size_t i;
    json_t *v;
    json_array_foreach(out, i, v) {
        printf("%s\t", json_string_value(json_object_get(v, "name")));
        print_params(v);
        putchar('\n');
    }
}

static int cmd_list(capstan_redis_t *r, int as_json)
{
    char err[CAPSTAN_ERRLEN] = "";
    json_t *out = read_list(r, err);
    if (!out)
        fprintf(stderr, "capstan limits list: %s\n", err);
    else if (as_json)
        print_json(out);
    else
        print_list(out);
    json_decref(out);
    return out ? 0 : EXIT_REDIS;
}

/* With shards, each shard's: a class's limiter has its state in its home
 * shard, a queue's caps in each. Text: a section a shard; JSON: an object from
 * each shard's name to what one Redis gives (info: null where there is no
 * such limiter), or {"error": ...}. A shard that cannot be read is named
 * on stderr, the others shown, and the status is EXIT_REDIS; a limiter
 * in no shard is 1. */
static int every_shard(const capstan_cli_fleet_t *f, const char *info, int as_json)
{
    json_t *all = json_object();
    int status = 0, found = 0;
    for (size_t i = 0; i < f->nshards; i++) {
        char err[CAPSTAN_ERRLEN] = "";
        int failed = EXIT_REDIS, rc = 0;
        capstan_redis_t *r = capstan__cli_connect_err(f->shards[i].redis_url, &failed, err);
        json_t *o = !r ? NULL : info ? read_info(r, info, &rc, err) : read_list(r, err);
        if (!r || rc || (!info && !o)) {
            fprintf(stderr, "capstan limits: shard %s: %s\n", f->shards[i].name, err);
            status = r ? EXIT_REDIS : failed;
            o = json_pack("{s:s}", "error", err);
        }
        capstan_redis_free(r);
        found += o && !json_object_get(o, "error");
        if (!as_json) {
            printf("%sShard %s\n", i ? "\n" : "", f->shards[i].name);
            if (json_object_get(o, "error"))
                printf("UNREACHABLE: %s\n", json_string_value(json_object_get(o, "error")));
            else if (!info)
                print_list(o);
            else if (o)
                print_info(info, o);
            else
                printf("(no limiter named %s)\n", info);
        }
        json_object_set_new(all, f->shards[i].name, o ? o : json_null());
    }
    if (as_json)
        print_json(all);
    json_decref(all);
    return status ? status : info && !found; /* 1: no such limiter, as on one Redis */
}

int capstan__cmd_limits(int argc, char **argv)
{
    capstan_cli_fleet_t f = {0};
    int as_json = 0, done = capstan__cli_fleet_options("capstan limits", usage, argc, argv, &f, &as_json);
    if (done >= 0)
        return done;
    int nops = argc - optind;
    char **ops = argv + optind;
    int list = nops == 0 || (nops == 1 && strcmp(ops[0], "list") == 0);
    int info = nops == 2 && strcmp(ops[0], "info") == 0;
    if (!list && !info) {
        fprintf(stderr, "capstan limits: expected list or info NAME\n\n%s", usage);
        return CAPSTAN_EXIT_USAGE;
    }
    int failed = capstan__cli_fleet_load("capstan limits", &f);
    capstan_redis_t *r = NULL;
    if (failed < 0 && f.nshards > 1) {
        failed = every_shard(&f, info ? ops[1] : NULL, as_json);
    } else if (failed < 0) {
        failed = EXIT_REDIS;
        r = capstan__cli_connect("capstan limits", f.nshards ? f.shards[0].redis_url : f.url, &failed);
    }
    int status = !r ? failed : list ? cmd_list(r, as_json) : cmd_info(r, ops[1], as_json);
    capstan_redis_free(r);
    capstan__cli_fleet_free(&f);
    return status;
}
