"""Decision tables: the planner prices a move, drain or shed over the fault's expected remaining time.

The 16-node fleet and synthetic assessments of tests/core/test_planner_stages.py: loop-000 cools
gpu000-007 (job-00, criticality 3, six nodes; job-01 two of its nodes there), loop-001 gpu008-015
(job-03, criticality 0.3, is shed from it). The break-even remaining time of each action is found
from the economics themselves (`move_pays`, `quarantine_pays` at a given remaining time), so the
tables check that the planner acts exactly where the fault has more than that left, at any age.
"""

from __future__ import annotations

import math

import pytest

from seamguard.assess.states import State
from seamguard.decide import planner as pl
from seamguard.decide.actions import Verb
from seamguard.decide.durations import expected_remaining_s, table_from_rows
from seamguard.fleet import Kind
from tests.core.test_planner_stages import J0, LOOP0_BAD, F, _a, _pol

T = 100_000.0
LOOP0 = "cooling_loop:loop-000"


def _policy(rows, section="objective", **actions):
    pol = _pol(section, fault_durations=rows) if section == "objective" else _pol(section, **actions)
    if actions and section == "objective":
        pol = pol.model_copy(update={"actions": pol.actions.model_copy(update=actions)})
    return pol.model_copy(update={"breaker": pol.breaker.model_copy(update={"enabled": False})})


def _exp(domain, mean_s, cls="gray"):
    return [{"domain": domain, "class": cls, "mean_s": mean_s, "source": "measured", "n": 9}]


def _logn(domain, median_s, sigma, cls="gray"):
    return [{"domain": domain, "class": cls, "n": 20, "source": "measured",
             "lognormal": {"mu": math.log(median_s), "sigma": sigma}}]


def _decide(pol, a, age_s=0.0, entity=LOOP0):
    state = pl.DecideState(onsets=((entity, a.t_s - age_s),))
    return pl.decide(F, a, pol, state, set())


def _move_break_even_s(pol) -> float:
    """The remaining time past which moving job-00 (6 nodes) off loop-000 at GFS 0.9 pays, by bisection."""
    lo, hi = 1.0, pol.objective.horizon_h * 3600.0
    pays = lambda s: pl.move_pays(F, pol, 0, 6, 0.9, 3.0, remaining_h=s / 3600.0).action == "quarantine"  # noqa: E731
    assert pays(hi) and not pays(lo)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi


def _moved(dec) -> bool:
    return any(a.verb == Verb.MOVE_JOB and a.target == J0 for a in dec.desired.values())


@pytest.mark.parametrize("rows, expect", [
    (_exp("cooling_loop", 20.0), False),  # flow losses here last 20 s: over before a move pays
    (_exp("cooling_loop", 7200.0), True),  # they last 2 h: the move pays
    ([], True),  # no history: the published prior (2 h)
])
def test_a_short_fault_is_not_moved_from_a_long_one_is(rows, expect):
    dec, _ = _decide(_policy(rows), _a(t_s=T, kinds=LOOP0_BAD))
    assert _moved(dec) == expect


@pytest.mark.parametrize("age_s", [0.0, 5.0, 30.0, 120.0, 600.0, 3000.0])
@pytest.mark.parametrize("median_s, sigma", [(10.0, 2.0), (300.0, 0.2), (60.0, 1.2)])
def test_the_move_is_taken_exactly_when_the_fault_has_more_than_the_break_even_left(age_s, median_s, sigma):
    pol = _policy(_logn("cooling_loop", median_s, sigma))
    left = expected_remaining_s(table_from_rows(_logn("cooling_loop", median_s, sigma), "t")[("cooling_loop", "gray")],
                                age_s)
    dec, st = _decide(pol, _a(t_s=T, kinds=LOOP0_BAD), age_s)
    assert _moved(dec) == (left > _move_break_even_s(pol))
    assert dict(st.onsets)[LOOP0] == T - age_s  # the fault keeps its age from tick to tick
    if _moved(dec):
        act = next(a for a in dec.desired.values() if a.verb == Verb.MOVE_JOB and a.target == J0)
        ev = {c: (s, v) for c, s, v, _ in act.evidence}
        assert ev["fault_remaining:loop-000"] == (round(age_s, 1), round(left, 1))
        assert f"expected to last {left:.0f} s more" in act.reason and "lognormal" in act.reason


def test_an_aging_heavy_tailed_fault_is_moved_once_it_has_lasted_long_enough():
    """Flow losses mostly of seconds, a few of hours (median 10 s, sigma 2): a new one is left alone;
    one that has lasted ten minutes is expected to last far longer and is moved."""
    pol = _policy(_logn("cooling_loop", 10.0, 2.0))
    a = _a(t_s=T, kinds=LOOP0_BAD)
    young, st = pl.decide(F, a, pol, pl.DecideState(), set())
    assert not _moved(young) and dict(st.onsets) == {LOOP0: T}
    d = table_from_rows(_logn("cooling_loop", 10.0, 2.0), "t")[("cooling_loop", "gray")]
    ages = (1.0, 2.0, 60.0, 600.0)
    pays = [expected_remaining_s(d, age) > _move_break_even_s(pol) for age in ages]
    assert pays == [False, False, True, True]  # the premise: young, it is not worth it; old, it is
    assert [_moved(pl.decide(F, _a(t_s=T + age, kinds=LOOP0_BAD), pol, st, set())[0]) for age in ages] == pays


def test_a_fault_healed_and_back_starts_young_again():
    pol = _policy(_logn("cooling_loop", 10.0, 2.0))
    _, st = _decide(pol, _a(t_s=T, kinds=LOOP0_BAD), 600.0)
    _, st = pl.decide(F, _a(t_s=T + 1), pol, st, set())  # the loop is healthy again
    assert LOOP0 not in dict(st.onsets)
    dec, st = pl.decide(F, _a(t_s=T + 2, kinds=LOOP0_BAD), pol, st, set())
    assert not _moved(dec) and dict(st.onsets)[LOOP0] == T + 2


def test_the_onsets_survive_a_restart_of_the_controller():
    _, st = _decide(_policy([]), _a(t_s=T, kinds=LOOP0_BAD), 42.0)
    assert pl.DecideState.from_json(st.to_json()).onsets == st.onsets
    assert pl.DecideState.from_json({**st.to_json(), "onsets": []}).onsets == ()


GPU3 = {3: State.QUARANTINE}


def _drain_a(t_s=T):
    return _a(t_s=t_s, node=GPU3, node_gfs={3: 0.95}, kinds={Kind.GPU: {"gfs": {24: 0.95}, "score": {24: 0.95}}})


@pytest.mark.parametrize("rows, expect", [
    (_exp("gpu", 20.0), False),  # the GPU's slow spells last 20 s
    (_exp("gpu", 3 * 3600.0), True),
    (_exp("node", 20.0), False),  # no gpu row: the node's
    ([], True),  # no history: the planning horizon
])
def test_a_drain_is_priced_over_the_nodes_fault(rows, expect):
    dec, _ = _decide(_policy(rows), _drain_a(), 0.0, "node:gpu003")
    drains = [a for a in dec.desired.values() if a.verb == Verb.DRAIN and a.target == "gpu003"]
    assert bool(drains) == expect
    if drains:
        assert any(c == "fault_remaining:gpu003" for c, *_ in drains[0].evidence)


def test_a_failed_node_is_drained_whatever_its_history_says():
    a = _a(t_s=T, node={3: State.FAILED})
    dec, _ = _decide(_policy(_exp("node", 1.0, "hard")), a, 0.0, "node:gpu003")
    assert "drain:gpu003" in dec.desired


HARMFUL_LOOP1 = {Kind.COOLING_LOOP: {"state": {1: State.HARMFUL}, "gfs": {1: 0.8}, "score": {1: 0.8},
                                     "fae": {1: 10.0}}}


@pytest.mark.parametrize("mean_s, expect", [(10.0, False), (7200.0, True)])
def test_no_shed_off_a_loop_whose_fault_ends_before_the_requeue(mean_s, expect):
    pol = _policy(_exp("cooling_loop", mean_s), move_job_domain_states=["harmful"])
    dec, _ = _decide(pol, _a(t_s=T, kinds=HARMFUL_LOOP1), 0.0, "cooling_loop:loop-001")
    sheds = [a for a in dec.desired.values() if a.param("mode") == "shed"]
    assert bool(sheds) == expect
    if sheds:
        assert any(c == "fault_remaining:loop-001" for c, *_ in sheds[0].evidence)
