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
