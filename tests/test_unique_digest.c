/* Digests as sidekiq-unique-jobs v9 computes them: the reference's test
 * vectors (MD5 and SHA3-256), unique_across_queues/workers, lock_prefix,
 * apartment, lock_args selection, Ruby's JSON for args, and the names of
 * lock types and strategies. No Redis. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "capstan/unique.h"
#include "unique/internal.h"

TestSuite(unique_digest, .timeout = 10);

static const char *digest(const capstan_digest_input_t *in)
{
    static char out[CAPSTAN_DIGEST_MAX];
    char err[CAPSTAN_ERRLEN] = "";
    cr_assert_eq(capstan_unique_digest(in, out, NULL, err), 0, "%s", err);
    return out;
}

Test(unique_digest, reference_vectors_md5)
{
    capstan_digest_input_t a = { .cls = "MyUniqueJob", .queue = "anotherqueue", .lock_args = "[1,2]" };
    char *canon = NULL;
    char out[CAPSTAN_DIGEST_MAX];
    cr_assert_eq(capstan_unique_digest(&a, out, &canon, NULL), 0);
    cr_assert_str_eq(canon, "[[\"class\",\"MyUniqueJob\"],[\"lock_args\",[1,2]],[\"queue\",\"anotherqueue\"]]");
    cr_assert_str_eq(out, "uniquejobs:6b6835a019cad7c2a7a4e53e20a9184c");
    free(canon);

    capstan_digest_input_t b = { .cls = "UntilExecutedJob", .queue = "working", .lock_args = "[]" };
    cr_assert_str_eq(digest(&b), "uniquejobs:41459093fde370420ea1d1f446b60281");
    b.lock_args = NULL; /* no args at all is [] */
    cr_assert_str_eq(digest(&b), "uniquejobs:41459093fde370420ea1d1f446b60281");

    capstan_digest_input_t c = { .cls = "NotifyWorker", .queue = "notify_worker",
                             .lock_args = "[183,\"xxxx\"]" };
    cr_assert_str_eq(digest(&c), "uniquejobs:ae503400be25bde0465cebd14f6f0daf");
}

Test(unique_digest, lock_prefix_changes_only_the_prefix)
{
    capstan_digest_input_t a = { .cls = "MyUniqueJob", .queue = "anotherqueue", .lock_args = "[1,2]",
                             .lock_prefix = "custom_prefix" };
    cr_assert_str_eq(digest(&a), "custom_prefix:6b6835a019cad7c2a7a4e53e20a9184c");
}

Test(unique_digest, sha3_256_vector)
{
    capstan_digest_input_t a = { .cls = "MyUniqueJob", .queue = "anotherqueue", .lock_args = "[1,2]",
                             .alg = CAPSTAN_DIGEST_SHA3_256 };
    cr_assert_str_eq(digest(&a),
        "uniquejobs:6a7de54d814e785f40610421fa3ff975107c6b9d6ab0cfef3d1f202a27b4706e");
}

Test(unique_digest, apartment_and_across_queues_and_workers)
{
    capstan_digest_input_t a = { .cls = "MyUniqueJob", .queue = "anotherqueue", .lock_args = "[1,2]",
                             .apartment = "\"public\"" };
    cr_assert_str_eq(digest(&a), "uniquejobs:89ad185f63519f23f689d633c4796815");

    capstan_digest_input_t q = { .cls = "MyUniqueJob", .queue = "anotherqueue", .lock_args = "[1,2]",
                             .unique_across_queues = 1 };
    cr_assert_str_eq(digest(&q), "uniquejobs:d78c6b3abca120dd438f24264d114ec5");
    q.queue = "elsewhere";
    cr_assert_str_eq(digest(&q), "uniquejobs:d78c6b3abca120dd438f24264d114ec5");

    char *canon = NULL;
    char out[CAPSTAN_DIGEST_MAX];
    capstan_digest_input_t w = { .cls = "AnyJob", .queue = "q", .lock_args = "[1]",
                             .unique_across_workers = 1 };
    cr_assert_eq(capstan_unique_digest(&w, out, &canon, NULL), 0);
    cr_assert_str_eq(canon, "[[\"lock_args\",[1]],[\"queue\",\"q\"]]");
    free(canon);
    char first[CAPSTAN_DIGEST_MAX];
    strcpy(first, out);
    w.cls = "OtherJob";
    cr_assert_str_eq(digest(&w), first, "the class does not matter across workers");
}

Test(unique_digest, args_spacing_does_not_change_the_digest)
{
    capstan_digest_input_t a = { .cls = "MyUniqueJob", .queue = "anotherqueue",
                             .lock_args = " [ 1 ,\n 2 ] " };
    cr_assert_str_eq(digest(&a), "uniquejobs:6b6835a019cad7c2a7a4e53e20a9184c");
}

Test(unique_digest, ruby_json_forms)
{
    struct { const char *in, *want; } cases[] = {
        { "[1e15, 1e16, 123456789012345.6, 0.0001, 0.00001, -0.0, 1.5e-07, 1e20, 2.5, 100.0]",
          "[1.0e+15,1.0e+16,123456789012345.6,0.0001,1.0e-05,-0.0,1.5e-07,1.0e+20,2.5,100.0]" },
        { "[1e14, 1234567890123456.0, 1234567890123456.7, 0.001, 0.0001234, 1E2, 5e-324]",
          "[100000000000000.0,1.234567890123456e+15,1234567890123456.8,0.001,0.0001234,100.0,5.0e-324]" },
        { "[\"\\u0001\\u001F\\u2028\\/\\u00e9\\\"\\\\\", \"\\ud83d\\ude00\"]",
          "[\"\\u0001\\u001f\xe2\x80\xa8/\xc3\xa9\\\"\\\\\",\"\xf0\x9f\x98\x80\"]" },
        { "[{\"b\": 1, \"a\": [true, false, null]}, 12345678901234567890123, -0]",
          "[{\"b\":1,\"a\":[true,false,null]},12345678901234567890123,0]" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *got = capstan__ruby_json_dup(cases[i].in, strlen(cases[i].in), NULL);
        cr_assert_not_null(got, "case %zu", i);
        cr_assert_str_eq(got, cases[i].want, "case %zu", i);
        free(got);
    }
    cr_assert_null(capstan__ruby_json_dup("[1,", 3, NULL));
}

Test(unique_digest, lock_args_selects_arguments)
{
    const char *args = "[1, \"two\", {\"x\": 3}, 4]";
    char *all = capstan__unique_lock_args(args, strlen(args), NULL, 0);
    cr_assert_str_eq(all, "[1,\"two\",{\"x\":3},4]");
    int idx[] = { 2, 0, 9 };
    char *some = capstan__unique_lock_args(args, strlen(args), idx, 3);
    cr_assert_str_eq(some, "[{\"x\":3},1]", "indexes past the end are skipped");
    cr_assert_null(capstan__unique_lock_args("{\"a\":1}", 7, NULL, 0));
    free(all);
    free(some);
}

Test(unique_digest, bad_input_is_an_error_not_a_crash)
{
    char out[CAPSTAN_DIGEST_MAX], err[CAPSTAN_ERRLEN] = "";
    capstan_digest_input_t a = { .cls = "X", .queue = "q", .lock_args = "[1," };
    cr_assert_eq(capstan_unique_digest(&a, out, NULL, err), CAPSTAN_EPARSE);
    cr_assert(strstr(err, "lock_args"), "%s", err);
    capstan_digest_input_t b = { .cls = NULL, .queue = "q" };
    cr_assert_eq(capstan_unique_digest(&b, out, NULL, err), CAPSTAN_EINVAL);
    char prefix[400];
    memset(prefix, 'p', sizeof(prefix) - 1);
    prefix[sizeof(prefix) - 1] = '\0';
    capstan_digest_input_t c = { .cls = "X", .queue = "q", .lock_prefix = prefix };
    cr_assert_eq(capstan_unique_digest(&c, out, NULL, err), CAPSTAN_EINVAL);
}

Test(unique_digest, digest_shape_check)
{
    cr_assert(capstan__unique_digest_valid("uniquejobs:6b6835a019cad7c2a7a4e53e20a9184c"));
    cr_assert(capstan__unique_digest_valid("uniquejobs:6b6835a019cad7c2a7a4e53e20a9184c:RUN"));
    cr_assert(capstan__unique_digest_valid(
        "a:6a7de54d814e785f40610421fa3ff975107c6b9d6ab0cfef3d1f202a27b4706e"));
    cr_assert_not(capstan__unique_digest_valid("garbage"));
    cr_assert_not(capstan__unique_digest_valid(":6b6835a019cad7c2a7a4e53e20a9184c"));
    cr_assert(capstan__unique_digest_valid("uniquejobs:0123456789abcdef01234567"));
    cr_assert_not(capstan__unique_digest_valid("uniquejobs:"));
    cr_assert_not(capstan__unique_digest_valid("uniquejobs:with space"));
    cr_assert_not(capstan__unique_digest_valid("$$garbage$$"));
    cr_assert_not(capstan__unique_digest_valid(NULL));
}

Test(unique_digest, lock_type_and_strategy_names)
{
    capstan_lock_type_t t;
    cr_assert_eq(capstan_lock_type_parse("until_completed", &t), 0);
    cr_assert_eq(t, CAPSTAN_LOCK_UNTIL_EXECUTED);
    cr_assert_eq(capstan_lock_type_parse("while_busy", &t), 0);
    cr_assert_eq(t, CAPSTAN_LOCK_WHILE_EXECUTING);
    cr_assert_eq(capstan_lock_type_parse(":while_enqueued", &t), 0);
    cr_assert_eq(t, CAPSTAN_LOCK_UNTIL_EXECUTING);
    cr_assert_eq(capstan_lock_type_parse("until_forever", &t), CAPSTAN_EINVAL);
    cr_assert_str_eq(capstan_lock_type_name(CAPSTAN_LOCK_UNTIL_AND_WHILE_EXECUTING),
                     "until_and_while_executing");
    capstan_on_conflict_t s;
    cr_assert_eq(capstan_on_conflict_parse("reschedule", &s), 0);
    cr_assert_eq(s, CAPSTAN_CONFLICT_RESCHEDULE);
    cr_assert_eq(capstan_on_conflict_parse("explode", &s), CAPSTAN_EINVAL);

    capstan_unique_opts_t o = CAPSTAN_UNIQUE_OPTS_INIT;
    cr_assert_eq(capstan_unique_for(&o, 3600, "start"), 0);
    cr_assert_eq(o.lock, CAPSTAN_LOCK_UNTIL_EXECUTING);
    cr_assert_eq(o.lock_ttl, 3600);
    cr_assert_eq(capstan_unique_for(&o, 60, NULL), 0);
    cr_assert_eq(o.lock, CAPSTAN_LOCK_UNTIL_EXECUTED);
    cr_assert_eq(capstan_unique_for(&o, 60, "later"), CAPSTAN_EINVAL);
    cr_assert_eq(capstan_unique_for(&o, -1, "start"), CAPSTAN_EINVAL);
}
