"""Checkpoint planner: Daly/Young against hand-computed values, modes, safety, early ckpt."""

import math

import numpy as np
import pytest

from seamguard.decide.tiers import (Mode, PlannerInput, Scope, StoragePath, TierCosts,
                                         daly_interval_s, footprint_hazard_per_s,
                                         hazard_multipliers_from_gfs, plan_checkpoint,
                                         should_checkpoint_now, young_interval_s)

COSTS = TierCosts(full_write_s=300.0, full_restore_s=300.0, in_memory_stall_s=2.0,
                  in_memory_restore_s=2.0, peer_extra_stall_s=0.5)


@pytest.mark.parametrize("delta,mttf,expected", [
    # sqrt(2*300*86400)=7200; x=300/172800; 7200*(1+sqrt(x)/3+x/9)-300
    (300.0, 86_400.0, 7001.391),
    # sqrt(2*60*3600)=657.267; x=60/7200; 657.267*(1.030429+0.000926)-60
    (60.0, 3_600.0, 617.876),
    # delta >= 2M: the interval is M
    (500.0, 200.0, 200.0),
])
def test_daly_matches_hand_computed(delta, mttf, expected):
    assert daly_interval_s(delta, mttf) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("mttf_min,published_min", [(24 * 60, 117.0), (6 * 60, 57.0), (15, 9.1)])
def test_daly_matches_the_optima_daly_published(mttf_min, published_min):
    # Daly, FGCS 22(3) 2006, Figs. 3-5: delta = 5 min; the printed optima (rounded).
    got = daly_interval_s(300.0, mttf_min * 60.0) / 60.0
    assert got == pytest.approx(published_min, abs=0.5 if published_min > 10 else 0.05)


def test_young_and_daly_agree_for_small_delta():
    assert young_interval_s(300, 86_400) == pytest.approx(7200.0)
    # Daly -> Young - delta as delta/M -> 0
    assert daly_interval_s(1.0, 1e7) == pytest.approx(young_interval_s(1.0, 1e7) - 1.0,
                                                      rel=1e-3)


@pytest.mark.parametrize("bad", [(0.0, 10.0), (10.0, 0.0), (-1.0, 10.0)])
def test_daly_rejects_non_positive(bad):
    with pytest.raises(ValueError):
        daly_interval_s(*bad)


def test_gfs_multipliers():
    m = hazard_multipliers_from_gfs(np.array([0.0, 1.0, 0.5, np.nan]), max_multiplier=20)
    assert m == pytest.approx([1.0, 20.0, math.sqrt(20.0), 1.0])
    assert footprint_hazard_per_s(1e-6, m) == pytest.approx(1e-6 * m.sum())


def _inp(**kw):
    base = dict(entity_hazard_per_s=1e-6, hazard_multipliers=np.ones(1000), costs=COSTS)
    base.update(kw)
    return PlannerInput(**base)


def test_interval_shrinks_as_footprint_degrades():
    healthy = plan_checkpoint(_inp())
    gray = plan_checkpoint(_inp(hazard_multipliers=hazard_multipliers_from_gfs(
        np.r_[np.ones(100), np.zeros(900)])))
    assert gray.hazard_per_s > healthy.hazard_per_s
    assert gray.interval_s < healthy.interval_s
    assert any("hazard raised" in r for r in gray.reasons)


@pytest.mark.parametrize("scopes,expected", [
    ({Scope.PROCESS: 1.0}, Mode.IN_MEMORY),                       # host RAM survives
    ({Scope.NODE: 1.0}, Mode.PEER_REPLICATED),                    # node loss: need a peer
    ({Scope.NODE: 0.9, Scope.PERSISTED: 0.1}, Mode.TIERED),       # corruption: need storage
])
def test_mode_decision_table(scopes, expected):
    assert plan_checkpoint(_inp(scope_fractions=scopes)).mode is expected


def test_storage_only_when_memory_tiers_unavailable():
    plan = plan_checkpoint(_inp(scope_fractions={Scope.PERSISTED: 1.0},
                                allowed_modes=(Mode.INCREMENTAL, Mode.FULL)))
    assert plan.mode in (Mode.INCREMENTAL, Mode.FULL)
    assert plan.storage_path == "storage"


def test_unsafe_storage_path_is_avoided():
    paths = (StoragePath("lustre-a", "checkpoint_unsafe"), StoragePath("lustre-b", "healthy"))
    plan = plan_checkpoint(_inp(scope_fractions={Scope.NODE: 0.5, Scope.PERSISTED: 0.5},
                                storage_paths=paths))
    assert plan.storage_path == "lustre-b"
    assert any("lustre-a" in r for r in plan.reasons)


def test_no_safe_storage_leaves_memory_tiers_only():
    paths = (StoragePath("lustre-a", "checkpoint_unsafe"), StoragePath("s3", "failed"))
    plan = plan_checkpoint(_inp(scope_fractions={Scope.NODE: 0.5, Scope.PERSISTED: 0.5},
                                storage_paths=paths))
    assert plan.mode in (Mode.IN_MEMORY, Mode.PEER_REPLICATED)
    assert plan.storage_path is None
    assert any("no safe storage" in r for r in plan.reasons)


@pytest.mark.parametrize("hazard,since,remaining,stall,expected", [
    (1e-3, 600.0, 600.0, 2.0, True),     # p_fail 0.45 * 600 s >> 2 s
    (1e-3, 1.0, 600.0, 2.0, False),      # too little work at risk
    (1e-9, 600.0, 600.0, 2.0, False),    # hazard negligible
    (1e-3, 600.0, 0.0, 2.0, False),      # checkpoint due now anyway
])
def test_should_checkpoint_now_table(hazard, since, remaining, stall, expected):
    assert should_checkpoint_now(hazard, since, remaining, stall) is expected


def test_early_checkpoint_when_evidence_makes_work_overdue():
    kw = dict(entity_hazard_per_s=1e-9, since_last_checkpoint_s=300.0)
    healthy = plan_checkpoint(_inp(**kw))
    assert healthy.interval_s > 300.0 and not healthy.checkpoint_now
    # The assessment raises the footprint's hazard 100x: the same work is now overdue.
    gray = plan_checkpoint(_inp(hazard_multipliers=np.full(1000, 100.0), **kw))
    assert gray.interval_s < 300.0 and gray.checkpoint_now


def test_precursor_hazard_triggers_early_checkpoint():
    # Inside the interval, short-term evidence (say 50% within 30 min) decides: lots of
    # work at risk -> now; little work at risk -> not now; no evidence -> not now.
    costs = TierCosts(full_write_s=300.0, full_restore_s=300.0, in_memory_stall_s=60.0,
                      in_memory_restore_s=2.0)
    kw = dict(entity_hazard_per_s=1e-9, costs=costs, scope_fractions={Scope.PROCESS: 1.0})
    pre = 0.5 / 1800.0
    big = plan_checkpoint(_inp(since_last_checkpoint_s=1500.0, precursor_hazard_per_s=pre, **kw))
    small = plan_checkpoint(_inp(since_last_checkpoint_s=5.0, precursor_hazard_per_s=pre, **kw))
    none = plan_checkpoint(_inp(since_last_checkpoint_s=1500.0, **kw))
    assert big.interval_s > 1500.0
    assert big.checkpoint_now and not small.checkpoint_now and not none.checkpoint_now


def test_tier_costs_validation():
    with pytest.raises(ValueError, match="full_write_s"):
        TierCosts(full_write_s=-1, full_restore_s=1, in_memory_stall_s=1,
                  in_memory_restore_s=1)
