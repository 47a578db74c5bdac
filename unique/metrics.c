/* Uniqueness lock metrics in sidekiq-unique-jobs v9's per-minute hashes, so
 * that its web UI, a Ruby console and `capstan locks metrics` all read the same
 * counts whichever process recorded them. */
#include "unique/admin_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe/prometheus.h"
#include "redis/keys.h"
#include "support/fmt.h"

#define METRICS_TTL_STR "28800"

void capstan__unique_metrics_key(time_t t, char *out, size_t n)
{
    struct tm tm;
    gmtime_r(&t, &tm);
    /* v9 formats "%y%m%d|%-H:%M": the hour is not padded, the minute is. */
    snprintf(out, n, CAPSTAN_KEY_METRICS "%02d%02d%02d|%d:%02d", tm.tm_year % 100,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min);
}

int capstan__unique_metric_at(capstan_redis_t *r, const char *lock_type, const char *event, time_t t)
{
    if (!event || !*event)
        return CAPSTAN_EINVAL;
    char key[64], field[256], total[128];
    capstan__unique_metrics_key(t, key, sizeof(key));
    snprintf(field, sizeof(field), "%s|%s", lock_type && *lock_type ? lock_type : "unknown",
             event);
    snprintf(total, sizeof(total), "total|%s", event);
    const char *c1[] = { "HINCRBY", key, field, "1" };
    const char *c2[] = { "HINCRBY", key, total, "1" };
    const char *c3[] = { "EXPIRE", key, METRICS_TTL_STR };
    int rc = capstan_redis_append(r, 4, c1, NULL);
    if (!rc)
        rc = capstan_redis_append(r, 4, c2, NULL);
    if (!rc)
        rc = capstan_redis_append(r, 3, c3, NULL);
    if (rc)
        return CAPSTAN_EREDIS;
    /* Read all three replies even after an error reply, or the next command
     * on this connection would get a stale one. */
    for (int i = 0; i < 3; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep)
            return CAPSTAN_EREDIS;
        if (rep->type == REDIS_REPLY_ERROR)
            rc = CAPSTAN_EREPLY;
        freeReplyObject(rep);
    }
    return rc;
}

int capstan__unique_metric(capstan_redis_t *r, const char *lock_type, const char *event)
{
    return capstan__unique_metric_at(r, lock_type, event, time(NULL));
}

#define PENDING_MAX 256

/* Counts wait for the heartbeat of the shard they happened in: each is
 * kept with the registry of the thread that counted it
 * (capstan__metrics_here), and a flush writes those of its own thread's,
 * and on home's threads (the first shard's) those counted outside every
 * shard too, in the default registry (a program's own client thread). */
typedef struct pending_metric {
    const capstan_metrics_t *owner;
    char key[64];       /* minute bucket of the event */
    char field[160];    /* "<type>|<event>" or "total|<event>" */
    long n;
} pending_metric_t;

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static pending_metric_t pending[PENDING_MAX];
static size_t npending;
static atomic_int buffering;
static const capstan_metrics_t *_Atomic home;

void capstan__unique_metrics_home(const capstan_metrics_t *first)
{
    atomic_store(&home, first);
}

void capstan__unique_metrics_buffer(int on)
{
    atomic_store(&buffering, on);
}

/* Adds n to (key, field); returns 0, or -1 when the buffer is full.
 * pending_lock is held. */
static int pending_add(const capstan_metrics_t *owner, const char *key, const char *field, long n)
{
    for (size_t i = 0; i < npending; i++)
        if (pending[i].owner == owner && !strcmp(pending[i].key, key) && !strcmp(pending[i].field, field)) {
            pending[i].n += n;
            return 0;
        }
    if (npending == PENDING_MAX)
        return -1;
    pending[npending].owner = owner;
    capstan__fmt_cat(pending[npending].key, sizeof(pending[npending].key), key, NULL);
    capstan__fmt_cat(pending[npending].field, sizeof(pending[npending].field), field, NULL);
    pending[npending++].n = n;
    return 0;
}

int capstan__unique_metric_record(capstan_redis_t *r, const char *lock_type, const char *event)
{
    if (!event || !*event)
        return CAPSTAN_EINVAL;
    if (atomic_load(&buffering)) {
        /* This runs for each lock taken or released: the minute's key is
         * made once a second per thread (gmtime_r takes a process lock). */
        static _Thread_local time_t key_at;
        static _Thread_local char key[64];
        char field[160], total[160];
        time_t now = time(NULL);
        if (now != key_at) {
            capstan__unique_metrics_key(now, key, sizeof(key));
            key_at = now;
        }
        capstan__fmt_cat(field, sizeof(field), lock_type && *lock_type ? lock_type : "unknown", "|",
                         event, NULL);
        capstan__fmt_cat(total, sizeof(total), "total|", event, NULL);
        const capstan_metrics_t *owner = capstan__metrics_here();
        pthread_mutex_lock(&pending_lock);
        int full = npending + 2 > PENDING_MAX;
        if (!full) {
            pending_add(owner, key, field, 1);
            pending_add(owner, key, total, 1);
        }
        pthread_mutex_unlock(&pending_lock);
        if (!full)
            return 0;
    }
    return capstan__unique_metric(r, lock_type, event);
}

int capstan__unique_metrics_flush(capstan_redis_t *r)
{
    const capstan_metrics_t *owner = capstan__metrics_here();
    const capstan_metrics_t *outside = owner == atomic_load(&home) ? capstan__metrics_default() : owner;
    pthread_mutex_lock(&pending_lock);
    size_t n = 0, kept = 0;
    for (size_t i = 0; i < npending; i++)
        n += pending[i].owner == owner || pending[i].owner == outside;
    pending_metric_t *batch = n ? malloc(n * sizeof(*batch)) : NULL;
    for (size_t i = 0, k = 0; batch && i < npending; i++) {
        if (pending[i].owner == owner || pending[i].owner == outside)
            batch[k++] = pending[i];
        else
            pending[kept++] = pending[i];
    }
    if (batch)
        npending = kept;
    pthread_mutex_unlock(&pending_lock);
    if (!batch)
        return n ? CAPSTAN_ENOMEM : 0;
    int rc = 0, sent = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char num[32];
        snprintf(num, sizeof(num), "%ld", batch[i].n);
        const char *hincr[] = { "HINCRBY", batch[i].key, batch[i].field, num };
        const char *exp[] = { "EXPIRE", batch[i].key, METRICS_TTL_STR };
        rc = capstan_redis_append(r, 4, hincr, NULL);
        if (!rc && !(rc = capstan_redis_append(r, 3, exp, NULL)))
            sent += 2;
        else if (!rc)
            sent++;
    }
    for (int i = 0; i < sent; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep) {
            rc = CAPSTAN_EREDIS;
            break;
        }
        freeReplyObject(rep);
    }
    if (rc == CAPSTAN_EREDIS) {
        /* Not known to be written: count them again next time (a reply lost
         * mid-pipeline can count a beat's worth twice, as the job stats). */
        pthread_mutex_lock(&pending_lock);
        for (size_t i = 0; i < n; i++)
            pending_add(batch[i].owner, batch[i].key, batch[i].field, batch[i].n);
        pthread_mutex_unlock(&pending_lock);
    }
    free(batch);
    return rc;
}

void capstan__unique_metrics_clear(capstan_unique_metrics_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++)
        free(m->rows[i].type);
    free(m->rows);
    m->rows = NULL;
    m->n = 0;
}

/* The row for type, added when missing; NULL when out of memory. */
static capstan_unique_metrics_row_t *row_for(capstan_unique_metrics_t *m, const char *type, size_t len)
{
    for (size_t i = 0; i < m->n; i++)
        if (strlen(m->rows[i].type) == len && memcmp(m->rows[i].type, type, len) == 0)
            return &m->rows[i];
    capstan_unique_metrics_row_t *rows = realloc(m->rows, (m->n + 1) * sizeof(*rows));
    if (!rows)
        return NULL;
    m->rows = rows;
    capstan_unique_metrics_row_t *row = &rows[m->n];
    memset(row, 0, sizeof(*row));
    if (!(row->type = strndup(type, len)))
        return NULL;
    m->n++;
    return row;
}

/* Adds one "<type>|<event>" field; 0 or CAPSTAN_ENOMEM. Unknown events (v9
 * declares "reaped" and never writes it) are ignored. */
static int add_field(capstan_unique_metrics_t *m, const char *field, const char *value)
{
    const char *bar = strrchr(field, '|');
    if (!bar || bar == field)
        return 0;
    const char *event = bar + 1;
    long long v = strtoll(value, NULL, 10);
    long long *slot = NULL;
    capstan_unique_metrics_row_t *row = row_for(m, field, (size_t)(bar - field));
    if (!row)
        return CAPSTAN_ENOMEM;
    if (!strcmp(event, "locked"))
        slot = &row->acquired;
    else if (!strcmp(event, "lock_failed"))
        slot = &row->denied;
    else if (!strcmp(event, "unlocked"))
        slot = &row->released;
    else if (!strcmp(event, "execution_failed") || !strcmp(event, "unlock_failed"))
        slot = &row->failures;
    if (slot)
        *slot += v;
    return 0;
}

static int by_type_total_last(const void *a, const void *b)
{
    const capstan_unique_metrics_row_t *x = a, *y = b;
    int xt = !strcmp(x->type, "total"), yt = !strcmp(y->type, "total");
    if (xt != yt)
        return xt - yt;
    return strcmp(x->type, y->type);
}

int capstan__unique_metrics_read(capstan_redis_t *r, int minutes, capstan_unique_metrics_t *out, char *err)
{
    int rc = 0, sent = 0, got = 0;
    out->rows = NULL;
    out->n = 0;
    if (minutes <= 0)
        minutes = 60;
    time_t now = time(NULL);
    for (int i = 0; i < minutes; i++) {
        char key[64];
        capstan__unique_metrics_key(now - (time_t)i * 60, key, sizeof(key));
        const char *argv[] = { "HGETALL", key };
        if (capstan_redis_append(r, 2, argv, NULL)) {
            rc = capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
            goto out;
        }
        sent++;
    }
    for (; got < sent; got++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep) {
            rc = capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
            goto out;
        }
        if (rep->type == REDIS_REPLY_ERROR && !rc)
            rc = capstan_seterr(err, CAPSTAN_EREPLY, "HGETALL: %s", rep->str);
        for (size_t k = 0; !rc && rep->type == REDIS_REPLY_ARRAY && k + 1 < rep->elements; k += 2)
            if (rep->element[k]->type == REDIS_REPLY_STRING
                && rep->element[k + 1]->type == REDIS_REPLY_STRING
                && add_field(out, rep->element[k]->str, rep->element[k + 1]->str))
                rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        freeReplyObject(rep);
    }
    if (!rc && out->n)
        qsort(out->rows, out->n, sizeof(*out->rows), by_type_total_last);
out:
    if (rc)
        capstan__unique_metrics_clear(out);
    return rc;
}
