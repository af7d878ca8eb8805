"""What a failure-free job costs etcd (Debian's etcd-server on loopback ports): the
coordinator's steady pass, a node beat, and that reading less misses nothing (a hint, an
evacuation, a lost node)."""

from __future__ import annotations

import json
import signal
import time
import uuid

import pytest

from seamguard import hintauth
from seamguard.runtime import keys
from seamguard.runtime.coordinator import Coordinator
from seamguard.runtime.launcher import STEADY_PASS_S, Child, _NodeBeat, _wait_s
from seamguard.runtime.settings import LaunchSettings
from seamguard.runtime.store import EtcdStore
from tests.runtime.coordinator_helpers import run_first_generation
from tests.runtime.conftest import etcd_store

pytestmark = pytest.mark.timeout(120)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _record(n: int, step: int, wids=(0, 1)) -> str:
    beat = {"n": n, "step": step, "phase": "compute", "compute_s": 0.1, "gen": 0}
    return json.dumps({"n": n, "beats": {str(w): beat for w in wids}})


def _until(seen, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not seen():
        assert time.monotonic() < deadline, f"the watched copy never showed {what}"
        time.sleep(0.005)


class LaggingMirror:
    """A copy of the job's keys that shows the store only when told to (`catch_up`): a
    watch stream as far behind as it may be."""

    def __init__(self, store: EtcdStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix
        self.catch_up()

    def catch_up(self) -> None:
        self.values, self.revisions, _ = self.store._range_prefix_revisions(self.prefix)

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def revision_of(self, key: str) -> int:
        return self.revisions.get(key, 0)


def _running(etcd, events: list, mirror=None, nodes: int = 1):
    """A coordinator (node 0 of ``nodes``, aggregated: etcd) whose job runs at step 40:
    (coordinator, its store, a second handle for what others write, clock). One node:
    ranks w0 w1, spare w2; two: a rank and a spare a node (w0 w1 | w2 w3)."""
    prefix = f"/traffic-{uuid.uuid4().hex[:8]}/"
    store, other, clock = etcd_store(etcd, prefix), etcd_store(etcd, prefix), Clock()
    if mirror is not None:
        store.mirror = lambda p: mirror.setdefault("copy", LaggingMirror(store, p))
    s = LaunchSettings(script=["x.py"], nproc=3 - nodes, spares=nodes - 1 if nodes > 1 else 0, nnodes=nodes,
                       store=f"etcd://{etcd.address}")
    trainers, spares = ([0, 1], [2]) if nodes == 1 else ([0, 2], [1, 3])
    c = Coordinator(store, s, trainers, spares, None, 30.0, events.append, clock=clock)
    run_first_generation(c, other, trainers + spares)
    for node in range(nodes):
        other.set(keys.node_beats(node), _record(1, 40, (0, 1) if nodes == 1 else (2 * node, 2 * node + 1)))
    if mirror is not None:
        mirror["copy"].catch_up()
    clock.t += 0.05
    c.tick()   # starts the watched copy
    return c, store, other, clock


def test_a_steady_pass_sends_etcd_nothing_and_still_sees_the_beats(etcd):
    c, store, other, clock = _running(etcd, [])
    for n in range(2, 6):
        other.set(keys.node_beats(0), _record(n, 40 + n))
        _until(lambda n=n: _seen_record(c, n), f"record {n}")
        clock.t += 0.05
        before = sum(store.requests.values())
        c.tick()
        # before: a request per hint key (7), the joined count and the key count: 9 a pass
        assert sum(store.requests.values()) - before == 0
        assert c._furthest_step == 40 + n
    assert c.phase == "running"


def _seen_record(c: Coordinator, n: int) -> bool:
    raw = c._watched().get(keys.node_beats(0))
    return raw is not None and json.loads(raw)["n"] == n


def test_a_hint_reaches_a_pass_through_the_watched_copy(etcd):
    c, _, other, clock = _running(etcd, [])
    control = int(other.get(keys.CONTROL_N))
    hintauth.send(other, keys.HINT_CHECKPOINT_REQ, "now", c.hint_key, keys.HINT_CHECKPOINT)
    _until(lambda: c._watched().get(keys.HINT_CHECKPOINT) == b"1", "the checkpoint hint")
    clock.t += 0.05
    c.tick()
    assert int(other.get(keys.HINT_PERSIST_AT)) >= 40 + 3
    assert int(other.get(keys.CONTROL_N)) == control + 1


def test_an_evacuation_is_acted_on_once_while_the_copy_still_shows_it(etcd):
    events, lagging = [], {}
    c, _, other, clock = _running(etcd, events, mirror=lagging)
    hintauth.send(other, keys.HINT_EVACUATE, "1", c.hint_key)
    lagging["copy"].catch_up()
    clock.t += 0.05
    c.tick()
    evacuated = [e for e in events if e.get("kind") == "evacuate_hint"]
    assert [e["rank"] for e in evacuated] == [1]
    assert other.get(keys.HINT_EVACUATE) == b""
    for _ in range(3):   # the copy has not caught up with the clearing: "1" is old news
        clock.t += 0.05
        c.tick()
    assert len([e for e in events if e.get("kind") == "evacuate_hint"]) == 1
    hintauth.send(other, keys.HINT_EVACUATE, "0", c.hint_key)   # a new request, written after the clearing
    lagging["copy"].catch_up()
    clock.t += 0.05
    c.tick()
    assert [e["rank"] for e in events if e.get("kind") == "evacuate_hint"] == [1, 0]


def test_a_node_whose_record_stands_still_is_lost_within_the_hang_timeout(etcd):
    events = []
    c, _, other, clock = _running(etcd, events, nodes=2)
    _until(lambda: c._watched().get(keys.node_beats(1)) is not None, "node 1's record")
    t0 = clock.t
    for n in range(2, 100):   # node 0's own record keeps moving; node 1's stands still
        other.set(keys.node_beats(0), _record(n, 40 + n))
        _until(lambda n=n: _seen_record(c, n), f"record {n}")
        clock.t += 0.05
        c.tick()
        if any(e["event"] == "node_lost" for e in events):
            break
    lost = [e for e in events if e["event"] == "node_lost"]
    assert [(e["node"], e["wids"]) for e in lost] == [(1, [2, 3])]
    assert clock.t - t0 <= c.settings.hang_timeout_s + 0.1


class FakeProc:
    def __init__(self) -> None:
        self.signals = []

    def poll(self):
        return None

    def send_signal(self, sig) -> None:
        self.signals.append(sig)


class CountedLocal:
    """The node's own TCPStore, counting the launcher's requests to it."""

    def __init__(self, inner) -> None:
        self.inner, self.requests = inner, 0

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        def counted(*args):
            self.requests += 1
            return method(*args)
        return counted


def test_a_node_beat_is_one_etcd_request_and_two_local_ones(etcd):
    prefix = f"/beat-{uuid.uuid4().hex[:8]}/"
    job, other = etcd_store(etcd, prefix), etcd_store(etcd, prefix)
    s = LaunchSettings(script=["x.py"], nproc=2, spares=1, store=f"etcd://{etcd.address}")
    node = _NodeBeat(job, s)
    children = [Child(w, FakeProc()) for w in (0, 1, 2)]
    for w in (0, 1, 2):
        node.local.set(keys.heartbeat(w), json.dumps({"n": 1, "step": 7 + w}))
    other.set(keys.GENERATION, "0")
    other.set(keys.kill_request(2), "1")
    node.local = CountedLocal(node.local)
    before = sum(job.requests.values())
    assert node.maybe_beat(children) is None
    assert sum(job.requests.values()) - before == 1
    # a check of the three heartbeat keys and one multi_get (before: a check and a get each),
    # then the generation and its wake key mirrored to the workers
    assert node.local.requests == 4
    record = json.loads(other.get(keys.node_beats(0)))
    assert {w: b["step"] for w, b in record["beats"].items()} == {"0": 7, "1": 8, "2": 9}
    assert children[2].proc.signals == [signal.SIGKILL] and not children[0].proc.signals
    node.next_s = 0.0
    node.local.requests = 0
    node.maybe_beat(children)
    assert node.local.requests == 2   # the generation did not change: not written again
    node.link.close(orderly=False)


def _until_local(node, key: str, timeout_s: float = 10.0) -> bytes:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.local.check([key]):
            return node.local.get(key)
        time.sleep(0.01)
    raise AssertionError(f"{key} never reached the node's store")


def test_a_new_generation_reaches_the_nodes_store_without_a_node_beat(etcd):
    """The node's generation follower mirrors what the coordinator announces (the counter,
    the generation, a wake key for every generation up to it) with no node beat run, and
    at the job's end mirrors the wake key that carries it and stops."""
    prefix = f"/follow-{uuid.uuid4().hex[:8]}/"
    job, other = etcd_store(etcd, prefix), etcd_store(etcd, prefix)
    node = _NodeBeat(job, LaunchSettings(script=["x.py"], nproc=1, store=f"etcd://{etcd.address}"))
    other.set(keys.CONTROL_N, "0")
    node.follow_generations(lambda: etcd_store(etcd, prefix))
    other.set(keys.GENERATION, "0")   # the coordinator's order: the generation, then its wake key
    other.set(keys.wake(0), "1")
    assert _until_local(node, keys.wake(0)) == b"1"
    assert node.local.get(keys.GENERATION) == b"0" and node.local.get(keys.CONTROL_N) == b"0"
    # generation 2 is announced before the follower read generation 1: both are woken
    other.set(keys.CONTROL_N, "7")
    other.set(keys.GENERATION, "2")
    other.set(keys.wake(2), "1")
    other.set(keys.wake(1), "1")
    assert _until_local(node, keys.wake(2)) == b"1"
    assert node.local.get(keys.wake(1)) == b"1"
    assert node.local.get(keys.GENERATION) == b"2" and node.local.get(keys.CONTROL_N) == b"7"
    other.set(keys.wake(3), "done")
    assert _until_local(node, keys.wake(3)) == b"done"
    assert node.local.get(keys.GENERATION) == b"2"
    node.link.close(orderly=False)


def test_a_node_beat_reads_a_worker_that_has_not_beaten_yet_as_absent(etcd):
    job = etcd_store(etcd, f"/beat-{uuid.uuid4().hex[:8]}/")
    node = _NodeBeat(job, LaunchSettings(script=["x.py"], nproc=2, store=f"etcd://{etcd.address}"))
    node.local.set(keys.heartbeat(0), json.dumps({"n": 1, "step": 3}))
    node.maybe_beat([Child(w, FakeProc()) for w in (0, 1)])
    assert list(json.loads(job.get(keys.node_beats(0)))["beats"]) == ["0"]
    node.link.close(orderly=False)


def test_a_node_launcher_sleeps_until_its_next_beat():
    beat_s = LaunchSettings(script=["x.py"]).node_beat_s
    node = type("Beat", (), {"next_s": 10.0 + beat_s})()
    assert _wait_s(None, node, pass_s=0.0, now_s=10.0) == pytest.approx(beat_s)
    assert beat_s > STEADY_PASS_S   # before, it woke every STEADY_PASS_S with nothing to do


def test_the_coordinators_node_hands_its_record_over_in_process_and_writes_etcd_only_on_change(etcd):
    """Node 0's launcher runs the coordinator: its record reaches it in process every beat
    (`own_record`); etcd gets it once, then again only when node 0's workers change (what a
    successor reads of a dead coordinator's node), not every beat. The other nodes' sign of
    the coordinator's life is its election key, not this record."""
    job = etcd_store(etcd, f"/own-{uuid.uuid4().hex[:8]}/")
    node = _NodeBeat(job, LaunchSettings(script=["x.py"], nproc=2, store=f"etcd://{etcd.address}"))
    children = [Child(w, FakeProc()) for w in (0, 1)]
    for w in (0, 1):
        node.local.set(keys.heartbeat(w), json.dumps({"n": 1, "step": 3}))

    def beat(kids) -> int:
        node.next_s = 0.0
        node.maybe_beat(kids)
        return json.loads(job.get(keys.node_beats(0)))["n"]
    try:
        assert beat(children) == 1                              # the first record is stored
        assert [beat(children) for _ in range(19)] == [1] * 19  # then not, while nothing changes
        assert node.own_record["n"] == 20 and sorted(node.own_record["beats"]) == ["0", "1"]
        children[1].reported = True                             # a worker ended: its workers changed
        assert beat(children) == 21 and beat(children) == 21
    finally:
        node.link.close(orderly=False)
        job.close()
