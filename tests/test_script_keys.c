/* Every key a Lua script of lua/ touches is one it declares in KEYS: Dragonfly
 * takes a global lock around a script with undeclared keys, and a Redis
 * Cluster proxy routes a script by its KEYS alone. Checked on a real
 * workload, not by reading the scripts: MONITOR shows each EVALSHA with its
 * KEYS and then (Redis 7.0) each command the script ran, marked "[N lua]";
 * COMMAND GETKEYS says which arguments of such a command are keys. A key
 * computed from data the caller cannot know ahead is allowed only where
 * the exceptions below name it with the reason (doc/internals.md, "Keys
 * the scripts cannot declare"); any other undeclared key fails the test. */
#include <ctype.h>
#include <fnmatch.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "helpers.h"
#include "capstan/batch.h"
#include "capstan/client.h"
#include "capstan/limiter.h"
#include "capstan/unique.h"
#include "fetch/fetch.h"
#include "lua/capstan_lua.h"

TestSuite(script_keys, .timeout = 280, .fini = kt_kill_children);

/* Keys a script may touch without declaring them: computed in the script
 * from data stored in Redis, so no caller can know them before the call. */
static const struct {
    const char *script, *pattern, *why;
} exceptions[] = {
    { "fetch", "*:LOCKED", "the lock digest is read from each fetched payload" },
    { "limit_acquire", "limiter:*:w:*", "the window's counter is named from the server clock" },
    { "reap", "uniquejobs:working:*", "live processes are read from \"processes\" in the script" },
    { "reap", "*:work", "live processes are read from \"processes\" in the script" },
    { "reap", "queue:*", "queues are read from \"queues\" in the script" },
    /* An identity: host:pid:hex. */
    { "reap", "*:[0-9]*:[0-9a-f]*", "live processes are read from \"processes\" in the script" },
};

/* The scripts that fire a batch's callbacks (lib/batch_done.lua). */
static const char *const batch_scripts[] = { "ack", "acks", "batch_commit", "recover" };

/* Why script may touch key undeclared, or NULL when it may not. declared:
 * the call's KEYS. */
static const char *exception_for(const char *script, const char *key, char **declared, int ndeclared)
{
    for (size_t i = 0; i < sizeof(exceptions) / sizeof(exceptions[0]); i++)
        if (strcmp(exceptions[i].script, script) == 0 && fnmatch(exceptions[i].pattern, key, 0) == 0)
            return exceptions[i].why;
    int batch = 0;
    for (size_t i = 0; i < sizeof(batch_scripts) / sizeof(batch_scripts[0]); i++)
        batch |= strcmp(batch_scripts[i], script) == 0;
    if (!batch)
        return NULL;
    if (strncmp(key, "queue:", 6) == 0)
        return "a callback's queue is read from the batch's hash";
    /* A key of a batch the call did not declare: the parent (and its
     * parents), whose bid is read from the child's hash. The call's own
     * batch is declared, so its keys never pass here. */
    if (strncmp(key, "batch:", 6) == 0) {
        size_t n = strcspn(key + 6, ":") + 6;
        for (int d = 0; d < ndeclared; d++)
            if (strlen(declared[d]) == n && strncmp(declared[d], key, n) == 0)
                return NULL;
        return "a parent batch's bid is read from its child's hash";
    }
    return NULL;
}

/* ---- the MONITOR stream --------------------------------------------------- */

#define END_MARK "capstan-script-keys-end"

typedef struct monitor {
    redisContext *c;
    char **lines;
    size_t n, cap;
    int ended;
} monitor_t;

/* Reads MONITOR lines until the end mark (an ECHO of it) or an error. */
static void *monitor_run(void *arg)
{
    monitor_t *m = arg;
    for (;;) {
        void *got = NULL;
        if (redisGetReply(m->c, &got) != REDIS_OK || !got)
            break;
        redisReply *r = got;
        int end = r->type == REDIS_REPLY_STATUS && strstr(r->str, "\"" END_MARK "\"");
        if (r->type == REDIS_REPLY_STATUS && !end) {
            if (m->n == m->cap) {
                m->cap = m->cap ? m->cap * 2 : 4096;
                m->lines = realloc(m->lines, m->cap * sizeof(char *));
            }
            m->lines[m->n++] = strdup(r->str);
        }
        freeReplyObject(r);
        if (end) {
            m->ended = 1;
            break;
        }
    }
    return NULL;
}

/* A MONITOR line's arguments, unquoted as Redis quotes them (sdscatrepr):
 * "\"", "\\", \n \r \t \a \b and \xHH. Returns how many, at most max; the
 * source ("lua", or the client's address) into src. */
static int split_line(const char *line, char *src, size_t srclen, char **argv, size_t *lens, int max)
{
    const char *p = strchr(line, '[');
    const char *q = p ? strchr(p, ']') : NULL;
    if (!p || !q)
        return 0;
    const char *sp = memchr(p, ' ', (size_t)(q - p));
    size_t sl = sp ? (size_t)(q - sp - 1) : 0;
    if (sl >= srclen)
        sl = srclen - 1;
    memcpy(src, sp ? sp + 1 : "", sl);
    src[sl] = '\0';
    int argc = 0;
    for (p = q + 1; *p && argc < max;) {
        while (*p == ' ')
            p++;
        if (*p != '"')
            break;
        p++;
        char *out = malloc(strlen(p) + 1);
        size_t n = 0;
        while (*p && *p != '"') {
            if (*p == '\\' && p[1]) {
                p++;
                switch (*p) {
                case 'n': out[n++] = '\n'; break;
                case 'r': out[n++] = '\r'; break;
                case 't': out[n++] = '\t'; break;
                case 'a': out[n++] = '\a'; break;
                case 'b': out[n++] = '\b'; break;
                case 'x': {
                    char hex[3] = { p[1], p[1] ? p[2] : 0, 0 };
                    out[n++] = (char)strtol(hex, NULL, 16);
                    p += 2;
                    break;
                }
                default: out[n++] = *p;
                }
                p++;
            } else {
                out[n++] = *p++;
            }
        }
        if (*p == '"')
            p++;
        out[n] = '\0';
        argv[argc] = out;
        lens[argc++] = n;
    }
    return argc;
}

static void free_args(char **argv, int argc)
{
    for (int i = 0; i < argc; i++)
        free(argv[i]);
}

/* ---- the check ------------------------------------------------------------ */

#define MAX_ARGS 4096
#define MAX_REPORT 40

typedef struct check {
    char shas[CAPSTAN_SCRIPT_COUNT][41];
    long calls[CAPSTAN_SCRIPT_COUNT];
    char **found; /* distinct "script: COMMAND key" lines */
    size_t nfound;
    char **excused;
    size_t nexcused;
} check_t;

static int add_distinct(char ***list, size_t *n, const char *text)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*list)[i], text) == 0)
            return 0;
    *list = realloc(*list, (*n + 1) * sizeof(char *));
    (*list)[(*n)++] = strdup(text);
    return 1;
}

static int script_of(const check_t *ck, const char *sha)
{
    for (int i = 0; i < CAPSTAN_SCRIPT_COUNT; i++)
        if (strcasecmp(ck->shas[i], sha) == 0)
            return i;
    return -1;
}

/* Goes through the MONITOR lines: each EVALSHA of a capstan script opens a
 * group (its declared keys) which the "lua" lines after it belong to. */
static void check_lines(check_t *ck, const monitor_t *m, redisContext *keys_c)
{
    char **argv = calloc(MAX_ARGS, sizeof(char *));
    size_t *lens = calloc(MAX_ARGS, sizeof(size_t));
    char **declared = NULL;
    int ndeclared = 0, script = -2; /* -2: no script yet, -1: not capstan's */
    for (size_t l = 0; l < m->n; l++) {
        char src[64];
        int argc = split_line(m->lines[l], src, sizeof(src), argv, lens, MAX_ARGS);
        if (argc == 0)
            continue;
        if (strcmp(src, "lua") != 0) {
            /* Another client's command ends the group before it. */
            free_args(declared, ndeclared);
            free(declared);
            declared = NULL;
            ndeclared = 0;
            script = -2;
            if (strcasecmp(argv[0], "EVALSHA") == 0 && argc >= 3) {
                script = script_of(ck, argv[1]);
                int nk = atoi(argv[2]);
                if (script >= 0 && nk >= 0 && nk <= argc - 3) {
                    ck->calls[script]++;
                    declared = calloc((size_t)nk + 1, sizeof(char *));
                    for (int k = 0; k < nk; k++)
                        declared[ndeclared++] = strdup(argv[3 + k]);
                }
            } else if (strcasecmp(argv[0], "EVAL") == 0) {
                script = -1; /* a plugin's own script (LimitJob's) */
            }
            free_args(argv, argc);
            continue;
        }
        if (script == -2) {
            char msg[256];
            snprintf(msg, sizeof(msg), "a script command with no EVALSHA before it: %.150s", m->lines[l]);
            add_distinct(&ck->found, &ck->nfound, msg);
        }
        if (script < 0) {
            free_args(argv, argc);
            continue;
        }
        /* COMMAND GETKEYS with the command as the script sent it. */
        const char **cargv = calloc((size_t)argc + 2, sizeof(char *));
        size_t *clens = calloc((size_t)argc + 2, sizeof(size_t));
        cargv[0] = "COMMAND";
        clens[0] = 7;
        cargv[1] = "GETKEYS";
        clens[1] = 7;
        for (int i = 0; i < argc; i++) {
            cargv[i + 2] = argv[i];
            clens[i + 2] = lens[i];
        }
        redisReply *r = redisCommandArgv(keys_c, argc + 2, cargv, clens);
        cr_assert(r, "COMMAND GETKEYS: %s", keys_c->errstr);
        /* An error reply is a command without keys (TIME). */
        for (size_t k = 0; r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
            const char *key = r->element[k]->str;
            int ok = 0;
            for (int d = 0; d < ndeclared && !ok; d++)
                ok = strcmp(declared[d], key) == 0;
            if (ok)
                continue;
            const char *name = capstan__lua_names[script];
            char msg[512];
            const char *why = exception_for(name, key, declared, ndeclared);
            snprintf(msg, sizeof(msg), "%s.lua: %s %.200s%s%s", name, argv[0], key, why ? ": " : "",
                     why ? why : "");
            add_distinct(why ? &ck->excused : &ck->found, why ? &ck->nexcused : &ck->nfound, msg);
        }
        freeReplyObject(r);
        free(cargv);
        free(clens);
        free_args(argv, argc);
    }
    free_args(declared, ndeclared);
    free(declared);
    free(argv);
    free(lens);
}

/* ---- the workload --------------------------------------------------------- */

/* Fast beats, polls, recovery and reaper, and an every-second periodic
 * schedule: every background script runs within seconds. */
#define FAST_YAML                                                                              \
    "poll_interval_average: 0.5\nheartbeat_interval: 0.5\nliveness_ttl: 2\n"                   \
    "recovery_interval: 1\ntimeout: 1\nreaper_interval: 1\nreaper_count: 10\n"                 \
    "reaper_timeout: 2\n"                                                                    \
    "periodic:\n  sk_tick: {cron: \"* * * * * *\", class: NoopJob, queue: sk_ticks}\n"

static void push(const char *const *argv)
{
    char *out = NULL;
    int st = kt_capstan_run(argv, &out);
    cr_assert(st == 0 || st == 3, "capstan push: %d: %s", st, out);
    free(out);
}

/* A batch of RecordJobs with complete and success callbacks, with a child
 * batch (of parent) when parent is not NULL; its bid into bid. */
static void run_batch(capstan_client_t *c, const char *parent, const char *key, char bid[64])
{
    char err[CAPSTAN_ERRLEN], opts[128], args[64];
    capstan_batch_t *b = capstan_batch_new(c, err);
    cr_assert(b, "%s", err);
    snprintf(opts, sizeof(opts), "{\"key\":\"%s\"}", key);
    cr_assert_eq(capstan_batch_describe(b, "script keys"), 0);
    if (parent)
        cr_assert_eq(capstan_batch_set_parent(b, parent), 0, "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_COMPLETE, "BatchCallbackJob", "default", opts), 0,
                 "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "BatchCallbackJob", "default", opts), 0);
    snprintf(args, sizeof(args), "[\"%s:jobs\"]", key);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(capstan_batch_push(b, "RecordJob", args, NULL, NULL), 0, "%s", capstan_batch_error(b));
    snprintf(bid, 64, "%s", capstan_batch_bid(b));
    if (!parent) {
        /* A job that reopens its own batch and adds to it. */
        char url_args[512];
        snprintf(url_args, sizeof(url_args), "[\"%s\", \"%s:reopen\", 2]", kt_url(), key);
        cr_assert_eq(capstan_batch_push(b, "ReopenJob", url_args, NULL, NULL), 0, "%s",
                     capstan_batch_error(b));
        cr_assert_eq(capstan_batch_push(b, "FailJob", "[\"batch failure\"]", NULL, NULL), 0);
    }
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    capstan_batch_free(b);
}

static void limiters(void)
{
    char err[CAPSTAN_ERRLEN] = "";
    capstan_redis_t *r = kt_lib_redis();
    capstan_limiter_t *l = capstan_limiter_new(CAPSTAN_LIMIT_CONCURRENT, "sk_conc", 2, 0.5, err);
    cr_assert(l, "%s", err);
    capstan_limit_token_t t;
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_extend(l, r, &t, err), 0, "%s", err);
    cr_assert_eq(capstan_limiter_release(l, r, &t, err), 0, "%s", err);
    capstan_limiter_free(l);
    l = capstan_limiter_new(CAPSTAN_LIMIT_WINDOW, "sk_win", 5, 1, err);
    cr_assert(l, "%s", err);
    cr_assert_eq(capstan_limiter_acquire(l, r, 0, &t, NULL, err), 0, "%s", err);
    capstan_limiter_free(l);
    capstan_redis_free(r);
}

/* Two round trips' acks as a feed writes them, whatever the timing of the
 * workers above: two jobs whose runtime locks have waiters go in one
 * acks.lua call (a lone one goes through ack.lua), then 40 plain jobs
 * through acks_plain.lua (fewer go as LREMs; with a locked one, all go
 * through acks.lua). */
static void round_trip_acks(void)
{
    enum { LOCKED = 2, PLAIN = 40, N = LOCKED + PLAIN };
    char err[CAPSTAN_ERRLEN] = "";
    capstan_queue_conf_t q = { .name = "default" };
    capstan_fetch_conf_t fc = { .ops = &capstan__fetch_reliable, .identity = "sk:1:aaaaaaaaaaaa",
                                .queues = &q, .nqueues = 1 };
    capstan_fetch_t *f = capstan__fetch_new(&fc, err);
    cr_assert(f, "%s", err);
    capstan_redis_t *r = kt_lib_redis();
    char *working = kt_working_key(fc.identity);
    char *p[N], keys[LOCKED][48], jids[LOCKED][25];
    capstan_ack_item_t items[N];
    for (int i = 0; i < N; i++) {
        char jid[25];
        kt_make_jid(jid, 9, (unsigned)i);
        p[i] = kt_payload("RecordJob", "[\"sk:acks\"]", jid, "default");
        kt_int("LPUSH %s %s", working, p[i]);
        items[i] = (capstan_ack_item_t){ .raw = p[i], .len = strlen(p[i]), .ack = { .kind = CAPSTAN_ACK_OK } };
        if (i < LOCKED) {
            snprintf(keys[i], sizeof(keys[i]), "uniquejobs:skacks%d:RUN:LOCKED", i);
            snprintf(jids[i], sizeof(jids[i]), "%s", jid);
            kt_int("HSET %s %s {}", keys[i], jid);
            kt_int("ZADD uniquejobs:skacks%d:RUN:WAITING 1 skwaiter%d", i, i);
            items[i].ack.lock_key = keys[i];
            items[i].ack.lock_jid = jids[i];
        }
    }
    cr_assert_eq(capstan__fetch_exchange(f, r, items, LOCKED, NULL, 0, 0), 0);
    cr_assert_eq(capstan__fetch_exchange(f, r, items + LOCKED, PLAIN, NULL, 0, 0), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(items[i].rc, 0, "ack %d written", i);
    cr_assert_eq(kt_int("LLEN %s", working), 0, "every job acked");
    for (int i = 0; i < LOCKED; i++) {
        cr_assert_eq(kt_int("EXISTS %s", keys[i]), 0, "lock %d released", i);
        cr_assert_eq(kt_int("LLEN uniquejobs:skacks%d:RUN:WAKE", i), 1, "lock %d's waiter woken", i);
    }
    for (int i = 0; i < N; i++)
        free(p[i]);
    free(working);
    capstan_redis_free(r);
    capstan__fetch_free(f);
}

static void workload(void)
{
    char *y = kt_write_file("keys.yml", FAST_YAML);
    /* Uniqueness locks of each type, a replaced duplicate, a scheduled job,
     * retries and deaths. */
    static const char *const types[] = { "until_executed", "until_executing", "while_executing",
                                         "until_and_while_executing", "until_expired" };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        char args[64];
        snprintf(args, sizeof(args), "[\"sk:lock:%zu\"]", i);
        push((const char *[]){ "push", "RecordJob", args, "--lock", types[i], "--lock-ttl", "60", NULL });
    }
    push((const char *[]){ "push", "NoopJob", "[\"r\"]", "--lock", "until_executed", NULL });
    push((const char *[]){ "push", "NoopJob", "[\"r\"]", "--lock", "until_executed", "--on-conflict",
                           "replace", NULL });
    push((const char *[]){ "push", "RecordJob", "[\"sk:scheduled\"]", "--in", "1", NULL });
    push((const char *[]){ "push", "FailJob", "[\"once\"]", "--retry", "1", NULL });
    push((const char *[]){ "push", "FailJob", "[\"dies\"]", "--retry", "0", NULL });
    push((const char *[]){ "push", "FailJob", "[\"locked\"]", "--retry", "0", "--lock", "until_executed", NULL });
    for (int i = 0; i < 20; i++)
        push((const char *[]){ "push", "RecordJob", "[\"sk:plain\"]", NULL });

    /* Batches: a parent with a child, callbacks, a reopen, a failure. */
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "%s", err);
    char parent[64], child[64];
    run_batch(c, NULL, "sk:parent", parent);
    run_batch(c, parent, "sk:child", child);
    capstan_client_free(c);

    pid_t w1 = kt_capstan_start((const char *[]){ "-C", y, "-c", "5", "-q", "default", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD sk:plain") == 20 && kt_int("LLEN queue:default") == 0
                            && kt_int("SCARD sk:scheduled") == 1, 30), "%s", kt_capstan_log(w1));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN sk:child") + kt_int("LLEN sk:parent") >= 3, 30),
              "the batches' callbacks ran: %s", kt_capstan_log(w1));
    /* Plain jobs alone, many to a round trip: their acks go as LREMs, or
     * through acks_plain.lua from 32 in one round trip (a round trip with a
     * locked job's ack uses acks.lua). */
    freeReplyObject(kt_cmd("EVAL %s 0", "for i = 1, 300 do redis.call('LPUSH', 'queue:default', "
                                         "string.format('{\"class\":\"NoopJob\",\"args\":[],\"jid\":"
                                         "\"skplain%017d\",\"queue\":\"default\"}', i)) end"));
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:default") == 0, 30), "%s", kt_capstan_log(w1));
    /* A periodic tick (periodic_enqueue). */
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:sk_ticks") >= 1, 10), "%s", kt_capstan_log(w1));

    /* The retries made due now run again: "once" dies (the batch's
     * failure goes back to retry). */
    freeReplyObject(kt_cmd("EVAL %s 0", "for _, m in ipairs(redis.call('ZRANGE', 'retry', 0, -1)) do "
                                         "redis.call('ZADD', 'retry', 0, m) end"));
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD dead") == 3, 20), "%s", kt_capstan_log(w1));

    /* A worker killed with a job in hand: w1 gives the job back (recover). */
    pid_t w2 = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "1", "-q", "slow", NULL });
    char *id2 = kt_log_identity(w2);
    char *wk2 = kt_working_key(id2);
    push((const char *[]){ "push", "SleepJob", "[30000]", "-q", "slow", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN %s", wk2) == 1, 20), "%s", kt_capstan_log(w2));
    kt_capstan_stop(w2, SIGKILL, 5);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:slow") == 1, 30), "recovered: %s", kt_capstan_log(w1));

    /* A worker stopped while the job runs puts it back (requeue). */
    pid_t w3 = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", "-q", "slow", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:slow") == 0, 20), "%s", kt_capstan_log(w3));
    kt_sleep(0.5);
    kt_capstan_stop(w3, SIGTERM, 20);
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:slow") == 1, 10), "requeued: %s", kt_capstan_log(w3));

    /* A job whose class has no handler goes back to its queue untouched,
     * in the worker's first minute (unknown_requeue). */
    pid_t wu = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "1", "-q", "sk_unknown", NULL });
    push((const char *[]){ "push", "NoSuchJob", "[]", "-q", "sk_unknown", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_log_has(wu, "no handler for NoSuchJob") && kt_int("LLEN queue:sk_unknown") == 1, 20),
              "%s", kt_capstan_log(wu));
    kt_capstan_stop(wu, SIGTERM, 20);

    /* Queued locks: taken, extended while the command runs, released; a
     * dead waiter's place cleared. */
    char *out = NULL;
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "sk", "--ttl", "300", "--redis-url", kt_url(),
                                                  "--", "sleep", "0.4", NULL }, &out), 0, "%s", out);
    free(out);
    freeReplyObject(kt_cmd("ZADD rql:lock_queue:sk_dead 1 gone"));
    cr_assert_eq(kt_capstan_run((const char *[]){ "lock", "clear-dead", "--dead-ttl", "1", "--redis-url",
                                                  kt_url(), NULL }, &out), 0, "%s", out);
    free(out);

    limiters();
    round_trip_acks();

    /* Runtime locks of several short jobs a processor takes at once
     * (locks): enough of them for the feed to fetch ahead. */
    enum { RUNLOCKS = 400 };
    char *runs[RUNLOCKS];
    for (unsigned i = 0; i < RUNLOCKS; i++) {
        char jid[25], args[64], key[32];
        kt_make_jid(jid, 7, i);
        snprintf(args, sizeof(args), "[\"sk:runlocks\", %u]", i);
        snprintf(key, sizeof(key), "skrun%u", i);
        runs[i] = kt_payload_locked("RecordJob", args, jid, "runlocks", "while_executing", key);
    }
    kt_push_all(kt_redis(), "runlocks", runs, RUNLOCKS);
    for (unsigned i = 0; i < RUNLOCKS; i++)
        free(runs[i]);
    pid_t w4 = kt_capstan_start((const char *[]){ "-C", y, "-c", "2", "-q", "runlocks", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD sk:runlocks") == RUNLOCKS, 30), "%s", kt_capstan_log(w4));
    cr_assert_eq(kt_capstan_stop(w4, SIGTERM, 30), 0);

    /* Jobs of one runtime lock waiting for it (lock_timeout): each release
     * wakes those in line (lib/wake_waiters.lua), through an ack (acks,
     * ack: a failure) and through an unlock (unlock). */
    for (int i = 0; i < 3; i++)
        push((const char *[]){ "push", "SleepJob", "[200]", "-q", "waits", "--lock", "while_executing",
                               "--lock-timeout", "20", NULL });
    push((const char *[]){ "push", "FailJob", "[\"w\"]", "-q", "waits", "--retry", "0", "--lock",
                           "while_executing", "--lock-timeout", "20", NULL });
    push((const char *[]){ "push", "FailJob", "[\"w\"]", "-q", "waits", "--retry", "0", "--lock",
                           "while_executing", "--lock-timeout", "20", NULL });
    pid_t w5 = kt_capstan_start((const char *[]){ "-C", y, "-c", "3", "-q", "waits", NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN queue:waits") == 0 && kt_int("ZCARD dead") == 5, 30), "%s",
              kt_capstan_log(w5));
    cr_assert_eq(kt_capstan_stop(w5, SIGTERM, 30), 0);
    char err5[CAPSTAN_ERRLEN] = "";
    capstan_redis_t *r5 = kt_lib_redis();
    capstan_lock_req_t held = { .digest = "uniquejobs:skwait", .runtime = 1, .jid = "skholder",
                                .type = CAPSTAN_LOCK_WHILE_EXECUTING };
    cr_assert_eq(capstan_unique_lock(r5, &held, err5), CAPSTAN_LOCK_ACQUIRED, "%s", err5);
    freeReplyObject(kt_cmd("ZADD uniquejobs:skwait:RUN:WAITING %f skwaiter", kt_now()));
    cr_assert_eq(capstan_unique_unlock(r5, "uniquejobs:skwait", 1, "skholder", CAPSTAN_LOCK_WHILE_EXECUTING,
                                       0, err5), 0, "%s", err5);
    cr_assert_eq(kt_int("LLEN uniquejobs:skwait:RUN:WAKE"), 1, "the waiter's token");
    capstan_redis_free(r5);

    /* An orphaned uniqueness lock and an empty digest: the reaper's. */
    freeReplyObject(kt_cmd("HSET uniquejobs:skorphan:LOCKED 0123456789abcdef01234567 {}"));
    freeReplyObject(kt_cmd("ZADD uniquejobs:digests 1 uniquejobs:skorphan 1 uniquejobs:skempty"));
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS uniquejobs:skorphan:LOCKED") == 0
                            && kt_int("ZCOUNT uniquejobs:digests 1 1") == 0, 30),
              "reaped: %s", kt_capstan_log(w1));
    cr_assert_eq(kt_capstan_stop(w1, SIGTERM, 30), 0);
    free(id2);
    free(wk2);
    free(y);
}

Test(script_keys, every_key_a_script_touches_is_declared)
{
    check_t ck = {0};
    redisContext *keys_c = redisConnect("127.0.0.1", atoi(getenv("KT_REDIS_PORT")));
    cr_assert(keys_c && !keys_c->err);
    /* The SHA1 of each script, as Redis computes it. */
    for (int i = 0; i < CAPSTAN_SCRIPT_COUNT; i++) {
        redisReply *r = redisCommand(keys_c, "SCRIPT LOAD %s", capstan__lua_texts[i]);
        cr_assert(r && r->type == REDIS_REPLY_STRING && r->len == 40);
        memcpy(ck.shas[i], r->str, 41);
        freeReplyObject(r);
    }

    monitor_t m = { .c = redisConnect("127.0.0.1", atoi(getenv("KT_REDIS_PORT"))) };
    cr_assert(m.c && !m.c->err);
    redisReply *ok = redisCommand(m.c, "MONITOR");
    cr_assert(ok && ok->type == REDIS_REPLY_STATUS);
    freeReplyObject(ok);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, monitor_run, &m), 0);

    workload();

    freeReplyObject(kt_cmd("ECHO %s", END_MARK));
    pthread_join(th, NULL);
    cr_assert(m.ended, "the MONITOR stream ended early: %s", m.c->errstr);
    check_lines(&ck, &m, keys_c);

    /* The report goes into the assertions' messages: criterion shows them
     * (a test's own stderr is not kept by the TAP output). */
    char *cover = NULL, *unrun = NULL, *found = NULL;
    size_t coverlen = 0, unrunlen = 0, foundlen = 0;
    FILE *cf = open_memstream(&cover, &coverlen), *uf = open_memstream(&unrun, &unrunlen);
    FILE *ff = open_memstream(&found, &foundlen);
    int missing = 0;
    for (int i = 0; i < CAPSTAN_SCRIPT_COUNT; i++) {
        fprintf(cf, " %s %ld", capstan__lua_names[i], ck.calls[i]);
        if (!ck.calls[i]) {
            fprintf(uf, "\n  %s.lua: never run", capstan__lua_names[i]);
            missing++;
        }
    }
    for (size_t i = 0; i < ck.nexcused; i++)
        fprintf(ff, "\n  known exception: %s", ck.excused[i]);
    for (size_t i = 0; i < ck.nfound && i < MAX_REPORT; i++)
        fprintf(ff, "\n  UNDECLARED: %s", ck.found[i]);
    fclose(cf);
    fclose(uf);
    fclose(ff);
    /* Seen with --verbose; what the workload does not reach, always. */
    cr_log_info("calls per script:%s", cover);
    cr_log_info("undeclared keys:%s", found);
    if (missing)
        cr_log_warn("scripts the workload does not run:%s", unrun);
    cr_expect_eq(missing, 0, "%d scripts were never run by the workload:%s\n  calls per script:%s", missing,
                 unrun, cover);
    cr_expect_eq(ck.nfound, 0, "%zu keys touched by scripts without being declared:%s", ck.nfound,
                 found);
    free(cover);
    free(unrun);
    free(found);

    for (size_t i = 0; i < m.n; i++)
        free(m.lines[i]);
    free(m.lines);
    for (size_t i = 0; i < ck.nfound; i++)
        free(ck.found[i]);
    free(ck.found);
    for (size_t i = 0; i < ck.nexcused; i++)
        free(ck.excused[i]);
    free(ck.excused);
    redisFree(m.c);
    redisFree(keys_c);
}
