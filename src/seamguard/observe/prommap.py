"""How Prometheus series map onto fleet entities: the configurable label mapping.

Shared by the Prometheus source (series -> entity index) and the exposition renderer
(entity -> labels, for `twin serve` and backfills), so both directions follow one
documented table (docs/prometheus-slurm.md). Pure data and string work, no I/O.

Defaults follow the exporters operators run (docs/sources.md §1): dcgm-exporter
names the host ``Hostname`` (older releases) or ``hostname`` (newer) and the GPU
``gpu="0"``; node_exporter's infiniband collector labels ``{device,port}`` and the node
comes from ``instance`` (``host:9100``) or a relabelled ``node`` label. Facilities,
storage, fabric probes and runtime series use seamguard's own documented labels; the
node agent's host series name their node with `node` (node_exporter's with `instance`),
and a signal that aggregates an exporter's series has its default PromQL in the registry
(``Signal.query``: per-controller EDAC counts summed per node, kernel-log XIDs joined
onto their GPU by PCI address).
"""

from __future__ import annotations

import zlib

from pydantic import BaseModel, ConfigDict, Field, field_validator

from seamguard.fleet.model import KIND_BY_LABEL, Fleet, Kind
from seamguard.observe.signals import REGISTRY, SIGNALS, default_query


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EntityKey(_Strict):
    """How to name one entity kind from a series' labels."""

    labels: list[str] = Field(min_length=1, description="label(s) carrying the primary name; first present wins")
    strip_port: bool = Field(False, description="drop a ':port' suffix (instance labels)")
    strip_domain: bool = Field(False, description="drop everything after the first '.' (FQDN hosts)")
    sub_label: str | None = Field(None, description="second label (GPU index, IB device)")
    template: str = Field("{name}", description="entity name from {name} and {sub}")

    def entity_name(self, name: str, sub: str | None) -> str:
        if self.strip_port and ":" in name:
            name = name.rsplit(":", 1)[0]
        if self.strip_domain and "." in name:
            name = name.split(".", 1)[0]
        return self.template.format(name=name, sub=sub if sub is not None else "")


def _default_keys() -> dict[str, EntityKey]:
    return {
        "gpu": EntityKey(labels=["Hostname", "hostname"], sub_label="gpu", template="{name}/gpu{sub}",
                         strip_domain=True),
        "nic": EntityKey(labels=["node", "instance"], strip_port=True, strip_domain=True, sub_label="device",
                         template="{name}/{sub}"),
        # node-level series: the agent's `node` label, node_exporter's `instance` (host:port)
        "node": EntityKey(labels=["node", "instance"], strip_port=True, strip_domain=True),
        "link": EntityKey(labels=["link"]),
        "cooling_loop": EntityKey(labels=["cooling_loop"]),
        "rack": EntityKey(labels=["rack"]),
        "storage": EntityKey(labels=["storage"]),
        # `job` is Prometheus' own scrape-job label, so seamguard's jobs use `job_name`.
        "job": EntityKey(labels=["job_name"]),
    }


class SignalQuery(_Strict):
    query: str | None = Field(None, description="PromQL; default: the signal name plus the global selector")
    enabled: bool = True


class Mapping(_Strict):
    """Entity keys per kind and the PromQL used per seamguard signal."""

    entities: dict[str, EntityKey] = Field(default_factory=_default_keys)
    signals: dict[str, SignalQuery] = Field(default_factory=dict)
    selector: str = Field("", description="label matchers added to default queries, e.g. 'cluster=\"a\"'")

    @field_validator("entities")
    @classmethod
    def _kinds(cls, v: dict[str, EntityKey]) -> dict[str, EntityKey]:
        for k in v:
            if k not in KIND_BY_LABEL:
                raise ValueError(f"unknown entity kind {k!r}; expected one of {', '.join(KIND_BY_LABEL)}")
        merged = _default_keys()
        merged.update(v)
        return merged

    @field_validator("signals")
    @classmethod
    def _signals(cls, v: dict[str, SignalQuery]) -> dict[str, SignalQuery]:
        for k in v:
            if k not in REGISTRY:
                raise ValueError(f"unknown signal {k!r}; known: {', '.join(REGISTRY)}")
        return v

    def key_for(self, kind: Kind) -> EntityKey:
        return self.entities[kind.label]

    def queries(self) -> dict[str, str]:
        """PromQL per enabled signal."""
        out = {}
        for sig in SIGNALS:
            sq = self.signals.get(sig.name)
            if sq is not None and not sq.enabled:
                continue
            out[sig.name] = sq.query if sq is not None and sq.query else default_query(sig, self.selector)
        return out


def entity_labels(fleet: Fleet, kind: Kind, mapping: Mapping | None = None) -> list[dict[str, str]]:
    """Labels an exporter would put on each entity of ``kind`` (the inverse of the mapping).

    Used to expose the twin's telemetry as real exporters would. The first label of
    each key carries the name; for GPUs and NICs the host and the sub label are split
    back out of the fleet's own naming.
    """
    m = mapping or Mapping()
    key = m.key_for(kind)
    first = key.labels[0]
    if kind == Kind.GPU:
        per_node: dict[int, int] = {}
        out = []
        for g, n in enumerate(fleet.gpu_node.tolist()):
            i = per_node.get(n, 0)
            per_node[n] = i + 1
            out.append({first: fleet.node_names[n], key.sub_label or "gpu": str(i), "device": f"nvidia{i}",
                        "UUID": f"GPU-{zlib.crc32(fleet.gpu_names[g].encode()):08x}"})
        return out
    if kind == Kind.NIC:
        out = []
        for i, name in enumerate(fleet.nic_names):
            node = fleet.node_names[int(fleet.nic_node[i])]
            dev = name[len(node) + 1:] if name.startswith(node + "/") else f"mlx5_{int(fleet.nic_rail[i])}"
            host = f"{node}:9100" if key.strip_port and first == "instance" else node
            out.append({first: host, key.sub_label or "device": dev, "port": "1"})
        return out
    extra: dict[str, list[str]] = {}
    if kind == Kind.RACK:
        extra["cooling_loop"] = [fleet.loop_names[i] for i in fleet.rack_loop.tolist()]
    names = fleet.names(kind)
    return [{first: n, **{k: v[i] for k, v in extra.items()}} for i, n in enumerate(names)]
