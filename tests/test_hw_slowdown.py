"""The seam drill's thermal HW slowdown (seamguard.testbed.hw_slowdown): when it starts, what the
twin's GPU series show while it lasts, and the clock files the drill's job reads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from seamguard.app.config import load_topology
from seamguard.fleet.model import Kind
from seamguard.testbed.drill import Layout, topology_yaml
from seamguard.testbed.hw_slowdown import (
    PLAN_FILE,
    SlowdownTwin,
    slowdown_delay_s,
    slowed_values,
)
from seamguard.twin.faults import FaultKind, FaultSpec
from seamguard.twin.telemetry import Twin, TwinConfig


def test_delay_follows_the_first_order_die_model():
    # 35 degC over the coolant at full flow, 70 at half: from 67 towards 102, the 87 degC point after tau*ln(35/15)
    assert slowdown_delay_s(67.0, 32.0, 87.0, 0.5, 20.0, ramp_s=4.0) == pytest.approx(4.0 + 20.0 * math.log(35 / 15))
    # less flow lost: slower; a small loss never reaches the slowdown point
    assert slowdown_delay_s(67.0, 32.0, 87.0, 0.4, 20.0) < slowdown_delay_s(67.0, 32.0, 87.0, 0.5, 20.0)
    assert slowdown_delay_s(67.0, 32.0, 87.0, 0.9, 20.0) is None
    # already at the slowdown point: as soon as the flow is down
    assert slowdown_delay_s(88.0, 32.0, 87.0, 0.5, 20.0, ramp_s=4.0) == 4.0
    with pytest.raises(ValueError, match="flow_fraction"):
        slowdown_delay_s(67.0, 32.0, 87.0, 0.0, 20.0)


def test_slowed_values_touch_only_the_slowed_gpus():
    values = {"DCGM_FI_DEV_SM_CLOCK": np.array([1980.0, 1930.0]), "DCGM_FI_DEV_GPU_TEMP": np.array([70.0, 65.0]),
              "DCGM_FI_DEV_THERMAL_VIOLATION": np.array([0.0, 0.0]), "DCGM_FI_DEV_GPU_UTIL": np.array([97.0, 97.0])}
    out = slowed_values(values, np.array([True, False]), 0.5, np.array([87.0, 87.0]), np.array([3e6, 0.0]))
    assert out["DCGM_FI_DEV_SM_CLOCK"].tolist() == [990.0, 1930.0]
    assert out["DCGM_FI_DEV_GPU_TEMP"].tolist() == [87.0, 65.0]
    assert out["DCGM_FI_DEV_THERMAL_VIOLATION"].tolist() == [3e6, 0.0]
    assert out["DCGM_FI_DEV_GPU_UTIL"] is values["DCGM_FI_DEV_GPU_UTIL"]


@pytest.fixture()
def drill_fleet(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(topology_yaml(Layout()))
    return load_topology(path)


def test_the_loop_gpus_slow_down_after_the_delay_and_recover_when_the_flow_returns(drill_fleet, tmp_path):
    fleet = drill_fleet
    loop = fleet.index_of(Kind.COOLING_LOOP, "cdu-a")
    start_s, fault_s = 5.0, 40.0
    twin = Twin(fleet, [FaultSpec(FaultKind.COOLING_FLOW_LOSS, loop, start_s, fault_s, 0.5, 4.0)],
                TwinConfig(tick_s=1.0), 0)
    clocks = tmp_path / "gpu-clock"
    st = SlowdownTwin(twin, loop, start_s, fault_s, 0.5, 4.0, clocks)
    h0 = fleet.node_names.index("h0")
    g0 = int(np.flatnonzero(fleet.gpu_node == h0)[0])
    rows = []
    for _ in range(60):
        frame = st.step()
        files = {n: float((clocks / n).read_text()) for n in fleet.node_names}
        rows.append((st.t_s, frame.get("DCGM_FI_DEV_SM_CLOCK").copy(), frame.get("DCGM_FI_DEV_GPU_TEMP").copy(),
                     frame.get("DCGM_FI_DEV_THERMAL_VIOLATION").copy(), files))
    plan = json.loads((clocks / PLAN_FILE).read_text())
    assert set(plan["delay_s"]) == {"h0"}  # only the loop's node
    delay = plan["delay_s"]["h0"]
    assert 4.0 < delay < fault_s
    on = [r for r in rows if start_s + delay <= r[0] < start_s + fault_s]
    off = [r for r in rows if r[0] < start_s + delay or r[0] >= start_s + fault_s]
    assert on and off
    for t, clock, temp, viol, files in on:
        assert files == {"h0": 0.5, "h1": 1.0, "h2": 1.0}, t
        assert clock[g0] < 0.55 * clock[fleet.gpu_node == fleet.node_names.index("h1")][0]
        assert temp[g0] >= fleet.gpu_throttle_temp_c[g0]
    for t, clock, _, _, files in off:
        assert set(files.values()) == {1.0}, t
    assert on[-1][3][g0] - on[0][3][g0] == pytest.approx((len(on) - 1) * 1e6)
    # the twin alone (its rack model) never throttles in this fault: the slowdown is what the module adds
    plain = Twin(fleet, [FaultSpec(FaultKind.COOLING_FLOW_LOSS, loop, start_s, fault_s, 0.5, 4.0)],
                 TwinConfig(tick_s=1.0), 0)
    assert max(plain.step().get("DCGM_FI_DEV_GPU_TEMP")[g0] for _ in range(60)) < fleet.gpu_throttle_temp_c[g0]
