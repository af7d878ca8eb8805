"""The control plane asks a seamguard-runtime job to checkpoint through its hint directory."""

from seamguard.act.reconcile import diff
import pytest

from seamguard import hintauth
from seamguard.act.runtime import RuntimeHintActuator
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.hintauth import hint_file_value


@pytest.fixture(autouse=True)
def _jobs_hold_keys(monkeypatch):
    """Each hint directory belongs to a launched job, whose launcher wrote its hint key there;
    the actuator signs every hint file with it (values are read past the signature line)."""
    monkeypatch.setattr(hintauth, "read_key", lambda path, private=False: b"k" * 32)


def _ckpt(job: str, t: int) -> Action:
    return Action(key=action_key(Verb.CHECKPOINT_NOW, job, f"t{t}"), verb=Verb.CHECKPOINT_NOW, target=job,
                  target_kind="job", reason="seamguard: job exposed to degraded gpu007")


def test_checkpoint_now_becomes_a_hint_file_once(tmp_path):
    act = RuntimeHintActuator({"train": tmp_path / "hints"})
    a = _ckpt("train", 100)
    assert act.apply(a).ok
    hint = tmp_path / "hints" / "checkpoint_now"
    assert hint_file_value(hint).startswith("seamguard: job exposed")
    # a restarted actuator (new object, same directory) knows the hint was delivered
    again = RuntimeHintActuator({"train": tmp_path / "hints"})
    assert a.key in again.observe()
    apply, revert = diff({a.key: a}, again.observe(), set())
    assert apply == [] and revert == []
    # the runtime consumes the file; a later episode asks again
    hint.unlink()
    b = _ckpt("train", 400)
    apply, _ = diff({b.key: b}, again.observe(), set())
    assert apply == [b] and again.apply(b).ok and hint.exists()


def test_jobs_outside_the_runtime_are_left_alone(tmp_path):
    act = RuntimeHintActuator({"train": tmp_path / "hints"})
    res = act.apply(_ckpt("other-job", 5))
    assert res.ok and "no hint directory" in res.detail
    assert not (tmp_path / "hints").exists()


def test_unwritable_directory_is_a_retryable_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    act = RuntimeHintActuator({"train": blocker / "hints"})
    res = act.apply(_ckpt("train", 1))
    assert not res.ok and res.retryable and "cannot write the hint" in res.detail


def _interval(job: str, seconds: int) -> Action:
    return Action(key=action_key(Verb.CHECKPOINT_INTERVAL, job, value=str(seconds)), verb=Verb.CHECKPOINT_INTERVAL,
                  target=job, target_kind="job", params=(("interval_s", str(seconds)),),
                  reason="seamguard: job exposed")


def test_checkpoint_interval_is_held_replaced_rung_by_rung_and_handed_back(tmp_path):
    hints = tmp_path / "hints"
    act = RuntimeHintActuator({"train": hints})
    a, b = _interval("train", 900), _interval("train", 450)
    assert act.apply(a).ok and hint_file_value((hints / "checkpoint_interval_s")) == "900\n"
    assert a.key in RuntimeHintActuator({"train": hints}).observe()  # a restarted controller sees it held
    # the next rung: reconcile applies the new key and reverts the old, in either order
    apply, revert = diff({b.key: b}, act.observe(), set())
    assert apply == [b] and revert == [a.key]
    assert act.apply(b).ok and act.revert(a.key).ok
    assert hint_file_value((hints / "checkpoint_interval_s")) == "450\n"  # the old revert did not undo the new one
    assert act.observe() == {b.key}
    # the episode ends: the job's own interval again, and nothing is held
    assert act.revert(b.key).ok and hint_file_value((hints / "checkpoint_interval_s")) == "default\n"
    assert RuntimeHintActuator({"train": hints}).observe() == set()


def test_checkpoint_interval_revert_before_apply_and_bad_values(tmp_path):
    hints = tmp_path / "hints"
    act = RuntimeHintActuator({"train": hints})
    a, b = _interval("train", 900), _interval("train", 1800)
    act.apply(a)
    assert act.revert(a.key).ok and act.apply(b).ok
    assert hint_file_value((hints / "checkpoint_interval_s")) == "1800\n" and act.observe() == {b.key}
    bad = Action(key=action_key(Verb.CHECKPOINT_INTERVAL, "train", value="-5"), verb=Verb.CHECKPOINT_INTERVAL,
                 target="train", target_kind="job", params=(("interval_s", "-5"),))
    res = act.apply(bad)
    assert not res.ok and not res.retryable and "not a positive number" in res.detail
    assert hint_file_value((hints / "checkpoint_interval_s")) == "1800\n"


def test_drain_evacuates_the_ranks_the_placement_puts_on_the_node(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    (a_dir / ".placement.json").write_text('{"job": "a", "gen": 3, "ranks": {"0": "n1", "1": "n2", "2": "n2"}}')
    (b_dir / ".placement.json").write_text("{torn")
    act = RuntimeHintActuator({"a": a_dir, "b": b_dir})
    drain = Action(key=action_key(Verb.DRAIN, "n2"), verb=Verb.DRAIN, target="n2", target_kind="node", reason="r")
    res = act.apply(drain)
    assert res.ok and "a ranks 1,2" in res.detail
    assert sorted(p.name for p in a_dir.iterdir() if not p.name.startswith(".")) == ["evacuate_rank_1",
                                                                                    "evacuate_rank_2"]
    assert [p.name for p in b_dir.iterdir()] == [".placement.json"]  # unreadable placement: left alone
    assert act.observe() == {drain.key}
    assert act.revert(drain.key).ok and act.observe() == set()
    idle = Action(key=action_key(Verb.DRAIN, "n9"), verb=Verb.DRAIN, target="n9", target_kind="node")
    assert act.apply(idle).ok and drain.key not in act.observe() and idle.key not in act.observe()


def _avoid(storage: str) -> Action:
    return Action(key=action_key(Verb.AVOID_STORAGE, storage), verb=Verb.AVOID_STORAGE, target=storage,
                  target_kind="storage", reason="seamguard: degraded")


def test_avoid_storage_moves_a_jobs_checkpoints_to_its_next_path_and_back(tmp_path):
    hints = tmp_path / "hints"
    dirs = {"train": {"s-a": tmp_path / "a", "s-b": tmp_path / "b", "s-c": tmp_path / "c"}}
    act = RuntimeHintActuator({"train": hints, "other": tmp_path / "h2"}, dirs)
    target = hints / "checkpoint_dir"
    unrelated = act.apply(_avoid("s-c"))  # a path the job does not write to: nothing to move, held
    assert unrelated.ok and not target.exists() and act.observe() == {_avoid("s-c").key}
    assert act.apply(_avoid("s-a")).ok and hint_file_value(target) == f"{tmp_path / 'b'}\n"
    assert act.apply(_avoid("s-b")).ok  # b too: every candidate but its own avoided... c is avoided too
    assert hint_file_value(target) == f"{tmp_path / 'b'}\n"  # none left: stays where it is
    assert act.observe() == {_avoid(s).key for s in ("s-a", "s-b", "s-c")}
    assert act.revert(_avoid("s-c").key).ok and hint_file_value(target) == f"{tmp_path / 'c'}\n"
    assert act.revert(_avoid("s-a").key).ok and hint_file_value(target) == "default\n"  # its own path is fine again
    assert act.revert(_avoid("s-b").key).ok and hint_file_value(target) == "default\n"
    assert RuntimeHintActuator({"train": hints}, dirs).observe() == set()
    # without checkpoint directories the verb is not this actuator's (the log actuator records it)
    assert Verb.AVOID_STORAGE not in RuntimeHintActuator({"train": hints}).verbs
