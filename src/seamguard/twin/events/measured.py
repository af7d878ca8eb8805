"""Recovery and checkpoint figures of the resilient runtime, measured, with their source.

Why this file exists: the ``seamguard`` policy must not run on constants picked to look
good. Its recovery times and stalls come from the runtime's benchmark results file
(``benchmarks/results/failover_training.json``, written by the runtime benchmarks); when
that file is absent or lacks a figure, the measured figures quoted in REFERENCE.md are
used instead, and :attr:`RuntimeFigures.source` says which. Reading the file is the
CLI's job (:func:`load_runtime_figures`); :func:`parse_runtime_figures` is pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["RuntimeFigures", "REFERENCE_FIGURES", "parse_runtime_figures",
           "load_runtime_figures", "DEFAULT_RESULTS_PATH"]

DEFAULT_RESULTS_PATH = Path("benchmarks/results/failover_training.json")


@dataclass(frozen=True)
class RuntimeFigures:
    """Measured runtime behaviour, on the (small) job the benchmark ran."""

    source: str
    """Where the figures came from (file path, REFERENCE.md, or both)."""
    live_resume_s: float
    """Stall of the surviving ranks when one rank is lost and a spare joins: kill to the
    first step committed after it, less that step's own compute (the twin charges the
    work redone at its own step time)."""
    relaunch_s: float
    """Time to get going again after every rank crashed at once: the runtime's measured
    restart from host memory (``seamguard_job_wide``), else torchrun's relaunch; less
    one step's compute, as for ``live_resume_s``."""
    steps_lost: float
    """Training steps lost by a node loss under the live-recovery runtime."""
    wall_ratio: float
    """Failure-free wall-clock under the runtime relative to plain training (>= 1)."""
    snapshot_stall_ratio: float
    """Stall a training step sees from an in-memory snapshot (the runtime's default,
    overlapped with the step) relative to a full save to storage."""
    restore_speedup: float
    """Speed of restoring from host memory relative to loading from storage."""
    measured_ranks: int
    """World size of the benchmark the figures were measured on."""
    save_s_per_gib: float = 0.667
    """Full save (torch.save + fsync) time per GiB on the measuring machine; the base the
    two ratios above are relative to (REFERENCE.md §4: 667 ms for 1 GiB)."""
    restore_s_per_gib: float = 0.051
    """Copy back from host memory per GiB on the measuring machine (REFERENCE.md §4: 51 ms
    for 1 GiB)."""
    relaunch_captured_s: float = 0.0
    """The same restart after every rank raised an uncaught exception and left the failed
    step's start in host memory (``seamguard_job_wide_exception``); 0 when not measured
    (then ``relaunch_s`` is used)."""
    blocking_stall_ratio: float = 0.0
    """The same for a snapshot that blocks the step (``--blocking-snapshots``): the
    pessimistic bound; 0 when not measured."""
    notes: tuple[str, ...] = ()
    """Which figure came from where."""


#: REFERENCE.md §4-5 measurements on this kind of machine (1 GiB fp32 state, 2 ranks):
#: torchft heartbeat-timeout stall 5.06 s; torchrun relaunch of a 2-rank job 3.46 s;
#: copy into preallocated buffers 51 ms vs torch.save+fsync 667 ms (7.6%); warm
#: torch.load 704 ms vs 51 ms copy back (13.8x, in line with Gemini's >13x).
REFERENCE_FIGURES = RuntimeFigures(
    source="REFERENCE.md (fallback: runtime results file absent)",
    live_resume_s=5.06, relaunch_s=3.46,
    steps_lost=1.0,   # the in-flight step is cancelled, never committed (torchft model)
    wall_ratio=1.0,   # no measured overhead in REFERENCE.md; the file's value replaces it
    snapshot_stall_ratio=51.0 / 667.0, restore_speedup=704.0 / 51.0, measured_ranks=2,
)


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key) if isinstance(d, Mapping) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse_runtime_figures(data: Mapping[str, Any], source: str) -> RuntimeFigures:
    """Build figures from a results document; missing figures fall back to REFERENCE.md.

    Accepted layout: per-system objects (``seamguard``, ``torchft``, ``torchrun``,
    ``seamguard_job_wide``: every rank killed at once, ``seamguard_job_wide_exception``:
    every rank raised) either at the top level or under
    ``systems``, each with ``resume_s_max``,
    ``steps_lost_max``, ``wall_ratio``; top-level ``snapshot_stall_ratio``,
    ``restore_speedup`` and optionally ``world_size`` and ``step_s`` (top level or under
    ``config``). A resume is measured from the kill to the first step committed after
    it, so it holds one step of compute, which the twin charges separately at its own
    step time (``steps_lost`` and the step in flight): with ``step_s`` known, the
    failure-free step time is taken off both resume figures.
    When the file carries the micro-benchmark (``micro_s`` with ``save_fsync_s`` and
    ``restore_ram_s``, ``config.micro_state_bytes``), the per-GiB save and restore rates
    come from it, so stall and restore are measured on one machine, not mixed with
    REFERENCE.md's.
    """
    systems = data.get("systems", data)
    if not isinstance(systems, Mapping):
        systems = {}
    ref = REFERENCE_FIGURES
    notes: list[str] = []
    used_file = False

    def pick(value: float | None, fallback: float, what: str) -> float:
        nonlocal used_file
        if value is None:
            notes.append(f"{what}: REFERENCE.md")
            return fallback
        used_file = True
        notes.append(f"{what}: {source}")
        return value

    sg = systems.get("seamguard", {})
    tr = systems.get("torchrun", {})
    jw = systems.get("seamguard_job_wide") or {}
    jx = systems.get("seamguard_job_wide_exception") or {}
    tops = data if isinstance(data, Mapping) else {}
    cfg = tops.get("config", {}) if isinstance(tops.get("config"), Mapping) else {}
    micro = tops.get("micro_s", {}) if isinstance(tops.get("micro_s"), Mapping) else {}
    gib = (_num(cfg, "micro_state_bytes") or 0.0) / 2**30
    save_rate = _num(tops, "save_s_per_gib")
    restore_rate = None
    if gib > 0:
        save_fsync, restore_ram = _num(micro, "save_fsync_s"), _num(micro, "restore_ram_s")
        if save_rate is None and save_fsync:
            save_rate = save_fsync / gib
        if restore_ram:
            restore_rate = restore_ram / gib
    save_s_per_gib = pick(save_rate, ref.save_s_per_gib, "save_s_per_gib")
    step_s = _num(tops, "step_s") or _num(cfg, "step_s") or 0.0

    def resume(value: float | None) -> float | None:
        return None if value is None else max(value - step_s, 0.0)

    captured = resume(_num(jx, "resume_s_max"))   # every rank raised; not always measured

    restore_speedup = max(1.0, pick(_num(tops, "restore_speedup"), ref.restore_speedup,
                                    "restore_speedup"))
    figs = RuntimeFigures(
        source="",
        live_resume_s=pick(resume(_num(sg, "resume_s_max")), ref.live_resume_s, "live_resume_s"),
        # the runtime's own restart after every rank crashed; torchrun's relaunch if absent
        relaunch_s=pick(resume(_num(jw, "resume_s_max") or _num(tr, "resume_s_max")),
                        ref.relaunch_s, "relaunch_s"),
        relaunch_captured_s=(0.0 if captured is None
                             else pick(captured, 0.0, "relaunch_captured_s")),
        steps_lost=pick(_num(sg, "steps_lost_max"), ref.steps_lost, "steps_lost"),
        # Failure-free overhead: the with-failures ratio would count recoveries twice (the
        # twin models failures itself).
        wall_ratio=max(1.0, pick(_num(tops, "seamguard_no_failure_wall_ratio"), ref.wall_ratio, "wall_ratio")),
        snapshot_stall_ratio=pick(_num(tops, "snapshot_stall_ratio"),
                                  ref.snapshot_stall_ratio, "snapshot_stall_ratio"),
        restore_speedup=restore_speedup,
        blocking_stall_ratio=_num(tops, "snapshot_stall_ratio_blocking") or 0.0,
        measured_ranks=int(_num(tops, "world_size") or _num(cfg, "world_size")
                           or ref.measured_ranks),
        save_s_per_gib=save_s_per_gib,
        # Without a measured copy-back rate, the restore speedup relative to a save.
        restore_s_per_gib=(pick(restore_rate, 0.0, "restore_s_per_gib") if restore_rate
                           else save_s_per_gib / restore_speedup),
        notes=tuple(notes),
    )
    all_file = all(source in n for n in notes)
    label = source if all_file else (f"{source} + REFERENCE.md fallback" if used_file
                                     else ref.source)
    return RuntimeFigures(**{**figs.__dict__, "source": label})


def load_runtime_figures(path: Path | str | None = None) -> RuntimeFigures:
    """Read the runtime's results file (edge I/O); fall back to REFERENCE.md figures."""
    p = Path(path) if path is not None else DEFAULT_RESULTS_PATH
    if not p.is_file():
        return REFERENCE_FIGURES
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read runtime results {p}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ValueError(f"runtime results {p} must hold a JSON object")
    return parse_runtime_figures(data, str(p))
