"""Every file seamguard reads, read here: run config, topology, policy.

The run config (docs/prometheus-slurm.md) is one model for `seamguard run --config`,
`seamguard serve --config` and `seamguard replay --config`: the same file means the
same thing to each. Errors name the file, the field and what was expected; a file is
read whole (bounded in size), decoded as UTF-8 and parsed with alias expansion bounded
before anything is built from it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seamguard.act.slurm import SlurmConfig
from seamguard.app.slurm_placement import SlurmPlacementConfig, parse_deadline
from seamguard.config import MAX_CONFIG_BYTES, format_validation_error, parse_yaml
from seamguard.decide.policy import Policy, PolicyError, default_policy, parse_policy
from seamguard.fleet.model import Fleet
from seamguard.fleet.topology import TopologyError, parse_topology
from seamguard.observe.prometheus import PromConfig


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
    evict_pods: bool = Field(True, description="a quarantine also evicts the node's pods (Eviction API)")
    eviction_skip_namespaces: tuple[str, ...] = ("kube-system",)
    eviction_grace_s: int | None = Field(None, ge=0)


class RuntimeActuatorConfig(_Strict):
    type: Literal["runtime"]
    hint_dirs: dict[str, Path] = Field(description="job name -> the --hint-dir its `seamguard launch` polls")
    checkpoint_dirs: dict[str, dict[str, Path]] = Field(
        default_factory=dict, description="job name -> {storage path name: checkpoint directory on it}, the job's "
                                          "own --checkpoint-dir first: avoid_storage moves its checkpoints along")
    rail_names: dict[str, str] = Field(
        default_factory=dict, description="NIC name (<node>/<nic>) -> the rail interface a job's --rails names it "
                                          "by; default: the NIC's own name")
    avoid_rails: bool = Field(True, description="avoid_link of a NIC's link -> its jobs stay off that rail")
    degraded: bool = Field(True, description="a job held at a shorter checkpoint interval also runs degraded")
    hint_key_files: dict[str, Path] = Field(
        default_factory=dict, description="job name -> its hint key file (`seamguard launch --hint-key-file`); "
                                          "default: <hint dir>/.hint-key, which the job's launcher writes")


ActuatorConfig = Annotated[LogActuatorConfig | SlurmActuatorConfig | KubernetesActuatorConfig | RuntimeActuatorConfig,
                           Field(discriminator="type")]


class JobConfig(_Strict):
    """A topology job's schedule (decide/slip.py): when it must finish and how much work it has."""

    deadline: float | None = Field(None, description="ISO 8601 time with a timezone by which the job should "
                                                     "finish (read as Unix seconds)")
    total_steps: int | None = Field(None, gt=0, description="steps the job runs in all (the runtime's "
                                                            "seamguard_job_step says how many are done)")
    step_s: float | None = Field(None, gt=0, allow_inf_nan=False,
                                 description="wall time of one step, s, until the runtime reports its own")


class HaConfig(_Strict):
    """``ha:``: run this controller as one of several replicas; one leads by an etcd lease
    (app/leader.py, docs/ha.md). The replicas share the ledger (``ledger: postgresql://...``)."""

    etcd: list[str] = Field(min_length=1, description="etcd client endpoints, host:port")
    lease_s: int = Field(3, ge=2, le=300, description="the leader's lease, s (etcd's minimum is 2): a killed "
                                                      "leader's replacement starts acting about this long after")
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@-]+$",
                      description="this replica's name (the lease key's value; who led, in the ledger)")
    key: str = Field("/seamguard/controller/leader", min_length=1,
                     description="the etcd key the replicas campaign for (one per controlled fleet)")


PostgresUrl = Annotated[str, Field(pattern=r"^postgres(ql)?://")]


class RunConfig(_Strict):
    version: Literal[1]
    topology: Path = Field(description="fleet topology YAML (docs/topology.md)")
    policy: Path | None = Field(None, description="policy YAML merged over the default")
    mode: Literal["dry_run", "enforce"] = Field("dry_run", description="enforce actuates; anything else only records")
    tick_s: float = Field(15.0, gt=0, description="controller period; should match the scrape interval")
    time_scale: float = Field(1.0, gt=0, description="controller seconds per wall second (only for a twin "
                                                     "served with --speed; 1 for real clusters)")
    ledger: PostgresUrl | Path = Field(Path("seamguard.db"), description="SQLite ledger file, or a "
                                       "postgresql:// URL (psycopg 3) that HA replicas share")
    ha: HaConfig | None = Field(None, description="run as one of several replicas, led by an etcd lease "
                                                  "(docs/ha.md); absent: this one controller acts alone")
    events_out: Path | None = Field(None, description="also write replay-format JSON lines here")
    max_ticks: int | None = Field(None, ge=1, description="stop after this many ticks (tests)")
    prometheus: PromConfig
    actuators: list[ActuatorConfig] = Field(default_factory=list)
    slurm_placement: SlurmPlacementConfig | None = Field(
        None, description="read where the topology's jobs run, and their criticality, from squeue")
    jobs: dict[str, JobConfig] = Field(
        default_factory=dict, description="topology job name -> its deadline and work (schedule-slip risk)")


def read_yaml(path: str | Path, what: str, error: type[Exception] = ValueError) -> Any:
    """Read and parse a YAML file; a missing, huge, non-UTF-8 or malformed file raises ``error``."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror or e}") from None
    return parse_yaml(data, str(p), what, error)


def load_topology(path: str | Path) -> Fleet:
    """Read and validate a topology file."""
    return parse_topology(read_yaml(path, "topology file", TopologyError), str(path))


def load_policy(path: str | Path | None) -> Policy:
    """The policy file merged over the default, or the default when ``path`` is None."""
    if path is None:
        return default_policy()
    return parse_policy(read_yaml(path, "policy file", PolicyError), str(path))


def _resolve(base: Path, p: Path | str | None) -> Path | None:
    """A relative path taken from the config's folder (a URL is not a path: None)."""
    return None if p is None or isinstance(p, str) or p.is_absolute() else base / p


def load_run_config(path: str | Path) -> RunConfig:
    p = Path(path)
    data = read_yaml(p, "config", ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    data = _deadlines_as_unix_s(data, p)
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


def _deadlines_as_unix_s(data: dict, p: Path) -> dict:
    """``jobs.<name>.deadline`` (an ISO 8601 string, or the datetime YAML made of one) as Unix seconds;
    a value without a timezone or not a time is a one-line ConfigError naming the job and field."""
    jobs = data.get("jobs")
    if not isinstance(jobs, dict):
        return data
    out = {}
    for name, job in jobs.items():
        if isinstance(job, dict) and job.get("deadline") is not None:
            where, v = f"{p}: jobs.{name}.deadline", job["deadline"]
            if isinstance(v, datetime):
                if v.tzinfo is None:
                    raise ConfigError(f"{where}: {v.isoformat()!r} has no timezone (add Z or +hh:mm)")
                job = {**job, "deadline": v.timestamp()}
            elif isinstance(v, str):
                try:
                    job = {**job, "deadline": parse_deadline(v, where)}
                except ValueError as e:
                    raise ConfigError(str(e)) from None
            else:
                raise ConfigError(f"{where}: {v!r} is not an ISO 8601 time with a timezone")
        out[name] = job
    return {**data, "jobs": out}


def with_job_schedule(fleet: Fleet, jobs: dict[str, JobConfig], where: str = "run config") -> Fleet:
    """The topology with the run config's per-job deadline, total steps and step time (NaN where not given);
    a job the topology does not have is a ConfigError naming it."""
    if not jobs:
        return fleet
    index = {n: j for j, n in enumerate(fleet.job_names)}
    n = len(fleet.job_names)
    arrays = {k: np.full(n, np.nan) for k in ("deadline", "total_steps", "step_s")}
    for name, job in jobs.items():
        if name not in index:
            raise ConfigError(f"{where}: jobs.{name}: no job of that name in the topology")
        for k, arr in arrays.items():
            v = getattr(job, k)
            arr[index[name]] = np.nan if v is None else float(v)
    return replace(fleet, job_deadline_s=arrays["deadline"], job_total_steps=arrays["total_steps"],
                   job_step_s=arrays["step_s"], _index={})


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

            out.append(RuntimeHintActuator(a.hint_dirs, a.checkpoint_dirs, a.rail_names, a.avoid_rails, a.degraded,
                                           a.hint_key_files))
        else:
            from seamguard.act.kubernetes import KubernetesActuator, KubernetesConfig

            out.append(KubernetesActuator(KubernetesConfig(**a.model_dump(exclude={"type"}))))
    return out
