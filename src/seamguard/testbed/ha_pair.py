"""A live fleet under an HA controller, and the faults to throw at its leader (tests, benchmarks).

The fleet is the twin served as Prometheus metrics (`seamguard twin serve`), scraped by a
real Prometheus; the controller is N `seamguard run` processes with ``ha:``, sharing one
PostgreSQL ledger (testbed/postgres_server.py) and one log actuator file (the world they
act on: a record is an action taken), each reaching etcd through a `TcpProxy` of its own
so a replica can be cut off from etcd alone (`partition`) while it still reaches the
ledger. `kill` is ``kill -9``. A `KeyWatch` records, from outside, every change of the
lease key with its wall time: when a lease ended (etcd deleted the key) and when the next
replica took it.

`audit` reads the ledger and the actuator's file afterwards and counts what HA must never
do: an action applied twice, one recorded done that never reached the world, one that
reached the world without a ledger row of the term that took it, one taken while its
term's key was not held.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from seamguard.ports import free_port
from seamguard.testbed.multinode import EtcdServer
from seamguard.testbed.postgres_server import PostgresServer
from seamguard.testbed.prom import PrometheusServer
from seamguard.testbed.tcp_proxy import TcpProxy

LEADER_KEY = "/seamguard/controller/leader"


@dataclass(frozen=True)
class KeyEvent:
    wall_s: float
    kind: str  # put | delete
    holder: str
    revision: int  # the key's create revision (the token) on put; the deleted key's on delete


class KeyWatch:
    """Every put and delete of the lease key, with the wall time it was seen (an etcd watch)."""

    def __init__(self, address: str, key: str = LEADER_KEY) -> None:
        self.address = address
        self.key = key.encode()
        self.events: list[KeyEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True, name="key-watch")

    def start(self, timeout_s: float = 10.0) -> KeyWatch:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"could not watch {self.key!r} on etcd {self.address}")
        return self

    async def _main(self) -> None:
        import aetcd
        from aetcd.rtypes import EventKind

        host, port = self.address.rsplit(":", 1)
        async with aetcd.Client(host=host, port=int(port), timeout=5) as client:
            current = await client.get(self.key)
            if current is not None:
                self._add(KeyEvent(time.time(), "put", current.value.decode(), current.create_revision))
            watch = await client.watch(self.key, prev_kv=True)
            self._ready.set()

            async def cancel_on_stop() -> None:
                while not self._stop.is_set():
                    await asyncio.sleep(0.2)
                await watch.cancel()

            stopper = asyncio.create_task(cancel_on_stop())
            async for ev in watch:
                now = time.time()
                if ev.kind == EventKind.PUT:
                    self._add(KeyEvent(now, "put", ev.kv.value.decode(), ev.kv.create_revision))
                else:
                    prev = ev.prev_kv
                    self._add(KeyEvent(now, "delete", prev.value.decode() if prev else "",
                                       prev.create_revision if prev else 0))
            await stopper

    def _add(self, ev: KeyEvent) -> None:
        with self._lock:
            self.events.append(ev)

    def snapshot(self) -> list[KeyEvent]:
        with self._lock:
            return list(self.events)

    def holder(self) -> KeyEvent | None:
        """The current holder (the last event, if a put)."""
        evs = self.snapshot()
        return evs[-1] if evs and evs[-1].kind == "put" else None

    def wait_for(self, accept, timeout_s: float) -> KeyEvent | None:
        """The first event (from now on) ``accept`` takes, or None after ``timeout_s``."""
        start = len(self.snapshot())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ev in self.snapshot()[start:]:
                if accept(ev):
                    return ev
            time.sleep(0.01)
        return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Replica:
    name: str
    config: Path
    log: Path
    proxy: TcpProxy
    proc: subprocess.Popen | None = None


@dataclass
class HaFleet:
    """See the module docstring. ``tick_s`` / ``speed`` is the controller's tick period in wall seconds."""

    workdir: Path
    replicas: int = 2
    gpus: int = 64
    tick_s: float = 10.0
    speed: float = 10.0
    lease_s: int = 2
    minutes: float = 60.0
    seed: int = 3
    env: dict[str, str] | None = None
    members: dict[str, Replica] = field(default_factory=dict)

    @property
    def period_s(self) -> float:
        return self.tick_s / self.speed

    @property
    def actions_file(self) -> Path:
        return self.workdir / "actions.jsonl"

    def start(self) -> HaFleet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._closers: list = []
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.etcd = EtcdServer.loopback(self.workdir / "etcd").start()
        self._closers.append(self.etcd.stop)
        self.postgres = PostgresServer().start()
        self._closers.append(self.postgres.stop)
        self.ledger_url = self.postgres.create_database("ha_ledger")
        port = free_port()
        topo = self.workdir / "topology.yaml"
        self.twin = subprocess.Popen(
            [sys.executable, "-m", "seamguard", "twin", "serve", "--gpus", str(self.gpus), "--seed", str(self.seed),
             "--minutes", str(self.minutes), "--tick-s", str(self.tick_s), "--speed", str(self.speed),
             "--port", str(port), "--topology-out", str(topo), "--truth-out", str(self.workdir / "truth.json")],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(self.workdir / "twin.log", "wb"))
        self._closers.append(lambda: _end(self.twin))
        deadline = time.monotonic() + 60
        while not topo.exists() and time.monotonic() < deadline and self.twin.poll() is None:
            time.sleep(0.1)
        if not topo.exists():
            raise RuntimeError(f"twin serve did not start (see {self.workdir}/twin.log)")
        self.prom = PrometheusServer(self.workdir / "prom", targets=[f"127.0.0.1:{port}"],
                                     scrape_interval=f"{int(self.period_s * 1000)}ms")
        self.prom.__enter__()
        self._closers.append(lambda: self.prom.__exit__(None, None, None))
        self.prom.wait_targets_up()
        self.watch = KeyWatch(self.etcd.address).start()
        self._closers.append(self.watch.stop)
        for i in range(self.replicas):
            self._add_replica(f"r{i}", topo)
        for name in self.members:
            self.launch(name)

    def _add_replica(self, name: str, topo: Path) -> None:
        host, port = self.etcd.address.rsplit(":", 1)
        proxy = TcpProxy((host, int(port))).start()
        self._closers.append(proxy.stop)
        cfg = {"version": 1, "topology": str(topo), "mode": "enforce", "tick_s": self.tick_s,
               "time_scale": self.speed, "ledger": self.ledger_url,
               "prometheus": {"url": self.prom.url, "timeout_s": max(0.5, self.period_s)},
               "actuators": [{"type": "log", "path": str(self.actions_file)}],
               "ha": {"etcd": [proxy.address], "lease_s": self.lease_s, "name": name, "key": LEADER_KEY}}
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.members[name] = Replica(name, path, self.workdir / f"{name}.log", proxy)

    def launch(self, name: str) -> None:
        r = self.members[name]
        r.proxy.unblock()
        r.proc = subprocess.Popen([sys.executable, "-m", "seamguard", "run", "-o", "json", "--config", str(r.config)],
                                  env=self.env, stdout=subprocess.DEVNULL, stderr=open(r.log, "ab"))

    def leader(self) -> str | None:
        ev = self.watch.holder()
        return ev.holder if ev is not None else None

    def wait_leader(self, timeout_s: float, other_than: str | None = None) -> KeyEvent | None:
        now = self.watch.holder()
        if now is not None and now.holder != other_than:
            return now
        return self.watch.wait_for(lambda ev: ev.kind == "put" and ev.holder != other_than, timeout_s)

    def kill(self, name: str) -> float:
        """``kill -9`` the replica; the wall time it was sent."""
        r = self.members[name]
        assert r.proc is not None
        t = time.time()
        r.proc.send_signal(signal.SIGKILL)
        r.proc.wait(10)
        r.proc = None
        return t

    def partition(self, name: str) -> float:
        t = time.time()
        self.members[name].proxy.block()
        return t

    def heal(self, name: str) -> None:
        self.members[name].proxy.unblock()

    def stop(self) -> None:
        for r in self.members.values():
            if r.proc is not None:
                _end(r.proc, signal.SIGTERM)
                r.proc = None
        for close in reversed(getattr(self, "_closers", [])):
            try:
                close()
            except Exception:  # noqa: BLE001 - stop everything we can
                pass
        self._closers = []

    def __enter__(self) -> HaFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _end(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


# ---- the audit ---------------------------------------------------------------------------------
def world_records(path: Path) -> list[dict]:
    """The log actuator's records (the world's history of actions), in order."""
    from seamguard.act.log import LogActuator

    return LogActuator(path).records()


def audit(ledger_url: str, actions_file: Path, events: list[KeyEvent]) -> dict:
    """What HA must never do, counted from the ledger, the world and etcd's key history.

    - ``duplicated``: an apply that reached the world while the same key was already in
      effect there (no revert between), or a one-shot applied twice.
    - ``lost``: an action the ledger closed as done that the world never saw, and actions
      still pending (begun, never closed) at the end.
    - ``unledgered``: world records beyond the ledger's applied/reverted rows of the same
      (op, key): an action that reached the world without passing the ledger's fence.
    - ``double_led``: action rows whose wall time falls outside the interval in which etcd
      held the key of their token (between its put and its delete), i.e. a replica acted
      while another could lead.
    - ``reverted_on_takeover``: see `reverted_on_takeover` (``undone``: an action a failover
      took back while it was still wanted).
    """
    import psycopg

    with psycopg.connect(ledger_url, connect_timeout=10) as conn:
        rows = conn.execute("SELECT op, key, status, fence, wall_time FROM actions ORDER BY id").fetchall()
    world = world_records(actions_file)
    in_effect: set[str] = set()
    duplicated = 0
    seen_one_shot: set[str] = set()
    for r in world:
        key = r["key"]
        if r["op"] == "apply":
            if key in in_effect or key in seen_one_shot:
                duplicated += 1
            in_effect.add(key)
            if _one_shot(key):
                seen_one_shot.add(key)
        else:
            in_effect.discard(key)
    from collections import Counter

    world_count = Counter((r["op"], r["key"]) for r in world)
    done_count = Counter((op, key) for op, key, status, _, _ in rows if status == "done")
    lost = sum(max(0, n - world_count[k]) for k, n in done_count.items())
    lost += sum(1 for _, _, status, _, _ in rows if status == "pending")
    unledgered = sum(max(0, n - done_count[k]) for k, n in world_count.items())
    held = _held_intervals(events)
    double_led = 0
    for _, _, status, token, wall in rows:
        if status in ("done", "failed", "refused", "pending", "interrupted") and token is not None:
            span = held.get(int(token))
            if span is None or not (span[0] <= wall <= span[1]):
                double_led += 1
    return {"actions": len(world), "ledger_rows": len(rows), "duplicated": duplicated, "lost": lost,
            "unledgered": unledgered, "double_led": double_led,
            "reverted_on_takeover": reverted_on_takeover(ledger_url)}


def reverted_on_takeover(ledger_url: str, ticks: int = 3) -> dict:
    """Reverts a new term made in its first ``ticks`` ticks (``reverts``), and of those the ones
    whose key was applied again later (``undone``): an action a takeover took back while it
    was still wanted. A revert that stays (a label replaced by a drain, a fault that ended)
    is the policy's, not the failover's."""
    import psycopg

    with psycopg.connect(ledger_url, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT a.id, a.key FROM actions a JOIN (SELECT fence, MIN(tick) AS first FROM ticks "
            "WHERE fence IS NOT NULL GROUP BY fence) t ON t.fence = a.fence "
            "WHERE a.op = 'revert' AND a.status = 'done' AND a.tick < t.first + %s", (ticks,)).fetchall()
        undone = sum(1 for rid, key in rows if conn.execute(
            "SELECT 1 FROM actions WHERE key = %s AND op = 'apply' AND status = 'done' AND id > %s LIMIT 1",
            (key, rid)).fetchone())
    return {"reverts": len(rows), "undone": undone}


def _one_shot(key: str) -> bool:
    from seamguard.act.base import verb_of

    return verb_of(key).one_shot


def _held_intervals(events: list[KeyEvent]) -> dict[int, tuple[float, float]]:
    """token -> (wall time its key was put, wall time it was deleted; +inf while held)."""
    spans: dict[int, tuple[float, float]] = {}
    for ev in events:
        if ev.kind == "put":
            spans.setdefault(ev.revision, (ev.wall_s, float("inf")))
        elif ev.revision in spans:
            spans[ev.revision] = (spans[ev.revision][0], ev.wall_s)
    return spans


def takeovers(ledger_url: str) -> list[dict]:
    """Each term in the ledger: its token, holder, when it took the ledger and finished its first tick."""
    import psycopg

    with psycopg.connect(ledger_url, connect_timeout=10) as conn:
        took = conn.execute("SELECT token, holder, wall_time FROM leader_events WHERE event='took' "
                            "ORDER BY id").fetchall()
        first = dict(conn.execute("SELECT fence, MIN(wall_finished) FROM ticks WHERE fence IS NOT NULL "
                                  "AND wall_finished IS NOT NULL GROUP BY fence").fetchall())
    return [{"token": t, "holder": h, "took_wall_s": w, "first_tick_wall_s": first.get(t)} for t, h, w in took]


def dumps(obj: object) -> str:
    return json.dumps(obj, sort_keys=True)
