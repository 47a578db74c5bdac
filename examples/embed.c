/* A program that links libcapstan and registers its own handler, then runs the
 * capstan command line (run, push, stats all work):
 *
 *   ./capstan-embed run -q default
 *   ./capstan-embed push HelloJob '["world"]'
 */
#include <stdio.h>

#include <capstan/capstan.h>

static int hello_job(capstan_job_t *job, void *ud)
{
    const char *greeting = ud;
    json_t *args = capstan_job_args(job);
    const char *who = json_string_value(json_array_get(args, 0));
    printf("%s, %s! (jid %s)\n", greeting, who ? who : "stranger", capstan_job_jid(job));
    fflush(stdout);
    return 0;
}

static int register_handlers(capstan_runtime_t *rt)
{
    capstan_class_opts_t opts = CAPSTAN_CLASS_OPTS_INIT;
    opts.retry = 3;
    return capstan_register(rt, "HelloJob", hello_job, "Hello", &opts);
}

int main(int argc, char **argv)
{
    return capstan_main(argc, argv, register_handlers);
}
