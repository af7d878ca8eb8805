"""Render Frames as Prometheus text exposition or OpenMetrics (with timestamps).

A thin renderer of a snapshot, like client_python's exposition: it takes a Frame and
precomputed label strings per entity and never looks inside whatever produced the
Frame. `twin serve` uses it for `/metrics`; tests and benchmarks use the OpenMetrics
form to backfill a TSDB with `promtool tsdb create-blocks-from openmetrics`.
NaN values are not written: an entity that does not report has no sample, exactly as
an exporter behaves when a GPU falls off the bus.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame
from seamguard.observe.prommap import Mapping, entity_labels
from seamguard.observe.signals import SIGNALS


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_strings(fleet: Fleet, mapping: Mapping | None = None) -> dict[Kind, list[str]]:
    """``{k="v",...}`` per entity of each kind, built once per fleet."""
    out: dict[Kind, list[str]] = {}
    for kind in {s.kind for s in SIGNALS}:
        out[kind] = ["{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labs.items()) + "}"
                     for labs in entity_labels(fleet, kind, mapping)]
    return out


def _fmt(v: float) -> str:
    return repr(float(v))  # shortest round-trip representation


def render_text(frame: Frame, labels: dict[Kind, list[str]], extra: Iterable[str] = ()) -> str:
    """Prometheus text format 0.0.4 of one Frame (no timestamps: the scrape time counts)."""
    parts: list[str] = []
    for sig in SIGNALS:
        arr = frame.values.get(sig.name)
        if arr is None:
            continue
        labs = labels[sig.kind]
        parts.append(f"# HELP {sig.name} {sig.help or sig.name} ({sig.unit})")
        parts.append(f"# TYPE {sig.name} {'counter' if sig.counter and sig.name.endswith('_total') else 'gauge'}")
        ok = np.flatnonzero(np.isfinite(arr))
        vals = arr[ok].tolist()
        name = sig.name
        parts.extend([f"{name}{labs[i]} {_fmt(v)}" for i, v in zip(ok.tolist(), vals)])
    parts.extend(extra)
    return "\n".join(parts) + "\n"


def render_openmetrics(frames: list[tuple[float, Frame]], labels: dict[Kind, list[str]]) -> Iterable[str]:
    """OpenMetrics text of many frames, each stamped with its Unix time; ends with '# EOF'.

    Samples of one family must be contiguous, so the output is grouped by signal and,
    inside it, by time (every series' timestamps increase).
    """
    for sig in SIGNALS:
        if not any(sig.name in f.values for _, f in frames):
            continue
        labs = labels[sig.kind]
        yield f"# HELP {sig.name} {sig.help or sig.name} ({sig.unit})\n"
        yield f"# TYPE {sig.name} gauge\n"  # counters kept as raw values; OpenMetrics counters need _total
        for t, f in frames:
            arr = f.values.get(sig.name)
            if arr is None:
                continue
            ok = np.flatnonzero(np.isfinite(arr))
            ts = f"{t:.3f}"
            yield "".join(f"{sig.name}{labs[i]} {_fmt(v)} {ts}\n" for i, v in zip(ok.tolist(), arr[ok].tolist()))
    yield "# EOF\n"
