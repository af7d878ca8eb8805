"""The Slurm actuator against a real slurmctld + munged (Debian packages), driven by the
real Controller in enforce mode. Nodes are fake (never registered, no slurmd)."""

from __future__ import annotations


import pytest

from seamguard.act.slurm import SlurmActuator, SlurmConfig
from seamguard.control import Controller
from seamguard.decide.actions import Action, Verb, action_key
from seamguard.decide.policy import default_policy
from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.observe.frame import make_frame
from seamguard.testbed.slurm import SlurmCluster
from seamguard.twin.telemetry import Twin, TwinConfig

pytestmark = pytest.mark.slow

FLEET = generate_fleet(FleetShape(gpus=64, spare_fraction=0.25), seed=0)  # gpu000..gpu007, 2 spares


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), FLEET.node_names) as sc:
        yield sc


@pytest.fixture
def slurm(cluster):
    """A fresh actuator; every node back to clean (no drain, no features) afterwards."""
    act = SlurmActuator(SlurmConfig(slurm_conf=cluster.conf, timeout_s=20))
    yield act
    for n in FLEET.node_names:
        cluster.scontrol("update", f"NodeName={n}", "State=RESUME")
        cluster.scontrol("update", f"NodeName={n}", "AvailableFeatures=", "ActiveFeatures=")


def policy(max_fleet_fraction: float = 1.0):
    return default_policy(
        mode="enforce", breaker={"max_fleet_fraction": max_fleet_fraction, "max_loop_fraction": 1.0,
                                 # only the rate bound is under test here, not the in-effect totals
                                 "max_in_effect_fleet_fraction": 1.0, "max_in_effect_loop_fraction": 1.0,
                                 "max_in_effect_rack_fraction": 1.0, "max_in_effect_leaf_fraction": 1.0,
                                 "max_domain_fraction": 1.0},
        assess={"hysteresis": {"gpu": {"recover_ticks": 2, "min_dwell_ticks": 0}}},
        actions={"release_after_healthy_ticks": 0})  # the resume mechanics are under test, not the dwell


def frames(slow_gpus: list[int], during: range, n: int):
    """Twin frames where ``slow_gpus`` compute 1.6x slower than their peers for ``during`` ticks."""
    tw = Twin(FLEET, [], TwinConfig(tick_s=5.0), 0)
    for k in range(n):
        f = tw.step()
        v = dict(f.values)
        if k in during:
            c = v["seamguard_rank_compute_seconds"].copy()
            c[slow_gpus] *= 1.6
            v["seamguard_rank_compute_seconds"] = c
        yield make_frame(FLEET, f.t_s, v)


def gpu_of(node: str) -> int:
    return FLEET.gpu_names.index(f"{node}/gpu0")


def test_quarantine_drains_with_tagged_reason_and_recovery_resumes(slurm) -> None:
    ctl = Controller(FLEET, policy(), [slurm], None, tick_s=5.0, mode="enforce")
    seen_drained = False
    for k, fr in enumerate(frames([gpu_of("gpu001")], range(2, 8), 16)):
        rep = ctl.tick(fr)
        assert not rep.error, rep.error
        node = slurm.nodes()["gpu001"]
        if node.draining:
            seen_drained = True
            assert node.reason.startswith("seamguard: quarantine ")
            assert "compute_excess" in node.reason  # the evidence travels with the drain
            assert "drain:gpu001" in slurm.observe()
    assert seen_drained
    # Recovered: seamguard resumed its own drain (Slurm 22.05 answers rc 1 here; state read back).
    assert not slurm.nodes()["gpu001"].draining
    assert "drain:gpu001" not in slurm.observe()
    reverts = [c for c in ctl.last.changes] if ctl.last else []
    assert all(c.status == "done" for c in reverts)


def test_node_drained_by_someone_else_is_never_resumed(slurm, cluster) -> None:
    r = cluster.scontrol("update", "NodeName=gpu002", "State=DRAIN", "Reason=admin: PSU swap ticket 123")
    assert r.returncode == 0, r.stderr
    assert "drain:gpu002" not in slurm.observe()  # not ours, so never a candidate for revert
    res = slurm.revert("drain:gpu002")
    assert not res.ok and "another owner" in res.detail
    # The controller also wants it out (fault on it), then it recovers: the foreign drain stays.
    ctl = Controller(FLEET, policy(), [slurm], None, tick_s=5.0, mode="enforce")
    for fr in frames([gpu_of("gpu002")], range(2, 8), 16):
        assert not ctl.tick(fr).error
    node = slurm.nodes()["gpu002"]
    assert node.draining and node.reason == "admin: PSU swap ticket 123"


def test_features_carry_degraded_admissibility(slurm, cluster) -> None:
    r = cluster.scontrol("update", "NodeName=gpu003", "AvailableFeatures=nvme", "ActiveFeatures=nvme")
    assert r.returncode == 0, r.stderr
    classes = "async_batch_inference,checkpoint_restore"
    key = action_key(Verb.LABEL_DEGRADED, f"gpu003={classes}")  # the planner's key
    act = Action(key=key, verb=Verb.LABEL_DEGRADED, target="gpu003", target_kind="node",
                 params=(("classes", classes),), reason="seamguard: degraded")
    res = slurm.apply(act)
    assert res.ok, res.detail
    node = slurm.nodes()["gpu003"]
    assert set(node.available) == {"nvme", "sg_degraded", "sg_ok_async_batch_inference", "sg_ok_checkpoint_restore"}
    assert set(node.active) == set(node.available)
    assert key in slurm.observe()  # read back as the same key: reconcile sees it as done
    assert slurm.revert(key).ok
    assert slurm.nodes()["gpu003"].available == ("nvme",)  # someone else's feature kept


def test_controller_labels_degraded_node_through_slurm(slurm) -> None:
    ctl = Controller(FLEET, policy(), [slurm], None, tick_s=5.0, mode="enforce")
    labelled = False
    for k, fr in enumerate(frames([gpu_of("gpu004")], range(2, 4), 5)):
        assert not ctl.tick(fr).error
        feats = slurm.nodes()["gpu004"].available
        labelled |= "sg_degraded" in feats and "sg_ok_async_batch_inference" in feats
    assert labelled


def test_breaker_stops_drains_beyond_budget(slurm) -> None:
    ctl = Controller(FLEET, policy(max_fleet_fraction=0.25), [slurm], None, tick_s=5.0, mode="enforce")
    victims = ["gpu001", "gpu002", "gpu003", "gpu004", "gpu005", "gpu006"]
    held = 0
    for fr in frames([gpu_of(n) for n in victims], range(2, 30), 8):
        rep = ctl.tick(fr)
        assert not rep.error, rep.error
        held = max(held, len(rep.decisions.held))
    drained = [n for n, info in slurm.nodes().items() if info.draining]
    assert len(drained) == 2  # 25 % of 8 nodes
    assert all(slurm.nodes()[n].reason.startswith("seamguard:") for n in drained)
    assert ctl.breaker.tripped and "of the fleet" in ctl.breaker.reason
    assert held >= 1  # more drains were wanted than the budget allows; none of them reached Slurm


def test_refusals_are_reported(slurm) -> None:
    act = Action(key="drain:nosuchnode", verb=Verb.DRAIN, target="nosuchnode", target_kind="node",
                 reason="seamguard: failed xid=79")
    res = slurm.apply(act)
    assert not res.ok and "no node" in res.detail
    # What scontrol itself refuses comes back with rc != 0 and its stderr.
    r = slurm._run([slurm.cfg.scontrol, "update", "NodeName=gpu000", "State=DRAIN"])  # no reason
    assert r.returncode != 0 and r.stderr.strip()


def test_separator_and_newline_free_text_in_a_foreign_reason(slurm, cluster) -> None:
    """Issue 14: a `|` in another owner's drain reason made every tick fail (sinfo rows did not split)."""
    reason = "admin: PSU swap | ticket 123 | a|b"
    r = cluster.scontrol("update", "NodeName=gpu005", "State=DRAIN", f"Reason={reason}")
    assert r.returncode == 0, r.stderr
    nodes = slurm.nodes()
    assert nodes["gpu005"].reason == reason and nodes["gpu005"].draining
    assert not slurm.problems and len(nodes) == len(FLEET.node_names)
    assert "drain:gpu005" not in slurm.observe()
    ctl = Controller(FLEET, policy(), [slurm], None, tick_s=5.0, mode="enforce")
    for fr in frames([gpu_of("gpu005")], range(2, 8), 10):
        assert not ctl.tick(fr).error
    assert slurm.nodes()["gpu005"].reason == reason  # never overwritten, never resumed
