"""Where the served controller gets its frames: the seam between `serve` and the world.

A `Source` yields one Frame per tick, owns the actuators the controller drives, and may
report job progress (the twin knows useful throughput; a live cluster may not). The twin
source also runs the counterfactual — the same fleet, faults and seed with nobody in the
loop — so the dashboard can show what control is worth. `PrometheusLiveSource` is the
live one, built from a run config: Prometheus in, the configured actuators out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from seamguard.act.base import Actuator
from seamguard.app.config import RunConfig, build_actuators, load_topology, with_job_schedule
from seamguard.app.slurm_placement import SlurmPlacement
from seamguard.fleet.model import Fleet
from seamguard.observe.frame import Frame


@dataclass(frozen=True)
class Progress:
    """Useful work so far, with control and (where known) without it."""

    useful_with: float  # share of ideal GPU-hours that became useful work
    useful_without: float | None
    gpu_hours_with: float
    gpu_hours_without: float | None
    failures_with: int
    failures_without: int | None
    job_useful_with: np.ndarray  # per job, share of ideal
    job_useful_without: np.ndarray | None


class Source(Protocol):
    name: str

    def next_frame(self, wall_s: float) -> Frame:
        """The frame for the tick scheduled at wall-clock ``wall_s``."""
        ...

    def placement(self) -> Fleet:
        """The fleet with its current job placement."""
        ...

    def actuators(self) -> list[Actuator]: ...

    def progress(self) -> Progress | None: ...


class TwinSource:
    """The telemetry twin with the controller's actions applied, plus its counterfactual."""

    name = "twin"

    def __init__(self, gpus: int = 2048, minutes: float = 30.0, seed: int = 0, counterfactual: bool = True) -> None:
        from seamguard.twin import closedloop as demo
        from seamguard.twin.actuator import TwinActuator
        from seamguard.twin.telemetry import Twin

        fleet, faults, cfg = demo.build(gpus, minutes, seed)
        self.fleet, self.faults, self.cfg = fleet, faults, cfg
        self.tick_s = cfg.tick_s
        self.twin = Twin(fleet, faults, cfg, seed)
        self.shadow = Twin(fleet, faults, cfg, seed) if counterfactual else None
        self._actuator = TwinActuator(self.twin)

    def next_frame(self, wall_s: float) -> Frame:  # simulated time: the wall clock plays no part
        if self.shadow is not None:
            self.shadow.step()
        return self.twin.step()

    def placement(self) -> Fleet:
        return self.twin.placement_fleet()

    def actuators(self) -> list[Actuator]:
        return [self._actuator]

    def progress(self) -> Progress:
        tw, sh = self.twin, self.shadow
        t = max(tw.t_s, 1e-9)
        return Progress(
            useful_with=tw.useful_throughput(),
            useful_without=sh.useful_throughput() if sh else None,
            gpu_hours_with=tw.useful_gpu_hours(),
            gpu_hours_without=sh.useful_gpu_hours() if sh else None,
            failures_with=int(tw.jobs.failures.sum()),
            failures_without=int(sh.jobs.failures.sum()) if sh else None,
            job_useful_with=tw.jobs.work_s / t,
            job_useful_without=(sh.jobs.work_s / max(sh.t_s, 1e-9)) if sh else None,
        )


class PrometheusLiveSource:
    """A live cluster: frames from Prometheus, actuators from a run config.

    Frame time follows the wall clock, scaled by the config's ``time_scale`` (1 on a
    real cluster; a twin served with ``--speed`` runs faster than the wall)."""

    name = "prometheus"

    def __init__(self, cfg: RunConfig) -> None:
        from seamguard.observe.prometheus import PrometheusSource

        self.cfg = cfg
        self.fleet = with_job_schedule(load_topology(cfg.topology), cfg.jobs)
        self.tick_s = cfg.tick_s
        self._source = PrometheusSource(self.fleet, cfg.prometheus)
        self._actuators = build_actuators(cfg)
        self._wall0: float | None = None
        self._placement = SlurmPlacement(cfg.slurm_placement) if cfg.slurm_placement is not None else None

    def next_frame(self, wall_s: float) -> Frame:
        if self._wall0 is None:
            self._wall0 = wall_s
        return self._source.frame_at(wall_s, self._wall0 + (wall_s - self._wall0) * self.cfg.time_scale)

    def placement(self) -> Fleet:
        return self._placement.fleet(self.fleet) if self._placement is not None else self.fleet

    def actuators(self) -> list[Actuator]:
        return self._actuators

    def progress(self) -> Progress | None:
        return None  # a live cluster does not report useful work to seamguard

    def close(self) -> None:
        self._source.close()
