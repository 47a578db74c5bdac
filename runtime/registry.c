/* The handler registry: job class name -> C function and its options; the
 * class table resolved from it and the file's classes: as the run starts;
 * and the error and death hooks. Filled before run; read concurrently by
 * processors afterwards. */
#include "runtime/rt.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "capstan/client.h"
#include "support/nearest.h"

static capstan_handler_entry_t *find_handler(const capstan_runtime_t *rt, const char *cls)
{
    for (size_t i = 0; i < rt->classes.nhandlers; i++)
        if (strcmp(rt->classes.handlers[i].cls, cls) == 0)
            return &rt->classes.handlers[i];
    return NULL;
}

const char *capstan__registry_nearest(const capstan_runtime_t *rt, const char *cls)
{
    if (!rt->classes.nhandlers)
        return NULL;
    const char *names[rt->classes.nhandlers];
    for (size_t i = 0; i < rt->classes.nhandlers; i++)
        names[i] = rt->classes.handlers[i].cls;
    return capstan__nearest(cls, names, rt->classes.nhandlers);
}

int capstan_register(capstan_runtime_t *rt, const char *cls, capstan_handler_fn fn, void *udata,
                     const capstan_class_opts_t *opts)
{
    if (!rt)
        return CAPSTAN_EINVAL;
    if (!cls || !*cls || !fn)
        return capstan_seterr(rt->classes.error, CAPSTAN_EINVAL, "capstan_register: %s", !cls || !*cls
                              ? "no class name" : "no handler function");
    if (opts && opts->limit && capstan_limit_opts_check(opts->limit, cls, rt->classes.error))
        return CAPSTAN_EINVAL;
    capstan_handler_entry_t *e = find_handler(rt, cls);
    if (!e) {
        capstan_handler_entry_t *p = realloc(rt->classes.handlers, (rt->classes.nhandlers + 1) * sizeof(*p));
        if (!p)
            return capstan_seterr(rt->classes.error, CAPSTAN_ENOMEM, "capstan_register %s: out of memory", cls);
        rt->classes.handlers = p;
        e = &rt->classes.handlers[rt->classes.nhandlers];
        memset(e, 0, sizeof(*e));
        if (!(e->cls = strdup(cls)))
            return capstan_seterr(rt->classes.error, CAPSTAN_ENOMEM, "capstan_register %s: out of memory", cls);
        rt->classes.nhandlers++;
    }
    e->fn = fn;
    e->udata = udata;
    free(e->queue);
    e->queue = opts && opts->queue ? strdup(opts->queue) : NULL;
    e->retry = opts ? opts->retry : CAPSTAN_RETRY_UNSET;
    e->unique = opts ? opts->unique : NULL;
    e->limit = opts && opts->limit && opts->limit->type ? opts->limit : NULL;
    e->timeout = opts && opts->timeout > 0 ? opts->timeout : 0;
    return 0;
}

/* The options both the registration and the file may give, the file's
 * winning. */
static void merge(capstan_class_row_t *w, const capstan_config_t *cfg)
{
    const capstan_class_conf_t *cc = w->cc;
    const capstan_handler_entry_t *h = w->h;
    w->retry = cc && cc->retry != CAPSTAN_RETRY_UNSET ? cc->retry : h ? h->retry : CAPSTAN_RETRY_UNSET;
    w->timeout = cc && cc->timeout > 0 ? (double)cc->timeout : h ? h->timeout : 0;
    w->max_iteration_runtime = cc && cc->max_iteration_runtime > 0 ? (double)cc->max_iteration_runtime
                             : cfg->max_iteration_runtime;
    w->limit = cc && cc->limit.type ? &cc->limit : h ? h->limit : NULL;
}

int capstan__classes_resolve(capstan_runtime_t *rt)
{
    const capstan_config_t *cfg = rt->cfg;
    size_t n = rt->classes.nhandlers + cfg->nclasses, m = 0;
    capstan_class_row_t *rows = calloc(n ? n : 1, sizeof(*rows));
    if (!rows)
        return CAPSTAN_ENOMEM;
    for (size_t i = 0; i < rt->classes.nhandlers; i++)
        rows[m++] = (capstan_class_row_t){ .cls = rt->classes.handlers[i].cls, .h = &rt->classes.handlers[i] };
    for (size_t i = 0; i < cfg->nclasses; i++) {
        const capstan_class_conf_t *cc = &cfg->classes[i];
        size_t j = 0;
        while (j < m && strcmp(rows[j].cls, cc->name) != 0)
            j++;
        if (j == m)
            rows[m++] = (capstan_class_row_t){ .cls = cc->name };
        if (!rows[j].cc) /* a name given twice: its first entry, as before */
            rows[j].cc = cc;
    }
    for (size_t i = 0; i < m; i++)
        merge(&rows[i], cfg);
    free(rt->classes.rows);
    rt->classes.rows = rows;
    rt->classes.nrows = m;
    rt->classes.no_row = (capstan_class_row_t){ 0 };
    merge(&rt->classes.no_row, cfg);
    return 0;
}

const capstan_class_row_t *capstan__class_find(const capstan_runtime_t *rt, const char *cls)
{
    for (size_t i = 0; cls && i < rt->classes.nrows; i++)
        if (strcmp(rt->classes.rows[i].cls, cls) == 0)
            return &rt->classes.rows[i];
    return &rt->classes.no_row;
}

int capstan_client_use_runtime(capstan_client_t *c, const capstan_runtime_t *rt)
{
    if (!c || !rt)
        return CAPSTAN_EINVAL;
    for (size_t i = 0; i < rt->classes.nhandlers; i++) {
        const capstan_handler_entry_t *h = &rt->classes.handlers[i];
        capstan_class_opts_t o = { .queue = h->queue, .retry = h->retry, .unique = h->unique };
        int rc = capstan_client_set_class(c, h->cls, &o);
        if (rc)
            return rc;
    }
    capstan_client_use_config(c, rt->cfg);
    return 0;
}

int capstan_runtime_load_plugin(capstan_runtime_t *rt, const char *path, char *err)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return capstan_seterr(err, CAPSTAN_ENOTFOUND, "cannot load plugin %s: %s", path, dlerror());
    capstan_plugin_init_fn init = (capstan_plugin_init_fn)(uintptr_t)dlsym(h, CAPSTAN_PLUGIN_INIT);
    if (!init)
        return capstan_seterr(err, CAPSTAN_EINVAL, "plugin %s does not export %s", path, CAPSTAN_PLUGIN_INIT);
    /* A refusal recorded before this plugin is not its reason. */
    rt->classes.error[0] = '\0';
    int rc = init(rt);
    if (rc)
        return capstan_seterr(err, CAPSTAN_EINVAL, "plugin %s: %s returned %d%s%s", path, CAPSTAN_PLUGIN_INIT,
                              rc, rt->classes.error[0] ? ": " : "", rt->classes.error);
    return 0;
}

const char *capstan_runtime_error(const capstan_runtime_t *rt)
{
    return rt->classes.error;
}

static int add_hook(capstan_runtime_t *rt, int death, capstan_hook_fn fn, void *udata)
{
    const char *what = death ? "capstan_on_death" : "capstan_on_error";
    if (!rt)
        return CAPSTAN_EINVAL;
    if (!fn)
        return capstan_seterr(rt->classes.error, CAPSTAN_EINVAL, "%s: no hook function", what);
    capstan_hook_t *p = realloc(rt->classes.hooks, (rt->classes.nhooks + 1) * sizeof(*p));
    if (!p)
        return capstan_seterr(rt->classes.error, CAPSTAN_ENOMEM, "%s: out of memory", what);
    rt->classes.hooks = p;
    rt->classes.hooks[rt->classes.nhooks++] = (capstan_hook_t){ .death = death, .fn = fn, .udata = udata };
    return 0;
}

int capstan_on_error(capstan_runtime_t *rt, capstan_hook_fn fn, void *udata)
{
    return add_hook(rt, 0, fn, udata);
}

int capstan_on_death(capstan_runtime_t *rt, capstan_hook_fn fn, void *udata)
{
    return add_hook(rt, 1, fn, udata);
}

static void run_hooks(const capstan_runtime_t *rt, int death, capstan_job_t *job, const char *cls,
                      const char *msg)
{
    for (size_t i = 0; i < rt->classes.nhooks; i++)
        if (rt->classes.hooks[i].death == death)
            rt->classes.hooks[i].fn(job, cls ? cls : "RuntimeError", msg ? msg : "", rt->classes.hooks[i].udata);
}

void capstan__hooks_error(const capstan_runtime_t *rt, capstan_job_t *job, const char *cls, const char *msg)
{
    run_hooks(rt, 0, job, cls, msg);
}

void capstan__hooks_death(const capstan_runtime_t *rt, capstan_job_t *job, const char *cls, const char *msg)
{
    /* The job's connection is the thread's that ran it; the ack may have
     * been written by another thread, which could be using it now. */
    redisContext *c = job->redis;
    job->redis = NULL;
    run_hooks(rt, 1, job, cls, msg);
    job->redis = c;
}

void capstan__registry_free(capstan_runtime_t *rt)
{
    for (size_t i = 0; i < rt->classes.nhandlers; i++) {
        free(rt->classes.handlers[i].cls);
        free(rt->classes.handlers[i].queue);
    }
    free(rt->classes.handlers);
    rt->classes.handlers = NULL;
    rt->classes.nhandlers = 0;
    free(rt->classes.rows);
    rt->classes.rows = NULL;
    rt->classes.nrows = 0;
    free(rt->classes.hooks);
    rt->classes.hooks = NULL;
    rt->classes.nhooks = 0;
}
