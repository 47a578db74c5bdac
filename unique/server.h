/* What the server half of uniqueness (unique/server.c) offers the runtime
 * besides its middleware (capstan_unique_server_mw) and the runtime locks
 * asked for ahead (unique/prelock.h). Not part of the public API. */
#ifndef CAPSTAN_UNIQUE_SERVER_H
#define CAPSTAN_UNIQUE_SERVER_H

#include "middleware/mw.h"

/* Records v9's "unlocked" metric for the lock o->release_key, which the
 * ack of o's job released: the middleware chose the lock, but only the
 * ack, written later with other acks, knows that it went. */
void capstan__unique_note_released(const capstan_outcome_t *o, capstan_redis_t *r);

/* The job of mw will not run though it is done with (it expired): the
 * uniqueness lock it holds goes as after a successful run, with its ack
 * (until_executed, until_executing, until_and_while_executing's until-lock,
 * a runtime lock asked for ahead); until_expired's stays until its ttl. */
void capstan__unique_server_skip(capstan_mw_t *mw);

#endif
