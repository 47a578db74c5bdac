#!/usr/bin/env python3
"""The fault-injection harness behind scripts/chaos.sh.

Runs capstan workers (tests/chaos/ledger.c: every start and end of a job in
a local file per process) against a private redis-server with
`appendfsync always`, pushes jobs of several kinds while a nemesis injects
faults chosen at random from a seed, lets the queues drain with every fault
healed, and checks the ledger and Redis's final state (checker.py). With
--shards N, against N such servers at once, each a shard of the workers'
shards: list.

Everything it starts (redis-server, workers, network namespaces, veth
pairs) is its own and removed at the end; it uses only loopback and
addresses inside the namespaces it makes.
"""
import argparse
import os
import pickle
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402

# --cycle: the kinds still to inject in this turn, kept across the runs of
# one invocation so that several short runs inject every kind between them.
CYCLE = []
# --cycle --sentinel: the failover kinds, one opening each run in turn (a
# failover takes seconds; the other kinds go on meanwhile or after).
OPENINGS = []

FAULTS = ["kill9_worker", "kill9_supervisor", "stop_worker", "partition", "partition_oneway",
          "stop_redis", "restart_redis", "client_kill", "maxmemory"]
# With --sentinel (a master, a replica, three sentinels): a SENTINEL
# FAILOVER, and a SIGKILL of the master that the sentinels fail over.
SENTINEL_FAULTS = ["failover", "failover_kill"]
# With --shards: one shard's redis-server killed -9 and restarted on its
# AOF, or frozen (SIGSTOP), for seconds: longer than the liveness TTL.
SHARD_FAULTS = [checker.SHARD_OUTAGE]
# The faults that hit a Redis: with --shards, the Redis of one shard.
REDIS_FAULTS = {"stop_redis", "restart_redis", "client_kill", "maxmemory", checker.SHARD_OUTAGE}


# ---- a small Redis client (RESP2) ------------------------------------------

class RedisError(Exception):
    pass


class Redis:
    def __init__(self, host, port, timeout=2.0):
        self.addr = (host, port)
        self.timeout = timeout
        self.sock = None
        self.buf = b""

    def close(self):
        if self.sock:
            self.sock.close()
        self.sock, self.buf = None, b""

    def _connect(self):
        self.sock = socket.create_connection(self.addr, timeout=self.timeout)
        self.sock.settimeout(self.timeout)

    def _line(self):
        while b"\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n + 2:]
        return out

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode("utf-8", "replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise ConnectionError("bad reply")

    def pipeline(self, cmds):
        """Sends every command, returns every reply (errors as RedisError
        objects); raises OSError when the connection fails."""
        if not self.sock:
            self._connect()
        out = []
        for c in cmds:
            out.append(b"*%d\r\n" % len(c))
            for a in c:
                a = a if isinstance(a, bytes) else str(a).encode()
                out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        try:
            self.sock.sendall(b"".join(out))
            return [self._reply() for _ in cmds]
        except (OSError, ConnectionError, ValueError):
            self.close()
            raise OSError("redis connection failed")

    def cmd(self, *args):
        r = self.pipeline([args])[0]
        if isinstance(r, RedisError):
            raise r
        return r


# ---- the pieces --------------------------------------------------------------

def sh(*args, check=True):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=check)


class Net:
    """One network namespace and veth pair per worker: the worker reaches
    Redis at 10.<net>.<i>.1 from 10.<net>.<i>.2 (net from the seed, so two
    runs at once do not share addresses), so a blackhole route cuts it off,
    both ways or one way."""

    def __init__(self, tag, n, net):
        self.tag, self.n, self.ok, self.made, self.net = tag, n, False, [], net
        self.wide = False  # routes to every host-side address (route_all)
        if os.geteuid() != 0 or not shutil.which("ip"):
            self.why = "not root, or no ip(8)"
            return
        try:
            for i in range(n):
                ns, host, peer = self.ns(i), "cv%s%dh" % (tag, i), "cv%s%dn" % (tag, i)
                sh("ip", "netns", "add", ns)
                self.made.append(i)
                sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
                sh("ip", "link", "set", peer, "netns", ns)
                sh("ip", "addr", "add", self.host_ip(i) + "/30", "dev", host)
                sh("ip", "link", "set", host, "up")
                sh("ip", "netns", "exec", ns, "ip", "addr", "add", self.ns_ip(i) + "/30", "dev", peer)
                sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
                sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            self.ok = True
        except subprocess.CalledProcessError as e:
            self.why = "cannot make network namespaces: %s" % (e.stdout or "").strip()
            self.close()

    def ns(self, i):
        return "capstan-chaos-%s-%d" % (self.tag, i)

    def host_ip(self, i):
        return "10.%d.%d.1" % (self.net, i)

    def ns_ip(self, i):
        return "10.%d.%d.2" % (self.net, i)

    def route_all(self):
        """For a topology whose servers announce worker 0's host-side
        address (--sentinel): every namespace reaches 10.<net>.0.0/16
        through its own host-side address."""
        for i in range(1, self.n):
            sh("ip", "netns", "exec", self.ns(i), "ip", "route", "add", "10.%d.0.0/16" % self.net,
               "via", self.host_ip(i))
        self.wide = True

    def cut_addrs(self, i):
        return [self.host_ip(i)] + ([self.host_ip(0)] if self.wide and i else [])

    def cut(self, i, oneway):
        """Both ways: the worker's packets to Redis are dropped. One way:
        Redis's packets to the worker are dropped, the worker's still
        arrive."""
        if oneway:
            sh("ip", "route", "add", "blackhole", self.ns_ip(i) + "/32", check=False)
        else:
            for addr in self.cut_addrs(i):
                sh("ip", "netns", "exec", self.ns(i), "ip", "route", "add", "blackhole",
                   addr + "/32", check=False)

    def heal(self, i):
        sh("ip", "route", "del", "blackhole", self.ns_ip(i) + "/32", check=False)
        for addr in self.cut_addrs(i):
            sh("ip", "netns", "exec", self.ns(i), "ip", "route", "del", "blackhole",
               addr + "/32", check=False)

    def close(self):
        for i in self.made:
            self.heal(i)
            sh("ip", "link", "del", "cv%s%dh" % (self.tag, i), check=False)
            sh("ip", "netns", "del", self.ns(i), check=False)
        self.made = []


# --appendfsync: how often every redis-server of the run syncs its AOF.
APPENDFSYNC = ["always"]


class RedisServer:
    def __init__(self, dir, binds, extra=()):
        self.dir, self.binds, self.proc, self.extra = dir, binds, None, list(extra)
        self.port = free_port()

    def start(self, replicaof=None):
        """Starts it on its AOF: as a master, or as a replica of the
        (host, port) replicaof."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", " ".join(self.binds),
             "--protected-mode", "no", "--dir", self.dir, "--save", "",
             "--appendonly", "yes", "--appendfsync", APPENDFSYNC[0],
             "--logfile", os.path.join(self.dir, "redis.log")] + self.extra +
            (["--replicaof", replicaof[0], str(replicaof[1])] if replicaof else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = Redis("127.0.0.1", self.port, 1)
        for _ in range(200):
            try:
                if c.cmd("PING") == "PONG":
                    c.close()
                    return
            except (OSError, RedisError):
                time.sleep(0.05)
        raise SystemExit("chaos: redis-server did not start (see %s/redis.log)" % self.dir)

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def info_field(text, name):
    for line in (text or "").split("\r\n"):
        if line.startswith(name + ":"):
            return line.split(":", 1)[1]
    return None


class Sentinels:
    """--sentinel: a master and one replica (redis-server, AOF always, on
    free ports) and three sentinels that watch them as "chaos". Every
    server binds 127.0.0.1 and the host-side addresses; with namespaces
    the replica and the sentinels announce worker 0's host-side address
    (every namespace routes to it), else everything is on 127.0.0.1."""

    NAME = "chaos"
    # Above the longest Redis freeze the harness injects (stop_redis, 3 s),
    # so that only a failover fault makes the sentinels fail over.
    # Well above the longest stop_redis (3 s) and the harness's lateness in
    # healing it (the read of a new master's state can hold its loop for a
    # second): a Redis freeze must not become a failover nobody injected.
    DOWN_AFTER_MS = 6000

    def __init__(self, dir, binds, announce):
        self.dir, self.binds, self.announce = dir, binds, announce
        extra = ["--repl-diskless-sync-delay", "0", "--replica-announce-ip", announce]
        self.servers = []
        for name in ("a", "b"):
            d = os.path.join(dir, "redis-" + name)
            os.mkdir(d)
            self.servers.append(RedisServer(d, binds, extra))
        self.sentinels, self.procs = [free_port() for _ in range(3)], []
        self.master = self.servers[0]

    def start(self):
        a, b = self.servers
        a.start()
        b.start(replicaof=(self.announce, a.port))
        for i, port in enumerate(self.sentinels):
            d = os.path.join(self.dir, "sentinel%d" % i)
            os.mkdir(d)
            conf = os.path.join(d, "sentinel.conf")
            with open(conf, "w") as f:
                f.write("port %d\nbind %s\nprotected-mode no\ndir %s\nlogfile %s\n"
                        "sentinel announce-ip %s\n"
                        "sentinel monitor %s %s %d 2\n"
                        "sentinel down-after-milliseconds %s %d\n"
                        "sentinel failover-timeout %s 10000\n"
                        % (port, " ".join(self.binds), d, os.path.join(d, "sentinel.log"), self.announce,
                           self.NAME, self.announce, a.port, self.NAME, self.DOWN_AFTER_MS, self.NAME))
            self.procs.append(subprocess.Popen(["redis-server", conf, "--sentinel"],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if not wait_for(lambda: self.ready(), 20):
            raise SystemExit("chaos: the sentinels did not see the master and its replica (see %s)" % self.dir)

    def url(self):
        return "redis+sentinel://%s/%s/0" % (",".join("%s:%d" % (self.announce, p) for p in self.sentinels),
                                             self.NAME)

    def ask(self, *args):
        """The first sentinel's answer that comes (None: none did)."""
        for port in self.sentinels:
            try:
                c = Redis("127.0.0.1", port, 0.5)
                r = c.cmd("SENTINEL", *args)
                c.close()
                return r
            except (OSError, RedisError):
                continue
        return None

    def named(self):
        """The server the sentinels name master now (None: none answered)."""
        r = self.ask("get-master-addr-by-name", self.NAME)
        for s in self.servers:
            if r and int(r[1]) == s.port:
                return s
        return None

    def other(self, s):
        return self.servers[1] if s is self.servers[0] else self.servers[0]

    def role(self, s):
        try:
            c = Redis("127.0.0.1", s.port, 0.5)
            r = c.cmd("ROLE")
            c.close()
            return r
        except (OSError, RedisError):
            return None

    def ready(self):
        """A failover can be injected: every sentinel names the master the
        harness knows, it is a master, and its replica is linked, caught
        up, and listed by every sentinel as a healthy replica."""
        m, rep = self.master, self.other(self.master)
        role = self.role(m)
        if not role or role[0] != "master":
            return False
        try:
            c = Redis("127.0.0.1", rep.port, 0.5)
            info = c.cmd("INFO", "replication")
            c.close()
        except (OSError, RedisError):
            return False
        if info_field(info, "master_port") != str(m.port) or info_field(info, "master_link_status") != "up":
            return False
        for port in self.sentinels:
            try:
                c = Redis("127.0.0.1", port, 0.5)
                addr = c.cmd("SENTINEL", "get-master-addr-by-name", self.NAME)
                reps = c.cmd("SENTINEL", "replicas", self.NAME)
                c.close()
            except (OSError, RedisError):
                return False
            if int(addr[1]) != m.port:
                return False
            flags = [dict(zip(x[::2], x[1::2])).get("flags") for x in reps or []
                     if dict(zip(x[::2], x[1::2])).get("port") == str(rep.port)]
            if flags != ["slave"]:
                return False
        return True

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.procs = []
        for s in self.servers:
            s.stop()


class SentinelRedis(Redis):
    """A client as redis-client's sentinel mode: each connect asks the
    sentinels for the master and checks its ROLE; a lost connection or a
    READONLY reply makes the next command connect again. And, as capstan's
    own connections do every beat, it asks the sentinels every
    FOLLOW_EVERY seconds which master they name and leaves a replaced one,
    which after a SENTINEL FAILOVER takes writes (lost with it) until the
    sentinels demote it, seconds later."""

    FOLLOW_EVERY = 0.5

    def __init__(self, topo, timeout=2.0):
        Redis.__init__(self, "127.0.0.1", 0, timeout)
        self.topo = topo
        self.server = None  # the server connected to
        self.asked = 0.0

    def _connect(self):
        s = self.topo.named()
        if s is None:
            raise OSError("no sentinel answered")
        self.addr, self.server = ("127.0.0.1", s.port), s
        Redis._connect(self)
        try:
            self.sock.sendall(b"*1\r\n$4\r\nROLE\r\n")
            role = self._reply()
        except (OSError, ConnectionError, ValueError):
            self.close()
            raise OSError("redis connection failed")
        if not isinstance(role, list) or role[0] != "master":
            self.close()
            raise OSError("not a master")

    def pipeline(self, cmds):
        if self.sock and time.time() - self.asked >= self.FOLLOW_EVERY:
            self.asked = time.time()
            s = self.topo.named()
            if s is not None and (self.server is None or s.port != self.server.port):
                self.close()
        out = Redis.pipeline(self, cmds)
        if any(isinstance(r, RedisError) and str(r).startswith("READONLY") for r in out):
            self.close()
        return out


def wait_for(cond, secs, step=0.1):
    deadline = time.time() + secs
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


class Worker:
    """One `capstan run`: worker 0 as capstan runs by default, a supervisor
    with one worker process under it (which replaces and recovers a worker
    that dies at once); the others alone (--no-supervisor), so the harness
    restarts them itself and their jobs wait for their liveness lease."""

    def __init__(self, h, i, supervised):
        self.h, self.i, self.proc, self.starts, self.supervised = h, i, None, 0, supervised

    def start(self):
        h = self.h
        host = h.net.host_ip(self.i) if h.net.ok else "127.0.0.1"
        url = h.topo.url() if h.topo else "redis://%s:%d/0" % (host, h.redis.port)
        # With --shards, a config of their own: the shards' URLs on this
        # worker's host-side address.
        conf, where = (h.shard_conf(self.i, host), []) if h.shards else (h.conf, ["--redis-url", url])
        cmd = [h.capstan, "run"] + ([] if self.supervised else ["--no-supervisor"]) + \
              ["-r", h.plugin, "-C", conf, "-c", str(h.concurrency),
               "-q", "chaos", "-t", "5"] + where
        if h.net.ok:
            cmd = ["ip", "netns", "exec", h.net.ns(self.i)] + cmd
        self.starts += 1
        self.log = os.path.join(h.dir, "worker%d.%d.log" % (self.i, self.starts))
        log = open(self.log, "w")
        env = dict(os.environ, CAPSTAN_LEDGER_DIR=h.dir)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    @property
    def pid(self):
        return self.proc.pid

    def job_pid(self):
        """The process that runs the jobs (whose ledger lines count): the
        supervisor's worker, or the process itself; None between two. Not
        the supervisor's quarantine worker (started after a crash, to run
        the jobs it recovers): the log says which child is which."""
        if not self.supervised:
            return self.pid
        try:
            with open("/proc/%d/task/%d/children" % (self.pid, self.pid)) as f:
                kids = [int(x) for x in f.read().split()]
            with open(self.log, errors="replace") as f:
                started = re.findall(r"(quarantine )?worker \d+ started \(pid (\d+)\)", f.read())
        except (OSError, ValueError):
            return None
        workers = [int(p) for q, p in started if not q and int(p) in kids]
        return workers[-1] if workers else None

    def alive(self):
        return self.proc and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, grace=10):
        if not self.proc:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- the run ---------------------------------------------------------------

class Harness:
    def __init__(self, a):
        self.a = a
        # The faults and their timing come from the seed alone; the jobs
        # from a second generator, so how many pushes a run makes does not
        # move its faults.
        self.rng = random.Random(a.seed)
        self.jobs_rng = random.Random(a.seed * 7919 + 1)
        self.dir = tempfile.mkdtemp(prefix="capstan-chaos.")
        self.capstan, self.plugin = a.capstan, a.plugin
        self.concurrency = a.concurrency
        self.faults = [f for f in (a.faults.split(",") if a.faults else FAULTS)]
        self.net = Net("%04x" % (a.seed % 65536), a.workers, 100 + a.seed % 100)
        if not self.net.ok:
            print("chaos: no network partitions (%s)" % self.net.why)
            self.faults = [f for f in self.faults if not f.startswith("partition")]
        binds = ["127.0.0.1"] + ([self.net.host_ip(i) for i in range(a.workers)] if self.net.ok else [])
        self.topo, self._redis = None, None
        # --shards: (name, RedisServer) each; the first stands for "the
        # Redis" where one is read (the periodic schedule ticks there).
        self.shards = []
        self.shard_of = {}  # jid -> the shard it was pushed to
        self.down = set()   # the shards frozen or dead now (by a fault)
        if a.shards:
            for k in range(a.shards):
                d = os.path.join(self.dir, "shard-s%d" % k)
                os.mkdir(d)
                self.shards.append(("s%d" % k, RedisServer(d, binds)))
            self._redis = self.shards[0][1]
            if not a.faults:
                self.faults += SHARD_FAULTS
            self.shard_clients = [Redis("127.0.0.1", srv.port, 2) for _, srv in self.shards]
        elif a.sentinel:
            if self.net.ok:
                self.net.route_all()
            self.topo = Sentinels(self.dir, binds, self.net.host_ip(0) if self.net.ok else "127.0.0.1")
            if not a.faults:
                self.faults += SENTINEL_FAULTS
        else:
            self._redis = RedisServer(self.dir, binds)
        self.push_at = {}   # jid -> (replication id, offset) of the master that took it (--sentinel)
        self.failover = None  # the failover under way
        self.deferred = None  # a failover kind waiting for the replica to be ready
        self.opened = False   # --cycle: this run's first fault was chosen
        self.conf = os.path.join(self.dir, "chaos.yml")
        with open(self.conf, "w") as f:
            f.write("heartbeat_interval: 0.5\nliveness_ttl: 2\nrecovery_interval: 1\n"
                    "poll_interval_average: 0.5\nmax_recoveries: 1000\n"
                    + ("min_replicas_ack: %d\n" % a.min_replicas_ack if a.min_replicas_ack else "") +
                    "classes:\n"
                    "  LedgerLockJob:\n    lock: while_executing\n    lock_args: [1]\n"
                    "    lock_timeout: 5\n    on_conflict: {server: reschedule}\n    schedule_in: 1\n"
                    "  LedgerLimitJob:\n"
                    "    limit: { type: concurrent, name: chaos, size: 3, lock_timeout: 10 }\n"
                    + self.workload_config())
        self.workers = [Worker(self, i, i == 0) for i in range(a.workers)]
        self.pushed = {}   # jid -> (class, args, time): Redis said it took them
        self.tried = set()  # jids sent whose reply never came: they may be there
        self.events = []   # checker.Fault
        self.active = []   # (heal time, fault, heal function)
        self.seq = 0
        self.batches = {}     # tag -> checker.Batch
        self.batch_procs = []  # (Batch, Popen) still running
        self.lock_pushes = []  # checker.LockPush, in the order sent
        self.maker_log = open(os.path.join(self.dir, "batch-maker.log"), "w")  # their stderr

    @property
    def redis(self):
        """The master of the moment (as far as the harness has seen)."""
        return self.topo.master if self.topo else self._redis

    def client(self):
        return Redis("127.0.0.1", self.redis.port, 2)

    def redis_url(self):
        """For the harness's own capstan clients (batches, until-locked
        pushes): through the sentinels, as the workers."""
        return self.topo.url() if self.topo else "redis://127.0.0.1:%d/0" % self.redis.port

    def start_redis(self):
        for srv in self.servers():
            srv.start()

    def stop_redis(self):
        for srv in self.servers():
            srv.stop()

    def servers(self):
        """What start_redis starts: the sentinels' topology, the shards'
        servers, or the one server."""
        return [self.topo] if self.topo else [srv for _, srv in self.shards] or [self.redis]

    def shard_conf(self, i, host):
        """Worker i's config with --shards: the harness's, and a shards:
        list of every shard on host."""
        path = os.path.join(self.dir, "chaos-shards%d.yml" % i)
        with open(path, "w") as f, open(self.conf) as base:
            f.write(base.read() + "shards:\n" + "".join("  - name: %s\n    redis_url: redis://%s:%d/0\n"
                                                        % (name, host, srv.port) for name, srv in self.shards))
        return path

    def shard_url(self, k):
        return "redis://127.0.0.1:%d/0" % self.shards[k][1].port

    def read_state(self):
        """checker.read_redis and read_enqueued of every Redis that holds
        jobs: the one, or every shard's (the states together: a jid is in
        one shard)."""
        st, enqueued = checker.State(), []
        for srv in ([srv for _, srv in self.shards] or [self.redis]):
            c = Redis("127.0.0.1", srv.port, 2)
            one = checker.read_redis(c)
            for k in ("queued", "schedule", "retry", "dead", "working"):
                setattr(st, k, getattr(st, k) | getattr(one, k))
            enqueued += checker.read_enqueued(c)
            c.close()
        return st, enqueued

    # -- pushes through a failover (--sentinel) --
    def push_extra(self):
        """Commands sent after a push: the master's replication offset (to
        tell a push a failover lost from one Redis had replicated) and,
        with --min-replicas-ack, a WAIT as capstan's own pushes do."""
        if not self.topo:
            return []
        return [["INFO", "replication"]] + \
            ([["WAIT", self.a.min_replicas_ack, 1000]] if self.a.min_replicas_ack else [])

    def push_landed(self, tail, jids):
        """Whether the push counts as taken (its WAIT, if any, reached the
        replicas); notes the replication offset after it."""
        if self.a.min_replicas_ack and not (isinstance(tail[1], int) and tail[1] >= self.a.min_replicas_ack):
            return False
        if isinstance(tail[0], str):
            at = (info_field(tail[0], "master_replid"), int(info_field(tail[0], "master_repl_offset") or 0))
            for j in jids:
                self.push_at[j] = at
        return True

    # -- the workload --
    def push_some(self, c, n):
        """n jobs: plain ones of mixed lengths, a few with a runtime lock on
        a handful of keys, some under a concurrent limiter, a few iterable
        ones (a step a line in the ledger); every fifth chunk
        as one transaction (MULTI/EXEC). Recorded once Redis said yes."""
        jobs = []
        for _ in range(n):
            self.seq += 1
            r = self.jobs_rng.random()
            if r < 0.1:
                cls, args = "LedgerLockJob", [self.jobs_rng.choice([5, 20, 50]), "k%d" % self.jobs_rng.randrange(4)]
            elif r < 0.2:
                cls, args = "LedgerLimitJob", [self.jobs_rng.choice([5, 20]), self.seq]
            elif r < 0.21:
                cls, args = "LedgerWindowJob", [self.jobs_rng.choice([0, 5]), self.seq]
            elif r < 0.215:
                cls, args = "LedgerIterJob", [10, self.jobs_rng.choice([20, 50, 150]), self.seq]
            else:
                cls, args = "LedgerJob", [self.jobs_rng.choice([0, 0, 1, 5, 20, 100]), self.seq]
            jid = uuid.uuid4().hex[:24]
            now = time.time()
            payload = ('{"class":"%s","args":[%s],"queue":"chaos","retry":true,"jid":"%s",'
                       '"created_at":%.6f,"enqueued_at":%.6f}'
                       % (cls, ",".join(('"%s"' % x) if isinstance(x, str) else str(x) for x in args),
                          jid, now, now))
            jobs.append((jid, cls, args, payload))
        txn = self.jobs_rng.random() < 0.2
        shard = None
        if self.shards:  # the chunk goes to one shard, at random
            k = self.jobs_rng.randrange(len(self.shards))
            shard, c = self.shards[k][0], self.shard_clients[k]
            if shard in self.down:
                return 0  # frozen or dead: its reply would hold the loop
        extra = self.push_extra()
        cmds = ([["MULTI"]] if txn else []) + [["LPUSH", "queue:chaos", j[3]] for j in jobs] + \
               [["SADD", "queues", "chaos"]] + ([["EXEC"]] if txn else []) + extra
        self.tried.update(j[0] for j in jobs)
        try:
            replies = c.pipeline(cmds)
        except OSError:
            return 0
        if extra:
            replies, tail = replies[:-len(extra)], replies[-len(extra):]
            if not self.push_landed(tail, [j[0] for j in jobs]):
                return 0
        ok = replies[-1] if txn else replies[:-1]
        if txn and not isinstance(ok, list):
            return 0
        t = time.time()
        for j, r in zip(jobs, ok if txn else ok):
            if isinstance(r, int):
                self.pushed[j[0]] = (j[1], j[2], t)
                if shard:
                    self.shard_of[j[0]] = shard
        return len(jobs)

    # -- batches and a periodic schedule --
    TICK_EVERY = 1
    WINDOW = 3  # LedgerWindowJob's starts a second

    def workload_config(self):
        """The config's iterable class, interrupted after a second (so its
        longer jobs resume from their cursor, maybe elsewhere), and its
        periodic schedule: a LedgerTickJob every second, every missed tick
        enqueued once a process is back (missed: all), so the checker can
        hold each tick to exactly one enqueue."""
        return ("  LedgerWindowJob:\n    limit: { type: window, name: chaos_window, count: %d, interval: second,"
                " wait_timeout: 0 }\n" % self.WINDOW +
                "  LedgerIterJob:\n    max_iteration_runtime: 1\n"
                "  LedgerUntilExecutedJob:\n    lock: until_executed\n    lock_args: [1]\n"
                "  LedgerUntilExpiredJob:\n    lock: until_expired\n    lock_args: [1]\n    lock_ttl: %d\n"
                "    on_conflict: {server: reschedule}\n    schedule_in: 1\n"
                "  LedgerUntilWhileJob:\n    lock: until_and_while_executing\n    lock_args: [1]\n"
                "    lock_timeout: 5\n    on_conflict: {server: reschedule}\n    schedule_in: 1\n"
                % checker.UNTIL_EXPIRED_TTL +
                "periodic:\n  chaos_tick:\n    cron: \"*/%d * * * * *\"\n    class: LedgerTickJob\n"
                "    queue: chaos\n    args: [0]\n    missed: all\n" % self.TICK_EVERY)

    def start_batch(self):
        """One batch of 5 to 30 LedgerBatchJob jobs with complete and
        success callbacks, made by tests/chaos/batch.c through the C client
        API (as an application makes one), without waiting for it."""
        b = checker.Batch("b%d" % (len(self.batches) + 1))
        self.batches[b.tag] = b
        n = self.jobs_rng.randint(5, 30)
        url = self.redis_url()
        if self.shards:  # one shard's, at random
            k = self.jobs_rng.randrange(len(self.shards))
            b.shard, url = self.shards[k][0], self.shard_url(k)
        proc = subprocess.Popen([self.a.batch_maker, url, b.tag, str(n)],
                                stdout=subprocess.PIPE, stderr=self.maker_log, text=True)
        self.batch_procs.append((b, proc))

    def start_lock_push(self):
        """One job of an until-lock class on one of three keys, pushed by
        `capstan push -C` (which takes the class's lock as an application's
        client does), without waiting for it: refused (status 3) while the
        key's lock is held."""
        self.seq += 1
        cls = self.jobs_rng.choice(sorted(checker.UNTIL_LOCKS))
        key = "k%d" % self.jobs_rng.randrange(3)
        p = checker.LockPush(cls, [self.jobs_rng.choice([5, 20, 50]), key, self.seq])
        url = self.redis_url()
        if self.shards:
            # A key's pushes go to one shard, so that they meet its lock
            # (the harness's config has no shards: for --redis-url).
            k = int(key[1:]) % len(self.shards)
            p.shard, url = self.shards[k][0], self.shard_url(k)
        p.sent = time.time()
        p.proc = subprocess.Popen([self.capstan, "push", cls, json.dumps(p.args), "-C", self.conf, "-q", "chaos",
                                   "--redis-url", url],
                                  stdout=subprocess.PIPE, stderr=self.maker_log, text=True)
        self.lock_pushes.append(p)

    def poll_lock_pushes(self, wait=0):
        """Reads the pushes that have ended (waiting up to wait s for all,
        then killing those left): status 0 accepted (the jid on stdout),
        3 refused by the lock, else not known."""
        deadline = time.time() + wait
        for p in self.lock_pushes:
            if p.proc is None:
                continue
            try:
                rc = p.proc.wait(max(0.0, deadline - time.time()) if wait else 0)
            except subprocess.TimeoutExpired:
                if not wait:
                    continue
                p.proc.kill()
                rc = p.proc.wait()
            p.replied = time.time()
            out = p.proc.stdout.read().split()
            p.proc.stdout.close()
            p.proc = None
            if rc == 0 and out:
                p.status, p.jid = "accepted", out[0]
                self.pushed[p.jid] = (p.cls, p.args, p.replied)
                if self.shards:
                    self.shard_of[p.jid] = p.shard
            else:
                p.status = "refused" if rc == 3 else "unknown"

    def poll_batches(self, wait=0):
        """Reads the makers that have ended (waiting up to wait s for all,
        then killing those left: their batches are judged as pushed and
        committed or not by what they printed)."""
        deadline = time.time() + wait
        left = []
        for b, proc in self.batch_procs:
            try:
                proc.wait(max(0.0, deadline - time.time()) if wait else 0)
            except subprocess.TimeoutExpired:
                if wait:
                    proc.kill()
                    proc.wait()
                else:
                    left.append((b, proc))
                    continue
            t = time.time()
            for line in proc.stdout.read().splitlines():
                k, _, v = line.partition(" ")
                if k == "bid":
                    b.bid = v
                elif k == "jid":
                    b.jids.append(v)
                    self.pushed[v] = (checker.BATCH_JOB, [b.tag], t)
                    if self.shards:
                        self.shard_of[v] = b.shard
                elif k == "committed":
                    b.committed = True
            b.pushed = bool(b.jids)
            proc.stdout.close()
        self.batch_procs = left

    # -- the nemesis --
    def worker_wl(self, pid):
        """The jids in the working list of the process pid now: what a freeze
        or a kill can hand to another process (None when Redis does not
        say). With Sentinel, on every server that is a master now: after a
        SENTINEL FAILOVER the old master stays one, and the workers on it,
        until the sentinels make it a replica."""
        found = None
        for port in self.master_ports():
            try:
                # (A shard frozen by a fault must not hold the loop long.)
                c = Redis("127.0.0.1", port, 0.5 if self.shards else 2)
                for ident in c.cmd("SMEMBERS", "processes") or []:
                    if ident.split(":")[1:2] == [str(pid)]:
                        found = (found or set()) | checker._jids(
                            c.cmd("LRANGE", "uniquejobs:working:" + ident, 0, -1))
                c.close()
            except (OSError, RedisError, IndexError):
                pass
        return found

    def master_ports(self):
        if self.shards:
            return [srv.port for _, srv in self.shards]
        if not self.topo:
            return [self.redis.port]
        return [s.port for s in self.topo.servers if (self.topo.role(s) or [None])[0] == "master"]

    def next_kind(self):
        """The next fault's kind: at random from the seed, or with --cycle
        each kind in turn (in an order the seed shuffles), so that short
        runs still inject every kind."""
        if self.deferred:
            kind, self.deferred = self.deferred, None
            return kind
        if not self.a.cycle:
            return self.rng.choice(self.faults)
        if self.shards and not self.opened and checker.SHARD_OUTAGE in self.faults:
            # --cycle --shards: each run opens with a shard outage.
            self.opened = True
            return checker.SHARD_OUTAGE
        if self.topo and not self.opened:
            self.opened = True
            kinds = [k for k in self.faults if k in SENTINEL_FAULTS]
            if kinds and not OPENINGS:
                OPENINGS.extend(kinds)
                self.rng.shuffle(OPENINGS)
            if OPENINGS:
                return OPENINGS.pop()
        if not CYCLE:
            CYCLE.extend(k for k in self.faults if not (self.topo and k in SENTINEL_FAULTS)
                         and not (self.shards and k in SHARD_FAULTS))
            self.rng.shuffle(CYCLE)
        return CYCLE.pop()

    def settled_wl(self, pid):
        """The working list of the process pid once what it sent before the
        fault has landed (it can send nothing more): what another process
        may take from it."""
        time.sleep(0.1)
        return self.worker_wl(pid)

    def inject(self, kind, now):
        rng = self.rng
        live = [w for w in self.workers if w.alive()]
        f = checker.Fault(kind, now)
        srv = self.redis
        if self.shards and kind in REDIS_FAULTS:  # one shard's Redis, at random
            k = rng.randrange(len(self.shards))
            f.shard, srv = self.shards[k]
        if kind == "kill9_supervisor":
            live = [w for w in live if w.supervised]
        pick = rng.choice(live) if live else None
        pid = pick.job_pid() if pick else None
        if kind == "kill9_worker" and pid:
            # A supervisor recovers its worker's list at once: read it first.
            held = self.worker_wl(pid) if pick.supervised else None
            # Its time once the signal is sent: a job whose start line the
            # process wrote as the kill was on its way started before it.
            os.kill(pid, signal.SIGKILL)
            f.pid, f.start = pid, time.time()
            if pick.supervised:
                f.kind = "kill9_supervised"  # its supervisor recovers and replaces it
                f.held = held
                self.active.append((now, f, lambda: None))
            else:
                pick.proc.wait()
                f.held = self.settled_wl(pid)
                self.active.append((now + rng.uniform(0.2, 1.5), f, pick.start))
        elif kind == "kill9_supervisor" and pid and pick.supervised:
            # Its worker sees it gone and stops as on TERM: running jobs
            # finish or go back after the grace.
            f.pid, f.held, f.start = pid, self.worker_wl(pid), time.time()
            pick.signal(signal.SIGKILL)
            pick.proc.wait()
            self.active.append((now + rng.uniform(0.5, 2), f, pick.start))
        elif kind == "stop_worker" and pid:
            f.pid, f.start = pid, time.time()
            os.kill(pid, signal.SIGSTOP)
            f.held = self.settled_wl(pid)
            self.active.append((now + rng.uniform(0.5, 6), f, lambda p=pid: os.kill(p, signal.SIGCONT)))
        elif kind in ("partition", "partition_oneway") and pid and self.net.ok:
            w = pick
            f.pid, f.start = pid, time.time()
            self.net.cut(w.i, kind == "partition_oneway")
            f.held = self.settled_wl(pid)
            self.active.append((now + rng.uniform(0.5, 6), f, lambda i=w.i: self.net.heal(i)))
        elif kind == "stop_redis":
            srv.signal(signal.SIGSTOP)
            self.down.add(f.shard)
            self.active.append((now + rng.uniform(0.3, 3), f, lambda: self.thaw(srv, f.shard)))
        elif kind == "restart_redis":
            srv.kill9()

            def back():
                srv.start()
            self.active.append((now + rng.uniform(0.2, 1.5), f, back))
        elif kind == checker.SHARD_OUTAGE and self.shards:
            # Every working list of the shard just before: the jobs its
            # recovery may hand to another process when it is back.
            f.held, f.slack = self.shard_wl(srv), self.a.workers * self.concurrency
            f.how = "kill9" if rng.random() < 0.5 else "sigstop"
            self.down.add(f.shard)
            f.start = time.time()
            if f.how == "kill9":
                srv.kill9()

                def restart():
                    srv.start()
                    self.down.discard(f.shard)
                heal = restart
            else:
                srv.signal(signal.SIGSTOP)
                heal = lambda: self.thaw(srv, f.shard)  # noqa: E731
            self.active.append((now + rng.uniform(2, 5), f, heal))
        elif kind == "client_kill":
            try:
                c = Redis("127.0.0.1", srv.port, 2)
                for _ in range(rng.randrange(1, 4)):
                    c.cmd("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    time.sleep(0.05)
            except (OSError, RedisError):
                pass
            self.active.append((now, f, lambda: None))
        elif kind in SENTINEL_FAULTS and self.topo:
            if not self.inject_failover(kind, f):
                return
        elif kind == "maxmemory":
            try:
                c = Redis("127.0.0.1", srv.port, 2)
                used = int([l for l in c.cmd("INFO", "memory").split("\r\n")
                            if l.startswith("used_memory:")][0].split(":")[1])
                c.cmd("CONFIG", "SET", "maxmemory", str(used + 64 * 1024))
                c.cmd("CONFIG", "SET", "maxmemory-policy", "noeviction")

                def lift():
                    try:
                        Redis("127.0.0.1", srv.port, 2).cmd("CONFIG", "SET", "maxmemory", "0")
                    except (OSError, RedisError):
                        pass
                self.active.append((now + rng.uniform(0.5, 3), f, lift))
            except (OSError, RedisError, IndexError, ValueError):
                return
        else:
            return
        self.events.append(f)

    def thaw(self, srv, shard):
        srv.signal(signal.SIGCONT)
        self.down.discard(shard)

    def shard_wl(self, srv):
        """The jids of every working list of srv now (None: it did not say)."""
        try:
            c = Redis("127.0.0.1", srv.port, 2)
            held = set()
            for k in c.cmd("KEYS", "uniquejobs:working:*") or []:
                held |= checker._jids(c.cmd("LRANGE", k, 0, -1))
            c.close()
            return held
        except (OSError, RedisError):
            return None

    def inject_failover(self, kind, f):
        """A SENTINEL FAILOVER, or a SIGKILL of the master that the
        sentinels fail over (it restarts as a replica once they did).
        Waits for its turn (self.deferred) while the replica is not ready.
        Other faults wait until the sentinels name the new master."""
        topo = self.topo
        if not topo.ready():
            self.deferred = kind
            return False
        f.old, f.promoted, f.demoted, f.cut, f.lag = topo.master, None, None, None, None
        f.read_at = None
        f.start = time.time()
        if kind == "failover":
            r = topo.ask("FAILOVER", topo.NAME)
            if r != "OK":
                self.deferred = kind
                return False
        else:
            f.old.kill9()
            f.demoted = f.start  # it takes no write after this
        self.failover, self.failover_poll = f, 0
        self.active.append((float("inf"), f, self.settle_failover))
        return True

    def failover_tick(self, now):
        """Follows the failover under way: the sentinels name the new master
        (the harness follows it; a killed master restarts as its replica),
        then (SENTINEL FAILOVER) the old master turns replica. Bounded."""
        f = self.failover
        if not f or now < self.failover_poll:
            return
        self.failover_poll = now + 0.05
        topo = self.topo
        if f.promoted is None:
            s = topo.named()
            if s is not None and s is not f.old:
                f.promoted = time.time()
                topo.master = s
                try:
                    # What the new master has unfinished: the jobs that can
                    # run again (those the old master took after the cut
                    # are not there).
                    st = checker.read_redis(self.client())
                    f.held, f.read_at = st.queued | st.working | st.retry, time.time()  # see checker._in_failover
                    info = self.client().cmd("INFO", "replication")
                    f.cut = (info_field(info, "master_replid2"), int(info_field(info, "second_repl_offset")) - 1)
                    if f.kind == "failover":  # how far the replica was behind (bytes)
                        f.lag = int(info_field(Redis("127.0.0.1", f.old.port, 1).cmd("INFO", "replication"),
                                               "master_repl_offset")) - f.cut[1]
                except (OSError, RedisError, TypeError, ValueError):
                    pass
                if f.kind == "failover_kill":
                    f.old.start(replicaof=(topo.announce, s.port))
                self.active = [x for x in self.active if x[1] is not f]
            elif now - f.start > 30 and f.kind == "failover" and topo.named() is f.old \
                    and (topo.role(f.old) or [""])[0] == "master":
                # SENTINEL FAILOVER is one sentinel's alone: another that has
                # not heard of it yet may turn the replica it promotes back
                # into a replica (+convert-to-slave), and the failover ends
                # in -failover-abort-slave-timeout. The master stayed the
                # master, and no client wrote to the replica it named no
                # one: a fault that did not happen.
                f.kind, f.end = "failover_aborted", time.time()
                self.failover = None
                self.active = [x for x in self.active if x[1] is not f]
                return
            elif now - f.start > 30:
                raise SystemExit("chaos: the sentinels named no new master 30 s after %s (see %s)"
                                 % (f.kind, self.dir))
        if f.promoted is not None and f.demoted is None:
            role = topo.role(f.old)
            if role and role[0] == "slave":
                f.demoted = time.time()
            elif now - f.start > 60:
                raise SystemExit("chaos: the old master was not made a replica 60 s after %s (see %s)"
                                 % (f.kind, self.dir))
        if f.promoted is not None and f.demoted is not None:
            f.end = max(f.promoted, f.demoted)
            self.failover = None

    def settle_failover(self):
        while self.failover:
            self.failover_tick(time.time())
            time.sleep(0.05)

    def heal_due(self, now, all_=False):
        keep = []
        for t, f, heal in self.active:
            if all_ or t <= now:
                # The time before the heal: the process may run (and write a
                # start line) before a time taken after it.
                f.end = time.time()
                heal()
            else:
                keep.append((t, f, heal))
        self.active = keep

    def watch_held(self):
        """Adds to each freeze's or cut's held jobs those its process's
        working list has now: Redis still moves jobs into the list of a
        frozen process blocked on a queue, and runs the fetches a one-way
        cut lets through, so the list can gain jobs after the fault began
        (and lose them to a recovery before it ends)."""
        for _, f, _ in self.active:
            if f.kind in checker.FREEZES and f.pid and f.held is not None:
                now_held = self.worker_wl(f.pid)
                if now_held:
                    f.held = set(f.held) | set(now_held)

    # -- a whole run --
    def run(self):
        a = self.a
        self.start_redis()
        for w in self.workers:
            w.start()
        c = SentinelRedis(self.topo) if self.topo else self.client()
        t0 = time.time()
        end = t0 + a.seconds
        next_fault = t0 + self.rng.uniform(0.5, a.fault_every)
        next_push = t0
        next_batch = t0 + 1
        next_lock_push = t0
        next_look = t0
        next_held = t0
        while time.time() < end:
            now = time.time()
            self.heal_due(now)
            self.failover_tick(now)
            if now >= next_held:
                self.watch_held()
                next_held = now + 0.2
            if self.topo and not self.failover and now >= next_look:
                # A failover the harness did not inject is one the checker
                # cannot judge: the run stops here rather than go on
                # without faults (a deferred failover waits for a topology
                # that no longer is).
                next_look = now + 0.5
                named = self.topo.named()
                if named is not None and named is not self.topo.master:
                    raise SystemExit("chaos: the sentinels failed over on their own at %s (see %s)"
                                     % (time.strftime("%H:%M:%S"), self.dir))
            if now >= next_push:
                self.push_some(c, a.rate // 20)
                next_push = now + 0.05
            if now >= next_batch:
                self.start_batch()
                next_batch = now + 2
            if now >= next_lock_push:
                self.start_lock_push()
                next_lock_push = now + 0.2
            self.poll_batches()
            self.poll_lock_pushes()
            if now >= next_fault and not any(f.kind != "client_kill" for _, f, _ in self.active):
                self.inject(self.next_kind(), now)
                next_fault = now + self.rng.uniform(0.5, a.fault_every)
            time.sleep(0.01)
        self.heal_due(0, all_=True)
        self.settle_failover()
        self.poll_batches(wait=15)
        self.poll_lock_pushes(wait=15)
        self.maker_log.close()
        for w in self.workers:
            if not w.alive():
                w.start()
        drained = self.drain(a.drain)
        for w in self.workers:
            w.stop()
        if not drained:
            self.dump_locks()
        state, enqueued = self.read_state()
        self.stop_redis()
        self.net.close()
        # What the checker reads besides the ledger, kept for a second look
        # at a failed run: the faults (with the jids each held), the pushes.
        with open(os.path.join(self.dir, "faults.txt"), "w") as out:
            for f in self.events:
                out.write("%.3f %.3f %s%s pid=%s held=%s\n"
                          % (f.start, f.end or f.start, f.kind,
                             "" if f.shard is None else " shard=%s%s" % (f.shard, " " + getattr(f, "how", "")),
                             f.pid, "-" if f.held is None else ",".join(sorted(f.held))))
        with open(os.path.join(self.dir, "pushed.txt"), "w") as out:
            out.writelines("%s %s %s %s\n" % ((j,) + self.push_at.get(j, ("-", "-")) + (self.shard_of.get(j, "-"),))
                           for j in self.pushed)
        self.write_failovers()
        with open(os.path.join(self.dir, "tried.txt"), "w") as out:
            out.writelines("%s\n" % j for j in self.tried - set(self.pushed))
        with open(os.path.join(self.dir, "batches.txt"), "w") as out:
            for b in self.batches.values():
                out.write("%s %s pushed=%d committed=%d %s\n" % (b.tag, b.bid, b.pushed, b.committed, ",".join(b.jids)))
        inputs = {"pushed": self.pushed, "tried": self.tried, "state": state, "enqueued": enqueued,
                  "batches": self.batches, "lock_pushes": self.lock_pushes, "push_at": self.push_at,
                  # (Each shard has its processors: a freeze's slack is
                  # one job for each of them.)
                  "concurrency": self.concurrency * (len(self.shards) or 1),
                  "shard_of": self.shard_of, "ports": {srv.port: name for name, srv in self.shards},
                  "tick_every": self.TICK_EVERY, "window": self.WINDOW,
                  "seed": a.seed, "seconds": a.seconds,
                  "faults": [checker.Fault.plain(f) for f in self.events]}
        # All the checker reads besides the ledger, as it was before it
        # judged: `--recheck DIR` judges a kept run again.
        with open(os.path.join(self.dir, INPUTS), "wb") as out:
            pickle.dump(inputs, out)
        report = judge(self.dir, inputs, self.events)
        report.no_connection_fails = not a.report_no_connection
        report.drained = drained
        report.seed, report.seconds, report.dir = a.seed, a.seconds, self.dir
        report.sanitizer = self.sanitizer_reports()
        return report

    def write_failovers(self):
        """failovers.txt: each failover's times (start, new master named,
        old master's last write) and the cut (the replication id and last
        offset of the old master that the new one had)."""
        with open(os.path.join(self.dir, "failovers.txt"), "w") as out:
            for f in self.events:
                if f.kind in SENTINEL_FAULTS:
                    out.write("%s start=%.3f promoted=%s demoted=%s old=%d lag=%s cut=%s\n"
                              % (f.kind, f.start, f.promoted and "%.3f" % f.promoted,
                                 f.demoted and "%.3f" % f.demoted, f.old.port, f.lag, f.cut))

    def sanitizer_reports(self):
        """Lines of the workers' (and batch makers') logs where AddressSanitizer or
        UndefinedBehaviorSanitizer reported (an ASan+UBSan build)."""
        found = []
        for path in sorted(os.listdir(self.dir)):
            if path.startswith(("worker", "batch-maker")) and path.endswith(".log"):
                with open(os.path.join(self.dir, path), errors="replace") as f:
                    for line in f:
                        if "ERROR: AddressSanitizer" in line or "ERROR: LeakSanitizer" in line \
                                or "runtime error:" in line:
                            found.append("%s: %s" % (path, line.strip()[:200]))
        return found

    def dump_locks(self):
        """For a run that did not drain: every uniqueness lock still held,
        with its holders, into locks.txt in the scratch directory."""
        try:
            c = self.client()
            with open(os.path.join(self.dir, "locks.txt"), "w") as f:
                for k in sorted(c.cmd("KEYS", "uniquejobs:*:LOCKED") or []):
                    f.write("%s %s\n" % (k, c.cmd("HGETALL", k)))
        except (OSError, RedisError):
            pass

    def drain(self, timeout):
        """Waits until every pushed job ended or is in the retry or dead set
        (the scheduler moves limiter reschedules back), at most timeout s."""
        deadline = time.time() + timeout
        ended, offsets = set(), {}
        while time.time() < deadline:
            checker.read_ended(self.dir, offsets, ended)
            try:
                st = self.read_state()[0]
            except (OSError, RedisError):
                time.sleep(0.2)
                continue
            parked = st.retry | st.dead
            # A push a failover's new master never had cannot end.
            if all(j in ended or j in parked or checker.lost_to_failover(self.events, j, self.pushed, self.push_at)
                   for j in self.pushed) and not st.working and not st.queued:
                return True
            time.sleep(0.2)
        return False


INPUTS = "inputs.pickle"


def judge(dir, inputs, faults=None):
    """The checker's report on the ledger in dir and inputs (what run()
    saves in INPUTS); faults: the harness's own Fault objects, else the
    plain ones of inputs."""
    faults = inputs["faults"] if faults is None else faults
    runs = checker.read_ledger(dir)
    steps, handed_back = checker.read_steps(dir, runs)
    report = checker.check(inputs["pushed"],
                           inputs["tried"] | checker.workload_jids(runs, inputs["batches"], inputs["lock_pushes"]),
                           runs, inputs["state"], faults,
                           lock_classes={"LedgerLockJob", "LedgerUntilExecutedJob", "LedgerUntilWhileJob"},
                           limits={"LedgerLimitJob": 3}, concurrency=inputs["concurrency"],
                           handed_back=handed_back, push_at=inputs["push_at"],
                           shard_of=inputs.get("shard_of"), ports=inputs.get("ports"))
    checker.check_workload(report, runs, inputs["state"], inputs["enqueued"], inputs["batches"],
                           inputs["tick_every"], steps, faults, inputs["lock_pushes"],
                           {"LedgerWindowJob": (inputs["window"], 1.0)}, push_at=inputs["push_at"])
    return report


def recheck(dir, no_connection_fails=True):
    """Judges the run kept in dir again, with this checker."""
    with open(os.path.join(dir, INPUTS), "rb") as f:
        inputs = pickle.load(f)
    r = judge(dir, inputs)
    r.drained, r.seed, r.seconds, r.dir = True, inputs["seed"], inputs["seconds"], dir
    r.no_connection_fails = no_connection_fails
    print(r.text())
    return 0 if r.ok() else 1


def main():
    p = argparse.ArgumentParser(prog="scripts/chaos.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", help="comma-separated seeds, one run each (overrides --seed)")
    p.add_argument("--seconds", type=float, default=20, help="faults and pushes last this long")
    p.add_argument("--minutes", type=float, help="as --seconds, in minutes")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=5)
    p.add_argument("--rate", type=int, default=400, help="jobs pushed per second")
    p.add_argument("--fault-every", type=float, default=2.0, help="mean seconds between faults, x2")
    p.add_argument("--faults", help="comma-separated kinds (default all): " + ",".join(FAULTS + SHARD_FAULTS)
                   + " (the last with --shards only)")
    p.add_argument("--sentinel", action=argparse.BooleanOptionalAction, default=True,
                   help="a master, a replica and three sentinels (the default; --no-sentinel: one "
                        "redis-server); the workers go through the sentinels, and the fault kinds add "
                        + ",".join(SENTINEL_FAULTS))
    p.add_argument("--shards", type=int, default=0, metavar="N",
                   help="N >= 2 shards: N redis-servers (AOF as --no-sentinel's one), the workers "
                        "serving them all through a shards: list, the pushes spread over them; the "
                        "checker holds every job to its shard, and the fault kinds add "
                        + ",".join(SHARD_FAULTS) + " (one shard's redis-server killed -9 and restarted "
                        "on its AOF, or frozen, for 2-5 s); the other Redis faults hit one shard at "
                        "random. Implies --no-sentinel (Sentinel mode is one shard's)")
    p.add_argument("--min-replicas-ack", type=int, default=0,
                   help="the workers' min_replicas_ack, and a WAIT after each push (with --sentinel)")
    p.add_argument("--cycle", action="store_true",
                   help="inject the kinds in turn (shuffled by the seed) rather than at random")
    p.add_argument("--drain", type=float, default=90, help="seconds to wait for the queues to empty")
    p.add_argument("--appendfsync", choices=("always", "everysec", "no"), default="always",
                   help="the servers' AOF sync policy (what a restart_redis may cost)")
    p.add_argument("--report-no-connection", action="store_true",
                   help="only report, rather than fail the run for, a handler that found "
                        "capstan_job_redis() NULL (the ledger's port 0), which include/capstan/job.h "
                        "says it never is")
    p.add_argument("--build", default="build", help="build directory")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--recheck", metavar="DIR", help="judge again, with this checker, a run kept in DIR "
                   "(its ledger and what the harness saved of Redis and the faults); nothing is started")
    a = p.parse_args()
    if a.recheck:
        return recheck(a.recheck, not a.report_no_connection)
    if a.minutes:
        a.seconds = a.minutes * 60
    if a.shards == 1 or a.shards < 0:
        raise SystemExit("chaos: --shards takes 2 or more")
    if a.shards:
        a.sentinel = False
    APPENDFSYNC[0] = a.appendfsync
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = a.build if os.path.isabs(a.build) else os.path.join(root, a.build)
    a.capstan = os.path.join(build, "capstan")
    a.plugin = os.path.join(build, "tests", "libcapstan-ledger.so")
    a.batch_maker = os.path.join(build, "tests", "capstan-chaos-batch")
    for f in (a.capstan, a.plugin, a.batch_maker):
        if not os.path.exists(f):
            raise SystemExit("chaos: %s not built (ninja -C %s)" % (f, build))
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else [a.seed]
    # A shell starts a background job with INT ignored: INT and TERM both
    # end the run here, through the cleanup below (processes, namespaces).
    def interrupted(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    reports, status = [], 0
    for s in seeds:
        a.seed = s
        h = Harness(a)
        try:
            r = h.run()
        except KeyboardInterrupt as e:
            print("chaos: stopped by %s; scratch kept in %s" % (e or "SIGINT", h.dir), file=sys.stderr)
            return 130
        finally:
            for w in h.workers:
                if w.proc and w.proc.poll() is None:
                    w.proc.kill()
            h.stop_redis()
            h.net.close()
        print(r.text())
        reports.append(r)
        if not r.ok():
            status = 1
            print("chaos: scratch kept in %s" % h.dir)
        elif not a.keep:
            shutil.rmtree(h.dir, ignore_errors=True)
    if len(reports) > 1:
        print(checker.summary(reports))
    return status


if __name__ == "__main__":
    sys.exit(main())
