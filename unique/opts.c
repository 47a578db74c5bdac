/* The uniqueness options of one job, resolved as v9's Job.prepare does:
 * the payload's own fields first (a Ruby client wrote them from the class's
 * sidekiq_options), then the class's YAML options, then what the class was
 * registered (or the push was made) with.
 *
 * Bad input never stops a job: each bad value is logged once here and
 * replaced by its default, and the job runs. */
#include "unique/internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/fmt.h"
#include "support/log.h"
#include "support/time.h"
#include "middleware/mw.h"

static char *field_str(capstan_mw_t *mw, const char *key)
{
    size_t len;
    const char *v = capstan_mw_field_raw(mw, key, &len);
    return v && *v == '"' ? capstan__json_string_dup(v, len) : NULL;
}

/* 1 with *out set when key holds a number, 0 when absent or null, -1 when
 * it holds something else. */
static int field_num(capstan_mw_t *mw, const char *key, double *out)
{
    size_t len;
    const char *v = capstan_mw_field_raw(mw, key, &len);
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

/* d >= 0 seconds of the payload's key, cut to CAPSTAN_UNIQUE_MAX_SECONDS with
 * a log line (a lock for centuries is a typo, not a wish). */
static long seconds(capstan_mw_t *mw, const char *key, double d)
{
    if (d <= (double)CAPSTAN_UNIQUE_MAX_SECONDS)
        return (long)d;
    capstan_warn("%s %s: %s %g is more than 10 years; using 10 years", mw->cls, mw->jid, key, d);
    return CAPSTAN_UNIQUE_MAX_SECONDS;
}

static int field_true(capstan_mw_t *mw, const char *key)
{
    size_t len;
    const char *v = capstan_mw_field_raw(mw, key, &len);
    return v && !(len == 4 && !memcmp(v, "null", 4)) && !(len == 5 && !memcmp(v, "false", 5));
}

static void strategy(capstan_mw_t *mw, const char *name, capstan_on_conflict_t *out)
{
    capstan_on_conflict_t st;
    if (!name)
        return;
    if (capstan_on_conflict_parse(name, &st) == 0)
        *out = st;
    else
        capstan_warn("%s %s: unknown on_conflict strategy \"%s\"; using log", mw->cls, mw->jid, name);
}

/* on_conflict in the payload: a name, or {"client": name, "server": name}. */
static void payload_strategies(capstan_mw_t *mw, capstan_unique_spec_t *s)
{
    size_t len;
    const char *v = capstan_mw_field_raw(mw, "on_conflict", &len);
    if (!v)
        return;
    if (*v == '"') {
        char *name = capstan__json_string_dup(v, len);
        strategy(mw, name, &s->client);
        strategy(mw, name, &s->server);
        free(name);
        return;
    }
    capstan_jobject_t obj = {0};
    if (*v == '{' && capstan__json_scan_object(v, len, &obj, NULL) == 0) {
        const capstan_jmember_t *c = capstan__jobject_get(&obj, v, "client");
        const capstan_jmember_t *sv = capstan__jobject_get(&obj, v, "server");
        char *cn = c ? capstan__json_string_dup(v + c->vstart, c->vlen) : NULL;
        char *sn = sv ? capstan__json_string_dup(v + sv->vstart, sv->vlen) : NULL;
        strategy(mw, cn, &s->client);
        strategy(mw, sn, &s->server);
        free(cn);
        free(sn);
    } else if (!(len == 4 && !memcmp(v, "null", 4))) {
        capstan_warn("%s %s: on_conflict must be a name or {client:, server:}; using log",
                     mw->cls, mw->jid);
    }
    capstan__jobject_free(&obj);
}

void capstan_unique__spec_clear(capstan_unique_spec_t *s)
{
    free(s->lock_args);
    s->lock_args = NULL;
}

/* What the registration and the class leave for the later steps: the
 * lock_args indexes and the key prefix (both borrowed). */
typedef struct inherited {
    const char *prefix;
    const int *idx;
    size_t nidx;
} inherited_t;

/* The options the class was registered (or the push was made) with. */
static void from_registration(const capstan_unique_opts_t *o, capstan_unique_spec_t *s, inherited_t *in)
{
    s->type = o->lock;
    s->ttl = o->lock_ttl;
    s->timeout = o->lock_timeout;
    s->limit = o->lock_limit;
    s->client = o->on_conflict_client;
    s->server = o->on_conflict_server;
    s->across_queues = o->unique_across_queues;
    s->across_workers = o->unique_across_workers;
    s->alg = o->digest_alg;
    s->schedule_in = o->schedule_in;
    in->prefix = o->lock_prefix;
    in->idx = o->lock_args;
    in->nidx = o->nlock_args;
}

/* The class's YAML options, over the registration's where set. */
static void from_class(const capstan_class_conf_t *cc, capstan_unique_spec_t *s, inherited_t *in)
{
    if (cc->lock)
        (void)capstan_lock_type_parse(cc->lock, &s->type); /* checked when read */
    if (cc->lock_ttl) s->ttl = cc->lock_ttl;
    if (cc->lock_timeout) s->timeout = cc->lock_timeout;
    if (cc->lock_limit) s->limit = cc->lock_limit;
    if (cc->lock_prefix) in->prefix = cc->lock_prefix;
    if (cc->on_conflict_client) (void)capstan_on_conflict_parse(cc->on_conflict_client, &s->client);
    if (cc->on_conflict_server) (void)capstan_on_conflict_parse(cc->on_conflict_server, &s->server);
    if (cc->unique_across_queues) s->across_queues = 1;
    if (cc->unique_across_workers) s->across_workers = 1;
    if (cc->schedule_in > 0) s->schedule_in = cc->schedule_in;
    s->unique_for = cc->unique_for;
    if (cc->lock_args) {
        in->idx = cc->lock_args;
        in->nidx = cc->nlock_args;
    }
}

/* Sidekiq Enterprise's unique_for (and unique_until), which its
 * sidekiq_options write into the payload of a Ruby push, mapped as the
 * class's YAML options are. */
static void payload_unique_for(capstan_mw_t *mw, capstan_unique_spec_t *s)
{
    double d;
    int k = field_num(mw, "unique_for", &d);
    if (k == 0)
        return;
    char *until = field_str(mw, "unique_until");
    capstan_unique_opts_t o = CAPSTAN_UNIQUE_OPTS_INIT;
    if (k < 0 || d < 1 || capstan_unique_for(&o, seconds(mw, "unique_for", d), until)) {
        capstan_warn("%s %s: unique_for must be seconds >= 1 and unique_until start or success; "
                     "running it without a lock", mw->cls, mw->jid);
        s->type = CAPSTAN_LOCK_NONE;
    } else {
        s->type = o.lock;
        s->ttl = o.lock_ttl;
        s->unique_for = 1;
    }
    free(until);
}

/* The payload's lock: a type name wins; anything else that is set means
 * the job runs without a lock. */
static void payload_lock_type(capstan_mw_t *mw, capstan_unique_spec_t *s)
{
    char *str = field_str(mw, "lock");
    if (str) {
        capstan_lock_type_t t;
        s->unique_for = 0; /* the payload's lock is v9's, whatever the class's */
        if (capstan_lock_type_parse(str, &t) == 0) {
            s->type = t;
        } else {
            capstan_warn("%s %s: unknown lock type \"%s\"; running it without a lock",
                         mw->cls, mw->jid, str);
            s->type = CAPSTAN_LOCK_NONE;
        }
        free(str);
    } else if (capstan_mw_field_raw(mw, "lock", NULL) && field_true(mw, "lock")) {
        capstan_warn("%s %s: \"lock\" is not a lock type name; running it without a lock",
                     mw->cls, mw->jid);
        s->type = CAPSTAN_LOCK_NONE;
    } else {
        payload_unique_for(mw, s);
    }
}

/* The payload's lock_ttl, lock_timeout and lock_limit, then the bounds. */
static void payload_limits(capstan_mw_t *mw, capstan_unique_spec_t *s)
{
    double d;
    int k = field_num(mw, "lock_ttl", &d);
    if (k < 0 || (k > 0 && d < 0)) {
        capstan_warn("%s %s: lock_ttl must be a number of seconds >= 0; the lock has no expiry",
                     mw->cls, mw->jid);
        s->ttl = 0;
    } else if (k > 0 || (k == 0 && capstan_mw_field_raw(mw, "lock_ttl", NULL))) {
        s->ttl = k > 0 ? seconds(mw, "lock_ttl", d) : 0; /* null in the payload: no expiry */
    }
    if (field_num(mw, "lock_timeout", &d) > 0)
        s->timeout = d > 0 ? seconds(mw, "lock_timeout", d) : 0;
    k = field_num(mw, "lock_limit", &d);
    if (k > 0)
        s->limit = d >= INT_MAX ? INT_MAX : d >= 1 ? (int)d : 1;
    /* The class's options are bounded when read, but not this tightly. */
    if (s->ttl > CAPSTAN_UNIQUE_MAX_SECONDS)
        s->ttl = CAPSTAN_UNIQUE_MAX_SECONDS;
    if (s->timeout > CAPSTAN_UNIQUE_MAX_SECONDS)
        s->timeout = CAPSTAN_UNIQUE_MAX_SECONDS;
}

/* The key prefix: the payload's, else the inherited one, else v9's. */
static void payload_prefix(capstan_mw_t *mw, capstan_unique_spec_t *s, const char *prefix)
{
    char *str = field_str(mw, "lock_prefix");
    if (str && *str)
        capstan__fmt_cat(s->prefix, sizeof(s->prefix), str, NULL);
    else
        capstan__fmt_cat(s->prefix, sizeof(s->prefix),
                         prefix && *prefix ? prefix : CAPSTAN_KEY_UNIQUE_PREFIX, NULL);
    free(str);
}

/* lock_args: the payload's (on the server), else args filtered by the
 * inherited indexes. */
static int resolve_lock_args(capstan_mw_t *mw, capstan_unique_spec_t *s, const inherited_t *in,
                             char *err)
{
    size_t len;
    const char *la = capstan_mw_field_raw(mw, "lock_args", &len);
    if (la && *la == '[' && mw->server)
        s->lock_args = capstan__ruby_json_dup(la, len, NULL);
    if (!s->lock_args) {
        const char *args = capstan_mw_field_raw(mw, "args", &len);
        if (!args) {
            args = "[]";
            len = 2;
        }
        s->lock_args = capstan__unique_lock_args(args, len, in->idx, in->nidx);
    }
    return s->lock_args ? 0 : capstan_seterr(err, CAPSTAN_EPARSE, "args is not a JSON array");
}

/* A lock_digest written by the client (Ruby's may come from a lock-args
 * method capstan cannot run) is trusted as is, on the server. Returns 1 when
 * it was taken; an unusable one is logged. */
static int payload_digest(capstan_mw_t *mw, capstan_unique_spec_t *s)
{
    if (!mw->server)
        return 0;
    char *str = field_str(mw, "lock_digest");
    int taken = 0;
    if (str && capstan__unique_digest_valid(str)) {
        size_t n = capstan__key_base(str, CAPSTAN_KEY_RUN);
        if (n)
            str[n] = '\0';
        capstan__fmt_cat(s->digest, sizeof(s->digest), str, NULL);
        s->digest_from_payload = 1;
        taken = 1;
    } else if (str) {
        capstan_warn("%s %s: lock_digest \"%.80s\" is not a digest; using the one computed from "
                     "class, queue and args", mw->cls, mw->jid, str);
    } else if (capstan_mw_field_raw(mw, "lock_digest", NULL)) {
        capstan_warn("%s %s: lock_digest is not a string; using the one computed from class, "
                     "queue and args", mw->cls, mw->jid);
    }
    free(str);
    return taken;
}

/* The digest v9 computes from class, queue, lock_args and the options. */
static int computed_digest(capstan_mw_t *mw, capstan_unique_spec_t *s, char *err)
{
    size_t len;
    const char *apt = capstan_mw_field_raw(mw, "apartment", &len);
    char *queue = field_str(mw, "queue"); /* what Ruby hashes, wherever it was fetched */
    capstan_digest_input_t in = {
        .cls = mw->cls, .queue = queue ? queue : mw->queue, .lock_args = s->lock_args,
        .apartment = apt, .apartment_len = apt ? len : 0, .lock_prefix = s->prefix,
        .unique_across_queues = s->across_queues, .unique_across_workers = s->across_workers,
        .alg = s->alg,
    };
    int rc = capstan_unique_digest(&in, s->digest, NULL, err);
    free(queue);
    return rc;
}

int capstan_unique__resolve(capstan_mw_t *mw, capstan_unique_spec_t *s, int compute_digest, char *err)
{
    inherited_t in = {0};
    memset(s, 0, sizeof(*s));
    if (mw->unique)
        from_registration(mw->unique, s, &in);
    if (mw->cc)
        from_class(mw->cc, s, &in);
    payload_lock_type(mw, s);
    if (s->type == CAPSTAN_LOCK_NONE)
        return 0;
    payload_limits(mw, s);
    payload_prefix(mw, s, in.prefix);
    payload_strategies(mw, s);
    if (field_true(mw, "unique_across_queues")) s->across_queues = 1;
    if (field_true(mw, "unique_across_workers")) s->across_workers = 1;
    if (s->type == CAPSTAN_LOCK_WHILE_EXECUTING_REJECT)
        s->server = CAPSTAN_CONFLICT_REJECT;
    if (!compute_digest)
        return 0;
    int rc = resolve_lock_args(mw, s, &in, err);
    if (!rc && !payload_digest(mw, s))
        rc = computed_digest(mw, s, err);
    if (rc)
        capstan_unique__spec_clear(s);
    return rc;
}
