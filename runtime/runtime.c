/* Process lifecycle: start the threads, handle signals on the calling
 * thread, and stop gracefully (quiet, wait up to timeout, requeue what is
 * still running, leave the process set). */
#include "runtime/rt.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/shards.h"
#include "fetch/leave.h"
#include "observe/http.h"
#include "observe/overview.h"
#include "observe/prometheus.h"
#include "redis/sentinel.h"
#include "locks/queue_limit.h"
#include "runtime/board.h"
#include "runtime/crash.h"
#include "runtime/shards.h"
#include "runtime/slot.h"
#include "runtime/source.h"
#include "support/identity.h"
#include "support/log.h"
#include "support/time.h"
#include "capstan/capstan.h"
#include "unique/admin.h"
#include "capstan/middleware.h"
#include "unique/admin_internal.h"

#define PAUSE 0.1

capstan_runtime_t *capstan_runtime_new(capstan_config_t *cfg, char *err)
{
    if (!cfg) {
        capstan_seterr(err, CAPSTAN_EINVAL, "no configuration");
        return NULL;
    }
    capstan_runtime_t *rt = calloc(1, sizeof(*rt));
    if (!rt) {
        capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        return NULL;
    }
    rt->cfg = cfg;
    rt->link.probe = &rt->link.own_probe;
    pthread_mutex_init(&rt->wake_mu, NULL);
    pthread_mutex_init(&rt->view.unknown_mu, NULL);
    pthread_cond_init(&rt->wake, NULL);
    pthread_cond_init(&rt->sched_wake.cv, NULL);
    capstan__identity_make(rt->self.identity, sizeof(rt->self.identity));
    capstan__hostname(rt->self.hostname, sizeof(rt->self.hostname));
    return rt;
}

void capstan_runtime_free(capstan_runtime_t *rt)
{
    if (!rt)
        return;
    if (rt->ctl.abandoned) {
        /* Threads still running a handler use rt: leave it to the exit. */
        return;
    }
    capstan__shards_free(rt);
    capstan__crash_watch(rt->member.index, NULL, NULL, 0);
    capstan__slots_free(rt);
    capstan__feed_free(rt->feed);
    capstan_chain_free(rt->server_chain);
    if (!rt->member.index)
        capstan__registry_free(rt); /* a member borrows the front's */
    /* Each member's own, as its fleet: the classes it logged no handler for. */
    for (size_t i = 0; i < rt->view.nunknown; i++)
        free(rt->view.unknown[i]);
    free(rt->view.unknown);
    free(rt->self.info_json);
    capstan__fleet_free(rt->view.fleet);
    capstan__paused_free(rt->view.paused);
    capstan__qlimits_free(rt->view.qlimits);
    capstan__liveness_free(rt->view.liveness);
    capstan__metrics_free(rt->member.metrics);
    capstan__config_member_free(rt->member.ticks);
    if (rt->member.index)
        capstan__config_member_free(rt->cfg);
    else
        capstan_config_free(rt->cfg);
    pthread_mutex_destroy(&rt->wake_mu);
    pthread_mutex_destroy(&rt->view.unknown_mu);
    pthread_cond_destroy(&rt->wake);
    pthread_cond_destroy(&rt->sched_wake.cv);
    free(rt);
}

const char *capstan_runtime_identity(const capstan_runtime_t *rt) { return rt->self.identity; }
int capstan_runtime_abandoned(const capstan_runtime_t *rt) { return rt->ctl.abandoned; }

void capstan_runtime_quiet(capstan_runtime_t *rt)
{
    atomic_store(&rt->ctl.quiet_req, 1);
}

void capstan_runtime_stop(capstan_runtime_t *rt)
{
    atomic_store(&rt->ctl.stop_req, 1);
}


/* The capsule's mode as Sidekiq names it from the weights given: strict
 * when none has one, random when every one is 1, else weighted. */
static const char *capsule_mode(const capstan_config_t *c)
{
    if (c->strict)
        return "strict";
    for (size_t i = 0; i < c->nqueues; i++)
        if (c->queues[i].weight != 1)
            return "weighted";
    return "random";
}
static char *build_info(capstan_runtime_t *rt)
{
    capstan_config_t *c = rt->cfg;
    json_t *o = json_object(), *queues = json_array(), *labels = json_array();
    json_t *weights = json_object(), *capw = json_object();
    for (size_t i = 0; i < c->nqueues; i++) {
        json_array_append_new(queues, json_string(c->queues[i].name));
        json_object_set_new(weights, c->queues[i].name, json_integer(c->queues[i].weight));
        json_object_set_new(capw, c->queues[i].name, json_integer(c->queues[i].weight));
    }
    for (size_t i = 0; i < c->nlabels; i++)
        json_array_append_new(labels, json_string(c->labels[i]));
    json_object_set_new(o, "hostname", json_string(rt->self.hostname));
    json_object_set_new(o, "started_at", json_real(rt->self.started_at));
    json_object_set_new(o, "pid", json_integer(getpid()));
    json_object_set_new(o, "tag", json_string(c->tag ? c->tag : ""));
    json_object_set_new(o, "concurrency", json_integer(c->concurrency));
    json_object_set_new(o, "queues", queues);
    json_object_set_new(o, "labels", labels);
    json_object_set_new(o, "identity", json_string(rt->self.identity));
    json_object_set_new(o, "version", json_string(CAPSTAN_VERSION));
    /* Sidekiq writes its own version above: this tells the process set's
     * readers (capstan stats, the fleet look of fleet/fleet.c) a capstan
     * process from a Ruby one. Sidekiq ignores the key. */
    json_object_set_new(o, CAPSTAN_INFO_MARKER, json_string(CAPSTAN_VERSION));
    /* A supervised worker names its supervisor and slot, for capstan stats. */
    if (rt->link.supervisor_pid) {
        json_object_set_new(o, "capstan_supervisor", json_integer(rt->link.supervisor_pid));
        json_object_set_new(o, "capstan_worker", json_integer(rt->link.worker_slot));
    }
    json_t *warr = json_array();
    json_array_append_new(warr, weights);
    json_object_set_new(o, "weights", warr);
    json_object_set_new(o, "embedded", json_false());
    json_t *cap = json_object(), *def = json_object();
    json_object_set_new(def, "concurrency", json_integer(c->concurrency));
    json_object_set_new(def, "mode", json_string(capsule_mode(c)));
    json_object_set_new(def, "weights", capw);
    json_object_set_new(cap, "default", def);
    json_object_set_new(o, "capsules", cap);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

static void dump_member(capstan_runtime_t *rt)
{
    double now = capstan__now();
    for (int i = 0; i < rt->nslots; i++) {
        capstan_slot_t *s = &rt->slots[i];
        pthread_mutex_lock(&s->mu);
        if (s->busy)
            capstan_warn("Thread TID-%s processor-%d: running %s for %.1fs", s->tid, i, s->cls,
                         now - (double)s->run_at);
        else
            capstan_warn("Thread TID-%s processor-%d: %s", s->tid, i, s->exited ? "exited" : "waiting for a job");
        pthread_mutex_unlock(&s->mu);
    }
    capstan_warn("Thread housekeeper: heartbeat every %.0fs; scheduler: %s", rt->cfg->heartbeat_interval,
                 atomic_load(&rt->quiet) ? "stopped" : "polling");
}

static void dump_threads(capstan_runtime_t *rt)
{
    for (size_t i = 0; i < capstan__members(rt); i++) {
        if (rt->cfg->nshards)
            capstan_warn("Shard %s:", rt->cfg->shards[i].name);
        dump_member(capstan__member(rt, i));
    }
}

/* Quiets the whole process: every member of a sharded one, whichever
 * shard asked. */
static void go_quiet(capstan_runtime_t *rt)
{
    if (atomic_exchange(&rt->quiet, 1))
        return;
    capstan_info("Terminating quiet workers");
    for (size_t i = 0; i < capstan__members(rt); i++) {
        capstan_runtime_t *m = capstan__member(rt, i);
        atomic_store(&m->quiet, 1);
        capstan__rt_wake(m);
    }
}

/* Jobs running in every member. */
static int busy_all(capstan_runtime_t *rt)
{
    int n = 0;
    for (size_t i = 0; i < capstan__members(rt); i++)
        n += capstan__slots_busy(capstan__member(rt, i));
    return n;
}

/* Waits up to timeout for one of our signals, or a request made through
 * the API. Returns the signal, 0 on timeout. */
static int next_signal(capstan_runtime_t *rt, const sigset_t *set, double timeout)
{
    if (atomic_exchange(&rt->ctl.stop_req, 0))
        return SIGTERM;
    if (atomic_exchange(&rt->ctl.quiet_req, 0))
        return SIGTSTP;
    struct timespec ts = { .tv_sec = (time_t)timeout,
                           .tv_nsec = (long)((timeout - (double)(time_t)timeout) * 1e9) };
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

/* Handles signals that do not stop the process; returns 1 for TERM/INT. */
static int handle_signal(capstan_runtime_t *rt, int sig)
{
    if (sig)
        capstan_debug("Got %s signal", capstan__sig_name(sig));
    switch (sig) {
    case SIGTERM:
    case SIGINT:
        return 1;
    case SIGTSTP:
        if (!atomic_load(&rt->quiet))
            capstan_info("Received TSTP, no longer accepting new work");
        go_quiet(rt);
        break;
    case SIGTTIN:
        dump_threads(rt);
        break;
    case SIGUSR2:
        if (capstan__log_reopen())
            capstan_error("cannot reopen the log file: %s", strerror(errno));
        else
            capstan_info("log file reopened");
        break;
    default:
        break;
    }
    return 0;
}

/* The main thread's connection sits idle from start to stop, so a Redis
 * restart in between goes unnoticed until a write of the shutdown fails
 * (the requeue, or leaving the process set). Checks it first. */
static void live_conn(capstan_redis_t *r)
{
    redisReply *pong = capstan_redis_ok(r) ? capstan_redis_cmdf(r, "PING") : NULL;
    if (!pong)
        capstan_redis_connect(r);
    freeReplyObject(pong);
}

/* The connection member m's shutdown writes on: the front's is r. */
static capstan_redis_t *conn_of(capstan_runtime_t *m, capstan_redis_t *r)
{
    return m->member.index ? m->member.r : r;
}

/* Ends m's threads, its jobs done or given back: idle processors leave
 * their blocking fetch within its timeout (by join_deadline), one still
 * in a handler is left to the exit; then the other threads. */
static void join_member(capstan_runtime_t *m, double join_deadline)
{
    for (int i = 0; i < m->nslots; i++) {
        capstan_slot_t *s = &m->slots[i];
        if (!s->started)
            continue;
        for (;;) {
            pthread_mutex_lock(&s->mu);
            int exited = s->exited, busy_now = s->busy;
            pthread_mutex_unlock(&s->mu);
            if (exited) {
                pthread_join(s->thread, NULL);
                break;
            }
            if (busy_now || capstan__mono() > join_deadline) {
                pthread_detach(s->thread);
                m->ctl.abandoned++;
                break;
            }
            capstan__rt_wait(m, 0.05);
        }
    }
    capstan__rt_wake(m);
    if (m->sched.started)
        pthread_join(m->sched.thread, NULL);
    if (m->periodic.started)
        pthread_join(m->periodic.thread, NULL);
    atomic_store(&m->housekeeper_stop, 1);
    capstan__rt_wake(m);
    if (m->keeper.started)
        pthread_join(m->keeper.thread, NULL);
    if (m->watch.started)
        pthread_join(m->watch.thread, NULL);
}

/* m leaves its Redis: its counters flushed, off the process set, its
 * working list gone. Returns 1 when that list is empty. On the main
 * thread, which acts for m's shard here (capstan__metrics_use: its lock
 * counts are the ones flushed). */
static int leave_member(capstan_runtime_t *m, capstan_redis_t *r)
{
    live_conn(r);
    capstan_metrics_t *was = capstan__metrics_use(m->member.metrics);
    capstan__stats_flush(m, r);
    capstan__unique_metrics_flush(r);
    capstan__metrics_use(was);
    capstan__heartbeat_leave(r, m->self.identity);
    return capstan__fetch_leave(r, m->self.identity) == 0;
}

/* Stops the process, every member of a sharded one together: all quiet
 * at once, the timeout shared, then each gives back its own jobs and
 * leaves its own Redis. */
static void shutdown_all(capstan_runtime_t *rt, capstan_redis_t *r, const sigset_t *set, int why)
{
    capstan__notify("STOPPING=1");
    if (why)
        capstan_info("Received %s, shutting down", capstan__sig_name(why));
    else
        capstan_info("Shutting down");
    size_t nm = capstan__members(rt);
    for (size_t i = 0; i < nm; i++)
        atomic_store(&capstan__member(rt, i)->stopping, 1);
    go_quiet(rt);
    capstan__shards_join(rt);
    double deadline = capstan__mono() + rt->cfg->timeout;
    if (busy_all(rt))
        capstan_info("Pausing to allow workers to finish...");
    while (busy_all(rt) && capstan__mono() < deadline) {
        capstan__notify_watchdog();
        capstan__log_flush();
        int sig = next_signal(rt, set, PAUSE);
        if (sig == SIGTERM || sig == SIGINT) {
            capstan_info("Second %s: not waiting any longer", capstan__sig_name(sig));
            break;
        }
        handle_signal(rt, sig);
    }
    int busy = busy_all(rt);
    if (busy) {
        capstan_info("Terminating %d busy worker threads", busy);
        int n = 0;
        for (size_t i = 0; i < nm; i++) {
            capstan_runtime_t *m = capstan__member(rt, i);
            if (!capstan__slots_busy(m))
                continue;
            live_conn(conn_of(m, r));
            capstan_metrics_t *was = capstan__metrics_use(m->member.metrics);
            n += capstan__slots_requeue_busy(m, conn_of(m, r));
            capstan__metrics_use(was);
        }
        capstan_info("Pushed %d jobs back to Redis", n);
    }
    double join_deadline = capstan__mono() + 3;
    for (size_t i = 0; i < nm; i++)
        join_member(capstan__member(rt, i), join_deadline);
    int left = 1;
    for (size_t i = 0; i < nm; i++) {
        capstan_runtime_t *m = capstan__member(rt, i);
        if (m->member.index)
            rt->ctl.abandoned += m->ctl.abandoned; /* its threads use the front's */
        /* A member that never reached its Redis has nothing there. */
        if (m->member.index && !capstan__redis_connects(m->member.r))
            continue;
        left &= leave_member(m, conn_of(m, r));
    }
    /* Nothing left for a supervisor to recover: it need not connect. */
    if (left)
        capstan__board_forget(rt);
    capstan__log_flush();
    capstan_info("Bye!");
}

/* This process's resident memory in bytes, or -1. */
static long long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, resident = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%lld %lld", &size, &resident) != 2)
        resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
}

/* A supervised worker's limits, checked by its main thread: a job past its
 * class's hard timeout fails (Capstan::Timeout), and the worker leaves, as
 * it does once its RSS passes max_memory; the supervisor starts its
 * successor as soon as the board says so. Returns 1 when the worker
 * leaves. */
static int over_limits(capstan_runtime_t *rt, capstan_redis_t *r)
{
    int leave = CAPSTAN_LEAVE_NONE;
    for (size_t i = 0; i < capstan__members(rt); i++) {
        capstan_runtime_t *m = capstan__member(rt, i);
        if (!capstan__slots_overdue(m))
            continue;
        live_conn(conn_of(m, r));
        capstan_metrics_t *was = capstan__metrics_use(m->member.metrics);
        if (capstan__slots_timeouts(m, conn_of(m, r)))
            leave = CAPSTAN_LEAVE_TIMEOUT;
        capstan__metrics_use(was);
    }
    if (!leave) {
        long long rss = rss_bytes();
        capstan__board_rss(rt, rss);
        if (rt->cfg->max_memory > 0 && rss > rt->cfg->max_memory) {
            capstan_warn("RSS %lld MB is over max_memory (%lld MB): finishing the jobs, then leaving",
                         rss >> 20, rt->cfg->max_memory >> 20);
            leave = CAPSTAN_LEAVE_MEMORY;
        }
    }
    if (leave == CAPSTAN_LEAVE_TIMEOUT)
        capstan_warn("a job ran over its timeout: this worker finishes its other jobs, then leaves");
    if (leave)
        capstan__board_leave(rt, leave);
    return leave != CAPSTAN_LEAVE_NONE;
}

/* "critical:3, default:1" or "a, b" (no weights), cut to fit n. */
static void queue_list(const capstan_config_t *c, char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < c->nqueues && len < n; i++) {
        const capstan_queue_conf_t *q = &c->queues[i];
        int w = q->weight > 0 ? snprintf(out + len, n - len, "%s%s:%d", i ? ", " : "", q->name, q->weight)
                              : snprintf(out + len, n - len, "%s%s", i ? ", " : "", q->name);
        len += w > 0 ? (size_t)w : 0;
    }
}

/* The registered classes, the first few by name. */
static void class_list(const capstan_runtime_t *rt, char *out, size_t n)
{
    enum { SHOWN = 8 };
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < rt->classes.nhandlers && i < SHOWN && len < n; i++) {
        int w = snprintf(out + len, n - len, "%s%s", i ? ", " : "", rt->classes.handlers[i].cls);
        len += w > 0 ? (size_t)w : 0;
    }
    if (rt->classes.nhandlers > SHOWN && len < n)
        snprintf(out + len, n - len, " and %zu more", rt->classes.nhandlers - SHOWN);
}

/* One line saying what this process will do, then the details at debug. */
static void log_start(capstan_runtime_t *rt, capstan_redis_t *r)
{
    const capstan_config_t *c = rt->cfg;
    char queues[512], classes[512];
    queue_list(c, queues, sizeof(queues));
    class_list(rt, classes, sizeof(classes));
    capstan_info("capstan %s starting: %s, environment %s, queues [%s] (%s), concurrency %d, %s fetch, "
                 "%zu classes [%s], unknown classes %s%s, identity %s",
                 CAPSTAN_VERSION, capstan_redis_name(r), capstan_config_environment(c), queues,
                 c->strict ? "strict order" : "weighted", c->concurrency,
                 c->fetch == CAPSTAN_FETCH_BASIC ? "basic" : "reliable", rt->classes.nhandlers, classes,
                 capstan_config_unknown_class_name(c->unknown_class),
                 c->unknown_class_explicit || c->unknown_class == CAPSTAN_UNKNOWN_REQUEUE
                     ? "" : " (requeue on queues a Ruby Sidekiq process reads)",
                 rt->self.identity);
    if (c->nshards) {
        char list[512] = "";
        size_t len = 0;
        for (size_t i = 0; i < c->nshards && len < sizeof(list); i++)
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", i ? ", " : "", c->shards[i].name);
        capstan_info("shards: %zu [%s], each a Redis of its own, all served by this process", c->nshards, list);
    }
    if (c->nperiodic) {
        char list[512] = "";
        size_t len = 0;
        for (size_t i = 0; i < c->nperiodic && len < sizeof(list); i++)
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s (%s%s%s)", i ? ", " : "",
                                    c->periodic[i].name, c->periodic[i].cron, c->periodic[i].tz ? ", " : "",
                                    c->periodic[i].tz ? c->periodic[i].tz : "");
        capstan_info("periodic: %zu schedule%s [%s]", c->nperiodic, c->nperiodic == 1 ? "" : "s", list);
    }
    if (rt->classes.nhandlers == 0 && c->unknown_class == CAPSTAN_UNKNOWN_FAIL)
        capstan_warn("no job classes are registered: every job will fail with NameError%s",
                     c->unknown_class_explicit ? "" : " unless a Ruby Sidekiq process reads its queue");
    capstan_debug("config file %s; timeout %g s, startup_timeout %g s, heartbeat every %g s, "
                  "liveness %g s, recovery every %g s (max %d), scheduler poll %g s average",
                  c->config_file ? c->config_file : "(none)", c->timeout, c->startup_timeout,
                  c->heartbeat_interval, c->liveness_ttl, c->recovery_interval, c->max_recoveries,
                  c->poll_interval_average > 0 ? c->poll_interval_average
                                           : c->average_scheduled_poll_interval);
}

/* Connects r at start. Redis may not be up yet: a refusal that may pass
 * (nothing listening, LOADING) is retried with backoff, the warning
 * repeated each time, for up to startup_timeout; one that will not (wrong
 * password, ACL, DB index, a Redis Cluster node) ends the start at once.
 * TERM/INT are answered meanwhile. Returns 0 once connected, 1 after
 * TERM/INT, or CAPSTAN_ECONFIG / CAPSTAN_EREDIS with err filled. Once
 * running, outages are waited out without end (capstan__rt_connect). */
static int wait_for_redis(capstan_runtime_t *rt, capstan_redis_t *r, const sigset_t *set, char *err)
{
    double limit = rt->cfg->startup_timeout;
    double give_up = capstan__mono() + limit, delay = 0.1;
    int rc;
    while ((rc = capstan_redis_connect(r)) != 0) {
        if (rc == CAPSTAN_ECONFIG)
            return capstan_seterr(err, CAPSTAN_ECONFIG, "%s", capstan_redis_error(r));
        double left = give_up - capstan__mono();
        if (limit > 0 && left <= 0)
            return capstan_seterr(err, CAPSTAN_EREDIS, "%s; gave up after startup_timeout (%g s)",
                                  capstan_redis_error(r), limit);
        double wait = limit > 0 && left < delay ? left : delay;
        capstan_warn("%s; waiting for Redis, next try in %.1f s", capstan_redis_error(r), wait);
        int sig = next_signal(rt, set, wait);
        if (sig == SIGTERM || sig == SIGINT) {
            capstan_info("Received %s while waiting for Redis. Bye!", capstan__sig_name(sig));
            return 1;
        }
        delay = delay * 2 > 5 ? 5 : delay * 2;
    }
    return 0;
}

/* The periodic thread's reconnects and sleeps: those of every thread of
 * the runtime, given up once it goes quiet. */
static int periodic_connect(void *rt, capstan_redis_t *r)
{
    capstan__member_log(rt); /* the periodic thread's first call */
    return capstan__rt_connect(rt, r, &((capstan_runtime_t *)rt)->quiet);
}

static void periodic_wait(void *rt, double s)
{
    capstan__rt_wait(rt, s);
}

static int start_threads(capstan_runtime_t *rt, char *err)
{
    int rc = rt->view.qlimits ? 0 : capstan__qlimits_new(rt->cfg, &rt->view.qlimits, err);
    if (rc)
        return rc;
    if (!capstan_runtime_server_chain(rt))
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    rc = capstan__slots_new(rt, err);
    if (rc)
        return rc;
    capstan__crash_watch(rt->member.index, capstan__shard_name(rt), rt->slots, rt->nslots);
    for (int i = 0; i < rt->nslots; i++) {
        int e = pthread_create(&rt->slots[i].thread, NULL, capstan__processor_main, &rt->slots[i]);
        if (e)
            return capstan_seterr(err, CAPSTAN_ESYS, "cannot start a processor thread: %s", strerror(e));
        rt->slots[i].started = 1;
    }
    if (pthread_create(&rt->keeper.thread, NULL, capstan__housekeeper_main, rt) == 0)
        rt->keeper.started = 1;
    if (pthread_create(&rt->sched.thread, NULL, capstan__scheduler_main, rt) == 0)
        rt->sched.started = 1;
    if (!rt->keeper.started || !rt->sched.started)
        return capstan_seterr(err, CAPSTAN_ESYS, "cannot start the housekeeper or scheduler thread");
    if (capstan__sentinel_scheme(rt->cfg->redis_url)) {
        if (pthread_create(&rt->watch.thread, NULL, capstan__master_watch_main, rt))
            return capstan_seterr(err, CAPSTAN_ESYS, "cannot start the master watch thread");
        rt->watch.started = 1;
    }
    /* With shards each schedule ticks in its home shard's member alone. */
    const capstan_config_t *pc = rt->member.ticks ? rt->member.ticks : rt->cfg;
    if (pc->nperiodic) {
        rt->periodic.env = (capstan_periodic_env_t){ .cfg = pc, .stop = &rt->quiet,
                                                     .connect = periodic_connect, .wait = periodic_wait,
                                                     .ud = rt };
        if (pthread_create(&rt->periodic.thread, NULL, capstan__periodic_main, &rt->periodic.env))
            return capstan_seterr(err, CAPSTAN_ESYS, "cannot start the periodic thread");
        rt->periodic.started = 1;
    }
    return 0;
}

int capstan__runtime_prepare(capstan_runtime_t *rt, char *err)
{
    const capstan_config_t *c = rt->cfg;
    rt->source = capstan__source_for(c);
    if (rt->source->prefetches && !rt->feed && !(rt->feed = capstan__source_feed_new(rt)))
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    rt->self.info_json = build_info(rt);
    if (!rt->view.paused)
        rt->view.paused = capstan__paused_new(c->queues, c->nqueues);
    if (!rt->view.liveness)
        rt->view.liveness = capstan__liveness_new(rt->self.identity, c->liveness_ttl);
    if (!rt->view.fleet)
        rt->view.fleet = capstan__fleet_new(c, capstan__shard_name(rt));
    if (!rt->self.info_json || !rt->view.paused || !rt->view.liveness || !rt->view.fleet)
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    return 0;
}

int capstan__runtime_begin(capstan_runtime_t *rt, capstan_redis_t *r, char *err)
{
    if (rt->source->working_list) {
        capstan__liveness_refresh(rt->view.liveness, r);
        capstan__recover_orphans(rt, r);
    }
    capstan__heartbeat_beat(rt, r, 0);
    /* Before the first fetch: a Ruby process reading our queues must not
     * lose its jobs to NameError in the first minute. */
    capstan__fleet_look(rt->view.fleet, r);
    return start_threads(rt, err);
}

/* The /metrics gauge of processors running a job (observe/http.h). */
static int busy_threads(void *ud)
{
    int n = 0;
    for (size_t i = 0; i < capstan__members(ud); i++)
        n += atomic_load(&capstan__member(ud, i)->busy);
    return n;
}

/* The /metrics gauge of jobs fetched ahead, by queue (observe/http.h). */
static void prefetched(void *ud, size_t shard, const char *const *queues, size_t n, long long *counts)
{
    capstan_runtime_t *m = capstan__member(ud, shard);
    m->source->count(m, queues, counts, n);
}

/* Every member's queue names, each once (borrowed from their configs), in
 * *n: the queues the metrics port counts the prefetched jobs of. */
static const char **queue_names(capstan_runtime_t *rt, size_t *n)
{
    size_t cap = 0;
    for (size_t i = 0; i < capstan__members(rt); i++)
        cap += capstan__member(rt, i)->cfg->nqueues;
    const char **names = calloc(cap ? cap : 1, sizeof(*names));
    *n = 0;
    for (size_t i = 0; names && i < capstan__members(rt); i++) {
        const capstan_config_t *mc = capstan__member(rt, i)->cfg;
        for (size_t q = 0; q < mc->nqueues; q++) {
            size_t k = 0;
            while (k < *n && strcmp(names[k], mc->queues[q].name))
                k++;
            if (k == *n)
                names[(*n)++] = mc->queues[q].name;
        }
    }
    return names;
}

/* CAPSTAN_GRACE: the seconds whatever stops this process (Kubernetes'
 * terminationGracePeriodSeconds, systemd's TimeoutStopSec) waits before
 * it kills it. A timeout not below it has jobs killed mid-run instead of
 * given back. Said once a host (worker 0). */
static void grace_check(const capstan_config_t *c, int slot)
{
    const char *g = getenv("CAPSTAN_GRACE");
    char *end = NULL;
    double grace = g ? strtod(g, &end) : 0;
    if (slot != 0 || !g || end == g || grace <= 0 || c->timeout < grace)
        return;
    capstan_warn("timeout (%g s) is not below CAPSTAN_GRACE (%g s): jobs still running when the grace "
                 "ends are killed mid-run instead of given back; give the stop more than timeout plus "
                 "a few seconds", c->timeout, grace);
}

/* /livez and /readyz (observe/http.h): this process, with shards by each
 * shard, then under a supervisor every other worker serving, the first
 * failing one named (with shards, its worker too under a supervisor).
 * In a reload both workers of a slot answer on the port: the one not
 * serving judges the other in its stead. */
static int probe(void *ud, int ready, char *why, size_t n)
{
    capstan_runtime_t *rt = ud;
    double now = capstan__mono();
    char one[CAPSTAN_ERRLEN], me[32] = "";
    if (rt->link.probes)
        snprintf(me, sizeof(me), "worker %d: ", rt->link.worker_slot);
    int replaced = rt->link.probes && capstan__probe_replaced(rt->link.probes, rt->link.nprobes, rt->link.probe_row);
    for (size_t i = 0; i < capstan__members(rt) && !replaced; i++) {
        if (capstan__probe_judge(capstan__member(rt, i)->link.probe, ready, now, one, sizeof(one)))
            continue;
        if (rt->cfg->nshards)
            snprintf(why, n, "%sshard %s: %s", me, rt->cfg->shards[i].name, one);
        else
            snprintf(why, n, "%s", one);
        return 0;
    }
    return !rt->link.probes
           || capstan__probe_judge_rows(rt->link.probes, rt->link.nprobes, rt->link.probe_row, ready, now, why, n);
}

static int run(capstan_runtime_t *rt, char *err)
{
    capstan_config_t *c = rt->cfg;
    int rc = capstan_config_validate(c, err);
    if (rc)
        return rc;
    /* The handlers are registered and the file read: each job finds its
     * class's merged options in one row from now on. */
    if (capstan__classes_resolve(rt))
        return capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
    rt->classes.retry = (capstan_retry_conf_t){ .max_retries = c->max_retries, .timestamps = c->timestamps };
    sigset_t set, old;
    sigemptyset(&set);
    int sigs[] = { SIGTERM, SIGINT, SIGTSTP, SIGTTIN, SIGUSR2 };
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(&set, sigs[i]);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    /* hiredis writes with write(): a large command sent on a connection
     * whose server restarted meanwhile would otherwise kill the process on
     * its second write. A program that set its own SIGPIPE keeps it. */
    struct sigaction pipe_sa;
    if (sigaction(SIGPIPE, NULL, &pipe_sa) == 0 && pipe_sa.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
    capstan__crash_install();

    capstan_http_t *http = NULL;
    capstan_redis_t *r = NULL;
    const char **qnames = NULL;
    rt->self.started_at = capstan__now();
    /* The members are made before the front's queues become the first
     * shard's; the feeds are there before the metrics thread can count
     * them. */
    if ((rc = capstan__shards_new(rt, err)) != 0 || (rc = capstan__runtime_prepare(rt, err)) != 0)
        goto out;
    size_t nqnames = 0;
    if (!(qnames = queue_names(rt, &nqnames))) {
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        goto out;
    }
    capstan_http_conf_t hc = { .bind = c->metrics_bind, .port = c->metrics_port,
                               .redis_url = c->redis_url, .threads = c->concurrency,
                               .busy_threads = busy_threads, .probe = probe, .ud = rt,
                               .shard_metrics = capstan__shards_metrics,
                               .reuse_port = rt->link.board != NULL };
    if (rt->source->prefetches) {
        hc.queues = qnames;
        hc.nqueues = nqnames;
        hc.prefetched = prefetched;
    }
    /* Before Redis, so a port in use stops the start at once instead of
     * leaving a worker running without its metrics. */
    if (c->metrics_port > 0 && (rc = capstan__http_start(&hc, &http, err)) != 0)
        goto out;
    capstan__unique_metrics_buffer(1); /* lock metrics go out with each heartbeat */
    r = capstan_redis_new(c->redis_url, 10, err);
    if (!r) {
        rc = CAPSTAN_ECONFIG;
        goto out;
    }
    log_start(rt, r);
    grace_check(c, rt->link.worker_slot);
    if ((rc = wait_for_redis(rt, r, &set, err)) != 0) {
        /* Nothing of this process is in Redis: its supervisor has nothing
         * to recover (and a server refused would refuse it too). */
        capstan__board_forget(rt);
        rc = rc > 0 ? 0 : rc;
        goto out;
    }
    capstan_debug("connected to %s", capstan_redis_name(r));
    if ((rc = capstan__runtime_begin(rt, r, err)) != 0 || (rc = capstan__shards_start(rt, err)) != 0) {
        capstan_error("%s", err);
        shutdown_all(rt, r, &set, 0);
        goto out;
    }
    capstan_info("Starting processing, hit Ctrl-C to stop");
    capstan__notify("READY=1");
    capstan__board_ready(rt);
    double tick = capstan__notify_watchdog_every();
    tick = tick > 0 && tick < 0.2 ? tick : 0.2;
    int sig;
    for (;;) {
        capstan__notify_watchdog();
        capstan__log_flush();
        sig = next_signal(rt, &set, tick);
        if (handle_signal(rt, sig))
            break;
        if (capstan__shards_failed(rt, &rc, err)) {
            capstan_error("%s", err);
            sig = 0;
            break;
        }
        if (rt->link.board && over_limits(rt, r)) {
            sig = 0;
            break;
        }
    }
    shutdown_all(rt, r, &set, sig);
out:
    capstan__http_stop(http);
    free(qnames);
    capstan_redis_free(r);
    capstan__crash_uninstall();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

int capstan_runtime_run(capstan_runtime_t *rt, char *err)
{
    int rc = run(rt, err);
    /* Told to the supervisor before the worker exits, which takes any
     * other exit (a handler's exit(0) too) for a crash, and repeats a
     * failed start's reason as its own last line. A run that ended before
     * the processors started left no job to recover. */
    if (!rt->nslots)
        capstan__board_forget(rt);
    capstan__board_ended(rt, rc ? err : NULL);
    return rc;
}
