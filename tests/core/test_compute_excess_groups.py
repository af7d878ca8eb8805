"""compute_excess judges a rank's work, not its neighbours' clocks (issue 37, point 2).

A rank's compute time is normalised by its clock (a throttled GPU is slow because of its
clock, which the clock and thermal channels judge) and compared with the other ranks of
its job. When half a job's clocks drop together, the healthy half must not read as slow:
a decision table over a twin fleet, the job's GPUs' clocks and compute times set per row.
"""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.assess import assess, initial_states
from seamguard.decide import default_policy
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe import History
from seamguard.twin.telemetry import Twin, TwinConfig

TICK = 30.0
POL = default_policy()
FLEET = generate_fleet(FleetShape(gpus=64), seed=1)
JOB = np.flatnonzero(FLEET.gpu_job == 0)  # 24 GPUs
HALF = JOB[: len(JOB) // 2]
SLOW = JOB[-1]  # in the other half

CLOCK, COMPUTE = "DCGM_FI_DEV_SM_CLOCK", "seamguard_rank_compute_seconds"

# (name, GPUs whose clock drops to `clock` (their compute time grows by 1/clock),
#  GPUs slow at full clock (compute x 1.3), GPUs compute_excess may flag)
ROWS = [
    ("half the job throttled", HALF, 0.7, [], set()),
    ("half the job throttled hard", HALF, 0.5, [], set()),
    ("half throttled, one fail-slow in the other half", HALF, 0.7, [SLOW], {int(SLOW)}),
    ("one fail-slow, clocks healthy", JOB[:0], 1.0, [SLOW], {int(SLOW)}),
    ("one throttled alone", JOB[:1], 0.7, [], set()),
]


def _run(throttled: np.ndarray, clock_share: float, slow: list, ticks: int = 16):
    twin = Twin(FLEET, [], TwinConfig(tick_s=TICK, warm_gpu_share=0.0), seed=3)
    hist = History(TICK, 2, POL.assess.history_depths(TICK))
    states, base, a = initial_states(FLEET), None, None
    for k in range(ticks):
        frame = twin.step()
        if k >= ticks // 2:  # a healthy first half: baselines learned
            frame.values[CLOCK][throttled] *= clock_share
            frame.values[COMPUTE][throttled] /= clock_share
            frame.values[COMPUTE][slow] *= 1.3
        a = assess(FLEET, frame, hist, states, POL.assess, base=base)
        hist.push(frame)
        states, base = {kd: a.kinds[kd].states for kd in a.kinds}, a.baselines
    return a.kinds[Kind.GPU].evidence


@pytest.mark.parametrize("name,throttled,clock_share,slow,may_flag", ROWS, ids=[r[0] for r in ROWS])
def test_compute_excess_never_indicts_the_unaffected_part_of_a_job(name, throttled, clock_share, slow, may_flag):
    ev = _run(throttled, clock_share, slow)
    score = ev.score[:, ev.channels.index("compute_excess")]
    flagged = {int(i) for i in JOB if score[i] > 0.0}
    assert flagged == may_flag, name
    if len(throttled) and clock_share < 0.9:  # the throttled ones carry their clock deficit as the reason
        assert (ev.column("clock_deficit")[throttled] > 0.2).all()
