/* Commands kept for one MULTI/EXEC, with the locks to release if they are
 * never sent (see txn.h). */
#include "client/txn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One command: argv and lens point into the same allocation. */
typedef struct txn_cmd {
    int argc;
    const char **argv;
    size_t *lens;
} txn_cmd_t;

typedef struct txn_hold {
    char *digest;
    capstan_lock_type_t type;
    char jid[25];
} txn_hold_t;

struct capstan_txn {
    txn_cmd_t *cmds;
    size_t ncmds, capcmds;
    txn_hold_t *holds;
    size_t nholds, capholds;
};

capstan_txn_t *capstan__txn_new(void)
{
    return calloc(1, sizeof(capstan_txn_t));
}

static void drop(capstan_txn_t *t, capstan_txn_mark_t mark)
{
    for (size_t i = mark.ncmds; i < t->ncmds; i++)
        free(t->cmds[i].argv);
    for (size_t i = mark.nholds; i < t->nholds; i++)
        free(t->holds[i].digest);
    t->ncmds = mark.ncmds;
    t->nholds = mark.nholds;
}

void capstan__txn_free(capstan_txn_t *t)
{
    if (!t)
        return;
    drop(t, (capstan_txn_mark_t){ 0, 0 });
    free(t->cmds);
    free(t->holds);
    free(t);
}

size_t capstan__txn_len(const capstan_txn_t *t)
{
    return t->ncmds;
}

/* Makes room for one more element of size sz in *p (n used, *cap). */
static int grow(void *p, size_t n, size_t *cap, size_t sz)
{
    if (n < *cap)
        return 0;
    size_t ncap = *cap ? 2 * *cap : 8;
    void *q = realloc(*(void **)p, ncap * sz);
    if (!q)
        return CAPSTAN_ENOMEM;
    *(void **)p = q;
    *cap = ncap;
    return 0;
}

int capstan__txn_add(capstan_txn_t *t, int argc, const char *const *argv, const size_t *lens)
{
    size_t bytes = 0, n = (size_t)argc;
    for (size_t i = 0; i < n; i++)
        bytes += (lens ? lens[i] : strlen(argv[i])) + 1;
    if (grow(&t->cmds, t->ncmds, &t->capcmds, sizeof(*t->cmds)))
        return CAPSTAN_ENOMEM;
    char *mem = malloc(n * (sizeof(char *) + sizeof(size_t)) + bytes);
    if (!mem)
        return CAPSTAN_ENOMEM;
    txn_cmd_t *cmd = &t->cmds[t->ncmds++];
    cmd->argc = argc;
    cmd->argv = (const char **)(void *)mem;
    cmd->lens = (size_t *)(void *)(mem + n * sizeof(char *));
    char *s = mem + n * (sizeof(char *) + sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        cmd->lens[i] = lens ? lens[i] : strlen(argv[i]);
        memcpy(s, argv[i], cmd->lens[i]);
        s[cmd->lens[i]] = '\0';
        cmd->argv[i] = s;
        s += cmd->lens[i] + 1;
    }
    return 0;
}

int capstan__txn_hold(capstan_txn_t *t, const char *digest, capstan_lock_type_t type, const char *jid)
{
    char *d = strdup(digest);
    if (!d || grow(&t->holds, t->nholds, &t->capholds, sizeof(*t->holds))) {
        free(d);
        return CAPSTAN_ENOMEM;
    }
    txn_hold_t *h = &t->holds[t->nholds++];
    h->digest = d;
    h->type = type;
    snprintf(h->jid, sizeof(h->jid), "%s", jid);
    return 0;
}

capstan_txn_mark_t capstan__txn_mark(const capstan_txn_t *t)
{
    return (capstan_txn_mark_t){ t->ncmds, t->nholds };
}

void capstan__txn_undo(capstan_txn_t *t, capstan_redis_t *r, capstan_txn_mark_t mark)
{
    char err[CAPSTAN_ERRLEN];
    if (t->nholds > mark.nholds && !capstan_redis_ok(r))
        (void)capstan_redis_connect(r);
    /* force: until_expired is released too, as the job never existed. */
    for (size_t i = mark.nholds; i < t->nholds && capstan_redis_ok(r); i++)
        (void)capstan_unique_unlock(r, t->holds[i].digest, 0, t->holds[i].jid, t->holds[i].type,
                                    1, err);
    drop(t, mark);
}

int capstan__txn_exec(const capstan_txn_t *t, capstan_redis_t *r, int replicas, long wait_ms, char *err)
{
    const char *multi[] = { "MULTI" }, *exec[] = { "EXEC" };
    char nrep[16], ms[32];
    snprintf(nrep, sizeof(nrep), "%d", replicas);
    snprintf(ms, sizeof(ms), "%ld", wait_ms);
    const char *wait[] = { "WAIT", nrep, ms };
    int rc = capstan_redis_append(r, 1, multi, NULL);
    for (size_t i = 0; i < t->ncmds && !rc; i++)
        rc = capstan_redis_append(r, t->cmds[i].argc, t->cmds[i].argv, t->cmds[i].lens);
    if (!rc) rc = capstan_redis_append(r, 1, exec, NULL);
    if (!rc && replicas > 0) rc = capstan_redis_append(r, 3, wait, NULL);
    /* MULTI's reply, one QUEUED (or an error) per command, then EXEC's. */
    redisReply *last = NULL;
    char refused[256] = "";
    for (size_t i = 0; i < t->ncmds + 2 && !rc; i++) {
        redisReply *rep = capstan_redis_get_reply(r);
        if (!rep)
            rc = CAPSTAN_EREDIS;
        else if (i == t->ncmds + 1)
            last = rep;
        else if (rep->type == REDIS_REPLY_ERROR && !refused[0])
            snprintf(refused, sizeof(refused), "%s", rep->str);
        if (rep != last)
            freeReplyObject(rep);
    }
    /* A command refused while queued (READONLY from a replica, which also
     * drops the connection so it is made again) aborts EXEC: nothing was
     * written, whether or not EXEC's own reply could be read. */
    if (rc && refused[0])
        return capstan_seterr(err, CAPSTAN_EREPLY, "push failed: %s", refused);
    if (rc) {
        freeReplyObject(last);
        return capstan_seterr(err, CAPSTAN_EREDIS, "%s", capstan_redis_error(r));
    }
    /* Read whatever EXEC said, so that the next command gets its own reply. */
    redisReply *rep = replicas > 0 ? capstan_redis_get_reply(r) : NULL;
    if (last->type != REDIS_REPLY_ARRAY)
        /* EXECABORT (a command refused while queued), READONLY, OOM... */
        rc = capstan_seterr(err, CAPSTAN_EREPLY, "push failed: %s",
                            last->type == REDIS_REPLY_ERROR ? last->str : "transaction aborted");
    /* A command that failed as it ran (a key of the wrong type): EXEC does
     * not undo the others. */
    for (size_t i = 0; !rc && i < last->elements; i++)
        if (last->element[i]->type == REDIS_REPLY_ERROR)
            rc = capstan_seterr(err, CAPSTAN_EREPLY, "push failed: %s", last->element[i]->str);
    /* Written: whatever WAIT says now is a warning, never a failure. */
    long long got = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    if (!rc && replicas > 0 && got < replicas)
        rc = got < 0 ? capstan_seterr(err, CAPSTAN_PUSH_UNREPLICATED,
                                      "pushed, but WAIT for %d replicas failed: %s", replicas,
                                      rep && rep->type == REDIS_REPLY_ERROR ? rep->str
                                                                        : capstan_redis_error(r))
                     : capstan_seterr(err, CAPSTAN_PUSH_UNREPLICATED,
                                      "pushed, but only %lld of %d replicas had it within %ld ms",
                                      got, replicas, wait_ms);
    freeReplyObject(last);
    freeReplyObject(rep);
    return rc;
}
