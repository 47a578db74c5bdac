/* The members of a sharded process (shards.h): made by the front from its
 * config's shards:, each started on a thread of its own, freed with the
 * front. */
#include "runtime/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/shards.h"
#include "middleware/mw.h"
#include "observe/prometheus.h"
#include "support/log.h"
#include "support/time.h"
#include "unique/admin_internal.h"

struct capstan_shards {
    capstan_runtime_t **m; /* m[0] is the front */
    size_t n;
    /* The run tokens (capstan__shards_run_begin): concurrency of them,
     * less those taken, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t freed;
    int tokens;
};

size_t capstan__members(const capstan_runtime_t *rt)
{
    return rt->member.group ? rt->member.group->n : 1;
}

capstan_runtime_t *capstan__member(capstan_runtime_t *rt, size_t i)
{
    return rt->member.group ? rt->member.group->m[i] : rt;
}

const char *capstan__shard_name(const capstan_runtime_t *rt)
{
    return rt->member.group ? rt->member.group->m[0]->cfg->shards[rt->member.index].name : NULL;
}

void capstan__member_log(const capstan_runtime_t *rt)
{
    capstan__log_shard(capstan__shard_name(rt));
    capstan__metrics_use(rt->member.metrics);
}

/* Member i of front, ready to start. */
static capstan_runtime_t *member_new(capstan_runtime_t *front, size_t i, char *err)
{
    capstan_config_t *mc = capstan__config_member(front->cfg, i);
    capstan_runtime_t *m = mc ? capstan_runtime_new(mc, err) : NULL;
    if (!m) {
        capstan__config_member_free(mc);
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    m->member.group = front->member.group;
    m->member.index = i;
    /* Read-only once resolved: the front's class table serves all. */
    m->classes = front->classes;
    memcpy(&m->self, &front->self, sizeof(m->self));
    m->self.info_json = NULL;
    m->link.board = front->link.board; /* for the jids it starts (board.c) */
    m->link.probe = capstan__board_probe(front, m, i);
    m->link.board_end = front->link.board_end;
    m->link.worker_slot = front->link.worker_slot;
    m->link.supervisor_pid = front->link.supervisor_pid;
    /* Its suspects go to its own shard's quarantine, which the
     * supervisor's quarantine worker reads in every shard. */
    m->link.quarantine = front->link.quarantine;
    m->link.quarantine_worker = front->link.quarantine_worker;
    /* Middleware a program added run in every shard; the built-ins each on
     * their member. */
    m->server_chain = capstan__chain_copy(capstan_runtime_server_chain(front), front, m);
    m->member.r = capstan_redis_new(mc->redis_url, 10, err);
    m->member.metrics = capstan__metrics_new();
    return m;
}

int capstan__shards_new(capstan_runtime_t *front, char *err)
{
    const capstan_config_t *c = front->cfg;
    if (!c->nshards)
        return 0;
    struct capstan_shards *g = calloc(1, sizeof(*g));
    if (!g || !(g->m = calloc(c->nshards, sizeof(*g->m)))) {
        free(g);
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    }
    g->m[0] = front;
    g->n = 1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->freed, NULL);
    g->tokens = c->concurrency;
    front->member.group = g;
    front->member.metrics = capstan__metrics_new();
    front->member.ticks = capstan__config_member(c, 0);
    if (!front->member.metrics || !front->member.ticks)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    /* Lock counts of threads outside every shard go out with its beats. */
    capstan__unique_metrics_home(front->member.metrics);
    for (size_t i = 1; i < c->nshards; i++) {
        capstan_runtime_t *m = member_new(front, i, err);
        if (!m)
            return CAPSTAN_ENOMEM;
        g->m[g->n++] = m;
        if (!m->server_chain || !m->member.metrics)
            return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        if (!m->member.r)
            return CAPSTAN_ECONFIG;
        int rc = capstan__runtime_prepare(m, err);
        if (rc)
            return rc;
    }
    return capstan__config_own_shard(front->cfg, 0) ? capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory") : 0;
}

/* A member's start thread: its Redis may not be up yet; a refusal that
 * may pass is retried with backoff for up to startup_timeout, as the
 * front's own start does, and a quiet front ends the wait. */
static void *member_start(void *arg)
{
    capstan_runtime_t *m = arg;
    const char *name = capstan__shard_name(m);
    capstan__member_log(m);
    double limit = m->cfg->startup_timeout, give_up = capstan__mono() + limit, delay = 0.1;
    int rc;
    while ((rc = capstan_redis_connect(m->member.r)) != 0 && !atomic_load(&m->quiet)) {
        if (rc == CAPSTAN_ECONFIG || (limit > 0 && capstan__mono() >= give_up)) {
            m->member.rc = capstan_seterr(m->member.err, rc == CAPSTAN_ECONFIG ? rc : CAPSTAN_EREDIS,
                                          "shard %s: %s%s", name, capstan_redis_error(m->member.r),
                                          rc == CAPSTAN_ECONFIG ? "" : "; gave up after startup_timeout");
            atomic_store(&m->member.state, CAPSTAN_MEMBER_FAILED);
            return NULL;
        }
        capstan_warn("shard %s: %s; waiting for its Redis, next try in %.1f s", name,
                     capstan_redis_error(m->member.r), delay);
        capstan__rt_wait(m, delay);
        delay = delay * 2 > 5 ? 5 : delay * 2;
    }
    if (rc)
        return NULL; /* quiet before it connected: nothing of it in Redis */
    capstan_info("shard %s: connected to %s", name, capstan_redis_name(m->member.r));
    rc = capstan__runtime_begin(m, m->member.r, m->member.err);
    if (rc) {
        m->member.rc = rc;
        atomic_store(&m->member.state, CAPSTAN_MEMBER_FAILED);
        return NULL;
    }
    atomic_store(&m->member.state, CAPSTAN_MEMBER_RUNNING);
    return NULL;
}

int capstan__shards_start(capstan_runtime_t *front, char *err)
{
    for (size_t i = 1; i < capstan__members(front); i++) {
        capstan_runtime_t *m = capstan__member(front, i);
        int e = pthread_create(&m->member.start, NULL, member_start, m);
        if (e)
            return capstan_seterr(err, CAPSTAN_ESYS, "cannot start shard %s: %s",
                                  front->cfg->shards[i].name, strerror(e));
        m->member.start_started = 1;
    }
    return 0;
}

int capstan__shards_failed(capstan_runtime_t *front, int *rc, char *err)
{
    for (size_t i = 1; i < capstan__members(front); i++) {
        capstan_runtime_t *m = capstan__member(front, i);
        if (atomic_load(&m->member.state) == CAPSTAN_MEMBER_FAILED) {
            *rc = m->member.rc;
            snprintf(err, CAPSTAN_ERRLEN, "%s", m->member.err);
            return 1;
        }
    }
    return 0;
}

void capstan__shards_join(capstan_runtime_t *front)
{
    for (size_t i = 1; i < capstan__members(front); i++) {
        capstan_runtime_t *m = capstan__member(front, i);
        if (m->member.start_started)
            pthread_join(m->member.start, NULL);
        m->member.start_started = 0;
    }
}

capstan_metrics_t *capstan__shards_metrics(void *ud, size_t i, const char **name, const char **redis_url)
{
    capstan_runtime_t *front = ud;
    struct capstan_shards *g = front->member.group;
    if (!g || i >= g->n)
        return NULL;
    *name = front->cfg->shards[i].name;
    *redis_url = front->cfg->shards[i].redis_url;
    return g->m[i]->member.metrics;
}

void capstan__shards_free(capstan_runtime_t *front)
{
    struct capstan_shards *g = front->member.group;
    if (!g || front->member.index)
        return;
    for (size_t i = 1; i < g->n; i++) {
        capstan_redis_free(g->m[i]->member.r);
        capstan_runtime_free(g->m[i]);
    }
    capstan__unique_metrics_home(NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->freed);
    free(g->m);
    free(g);
    front->member.group = NULL;
}

void capstan__shards_run_begin(capstan_runtime_t *rt)
{
    struct capstan_shards *g = rt->member.group;
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    /* Stopping, the job runs at once, over the budget: the shutdown waits
     * for it as for any job started before it. */
    while (g->tokens <= 0 && !atomic_load(&rt->stopping)) {
        struct timespec ts = capstan__timespec(capstan__now() + 0.1);
        pthread_cond_timedwait(&g->freed, &g->mu, &ts);
    }
    g->tokens--;
    pthread_mutex_unlock(&g->mu);
}

void capstan__shards_run_end(capstan_runtime_t *rt)
{
    struct capstan_shards *g = rt->member.group;
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->tokens++;
    pthread_cond_signal(&g->freed);
    pthread_mutex_unlock(&g->mu);
}

const char *capstan__shards_home(capstan_runtime_t *rt, const char *shard, const char *key)
{
    struct capstan_shards *g = rt->member.group;
    if (!g)
        return NULL;
    const capstan_config_t *c = g->m[0]->cfg;
    const char *url = capstan_limiter_home(c, key, shard, NULL);
    return url == c->shards[rt->member.index].redis_url ? NULL : url;
}
