#!/usr/bin/env python3
"""bench/rolling_restart.py: a deploy in the middle of a drain, measured.

Pushes N jobs that each take MS milliseconds (tests/chaos/ledger.c's
LedgerJob, which writes every start and end to a local file per process),
starts `capstan run --processes P -c C` on them, sends SIGHUP (the rolling
restart a deploy does: each worker replaced by one exec'd from the binary on
disk, the new one ready before the old one goes quiet) once a third of the
jobs ran, and prints: jobs lost, jobs started twice, and the longest gap
between two job starts around the restart. Numbers, not pass/fail.

    bench/rolling_restart.py [--jobs 50000] [--ms 5] [--processes 2] [--concurrency 10]
                             [--build build]
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "chaos"))
import checker  # noqa: E402
from harness import Redis, free_port  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=50000)
    p.add_argument("--ms", type=int, default=5)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--build", default="build")
    a = p.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = a.build if os.path.isabs(a.build) else os.path.join(root, a.build)
    capstan, plugin = os.path.join(build, "capstan"), os.path.join(build, "tests", "libcapstan-ledger.so")
    for f in (capstan, plugin):
        if not os.path.exists(f):
            raise SystemExit("rolling_restart: %s not built (ninja -C %s)" % (f, build))
    tmp = tempfile.mkdtemp(prefix="capstan-hup.")
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    worker = None
    try:
        c = Redis("127.0.0.1", port, 5)
        for _ in range(100):
            try:
                c.cmd("PING")
                break
            except OSError:
                time.sleep(0.05)
        jids, now = [], time.time()
        for base in range(0, a.jobs, 1000):
            cmds = []
            for i in range(base, min(base + 1000, a.jobs)):
                jid = uuid.uuid4().hex[:24]
                jids.append(jid)
                cmds.append(["LPUSH", "queue:hup",
                             '{"class":"LedgerJob","args":[%d,%d],"queue":"hup","retry":true,"jid":"%s",'
                             '"created_at":%.6f,"enqueued_at":%.6f}' % (a.ms, i, jid, now, now)])
            c.pipeline(cmds)
        log = open(os.path.join(tmp, "capstan.log"), "w")
        worker = subprocess.Popen([capstan, "run", "-r", plugin, "-q", "hup", "-c", str(a.concurrency),
                                   "--processes", str(a.processes), "--redis-url",
                                   "redis://127.0.0.1:%d/0" % port],
                                  stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, CAPSTAN_LEDGER_DIR=tmp))
        t0 = time.time()
        while c.cmd("LLEN", "queue:hup") > a.jobs * 2 // 3 and time.time() - t0 < 120:
            time.sleep(0.01)
        hup_at = time.time()
        worker.send_signal(signal.SIGHUP)
        while time.time() - t0 < 300:
            runs = checker.read_ledger(tmp)
            if len(checker.ended_jids(runs)) >= a.jobs and c.cmd("LLEN", "queue:hup") == 0:
                break
            time.sleep(0.2)
        done_at = time.time()
        runs = checker.read_ledger(tmp)
        starts = sorted(r.start for rs in runs.values() for r in rs)
        around = [t for t in starts if hup_at - 1 <= t <= hup_at + 10]
        gaps = [(b - a_, a_) for a_, b in zip(around, around[1:])]
        gap, at = max(gaps) if gaps else (0, hup_at)
        ended = checker.ended_jids(runs)
        twice = sum(1 for rs in runs.values() if len(rs) > 1)
        lost = sum(1 for j in jids if j not in ended)
        pids = sorted({r.pid for rs in runs.values() for r in rs})
        print("rolling restart: %d jobs of %d ms, processes %d x concurrency %d; SIGHUP after %.2f s"
              % (a.jobs, a.ms, a.processes, a.concurrency, hup_at - t0))
        print("  lost %d, started twice %d, worker processes that ran jobs %d, drained in %.2f s"
              % (lost, twice, len(pids), done_at - t0))
        print("  longest gap between two job starts from 1 s before the HUP to 10 s after: %.1f ms "
              "(%.2f s after the HUP)" % (gap * 1000, at - hup_at))
        return 0 if lost == 0 and twice == 0 else 1
    finally:
        if worker and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        redis.kill()
        redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
