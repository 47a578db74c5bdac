/* A plugin whose init gives up, as a handler author's would on a refused
 * registration: ReportJob with a concurrent limiter of size 0. */
#include <capstan/capstan.h>

static int report_job(capstan_job_t *job, void *udata)
{
    (void)job;
    (void)udata;
    return 0;
}

/* The runtime keeps a pointer to the limit. */
static capstan_limit_opts_t none = CAPSTAN_LIMIT_OPTS_INIT;

__attribute__((visibility("default"))) int capstan_plugin_init(capstan_runtime_t *rt)
{
    capstan_class_opts_t opts = CAPSTAN_CLASS_OPTS_INIT;
    none.type = CAPSTAN_LIMIT_CONCURRENT;
    none.count = 0;
    opts.limit = &none;
    return capstan_register(rt, "ReportJob", report_job, NULL, &opts);
}
