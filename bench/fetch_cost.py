#!/usr/bin/env python3
"""Redis's instructions a job for one way of fetching, counted by callgrind.

usage: bench/fetch_cost.py WAY K [JOBS]

A private redis-server runs under valgrind --tool=callgrind. Each round
pushes K jobs into queue:default and moves them into a working list by WAY,
then deletes the working list:
  fetch   lua/fetch.lua asked for K jobs, no lock check (a plain sweep)
  lmove   TIME and K LMOVEs, pipelined (no Lua)
The same rounds without the move (the queue deleted instead) are counted
too; the difference over the JOBS (6,400) jobs is what the fetch costs.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time
import random

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from acks_cost import Conn, WORKING, payload, script  # noqa: E402

QUEUE = 'queue:default'


def count(way, k, jobs):
    """Instructions redis-server ran from its start to its shutdown."""
    tmp = tempfile.mkdtemp(prefix='capstan-fetch.')
    with socket.socket() as probe:  # a free port: never a Redis already running
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    out = tmp + '/cg.out'
    vg = subprocess.Popen(['valgrind', '--tool=callgrind', '--callgrind-out-file=' + out,
                           'redis-server', '--port', str(port), '--save', '',
                           '--appendonly', 'no', '--dir', tmp],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if vg.poll() is not None:
            sys.exit('redis-server under valgrind exited')
        try:
            c = Conn(port)
            c.cmd('PING')
            break
        except (OSError, RuntimeError):
            time.sleep(0.1)
    else:
        vg.kill()
        sys.exit('redis-server under valgrind did not start')
    random.seed(1)
    sha = c.cmd('SCRIPT', 'LOAD', script('fetch')) if way == 'fetch' else None
    for r in range(jobs // k):
        c.cmd('LPUSH', QUEUE, *[payload(r * k + i) for i in range(k)])
        if way == 'fetch':
            c.cmd('EVALSHA', sha, 2, QUEUE, WORKING, str(k), '0')
        elif way == 'lmove':
            c.pipe([('TIME',)] + [('LMOVE', QUEUE, WORKING, 'RIGHT', 'LEFT')] * k)
        else:
            c.cmd('DEL', QUEUE)
        c.cmd('DEL', WORKING)
    try:
        c.cmd('SHUTDOWN', 'NOSAVE')
    except (OSError, RuntimeError):
        pass
    vg.wait()
    text = subprocess.check_output(['callgrind_annotate', out], stderr=subprocess.DEVNULL).decode()
    for line in text.splitlines():
        if 'PROGRAM TOTALS' in line:
            return int(line.split()[0].replace(',', ''))
    sys.exit('no totals in ' + out)


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ('fetch', 'lmove'):
        sys.exit(__doc__)
    way, k = sys.argv[1], int(sys.argv[2])
    jobs = int(sys.argv[3]) if len(sys.argv) == 4 else 6400
    jobs -= jobs % k
    total, base = count(way, k, jobs), count('none', k, jobs)
    print('%s K=%d: %.1fk instructions a job' % (way, k, (total - base) / jobs / 1000))


if __name__ == '__main__':
    main()
