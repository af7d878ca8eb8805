"""Per-entity baselines (assess/baselines.py): steady warm GPUs are left alone, drift from a
GPU's own history is caught, counters are read as rates above their floor, resets are not
bursts, baselines survive a restart and give no verdict while they warm."""

from __future__ import annotations

import numpy as np
from seamguard.assess import State, assess, initial_states
from seamguard.assess.baselines import Baselines
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.ledger import Ledger
from seamguard.observe import History
from seamguard.twin.faults import FaultKind, FaultSpec
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=128, nodes_per_storage_path=4), seed=3)
TICK = 30.0  # the users' scrape interval
POL = default_policy()
WARM = POL.assess.baselines.warm_samples


def _busy_gpu(i: int = 9) -> int:
    return int(np.flatnonzero(FLEET.gpu_job == 0)[i])


class Loop:
    """The assess stage driven tick by tick over a twin, as the controller drives it."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.hist = History(TICK, 2, POL.assess.history_depths(TICK))
        self.states = initial_states(FLEET)
        self.base: Baselines | None = None
        self.a = None
        self.transitions: list = []

    def tick(self, edit=None):
        frame = self.twin.step()
        if edit is not None:
            edit(frame)
        a = assess(FLEET, frame, self.hist, self.states, POL.assess, base=self.base)
        self.hist.push(frame)
        self.states = {k: a.kinds[k].states for k in a.kinds}
        self.base = a.baselines
        self.a = a
        self.transitions += a.transitions
        return a

    def gpu(self, channel: str, g: int) -> tuple[float, float]:
        e = self.a.kinds[Kind.GPU].evidence
        c = e.channels.index(channel)
        return float(e.score[g, c]), float(e.value[g, c])


def _twin(faults=(), seed=4, **kw) -> Twin:
    cfg = TwinConfig(tick_s=TICK, warm_gpu_share=0.0, diurnal_period_s=2 * 3600.0, **kw)
    return Twin(FLEET, list(faults), cfg, seed=seed)


def test_warm_but_steady_gpu_is_never_degraded_over_hours():
    """8 % more thermal resistance than its peers, 4 °C below throttle at full load, steady
    through a diurnal coolant swing: three hours of ticks, never anything but healthy."""
    twin = _twin(diurnal_amplitude_c=2.0)
    g = _busy_gpu()
    twin.gpu_r_th[g] *= 1.08
    p_full = (100.0 + FLEET.gpu_tdp_w[g] - 120.0) * twin.gpu_power_scale[g] * 0.97
    nominal = twin.cfg.supply_temp_c + 0.5 * twin.cfg.rack_rise_nominal_c + p_full * twin.gpu_r_th[g]
    twin.gpu_offset_c[g] = FLEET.gpu_throttle_temp_c[g] - 4.0 - nominal
    loop = Loop(twin)
    headroom, worst = [], 0.0
    for _ in range(int(3 * 3600 / TICK)):
        a = loop.tick()
        headroom.append(loop.gpu("headroom", g)[1])
        worst = max(worst, float(a.kinds[Kind.GPU].gfs[g]))
        assert a.kinds[Kind.GPU].states.state[g] == State.HEALTHY
    assert min(headroom) < 6.0  # it really ran warm: a fixed 8 °C headroom rule would flag it
    assert worst < POL.assess.hysteresis_for(Kind.GPU).degrade_exit
    assert [t for t in loop.transitions if t.kind == Kind.GPU] == []


def test_thermal_interface_degradation_is_caught_from_its_own_baseline():
    """Same power, rising temperature against its own history: degraded within a few ticks of
    the rise clearing its own noise, long before headroom would have said anything."""
    g = _busy_gpu(3)
    start = 40 * TICK
    spec = FaultSpec(FaultKind.GPU_THERMAL_INTERFACE, g, start, magnitude=1.3, ramp_s=900.0)
    twin = _twin([spec])
    loop = Loop(twin)
    cleared_at = detected_at = None
    for k in range(80):
        a = loop.tick()
        t = twin.t_s
        ramp = min(1.0, max(0.0, t - start) / spec.ramp_s)
        excess = twin.gpu_r_th[g] * (spec.magnitude - 1.0) * ramp * loop.hist.window("DCGM_FI_DEV_POWER_USAGE", 1)[-1][g]
        noise = 1.2533 * float(loop.base.gpu.noise[g])
        if cleared_at is None and excess >= 6 * max(noise, POL.assess.evidence.drift_noise_floor_c):
            cleared_at = k
        if detected_at is None and a.kinds[Kind.GPU].states.state[g] != State.HEALTHY:
            detected_at = k
            reason = a.kinds[Kind.GPU].reasons(g)[0]
            headroom = loop.gpu("headroom", g)[1]
    assert cleared_at is not None and detected_at is not None
    assert detected_at <= cleared_at + 3, (cleared_at, detected_at)
    assert detected_at > 40  # not before the fault
    assert reason.channel == "thermal_drift"
    assert headroom > POL.assess.evidence.thermal_warn_headroom_c  # still far from throttle


def test_pcie_replay_climb_is_detected():
    g = _busy_gpu(5)
    spec = FaultSpec(FaultKind.GPU_PCIE_REPLAY, g, 30 * TICK, magnitude=2000.0, ramp_s=600.0)
    loop = Loop(_twin([spec]))
    detected = None
    for k in range(70):
        a = loop.tick()
        if detected is None and a.kinds[Kind.GPU].states.state[g] != State.HEALTHY:
            detected = k
            assert a.kinds[Kind.GPU].reasons(g)[0].channel == "pcie_replays"
    assert detected is not None and 30 < detected <= 30 + 20
    # nobody else was touched
    others = [t for t in loop.transitions if t.kind == Kind.GPU and t.index != g]
    assert others == []


def test_counter_reset_and_exporter_gap_are_not_bursts():
    """An exporter restart: counters drop to zero, series vanish for a scrape and come back
    (some at values far above where they were, after a driver reload). No channel fires."""
    loop = Loop(_twin())
    for _ in range(WARM + 5):
        loop.tick()
    g, nic = _busy_gpu(2), 7
    big = {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 1e6, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 5e5,
           "node_infiniband_symbol_error_total": 1e6}

    def reset(frame):
        loop.twin.gpu_pcie_replays[:] = 0.0
        loop.twin.gpu_sbe[:] = 0.0
        loop.twin.nic_symbol[:] = 0.0
        for name in big:
            frame.values[name][:] = 0.0

    def gap(frame):
        for name in big:
            frame.values[name][:] = np.nan

    def jump(frame):
        for name, v in big.items():
            frame.values[name][g if name.startswith("DCGM") else nic] = v

    scores = []
    for edit in (reset, None, gap, jump, None, None):
        a = loop.tick(edit)
        e_g, e_n = a.kinds[Kind.GPU].evidence, a.kinds[Kind.NIC].evidence
        scores += [e_g.score[:, e_g.channels.index(c)].max() for c in ("pcie_replays", "sbe_rate")]
        scores.append(e_n.score[:, e_n.channels.index("symbol_errors")].max())
    assert max(scores) == 0.0


def test_baselines_survive_a_controller_restart(tmp_path):
    db = tmp_path / "ledger.sqlite"
    twin = _twin()
    ctl = Controller(FLEET, POL, ledger=Ledger(db), tick_s=TICK)
    for _ in range(WARM + 3):
        assert not ctl.tick(twin.step()).error
    before = ctl.baselines
    busy = FLEET.gpu_job >= 0  # spare nodes idle: their GPUs' thermal fit learns at load only
    assert before.warm_counts(POL.assess.baselines)["gpu"] == int(busy.sum()) > 0
    ctl.ledger.close()

    again = Controller(FLEET, POL, ledger=Ledger(db), tick_s=TICK)
    after = again.baselines
    for name, arr in before.to_arrays().items():
        np.testing.assert_array_equal(after.to_arrays()[name], arr, err_msg=name)
    rep = again.tick(twin.step())
    ev = rep.assessment.kinds[Kind.GPU].evidence
    assert ev.column("warming")[busy].sum() == 0  # no re-warming after the restart
    again.ledger.close()


def test_baselines_of_another_fleet_warm_up_again(tmp_path):
    db = tmp_path / "ledger.sqlite"
    ctl = Controller(FLEET, POL, ledger=Ledger(db), tick_s=TICK)
    twin = _twin()
    for _ in range(3):
        ctl.tick(twin.step())
    ctl.ledger.close()
    other = generate_fleet(FleetShape(gpus=64, nodes_per_storage_path=4), seed=3)
    again = Controller(other, POL, ledger=Ledger(db), tick_s=TICK)
    assert again.baselines.warm_counts(POL.assess.baselines)["gpu"] == 0
    assert int(again.baselines.gpu.n.max()) == 0
    again.ledger.close()


def test_warm_up_gives_no_verdict_from_baselines():
    """A GPU that starts hot and keeps heating: while its baseline warms, it is 'warming'
    (data), its drift channel scores 0; once warm, the drift counts."""
    g = _busy_gpu(4)
    twin = _twin([FaultSpec(FaultKind.GPU_THERMAL_INTERFACE, g, 0.0, magnitude=1.25, ramp_s=WARM * TICK * 3)])
    loop = Loop(twin)
    for k in range(WARM * 3):
        loop.tick()
        s, _ = loop.gpu("thermal_drift", g)
        warming = loop.gpu("warming", g)[1]
        if k < WARM:
            assert warming == 1.0 and s == 0.0
        else:
            assert warming == 0.0
    assert loop.gpu("thermal_drift", g)[0] > 0.0  # the drift that followed warm-up counts


def test_baseline_memory_is_fixed_per_entity():
    loop = Loop(_twin())
    loop.tick()
    size = sum(a.nbytes for a in loop.base.to_arrays().values())
    for _ in range(30):
        loop.tick()
    assert sum(a.nbytes for a in loop.base.to_arrays().values()) == size
    assert size / FLEET.count(Kind.GPU) < 200  # bytes per GPU, all kinds included


def test_a_load_change_is_not_drift():
    """A job that stops and starts again (a restart, a move) changes its GPUs' power by
    hundreds of watts; the die lags, the prediction is less sure while power settles: no flag."""
    twin = _twin()
    loop = Loop(twin)
    jobs = np.flatnonzero(FLEET.gpu_job == 1)
    for k in range(WARM + 40):
        if k == WARM + 5:
            twin.gpu_job[jobs] = -1
        if k == WARM + 20:
            twin.gpu_job[jobs] = 1
        loop.tick()
    assert [t for t in loop.transitions if t.kind == Kind.GPU] == []
