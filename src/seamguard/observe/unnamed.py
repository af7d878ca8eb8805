"""Series nobody named: every other numeric series an exporter reports for an entity.

The signal registry (observe/signals.py) names the series seamguard has a channel for.
An exporter reports many more (dcgm-exporter alone has dozens of fields a deployment may
enable); a fault that shows only in one of them would otherwise go unseen. A source that
can list them fills a :class:`SeriesBlock` per entity kind: one matrix, entities x series,
carried on the Frame next to the named signals; assess/unnamed.py judges it.

Counters stay raw here (assess takes rates, with resets), as for named signals. Which
series are taken is bounded by :class:`UnnamedConfig` (a series cap per kind and an
allow/deny list of name patterns), so memory and the per-tick cost stay bounded whatever
an exporter grows into (docs/evidence.md, "Series nobody named").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from seamguard.fleet.model import KIND_BY_LABEL, Kind
from seamguard.observe.signals import Domain, Signal, signals_for

# Exporter bookkeeping and series that are labels, clocks or identities, not measurements.
# Matched ignoring case (dcgm-exporter writes DCGM field names in upper case).
DEFAULT_DENY = (
    r"scrape_.*", r"up", r"go_.*", r"process_.*", r"promhttp_.*", r".*_info", r".*_created", r".*_version",
    r".*_timestamp(_seconds)?", r".*_boot_time_seconds", r".*_bucket", r".*_count", r".*_sum",
)
# Units of a named signal that are codes, not measurements: a level of these means nothing.
_CODE_UNITS = ("bitmask", "xid", "state", "bool", "generation", "lanes")
# Prometheus's naming convention marks counters (the OpenMetrics spec: a counter's samples end
# in _total); dcgm-exporter writes DCGM field names in upper case. A series so named is judged
# on its rate, as is one whose exporter declares it a counter.
COUNTER_SUFFIXES = ("_total",)


# One query per exporter: dcgm-exporter's fields per GPU, node_exporter's infiniband collector per port.
DEFAULT_EXPORTERS = {"gpu": "DCGM_.+", "nic": "node_infiniband_.+"}


class UnnamedConfig(BaseModel):
    """Which unnamed series a source takes (the `unnamed:` section of a Prometheus source)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="fetch and judge series nobody named")
    exporters: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_EXPORTERS),
                                      description="entity kind -> regex of the series names its exporter writes "
                                                  "(one query per kind and tick)")
    max_series: int = Field(64, ge=1, le=1024, description="most series kept per entity kind (the first by name)")
    allow: tuple[str, ...] = Field((r".*",), description="regexes: a series name must match one")
    deny: tuple[str, ...] = Field(DEFAULT_DENY, description="regexes: a series name matching one is dropped")
    counters: tuple[str, ...] = Field((), description="regexes: series read as counters besides the *_total ones")

    @field_validator("exporters")
    @classmethod
    def _kinds(cls, v: dict[str, str]) -> dict[str, str]:
        for k, p in v.items():
            if k not in KIND_BY_LABEL or KIND_BY_LABEL[k] not in (Kind.GPU, Kind.NIC):
                raise ValueError(f"unnamed.exporters: kind {k!r} is not one a node's exporters report per "
                                 "entity (gpu, nic)")
            cls._compiles((p,))
        return v

    @field_validator("allow", "deny", "counters")
    @classmethod
    def _compiles(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"bad series pattern {p!r}: {e}") from None
        return v

    def keeps(self, name: str) -> bool:
        return (any(re.fullmatch(p, name, re.I) for p in self.allow)
                and not any(re.fullmatch(p, name, re.I) for p in self.deny))

    def is_counter(self, name: str) -> bool:
        return name.lower().endswith(COUNTER_SUFFIXES) or any(re.fullmatch(p, name) for p in self.counters)


@dataclass(frozen=True, eq=False)
class SeriesBlock:
    """Every kept series of one entity kind this tick: ``values[i, s]`` is entity ``i``'s
    value of series ``names[s]`` (NaN: not reported); ``counter[s]`` marks counters."""

    kind: Kind
    names: tuple[str, ...]
    counter: np.ndarray  # bool [S]
    values: np.ndarray  # float64 [N, S]

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[1] != len(self.names) or self.counter.shape != (len(self.names),):
            raise ValueError(f"series block of {self.kind.label}: values {self.values.shape} do not fit "
                             f"{len(self.names)} names and {self.counter.shape} counter flags")


def block_from_columns(kind: Kind, n: int, columns: dict[str, np.ndarray], cfg: UnnamedConfig,
                       counters: frozenset[str] = frozenset()) -> SeriesBlock:
    """A block from ``{series name: float array per entity}``: the allow/deny list and the
    cap applied (names sorted, the first ``max_series`` kept). Counters are those the exporter
    declares (``counters``: its TYPE metadata) and those named as counters (``*_total``)."""
    names = tuple(sorted(k for k in columns if cfg.keeps(k)))[:cfg.max_series]
    values = np.full((n, len(names)), np.nan)
    for s, name in enumerate(names):
        a = np.asarray(columns[name], dtype=float)
        if a.shape != (n,):
            raise ValueError(f"series {name!r}: expected {n} {kind.label} values, got shape {a.shape}")
        values[:, s] = a
    return SeriesBlock(kind, names, np.array([x in counters or cfg.is_counter(x) for x in names], dtype=bool), values)


def unjudged(kind: Kind) -> list[Signal]:
    """The named signals of ``kind`` that no channel judges: measurements read as context only
    (direction 0: power, utilisation, tensor activity). They join the block; every other named
    signal is judged by its own channel, whose thresholds have their documented reasons, and a
    job's runtime series come and go with the job, not with the entity's telemetry."""
    return [s for s in signals_for(kind) if s.direction == 0 and s.domain != Domain.RUNTIME
            and s.unit not in _CODE_UNITS]


def selector(name_re: str, sub_label: str | None, exclude: list[str], extra: str = "") -> str:
    """The PromQL selector of one exporter's series: its names, an entity sub-label present
    (a GPU index, an IB device), the series already fetched as named signals left out."""
    m = [f'__name__=~"{name_re}"']
    if exclude:
        m.append(f'__name__!~"{"|".join(re.escape(x) for x in sorted(exclude))}"')
    if sub_label:
        m.append(f'{sub_label}!=""')
    if extra:
        m.append(extra)
    return "{" + ", ".join(m) + "}"
