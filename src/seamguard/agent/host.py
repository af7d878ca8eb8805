"""Host pressure: PSI stall time, OOM kills and EDAC memory-controller errors.

Parsers are pure (file text in, numbers out); ``read_host`` does the reading, and a file
a kernel lacks (PSI needs 4.20+, EDAC a driver) is an empty result, not an error. The
exported names are node_exporter's (pressure, vmstat and edac collectors), so dashboards
built for it read the agent's series too (docs/sources.md, "Host pressure").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PSI_RESOURCES = ("cpu", "memory", "io")


def parse_psi(text: str) -> dict[str, float]:
    """``some``/``full`` stall totals in seconds from a /proc/pressure/<resource> file.

    "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234" -> {"some": 0.001234}; ``total`` is
    in microseconds. Lines that do not parse are skipped.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        for part in rest.split():
            k, _, v = part.partition("=")
            if k == "total" and v.isdigit():
                out[kind] = int(v) / 1e6
    return out


def parse_vmstat(text: str, keys: tuple[str, ...] = ("oom_kill",)) -> dict[str, float]:
    """Selected counters of /proc/vmstat ("oom_kill 3" lines); absent keys are absent."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k in keys and v.strip().isdigit():
            out[k] = float(v)
    return out


def read_edac(root: Path) -> dict[str, tuple[float, float]]:
    """{controller: (correctable, uncorrectable)} from <root>/mc<N>/{ce_count,ue_count}."""
    out: dict[str, tuple[float, float]] = {}
    if not root.is_dir():
        return out
    for mc in sorted(root.iterdir()):
        if not (mc.name.startswith("mc") and mc.name[2:].isdigit()):
            continue
        counts = []
        for f in ("ce_count", "ue_count"):
            try:
                counts.append(float(int((mc / f).read_text().strip())))
            except (OSError, ValueError):
                counts.append(float("nan"))
        out[mc.name[2:]] = (counts[0], counts[1])
    return out


@dataclass
class HostReading:
    psi: dict[str, dict[str, float]] = field(default_factory=dict)  # resource -> {some, full}
    vmstat: dict[str, float] = field(default_factory=dict)
    edac: dict[str, tuple[float, float]] = field(default_factory=dict)


def _text(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None


def read_host(proc_root: Path, edac_root: Path) -> HostReading:
    r = HostReading()
    for res in PSI_RESOURCES:
        t = _text(proc_root / "pressure" / res)
        if t is not None:
            r.psi[res] = parse_psi(t)
    t = _text(proc_root / "vmstat")
    if t is not None:
        r.vmstat = parse_vmstat(t)
    r.edac = read_edac(edac_root)
    return r
