/* Lock digests exactly as sidekiq-unique-jobs v9 computes them, and the
 * names of lock types and conflict strategies.
 *
 * v9 hashes Ruby's JSON.generate of a sorted [key, value] list. A digest
 * only matches when every byte of that JSON matches, so the payload's args
 * are re-serialised the way Ruby would (ruby_json.c) instead of being
 * hashed as the client happened to space them. */
#include "capstan/unique.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>

#include "support/buf.h"
#include "support/dl.h"
#include "support/time.h"
#include "unique/internal.h"
#include "unique/ruby_json.h"
#include "redis/keys.h"

static const struct { const char *name; capstan_lock_type_t type; } lock_names[] = {
    { "until_executing", CAPSTAN_LOCK_UNTIL_EXECUTING },
    { "while_enqueued", CAPSTAN_LOCK_UNTIL_EXECUTING },
    { "until_executed", CAPSTAN_LOCK_UNTIL_EXECUTED },
    { "until_completed", CAPSTAN_LOCK_UNTIL_EXECUTED },
    { "until_performed", CAPSTAN_LOCK_UNTIL_EXECUTED },
    { "until_processed", CAPSTAN_LOCK_UNTIL_EXECUTED },
    { "until_successfully_completed", CAPSTAN_LOCK_UNTIL_EXECUTED },
    { "until_expired", CAPSTAN_LOCK_UNTIL_EXPIRED },
    { "while_executing", CAPSTAN_LOCK_WHILE_EXECUTING },
    { "while_busy", CAPSTAN_LOCK_WHILE_EXECUTING },
    { "around_perform", CAPSTAN_LOCK_WHILE_EXECUTING },
    { "while_working", CAPSTAN_LOCK_WHILE_EXECUTING },
    { "while_executing_reject", CAPSTAN_LOCK_WHILE_EXECUTING_REJECT },
    { "until_and_while_executing", CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING },
};

int capstan_lock_type_parse(const char *name, capstan_lock_type_t *out)
{
    if (!name)
        return CAPSTAN_EINVAL;
    if (*name == ':') /* a Ruby symbol written by a YAML file */
        name++;
    for (size_t i = 0; i < sizeof(lock_names) / sizeof(lock_names[0]); i++)
        if (!strcmp(lock_names[i].name, name)) {
            *out = lock_names[i].type;
            return 0;
        }
    return CAPSTAN_EINVAL;
}

const char *capstan_lock_type_name(capstan_lock_type_t t)
{
    switch (t) {
    case CAPSTAN_LOCK_UNTIL_EXECUTING: return "until_executing";
    case CAPSTAN_LOCK_UNTIL_EXECUTED: return "until_executed";
    case CAPSTAN_LOCK_UNTIL_EXPIRED: return "until_expired";
    case CAPSTAN_LOCK_WHILE_EXECUTING: return "while_executing";
    case CAPSTAN_LOCK_WHILE_EXECUTING_REJECT: return "while_executing_reject";
    case CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING: return "until_and_while_executing";
    default: return "";
    }
}

static const char *const conflict_names[] = { "", "log", "raise", "reject", "replace", "reschedule" };

int capstan_on_conflict_parse(const char *name, capstan_on_conflict_t *out)
{
    if (!name)
        return CAPSTAN_EINVAL;
    if (*name == ':')
        name++;
    for (int i = 1; i <= CAPSTAN_CONFLICT_RESCHEDULE; i++)
        if (!strcmp(conflict_names[i], name)) {
            *out = (capstan_on_conflict_t)i;
            return 0;
        }
    return CAPSTAN_EINVAL;
}

const char *capstan_on_conflict_name(capstan_on_conflict_t s)
{
    return s >= CAPSTAN_CONFLICT_LOG && s <= CAPSTAN_CONFLICT_RESCHEDULE ? conflict_names[s] : "log";
}

int capstan_unique_for(capstan_unique_opts_t *opts, long seconds, const char *until)
{
    if (seconds <= 0)
        return CAPSTAN_EINVAL;
    if (!until || !strcmp(until, "success") || !strcmp(until, ":success"))
        opts->lock = CAPSTAN_LOCK_UNTIL_EXECUTED;
    else if (!strcmp(until, "start") || !strcmp(until, ":start"))
        opts->lock = CAPSTAN_LOCK_UNTIL_EXECUTING;
    else
        return CAPSTAN_EINVAL;
    opts->lock_ttl = seconds;
    return 0;
}

/* libcrypto is opened the first time a digest is computed: a worker that
 * takes no uniqueness locks never maps it (it is a third of capstan's
 * resident memory otherwise). */
struct crypto {
    const EVP_MD *md5, *sha3_256;   /* fetched once: OpenSSL 3 would look the
                                       algorithm up under a global lock on
                                       every digest otherwise */
    __typeof__(&EVP_Digest) digest;
};

static struct crypto crypto_fns;
static int crypto_ok;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

static void crypto_load(void)
{
    void *h = capstan__dlopen_lib("libcrypto", "3");
    if (!h)
        return;
    __typeof__(&EVP_MD_fetch) fetch = (__typeof__(&EVP_MD_fetch))(uintptr_t)dlsym(h, "EVP_MD_fetch");
    crypto_fns.digest = (__typeof__(&EVP_Digest))(uintptr_t)dlsym(h, "EVP_Digest");
    if (!fetch)
        return;
    crypto_fns.md5 = fetch(NULL, "MD5", NULL);
    crypto_fns.sha3_256 = fetch(NULL, "SHA3-256", NULL);
    crypto_ok = crypto_fns.md5 && crypto_fns.sha3_256 && crypto_fns.digest;
}

static const struct crypto *crypto(void)
{
    pthread_once(&crypto_once, crypto_load);
    return crypto_ok ? &crypto_fns : NULL;
}

char *capstan__unique_lock_args(const char *args, size_t len, const int *idx, size_t nidx)
{
    return capstan__ruby_json_pick(args, len, idx, nidx);
}

int capstan_unique_digest(const capstan_digest_input_t *in, char out[CAPSTAN_DIGEST_MAX], char **canon,
                          char *err)
{
    if (!in || !in->cls || !in->queue)
        return capstan_seterr(err, CAPSTAN_EINVAL, "a digest needs a class and a queue");
    const char *la = in->lock_args ? in->lock_args : "[]";
    size_t lalen = in->lock_args ? (in->lock_args_len ? in->lock_args_len : strlen(la)) : 2;
    char *args = capstan__ruby_json_dup(la, lalen, NULL);
    char *apt = NULL;
    capstan_buf_t b = {0};
    int rc = 0;
    if (!args) {
        rc = capstan_seterr(err, CAPSTAN_EPARSE, "lock_args is not JSON: %.60s", la);
        goto out;
    }
    if (in->apartment &&
        !(apt = capstan__ruby_json_dup(in->apartment, in->apartment_len ? in->apartment_len
                                                                   : strlen(in->apartment), NULL))) {
        rc = capstan_seterr(err, CAPSTAN_EPARSE, "apartment is not JSON");
        goto out;
    }
    /* Ruby's Hash#sort: [key, value] pairs, keys in byte order. */
    rc = capstan__buf_puts(&b, "[");
    if (!rc && apt)
        rc = capstan__buf_printf(&b, "[\"apartment\",%s],", apt);
    if (!rc && !in->unique_across_workers) {
        rc = capstan__buf_puts(&b, "[\"class\",");
        if (!rc) rc = capstan__ruby_json_string(&b, in->cls);
        if (!rc) rc = capstan__buf_puts(&b, "],");
    }
    if (!rc)
        rc = capstan__buf_printf(&b, "[\"lock_args\",%s]", args);
    if (!rc && !in->unique_across_queues) {
        rc = capstan__buf_puts(&b, ",[\"queue\",");
        if (!rc) rc = capstan__ruby_json_string(&b, in->queue);
        if (!rc) rc = capstan__buf_puts(&b, "]");
    }
    if (!rc)
        rc = capstan__buf_puts(&b, "]");
    if (rc) {
        rc = capstan_seterr(err, CAPSTAN_ENOMEM, "out of memory");
        goto out;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    const struct crypto *cr = crypto();
    const EVP_MD *alg = !cr ? NULL : in->alg == CAPSTAN_DIGEST_SHA3_256 ? cr->sha3_256 : cr->md5;
    if (!alg || !cr->digest(b.p, b.len, md, &mdlen, alg, NULL)) {
        rc = capstan_seterr(err, CAPSTAN_EINVAL, "OpenSSL cannot compute %s%s",
                            in->alg == CAPSTAN_DIGEST_SHA3_256 ? "SHA3-256" : "MD5",
                            cr ? "" : " (libcrypto.so.3 cannot be loaded)");
        goto out;
    }
    const char *prefix =
        in->lock_prefix && *in->lock_prefix ? in->lock_prefix : CAPSTAN_KEY_UNIQUE_PREFIX;
    if (strlen(prefix) + 2 + 2 * mdlen + 4 >= CAPSTAN_DIGEST_MAX) {
        rc = capstan_seterr(err, CAPSTAN_EINVAL, "lock_prefix is too long");
        goto out;
    }
    int n = snprintf(out, CAPSTAN_DIGEST_MAX, "%s:", prefix);
    capstan__hex(out + n, md, mdlen); /* fits: checked above */
    if (canon)
        *canon = capstan__buf_take(&b, NULL);
out:
    free(args);
    free(apt);
    capstan__buf_free(&b);
    return rc;
}

int capstan__unique_digest_valid(const char *s)
{
    if (!s)
        return 0;
    size_t len = strlen(s);
    const char *colon = strchr(s, ':');
    if (len >= CAPSTAN_DIGEST_MAX - 16 || !colon || colon == s || !colon[1] || colon[1] == ':')
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
            return 0;
    return 1;
}
