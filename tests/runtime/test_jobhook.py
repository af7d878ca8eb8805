"""A torchrun + DCP job not started by `seamguard launch` takes the controller's hints
through the job hook (runtime/jobhook.py, runtime/hintclient.py): the controller's runtime
actuator (act/runtime.py) writes real signed hint files, a 2-rank torchrun job saves its
own DCP checkpoint at the step its ranks agreed, moves its next save, sees degraded mode,
refuses unsigned and forged hints and exports the step metrics the controller reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from seamguard import hintauth, hintfiles
from seamguard.act.runtime import RuntimeHintActuator
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.ports import free_port
from seamguard.runtime.hintclient import HintReader, JobHints, fold
from seamguard.runtime.jobhook import HookSettings, JobHook

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}

pytestmark = pytest.mark.timeout(240)


# ---------------------------------------------------------------- the pure parts
def test_fold_takes_what_a_plain_job_can_do_and_names_what_it_cannot(tmp_path):
    roots = (tmp_path,)
    h, ev = fold(JobHints(), hintfiles.CHECKPOINT_NOW, "seamguard: gpu3 failing\n", roots)
    assert (h.checkpoint_seq, ev) == (1, None)
    h, ev = fold(h, hintfiles.CHECKPOINT_DIR, f"{tmp_path / 'b'}\n", roots)
    assert (h.checkpoint_dir, h.dir_seq, ev) == (str(tmp_path / "b"), 1, None)
    h2, ev = fold(h, hintfiles.CHECKPOINT_DIR, "/elsewhere/ckpt\n", roots)
    assert h2 == h and ev["reason"] == "outside_roots"
    h, _ = fold(h, hintfiles.CHECKPOINT_DIR, "default\n", roots)
    assert (h.checkpoint_dir, h.dir_seq) == (None, 2)
    h, _ = fold(h, hintfiles.CHECKPOINT_INTERVAL, "30\n", roots)
    h, _ = fold(h, hintfiles.DEGRADED, "on\n", roots)
    assert (h.interval_s, h.degraded) == (30.0, True)
    h3, ev = fold(h, hintfiles.CHECKPOINT_INTERVAL, "soon\n", roots)
    assert h3 == h and ev["event"] == "hint_ignored"
    h3, ev = fold(h, hintfiles.evacuate_file(1), "drain\n", roots)
    assert h3 == h and ev["event"] == "hint_ignored" and "seamguard launch" in ev["detail"]


def test_reader_refuses_unsigned_forged_and_replayed_files_and_removes_them(tmp_path):
    hints, events = tmp_path / "hints", []
    reader = HintReader.for_job(hints, tmp_path / "ckpt", log=events.append)
    key = hintauth.read_key(hints / hintauth.KEY_FILE_NAME)
    (hints / hintfiles.CHECKPOINT_NOW).write_text("now\n")
    hintauth.write_hint_file(hints, hintfiles.DEGRADED, "on\n", b"k" * 32)
    assert reader.poll() == JobHints()
    hintauth.write_hint_file(hints, hintfiles.CHECKPOINT_NOW, "now\n", key)
    replay = (hints / hintfiles.CHECKPOINT_NOW).read_text()
    assert reader.poll().checkpoint_seq == 1
    (hints / hintfiles.CHECKPOINT_NOW).write_text(replay)
    assert reader.poll().checkpoint_seq == 1
    assert [e["reason"] for e in events] == ["unsigned", "forged", "replayed"]
    assert reader.refusals() == {"unsigned": 1, "forged": 1, "replayed": 1, "stale": 0}
    assert [p.name for p in hints.iterdir()] == [hintauth.KEY_FILE_NAME]


def test_hook_settings_refuse_bad_values_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^seamguard job hook: checkpoint_dir: expected an absolute path"):
        HookSettings(job="j", checkpoint_dir=Path("rel"))
    with pytest.raises(ValueError, match=r"^seamguard job hook: SEAMGUARD_METRICS_PORT='x9'"):
        HookSettings.from_env({"SEAMGUARD_METRICS_PORT": "x9", "SEAMGUARD_CHECKPOINT_DIR": str(tmp_path)})
    s = HookSettings.from_env({"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2", "LOCAL_RANK": "1",
                               "SEAMGUARD_CHECKPOINT_DIR": str(tmp_path)})
    assert (s.job, s.generation, s.local_rank) == ("job7", 2, 1)


def test_the_hook_module_imports_without_torch():
    code = ("import sys; import seamguard.runtime.jobhook, seamguard.runtime.hintclient; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "ok", p.stderr[-2000:]


def test_one_process_hook_acts_on_the_actuators_hints_at_its_agreement_steps(tmp_path):
    hints, own, other = tmp_path / "hints", tmp_path / "storage-a", tmp_path / "storage-b"
    saved, flags = [], []
    hook = JobHook(HookSettings(job="j", checkpoint_dir=own, hint_dir=hints, sync_every_steps=4),
                   save=lambda step, d: saved.append((step, d)), on_degraded=flags.append)
    act = RuntimeHintActuator({"j": hints}, {"j": {"storage-a": own, "storage-b": other}})
    for step in (1, 2, 3):
        assert not hook.step_end(step).save
    assert act.apply(_action(Verb.AVOID_STORAGE, "storage-a", "storage")).ok
    assert act.apply(_action(Verb.CHECKPOINT_NOW, "j", "job")).ok
    assert act.apply(_action(Verb.CHECKPOINT_INTERVAL, "j", "job", "3600", (("interval_s", "3600"),))).ok
    controls = [hook.step_end(step) for step in range(4, 10)]
    assert [(c.step, c.why) for c in controls if c.save] == [(4, "checkpoint_now")]
    assert saved == [(4, other)] and hook.checkpoint_dir == other and flags == [True]
    text = hook.metrics_text()
    assert 'seamguard_job_persisted_step{job_name="j"} 4' in text and 'seamguard_job_step{job_name="j"} 9' in text
    hook.close()


# ---------------------------------------------------------------- a real torchrun job
def _torchrun(script: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *args]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> str:
    """End the job as a scheduler does: SIGTERM to torchrun, which stops its workers (they run
    in sessions of their own); SIGKILL to its group only if that does not end it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=60)[1][-3000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate(timeout=30)[1][-3000:]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _until(what: str, check, proc: subprocess.Popen, timeout_s: float = 90):
    """Poll ``check()`` until it returns something truthy (bounded); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"the job exited ({proc.returncode}) before {what}: {_stop(proc)}")
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout_s} s: {_stop(proc)}")


def _saves(events: Path, why: str) -> dict[int, list[dict]]:
    """rank -> its checkpoint_saved events for ``why``."""
    out: dict[int, list[dict]] = {0: [], 1: []}
    for e in _events(events):
        if e["event"] == "checkpoint_saved" and e["why"] == why:
            out[e["rank"]].append(e)
    return out


def _on_both(saves: dict[int, list[dict]]) -> dict[int, list[dict]] | None:
    return saves if all(saves.values()) else None


def _load_step(checkpoint: Path) -> int:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"step": torch.zeros((), dtype=torch.int64)}
    dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    return int(state["step"])


def _action(verb: Verb, target: str, kind: str, value: str = "", params=()) -> Action:
    return Action(key=action_key(verb, target, value=value), verb=verb, target=target, target_kind=kind,
                  params=params, reason=f"seamguard: test {verb.value}")


def test_torchrun_dcp_job_takes_the_controllers_hints(tmp_path):
    hints, own, other, events = tmp_path / "hints", tmp_path / "storage-a", tmp_path / "storage-b", tmp_path / "ev.jsonl"
    port = free_port()
    proc = _torchrun(REPO / "examples" / "torchrun_dcp" / "train.py", "--steps", "100000", "--checkpoint-dir", str(own),
                     "--hint-dir", str(hints), "--metrics-port", str(port), "--job", "job7", "--sync-every", "2",
                     "--step-sleep-s", "0.01", "--events-file", str(events))
    act = RuntimeHintActuator({"job7": hints}, {"job7": {"storage-a": own, "storage-b": other}})
    try:
        _until("job step 3 in its metrics", lambda: _scrape(port).get(("seamguard_job_step", (("job_name", "job7"),)),
                                                                        0) >= 3, proc)
        # the controller moves the job off storage-a, then asks for a checkpoint
        assert act.apply(_action(Verb.AVOID_STORAGE, "storage-a", "storage")).ok
        assert act.apply(_action(Verb.CHECKPOINT_NOW, "job7", "job")).ok
        saves = _until("a checkpoint_now save on both ranks", lambda: _on_both(_saves(events, "checkpoint_now")), proc)
        step = saves[0][0]["step"]
        assert [e["step"] for e in saves[1]] == [step] and [e["step"] for e in saves[0]] == [step]
        assert saves[0][0]["dir"] == saves[1][0]["dir"] == str(other)
        ckpt = other / f"step_{step}"
        _until("the DCP checkpoint's metadata", lambda: (ckpt / ".metadata").exists(), proc)
        assert _load_step(ckpt) == step
        assert not own.exists() or not any(own.iterdir())

        # a shorter interval held degraded: both ranks switch at one step and save on the interval
        assert act.apply(_action(Verb.CHECKPOINT_INTERVAL, "job7", "job", "0.5", (("interval_s", "0.5"),))).ok
        _until("degraded on both ranks", lambda: {e["rank"] for e in _events(events)
                                                  if e["event"] == "degraded" and e["on"]} == {0, 1}, proc)
        _until("an interval save on both ranks", lambda: _on_both(_saves(events, "interval")), proc)

        # hints not signed with the job's key are refused, counted and never acted on
        (hints / hintfiles.CHECKPOINT_NOW).write_text("now\n")
        refused = ("seamguard_job_hints_refused_total", (("job_name", "job7"), ("reason", "unsigned")))
        _until("the unsigned hint refused", lambda: _scrape(port).get(refused) == 1, proc)
        hintauth.write_hint_file(hints, hintfiles.CHECKPOINT_NOW, "now\n", b"x" * 32)
        forged = ("seamguard_job_hints_refused_total", (("job_name", "job7"), ("reason", "forged")))
        _until("the forged hint refused", lambda: _scrape(port).get(forged) == 1, proc)
        m = _scrape(port)
    finally:
        err = _stop(proc)
    assert [len(v) for v in _saves(events, "checkpoint_now").values()] == [1, 1], err
    job = (("job_name", "job7"),)
    assert m[("seamguard_job_step", job)] > step and m[("seamguard_job_step_seconds", job)] > 0
    assert m[("seamguard_job_persisted_step", job)] >= step and m[("seamguard_job_generation", job)] == 0
    for rank, gpu in ((0, "0"), (1, "1")):
        compute = [v for (name, labels), v in m.items() if name == "seamguard_rank_compute_seconds"
                   and dict(labels)["rank"] == str(rank)]
        assert len(compute) == 1 and compute[0] > 0
        assert ("seamguard_rank_checkpoint_stall_seconds", (("job_name", "job7"), ("rank", str(rank)))) in m
        assert any(name == "seamguard_rank_compute_seconds" and dict(labels)["gpu"] == gpu for name, labels in m)
