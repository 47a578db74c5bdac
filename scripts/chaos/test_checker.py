"""Tests of the fault-injection harness's checker (checker.py): for each
rule, a small ledger and Redis state that it must pass, and one that breaks
the rule and that it must report. The inputs are made as harness.py makes
them (ledger files in tests/chaos/ledger.c's line format, a checker.State,
checker.Fault objects) and judged by the same calls in the same order as
harness.py's run() makes."""
import json
import os
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402

T = 1000.0  # the epoch every case's times are counted from
WINDOW = 3  # harness.py's LedgerWindowJob starts a second
LIMIT = 3   # harness.py's LedgerLimitJob limiter size
LOCK_CLASSES = {"LedgerLockJob", "LedgerUntilExecutedJob", "LedgerUntilWhileJob"}


def stamp(t):
    """An epoch as the ledger writes it (%.6f): a step's run tag names its
    S line's time by the same text."""
    return "%.6f" % t


def S(jid, pid, t, cls="LedgerJob", args=(5,)):
    return ("S", jid, pid, t, cls, json.dumps(list(args), separators=(",", ":")))


def E(jid, pid, t, run=None):
    return ("E", jid, pid, t, run)


def I(jid, pid, t, index, run):  # noqa: E743 (the ledger's own letter)
    return ("I", jid, pid, t, index, run)


def H(jid, pid, t, run):
    return ("H", jid, pid, t, run)


def run_of(jid, pid, start, end, cls="LedgerJob", args=(5,), port=6379):
    """The S and E lines of one whole run (port: of its Redis connection)."""
    return [S(jid, pid, start, cls, args) + (port,), E(jid, pid, end, start)]


# Two shards, as harness.py --shards 2 names them, by their Redis ports.
PORTS = {6001: "s0", 6002: "s1"}
PORT = {v: k for k, v in PORTS.items()}


def write_ledger(dir, lines):
    """Writes lines (tuples: S, E, I, H as above) into dir/ledger.<pid>, one
    file per process, each in time order as its process appended them."""
    by_pid = {}
    for x in sorted(lines, key=lambda x: x[3]):
        kind, jid, pid, t = x[:4]
        rest = x[4:]
        if kind == "S":
            text = "S %s %d %s %d %s %s\n" % (jid, pid, stamp(t), rest[2] if len(rest) > 2 else 6379, rest[0],
                                                rest[1])
        elif kind == "E":
            text = "E %s %d %s%s\n" % (jid, pid, stamp(t), "" if rest[0] is None else " " + stamp(rest[0]))
        elif kind == "I":
            text = "I %s %d %s %d %s\n" % (jid, pid, stamp(t), rest[0], stamp(rest[1]))
        else:
            text = "H %s %d %s %s\n" % (jid, pid, stamp(t), stamp(rest[0]))
        by_pid.setdefault(pid, []).append(text)
    for pid, texts in by_pid.items():
        with open(os.path.join(dir, "ledger.%d" % pid), "w") as f:
            f.writelines(texts)


def fault(kind, start, end=None, pid=None, held=()):
    """A fault as harness.py's inject() leaves it: the process it hit and
    the jids of that process's working list (None: Redis did not say)."""
    f = checker.Fault(kind, start)
    f.end, f.pid = end, pid
    f.held = None if held is None else set(held)
    return f


def state(queued=(), retry=(), dead=(), working=()):
    st = checker.State()
    st.queued, st.retry, st.dead, st.working = set(queued), set(retry), set(dead), set(working)
    return st


def batch(tag, bid, jids, committed=True):
    b = checker.Batch(tag)
    b.bid, b.jids, b.pushed, b.committed = bid, list(jids), bool(jids), committed
    return b


def callback(jid, pid, start, end, tag, bid, event, enqueued_at):
    """A batch callback's run: its ledger args are [enqueued_at, its args]."""
    return run_of(jid, pid, start, end, checker.BATCH_CALLBACK,
                  [enqueued_at, [{"bid": bid, "event": event}, {"tag": tag}]])


def tick(jid, pid, start, periodic_at, enqueued_at):
    """A periodic tick's run: its ledger args are [enqueued_at, periodic_at]."""
    return run_of(jid, pid, start, start + 0.01, checker.TICK_JOB, [enqueued_at, periodic_at])


class CheckerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def judge(self, lines, pushed=None, st=None, faults=(), tried=(), concurrency=0, batches=None,
              enqueued=(), tick_every=0, lock_pushes=(), push_at=None, shard_of=None):
        """The report on lines, as harness.py's run() makes it. pushed: the
        jids Redis took (default: every jid of an S line that is not a tick
        or a batch callback, which capstan enqueues)."""
        write_ledger(self.dir, lines)
        if pushed is None:
            pushed = {x[1] for x in lines if x[0] == "S"
                      and x[4] not in (checker.TICK_JOB, checker.BATCH_CALLBACK)}
        pushed = {j: ("LedgerJob", [5], T) for j in pushed}
        batches = batches or {}
        faults = list(faults)
        st = st or state()
        push_at = push_at or {}
        self.runs = runs = checker.read_ledger(self.dir)
        steps, handed_back = checker.read_steps(self.dir, runs)
        r = checker.check(pushed, set(tried) | checker.workload_jids(runs, batches, lock_pushes), runs, st,
                          faults, lock_classes=LOCK_CLASSES, limits={"LedgerLimitJob": LIMIT},
                          concurrency=concurrency, handed_back=handed_back, push_at=push_at,
                          shard_of=shard_of, ports=PORTS if shard_of is not None else None)
        checker.check_workload(r, runs, st, list(enqueued), batches, tick_every, steps, faults, list(lock_pushes),
                               {"LedgerWindowJob": (WINDOW, 1.0)}, push_at=push_at)
        r.drained = True
        self.text = r.text()
        return r

    def assertOk(self, r):
        self.assertTrue(r.ok(), "\n" + self.text)

    def assertFailed(self, r, *lines):
        """r fails, and its text has each of lines as one of its own."""
        self.assertFalse(r.ok(), "\n" + self.text)
        have = [x.strip() for x in self.text.split("\n")]
        for line in lines:
            self.assertIn(line, have, "\n" + self.text)

    # -- lost jobs --
    def test_a_job_that_ended_is_not_lost(self):
        r = self.judge(run_of("j1", 100, T + 0.1, T + 0.2))
        self.assertOk(r)
        self.assertEqual((r.pushed, r.ended, r.starts), (1, 1, 1))

    def test_a_job_pushed_never_run_and_in_no_set_is_lost(self):
        r = self.judge(run_of("j1", 100, T + 0.1, T + 0.2), pushed={"j1", "j2"})
        self.assertEqual(r.lost, ["j2"])
        self.assertFailed(r, "lost: j2")

    def test_a_job_started_never_ended_and_in_no_set_is_lost(self):
        r = self.judge([S("j1", 100, T + 0.1)])
        self.assertEqual(r.lost, ["j1"])
        self.assertFailed(r, "lost: j1")

    def test_a_job_in_the_retry_set_is_not_lost(self):
        # Its run failed (no E line) and it waits for its next try.
        r = self.judge([S("j1", 100, T + 0.1)], st=state(retry={"j1"}))
        self.assertOk(r)
        self.assertEqual((r.lost, r.retry), ([], 1))

    def test_a_job_still_queued_or_dead_is_not_lost(self):
        r = self.judge([], pushed={"j1", "j2"}, st=state(queued={"j1"}, dead={"j2"}))
        self.assertOk(r)
        self.assertEqual((r.lost, r.dead), ([], 1))

    def test_a_job_nobody_pushed_is_unexpected(self):
        r = self.judge(run_of("j1", 100, T + 0.1, T + 0.2), pushed=set())
        self.assertEqual(r.unexpected, ["j1"])
        self.assertFailed(r, "unexpected: j1")

    def test_a_job_whose_push_went_unanswered_is_not_unexpected(self):
        r = self.judge(run_of("j1", 100, T + 0.1, T + 0.2), pushed=set(), tried={"j1"})
        self.assertOk(r)

    def failover(self):
        """A SENTINEL FAILOVER whose new master had the old one's writes of
        replication id R1 up to offset 500."""
        f = fault("failover", T + 1, T + 2)
        f.promoted, f.demoted, f.cut = T + 1.5, T + 2, ("R1", 500)
        return f

    def test_a_push_past_a_failovers_cut_is_not_lost_but_counted_apart(self):
        fo = self.failover()
        r = self.judge([], pushed={"j1"}, faults=[fo], push_at={"j1": ("R1", 510)})
        self.assertOk(r)
        self.assertEqual((r.lost, r.unreplicated), ([], ["j1"]))

    def test_a_push_the_new_master_had_is_lost_through_a_failover(self):
        fo = self.failover()
        r = self.judge([], pushed={"j1"}, faults=[fo], push_at={"j1": ("R1", 490)})
        self.assertFailed(r, "lost: j1")

    # -- extra runs and the faults they come from --
    def failover_kill_of(self, held):
        """A kill -9 of the master at T + 3, the replica promoted at T + 10
        with held unfinished (read at once)."""
        f = fault("failover_kill", T + 3, T + 10)
        f.promoted, f.demoted, f.cut = T + 10, T + 3, ("R1", 500)
        f.held, f.read_at = set(held), T + 10.1
        return f

    def test_a_run_whose_ack_a_redis_restart_held_back_into_a_failover_is_the_failovers(self):
        # j1 ended at T + 0.5 while Redis was down (killed at T + 0.45,
        # back at T + 2.5): its ack was written after that, then lost with
        # the master killed at T + 3 before its replica had it.
        restart = fault("restart_redis", T + 0.45, T + 2.5)
        fo = self.failover_kill_of({"j1"})
        r = self.judge(run_of("j1", 100, T + 0.4, T + 0.5) + run_of("j1", 100, T + 15, T + 15.1),
                       faults=[restart, fo])
        self.assertOk(r)
        self.assertEqual((fo.dups, fo.bound), (1, 1))

    def test_a_run_acked_after_a_lagging_replicas_copy_stopped_is_the_failovers(self):
        # The replica had the master's writes up to offset 500 only, which
        # a push at T + 0.2 had reached (one at T + 2.5 was past it): j1's
        # ack at T + 0.5, 2.5 s before the master was killed, was past the
        # cut too.
        fo = self.failover_kill_of({"j1"})
        r = self.judge(run_of("j1", 100, T + 0.4, T + 0.5) + run_of("j1", 100, T + 15, T + 15.1),
                       pushed={"j1", "p1", "p2"}, faults=[fo],
                       push_at={"p1": ("R1", 400), "p2": ("R1", 600)},
                       st=state(queued={"p1", "p2"}))
        self.assertEqual(fo.cut_at, T)  # judge() gives every push the time T
        self.assertOk(r)
        self.assertEqual(fo.dups, 1)

    def test_a_run_fetched_past_the_cut_and_run_again_before_the_read_is_the_failovers(self):
        # The replica's copy stopped at T (cut_at); j1 was fetched from the
        # old master at T + 0.3, so the new master still had it queued,
        # and a worker that moved there ran it again at T + 1.4 and acked
        # it before the harness read the new master (T + 3.5): it is not in
        # held, and it started 1.7 s before the promotion was seen.
        fo = fault("failover", T + 0.2, T + 12)
        fo.promoted, fo.demoted, fo.cut = T + 2, T + 12, ("R1", 500)
        fo.held, fo.read_at = set(), T + 3.5
        r = self.judge(run_of("j1", 100, T + 0.3, T + 0.35) + run_of("j1", 100, T + 1.4, T + 1.45),
                       pushed={"j1", "p1", "p2"}, faults=[fo],
                       push_at={"p1": ("R1", 400), "p2": ("R1", 600)},
                       st=state(queued={"p1", "p2"}))
        self.assertEqual(fo.cut_at, T)
        self.assertOk(r)
        self.assertEqual((fo.dups, fo.bound), (1, 1))

    def test_a_run_that_ended_well_before_a_failover_is_not_the_failovers(self):
        # The same without the restart: its ack had 2.5 s to be written.
        fo = self.failover_kill_of({"j1"})
        r = self.judge(run_of("j1", 100, T + 0.4, T + 0.5) + run_of("j1", 100, T + 15, T + 15.1), faults=[fo])
        self.assertFailed(r, "unexplained extra start: j1 ran on 100 at 1000.400 and on 100 at 1015.000")

    def test_a_run_again_after_a_kill_of_its_process_is_the_kills(self):
        kill = fault("kill9_worker", T + 1, T + 1, pid=100, held={"j1"})
        r = self.judge([S("j1", 100, T + 0.5)] + run_of("j1", 200, T + 2, T + 2.1), faults=[kill])
        self.assertOk(r)
        self.assertEqual((kill.dups, kill.bound), (1, 1))
        self.assertEqual(r.unattributed, [])

    def test_a_run_again_with_no_fault_is_unexplained(self):
        r = self.judge(run_of("j1", 100, T + 0.5, T + 0.6) + run_of("j1", 200, T + 2, T + 2.1))
        self.assertEqual(len(r.unattributed), 1)
        self.assertFailed(r, "unexplained extra start: j1 ran on 100 at %.3f and on 200 at %.3f" % (T + 0.5, T + 2))

    def test_a_kill_does_not_explain_a_job_its_process_had_finished_and_acked(self):
        # j1 ended before the kill and was not in the process's working
        # list: its ack was in, the kill cannot make it run again.
        kill = fault("kill9_worker", T + 1, T + 1, pid=100, held=set())
        r = self.judge(run_of("j1", 100, T + 0.5, T + 0.6) + run_of("j1", 200, T + 2, T + 2.1), faults=[kill])
        self.assertEqual((kill.dups, len(r.unattributed)), (0, 1))
        self.assertFailed(r, "unexplained extra start: j1 ran on 100 at %.3f and on 200 at %.3f" % (T + 0.5, T + 2))

    def test_a_freeze_explains_as_many_extra_runs_as_its_process_held(self):
        stop = fault("stop_worker", T + 1, T + 3, pid=100, held={"j1"})
        r = self.judge(run_of("j1", 100, T + 0.5, T + 3.1) + run_of("j1", 200, T + 2, T + 2.1), faults=[stop])
        self.assertOk(r)
        self.assertEqual((stop.dups, stop.bound), (1, 1))

    def test_a_run_of_a_cut_off_process_in_its_cut_is_not_the_cuts_extra_run(self):
        # j1 ended on 100 half a second before the master was killed (its
        # ack lost with it); 100 gave it back as a stray and ran it again
        # just as it was cut off from Redis (it was in its working list
        # then), and 200 recovered it during the cut. The first extra run
        # is the failover's, the second the cut's: a process cut off starts
        # no job it did not fetch before.
        fo = self.failover_kill_of({"j1"})
        cut = fault("partition", T + 12, T + 15, pid=100, held={"j1"})
        r = self.judge(run_of("j1", 100, T + 2.4, T + 2.5) + run_of("j1", 100, T + 12.02, T + 12.03)
                       + run_of("j1", 200, T + 14, T + 14.1), faults=[fo, cut])
        self.assertOk(r)
        self.assertEqual((fo.dups, cut.dups, cut.bound), (1, 1, 1))

    def test_extra_runs_beyond_a_freezes_bound_are_reported(self):
        # The frozen process held one job, which ran three times: two extra
        # runs where the freeze allows one (concurrency 0: no processor
        # blocked on an empty queue).
        stop = fault("stop_worker", T + 1, T + 3, pid=100, held={"j1"})
        r = self.judge(run_of("j1", 100, T + 0.5, T + 3.1) + run_of("j1", 200, T + 2, T + 2.1)
                       + run_of("j1", 100, T + 3.5, T + 3.6), faults=[stop])
        self.assertEqual(r.over_bound(), [stop])
        self.assertEqual((stop.dups, stop.bound), (2, 1))
        self.assertFailed(r, "%-18s %8d %12d %14d %10d" % ("stop_worker", 1, 2, 1, 1))

    # -- runtime locks --
    def test_runtime_locked_runs_one_after_the_other_are_ok(self):
        lock = lambda jid, pid, s, e, key: run_of(jid, pid, s, e, "LedgerLockJob", [50, key])  # noqa: E731
        r = self.judge(lock("j1", 100, T + 0.1, T + 0.2, "k1") + lock("j2", 200, T + 0.3, T + 0.4, "k1")
                       # another digest may run beside it
                       + lock("j3", 200, T + 0.15, T + 0.25, "k2"))
        self.assertOk(r)

    def test_overlapping_runs_of_a_runtime_locked_digest_are_reported(self):
        lock = lambda jid, pid, s, e, key: run_of(jid, pid, s, e, "LedgerLockJob", [50, key])  # noqa: E731
        r = self.judge(lock("j1", 100, T + 0.1, T + 0.2, "k1") + lock("j2", 200, T + 0.15, T + 0.3, "k1"))
        self.assertEqual(len(r.overlaps_unattributed), 1)
        self.assertFailed(r, 'overlap: ["LedgerLockJob", "k1"]: j1 on 100 and j2 on 200')

    def test_an_overlap_next_to_a_freeze_of_a_holder_is_the_freezes(self):
        lock = lambda jid, pid, s, e, key: run_of(jid, pid, s, e, "LedgerLockJob", [50, key])  # noqa: E731
        stop = fault("stop_worker", T + 0.12, T + 0.18, pid=100, held={"j1"})
        r = self.judge(lock("j1", 100, T + 0.1, T + 0.2, "k1") + lock("j2", 200, T + 0.15, T + 0.3, "k1"),
                       faults=[stop])
        self.assertOk(r)
        self.assertEqual((r.overlaps_attributed, stop.overlaps), (1, 1))

    def test_an_overlap_just_after_a_promotion_is_the_failovers(self):
        # Two jobs fetched after the new master was read, one from each
        # master: each master hands out lock k1. Neither job was one the new
        # master had unfinished; the lock is what the split brain doubled.
        lock = lambda jid, pid, s, e, key: run_of(jid, pid, s, e, "LedgerLockJob", [50, key])  # noqa: E731
        fo = self.failover()
        fo.held, fo.read_at = set(), T + 1.55
        r = self.judge(lock("j1", 100, T + 1.6, T + 1.7, "k1") + lock("j2", 200, T + 1.65, T + 1.8, "k1"),
                       faults=[fo])
        self.assertOk(r)
        self.assertEqual((r.overlaps_attributed, fo.overlaps), (1, 1))

    # -- until-locks (taken by `capstan push`) --
    def until(self, cls, pushes, runs):
        """Accepted pushes (jid, sent, replied) of cls with key k1, and the
        runs (jid, pid, start, end) of their jobs."""
        ps = []
        for seq, (jid, sent, replied) in enumerate(pushes):
            p = checker.LockPush(cls, [5, "k1", seq])
            p.sent, p.replied, p.status, p.jid = sent, replied, "accepted", jid
            ps.append(p)
        lines = [x for jid, pid, s, e in runs for x in run_of(jid, pid, s, e, cls, [5, "k1", 0])]
        return self.judge(lines, lock_pushes=ps)

    def test_an_until_executed_lock_taken_after_its_holder_ended_is_ok(self):
        r = self.until("LedgerUntilExecutedJob", [("u1", T, T + 0.01), ("u2", T + 0.5, T + 0.51)],
                       [("u1", 100, T + 0.1, T + 0.3), ("u2", 200, T + 0.6, T + 0.7)])
        self.assertOk(r)

    def test_an_until_executed_lock_taken_while_its_holder_ran_is_reported(self):
        r = self.until("LedgerUntilExecutedJob", [("u1", T, T + 0.01), ("u2", T + 0.5, T + 0.51)],
                       [("u1", 100, T + 0.1, T + 0.55), ("u2", 200, T + 0.6, T + 0.7)])
        self.assertFailed(r, "workload: LedgerUntilExecutedJob k1: u2 accepted at %.3f before u1 (which ran first) "
                          "ended at %.3f" % (T + 0.51, T + 0.55))

    def test_an_until_expired_lock_taken_again_after_its_ttl_is_ok(self):
        r = self.until("LedgerUntilExpiredJob", [("u1", T, T + 0.01), ("u2", T + 1.2, T + 1.21)],
                       [("u1", 100, T + 0.1, T + 0.2), ("u2", 200, T + 1.3, T + 1.4)])
        self.assertOk(r)

    def test_an_until_expired_lock_taken_again_within_its_ttl_is_reported(self):
        r = self.until("LedgerUntilExpiredJob", [("u1", T, T + 0.01), ("u2", T + 0.5, T + 0.51)],
                       [("u1", 100, T + 0.1, T + 0.2), ("u2", 200, T + 0.6, T + 0.7)])
        self.assertFailed(r, "workload: LedgerUntilExpiredJob k1: u1 and u2 both took the lock within 0.510 s "
                          "(ttl 1 s)")

    # -- the concurrent limiter --
    def limited(self, n, overlap):
        """n runs of LedgerLimitJob, all at once when overlap, else the last
        one after the first ended."""
        lines = []
        for k in range(n):
            s = T + 0.1 + 0.01 * k if overlap or k < n - 1 else T + 0.6
            lines += run_of("l%d" % k, 100 + k % 2, s, s + 0.4, "LedgerLimitJob")
        return lines

    def test_a_concurrent_limiter_at_its_size_is_ok(self):
        self.assertOk(self.judge(self.limited(LIMIT, True) + self.limited(LIMIT + 1, False)[-2:]))

    def test_a_concurrent_limiter_over_its_size_is_reported(self):
        r = self.judge(self.limited(LIMIT + 1, True))
        self.assertEqual(len(r.limit_unattributed), 1)
        self.assertFailed(r, "limiter: %d LedgerLimitJob holders at %.3f" % (LIMIT + 1, T + 0.1 + 0.01 * LIMIT))

    # -- the window limiter --
    def window(self, counts):
        """counts[k] starts of LedgerWindowJob in the k-th second after T,
        none at a window's first LIMIT_LAG."""
        lines = []
        for k, n in enumerate(counts):
            for i in range(n):
                s = T + k + 0.2 + 0.1 * i
                lines += run_of("w%d_%d" % (k, i), 100, s, s + 0.01, "LedgerWindowJob")
        return lines

    def test_a_window_limiter_at_its_count_is_ok(self):
        r = self.judge(self.window([WINDOW, WINDOW, 1]))
        self.assertOk(r)

    def test_a_window_limiter_over_its_count_is_reported(self):
        r = self.judge(self.window([WINDOW, WINDOW + 1]))
        self.assertFailed(r, "workload: LedgerWindowJob: %d starts in the window at %.0f (limit %d per 1 s)"
                          % (WINDOW + 1, T + 1, WINDOW))

    # -- iterable jobs --
    def iterable(self, jid, pid, start, n, taken, end=None):
        """A run of an n-step LedgerIterJob taking steps taken (index, time)."""
        lines = [S(jid, pid, start, checker.ITER_JOB, [1, n])]
        lines += [I(jid, pid, t, i, start) for i, t in taken]
        return lines + ([E(jid, pid, end, start)] if end is not None else [])

    def test_an_iterable_job_taking_each_step_once_is_ok(self):
        r = self.judge(self.iterable("i1", 100, T, 3, [(0, T + 0.1), (1, T + 0.2), (2, T + 0.3)], T + 0.4))
        self.assertOk(r)
        self.assertIn("iterable jobs: 1, 3 steps taken, 0 never taken, 0 taken again after a fault of their "
                      "process, 0 after a failover, 0 otherwise", self.text)

    def test_an_iterable_step_never_taken_is_reported(self):
        r = self.judge(self.iterable("i1", 100, T, 3, [(0, T + 0.1), (2, T + 0.3)], T + 0.4))
        self.assertFailed(r, "workload: iterable i1: step 1 of 3 never taken")

    def test_an_iterable_step_taken_twice_by_one_run_is_reported(self):
        r = self.judge(self.iterable("i1", 100, T, 3, [(0, T + 0.1), (1, T + 0.2), (1, T + 0.25), (2, T + 0.3)],
                                     T + 0.4))
        self.assertFailed(r, "workload: iterable i1: step 1 taken again by the same run without a fault between")

    def test_an_iterable_step_taken_again_by_another_run_without_a_fault_is_reported(self):
        # The first run's interruption handed it back (H) but the next
        # resumes before its last step.
        r = self.judge(self.iterable("i1", 100, T, 3, [(0, T + 0.1), (1, T + 0.2)], T + 0.3)
                       + [H("i1", 100, T + 0.29, T)]
                       + self.iterable("i1", 200, T + 1, 3, [(1, T + 1.1), (2, T + 1.2)], T + 1.3))
        self.assertFailed(r, "workload: iterable i1: step 1 taken again by another run without a fault between")

    def test_an_interrupted_iterable_job_resumed_is_no_extra_run(self):
        r = self.judge(self.iterable("i1", 100, T, 3, [(0, T + 0.1), (1, T + 0.2)], T + 0.3)
                       + [H("i1", 100, T + 0.29, T)]
                       + self.iterable("i1", 200, T + 1, 3, [(2, T + 1.1)], T + 1.2))
        self.assertOk(r)
        self.assertEqual(r.unattributed, [])

    def test_an_iterable_job_run_again_without_being_handed_back_is_an_extra_run(self):
        r = self.judge(self.iterable("i1", 100, T, 3, [(0, T + 0.1), (1, T + 0.2)], T + 0.3)
                       + self.iterable("i1", 200, T + 1, 3, [(2, T + 1.1)], T + 1.2))
        self.assertEqual(len(r.unattributed), 1)
        self.assertFalse(r.ok())

    def test_two_runs_of_an_iterable_job_at_once_on_one_process_are_told_apart(self):
        # Process 100 is frozen while its run A of i1 is at step 2; i1 is
        # recovered, and the process, thawed, fetches it again: run B
        # resumes from the saved cursor (2) while A goes on. Both take steps
        # 2 and 3, each its own (the freeze explains that); by process and
        # time alone, A's steps after B began would be B's, taken twice.
        stop = fault("stop_worker", T + 1, T + 3, pid=100, held={"i1"})
        a, b = T + 0.5, T + 3.05
        lines = (self.iterable("i1", 100, a, 5, [(0, T + 0.6), (1, T + 0.7), (2, T + 3.1), (3, T + 3.3)])
                 + self.iterable("i1", 100, b, 5, [(2, T + 3.2), (3, T + 3.4), (4, T + 3.5)])
                 + [E("i1", 100, T + 3.35, a), E("i1", 100, T + 3.6, b)])
        r = self.judge(lines, faults=[stop])
        self.assertOk(r)
        # Each end is its own run's, by its tag too.
        self.assertEqual([(x.start, x.end) for x in self.runs["i1"]], [(a, T + 3.35), (b, T + 3.6)])
        self.assertIn("iterable jobs: 1, 7 steps taken, 0 never taken, 2 taken again after a fault of their "
                      "process, 0 after a failover, 0 otherwise", self.text)
        self.assertEqual(stop.dups, 1)

    def test_an_end_without_a_run_tag_closes_the_last_run_started_there(self):
        # An older ledger: E lines name no run.
        write_ledger(self.dir, [S("j1", 100, T + 0.1), S("j1", 100, T + 0.2), E("j1", 100, T + 0.3)])
        runs = checker.read_ledger(self.dir)
        self.assertEqual([(x.start, x.end) for x in runs["j1"]], [(T + 0.1, None), (T + 0.2, T + 0.3)])

    def test_a_stale_run_taking_a_step_after_the_run_that_replaced_it_is_the_freezes(self):
        # Process 100 is frozen in run A of i1 after step 1; process 200
        # takes i1 over (run B, from the saved cursor, 2) and finishes it;
        # then 100 thaws and A takes step 2 too: later than B did, though A
        # began first. The freeze of A's process between the two runs
        # explains it.
        stop = fault("stop_worker", T + 1, T + 3, pid=100, held={"i1"})
        r = self.judge(self.iterable("i1", 100, T + 0.5, 3, [(0, T + 0.6), (1, T + 0.7), (2, T + 3.1)], T + 3.2)
                       + self.iterable("i1", 200, T + 2, 3, [(2, T + 2.1)], T + 2.2),
                       faults=[stop])
        self.assertOk(r)
        self.assertEqual(stop.dups, 1)

    def test_a_step_taken_again_after_a_stale_run_saved_its_older_cursor_is_the_freezes(self):
        # 100 cut off while it ran the job; 200 took it over, took step 5
        # and handed it back; 100, back, handed back its own older cursor
        # (5), so 300 took step 5 again.
        cut = fault("partition", T + 0.5, T + 5, pid=100, held={"i1"})
        a, b, c = T + 0.1, T + 6, T + 8
        lines = [S("i1", 100, a, checker.ITER_JOB, [10, 7])] + [I("i1", 100, a + 0.1 + k / 100, k, a)
                                                                for k in range(5)] + [
                 S("i1", 200, b, checker.ITER_JOB, [10, 7]), I("i1", 200, b + 0.1, 5, b), H("i1", 200, b + 0.2, b),
                 E("i1", 200, b + 0.3, b), H("i1", 100, b + 0.5, a), E("i1", 100, b + 0.6, a),
                 S("i1", 300, c, checker.ITER_JOB, [10, 7]), I("i1", 300, c + 0.1, 5, c),
                 I("i1", 300, c + 0.2, 6, c), E("i1", 300, c + 0.3, c)]
        self.assertOk(self.judge(lines, faults=[cut]))
        r = self.judge(lines, faults=[])
        self.assertIn("taken again by another run without a fault between", self.text)

    # -- batch callbacks --
    def batch_run(self, events):
        """Batch b1 of jobs bj1, bj2 (both ended by T + 0.5), committed, and
        its callbacks: events [(event, enqueued_at, start[, pid])]."""
        lines = (run_of("bj1", 100, T + 0.1, T + 0.3, checker.BATCH_JOB, [5, "b1"])
                 + run_of("bj2", 200, T + 0.2, T + 0.5, checker.BATCH_JOB, [5, "b1"]))
        for k, (event, enq, start, *pid) in enumerate(events):
            lines += callback("cb-%s-%d" % (event, k), (pid or [100])[0], start, start + 0.01, "b1", "BID1",
                              event, enq)
        return lines, {"b1": batch("b1", "BID1", ["bj1", "bj2"])}

    def test_batch_callbacks_each_once_after_the_jobs_are_ok(self):
        lines, batches = self.batch_run([("complete", T + 0.51, T + 0.6), ("success", T + 0.51, T + 0.7)])
        r = self.judge(lines, pushed={"bj1", "bj2"}, batches=batches)
        self.assertOk(r)
        self.assertIn("batch callbacks: 1 batches (1 committed with every job done), 0 missing (+0 lost in a "
                      "failover: the last job ended in its split brain), 0 twice (+0 enqueued again in a "
                      "failover), 0 before their jobs ended", self.text)

    def test_a_batch_callback_enqueued_twice_is_reported(self):
        lines, batches = self.batch_run([("complete", T + 0.51, T + 0.6), ("success", T + 0.51, T + 0.7),
                                         ("success", T + 0.8, T + 0.9)])
        r = self.judge(lines, pushed={"bj1", "bj2"}, batches=batches)
        self.assertFailed(r, "workload: batch b1 (BID1): success fired 2 times")

    def test_a_batch_callback_run_twice_from_one_enqueue_is_not_fired_twice(self):
        # One enqueue (one enqueued_at) run twice: a recovery, an extra run
        # (judged by check() against its fault), not a second firing.
        lines, batches = self.batch_run([("complete", T + 0.51, T + 0.6, 300), ("success", T + 0.51, T + 0.7)])
        kill = fault("kill9_worker", T + 0.605, T + 0.605, pid=300, held={"cb-complete-0"})
        lines = [x for x in lines if x[:2] != ("E", "cb-complete-0")]
        lines += callback("cb-complete-0", 200, T + 1, T + 1.1, "b1", "BID1", "complete", T + 0.51)
        r = self.judge(lines, pushed={"bj1", "bj2"}, batches=batches, faults=[kill])
        self.assertOk(r)

    def test_a_batch_callback_never_fired_is_reported(self):
        lines, batches = self.batch_run([("complete", T + 0.51, T + 0.6)])
        r = self.judge(lines, pushed={"bj1", "bj2"}, batches=batches)
        self.assertFailed(r, "workload: batch b1 (BID1): success never fired")

    def test_batch_callbacks_lost_with_an_old_masters_writes_are_counted_apart(self):
        # The last job's ack, which fires the callbacks, went to the old
        # master in a failover's split brain: lost with its writes.
        lines, batches = self.batch_run([])
        fo = fault("failover", T + 0.4, T + 10)
        r = self.judge(lines, pushed={"bj1", "bj2"}, batches=batches, faults=[fo])
        self.assertOk(r)
        self.assertIn("batch callbacks: 1 batches (1 committed with every job done), 0 missing (+2 lost in a "
                      "failover: the last job ended in its split brain)", self.text)

    def test_a_batch_callback_before_the_last_job_ended_is_reported(self):
        lines, batches = self.batch_run([("complete", T + 0.25, T + 0.4), ("success", T + 0.51, T + 0.7)])
        r = self.judge(lines, pushed={"bj1", "bj2"}, batches=batches)
        self.assertFailed(r, "workload: batch b1 (BID1): complete ran at %.3f, before its last job ended at %.3f"
                          % (T + 0.4, T + 0.5))

    # -- periodic ticks --
    def ticks(self, enqueues):
        """A tick run per (periodic_at, enqueued_at), its jid derived from
        periodic_at as capstan derives it."""
        return [x for k, (at, enq) in enumerate(enqueues)
                for x in tick("tick-%d" % at, 100 + k % 2, enq + 0.01, at, enq)]

    def test_each_periodic_tick_once_is_ok(self):
        r = self.judge(self.ticks([(1000, T), (1001, T + 1), (1002, T + 2)]), tick_every=1)
        self.assertOk(r)
        self.assertIn("periodic ticks: 3 from the first to the last, 0 missed, 0 twice", self.text)

    def test_a_periodic_tick_missed_is_reported(self):
        r = self.judge(self.ticks([(1000, T), (1002, T + 2)]), tick_every=1)
        self.assertFailed(r, "workload: periodic tick 1001 never enqueued")

    def test_a_periodic_tick_enqueued_twice_is_reported(self):
        r = self.judge(self.ticks([(1000, T), (1001, T + 1), (1001, T + 1.5), (1002, T + 2)]), tick_every=1)
        self.assertFailed(r, "workload: periodic tick 1001 enqueued 2 times")

    def test_a_periodic_tick_still_queued_at_the_end_counts(self):
        r = self.judge(self.ticks([(1000, T), (1002, T + 2)]), tick_every=1,
                       enqueued=[(checker.TICK_JOB, "tick-1001", [T + 1, 1001])])
        self.assertOk(r)

    def test_no_periodic_tick_at_all_is_reported(self):
        r = self.judge([], tick_every=1)
        self.assertFailed(r, "workload: periodic: no tick enqueued")

    # -- shards (harness.py --shards) --
    def sharded(self, runs, faults=(), **kw):
        """runs: (jid, shard, pid, start, end) each, every jid pushed to the
        shard of its first run."""
        lines, shard_of = [], {}
        for jid, shard, pid, start, end in runs:
            # (end None: a run a kill ended, with no E line.)
            lines += run_of(jid, pid, start, end, port=PORT[shard])[:1 if end is None else 2]
            shard_of.setdefault(jid, shard)
        return self.judge(lines, faults=faults, shard_of=shard_of, **kw)

    def outage(self, shard="s0", held=("j1",), slack=0):
        """s0's Redis killed at T + 1 and back at T + 4, its working lists
        holding held just before."""
        f = fault(checker.SHARD_OUTAGE, T + 1, T + 4, held=held)
        f.shard, f.slack = shard, slack
        return f

    def test_a_shard_outage_explains_a_rerun_of_a_job_its_shard_held(self):
        # j1 ran on 100 across the outage; its ack unwritten, 200 took it
        # from 100's working list when s0 came back without 100's lease.
        out = self.outage()
        r = self.sharded([("j1", "s0", 100, T + 0.5, T + 2), ("j1", "s0", 200, T + 4.5, T + 4.6),
                          ("j2", "s1", 100, T + 0.5, T + 0.6)], faults=[out])
        self.assertOk(r)
        self.assertEqual((out.dups, out.bound), (1, 1))
        self.assertIn("shard s0: pushed 1, ended 1, lost 0; extra starts 1 (0 not explained by a fault)",
                      [x.strip() for x in self.text.split("\n")])

    def test_a_shard_outage_does_not_explain_a_rerun_in_another_shard(self):
        # The same two runs, in s1, while s0 was out: nothing explains them.
        out = self.outage(held=("j1",))
        r = self.sharded([("j1", "s1", 100, T + 0.5, T + 2), ("j1", "s1", 200, T + 4.5, T + 4.6)], faults=[out])
        self.assertEqual((out.dups, len(r.unattributed)), (0, 1))
        self.assertFailed(r, "unexplained extra start: j1 ran on 100 at %.3f and on 200 at %.3f (shard s1)"
                          % (T + 0.5, T + 4.5),
                          "shard s1: pushed 1, ended 1, lost 0; extra starts 1 (1 not explained by a fault)")

    def test_a_shard_outage_does_not_explain_a_job_fetched_after_it(self):
        # j1 was fetched and first run after s0 came back, far from the fault.
        out = self.outage(held=())
        r = self.sharded([("j1", "s0", 100, T + 20, T + 20.1), ("j1", "s0", 200, T + 21, T + 21.1)], faults=[out])
        self.assertEqual((out.dups, len(r.unattributed)), (0, 1))
        self.assertFalse(r.ok())

    def test_reruns_beyond_a_shard_outages_bound_are_reported(self):
        # It held one job (and no slack): two of its jobs ran again.
        out = self.outage(held=("j1",))
        r = self.sharded([("j1", "s0", 100, T + 0.5, T + 2), ("j1", "s0", 200, T + 4.5, T + 4.6),
                          ("j3", "s0", 100, T + 0.6, T + 2), ("j3", "s0", 200, T + 4.5, T + 4.6)], faults=[out])
        self.assertEqual(r.over_bound(), [out])
        self.assertFailed(r, "%-18s %8d %12d %14d %10d" % (checker.SHARD_OUTAGE, 1, 2, 1, 1))

    def test_a_process_fault_explains_reruns_in_every_shard(self):
        # A killed process ran a job of each shard: both run again.
        kill = fault("kill9_worker", T + 1, T + 1.5, pid=100)
        r = self.sharded([("j1", "s0", 100, T + 0.5, None), ("j1", "s0", 200, T + 4, T + 4.1),
                          ("j2", "s1", 100, T + 0.5, None), ("j2", "s1", 200, T + 4, T + 4.1)], faults=[kill])
        self.assertOk(r)
        self.assertEqual((kill.dups, kill.bound), (2, 2))

    def test_a_job_run_outside_the_shard_it_was_pushed_to_is_reported(self):
        lines = run_of("j1", 100, T + 0.5, T + 0.6, port=PORT["s1"])
        r = self.judge(lines, shard_of={"j1": "s0"})
        self.assertFailed(r, "wrong shard: j1 pushed to s0 ran in s1 on 100 at %.3f" % (T + 0.5))

    def test_a_handler_given_no_redis_connection_is_reported(self):
        # The ledger writes port 0 when capstan_job_redis() was NULL.
        r = self.judge(run_of("j1", 100, T + 0.5, T + 0.6, port=0) + run_of("j2", 100, T + 0.7, T + 0.8))
        self.assertIn("no connection: j1 on 100 at %.3f" % (T + 0.5), [x.strip() for x in self.text.split("\n")])
        self.assertFalse(r.ok())
        r.no_connection_fails = False  # harness.py --report-no-connection
        self.assertOk(r)

    def test_runtime_locked_runs_overlap_only_within_one_shard(self):
        # A lock is one shard's: k1's runs in s0 and s1 may overlap, two in s0 not.
        lock = lambda jid, s, start, port: run_of(jid, 100 + s, start, start + 0.5, "LedgerLockJob",  # noqa: E731
                                                  [50, "k1"], port=port)
        shard_of = {"j1": "s0", "j2": "s1", "j3": "s0"}
        self.assertOk(self.judge(lock("j1", 0, T + 0.1, 6001) + lock("j2", 1, T + 0.2, 6002), shard_of=shard_of))
        r = self.judge(lock("j1", 0, T + 0.1, 6001) + lock("j3", 1, T + 0.2, 6001), shard_of=shard_of)
        self.assertEqual(len(r.overlaps_unattributed), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
