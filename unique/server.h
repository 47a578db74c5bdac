/* What the server half of uniqueness (unique/server.c) offers the runtime
 * besides its middleware (capstan_unique_server_mw) and the runtime locks
 * asked for ahead (unique/prelock.h). Not part of the public API. */
#ifndef CAPSTAN_UNIQUE_SERVER_H
#define CAPSTAN_UNIQUE_SERVER_H

#include "middleware/mw.h"

/* Records v9's "unlocked" metric for the lock mw->release_key, which the
 * ack of mw's job released: the middleware chose the lock, but only the
 * ack, written later with other acks, knows that it went. */
void capstan__unique_note_released(const capstan_mw_t *mw, capstan_redis_t *r);

#endif
