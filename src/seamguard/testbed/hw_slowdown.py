"""Thermal HW slowdown: what a cooling loop losing flow does to the GPUs it cools, for the seam drill.

Why this exists: the seam drill's cooling fault is a flow loss in the twin's facilities
series (there is no real CDU). Alone it touched nothing real, so moving the job off the loop
was pure cost. On a real cluster a GPU whose cold plate loses flow heats up until it reaches
its slowdown temperature, and then HW (thermal) slowdown cuts its clocks "by a factor of 2 or
more" (NVML's clock event reasons, docs/seam-drill.md has the source). This module gives the
drill that consequence, the same in enforce and dry-run:

- `slowdown_delay_s` (pure): when a GPU reaches the slowdown point after the flow drops, from
  a first-order model of its die: the die's rise over the coolant scales with 1/flow, and it
  approaches the new level with the twin's die time constant;
- `SlowdownPlan` (pure): per GPU, from when to when it is slowed, and `slowed_values`: the
  GPU series as dcgm-exporter would show it then (SM clock x the fraction, the temperature
  held at the slowdown point, the thermal violation counter running);
- `SlowdownTwin`: the twin's step with the plan applied, which also writes each node's GPU
  clock fraction to ``<clock_dir>/<node>``: the drill's job emulates its GPU work
  (`examples/train_ddp.py --gpu-clock-file`) and stretches it by 1/fraction while its node is
  slowed. The job reads the file of the node it runs on, so the slowdown ends for the work
  the moment the work leaves the loop; for the node it ends when the flow returns.

Called by the drill's twin driver (`python -m seamguard.app.fault_twin cooling --slowdown-clock-dir`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame

PLAN_FILE = "plan.json"  # in the clock directory: the slowdown the twin planned (the drill reports it)
HW_SLOWDOWN_CLOCK_FRACTION = 0.5  # NVML/DCGM: HW slowdown cuts the core clocks by a factor of 2 or more


def slowdown_delay_s(die_c: float, coolant_c: float, slowdown_c: float, flow_fraction: float, tau_s: float,
                     ramp_s: float = 0.0) -> float | None:
    """Seconds from the start of a flow loss until the die reaches ``slowdown_c``; None if it never does.

    The die sits ``die_c - coolant_c`` above its coolant at full flow; at ``flow_fraction`` of the
    flow the rise is taken as 1/``flow_fraction`` times that (the heat the coolant carries away per
    degree falls with the flow), and the die approaches the new level exponentially with time
    constant ``tau_s``, counted from the end of the flow's ``ramp_s`` (where the flow reaches its
    low level). The simplest model with a delay in it; docs/seam-drill.md says what it leaves out."""
    if not 0.0 < flow_fraction <= 1.0:
        raise ValueError(f"flow_fraction must be in (0, 1], got {flow_fraction}")
    if tau_s <= 0.0:
        raise ValueError(f"tau_s must be > 0, got {tau_s}")
    if die_c >= slowdown_c:
        return ramp_s
    hot_c = coolant_c + (die_c - coolant_c) / flow_fraction
    if hot_c <= slowdown_c:
        return None
    return ramp_s + tau_s * math.log((hot_c - die_c) / (hot_c - slowdown_c))


@dataclass(frozen=True)
class SlowdownPlan:
    """Per GPU, the twin time its slowdown starts (inf: never) and the time the flow returns."""

    start_s: np.ndarray
    end_s: float
    clock_fraction: float = HW_SLOWDOWN_CLOCK_FRACTION

    def active(self, t_s: float) -> np.ndarray:
        return (self.start_s <= t_s) & (t_s < self.end_s)

    def describe(self, fleet: Fleet, fault_start_s: float) -> dict:
        """Per node with a slowed GPU: the delay after the flow loss began (s); the clock fraction."""
        delay = {fleet.node_names[int(fleet.gpu_node[g])]: round(float(self.start_s[g] - fault_start_s), 2)
                 for g in np.flatnonzero(np.isfinite(self.start_s))}
        return {"delay_s": delay, "clock_fraction": self.clock_fraction,
                "lasts_s": round(self.end_s - fault_start_s, 2)}


def plan_for_loop(fleet: Fleet, loop: int, die_c: np.ndarray, coolant_c: np.ndarray, fault_start_s: float,
                  fault_s: float, flow_fraction: float, ramp_s: float, tau_s: float) -> SlowdownPlan:
    """The slowdown of every GPU cooled by ``loop`` during a flow loss starting at ``fault_start_s``
    (twin time) and lasting ``fault_s``: each GPU from its own `slowdown_delay_s` on (``die_c``: its
    die temperature when the flow starts to drop, ``coolant_c``: its coolant's), until the flow returns."""
    start = np.full(fleet.count(Kind.GPU), np.inf)
    for g in np.flatnonzero(fleet.gpu_loop == loop):
        d = slowdown_delay_s(float(die_c[g]), float(coolant_c[g]), float(fleet.gpu_throttle_temp_c[g]),
                             flow_fraction, tau_s, ramp_s)
        if d is not None:
            start[g] = fault_start_s + d
    return SlowdownPlan(start_s=start, end_s=fault_start_s + fault_s)


def slowed_values(values: dict[str, np.ndarray], slowed: np.ndarray, clock_fraction: float,
                  slowdown_c: np.ndarray, violation_us: np.ndarray) -> dict[str, np.ndarray]:
    """The GPU series with ``slowed`` GPUs in HW slowdown: SM clock x ``clock_fraction``,
    temperature at least the slowdown point, ``violation_us`` (their accumulated slowdown time)
    added to the thermal violation counter. Other series and GPUs are returned unchanged."""
    out = dict(values)
    if "DCGM_FI_DEV_SM_CLOCK" in values:
        out["DCGM_FI_DEV_SM_CLOCK"] = np.where(slowed, values["DCGM_FI_DEV_SM_CLOCK"] * clock_fraction,
                                               values["DCGM_FI_DEV_SM_CLOCK"])
    if "DCGM_FI_DEV_GPU_TEMP" in values:
        out["DCGM_FI_DEV_GPU_TEMP"] = np.where(slowed, np.maximum(values["DCGM_FI_DEV_GPU_TEMP"], slowdown_c),
                                               values["DCGM_FI_DEV_GPU_TEMP"])
    if "DCGM_FI_DEV_THERMAL_VIOLATION" in values:
        out["DCGM_FI_DEV_THERMAL_VIOLATION"] = values["DCGM_FI_DEV_THERMAL_VIOLATION"] + violation_us
    return out


def node_clock_fractions(fleet: Fleet, slowed: np.ndarray, clock_fraction: float) -> dict[str, float]:
    """Each node's GPU clock fraction (its slowest GPU's): 1.0, or ``clock_fraction`` while slowed."""
    frac = np.where(slowed, clock_fraction, 1.0)
    out = {n: 1.0 for n in fleet.node_names}
    for g, node in enumerate(fleet.gpu_node):
        out[fleet.node_names[int(node)]] = min(out[fleet.node_names[int(node)]], float(frac[g]))
    return out


def write_clock_files(clock_dir: Path, fractions: dict[str, float]) -> None:
    """One file per node holding its GPU clock fraction, replaced atomically (a reader never sees half)."""
    clock_dir.mkdir(parents=True, exist_ok=True)
    for node, frac in fractions.items():
        tmp = clock_dir / f".{node}.tmp"
        tmp.write_text(f"{frac:g}\n")
        os.replace(tmp, clock_dir / node)


class SlowdownTwin:
    """A twin whose flow loss on ``loop`` puts the loop's GPUs into HW slowdown (see the module
    docstring). ``step()`` is the twin's step with the slowdown applied; the plan is made on the
    first step at or after the fault's start, from the die and coolant temperatures then."""

    def __init__(self, twin, loop: int, fault_start_s: float, fault_s: float, flow_fraction: float,
                 ramp_s: float, clock_dir: Path | None) -> None:
        self.twin, self.loop, self.clock_dir = twin, loop, clock_dir
        self.fault_start_s, self.fault_s, self.flow_fraction, self.ramp_s = fault_start_s, fault_s, flow_fraction, ramp_s
        self.plan: SlowdownPlan | None = None
        self.violation_us = np.zeros(twin.fleet.count(Kind.GPU))
        if clock_dir is not None:
            write_clock_files(clock_dir, node_clock_fractions(twin.fleet, np.zeros(len(self.violation_us), bool), 1.0))

    def step(self) -> Frame:
        frame = self.twin.step()
        t, fleet = self.twin.t_s, self.twin.fleet
        if self.plan is None and t >= self.fault_start_s:
            coolant = frame.get("seamguard_rack_inlet_temp_c")[fleet.gpu_rack]
            self.plan = plan_for_loop(fleet, self.loop, np.asarray(self.twin.gpu_temp_c), coolant, self.fault_start_s,
                                      self.fault_s, self.flow_fraction, self.ramp_s, self.twin.cfg.gpu_thermal_tau_s)
            if self.clock_dir is not None:
                (self.clock_dir / PLAN_FILE).write_text(json.dumps(self.plan.describe(fleet, self.fault_start_s)))
        slowed = self.plan.active(t) if self.plan is not None else np.zeros(len(self.violation_us), bool)
        self.violation_us += slowed * self.twin.cfg.tick_s * 1e6
        if self.clock_dir is not None:
            frac = self.plan.clock_fraction if self.plan is not None else 1.0
            write_clock_files(self.clock_dir, node_clock_fractions(fleet, slowed, frac))
        if self.plan is None:
            return frame
        values = slowed_values(frame.values, slowed, self.plan.clock_fraction, fleet.gpu_throttle_temp_c,
                               self.violation_us)
        return replace(frame, values=values)

    def __getattr__(self, name: str):
        return getattr(self.twin, name)  # the exporter reads the twin's clock (t_s), fleet and jobs
