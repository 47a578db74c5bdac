/* Job payloads as any client may write them: the JSON scanner and the
 * text edits the runtime makes on retry, death and invalid input.
 *
 * Invariants: what jansson accepts the scanner accepts; member spans lie
 * inside the text and each value is JSON on its own; an edit (and the
 * retry and dead-set payloads built with it) is a JSON object that keeps
 * every untouched member byte for byte, and stays loadable by jansson
 * when the input was; an invalid payload's dead entry is JSON. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "job/job.h"
#include "support/json.h"
#include "support/payload.h"
#include "capstan/config.h"
#include "capstan/error.h"

#define CHECK(c) ((c) ? (void)0 : abort())

/* Jansson nests 2048 deep, the scanner 512: only texts too short to nest
 * past 512 are compared with jansson's verdict. */
#define COMPARE_MAX 1024

static const double now = 1700000000.25;

static int jansson_ok(const char *s, size_t len)
{
    json_t *j = json_loadb(s, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    json_decref(j);
    return j != NULL;
}

static char *raw_key(const char *s, const capstan_jmember_t *m)
{
    char *k = strndup(s + m->kstart, m->klen);
    CHECK(k != NULL);
    return k;
}

/* out[m] equals in[m] for a member m of in whose key is not in skip. */
static void check_kept(const char *in, const capstan_jobject_t *io, const char *out,
                       const capstan_jobject_t *oo, const char *const *skip, size_t nskip)
{
    for (size_t i = 0; i < io->n; i++) {
        char *k = raw_key(in, &io->m[i]);
        int skipped = 0;
        for (size_t j = 0; j < nskip; j++)
            skipped |= skip[j] && !strcmp(skip[j], k);
        if (!skipped) {
            const capstan_jmember_t *a = capstan__jobject_get(io, in, k), *b = capstan__jobject_get(oo, out, k);
            CHECK(a && b && a->vlen == b->vlen);
            CHECK(memcmp(in + a->vstart, out + b->vstart, a->vlen) == 0);
        }
        free(k);
    }
}

static void check_members(const char *s, size_t len, const capstan_jobject_t *o)
{
    for (size_t i = 0; i < o->n; i++) {
        const capstan_jmember_t *m = &o->m[i];
        CHECK(m->kstart >= 2 && m->kstart + m->klen < len);
        CHECK(s[m->kstart - 1] == '"' && s[m->kstart + m->klen] == '"');
        CHECK(m->vstart + m->vlen <= len && m->vlen > 0);
        CHECK(capstan__json_validate(s + m->vstart, m->vlen, NULL) == 0);
        free(capstan__json_string_dup(s + m->kstart - 1, m->klen + 2));
        if (s[m->vstart] == '"') {
            char *v = capstan__json_string_dup(s + m->vstart, m->vlen);
            CHECK(v != NULL);
            free(v);
        }
        char *k = raw_key(s, m);
        const capstan_jmember_t *last = capstan__jobject_get(o, s, k);
        CHECK(last && last >= m);
        free(k);
    }
}

/* Replaces the first member, removes the last, adds two, as retry does. */
static void check_edit(const char *s, size_t len, const capstan_jobject_t *o, int jok)
{
    capstan_buf_t msg = {0};
    CHECK(capstan__json_quote(&msg, s, len) == 0);
    char *first = o->n ? raw_key(s, &o->m[0]) : NULL;
    char *last = o->n ? raw_key(s, &o->m[o->n - 1]) : NULL;
    /* A key given twice in one edit is the caller's mistake: avoid it. */
    if (first && (!strcmp(first, "retry_count") || !strcmp(first, "error_message"))) {
        free(first);
        first = NULL;
    }
    if (last && (!strcmp(last, "retry_count") || !strcmp(last, "error_message"))) {
        free(last);
        last = NULL;
    }
    capstan_field_t set[4] = {
        { "retry_count", "7", 0 },
        { "error_message", msg.p, msg.len },
        { first ? first : "class", "null", 0 },
        { last ? last : "gone", NULL, 0 },
    };
    char *out = NULL;
    size_t outlen = 0;
    CHECK(capstan__payload_edit(s, o, set, 4, &out, &outlen) == 0);
    capstan_jobject_t oo = {0};
    CHECK(capstan__json_scan_object(out, outlen, &oo, NULL) == 0);
    CHECK(!jok || jansson_ok(out, outlen));
    const capstan_jmember_t *m = capstan__jobject_get(&oo, out, "retry_count");
    CHECK(m && m->vlen == 1 && out[m->vstart] == '7');
    if (strcmp(set[3].key, set[2].key))
        CHECK(capstan__jobject_get(&oo, out, set[3].key) == NULL);
    const char *skip[] = { "retry_count", "error_message", set[2].key, set[3].key };
    check_kept(s, o, out, &oo, skip, 4);
    capstan__jobject_free(&oo);
    free(out);
    free(first);
    free(last);
    capstan__buf_free(&msg);
}

/* A failed job through Sidekiq's retry rules. */
static void check_retry(const char *s, size_t len, const capstan_retry_conf_t *conf, int jok)
{
    char *copy = malloc(len ? len : 1), err[CAPSTAN_ERRLEN];
    CHECK(copy != NULL);
    memcpy(copy, s, len);
    capstan_job_t job;
    if (capstan__job_init(&job, copy, len, "default", err) == 0) {
        CHECK(job.cls && job.cls[0] && job.jid && job.jid[0]);
        capstan_failure_t f;
        CHECK(capstan__retry_decide(&job, "Bad\xff" "Error", "line\n\"quoted\"\x80", CAPSTAN_RETRY_UNSET,
                                    conf, now, &f) == 0);
        if (f.payload) {
            capstan_jobject_t oo = {0};
            CHECK(capstan__json_scan_object(f.payload, f.len, &oo, NULL) == 0);
            CHECK(!jok || jansson_ok(f.payload, f.len));
            CHECK(capstan__jobject_get(&oo, f.payload, "retry_count") != NULL);
            /* A job whose handler returned is no suspect any more. */
            CHECK(capstan__jobject_get(&oo, f.payload, "recovery_count") == NULL);
            const char *skip[] = { "queue", "error_message", "error_class", "failed_at",
                                   "retried_at", "retry_count", "recovery_count",
                                   "error_backtrace" };
            check_kept(job.payload, &job.obj, f.payload, &oo, skip, 8);
            capstan__jobject_free(&oo);
        } else {
            CHECK(f.fate == CAPSTAN_FATE_DROP);
        }
        capstan__failure_clear(&f);
    }
    capstan__job_clear(&job);
}

/* A payload that cannot run becomes a dead-set entry. */
static void check_invalid(const char *s, size_t len, const capstan_retry_conf_t *conf, int is_object,
                          int jok)
{
    capstan_failure_t f;
    CHECK(capstan__retry_invalid(s, len, "default", "no class", conf, now, &f) == 0);
    CHECK(f.fate == CAPSTAN_FATE_DEAD && f.payload);
    capstan_jobject_t oo = {0};
    CHECK(capstan__json_scan_object(f.payload, f.len, &oo, NULL) == 0);
    /* The envelope for text that is no object is strict JSON (UTF-8). */
    CHECK((is_object && !jok) || jansson_ok(f.payload, f.len));
    capstan__jobject_free(&oo);
    capstan__failure_clear(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The defaults of a configuration. */
    static capstan_retry_conf_t conf;
    static int made;
    if (!made) {
        capstan_config_t *cfg = capstan_config_new();
        CHECK(cfg != NULL);
        conf = (capstan_retry_conf_t){ .max_retries = cfg->max_retries, .timestamps = cfg->timestamps };
        capstan_config_free(cfg);
        made = 1;
    }
    const char *s = (const char *)data;
    int valid = capstan__json_validate(s, size, NULL) == 0;
    /* Strict JSON by jansson's reading (which stops at a NUL byte). */
    int jok = !memchr(s, '\0', size) && jansson_ok(s, size);
    CHECK(!jok || valid || size > COMPARE_MAX);

    capstan_jobject_t o = {0};
    int is_object = capstan__json_scan_object(s, size, &o, NULL) == 0;
    if (is_object) {
        CHECK(valid);
        check_members(s, size, &o);
        check_edit(s, size, &o, jok);
    }
    capstan__jobject_free(&o);
    check_retry(s, size, &conf, jok);
    check_invalid(s, size, &conf, is_object, jok);
    return 0;
}
