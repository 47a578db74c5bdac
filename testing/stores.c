/* The testing kit's uniqueness locks and limiters, in its memory: the lock
 * store (unique/internal.h) and the limit store (locks/limiter_internal.h)
 * the real middleware call while the kit runs, and capstan_test_hold_lock,
 * capstan_test_locks_held and capstan_test_limit_take. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "middleware/mw.h"
#include "redis/keys.h"
#include "runtime/rt.h"
#include "support/time.h"
#include "testing/testing_internal.h"

/* ---- locks ----------------------------------------------------------- */

static void lock_key(char *out, size_t n, const char *digest, int runtime)
{
    snprintf(out, n, "%s%s%s", digest, runtime ? CAPSTAN_KEY_RUN : "", CAPSTAN_KEY_LOCKED);
}

static int store_lock(void *ud, const capstan_lock_req_t *q)
{
    capstan_test_t *t = ud;
    char key[CAPSTAN_DIGEST_MAX + 16];
    lock_key(key, sizeof(key), q->digest, q->runtime);
    size_t others = 0;
    for (size_t i = 0; i < t->nholds; i++)
        if (strcmp(t->holds[i].key, key) == 0) {
            if (strcmp(t->holds[i].jid, q->jid) == 0)
                return CAPSTAN_LOCK_REENTERED;
            others++;
        }
    if (others >= (size_t)(q->limit > 1 ? q->limit : 1))
        return CAPSTAN_EDENIED;
    hold_t *h = realloc(t->holds, (t->nholds + 1) * sizeof(*h));
    if (!h)
        return CAPSTAN_ENOMEM;
    t->holds = h;
    h = &t->holds[t->nholds];
    h->key = strdup(key);
    h->jid = strdup(q->jid);
    h->type = q->type;
    if (!h->key || !h->jid) {
        free(h->key);
        free(h->jid);
        return CAPSTAN_ENOMEM;
    }
    t->nholds++;
    return CAPSTAN_LOCK_ACQUIRED;
}

/* Drops jid's hold on key; force: until_expired's too. Returns as
 * capstan_unique_unlock. */
static int drop_hold(capstan_test_t *t, const char *key, const char *jid, int force)
{
    int others = 0;
    for (size_t i = 0; i < t->nholds; i++) {
        hold_t *h = &t->holds[i];
        if (strcmp(h->key, key) != 0)
            continue;
        if (strcmp(h->jid, jid) != 0) {
            others = 1;
            continue;
        }
        if (h->type == CAPSTAN_LOCK_UNTIL_EXPIRED && !force)
            return 0; /* v9: it stays until its ttl */
        free(h->key);
        free(h->jid);
        t->holds[i] = t->holds[--t->nholds];
        return 0;
    }
    return others ? CAPSTAN_EDENIED : 0;
}

static int store_unlock(void *ud, const char *digest, int runtime, const char *jid, capstan_lock_type_t type,
                        int force)
{
    (void)type;
    char key[CAPSTAN_DIGEST_MAX + 16];
    lock_key(key, sizeof(key), digest, runtime);
    return drop_hold(ud, key, jid, force);
}

int capstan_test_hold_lock(capstan_test_t *t, const char *payload)
{
    t->err[0] = '\0';
    char err[CAPSTAN_ERRLEN];
    size_t len = payload ? strlen(payload) : 0;
    char *copy = payload ? strdup(payload) : NULL;
    if (!copy)
        return capstan_seterr(t->err, payload ? CAPSTAN_ENOMEM : CAPSTAN_EINVAL, "no payload");
    capstan_job_t job;
    int rc = capstan__job_init(&job, copy, len, "default", err);
    if (rc) {
        capstan__job_clear(&job);
        return capstan_seterr(t->err, rc, "not a job: %s", err);
    }
    /* Inside a run the rows are in use, and resolved already. */
    if (!t->depth && (rc = capstan__test_prepare(t))) {
        capstan__job_clear(&job);
        return rc;
    }
    /* The lock options as the job's server chain resolves them. */
    const capstan_class_row_t *row = capstan__class_find(t->rt, job.cls);
    capstan_mw_t mw = { .server = 1, .r = t->r, .cfg = t->rt->cfg, .cc = row->cc,
                        .unique = row->h ? row->h->unique : NULL, .job = &job,
                        .cls = job.wrapper ? job.wrapper : job.cls, .jid = job.jid, .queue = job.queue };
    capstan_unique_spec_t s;
    if ((rc = capstan_unique__resolve(&mw, &s, 1, err))) {
        capstan__job_clear(&job);
        return capstan_seterr(t->err, rc, "%s", err);
    }
    int runtime = s.type == CAPSTAN_LOCK_WHILE_EXECUTING || s.type == CAPSTAN_LOCK_WHILE_EXECUTING_REJECT;
    capstan_lock_req_t q = { .digest = s.digest, .runtime = runtime, .jid = job.jid, .type = s.type,
                             .limit = s.limit };
    if (s.type == CAPSTAN_LOCK_NONE)
        rc = capstan_seterr(t->err, CAPSTAN_EINVAL, "%s is not unique: it takes no lock", job.cls);
    else if ((rc = store_lock(t, &q)) == CAPSTAN_EDENIED)
        capstan_seterr(t->err, rc, "lock %s is held by another job", s.digest);
    else if (rc < 0)
        capstan_seterr(t->err, rc, "out of memory");
    capstan_unique__spec_clear(&s);
    capstan__job_clear(&job);
    return rc < 0 ? rc : 0;
}

size_t capstan_test_locks_held(const capstan_test_t *t) { return t->nholds; }

/* ---- limiters -------------------------------------------------------- */

static spent_t *spent_add(capstan_test_t *t, const char *name, const char *holder)
{
    spent_t *u = realloc(t->spent, (t->nspent + 1) * sizeof(*u));
    if (!u)
        return NULL;
    t->spent = u;
    u = &t->spent[t->nspent];
    *u = (spent_t){ .name = strdup(name), .holder = holder ? strdup(holder) : NULL, .since = capstan__now() };
    if (!u->name || (holder && !u->holder)) {
        free(u->name);
        free(u->holder);
        return NULL;
    }
    t->nspent++;
    return u;
}

static spent_t *rate_of(capstan_test_t *t, const char *name)
{
    for (size_t i = 0; i < t->nspent; i++)
        if (!t->spent[i].holder && strcmp(t->spent[i].name, name) == 0)
            return &t->spent[i];
    return spent_add(t, name, NULL);
}

/* A concurrent limit counts the jobs holding a slot; the others the points
 * spent in the current period of ms, a new period starting once it has
 * passed (a bucket's steady refill comes as whole periods). */
static int limit_attempt(void *ud, const char *name, capstan_limit_type_t type, long count, long long ms,
                         const char *holder, long points, long long *wait_ms)
{
    capstan_test_t *t = ud;
    if (type == CAPSTAN_LIMIT_CONCURRENT) {
        long n = 0;
        for (size_t i = 0; i < t->nspent; i++)
            n += t->spent[i].holder && strcmp(t->spent[i].name, name) == 0;
        if (n < count)
            return spent_add(t, name, holder) ? 1 : CAPSTAN_ENOMEM;
        *wait_ms = ms;
        return 0;
    }
    spent_t *u = rate_of(t, name);
    if (!u)
        return CAPSTAN_ENOMEM;
    double now = capstan__now(), period = (double)ms / 1000;
    if (now - u->since >= period) {
        u->since = now;
        u->points = 0;
    }
    if (u->points + points <= count) {
        u->points += points;
        return 1;
    }
    long long left = (long long)((u->since + period - now) * 1000);
    *wait_ms = left > 0 ? left : 1;
    return 0;
}

static void limit_release(void *ud, const char *name, const char *holder)
{
    capstan_test_t *t = ud;
    for (size_t i = 0; i < t->nspent; i++)
        if (t->spent[i].holder && strcmp(t->spent[i].holder, holder) == 0 && strcmp(t->spent[i].name, name) == 0) {
            free(t->spent[i].name);
            free(t->spent[i].holder);
            t->spent[i] = t->spent[--t->nspent];
            return;
        }
}

int capstan_test_limit_take(capstan_test_t *t, const char *name, long n)
{
    if (!name || n < 1)
        return capstan_seterr(t->err, CAPSTAN_EINVAL, "capstan_test_limit_take: a name and n >= 1");
    char holder[64];
    spent_t *u = rate_of(t, name);
    if (!u)
        return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    u->points += n;
    for (long i = 0; i < n; i++) {
        snprintf(holder, sizeof(holder), "capstan_test_limit_take:%ld", i);
        if (!spent_add(t, name, holder))
            return capstan_seterr(t->err, CAPSTAN_ENOMEM, "out of memory");
    }
    return 0;
}

/* ---- the kit's stores ------------------------------------------------ */

void capstan__test_stores_init(capstan_test_t *t)
{
    t->store = (capstan_lock_store_t){ store_lock, store_unlock, t };
    t->limits = (capstan_limit_store_t){ limit_attempt, limit_release, t };
}

void capstan__test_stores_free(capstan_test_t *t)
{
    for (size_t i = 0; i < t->nholds; i++) {
        free(t->holds[i].key);
        free(t->holds[i].jid);
    }
    free(t->holds);
    for (size_t i = 0; i < t->nspent; i++) {
        free(t->spent[i].name);
        free(t->spent[i].holder);
    }
    free(t->spent);
}

/* Releases in the kit's memory the lock the ack would release. */
void capstan__test_ack_release(capstan_test_t *t, const capstan_outcome_t *out, const char *jid)
{
    const char *key = capstan__outcome_release_key(out);
    if (key)
        (void)drop_hold(t, key, jid, 0);
}
