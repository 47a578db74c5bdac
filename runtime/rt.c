/* How the runtime's threads sleep, wake each other and get through a
 * Redis outage: the waits on rt->wake that quiet and shutdown cut short,
 * and the reconnect loop every thread's connection goes through, so that
 * an outage is logged once for the process rather than once per thread. */
#include "runtime/rt.h"
#include "redis/scripts.h"

#include "observe/prometheus.h"
#include "support/log.h"
#include "support/time.h"

void capstan__rt_wait(capstan_runtime_t *rt, double s)
{
    struct timespec ts = capstan__timespec(capstan__now() + s);
    pthread_mutex_lock(&rt->wake_mu);
    pthread_cond_timedwait(&rt->wake, &rt->wake_mu, &ts);
    pthread_mutex_unlock(&rt->wake_mu);
}

void capstan__rt_wake(capstan_runtime_t *rt)
{
    pthread_mutex_lock(&rt->wake_mu);
    pthread_cond_broadcast(&rt->wake);
    /* The scheduler sleeps on a condition of its own (scheduler.c). */
    pthread_cond_broadcast(&rt->sched_wake.cv);
    pthread_mutex_unlock(&rt->wake_mu);
}

int capstan__rt_connect(capstan_runtime_t *rt, capstan_redis_t *r, atomic_int *give_up)
{
    return capstan__rt_connect_every(rt, r, give_up, 5);
}

int capstan__rt_connect_every(capstan_runtime_t *rt, capstan_redis_t *r, atomic_int *give_up,
                              double max_delay)
{
    double delay = 0.05;
    for (;;) {
        /* Every thread notices an outage on its own connection; the first
         * to fail reports it and the first back reports the recovery. */
        if (capstan_redis_connect(r) == 0) {
            /* A connection made again, not a new one, is a reconnect. */
            if (capstan__redis_connects(r) > 1)
                capstan__metrics_add(capstan__rt_metrics(rt), CAPSTAN_METRIC_REDIS_RECONNECTS, 1);
            if (atomic_exchange(&rt->health.redis_down, 0))
                capstan_info("Redis is online, %.3f sec downtime",
                             capstan__mono() - atomic_load(&rt->health.redis_down_at));
            return 0;
        }
        int was_up = 0;
        double now = capstan__mono();
        if (atomic_compare_exchange_strong(&rt->health.redis_down, &was_up, 1)) {
            atomic_store(&rt->health.redis_down_at, now);
            capstan_warn("%s; retrying with backoff", capstan_redis_error(r));
        }
        double until = capstan__mono() + delay;
        while (capstan__mono() < until) {
            if (give_up && atomic_load(give_up))
                return CAPSTAN_EREDIS;
            capstan__rt_wait(rt, until - capstan__mono() < 0.2 ? until - capstan__mono() : 0.2);
        }
        delay = delay * 2 > max_delay ? max_delay : delay * 2;
    }
}

capstan_metrics_t *capstan__rt_metrics(capstan_runtime_t *rt)
{
    return rt->member.metrics ? rt->member.metrics : capstan__metrics_default();
}

void capstan__rt_job_metrics(capstan_runtime_t *rt, const char *cls, const char *queue, double seconds,
                             int failed, const char *raw)
{
    capstan__metrics_job(capstan__rt_metrics(rt), cls, queue, seconds, failed, raw);
}
