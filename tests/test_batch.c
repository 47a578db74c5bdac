/* Batches end to end (capstan/batch.h): batches made with the C client (and by
 * Ruby with examples/ruby/capstan_batch.rb), their jobs run by capstan processes,
 * some failing, retried, killed with -9 or dead, and their callbacks: each
 * pushed exactly once, with the status, and run by capstan or by Ruby Sidekiq
 * (6.4.1, and 7.3.10 and 8.0.10 where their sources are found). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "capstan/batch.h"
#include "capstan/client.h"

/* Fast beats, scheduler polls and recovery: a retry made due and a job
 * left by a killed process come back in seconds. */
#define FAST_YAML                                                                              \
    "poll_interval_average: 0.5\nheartbeat_interval: 0.5\nliveness_ttl: 2\n"                   \
    "recovery_interval: 1\ntimeout: 5\n"

TestSuite(batch, .timeout = 240, .fini = kt_kill_children);

static capstan_client_t *client(void)
{
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(kt_url(), err);
    cr_assert(c, "client: %s", err);
    return c;
}

/* One worker without a supervisor: a process whose kill -9 is the death
 * of the worker itself. */
static pid_t capstan_start_alone(const char *queues)
{
    char *y = kt_write_file("batch.yml", FAST_YAML);
    char q[64];
    snprintf(q, sizeof(q), "%s", queues);
    pid_t pid = kt_capstan_start((const char *[]){ "--no-supervisor", "-C", y, "-c", "5", "-q", q, NULL });
    free(y);
    return pid;
}

static pid_t capstan_start(const char *queues)
{
    char *y = kt_write_file("batch.yml", FAST_YAML);
    char q[64];
    snprintf(q, sizeof(q), "%s", queues);
    pid_t pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "5", "-q", q, NULL });
    free(y);
    return pid;
}

/* A new batch with callbacks for complete and success (and death when
 * death_too) of class BatchCallbackJob to queue, options {"key": key}. */
static capstan_batch_t *new_batch(capstan_client_t *c, const char *queue, const char *key, int death_too)
{
    char err[CAPSTAN_ERRLEN], opts[128];
    capstan_batch_t *b = capstan_batch_new(c, err);
    cr_assert(b, "%s", err);
    snprintf(opts, sizeof(opts), "{\"key\":\"%s\",\"n\":1}", key);
    cr_assert_eq(capstan_batch_describe(b, "test batch"), 0);
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_COMPLETE, "BatchCallbackJob", queue, opts), 0, "%s",
                 capstan_batch_error(b));
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "BatchCallbackJob", queue, opts), 0);
    if (death_too)
        cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_DEATH, "BatchCallbackJob", queue, opts), 0);
    return b;
}

/* n jobs of cls in b, args from argsf(i) (one bulk push). */
static void push_n(capstan_batch_t *b, const char *cls, size_t n, const char *(*argsf)(size_t))
{
    const char **args = calloc(n, sizeof(*args));
    for (size_t i = 0; i < n; i++)
        args[i] = argsf(i);
    cr_assert_eq(capstan_batch_push_bulk(b, cls, args, n, NULL, NULL), 0, "%s", capstan_batch_error(b));
    free(args);
}

static const char *record_args(size_t i)
{
    (void)i;
    return "[\"rec\"]";
}

/* Every tenth job fails its first run. */
static const char *flaky_args(size_t i)
{
    return i % 10 == 0 ? "[\"fl\",true]" : "[\"fl\",false]";
}

/* The statuses the callbacks recorded in key (BatchCallbackJob), by event:
 * how many and the last. */
static int recorded(const char *key, const char *event, json_t **last)
{
    redisReply *r = kt_cmd("LRANGE %s 0 -1", key);
    int n = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        json_t *st = json_loads(r->element[i]->str, 0, NULL);
        cr_assert(st, "a status is JSON: %s", r->element[i]->str);
        if (strcmp(json_string_value(json_object_get(st, "event")), event) == 0) {
            n++;
            if (last) {
                json_decref(*last);
                *last = json_incref(st);
            }
        }
        json_decref(st);
    }
    freeReplyObject(r);
    return n;
}

/* The callback jobs waiting in queue:NAME for event: how many, and the
 * status of the last (args[0]). */
static int queued(const char *queue, const char *event, json_t **status)
{
    redisReply *r = kt_cmd("LRANGE queue:%s 0 -1", queue);
    int n = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        json_t *job = json_loads(r->element[i]->str, 0, NULL);
        cr_assert(job, "a callback job is JSON: %s", r->element[i]->str);
        json_t *st = json_array_get(json_object_get(job, "args"), 0);
        if (strcmp(json_string_value(json_object_get(st, "event")), event) == 0) {
            n++;
            if (status) {
                json_decref(*status);
                *status = json_incref(st);
            }
        }
        json_decref(job);
    }
    freeReplyObject(r);
    return n;
}

static long num(json_t *o, const char *key)
{
    return (long)json_integer_value(json_object_get(o, key));
}

/* Makes every retry due now, as if its backoff had passed. */
static void retries_due(void)
{
    redisReply *r = kt_cmd("ZRANGE retry 0 -1");
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        freeReplyObject(kt_cmd("ZADD retry XX 0 %b", r->element[i]->str, r->element[i]->len));
    freeReplyObject(r);
}

static capstan_batch_status_t status_of(const char *bid)
{
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = kt_lib_redis();
    capstan_batch_status_t s;
    cr_assert_eq(capstan_batch_status(r, bid, &s, err), 0, "%s", err);
    capstan_redis_free(r);
    return s;
}

/* The thinnest path: 50 jobs, committed, run by capstan; complete and success
 * are pushed once each, run by capstan, with the status and the options. */
Test(batch, callbacks_fire_once_after_the_jobs)
{
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "default", "cb", 0);
    push_n(b, "RecordJob", 50, record_args);
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    char *bid = strdup(capstan_batch_bid(b));
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN cb") == 2, 20), "callbacks: %lld\n%s", kt_int("LLEN cb"),
              kt_capstan_log(pid));
    kt_sleep(1);
    json_t *st = NULL;
    cr_assert_eq(recorded("cb", "complete", NULL), 1);
    cr_assert_eq(recorded("cb", "success", &st), 1);
    cr_assert_eq(kt_int("SCARD rec"), 50);
    cr_assert_str_eq(json_string_value(json_object_get(st, "bid")), bid);
    cr_assert_str_eq(json_string_value(json_object_get(st, "description")), "test batch");
    cr_assert_eq(num(st, "total"), 50);
    cr_assert_eq(num(st, "pending"), 0);
    cr_assert_eq(num(st, "failures"), 0);
    capstan_batch_status_t s = status_of(bid);
    cr_assert_eq(s.total, 50);
    cr_assert_eq(s.pending, 0);
    cr_assert(s.complete_at > 0 && s.success_at > 0 && s.death_at == 0);
    capstan_batch_status_clear(&s);
    /* The options reached the callback byte for byte. */
    cr_assert(kt_log_has(pid, "BatchCallbackJob"), "%s", kt_capstan_log(pid));
    json_decref(st);
    free(bid);
    capstan_batch_free(b);
    capstan_client_free(c);
}


/* The acceptance run: 1,000 jobs over two capstan processes, every
 * tenth failing once. complete is pushed once, when every job has run once
 * (the failed ones still pending); success once, after the retries
 * succeed. Both run on Ruby Sidekiq and see the status. */
Test(batch, thousand_jobs_two_processes_one_complete_one_success_run_by_ruby)
{
    enum { N = 1000 };
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "callbacks", "rcb", 0);
    push_n(b, "FlakyJob", N, flaky_args);
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    pid_t k1 = capstan_start("default"), k2 = capstan_start("default");
    json_t *st = NULL;
    cr_assert(KT_WAIT_UNTIL(queued("callbacks", "complete", &st) == 1, 60),
              "complete: %lld runs, %lld retries\n%s", kt_int("LLEN fl:runs"),
              kt_int("ZCARD retry"), kt_capstan_log(k1));
    /* Every job had run once when complete fired; the failed ones were
     * pending still, and the retries had not run (their backoff is long). */
    cr_assert_eq(kt_int("SCARD fl:seen"), N / 10);
    cr_assert_eq(num(st, "total"), N);
    cr_assert_eq(num(st, "pending"), N / 10);
    cr_assert_eq(num(st, "failures"), N / 10);
    cr_assert_eq(queued("callbacks", "success", NULL), 0);
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") == N / 10, 10));
    retries_due();
    cr_assert(KT_WAIT_UNTIL(queued("callbacks", "success", &st) == 1, 60),
              "success: %lld done, %lld in retry\n%s", kt_int("SCARD fl"), kt_int("ZCARD retry"),
              kt_capstan_log(k2));
    cr_assert_eq(kt_int("SCARD fl"), N);
    cr_assert_eq(num(st, "pending"), 0);
    cr_assert_eq(num(st, "failures"), 0);
    kt_sleep(1);
    cr_assert_eq(queued("callbacks", "complete", NULL), 1, "complete pushed exactly once");
    cr_assert_eq(queued("callbacks", "success", NULL), 1, "success pushed exactly once");
    json_decref(st);

    pid_t rb = kt_sidekiq_start("batch_jobs.rb", "callbacks");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN rcb") == 2, 60), "Ruby ran the callbacks: %s",
              kt_sidekiq_log());
    st = NULL;
    cr_assert_eq(recorded("rcb", "complete", &st), 1);
    cr_assert_eq(num(st, "pending"), N / 10, "Ruby saw the status at complete");
    cr_assert_eq(recorded("rcb", "success", &st), 1);
    cr_assert_eq(num(st, "total"), N);
    cr_assert_eq(num(st, "pending"), 0);
    /* And the options, as Ruby parsed them. */
    cr_assert_eq(kt_int("LLEN rcb:opts"), 2);
    char *o = kt_str("LINDEX rcb:opts 0");
    cr_assert_str_eq(o, "{\"key\":\"rcb\",\"n\":1}");
    free(o);
    json_decref(st);
    kt_capstan_stop(rb, SIGTERM, 10);
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* kill -9 of a worker three times during the batch: still one complete
 * and one success, and pending reaches 0 without going below. */
Test(batch, kill9_three_times_still_exactly_once)
{
    enum { N = 3000 };
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "callbacks", "kcb", 0);
    push_n(b, "FlakyJob", N, flaky_args);
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    char bkey[64];
    snprintf(bkey, sizeof(bkey), "batch:%s", capstan_batch_bid(b));
    pid_t steady = capstan_start("default"), victim = capstan_start_alone("default");
    long minimum = N;
    for (int k = 0; k < 3; k++) {
        long at = (long)(k + 1) * N / 5;
        cr_assert(KT_WAIT_UNTIL(kt_int("LLEN fl:runs") >= at, 60), "stalled at %lld: %s",
                  kt_int("LLEN fl:runs"), kt_capstan_log(victim));
        cr_assert_eq(kt_capstan_stop(victim, SIGKILL, 10), 128 + SIGKILL);
        long p = (long)kt_int("HGET %s pending", bkey);
        minimum = p < minimum ? p : minimum;
        victim = capstan_start_alone("default");
    }
    cr_assert(KT_WAIT_UNTIL(queued("callbacks", "complete", NULL) == 1, 90), "%s",
              kt_capstan_log(steady));
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD retry") >= N / 10 - 5, 10));
    /* The retries: whatever failed, now due (one pass may miss a retry a
     * recovered job adds after it). */
    cr_assert(KT_WAIT_UNTIL(({ retries_due(); queued("callbacks", "success", NULL) == 1; }), 90),
              "success: %lld of %d done, pending %lld\n%s", kt_int("SCARD fl"), N,
              kt_int("HGET %s pending", bkey), kt_capstan_log(steady));
    kt_sleep(2);
    cr_assert_eq(queued("callbacks", "complete", NULL), 1);
    cr_assert_eq(queued("callbacks", "success", NULL), 1);
    cr_assert_eq(kt_int("HGET %s pending", bkey), 0);
    cr_assert_geq(minimum, 0);
    cr_assert_eq(kt_int("HGET %s notrun", bkey), 0, "every jid counted once");
    cr_assert_eq(kt_int("HLEN %s:jids", bkey), N + 1, "every jid (and the placeholder)");
    cr_assert_eq(kt_int("SCARD fl"), N);
    fprintf(stderr, "[batch kill9] %lld runs for %d jobs\n", kt_int("LLEN fl:runs"), N);
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* A parent with 3 child batches of 100 jobs each: the parent's success runs
 * once, after the children's callbacks have run (as Sidekiq Pro's does),
 * since those count as jobs of the parent. */
Test(batch, nested_parent_fires_after_its_children_callbacks)
{
    capstan_client_t *c = client();
    capstan_batch_t *parent = new_batch(c, "default", "ncb", 0);
    capstan_batch_t *kids[3];
    for (int i = 0; i < 3; i++) {
        kids[i] = new_batch(c, "default", "ncb", 0);
        cr_assert_eq(capstan_batch_set_parent(kids[i], capstan_batch_bid(parent)), 0);
    }
    /* The parent exists before its children name it. */
    cr_assert_eq(capstan_batch_push(parent, "RecordJob", "[\"rec\"]", NULL, NULL), 0, "%s",
                 capstan_batch_error(parent));
    for (int i = 0; i < 3; i++) {
        push_n(kids[i], "RecordJob", 100, record_args);
        cr_assert_eq(capstan_batch_commit(kids[i]), 0, "%s", capstan_batch_error(kids[i]));
    }
    cr_assert_eq(capstan_batch_commit(parent), 0);
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ncb") == 8, 60), "%lld done\n%s", kt_int("SCARD rec"),
              kt_capstan_log(pid));
    kt_sleep(1);
    /* The parent's two callbacks ran last of the 8, once each. */
    redisReply *r = kt_cmd("LRANGE ncb 0 -1");
    cr_assert_eq(r->elements, 8, "4 completes and 4 successes");
    for (size_t i = 0; i < 8; i++) {
        json_t *st = json_loads(r->element[i]->str, 0, NULL);
        const char *bid = json_string_value(json_object_get(st, "bid"));
        cr_assert_eq(strcmp(bid, capstan_batch_bid(parent)) == 0, i >= 6, "callback %zu: %s", i,
                     r->element[i]->str);
        if (i >= 6 && !strcmp(json_string_value(json_object_get(st, "event")), "success"))
            cr_assert_eq(num(st, "total"), 10, "one job, three children and their six callbacks");
        json_decref(st);
    }
    freeReplyObject(r);
    for (int i = 0; i < 3; i++) {
        capstan_batch_status_t s = status_of(capstan_batch_bid(kids[i]));
        cr_assert_str_eq(s.parent, capstan_batch_bid(parent));
        cr_assert(s.success_at > 0);
        capstan_batch_status_clear(&s);
        capstan_batch_free(kids[i]);
    }
    capstan_batch_free(parent);
    capstan_client_free(c);
}

/* Sidekiq Pro's workflow: a child batch's success callback adds the next
 * step's jobs to the parent, whose success then waits for them. */
Test(batch, a_child_callback_adds_to_the_parent_before_it_succeeds)
{
    capstan_client_t *c = client();
    char err[CAPSTAN_ERRLEN], opts[512];
    capstan_batch_t *parent = capstan_batch_new(c, err);
    cr_assert(parent, "%s", err);
    cr_assert_eq(capstan_batch_on(parent, CAPSTAN_BATCH_SUCCESS, "BatchCallbackJob", "default",
                                  "{\"key\":\"wcb\"}"), 0);
    capstan_batch_t *step1 = capstan_batch_new(c, err);
    cr_assert(step1, "%s", err);
    snprintf(opts, sizeof(opts), "{\"key\":\"wcb\",\"add\":5,\"url\":\"%s\"}", kt_url());
    cr_assert_eq(capstan_batch_on(step1, CAPSTAN_BATCH_SUCCESS, "BatchCallbackJob", "default", opts), 0);
    cr_assert_eq(capstan_batch_set_parent(step1, capstan_batch_bid(parent)), 0);
    cr_assert_eq(capstan_batch_push(parent, "RecordJob", "[\"wrec\"]", NULL, NULL), 0);
    push_n(step1, "RecordJob", 3, record_args);
    cr_assert_eq(capstan_batch_commit(step1), 0, "%s", capstan_batch_error(step1));
    cr_assert_eq(capstan_batch_commit(parent), 0);
    pid_t pid = capstan_start("default");
    json_t *st = NULL;
    cr_assert(KT_WAIT_UNTIL(recorded("wcb", "success", &st) == 2, 30), "%s", kt_capstan_log(pid));
    /* The last success recorded is the parent's, after the step's jobs. */
    cr_assert_str_eq(json_string_value(json_object_get(st, "bid")), capstan_batch_bid(parent));
    cr_assert_eq(kt_int("SCARD wcb:added"), 5, "the added jobs ran before the parent's success");
    cr_assert_eq(num(st, "total"), 8, "a job, the child, its callback and the 5 it added");
    kt_sleep(1);
    cr_assert_eq(recorded("wcb", "success", NULL), 2);
    json_decref(st);
    capstan_batch_free(step1);
    capstan_batch_free(parent);
    capstan_client_free(c);
}

/* A job that dies: death fires once, complete fires, success never. */
Test(batch, death_fires_once_success_never)
{
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "callbacks", "dcb", 1);
    push_n(b, "RecordJob", 5, record_args);
    capstan_push_opts_t o = capstan_push_opts_default();
    o.retry = 0; /* dead at its first failure */
    cr_assert_eq(capstan_batch_push(b, "FailJob", "[\"no luck\"]", &o, NULL), 0);
    cr_assert_eq(capstan_batch_commit(b), 0);
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(queued("callbacks", "complete", NULL) == 1, 30), "%s",
              kt_capstan_log(pid));
    kt_sleep(1);
    json_t *st = NULL;
    cr_assert_eq(queued("callbacks", "death", &st), 1);
    cr_assert_eq(num(st, "failures"), 1);
    cr_assert_eq(queued("callbacks", "success", NULL), 0);
    cr_assert_eq(kt_int("ZCARD dead"), 1);
    capstan_batch_status_t s = status_of(capstan_batch_bid(b));
    cr_assert_eq(s.dead, 1);
    cr_assert_eq(s.pending, 1);
    cr_assert_str_eq(s.first_error, "RuntimeError: no luck");
    capstan_batch_status_clear(&s);
    json_decref(st);
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* A job of the batch reopens it and adds 10 jobs: success waits for them. */
Test(batch, reopen_from_a_job_success_waits_for_the_added_jobs)
{
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "callbacks", "ocb", 0);
    char args[256];
    snprintf(args, sizeof(args), "[\"%s\",\"rec\",10]", kt_url());
    cr_assert_eq(capstan_batch_push(b, "ReopenJob", args, NULL, NULL), 0);
    cr_assert_eq(capstan_batch_commit(b), 0);
    pid_t pid = capstan_start("default");
    json_t *st = NULL;
    cr_assert(KT_WAIT_UNTIL(queued("callbacks", "success", &st) == 1, 30), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("SCARD rec"), 11, "the added jobs ran before success");
    cr_assert_eq(num(st, "total"), 11);
    kt_sleep(1);
    cr_assert_eq(queued("callbacks", "success", NULL), 1);
    json_decref(st);
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* Bad input: a bid naming no batch runs as a plain job with a warning; a
 * malformed callback is refused when the batch is made. */
Test(batch, bad_input)
{
    /* Several, so that acks of one call (acks.lua) and of one job
     * (ack.lua) both meet it. */
    char *p[20];
    for (unsigned i = 0; i < 20; i++) {
        char jid[25];
        kt_make_jid(jid, 1, i);
        cr_assert(asprintf(&p[i], "{\"retry\":true,\"queue\":\"default\",\"args\":[\"rec\"],"
                           "\"class\":\"RecordJob\",\"jid\":\"%s\",\"bid\":\"nosuchbatch\","
                           "\"created_at\":1767225600.1,\"enqueued_at\":1767225600.1}", jid) > 0);
    }
    kt_push_all(kt_redis(), "default", p, 20);
    for (unsigned i = 0; i < 20; i++)
        free(p[i]);
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(kt_int("SCARD rec") == 20 && kt_log_has(pid, "nosuchbatch"), 20),
              "%s", kt_capstan_log(pid));
    cr_assert(kt_log_has(pid, "does not exist"), "%s", kt_capstan_log(pid));
    cr_assert_eq(kt_int("EXISTS batch:nosuchbatch"), 0);

    capstan_client_t *c = client();
    char err[CAPSTAN_ERRLEN];
    capstan_batch_t *b = capstan_batch_new(c, err);
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "Cb", "q", "[1,2]"), CAPSTAN_EINVAL);
    cr_assert(strstr(capstan_batch_error(b), "must be a JSON object"), "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "Cb", "q", "{\"a\":"), CAPSTAN_EINVAL);
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "", "q", NULL), CAPSTAN_EINVAL);
    cr_assert(strstr(capstan_batch_error(b), "needs a class"), "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_on(b, CAPSTAN_BATCH_SUCCESS, "Cb", "a queue", NULL), CAPSTAN_EINVAL);
    cr_assert_eq(capstan_batch_on(b, (capstan_batch_event_t)7, "Cb", "q", NULL), CAPSTAN_EINVAL);
    cr_assert_eq(capstan_batch_set_parent(b, "nosuchparent"), 0);
    cr_assert_eq(capstan_batch_push(b, "RecordJob", "[\"x\"]", NULL, NULL), CAPSTAN_ENOTFOUND);
    cr_assert(strstr(capstan_batch_error(b), "nosuchparent"), "%s", capstan_batch_error(b));
    capstan_batch_free(b);
    cr_assert_null(capstan_batch_reopen(c, "nosuchbatch", err));
    cr_assert(strstr(err, "no batch"), "%s", err);
    capstan_client_free(c);
}

/* An empty batch succeeds at its commit; a committed handle takes no more
 * jobs; delete and invalidate; `capstan batch status` and `capstan batch list`. */
Test(batch, empty_commit_cli_delete_invalidate)
{
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "callbacks", "ecb", 0);
    cr_assert_eq(capstan_batch_commit(b), 0);
    cr_assert_eq(queued("callbacks", "success", NULL), 1);
    cr_assert_eq(capstan_batch_push(b, "RecordJob", "[]", NULL, NULL), CAPSTAN_EINVAL);
    cr_assert_eq(capstan_batch_commit(b), CAPSTAN_EINVAL);
    cr_assert_null(capstan_batch_reopen(c, capstan_batch_bid(b), (char[CAPSTAN_ERRLEN]){0}),
                   "a batch that succeeded is not reopened");

    capstan_batch_t *d = new_batch(c, "callbacks", "ecb", 0);
    cr_assert_eq(capstan_batch_push(d, "FailJob", "[\"boom\"]", NULL, NULL), 0);
    cr_assert_eq(capstan_batch_commit(d), 0);
    char *out = NULL;
    const char *bid = capstan_batch_bid(d);
    cr_assert_eq(kt_capstan_run((const char *[]){ "batch", "status", bid, "--redis-url", kt_url(),
                                              NULL }, &out), 0, "%s", out);
    cr_assert(strstr(out, "total:        1") && strstr(out, "pending:      1"), "%s", out);
    cr_assert(strstr(out, "state:        running"), "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "batch", "list", "--redis-url", kt_url(), NULL },
                                &out), 0, "%s", out);
    cr_assert(strstr(out, bid) && strstr(out, capstan_batch_bid(b)) && strstr(out, "succeeded"),
              "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "batch", "invalidate", bid, "--redis-url",
                                              kt_url(), NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_int("HEXISTS batch:%s invalidated", bid), 1);
    cr_assert_eq(kt_capstan_run((const char *[]){ "batch", "delete", bid, "--redis-url", kt_url(),
                                              NULL }, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kt_capstan_run((const char *[]){ "batch", "status", bid, "--redis-url", kt_url(),
                                              NULL }, &out), 1, "%s", out);
    free(out);
    cr_assert_eq(kt_int("ZSCORE batches %s", bid), 0);
    cr_assert_eq(kt_int("EXISTS batch:%s", bid), 0);
    capstan_batch_free(d);
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* A Ruby app with Sidekiq OSS makes the batch (examples/ruby/capstan_batch.rb),
 * capstan runs its jobs, Ruby Sidekiq runs the success callback, once: in
 * each Sidekiq version (6.x speaks redis-rb, 7 and 8 redis-client). */
KT_SIDEKIQ_TEST(batch, ruby_makes_the_batch_capstan_runs_it_ruby_gets_the_callback)
{
    char *out = NULL;
    int st = kt_ruby_v(sidekiq, "batch.rb", (const char *[]){ "create", "20", NULL }, &out);
    cr_assert_eq(st, 0, "batch.rb exited %d: %s", st, out);
    out[strcspn(out, "\n")] = '\0';
    char *bid = out;
    cr_assert(kt_int("EXISTS batch:%s", bid), "the batch exists: %s", bid);
    cr_assert_eq(kt_int("HGET batch:%s total", bid), 20);
    pid_t pid = capstan_start("default");
    pid_t rb = kt_sidekiq_start_v(sidekiq, "batch_jobs.rb", "callbacks");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN rubycb") == 1, 60), "%s\n%s", kt_capstan_log(pid),
              kt_sidekiq_log());
    json_t *s = NULL;
    cr_assert_eq(recorded("rubycb", "success", &s), 1);
    cr_assert_str_eq(json_string_value(json_object_get(s, "bid")), bid);
    cr_assert_eq(num(s, "total"), 20);
    cr_assert_eq(kt_int("SCARD rrec"), 20);
    json_decref(s);
    free(out);
    kt_sleep(1);
    cr_assert_eq(kt_int("LLEN rubycb"), 1, "the callback ran once");
    cr_assert_eq(kt_capstan_stop(rb, SIGTERM, 10), 0, "%s", kt_sidekiq_log());
}

/* A batch whose jobs Sidekiq runs (examples/ruby/capstan_batch.rb's server
 * middleware and death handler): a nested one succeeds, the child's
 * callback before the parent's; a job that dies fires complete and death.
 * In each Sidekiq version. */
KT_SIDEKIQ_TEST(batch, sidekiq_runs_the_jobs_of_a_batch_and_they_count)
{
    char *out = NULL;
    int st = kt_ruby_v(sidekiq, "batch.rb", (const char *[]){ "nested", "5", NULL }, &out);
    cr_assert_eq(st, 0, "batch.rb exited %d: %s", st, out);
    out[strcspn(out, "\n")] = '\0';
    pid_t rb = kt_sidekiq_start_v(sidekiq, "batch_jobs.rb", "callbacks");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN rubynest") == 2, 60), "%s", kt_sidekiq_log());
    char *last = kt_str("LINDEX rubynest 1");
    json_t *s = json_loads(last, 0, NULL);
    cr_assert(s, "%s", last);
    cr_assert_str_eq(json_string_value(json_object_get(s, "bid")), out, "the parent's is last");
    cr_assert_eq(num(s, "total"), 3, "a job, the child and its callback");
    cr_assert_eq(kt_int("SCARD rnrec"), 6);
    /* Each job read its own batch's bid (Capstan::Batch::Member). */
    cr_assert_eq(kt_int("HLEN rnrec:bids"), 6);
    cr_assert_eq(kt_int("EVAL %s 1 rnrec:bids %s",
                        "local n = 0 for _, v in ipairs(redis.call('HVALS', KEYS[1])) do "
                        "if v == ARGV[1] then n = n + 1 end end return n", out), 1,
                 "one job of the parent, five of the child");
    json_decref(s);
    free(last);
    free(out);

    out = NULL;
    st = kt_ruby_v(sidekiq, "batch.rb", (const char *[]){ "dies", NULL }, &out);
    cr_assert_eq(st, 0, "batch.rb exited %d: %s", st, out);
    out[strcspn(out, "\n")] = '\0';
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN rubydie") == 2, 60), "%s", kt_sidekiq_log());
    cr_assert_eq(recorded("rubydie", "complete", NULL), 1);
    cr_assert_eq(recorded("rubydie", "death", NULL), 1);
    cr_assert_eq(kt_int("HGET batch:%s dead", out), 1);
    cr_assert_eq(kt_int("HLEN batch:%s:failures", out), 1, "the error is kept");
    cr_assert_eq(kt_int("ZCARD dead"), 1, "Sidekiq's own dead set has it too");
    free(out);

    /* retry: false: Sidekiq drops the job (and calls the death handlers):
     * a failure, as capstan counts a dropped job, not a death. */
    out = NULL;
    st = kt_ruby_v(sidekiq, "batch.rb", (const char *[]){ "drops", NULL }, &out);
    cr_assert_eq(st, 0, "batch.rb exited %d: %s", st, out);
    out[strcspn(out, "\n")] = '\0';
    cr_assert(KT_WAIT_UNTIL(recorded("rubydrop", "complete", NULL) == 1, 60), "%s",
              kt_sidekiq_log());
    kt_sleep(1);
    cr_assert_eq(recorded("rubydrop", "death", NULL), 0);
    cr_assert_eq(kt_int("HGET batch:%s dead", out), 0);
    cr_assert_eq(kt_int("HLEN batch:%s:failures", out), 1);
    cr_assert_eq(kt_int("ZCARD dead"), 1, "nothing more in the dead set");
    free(out);
    /* Every callback ran once, and no batch step failed in Sidekiq (a
     * death handler's error is only logged). */
    cr_assert_eq(kt_int("LLEN rubynest"), 2);
    cr_assert_eq(kt_int("LLEN rubydie"), 2);
    cr_assert_eq(kt_int("LLEN rubydrop"), 1);
    char *log = kt_sidekiq_log();
    cr_assert(!strstr(log, "Error calling") && !strstr(log, "NameError"), "%s", log);
    free(log);
    cr_assert_eq(kt_capstan_stop(rb, SIGTERM, 10), 0, "%s", kt_sidekiq_log());
}

/* In a client transaction, a push that fails (bad args) takes its count
 * back with it: the batch counts only the job that is in. */
Test(batch, a_failed_push_in_a_client_transaction_is_not_counted)
{
    capstan_client_t *c = client();
    cr_assert_eq(capstan_client_begin(c), 0);
    capstan_batch_t *b = new_batch(c, "callbacks", "fcb", 0);
    cr_assert_eq(capstan_batch_push(b, "RecordJob", "[\"rec\"]", NULL, NULL), 0);
    cr_assert_lt(capstan_batch_push(b, "RecordJob", "not json", NULL, NULL), 0);
    /* Refused before any job was made: the jids hold an earlier push's. */
    char jids[1][25] = { "c0000000000000000000000f" };
    cr_assert_lt(capstan_batch_push_bulk(b, "", (const char *[]){ "[]" }, 1, NULL, jids), 0);
    cr_assert_str_eq(jids[0], "", "no job is said to be in");
    cr_assert_eq(capstan_batch_commit(b), 0);
    cr_assert_eq(capstan_client_commit(c), 0, "%s", capstan_client_error(c));
    cr_assert_eq(kt_int("LLEN queue:default"), 1);
    cr_assert_eq(kt_int("HGET batch:%s total", capstan_batch_bid(b)), 1);
    cr_assert_eq(kt_int("HGET batch:%s pending", capstan_batch_bid(b)), 1);
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* A batch whose data expired before it succeeded leaves the open-batches
 * index (behind the capstan_batches_open gauge) at the next recovery pass,
 * without anyone listing the batches; a live one stays. */
Test(batch, an_expired_open_batch_leaves_the_index)
{
    capstan_client_t *c = client();
    capstan_push_opts_t nobody = capstan_push_opts_default();
    nobody.queue = "nobody"; /* no process runs them */
    capstan_batch_t *gone = new_batch(c, "callbacks", "xcb", 0);
    cr_assert_eq(capstan_batch_set_linger(gone, 60, 1), 0);
    cr_assert_eq(capstan_batch_push(gone, "RecordJob", "[\"rec\"]", &nobody, NULL), 0, "%s",
                 capstan_batch_error(gone));
    cr_assert_eq(capstan_batch_commit(gone), 0);
    capstan_batch_t *live = new_batch(c, "callbacks", "xcb", 0);
    cr_assert_eq(capstan_batch_push(live, "RecordJob", "[\"rec\"]", &nobody, NULL), 0);
    cr_assert_eq(capstan_batch_commit(live), 0);
    cr_assert_eq(kt_int("ZCARD batches:open"), 2);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS batch:%s", capstan_batch_bid(gone)) == 0, 10));
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(kt_int("ZCARD batches:open") == 1, 20), "%s", kt_capstan_log(pid));
    cr_assert(kt_int("ZSCORE batches:open %s", capstan_batch_bid(live)) > 0);
    cr_assert_eq(kt_int("ZSCORE batches %s", capstan_batch_bid(gone)), 0, "gone from both");
    cr_assert(kt_log_has(pid, "1 expired batches left the open-batches index"), "%s",
              kt_capstan_log(pid));
    capstan_batch_free(gone);
    capstan_batch_free(live);
    capstan_client_free(c);
}

/* ---- a connection lost after Redis ran the push ----------------------- */

/* A TCP relay to the test's Redis that, once armed, passes on one command
 * holding its needle (an EXEC by default) and then closes the connection
 * without its reply: Redis has run it, the client cannot know. */
typedef struct cut_proxy {
    int listen_fd, redis_port;
    atomic_int armed, cuts;
    const char *needle; /* what the client sends before the cut */
    char url[128];
} cut_proxy_t;

typedef struct relay {
    cut_proxy_t *px;
    int client;
} relay_t;

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void *relay_main(void *arg)
{
    relay_t *rl = arg;
    cut_proxy_t *px = rl->px;
    int server = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons((uint16_t)px->redis_port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(server, (struct sockaddr *)&a, sizeof(a)) == 0) {
        struct pollfd fds[2] = { { .fd = rl->client, .events = POLLIN },
                                 { .fd = server, .events = POLLIN } };
        char buf[65536];
        for (int done = 0; !done && poll(fds, 2, -1) > 0;) {
            for (int i = 0; i < 2 && !done; i++) {
                if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                    continue;
                ssize_t n = read(fds[i].fd, buf, sizeof(buf));
                if (n <= 0 || write_all(fds[1 - i].fd, buf, (size_t)n)) {
                    done = 1;
                } else if (i == 0 && memmem(buf, (size_t)n, px->needle, strlen(px->needle))
                           && atomic_exchange(&px->armed, 0)) {
                    kt_sleep(0.2); /* Redis runs it; its reply is not passed on */
                    atomic_fetch_add(&px->cuts, 1);
                    done = 1;
                }
            }
        }
    }
    close(server);
    close(rl->client);
    free(rl);
    return NULL;
}

static void *accept_main(void *arg)
{
    cut_proxy_t *px = arg;
    for (int fd; (fd = accept(px->listen_fd, NULL, NULL)) >= 0;) {
        relay_t *rl = malloc(sizeof(*rl));
        *rl = (relay_t){ px, fd };
        pthread_t t;
        pthread_create(&t, NULL, relay_main, rl);
        pthread_detach(t);
    }
    return NULL;
}

static cut_proxy_t *cut_proxy_start(void)
{
    cut_proxy_t *px = calloc(1, sizeof(*px));
    px->needle = "$4\r\nEXEC\r\n";
    const char *url = kt_url(), *colon = strrchr(url, ':');
    px->redis_port = atoi(colon + 1);
    px->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    cr_assert_eq(bind(px->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(px->listen_fd, 16), 0);
    cr_assert_eq(getsockname(px->listen_fd, (struct sockaddr *)&a, &len), 0);
    /* The test's URL with the relay's port. */
    snprintf(px->url, sizeof(px->url), "%.*s:%d%s", (int)(colon - url), url,
             ntohs(a.sin_port), strchr(colon, '/'));
    pthread_t t;
    pthread_create(&t, NULL, accept_main, px);
    pthread_detach(t);
    return px;
}

/* Commits b, runs its jobs (queue default), and checks its success
 * callback is pushed once, counting total jobs, none pending. */
static void commit_and_succeed(capstan_batch_t *b, long total)
{
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(queued("callbacks", "success", NULL) == 1, 20), "%s",
              kt_capstan_log(pid));
    json_t *s = NULL;
    cr_assert_eq(queued("callbacks", "success", &s), 1);
    cr_assert_eq(num(s, "total"), total);
    cr_assert_eq(num(s, "pending"), 0);
    json_decref(s);
}

/* The reply to a batch push is lost after Redis ran it: its jobs and their
 * count are in together, once (a second send would push them twice,
 * counted once, and fire the batch before its last jobs ran), and the
 * batch succeeds when they have run. */
Test(batch, a_push_whose_reply_is_lost_is_counted_with_its_jobs_once)
{
    cut_proxy_t *px = cut_proxy_start();
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(px->url, err);
    cr_assert(c, "client: %s", err);
    capstan_batch_t *b = new_batch(c, "callbacks", "lcb", 0);
    push_n(b, "RecordJob", 2, record_args);
    atomic_store(&px->armed, 1);
    const char *args[] = { "[\"rec\"]", "[\"rec\"]", "[\"rec\"]" };
    char jids[3][25];
    int rc = capstan_batch_push_bulk(b, "RecordJob", args, 3, NULL, jids);
    cr_assert_eq(atomic_load(&px->cuts), 1, "the push went through the cut");
    cr_assert_eq(rc, CAPSTAN_EREDIS, "the caller learns its push is in doubt: %d %s", rc,
                 capstan_batch_error(b));
    cr_assert_str_eq(jids[0], "");
    cr_assert_eq(kt_int("LLEN queue:default"), 5, "pushed once");
    cr_assert_eq(kt_int("HGET batch:%s total", capstan_batch_bid(b)), 5, "and counted");
    commit_and_succeed(b, 5);
    capstan_batch_free(b);
    capstan_client_free(c);
    close(px->listen_fd);
}

/* The reply to a new batch's creation is lost: the push that made it says
 * so and pushes nothing; the next push finds the batch made (by this
 * handle) and goes on, and the batch succeeds when its jobs have run. */
Test(batch, a_creation_whose_reply_is_lost_is_taken_as_made)
{
    cut_proxy_t *px = cut_proxy_start();
    px->needle = "$3\r\nnew\r\n"; /* batch_open.lua's mode argument */
    char err[CAPSTAN_ERRLEN];
    capstan_client_t *c = capstan_client_new(px->url, err);
    cr_assert(c, "client: %s", err);
    capstan_batch_t *b = new_batch(c, "callbacks", "ncb", 0);
    atomic_store(&px->armed, 1);
    char jids[2][25] = { "stale", "stale" };
    const char *args[] = { "[\"rec\"]", "[\"rec\"]" };
    int rc = capstan_batch_push_bulk(b, "RecordJob", args, 2, NULL, jids);
    cr_assert_eq(atomic_load(&px->cuts), 1, "the creation went through the cut");
    cr_assert_eq(rc, CAPSTAN_EREDIS, "%d %s", rc, capstan_batch_error(b));
    cr_assert_str_eq(jids[0], "", "nothing pushed");
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    cr_assert_eq(kt_int("EXISTS batch:%s", capstan_batch_bid(b)), 1, "but the batch was made");
    cr_assert_eq(capstan_batch_push_bulk(b, "RecordJob", args, 2, NULL, jids), 0, "%s",
                 capstan_batch_error(b));
    cr_assert_eq(strlen(jids[1]), 24);
    commit_and_succeed(b, 2);
    capstan_batch_free(b);
    capstan_client_free(c);
    close(px->listen_fd);
}

/* The metrics page once it has the line want (the counters move when capstan
 * reads a step's reply, just after Redis ran it). The caller frees it. */
static char *scrape_has(int port, const char *want)
{
    char *m = NULL;
    cr_assert(KT_WAIT_UNTIL((free(m), m = kt_scrape(port)) != NULL && strstr(m, want), 10),
              "no \"%s\" in:\n%s", want, m ? m : "(no page)");
    return m;
}

/* The Prometheus series: batches open (from Redis), completed and
 * succeeded (fired by this process), and the callbacks' latency; and a
 * batch's data goes linger seconds after its success. */
Test(batch, metrics_and_linger)
{
    capstan_client_t *c = client();
    capstan_batch_t *open = new_batch(c, "default", "mcb", 0);
    cr_assert_eq(capstan_batch_push(open, "SleepJob", "[1]", NULL, NULL), 0);
    capstan_batch_t *b = new_batch(c, "default", "mcb", 0);
    cr_assert_eq(capstan_batch_set_linger(b, 2, 60), 0);
    push_n(b, "RecordJob", 10, record_args);
    cr_assert_eq(capstan_batch_commit(b), 0);
    int port = kt_free_port();
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    pid_t pid = kt_capstan_start((const char *[]){ "-q", "default", "-c", "3", "--metrics-port",
                                               portstr, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN mcb") == 2, 20), "%s", kt_capstan_log(pid));
    char *m = scrape_has(port, "\ncapstan_batches_open 1\n");
    cr_assert(strstr(m, "\ncapstan_batches_completed_total 1\n"), "%s", m);
    cr_assert(strstr(m, "\ncapstan_batches_succeeded_total 1\n"), "%s", m);
    cr_assert(strstr(m, "capstan_batch_callback_latency_seconds_count{event=\"success\"} 1\n"),
              "%s", m);
    free(m);
    char key[64];
    snprintf(key, sizeof(key), "batch:%s", capstan_batch_bid(b));
    cr_assert_eq(kt_int("EXISTS %s", key), 1);
    cr_assert(KT_WAIT_UNTIL(kt_int("EXISTS %s %s:jids", key, key) == 0, 10),
              "the batch's data went after linger");
    capstan_batch_free(b);
    capstan_batch_free(open);
    capstan_client_free(c);
}

/* A step that fires a child and, walking up, its parent counts both in the
 * metrics: the last ack of the child's jobs fires the two batches' complete
 * and success (the parent's own job ran before, in another process). */
Test(batch, metrics_count_each_batch_a_step_fires)
{
    capstan_client_t *c = client();
    char err[CAPSTAN_ERRLEN];
    capstan_batch_t *parent = new_batch(c, "callbacks", "wcm", 0);
    cr_assert_eq(capstan_batch_push(parent, "RecordJob", "[\"prec\"]", NULL, NULL), 0);
    capstan_batch_t *child = capstan_batch_new(c, err);
    cr_assert(child, "%s", err);
    cr_assert_eq(capstan_batch_set_parent(child, capstan_batch_bid(parent)), 0);
    capstan_push_opts_t later = capstan_push_opts_default();
    later.queue = "later";
    for (int i = 0; i < 5; i++)
        cr_assert_eq(capstan_batch_push(child, "RecordJob", "[\"crec\"]", &later, NULL), 0, "%s",
                     capstan_batch_error(child));
    cr_assert_eq(capstan_batch_commit(child), 0);
    cr_assert_eq(capstan_batch_commit(parent), 0);
    pid_t first = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(kt_int("HGET batch:%s pending", capstan_batch_bid(parent)) == 1, 20),
              "the parent's own job ran: %s", kt_capstan_log(first));
    kt_capstan_stop(first, SIGTERM, 10);
    int port = kt_free_port();
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    pid_t pid = kt_capstan_start((const char *[]){ "-q", "later", "-c", "3", "--metrics-port",
                                               portstr, NULL });
    cr_assert(KT_WAIT_UNTIL(kt_int("HEXISTS batch:%s success_at", capstan_batch_bid(parent)), 20),
              "%s", kt_capstan_log(pid));
    char *m = scrape_has(port, "\ncapstan_batches_succeeded_total 2\n");
    cr_assert(strstr(m, "\ncapstan_batches_completed_total 2\n"), "%s", m);
    free(m);
    capstan_batch_free(child);
    capstan_batch_free(parent);
    capstan_client_free(c);
}

/* A job that kills every process that runs it becomes a poison pill, sent
 * to dead by the orphan recovery: that is a death in its batch too. */
Test(batch, poison_pill_is_a_death)
{
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "callbacks", "pcb", 1);
    cr_assert_eq(capstan_batch_push(b, "CrashJob", "[]", NULL, NULL), 0);
    cr_assert_eq(capstan_batch_commit(b), 0);
    char *y = kt_write_file("pill.yml", FAST_YAML "max_recoveries: 1\n");
    pid_t pid = 0;
    char portstr[16] = "";
    /* Each run kills its process; the next process recovers the job, until
     * it has been recovered once too often. */
    cr_assert(KT_WAIT_UNTIL(({
        if (!pid || waitpid(pid, NULL, WNOHANG) == pid) {
            if (pid)
                kt_untrack(pid);
            snprintf(portstr, sizeof(portstr), "%d", kt_free_port());
            pid = kt_capstan_start((const char *[]){ "-C", y, "-c", "1", "--metrics-port", portstr,
                                                 NULL });
        }
        queued("callbacks", "death", NULL) == 1; }), 60), "%lld dead", kt_int("ZCARD dead"));
    cr_assert_eq(queued("callbacks", "complete", NULL), 1);
    cr_assert_eq(queued("callbacks", "success", NULL), 0);
    /* The process whose recovery sent it to the dead set counted both. */
    char *m = scrape_has(atoi(portstr), "\ncapstan_batches_died_total 1\n");
    cr_assert(strstr(m, "\ncapstan_batches_completed_total 1\n"), "%s", m);
    free(m);
    free(y);
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* An invalidated batch's jobs still run, and can tell (capstan_batch_valid);
 * a job of no batch is valid. */
Test(batch, invalidated_batch_jobs_can_tell)
{
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "callbacks", "vcb", 0);
    cr_assert_eq(capstan_batch_push(b, "BatchValidJob", "[\"valid\"]", NULL, NULL), 0);
    cr_assert_eq(capstan_batch_commit(b), 0);
    char err[CAPSTAN_ERRLEN];
    capstan_redis_t *r = kt_lib_redis();
    cr_assert_eq(capstan_batch_invalidate(r, capstan_batch_bid(b), err), 0, "%s", err);
    cr_assert_eq(capstan_batch_invalidate(r, "nosuchbatch", err), CAPSTAN_ENOTFOUND);
    capstan_redis_free(r);
    cr_assert_eq(capstan_client_push(c, "BatchValidJob", "[\"plain\"]", NULL, NULL), 0);
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN valid") == 1 && kt_int("LLEN plain") == 1, 20), "%s",
              kt_capstan_log(pid));
    cr_assert_eq(kt_int("LINDEX valid 0"), 0, "the batch's job saw it invalid");
    cr_assert_eq(kt_int("LINDEX plain 0"), 1, "the plain job is valid");
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* Inside a client transaction a batch and its jobs land together at the
 * commit, or not at all after a rollback. */
Test(batch, in_a_client_transaction)
{
    capstan_client_t *c = client();
    cr_assert_eq(capstan_client_begin(c), 0);
    capstan_batch_t *b = new_batch(c, "callbacks", "tcb", 0);
    push_n(b, "RecordJob", 3, record_args);
    cr_assert_eq(capstan_batch_commit(b), 0);
    cr_assert_eq(kt_int("EXISTS batch:%s", capstan_batch_bid(b)), 0, "nothing before the commit");
    cr_assert_eq(capstan_client_rollback(c), 0);
    cr_assert_eq(kt_int("EXISTS batch:%s", capstan_batch_bid(b)), 0);
    cr_assert_eq(kt_int("LLEN queue:default"), 0);
    capstan_batch_free(b);

    cr_assert_eq(capstan_client_begin(c), 0);
    b = new_batch(c, "callbacks", "tcb", 0);
    push_n(b, "RecordJob", 3, record_args);
    cr_assert_eq(capstan_batch_commit(b), 0);
    cr_assert_eq(capstan_client_commit(c), 0, "%s", capstan_client_error(c));
    cr_assert_eq(kt_int("HGET batch:%s total", capstan_batch_bid(b)), 3);
    cr_assert_eq(kt_int("LLEN queue:default"), 3);
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(queued("callbacks", "success", NULL) == 1, 20), "%s", kt_capstan_log(pid));
    capstan_batch_free(b);
    capstan_client_free(c);
}

/* A job of a batch that expired before its turn counts as a success of its
 * batch, as Sidekiq Pro counts it: the batch completes and succeeds though
 * the job never ran. */
Test(batch, an_expired_job_counts_as_a_success_of_its_batch)
{
    capstan_client_t *c = client();
    capstan_batch_t *b = new_batch(c, "default", "ecb", 1);
    capstan_push_opts_t o = capstan_push_opts_default();
    char extra[64];
    snprintf(extra, sizeof(extra), "{\"expires_at\":%.3f}", kt_wall() - 5);
    o.extra = extra;
    cr_assert_eq(capstan_batch_push(b, "RecordJob", "[\"erec\"]", &o, NULL), 0, "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_push(b, "RecordJob", "[\"erec\"]", NULL, NULL), 0, "%s", capstan_batch_error(b));
    cr_assert_eq(capstan_batch_commit(b), 0, "%s", capstan_batch_error(b));
    pid_t pid = capstan_start("default");
    cr_assert(KT_WAIT_UNTIL(kt_int("LLEN ecb") == 2, 20), "callbacks: %lld\n%s", kt_int("LLEN ecb"),
              kt_capstan_log(pid));
    json_t *st = NULL;
    cr_assert_eq(recorded("ecb", "complete", NULL), 1);
    cr_assert_eq(recorded("ecb", "success", &st), 1);
    cr_assert_eq(recorded("ecb", "death", NULL), 0);
    cr_assert_eq(num(st, "total"), 2);
    cr_assert_eq(num(st, "pending"), 0);
    cr_assert_eq(num(st, "failures"), 0);
    cr_assert_eq(kt_int("SCARD erec"), 1, "the expired job did not run");
    cr_assert(KT_WAIT_UNTIL(kt_log_has(pid, "INFO: expired"), 5), "%s", kt_capstan_log(pid));
    json_decref(st);
    capstan_batch_free(b);
    capstan_client_free(c);
}
