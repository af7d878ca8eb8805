"""The scenario generator: physics that behaves, faults that change what they should, honest labels."""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.fleet.model import Kind
from seamguard.scenarios.generator import DRIVER_NEW
from seamguard.scenarios import FAULT_CLASS_NAMES, Scenario, ScenarioSpec, rotating_classes


def _run(spec: ScenarioSpec):
    sc = Scenario(spec)
    rows: list[tuple[float, dict]] = []
    sc.run(lambda t, v, d: rows.append((t, {k: a.copy() for k, a in v.items()})))
    return sc, rows


def _series(rows, name):
    return np.array([r[1][name] for r in rows])


def test_at_least_twelve_fault_classes_and_every_class_reachable():
    assert len(FAULT_CLASS_NAMES) >= 12
    seen = {c for i in range(4) for c in rotating_classes(i, 6)}
    assert seen == set(FAULT_CLASS_NAMES)


def test_same_seed_same_history_other_seed_differs():
    spec = ScenarioSpec(gpus=128, minutes=20, seed=4, faults=("fail_slow_gpu",))
    _, a = _run(spec)
    _, b = _run(spec)
    _, c = _run(ScenarioSpec(gpus=128, minutes=20, seed=5, faults=("fail_slow_gpu",)))
    ta, tb, tc = (_series(x, "DCGM_FI_DEV_GPU_TEMP") for x in (a, b, c))
    assert np.array_equal(ta, tb, equal_nan=True)
    assert not np.array_equal(ta, tc, equal_nan=True)


def test_warm_gpus_run_hot_but_never_throttle_and_others_spread_a_little():
    sc, rows = _run(ScenarioSpec(gpus=256, minutes=30, seed=2, faults=()))
    temp = _series(rows, "DCGM_FI_DEV_GPU_TEMP")
    util = _series(rows, "DCGM_FI_DEV_GPU_UTIL")
    warm = sc.warm_gpus
    assert len(warm) >= 0.03 * len(sc.fleet.gpu_names)
    slow = sc.hw.slowdown_c
    busy = (util > 50).mean(axis=0) > 0.8
    others = np.setdiff1d(np.flatnonzero(busy), warm)
    med_other = np.nanmedian(temp[:, others])
    # Warm: clearly above their peers, a few degrees under their own slowdown point, never over it.
    assert np.nanmedian(temp[:, warm]) > med_other + 8
    assert np.nanmax(temp[:, warm] - slow[warm]) < 0
    assert np.nanmax(temp[:, warm] - slow[warm]) > -12
    assert np.isnan(sc.sim.first_throttle).all()
    thermal = _series(rows, "DCGM_FI_DEV_THERMAL_VIOLATION")
    assert (np.nanmax(thermal[:, warm], axis=0) == np.nanmin(thermal[:, warm], axis=0)).all()
    # Spread between ordinary busy GPUs: a few degrees, not identical.
    sd = np.nanstd(np.nanmean(temp[:, others], axis=0))
    assert 0.8 < sd < 5


def test_loop_flow_loss_heats_its_gpus_until_the_first_throttles_and_labels_that_time():
    sc, rows = _run(ScenarioSpec(gpus=256, minutes=60, seed=1, faults=("cooling_loop_flow",)))
    (inc,) = [i for i in sc.labels() if i["fault"] != "maintenance"]
    assert inc["kind"] == "cooling_loop"
    lp = sc.fleet.loop_names.index(inc["entity"])
    gpus = np.flatnonzero(sc.fleet.gpu_loop == lp)
    t = np.array([r[0] for r in rows])
    flow = _series(rows, "seamguard_coolant_flow_lpm")[:, lp]
    temp = _series(rows, "DCGM_FI_DEV_GPU_TEMP")[:, gpus]
    before, late = t < inc["start"], t > inc["start"] + 900
    assert np.nanmean(flow[late]) < 0.6 * np.nanmean(flow[before])
    assert np.nanmean(temp[late]) > np.nanmean(temp[before]) + 8
    assert "hard_failure" in inc and inc["hard_failure"] > inc["start"]
    k = int(np.searchsorted(t, inc["hard_failure"]))
    assert np.nanmax(temp[k] - sc.hw.slowdown_c[gpus]) >= -1  # at the labelled time a GPU is at its limit
    assert np.nanmax(temp[: max(k - 2, 0)] - sc.hw.slowdown_c[gpus]) < 0.5


@pytest.mark.parametrize("cls, series, kind, factor", [
    ("pcie_replay", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Kind.GPU, 10),
    ("nvlink_errors", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", Kind.GPU, 10),
    ("ecc_sbe", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Kind.GPU, 10),
    ("ib_symbol_errors", "node_infiniband_symbol_error_total", Kind.NIC, 10),
    # congestion: ordinary ports wait too (traffic), so the faulty one stands out by less
    ("fabric_congestion", "node_infiniband_port_transmit_wait_total", Kind.NIC, 4),
])
def test_counter_faults_climb_only_on_their_entity_after_start(cls, series, kind, factor):
    sc, rows = _run(ScenarioSpec(gpus=128, minutes=40, seed=3, faults=(cls,), gap_rate=0.0))
    (inc,) = [i for i in sc.labels() if i["fault"] == cls]
    idx = sc.fleet.names(kind).index(inc["entity"])
    t = np.array([r[0] for r in rows])
    v = _series(rows, series)
    rate = np.nan_to_num(np.diff(v, axis=0), nan=0.0).clip(min=0)  # resets and gaps read as no increase
    after = t[1:] > inc["start"] + 300
    before = t[1:] < inc["start"]
    mine = rate[after, idx].mean()
    peers = np.delete(rate[after], idx, axis=1).mean(axis=0)
    assert mine > factor * max(np.percentile(peers, 99), 1e-9)
    assert rate[before, idx].mean() < mine / factor


def test_fail_slow_cuts_clock_without_heat_and_power_brake_caps_a_node():
    sc, rows = _run(ScenarioSpec(gpus=128, minutes=40, seed=6, faults=("fail_slow_gpu", "power_brake"), gap_rate=0))
    labs = {i["fault"]: i for i in sc.labels()}
    t = np.array([r[0] for r in rows])
    clock, temp, power = (_series(rows, n) for n in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
                                                     "DCGM_FI_DEV_POWER_USAGE"))
    util = _series(rows, "DCGM_FI_DEV_GPU_UTIL")
    g = sc.fleet.gpu_names.index(labs["fail_slow_gpu"]["entity"])
    before = (t < labs["fail_slow_gpu"]["start"]) & (util[:, g] > 50)
    after = (t > labs["fail_slow_gpu"]["start"]) & (util[:, g] > 50)
    assert np.nanmedian(clock[after, g]) < 0.85 * np.nanmedian(clock[before, g])
    assert np.nanmedian(temp[after, g]) < np.nanmedian(temp[before, g])  # slower and cooler: no thermal cause
    node = sc.fleet.node_names.index(labs["power_brake"]["entity"])
    gs = np.flatnonzero(sc.fleet.gpu_node == node)
    after = t > labs["power_brake"]["start"]
    assert np.nanmax(power[after][:, gs]) < 0.62 * sc.fleet.gpu_tdp_w[gs].max()
    viol = _series(rows, "DCGM_FI_DEV_POWER_VIOLATION")[:, gs]
    assert (np.nanmax(viol[after], axis=0) - np.nanmin(viol[after], axis=0) > 0.5e6 * (after.sum() - 2) * 30).all()


def test_everyday_events_show_up_gaps_resets_and_idle_clocks():
    sc, rows = _run(ScenarioSpec(gpus=256, minutes=60, seed=0, faults=()))
    tr = sc.truth()
    whats = {e["what"] for e in tr["events"]}
    assert {"driver_update", "maintenance_drain", "job_restart", "app_xid", "load_change", "exporter_restart",
            "port_counter_clear"} <= whats
    temp = _series(rows, "DCGM_FI_DEV_GPU_TEMP")
    assert np.isnan(temp).any()  # gaps exist
    # A driver update: the node goes dark, comes back with counters from zero and a new driver label.
    du = next(e for e in tr["events"] if e["what"] == "driver_update")
    gs = np.flatnonzero(sc.fleet.gpu_node == sc.fleet.node_names.index(du["entity"]))
    t = np.array([r[0] for r in rows])
    viol = _series(rows, "DCGM_FI_DEV_POWER_VIOLATION")[:, gs]
    assert np.isnan(viol[(t > du["t"] + 31) & (t < du["end"] - 1)]).all()
    before, after = viol[t < du["t"] - 1][-1], viol[t > du["end"] + 31][0]
    assert (after < before).all()
    assert sc.sim.driver[sc.fleet.node_names.index(du["entity"])] == DRIVER_NEW
    xid = _series(rows, "DCGM_FI_DEV_XID_ERRORS")
    assert set(np.unique(xid[~np.isnan(xid)]).tolist()) & {13, 31, 43}
    # maintenance windows are labelled as such, not as incidents
    assert any(i["fault"] == "maintenance" for i in sc.labels())


def test_no_room_for_faults_is_a_clear_error():
    with pytest.raises(ValueError, match="no free"):
        Scenario(ScenarioSpec(gpus=64, minutes=20, seed=0, faults=("cooling_loop_flow",) * 5))
    with pytest.raises(ValueError, match="unknown fault"):
        ScenarioSpec(faults=("melted",))
