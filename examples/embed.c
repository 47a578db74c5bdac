/* A program that links libkiq and registers its own handler, then runs the
 * kiq command line (run, push, stats all work):
 *
 *   ./kiq-embed run -q default
 *   ./kiq-embed push HelloJob '["world"]'
 */
#include <stdio.h>

#include <kiq/kiq.h>

static int hello_job(kiq_job_t *job, void *ud)
{
    const char *greeting = ud;
    json_t *args = kiq_job_args(job);
    const char *who = json_string_value(json_array_get(args, 0));
    printf("%s, %s! (jid %s)\n", greeting, who ? who : "stranger", kiq_job_jid(job));
    fflush(stdout);
    return 0;
}

static int register_handlers(kiq_runtime_t *rt)
{
    kiq_class_opts_t opts = KIQ_CLASS_OPTS_INIT;
    opts.retry = 3;
    return kiq_register(rt, "HelloJob", hello_job, "Hello", &opts);
}

int main(int argc, char **argv)
{
    return kiq_main(argc, argv, register_handlers);
}
