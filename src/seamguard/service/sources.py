"""Where the served controller gets its frames: the seam between `serve` and the world.

A `Source` yields one Frame per tick, owns the actuators the controller drives, and may
report job progress (the twin knows useful throughput; a live cluster may not). The twin
source also runs the counterfactual — the same fleet, faults and seed with nobody in the
loop — so the dashboard can show what control is worth. `source_from_config` builds the
live one: Prometheus in, the configured actuators out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from seamguard.act.base import Actuator
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

    def next_frame(self) -> Frame: ...

    def placement(self) -> Fleet:
        """The fleet with its current job placement."""
        ...

    def actuators(self) -> list[Actuator]: ...

    def progress(self) -> Progress | None: ...


class TwinSource:
    """The telemetry twin with the controller's actions applied, plus its counterfactual."""

    name = "twin"

    def __init__(self, gpus: int = 2048, minutes: float = 30.0, seed: int = 0, counterfactual: bool = True) -> None:
        from seamguard import demo
        from seamguard.twin.actuator import TwinActuator
        from seamguard.twin.telemetry import Twin

        fleet, faults, cfg = demo.build(gpus, minutes, seed)
        self.fleet, self.faults, self.cfg = fleet, faults, cfg
        self.tick_s = cfg.tick_s
        self.twin = Twin(fleet, faults, cfg, seed)
        self.shadow = Twin(fleet, faults, cfg, seed) if counterfactual else None
        self._actuator = TwinActuator(self.twin)

    def next_frame(self) -> Frame:
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


class SourceUnavailable(RuntimeError):
    """The configured source cannot run in this installation; the message says why."""


class PrometheusLiveSource:
    """A live cluster: frames from Prometheus, actuators from a `seamguard run` config."""

    name = "prometheus"

    def __init__(self, path: Path) -> None:
        from seamguard.fleet.topology import TopologyError, load_topology
        from seamguard.live import ConfigError, build_actuators, load_run_config
        from seamguard.observe.prometheus import PrometheusSource

        try:
            cfg = load_run_config(path)
            self.fleet = load_topology(cfg.topology)
        except (ConfigError, TopologyError) as e:
            raise SourceUnavailable(str(e)) from None
        self.cfg = cfg
        self.tick_s = cfg.tick_s
        self.mode = cfg.mode  # a live cluster runs in the mode its config says, never a CLI default
        self._source = PrometheusSource(self.fleet, cfg.prometheus)
        self._actuators = build_actuators(cfg)

    def next_frame(self) -> Frame:
        now = time.time()
        return self._source.frame_at(now, now)

    def placement(self) -> Fleet:
        return self.fleet

    def actuators(self) -> list[Actuator]:
        return self._actuators

    def progress(self) -> Progress | None:
        return None  # a live cluster does not report useful work to seamguard


def source_from_config(path: Path) -> Source:
    """A live source from a `seamguard run` config file (Prometheus ingest)."""
    return PrometheusLiveSource(path)
