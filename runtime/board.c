/* The worker's side of the board (board.h): what a supervised worker
 * writes there, from its main thread and, for the jobs they start, its
 * processors. Without a board every write is a no-op. */
#include "runtime/board.h"

#include <stdio.h>
#include <string.h>

#include "runtime/rt.h"
#include "support/identity.h"

void capstan__board_attach(struct capstan_runtime *rt, capstan_board_t *board, size_t size, int slot,
                           int supervisor, int quarantine)
{
    rt->link.board = board;
    rt->link.board_end = capstan__board_end(board, size);
    /* A board an older supervisor made has no room to ask for the
     * quarantine worker, which that supervisor would not start: suspects
     * then run here alone. */
    rt->link.quarantine = rt->link.board_end && !quarantine ? CAPSTAN_QUARANTINE : NULL;
    rt->link.quarantine_worker = quarantine;
    rt->link.worker_slot = slot;
    rt->link.supervisor_pid = supervisor;
    capstan__identity_make(rt->self.identity, sizeof(rt->self.identity));
    memcpy(board->identity, rt->self.identity, sizeof(board->identity));
}

int capstan__probe_judge(const capstan_probe_t *p, int ready, double now, char *why, size_t n)
{
    double beat = atomic_load(&p->beat), turn = atomic_load(&p->turn);
    double asked = atomic_load(&p->asked), answered = atomic_load(&p->answered);
    double stuck = CAPSTAN_PROBE_BEATS * (beat > 1 ? beat : 1);
    if (turn > 0 && now - turn > stuck) {
        snprintf(why, n, "the housekeeper thread has not come round for %.1f s", now - turn);
        return 0;
    }
    if (!ready)
        return 1;
    if (atomic_load(&p->quiet))
        snprintf(why, n, "quiet: not fetching");
    else if (!answered)
        snprintf(why, n, "not connected to Redis yet");
    else if (asked > 0 && now - asked > CAPSTAN_PROBE_STALL)
        snprintf(why, n, "Redis has not answered for %.1f s", now - asked);
    else if (now - answered > stuck + CAPSTAN_PROBE_STALL)
        snprintf(why, n, "Redis last answered %.1f s ago", now - answered);
    else if (atomic_load(&p->fetch_failing))
        snprintf(why, n, "fetches get error replies");
    else
        return 1;
    return 0;
}

int capstan__probe_judge_rows(const capstan_probe_row_t *rows, int nrows, int self, int ready, double now,
                              char *why, size_t n)
{
    char one[CAPSTAN_ERRLEN];
    for (int i = 0; i < nrows; i++) {
        const capstan_probe_row_t *w = &rows[i];
        int shards = atomic_load(&w->shards);
        if (i == self || !atomic_load(&w->serving))
            continue;
        for (int k = 0; k < shards && k < CAPSTAN_PROBE_SHARDS; k++) {
            if (capstan__probe_judge(&w->shard[k], ready, now, one, sizeof(one)))
                continue;
            char name[CAPSTAN_PROBE_NAME];
            memcpy(name, w->name[k], sizeof(name));
            name[sizeof(name) - 1] = '\0';
            if (name[0])
                snprintf(why, n, "worker %d: shard %s: %s", atomic_load(&w->slot), name, one);
            else
                snprintf(why, n, "worker %d: %s", atomic_load(&w->slot), one);
            return 0;
        }
    }
    return 1;
}

int capstan__probe_replaced(const capstan_probe_row_t *rows, int nrows, int self)
{
    if (self < 0 || self >= nrows || atomic_load(&rows[self].serving))
        return 0;
    for (int i = 0; i < nrows; i++)
        if (i != self && atomic_load(&rows[i].serving) && atomic_load(&rows[i].slot) == atomic_load(&rows[self].slot))
            return 1;
    return 0;
}

void capstan__board_probes(struct capstan_runtime *rt, capstan_probe_row_t *rows, int nrows, int row)
{
    if (!rows || row < 0 || row >= nrows)
        return;
    capstan_probe_row_t *me = &rows[row];
    const capstan_config_t *c = rt->cfg;
    size_t shards = c->nshards ? c->nshards : 1;
    if (shards > CAPSTAN_PROBE_SHARDS)
        shards = CAPSTAN_PROBE_SHARDS;
    for (size_t k = 0; k < c->nshards && k < shards; k++)
        snprintf(me->name[k], sizeof(me->name[k]), "%s", c->shards[k].name);
    rt->link.probes = rows;
    rt->link.nprobes = nrows;
    rt->link.probe_row = row;
    rt->link.probe = &me->shard[0];
    atomic_store(&me->shards, (int)shards);
}

capstan_probe_t *capstan__board_probe(struct capstan_runtime *rt, struct capstan_runtime *member, size_t i)
{
    if (rt->link.probes && i < (size_t)atomic_load(&rt->link.probes[rt->link.probe_row].shards))
        return &rt->link.probes[rt->link.probe_row].shard[i];
    return &member->link.own_probe;
}

void capstan__board_run(struct capstan_runtime *rt, int index, const char *jid)
{
    capstan_board_t *b = rt->link.board;
    /* The member of a sharded worker's shard k has rows of its own, after
     * those of the shards before it. */
    index += (int)rt->member.index * rt->cfg->concurrency;
    if (!b || !jid || index < 0 || index >= b->nslots)
        return;
    capstan_board_row_t *row = &b->row[index];
    char *at = row->jid[row->next++ % CAPSTAN_BOARD_RING];
    size_t n = strlen(jid);
    if (n >= CAPSTAN_BOARD_JID)
        n = CAPSTAN_BOARD_JID - 1;
    memcpy(at, jid, n);
    at[n] = '\0';
}

void capstan__board_quarantined(struct capstan_runtime *rt)
{
    if (rt->link.board_end)
        atomic_store(&rt->link.board_end->quarantined, 1);
}

void capstan__board_ready(struct capstan_runtime *rt)
{
    if (rt->link.board)
        atomic_store(&rt->link.board->ready, 1);
}

void capstan__board_rss(struct capstan_runtime *rt, long long rss)
{
    if (rt->link.board)
        atomic_store(&rt->link.board->rss, rss);
}

void capstan__board_leave(struct capstan_runtime *rt, int why)
{
    if (rt->link.board)
        atomic_store(&rt->link.board->leaving, why);
}

void capstan__board_forget(struct capstan_runtime *rt)
{
    if (rt->link.board)
        rt->link.board->identity[0] = '\0';
}

void capstan__board_ended(struct capstan_runtime *rt, const char *err)
{
    if (!rt->link.board_end)
        return;
    if (err)
        snprintf(rt->link.board_end->reason, sizeof(rt->link.board_end->reason), "%s", err);
    atomic_store(&rt->link.board_end->ended, 1);
}

capstan_config_t *capstan__runtime_config(struct capstan_runtime *rt)
{
    return rt->cfg;
}
