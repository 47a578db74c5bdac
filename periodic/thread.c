/* The periodic thread: every process with schedules computes their due
 * ticks and offers them to Redis through one script (periodic_enqueue.lua)
 * that records a schedule's last tick and pushes its jobs together, so any
 * number of processes may offer a tick and exactly one enqueues it, with
 * no leader to lose or to double. The thread wakes at the next tick of its
 * schedules, and at least once a second.
 *
 * The tick record (capstan:periodic:NAME) holds the last tick handled and
 * the signature of the expression that made it. At start, or once Redis is
 * back, the ticks after that record and before now were missed: the
 * schedule's policy says which to enqueue. A changed expression (or zone)
 * makes a new signature, and the record of the old one is not used to
 * find missed ticks: the schedule starts fresh. */
#include "periodic/periodic.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe/prometheus.h"
#include "redis/keys.h"
#include "redis/scripts.h"
#include "support/buf.h"
#include "support/cron.h"
#include "support/json.h"
#include "support/log.h"
#include "support/payload.h"
#include "support/time.h"
#include "support/tz.h"

/* Only the latest due tick may be on time, and only while it is younger
 * than this: older, no process was there to enqueue it when it was due. */
#define ON_TIME 2.0
/* How far back missed ticks are looked for; an older record counts as
 * this old. */
#define LOOKBACK (31 * 86400)
/* Due ticks kept while walking from the record to now. */
#define RING (CAPSTAN_PERIODIC_ALL_MAX + 2)

typedef struct sched {
    const struct capstan_periodic_conf *conf;
    capstan_cron_t cron;
    capstan_tz_t *tz;
    char sig[17];
    char *key, *qkey;
    int loaded;     /* the record was read */
    int64_t cursor; /* ticks up to this one are handled */
    int blocked;    /* the queue key holds another type (said once) */
} sched_t;

static uint64_t fnv1a(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

void capstan__periodic_jid(const char *name, int64_t tick, char out[25])
{
    char text[64];
    int n = snprintf(text, sizeof(text), "@%" PRId64, tick);
    uint64_t a = fnv1a(fnv1a(14695981039346656037ULL, name, strlen(name)), text, (size_t)n);
    uint64_t b = fnv1a(fnv1a(0x9e3779b97f4a7c15ULL, text, (size_t)n), name, strlen(name));
    snprintf(out, 25, "%016" PRIx64 "%08" PRIx32, a, (uint32_t)(b >> 32));
}

/* What makes a schedule's ticks: its fields and its zone. */
static void signature(const capstan_cron_t *c, const char *tz, char out[17])
{
    /* The last days and n-th weekdays, only where used: the signature of
     * every other expression stays as it was before they were read. */
    char extra[64] = "";
    uint16_t nth = 0;
    for (int i = 0; i < 7; i++)
        nth |= c->nth[i];
    if (c->dom_last || nth)
        snprintf(extra, sizeof(extra), ":L%x:%x:%x:%x:%x:%x:%x:%x", c->dom_last, c->nth[0], c->nth[1],
                 c->nth[2], c->nth[3], c->nth[4], c->nth[5], c->nth[6]);
    char text[256];
    int n = snprintf(text, sizeof(text), "%" PRIx64 ":%" PRIx64 ":%x:%x:%x:%x:%d:%d:%s%s", c->sec,
                     c->min, c->hour, c->dom, c->mon, c->dow, c->dom_any, c->dow_any, tz ? tz : "UTC",
                     extra);
    if (n < 0 || (size_t)n >= sizeof(text))
        n = (int)sizeof(text) - 1;
    snprintf(out, 17, "%016" PRIx64, fnv1a(14695981039346656037ULL, text, (size_t)n));
}

/* The payload of schedule s's tick, as the client writes a job's. */
static char *payload(const sched_t *s, int64_t tick, double now, capstan_ts_format_t fmt)
{
    const struct capstan_periodic_conf *p = s->conf;
    capstan_buf_t b = { 0 };
    capstan_jobject_t extra = { 0 };
    char ts[32], jid[25];
    capstan__ts_json(ts, now, fmt);
    capstan__periodic_jid(p->name, tick, jid);
    int rc = p->retry == CAPSTAN_RETRY_UNSET || p->retry == CAPSTAN_RETRY_DEFAULT
                 ? capstan__buf_puts(&b, "{\"retry\":true")
             : p->retry == CAPSTAN_RETRY_NONE ? capstan__buf_puts(&b, "{\"retry\":false")
                                              : capstan__buf_printf(&b, "{\"retry\":%d", p->retry);
    if (!rc) rc = capstan__buf_puts(&b, ",\"queue\":");
    if (!rc) rc = capstan__json_quote(&b, p->queue, strlen(p->queue));
    if (!rc && p->extra && !capstan__json_scan_object(p->extra, strlen(p->extra), &extra, NULL))
        for (size_t i = 0; i < extra.n && !rc; i++)
            rc = capstan__buf_printf(&b, ",\"%.*s\":%.*s", (int)extra.m[i].klen, p->extra + extra.m[i].kstart,
                                     (int)extra.m[i].vlen, p->extra + extra.m[i].vstart);
    capstan__jobject_free(&extra);
    if (!rc) rc = capstan__buf_puts(&b, ",\"args\":");
    if (!rc) rc = capstan__buf_puts(&b, p->args);
    if (!rc) rc = capstan__buf_puts(&b, ",\"class\":");
    if (!rc) rc = capstan__json_quote(&b, p->cls, strlen(p->cls));
    if (!rc) rc = capstan__buf_printf(&b, ",\"jid\":\"%s\",\"created_at\":%s,\"enqueued_at\":%s", jid, ts, ts);
    if (!rc) rc = capstan__buf_puts(&b, ",\"periodic\":");
    if (!rc) rc = capstan__json_quote(&b, p->name, strlen(p->name));
    if (!rc) rc = capstan__buf_printf(&b, ",\"periodic_at\":%" PRId64 "}", tick);
    char *out = rc ? NULL : capstan__buf_take(&b, NULL);
    capstan__buf_free(&b);
    return out;
}

/* Reads s's record: with the same signature, the ticks after its last one
 * are the missed ones; else (none, or another expression) the schedule
 * starts fresh from now. */
static int load(capstan_redis_t *r, sched_t *s, double now)
{
    redisReply *rep = capstan_redis_cmdf(r, "HMGET %s last sig", s->key);
    if (!rep)
        return CAPSTAN_EREDIS;
    int64_t floor_now = (int64_t)now;
    s->cursor = floor_now;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 && rep->element[0]->type == REDIS_REPLY_STRING &&
        rep->element[1]->type == REDIS_REPLY_STRING && !strcmp(rep->element[1]->str, s->sig)) {
        int64_t last = strtoll(rep->element[0]->str, NULL, 10);
        s->cursor = last < floor_now - LOOKBACK ? floor_now - LOOKBACK : last;
    } else if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
               rep->element[1]->type == REDIS_REPLY_STRING) {
        capstan_info("periodic %s: its expression changed; it starts afresh, no missed ticks",
                     s->conf->name);
    }
    freeReplyObject(rep);
    s->loaded = 1;
    return 0;
}

/* An entry of the script's tick list. */
typedef struct offer {
    int64_t tick;
    char *payload; /* owned; NULL = let go (count gives how many ticks) */
    long count;
} offer_t;

/* Offers s's ticks due by now. Returns 0 or CAPSTAN_EREDIS (s->cursor
 * then stays, so they are offered again once Redis answers). */
static int step(const capstan_periodic_env_t *env, capstan_redis_t *r, sched_t *s, double now)
{
    int64_t ring[RING], t = s->cursor;
    long count = 0;
    while ((t = capstan__cron_next(&s->cron, s->tz, t)) >= 0 && (double)t <= now) {
        ring[count % RING] = t;
        count++;
    }
    if (!count)
        return 0;
    int64_t latest = ring[(count - 1) % RING];
    int on_time = now - (double)latest < ON_TIME;
    long missed = count - on_time;
    offer_t offers[RING + 2];
    size_t n = 0;
    long kept = 0; /* missed ticks to enqueue, the latest ones */
    if (s->conf->missed == CAPSTAN_MISSED_LAST)
        kept = missed > 0;
    else if (s->conf->missed == CAPSTAN_MISSED_ALL)
        for (kept = 0; kept < missed && kept < CAPSTAN_PERIODIC_ALL_MAX; kept++) {
            int64_t k = ring[(count - 1 - on_time - kept) % RING];
            if (now - (double)k > CAPSTAN_PERIODIC_ALL_WINDOW)
                break;
        }
    if (missed > kept) /* the ones let go, as one entry at the latest of them */
        offers[n++] = (offer_t){ ring[(count - 1 - on_time - kept) % RING], NULL, missed - kept };
    for (long i = kept; i > 0; i--)
        offers[n++] = (offer_t){ ring[(count - on_time - i) % RING], NULL, 0 };
    if (on_time)
        offers[n++] = (offer_t){ latest, NULL, 0 };
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        if (!offers[i].count && !(offers[i].payload = payload(s, offers[i].tick, now, env->cfg->timestamps)))
            rc = CAPSTAN_ENOMEM;
    /* The record outlives the look back for missed ticks, and twice the
     * gap to the next tick. */
    int64_t after = capstan__cron_next(&s->cron, s->tz, latest);
    long long ttl = after > latest ? 2 * (after - latest) : 0;
    if (ttl < LOOKBACK + 86400)
        ttl = LOOKBACK + 86400;
    char ttls[32], ticks[RING + 2][24], counts[RING + 2][24];
    const char *argv[4 + 2 * (RING + 2)];
    size_t lens[4 + 2 * (RING + 2)];
    int argc = 0;
    snprintf(ttls, sizeof(ttls), "%lld", ttl);
    argv[argc++] = s->key;
    argv[argc++] = s->qkey;
    argv[argc++] = CAPSTAN_KEY_QUEUES;
    argv[argc++] = s->sig;
    argv[argc++] = s->conf->queue;
    argv[argc++] = ttls;
    for (size_t i = 0; i < n; i++) {
        snprintf(ticks[i], sizeof(ticks[i]), "%" PRId64, offers[i].tick);
        snprintf(counts[i], sizeof(counts[i]), "#%ld", offers[i].count);
        argv[argc++] = ticks[i];
        argv[argc++] = offers[i].payload ? offers[i].payload : counts[i];
    }
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = rc ? NULL : capstan__redis_script(r, CAPSTAN_SCRIPT_PERIODIC_ENQUEUE, 3, argc, argv, lens);
    if (!rc && !rep)
        rc = CAPSTAN_EREDIS;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 3) {
        long long pushed = rep->element[0]->integer, let_go = rep->element[1]->integer;
        if (pushed < 0) {
            if (!s->blocked)
                capstan_error("periodic %s: %s holds another type than a list; its ticks wait",
                              s->conf->name, s->qkey);
            s->blocked = 1;
        } else {
            if (s->blocked)
                capstan_info("periodic %s: %s is a list again", s->conf->name, s->qkey);
            s->blocked = 0;
            s->cursor = latest;
            capstan__metrics_periodic(capstan__metrics_here(), s->conf->name, (long)pushed, (long)let_go);
            if (let_go)
                capstan_warn("periodic %s: %lld missed tick%s let go (missed: %s)", s->conf->name,
                             let_go, let_go == 1 ? "" : "s", capstan_periodic_missed_name(s->conf->missed));
            long long caught = pushed - (on_time && pushed > 0);
            if (caught > 0)
                capstan_info("periodic %s: %lld missed tick%s enqueued (missed: %s)", s->conf->name,
                             caught, caught == 1 ? "" : "s", capstan_periodic_missed_name(s->conf->missed));
        }
    } else if (rep && rep->type == REDIS_REPLY_ERROR) {
        capstan_warn("periodic %s: %s", s->conf->name, rep->str);
    }
    freeReplyObject(rep);
    for (size_t i = 0; i < n; i++)
        free(offers[i].payload);
    return rc;
}

static void scheds_free(sched_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) {
        capstan__tz_free(v[i].tz);
        free(v[i].key);
        free(v[i].qkey);
    }
    free(v);
}

/* The schedules as the thread runs them; their config was checked by
 * capstan_periodic_add. */
static sched_t *scheds_new(const capstan_config_t *cfg)
{
    sched_t *v = calloc(cfg->nperiodic, sizeof(*v));
    char err[CAPSTAN_ERRLEN];
    for (size_t i = 0; v && i < cfg->nperiodic; i++) {
        sched_t *s = &v[i];
        s->conf = &cfg->periodic[i];
        if (capstan__cron_parse(s->conf->cron, &s->cron, err) || !(s->tz = capstan__tz_load(s->conf->tz, err)) ||
            !(s->key = capstan__key_dup(CAPSTAN_KEY_PERIODIC, s->conf->name)) ||
            !(s->qkey = capstan__key_dup(CAPSTAN_KEY_QUEUE, s->conf->queue))) {
            capstan_error("periodic %s: %s", s->conf->name, err);
            scheds_free(v, cfg->nperiodic);
            return NULL;
        }
        signature(&s->cron, s->conf->tz, s->sig);
    }
    return v;
}

void *capstan__periodic_main(void *arg)
{
    const capstan_periodic_env_t *env = arg;
    const capstan_config_t *cfg = env->cfg;
    char err[CAPSTAN_ERRLEN];
    sched_t *scheds = scheds_new(cfg);
    capstan_redis_t *r = scheds ? capstan_redis_new(cfg->redis_url, 10, err) : NULL;
    if (!r) {
        if (scheds)
            capstan_error("periodic: %s", err);
        scheds_free(scheds, cfg->nperiodic);
        return NULL;
    }
    while (!atomic_load(env->stop)) {
        if (!capstan_redis_ok(r) && env->connect(env->ud, r))
            break;
        /* Ticks are judged by Redis's clock, one for the whole fleet: by
         * its own, a host ahead would record ticks still to come (letting
         * the ones between go, for every process) and one behind would
         * wait past their time. The wake-up is timed from the reading on
         * the monotonic clock, which no host's offset touches. */
        double now, read_at = capstan__mono();
        if (capstan__redis_time(r, &now)) {
            env->wait(env->ud, 1);
            continue;
        }
        double wake = now + 1;
        for (size_t i = 0; i < cfg->nperiodic; i++) {
            sched_t *s = &scheds[i];
            if ((!s->loaded && load(r, s, now)) || step(env, r, s, now))
                break;
            int64_t next = capstan__cron_next(&s->cron, s->tz, s->cursor > (int64_t)now ? s->cursor : (int64_t)now);
            if (next >= 0 && (double)next < wake)
                wake = (double)next;
        }
        env->wait(env->ud, wake - now - (capstan__mono() - read_at));
    }
    capstan_info("Periodic exiting...");
    capstan_redis_free(r);
    scheds_free(scheds, cfg->nperiodic);
    return NULL;
}
