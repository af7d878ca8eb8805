"""The control-plane hint channel (files in --hint-dir) and the torch-free CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from seamguard import hintauth
from seamguard.act.runtime import RuntimeHintActuator
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.runtime.manifest import committed_steps, latest_verified

from .conftest import REPO


def test_cli_help_does_not_import_torch():
    code = ("import sys; from typer.testing import CliRunner; import seamguard.app.cli as c; "
            "r = CliRunner().invoke(c.app, ['launch', '--help']); "
            "assert r.exit_code == 0 and '--spares' in r.output, r.output; "
            "import seamguard.runtime; assert 'torch' not in sys.modules; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr


def test_launch_rejects_missing_script():
    p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--nproc", "2"],
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no training command" in p.stdout + p.stderr


@pytest.mark.timeout(180)
def test_evacuate_and_checkpoint_hints(tmp_path, clean_checksums):
    hints, ckpt, out = tmp_path / "hints", tmp_path / "ckpt", tmp_path / "run"
    hints.mkdir()
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--spares", "1",
           "--hint-dir", str(hints), "--checkpoint-dir", str(ckpt), "--persist-every", "0",
           "--events-file", str(out / "events.jsonl"), "--",
           str(REPO / "examples" / "train_ddp.py"), "--steps", "30", "--out", str(out),
           "--step-sleep-s", "0.1"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        log = out / "worker_0.log"
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 5):
            time.sleep(0.1)
        _hint(hints, "checkpoint_now")
        _hint(hints, "evacuate_rank_1")
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "detected" and e["kind"] == "evacuate_hint" for e in events)
    target = next(e["persist_at"] for e in events if e["event"] == "checkpoint_hint")
    assert target in committed_steps(ckpt)
    assert latest_verified(ckpt) is not None
    assert (out / "final_checksum.txt").read_text() == clean_checksums(30)
    assert not [p for p in hints.iterdir() if not p.name.startswith(".")]  # consumed (dotfiles: placement, records)


def _hint(hints, name: str, value: str = "", key_file=None) -> None:
    """Drop a hint file signed with the job's key, as the controller's actuator does (the
    launcher writes the key into the hint directory as it starts, unless given one)."""
    key_file = key_file or hints / hintauth.KEY_FILE_NAME
    deadline = time.monotonic() + 60
    while not key_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    hintauth.write_hint_file(hints, name, value, hintauth.read_key(key_file))


def _launch_bg(hints, ckpt, out, steps, extra=()):
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--hint-dir", str(hints),
           "--checkpoint-dir", str(ckpt), "--snapshot-every", "5", "--persist-every", "10",
           "--events-file", str(out / "events.jsonl"), *extra, "--",
           str(REPO / "examples" / "train_ddp.py"), "--steps", str(steps), "--out", str(out),
           "--step-sleep-s", "0.1"]
    return subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_step(out, step: int, timeout_s: float = 90) -> None:
    log, deadline = out / "worker_0.log", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and any(int(x.split()[0]) >= step for x in log.read_text().splitlines()):
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout_s}s")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hint, at_step, steps", [("rollback", 26, 40),
                                                  ("rollback_to_step_30", 52, 70)])
def test_rollback_hint_goes_back_in_place(tmp_path, clean_checksums, hint, at_step, steps):
    # Corruption found after it was persisted: the operator (or the controller) drops a
    # rollback hint. Every rank goes back, without a restart, to the newest persisted step
    # (or the one named), reading the copy it kept in host memory when it still has one,
    # else storage; the replay is bit-identical to a run that never went forward.
    hints, ckpt, out = tmp_path / "hints", tmp_path / "ckpt", tmp_path / "run"
    hints.mkdir()
    proc = _launch_bg(hints, ckpt, out, steps=steps, extra=("--keep-checkpoints", "4"))
    try:
        _wait_for_step(out, at_step)
        deadline = time.monotonic() + 60   # step 20's persist (hash, replica, fsync) may trail the steps
        while hint == "rollback" and 20 not in committed_steps(ckpt) and time.monotonic() < deadline:
            time.sleep(0.05)
        t_hint = time.monotonic()
        _hint(hints, hint)
        assert proc.wait(timeout=120) == 0
        since_hint_s = time.monotonic() - t_hint
    finally:
        proc.kill()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    target = next(e["to_step"] for e in events if e["event"] == "rollback_requested")
    # the rollback's resume is timed from the request (it read the monotonic clock's origin)
    resumed = [e for e in events if e["event"] == "resumed" and e["gen"] > 0]
    assert len(resumed) == 1 and 0 <= resumed[0]["since_detection_s"] <= since_hint_s
    chosen = [e for e in events if e["event"] == "resume_chosen" and e["gen"] > 0]
    assert len(chosen) == 1 and chosen[0]["step"] == target
    if hint == "rollback":
        # the newest persisted step, still in host memory: no storage read
        assert target >= 20 and target % 10 == 0 and chosen[0]["source"] == "memory"
    else:
        # by step 52 step 30 has left host memory (50 is the persisted step kept there)
        # but is still on storage (four kept): it comes back from storage
        assert target == 30 and chosen[0]["source"] == "disk"
    # every rank redid the steps after the target (one line per committed step)
    done = [int(x.split()[0]) for x in (out / "worker_0.log").read_text().splitlines()]
    assert done.count(target) == 2
    assert (out / "final_checksum.txt").read_text() == clean_checksums(steps)


def test_rollback_without_a_persisted_step_is_refused_and_training_goes_on(tmp_path, clean_checksums):
    hints, ckpt, out = tmp_path / "hints", tmp_path / "ckpt", tmp_path / "run"
    hints.mkdir()
    key_file = tmp_path / "job.key"   # the operator's key: hints can be signed before the launch
    hintauth.create_key(key_file)
    _hint(hints, "rollback", key_file=key_file)    # before anything was persisted
    _hint(hints, "rollback_to_step_x", key_file=key_file)
    proc = _launch_bg(hints, ckpt, out, steps=40, extra=("--hint-key-file", str(key_file)))
    try:
        _wait_for_step(out, 16)
        _hint(hints, "rollback_to_step_5", key_file=key_file)   # never persisted (every 10 steps)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["event"] == "rollback_rejected"]
    assert [e["asked"] for e in rejected] == [-1, 5], rejected
    assert "step 5 is not a complete persisted checkpoint" in rejected[1]["reason"]
    assert not any(e["event"] == "rollback_requested" for e in events)
    assert (out / "final_checksum.txt").read_text() == clean_checksums(40)
    assert not [p for p in hints.iterdir() if not p.name.startswith(".")]  # consumed (dotfiles: placement, records)


@pytest.mark.timeout(240)
def test_checkpoint_interval_hint_sets_the_persist_cadence_and_default_restores_the_jobs_own(tmp_path, clean_checksums):
    # The controller's checkpoint planner asks a running job for a shorter interval while
    # its nodes are at risk (seconds; the coordinator turns them into steps at the job's
    # pace), then hands it back ("default"). Every rank persists the same steps, so every
    # checkpoint is complete; a bad value is ignored with a message, training goes on.
    hints, ckpt, out = tmp_path / "hints", tmp_path / "ckpt", tmp_path / "run"
    hints.mkdir()
    proc = _launch_bg(hints, ckpt, out, steps=70, extra=("--keep-checkpoints", "100"))
    try:
        _wait_for_step(out, 8)
        _hint(hints, "checkpoint_interval_s", "nonsense")
        _wait_for_step(out, 10)
        # delivered by the controller's runtime actuator, as `seamguard run` would
        # the cadence alone: degraded mode (also held with an interval) is tested in test_rail_hints_in_runtime.py
        hint = RuntimeHintActuator({"train": hints}, degraded=False)
        shorter = Action(key=action_key(Verb.CHECKPOINT_INTERVAL, "train", value="0.8"),
                         verb=Verb.CHECKPOINT_INTERVAL, target="train", target_kind="job",
                         params=(("interval_s", "0.8"),), reason="test")
        assert hint.apply(shorter).ok
        _wait_for_step(out, 40)
        assert hint.revert(shorter.key).ok
        assert proc.wait(timeout=150) == 0
    finally:
        proc.kill()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    asked, back = [e for e in events if e["event"] == "checkpoint_interval"]
    assert asked["interval"] == "0.8" and asked["every_steps"] >= 1 and back["every_steps"] == 0
    # --snapshot-every 5: a persist point p is written with the first snapshot at or after it
    def at_snapshot(p):
        return -(-p // 5) * 5
    start, every, back_at = asked["from_step"], asked["every_steps"], back["from_step"]
    expected = {s for s in range(10, 70, 10) if at_snapshot(s) < start or at_snapshot(s) >= back_at}
    expected |= {at_snapshot(p) for p in range(start, back_at, every) if at_snapshot(p) < back_at}
    committed = set(committed_steps(ckpt))
    assert committed - {70} == expected, (committed, asked, back)
    assert all(latest_verified(ckpt, at_most=s) is not None for s in committed)
    assert (out / "final_checksum.txt").read_text() == clean_checksums(70)
    assert not [p for p in hints.iterdir() if not p.name.startswith(".")]  # consumed (dotfiles: placement, records)


@pytest.mark.timeout(180)
def test_auto_snapshot_interval_spares_snapshots_but_not_persist_points(tmp_path, clean_checksums):
    # --snapshot-every auto starts at every 10 steps; once the ranks have measured what a
    # snapshot costs (milliseconds here) the coordinator sets Daly's interval for 2 ranks
    # failing every 50,700 h each: thousands of steps. Persist points (every 20) are still
    # snapshotted and written, and the weights are those of any other run.
    hints, ckpt, out = tmp_path / "hints", tmp_path / "ckpt", tmp_path / "run"
    hints.mkdir()
    proc = _launch_bg(hints, ckpt, out, steps=50, extra=("--snapshot-every", "auto", "--persist-every", "20",
                                                               "--keep-checkpoints", "10"))
    assert proc.wait(timeout=150) == 0
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    tuned = [e for e in events if e["event"] == "snapshot_interval"]   # again if the cost moves
    assert tuned and tuned[0]["from_step"] < 30 and all(e["every_steps"] > 1000 and e["ranks"] == 2 for e in tuned)
    assert set(committed_steps(ckpt)) == {20, 40, 50}   # 50: the final checkpoint
    snapshots = [e["snapshots"] for e in events if e.get("kind") == "finished"]
    # every rank snapshots the same steps: 0, 1 (the optimizer's state appears), 10, the
    # persist points 20 and 40, and the end; not 30 as at a fixed 10
    assert snapshots == [6, 6], snapshots
    assert (out / "final_checksum.txt").read_text() == clean_checksums(50)


def test_snapshot_every_takes_steps_or_auto_and_nothing_else():
    r = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--snapshot-every", "often", "--",
                        str(REPO / "examples" / "train_ddp.py")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --snapshot-every: expected a number of steps or auto, got 'often' (see 'seamguard launch --help')"]



def test_rail_mode_is_stripe_or_standby_and_reaches_the_rails():
    from seamguard.runtime.settings import RAIL_MODES, RuntimeSettings

    r = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--rails", "rail0,rail1", "--rail-mode", "bond",
                        "--", str(REPO / "examples" / "train_ddp.py")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --rail-mode must be one of stripe, standby, got 'bond' (see 'seamguard launch --help')"]
    # the mode travels to the workers and sets the rails' chunking (one chunk: one rail carries)
    env = RuntimeSettings(rails=("rail0", "rail1"), rail_mode="standby").to_env()
    assert RAIL_MODES[RuntimeSettings.from_env(env).rail_mode] == 1
    assert RAIL_MODES[RuntimeSettings.from_env({}).rail_mode] == 0

@pytest.mark.timeout(240)
def test_draining_a_node_evacuates_its_ranks_to_hot_spares(tmp_path, clean_checksums):
    # The controller drains a node (e.g. XIDs before it falls off the bus): the runtime
    # actuator reads where the job's ranks run from the placement its launcher publishes
    # and asks for each rank there to be evacuated; the spares take them, nothing restarts.
    hints, ckpt, out = tmp_path / "hints", tmp_path / "ckpt", tmp_path / "run"
    hints.mkdir()
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--spares", "2", "--hint-dir", str(hints),
           "--checkpoint-dir", str(ckpt), "--events-file", str(out / "events.jsonl"), "--",
           str(REPO / "examples" / "train_ddp.py"), "--steps", "40", "--out", str(out), "--step-sleep-s", "0.1"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO / "src"), "SEAMGUARD_NODE_NAME": "gpu007"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    act = RuntimeHintActuator({"train": hints})
    drain = Action(key=action_key(Verb.DRAIN, "gpu007"), verb=Verb.DRAIN, target="gpu007", target_kind="node",
                   reason="seamguard: harmful gpu007/gpu0:xid=79")
    try:
        _wait_for_step(out, 10)
        placement = json.loads((hints / ".placement.json").read_text())
        assert placement["ranks"] == {"0": "gpu007", "1": "gpu007"} and placement["gen"] == 0
        other = act.apply(Action(key=action_key(Verb.DRAIN, "gpu003"), verb=Verb.DRAIN, target="gpu003",
                                 target_kind="node"))
        assert other.ok and "nothing to evacuate" in other.detail
        res = act.apply(drain)
        assert res.ok and "ranks 0,1" in res.detail, res.detail
        assert proc.wait(timeout=150) == 0
    finally:
        proc.kill()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert sorted(e["rank"] for e in events if e.get("kind") == "evacuate_hint") == [0, 1]
    assert (out / "final_checksum.txt").read_text() == clean_checksums(40)
    assert act.observe() == {drain.key}
    assert act.revert(drain.key).ok and act.observe() == set()


@pytest.mark.timeout(240)
def test_avoid_storage_moves_checkpoints_to_another_path_and_restores_read_there(tmp_path, clean_checksums):
    # The controller sees the job's checkpoint storage path slow (avoid_storage): the runtime
    # actuator points the job at its next checkpoint directory; every rank persists there
    # from a step all agree on; when the path is healthy again the job's own comes back. A
    # rollback to a step that lives only on the other path reads it from there.
    hints, own, other, out = tmp_path / "hints", tmp_path / "ckpt-a", tmp_path / "ckpt-b", tmp_path / "run"
    hints.mkdir()
    proc = _launch_bg(hints, own, out, steps=70, extra=("--keep-checkpoints", "100"))
    act = RuntimeHintActuator({"train": hints}, {"train": {"storage-a": own, "storage-b": other}})
    slow = Action(key=action_key(Verb.AVOID_STORAGE, "storage-a"), verb=Verb.AVOID_STORAGE, target="storage-a",
                  target_kind="storage", reason="seamguard: degraded storage-a")
    try:
        _wait_for_step(out, 5)   # its start step (about 10 steps ahead) then leaves 1.5 s of slack to 30
        assert act.apply(slow).ok
        _wait_for_step(out, 40)
        assert act.revert(slow.key).ok
        _wait_for_step(out, 55)
        _hint(hints, "rollback_to_step_30")
        assert proc.wait(timeout=150) == 0
    finally:
        proc.kill()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    moved, back = [e for e in events if e["event"] == "checkpoint_dir"]
    assert moved["dir"] == str(other) and back["dir"] == "default" and moved["from_step"] <= 30 < back["from_step"]
    on_other = set(committed_steps(other))
    assert on_other == {s for s in range(10, 71, 10) if moved["from_step"] <= s < back["from_step"]}
    assert not on_other & set(committed_steps(own)) and 70 in committed_steps(own)
    chosen = [e for e in events if e["event"] == "resume_chosen" and e["gen"] > 0]
    assert [(c["source"], c["step"], c.get("dir")) for c in chosen] == [("disk", 30, str(other))]
    assert (out / "final_checksum.txt").read_text() == clean_checksums(70)
