"""Schedule-slip risk (decide/slip.py) and the planner's deadline term, as decision tables.

The forecast is checked against the Poisson model computed independently (factorials) and
against a simulation; the planner on the 16-node fleet of test_planner_stages: the same
fleet and the same degraded node, once under a job whose deadline is tight and once under
the same job with slack, give different, explained decisions.
"""

import math
from dataclasses import replace

import numpy as np
import pytest

from seamguard.assess.states import State
from seamguard.decide import planner as pl
from seamguard.decide import schedule as sc
from seamguard.decide import shed as sh
from seamguard.decide.checkpoints import exposure
from seamguard.decide.slip import checkpoint_slip_saved_s, slip_forecast, slip_saved_s, work_left_s
from seamguard.fleet import Kind

from .test_planner_stages import POL, F, _a, _drains, _pol

NAN = float("nan")


# ---- the forecast -----------------------------------------------------------------------------

def _one(deadline, work, hazard, loss, now=0.0):
    f = slip_forecast(now, np.array([deadline]), np.array([work]), np.array([hazard]), np.array([loss]))
    return float(f.p_miss[0]), float(f.expected_slip_s[0]), float(f.expected_finish_s[0]), float(f.slack_s[0])


@pytest.mark.parametrize("deadline, work, p_miss, slip", [
    (1000.0, 400.0, 0.0, 0.0),       # no hazard, slack: on time
    (1000.0, 1300.0, 1.0, 300.0),    # no hazard, late by construction: slip is the shortfall
    (1000.0, 1000.0, 0.0, 0.0),      # exactly on time is not late
])
def test_without_failures_the_forecast_is_the_arithmetic(deadline, work, p_miss, slip):
    p, s, finish, slack = _one(deadline, work, 0.0, 500.0)
    assert (p, s) == (p_miss, slip)
    assert finish == work and slack == deadline - work


def _poisson_by_factorials(m, loss, slack):
    pmf = [math.exp(-m) * m ** n / math.factorial(n) for n in range(60)]
    p = sum(q for n, q in enumerate(pmf) if n * loss > slack)
    s = sum(q * max(n * loss - slack, 0.0) for n, q in enumerate(pmf))
    return p, s


@pytest.mark.parametrize("hazard_per_h, work_s, loss_s, slack_s", [
    (0.5, 7200.0, 1440.0, 600.0),    # one failure makes it late
    (0.5, 7200.0, 1440.0, 2000.0),   # two do
    (2.0, 36000.0, 900.0, 5000.0),   # many failures expected
    (0.1, 3600.0, 600.0, -100.0),    # late even without failures
])
def test_forecast_matches_the_poisson_model_computed_another_way(hazard_per_h, work_s, loss_s, slack_s):
    p, s, finish, _ = _one(work_s + slack_s, work_s, hazard_per_h, loss_s)
    m = hazard_per_h * work_s / 3600.0
    p_ref, s_ref = _poisson_by_factorials(m, loss_s, slack_s)
    assert p == pytest.approx(p_ref, abs=1e-9) and s == pytest.approx(s_ref, rel=1e-9, abs=1e-9)
    assert finish == pytest.approx(work_s + m * loss_s)


def test_forecast_agrees_with_a_simulation_of_the_job():
    rng = np.random.default_rng(7)
    hazard, work, loss, deadline = 0.8, 4 * 3600.0, 1200.0, 4 * 3600.0 + 2500.0
    finish = np.zeros(200_000)
    for k in range(finish.size // 1000):  # failure times as a Poisson process over the remaining run
        gaps = rng.exponential(3600.0 / hazard, size=(1000, 40)).cumsum(axis=1)
        finish[k * 1000:(k + 1) * 1000] = work + (gaps < work).sum(axis=1) * loss
    p, s, _, _ = _one(deadline, work, hazard, loss)
    assert p == pytest.approx(float((finish > deadline).mean()), abs=0.01)
    assert s == pytest.approx(float(np.maximum(finish - deadline, 0).mean()), rel=0.03)


def test_no_deadline_or_no_progress_is_no_forecast():
    f = slip_forecast(0.0, np.array([NAN, 5000.0]), np.array([100.0, NAN]), np.array([1.0, 1.0]),
                      np.array([60.0, 60.0]))
    assert np.isnan(f.p_miss).all() and np.isnan(f.expected_slip_s).all()


def test_work_left_uses_the_measured_step_time_and_needs_the_runtimes_progress():
    work, step = work_left_s(np.array([1000.0, 1000.0, NAN, 1000.0]), np.array([400.0, NAN, 10.0, 1200.0]),
                             np.array([2.0, NAN, 1.0, NAN]), np.array([1.0, 1.5, 1.0, 1.0]))
    assert list(step) == [2.0, 1.5, 1.0, 1.0]
    assert work[0] == 600 * 2.0 and np.isnan(work[1]) and np.isnan(work[2]) and work[3] == 0.0


@pytest.mark.parametrize("slack_s, saves", [(300.0, True), (30 * 86400.0, False)])
def test_an_action_saves_slip_only_when_the_deadline_is_at_risk(slack_s, saves):
    work = 20 * 3600.0
    saved, before, after = slip_saved_s(0.0, work + slack_s, work, 0.3, 1440.0, hazard_removed_per_h=0.2,
                                        stall_s=45.0)
    assert saved == pytest.approx(before - after)
    assert (saved > 0) == saves and (before > 0) == saves


# ---- the planner ------------------------------------------------------------------------------

J0 = 0  # job-00: high sync training, criticality 3, 48 GPUs on gpu001-006
STEP_S, STEPS = 10.0, 7200  # 20 h of work left from the start


def _fleet(deadline_slack_s, t_s=1000.0):
    n = len(F.job_names)
    deadline = np.full(n, NAN)
    deadline[J0] = t_s + STEPS * STEP_S + deadline_slack_s
    return replace(F, job_deadline_s=deadline, job_total_steps=np.full(n, float(STEPS)),
                   job_step_s=np.full(n, STEP_S), _index={})


def _degraded(gfs=0.1, steps_done=0.0, measured_step_s=NAN):
    a = _a(node={3: State.QUARANTINE}, node_gfs={3: gfs}, kinds={Kind.GPU: {"gfs": {24: gfs}, "score": {24: gfs}}})
    n = len(F.job_names)
    return replace(a, job_steps_done=np.full(n, steps_done), job_step_s=np.full(n, measured_step_s))


def _drain(fleet, a, policy=POL):
    _, node_w = pl.criticality_weights(fleet, policy)
    free, drained_now = pl.spare_nodes(fleet, a, set())
    sched = sc.schedule(fleet, a, policy, exposure(fleet, a, policy))
    mask = np.isin(a.node_state, [State.QUARANTINE])
    return pl.plan_drains(fleet, a, policy, node_w, mask, free, drained_now, sched), sched


@pytest.mark.parametrize("slack_s, policy, drained", [
    (600.0, POL, True),                                   # tight: one failure makes it late -> swap the node
    (30 * 86400.0, POL, False),                           # slack: the same node stays (it does not pay)
    (600.0, _pol("objective", slip_weight=0.0), False),   # the deadline term switched off
])
def test_a_tight_deadline_drains_a_node_that_slack_keeps(slack_s, policy, drained):
    a = _degraded()
    assert _drains(a) == []  # without a deadline the node is kept: the table's premise
    out, sched = _drain(_fleet(slack_s), a, policy)
    assert [x.key for x, _ in out] == (["drain:gpu003"] if drained else [])
    if drained:
        act = out[0][0]
        ev = {e[0].removesuffix(f":{F.job_names[J0]}"): e for e in act.evidence}
        saved = sc.drain_slip_s(_fleet(slack_s), a, policy, 3, 0.0, sched)
        assert ev["slip_saved"][1] == round(saved[0], 1) > 0 and ev["slip_saved"][2] == round(saved[1], 1)
        assert ev["deadline_slip"][1] == round(float(sched.forecast.expected_slip_s[J0]), 1)
        assert ev["deadline_miss"][1] == round(float(sched.forecast.p_miss[J0]), 4) > 0
        assert "deadline slip saved" in act.reason
        dec = pl.quarantine_pays(_fleet(slack_s), a, policy, 3, 3.0, 0.0, 2, False, sched)
        assert any("deadline slip saved" in r for r in dec.reasons) and dec.benefit_gpu_h > dec.cost_gpu_h


def test_a_slow_measured_step_puts_a_job_configured_on_time_at_risk():
    fleet = _fleet(3600.0)  # an hour of slack at the configured 10 s step
    on_time = sc.schedule(fleet, _degraded(gfs=0.0), POL, exposure(fleet, _degraded(gfs=0.0), POL))
    slow = _degraded(gfs=0.0, measured_step_s=STEP_S * 1.1)  # 2 h more work than the slack
    late = sc.schedule(fleet, slow, POL, exposure(fleet, slow, POL))
    assert late.forecast.p_miss[J0] == 1.0 and late.forecast.p_miss[J0] > on_time.forecast.p_miss[J0]
    assert late.forecast.expected_slip_s[J0] >= STEPS * STEP_S * 0.1 - 3600.0


def _loop1_harmful():
    return _a(kinds={Kind.COOLING_LOOP: {"state": {1: State.HARMFUL}, "gfs": {1: 0.8}, "score": {1: 0.8},
                                         "fae": {1: 10.0}}})


@pytest.mark.parametrize("deadline_job, slack_s, shed", [
    (None, 0.0, ["job-03", "job-01"]),        # no deadlines: criticality, then name
    (1, 60.0, ["job-03", "job-02"]),          # job-01 about to miss its deadline: job-02 goes instead
    (2, 30 * 86400.0, ["job-03", "job-01"]),  # job-02 has slack, job-01 no deadline (all the slack): as before
    (1, 30 * 86400.0, ["job-03", "job-02"]),  # equal value: job-02 (no deadline) has more slack than job-01
])
def test_shedding_prefers_jobs_with_slack(deadline_job, slack_s, shed):
    a = _loop1_harmful()
    n = len(F.job_names)
    deadline = np.full(n, NAN)
    if deadline_job is not None:
        deadline[deadline_job] = a.t_s + 3600.0 + slack_s
    fleet = replace(F, job_deadline_s=deadline, job_total_steps=np.full(n, 360.0), job_step_s=np.full(n, 10.0),
                    _index={})
    a = replace(a, job_uncommitted_s=np.full(n, 600.0), job_steps_done=np.zeros(n))
    pol = _pol("actions", shed_job_max_criticality=1.0, shed_job_max_loop_fraction=0.5)
    sched = sc.schedule(fleet, a, pol, exposure(fleet, a, pol))
    crit, _ = pl.criticality_weights(fleet, pol)
    out = sh.plan_sheds(fleet, a, pol, crit, set(), None, set(), *sc.shed_priority(fleet, sched))
    assert [x.target for x, _ in out] == [F.job_names[int(j[-1])] for j in shed]


def test_decide_records_the_forecast_on_job_actions_and_nothing_without_deadlines():
    a = replace(_degraded(gfs=0.1), node_state=np.where(np.arange(16) == 3, State.CHECKPOINT_UNSAFE, State.HEALTHY)
                .astype(np.int8))
    base, _ = pl.decide(F, a, POL, pl.DecideState(), set())
    dl, _ = pl.decide(_fleet(600.0), a, POL, pl.DecideState(), set())
    assert not any(e[0].startswith("deadline") for act in base.desired.values() for e in act.evidence)
    jobs = [act for act in dl.desired.values() if act.target_kind == "job" and act.target == F.job_names[J0]]
    assert jobs, "an exposed job gets a checkpoint action"
    for act in jobs:
        assert {f"deadline_slip:{act.target}", f"deadline_miss:{act.target}"} <= {e[0] for e in act.evidence}


@pytest.mark.parametrize("slack_s, policy, moved", [
    (600.0, POL, True),                                   # tight: the loop's throttling would make it late
    (30 * 86400.0, POL, False),                           # slack: a barely-throttling loop is not worth a move
    (600.0, _pol("objective", slip_weight=0.0), False),   # the deadline term switched off
])
def test_a_tight_deadline_moves_a_job_off_a_loop_that_slack_leaves(slack_s, policy, moved):
    g = 0.01  # the loop's GFS: a 0.3 % slower step, below what a move costs the job without a deadline
    a = _a(kinds={Kind.COOLING_LOOP: {"state": {0: State.DEGRADED}, "gfs": {0: g}, "score": {0: g}}})
    n = len(F.job_names)
    a = replace(a, job_steps_done=np.zeros(n), job_step_s=np.full(n, NAN))
    fleet = _fleet(slack_s)
    crit, _ = pl.criticality_weights(fleet, policy)
    free, _ = pl.spare_nodes(fleet, a, set())
    sched = sc.schedule(fleet, a, policy, exposure(fleet, a, policy))
    assert pl.move_pays(F, policy, J0, 6, g, 3.0).action == "keep"  # the premise: no deadline, no move
    out = [act for act, _ in pl.plan_moves(fleet, a, policy, crit, free, set(), None, sched)
           if act.target == F.job_names[J0]]
    assert bool(out) == moved
    if moved:
        saved = sc.move_slip_s(policy, J0, g, sched, a.t_s)
        ev = {e[0]: e for e in out[0].evidence}
        assert ev[f"slip_saved:{F.job_names[J0]}"][1] == round(saved[0], 1) > 0
        assert f"deadline slip saved {saved[0]:.0f} s" in out[0].reason


@pytest.mark.parametrize("slack_s, p_fail", [(-5000.0, 0.3), (-5000.0, 0.9), (30 * 86400.0, 0.5)])
def test_a_checkpoints_slip_saved_is_the_rollback_it_keeps_against_the_write(slack_s, p_fail):
    unc, write, work = 1200.0, 20.0, 7200.0
    saved, before, after = checkpoint_slip_saved_s(0.0, work + slack_s, work, 0.0, 900.0, p_fail, unc, write)
    if slack_s < 0:  # surely late: every second of delay is a second of slip
        assert before == pytest.approx(-slack_s + p_fail * unc) and after == pytest.approx(-slack_s + write)
        assert saved == pytest.approx(p_fail * unc - write)
    else:
        assert (saved, before, after) == (0.0, 0.0, 0.0)


def test_decide_records_the_slip_a_checkpoint_now_saves():
    a = replace(_degraded(gfs=0.1), node_state=np.where(np.arange(16) == 3, State.CHECKPOINT_UNSAFE, State.HEALTHY)
                .astype(np.int8))
    fleet = _fleet(600.0)
    out, _ = pl.decide(fleet, a, POL, pl.DecideState(), set())
    ck = next(act for k, act in out.desired.items() if k.startswith("checkpoint_now:"))
    sched = sc.schedule(fleet, a, POL, exposure(fleet, a, POL))
    saved = sc.checkpoint_slip_s(fleet, a, POL, sched, J0, None)
    ev = {e[0]: e for e in ck.evidence}
    assert ev[f"slip_saved:{F.job_names[J0]}"][1:3] == (round(saved[0], 1), round(saved[1], 1))
    assert saved[0] != 0.0
