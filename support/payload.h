/* Edits of a job payload's text: replace or add top-level fields and leave
 * every other byte as the client wrote it. */
#ifndef CAPSTAN_SUPPORT_PAYLOAD_H
#define CAPSTAN_SUPPORT_PAYLOAD_H

#include <stddef.h>

#include "support/json.h"
#include "capstan/config.h"

typedef struct capstan_field {
    const char *key;
    const char *value; /* raw JSON text of the new value; NULL removes the key */
    size_t vlen;       /* 0 = strlen(value) */
} capstan_field_t;

/* Builds a new payload from s (scanned into obj): fields in set replace the
 * value of an existing member in place (all duplicates collapse into one) or
 * are appended at the end in order. *out is owned by the caller (free()).
 * Returns 0 or CAPSTAN_ENOMEM. */
int capstan__payload_edit(const char *s, const capstan_jobject_t *obj,
                          const capstan_field_t *set, size_t nset,
                          char **out, size_t *outlen);

/* Writes now as a JSON timestamp of the given format into buf (32 bytes):
 * float seconds always carry a '.', millis are an integer. */
void capstan__ts_json(char *buf, double now, capstan_ts_format_t fmt);

/* The unit of the timestamps payload s (scanned into obj) already carries:
 * that of its created_at, else enqueued_at, failed_at or retried_at (an
 * integer is Sidekiq 8's milliseconds, a number with '.' or an exponent
 * seconds); fallback when it has none of them as a number. A field capstan
 * writes takes this unit, so the readers of a payload never see two units
 * in it and a Sidekiq 8 job stays in milliseconds under timestamps: float. */
capstan_ts_format_t capstan__ts_format_of(const char *s, const capstan_jobject_t *obj,
                                          capstan_ts_format_t fallback);

/* Reads a JSON timestamp: a number with '.' or an exponent is seconds, an
 * integer is milliseconds. Returns epoch seconds or 0 when v is not a number. */
double capstan__ts_parse(const char *v, size_t len);

/* A new random jid (24 lowercase hex chars + NUL) into out. */
void capstan__new_jid(char out[25]);

#endif
