"""A cooling loop's supply temperature is judged against the offset over its peers that it holds
when healthy (assess/evidence.loop_evidence, supply_excess). CDUs hold different setpoints: the
detection benchmark's scenario 16 flagged a loop that ran 3.7 °C over the peer median from its
first sample, and the planner labelled its 16 nodes and moved a job off it."""

import numpy as np

from seamguard.assess.baselines import BaselineConfig, Baselines
from seamguard.assess.evidence import EvidenceConfig, loop_evidence
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe.frame import make_frame

FLEET = generate_fleet(FleetShape(gpus=2048), seed=3)
CFG, BCFG = EvidenceConfig(), BaselineConfig()
N = FLEET.count(Kind.COOLING_LOOP)


def _run(supply_of_tick, ticks: int, base: Baselines | None = None):
    """Feed `ticks` frames (30 s apart; flow at rating); returns the supply_excess score per tick."""
    base = base or Baselines.initial(FLEET, BCFG)
    scores = []
    rng = np.random.default_rng(0)
    for k in range(ticks):
        frame = make_frame(FLEET, 30.0 * k, {
            "seamguard_coolant_flow_lpm": FLEET.loop_rated_flow_lpm * (1 + 0.003 * rng.standard_normal(N)),
            "seamguard_coolant_supply_temp_c": supply_of_tick(k) + 0.05 * rng.standard_normal(N)})
        ev, (flow_b, supply_b) = loop_evidence(FLEET, frame, CFG, base, BCFG, dt_s=30.0)
        base = Baselines(base.gpu, base.nic, base.link, base.storage, flow_b, supply_b, base.r_th, base.r_th_n,
                         frame.t_s)
        scores.append(ev.score[:, ev.channels.index("supply_excess")].copy())
    return np.array(scores), base


def test_a_loop_that_always_ran_warmer_than_its_peers_is_left_alone():
    setpoints = np.full(N, 27.0)
    setpoints[1] = 30.7  # 3.7 °C over the median from the first sample
    scores, _ = _run(lambda k: setpoints, 120)
    assert N >= 3 and scores.max() == 0.0


def test_a_loop_whose_supply_rises_over_what_it_held_is_flagged_and_its_peers_are_not():
    setpoints = np.full(N, 27.0)
    setpoints[1] = 29.0
    scores, base = _run(lambda k: setpoints, 40)  # learned: loop 1 holds +2 °C
    assert scores.max() == 0.0
    risen = setpoints.copy()
    risen[1] += 4.0
    after, _ = _run(lambda k: risen, 6, base)
    assert (after[:, 1] > 0.5).all()  # 4 °C over its own offset: 2 -> 5 °C ramp
    assert after[:, [i for i in range(N) if i != 1]].max() == 0.0


def test_a_ledger_snapshot_without_the_supply_baseline_starts_it_fresh():
    _, base = _run(lambda k: np.full(N, 27.0), 20)
    arrays = {k: v for k, v in base.to_arrays().items() if ".loop_supply." not in k}
    back, stale = Baselines.from_arrays(arrays, FLEET, BCFG)
    assert stale == ["loop_supply"]
    assert (back.loop_supply.n == 0).all() and (back.loop.n == base.loop.n).all()
