"""Telemetry that is normal is not a fault (issue 37, held-out detection): decision tables.

A healthy NVLink, PCIe link or HBM corrects a burst of errors now and then (field studies
in docs/evidence.md, "Error counters"): one scrape's burst of 20 CRC errors read over a
one-minute window is 1,200 per hour, far over any limit. A counter that keeps climbing is
what a failing part shows, so a rate scores only when the counter rose in several scrapes
of the window; one burst and then quiet is background, whatever its size.
"""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.assess.assessment import AssessConfig, assess, initial_states
from seamguard.assess.states import State
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe import History
from seamguard.observe.frame import make_frame

TICK_S = 30.0
FLEET = generate_fleet(FleetShape(gpus=32, rails=2, racks_per_loop=1), seed=5)
G = FLEET.count(Kind.GPU)
GPU = 3
COUNTERS = {"nvlink_errors": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "sbe_rate": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "pcie_replays": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"}


def healthy() -> dict[str, np.ndarray]:
    nic = FLEET.count(Kind.NIC)
    return {
        "DCGM_FI_DEV_GPU_TEMP": np.full(G, 60.0), "DCGM_FI_DEV_POWER_USAGE": np.full(G, 600.0),
        "DCGM_FI_DEV_GPU_UTIL": np.full(G, 95.0), "DCGM_FI_DEV_SM_CLOCK": np.full(G, 1980.0),
        "DCGM_FI_DEV_XID_ERRORS": np.zeros(G),
        "node_infiniband_state_id": np.full(nic, 4.0), "node_infiniband_physical_state_id": np.full(nic, 5.0),
        "seamguard_coolant_flow_lpm": FLEET.loop_rated_flow_lpm.copy(),
        "seamguard_coolant_supply_temp_c": np.full(FLEET.count(Kind.COOLING_LOOP), 30.0),
        "seamguard_storage_write_latency_ms": np.full(FLEET.count(Kind.STORAGE), 20.0),
    }


def run(counter: str, increments: list[float]) -> tuple[float, State]:
    """Feed ``increments`` (one per scrape) to one GPU's counter; its highest score on the
    counter's channel over the run, and its state at the end."""
    cfg = AssessConfig()
    hist = History(TICK_S, default_depth=2, depth_by_signal=cfg.history_depths(TICK_S))
    prev, base, top = initial_states(FLEET), None, 0.0
    total = np.zeros(G)
    channel = next(k for k, v in COUNTERS.items() if v == counter)
    for i, inc in enumerate(increments):
        total[GPU] += inc
        frame = make_frame(FLEET, 1000.0 + i * TICK_S, {**healthy(), counter: total.copy()})
        a = assess(FLEET, frame, hist, prev, cfg, base=base)
        ev = a.kinds[Kind.GPU].evidence
        top = max(top, float(ev.score[GPU, ev.channels.index(channel)]))
        prev, base = {k: ka.states for k, ka in a.kinds.items()}, a.baselines
        hist.push(frame)
    return top, State(int(prev[Kind.GPU].state[GPU]))


QUIET = [0.0] * 12
# (increments per scrape after a quiet start, must score >= 0.5, must the GPU stay healthy)
CASES = [
    (QUIET + [20.0] + QUIET, False, True),                       # one healthy burst of 20 CRC errors
    (QUIET + [6.0, 0.0, 0.0, 5.0] + QUIET, False, True),          # two bursts a minute and a half apart
    (QUIET + [10.0] * 10, True, False),                           # a link that keeps counting
]


@pytest.mark.parametrize("counter", list(COUNTERS.values()))
@pytest.mark.parametrize("increments,scores,stays_healthy", CASES)
def test_a_burst_is_background_a_climb_is_a_rate(counter, increments, scores, stays_healthy):
    top, state = run(counter, increments)
    assert (top >= 0.5) == scores, (counter, increments, top)
    if stays_healthy:
        assert state == State.HEALTHY, (counter, increments, state)


# ---- a node's exporter restarting is a telemetry gap, not its ports failing ------------------------
NODE = 1
PORTS = np.flatnonzero(FLEET.nic_node == NODE)
GPUS = np.flatnonzero(FLEET.gpu_node == NODE)


def missing_scores(ports_gone: np.ndarray, gpus_gone: bool) -> np.ndarray:
    """The ``missing`` score of the node's ports after one scrape with ``ports_gone`` absent."""
    cfg = AssessConfig()
    hist = History(TICK_S, default_depth=2, depth_by_signal=cfg.history_depths(TICK_S))
    prev, base = initial_states(FLEET), None
    for i in range(2):
        values = healthy()
        if i == 1:
            for name in ("node_infiniband_state_id", "node_infiniband_physical_state_id"):
                values[name][ports_gone] = np.nan
            if gpus_gone:
                values["DCGM_FI_DEV_GPU_TEMP"][GPUS] = np.nan
        frame = make_frame(FLEET, 1000.0 + i * TICK_S, values)
        a = assess(FLEET, frame, hist, prev, cfg, base=base)
        prev, base = {k: ka.states for k, ka in a.kinds.items()}, a.baselines
        hist.push(frame)
    ev = a.kinds[Kind.NIC].evidence
    return ev.score[PORTS, ev.channels.index("missing")]


# (ports of the node gone, its GPUs gone too, ports whose missing must score)
EXPORTER_CASES = [
    (PORTS, False, []),              # node_exporter restarting: every port gone, DCGM still reports
    (PORTS[:1], False, PORTS[:1]),   # one port gone while its siblings report: it fell off the host
    (PORTS, True, PORTS),            # the host went dark: everything it exports is gone
]


@pytest.mark.parametrize("gone,gpus_gone,scored", EXPORTER_CASES)
def test_a_node_exporter_gap_is_not_its_ports_failing(gone, gpus_gone, scored):
    s = missing_scores(gone, gpus_gone)
    assert set(PORTS[s > 0].tolist()) == set(np.asarray(scored).tolist()), s


# ---- a drift the whole job shares is its work, not one GPU's thermal interface ---------------------
# A job that is a small part of its rack (the rack's common mode stays where it was).
JOB = int(np.argmin(np.bincount(FLEET.gpu_job[FLEET.gpu_job >= 0])))
JOB_GPUS = np.flatnonzero(FLEET.gpu_job == JOB)
ONE = int(JOB_GPUS[0])


def drift_scores(warmer: np.ndarray, rise_c: float) -> np.ndarray:
    """Highest ``thermal_drift`` score per GPU once ``warmer`` run ``rise_c`` hotter at the same power
    after a warm-up long enough for every baseline to give verdicts."""
    cfg = AssessConfig()
    hist = History(TICK_S, default_depth=2, depth_by_signal=cfg.history_depths(TICK_S))
    prev, base, top = initial_states(FLEET), None, np.zeros(G)
    rng = np.random.default_rng(0)
    for i in range(40):
        values = healthy()
        values["DCGM_FI_DEV_GPU_TEMP"] = values["DCGM_FI_DEV_GPU_TEMP"] + rng.normal(0.0, 0.2, G)
        if i >= 30:
            values["DCGM_FI_DEV_GPU_TEMP"][warmer] += rise_c
        frame = make_frame(FLEET, 1000.0 + i * TICK_S, values)
        a = assess(FLEET, frame, hist, prev, cfg, base=base)
        ev = a.kinds[Kind.GPU].evidence
        top = np.maximum(top, ev.score[:, ev.channels.index("thermal_drift")])
        prev, base = {k: ka.states for k, ka in a.kinds.items()}, a.baselines
        hist.push(frame)
    return top


def test_the_job_fixture_has_peers():
    assert len(JOB_GPUS) >= 4 and len(JOB_GPUS) <= G // 3


# (GPUs that run hotter, must score >= 0.5, must not)
DRIFT_CASES = [
    (np.array([ONE]), [ONE], [g for g in JOB_GPUS if g != ONE]),   # one GPU's interface wearing
    (JOB_GPUS, [], JOB_GPUS),                                      # the whole job runs a hotter phase
]


@pytest.mark.parametrize("warmer,scored,quiet", DRIFT_CASES)
def test_a_drift_the_job_shares_is_its_work(warmer, scored, quiet):
    top = drift_scores(warmer, 4.0)
    assert all(top[g] >= 0.5 for g in scored), top[scored]
    assert all(top[g] < 0.5 for g in quiet), top[quiet]
