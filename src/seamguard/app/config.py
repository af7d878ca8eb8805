"""Every file seamguard reads, read here: run config, topology, policy.

The run config (docs/prometheus-slurm.md) is one model for `seamguard run --config`,
`seamguard serve --config` and `seamguard replay --config`: the same file means the
same thing to each. Errors name the file, the field and what was expected; a file is
read whole (bounded in size), decoded as UTF-8 and parsed with alias expansion bounded
before anything is built from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seamguard.act.slurm import SlurmConfig
from seamguard.app.slurm_placement import SlurmPlacementConfig
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
    slurm_placement: SlurmPlacementConfig | None = Field(
        None, description="read where the topology's jobs run, and their criticality, from squeue")


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

            out.append(RuntimeHintActuator(a.hint_dirs, a.checkpoint_dirs, a.rail_names, a.avoid_rails, a.degraded))
        else:
            from seamguard.act.kubernetes import KubernetesActuator, KubernetesConfig

            out.append(KubernetesActuator(KubernetesConfig(**a.model_dump(exclude={"type"}))))
    return out
