"""A `seamguard launch` job across testbed hosts: etcd on one host, a launcher per host.

Why this exists: the runtime's multi-node path (one launcher per node, real TCP between
them, a job-wide store that survives a node) must be exercised on real sockets between
network namespaces, and so must losing a whole node. Tests and benchmarks build the
hosts with `seamguard.testbed.net.Testbed` and run the job with this module; the caller
owns the testbed and stops the job (`MultiNodeJob.stop`), also on failure.

Hosts talk over the management network (10.213.200.<i+1>); etcd runs in its own host's
namespace from Debian's etcd-server package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from seamguard.ports import free_port
from seamguard.testbed.net import SRC, Testbed, _ip
from seamguard.testbed.prom import need

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
# A job rewrites each node's record every node beat (20 writes a second for 2 nodes at
# the default 0.1 s) and etcd keeps every revision until it is compacted: without
# auto-compaction the history of a days-long job fills etcd's default 2 GiB backend quota
# and etcd refuses every write (NOSPACE alarm). Keep the last 10000 revisions (minutes of
# a job; etcd 3.4 compacts every 5 min in this mode): a watch or a PrefixMirror that
# falls that far behind reads its prefix afresh. Production etcd for seamguard needs the
# same (https://etcd.io/docs/v3.4/op-guide/maintenance/#auto-compaction).
COMPACTION = ("--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000")


@dataclass
class EtcdServer:
    """A one-member etcd cluster, data in ``workdir``: inside a testbed host's namespace
    (`in_host`) or on free loopback ports of the caller's (`loopback`)."""

    workdir: Path
    ip: str = "127.0.0.1"
    client_port: int = ETCD_CLIENT_PORT
    peer_port: int = ETCD_PEER_PORT
    exec_prefix: tuple[str, ...] = ()
    host: int | None = None
    """The testbed host it runs in (None: the caller's namespace)."""
    _proc: subprocess.Popen | None = None

    @staticmethod
    def in_host(tb: Testbed, host: int, workdir: Path) -> EtcdServer:
        return EtcdServer(workdir, tb.addr(host, None), exec_prefix=tuple(tb.exec_prefix(host)), host=host)

    @staticmethod
    def loopback(workdir: Path) -> EtcdServer:
        return EtcdServer(workdir, client_port=free_port(), peer_port=free_port())

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"etcd://{self.address}"

    def start(self, timeout_s: float = 20.0) -> EtcdServer:
        exe = need("etcd", "etcd-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        peer = f"http://{self.ip}:{self.peer_port}"
        client = f"http://{self.address}"
        with open(self.workdir / "etcd.log", "wb") as log:
            self._proc = subprocess.Popen(
                [*self.exec_prefix, exe, "--name", "sg", "--data-dir", str(self.workdir / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"sg={peer}", *COMPACTION],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not become healthy on {self.address} (see {self.workdir}/etcd.log)")
            time.sleep(0.1)
        return self

    def _healthy(self) -> bool:
        if not self.exec_prefix:
            return etcd_up(self.address)
        probe = ("import sys, urllib.request; sys.exit(0 if b'true' in urllib.request.urlopen("
                 f"'http://{self.address}/health', timeout=1).read() else 1)")
        cmd = [*self.exec_prefix, sys.executable, "-c", probe]
        return subprocess.run(cmd, capture_output=True, timeout=10, check=False).returncode == 0

    def metrics_text(self) -> str:
        """etcd's Prometheus exposition (``/metrics``), fetched from inside its namespace."""
        fetch = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
                 f"'http://{self.address}/metrics', timeout=5).read().decode())")
        p = subprocess.run([*self.exec_prefix, sys.executable, "-c", fetch], capture_output=True, text=True,
                           timeout=20, check=True)
        return p.stdout

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def namespace_pids(tb: Testbed, host: int) -> list[int]:
    out = _ip("netns", "pids", tb.host_ns(host), check=False).stdout
    return [int(p) for p in out.split()]


def kill_host(tb: Testbed, host: int) -> list[int]:
    """A node lost at once: SIGKILL every process in the host's namespace (launcher,
    zygote, workers, spares alike). Returns the pids killed."""
    pids = namespace_pids(tb, host)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@dataclass
class MultiNodeJob:
    """One launcher per host in ``hosts``, all joined through ``store`` (an etcd URL)."""

    tb: Testbed
    hosts: list[int]
    store: str
    out: Path
    run_id: str
    nproc: int = 2
    spares: int = 1
    launch_args: tuple[str, ...] = ()
    script_args: tuple[str, ...] = ()
    script: Path = Path(SRC).parent / "examples" / "train_ddp.py"
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)

    def command(self, node: int) -> list[str]:
        host = self.hosts[node]
        return [*self.tb.exec_prefix(host), "env", f"PYTHONPATH={SRC}",
                f"SEAMGUARD_ADVERTISE_HOST={self.tb.addr(host, None)}", "GLOO_SOCKET_IFNAME=mgmt",
                f"SEAMGUARD_NODE_NAME=h{host}",
                sys.executable, "-m", "seamguard", "launch", "--nproc", str(self.nproc),
                "--spares", str(self.spares), "--nnodes", str(len(self.hosts)), "--node-rank", str(node),
                "--master-addr", self.tb.addr(self.hosts[0], None), "--store", self.store,
                "--run-id", self.run_id, "--events-file", str(self.out / "events.jsonl"),
                "--chaos-dir", str(self.out / "chaos"), *self.launch_args,
                "--", str(self.script), "--out", str(self.out), *self.script_args]

    def start(self) -> MultiNodeJob:
        self.out.mkdir(parents=True, exist_ok=True)
        for node in range(len(self.hosts)):
            with open(self.out / f"launcher{node}.log", "wb") as log:
                self.procs[node] = subprocess.Popen(self.command(node), stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout_s: float) -> dict[int, int | None]:
        """Exit code per node (None: still running at the deadline, or killed with its host)."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return {n: p.poll() for n, p in self.procs.items()}

    def events(self) -> list[dict]:
        f = self.out / "events.jsonl"
        if not f.exists():
            return []
        return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]

    def wait_for(self, accept, timeout_s: float) -> dict | None:
        """The first event ``accept(event)`` takes, waiting (bounded) for it to be logged."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((e for e in self.events() if accept(e)), None)
            if found is not None or any(p.poll() is not None for p in self.procs.values()):
                return found
            time.sleep(0.1)
        return None

    def furthest_step(self, etcd: EtcdServer) -> int:
        """The furthest step any rank committed, from the example's per-worker step logs in
        the job's --out directory (the hosts share this filesystem). Not from etcd: node
        records travel over the launchers' links, and the coordinator's own goes to etcd
        only when its workers change. ``etcd`` is kept for the callers."""
        best = -1
        for f in self.out.glob("worker_*.log"):
            lines = [line for line in f.read_text().splitlines()[-3:] if line.strip()]
            best = max([best, *(int(line.split()[0]) for line in lines)])
        return best

    def wait_for_step(self, etcd: EtcdServer, step: int, timeout_s: float) -> int:
        """Wait (bounded) until some rank reached ``step``; returns the furthest step seen."""
        deadline = time.monotonic() + timeout_s
        seen = -1
        while time.monotonic() < deadline and all(p.poll() is None for p in self.procs.values()):
            seen = self.furthest_step(etcd)
            if seen >= step:
                break
            time.sleep(0.2)
        return seen

    def log(self, node: int) -> str:
        f = self.out / f"launcher{node}.log"
        return f.read_text(errors="replace") if f.exists() else ""

    def stop(self) -> None:
        """Kill every launcher still running and everything in the job's hosts."""
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for host in self.hosts:
            kill_host(self.tb, host)


def etcd_up(address: str, timeout_s: float = 1.0) -> bool:
    """From the caller's namespace: does etcd at host:port answer /health?"""
    try:
        return b"true" in urllib.request.urlopen(f"http://{address}/health", timeout=timeout_s).read()
    except OSError:
        return False
