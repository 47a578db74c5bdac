/* Iterable jobs: the cursor of a handler that walks many items, kept in
 * Sidekiq's own hash it-<jid> (fields "ex" executions, "c" the cursor as
 * JSON, "rt" seconds run so far, "cancelled" epoch seconds), so a run
 * stopped between two steps resumes there, here or on a Ruby process with
 * a Sidekiq::IterableJob of the class. The rules follow Sidekiq 7.3+: the
 * state is read when the run starts, written every 5 seconds, when the run
 * is interrupted and when it fails, each write setting a 30-day expiry
 * (see flush), and deleted when the job completes or is cancelled. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>
#include <jansson.h>

#include "job/job.h"
#include "redis/keys.h"
#include "support/time.h"

/* Seconds between two writes of the state while a run goes on. */
#define FLUSH_EVERY 5.0
/* Seconds between two reads of "cancelled" by capstan_job_cancelled. */
#define CANCEL_POLL 1.0

struct capstan_iter {
    char *key;              /* it-<jid> */
    json_t *cursor;         /* the cursor of the step about to run, or NULL */
    long executions;        /* runs so far, this one included */
    double runtime;         /* seconds the earlier runs iterated */
    double started;         /* capstan__mono() when this run read its state */
    double flushed;         /* capstan__mono() of the last write */
    double polled;          /* capstan__mono() of the last read of "cancelled" */
    int stop;               /* CAPSTAN_ITER_STOP or _CANCELLED once said */
    int cancelled;
    int unread;             /* the state could not be read or parsed: this
                               run fails rather than start over and
                               overwrite it */
    int iterated;           /* capstan_job_cursor or _checkpoint was called
                               (capstan_job_cancelled alone is no iteration) */
    int unsaved;            /* the last write did not land */
};

/* The field named name in an HGETALL reply, or NULL. */
static const redisReply *field(const redisReply *r, const char *name)
{
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2)
        if (r->element[i]->type == REDIS_REPLY_STRING && strcmp(r->element[i]->str, name) == 0)
            return r->element[i + 1];
    return NULL;
}

/* The error class of a state that is there but cannot be used: a key of
 * another type, a cursor that does not parse. */
#define STATE_ERROR "Capstan::IterationStateError"

/* Fails the job when the HGETALL reply r cannot be used (c: its field
 * "c"), and returns nonzero then; else sets it->cursor and returns 0. */
static int unusable(capstan_job_t *job, struct capstan_iter *it, const redisReply *r,
                    const redisReply *c)
{
    json_error_t jerr;
    if (!r)
        return capstan_job_fail(job, "Redis::CannotConnectError", "reading %s: %s", it->key,
                                job->redis && job->redis->err ? job->redis->errstr : "no connection");
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGTYPE", 9) == 0)
        return capstan_job_fail(job, STATE_ERROR, "%s is not a hash: %s", it->key, r->str);
    if (r->type != REDIS_REPLY_ARRAY)
        return capstan_job_fail(job, "Redis::CommandError", "reading %s: %s", it->key,
                                r->type == REDIS_REPLY_ERROR ? r->str : "not an array");
    if (c && c->type == REDIS_REPLY_STRING
        && !(it->cursor = json_loadb(c->str, c->len, JSON_DECODE_ANY, &jerr)))
        return capstan_job_fail(job, STATE_ERROR, "%s: the cursor \"c\" does not parse: %s at byte %d",
                                it->key, jerr.text, jerr.position);
    if (json_is_null(it->cursor)) {
        json_decref(it->cursor);
        it->cursor = NULL;
    }
    return 0;
}

/* Reads the state at the first call of a run. A state that cannot be read
 * fails the job, as Ruby's IterableJob raises: its retry resumes from the
 * saved state, which this run must neither overwrite nor start over from
 * the first step. */
static struct capstan_iter *state(capstan_job_t *job)
{
    if (job->iter)
        return job->iter;
    struct capstan_iter *it = calloc(1, sizeof(*it));
    if (!it || !(it->key = capstan__key_dup(CAPSTAN_KEY_ITERATION, job->jid))) {
        free(it);
        return NULL;
    }
    job->iter = it;
    it->started = it->flushed = it->polled = capstan__mono();
    if (job->sandbox) {
        job->sandbox->iter_read(job->sandbox->ud, job->jid, &it->cursor, &it->executions, &it->cancelled);
    } else {
        redisReply *r = job->redis ? redisCommand(job->redis, "HGETALL %s", it->key) : NULL;
        const redisReply *ex = field(r, "ex"), *c = field(r, "c"), *rt = field(r, "rt"),
                         *cancelled = field(r, "cancelled");
        it->unread = unusable(job, it, r, c) != 0;
        if (ex && ex->type == REDIS_REPLY_STRING)
            it->executions = strtol(ex->str, NULL, 10);
        if (rt && rt->type == REDIS_REPLY_STRING)
            it->runtime = strtod(rt->str, NULL);
        it->cancelled = cancelled && cancelled->type == REDIS_REPLY_STRING;
        freeReplyObject(r);
    }
    if (it->executions < LONG_MAX) /* strtol's cap for a larger ex */
        it->executions++;
    return it;
}

/* Writes ex, c and rt, sets the expiry if none is set, and reads
 * "cancelled", in one MULTI, as Sidekiq's flush does. Sets it->unsaved
 * when the write did not land (a broken connection, a refused write). */
static void flush(capstan_job_t *job, struct capstan_iter *it)
{
    const char *key = it->key;
    char ex[32], rt[32], ttl[32];
    if (it->unread)
        return;
    if (job->sandbox) {
        job->sandbox->iter_write(job->sandbox->ud, job->jid, it->cursor, it->executions);
        it->flushed = it->polled = capstan__mono();
        return;
    }
    char *c = it->cursor ? json_dumps(it->cursor, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    snprintf(ex, sizeof(ex), "%ld", it->executions);
    snprintf(rt, sizeof(rt), "%.6f", it->runtime + (capstan__mono() - it->started));
    snprintf(ttl, sizeof(ttl), "%d", CAPSTAN_ITERATION_TTL);
    redisContext *r = job->redis;
    it->flushed = it->polled = capstan__mono();
    if (!r || (it->cursor && !c)) {
        free(c);
        return;
    }
    /* EXPIRE without NX, as Sidekiq 7.3 sends it (NX needs Redis 7; the
     * 30 days start again at each write, which Sidekiq 8's NX does not). */
    const char *hset[] = { "HSET", key, "ex", ex, "c", c ? c : "null", "rt", rt };
    const char *expire[] = { "EXPIRE", key, ttl };
    const char *hget[] = { "HGET", key, "cancelled" };
    redisAppendCommand(r, "MULTI");
    redisAppendCommandArgv(r, 8, hset, NULL);
    redisAppendCommandArgv(r, 3, expire, NULL);
    redisAppendCommandArgv(r, 3, hget, NULL);
    redisAppendCommand(r, "EXEC");
    free(c);
    redisReply *last = NULL;
    for (int i = 0; i < 5; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(r, (void **)&rep) != REDIS_OK)
            break;
        freeReplyObject(last);
        last = rep;
    }
    /* EXEC's reply: HSET, EXPIRE, HGET. A write that failed is tried again
     * at the next flush, and before an interrupted run goes back to its
     * queue (capstan__job_iter_save); a run cut off from Redis ends at a
     * hard stop and resumes from the last write that landed. */
    it->unsaved = !(last && last->type == REDIS_REPLY_ARRAY && last->elements == 3);
    if (!it->unsaved && last->element[2]->type == REDIS_REPLY_STRING)
        it->cancelled = 1;
    freeReplyObject(last);
}

int capstan__job_iter_save(capstan_job_t *job)
{
    struct capstan_iter *it = job->iter;
    if (!it || !it->unsaved)
        return 0;
    flush(job, it);
    return it->unsaved ? CAPSTAN_EREDIS : 0;
}

const json_t *capstan_job_cursor(capstan_job_t *job)
{
    struct capstan_iter *it = state(job);
    if (!it)
        return NULL;
    it->iterated = 1;
    return it->cursor;
}

long capstan_job_executions(const capstan_job_t *job)
{
    return job->iter ? job->iter->executions : 0;
}

/* Whether this run should stop at the next step: the process goes quiet or
 * stops, or the run iterated longer than max_iteration_runtime. */
static int interrupted(const capstan_job_t *job, const struct capstan_iter *it)
{
    return (job->quiet && atomic_load(job->quiet)) || (job->stopping && atomic_load(job->stopping))
        || (job->max_iteration_runtime > 0 && capstan__mono() - it->started > job->max_iteration_runtime);
}

int capstan_job_checkpoint(capstan_job_t *job, json_t *cursor)
{
    struct capstan_iter *it = state(job);
    if (!it)
        return CAPSTAN_ITER_NEXT; /* no memory: go on; a stop cannot be kept */
    it->iterated = 1;
    if (it->unread)
        return it->stop = CAPSTAN_ITER_STOP; /* the job has failed: see state() */
    if (it->stop)
        return it->stop;
    json_t *old = it->cursor;
    it->cursor = json_is_null(cursor) ? NULL : json_incref(cursor);
    json_decref(old);
    if (it->cancelled)
        return it->stop = CAPSTAN_ITER_CANCELLED;
    int stop = interrupted(job, it) || (job->sandbox && job->sandbox->iter_stop(job->sandbox->ud, job->jid));
    if (stop || capstan__mono() - it->flushed >= FLUSH_EVERY)
        flush(job, it);
    if (it->cancelled)
        return it->stop = CAPSTAN_ITER_CANCELLED;
    if (stop)
        return it->stop = CAPSTAN_ITER_STOP;
    return CAPSTAN_ITER_NEXT;
}

int capstan_job_cancelled(capstan_job_t *job)
{
    struct capstan_iter *it = state(job);
    if (!it || it->cancelled)
        return it ? 1 : 0;
    if (capstan__mono() - it->polled >= CANCEL_POLL && job->redis && !job->sandbox) {
        it->polled = capstan__mono();
        redisReply *r = redisCommand(job->redis, "HGET %s cancelled", it->key);
        it->cancelled = r && r->type == REDIS_REPLY_STRING;
        freeReplyObject(r);
    }
    return it->cancelled;
}

capstan_iterated_t capstan__job_iter_end(capstan_job_t *job)
{
    struct capstan_iter *it = job->iter;
    if (!it || !it->iterated || it->unread)
        return CAPSTAN_ITERATED_NOT; /* only polled for a cancel, or failed */
    if (job->err_class) {
        flush(job, it); /* a retry resumes from the cursor */
        return CAPSTAN_ITERATED_NOT;
    }
    if (it->stop == CAPSTAN_ITER_STOP)
        return CAPSTAN_ITERATED_STOPPED;
    if (job->sandbox)
        job->sandbox->iter_drop(job->sandbox->ud, job->jid);
    else
        freeReplyObject(job->redis ? redisCommand(job->redis, "UNLINK %s", it->key) : NULL);
    return it->cancelled ? CAPSTAN_ITERATED_CANCELLED : CAPSTAN_ITERATED_ALL;
}

void capstan__job_iter_free(capstan_job_t *job)
{
    if (!job->iter)
        return;
    json_decref(job->iter->cursor);
    free(job->iter->key);
    free(job->iter);
    job->iter = NULL;
}
