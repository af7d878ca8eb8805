"""Decision table for decide/intervals.py: a shorter checkpoint interval while a job is exposed.

The same 16-node fleet and synthetic assessments as test_planner_stages (job-00 on
gpu001-006, 48 GPUs; job-03 is async inference). Defaults: a 30 min assumed interval and a
20 s write.
"""

import math

import numpy as np
import pytest

from seamguard.decide import checkpoints as ck
from seamguard.decide import intervals as iv
from seamguard.decide.actions import ActionKey, Verb

from .test_planner_stages import CU, F, J0, POL, _a, _pol

OWN_S = POL.assess.propagation.checkpoint_interval_h * 3600.0
WRITE_S = POL.actions.checkpoint_write_s
CRIT = np.ones(len(F.job_names))


@pytest.mark.parametrize("young_s, rung_s", [
    (1000.0, 900.0),    # one halving
    (900.0, 900.0),
    (600.0, 450.0),     # the rung at or below Young's
    (200.0, 112.5),
    (10.0, 56.25),      # capped: never below twice the write (40 s)
    (1800.0, None),     # the job's own interval is already at or below Young's: left alone
    (5000.0, None),
])
def test_the_ladder_of_halvings(young_s, rung_s):
    assert iv.ladder_interval_s(OWN_S, young_s, WRITE_S) == rung_s


def _plan(a, in_effect=(), in_episode=(), policy=POL):
    return iv.plan_checkpoint_intervals(F, policy, ck.exposure(F, a, policy), CRIT, set(in_effect), set(in_episode))


def _exposed(gfs):
    return _a(node={3: CU}, domain={3: (CU, 0, 0, 0)}, node_gfs={3: gfs})


def test_an_exposed_training_job_gets_youngs_rung_when_it_pays():
    out = _plan(_exposed(0.9))
    (act,) = out.values()
    hazard = 0.5 * 0.9 ** 2  # hazard_per_h_at_gfs1 x GFS^2 of gpu003
    young = math.sqrt(2 * WRITE_S * 3600 / hazard)
    ak = ActionKey.parse(act.key)
    assert (ak.verb, ak.entity) == (Verb.CHECKPOINT_INTERVAL, J0) and act.cause == "gpu003"
    assert young / 2 < float(ak.value) <= young and act.param("interval_s") == ak.value
    assert act.benefit_gpu_h_per_h > act.cost_gpu_h_per_h > 0
    assert "checkpoint every" in act.reason and "Young's" in act.reason
    # a worse node: a shorter rung, a new key (reconcile reverts the old one)
    worse = _plan(_exposed(1.5), in_effect={act.key})
    (act2,) = worse.values()
    assert float(ActionKey.parse(act2.key).value) < float(ak.value)


def test_nothing_for_healthy_jobs_inference_jobs_or_when_switched_off():
    assert _plan(_a()) == {}
    inference = _a(node={12: CU}, domain={12: (CU, 0, 0, 0)}, node_gfs={12: 0.9})  # job-03
    assert _plan(inference) == {}
    assert _plan(_exposed(0.9), policy=_pol("actions", adapt_checkpoint_interval=False)) == {}
    # a write so long that the shorter interval costs more than the rollback it saves
    assert _plan(_exposed(0.9), policy=_pol("actions", checkpoint_write_s=400.0)) == {}


def test_one_in_effect_stays_through_the_risk_episode_and_goes_when_it_ends():
    held = f"checkpoint_interval:{J0}=900"
    calm = _a()  # this tick shows no exposure (a dip, a restarted controller's first tick)
    kept = _plan(calm, in_effect={held}, in_episode={J0})
    assert list(kept) == [held] and kept[held].param("interval_s") == "900"
    assert "risk episode" in kept[held].reason
    assert _plan(calm, in_effect={held}) == {}  # the episode ended: reverted, the job's own interval
    assert _plan(calm, in_effect={"checkpoint_interval:no-such-job=900"}, in_episode={"no-such-job"}) == {}


def test_within_the_risk_the_interval_only_tightens():
    """A hazard that dips across a rung's boundary for a tick keeps the shorter rung (the detection
    benchmark's scenario 6 switched a job 450 -> 900 -> 450 -> 900 s on consecutive ticks)."""
    (tight,) = _plan(_exposed(1.5))
    (loose,) = _plan(_exposed(0.9))
    assert float(ActionKey.parse(tight).value) < float(ActionKey.parse(loose).value)
    dipped = _plan(_exposed(0.9), in_effect={tight})
    assert list(dipped) == [tight] and "only tightens" in dipped[tight].reason
    assert list(_plan(_exposed(1.5), in_effect={loose})) == [tight]  # worse: tightens at once
