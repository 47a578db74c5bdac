/* Ruby's JSON.generate over JSON text (ruby_json.c), for the digests and
 * lock_args that must match what a Ruby process writes byte for byte. Not
 * part of the public API. */
#ifndef CAPSTAN_UNIQUE_RUBY_JSON_H
#define CAPSTAN_UNIQUE_RUBY_JSON_H

#include <stddef.h>

#include "support/buf.h"

/* The JSON that Ruby's JSON.generate writes for the JSON value in[0..len):
 * compact, "/" unescaped, raw UTF-8, Ruby's Float#to_s for floats, integers
 * of any size kept, object keys in their order. Returns a string owned by
 * the caller (*outlen its length, may be NULL), or NULL when in is not one
 * JSON value or memory ran out. */
char *capstan__ruby_json_dup(const char *in, size_t len, size_t *outlen);

/* The elements of the JSON array args[0..len) at the indexes idx[0..nidx),
 * in that order (indexes past its end skipped), or all of it when idx is
 * NULL, as a Ruby JSON array. Returns a string owned by the caller, or
 * NULL when args is not an array or memory ran out. */
char *capstan__ruby_json_pick(const char *args, size_t len, const int *idx, size_t nidx);

/* Appends the C string s to b as a JSON string the way Ruby writes it
 * (only '"', '\\' and control characters escaped). Returns 0 or
 * CAPSTAN_ENOMEM. */
int capstan__ruby_json_string(capstan_buf_t *b, const char *s);

#endif
