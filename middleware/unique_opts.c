/* The uniqueness options of one job, resolved as v9's Job.prepare does:
 * the payload's own fields first (a Ruby client wrote them from the class's
 * sidekiq_options), then the class's YAML options, then what the class was
 * registered (or the push was made) with.
 *
 * Bad input never stops a job: each bad value is logged once here and
 * replaced by its default, and the job runs. */
#include "middleware/unique_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/log.h"
#include "support/time.h"
#include "middleware/mw.h"

static char *field_str(kiq_mw_t *mw, const char *key)
{
    size_t len;
    const char *v = kiq_mw_field_raw(mw, key, &len);
    return v && *v == '"' ? kiq_json_string_dup(v, len) : NULL;
}

/* 1 with *out set when key holds a number, 0 when absent or null, -1 when
 * it holds something else. */
static int field_num(kiq_mw_t *mw, const char *key, double *out)
{
    size_t len;
    const char *v = kiq_mw_field_raw(mw, key, &len);
    if (!v || (len == 4 && !memcmp(v, "null", 4)))
        return 0;
    char tmp[64];
    size_t n = len < sizeof(tmp) - 1 ? len : sizeof(tmp) - 1;
    memcpy(tmp, v, n);
    tmp[n] = '\0';
    if (*tmp == '"') /* Ruby accepts numeric strings for lock_ttl */
        memmove(tmp, tmp + 1, strlen(tmp));
    char *end;
    double d = strtod(tmp, &end);
    if (end == tmp || (*end && *end != '"') || !isfinite(d))
        return -1;
    *out = d;
    return 1;
}

/* d >= 0 seconds of the payload's key, cut to KIQ_UNIQUE_MAX_SECONDS with
 * a log line (a lock for centuries is a typo, not a wish). */
static long seconds(kiq_mw_t *mw, const char *key, double d)
{
    if (d <= (double)KIQ_UNIQUE_MAX_SECONDS)
        return (long)d;
    kiq_warn("%s %s: %s %g is more than 10 years; using 10 years", mw->cls, mw->jid, key, d);
    return KIQ_UNIQUE_MAX_SECONDS;
}

static int field_true(kiq_mw_t *mw, const char *key)
{
    size_t len;
    const char *v = kiq_mw_field_raw(mw, key, &len);
    return v && !(len == 4 && !memcmp(v, "null", 4)) && !(len == 5 && !memcmp(v, "false", 5));
}

static void strategy(kiq_mw_t *mw, const char *name, kiq_on_conflict_t *out)
{
    kiq_on_conflict_t st;
    if (!name)
        return;
    if (kiq_on_conflict_parse(name, &st) == 0)
        *out = st;
    else
        kiq_warn("%s %s: unknown on_conflict strategy \"%s\"; using log", mw->cls, mw->jid, name);
}

/* on_conflict in the payload: a name, or {"client": name, "server": name}. */
static void payload_strategies(kiq_mw_t *mw, kiq_unique_spec_t *s)
{
    size_t len;
    const char *v = kiq_mw_field_raw(mw, "on_conflict", &len);
    if (!v)
        return;
    if (*v == '"') {
        char *name = kiq_json_string_dup(v, len);
        strategy(mw, name, &s->client);
        strategy(mw, name, &s->server);
        free(name);
        return;
    }
    kiq_jobject_t obj = {0};
    if (*v == '{' && kiq_json_scan_object(v, len, &obj, NULL) == 0) {
        const kiq_jmember_t *c = kiq_jobject_get(&obj, v, "client");
        const kiq_jmember_t *sv = kiq_jobject_get(&obj, v, "server");
        char *cn = c ? kiq_json_string_dup(v + c->vstart, c->vlen) : NULL;
        char *sn = sv ? kiq_json_string_dup(v + sv->vstart, sv->vlen) : NULL;
        strategy(mw, cn, &s->client);
        strategy(mw, sn, &s->server);
        free(cn);
        free(sn);
    } else if (!(len == 4 && !memcmp(v, "null", 4))) {
        kiq_warn("%s %s: on_conflict must be a name or {client:, server:}; using log",
                 mw->cls, mw->jid);
    }
    kiq_jobject_free(&obj);
}

void kiq_unique__spec_clear(kiq_unique_spec_t *s)
{
    free(s->lock_args);
    s->lock_args = NULL;
}

int kiq_unique__resolve(kiq_mw_t *mw, kiq_unique_spec_t *s, int compute_digest, char *err)
{
    memset(s, 0, sizeof(*s));
    const kiq_unique_opts_t *o = mw->unique;
    const kiq_class_conf_t *cc = mw->cc;
    const int *idx = NULL;
    size_t nidx = 0;
    const char *prefix = NULL;
    int rc = 0;
    char *str = NULL;
    if (o) {
        s->type = o->lock;
        s->ttl = o->lock_ttl;
        s->timeout = o->lock_timeout;
        s->limit = o->lock_limit;
        prefix = o->lock_prefix;
        s->client = o->on_conflict_client;
        s->server = o->on_conflict_server;
        s->across_queues = o->unique_across_queues;
        s->across_workers = o->unique_across_workers;
        s->alg = o->digest_alg;
        s->schedule_in = o->schedule_in;
        idx = o->lock_args;
        nidx = o->nlock_args;
    }
    if (cc) {
        if (cc->lock)
            (void)kiq_lock_type_parse(cc->lock, &s->type); /* checked when read */
        if (cc->lock_ttl) s->ttl = cc->lock_ttl;
        if (cc->lock_timeout) s->timeout = cc->lock_timeout;
        if (cc->lock_limit) s->limit = cc->lock_limit;
        if (cc->lock_prefix) prefix = cc->lock_prefix;
        if (cc->on_conflict_client) (void)kiq_on_conflict_parse(cc->on_conflict_client, &s->client);
        if (cc->on_conflict_server) (void)kiq_on_conflict_parse(cc->on_conflict_server, &s->server);
        if (cc->unique_across_queues) s->across_queues = 1;
        if (cc->unique_across_workers) s->across_workers = 1;
        if (cc->schedule_in > 0) s->schedule_in = cc->schedule_in;
        if (cc->lock_args) {
            idx = cc->lock_args;
            nidx = cc->nlock_args;
        }
    }
    /* The payload's own fields. */
    if ((str = field_str(mw, "lock"))) {
        kiq_lock_type_t t;
        if (kiq_lock_type_parse(str, &t) == 0) {
            s->type = t;
        } else {
            kiq_warn("%s %s: unknown lock type \"%s\"; running it without a lock",
                     mw->cls, mw->jid, str);
            s->type = KIQ_LOCK_NONE;
            goto out;
        }
        free(str);
        str = NULL;
    } else if (kiq_mw_field_raw(mw, "lock", NULL) && field_true(mw, "lock")) {
        kiq_warn("%s %s: \"lock\" is not a lock type name; running it without a lock",
                 mw->cls, mw->jid);
        s->type = KIQ_LOCK_NONE;
        goto out;
    }
    if (s->type == KIQ_LOCK_NONE)
        goto out;
    double d;
    int k = field_num(mw, "lock_ttl", &d);
    if (k < 0 || (k > 0 && d < 0)) {
        kiq_warn("%s %s: lock_ttl must be a number of seconds >= 0; the lock has no expiry",
                 mw->cls, mw->jid);
        s->ttl = 0;
    } else if (k > 0 || (k == 0 && kiq_mw_field_raw(mw, "lock_ttl", NULL))) {
        s->ttl = k > 0 ? seconds(mw, "lock_ttl", d) : 0; /* null in the payload: no expiry */
    }
    if (field_num(mw, "lock_timeout", &d) > 0)
        s->timeout = d > 0 ? seconds(mw, "lock_timeout", d) : 0;
    k = field_num(mw, "lock_limit", &d);
    if (k > 0)
        s->limit = d >= INT_MAX ? INT_MAX : d >= 1 ? (int)d : 1;
    /* The class's options are bounded when read, but not this tightly. */
    if (s->ttl > KIQ_UNIQUE_MAX_SECONDS)
        s->ttl = KIQ_UNIQUE_MAX_SECONDS;
    if (s->timeout > KIQ_UNIQUE_MAX_SECONDS)
        s->timeout = KIQ_UNIQUE_MAX_SECONDS;
    if ((str = field_str(mw, "lock_prefix")) && *str) {
        snprintf(s->prefix, sizeof(s->prefix), "%s", str);
        prefix = NULL;
    }
    free(str);
    str = NULL;
    if (!s->prefix[0])
        snprintf(s->prefix, sizeof(s->prefix), "%s",
                 prefix && *prefix ? prefix : KIQ_KEY_UNIQUE_PREFIX);
    payload_strategies(mw, s);
    if (field_true(mw, "unique_across_queues")) s->across_queues = 1;
    if (field_true(mw, "unique_across_workers")) s->across_workers = 1;
    if (s->type == KIQ_LOCK_WHILE_EXECUTING_REJECT)
        s->server = KIQ_CONFLICT_REJECT;
    if (!compute_digest)
        goto out;

    /* lock_args: the payload's, else args (filtered by indexes). */
    size_t len;
    const char *la = kiq_mw_field_raw(mw, "lock_args", &len);
    if (la && *la == '[' && mw->server)
        s->lock_args = kiq_ruby_json_dup(la, len, NULL);
    if (!s->lock_args) {
        const char *args = kiq_mw_field_raw(mw, "args", &len);
        if (!args) {
            args = "[]";
            len = 2;
        }
        s->lock_args = kiq_unique_lock_args(args, len, idx, nidx);
    }
    if (!s->lock_args) {
        rc = kiq_seterr(err, KIQ_EPARSE, "args is not a JSON array");
        goto out;
    }
    /* A lock_digest written by the client (Ruby's may come from a lock-args
     * method kiq cannot run) is trusted as is. */
    if ((str = field_str(mw, "lock_digest")) && mw->server) {
        if (kiq_unique_digest_valid(str)) {
            size_t n = kiq_key_base(str, KIQ_KEY_RUN);
            if (n)
                str[n] = '\0';
            snprintf(s->digest, sizeof(s->digest), "%s", str);
            s->digest_from_payload = 1;
            goto out;
        }
        kiq_warn("%s %s: lock_digest \"%.80s\" is not a digest; using the one computed from "
                 "class, queue and args", mw->cls, mw->jid, str);
    } else if (mw->server && kiq_mw_field_raw(mw, "lock_digest", NULL)) {
        kiq_warn("%s %s: lock_digest is not a string; using the one computed from class, "
                 "queue and args", mw->cls, mw->jid);
    }
    const char *apt = kiq_mw_field_raw(mw, "apartment", &len);
    free(str);
    str = field_str(mw, "queue"); /* what Ruby hashes, wherever it was fetched */
    kiq_digest_input_t in = {
        .cls = mw->cls, .queue = str ? str : mw->queue, .lock_args = s->lock_args,
        .apartment = apt, .apartment_len = apt ? len : 0, .lock_prefix = s->prefix,
        .unique_across_queues = s->across_queues, .unique_across_workers = s->across_workers,
        .alg = s->alg,
    };
    rc = kiq_unique_digest(&in, s->digest, NULL, err);
out:
    free(str);
    if (rc)
        kiq_unique__spec_clear(s);
    return rc;
}
