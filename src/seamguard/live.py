"""`seamguard run --config FILE`: the live controller against Prometheus, on a schedule.

Reads the run config (documented in docs/prometheus-slurm.md, validated with errors that
name the file and the field), builds the Prometheus source, the configured actuators
and the SQLite ledger, and ticks the Controller every ``tick_s`` until told to stop.
Dry-run unless the config says ``mode: enforce``. SIGTERM/SIGINT finish the current
tick, then the ledger and the source are closed.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seamguard.act.slurm import SlurmConfig
from seamguard.backtest import EventStream, dumps
from seamguard.observe.prometheus import PromConfig
from seamguard.validation import format_validation_error, read_yaml

log = logging.getLogger("seamguard.live")


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogActuatorConfig(_Strict):
    type: Literal["log"]
    path: Path = Field(description="JSON-lines file of what would be / was done")


class SlurmActuatorConfig(SlurmConfig):
    type: Literal["slurm"]


class KubernetesActuatorConfig(_Strict):
    type: Literal["kubernetes"]
    kubeconfig: Path | None = None
    context: str | None = None
    request_timeout_s: float = Field(10.0, gt=0)
    label_selector: str | None = None


class RuntimeActuatorConfig(_Strict):
    type: Literal["runtime"]
    hint_dirs: dict[str, Path] = Field(description="job name -> the --hint-dir its `seamguard launch` polls")


ActuatorConfig = Annotated[LogActuatorConfig | SlurmActuatorConfig | KubernetesActuatorConfig | RuntimeActuatorConfig,
                           Field(discriminator="type")]


class RunConfig(_Strict):
    version: Literal[1]
    topology: Path = Field(description="fleet topology YAML (docs/topology.md)")
    policy: Path | None = Field(None, description="policy YAML merged over the default")
    mode: Literal["dry_run", "enforce"] = Field("dry_run", description="enforce actuates; anything else only records")
    tick_s: float = Field(15.0, gt=0, description="controller period; should match the scrape interval")
    time_scale: float = Field(1.0, gt=0, description="controller seconds per wall second (only for a twin "
                                                     "served with --speed; 1 for real clusters)")
    ledger: Path = Field(Path("seamguard.db"), description="SQLite ledger")
    events_out: Path | None = Field(None, description="also write replay-format JSON lines here")
    max_ticks: int | None = Field(None, ge=1, description="stop after this many ticks (tests)")
    prometheus: PromConfig
    actuators: list[ActuatorConfig] = Field(default_factory=list)


def _resolve(base: Path, p: Path | None) -> Path | None:
    return None if p is None or p.is_absolute() else base / p


def load_run_config(path: str | Path) -> RunConfig:
    p = Path(path)
    data = read_yaml(p, "config", ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(str(p), "run config", err)) from None
    # Relative paths are relative to the config file.
    base = p.parent
    upd: dict[str, Any] = {}
    for name in ("topology", "policy", "ledger", "events_out"):
        r = _resolve(base, getattr(cfg, name))
        if r is not None:
            upd[name] = r
    acts = []
    for a in cfg.actuators:
        if isinstance(a, LogActuatorConfig):
            a = a.model_copy(update={"path": _resolve(base, a.path) or a.path})
        acts.append(a)
    upd["actuators"] = acts
    return cfg.model_copy(update=upd)


def build_actuators(cfg: RunConfig) -> list:
    from seamguard.act.log import LogActuator

    out: list = []
    for a in cfg.actuators:
        if isinstance(a, LogActuatorConfig):
            out.append(LogActuator(a.path))
        elif isinstance(a, SlurmActuatorConfig):
            from seamguard.act.slurm import SlurmActuator

            out.append(SlurmActuator(SlurmConfig(**a.model_dump(exclude={"type"}))))
        elif isinstance(a, RuntimeActuatorConfig):
            from seamguard.act.runtime import RuntimeHintActuator

            out.append(RuntimeHintActuator(a.hint_dirs))
        else:
            from seamguard.act.kubernetes import KubernetesActuator, KubernetesConfig

            out.append(KubernetesActuator(KubernetesConfig(**a.model_dump(exclude={"type"}))))
    return out


class LiveRunner:
    """Owns the source, controller and ledger of one `seamguard run`."""

    def __init__(self, cfg: RunConfig, stop: threading.Event | None = None) -> None:
        from seamguard.control import Controller
        from seamguard.decide.policy import default_policy, load_policy
        from seamguard.fleet.topology import load_topology
        from seamguard.ledger.sqlite import Ledger
        from seamguard.observe.prometheus import PrometheusSource

        self.cfg = cfg
        self.stop = stop or threading.Event()
        self.fleet = load_topology(cfg.topology)
        policy = load_policy(cfg.policy) if cfg.policy else default_policy()
        self.source = PrometheusSource(self.fleet, cfg.prometheus)
        self.ledger = Ledger(cfg.ledger)
        self.controller = Controller(self.fleet, policy, build_actuators(cfg), self.ledger, tick_s=cfg.tick_s,
                                     mode=cfg.mode)
        self.events = EventStream()
        self.ticks = 0

    def run(self) -> int:
        period = self.cfg.tick_s / self.cfg.time_scale
        wall0 = time.time()
        out = open(self.cfg.events_out, "a", encoding="utf-8") if self.cfg.events_out else None
        log.info("seamguard run: %s mode, tick %.3gs (%.3gs wall), %d GPUs, actuators: %s", self.cfg.mode,
                 self.cfg.tick_s, period, len(self.fleet.gpu_names),
                 ", ".join(a.name for a in self.controller.actuators) or "none")
        try:
            k = 0
            while not self.stop.is_set():
                wall_q = wall0 + k * period
                now = time.time()
                if wall_q > now and self.stop.wait(wall_q - now):
                    break
                if time.time() - wall_q > period:  # fell behind: skip to the present, keep the grid
                    k = int((time.time() - wall0) // period)
                    wall_q = wall0 + k * period
                t_frame = wall0 + (wall_q - wall0) * self.cfg.time_scale
                frame = self.source.frame_at(wall_q, t_frame)
                rep = self.controller.tick(frame)
                self.ticks += 1
                if rep.error:
                    log.error("tick %d failed: %s", rep.tick, rep.error)
                if out is not None:
                    extra = {"wall": wall_q, **({"flags": list(frame.flags)} if frame.flags else {})}
                    for ev in self.events.events(rep, extra):
                        out.write(dumps(ev) + "\n")
                    out.flush()
                k += 1
                if self.cfg.max_ticks is not None and self.ticks >= self.cfg.max_ticks:
                    break
        finally:
            if out is not None:
                out.close()
            self.source.close()
            self.ledger.close()
            log.info("seamguard run: stopped after %d ticks; ledger closed", self.ticks)
        return self.ticks
