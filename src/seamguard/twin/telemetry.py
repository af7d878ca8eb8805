"""The telemetry-mode twin: vectorized per-tick physics of a fleet, with injected faults.

Coolant flow and supply temperature set each rack's coolant temperature rise, GPU
power on top of it sets die temperature, and a GPU past its throttle point loses SM
clock. Links carry latency, NICs flap, storage paths slow, ECC errors climb into a
fatal XID, fail-slow GPUs compute slower. Jobs run a step-time model (a synchronous job
runs at its slowest rank and its worst path), checkpoint periodically and roll back on
failure, so useful throughput is computed, not asserted. It emits Frames under the
real exporter names and obeys the controller's actions through `TwinActuator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from seamguard.fleet.model import JOB_CLASS_SYNCHRONY, Fleet, JobClass, Kind
from seamguard.observe.frame import Frame, make_frame
from seamguard.twin.faults import FaultKind, FaultSpec, FaultTruth, affected_entities


@dataclass(frozen=True)
class TwinConfig:
    """Physics and job-model constants (each documented where it comes from)."""

    tick_s: float = 5.0
    supply_temp_c: float = 32.0  # warm-water liquid cooling supply
    diurnal_amplitude_c: float = 2.5  # Llama 3 saw a 1-2 % diurnal throughput swing via DVFS
    diurnal_period_s: float = 86400.0
    rack_rise_nominal_c: float = 10.0  # coolant rise across a rack at rated flow and full load
    gpu_r_th_c_per_w: float = 0.045  # die-to-coolant: ~66 C at full load on rated flow
    gpu_thermal_tau_s: float = 20.0
    clock_max_mhz: float = 1980.0  # H100 SXM boost clock
    clock_idle_mhz: float = 345.0
    throttle_slope_per_c: float = 0.06  # clock fraction lost per degree past the throttle point
    thermal_trip_over_c: float = 11.0  # beyond this the clock floor (0.35) cannot hold the temperature
    thermal_trip_after_s: float = 30.0
    compute_share: float = 0.7  # share of an ideal step spent computing; the rest in collectives
    latency_comm_weight: float = 0.25  # collective time grows by this times (latency ratio - 1)
    checkpoint_interval_s: float = 600.0
    checkpoint_write_s: float = 20.0  # at nominal storage latency
    restart_s: float = 300.0  # unplanned restart: Meta RSC u0 = 5-20 min
    migrate_s: float = 45.0  # planned move of ranks to a spare after a checkpoint
    flap_down_s: float = 8.0  # HPN: a flap on a single path stalls training > 9 s with recovery
    sbe_base_per_h: float = 0.5
    temp_noise_c: float = 0.4
    # Hardware spread between GPUs of one model (fixed per GPU for a run): die-to-coolant
    # thermal resistance (paste, cold-plate contact), full-load power, boost clock.
    r_th_spread: float = 0.04  # relative standard deviation
    power_spread: float = 0.03
    clock_spread: float = 0.01
    warm_gpu_share: float = 0.03  # GPUs that run a few °C below throttle, healthy and steady
    warm_below_throttle_c: tuple[float, float] = (4.0, 5.0)  # their full-load distance to throttle (nominal coolant)
    storage_latency_ms: float = 8.0
    link_latency_us: float = 2.0


@dataclass
class JobState:
    work_s: np.ndarray  # ideal-step seconds of progress
    committed_s: np.ndarray  # progress covered by the last checkpoint
    last_ckpt_s: np.ndarray
    busy_until_s: np.ndarray  # checkpointing, restarting or migrating until then
    lost_s: np.ndarray  # progress thrown away by rollbacks
    failures: np.ndarray
    step_s: np.ndarray  # last step wall time


@dataclass
class Twin:
    """A simulated fleet. `step()` advances it one tick and returns the Frame."""

    fleet: Fleet
    faults: list[FaultSpec]
    cfg: TwinConfig = field(default_factory=TwinConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        f, rng = self.fleet, np.random.default_rng(self.seed)
        self.rng = rng
        self.t_s = 0.0
        n_g, n_n, n_nic, n_l = f.count(Kind.GPU), f.count(Kind.NODE), f.count(Kind.NIC), f.count(Kind.LINK)
        self.gpu_job = f.gpu_job.copy()
        self._placed = f  # the Fleet handed out for the current placement
        self.gpu_offset_c = rng.normal(0.0, 1.2, n_g)  # sensor/mounting offset, fixed per GPU
        self.loop_offset_c = rng.normal(0.0, 0.3, f.count(Kind.COOLING_LOOP))
        c = self.cfg

        def spread(rel: float) -> np.ndarray:
            return 1.0 + np.clip(rng.normal(0.0, rel, n_g), -3 * rel, 3 * rel)

        self.gpu_r_th = c.gpu_r_th_c_per_w * spread(c.r_th_spread)
        self.gpu_power_scale = spread(c.power_spread)
        self.gpu_clock_scale = np.minimum(spread(c.clock_spread), 1.0 + c.clock_spread)
        # Some GPUs run warm: a few °C below their throttle point at full load on nominal
        # coolant, steady (a worse slot in the rack, a thicker paste line). Not a fault.
        warm = rng.random(n_g) < c.warm_gpu_share
        p_full = (100.0 + (f.gpu_tdp_w - 120.0)) * self.gpu_power_scale
        nominal = c.supply_temp_c + 0.5 * c.rack_rise_nominal_c + p_full * self.gpu_r_th
        want = f.gpu_throttle_temp_c - rng.uniform(*c.warm_below_throttle_c, n_g)
        self.gpu_offset_c = np.where(warm, want - nominal, self.gpu_offset_c)
        self.gpu_warm = warm
        self.gpu_pcie_replays = rng.integers(0, 20, n_g).astype(float)
        self.gpu_temp_c = np.full(n_g, self.cfg.supply_temp_c + 30.0)
        self.gpu_clock_frac = np.ones(n_g)
        self.gpu_sbe = rng.integers(0, 50, n_g).astype(float)
        self.gpu_remap = rng.integers(0, 3, n_g).astype(float)
        self.gpu_xid = np.zeros(n_g)
        self.gpu_thermal_us = np.zeros(n_g)
        self.gpu_dead = np.zeros(n_g, dtype=bool)
        self.gpu_off_bus = np.zeros(n_g, dtype=bool)  # stops reporting altogether
        self.gpu_overheat_s = np.zeros(n_g)
        self.nic_down_until_s = np.full(n_nic, -1.0)
        self.nic_downed = rng.integers(0, 3, n_nic).astype(float)
        self.nic_symbol = rng.integers(0, 100, n_nic).astype(float)
        self.nic_next_flap_s = np.full(n_nic, np.inf)
        self.link_base_us = np.where(f.link_nic >= 0, 1.0, self.cfg.link_latency_us) * \
            (1.0 + 0.03 * rng.standard_normal(n_l))
        self.link_avoided = np.zeros(n_l, dtype=bool)
        self.storage_avoided = np.zeros(f.count(Kind.STORAGE), dtype=bool)
        self.node_drained = np.zeros(n_n, dtype=bool)
        self.node_labels: dict[int, tuple[str, ...]] = {}
        self.job_phase = rng.uniform(0, 2 * math.pi, len(f.job_names))
        n_j = len(f.job_names)
        self.jobs = JobState(np.zeros(n_j), np.zeros(n_j), np.zeros(n_j),
                             np.zeros(n_j), np.zeros(n_j), np.zeros(n_j, dtype=np.int64), np.ones(n_j))
        self.job_interval_s = np.full(n_j, np.nan)  # a controller's checkpoint_interval; NaN: cfg's
        for s in self.faults:
            n = f.count(s.entity_kind)
            if not 0 <= s.index < n:
                raise ValueError(f"fault {s.kind.value}: {s.entity_kind.label} index {s.index} out of range "
                                 f"(fleet {f.name!r} has {n})")
        self.truth = [FaultTruth(s, f.names(s.entity_kind)[s.index],
                                 affected_entities(f, s, self.gpu_job)) for s in self.faults]
        self.events: list[dict] = []  # what happened to jobs (failures, migrations), for the demo

    # ---- placement -------------------------------------------------------
    def placement_fleet(self) -> Fleet:
        """The fleet as the scheduler sees it now (same object until placement changes)."""
        if np.array_equal(self._placed.gpu_job, self.gpu_job):
            return self._placed
        self._placed = self.fleet if np.array_equal(self.gpu_job, self.fleet.gpu_job) else \
            replace(self.fleet, gpu_job=self.gpu_job.copy(), _index={})
        return self._placed

    def node_job(self) -> np.ndarray:
        out = np.full(self.fleet.count(Kind.NODE), -1, dtype=np.int64)
        placed = self.gpu_job >= 0
        out[self.fleet.gpu_node[placed]] = self.gpu_job[placed]
        return out

    def free_nodes(self, avoid_loop: int = -1) -> np.ndarray:
        """Nodes a scheduler may place work on: idle, not drained, no dead GPU, healthy NICs."""
        f = self.fleet
        idle = self.node_job() < 0
        dead = np.bincount(f.gpu_node, weights=self.gpu_dead, minlength=f.count(Kind.NODE)) > 0
        ok = idle & ~self.node_drained & ~dead & ~np.isin(np.arange(len(idle)), list(self.node_labels))
        if avoid_loop >= 0:
            ok &= f.node_loop != avoid_loop
        return np.flatnonzero(ok)

    def move_node_work(self, src: int, dst: int) -> None:
        f = self.fleet
        src_g = np.flatnonzero(f.gpu_node == src)
        dst_g = np.flatnonzero(f.gpu_node == dst)
        jobs = self.gpu_job[src_g].copy()
        self.gpu_job[src_g] = self.gpu_job[dst_g][: len(src_g)] if len(dst_g) >= len(src_g) else -1
        self.gpu_job[dst_g[: len(src_g)]] = jobs

    def pause_job(self, j: int, seconds: float, rollback: bool) -> None:
        js = self.jobs
        if rollback:
            lost = js.work_s[j] - js.committed_s[j]
            js.lost_s[j] += lost
            js.work_s[j] = js.committed_s[j]
            js.failures[j] += 1
        js.busy_until_s[j] = max(js.busy_until_s[j], self.t_s) + seconds

    def checkpoint_job(self, j: int) -> None:
        js = self.jobs
        js.committed_s[j] = js.work_s[j]
        js.last_ckpt_s[j] = self.t_s
        self.pause_job(j, self.checkpoint_write_s(j), rollback=False)

    def checkpoint_write_s(self, j: int) -> float:
        """A checkpoint waits for the slowest storage path its nodes write to."""
        f = self.fleet
        nodes = np.unique(f.gpu_node[self.gpu_job == j])
        if nodes.size == 0:
            return 0.0
        paths = f.node_storage[nodes]
        mult = self._storage_mult
        usable = ~self.storage_avoided
        best = float(mult[usable].min()) if usable.any() else float(mult.min())
        eff = np.where(self.storage_avoided[paths], best * 1.2, mult[paths])
        return self.cfg.checkpoint_write_s * float(eff.max())

    # ---- one tick --------------------------------------------------------
    def step(self) -> Frame:
        c, f = self.cfg, self.fleet
        dt = c.tick_s
        self.t_s += dt
        t = self.t_s
        flow_frac, link_mult, self._storage_mult, speed, sbe_rate_h, tim, replay_h = self._fault_effects(t)
        self._flaps(t)

        # Load: training runs flat out; inference load follows demand.
        job = self.gpu_job
        placed = job >= 0
        jj = np.maximum(job, 0)
        cls = f.job_class[jj] if len(f.job_class) else np.zeros_like(jj)
        phase = self.job_phase[jj] if len(self.job_phase) else np.zeros_like(jj, dtype=float)
        util = np.where(cls == JobClass.HIGH_SYNC_TRAINING, 0.97,
               np.where(cls == JobClass.PIPELINE_TRAINING, 0.85,
               np.where(cls == JobClass.ASYNC_BATCH_INFERENCE, 0.55 + 0.35 * np.sin(2 * math.pi * t / 900 + phase),
                        0.45 + 0.25 * np.sin(2 * math.pi * t / 600 + phase))))
        util = np.where(placed & ~self.gpu_dead, np.clip(util + 0.02 * self.rng.standard_normal(len(util)), 0, 1), 0.0)

        # Thermal: rack coolant rise from rack power and loop flow; die temp on top.
        power_w = np.where(util > 0, 100.0 + (f.gpu_tdp_w - 120.0) * util * self.gpu_clock_frac, 70.0) * \
            self.gpu_power_scale
        rack_power = np.bincount(f.gpu_rack, weights=power_w, minlength=f.count(Kind.RACK))
        gpus_per_rack = np.bincount(f.gpu_rack, minlength=f.count(Kind.RACK))
        rack_nominal = np.maximum(gpus_per_rack, 1) * 600.0
        diurnal = c.diurnal_amplitude_c * math.sin(2 * math.pi * t / c.diurnal_period_s)
        supply = c.supply_temp_c + diurnal + self.loop_offset_c
        rise = c.rack_rise_nominal_c * (rack_power / rack_nominal) / flow_frac[f.rack_loop]
        rack_inlet = supply[f.rack_loop]
        target = rack_inlet[f.gpu_rack] + 0.5 * rise[f.gpu_rack] + power_w * self.gpu_r_th * tim + self.gpu_offset_c
        over = target - f.gpu_throttle_temp_c
        clock_frac = np.clip(1.0 - c.throttle_slope_per_c * np.maximum(over, 0.0), 0.35, 1.0)
        held = np.minimum(target, f.gpu_throttle_temp_c + 1.0)
        # The fleet has been running before the twin starts: begin in thermal steady state.
        alpha = 1.0 if t <= dt else 1.0 - math.exp(-dt / c.gpu_thermal_tau_s)
        self.gpu_temp_c += alpha * (held - self.gpu_temp_c)
        throttled = (clock_frac < 0.999) & (self.gpu_temp_c >= f.gpu_throttle_temp_c - 0.5)
        self.gpu_clock_frac = np.where(throttled, clock_frac, 1.0)
        self.gpu_thermal_us += throttled * dt * 1e6  # dcgm-exporter reports microseconds
        self._record_throttle(throttled, t)
        # Past the bottom of its clock range a GPU cannot shed more heat: it overheats
        # until the driver's thermal shutdown takes it off the bus.
        self.gpu_overheat_s = np.where((over > c.thermal_trip_over_c) & ~self.gpu_dead, self.gpu_overheat_s + dt, 0.0)
        tripped = np.flatnonzero(self.gpu_overheat_s >= c.thermal_trip_after_s)
        if tripped.size:
            self.gpu_dead[tripped] = True
            self.gpu_off_bus[tripped] = True
            self.gpu_xid[tripped] = 79
            self._fail_jobs_on_gpus(tripped, "thermal shutdown (xid79)")

        # Errors: correctable ECC as a Poisson process, fatal XID at the end of an escalation.
        self.gpu_sbe += self.rng.poisson(sbe_rate_h * dt / 3600.0)
        self.gpu_pcie_replays += self.rng.poisson(replay_h * dt / 3600.0)
        self._ecc_progress(t)

        # Jobs.
        self._jobs_progress(t, dt, speed, link_mult)
        return self._frame(t, util, power_w, speed, flow_frac, supply, rack_inlet, rise, link_mult)

    # ---- fault effects -----------------------------------------------------
    def _fault_effects(self, t: float):
        f = self.fleet
        flow = np.ones(f.count(Kind.COOLING_LOOP))
        link = np.ones(f.count(Kind.LINK))
        storage = np.ones(f.count(Kind.STORAGE))
        speed = np.ones(f.count(Kind.GPU))
        sbe = np.full(f.count(Kind.GPU), self.cfg.sbe_base_per_h)
        tim = np.ones(f.count(Kind.GPU))
        replay = np.full(f.count(Kind.GPU), 0.2)  # a healthy link replays now and then
        for s in self.faults:
            if not s.active(t):
                continue
            ramp = min(1.0, (t - s.start_s) / max(s.ramp_s, 1e-9))
            if s.kind == FaultKind.COOLING_FLOW_LOSS:
                flow[s.index] = 1.0 - (1.0 - s.magnitude) * ramp
            elif s.kind == FaultKind.FABRIC_LATENCY:
                link[s.index] = 1.0 + (s.magnitude - 1.0) * min(1.0, (t - s.start_s) / 60.0)
            elif s.kind == FaultKind.STORAGE_SLOW:
                storage[s.index] = 1.0 + (s.magnitude - 1.0) * min(1.0, (t - s.start_s) / 120.0)
            elif s.kind == FaultKind.GPU_FAIL_SLOW:
                speed[s.index] = s.magnitude
            elif s.kind == FaultKind.GPU_THERMAL_INTERFACE:
                tim[s.index] = 1.0 + (s.magnitude - 1.0) * ramp
            elif s.kind == FaultKind.GPU_PCIE_REPLAY:
                # Replays climb to ``magnitude`` per hour; each one stalls the GPU's DMA, so
                # the rank slows by up to 4 % at the top of the climb.
                replay[s.index] = s.magnitude * ramp
                speed[s.index] = 1.0 - 0.04 * ramp
            elif s.kind == FaultKind.GPU_ECC_ESCALATION:
                p = min(1.0, (t - s.start_s) / s.magnitude)
                sbe[s.index] = 30.0 * 100.0 ** p
            elif s.kind == FaultKind.NIC_FLAP and not np.isfinite(self.nic_next_flap_s[s.index]):
                self.nic_next_flap_s[s.index] = t
        for s in self.faults:  # a flapping NIC stops flapping when its fault ends
            if s.kind == FaultKind.NIC_FLAP and t >= s.start_s + s.duration_s:
                self.nic_next_flap_s[s.index] = np.inf
        return flow, link, storage, speed, sbe, tim, replay

    def _flaps(self, t: float) -> None:
        due = self.nic_next_flap_s <= t
        if not due.any():
            return
        for i in np.flatnonzero(due).tolist():
            spec = next(s for s in self.faults if s.kind == FaultKind.NIC_FLAP and s.index == i)
            self.nic_down_until_s[i] = t + self.cfg.flap_down_s * self.rng.uniform(0.7, 1.3)
            self.nic_downed[i] += 1
            self.nic_symbol[i] += self.rng.integers(50, 500)
            self.nic_next_flap_s[i] = t + spec.magnitude * self.rng.uniform(0.6, 1.4)

    def _ecc_progress(self, t: float) -> None:
        for truth in self.truth:
            s = truth.spec
            if s.kind != FaultKind.GPU_ECC_ESCALATION or t < s.start_s:
                continue
            p = (t - s.start_s) / s.magnitude
            # Rows get remapped as the weak HBM bank degrades (XID 63 events).
            want_remaps = int(p >= 0.4) + int(p >= 0.7)
            if want_remaps > truth.remaps:
                self.gpu_remap[s.index] += want_remaps - truth.remaps
                truth.remaps = want_remaps
            if p >= 1.0 and not self.gpu_dead[s.index]:
                self.gpu_dead[s.index] = True
                self.gpu_xid[s.index] = 48  # double-bit ECC: the GPU's memory can no longer be trusted
                truth.hard_failure_s = t
                self._fail_jobs_on_gpus(np.array([s.index]), "xid48")

    def _record_throttle(self, throttled: np.ndarray, t: float) -> None:
        for truth in self.truth:
            if truth.spec.kind == FaultKind.COOLING_FLOW_LOSS and truth.throttle_s is None:
                on_loop = self.fleet.gpu_loop == truth.spec.index
                if (throttled & on_loop).any():
                    truth.throttle_s = t
            if truth.spec.kind == FaultKind.GPU_THERMAL_INTERFACE and truth.throttle_s is None and \
                    throttled[truth.spec.index]:
                truth.throttle_s = t

    # ---- jobs ----------------------------------------------------------------
    def _node_comm_factor(self, link_mult: np.ndarray) -> np.ndarray:
        """Collective slowdown per node: the worst leaf its rails reach, after routing."""
        f, c = self.fleet, self.cfg
        up = f.link_nic < 0
        eff = np.where(self.link_avoided, 1.0, link_mult)
        n_sw = f.count(Kind.SWITCH)
        leaf_worst = np.ones(n_sw)
        np.maximum.at(leaf_worst, f.link_leaf[up], eff[up])
        uplinks = np.bincount(f.link_leaf[up], minlength=n_sw)
        avoided = np.bincount(f.link_leaf[up], weights=self.link_avoided[up], minlength=n_sw)
        # Bandwidth lost with fewer uplinks in the ECMP group.
        bw = np.where(uplinks > 0, uplinks / np.maximum(uplinks - avoided, 1), 1.0)
        leaf_factor = (1.0 + c.latency_comm_weight * (leaf_worst - 1.0)) * bw
        node_factor = np.ones(f.count(Kind.NODE))
        np.maximum.at(node_factor, f.nic_node, leaf_factor[f.nic_leaf])
        return node_factor

    def _jobs_progress(self, t: float, dt: float, speed: np.ndarray, link_mult: np.ndarray) -> None:
        f, c, js = self.fleet, self.cfg, self.jobs
        n_j = len(f.job_names)
        if n_j == 0:
            return
        node_down = np.zeros(f.count(Kind.NODE), dtype=bool)
        down = self.nic_down_until_s > t
        node_down[f.nic_node[down]] = True
        comm = self._node_comm_factor(link_mult)[f.gpu_node]
        step = c.compute_share / (speed * self.gpu_clock_frac) + (1.0 - c.compute_share) * comm
        rate = np.where(self.gpu_dead | node_down[f.gpu_node], 0.0, 1.0 / step)
        placed = self.gpu_job >= 0
        jobs = self.gpu_job[placed]
        r = rate[placed]
        count = np.bincount(jobs, minlength=n_j)
        mean_rate = np.bincount(jobs, weights=r, minlength=n_j) / np.maximum(count, 1)
        min_rate = np.full(n_j, np.inf)
        np.minimum.at(min_rate, jobs, r)
        min_rate = np.where(count > 0, min_rate, 0.0)
        sync = JOB_CLASS_SYNCHRONY[f.job_class]
        job_rate = sync * min_rate + (1.0 - sync) * mean_rate
        js.step_s = np.where(job_rate > 0, 1.0 / np.maximum(job_rate, 1e-9), np.inf)
        avail = np.clip((t - js.busy_until_s) / dt, 0.0, 1.0)
        js.work_s += job_rate * avail * dt
        interval_s = np.where(np.isnan(self.job_interval_s), c.checkpoint_interval_s, self.job_interval_s)
        due = (t - js.last_ckpt_s >= interval_s) & (js.busy_until_s <= t) & (count > 0)
        for j in np.flatnonzero(due).tolist():
            self.checkpoint_job(j)

    def _fail_jobs_on_gpus(self, gpus: np.ndarray, why: str) -> None:
        """A hard failure: a synchronous job rolls back and restarts on a spare; inference
        loses only the failed GPU's share."""
        f = self.fleet
        for g in gpus.tolist():
            j = int(self.gpu_job[g])
            if j < 0:
                continue
            if JOB_CLASS_SYNCHRONY[f.job_class[j]] < 0.5:
                self.events.append({"t_s": self.t_s, "event": "gpu_lost", "job": f.job_names[j],
                                    "gpu": f.gpu_names[g], "why": why})
                continue
            if self.jobs.busy_until_s[j] > self.t_s + self.cfg.restart_s / 2:
                continue  # already restarting from this event
            self.pause_job(j, self.cfg.restart_s, rollback=True)
            node = int(f.gpu_node[g])
            spares = self.free_nodes()
            if spares.size:
                self.move_node_work(node, int(spares[0]))
            self.events.append({"t_s": self.t_s, "event": "job_failure", "job": f.job_names[j],
                                "gpu": f.gpu_names[g], "why": why,
                                "replacement": f.node_names[int(spares[0])] if spares.size else None})

    # ---- telemetry -------------------------------------------------------------
    def _frame(self, t, util, power_w, speed, flow_frac, supply, rack_inlet, rise, link_mult) -> Frame:
        f, c, rng = self.fleet, self.cfg, self.rng
        n_g = f.count(Kind.GPU)
        busy = util > 0
        temp = self.gpu_temp_c + c.temp_noise_c * rng.standard_normal(n_g)
        clock = np.where(busy, c.clock_max_mhz * self.gpu_clock_scale * self.gpu_clock_frac, c.clock_idle_mhz) * \
            (1.0 + 0.002 * rng.standard_normal(n_g))
        compute = np.where(busy, c.compute_share / (speed * self.gpu_clock_frac), np.nan) * \
            (1.0 + 0.01 * rng.standard_normal(n_g))
        nic_state = np.where(self.nic_down_until_s > t, 1.0, 4.0)
        n_l = f.count(Kind.LINK)
        latency = self.link_base_us * link_mult * (1.0 + 0.03 * rng.standard_normal(n_l))
        n_s = f.count(Kind.STORAGE)
        writing = np.zeros(n_s)
        busy_jobs = self.jobs.busy_until_s > t
        if busy_jobs.any():
            nodes = np.isin(self.node_job(), np.flatnonzero(busy_jobs))
            writing = np.bincount(f.node_storage[nodes], minlength=n_s).astype(float)
        storage_ms = c.storage_latency_ms * self._storage_mult * (1.0 + 0.15 * np.tanh(writing / 16.0)) * \
            np.exp(0.1 * rng.standard_normal(n_s))
        flow = f.loop_rated_flow_lpm * flow_frac * (1.0 + 0.01 * rng.standard_normal(len(flow_frac)))
        for arr in (temp, clock, compute):
            arr[self.gpu_off_bus] = np.nan
        power_w = np.where(self.gpu_off_bus, np.nan, power_w)
        values = {
            "DCGM_FI_DEV_GPU_TEMP": temp,
            "DCGM_FI_DEV_SM_CLOCK": clock,
            "DCGM_FI_DEV_POWER_USAGE": power_w,
            "DCGM_FI_DEV_GPU_UTIL": util * 100.0,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": self.gpu_sbe.copy(),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": self.gpu_remap.copy(),
            "DCGM_FI_DEV_XID_ERRORS": self.gpu_xid.copy(),
            "DCGM_FI_DEV_THERMAL_VIOLATION": self.gpu_thermal_us.copy(),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": self.gpu_pcie_replays.copy(),
            "seamguard_rank_compute_seconds": compute,
            "node_infiniband_state_id": nic_state,
            "node_infiniband_link_downed_total": self.nic_downed.copy(),
            "node_infiniband_symbol_error_total": self.nic_symbol.copy(),
            "seamguard_fabric_link_latency_us": latency,
            "seamguard_coolant_flow_lpm": flow,
            "seamguard_coolant_supply_temp_c": supply + 0.1 * rng.standard_normal(len(supply)),
            "seamguard_coolant_return_temp_c": supply + np.bincount(f.rack_loop, weights=rise) /
            np.maximum(np.bincount(f.rack_loop), 1),
            "seamguard_rack_inlet_temp_c": rack_inlet + 0.1 * rng.standard_normal(len(rack_inlet)),
            "seamguard_storage_write_latency_ms": storage_ms,
            "seamguard_job_step_seconds": self.jobs.step_s.copy(),
        }
        return make_frame(f, t, values)

    # ---- accounting ------------------------------------------------------------
    def useful_gpu_hours(self) -> float:
        return float((self.jobs.work_s * self.fleet.job_gpu_count).sum() / 3600.0)

    def ideal_gpu_hours(self) -> float:
        return float(self.fleet.job_gpu_count.sum() * self.t_s / 3600.0)

    def useful_throughput(self) -> float:
        """Useful work as a share of what the allocated GPUs would do with no faults."""
        ideal = self.ideal_gpu_hours()
        return self.useful_gpu_hours() / ideal if ideal > 0 else 0.0
