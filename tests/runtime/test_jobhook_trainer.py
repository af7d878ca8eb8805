"""The trainer-callback shape of the job hook (examples/trainer_callback/): a 2-rank
torchrun job whose loop is a stand-in for Hugging Face's Trainer (the callback moments and
``control.should_save``, not the real Trainer) takes the runtime actuator's signed hints:
a checkpoint at the step both ranks agreed, in the directory the controller moved it to,
degraded mode, and the step metrics."""

from __future__ import annotations

import pytest

from seamguard.act.runtime import RuntimeHintActuator
from seamguard.decide.actions import Verb
from seamguard.ports import free_port

from .test_jobhook import REPO, _action, _events, _load_step, _on_both, _saves, _scrape, _stop, _torchrun, _until

pytestmark = pytest.mark.timeout(240)


def test_trainer_callback_job_saves_where_and_when_the_controller_asks(tmp_path):
    hints, own, other, events = tmp_path / "hints", tmp_path / "storage-a", tmp_path / "storage-b", tmp_path / "ev.jsonl"
    port = free_port()
    proc = _torchrun(REPO / "examples" / "trainer_callback" / "train.py", "--max-steps", "100000", "--output-dir",
                     str(own), "--hint-dir", str(hints), "--metrics-port", str(port), "--job", "job8",
                     "--sync-every", "3", "--step-sleep-s", "0.01", "--events-file", str(events))
    act = RuntimeHintActuator({"job8": hints}, {"job8": {"storage-a": own, "storage-b": other}})
    job = (("job_name", "job8"),)
    try:
        _until("job step 3 in its metrics", lambda: _scrape(port).get(("seamguard_job_step", job), 0) >= 3, proc)
        assert act.apply(_action(Verb.AVOID_STORAGE, "storage-a", "storage")).ok
        assert act.apply(_action(Verb.CHECKPOINT_NOW, "job8", "job")).ok
        saves = _until("a checkpoint_now save on both ranks", lambda: _on_both(_saves(events, "checkpoint_now")), proc)
        step = saves[0][0]["step"]
        assert [e["step"] for e in saves[1]] == [step] and saves[1][0]["dir"] == str(other)
        assert step % 3 == 0   # a step the ranks agreed at
        assert _load_step(other / f"checkpoint-{step}") == step
        assert act.apply(_action(Verb.CHECKPOINT_INTERVAL, "job8", "job", "0.5", (("interval_s", "0.5"),))).ok
        _until("degraded on both ranks", lambda: {e["rank"] for e in _events(events)
                                                  if e["event"] == "degraded" and e["on"]} == {0, 1}, proc)
        _until("an interval save on both ranks", lambda: _on_both(_saves(events, "interval")), proc)
        m = _scrape(port)
    finally:
        err = _stop(proc)
    assert m[("seamguard_job_step", job)] > step and m[("seamguard_job_step_seconds", job)] > 0, err
    assert m[("seamguard_job_persisted_step", job)] >= step
    ranks = {dict(labels)["rank"] for name, labels in m if name == "seamguard_rank_compute_seconds"}
    assert ranks == {"0", "1"}
    assert not own.exists() or not any(own.iterdir())
