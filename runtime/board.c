/* The worker's side of the board (board.h): what a supervised worker
 * writes there, from its main thread and, for the jobs they start, its
 * processors. Without a board every write is a no-op. */
#include "runtime/board.h"

#include <stdio.h>
#include <string.h>

#include "runtime/rt.h"
#include "support/identity.h"

void capstan__board_attach(struct capstan_runtime *rt, capstan_board_t *board, size_t size, int slot,
                           int supervisor)
{
    rt->board = board;
    rt->board_end = capstan__board_end(board, size);
    rt->worker_slot = slot;
    rt->supervisor_pid = supervisor;
    capstan__identity_make(rt->identity, sizeof(rt->identity));
    memcpy(board->identity, rt->identity, sizeof(board->identity));
}

void capstan__board_run(struct capstan_runtime *rt, int index, const char *jid)
{
    capstan_board_t *b = rt->board;
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

void capstan__board_ready(struct capstan_runtime *rt)
{
    if (rt->board)
        atomic_store(&rt->board->ready, 1);
}

void capstan__board_rss(struct capstan_runtime *rt, long long rss)
{
    if (rt->board)
        atomic_store(&rt->board->rss, rss);
}

void capstan__board_leave(struct capstan_runtime *rt, int why)
{
    if (rt->board)
        atomic_store(&rt->board->leaving, why);
}

void capstan__board_forget(struct capstan_runtime *rt)
{
    if (rt->board)
        rt->board->identity[0] = '\0';
}

void capstan__board_ended(struct capstan_runtime *rt, const char *err)
{
    if (!rt->board_end)
        return;
    if (err)
        snprintf(rt->board_end->reason, sizeof(rt->board_end->reason), "%s", err);
    atomic_store(&rt->board_end->ended, 1);
}

capstan_config_t *capstan__runtime_config(struct capstan_runtime *rt)
{
    return rt->cfg;
}
