/* The basic fetch: BRPOP, as Sidekiq OSS, one job at a time; a job lives
 * only in memory while it runs, so its ack writes only what it stores and
 * a requeue is a plain RPUSH. See fetch/fetch.h. */
#include "fetch/fetch_internal.h"

#include <string.h>

static size_t queue_of_key(const capstan_fetch_t *f, const char *key)
{
    for (size_t i = 0; i < f->nq; i++)
        if (strcmp(f->keys[i], key) == 0)
            return i;
    return 0;
}

static int fetch_basic(capstan_fetch_t *f, capstan_redis_t *r, capstan_fetched_t *out)
{
    if (!f->nact)
        return capstan__fetch_wait_paused(f);
    const char *argv[f->nact + 2];
    argv[0] = "BRPOP";
    for (size_t i = 0; i < f->nact; i++)
        argv[1 + i] = f->keys[f->order[i]];
    argv[f->nact + 1] = f->timeout_s;
    redisReply *rep = capstan_redis_cmd(r, (int)f->nact + 2, argv, NULL);
    if (!rep)
        return CAPSTAN_EREDIS;
    int rc = 0;
    size_t qi = 0;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
        rc = capstan__fetch_take(f, rep->element[1], qi = queue_of_key(f, rep->element[0]->str), out);
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = CAPSTAN_EREPLY;
    if (rep->type != REDIS_REPLY_ERROR)
        atomic_fetch_add(&f->answered, 1);
    freeReplyObject(rep);
    return rc == 1 ? capstan__fetch_give_back_paused(f, r, qi, out, 1) : rc;
}

static int ack(capstan_fetch_t *f, capstan_redis_t *r, const char *raw, size_t len, const capstan_ack_t *a)
{
    (void)f;
    int sent, rc = capstan__fetch_append_ack(r, NULL, raw, len, a, &sent);
    if (rc || !sent)
        return rc ? CAPSTAN_EREDIS : 0;
    return capstan__fetch_read_ack(r, a, 0) ? CAPSTAN_EREDIS : 0;
}

/* The calls one by one, each in a round trip of its own. */
static int run_calls(capstan_redis_t *r, capstan_script_call_t *calls, size_t ncalls)
{
    for (size_t i = 0; i < ncalls; i++)
        if (!(calls[i].reply = capstan__redis_script(r, calls[i].script, calls[i].nkeys,
                                                     calls[i].argc, calls[i].argv, NULL)))
            return CAPSTAN_EREDIS;
    return 0;
}

/* The acks one by one, the calls one by one, then one job at most,
 * blocking. */
static int exchange(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks, size_t nacks,
                    capstan_script_call_t *calls, size_t ncalls, capstan_fetched_t *out, size_t max,
                    int block)
{
    (void)block;
    capstan__fetch_reset(acks, nacks, calls, ncalls, out, max);
    for (size_t i = 0; i < nacks; i++)
        if ((acks[i].rc = ack(f, r, acks[i].raw, acks[i].len, &acks[i].ack)))
            return CAPSTAN_EREDIS;
    if (run_calls(r, calls, ncalls))
        return CAPSTAN_EREDIS;
    if (!max)
        return 0;
    capstan__fetch_plan_order(f);
    int rc = fetch_basic(f, r, out);
    return rc == CAPSTAN_EREPLY ? CAPSTAN_EREDIS : rc;
}

/* No round trip to split: a caller of capstan__fetch_send needs the
 * reliable fetch. */
static capstan_exchange_t *send(capstan_fetch_t *f, capstan_redis_t *r, capstan_ack_item_t *acks,
                                size_t nacks, size_t max, int *rc)
{
    (void)f, (void)r, (void)acks, (void)nacks, (void)max;
    *rc = CAPSTAN_EINVAL;
    return NULL;
}

static redisReply *requeue(capstan_fetch_t *f, capstan_redis_t *r, const char **argv, size_t *lens, int argc)
{
    (void)f;
    argv[0] = "RPUSH";
    lens[0] = strlen(argv[0]);
    return capstan_redis_cmd(r, argc, argv, lens);
}

const capstan_fetch_ops_t capstan__fetch_basic = {
    .exchange = exchange, .send = send, .ack = ack, .requeue = requeue,
};
