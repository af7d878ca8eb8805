"""Store traffic of a running job: what the coordinator's pass and a rank's step boundary
read, and that reading less misses nothing (an exit, a hint, a control change)."""

import datetime
import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from seamguard import hintauth
from seamguard.runtime import keys
from seamguard.runtime.coordinator import Coordinator
from seamguard.runtime.settings import LaunchSettings
from seamguard.runtime.clock import SYSTEM_CLOCK
from seamguard.runtime.follower import ControlKeys, MembershipFollower
from seamguard.runtime.profile import PhaseClock
from seamguard.runtime.records import Board, Controls, Progress
from tests.runtime.coordinator_helpers import run_first_generation


class Counted:
    """A real TCPStore (so multi_get waits on a missing key, as in a job: a short timeout
    turns that into an error) that counts the requests made through it."""

    def __init__(self) -> None:
        self.inner = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=2))
        self.requests = 0

    def __getattr__(self, name):
        if name not in ("check", "get", "set", "add", "multi_get", "num_keys"):
            raise AttributeError(name)
        method = getattr(self.inner, name)

        def counted(*args):
            self.requests += 1
            return method(*args)
        return counted


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def beat(store, wid: int, n: int, step: int) -> None:
    store.set(keys.heartbeat(wid), json.dumps({"n": n, "step": step, "phase": "compute",
                                               "compute_s": 0.1, "gen": 0}))


@pytest.fixture
def running():
    """A coordinator over a real store, its job running at step 40: (coordinator, store, clock)."""
    store, clock = Counted(), Clock()
    c = Coordinator(store, LaunchSettings(script=["x.py"], nproc=2), [0, 1], [2], None, 30.0,
                    lambda _: None, clock=clock)
    run_first_generation(c, store, [0, 1, 2])
    for w in (0, 1):
        beat(store, w, 1, 40)
    clock.t += 0.05
    c.tick()   # the first reads of the beats and of the key families
    return c, store, clock


def test_a_steady_pass_reads_the_key_count_the_hints_and_the_beats_once_each(running):
    c, store, clock = running
    for n in range(2, 6):
        for w in (0, 1):
            beat(store, w, n, 40 + n)
        clock.t += 0.05
        before = store.requests
        c.tick()
        assert store.requests - before == 3   # num_keys, hint keys, heartbeats
    assert c.phase == "running" and c._furthest_step == 45


def test_an_exit_is_seen_at_the_next_pass(running):
    c, store, clock = running
    clock.t += 0.05
    c.tick()
    store.set(keys.exit_code(1), "-9")
    clock.t += 0.05
    c.tick()
    assert c.plan.gen == 1 and 1 not in c.plan.ranks


def test_a_hint_is_seen_at_the_next_pass_and_moves_the_control_counter(running):
    c, store, clock = running
    control = int(store.get(keys.CONTROL_N))
    hintauth.send(store, keys.HINT_CHECKPOINT_REQ, "now", c.hint_key, keys.HINT_CHECKPOINT)
    clock.t += 0.05
    c.tick()
    assert int(store.get(keys.HINT_PERSIST_AT)) >= 40 + 3
    assert int(store.get(keys.CONTROL_N)) == control + 1


def test_keys_that_appear_while_others_go_are_read_within_the_full_read_interval():
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    store.set("a", "1")
    seen = keys.NewKeys(full_every_s=0.5)
    assert seen.appeared(store, 0.0)
    assert not seen.appeared(store, 0.1)
    store.delete_key("a")
    store.set("b", "1")   # the count is as it was
    assert not seen.appeared(store, 0.2)
    assert seen.appeared(store, 0.6)
    store.set("c", "1")
    assert seen.appeared(store, 0.7)


def test_a_store_that_cannot_count_its_keys_is_read_every_time():
    seen = keys.NewKeys(full_every_s=0.5)
    assert seen.appeared(object(), 0.0) and seen.appeared(object(), 0.0)


class ControlStore:
    """keys.CONTROL_N and one step mode, counting reads."""

    def __init__(self, counter: int) -> None:
        self.d = {keys.CONTROL_N: str(counter).encode(), keys.STEP_MODES: b"40 - on"}
        self.reads = 0

    def check(self, ks):
        self.reads += 1
        return all(k in self.d for k in ks)

    def get(self, k):
        self.reads += 1
        return self.d[k]


class _Rank:
    """The part of a Runtime that reads the control keys at a step boundary: its
    ControlKeys, on the Controls record its heartbeat publishes and a clock of the test's."""

    def __init__(self, store, beat, last_step_s, now, mirror_lag_s=0.0):
        self.controls = Board(Controls())
        clock = SimpleNamespace(monotonic=lambda: now[0])
        self.keys = ControlKeys(store, self.controls, 0.2, mirror_lag_s, clock)
        self._control_beat, self._last_step_s = beat, last_step_s

    @property
    def _control_beat(self):
        return self.controls.current.control_n, self.controls.current.control_read_s

    @_control_beat.setter
    def _control_beat(self, beat):   # what the heartbeat read: (counter, when)
        self.controls.update(control_n=beat[0], control_read_s=beat[1])

    @property
    def _mirror_lag_s(self):
        return self.keys.mirror_lag_s

    @_mirror_lag_s.setter
    def _mirror_lag_s(self, lag_s):
        self.keys.mirror_lag_s = lag_s

    def at_boundary(self):
        return self.keys.at_boundary(self._last_step_s)


def test_a_rank_reads_the_control_keys_only_when_the_counter_moves():
    now = [100.0]
    store = ControlStore(3)
    rank = _Rank(store, (3, 99.95), last_step_s=0.2, now=now)
    assert rank.at_boundary()[keys.STEP_MODES] == b"40 - on"
    first = store.reads
    assert rank.at_boundary()[keys.STEP_MODES] == b"40 - on"
    assert store.reads == first   # fresh heartbeat reading, same counter: no request
    store.d[keys.STEP_MODES] = b"40 - on\n55 - off"
    store.d[keys.CONTROL_N] = b"4"
    rank._control_beat = (4, 99.99)
    assert rank.at_boundary()[keys.STEP_MODES] == b"40 - on\n55 - off"


def test_a_heartbeat_reading_older_than_a_heartbeat_and_a_step_is_not_relied_on():
    now = [100.0]
    store = ControlStore(3)
    rank = _Rank(store, (3, 99.9), last_step_s=0.2, now=now)
    rank.at_boundary()
    store.d[keys.STEP_MODES] = b"70 - off"
    store.d[keys.CONTROL_N] = b"4"   # changed after the heartbeat's reading (counter 3) ...
    rank._last_step_s = 0.05         # ... which is 0.1 s old: within a heartbeat interval
    assert rank.at_boundary()[keys.STEP_MODES] == b"40 - on"
    now[0] = 100.15                  # 0.25 s: older than a heartbeat interval and a step: read now
    assert rank.at_boundary()[keys.STEP_MODES] == b"70 - off"
    # slow steps: a reading up to a step old, less the node beat its mirror may lag by
    store.d[keys.STEP_MODES], store.d[keys.CONTROL_N] = b"80 - on", b"5"
    rank._control_beat, rank._last_step_s, rank._mirror_lag_s = (4, 99.81), 0.6, 0.25
    assert rank.at_boundary()[keys.STEP_MODES] == b"70 - off"   # 0.34 s <= 0.6 - 0.25
    now[0] = 100.17                                                  # 0.36 s
    assert rank.at_boundary()[keys.STEP_MODES] == b"80 - on"


def _follower(server: dist.TCPStore) -> MembershipFollower:
    """A Runtime's membership follower, on its own client of ``server`` (not started)."""
    return MembershipFollower(
        0, lambda: dist.TCPStore("127.0.0.1", server.port, None, False, timeout=datetime.timedelta(seconds=5)),
        0.2, Board(Progress()), Board(Controls()), ("node0", 0), SYSTEM_CLOCK, PhaseClock(False))


def _until(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_rank_learns_each_generation_from_its_wake_key_without_a_heartbeat():
    """No heartbeat runs here: the follower alone sees generations as their wake keys
    appear (a generation announced while it was away is taken as a whole), and it stops at
    the wake key that carries the job's end instead of spinning on it."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    rank = _follower(server)
    follower = threading.Thread(target=rank.follow_generations, daemon=True)
    follower.start()
    server.set(keys.GENERATION, "0")
    server.set(keys.wake(0), "1")
    _until(lambda: rank.controls.current.gen_seen == 0, "generation 0 not seen")
    server.set(keys.GENERATION, "3")
    server.set(keys.wake(1), "1")
    _until(lambda: rank.controls.current.gen_seen == 3, "generation 3 not seen")
    server.set(keys.wake(4), "done")   # JOB_DONE's wake key: the generation stays 3
    follower.join(timeout=10)
    assert not follower.is_alive() and rank.controls.current.gen_seen == 3
    rank.see_generation(2)   # the heartbeat's older reading never moves it back
    assert rank.controls.current.gen_seen == 3
