/* A validating JSON scanner that keeps the text as it is.
 *
 * jansson cannot hold integers wider than 64 bits, and a Ruby app can enqueue
 * them, so capstan never round-trips a payload through a parser: it checks the
 * text once, records where each top-level member lies, and edits the text
 * itself (payload.c). */
#ifndef CAPSTAN_SUPPORT_JSON_H
#define CAPSTAN_SUPPORT_JSON_H

#include <stddef.h>
#include <string.h>

typedef struct capstan_jmember {
    size_t kstart, klen;  /* key bytes inside the quotes, escapes undecoded */
    size_t vstart, vlen;  /* value text */
} capstan_jmember_t;

typedef struct capstan_jobject {
    capstan_jmember_t *m; /* owned, or the room lent (see capstan__jobject_lend) */
    size_t n, cap;
    /* A bit per member key (of its length and first byte): a look-up whose
     * key has no bit here is done at once, as most of a job's are. */
    unsigned long long keys;
    int lent;             /* m is the room lent: not freed; outgrown, copied */
} capstan_jobject_t;

/* Lends obj room for cap members, which the next scans fill before any
 * allocation (the room must outlive obj's use of it). Call on a zeroed or
 * freed obj. */
static inline void capstan__jobject_lend(capstan_jobject_t *obj, capstan_jmember_t *room, size_t cap)
{
    obj->m = room;
    obj->cap = cap;
    obj->n = 0;
    obj->lent = 1;
}

/* Checks that s[0..len) is one JSON value (RFC 8259 grammar; numbers of any
 * size; string bytes are not checked for UTF-8). Returns 0 or CAPSTAN_EPARSE with
 * a message naming the byte offset in err (CAPSTAN_ERRLEN, may be NULL). */
int capstan__json_validate(const char *s, size_t len, char *err);

/* Validates s as a JSON object and fills obj with its top-level members in
 * order. obj must be zeroed or previously used; free with capstan__jobject_free.
 * Returns 0, CAPSTAN_EPARSE (not JSON, or not an object) or CAPSTAN_ENOMEM. */
int capstan__json_scan_object(const char *s, size_t len, capstan_jobject_t *obj, char *err);
void capstan__jobject_free(capstan_jobject_t *obj);

/* The last member named key[0..klen) (JSON keeps the last of duplicates),
 * or NULL. */
const capstan_jmember_t *capstan__jobject_getn(const capstan_jobject_t *obj, const char *s,
                                               const char *key, size_t klen);

/* The bit of capstan_jobject_t.keys for a key of klen bytes at key. */
static inline unsigned long long capstan__jkey_bit(const char *key, size_t klen)
{
    return 1ULL << ((klen * 7 + (klen ? (unsigned char)key[0] : 0)) & 63);
}

/* The same for the string key: inline, so that for a literal key (a job
 * makes a dozen look-ups, most for keys it lacks) its length and bit are
 * known when compiled, and an absent one costs no call. */
static inline const capstan_jmember_t *capstan__jobject_get(const capstan_jobject_t *obj,
                                                            const char *s, const char *key)
{
    size_t klen = strlen(key);
    if (!(obj->keys & capstan__jkey_bit(key, klen)))
        return NULL;
    return capstan__jobject_getn(obj, s, key, klen);
}

/* Decodes the JSON string literal v[0..len) (with quotes) into out, which
 * has room for len - 1 bytes, and ends it with a NUL. Returns the decoded
 * length (the NUL not counted), or (size_t)-1 when v is not a string (out
 * then is untouched). */
size_t capstan__json_string_decode(const char *v, size_t len, char *out);

/* The same into a new NUL-terminated string owned by the caller. Returns
 * NULL if it is not a string or on allocation failure. */
char *capstan__json_string_dup(const char *v, size_t len);

/* Appends s[0..len) to b as a JSON string literal (with quotes). Bytes that
 * are not valid UTF-8 become U+FFFD. Returns 0 or CAPSTAN_ENOMEM. */
struct capstan_buf;
int capstan__json_quote(struct capstan_buf *b, const char *s, size_t len);

/* The value of hex digit c (0-9, a-f, A-F), or -1. */
int capstan__hexval(char c);

/* True when s[0..len) is valid UTF-8. */
int capstan__utf8_valid(const char *s, size_t len);

/* Length of the valid UTF-8 sequence at s (n > 0 bytes available): 1 to 4,
 * or 0 when s starts with a byte that begins none (overlong forms and
 * surrogates included). */
size_t capstan__utf8_seq(const char *s, size_t n);

#endif
