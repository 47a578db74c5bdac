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
import sys
import random

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from acks_cost import WORKING, callgrind_redis, callgrind_total, payload, script  # noqa: E402

QUEUE = 'queue:default'


def count(way, k, jobs):
    """Instructions redis-server ran from its start to its shutdown."""
    vg, c, out = callgrind_redis('fetch')
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
    return callgrind_total(vg, c, out)


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
