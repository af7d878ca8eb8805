"""Membership load, 1k-10k ranks: one job-wide TCPStore, per-node aggregation on etcd
(today's launcher), and liveness over the launchers' links with etcd written on change.

    PYTHONPATH=src python benchmarks/membership_load.py --quick   # 1k and 3k ranks, 2 reps, 4 s windows
    PYTHONPATH=src python benchmarks/membership_load.py           # 1k, 3k, 10k ranks, 3 reps, 6 s windows

What is simulated, and how (the honest part). A job of N ranks, 8 ranks and 1 idle
spare per node (N/8 nodes), talks to its job-wide store exactly as the runtime's code
does today, with the runtime's own key layout (runtime/keys.py), store clients, default
periods (settings.py: a rank's heartbeat every 0.2 s, a node beat every 0.25 s, hang
timeout 1 s) and detectors (runtime/detect.py); only the training is missing. A few
generator processes each play a slice of the nodes on one store connection each, on a
schedule (phases spread evenly):

- flat (one TCPStore, as a one-node job uses it; what torchrun's c10d store would carry
  if every rank beat into it): every rank writes its heartbeat key every heartbeat; idle
  spares wait on the next generation's wake key (a blocking wait: no requests while they
  wait, not simulated); the coordinator, every pass, reads the hint keys (one multi_get),
  the key count (keys.NewKeys) and every rank's heartbeat (one multi_get), and when the
  key count moves or every 0.5 s (coordinator.FULL_READ_S) every worker's exit key and
  every rank's done key (a check and a get per key: a TCPStore has no range read).
- aggregated (``--store etcd://``): a node's ranks beat into their node's launcher
  (in memory here: that hop is a localhost store whose load does not grow with the job),
  and each node's launcher sends one transaction every node beat: the record with its
  ranks' latest beats, and the reads launcher.NODE_BEAT_READS, the kill keys and node 0's
  record's revision; every idle spare holds one etcd watch (an open HTTP stream: no
  requests while it waits); the coordinator follows the job's keys with one watch
  (PrefixMirror) and judges nodes (NodeTracker) and ranks from that local copy every pass.
- links (runtime/liveness.py, roster.py, node_membership.py; not yet what `seamguard
  launch` runs): the coordinator is node 0's `NodeMembership`, elected through etcd (a
  lease and a fenced key), its hub judging every node's link in memory and writing the
  membership to etcd (aetcd, gRPC, on a thread of its own) only when it changes. The
  other nodes' launchers are SIMULATED: one TCP link each, carrying what a
  `NodeReporter` sends (its 8 ranks' beats as one HMAC-signed line, `encode_report`,
  every node beat on a fixed schedule, the first as it connects), verified by the hub as
  in the job (``link_lines_refused`` counts the lines it refused); one thread per
  generator process sends for a few hundred nodes from a heap of due times, so the
  simulation costs the machine the lines, not an event-loop task per node (with one
  asyncio `NodeReporter` task each, 1,250 simulated launchers could not keep their
  schedule on this machine and their own silences were judged). They do not campaign
  (failover is tested in tests/runtime/test_membership_links.py, not here).
  The silent node (node 1) stops sending but keeps its link open, as a hung host does, so
  its loss is judged by the timeout, not by the faster closed link.

``--generator-nice N`` runs the links design's generator processes at nice N (default 0,
as every other process here): niced generators send their beats later, not sooner,
which works against the links design's verdicts, not for them.

``--system-nice N`` (default -20, needs root; the result records what each process ran
at) runs the processes under test, every design's store server and coordinator alike, at
nice N. In a job each is a process on a host of its own; here they share 2 cores with
the simulated launchers and with whatever else the machine runs. At nice 0 and load 10,
the links coordinator waited for a core longer than it ran (its threads' run-queue time
176 % of a core against 15 % of CPU) and the silent node's verdict came after the
window: a measure of the machine, not of the design. The simulated launchers stay at
nice 0, so a sender starved by the machine still counts against the design.

Coordinator CPU is its process's user+system time over the window; ``*_waiting_pct`` is
the run-queue time of each role's threads (runnable, no core: the kernel's schedstat) and
``machine_busy_pct`` every process's CPU on the machine, both in % of one core. Waits are
metered for the processes under test only: a generator's threads end with the window,
and an ended thread's wait leaves the sum.
In the links design the silent node's way through the coordinator is timed
(`_VerdictProbe`, `detection_split`): its last line's send and read, the hang timeout,
the pass gaps the hub forgave (a pass more than the timeout after the last: the
coordinator's host frozen, not the node silent), the wait for the judging pass, that
pass's reading of what had arrived before it judged, and the membership write that
published the loss;
``detect_s`` is the verdict pass's time after the kill.
The flat and aggregated coordinators sleep 5 ms between passes, as the launcher's loop does. etcd keeps its
data on tmpfs (/dev/shm): it fsyncs every write, and this machine's shared disk would
measure the disk, not etcd.

A generator that falls behind its schedule runs as fast as the store answers, so the
achieved ops/s below the demanded ones is the saturation point of this machine (server,
generators and coordinator share its cores: the load average is printed). Figures per
design and scale, median [min-max] over interleaved repetitions (the design order flips
every repetition): store requests/s (demanded by the protocol, and achieved), the store
server's CPU % of one core, heartbeat staleness p50/p99 (a rank's beat to the coordinator
seeing it), the server's CPU time per request and, from it, the CPU % the demanded rate
would take (a projection, labelled so), the detection time of a dead node (one node's beats stop at 40 % of the
window), and false verdicts (live ranks or nodes judged dead because the coordinator's
pass, or the store, was slower than the hang timeout). In the links design each simulated
launcher's own sends are timed too: ``simulated_launchers_silent`` counts those that sent
nothing for longer than the hang timeout inside the window (a generator starved on this
shared machine: a verdict on such a node is right about what was sent), and
``false_verdicts_on_nodes_that_sent`` the false verdicts on the others (the design's own:
its hub or coordinator too slow, or a launcher's gap near the timeout plus the hub's
reading jitter), ``false_verdicts_on_nodes_never_silent_half_timeout`` those of them whose
launcher never paused half the timeout; ``false_verdicts`` counts all. Last line: one JSON object, also
written to benchmarks/results/membership_load[_quick].json.
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _record import provenance, write_result  # beside this file
from seamguard import hintauth
from seamguard.runtime.coordinator import FULL_READ_S, HINT_KEYS
from seamguard.runtime.settings import LaunchSettings, RuntimeSettings

RANKS_PER_NODE = 8
HEARTBEAT_S = RuntimeSettings.heartbeat_interval_s   # a rank's heartbeat
NODE_BEAT_S = LaunchSettings.node_beat_s             # a node's launcher's record (--node-beat-s)
HANG_TIMEOUT_S = LaunchSettings.hang_timeout_s
SYSTEM_NICE = -20   # the processes under test: each stands in for its own host (see the docstring)
COORDINATOR_POLL_S = 0.005  # the launcher's loop sleep between coordinator ticks
WARMUP_S = 1.0
KILL_AT = 0.4  # of the window
RESULTS = Path(__file__).parent / "results"


def _beat(n: int, step: int, t: float) -> dict:
    """A rank's heartbeat with the worker's fields (runtime/worker.py) and its send time."""
    return {"n": n, "step": step, "phase": "compute", "compute_s": 0.0123, "comm_s": 0.0041,
            "stall_s": 0.0, "snap_step": step - 1, "persisted_step": step - step % 50, "gen": 0,
            "host": "node0000", "local": 0, "t": t}


def demanded_ops_s(design: str, ranks: int, node_beat_s: float) -> float:
    """Store requests per second the protocol asks for, not counting the coordinator."""
    nodes = ranks // RANKS_PER_NODE
    if design == "flat":
        return ranks / HEARTBEAT_S
    return nodes / node_beat_s


# ------------------------------------------------------------------------ servers
def _tcp_server(port_file: str) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    Path(port_file).write_text(str(store.port))
    while True:
        time.sleep(3600)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _renice(pid: int, nice: int) -> int:
    """Sets every thread of ``pid`` to ``nice`` (threads it starts later inherit it) and
    returns the nice its main thread has: a value below 0 needs root, and without it the
    process keeps its own (the result records which it ran at)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
        except (PermissionError, ProcessLookupError):
            pass
    return os.getpriority(os.PRIO_PROCESS, pid)


def _waited_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a core (the kernel's
    schedstat: run-queue time), summed over the threads alive now."""
    total_ns = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total_ns += int(f.read_text().split()[1])
        except (OSError, IndexError, ValueError):   # a thread that ended meanwhile
            pass
    return total_ns / 1e9


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (every process's, all cores), from /proc/stat."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class _Meters:
    """CPU over the window: each of the benchmark's processes' time on a core, the time the
    processes under test waited for one, and the whole machine's busy time, read at its
    start and its end. Waits are summed over the threads alive at each reading, so only
    the processes under test are metered (their threads outlive the window; a generator's
    end with it, and their waits would vanish from the second reading)."""

    WAITED = ("server", "coordinator")

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.t0 = self._read()

    def _read(self) -> dict:
        return {"wall": time.monotonic(), "machine": _machine_busy_s(),
                **{f"{role}_cpu": sum(_cpu_s(p) for p in ps) for role, ps in self.pids.items()},
                **{f"{role}_waiting": sum(_waited_s(p) for p in self.pids[role]) for role in self.WAITED}}

    def stop(self) -> dict[str, float]:
        """% of one core over the window: ``<role>_cpu_pct``, ``<role>_waiting_pct``, ``machine_busy_pct``."""
        t1 = self._read()
        wall_s = t1.pop("wall") - self.t0["wall"]
        out = {f"{k}_pct": round(100 * (t1[k] - self.t0[k]) / wall_s, 1) for k in t1 if k != "machine"}
        out["machine_busy_pct"] = round(100 * (t1["machine"] - self.t0["machine"]) / wall_s, 1)
        return out


# ------------------------------------------------------------------------ clients
def _connect(design: str, address: str):
    import datetime

    host, port = address.rsplit(":", 1)
    if design == "flat":
        import torch.distributed as dist

        return dist.TCPStore(host, int(port), None, False, timeout=datetime.timedelta(seconds=60))
    from seamguard.runtime.store import EtcdStore

    return EtcdStore(((host, int(port)),), "/bench/", datetime.timedelta(seconds=60))


def _hold_watches(address: str, count: int, key_b64: str) -> list[socket.socket]:
    """``count`` idle spares waiting on the next generation's wake key: etcd watch streams."""
    host, port = address.rsplit(":", 1)
    body = json.dumps({"create_request": {"key": key_b64}}).encode()
    req = (f"POST /v3/watch HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    socks = []
    for _ in range(count):
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(req)
        socks.append(s)
    for s in socks:
        s.recv(4096)  # the "created" message: the watch is registered
    return socks


def generator(design: str, address: str, nodes: list[int], window_s: float, threads: int, node_beat_s: float,
              go, t0_box, out) -> None:
    """Plays ``nodes`` (their ranks, spares and launcher): ``threads`` threads, each on its
    own store connection (the store clients release the GIL while they wait)."""
    import base64
    import threading

    from seamguard.runtime import keys

    stores = [_connect(design, address) for _ in range(threads)]
    watches = []
    if design == "aggregated":
        wake = base64.b64encode(b"/bench/" + keys.wake(1).encode()).decode()
        watches = _hold_watches(address, len(nodes), wake)
    out.put(("ready", os.getpid()))
    go.wait()
    results: list[tuple[int, int]] = []
    workers = [threading.Thread(target=lambda i=i: results.append(
        _play(design, stores[i], nodes[i::threads], t0_box.value, window_s, node_beat_s))) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for s in watches:
        s.close()
    out.put(("gen", {"ops": sum(r[0] for r in results), "late": sum(r[1] for r in results)}))


def run_schedule(heap: list[tuple[float, int]], act, until_s: float, stop=lambda: False) -> None:
    """The generators' one scheduling loop: pops each ``(due_s, ident)`` of ``heap`` as it
    falls due and calls ``act(ident, due_s, now_s)``, which sends and returns the ident's
    next due time (None: it sends no more), until ``until_s`` or ``stop()``. Sleeps at most
    2 ms at a time, so ``stop`` is seen that soon. Whether a late sender catches up or
    starts its schedule again is ``act``'s rule, not the loop's."""
    while heap:
        due_s, ident = heap[0]
        now_s = time.monotonic()
        if now_s >= until_s or stop():
            return
        if due_s > now_s:
            time.sleep(min(due_s - now_s, 0.002))
            continue
        heapq.heappop(heap)
        next_s = act(ident, due_s, now_s)
        if next_s is not None:
            heapq.heappush(heap, (next_s, ident))


def _play(design: str, store, nodes: list[int], t0: float, window_s: float,
          node_beat_s: float) -> tuple[int, int]:
    """One connection's share of the nodes, on schedule; returns (requests, late actions)
    in the window. Flat: one entry per rank (its heartbeat); aggregated: one per node (its
    launcher's transaction). A sender behind its schedule catches up as fast as the store
    answers (the saturation this design measures)."""
    from seamguard.runtime import keys

    start, end = t0 + WARMUP_S, t0 + WARMUP_S + window_s
    kill_s = start + KILL_AT * window_s
    if design == "flat":
        period_s = HEARTBEAT_S
        heap = [(t0 + HEARTBEAT_S * (wid % 97) / 97, wid)
                for n in nodes for wid in range(n * RANKS_PER_NODE, (n + 1) * RANKS_PER_NODE)]
    else:
        from seamguard.runtime.launcher import NODE_BEAT_READS

        period_s = node_beat_s
        heap = [(t0 + node_beat_s * (n % 89) / 89, n) for n in nodes]
    heapq.heapify(heap)
    tally = {"ops": 0, "late": 0}
    counters: dict[int, int] = {}

    def act(ident: int, due_s: float, now_s: float) -> float:
        in_window = now_s >= start
        tally["late"] += in_window and now_s - due_s > HEARTBEAT_S
        node = ident // RANKS_PER_NODE if design == "flat" else ident
        n = counters[ident] = counters.get(ident, 0) + 1
        if node == 0 and now_s >= kill_s:
            return due_s + period_s   # the dead node: its beats stop
        if design == "flat":
            store.set(keys.heartbeat(ident), json.dumps(_beat(n, n, now_s)))
        else:
            beats = {}
            for wid in range(ident * RANKS_PER_NODE, (ident + 1) * RANKS_PER_NODE):
                phase = HEARTBEAT_S * (wid % 97) / 97   # each rank's latest beat on its own schedule
                k = int((now_s - t0 - phase) // HEARTBEAT_S)
                beats[wid] = _beat(k, k, t0 + phase + k * HEARTBEAT_S)
            # as launcher._NodeBeat.maybe_beat on etcd: one transaction
            store.put_and_read(keys.node_beats(ident), json.dumps({"n": n, "beats": beats}),
                               list(NODE_BEAT_READS), [keys.KILL_PREFIX], versions=(keys.node_beats(0),))
        tally["ops"] += in_window
        return due_s + period_s
    run_schedule(heap, act, end)
    return tally["ops"], tally["late"]


class _Counted:
    """A store whose requests are counted (the coordinator's side of the traffic)."""

    def __init__(self, store) -> None:
        self.store, self.requests = store, 0

    def __getattr__(self, name: str):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.requests += 1
            return attr(*args, **kwargs)
        return call


def coordinator(design: str, address: str, ranks: int, window_s: float, go, t0_box, out) -> None:
    """The coordinator's read side, as runtime/coordinator.py does it per tick."""
    from seamguard.runtime import keys
    from seamguard.runtime.detect import Beat, HeartbeatTracker, NodeTracker

    raw_store = _connect(design, address)
    raw_store.set(keys.GENERATION, "0")
    for k in HINT_KEYS:
        raw_store.set(k, "0")
    store = _Counted(raw_store)
    view = raw_store.mirror(keys.ROOT + "/") if design == "aggregated" else store  # as Coordinator._family
    nodes = ranks // RANKS_PER_NODE
    wids = [str(w) for w in range(ranks)]
    workers = wids + [str(ranks + n) for n in range(nodes)]  # ranks and spares
    tracker = HeartbeatTracker(HANG_TIMEOUT_S, 10.0, 1.5, 8)
    node_tracker = NodeTracker(HANG_TIMEOUT_S)
    new_keys = keys.NewKeys(FULL_READ_S)
    out.put(("ready-coord", os.getpid()))
    go.wait()
    t0 = t0_box.value
    start, end = t0 + WARMUP_S, t0 + WARMUP_S + window_s
    kill_s = start + KILL_AT * window_s
    seen: dict[int, int] = {}
    stale: list[float] = []
    passes = 0
    detected: set[int] = set()
    detect_s = None
    false = 0
    pass_s: list[float] = []
    beating: list[int] = []   # ranks whose heartbeat key exists (Coordinator._beating)
    while time.monotonic() < end:
        t_pass = time.monotonic()
        beats: dict[int, dict] = {}
        if design == "flat":   # as Coordinator.tick with one TCPStore: hints, key count, beats
            keys.read_existing(store, list(HINT_KEYS))
            if new_keys.appeared(store, t_pass):
                keys.read_family(store, keys.EXIT_PREFIX, workers)
                keys.read_family(store, keys.DONE_PREFIX, wids)
            if len(beating) < ranks:
                beating = [w for w in range(ranks) if store.check([keys.heartbeat(w)])]
            raws = keys.read_existing(store, [keys.heartbeat(w) for w in beating])
            beats = {w: json.loads(r) for w, r in zip(beating, raws)}
        else:
            keys.read_family(view, keys.EXIT_PREFIX, workers)
            records = keys.read_family(view, keys.NODE_PREFIX, [str(n) for n in range(nodes)])
            keys.read_family(view, keys.DONE_PREFIX, wids)  # local copies: no store requests
            now = time.monotonic()
            for n, raw in records.items():
                rec = json.loads(raw)
                node_tracker.observe(int(n), rec["n"], {int(w) for w in rec["beats"]}, now)
                beats.update({int(w): b for w, b in rec["beats"].items()})
        now = time.monotonic()
        for w, b in beats.items():
            if seen.get(w) != b["n"]:
                if seen.get(w) is not None and now >= start:
                    stale.append(now - b["t"])
                seen[w] = b["n"]
                tracker.observe(w, Beat(b["n"], b["step"], b["phase"], b["compute_s"]), now)
        if design == "flat":
            verdicts = {v.wid for v in tracker.verdicts(list(range(ranks)), now) if v.kind == "unresponsive"}
            for w in verdicts - detected:
                tracker.forget(w)
                if w // RANKS_PER_NODE != 0 or now < kill_s:
                    false += 1
            detected |= verdicts
            if detect_s is None and all(w in detected for w in range(RANKS_PER_NODE)):
                detect_s = now - kill_s
        else:
            for node, _, _ in node_tracker.verdicts(now):
                if node != 0 or now < kill_s:
                    false += 1
                elif detect_s is None:
                    detect_s = now - kill_s
        if t_pass >= start:
            passes += 1
            pass_s.append(time.monotonic() - t_pass)
        else:
            store.requests = 0
        time.sleep(COORDINATOR_POLL_S)
    if view is not store:
        view.close()
    out.put(("coord", {"ops": store.requests, "passes": passes, "stale": stale, "detect_s": detect_s,
                       "false": false, "pass_s_p50": statistics.median(pass_s) if pass_s else None}))


# ------------------------------------------------------------------------ links (the new design)
LINK_VICTIM = 1  # node 0 runs the coordinator here; node 1 is the one that goes silent


class _VerdictProbe:
    """Times the silent node's way through the coordinator: the last line of it the hub
    read, every judging pass (as of when; the gap the hub forgave: `forgiven_s`; how long
    it read before judging: `read_through_s`), the pass that judged it and why, and the
    membership write that published the loss to etcd. It wraps this hub's and this
    roster's methods (instance attributes: the product's code runs unchanged) and only
    records times."""

    def __init__(self, hub, book, victim: int) -> None:
        self.last_line_s: float | None = None
        self.passes: list[tuple[float, float, float]] = []   # (as of, forgiven s, read-through s)
        self.verdict: tuple[float, str, float] | None = None   # (when, why, read-through s)
        self.published_s: float | None = None
        observe, judge, write = hub.observe, hub.judge, book.write

        def observing(report, now_s: float) -> None:
            if report.node == victim:
                self.last_line_s = now_s
            observe(report, now_s)

        def judging(as_of_s: float, *spared):
            lost = judge(as_of_s, *spared)
            read_s = hub.read_through_s   # judge_now sets it before it judges
            self.passes.append((as_of_s, hub.forgiven_s, read_s))
            if self.verdict is None and any(node == victim for node, _, _ in lost):
                self.verdict = (as_of_s + read_s, next(why for node, _, why in lost if node == victim), read_s)
            return lost

        async def writing(new):
            sent = await write(new)
            if sent and self.verdict is not None and self.published_s is None and victim not in new:
                self.published_s = time.monotonic()
            return sent
        hub.observe, hub.judge, book.write = observing, judging, writing


def detection_split(kill_s: float, last_sent_s: float | None, last_read_s: float | None,
                    passes: list[tuple[float, float, float]], verdict: tuple[float, str, float] | None,
                    published_s: float | None, timeout_s: float) -> dict:
    """Where a silent node's detection time went, in s, from its kill to its loss in etcd:
    ``last_sent`` (its last line's send, relative to the kill: <= 0), ``read_lag`` (that
    line's send to the hub reading it), ``timeout``, ``forgiven`` (pass gaps the hub
    forgave between that read and the verdict), ``pass_wait`` (from the deadline so moved
    to the moment the judging pass judged as of), ``read_through`` (that pass reading what
    had arrived by then), ``publish`` (the verdict to its membership write); they sum to
    ``published``, as ``verdict`` sums all but the last. None where the node was not judged."""
    if verdict is None or last_read_s is None:
        return {"path": None, "verdict_s": None, "published_s": None}
    verdict_at_s, why, read_s = verdict
    forgiven_s = sum(f for t, f, _ in passes if last_read_s < t <= verdict_at_s - read_s)
    last_sent_s = last_read_s if last_sent_s is None else last_sent_s
    split = {"last_sent": last_sent_s - kill_s, "read_lag": last_read_s - last_sent_s,
             "timeout": timeout_s, "forgiven": forgiven_s, "read_through": read_s}
    if "closed" in why:   # the faster path: its link closed, no timeout
        split.update(timeout=0.0, forgiven=0.0)
    split["pass_wait"] = verdict_at_s - kill_s - sum(split.values())
    split["publish"] = None if published_s is None else published_s - verdict_at_s
    return {"path": "link closed" if "closed" in why else "timeout",
            "verdict_s": round(verdict_at_s - kill_s, 3),
            "published_s": None if published_s is None else round(published_s - kill_s, 3),
            **{k: None if v is None else round(v, 3) for k, v in split.items()}}


def _bench_link_key() -> bytes:
    from seamguard.runtime.liveness import link_key

    return link_key(hintauth.read_key(Path(os.environ["SG_BENCH_DIR"]) / "key"))


def links_coordinator(address: str, ranks: int, window_s: float, node_beat_s: float, go, t0_box, out) -> None:
    """Node 0's launcher, elected: its `NodeMembership` (hub, roster in etcd, its own node's beats)."""
    import asyncio

    from seamguard.runtime import roster
    from seamguard.runtime.node_membership import NodeMembership

    host, port = address.rsplit(":", 1)
    key = _bench_link_key()
    out.put(("ready-coord", os.getpid()))

    async def play() -> dict:
        book = roster.Roster(roster.connect((host, int(port))), "bench")
        nm = NodeMembership(book, "bench", 0, lambda: {w: (1, 1) for w in range(RANKS_PER_NODE)}, key,
                            beat_s=node_beat_s, hang_timeout_s=HANG_TIMEOUT_S, nodes=ranks // RANKS_PER_NODE)
        stop = asyncio.Event()
        task = asyncio.create_task(nm.run(stop))
        while not nm.coordinates:
            await asyncio.sleep(0.05)
        probe = _VerdictProbe(nm.hub, book, LINK_VICTIM)
        where = Path(os.environ["SG_BENCH_DIR"]) / "hub"
        where.write_text(nm.address)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        t0 = t0_box.value
        start, end = t0 + WARMUP_S, t0 + WARMUP_S + window_s
        kill_s = start + KILL_AT * window_s
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        rev0, writes0, reports0 = await nm.etcd.call(book.revision()), book.writes, nm.hub.reports
        joined = len(book.members)
        seen_s = None
        while time.monotonic() < end:   # the victim's loss as the launcher's loop sees it (nm.lost)
            if seen_s is None and any(x.node == LINK_VICTIM for x in nm.lost):
                seen_s = time.monotonic() - kill_s
            await asyncio.sleep(0.01)
        rev1, writes1, reports1 = await nm.etcd.call(book.revision()), book.writes, nm.hub.reports
        stop.set()
        await asyncio.wait_for(task, 10)
        false = [x for x in nm.lost if x.node != LINK_VICTIM]
        return {"ops": 0, "reports_s": (reports1 - reports0) / window_s, "etcd_revisions": rev1 - rev0,
                "etcd_txns": writes1 - writes0, "joined": joined, "false": len(false),
                "false_nodes": sorted({x.node for x in false}),
                "refused": sum(nm.hub.gate.refused.values()), "terms": nm.terms,
                "seen_s": None if seen_s is None else round(seen_s, 3), "kill_s": kill_s,
                "last_read_s": probe.last_line_s, "verdict": probe.verdict, "published_s": probe.published_s,
                "passes": [x for x in probe.passes if start <= x[0] < end]}
    out.put(("coord", asyncio.run(play())))


class _SimulatedLinks:
    """The simulated launchers' links, one per node: each line signed as `NodeReporter`
    signs it (its 8 ranks' beats), the sequence numbers rising across reconnects."""

    def __init__(self, host: str, port: int, hub: str, key: bytes) -> None:
        self.host, self.port, self.hub, self.key = host, port, hub, key
        self.links: dict[int, socket.socket] = {}
        self.seq: dict[int, int] = {}
        self.reconnects = 0

    def _connect(self) -> socket.socket:
        link = socket.create_connection((self.host, self.port), timeout=10)
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return link

    def send(self, n: int) -> None:
        """One beat (the first opens the link); a link the hub closed is opened again at
        once, as NodeReporter would."""
        from seamguard.runtime.liveness import encode_report

        seq = self.seq[n] = self.seq.get(n, 0) + 1
        line = encode_report(self.key, "bench", self.hub, n, seq,
                             {n * RANKS_PER_NODE + i: (seq, seq) for i in range(RANKS_PER_NODE)})
        if n not in self.links:
            self.links[n] = self._connect()
        try:
            self.links[n].sendall(line)
        except OSError:
            self.reconnects += 1
            self.links[n].close()
            self.links[n] = self._connect()
            self.links[n].sendall(line)

    def goodbye(self) -> None:
        """Each link says goodbye and closes (a link the hub already closed at the window's
        end, its coordinator done first, says nothing)."""
        from seamguard.runtime.liveness import BYE, seal

        for n, link in self.links.items():
            self.seq[n] += 1
            try:
                link.sendall(seal(self.key, "bench", self.hub, n, self.seq[n], BYE, time.time_ns()))
            except OSError:
                pass
            link.close()


def links_generator(address: str, nodes: list[int], window_s: float, node_beat_s: float, go, t0_box, out,
                    nice: int = 0) -> None:
    """Simulated launchers: one TCP link each, sending what a `NodeReporter` sends (its
    node's 8 ranks' beats, one signed line, `liveness.encode_report`) every node beat on a
    fixed schedule; one thread sends for all of this process's nodes (a heap of due
    times), so a thousand simulated launchers cost the machine their lines, not a
    thousand event-loop timers. They do not campaign (no failover is exercised at scale)."""
    from seamguard.runtime.liveness import parse_hub_address

    host, port, hub = parse_hub_address((Path(os.environ["SG_BENCH_DIR"]) / "hub").read_text())
    os.nice(nice)
    links = _SimulatedLinks(host, port, hub, _bench_link_key())
    for n in nodes:   # each says its first line as it connects, as a launcher does
        links.send(n)
    t_first = time.monotonic()
    heap = [(t_first + node_beat_s * i / len(nodes), n) for i, n in enumerate(nodes)]   # phases spread
    out.put(("ready", os.getpid()))
    start = kill_s = float("inf")   # the window, once `go` says when
    sent_s: dict[int, float] = {}   # node -> when its simulated launcher last sent
    gap_s = {n: 0.0 for n in nodes}   # node -> its longest silence in the window
    sent = 0

    def beat(n: int, due_s: float, now_s: float) -> float | None:
        """As NodeReporter: on a fixed schedule; one more than a period late starts it again."""
        nonlocal sent
        if n == LINK_VICTIM and now_s >= kill_s:
            return None   # a hung host: its launcher stops, its link stays open
        if n in sent_s and now_s > start:
            gap_s[n] = max(gap_s[n], now_s - max(sent_s[n], start))
        links.send(n)
        sent_s[n] = now_s
        sent += now_s >= start
        return due_s + node_beat_s if due_s + node_beat_s > now_s else now_s + node_beat_s
    run_schedule(heap, beat, float("inf"), stop=go.is_set)   # beating before the window, as the job does
    start = t0_box.value + WARMUP_S
    end, kill_s = start + window_s, start + KILL_AT * window_s
    run_schedule(heap, beat, end)
    for n in nodes:   # a silence still open at the window's end counts too
        gap_s[n] = max(gap_s[n], end - max(sent_s.get(n, start), start))
    links.goodbye()   # an orderly end of the job
    silent = sorted(n for n in nodes if n != LINK_VICTIM and gap_s[n] > HANG_TIMEOUT_S)
    out.put(("gen", {"ops": sent, "late": 0, "silent_nodes": silent, "reconnects": links.reconnects,
                     "victim_last_sent_s": sent_s.get(LINK_VICTIM),
                     "gaps_s": {n: round(g, 3) for n, g in gap_s.items()}}))


def trial_links(ranks: int, window_s: float, procs: int, workdir: Path, node_beat_s: float, nice: int,
                system_nice: int) -> dict:
    from seamguard.testbed.multinode import EtcdServer

    ctx = mp.get_context("spawn")
    os.environ["SG_BENCH_DIR"] = str(workdir)
    (workdir / "hub").unlink(missing_ok=True)
    hintauth.create_key(workdir / "key")   # the job's key; every link line is signed with one derived from it
    etcd = EtcdServer.loopback(Path(tempfile.mkdtemp(prefix="sg-etcd-", dir="/dev/shm"))).start()
    go, box, out = ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
    nodes = list(range(1, ranks // RANKS_PER_NODE))
    coord = ctx.Process(target=links_coordinator, args=(etcd.address, ranks, window_s, node_beat_s, go, box, out))
    gens = [ctx.Process(target=links_generator, args=(etcd.address, nodes[i::procs], window_s, node_beat_s,
                                                      go, box, out, nice)) for i in range(procs)]
    try:
        coord.start()
        coord_pid = out.get(timeout=120)[1]
        _renice(etcd.pid, system_nice), _renice(coord_pid, system_nice)
        deadline = time.monotonic() + 60
        while not (workdir / "hub").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the coordinator was not elected")
            time.sleep(0.05)
        for g in gens:
            g.start()
        gen_pids = [out.get(timeout=180)[1] for _ in gens]
        box.value = time.monotonic() + 2 * node_beat_s   # the coordinator has written the joins
        go.set()
        time.sleep(max(0.0, box.value + WARMUP_S - time.monotonic()))
        ran_at = {"server_nice": _renice(etcd.pid, system_nice),   # again: threads started since
                  "coordinator_nice": _renice(coord_pid, system_nice)}
        meters = _Meters({"server": [etcd.pid], "coordinator": [coord_pid], "generators": gen_pids})
        load_1m = os.getloadavg()[0]
        time.sleep(window_s)
        cpu = meters.stop()
        results = [out.get(timeout=120) for _ in range(len(gens) + 1)]
        for c in [coord, *gens]:
            c.join(30)
    finally:
        for c in [coord, *gens]:
            if c.is_alive():
                c.kill()
        etcd.stop()
        shutil.rmtree(etcd.workdir, ignore_errors=True)
    co = next(r for k, r in results if k == "coord")
    gens = [r for k, r in results if k == "gen"]
    return {**cpu, **ran_at, "loadavg_1m": round(load_1m, 2), **_links_row(ranks, window_s, node_beat_s, co, gens)}


def _links_row(ranks: int, window_s: float, node_beat_s: float, co: dict, gens: list[dict]) -> dict:
    """A links trial's figures from what its coordinator and generators reported."""
    sent = sum(g["ops"] for g in gens)
    silent = {n for g in gens for n in g["silent_nodes"]}
    gaps = {int(n): gap for g in gens for n, gap in g["gaps_s"].items()}
    last_sent_s = next((g["victim_last_sent_s"] for g in gens if g["victim_last_sent_s"] is not None), None)
    split = detection_split(co["kill_s"], last_sent_s, co["last_read_s"], co["passes"], co["verdict"],
                            co["published_s"], HANG_TIMEOUT_S)
    when = [t for t, _, _ in co["passes"]]
    return {
        "coordinator_terms": co["terms"], "detection": split, "seen_by_launcher_loop_s": co["seen_s"],
        "pass_gap_max_s": round(max((b - a for a, b in zip(when, when[1:])), default=0.0), 3),
        "forgiven_in_window_s": round(sum(f for _, f, _ in co["passes"]), 3),
        "design": "links", "ranks": ranks, "demanded_ops_s": 0, "ops_s": 0, "coordinator_ops_s": 0,
        "link_reports_s": round(co["reports_s"]), "link_reports_sent_s": round(sent / window_s),
        "demanded_link_reports_s": round((ranks // RANKS_PER_NODE) / node_beat_s),
        "etcd_revisions_in_window": co["etcd_revisions"], "etcd_txns_in_window": co["etcd_txns"],
        "link_lines_refused": co["refused"],
        "server_cpu_us_per_op": None, "projected_server_cpu_pct": None,
        "staleness_p50_s": None, "staleness_p99_s": None,
        "detect_s": split["verdict_s"], "false_verdicts": co["false"], "coordinator_pass_s": None, "late_actions": 0,
        "simulated_launchers_silent": len(silent),
        "simulated_link_reconnects": sum(g["reconnects"] for g in gens),
        "false_verdicts_on_nodes_that_sent": len(set(co["false_nodes"]) - silent),
        "false_verdicts_on_nodes_never_silent_half_timeout": sum(
            gaps.get(n, 0.0) <= HANG_TIMEOUT_S / 2 for n in set(co["false_nodes"]) - silent),
    }


# ------------------------------------------------------------------------ one trial
def trial(design: str, ranks: int, window_s: float, procs: int, threads: int, workdir: Path,
          node_beat_s: float, system_nice: int) -> dict:
    ctx = mp.get_context("spawn")
    server, etcd = None, None
    if design == "flat":
        port_file = workdir / "port"
        port_file.unlink(missing_ok=True)
        server = ctx.Process(target=_tcp_server, args=(str(port_file),), daemon=True)
        server.start()
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("TCPStore server did not start")
            time.sleep(0.05)
        address, server_pid = f"127.0.0.1:{port_file.read_text()}", server.pid
    else:
        from seamguard.testbed.multinode import EtcdServer

        # data on tmpfs: etcd fsyncs every write, and this machine's shared disk would measure the
        # disk; production etcd wants a dedicated SSD (https://etcd.io/docs/v3.4/op-guide/hardware/)
        etcd = EtcdServer.loopback(Path(tempfile.mkdtemp(prefix="sg-etcd-", dir="/dev/shm"))).start()
        address, server_pid = etcd.address, etcd.pid
    go = ctx.Event()
    box = ctx.Value("d", 0.0)
    out = ctx.Queue()
    nodes = list(range(ranks // RANKS_PER_NODE))
    children = [ctx.Process(target=coordinator, args=(design, address, ranks, window_s, go, box, out))]
    children += [ctx.Process(target=generator, args=(design, address, nodes[i::procs], window_s, threads, node_beat_s,
                                                     go, box, out)) for i in range(procs)]
    try:
        for c in children:
            c.start()
        readies = [out.get(timeout=180) for _ in children]
        coord_pid = next(pid for kind, pid in readies if kind == "ready-coord")
        box.value = time.monotonic() + 0.2
        go.set()
        ran_at = {"server_nice": _renice(server_pid, system_nice), "coordinator_nice": _renice(coord_pid, system_nice)}
        time.sleep(max(0.0, box.value + WARMUP_S - time.monotonic()))
        meters = _Meters({"server": [server_pid], "coordinator": [coord_pid],
                          "generators": [pid for kind, pid in readies if kind == "ready"]})
        load_1m = os.getloadavg()[0]
        time.sleep(window_s)
        cpu = meters.stop()
        results = [out.get(timeout=120) for _ in children]
        for c in children:
            c.join(30)
    finally:
        for c in children:
            if c.is_alive():
                c.kill()
        if server is not None:
            server.kill()
            server.join(10)
        if etcd is not None:
            etcd.stop()
            shutil.rmtree(etcd.workdir, ignore_errors=True)
    coord = next(r for k, r in results if k == "coord")
    gens = [r for k, r in results if k == "gen"]
    return {**cpu, **ran_at, "loadavg_1m": round(load_1m, 2),
            **_store_row(design, ranks, window_s, node_beat_s, coord, gens, cpu["server_cpu_pct"] / 100 * window_s)}


def _store_row(design: str, ranks: int, window_s: float, node_beat_s: float, coord: dict, gens: list[dict],
               server_cpu_s: float) -> dict:
    """A flat or aggregated trial's figures from what its coordinator and generators reported."""
    ops = sum(g["ops"] for g in gens) + coord["ops"]  # requests in the window
    demanded_s = demanded_ops_s(design, ranks, node_beat_s)
    stale = sorted(coord["stale"])
    pct = (lambda q: stale[min(len(stale) - 1, int(q * len(stale)))] if stale else None)
    return {
        "design": design, "ranks": ranks,
        "demanded_ops_s": round(demanded_s),
        "ops_s": round(ops / window_s),
        "coordinator_ops_s": round(coord["ops"] / window_s),
        "server_cpu_us_per_op": round(1e6 * server_cpu_s / max(1, ops), 1),
        "projected_server_cpu_pct": round(100 * server_cpu_s / max(1, ops) * (demanded_s + coord["ops"] / window_s), 1),
        "staleness_p50_s": pct(0.5), "staleness_p99_s": pct(0.99),
        "detect_s": coord["detect_s"], "false_verdicts": coord["false"],
        "coordinator_pass_s": coord["pass_s_p50"], "late_actions": sum(g["late"] for g in gens),
    }


def _spread(values: list[float | None]) -> dict:
    got = [v for v in values if v is not None]
    if not got:
        return {"median": None, "min": None, "max": None, "missing": len(values)}
    return {"median": round(statistics.median(got), 4), "min": round(min(got), 4), "max": round(max(got), 4),
            "missing": len(values) - len(got)}


FIGURES = ("ops_s", "coordinator_ops_s", "server_cpu_pct", "coordinator_cpu_pct", "server_cpu_us_per_op",
           "projected_server_cpu_pct", "staleness_p50_s", "staleness_p99_s",
           "detect_s", "false_verdicts", "coordinator_pass_s",
           "link_reports_s", "link_reports_sent_s", "demanded_link_reports_s", "etcd_revisions_in_window",
           "simulated_launchers_silent", "false_verdicts_on_nodes_that_sent",
           "false_verdicts_on_nodes_never_silent_half_timeout",
           "coordinator_waiting_pct", "generators_cpu_pct", "machine_busy_pct", "loadavg_1m",
           "pass_gap_max_s", "forgiven_in_window_s")
DESIGNS = ("flat", "aggregated", "links")


def summarize(trials: list[dict]) -> dict:
    out: dict = {}
    for design in DESIGNS:
        for ranks in sorted({t["ranks"] for t in trials}):
            mine = [t for t in trials if t["design"] == design and t["ranks"] == ranks]
            if mine:
                out.setdefault(design, {})[str(ranks)] = {
                    "demanded_ops_s": mine[0]["demanded_ops_s"],
                    **{f: _spread([t.get(f) for t in mine]) for f in FIGURES}}
    ratios = {}
    for ranks, agg in out.get("aggregated", {}).items():
        flat = out.get("flat", {}).get(ranks)
        if flat and agg["server_cpu_pct"]["median"] and flat["server_cpu_pct"]["median"]:
            ratios[ranks] = {
                "demanded_ops_ratio": round(flat["demanded_ops_s"] / agg["demanded_ops_s"], 1),
                "server_cpu_ratio": round(flat["server_cpu_pct"]["median"] / agg["server_cpu_pct"]["median"], 2),
                "projected_server_cpu_ratio": round(flat["projected_server_cpu_pct"]["median"]
                                                    / agg["projected_server_cpu_pct"]["median"], 2)}
    out["flat_over_aggregated"] = ratios
    out["aggregated_over_links"] = {
        ranks: {f: round(agg[f]["median"] / links[f]["median"], 1)
                for f in ("server_cpu_pct", "coordinator_cpu_pct") if agg[f]["median"] and links[f]["median"]}
        for ranks, links in out.get("links", {}).items() if (agg := out.get("aggregated", {}).get(ranks))}
    return out


def _fmt(s: dict, unit: str = "") -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median']:g}{unit} [{s['min']:g}-{s['max']:g}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k and 3k ranks, 2 reps of 4 s windows (about 2-3 minutes)")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--window-s", type=float)
    ap.add_argument("--scales", help="comma-separated rank counts (1000,3000 with --quick, else 1000,3000,10000)")
    ap.add_argument("--node-beat-s", type=float, default=NODE_BEAT_S,
                    help="a node's launcher's record period (the launch's --node-beat-s)")
    ap.add_argument("--procs", type=int, default=3, help="generator processes per trial")
    ap.add_argument("--threads", type=int, default=8, help="store connections (threads) per generator")
    ap.add_argument("--generator-nice", type=int, default=0,
                    help="links: the nice value of the simulated launchers' processes (see the docstring)")
    ap.add_argument("--system-nice", type=int, default=SYSTEM_NICE,
                    help="the nice value of the processes under test, every design's store server and coordinator "
                         "(see the docstring; below 0 needs root)")
    ap.add_argument("--designs", default=",".join(DESIGNS), help=f"comma-separated, of {', '.join(DESIGNS)}")
    ap.add_argument("--out", type=Path, help="result file (default: results/membership_load[_quick].json)")
    args = ap.parse_args()
    designs = tuple(d for d in args.designs.split(",") if d)
    if not designs or set(designs) - set(DESIGNS):
        ap.error(f"--designs: {args.designs!r} is not a list of {', '.join(DESIGNS)}")
    reps = args.reps or (2 if args.quick else 3)
    window_s = args.window_s or (4.0 if args.quick else 6.0)
    scales = [int(x) for x in (args.scales or ("1000,3000" if args.quick else "1000,3000,10000")).split(",")]
    for s in scales:
        if s < 2 * RANKS_PER_NODE or s % RANKS_PER_NODE:
            ap.error(f"--scales: {s} is not a multiple of {RANKS_PER_NODE} ranks per node (>= 16)")
    trials = []
    t_start = time.monotonic()
    load0 = os.getloadavg()
    started = provenance()
    with tempfile.TemporaryDirectory(prefix="sg-membership-") as tmp:
        for rep in range(reps):
            order = designs[rep % len(designs):] + designs[:rep % len(designs)]   # rotated every repetition
            for ranks in scales:
                for design in order:
                    t = (trial_links(ranks, window_s, args.procs, Path(tmp), args.node_beat_s, args.generator_nice,
                                     args.system_nice)
                         if design == "links"
                         else trial(design, ranks, window_s, args.procs, args.threads, Path(tmp), args.node_beat_s,
                                    args.system_nice))
                    t["rep"] = rep
                    trials.append(t)
                    print(f"rep {rep} {design:10s} {ranks:6d} ranks: {t['ops_s']:8d} store ops/s of "
                          f"{t['demanded_ops_s']:8d} demanded, link reports/s {t.get('link_reports_s', '-')} of "
                          f"{t.get('demanded_link_reports_s', '-')}, etcd revisions {t.get('etcd_revisions_in_window', '-')}, "
                          f"server {t['server_cpu_pct']:5.1f} % CPU, coordinator {t['coordinator_cpu_pct']:5.1f} % "
                          f"({t['server_cpu_us_per_op']} us/op), "
                          f"staleness p50 {t['staleness_p50_s']} p99 {t['staleness_p99_s']} s, "
                          f"node loss detected in {t['detect_s']} s, {t['false_verdicts']} false verdicts "
                          f"({t.get('false_verdicts_on_nodes_that_sent', '-')} on nodes that sent within the timeout, "
                          f"{t.get('false_verdicts_on_nodes_never_silent_half_timeout', '-')} of them never silent "
                          f"half of it; "
                          f"{t.get('simulated_launchers_silent', '-')} simulated launchers starved past it), "
                          f"coordinator pass {t['coordinator_pass_s']} s; coordinator waited for a core "
                          f"{t['coordinator_waiting_pct']} %, generators {t['generators_cpu_pct']} % CPU, machine busy "
                          f"{t['machine_busy_pct']} % of a core, load {t['loadavg_1m']}", flush=True)
                    if "detection" in t:
                        print(f"    detection: {json.dumps(t['detection'])}; longest pass gap {t['pass_gap_max_s']} s, "
                              f"forgiven {t['forgiven_in_window_s']} s in the window", flush=True)
    summary = summarize(trials)
    for design in designs:
        for ranks, f in summary.get(design, {}).items():
            print(f"{design:10s} {ranks:>6s}: ops/s {_fmt(f['ops_s'])} (demanded {f['demanded_ops_s']}), "
                  f"server CPU {_fmt(f['server_cpu_pct'], '%')}, coordinator CPU {_fmt(f['coordinator_cpu_pct'], '%')} "
                  f"({_fmt(f['server_cpu_us_per_op'], ' us/op')}; "
                  f"at the demanded rate {_fmt(f['projected_server_cpu_pct'], '%')}), staleness p50 {_fmt(f['staleness_p50_s'], 's')} "
                  f"p99 {_fmt(f['staleness_p99_s'], 's')}, detection {_fmt(f['detect_s'], 's')}, "
                  f"false verdicts {_fmt(f['false_verdicts'])}")
    result = {"benchmark": "membership_load", "quick": args.quick, "reps": reps, "window_s": window_s,
              "ranks_per_node": RANKS_PER_NODE, "heartbeat_s": HEARTBEAT_S, "node_beat_s": args.node_beat_s,
              "hang_timeout_s": HANG_TIMEOUT_S, "generator_procs": args.procs, "generator_nice": args.generator_nice, "system_nice": args.system_nice, "threads_per_generator": args.threads,
              "cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load0],
              "loadavg_end": [round(x, 2) for x in os.getloadavg()],
              "wall_s": round(time.monotonic() - t_start, 1), "summary": summary, "trials": trials}
    out = args.out or RESULTS / f"membership_load{'_quick' if args.quick else ''}.json"
    write_result(out, result, started)   # with the commit and the load at start and end
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
