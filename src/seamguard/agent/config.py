"""The agent's YAML config (docs/agent.md): one typed model, validated whole before a port is bound.

Pure: text in, an ``AgentConfig`` or an ``AgentConfigError`` naming the file and the field
out. Reading the file is the shell's job (``seamguard.app.agent_cli``). Every probe has an
``enabled`` switch, a timeout and a bound on how much work one round may do.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from seamguard.config import format_validation_error, parse_yaml

MAX_PEERS_PER_RAIL = 64
MAX_STORAGE_PATHS = 16


def _ip(v: str) -> str:
    return str(ipaddress.ip_address(v))  # ValueError: "... does not appear to be an IPv4 or IPv6 address"


Address = Annotated[str, AfterValidator(_ip)]


def _net(v: str) -> str:
    return str(ipaddress.ip_network(v, strict=False))  # ValueError names what is not a network


Network = Annotated[str, AfterValidator(_net)]


class AgentConfigError(ValueError):
    """An agent config that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Strict):
    host: str = Field("0.0.0.0", description="Address /metrics listens on.")
    port: int = Field(9475, ge=0, le=65535, description="Port of /metrics (0: any free port).")


class GpuConfig(_Strict):
    enabled: bool = Field(True, description="Read GPUs through NVML when a driver is present.")


class KernelLogConfig(_Strict):
    enabled: bool = True
    source: Literal["kmsg", "journal"] = Field("kmsg", description="/dev/kmsg (needs root) or `journalctl -k -f`.")
    path: Path = Field(Path("/dev/kmsg"), description="The kmsg device (a test points it at a FIFO or file).")
    journalctl: str = Field("journalctl", description="journalctl binary for source: journal.")
    max_lines_per_read: int = Field(10_000, ge=1, le=1_000_000,
                                    description="Lines read per scrape at most; the rest wait for the next.")
    max_series: int = Field(512, ge=1, le=100_000,
                            description="Distinct (bus id, code) label sets kept; later ones count under 'other'.")
    gpus: dict[str, int] = Field(default_factory=dict,
                                 description="PCI bus id -> GPU index, for the DCGM_FI_DEV_XID_ERRORS gauge "
                                             "(filled from NVML when a driver is present).")
    dcgm_xid_gauge: bool = Field(True, description="Export DCGM_FI_DEV_XID_ERRORS{Hostname,gpu} for mapped GPUs; "
                                                   "turn off where dcgm-exporter runs.")


class NicConfig(_Strict):
    enabled: bool = True
    net_root: Path = Path("/sys/class/net")
    ib_root: Path = Path("/sys/class/infiniband")
    interfaces: list[str] | None = Field(None, description="Netdevs exported as node_network_* (default: all but lo).")
    devices: dict[str, str] = Field(default_factory=dict,
                                    description="Fleet NIC device name -> IB device or netdev, exported as "
                                                "node_infiniband_*{device} (RoCE/Ethernet rails).")


class StoragePath(_Strict):
    name: str = Field(min_length=1, description="The storage entity's name in the topology (label `storage`).")
    path: Path = Field(description="A directory on the checkpoint file system; a temp file is written there.")


class StorageConfig(_Strict):
    enabled: bool = True
    paths: list[StoragePath] = Field(default_factory=list, max_length=MAX_STORAGE_PATHS)
    interval_s: float = Field(15.0, gt=0, le=3600)
    timeout_s: float = Field(10.0, gt=0, le=600, description="A probe slower than this counts as failed.")
    size_bytes: int = Field(4096, ge=1, le=16 * 1024 * 1024)
    window: int = Field(64, ge=1, le=10_000, description="Recent write probes the p99 gauge is taken over.")


class Rail(_Strict):
    nic: str = Field(min_length=1, description="This node's NIC on the rail, fleet name ('node-0/mlx5_0').")
    address: Address = Field(description="Source address of probes on this rail (an address of that NIC).")
    rail: int = Field(ge=0)
    link: str | None = Field(None, description="The NIC's link in the topology ('node-0/mlx5_0~leaf-0'): "
                                               "exported as seamguard_fabric_link_latency_us{link}.")


class Peer(_Strict):
    nic: str = Field(min_length=1, description="Peer NIC, fleet name.")
    address: Address
    rail: int = Field(ge=0)
    port: int | None = Field(None, ge=1, le=65535, description="Peer's echo port (default: fabric.port).")


class FabricConfig(_Strict):
    enabled: bool = True
    port: int = Field(9476, ge=0, le=65535, description="Echo responder port (0: any free port).")
    listen: str = Field("0.0.0.0", description="Address the echo responder binds.")
    accept_from: list[Network] = Field(
        default_factory=list, max_length=4096,
        description="Addresses or networks ('10.1.0.0/16') the echo responder answers besides the peers' "
                    "addresses: nodes that probe this one without this one probing them. Anyone else is "
                    "closed at accept.")
    rails: list[Rail] = Field(default_factory=list)
    peers: list[Peer] = Field(default_factory=list)
    interval_s: float = Field(5.0, gt=0, le=3600, description="Seconds between probe rounds.")
    timeout_s: float = Field(1.0, gt=0, le=60, description="A probe unanswered this long counts as lost.")
    payload_bytes: int = Field(64, ge=1, le=65_536)

    @model_validator(mode="after")
    def _bounded(self) -> FabricConfig:
        rails = {r.rail for r in self.rails}
        for p in self.peers:
            if p.port is None and self.port == 0:
                raise ValueError(f"peer {p.nic} needs a port: fabric.port is 0 (any free port)")
            if p.rail not in rails:
                raise ValueError(f"peer {p.nic} is on rail {p.rail}, which no entry of `rails` names")
        for rail in rails:
            n = sum(p.rail == rail for p in self.peers)
            if n > MAX_PEERS_PER_RAIL:
                raise ValueError(f"rail {rail} has {n} peers; at most {MAX_PEERS_PER_RAIL} (probe a sample)")
        return self


class HostConfig(_Strict):
    enabled: bool = True
    proc_root: Path = Path("/proc")
    edac_root: Path = Path("/sys/devices/system/edac/mc")


class AgentConfig(_Strict):
    version: Literal[1]
    node: str = Field(min_length=1, description="This node's name in the topology (label `node`, `Hostname`).")
    listen: Listen = Field(default_factory=Listen)
    gpus: GpuConfig = Field(default_factory=GpuConfig)
    kernel_log: KernelLogConfig = Field(default_factory=KernelLogConfig)
    nics: NicConfig = Field(default_factory=NicConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
    host: HostConfig = Field(default_factory=HostConfig)


def parse_agent_config(text: str | bytes, source: str) -> AgentConfig:
    """Validate the whole file; the error is one line: ``<file>: <field>: <problem>``."""
    raw = parse_yaml(text, source, "agent config", AgentConfigError)
    if not isinstance(raw, dict):
        raise AgentConfigError(f"{source}: an agent config is a mapping with `version: 1` and `node`")
    try:
        return AgentConfig.model_validate(raw)
    except ValidationError as e:
        # One line: the first problem (the full list would be several lines).
        first = format_validation_error(source, "agent config", e).splitlines()[1].strip()
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise AgentConfigError(f"{source}: {first}{more}") from None
