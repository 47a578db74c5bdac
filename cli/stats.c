/* `capstan stats [--json]`: what Sidekiq's dashboard shows, from the shell —
 * processed/failed, queue sizes and latency, schedule/retry/dead sizes,
 * processes, and the reliable fetch's working lists with their owners. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "observe/overview.h"
#include "fetch/fetch.h"
#include "redis/keys.h"
#include "support/identity.h"
#include "capstan/capstan.h"
#include "capstan/redis.h"

static const char *usage =
    "Usage: capstan stats [--json] [--redis-url URL | -C FILE [--shard NAME]]\n"
    "\n"
    "Prints processed and failed counts, each queue's size and latency (age of\n"
    "its oldest job) and the jobs capstan processes fetched from it ahead and\n"
    "have not started (in their working lists, not in the size; as of their\n"
    "last heartbeat), and whether it is paused; the schedule/retry/dead sizes,\n"
    "the live processes, and the reliable fetch's working lists with whether\n"
    "their owner is alive. Each\n"
    "process shows whether it is capstan or Ruby Sidekiq, and its queues. An owner\n"
    "on this host whose pid is gone shows as dead at once (recovery still waits\n"
    "for its liveness key to lapse).\n"
    "\n"
    "Exits 1 when a capstan process of this host says in its last beat that\n"
    "Redis answered some of its fetches with an error (an ACL refusal, OOM),\n"
    "naming it on stderr; other hosts' processes are shown, not judged.\n"
    "\n"
    "With -C FILE's shards: list, each shard is shown, then the totals across\n"
    "them (a queue's sizes added, its latency the oldest); --json gives the\n"
    "totals where one Redis's figures are, each process, working list and\n"
    "iterating job with its \"shard\", and \"shards\": each shard's own object,\n"
    "or {\"error\": ...} for one that cannot be read. That one is named on\n"
    "stderr, the others are still shown, and the exit status is 1.\n"
    "\n"
    CAPSTAN_CLI_FLEET_USAGE("that shard alone")
    "      --json              print JSON\n";

/* The pid of identity ("hostname:pid:nonce") when hostname is this
 * machine's and no process has that pid any more, else 0. For display
 * only: pids are reused and containers share hostnames, so recovery never
 * decides on it (it waits for the liveness key to lapse). */
static long gone_pid(const char *identity, const char *host)
{
    const char *nonce = strrchr(identity, ':');
    const char *p = nonce;
    while (p && p > identity && p[-1] != ':')
        p--;
    if (!nonce || p <= identity || (size_t)(p - 1 - identity) != strlen(host)
        || strncmp(identity, host, strlen(host)) != 0)
        return 0;
    char *end;
    long pid = strtol(p, &end, 10);
    if (end != nonce || pid <= 0 || pid > INT_MAX)
        return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH ? pid : 0;
}

/* A count, or null for a field the heartbeat did not have (-1). */
static json_t *opt_integer(long long v)
{
    return v < 0 ? json_null() : json_integer(v);
}

/* Jobs fetched ahead and not started, by queue, as each live capstan
 * process counted them at its last beat: in its working list, so not in
 * Sidekiq's queue size and latency. */
static json_t *prefetched(const capstan_overview_t *ov)
{
    json_t *sum = json_object();
    for (size_t i = 0; i < ov->nprocesses; i++) {
        json_t *mine = ov->processes[i].prefetched ? json_loads(ov->processes[i].prefetched, 0, NULL) : NULL;
        const char *q;
        json_t *v;
        json_object_foreach(mine, q, v)
            json_object_set_new(sum, q, json_integer(json_integer_value(json_object_get(sum, q))
                                                     + json_integer_value(v)));
        json_decref(mine);
    }
    return sum;
}

static json_t *queues_json(const capstan_overview_t *ov, json_t *ahead)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < ov->nqueues; i++) {
        json_t *q = json_object();
        json_object_set_new(q, "name", json_string(ov->queues[i].name));
        json_object_set_new(q, "size", json_integer(ov->queues[i].size));
        json_object_set_new(q, "latency", json_real(ov->queues[i].latency));
        json_object_set_new(q, "prefetched",
                            json_integer(json_integer_value(json_object_get(ahead, ov->queues[i].name))));
        json_object_set_new(q, "paused", json_boolean(ov->queues[i].paused));
        json_array_append_new(arr, q);
    }
    return arr;
}

static json_t *processes_json(const capstan_overview_t *ov, const char *host)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < ov->nprocesses; i++) {
        const capstan_overview_process_t *pr = &ov->processes[i];
        json_t *p = json_object();
        json_t *info = json_loads(pr->info, 0, NULL);
        json_object_set_new(p, "identity", json_string(pr->identity));
        /* A mixed fleet: which processes run capstan and which Ruby. */
        json_object_set_new(p, "runtime", json_string(pr->capstan ? "capstan" : "sidekiq"));
        json_object_set_new(p, "version", pr->version ? json_string(pr->version) : json_null());
        json_t *queues = json_array();
        for (size_t q = 0; q < pr->nqueues; q++)
            json_array_append_new(queues, json_string(pr->queues[q]));
        json_object_set_new(p, "queues", queues);
        json_object_set(p, "concurrency", info ? json_object_get(info, "concurrency") : json_null());
        json_object_set(p, "tag", info ? json_object_get(info, "tag") : json_null());
        json_t *sup = info ? json_object_get(info, "capstan_supervisor") : NULL;
        if (json_is_integer(sup)) {
            json_object_set(p, "supervisor", sup);
            json_object_set(p, "worker", json_object_get(info, "capstan_worker"));
        }
        json_object_set_new(p, "busy", opt_integer(pr->busy));
        json_object_set_new(p, "beat", pr->beat < 0 ? json_null() : json_real(pr->beat));
        json_object_set_new(p, "quiet", pr->quiet < 0 ? json_null() : json_boolean(pr->quiet));
        json_object_set_new(p, "rss", opt_integer(pr->rss));
        json_object_set_new(p, "fetch_errors", opt_integer(pr->fetch_errors));
        json_object_set_new(p, "fetch_error", pr->fetch_error ? json_string(pr->fetch_error) : json_null());
        long gone = gone_pid(pr->identity, host);
        json_object_set_new(p, "alive", json_boolean(!gone));
        if (gone)
            json_object_set_new(p, "pid_gone", json_integer(gone));
        json_decref(info);
        json_array_append_new(arr, p);
    }
    return arr;
}

static json_t *working_json(capstan_redis_t *r, const char *host)
{
    json_t *arr = json_array();
    capstan_working_info_t *w = NULL;
    size_t n = 0;
    char err[CAPSTAN_ERRLEN];
    if (capstan__fetch_list_working(r, &w, &n, err) == 0) {
        for (size_t i = 0; i < n; i++) {
            json_t *o = json_object();
            json_object_set_new(o, "identity", json_string(w[i].identity));
            json_object_set_new(o, "size", json_integer(w[i].length));
            long gone = gone_pid(w[i].identity, host);
            json_object_set_new(o, "alive", json_boolean(w[i].alive && !gone));
            json_object_set_new(o, "liveness_key", json_boolean(w[i].alive));
            if (gone)
                json_object_set_new(o, "pid_gone", json_integer(gone));
            json_array_append_new(arr, o);
        }
    }
    capstan__fetch_working_info_free(w, n);
    return arr;
}

/* The running jobs that iterate (Sidekiq 7.3+'s it-<jid> exists for them),
 * as Sidekiq's Busy page shows them: jid, class, process, executions,
 * cursor, seconds run before this run, and when cancelled. */
static json_t *iterating_json(capstan_redis_t *r, const capstan_overview_t *ov)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < ov->nprocesses; i++) {
        const char *id = ov->processes[i].identity;
        redisReply *work = capstan_redis_cmdf(r, "HVALS %s%s", id, CAPSTAN_KEY_WORK);
        for (size_t k = 0; work && work->type == REDIS_REPLY_ARRAY && k < work->elements; k++) {
            json_t *e = json_loadb(work->element[k]->str, work->element[k]->len, 0, NULL);
            json_t *p = json_object_get(e, "payload");
            json_t *job = json_is_string(p) ? json_loads(json_string_value(p), 0, NULL) : json_incref(p);
            const char *jid = json_string_value(json_object_get(job, "jid"));
            redisReply *st = jid ? capstan_redis_cmdf(r, "HMGET %s%s ex c rt cancelled", CAPSTAN_KEY_ITERATION, jid)
                                 : NULL;
            if (st && st->type == REDIS_REPLY_ARRAY && st->elements == 4 && st->element[0]->type == REDIS_REPLY_STRING) {
                json_t *it = json_object();
                json_object_set_new(it, "jid", json_string(jid));
                json_object_set(it, "class", json_object_get(job, "class"));
                json_object_set_new(it, "process", json_string(id));
                json_object_set_new(it, "executions", json_integer(strtoll(st->element[0]->str, NULL, 10)));
                json_t *c = st->element[1]->type == REDIS_REPLY_STRING
                          ? json_loads(st->element[1]->str, JSON_DECODE_ANY, NULL) : NULL;
                json_object_set_new(it, "cursor", c ? c : json_null());
                json_object_set_new(it, "runtime", json_real(st->element[2]->type == REDIS_REPLY_STRING
                                                                 ? strtod(st->element[2]->str, NULL) : 0));
                json_object_set_new(it, "cancelled", st->element[3]->type == REDIS_REPLY_STRING
                                                         ? json_integer(strtoll(st->element[3]->str, NULL, 10))
                                                         : json_null());
                json_array_append_new(arr, it);
            }
            freeReplyObject(st);
            json_decref(job);
            json_decref(e);
        }
        freeReplyObject(work);
    }
    return arr;
}

/* Everything `capstan stats` shows, or NULL with err filled. */
static json_t *collect(capstan_redis_t *r, char *err)
{
    capstan_overview_t ov;
    if (capstan__overview_read(r, 1, &ov, err)) {
        capstan__overview_clear(&ov);
        return NULL;
    }
    char host[256];
    capstan__hostname(host, sizeof(host));
    json_t *o = json_object();
    json_object_set_new(o, "processed", json_integer(ov.processed));
    json_object_set_new(o, "failed", json_integer(ov.failed));
    json_object_set_new(o, "scheduled", json_integer(ov.scheduled));
    json_object_set_new(o, "retries", json_integer(ov.retries));
    json_object_set_new(o, "dead", json_integer(ov.dead));
    json_t *ahead = prefetched(&ov);
    json_object_set_new(o, "queues", queues_json(&ov, ahead));
    json_decref(ahead);
    json_object_set_new(o, "processes", processes_json(&ov, host));
    json_object_set_new(o, "working", working_json(r, host));
    json_object_set_new(o, "iterating", iterating_json(r, &ov));
    capstan__overview_clear(&ov);
    return o;
}

/* "capstan 0.1.0", "Ruby Sidekiq 7.3.10", or "Ruby Sidekiq" for 6.x,
 * which writes no version. */
static void runtime_name(json_t *p, char *out, size_t n)
{
    const char *v = json_string_value(json_object_get(p, "version"));
    int capstan = strcmp(json_string_value(json_object_get(p, "runtime")), "capstan") == 0;
    snprintf(out, n, "%s%s%s", capstan ? "capstan" : "Ruby Sidekiq", v ? " " : "", v ? v : "");
}

/* "a, b", cut to fit n. */
static void queue_names(json_t *queues, char *out, size_t n)
{
    size_t i, len = 0;
    json_t *q;
    out[0] = '\0';
    json_array_foreach(queues, i, q) {
        int w = len < n ? snprintf(out + len, n - len, "%s%s", i ? ", " : "", json_string_value(q)) : 0;
        len += w > 0 ? (size_t)w : 0;
    }
}

static void print_counts(json_t *o)
{
    printf("Processed: %lld  Failed: %lld\n",
           json_integer_value(json_object_get(o, "processed")),
           json_integer_value(json_object_get(o, "failed")));
    printf("Scheduled: %lld  Retries: %lld  Dead: %lld\n\n",
           json_integer_value(json_object_get(o, "scheduled")),
           json_integer_value(json_object_get(o, "retries")),
           json_integer_value(json_object_get(o, "dead")));
}

static void print_queues(json_t *o)
{
    size_t i;
    json_t *e;
    printf("%-30s %10s %12s %11s\n", "Queue", "Size", "Latency (s)", "Prefetched");
    json_array_foreach(json_object_get(o, "queues"), i, e)
        printf("%-30s %10lld %12.3f %11lld%s\n", json_string_value(json_object_get(e, "name")),
               json_integer_value(json_object_get(e, "size")),
               json_real_value(json_object_get(e, "latency")),
               json_integer_value(json_object_get(e, "prefetched")),
               json_is_true(json_object_get(e, "paused")) ? "  paused" : "");
}

/* One Redis's figures, under a heading line of the caller's. */
static void print_body(json_t *o)
{
    size_t i;
    json_t *e;
    print_counts(o);
    print_queues(o);
    printf("\nProcesses\n");
    json_array_foreach(json_object_get(o, "processes"), i, e) {
        char state[64];
        json_t *gone = json_object_get(e, "pid_gone");
        if (gone)
            snprintf(state, sizeof(state), "dead (pid %lld gone)", json_integer_value(gone));
        else
            snprintf(state, sizeof(state), "%s",
                     json_is_true(json_object_get(e, "quiet")) ? "quiet" : "running");
        char kind[96], queues[512];
        runtime_name(e, kind, sizeof(kind));
        queue_names(json_object_get(e, "queues"), queues, sizeof(queues));
        char sup[64] = "";
        if (json_is_integer(json_object_get(e, "supervisor")))
            snprintf(sup, sizeof(sup), "  worker %lld of supervisor %lld",
                     json_integer_value(json_object_get(e, "worker")),
                     json_integer_value(json_object_get(e, "supervisor")));
        printf("  %s  busy %lld of %lld  %s  rss %lld KB  %s%s  queues [%s]\n",
               json_string_value(json_object_get(e, "identity")),
               json_integer_value(json_object_get(e, "busy")),
               json_integer_value(json_object_get(e, "concurrency")), state,
               json_integer_value(json_object_get(e, "rss")), kind, sup, queues);
    }
    printf("\nWorking lists (reliable fetch)\n");
    json_array_foreach(json_object_get(o, "working"), i, e) {
        char owner[128];
        json_t *gone = json_object_get(e, "pid_gone");
        int key = json_is_true(json_object_get(e, "liveness_key"));
        if (gone && key)
            snprintf(owner, sizeof(owner),
                     "dead (pid %lld gone; recovered once its liveness key lapses)",
                     json_integer_value(gone));
        else if (gone)
            snprintf(owner, sizeof(owner), "DEAD (pid %lld gone; recovered at the next pass)",
                     json_integer_value(gone));
        else
            snprintf(owner, sizeof(owner), "%s", key ? "alive" : "DEAD (recovered at the next pass)");
        printf("  %s  %lld jobs  owner %s\n", json_string_value(json_object_get(e, "identity")),
               json_integer_value(json_object_get(e, "size")), owner);
    }
    json_t *its = json_object_get(o, "iterating");
    if (json_array_size(its))
        printf("\nIterating jobs (it-<jid>)\n");
    json_array_foreach(its, i, e) {
        char *cursor = json_dumps(json_object_get(e, "cursor"), JSON_COMPACT | JSON_ENCODE_ANY);
        printf("  %s %s on %s  execution %lld  cursor %s  %.1f s before this run%s\n",
               json_string_value(json_object_get(e, "class")), json_string_value(json_object_get(e, "jid")),
               json_string_value(json_object_get(e, "process")),
               json_integer_value(json_object_get(e, "executions")), cursor ? cursor : "?",
               json_real_value(json_object_get(e, "runtime")),
               json_is_integer(json_object_get(e, "cancelled")) ? "  CANCELLED" : "");
        free(cursor);
    }
}

static void print_text(json_t *o, const char *name)
{
    printf("capstan %s  %s\n\n", CAPSTAN_VERSION, name);
    print_body(o);
}

/* Says on stderr which processes of this host (host) had fetches Redis
 * answered with errors between their last two beats (an ACL without a
 * command capstan runs, a full Redis): they fetch little or nothing, so
 * stats, the image's health check, fails. A process elsewhere is another
 * container's to judge: one failing host must not make every container of
 * a fleet unhealthy at once. Returns how many. */
static int failing_fetches(json_t *o, const char *host)
{
    size_t hl = strlen(host);
    int n = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(o, "processes"), i, p) {
        json_int_t errors = json_integer_value(json_object_get(p, "fetch_errors"));
        const char *id = json_string_value(json_object_get(p, "identity"));
        if (errors <= 0 || !id || strncmp(id, host, hl) != 0 || id[hl] != ':')
            continue;
        const char *why = json_string_value(json_object_get(p, "fetch_error"));
        fprintf(stderr, "capstan stats: %s: %lld fetches answered with an error between its last "
                "two beats: %s\n", json_string_value(json_object_get(p, "identity")), (long long)errors,
                why ? why : "?");
        n++;
    }
    return n;
}

/* A queue of one shard's into the totals' list, kept sorted by name: the
 * sizes and prefetched counts add up, the latency is the oldest job's, and
 * the queue is paused only when every shard that has it paused it (a shard
 * that still fetches it is still draining it). */
static void queue_add(json_t *queues, json_t *q)
{
    const char *name = json_string_value(json_object_get(q, "name"));
    size_t i;
    json_t *t;
    json_array_foreach(queues, i, t) {
        int c = strcmp(json_string_value(json_object_get(t, "name")), name);
        if (c > 0)
            break;
        if (c == 0) {
            json_object_set_new(t, "size", json_integer(json_integer_value(json_object_get(t, "size"))
                                                        + json_integer_value(json_object_get(q, "size"))));
            double a = json_real_value(json_object_get(t, "latency"));
            double b = json_real_value(json_object_get(q, "latency"));
            json_object_set_new(t, "latency", json_real(a > b ? a : b));
            json_object_set_new(t, "prefetched",
                                json_integer(json_integer_value(json_object_get(t, "prefetched"))
                                             + json_integer_value(json_object_get(q, "prefetched"))));
            json_object_set_new(t, "paused", json_boolean(json_is_true(json_object_get(t, "paused"))
                                                          && json_is_true(json_object_get(q, "paused"))));
            return;
        }
    }
    json_array_insert_new(queues, i, json_deep_copy(q));
}

/* Adds shard's figures (o, as collect gives them) into total: counts
 * summed, queues merged, each process, working list and iterating job
 * listed with its "shard". */
static void total_add(json_t *total, json_t *o, const char *shard)
{
    static const char *const counts[] = { "processed", "failed", "scheduled", "retries", "dead" };
    static const char *const lists[] = { "processes", "working", "iterating" };
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        json_object_set_new(total, counts[k], json_integer(json_integer_value(json_object_get(total, counts[k]))
                                                           + json_integer_value(json_object_get(o, counts[k]))));
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(o, "queues"), i, e)
        queue_add(json_object_get(total, "queues"), e);
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++)
        json_array_foreach(json_object_get(o, lists[k]), i, e) {
            json_t *c = json_deep_copy(e);
            json_object_set_new(c, "shard", json_string(shard));
            json_array_append_new(json_object_get(total, lists[k]), c);
        }
}

/* The text of a sharded fleet: each shard's section (or why it could not
 * be read), then the totals with the threads busy. */
static void print_shards(json_t *total, const capstan_cli_fleet_t *f, char **names, size_t down)
{
    printf("capstan %s  %zu shard%s\n", CAPSTAN_VERSION, f->nshards, f->nshards == 1 ? "" : "s");
    json_t *shards = json_object_get(total, "shards");
    for (size_t i = 0; i < f->nshards; i++) {
        json_t *o = json_object_get(shards, f->shards[i].name);
        json_t *why = json_object_get(o, "error");
        if (why) {
            printf("\nShard %s  UNREACHABLE: %s\n", f->shards[i].name, json_string_value(why));
            continue;
        }
        printf("\nShard %s  %s\n\n", f->shards[i].name, names[i]);
        print_body(o);
    }
    if (f->nshards == 1) /* --shard: its figures are the totals */
        return;
    long long busy = 0, threads = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(total, "processes"), i, p) {
        busy += json_integer_value(json_object_get(p, "busy"));
        threads += json_integer_value(json_object_get(p, "concurrency"));
    }
    printf("\nTotal of %zu shard%s", f->nshards, f->nshards == 1 ? "" : "s");
    if (down)
        printf(" (%zu unreachable, not counted)", down);
    printf("\n\n");
    print_counts(total);
    printf("Busy: %lld of %lld threads in %zu processes\n\n", busy, threads,
           json_array_size(json_object_get(total, "processes")));
    print_queues(total);
}

/* `capstan stats` over the shards of f: exits 1 when one could not be
 * read (after showing the others), as when the one Redis cannot be. */
static int stats_shards(const capstan_cli_fleet_t *f, int as_json)
{
    json_t *total = json_pack("{s:i, s:i, s:i, s:i, s:i, s:[], s:[], s:[], s:[], s:{}}", "processed", 0,
                              "failed", 0, "scheduled", 0, "retries", 0, "dead", 0, "queues", "processes",
                              "working", "iterating", "shards");
    char **names = calloc(f->nshards, sizeof(*names));
    if (!total || !names) {
        fprintf(stderr, "capstan stats: out of memory\n");
        json_decref(total);
        free(names);
        return 1;
    }
    size_t down = 0;
    for (size_t i = 0; i < f->nshards; i++) {
        char err[CAPSTAN_ERRLEN];
        int failed = 1;
        capstan_redis_t *r = capstan__cli_connect_err(f->shards[i].redis_url, &failed, err);
        json_t *o = r ? collect(r, err) : NULL;
        names[i] = r ? strdup(capstan_redis_name(r)) : NULL;
        capstan_redis_free(r);
        if (o) {
            total_add(total, o, f->shards[i].name);
        } else {
            o = json_pack("{s:s}", "error", err);
            down++;
        }
        json_object_set_new(json_object_get(total, "shards"), f->shards[i].name, o);
    }
    if (as_json) {
        char *s = json_dumps(total, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n", s);
        free(s);
    } else {
        print_shards(total, f, names, down);
    }
    fflush(stdout); /* the stats first, then why they are not healthy */
    json_t *shards = json_object_get(total, "shards");
    for (size_t i = 0; i < f->nshards; i++) {
        json_t *why = json_object_get(json_object_get(shards, f->shards[i].name), "error");
        if (why)
            fprintf(stderr, "capstan stats: shard %s: %s\n", f->shards[i].name, json_string_value(why));
    }
    char host[256];
    capstan__hostname(host, sizeof(host));
    int status = failing_fetches(total, host) || down ? 1 : 0;
    for (size_t i = 0; i < f->nshards; i++)
        free(names[i]);
    free(names);
    json_decref(total);
    return status;
}

static int stats_one(const char *url, int as_json)
{
    char err[CAPSTAN_ERRLEN];
    int failed = 1;
    capstan_redis_t *r = capstan__cli_connect("capstan stats", url, &failed);
    if (!r)
        return failed;
    json_t *o = collect(r, err);
    if (!o) {
        fprintf(stderr, "capstan stats: %s\n", err);
        capstan_redis_free(r);
        return 1;
    }
    if (as_json) {
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n", s);
        free(s);
    } else {
        print_text(o, capstan_redis_name(r));
    }
    fflush(stdout); /* the stats first, then why they are not healthy */
    char host[256];
    capstan__hostname(host, sizeof(host));
    int status = failing_fetches(o, host) ? 1 : 0;
    json_decref(o);
    capstan_redis_free(r);
    return status;
}

int capstan__cmd_stats(int argc, char **argv)
{
    capstan_cli_fleet_t f = {0};
    int as_json = 0, done = capstan__cli_fleet_options("capstan stats", usage, argc, argv, &f, &as_json);
    if (done >= 0)
        return done;
    done = capstan__cli_fleet_load("capstan stats", &f);
    if (done < 0)
        done = f.nshards ? stats_shards(&f, as_json) : stats_one(f.url, as_json);
    capstan__cli_fleet_free(&f);
    return done;
}
