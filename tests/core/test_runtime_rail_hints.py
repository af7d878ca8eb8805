"""avoid_link of a NIC's link -> the jobs on its node stay off that rail (``avoid_rails``);
checkpoint_interval held -> the job also runs ``degraded``. Decision table of the runtime
actuator: written, kept, rewritten, reverted only when it is ours, switched off by config."""

from __future__ import annotations

import json

import pytest

from seamguard.act.reconcile import diff
from seamguard import hintauth
from seamguard.act.runtime import RuntimeHintActuator, nic_of_link, severity_of
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.hintauth import hint_file_value


@pytest.fixture(autouse=True)
def _jobs_hold_keys(monkeypatch):
    """Each hint directory belongs to a launched job, whose launcher wrote its hint key there;
    the actuator signs every hint file with it (values are read past the signature line)."""
    monkeypatch.setattr(hintauth, "read_key", lambda path, private=False: b"k" * 32)


def _placement(d, ranks: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / ".placement.json").write_text(json.dumps({"job": d.name, "gen": 0, "ranks": ranks}))


def _avoid_link(link: str, state: str = "quarantine") -> Action:
    return Action(key=action_key(Verb.AVOID_LINK, link), verb=Verb.AVOID_LINK, target=link, target_kind="link",
                  reason=f"seamguard: {state} loss 4.0% on {link}")


def _interval(job: str, seconds: int) -> Action:
    return Action(key=action_key(Verb.CHECKPOINT_INTERVAL, job, value=str(seconds)), verb=Verb.CHECKPOINT_INTERVAL,
                  target=job, target_kind="job", params=(("interval_s", str(seconds)),), reason="seamguard: exposed")


@pytest.mark.parametrize("entity, nic", [
    ("n1/mlx5_0~leaf-u000-r0", "n1/mlx5_0"),   # a NIC's own link, as the fleet names it
    ("n1/rail1", "n1/rail1"),                  # the NIC itself
    ("leaf-u000-r0~spine-3", None),            # switch to switch: routing, no job's rail
    ("~leaf", None), ("n1/~leaf", None),
])
def test_which_avoid_links_name_a_nic(entity, nic):
    assert nic_of_link(entity) == nic


def test_severity_comes_from_the_state_the_reason_names():
    assert severity_of("seamguard: failed carrier down") > severity_of("seamguard: quarantine loss 3%") > 0
    assert severity_of("operator said so") > severity_of("seamguard: failed x")  # unknown counts as the worst


def test_avoid_rail_is_written_for_jobs_on_the_node_kept_and_reverted(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _placement(a, {"0": "n1", "1": "n2"})
    _placement(b, {"0": "n3"})
    act = RuntimeHintActuator({"a": a, "b": b})
    link = _avoid_link("n2/rail0~leaf-u000-r0")
    res = act.apply(link)
    assert res.ok and "a stay off rail rail0" in res.detail
    assert hint_file_value((a / "avoid_rails")) == "rail0 3\n"
    assert not (b / "avoid_rails").exists()  # no rank of b on n2
    # held: a restarted controller sees it in effect and does not ask again
    again = RuntimeHintActuator({"a": a, "b": b})
    assert link.key in again.observe()
    assert diff({link.key: link}, again.observe(), set()) == ([], [])
    # the launcher consumes the file; the decision goes away -> the job may use the rail again
    (a / "avoid_rails").unlink()
    apply, revert = diff({}, again.observe(), set())
    assert apply == [] and revert == [link.key]
    assert again.revert(link.key).ok
    assert hint_file_value((a / "avoid_rails")) == "default\n" and again.observe() == set()


def test_two_rails_avoided_then_one_handed_back(tmp_path):
    a = tmp_path / "a"
    _placement(a, {"0": "n1", "1": "n2"})
    act = RuntimeHintActuator({"a": a})
    r0, r1 = _avoid_link("n1/rail0~leaf0", "failed"), _avoid_link("n2/rail1~leaf1", "quarantine")
    assert act.apply(r0).ok and act.apply(r1).ok
    assert hint_file_value((a / "avoid_rails")) == "rail0 5\nrail1 3\n"  # both, with how bad each is
    assert act.revert(r0.key).ok
    assert hint_file_value((a / "avoid_rails")) == "rail1 3\n" and act.observe() == {r1.key}
    # the same rail's other link, less bad: the worst state still counts; its revert keeps the rail off
    r1b = _avoid_link("n2/rail1", "degraded")
    assert act.apply(r1b).ok and hint_file_value((a / "avoid_rails")) == "rail1 3\n"
    assert act.revert(r1.key).ok and hint_file_value((a / "avoid_rails")) == "rail1 1\n"


def test_revert_of_a_key_this_actuator_never_took_changes_nothing(tmp_path):
    a = tmp_path / "a"
    _placement(a, {"0": "n1"})
    (a / "avoid_rails").write_text("rail1 4\n")  # someone else's (an operator's) request
    act = RuntimeHintActuator({"a": a})
    res = act.revert(action_key(Verb.AVOID_LINK, "n1/rail1~leaf1"))
    assert res.ok and "nothing to revert" in res.detail
    assert hint_file_value((a / "avoid_rails")) == "rail1 4\n"


def test_switch_links_nodes_without_ranks_and_rail_names(tmp_path):
    a = tmp_path / "a"
    _placement(a, {"0": "n1"})
    act = RuntimeHintActuator({"a": a}, rail_names={"n1/mlx5_1": "ib1"})
    uplink = act.apply(_avoid_link("leaf-u000-r1~spine-0"))
    elsewhere = act.apply(_avoid_link("n7/mlx5_1~leaf"))
    assert uplink.ok and "not a NIC's own link" in uplink.detail
    assert elsewhere.ok and "no seamguard-runtime rank runs on n7" in elsewhere.detail
    assert not (a / "avoid_rails").exists() and act.observe() == set()
    assert act.apply(_avoid_link("n1/mlx5_1~leaf-u000-r1")).ok
    assert hint_file_value((a / "avoid_rails")) == "ib1 3\n"  # the interface the job's --rails names


def test_degraded_rides_the_checkpoint_interval(tmp_path):
    hints = tmp_path / "hints"
    act = RuntimeHintActuator({"train": hints})
    first, next_rung = _interval("train", 900), _interval("train", 450)
    assert act.apply(first).ok and hint_file_value((hints / "degraded")) == "on\n"
    (hints / "degraded").unlink()  # consumed by the launcher
    assert act.apply(next_rung).ok and act.revert(first.key).ok
    assert hint_file_value((hints / "degraded")) == "on\n"  # a newer interval is in effect: still at risk
    assert act.revert(next_rung.key).ok and hint_file_value((hints / "degraded")) == "off\n"
    assert act.observe() == set()


def test_operators_switch_each_off(tmp_path):
    a = tmp_path / "a"
    _placement(a, {"0": "n1"})
    act = RuntimeHintActuator({"a": a}, avoid_rails=False, degraded=False)
    assert Verb.AVOID_LINK not in act.verbs  # the reconciler never hands it avoid_link
    assert Verb.AVOID_LINK in RuntimeHintActuator({"a": a}).verbs
    assert act.apply(_interval("a", 900)).ok
    assert (a / "checkpoint_interval_s").exists() and not (a / "degraded").exists()
