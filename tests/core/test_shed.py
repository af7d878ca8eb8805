"""Decision table for decide/shed.py: the lowest-criticality jobs off a cooling loop losing flow.

The 16-node fleet of test_planner_stages: loop-001 cools gpu008-015, where job-01
(criticality 1, 2 of its nodes), job-02 (1, 2 nodes), job-03 (0.3, 2 nodes) and job-04
(2, 1 node) run; gpu015 is idle. Default shedding: loops in quarantine or harmful, jobs of
criticality <= 0.5, at most half of the loop's 8 nodes.
"""

import numpy as np
import pytest

from seamguard.assess.quality import FreezeView, FrozenScope
from seamguard.assess.states import State
from seamguard.decide import planner as pl
from seamguard.decide import shed as sh
from seamguard.fleet import Kind

from .test_planner_stages import POL, F, _a, _pol

HARM, Q, D = State.HARMFUL, State.QUARANTINE, State.DEGRADED
LOOP1 = ",".join(f"gpu{i:03d}" for i in range(8, 16))


def loop1(state, fae=10.0):
    return _a(kinds={Kind.COOLING_LOOP: {"state": {1: state}, "gfs": {1: 0.8}, "score": {1: 0.8}, "fae": {1: fae}}})


def sheds(a, policy=POL, in_effect=frozenset(), frozen=None, moving=frozenset()):
    crit, _ = pl.criticality_weights(F, policy)
    return sh.plan_sheds(F, a, policy, crit, set(in_effect), frozen, set(moving))


def name(short):
    """job-0k -> its full name in the fleet (job-03-async_batch_inference)."""
    return F.job_names[int(short[-1])]


def key(short):
    return f"move_job:{name(short)}@loop-001"


@pytest.mark.parametrize("state, max_crit, fraction, moving, expected", [
    (HARM, 0.5, 0.5, (), ["job-03"]),                       # the default: only the low-criticality job
    (Q, 0.5, 0.5, (), ["job-03"]),
    (D, 0.5, 0.5, (), []),                                  # degraded: moves, not sheds
    (State.HEALTHY, 0.5, 0.5, (), []),
    (HARM, 1.0, 0.5, (), ["job-03", "job-01"]),             # lowest first; 4 of 8 nodes; job-02 would be 6
    (HARM, 1.0, 0.5, ("job-01",), ["job-03", "job-02"]),    # a job plan_moves moves is not also shed
    (HARM, 1.0, 0.25, (), ["job-03"]),                      # 2 of 8 nodes
    (HARM, 2.0, 1.0, (), ["job-03", "job-01", "job-02", "job-04"]),  # criticality, then name
    (HARM, 0.2, 0.5, (), []),
    (HARM, 0.5, 0.1, (), []),                               # budget of 0 nodes
])
def test_shed_decision_table(state, max_crit, fraction, moving, expected):
    pol = _pol("actions", shed_job_max_criticality=max_crit, shed_job_max_loop_fraction=fraction)
    out = sheds(loop1(state), pol, moving={key(j) for j in moving})
    assert [a.target for a, _ in out] == [name(j) for j in expected]


def test_a_shed_is_a_move_job_off_the_loop_with_its_nodes_and_counts_against_the_domain():
    (act, req), = sheds(loop1(HARM, fae=12.0))
    assert act.key == key("job-03") and act.cause == "loop-001"
    assert act.params == (("domain", "loop-001"), ("domain_kind", "cooling_loop"), ("nodes", LOOP1), ("mode", "shed"))
    assert req.domain == "cooling_loop:loop-001"
    assert act.reason.startswith("seamguard: shed from loop-001 harmful (criticality 0.3;")
    # benefit: the loop's FAE x the job's share of the loop's busy nodes (2 of 7); cost: its GPUs x weight
    assert act.benefit_gpu_h_per_h == round(12.0 * 2 / 7, 3)
    assert act.cost_gpu_h_per_h == round(float(F.job_gpu_count[3]) * 0.3, 3) and act.criticality == 0.3


def test_shedding_off_and_frozen_loops():
    assert sheds(loop1(HARM), _pol("actions", shed_job_domain_states=[])) == []
    view = FreezeView((FrozenScope("cooling_loop:loop-001", "no data", 0.0),),
                      {Kind.COOLING_LOOP: np.array([False, True])})
    assert sheds(loop1(HARM), frozen=view) == []
    # one in effect stays asked on a frozen loop, and counts against the loop's share
    pol = _pol("actions", shed_job_max_criticality=1.0, shed_job_max_loop_fraction=0.25)
    out = sheds(loop1(HARM), pol, in_effect={key("job-02")}, frozen=view)
    assert [a.target for a, _ in out] == [name("job-02")]
    assert [a.target for a, _ in sheds(loop1(HARM), pol, in_effect={key("job-02")})] == [name("job-02")]


def test_decide_sheds_beside_moves_and_the_actions_carry_the_loops_nodes():
    pol = _pol("actions", move_job_domain_states=["harmful"])
    pol = pol.model_copy(update={"breaker": pol.breaker.model_copy(update={"enabled": False})})
    dec, _ = pl.decide(F, loop1(HARM), pol, pl.DecideState(), set())
    moves = {k: a for k, a in dec.desired.items() if k.startswith("move_job:")}
    assert key("job-03") in moves and moves[key("job-03")].param("mode") == "shed"
    assert all(a.param("nodes") == LOOP1 for a in moves.values())
    assert all(a.param("mode") == "" for k, a in moves.items() if k != key("job-03"))  # the rest are moves


def test_policy_refuses_unknown_shed_states():
    with pytest.raises(ValueError, match="unknown state 'boiling'"):
        _pol("actions", shed_job_domain_states=["boiling"]).actions.model_validate(
            {**POL.actions.model_dump(), "shed_job_domain_states": ["boiling"]})
