"""The detector's measured recall and delays, as the event twin's seamguard policy sees them.

Why this file exists: the seamguard policy must not be handed a perfect detector (every
degradation found, always after the same delay). ``benchmarks/detection.py`` measures,
per fault class, how many incidents the detector found (``recall``) and how long it took
(``median_delay_s``, ``p90_delay_s``); :func:`parse_detection_results` turns that
result document into a :class:`DetectionModel` the simulator samples once per event: a
miss with probability ``1 - recall`` of a class drawn by its share of the incidents,
else a delay from that class's distribution. Pure; reading the file is the caller's
(:func:`load_detection_results`).

The result gives two quantiles per class, not the delays themselves, so each class's
delay is drawn from the lognormal through its median and 90th percentile (a class whose
median is 0 — found at onset — is 0 up to its median and grows linearly to its p90).

Which detector classes stand for which twin event (the twin has fewer, coarser events):

* ``fail_slow_compute``: ``fail_slow_gpu``, ``power_brake``, ``thermal_interface`` and the
  held-out histories' ``pcie_downtrain``, ``hbm_heat``;
* ``fail_slow_comm``: ``fabric_latency``, ``fabric_congestion``, ``ib_symbol_errors``;
* ``cooling``: ``cooling_loop_flow``;
* ``precursor`` (evidence ahead of a hard node failure): ``pcie_replay``, ``ecc_sbe``,
  ``nvlink_errors``, ``row_remap`` and the held-out ``host_memory_ue`` and ``nvswitch_sxid``
  (non-fatal SXids climbing ahead of a fatal one that stops the NVLink domain's GPUs).

Two result layouts are read: ``current`` (one detector on one set of histories) and
``arms`` (per set of histories, each detector's block): there the ``heldout`` arm's
``seamguard`` block, histories the detector was not developed on. A class the result
did not score (no incidents) is left out of its event kind's mix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

__all__ = ["ClassDetection", "DetectionModel", "TWIN_EVENT_CLASSES", "parse_detection_results",
           "load_detection_results"]

#: Detector fault classes (benchmarks/detection.py) behind each twin event kind.
TWIN_EVENT_CLASSES: dict[str, tuple[str, ...]] = {
    "fail_slow_compute": ("fail_slow_gpu", "power_brake", "thermal_interface", "pcie_downtrain",
                          "hbm_heat"),
    "fail_slow_comm": ("fabric_latency", "fabric_congestion", "ib_symbol_errors"),
    "cooling": ("cooling_loop_flow",),
    "precursor": ("pcie_replay", "ecc_sbe", "nvlink_errors", "row_remap", "host_memory_ue", "nvswitch_sxid"),
}

_Z90 = 1.2815515655446004   # standard normal 90th percentile


@dataclass(frozen=True)
class ClassDetection:
    """One detector class's measured figures."""

    name: str
    """Detector fault class."""
    incidents: int
    """Incidents of the class the detector was scored on."""
    recall: float
    """Share of them found."""
    median_delay_s: float
    """Median onset-to-detection delay of those found."""
    p90_delay_s: float
    """90th percentile of the same."""

    def delay_s(self, u: float, z: float) -> float:
        """The delay at uniform ``u`` / standard normal ``z`` (same draw, two forms)."""
        p50, p90 = self.median_delay_s, max(self.p90_delay_s, self.median_delay_s)
        if p50 <= 0.0:
            return p90 * max(u - 0.5, 0.0) / 0.4
        return p50 * math.exp(z * math.log(p90 / p50) / _Z90)


@dataclass(frozen=True)
class DetectionModel:
    """What the seamguard policy detects, per twin event kind, and its alarm precision."""

    source: str
    """Where the figures came from."""
    classes: dict[str, tuple[ClassDetection, ...]]
    """Per twin event kind (:data:`TWIN_EVENT_CLASSES`), the measured classes behind it."""
    precision: float
    """Share of the detector's alarms that were true (the result's overall precision)."""

    def recall(self, kind: str) -> float:
        """Incident-weighted recall of a twin event kind."""
        cs = self.classes[kind]
        return sum(c.recall * c.incidents for c in cs) / sum(c.incidents for c in cs)

    def sample_delay_s(self, kind: str, rng: np.random.Generator) -> float | None:
        """One detection of a ``kind`` event: its delay in seconds, or ``None`` (missed)."""
        cs = self.classes[kind]
        w = np.array([c.incidents for c in cs], dtype=float)
        c = cs[int(rng.choice(len(cs), p=w / w.sum()))] if len(cs) > 1 else cs[0]
        if rng.random() >= c.recall:
            return None
        z = float(rng.standard_normal())
        return c.delay_s(0.5 * (1.0 + math.erf(z / math.sqrt(2.0))), z)

    def at_recall_bound(self) -> DetectionModel:
        """Every class at the lower end of its recall's 95 % Wilson interval (a class
        scored on few incidents may miss more than it did)."""
        def lo(c: ClassDetection) -> float:
            n, p, z = c.incidents, c.recall, 1.959964
            centre = (p + z * z / (2 * n)) / (1 + z * z / n)
            half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
            return max(centre - half, 0.0)
        return replace(self, source=f"{self.source} (recall at its 95% lower bound)",
                       classes={k: tuple(replace(c, recall=lo(c)) for c in cs)
                                for k, cs in self.classes.items()})


def _num(d: Mapping[str, Any], key: str) -> float | None:
    """A finite number at ``key``, else None (NaN and infinities in a hand-edited file included)."""
    v = d.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _detector_block(data: Mapping[str, Any], source: str) -> tuple[Mapping[str, Any], str]:
    """The detector's figures in either layout (module docstring) and where they were."""
    arms = data.get("arms") if isinstance(data, Mapping) else None
    if isinstance(arms, Mapping) and arms:
        arm = "heldout" if "heldout" in arms else sorted(arms)[0]
        block = arms[arm].get("seamguard") if isinstance(arms[arm], Mapping) else None
        if isinstance(block, Mapping) and isinstance(block.get("per_class"), Mapping):
            return block, f"{source} (arm {arm})"
    cur = data.get("current") if isinstance(data, Mapping) else None
    if isinstance(cur, Mapping) and isinstance(cur.get("per_class"), Mapping):
        return cur, source
    raise ValueError(f"{source}: not a benchmarks/detection.py result "
                     "(no current.per_class or arms.<arm>.seamguard.per_class)")


def parse_detection_results(data: Mapping[str, Any], source: str) -> DetectionModel:
    """A :class:`DetectionModel` from a benchmarks/detection.py result; a one-line
    ``ValueError`` naming ``source`` and the field when something it needs is missing.
    Precision: per alarm (``precision_per_alarm``) where the result has it, else per
    flagged entity (``precision``)."""
    cur, source = _detector_block(data, source)
    per = cur["per_class"]
    overall = cur.get("overall") if isinstance(cur.get("overall"), Mapping) else {}
    precision = _num(overall, "precision_per_alarm")
    precision = precision if precision is not None else _num(overall, "precision")
    if precision is None or not 0.0 < precision <= 1.0:
        raise ValueError(f"{source}: overall precision must be in (0, 1], got {precision!r}")
    classes: dict[str, tuple[ClassDetection, ...]] = {}
    for kind, names in TWIN_EVENT_CLASSES.items():
        found = []
        for n in names:
            row = per.get(n)
            if not isinstance(row, Mapping):
                continue
            inc, rec = _num(row, "incidents"), _num(row, "recall")
            p50, p90 = _num(row, "median_delay_s"), _num(row, "p90_delay_s")
            if not inc:
                continue   # not scored in this result
            if rec is None or not 0.0 <= rec <= 1.0:
                raise ValueError(f"{source}: per_class.{n} needs a "
                                 f"recall in [0, 1], got {inc!r}, {rec!r}")
            if rec > 0 and (p50 is None or p90 is None or p50 < 0 or p90 < 0):
                raise ValueError(f"{source}: per_class.{n} needs median_delay_s and "
                                 f"p90_delay_s >= 0, got {p50!r}, {p90!r}")
            found.append(ClassDetection(n, int(inc), rec, p50 or 0.0, p90 or 0.0))
        if not found:
            raise ValueError(f"{source}: per_class scored none of {', '.join(names)} "
                             f"(needed for the twin's {kind} events)")
        classes[kind] = tuple(found)
    return DetectionModel(source=source, classes=classes, precision=precision)


def load_detection_results(path: Path | str) -> DetectionModel:
    """Read a detection result file (edge I/O) into a :class:`DetectionModel`."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read detection results {p}: {exc}") from exc
    return parse_detection_results(data, str(p))
