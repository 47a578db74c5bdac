/* The shards: list of the file, each entry a mapping:
 *
 *   shards:
 *     - name: a
 *       redis_url: redis://10.0.0.1:6379/0   # or url:, as under redis:
 *     - name: b
 *       redis_url: rediss://10.0.0.2:6380/0  # the top-level tls: applies
 *       queues: [reports]                    # optional: its own queues
 *
 * A later file's (or section's) shards: replaces the list. */
#include "config/shards.h"
#include "config/yaml.h"

#include <stdio.h>

static int read_queues(ctx_t *c, const char *key, yaml_node_t *v, char ***out, size_t *n)
{
    if (v->type != YAML_SEQUENCE_NODE)
        return capstan__yaml_fail(c, v, key, "must be a list of queue names");
    size_t len = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    *out = calloc(len ? len : 1, sizeof(char *));
    if (!*out)
        return nomem(c);
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        int rc = capstan__yaml_scalar(c, node(c, *it), key, "must be a queue name", &(*out)[*n]);
        if (rc < 0)
            return rc;
        ++*n;
    }
    return 0;
}

static int shard_entry(ctx_t *c, const char *key, yaml_node_t *v)
{
    if (v->type != YAML_MAPPING_NODE)
        return capstan__yaml_fail(c, v, key, "each shard must be a mapping with name and redis_url");
    char *name = NULL, *url = NULL, **queues = NULL;
    size_t nqueues = 0;
    int rc = 0;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; !rc && p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = node(c, p->key), *vn = node(c, p->value);
        const char *k = key_name(kn);
        char sub[CAPSTAN_ERRLEN];
        snprintf(sub, sizeof(sub), "%s.%s", key, k ? k : "?");
        if (k && !strcmp(k, "name"))
            rc = capstan__yaml_set_string(c, sub, vn, &name, NULL);
        else if (k && (!strcmp(k, "redis_url") || !strcmp(k, "url")))
            rc = capstan__yaml_set_string(c, sub, vn, &url, NULL);
        else if (k && !strcmp(k, "queues"))
            rc = queues ? capstan__yaml_fail(c, kn, sub, "is given twice")
                        : read_queues(c, sub, vn, &queues, &nqueues);
        else
            rc = capstan__yaml_fail(c, kn, sub, "unknown key (a shard has name, redis_url and queues)");
    }
    char why[CAPSTAN_ERRLEN];
    if (!rc && (rc = capstan_config_add_shard(c->cfg, name ? name : "", url, (const char *const *)queues,
                                              nqueues, why)) != 0)
        rc = rc == CAPSTAN_ENOMEM ? nomem(c)
                                  : capstan__yaml_fail(c, v, key, "%s", why + strlen("shards: "));
    free(name);
    free(url);
    for (size_t i = 0; i < nqueues; i++)
        free(queues[i]);
    free(queues);
    return rc;
}

int capstan__yaml_set_shards(ctx_t *c, const key_def_t *k, const char *key, yaml_node_t *v)
{
    (void)k;
    capstan__config_shards_free(c->cfg);
    if (is_null(v))
        return 0;
    if (v->type != YAML_SEQUENCE_NODE)
        return capstan__yaml_fail(c, v, key, "must be a list of shards (name, redis_url, queues)");
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        int rc = shard_entry(c, key, node(c, *it));
        if (rc < 0)
            return rc;
    }
    return 0;
}
