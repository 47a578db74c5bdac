/* The supervisor: `capstan run` loads the config and the plugins once, then
 * forks the worker processes (processes:) and watches them. It runs no jobs
 * and holds no Redis connection or thread across a fork. When a worker
 * dies it knows for certain (it reaped it), so it puts the worker's jobs
 * back at once and starts a replacement; it forwards the signals to every
 * worker, and replaces a worker that leaves on its own (a hard timeout,
 * max_memory) or, on HUP, every worker in turn.
 *
 * A worker and its supervisor share a board (runtime/board.h), on which
 * the worker writes its identity, its readiness, why it leaves, that its
 * run ended, and the jids of the jobs each processor started last.
 *
 * The supervisor sits above the runtime: it reads the runtime's config,
 * hands the worker it becomes its board, and calls nothing else of it but
 * systemd's notify and the process set's cleanup. Its entry point is
 * capstan_runtime_supervise (capstan/runtime.h). Not part of the public
 * API. */
#ifndef CAPSTAN_SUPERVISOR_SUPERVISOR_H
#define CAPSTAN_SUPERVISOR_SUPERVISOR_H

#include "capstan/runtime.h"

#endif
