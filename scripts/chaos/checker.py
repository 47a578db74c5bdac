"""The checker of the fault-injection harness (harness.py): reads the ledger
(tests/chaos/ledger.c) and Redis's final state and says, for one run, which
jobs were lost, which ran more than once and which fault each extra run
comes from (against that fault's bound), which runs of one runtime-locked
digest overlapped, and when a concurrent limiter had more holders than its
size."""
import bisect
import collections
import glob
import json
import os
import time

# Faults on one process, and what a job of that process can do through them.
PROCESS_FAULTS = {"kill9_worker", "kill9_supervised", "kill9_supervisor", "stop_worker", "partition",
                  "partition_oneway"}
# The faults that end the jobs a process was running: a kill -9 of it
# (alone, or under a supervisor that recovers its jobs at once), or of its
# supervisor (then it stops as on TERM: jobs past the grace go back).
KILLS = {"kill9_worker", "kill9_supervised", "kill9_supervisor"}
# A frozen or cut-off process's jobs are recovered by others while it may
# still run them: duplicates bounded by its working list at that moment.
FREEZES = {"stop_worker", "partition", "partition_oneway"}
# Seconds a job's first line in the ledger may come after it was fetched:
# its handler starts once its runtime lock (lock_timeout 5 s in the
# harness's config, then a reschedule of 1 s) or its limiter slot
# (wait_timeout 5 s) is had.
START_LAG = 15
# A Sentinel failover (harness.py --sentinel): writes the old master took
# after its replica's copy stopped are gone, so a job whose fetch or ack
# went there runs again. See failover_window() and _in_failover().
FAILOVERS = {"failover", "failover_kill"}
# Seconds a finished job's ack may come after its end (it rides the
# processor's next round trip) and still miss the replica; counted from
# when its process could write again (_ack_from).
ACK_LAG = 1
# The faults during which no process can write to the master: an ack is
# sent again once they end.
OUTAGES = {"stop_redis", "restart_redis", "maxmemory"}
# Seconds after a failover ends in which a job a worker starts may still
# run again: one fetched ahead from the old master and started late, or
# one started by a processor whose connection is still of the old master's
# era (capstan drops the ack of a job that began in another era).
SWITCH_LAG = 5
# A shard's Redis killed -9 (restarted on its AOF) or frozen for seconds
# (harness.py --shards): its liveness keys lapse meanwhile, so the first
# process back recovers the others' working lists of that shard, whose
# jobs may still run in their owners. Its jobs alone: a shard outage
# explains no extra run of another shard.
SHARD_OUTAGE = "shard_outage"


class Fault:
    @staticmethod
    def plain(f):
        """A copy of f that holds data only (what a pickle can keep): the
        old master of a failover by its port."""
        g = Fault(f.kind, f.start)
        g.__dict__.update(f.__dict__)
        if hasattr(g, "old") and not isinstance(g.old, (int, type(None))):
            g.old = getattr(g.old, "port", None)
        return g

    def __init__(self, kind, start):
        self.kind, self.start, self.end = kind, start, None
        self.pid = None       # the process it hit, for a process fault
        self.held = None      # the jids in its working list just before (a
                              # freeze or a cut: at any of the harness's reads
                              # while it lasted; None: Redis did not answer)
        self.bound = 0        # extra runs it may cause (set by check)
        self.dups = 0         # extra runs attributed to it
        self.overlaps = 0     # lock overlaps and limiter excesses attributed to it
        self.shard = None     # the shard of a Redis fault (harness.py --shards)
        self.slack = 0        # a shard outage: jobs its shard's processors may
                              # fetch between the read of held and the fault

    def window(self):
        return self.start, (self.end or self.start)


class Run:
    __slots__ = ("jid", "pid", "start", "end", "cls", "args", "port", "shard")

    def __init__(self, jid, pid, start, cls, args, port=0):
        self.jid, self.pid, self.start, self.end, self.cls, self.args = jid, pid, start, None, cls, args
        self.port = port    # the Redis port its connection had (the ledger's)
        self.shard = None   # the shard of that port (check(), with shards)


def read_ledger(dir):
    """Every run in the ledger files of dir, by jid, in start order."""
    runs = collections.defaultdict(list)
    open_runs = {}
    lines = []
    for path in glob.glob(os.path.join(dir, "ledger.*")):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    lines.append(line.rstrip("\n").split(" ", 6))
    lines.sort(key=lambda p: float(p[3]))
    for p in lines:
        jid, pid, t = p[1], int(p[2]), float(p[3])
        if p[0] == "S":
            r = Run(jid, pid, t, p[5] if len(p) > 5 else "", p[6] if len(p) > 6 else "", int(p[4]))
            runs[jid].append(r)
            open_runs.setdefault((jid, pid), []).append(r)
        elif p[0] == "E" and open_runs.get((jid, pid)):
            # The run its tag names (the start of a run of the job in the
            # same process, which may run it twice at once), else the last
            # started there (an older ledger).
            mine = open_runs[(jid, pid)]
            at = [r for r in mine if len(p) > 4 and r.start == float(p[4])]
            r = at[0] if at else mine[-1]
            mine.remove(r)
            r.end = t
    return runs


def ended_jids(runs):
    return {j for j, rs in runs.items() if any(r.end is not None for r in rs)}


def read_ended(dir, offsets, ended):
    """Adds to ended the jids of the E lines the ledger files of dir gained
    since offsets (path -> bytes read, updated): a drain's poll reads each
    line once."""
    for path in glob.glob(os.path.join(dir, "ledger.*")):
        with open(path, "rb") as f:
            f.seek(offsets.get(path, 0))
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]
        offsets[path] = offsets.get(path, 0) + len(whole)
        for line in whole.split(b"\n"):
            if line.startswith(b"E "):
                ended.add(line.split(b" ", 2)[1].decode())


class State:
    def __init__(self):
        self.queued, self.schedule, self.retry, self.dead, self.working = set(), set(), set(), set(), set()


def _jids(payloads):
    out = set()
    for p in payloads or []:
        try:
            out.add(json.loads(p)["jid"])
        except (ValueError, KeyError, TypeError):
            pass
    return out


def read_redis(c):
    st = State()
    for q in c.cmd("KEYS", "queue:*") or []:
        st.queued |= _jids(c.cmd("LRANGE", q, 0, -1))
    for k in c.cmd("KEYS", "uniquejobs:working:*") or []:
        st.working |= _jids(c.cmd("LRANGE", k, 0, -1))
    st.schedule = _jids(c.cmd("ZRANGE", "schedule", 0, -1))
    st.retry = _jids(c.cmd("ZRANGE", "retry", 0, -1))
    st.dead = _jids(c.cmd("ZRANGE", "dead", 0, -1))
    st.queued |= st.schedule
    return st


class Report:
    def __init__(self):
        self.pushed = self.ended = self.starts = 0
        self.lost, self.unexpected, self.unattributed = [], [], []
        self.dead = self.retry = 0
        self.unreplicated = []  # lost with a failover: taken by a master, not by its replica
        self.faults = []
        self.overlaps_unattributed, self.limit_unattributed = [], []
        self.overlaps_attributed = self.limit_attributed = 0
        self.drained, self.seed, self.seconds, self.dir = True, 0, 0, ""
        self.sanitizer = []
        self.workload = []           # one line per check of check_workload()
        self.workload_problems = []  # what those checks found wrong
        self.wrong_shard = []        # runs outside the shard their job was pushed to
        self.no_connection = []      # runs whose handler had no Redis connection
        self.no_connection_fails = True  # whether those fail the run
        self.shards = collections.OrderedDict()  # shard -> shard_counts()

    def shard_counts(self, shard):
        """[pushed, ended, lost, extra runs explained, not explained] of shard."""
        return self.shards.setdefault(shard, [0, 0, 0, 0, 0])

    def over_bound(self):
        return [f for f in self.faults if f.dups > f.bound]

    def ok(self):
        return (self.drained and not self.lost and not self.unattributed and not self.over_bound()
                and not self.overlaps_unattributed and not self.limit_unattributed and not self.unexpected
                and not self.sanitizer and not self.workload_problems and not self.wrong_shard
                and not (self.no_connection and self.no_connection_fails))

    def text(self):
        out = ["chaos seed %d, %.0f s: %s" % (self.seed, self.seconds, "ok" if self.ok() else "FAILED"),
               "  pushed %d, ended %d, starts %d; lost %d%s; extra starts %d (%d not explained by a fault); "
               "dead %d, retry %d%s" % (self.pushed, self.ended, self.starts, len(self.lost),
                                        " (+%d pushes a failover's new master never had)" % len(self.unreplicated)
                                        if self.unreplicated else "",
                                        sum(f.dups for f in self.faults) + len(self.unattributed),
                                        len(self.unattributed), self.dead, self.retry,
                                        "" if self.drained else "; the queues did not drain"),
               "  runtime-locked runs overlapping: %d after a freeze of a holder or a failover, %d otherwise; "
               "limiter over its size: %d after a freeze or a failover, %d otherwise"
               % (self.overlaps_attributed, len(self.overlaps_unattributed), self.limit_attributed,
                  len(self.limit_unattributed)),
               ] + (["  handlers given no Redis connection (capstan_job_redis() NULL): %d%s"
                     % (len(self.no_connection), "" if self.no_connection_fails else
                        " (not failing the run: --report-no-connection)")]
                    if self.no_connection else []) + \
            ["  shard %s: pushed %d, ended %d, lost %d; extra starts %d (%d not explained by a fault)"
                    % (k, c[0], c[1], c[2], c[3] + c[4], c[4]) for k, c in self.shards.items()] + \
            (["  runs outside their job's shard: %d" % len(self.wrong_shard)] if self.shards else []) + \
            ["  " + x for x in self.workload] + fault_table(self.faults) + failover_lines(self.faults)
        for what, items in (("lost", self.lost), ("unexplained extra start", self.unattributed),
                            ("wrong shard", self.wrong_shard), ("no connection", self.no_connection),
                            ("unexpected", self.unexpected),
                            ("overlap", self.overlaps_unattributed), ("limiter", self.limit_unattributed),
                            ("sanitizer", self.sanitizer), ("workload", self.workload_problems)):
            for x in items[:10]:
                out.append("  %s: %s" % (what, x))
        return "\n".join(out)


def failover_window(f):
    """The runs a failover f may make run again: those that ended (or did
    not) at most ACK_LAG before it began, or before the replica's copy
    stopped (f.cut_at: a replica still catching up after a restart of the
    master lags it by seconds), and started at most SWITCH_LAG after it
    ended (f.end: the sentinels name the new master and the old one takes
    no more writes: killed, or made a replica, the workers staying on it
    until then). Their fetch or ack may have gone to the old master after
    its replica's copy stopped, or a worker drops their ack since they
    started on a master it has seen replaced."""
    cut_at = getattr(f, "cut_at", None)
    return min(f.start, cut_at if cut_at is not None else f.start) - ACK_LAG, (f.end or f.start) + SWITCH_LAG


def cut_times(faults, pushed, push_at):
    """Sets f.cut_at on each failover f whose cut (the old master's
    replication id and the last offset of it the new master had) is known:
    the time of the last push the harness made at or before that offset,
    when the replica's copy stopped, or None."""
    by_id = collections.defaultdict(list)
    for jid, (rid, off) in (push_at or {}).items():
        if jid in pushed:
            by_id[rid].append((off, pushed[jid][2]))
    for xs in by_id.values():
        xs.sort()
    for f in faults:
        cut = getattr(f, "cut", None)
        xs = by_id.get(cut[0], []) if f.kind in FAILOVERS and cut else []
        k = bisect.bisect_right(xs, (cut[1], float("inf"))) if xs else 0
        f.cut_at = max(t for _, t in xs[:k]) if k else None


def ack_gaps(faults):
    """Sets f.gaps on each failover f of faults: the faults that keep an
    ack from being written (OUTAGES, FREEZES), ended, by start:
    ([starts], [faults]), which _ack_from reads."""
    gs = sorted((g for g in faults if g.end is not None and (g.kind in OUTAGES or g.kind in FREEZES)),
                key=lambda g: g.start)
    gaps = ([g.start for g in gs], gs)
    for f in faults:
        if f.kind in FAILOVERS:
            f.gaps = gaps


def _ack_from(gaps, x):
    """When run x's ack could first be written: at its end, or, when the
    master was down, frozen or out of memory then, or x's process frozen or
    cut off (one outage running into the next), when that ended. gaps: as
    ack_gaps sets them. (No fault lasts 10 s.)"""
    starts, gs = gaps
    t = x.end
    while t is not None:
        later = [g.end for g in gs[bisect.bisect_left(starts, t - 10):bisect.bisect_right(starts, t)]
                 if t < g.end and (g.kind in OUTAGES or g.pid == x.pid)]
        if not later:
            break
        t = max(later)
    return t


def _in_failover(f, prev):
    """Whether run prev may run again through failover f: it falls in
    failover_window(f), and its job was one the new master had unfinished
    (queued, scheduled, in a working list, in the retry set) when the
    harness read it just after the promotion, or prev started between the
    promotion (seen by the harness up to ACK_LAG late), or the replica's
    copy stopping (f.cut_at: a fetch past it is not on the new master,
    which still has the job queued), and that read (it may have been run
    again and acked on the new master before), or in the SWITCH_LAG after
    the failover ended. (A run's ack counts from when it
    could be written, _ack_from: a Redis restart just before a failover
    holds acks back into it.) A job the new
    master had finished, or never had, cannot run again through it.
    Without a read of the new master (f.held None), every run of the
    window may."""
    lo, hi = failover_window(f)
    if not (prev.start <= hi and (prev.end is None or prev.end >= lo
                                   or (prev.end >= lo - 20 and _ack_from(getattr(f, "gaps", ((), ())), prev) >= lo))):
        return False
    if prev.cls == TICK_JOB:
        return True  # enqueued on the old master, and again by the new one's scheduler
    held, read_at = getattr(f, "held", None), getattr(f, "read_at", None)
    if held is None or read_at is None:
        return True
    end, cut_at = f.end or f.start, getattr(f, "cut_at", None)
    since = f.promoted - ACK_LAG if cut_at is None else min(f.promoted - ACK_LAG, cut_at)
    return (prev.jid in held or since <= prev.start <= read_at
            or end <= prev.start <= end + SWITCH_LAG)


def _fault_for(faults, prev, new):
    """The fault that explains run new of a job whose previous run was prev:
    the kill of prev's process after prev started; else a freeze or cut of
    prev's process (its jobs recovered by another) or of new's (a stale copy
    run after it came back) that began before new started and had not ended
    long before prev started, and whose process held the job; else a
    failover whose window prev falls in (_in_failover); else such a freeze
    that did not hold it. The latest of a kind is the one."""
    kills = [f for f in faults if f.kind in KILLS and f.pid == prev.pid
             and prev.start <= f.start <= new.start
             and (prev.end is None or prev.end > f.start or prev.jid in (f.held or ()))]
    if kills:
        return max(kills, key=lambda f: f.start)
    # A frozen or cut-off process starts no job it did not fetch before:
    # its own run of a job during the freeze was not made by the freeze.
    freezes = [f for f in faults if f.kind in FREEZES and f.pid in (prev.pid, new.pid)
               and f.start <= new.start and (f.end or new.start) >= prev.start - START_LAG
               and not (new.pid == f.pid and (f.end is None or new.start < f.end))]
    # Of those, one whose process held the job when it began is the cause;
    # a later freeze of a process that never held it only happened nearby.
    held = [f for f in freezes if prev.jid in (f.held or ())]
    if held:
        return max(held, key=lambda f: f.start)
    fos = [f for f in faults if f.kind in FAILOVERS and f.start <= new.start and _in_failover(f, prev)]
    if fos:
        return max(fos, key=lambda f: f.start)
    outages = [f for f in faults if _in_outage(f, prev, new)]
    if outages:
        return max(outages, key=lambda f: f.start)
    return max(freezes, key=lambda f: f.start) if freezes else None


def _in_outage(f, prev, new):
    """Whether shard outage f explains run new of a job after run prev:
    prev ran in f's shard, began before f did (it was in that shard's
    working lists then, f.held, or fetched between that read and the
    fault), or at most START_LAG after f ended (fetched before it, started
    late), and new began after f began. A run of another shard, or of a
    job fetched after the shard came back, is not f's."""
    if f.kind != SHARD_OUTAGE or prev.shard != f.shard or new.start < f.start:
        return False
    if prev.start > (f.end or new.start) + START_LAG:
        return False
    return f.held is None or prev.jid in f.held or prev.start <= f.start


def _unreplicated(faults, at):
    """The failover whose new master never had a push that the master
    took at at = (replication id, offset after it): past f.cut (the old
    master's replication id, and the last offset of it the new master had
    when promoted). Redis's asynchronous replication lost it, not capstan.
    None: no failover explains its loss."""
    if not at:
        return None
    for f in faults:
        cut = getattr(f, "cut", None)
        if f.kind in FAILOVERS and cut and cut[0] == at[0] and at[1] > cut[1]:
            return f
    return None


def lost_to_failover(faults, jid, pushed, push_at):
    """The failover whose new master never had the push of jid (None: no
    failover explains its loss): by its replication offset (_unreplicated),
    or, for a push by capstan's client (capstan push, a batch), whose offset
    the harness does not see, by its time alone: the old master may have
    taken it from ACK_LAG before the failover to its last write."""
    if push_at is None:
        return None
    at = push_at.get(jid)
    if at:
        return _unreplicated(faults, at)
    return next((f for f in faults if f.kind in FAILOVERS
                 and f.start - ACK_LAG <= pushed[jid][2] <= (f.end or f.start)), None)


def _failover_near(faults, xs):
    """A failover in whose split brain (_in_split_brain) one of the runs xs
    started: a lock or a limiter slot taken on the old master after its
    replica's copy stopped is not on the new one, which hands it out again.
    (Whether the new master had the job unfinished, as _in_failover asks,
    says nothing of the locks: two jobs fetched after the promotion, one
    from each master, take one lock twice.)"""
    for x in xs:
        f = _in_split_brain(faults, x.start)
        if f:
            return f
    return None


def _freeze_near(faults, pids, t0, t1):
    for f in faults:
        s, e = f.window()
        if f.kind in FREEZES and f.pid in pids and s <= t1 + 5 and e >= t0 - 5:
            return f
    return None


def check(pushed, tried, runs, state, faults, lock_classes=(), limits=None, concurrency=0, handed_back=(),
          push_at=None, shard_of=None, ports=None):
    """pushed: the jids Redis took (they must end, or be in a set); tried:
    those sent whose answer was lost (they may have been taken); handed_back:
    (jid, start) of the runs an iterable job's interruption put back in its
    queue (read_steps), whose next run is no extra run; push_at: jid ->
    (replication id, offset) of the master after it took the push (a
    Sentinel topology). shard_of: jid -> the shard it was pushed to, and
    ports: Redis port -> shard (harness.py --shards): every run of a job
    must be in its shard, and the locks and limiters are judged per shard."""
    r = Report()
    # capstan_job_redis() is never NULL in a handler (include/capstan/job.h):
    # the ledger writes port 0 when it was.
    r.no_connection = ["%s on %d at %.3f" % (x.jid, x.pid, x.start) for rs in runs.values() for x in rs
                       if x.port == 0]
    if ports:
        for rs in runs.values():
            for x in rs:
                x.shard = ports.get(x.port, "port %d" % x.port)
        for jid, shard in (shard_of or {}).items():
            for x in runs.get(jid, ()):
                if x.shard != shard and x.port:
                    r.wrong_shard.append("%s pushed to %s ran in %s on %d at %.3f"
                                         % (jid, shard, x.shard, x.pid, x.start))
    r.faults = faults
    r.pushed = len(pushed)
    r.dead, r.retry = len(state.dead), len(state.retry)
    present = state.queued | state.retry | state.dead | state.working
    ended = ended_jids(runs)
    r.ended = len(ended)
    kills = {f.pid: f.start for f in faults if f.kind in ("kill9_worker", "kill9_supervised")}
    # A killed process's started jobs whose acks were not written run again:
    # those running at the kill, and those in its working list just before
    # that had started there (finished, the ack riding a later round trip).
    # A frozen or cut-off one's whole working list may be taken by another
    # process, and the jobs it held may still run when it comes back.
    for f in faults:
        if f.kind in KILLS:
            mine = {x.jid for rs in runs.values() for x in rs if x.pid == f.pid and x.start <= f.start}
            running = {x.jid for rs in runs.values() for x in rs
                       if x.pid == f.pid and x.start <= f.start and (x.end is None or x.end > f.start)}
            f.bound = len(running | (mine & (f.held or set())))
    # A freeze's bound: its working list while it lasted (as the harness
    # read it: a one-way cut lets fetches through, and Redis moves a job
    # pushed meanwhile into the list of a processor blocked on an empty
    # queue), plus one job for each processor (one so moved between two
    # reads), plus what a freeze of the same process just before it held
    # (its dups may surface after this one).
    last = {}
    for f in sorted(faults, key=lambda f: f.start):
        if f.kind not in FREEZES:
            continue
        if f.held is None:
            f.bound = 10 ** 6
            continue
        held = set(f.held)
        prev = last.get(f.pid)
        if prev is not None and prev.held is not None and (prev.end or prev.start) >= f.start - 10:
            held |= prev.held
        f.held = held
        f.bound = len(held) + concurrency
        last[f.pid] = f
    # A failover's bound: each job with a run it may make run again
    # (_in_failover) runs once more.
    cut_times(faults, pushed, push_at)
    ack_gaps(faults)
    for f in faults:
        if f.kind in FAILOVERS:
            f.bound = len({x.jid for rs in runs.values() for x in rs if _in_failover(f, x)})
        elif f.kind == SHARD_OUTAGE:
            f.bound = 10 ** 6 if f.held is None else len(f.held) + f.slack
    for jid in pushed:
        if jid not in ended and jid not in present:
            f = lost_to_failover(faults, jid, pushed, push_at)
            if f:
                f.unreplicated = getattr(f, "unreplicated", 0) + 1
                r.unreplicated.append(jid)
            else:
                r.lost.append(jid)
                if ports:
                    r.shard_counts((shard_of or {}).get(jid))[2] += 1
    if ports:
        for shard in sorted(set(ports.values())):
            r.shard_counts(shard)
        for jid in pushed:
            c = r.shard_counts((shard_of or {}).get(jid))
            c[0] += 1
            c[1] += jid in ended
    for jid, rs in runs.items():
        r.starts += len(rs)
        if jid not in pushed and jid not in tried:
            r.unexpected.append(jid)
        for prev, new in zip(rs, rs[1:]):
            if (jid, prev.start) in handed_back:
                continue
            f = _fault_for(faults, prev, new)
            if f:
                f.dups += 1
            else:
                r.unattributed.append("%s ran on %d at %.3f and on %d at %.3f%s"
                                      % (jid, prev.pid, prev.start, new.pid, new.start,
                                         "" if new.shard is None else " (shard %s)" % new.shard))
            if ports:
                r.shard_counts(new.shard)[3 if f else 4] += 1
    # Runs of one runtime-locked digest (the lock's args: all of them) must
    # not overlap.
    def span(x):
        return x.start, (x.end if x.end is not None else kills.get(x.pid, x.start))
    by_digest = collections.defaultdict(list)
    for rs in runs.values():
        for x in rs:
            if x.cls in lock_classes:
                try:
                    key = json.dumps([x.cls, json.loads(x.args)[1]])  # lock_args: [1]
                except (ValueError, IndexError):
                    key = x.args
                if x.shard is not None:  # a lock is one shard's
                    key = "%s in %s" % (key, x.shard)
                by_digest[key].append(x)
    for key, xs in by_digest.items():
        xs.sort(key=lambda x: x.start)
        for a, b in zip(xs, xs[1:]):
            a0, a1 = span(a)
            b0, _ = span(b)
            if b0 < a1 - 1e-4:
                f = _freeze_near(faults, (a.pid, b.pid), a0, a1) or _failover_near(faults, (a, b))
                if f:
                    f.overlaps += 1
                    r.overlaps_attributed += 1
                else:
                    r.overlaps_unattributed.append("%s: %s on %d and %s on %d" % (key, a.jid, a.pid, b.jid, b.pid))
    for (cls, size), shard in [(c, s) for c in (limits or {}).items()
                               for s in sorted({x.shard for rs in runs.values() for x in rs}, key=str)]:
        # A limiter allows its size per shard.
        edges = []
        for rs in runs.values():
            for x in rs:
                if x.cls == cls and x.shard == shard:
                    s, e = span(x)
                    edges += [(s, 1, x), (e, -1, x)]
        edges.sort(key=lambda e: (e[0], e[1]))
        held = set()
        for t, d, x in edges:
            if d > 0:
                held.add(x)
                if len(held) > size:
                    f = _freeze_near(faults, {y.pid for y in held}, t, t) or _failover_near(faults, held)
                    if f:
                        f.overlaps += 1
                        r.limit_attributed += 1
                    else:
                        r.limit_unattributed.append("%d %s holders at %.3f" % (len(held), cls, t))
            else:
                held.discard(x)
    return r


def fault_table(faults):
    """Lines of a table per fault kind: injected, extra runs, their bound
    (summed over the faults whose bound is known: a freeze while Redis did
    not answer has none), faults over their bound."""
    by = collections.OrderedDict()
    for f in faults:
        e = by.setdefault(f.kind, [0, 0, 0, 0])
        e[0] += 1
        e[1] += f.dups
        e[2] += f.bound if f.bound < 10 ** 6 else 0
        e[3] += f.dups > f.bound
    out = ["  %-18s %8s %12s %14s %10s" % ("fault", "injected", "extra runs", "bound (sum)", "over it")]
    for k, e in by.items():
        out.append("  %-18s %8d %12d %14d %10d" % (k, e[0], e[1], e[2], e[3]))
    return out


def failover_lines(faults):
    """A line per failover: when the sentinels named the new master and
    when the old one took its last write (seconds after the fault), its
    extra runs against its bound, the pushes its new master never had."""
    out = []
    for f in faults:
        if f.kind in FAILOVERS:
            rel = lambda t: "-" if t is None else "%.1f s" % (t - f.start)  # noqa: E731
            out.append("  %s at %s: new master named after %s, old master's last write after %s; "
                       "%d extra runs (bound %d); %d pushes past the cut"
                       % (f.kind, time.strftime("%H:%M:%S", time.gmtime(f.start)), rel(getattr(f, "promoted", None)),
                          rel(getattr(f, "demoted", None)), f.dups, f.bound, getattr(f, "unreplicated", 0)))
    return out


def summary(reports):
    """One table over several runs, per fault kind."""
    out = ["chaos: %d runs (seeds %s), %d jobs pushed, %d lost, %d extra starts not explained, %d over a bound"
           % (len(reports), ",".join(str(r.seed) for r in reports), sum(r.pushed for r in reports),
              sum(len(r.lost) for r in reports), sum(len(r.unattributed) for r in reports),
              sum(len(r.over_bound()) for r in reports))]
    unrep = sum(len(r.unreplicated) for r in reports)
    if unrep:
        out[0] += "; %d pushes a failover's new master never had" % unrep
    return "\n".join(out + fault_table([f for r in reports for f in r.faults]))


# ---- batches and periodic ticks ---------------------------------------------
# Jobs that capstan, not the harness, enqueues: a batch's callbacks, a
# periodic schedule's ticks, and the jobs of a batch whose push went
# unanswered. Their ledger lines carry [enqueued_at, ...] as args (see
# tests/chaos/ledger.c), so two enqueues of one jid (a callback's and a
# tick's jid are derived from the batch and event, or the schedule and the
# tick) are told apart from a job recovered and run again, which keeps its
# enqueued_at.

BATCH_JOB, BATCH_CALLBACK, TICK_JOB = "LedgerBatchJob", "LedgerBatchCallback", "LedgerTickJob"


class Batch:
    """One batch the harness asked tests/chaos/batch.c to make."""

    def __init__(self, tag):
        self.tag, self.bid, self.jids = tag, None, []
        self.pushed = False     # its jobs are in (the maker printed their jids)
        self.committed = False  # the maker's commit returned


def _args(x):
    try:
        return json.loads(x.args)
    except ValueError:
        return None


def _callback(args):
    """(tag, bid, event, enqueued_at) of a callback's ledger args."""
    try:
        enq, (status, opts) = args
        return opts["tag"], status["bid"], status["event"], enq
    except (TypeError, ValueError, KeyError):
        return None


def read_enqueued(c):
    """The callbacks and ticks still in Redis at the end (in a queue, a
    working list, the schedule, retry or dead set): (class, jid, ledger-like
    args) each."""
    payloads = []
    for k in (c.cmd("KEYS", "queue:*") or []) + (c.cmd("KEYS", "uniquejobs:working:*") or []):
        payloads += c.cmd("LRANGE", k, 0, -1) or []
    for z in ("schedule", "retry", "dead"):
        payloads += c.cmd("ZRANGE", z, 0, -1) or []
    out = []
    for p in payloads:
        try:
            j = json.loads(p)
            if j["class"] == TICK_JOB:
                out.append((TICK_JOB, j["jid"], [j["enqueued_at"], j["periodic_at"]]))
            elif j["class"] == BATCH_CALLBACK:
                out.append((BATCH_CALLBACK, j["jid"], [j["enqueued_at"], j["args"]]))
        except (ValueError, KeyError, TypeError):
            pass
    return out


def workload_jids(runs, batches, lock_pushes=()):
    """The jids in the ledger that capstan enqueued for the harness (see
    above): check() must not call them unexpected. A batch job is the
    harness's when its tag names a batch it asked for; an until-locked job
    when its push's answer never came (its args' seq says which)."""
    out = set()
    unknown = {p.args[2] for p in lock_pushes if p.status != "accepted"}
    for jid, rs in runs.items():
        x = rs[0]
        a = _args(x)
        if x.cls in UNTIL_LOCKS and isinstance(a, list) and len(a) > 2 and a[2] in unknown:
            out.add(jid)
        elif x.cls == TICK_JOB:
            out.add(jid)
        elif x.cls == BATCH_CALLBACK and _callback(a) and _callback(a)[0] in batches:
            out.add(jid)
        elif x.cls == BATCH_JOB and isinstance(a, list) and len(a) > 1 and a[1] in batches:
            out.add(jid)
    return out


def check_workload(r, runs, state, enqueued, batches, tick_every=0, steps=None, faults=(), lock_pushes=None,
                   windows=None, push_at=None):
    """Adds to report r the checks of the batches, the periodic ticks, the
    iterable jobs' steps (read_steps), the until-locks' pushes and the
    window limiters ({class: (count, interval s)}). push_at: as check()'s."""
    if lock_pushes is not None:
        _check_until_locks(r, runs, lock_pushes, faults)
    for cls, (count, interval) in (windows or {}).items():
        _check_window(r, runs, faults, cls, count, interval)
    if batches:
        _check_batches(r, runs, state, enqueued, batches, faults)
    if tick_every:
        _check_ticks(r, runs, enqueued, tick_every, faults)
    if steps is not None:
        _check_steps(r, runs, state, steps, faults, push_at)


ITER_JOB = "LedgerIterJob"


def read_steps(dir, runs):
    """The iterable jobs' steps in the ledger files of dir, jid -> [(time,
    run, index)] in time order (run: of runs, read_ledger's), and the runs
    that their interruption handed back, {(jid, start)}."""
    steps, back = collections.defaultdict(list), set()
    for path in glob.glob(os.path.join(dir, "ledger.*")):
        with open(path) as f:
            for line in f:
                p = line.split()
                if not line.endswith("\n") or len(p) < 4 or p[0] not in ("I", "H"):
                    continue
                run = _run_of(runs.get(p[1], ()), int(p[2]), float(p[3]), p[5 if p[0] == "I" else 4:][:1])
                if p[0] == "I" and len(p) >= 5:
                    steps[p[1]].append((float(p[3]), run, int(p[4])))
                elif p[0] == "H" and run:
                    back.add((p[1], run.start))
    for s in steps.values():
        s.sort(key=lambda x: x[0])
    return steps, back


def _run_of(rs, pid, t, tag):
    """The run of rs on process pid a step line at t belongs to: the one
    whose start its tag ([the start's epoch], or [] in an older ledger)
    names, else the latest started by t."""
    if tag:
        start = float(tag[0])
        for x in rs:
            if x.pid == pid and x.start == start:
                return x
    return max((x for x in rs if x.pid == pid and x.start <= t), key=lambda x: x.start, default=None)


def _step_fault(faults, prev, new):
    """The fault that lets run new take again a step run prev took: one
    that explains new (_fault_for), except a kill of the supervisor: its
    worker stops as on TERM, and an iterating run stopped so saves its
    cursor before it goes back to the queue."""
    f = _fault_for(faults, prev, new)
    return f if f and f.kind != "kill9_supervisor" else None


def _stale_between(faults, rs, a, b):
    """A run of rs started before a and still running after a began (its
    process frozen or cut off meanwhile, its job given to a) that saved
    its older cursor when it came back, after a saved a later one: b then
    resumes from the stale run's cursor."""
    for x in rs:
        if x is a or x is b or x.start >= a.start or (x.end is not None and x.end <= a.start):
            continue
        if any(f.kind in FREEZES and f.pid == x.pid and f.start <= a.start and (f.end or a.start) >= x.start
               for f in faults):
            return True
    return False


def _successive(rs, a, b):
    """The pairs of successive runs of rs (in start order) from the earlier
    to start of runs a and b to the other: a stale run (its process frozen
    or cut off) may take a step after the run that replaced it took it."""
    lo, hi = sorted((rs.index(a), rs.index(b)))
    return zip(rs[lo:hi], rs[lo + 1:hi + 1])


def _check_steps(r, runs, state, steps, faults, push_at=None):
    """Every step of every iterable job that finished was taken; a step
    taken twice only by two runs of the job with a kill -9, freeze or
    partition of the process of one run between them (_step_fault): a run
    that resumes takes up at the last saved cursor, which a killed or
    frozen run saved up to 5 s before it stopped."""
    unfinished = state.queued | state.working | state.retry | state.dead
    jobs = nsteps = missing = after = after_failover = other = 0
    for jid, rs in runs.items():
        if rs[0].cls != ITER_JOB:
            continue
        jobs += 1
        a = _args(rs[0])
        n = a[1] if isinstance(a, list) and len(a) > 1 and isinstance(a[1], int) else 0
        taken = collections.defaultdict(list)  # index -> runs that took it
        for _, run, i in steps.get(jid, []):
            taken[i].append(run)
            nsteps += 1
        if jid not in unfinished and not _unreplicated(faults, (push_at or {}).get(jid)):
            # (A job pushed past a failover's cut lived on the old master
            # only: its requeue with its cursor went with it.)
            gone = [i for i in range(n) if i not in taken]
            missing += len(gone)
            if gone:
                r.workload_problems.append("iterable %s: step%s %s of %d never taken"
                                           % (jid, "s" if len(gone) > 1 else "", ",".join(map(str, gone[:10])), n))
        for i, by in sorted(taken.items()):
            for ra, rb in zip(by, by[1:]):
                if ra is not None and rb is not None and ra is not rb and (any(
                        _step_fault(faults, p, q) for p, q in _successive(rs, ra, rb))
                        or _stale_between(faults, rs, ra, rb)):
                    after += 1
                elif ra is not None and rb is not None and ra is not rb and (
                        _in_split_brain(faults, ra.start) or _in_split_brain(faults, rb.start)):
                    # The cursor a run saved on the old master after the
                    # cut is not on the new one, whose copy resumes before.
                    after_failover += 1
                else:
                    other += 1
                    r.workload_problems.append("iterable %s: step %d taken again by %s without a fault between"
                                               % (jid, i, "the same run" if ra is rb else "another run"))
    r.workload.append("iterable jobs: %d, %d steps taken, %d never taken, %d taken again after a fault "
                      "of their process, %d after a failover, %d otherwise"
                      % (jobs, nsteps, missing, after, after_failover, other))


def _check_batches(r, runs, state, enqueued, batches, faults=()):
    """Every committed batch whose jobs all ended, none failed, fires its
    complete and its success callback each exactly once, not before its last
    job's first end; no batch fires one twice (two enqueues of the callback's
    jid), committed or not."""
    fired = collections.defaultdict(set)   # (tag, event) -> {enqueued_at}
    first = {}                             # (tag, event) -> first start
    bids = {}
    seen = [(x.jid, _args(x), x.start) for rs in runs.values() for x in rs if x.cls == BATCH_CALLBACK]
    seen += [(jid, a, None) for cls, jid, a in enqueued if cls == BATCH_CALLBACK]
    for jid, a, t in seen:
        cb = _callback(a)
        if not cb or cb[0] not in batches:
            r.workload_problems.append("batch callback %s for no batch the harness made: %s" % (jid, a))
            continue
        tag, bid, event, enq = cb
        fired[(tag, event)].add(enq)
        bids[tag] = bid
        if t is not None:
            first[(tag, event)] = min(t, first.get((tag, event), t))
    ends = collections.defaultdict(list)  # jid -> its runs' ends
    members = collections.defaultdict(set)
    for jid, rs in runs.items():
        for x in rs:
            if x.cls == BATCH_JOB:
                a = _args(x)
                if isinstance(a, list) and len(a) > 1:
                    members[a[1]].add(jid)
                if x.end is not None:
                    ends[jid].append(x.end)
    missing = missing_failover = twice = twice_failover = early = judged = 0
    for tag, b in sorted(batches.items()):
        jids = set(b.jids) if b.pushed else members[tag]
        if b.bid and tag in bids and bids[tag] != b.bid:
            r.workload_problems.append("batch %s: callbacks name bid %s, not %s" % (tag, bids[tag], b.bid))
        for event in ("complete", "success"):
            n = len(fired[(tag, event)])
            if n > 1 and all(_in_split_brain(faults, t) for t in sorted(fired[(tag, event)])[1:]):
                # Enqueued again in a failover: the old master's record
                # that it fired is not on the new one, or both fire it.
                twice_failover += 1
            elif n > 1:
                twice += 1
                r.workload_problems.append("batch %s (%s): %s fired %d times" % (tag, b.bid, event, n))
        done = jids and all(ends.get(j) for j in jids)
        failed = jids & (state.retry | state.dead)
        if not (b.committed and done and not failed):
            continue
        judged += 1
        last_end = max(min(ends[j]) for j in jids)
        for event in ("complete", "success"):
            if not fired[(tag, event)] and _in_split_brain(faults, last_end):
                # The last job's ack, which fires the callbacks, went to an
                # old master past its replica's copy: lost with its writes.
                missing_failover += 1
            elif not fired[(tag, event)]:
                missing += 1
                r.workload_problems.append("batch %s (%s): %s never fired" % (tag, b.bid, event))
            elif first.get((tag, event), last_end) < last_end:
                early += 1
                r.workload_problems.append("batch %s (%s): %s ran at %.3f, before its last job ended at %.3f"
                                           % (tag, b.bid, event, first[(tag, event)], last_end))
    r.workload.append("batch callbacks: %d batches (%d committed with every job done), %d missing "
                      "(+%d lost in a failover: the last job ended in its split brain), "
                      "%d twice (+%d enqueued again in a failover), %d before their jobs ended"
                      % (len(batches), judged, missing, missing_failover, twice, twice_failover, early))


def _in_split_brain(faults, t):
    """A failover during which two masters may each have taken writes at
    t: from ACK_LAG before it to SWITCH_LAG after the old master's last
    write (failover_window)."""
    for f in faults:
        if f.kind in FAILOVERS:
            lo, hi = failover_window(f)
            if lo <= t <= hi:
                return f
    return None


def _check_ticks(r, runs, enqueued, every, faults=()):
    """Each tick of the periodic schedule (every `every` seconds, missed:
    all) from the first seen to the last seen is enqueued exactly once:
    one enqueued_at per tick, whatever ran it how often. During a failover
    (_in_split_brain) a tick may be enqueued by both masters' schedulers,
    or only on the old master past its replica's copy and lost with it
    (a tick due earlier too, when a Redis fault held it back until then):
    counted apart."""
    enq = collections.defaultdict(set)
    seen = [_args(x) for rs in runs.values() for x in rs if x.cls == TICK_JOB]
    seen += [a for cls, _, a in enqueued if cls == TICK_JOB]
    for a in seen:
        try:
            enq[int(a[1])].add(a[0])
        except (TypeError, ValueError, IndexError):
            r.workload_problems.append("tick with no periodic_at: %s" % (a,))
    if not enq:
        r.workload_problems.append("periodic: no tick enqueued")
        r.workload.append("periodic ticks: none")
        return
    lo, hi = min(enq), max(enq)
    def lost_in_failover(t):
        """Tick t missing, and either due in a failover's split brain, or
        due before one with no tick enqueued from t to the window's start:
        with missed: all, t was enqueued at the first offering that went
        through after it (a Redis fault may hold that back for seconds),
        and that offering fell in the split brain."""
        if _in_split_brain(faults, t):
            return True
        for f in faults:
            if f.kind in FAILOVERS:
                w0, _ = failover_window(f)
                if t <= w0 <= t + 10 and not any(enq.get(u) for u in range(t, int(w0) + 1)):
                    return True
        return False
    gone = [t for t in range(lo, hi + 1, every) if not enq.get(t)]
    missed = [t for t in gone if not lost_in_failover(t)]
    failover_missed = len(gone) - len(missed)
    twice = [t for t in sorted(enq) if len(enq[t]) > 1 and not _in_split_brain(faults, t)]
    failover_twice = sum(1 for t in enq if len(enq[t]) > 1 and _in_split_brain(faults, t))
    for t in missed[:10]:
        r.workload_problems.append("periodic tick %d never enqueued" % t)
    for t in twice[:10]:
        r.workload_problems.append("periodic tick %d enqueued %d times" % (t, len(enq[t])))
    r.workload.append("periodic ticks: %d from the first to the last, %d missed, %d twice%s%s"
                      % ((hi - lo) // every + 1, len(missed), len(twice),
                         " (+%d twice during a failover: each master's scheduler enqueues it)" % failover_twice
                         if failover_twice else "",
                         " (+%d missed during a failover: enqueued on the old master past its replica's copy)"
                         % failover_missed if failover_missed else ""))


# ---- until-locks --------------------------------------------------------------
# Classes whose lock `capstan push` takes at push (lock_args: [1], the key),
# each pushed with args [ms, key, seq].
UNTIL_LOCKS = {"LedgerUntilExecutedJob": "until_executed", "LedgerUntilExpiredJob": "until_expired",
               "LedgerUntilWhileJob": "until_and_while_executing"}
UNTIL_EXPIRED_TTL = 1


class LockPush:
    """One `capstan push` of an until-locked job: sent before its lock was
    asked for, replied after its answer (so a lock taken by the push was
    taken between the two)."""

    def __init__(self, cls, args):
        self.cls, self.args = cls, args
        self.sent = self.replied = None
        self.status = None   # accepted, refused (the lock was held), unknown
        self.jid, self.proc = None, None


def _push_in_failover(faults, p):
    """A failover in whose window push p was made: a lock it took on the
    old master after its replica's copy stopped is not on the new one,
    which hands it out again."""
    for f in faults:
        if f.kind in FAILOVERS:
            lo, hi = failover_window(f)
            if p.sent <= hi and p.replied >= lo:
                return f
    return None


def _check_until_locks(r, runs, pushes, faults=()):
    """until_executed: the lock goes with the job's successful ack (after
    its run's end line), so a push of the key that takes it comes after the
    end of the job that held it before: of two accepted jobs of a key, the
    later to start was accepted after the earlier one's first end.
    until_expired: a lock lasts its ttl whatever the job does, so two
    accepted pushes of a key took it at least ttl apart: from the first
    send to the last reply of the two is at least ttl. (until_and_while_executing's
    runtime half is check()'s lock overlap rule; until_executing's release,
    as its job starts, is not in the ledger: not judged here.)"""
    first = {}
    for jid, rs in runs.items():
        first[jid] = (min(x.start for x in rs), min((x.end for x in rs if x.end is not None), default=None))
    by = collections.defaultdict(list)
    counts = collections.Counter()
    for p in pushes:
        counts[p.status] += 1
        if p.status == "accepted":
            by[(p.cls, p.args[1])].append(p)
    bad = excused = 0
    for (cls, key), ps in sorted(by.items()):
        if UNTIL_LOCKS[cls] == "until_executed":
            ran = sorted((first[p.jid][0], p) for p in ps if p.jid in first)
            for (_, a), (_, b) in zip(ran, ran[1:]):
                end = first[a.jid][1]
                if (end is None or b.replied <= end) and (_push_in_failover(faults, a)
                                                          or _push_in_failover(faults, b)):
                    excused += 1
                elif end is None or b.replied <= end:
                    bad += 1
                    r.workload_problems.append(
                        "%s %s: %s accepted at %.3f before %s (which ran first) ended%s"
                        % (cls, key, b.jid, b.replied, a.jid, "" if end is None else " at %.3f" % end))
        elif UNTIL_LOCKS[cls] == "until_expired":
            for i, a in enumerate(ps):
                for b in ps[i + 1:]:
                    if max(a.replied, b.replied) - min(a.sent, b.sent) >= UNTIL_EXPIRED_TTL:
                        continue
                    if _push_in_failover(faults, a) or _push_in_failover(faults, b):
                        excused += 1
                    else:
                        bad += 1
                        r.workload_problems.append("%s %s: %s and %s both took the lock within %.3f s (ttl %d s)"
                                                   % (cls, key, a.jid, b.jid, max(a.replied, b.replied)
                                                      - min(a.sent, b.sent), UNTIL_EXPIRED_TTL))
    r.workload.append("until-locks: %d pushes, %d accepted, %d refused by the lock, %d unanswered; "
                      "%d taken while held (+%d next to a failover: a lock the old master took after "
                      "its replica's copy stopped is not on the new one)"
                      % (len(pushes), counts["accepted"], counts["refused"],
                         len(pushes) - counts["accepted"] - counts["refused"], bad, excused))


# ---- window limiters ------------------------------------------------------------
# Seconds from a window limiter's grant (lua/limit_acquire.lua, on the Redis
# clock of this same host) to its job's start line: the limiter middleware
# returning into the handler. A start this close to a window's beginning may
# have been granted at the end of the window before.
LIMIT_LAG = 0.05


def _check_window(r, runs, faults, cls, count, interval):
    """No more starts of cls in any calendar window of interval s than
    count: each start (a recovered copy's too) took a grant of its own. A
    start within LIMIT_LAG of its window's beginning counts in the window
    before when that one had a grant to spare; a window still over is
    forgiven only next to a freeze or partition of one of its starters'
    processes (a stale copy, granted before the freeze, runs when it
    wakes)."""
    by = collections.defaultdict(list)
    for rs in runs.values():
        for x in rs:
            if x.cls == cls:  # a limiter's windows are one shard's
                by[(str(x.shard), int(x.start // interval))].append(x)
    spare_prev, prev_w, prev_sw = 0, None, None
    over = attributed = 0
    for sw in sorted(by):
        xs, w = by[sw], sw[1]
        if prev_w is not None and sw[0] != prev_sw[0]:
            prev_w = None
        prev_sw = sw
        early = sum(1 for x in xs if x.start - w * interval < LIMIT_LAG)
        # A window before with no start at all had every grant to spare.
        moved = min(early, spare_prev if prev_w == w - 1 else count)
        n = len(xs) - moved
        if n > count:
            f = _freeze_near(faults, {x.pid for x in xs}, w * interval, (w + 1) * interval) \
                or _failover_near(faults, xs)
            if f:
                f.overlaps += 1
                attributed += 1
            else:
                over += 1
                r.workload_problems.append("%s: %d starts in the window at %.0f (limit %d per %g s)"
                                           % (cls, n, w * interval, count, interval))
        spare_prev, prev_w = max(0, count - n), w
    r.workload.append("window limiter %s (%d per %g s): %d starts in %d windows, %d over it next to a freeze, "
                      "%d otherwise" % (cls, count, interval, sum(len(v) for v in by.values()), len(by),
                                        attributed, over))
