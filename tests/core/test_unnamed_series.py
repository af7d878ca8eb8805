"""Faults nobody named are still seen (issue 37, point 5): decision tables.

A twin fleet's frames carry two series no channel names (an HBM temperature gauge that
follows load, an NVLink traffic counter that grows with it), each GPU with its own offset
and noise. Through the controller (assess, then decide with the default policy):
- one GPU's gauge drifting away from its own past and its peers -> that GPU degraded, the
  evidence names the series, never quarantined or failed, no drain;
- the same drift on every GPU (a driver update) -> nothing;
- a counter that stops while its peers move -> a telemetry fault of that GPU;
- a series that vanishes while its host still reports -> a telemetry fault of that GPU;
- a spike of two scrapes -> nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from seamguard.assess import State
from seamguard.assess.unnamed import UnnamedJudgeConfig
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.decide.actions import ActionKey, Verb
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe.unnamed import SeriesBlock, UnnamedConfig, block_from_columns
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=64, nodes_per_storage_path=4), seed=3)
TICK = 30.0
POL = default_policy()
WARM = POL.assess.unnamed.warm_samples + 5
GAUGE, COUNTER = "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
DRAINS = (State.QUARANTINE, State.HARMFUL, State.FAILED)


class World:
    """The twin plus the two unnamed series, with hooks to bend them per tick."""

    def __init__(self, seed: int = 4) -> None:
        self.twin = Twin(FLEET, [], TwinConfig(tick_s=TICK, warm_gpu_share=0.0), seed=seed)
        self.rng = np.random.default_rng(seed)
        n = FLEET.count(Kind.GPU)
        self.offset_c = self.rng.normal(0.0, 2.0, n)  # each board its own normal
        self.bytes = np.zeros(n)
        self.ctl = Controller(FLEET, POL, tick_s=TICK)

    def tick(self, bend=None):
        frame = self.twin.step()
        util = frame.values["DCGM_FI_DEV_GPU_UTIL"] / 100.0
        n = util.size
        gauge = 45.0 + 25.0 * util + self.offset_c + self.rng.normal(0.0, 0.3, n)
        self.bytes += util * 2e9 * TICK * (1.0 + 0.05 * self.rng.standard_normal(n))
        cols = {GAUGE: gauge, COUNTER: self.bytes.copy()}
        if bend is not None:
            bend(cols)
        block = block_from_columns(Kind.GPU, n, cols, UnnamedConfig())
        rep = self.ctl.tick(replace(frame, series=(block,)))
        assert not rep.error, rep.error
        return rep

    def warm(self) -> None:
        for _ in range(WARM):
            self.tick()


def busy_gpu(i: int = 5) -> int:
    return int(np.flatnonzero(FLEET.gpu_job == 0)[i])


def unnamed_channels(rep, g: int) -> dict[str, float]:
    e = rep.assessment.kinds[Kind.GPU].evidence
    return {c: float(e.score[g, j]) for j, c in enumerate(e.channels) if ":" in c and e.score[g, j] > 0}


def drains(rep) -> list[str]:
    return [k for k in rep.decisions.desired if ActionKey.parse(k).verb == Verb.DRAIN]


def run(world: World, ticks: int, bend=None):
    reps = [world.tick(bend) for _ in range(ticks)]
    return reps


def test_a_drifting_gauge_on_one_gpu_degrades_it_naming_the_series_and_never_drains():
    w, g = World(), busy_gpu()
    w.warm()

    def hot(cols):
        cols[GAUGE][g] += 10.0
    reps = run(w, 40, hot)
    states = [int(r.assessment.kinds[Kind.GPU].states.state[g]) for r in reps]
    assert State.DEGRADED in states
    assert not any(s in DRAINS for s in states)
    assert all(not drains(r) for r in reps)
    assert max(int(r.assessment.node_state.max()) for r in reps) <= State.DEGRADED
    named = unnamed_channels(reps[-1], g)
    assert list(named) == [f"series:{GAUGE}"]
    # only that GPU: its peers are untouched
    others = [i for i in range(FLEET.count(Kind.GPU)) if i != g]
    assert all(not unnamed_channels(r, i) for r in reps for i in others)


def test_the_same_drift_on_every_gpu_is_nobodys_fault():
    w = World()
    w.warm()

    def driver_update(cols):
        cols[GAUGE] += 8.0
    reps = run(w, 20, driver_update)
    assert all(not unnamed_channels(r, i) for r in reps for i in range(FLEET.count(Kind.GPU)))
    assert all(int(r.assessment.kinds[Kind.GPU].states.state.max()) == State.HEALTHY for r in reps)


def test_a_counter_stuck_while_its_peers_move_is_a_telemetry_fault_of_that_gpu():
    w, g = World(), busy_gpu(2)
    w.warm()
    frozen = float(w.bytes[g])

    def stuck(cols):
        cols[COUNTER][g] = frozen
    reps = run(w, POL.assess.unnamed.stuck_ticks + 2, stuck)
    assert f"telemetry:{COUNTER}" in unnamed_channels(reps[-1], g)
    assert not unnamed_channels(reps[0], g)  # still for one tick is not stuck
    assert all(not unnamed_channels(reps[-1], i) for i in range(FLEET.count(Kind.GPU)) if i != g)


def test_a_series_that_vanishes_while_its_host_reports_is_a_telemetry_fault():
    w, g = World(), busy_gpu(3)
    w.warm()

    def gone(cols):
        cols[GAUGE][g] = np.nan
    reps = run(w, POL.assess.unnamed.vanish_ticks + 1, gone)
    assert f"telemetry:{GAUGE}" in unnamed_channels(reps[-1], g)
    assert all(not unnamed_channels(reps[-1], i) for i in range(FLEET.count(Kind.GPU)) if i != g)


def test_a_series_gone_everywhere_is_no_ones_telemetry_fault():
    w = World()
    w.warm()

    def dropped(cols):  # a new exporter version stopped exporting it
        cols[GAUGE][:] = np.nan
    reps = run(w, POL.assess.unnamed.vanish_ticks + 2, dropped)
    assert all(not unnamed_channels(r, i) for r in reps for i in range(FLEET.count(Kind.GPU)))


def test_a_two_scrape_spike_is_nothing():
    w, g = World(), busy_gpu(4)
    w.warm()
    k = [0]

    def spike(cols):
        k[0] += 1
        if k[0] in (2, 3):
            cols[GAUGE][g] += 20.0
    reps = run(w, 10, spike)
    assert all(not unnamed_channels(r, g) for r in reps)
    assert all(int(r.assessment.kinds[Kind.GPU].states.state[g]) == State.HEALTHY for r in reps)


# (weight, telemetry score, explain GFS): whether unnamed evidence alone could reach quarantine (0.8)
BOUND_CASES = [((0.6, 0.55, 0.2), False), ((0.8, 0.55, 0.0), True), ((0.6, 0.6, 0.5), True)]


@pytest.mark.parametrize("knobs,refused", BOUND_CASES)
def test_the_config_refuses_weights_that_could_drain_on_their_own(knobs, refused):
    w, t, e = knobs
    if refused:
        with pytest.raises(ValueError, match="on its own"):
            UnnamedJudgeConfig(weight=w, telemetry_score=t, explain_gfs=e)
    else:
        UnnamedJudgeConfig(weight=w, telemetry_score=t, explain_gfs=e)


def test_a_block_that_does_not_fit_is_refused_in_one_line():
    with pytest.raises(ValueError, match="do not fit"):
        SeriesBlock(Kind.GPU, ("a", "b"), np.zeros(2, bool), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="bad series pattern"):
        UnnamedConfig(deny=("(",))
