"""Snapshot slots a SIGKILLed launcher left in /dev/shm are swept by the next launcher
(runtime/shm.py); slots some live process may still adopt or delete are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamguard.runtime import shm

from .conftest import REPO, launch

LIVE, DEAD, DEAD_LAUNCHER, LIVE_LAUNCHER = 100, 200, 300, 400
OURS, THEIRS = 4026531836, 4026532999   # PID namespaces: the sweeping launcher's, another container's


@pytest.mark.parametrize("name,swept", [
    (f"seamguard-job-{DEAD}-w1-l{DEAD_LAUNCHER}-slot0", True),        # worker and launcher gone
    (f"seamguard-job-{DEAD}-w1-l{DEAD_LAUNCHER}-slot0.json", True),   # its manifest too
    (f"seamguard-job-{DEAD}-w1-l{LIVE_LAUNCHER}-slot0", False),       # its job may still adopt it
    (f"seamguard-job-{LIVE}-w1-l{DEAD_LAUNCHER}-slot2", False),       # its worker still runs
    (f"seamguard-job-{DEAD}-w1-l{DEAD_LAUNCHER}-n{OURS}-slot0", True),  # of this PID namespace
    (f"seamguard-job-{DEAD}-w1-l{DEAD_LAUNCHER}-n{THEIRS}-slot0", False),  # its pids mean nothing here
    (f"seamguard-job-{DEAD}-w3-slot1", True),                         # named before launcher pids
    (f"seamguard-job-{LIVE}-w3-slot1", False),
    (f"seamguard-a-1-w2-run-{DEAD}-w0-l{DEAD_LAUNCHER}-slot0", True),  # a run id with dashes
    ("seamguard-serve-abc", False),                                   # not a snapshot slot
    (f"other-{DEAD}-w1-slot0", False),
])
def test_a_slot_is_stale_only_when_nobody_can_adopt_or_delete_it(name, swept):
    assert shm.stale([name], alive=lambda pid: pid in (LIVE, LIVE_LAUNCHER), namespace=OURS) \
        == ([name] if swept else [])


def test_slot_names_carry_the_worker_and_launcher_pids_and_their_namespace():
    assert shm.owners(shm.slot_prefix("run-7", 1234, 5, 99, OURS) + "-slot3") == (1234, 99, OURS)
    assert shm.owners(shm.slot_prefix("run-7", 1234, 5, 99) + "-slot3") == (1234, 99, None)
    assert shm.owners(shm.slot_prefix("run-7", 1234, 5, None) + "-slot0.json") == (1234, None, None)


def _gone_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _slots(run_id: str) -> list[Path]:
    return sorted(shm.SHM.glob(f"seamguard-{run_id}-*"))


def _slot_files(run_id: str) -> list[Path]:
    return [f for f in _slots(run_id) if f.suffix != ".json"]


@pytest.mark.timeout(180)
def test_a_launcher_sweeps_the_slots_a_killed_launcher_left(tmp_path):
    run_id = f"shmkill-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    p = subprocess.Popen([sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--run-id", run_id,
                          "--snapshot-every", "1", "--", str(REPO / "examples" / "train_ddp.py"),
                          "--steps", "2000", "--step-sleep-s", "0.02", "--out", str(tmp_path / "killed")],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None and len(_slot_files(run_id)) < 2:
            time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    deadline = time.monotonic() + 30   # its workers die with it (and leave their slots)
    while time.monotonic() < deadline and any(shm.pid_alive(shm.owners(f.name)[0]) for f in _slots(run_id)):
        time.sleep(0.2)
    left = _slots(run_id)   # a slot's manifest is absent while its bytes change, so count slots
    assert len(_slot_files(run_id)) >= 2 and all(shm.owners(f.name)[1] == p.pid for f in left), left
    # beside them: a slot of a live worker, a dead worker's slot whose launcher lives, and
    # a slot of another PID namespace
    ns = shm.pid_namespace()
    keep = [shm.SHM / (shm.slot_prefix(f"keep-{os.getpid()}", os.getpid(), 0, _gone_pid(), ns) + "-slot0"),
            shm.SHM / (shm.slot_prefix(f"keep-{os.getpid()}", _gone_pid(), 1, os.getpid(), ns) + "-slot0"),
            shm.SHM / (shm.slot_prefix(f"keep-{os.getpid()}", _gone_pid(), 2, _gone_pid(), (ns or 0) + 1)
                       + "-slot0")]
    for f in keep:
        f.write_bytes(b"x")
    try:
        r = launch(tmp_path, "next", steps=3)
        assert r.code == 0, r.stderr
        assert _slots(run_id) == []
        assert all(f.exists() for f in keep)
        removed = r.kinds("stale_slots_removed")
        assert removed and removed[0]["files"] >= len(left)
        assert "whose worker and launcher are gone" in r.log
    finally:
        for f in keep:
            f.unlink(missing_ok=True)
