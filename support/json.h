/* A validating JSON scanner that keeps the text as it is.
 *
 * jansson cannot hold integers wider than 64 bits, and a Ruby app can enqueue
 * them, so kiq never round-trips a payload through a parser: it checks the
 * text once, records where each top-level member lies, and edits the text
 * itself (payload.c). */
#ifndef KIQ_SUPPORT_JSON_H
#define KIQ_SUPPORT_JSON_H

#include <stddef.h>

typedef struct kiq_jmember {
    size_t kstart, klen;  /* key bytes inside the quotes, escapes undecoded */
    size_t vstart, vlen;  /* value text */
} kiq_jmember_t;

typedef struct kiq_jobject {
    kiq_jmember_t *m;     /* owned */
    size_t n, cap;
} kiq_jobject_t;

/* Checks that s[0..len) is one JSON value (RFC 8259 grammar; numbers of any
 * size; string bytes are not checked for UTF-8). Returns 0 or KIQ_EPARSE with
 * a message naming the byte offset in err (KIQ_ERRLEN, may be NULL). */
int kiq__json_validate(const char *s, size_t len, char *err);

/* Validates s as a JSON object and fills obj with its top-level members in
 * order. obj must be zeroed or previously used; free with kiq__jobject_free.
 * Returns 0, KIQ_EPARSE (not JSON, or not an object) or KIQ_ENOMEM. */
int kiq__json_scan_object(const char *s, size_t len, kiq_jobject_t *obj, char *err);
void kiq__jobject_free(kiq_jobject_t *obj);

/* The last member named key (JSON keeps the last of duplicates), or NULL. */
const kiq_jmember_t *kiq__jobject_get(const kiq_jobject_t *obj, const char *s,
                                     const char *key);

/* Decodes the JSON string literal v[0..len) (with quotes) into a new
 * NUL-terminated string owned by the caller. Returns NULL if it is not a
 * string or on allocation failure. */
char *kiq__json_string_dup(const char *v, size_t len);

/* Appends s[0..len) to *buf as a JSON string literal (with quotes). Bytes that
 * are not valid UTF-8 become U+FFFD. buf is a growable kiq_buf. */
struct kiq_buf;
int kiq__json_quote(struct kiq_buf *b, const char *s, size_t len);

/* True when s[0..len) is valid UTF-8. */
int kiq__utf8_valid(const char *s, size_t len);

/* Length of the valid UTF-8 sequence at s (n > 0 bytes available): 1 to 4,
 * or 0 when s starts with a byte that begins none (overlong forms and
 * surrogates included). */
size_t kiq__utf8_seq(const char *s, size_t n);

#endif
