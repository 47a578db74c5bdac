#!/usr/bin/env python3
"""Redis's instructions a job for one way of acking, counted by callgrind.

usage: bench/acks_cost.py WAY K P [JOBS]

A private redis-server runs under valgrind --tool=callgrind. Its working
list holds P older jobs (never acked) at the tail; each round pushes K new
jobs at the head, as a fetch leaves them, and acks them in one round trip,
oldest first, by WAY:
  acks    lua/acks.lua, groups of 4 (no lock, no batch)
  plain   lua/acks_plain.lua
  lrem    one LREM working -1 PAYLOAD a job, pipelined
The same rounds without the acks are counted too; the difference over the
JOBS (6,400) jobs is what the acks cost. Instructions do not depend on what
else the machine runs, as times on a shared machine do.
"""
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKING = 'uniquejobs:working:bench:1:abc'


def enc(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(('127.0.0.1', port))
        self.f = self.s.makefile('rb')

    def reply(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b'-':
            raise RuntimeError(rest.decode())
        if kind in b'+:':
            return rest
        if kind == b'$':
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        return [self.reply() for _ in range(int(rest))]

    def pipe(self, cmds):
        self.s.sendall(b''.join(enc(*c) for c in cmds))
        return [self.reply() for _ in cmds]

    def cmd(self, *args):
        return self.pipe([args])[0]


def script(name):
    return subprocess.check_output(['python3', ROOT + '/tools/embed_lua.py', '--print',
                                    ROOT + '/lua', name])


def payload(i):
    return ('{"retry":true,"queue":"default","args":[%d],"class":"NoopJob","jid":"%024x",'
            '"created_at":1796171140.294788,"enqueued_at":1796171140.294788}'
            % (i, random.getrandbits(96)))


def callgrind_redis(tag):
    """A redis-server under callgrind on a free port (never a Redis already
    running), with a connection to it: (process, connection, output file)."""
    tmp = tempfile.mkdtemp(prefix='capstan-%s.' % tag)
    with socket.socket() as probe:
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
            return vg, c, out
        except (OSError, RuntimeError):
            time.sleep(0.1)
    vg.kill()
    sys.exit('redis-server under valgrind did not start')


def callgrind_total(vg, c, out):
    """Shuts the server down: the instructions it ran from start to end."""
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


def count(way, k, p, jobs):
    """Instructions redis-server ran from its start to its shutdown."""
    vg, c, out = callgrind_redis('acks')
    random.seed(1)
    name = {'acks': 'acks', 'plain': 'acks_plain'}.get(way)
    sha = {way: c.cmd('SCRIPT', 'LOAD', script(name))} if name else {}
    if p:
        c.cmd('RPUSH', WORKING, *[payload(10**6 + i) for i in range(p)])
    for r in range(jobs // k):
        batch = [payload(r * k + i) for i in range(k)]
        c.cmd('LPUSH', WORKING, *batch)
        if way == 'acks':
            args = []
            for j in batch:
                args += [j, '', '', '']
            c.cmd('EVALSHA', sha[way], 2, WORKING, 'uniquejobs:digests', *args)
        elif way == 'plain':
            c.cmd('EVALSHA', sha[way], 1, WORKING, *batch)
        elif way == 'lrem':
            c.pipe([('LREM', WORKING, '-1', j) for j in batch])
    return callgrind_total(vg, c, out)


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ('acks', 'plain', 'lrem'):
        sys.exit(__doc__)
    way, k, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    jobs = int(sys.argv[4]) if len(sys.argv) == 5 else 6400
    jobs -= jobs % k
    total, base = count(way, k, p, jobs), count('none', k, p, jobs)
    print('%s K=%d P=%d: %.1fk instructions a job' % (way, k, p, (total - base) / jobs / 1000))


if __name__ == '__main__':
    main()
