/* The processors' slots (capstan_slot_t, in rt.h): what each processor
 * thread is doing, for the heartbeat (work hash), TTIN, the fatal-signal
 * report and shutdown. A job is marked in its slot from its start to its
 * ack, under the slot's lock, so that the shutdown's give-back and the
 * processor's own ack never both happen. Not part of the public API. */
#ifndef CAPSTAN_RUNTIME_SLOT_H
#define CAPSTAN_RUNTIME_SLOT_H

#include "runtime/rt.h"

/* Makes rt->slots, one for each of the concurrency processors, each with
 * its fetch, and rt->keeper.slot, the housekeeper's. Returns 0, or
 * CAPSTAN_ENOMEM with err filled; what was made is freed by
 * capstan__slots_free either way. */
int capstan__slots_new(struct capstan_runtime *rt, char *err);
/* Frees rt->slots and what each holds (its fetch, its lock). */
void capstan__slots_free(struct capstan_runtime *rt);

/* Marks s busy with job (whose payload and queue must outlive the mark).
 * A job taken ahead (see capstan__feed_take_ahead) leaves its seat's list
 * in the same step, unless the give-back at shutdown took it: then the
 * slot stays free and 1 is returned. Otherwise 0. */
int capstan__slot_set(capstan_slot_t *s, const capstan_job_t *job, int ahead);
/* Marks s free again. */
void capstan__slot_clear(capstan_slot_t *s);
/* Acknowledges the job raw[0..len) running in s with ack until it is
 * written (0), unless shutdown gave the job back meanwhile (CAPSTAN_EDENIED),
 * or the process stops during a Redis outage (CAPSTAN_EREDIS). */
int capstan__slot_ack(capstan_slot_t *s, capstan_redis_t *r, const char *raw, size_t len,
                      const capstan_ack_t *ack);
/* Reconnects r when it broke, so that a handler always gets a connected
 * context. Returns 0 when s's job may start, nonzero when it must not
 * (the process exits, or shutdown gave the job back). */
int capstan__slot_connected(capstan_slot_t *s, capstan_redis_t *r);

/* How many slots run a job that shutdown has not given back. */
int capstan__slots_busy(struct capstan_runtime *rt);
/* Puts back every job still running (marking its slot abandoned) and the
 * jobs the feed holds, using r. Returns the number requeued. */
int capstan__slots_requeue_busy(struct capstan_runtime *rt, capstan_redis_t *r);

/* Fails every job running past its class's hard timeout with
 * Capstan::Timeout under the retry rules (written with its removal from
 * the working list, on r), and marks its slot abandoned so that its
 * processor never acks it. Returns how many jobs timed out. */
int capstan__slots_timeouts(struct capstan_runtime *rt, capstan_redis_t *r);
/* How many jobs run past their hard timeout (not failed yet). */
int capstan__slots_overdue(struct capstan_runtime *rt);

#endif
