"""A fleet history: hardware spread, everyday events, injected faults, scraped every ``scrape_s``.

``Scenario(spec).run(sink)`` steps the physics (seamguard.scenarios.physics) over the
window and hands every scrape — Unix time and ``{series name: values per entity}``, NaN
where the series was not scraped — to ``sink``; afterwards ``labels()`` gives the
incidents (one per injected fault, with the hard-failure time the run reached) and
``truth()`` everything else that happened (the decoys a detector must not flag).

Everyday life, none of it a fault: warm-but-healthy GPUs, GPUs brushing their power
limit, load changes, checkpoint pauses (GPUs idle, storage slower), a job restart after
an application XID (13/31/43), application XIDs elsewhere, diurnal coolant swings,
exporter restarts (a gap), counter resets (reboots, a fabric admin clearing port
counters), random scrape gaps and one fleet-wide missed scrape, a maintenance drain by
someone else (node idle, rebooted), and a driver/firmware update on a few nodes (reboot,
counters reset, new driver label, slightly different power reading and clocks after).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.fleet.model import Fleet, JobClass, Kind
from seamguard.scenarios import physics as ph
from seamguard.scenarios import shifted as sh
from seamguard.scenarios.faults import CLASSES, FAULT_CLASS_NAMES, HELDOUT_CLASS_NAMES, HELDOUT_ONLY, Fault
from seamguard.scenarios.metrics import SERIES

DRIVER_OLD, DRIVER_NEW = "550.54.15", "550.90.07"
# Gauges a fault sets (an XID code, a sticky state, a lane count): an onset never scales them.
_STEP_MODS = frozenset({"pcie_width", "nic_down"})  # a link has whole lanes and is up or down
_GAUGES = frozenset({"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE"})


@dataclass(frozen=True)
class ScenarioSpec:
    gpus: int = 256
    minutes: float = 60.0
    seed: int = 0
    scrape_s: float = 30.0
    start_unix: float = 1_700_000_000.0
    faults: tuple[str, ...] = ()  # fault class names, one fault each (repeats allowed)
    warm_share: float = 0.05  # share of GPUs that run warm but healthy
    gap_rate: float = 0.002  # probability a node's exporters miss one scrape
    physics: str = "dev"  # "shifted": the held-out physics of seamguard.scenarios.shifted

    def __post_init__(self) -> None:
        if self.physics not in sh.PHYSICS:
            raise ValueError(f"physics must be one of {', '.join(sh.PHYSICS)}, got {self.physics!r}")
        unknown = [c for c in self.faults if c not in CLASSES]
        if unknown:
            raise ValueError(f"unknown fault class(es) {', '.join(unknown)}; known: {', '.join(HELDOUT_CLASS_NAMES)}")
        held = [c for c in self.faults if c in HELDOUT_ONLY]
        if held and self.physics != "shifted":
            raise ValueError(f"fault class(es) {', '.join(held)} exist only in the held-out physics "
                             f"(physics 'shifted'): the development physics writes none of their series")
        if self.minutes < 20:
            raise ValueError(f"minutes must be at least 20 (faults need history before and after), got {self.minutes}")
        if self.scrape_s <= 0:
            raise ValueError(f"scrape_s must be positive, got {self.scrape_s}")


def rotating_classes(index: int, per_scenario: int, classes: tuple[str, ...] = FAULT_CLASS_NAMES) -> tuple[str, ...]:
    """Fault classes for scenario ``index``: consecutive scenarios walk through every class in turn."""
    n = len(classes)
    return tuple(classes[(index * per_scenario + j) % n] for j in range(per_scenario))


def scenario_fleet(gpus: int, seed: int) -> Fleet:
    """The fleet of a scenario: the stock generator with loops small enough that a 256-GPU
    fleet has several (a loop fault must not cover the whole fleet) and several storage paths."""
    nodes = gpus // 8
    racks_per_loop = 2 if nodes <= 64 else 4
    shape = FleetShape(gpus=gpus, racks_per_loop=racks_per_loop, loop_rated_flow_lpm=60.0 * racks_per_loop,
                       nodes_per_storage_path=8 if nodes <= 64 else 32)
    return generate_fleet(shape, seed=seed, name=f"scenario-{gpus}-s{seed}")


@dataclass
class Event:
    """A scheduled everyday event (truth for the report, never a label)."""

    what: str
    kind: Kind
    index: int
    t_s: float
    end_s: float | None = None
    detail: dict = field(default_factory=dict)


class Sim:
    """The running state; faults change it through ``mods``, ``cnt``, ``set_xid`` and ``off_bus_at``."""

    def __init__(self, fleet: Fleet, rng: np.random.Generator, hw: ph.Hardware, dt: float) -> None:
        self.fleet, self.rng, self.hw, self.dt = fleet, rng, hw, dt
        self.mods = ph.Mods.fresh(fleet)
        self.cnt = ph.initial_counters(fleet, rng)
        g = len(fleet.gpu_names)
        self.temp = np.full(g, np.nan)
        self.off_bus = np.zeros(g, dtype=bool)
        self.nvlink_lost = np.zeros(g, dtype=bool)  # NVLink down until a GPU and switch reset: no work, still reports
        self._off_pending: dict[int, int] = {}
        self.first_throttle = np.full(g, np.nan)
        self.last_compute = np.full(g, np.nan)
        self.last_step = np.full(len(fleet.job_names), np.nan)
        self.driver = [DRIVER_OLD] * len(fleet.node_names)
        self.power_offset = np.zeros(len(fleet.node_names))
        self.clock_offset = np.zeros(len(fleet.node_names))
        self.node_cnt = {name: np.zeros(len(fleet.node_names)) for name in sh.NODE_COUNTERS}
        self.node_down = np.zeros(len(fleet.node_names), dtype=bool)
        self._crash_pending: dict[int, int] = {}

    def crash_node_at(self, node: int, delay_scrapes: int) -> None:
        """The host crashes after ``delay_scrapes`` more scrapes and stays down (its series vanish)."""
        self._crash_pending.setdefault(node, delay_scrapes)

    def set_xid(self, g: int, xid: int) -> None:
        self.cnt.g["DCGM_FI_DEV_XID_ERRORS"][g] = xid

    def off_bus_at(self, g: int, delay_scrapes: int) -> None:
        """The GPU falls off the bus after ``delay_scrapes`` more scrapes (the XID is seen first)."""
        self._off_pending.setdefault(g, delay_scrapes)

    def advance_off_bus(self) -> None:
        """A pending GPU's XID shows for its remaining scrapes, then the GPU is gone."""
        for g in list(self._off_pending):
            if self._off_pending[g] <= 0:
                self.off_bus[g] = True
                del self._off_pending[g]
            else:
                self._off_pending[g] -= 1
        for n in list(self._crash_pending):
            if self._crash_pending[n] <= 0:
                self.node_down[n] = True
                del self._crash_pending[n]
            else:
                self._crash_pending[n] -= 1

    def reset_node(self, node: int) -> None:
        """A reboot or driver reload: counters and sticky gauges start again from zero."""
        gs = np.flatnonzero(self.fleet.gpu_node == node)
        for arr in self.cnt.g.values():
            arr[gs] = 0.0
        for name in sh.SXID_COUNTERS:  # the agent counts in memory: it starts again with the host
            self.node_cnt[name][node] = 0.0
        self.clear_ports(node)

    def clear_ports(self, node: int) -> None:
        ns = np.flatnonzero(self.fleet.nic_node == node)
        for arr in self.cnt.n.values():
            arr[ns] = 0.0


@dataclass
class _JobState:
    """What each job does this scrape."""

    ckpt: np.ndarray  # checkpointing: its GPUs paused
    down: np.ndarray  # restarting
    ckpt_done_s: np.ndarray  # the length of a checkpoint that ended this scrape (added to the step shown)
    intensity: np.ndarray  # after load changes


@dataclass
class _NodeState:
    """Per node: out of service, and which exporters missed this scrape."""

    idle: np.ndarray
    gap: np.ndarray
    dcgm_gap: np.ndarray
    nodeexp_gap: np.ndarray


@dataclass
class _GpuRun:
    """Per GPU this scrape (``step_s`` per job, ``nic_load`` per NIC)."""

    active: np.ndarray  # computing
    paused: np.ndarray  # its job checkpoints
    busy: np.ndarray  # placed on a job that is up, node in service, on the bus
    clk_mhz: np.ndarray
    capped: np.ndarray
    compute_s: np.ndarray
    step_s: np.ndarray
    power_w: np.ndarray
    nic_load: np.ndarray


class Scenario:
    def __init__(self, spec: ScenarioSpec) -> None:
        self.spec = spec
        self.fleet = scenario_fleet(spec.gpus, spec.seed)
        self.rng = np.random.default_rng([spec.seed, spec.gpus, 7919])
        self.n_scrapes = int(spec.minutes * 60 // spec.scrape_s) + 1
        self.window_s = (self.n_scrapes - 1) * spec.scrape_s
        self.hw = ph.draw_hardware(self.fleet, self.rng, spec.start_unix)
        self.sim = Sim(self.fleet, self.rng, self.hw, spec.scrape_s)
        self.events: list[Event] = []
        self.faults: list[Fault] = []
        self.warm_gpus = np.array([], dtype=np.int64)
        self.shifted = spec.physics == "shifted"
        self.onsets: dict[int, sh.Onset] = {}
        self.background: dict[str, tuple] = {}
        self._last_out: dict[str, np.ndarray] = {}
        self._plan()
        if self.shifted:
            self._plan_shifted()

    # ---- planning: who is faulty, what happens when --------------------------------------------
    def _times(self) -> np.ndarray:
        return np.arange(self.n_scrapes) * self.spec.scrape_s

    def _plan(self) -> None:
        f, rng, T = self.fleet, self.rng, self.window_s
        busy_nodes: set[int] = set()
        busy_loops: set[int] = set()
        busy_storage: set[int] = set()
        # A loop fault first: its loop hosts no everyday event and no other fault (warm GPUs may sit on it,
        # and they are the first to throttle when its flow falls).
        loop_faults = [i for i, c in enumerate(self.spec.faults) if c == "cooling_loop_flow"]
        placed: dict[int, int] = {}
        for i in loop_faults:
            lp = self._place(Kind.COOLING_LOOP, busy_nodes, busy_loops, busy_storage)
            if lp is None:
                raise ValueError(f"fleet of {self.spec.gpus} GPUs has no free cooling loop for another "
                                 f"cooling_loop_flow fault")
            placed[i] = lp
        loop_nodes = set(busy_nodes)
        alloc_nodes = np.flatnonzero((f.node_job >= 0) & ~f.node_spare)
        sync = {int(JobClass.HIGH_SYNC_TRAINING), int(JobClass.PIPELINE_TRAINING)}
        tolerant = [n for n in alloc_nodes.tolist() if int(f.job_class[f.node_job[n]]) not in sync
                    and n not in busy_nodes]

        # Everyday events first; faults then go where nothing else happens.
        n_du = min(len(tolerant), max(2, len(f.node_names) // 64))
        du_nodes = [int(x) for x in rng.choice(tolerant, size=n_du, replace=False)] if tolerant else []
        du_t = float(rng.uniform(0.15, 0.8) * T)
        for n in du_nodes:
            self.events.append(Event("driver_update", Kind.NODE, n, du_t, du_t + float(rng.uniform(180, 300))))
            busy_nodes.add(n)
        spare_tol = [n for n in tolerant if n not in busy_nodes]
        if spare_tol:
            m = int(rng.choice(spare_tol))
            t_m = float(rng.uniform(0.1, 0.6) * T)
            self.events.append(Event("maintenance_drain", Kind.NODE, m, t_m,
                                     detail={"reboot_s": t_m + 300.0, "reboot_end_s": t_m + 300 + float(rng.uniform(240, 420))}))
            busy_nodes.add(m)
        # Job restart after an application XID on one of its GPUs.
        j_r = int(rng.integers(0, len(f.job_names)))
        t_r = float(rng.uniform(0.1, 0.85) * T)
        cand = np.flatnonzero((f.gpu_job == j_r) & ~np.isin(f.gpu_node, list(busy_nodes)))
        g_x = int(rng.choice(cand)) if len(cand) else -1
        self.events.append(Event("job_restart", Kind.JOB, j_r, t_r, t_r + float(rng.uniform(240, 480)),
                                 {"xid_gpu": g_x, "xid": int(rng.choice([13, 43]))}))
        if g_x >= 0:
            busy_nodes.add(int(f.gpu_node[g_x]))
        # Application XIDs without a restart (inference jobs retry the request).
        for _ in range(int(rng.integers(1, 4))):
            cand = np.flatnonzero((f.gpu_job >= 0) & ~np.isin(f.gpu_node, list(busy_nodes)))
            g = int(rng.choice(cand))
            self.events.append(Event("app_xid", Kind.GPU, g, float(rng.uniform(0.05, 0.95) * T),
                                     detail={"xid": int(rng.choice([13, 31, 43]))}))
            busy_nodes.add(int(f.gpu_node[g]))
        # Load change on one job.
        j_l = int(rng.integers(0, len(f.job_names)))
        self.events.append(Event("load_change", Kind.JOB, j_l, float(rng.uniform(0.2, 0.8) * T),
                                 detail={"factor": float(rng.choice([0.85, 0.9, 1.06]))}))
        # Checkpoints: every job, every 15-35 minutes, 60-150 s each.
        for j in range(len(f.job_names)):
            period = float(rng.uniform(900, 2100))
            t = float(rng.uniform(120, period))
            while t < T:
                self.events.append(Event("checkpoint", Kind.JOB, j, t,
                                         t + float(rng.uniform(*sh.CHECKPOINT_S[self.spec.physics]))))
                t += period
        # Exporter restarts (a gap) and port-counter clears anywhere, faulty nodes included.
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(0, len(f.node_names)))
            which = str(rng.choice(["dcgm", "node"]))
            t = float(rng.uniform(0.05, 0.95) * T)
            self.events.append(Event("exporter_restart", Kind.NODE, n, t, t + float(rng.choice([1, 2])) * self.spec.scrape_s,
                                     {"exporter": which}))
        n = int(rng.integers(0, len(f.node_names)))
        self.events.append(Event("port_counter_clear", Kind.NODE, n, float(rng.uniform(0.1, 0.9) * T)))
        if rng.random() < 0.5:
            self.events.append(Event("prometheus_missed_scrape", Kind.NODE, -1, float(rng.uniform(0.1, 0.9) * T)))

        # Warm-but-healthy GPUs: never on nodes of the events above.
        exclude = np.isin(f.gpu_node, list(busy_nodes - loop_nodes))
        self.warm_gpus = ph.pick_warm(f, rng, self.spec.warm_share, exclude)

        # Faults: disjoint nodes, never on decoys or warm GPUs, loops with nothing else in them.
        busy_nodes |= set(f.gpu_node[self.warm_gpus].tolist())
        for i in range(len(self.spec.faults)):
            cls = CLASSES[self.spec.faults[i]]
            idx = placed[i] if i in placed else self._place(cls.kind, busy_nodes, busy_loops, busy_storage)
            if idx is None:
                raise ValueError(f"fleet of {self.spec.gpus} GPUs has no free place for fault {cls.name}; "
                                 f"use fewer faults or a larger fleet")
            start = float(rng.uniform(0.25, 0.5) * T)
            start = math.ceil(start / self.spec.scrape_s) * self.spec.scrape_s
            fault = Fault(cls.name, cls.kind, idx, start, cls.params(rng))
            if self.shifted:
                fault.state["onset"] = sh.draw_onset(rng)
            sched = cls.scheduled_failure(rng)
            if sched is not None and start + sched < T - 2 * self.spec.scrape_s:
                fault.hard_failure_s = math.ceil((start + sched) / self.spec.scrape_s) * self.spec.scrape_s
            self.faults.append(fault)
        self.faults.sort(key=lambda x: x.start_s)

    def _plan_shifted(self) -> None:
        """Held-out extras: counter backgrounds, and stale exporters on nodes where nothing else happens."""
        f, rng, T = self.fleet, self.rng, self.window_s
        self.background = sh.draw_background(rng, {"gpu": len(f.gpu_names), "nic": len(f.nic_names),
                                                   "node": len(f.node_names)})
        taken = {int(e.index) for e in self.events if e.kind == Kind.NODE}
        taken |= {int(f.gpu_node[g]) for g in self.warm_gpus.tolist()}
        for fault in self.faults:
            taken |= set(self._fault_nodes(fault))
        free = [n for n in range(len(f.node_names)) if n not in taken]
        for n in rng.choice(free, size=min(len(free), max(1, len(f.node_names) // 64)), replace=False).tolist():
            t = float(rng.uniform(0.1, 0.8) * T)
            self.events.append(Event("exporter_stale", Kind.NODE, int(n), t, t + float(rng.uniform(*sh.STALE_S)),
                                     {"exporter": "dcgm"}))

    def _fault_nodes(self, fault: Fault) -> list[int]:
        f = self.fleet
        if fault.kind == Kind.NODE:
            return [fault.index]
        if fault.kind == Kind.GPU:
            return [int(f.gpu_node[fault.index])]
        if fault.kind == Kind.NIC:
            return [int(f.nic_node[fault.index])]
        if fault.kind == Kind.LINK and f.link_nic[fault.index] >= 0:
            return [int(f.nic_node[f.link_nic[fault.index]])]
        if fault.kind == Kind.COOLING_LOOP:
            return np.flatnonzero(f.node_loop == fault.index).tolist()
        return []

    def _place(self, kind: Kind, busy_nodes: set[int], busy_loops: set[int], busy_storage: set[int]) -> int | None:
        f, rng = self.fleet, self.rng
        ok_node = np.array([(n not in busy_nodes) and int(f.node_loop[n]) not in busy_loops
                            and not f.node_spare[n] and f.node_job[n] >= 0 for n in range(len(f.node_names))])
        if kind == Kind.COOLING_LOOP:
            loops = [lp for lp in range(len(f.loop_names)) if lp not in busy_loops
                     and not any(n in busy_nodes for n in np.flatnonzero(f.node_loop == lp).tolist())]
            if not loops or len(f.loop_names) < 2:
                return None
            lp = int(rng.choice(loops))
            busy_loops.add(lp)
            busy_nodes.update(np.flatnonzero(f.node_loop == lp).tolist())
            return lp
        if kind == Kind.STORAGE:
            paths = [s for s in range(len(f.storage_names)) if s not in busy_storage]
            if not paths or len(f.storage_names) < 2:
                return None
            s = int(rng.choice(paths))
            busy_storage.add(s)
            return s
        nodes = np.flatnonzero(ok_node)
        if not len(nodes):
            return None
        n = int(rng.choice(nodes))
        busy_nodes.add(n)
        if kind == Kind.NODE:
            return n
        if kind == Kind.GPU:
            return int(rng.choice(np.flatnonzero(f.gpu_node == n)))
        nic = int(rng.choice(np.flatnonzero(f.nic_node == n)))
        if kind == Kind.NIC:
            return nic
        if kind == Kind.LINK:
            return int(f.nic_link[nic])
        raise ValueError(kind)

    # ---- the run ---------------------------------------------------------------------------------
    def run(self, sink: Callable[[float, dict[str, np.ndarray], list[str]], None]) -> None:
        """Step every scrape; ``sink(unix_t, values, driver_label_per_node)``."""
        # Settle temperatures before the first scrape (the fleet has been running for hours).
        for k in range(8):
            self._step(-(16 - k) * self.spec.scrape_s, warmup=True)
        # Warm GPUs are calibrated on the running fleet: their own plate coolant and load.
        t = self._times()
        diurnal = self.hw.diurnal_amp * np.sin(2 * np.pi * t[:, None] / 86400.0 + self.hw.diurnal_phase)
        headroom = (diurnal.max(axis=0) - diurnal[0])[self.fleet.gpu_loop[self.warm_gpus]]
        ph.make_warm(self.hw, self.warm_gpus, self.sim.plate, self.sim.power, headroom, self.rng)
        for k in range(8):
            self._step(-(8 - k) * self.spec.scrape_s, warmup=True)
        for k in range(self.n_scrapes):
            t = k * self.spec.scrape_s
            vals = self._step(t)
            sink(self.spec.start_unix + t, vals, self.sim.driver)

    def _active_events(self, t: float, what: str) -> list[Event]:
        return [e for e in self.events if e.what == what and e.t_s <= t < (e.end_s if e.end_s is not None else math.inf)]

    def _step(self, t: float, warmup: bool = False) -> dict[str, np.ndarray]:
        """One scrape: faults and events change the state, the physics runs, the exporters show it."""
        sim = self.sim
        sim.mods = ph.Mods.fresh(self.fleet)
        if not warmup:
            for fault in self.faults:
                if t >= fault.start_s:
                    self._apply_fault(fault, t)
        jobs = self._job_state(t, warmup)
        nodes = self._node_state(t, warmup)
        sim.advance_off_bus()
        supply_c, flow_lpm = self._facility(t)
        run = self._run_gpus(jobs, nodes)
        rise_c = self._heat(t, run, supply_c, flow_lpm, warmup)
        self._count(run)
        if warmup:
            return {}
        out = self._gpu_series(run, jobs, nodes)
        out.update(self._fabric_series(run))
        out.update(self._facility_series(supply_c, flow_lpm, rise_c))
        out.update(self._storage_series(jobs))
        if self.shifted:
            out.update(self._shifted_series(run))
            self._stale(out, t)
        self._blank_gaps(out, t, nodes)
        return out

    def _shifted_series(self, run: _GpuRun) -> dict[str, np.ndarray]:
        """Series only the held-out histories write: PCIe link state, host EDAC counters, the node agent's
        roster and SXid counters (a series from the node's first SXid on, as the agent exports it)."""
        sim = self.sim
        # Links drop to Gen1 when the GPU idles (ASPM / link-speed management) and train back at load.
        gen = np.where(run.active | run.paused, 5.0, 1.0)
        out = {"DCGM_FI_DEV_PCIE_LINK_GEN": gen, "DCGM_FI_DEV_PCIE_LINK_WIDTH": sim.mods.pcie_width.copy(),
               "seamguard_agent_info": np.ones(len(self.fleet.node_names))}
        for name, arr in sim.node_cnt.items():
            out[name] = np.where(arr > 0, arr, np.nan) if name in sh.SXID_COUNTERS else arr.copy()
        return out

    def _stale(self, out: dict[str, np.ndarray], t: float) -> None:
        """A stale exporter serves its last scrape again: the node's dcgm series stop changing."""
        stale = [e.index for e in self._active_events(t, "exporter_stale")]
        if stale and self._last_out:
            gs = np.isin(self.fleet.gpu_node, stale)
            for s in SERIES:
                if s.kind == Kind.GPU and s.exporter == "dcgm" and s.name in self._last_out:
                    out[s.name][gs] = self._last_out[s.name][gs]
        self._last_out = {k: v.copy() for k, v in out.items()}

    def _apply_fault(self, fault: Fault, t: float) -> None:
        """A fault's change this scrape, scaled by its onset (held-out physics) — a step at full strength."""
        sim, since = self.sim, t - fault.start_s
        onset = fault.state.get("onset")
        hard = fault.hard_failure_s is not None and t >= fault.hard_failure_s
        w = 1.0 if onset is None else onset.weight(since, hard)
        if w <= 0.0:
            return
        if w >= 1.0:
            CLASSES[fault.cls].apply(sim, fault, since, self.spec.scrape_s)
            return
        mods = {k: v.copy() for k, v in vars(sim.mods).items()}
        cnt = {k: v.copy() for k, v in sim.cnt.g.items() if k not in _GAUGES}
        cnt_n = {k: v.copy() for k, v in sim.cnt.n.items()}
        cnt_nd = {k: v.copy() for k, v in sim.node_cnt.items()}
        CLASSES[fault.cls].apply(sim, fault, since, self.spec.scrape_s)
        for k, before in mods.items():
            after = getattr(sim.mods, k)
            setattr(sim.mods, k, (after if w >= 0.5 else before) if k in _STEP_MODS
                    else sh.blend(before, after, w, self.rng, counter=False))
        for store, snap in ((sim.cnt.g, cnt), (sim.cnt.n, cnt_n), (sim.node_cnt, cnt_nd)):
            for k, before in snap.items():
                store[k] = sh.blend(before, store[k], w, self.rng, counter=True)

    def _job_state(self, t: float, warmup: bool) -> _JobState:
        """Jobs running, checkpointing or down this scrape; their intensity after load changes."""
        nj, dt, sim = len(self.fleet.job_names), self.spec.scrape_s, self.sim
        jobs = _JobState(ckpt=np.zeros(nj, dtype=bool), down=np.zeros(nj, dtype=bool),
                         ckpt_done_s=np.zeros(nj), intensity=self.hw.job_intensity.copy())
        if warmup:
            return jobs
        for e in self.events:
            if e.what == "checkpoint":
                if e.t_s <= t < e.end_s:
                    jobs.ckpt[e.index] = True
                elif e.end_s <= t < e.end_s + dt:
                    jobs.ckpt_done_s[e.index] = e.end_s - e.t_s
            elif e.what == "job_restart" and e.t_s <= t < e.end_s:
                jobs.down[e.index] = True
                if e.detail["xid_gpu"] >= 0 and t < e.t_s + dt:
                    sim.set_xid(e.detail["xid_gpu"], e.detail["xid"])
            elif e.what == "load_change" and t >= e.t_s:
                jobs.intensity[e.index] = min(1.0, jobs.intensity[e.index] * e.detail["factor"])
            elif e.what == "app_xid" and e.t_s <= t < e.t_s + dt:
                sim.set_xid(e.index, e.detail["xid"])
            elif e.what == "port_counter_clear" and e.t_s <= t < e.t_s + dt:
                sim.clear_ports(e.index)
        return jobs

    def _node_state(self, t: float, warmup: bool) -> _NodeState:
        """Nodes out of service (maintenance: idle, then a reboot; driver updates: a reboot) and scrape gaps."""
        nn, dt, sim, rng = len(self.fleet.node_names), self.spec.scrape_s, self.sim, self.rng
        nodes = _NodeState(*(np.zeros(nn, dtype=bool) for _ in range(4)))
        if warmup:
            return nodes
        for e in self.events:
            if e.what == "maintenance_drain" and t >= e.t_s:
                nodes.idle[e.index] = True
                rb, rb_end = e.detail["reboot_s"], e.detail["reboot_end_s"]
                if rb <= t < rb_end:
                    nodes.gap[e.index] = True
                elif rb_end <= t < rb_end + dt:
                    sim.reset_node(e.index)
            elif e.what == "driver_update":
                if e.t_s <= t < e.end_s:
                    nodes.gap[e.index] = nodes.idle[e.index] = True
                elif e.end_s <= t < e.end_s + dt:
                    sim.reset_node(e.index)
                    sim.driver[e.index] = DRIVER_NEW
                    sim.power_offset[e.index] = float(rng.uniform(4, 10))
                    sim.clock_offset[e.index] = -float(rng.choice([15.0, 30.0, 45.0]))
            elif e.what == "exporter_restart" and e.t_s <= t < e.end_s:
                (nodes.dcgm_gap if e.detail["exporter"] == "dcgm" else nodes.nodeexp_gap)[e.index] = True
        nodes.gap |= rng.random(nn) < self.spec.gap_rate
        nodes.gap |= sim.node_down
        nodes.idle |= sim.node_down
        return nodes

    def _facility(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Coolant supply temperature (diurnal swing) and flow per loop."""
        hw, rng, loops = self.hw, self.rng, len(self.fleet.loop_names)
        supply_c = (hw.supply_base + hw.diurnal_amp * np.sin(2 * np.pi * t / 86400.0 + hw.diurnal_phase)
                    + 0.08 * rng.standard_normal(loops))
        noise = sh.FLOW_NOISE_SD[self.spec.physics]
        flow_lpm = hw.flow_rated * self.sim.mods.flow_factor * (1 + noise * rng.standard_normal(loops))
        return supply_c, flow_lpm

    def _run_gpus(self, jobs: _JobState, nodes: _NodeState) -> _GpuRun:
        """Clocks and power (thermal slowdown from the last temperature, power caps), rank compute, job steps."""
        f, hw, sim, rng, mods = self.fleet, self.hw, self.sim, self.rng, self.sim.mods
        job, gnode = f.gpu_job, f.gpu_node
        jj = np.maximum(job, 0)
        has_job = job >= 0
        in_service = ~nodes.idle[gnode] & ~sim.off_bus & ~sim.nvlink_lost
        active = has_job & ~jobs.down[jj] & ~jobs.ckpt[jj] & in_service
        paused = has_job & jobs.ckpt[jj] & in_service
        prev_c = np.where(np.isnan(sim.temp), 40.0, sim.temp)
        over_c = prev_c - hw.slowdown_c
        throttle = np.where(over_c >= 0, np.clip(1 - 0.07 * (over_c + 1), 0.45, 1.0), 1.0)
        clk_nom = hw.clk_load + sim.clock_offset[gnode]
        clk = clk_nom * mods.clock_factor * throttle
        p_span = hw.p_full * jobs.intensity[jj] - hw.p_idle
        p_busy = hw.p_idle + p_span * (clk / clk_nom) ** 1.6
        capped = active & (p_busy > mods.power_cap_w)
        scale = np.where(capped, np.clip((mods.power_cap_w - hw.p_idle) / np.maximum(p_busy - hw.p_idle, 1e-6),
                                         0.05, 1), 1.0)
        clk = clk * scale ** (1 / 1.6)
        p_busy = np.where(capped, mods.power_cap_w, p_busy)
        compute_s = (hw.job_base_s[jj] * (clk_nom / clk) * mods.compute_factor
                     * (1 + 0.01 * rng.standard_normal(len(job))))
        step_s = self._job_steps(compute_s, active, jobs.down)
        frac = np.where(active, np.clip(compute_s / np.where(np.isnan(step_s[jj]), compute_s, step_s[jj]), 0, 1), 0.0)
        power_w = np.where(active, hw.p_idle + (p_busy - hw.p_idle) * (ph.WAIT_POWER_SHARE
                                                                        + (1 - ph.WAIT_POWER_SHARE) * frac),
                           hw.p_idle + np.where(paused, 25.0, 0.0))
        power_w = power_w * (1 + 0.012 * rng.standard_normal(len(job)))
        nic_load = np.bincount(gnode, weights=active.astype(float), minlength=len(f.node_names))[f.nic_node] / 8.0
        return _GpuRun(active=active, paused=paused, busy=has_job & ~jobs.down[jj] & in_service, clk_mhz=clk,
                       capped=capped, compute_s=compute_s, step_s=step_s, power_w=power_w, nic_load=nic_load)

    def _job_steps(self, compute_s: np.ndarray, active: np.ndarray, down: np.ndarray) -> np.ndarray:
        """Each job's step: its slowest rank (synchronous) or a quantile (loosely coupled), plus communication."""
        f, hw, rng = self.fleet, self.hw, self.rng
        step_s = np.full(len(f.job_names), np.nan)
        for j in range(len(f.job_names)):
            ranks = np.flatnonzero((f.gpu_job == j) & active)
            if down[j] or not len(ranks):
                continue
            q = ph.SYNC_QUANTILE[JobClass(int(f.job_class[j]))]
            comm_s = 0.2 * hw.job_base_s[j] * float(self.sim.mods.comm_factor[np.unique(f.gpu_node[ranks])].max())
            step_s[j] = float(np.quantile(compute_s[ranks], q)) + comm_s * (1 + 0.02 * rng.standard_normal())
        return step_s

    def _heat(self, t: float, run: _GpuRun, supply_c: np.ndarray, flow_lpm: np.ndarray, warmup: bool) -> np.ndarray:
        """Loop heat and coolant rise, cold plates, die temperatures; returns each loop's rise (°C)."""
        f, hw, sim = self.fleet, self.hw, self.sim
        heat_w = np.bincount(f.gpu_loop, weights=np.where(sim.off_bus, 0, run.power_w), minlength=len(f.loop_names))
        rise_c = ph.loop_rise_c(heat_w * ph.HEAT_PER_GPU_WATT, flow_lpm)
        plate_c = supply_c[f.gpu_loop] + hw.rack_offset[f.gpu_rack] + 0.5 * rise_c[f.gpu_loop]
        r_th = (hw.r_cond * sim.mods.tim_factor
                + hw.r_conv * (hw.flow_rated[f.gpu_loop] / flow_lpm[f.gpu_loop]) ** ph.FLOW_EXPONENT)
        t_ss = plate_c + r_th * run.power_w
        sim.plate, sim.power = plate_c, run.power_w
        alpha = 1 - math.exp(-self.spec.scrape_s / ph.DIE_TAU_S)
        sim.temp = np.where(np.isnan(sim.temp), t_ss, sim.temp + (t_ss - sim.temp) * alpha)
        if not warmup:
            hot = sim.temp >= hw.slowdown_c
            sim.first_throttle = np.where(hot & np.isnan(sim.first_throttle), t, sim.first_throttle)
        return rise_c

    def _count(self, run: _GpuRun) -> None:
        """Advance the counters: violations, ECC and PCIe noise, InfiniBand transmit waits and symbol errors."""
        hw, sim, rng, dt = self.hw, self.sim, self.rng, self.spec.scrape_s
        g, nics = len(run.active), len(self.fleet.nic_names)
        c = sim.cnt.g
        hot = sim.temp >= hw.slowdown_c
        c["DCGM_FI_DEV_THERMAL_VIOLATION"] += np.where(hot, dt * 1e6 * np.clip(sim.temp - hw.slowdown_c + 0.5, 0, 1),
                                                       0).round()
        brush = np.where(run.active, hw.power_brush, 0.0)
        c["DCGM_FI_DEV_POWER_VIOLATION"] += (np.where(run.capped, dt, dt * brush) * 1e6).round()
        c["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] += rng.poisson(np.where(rng.random(g) < 0.002, 1.0, 0.0))
        c["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] += rng.poisson(np.where(rng.random(g) < 0.001, 1.5, 0.0))
        n = sim.cnt.n
        n["node_infiniband_port_transmit_wait_total"] += (hw.xmit_rate * run.nic_load * sim.mods.xmit_wait_factor * dt
                                                          * np.exp(0.2 * rng.standard_normal(nics))).round()
        n["node_infiniband_symbol_error_total"] += rng.poisson(np.where(rng.random(nics) < 0.003, 1.0, 0.0))
        for name, (kind, rate, burst) in self.background.items():
            store = c if kind == "gpu" else n if kind == "nic" else sim.node_cnt
            store[name] += sh.background_increments(rng, rate, burst, dt)

    # ---- what the exporters show ----------------------------------------------------------------------
    def _gpu_series(self, run: _GpuRun, jobs: _JobState, nodes: _NodeState) -> dict[str, np.ndarray]:
        hw, sim, rng = self.hw, self.sim, self.rng
        g = len(run.active)
        out: dict[str, np.ndarray] = {}
        util = np.where(run.active, np.minimum(100, 97 + 2.5 * rng.standard_normal(g)).round(),
                        np.where(run.paused, rng.integers(0, 7, g), 0)).astype(float)
        clock_shown = np.where(run.active, run.clk_mhz, np.where(run.paused, ph.MAX_CLOCK_MHZ, ph.IDLE_CLOCK_MHZ))
        out["DCGM_FI_DEV_GPU_TEMP"] = np.round(sim.temp + 0.35 * rng.standard_normal(g))
        out["DCGM_FI_DEV_MEMORY_TEMP"] = np.round(sim.temp + hw.mem_offset + sim.mods.mem_temp_add_c
                                                  + 0.35 * rng.standard_normal(g))
        out["DCGM_FI_DEV_SM_CLOCK"] = np.round(clock_shown / ph.CLOCK_STEP_MHZ) * ph.CLOCK_STEP_MHZ
        out["DCGM_FI_DEV_POWER_USAGE"] = np.round(run.power_w + sim.power_offset[self.fleet.gpu_node], 3)
        out["DCGM_FI_DEV_GPU_UTIL"] = util
        for name, arr in sim.cnt.g.items():
            out[name] = arr.copy()
        sim.last_compute = np.where(run.active, run.compute_s, sim.last_compute)
        out["seamguard_rank_compute_seconds"] = np.where(run.busy, np.round(sim.last_compute, 4), np.nan)
        step_shown = np.where(np.isnan(run.step_s), sim.last_step, run.step_s + jobs.ckpt_done_s)
        sim.last_step = np.where(np.isnan(run.step_s), sim.last_step, run.step_s)
        out["seamguard_job_step_seconds"] = np.where(jobs.down, np.nan, np.round(step_shown, 4))
        return out

    def _fabric_series(self, run: _GpuRun) -> dict[str, np.ndarray]:
        f, hw, sim = self.fleet, self.hw, self.sim
        nic_down = sim.mods.nic_down
        out = {"node_infiniband_state_id": np.where(nic_down, 1.0, 4.0),
               "node_infiniband_physical_state_id": np.where(nic_down, 3.0, 5.0)}
        for name, arr in sim.cnt.n.items():
            out[name] = arr.copy()
        link_load = np.where(f.link_nic >= 0, run.nic_load[np.maximum(f.link_nic, 0)], float(run.nic_load.mean()))
        out["seamguard_fabric_link_latency_us"] = np.round(
            hw.link_base_us * sim.mods.latency_factor * (1 + 0.15 * link_load)
            * np.exp(0.05 * self.rng.standard_normal(len(f.link_names))), 3)
        return out

    def _facility_series(self, supply_c: np.ndarray, flow_lpm: np.ndarray, rise_c: np.ndarray) -> dict[str, np.ndarray]:
        f, rng = self.fleet, self.rng
        return {
            "seamguard_coolant_flow_lpm": np.round(flow_lpm, 2),
            "seamguard_coolant_supply_temp_c": np.round(supply_c, 2),
            "seamguard_coolant_return_temp_c": np.round(supply_c + rise_c + 0.05 * rng.standard_normal(len(supply_c)), 2),
            "seamguard_rack_inlet_temp_c": np.round(supply_c[f.rack_loop] + self.hw.rack_offset
                                                    + 0.05 * rng.standard_normal(len(f.rack_names)), 2),
        }

    def _storage_series(self, jobs: _JobState) -> dict[str, np.ndarray]:
        """Write latency per storage target, slower while a job on it checkpoints."""
        f, rng = self.fleet, self.rng
        in_ckpt = np.zeros(len(f.storage_names))
        for j in np.flatnonzero(jobs.ckpt):
            in_ckpt[np.unique(f.node_storage[f.node_job == j])] = 1.0
        return {"seamguard_storage_write_latency_ms": np.round(
            self.hw.storage_base_ms * self.sim.mods.storage_factor
            * (1 + in_ckpt * rng.uniform(1.5, 3.0, len(in_ckpt))) * np.exp(0.08 * rng.standard_normal(len(in_ckpt))), 2)}

    def _blank_gaps(self, out: dict[str, np.ndarray], t: float, nodes: _NodeState) -> None:
        """NaN where nothing was scraped: gaps per node and exporter, GPUs off the bus, a fleet-wide missed scrape."""
        f = self.fleet
        g_gap = nodes.gap[f.gpu_node] | nodes.dcgm_gap[f.gpu_node] | self.sim.off_bus
        nic_gap = nodes.gap[f.nic_node] | nodes.nodeexp_gap[f.nic_node]
        for s in SERIES:
            if s.name not in out:  # written by the held-out physics only
                continue
            if s.kind == Kind.GPU:
                out[s.name][g_gap] = np.nan
            elif s.kind == Kind.NIC:
                out[s.name][nic_gap] = np.nan
            elif s.kind == Kind.NODE:
                out[s.name][nodes.gap | (nodes.nodeexp_gap & (s.exporter == "node"))] = np.nan
        if any(e.what == "prometheus_missed_scrape" and e.t_s <= t < e.t_s + self.spec.scrape_s for e in self.events):
            for arr in out.values():
                arr[:] = np.nan

    # ---- results -----------------------------------------------------------------------------------
    def _name(self, kind: Kind, i: int) -> str:
        return self.fleet.names(kind)[i]

    def labels(self) -> list[dict]:
        """One incident per fault, then the maintenance windows, in the labels-file form (seamguard.app.eval)."""
        s0 = self.spec.start_unix
        out = []
        for i, fault in enumerate(self.faults):
            cls = CLASSES[fault.cls]
            hf = fault.hard_failure_s
            if cls.physical_failure:
                gs = (np.flatnonzero(self.fleet.gpu_loop == fault.index) if fault.kind == Kind.COOLING_LOOP
                      else np.array([fault.index]))
                ft = self.sim.first_throttle[gs]
                ft = ft[~np.isnan(ft) & (ft >= fault.start_s)]
                hf = float(ft.min()) if len(ft) else None
            inc = {"id": f"F{i + 1:02d}", "kind": fault.kind.label, "entity": self._name(fault.kind, fault.index),
                   "fault": fault.cls, "start": s0 + fault.start_s}
            if hf is not None:
                inc["hard_failure"] = s0 + hf
            out.append(inc)
        # Planned work an operator has records of (the scheduler's drain, the change ticket): labelled as
        # maintenance windows, which cover flags and actions but are not incidents.
        k = 0
        for e in self.events:
            if e.what in ("maintenance_drain", "driver_update"):
                k += 1
                w = {"id": f"M{k:02d}", "kind": "node", "entity": self._name(Kind.NODE, e.index),
                     "fault": "maintenance", "start": s0 + e.t_s, "note": e.what.replace("_", " ")}
                if e.end_s is not None:
                    w["end"] = s0 + e.end_s
                out.append(w)
        return out

    def truth(self) -> dict:
        """Everything else that happened: decoys with their entities and times, and the spec."""
        s0 = self.spec.start_unix
        ev = []
        for e in self.events:
            if e.what == "checkpoint":
                continue
            d = {"what": e.what, "kind": e.kind.label if e.index >= 0 else None,
                 "entity": self._name(e.kind, e.index) if e.index >= 0 else None, "t": s0 + e.t_s}
            if e.end_s is not None:
                d["end"] = s0 + e.end_s
            if e.what == "job_restart" and e.detail["xid_gpu"] >= 0:
                d["xid_gpu"] = self.fleet.gpu_names[e.detail["xid_gpu"]]
                d["xid"] = e.detail["xid"]
            elif "xid" in e.detail:
                d["xid"] = e.detail["xid"]
            ev.append(d)
        return {"spec": {"gpus": self.spec.gpus, "minutes": self.spec.minutes, "seed": self.spec.seed,
                         "scrape_s": self.spec.scrape_s, "start": s0, "end": s0 + self.window_s,
                         "faults": list(self.spec.faults), "physics": self.spec.physics,
                         "generator_version": sh.GENERATOR_VERSION},
                "onsets": {f"F{i + 1:02d}": vars(fl.state["onset"]) for i, fl in enumerate(self.faults)
                           if "onset" in fl.state},
                "warm_but_healthy": [self.fleet.gpu_names[g] for g in self.warm_gpus.tolist()],
                "warm_throttled": [self.fleet.gpu_names[g] for g in self.warm_gpus.tolist()
                                   if not np.isnan(self.sim.first_throttle[g])],
                "events": ev,
                "checkpoints": sum(e.what == "checkpoint" for e in self.events)}
