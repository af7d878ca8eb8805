"""The records the runtime's parts exchange (runtime/records.py), its typed settings in
the environment (RuntimeSettings.to_env / from_env) and its injected clock."""

import dataclasses
import threading
from pathlib import Path

import pytest

from seamguard.runtime.records import Board, Controls, Progress
from seamguard.runtime.settings import SETTINGS_ENV, RuntimeSettings


def test_settings_travel_through_the_environment_unchanged():
    s = RuntimeSettings(snapshot_every_steps=5, snapshot_auto=True, rank_mttf_h=1234.5, persist_every_steps=20,
                        checkpoint_dir=Path("/ckpt/job"), keep_checkpoints=3, collective_timeout_s=12.5,
                        rails=("rail0", "rail1"), checkpoint_roots=("/ckpt",), step_guard=False)
    env = s.to_env()
    assert list(env) == [SETTINGS_ENV]
    back = RuntimeSettings.from_env(env)
    assert back == s and isinstance(back.checkpoint_dir, Path) and back.rails == ("rail0", "rail1")
    assert RuntimeSettings.from_env({}) == RuntimeSettings()   # nothing set: the defaults, typed once


@pytest.mark.parametrize("text, why", [("{not json", "not JSON"), ("[1]", "expected a JSON object"),
                                       ('{"snapshot_every": 3}', "unknown settings snapshot_every"),
                                       ('{"snapshot_every_steps": 0}', "snapshot_every_steps must be >= 1")])
def test_bad_settings_in_the_environment_are_one_line(text, why):
    with pytest.raises(ValueError, match=why) as err:
        RuntimeSettings.from_env({SETTINGS_ENV: text})
    assert "\n" not in str(err.value)


def test_records_are_immutable():
    for record in (Progress(), Controls()):
        field = dataclasses.fields(record)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, 1)


def test_a_reader_keeps_the_record_it_took_while_writers_publish_new_ones():
    board = Board(Progress())
    taken = board.current
    board.update(step=7, phase="compute")
    assert (taken.step, taken.phase) == (0, "start")   # the reader's record never changes under it
    assert (board.current.step, board.current.phase) == (7, "compute")


def test_writers_of_different_fields_lose_no_update():
    """The training thread and the persister's reply thread write different fields of the
    same Progress: each update is applied to the newest record, none is lost."""
    board = Board(Progress())

    def bump(field: str) -> None:
        for _ in range(2000):
            board.swap(lambda p: dataclasses.replace(p, **{field: getattr(p, field) + 1}))

    threads = [threading.Thread(target=bump, args=(f,)) for f in ("step", "persisted_step", "snap_step")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (board.current.step, board.current.persisted_step, board.current.snap_step) == (2000, 1999, 1999)


def test_an_older_generation_never_moves_controls_back():
    c = Controls().with_generation(3)
    assert c.with_generation(2) is c and c.with_generation(5).gen_seen == 5
    assert Controls(gen_seen=3, control_n=4).with_generation(6).control_n == 4


def test_the_heartbeat_body_has_the_fields_the_coordinator_reads():
    p = Progress(step=9, phase="compute", gen=2, rank=1, compute_s=0.5, snap_step=8, persisted_step=5,
                 snap_cost_s=0.02, copies=2)
    body = p.beat(17, "node3", 1, auto=False)
    assert body == {"n": 17, "step": 9, "phase": "compute", "compute_s": 0.5, "comm_s": 0.0, "stall_s": 0.0,
                    "snap_step": 8, "persisted_step": 5, "gen": 2, "host": "node3", "local": 1}
    assert p.beat(17, "node3", 1, auto=True) == body | {"snap_cost_s": 0.02, "copies": 2}


class _FixedClock:
    """A clock the test sets: every part given it reads this time, not the system's."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def monotonic(self) -> float:
        return self.now_s

    def perf_counter(self) -> float:
        return self.now_s

    def thread_time(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def test_the_heartbeat_sends_the_published_progress_and_stamps_controls_with_the_injected_clock():
    import datetime
    import json
    import time

    import torch.distributed as dist

    from seamguard.runtime import keys
    from seamguard.runtime.follower import MembershipFollower
    from seamguard.runtime.profile import PhaseClock

    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    server.set(keys.GENERATION, "4")
    server.set(keys.CONTROL_N, "7")
    progress, controls = Board(Progress(step=3, phase="compute", gen=4, rank=0)), Board(Controls())
    clock = _FixedClock(5000.0)
    follower = MembershipFollower(
        2, lambda: dist.TCPStore("127.0.0.1", server.port, None, False, timeout=datetime.timedelta(seconds=5)),
        0.02, progress, controls, ("node7", 1), clock, PhaseClock(False))
    follower.start()
    try:
        deadline = time.monotonic() + 20
        while controls.current.control_n is None:
            assert time.monotonic() < deadline, "the heartbeat never read the control counter"
            time.sleep(0.01)
        assert (controls.current.gen_seen, controls.current.control_n) == (4, 7)
        assert controls.current.control_read_s == 5000.0   # the injected clock's reading
        progress.update(step=11, phase="collective")
        while json.loads(server.get(keys.heartbeat(2)))["step"] != 11:
            assert time.monotonic() < deadline, "the heartbeat never sent the newly published step"
            time.sleep(0.01)
        beat = json.loads(server.get(keys.heartbeat(2)))
        assert {k: beat[k] for k in ("phase", "gen", "host", "local")} == \
            {"phase": "collective", "gen": 4, "host": "node7", "local": 1}
    finally:
        follower.stop()
