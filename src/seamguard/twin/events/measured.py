"""Recovery and checkpoint figures of the resilient runtime, measured, with their source.

Why this file exists: the ``seamguard`` policy must not run on constants picked to look
good. Its recovery times and stalls come from a runtime benchmark results file (the one
``benchmarks/failover_training.py`` writes, e.g.
``benchmarks/results/failover_training.json``), named explicitly by the caller
(``seamguard twin simulate --measured FILE``); without a file, or for a figure the file
lacks, the built-in defaults :data:`DEFAULT_FIGURES` are used (small-machine
measurements, each listed with its origin in docs/sources.md, "Runtime recovery
defaults"), and :attr:`RuntimeFigures.source` says which. Nothing here looks at the
current working directory. Reading the file is the CLI's job
(:func:`load_runtime_figures`); :func:`parse_runtime_figures` is pure.

GPU figures (``benchmarks/gpu_runtime.py``'s results, e.g.
``benchmarks/results/gpu_runtime_h100.json``, ``--measured-gpu FILE``) replace what they
measured on the hardware the product is for: the snapshot stall and restore relative to
torch.save/torch.load, the per-GiB save and restore rates, the restart from host memory
after every rank of a job was lost (its recovery of a killed rank by a hot spare, world
size 1), the blocking stall and, when measured, the failure-free overhead
(:func:`with_gpu_figures`, pure). The notes and the source say which came from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

__all__ = ["RuntimeFigures", "DEFAULT_FIGURES", "DEFAULTS_LABEL", "parse_runtime_figures",
           "with_gpu_figures", "load_runtime_figures", "load_gpu_figures", "describe_defaults"]

#: How outputs name the built-in defaults.
DEFAULTS_LABEL = "built-in defaults (docs/sources.md)"


@dataclass(frozen=True)
class RuntimeFigures:
    """Measured runtime behaviour, on the (small) job the benchmark ran."""

    source: str
    """Where the figures came from (file path, the built-in defaults, or both)."""
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
    two ratios above are relative to (default: 667 ms for 1 GiB, docs/sources.md)."""
    restore_s_per_gib: float = 0.051
    """Copy back from host memory per GiB on the measuring machine (default: 51 ms
    for 1 GiB, docs/sources.md)."""
    relaunch_captured_s: float = 0.0
    """The same restart after every rank raised an uncaught exception and left the failed
    step's start in host memory (``seamguard_job_wide_exception``); 0 when not measured
    (then ``relaunch_s`` is used)."""
    blocking_stall_ratio: float = 0.0
    """The same for a snapshot that blocks the step (``--blocking-snapshots``): the
    pessimistic bound; 0 when not measured."""
    notes: tuple[str, ...] = ()
    """Which figure came from where."""


#: Built-in defaults, measured by the project on a 2-core CPU machine (1 GiB fp32 state,
#: 2 ranks, torch 2.13 CPU; docs/sources.md, "Runtime recovery defaults"): a torchft
#: replica loss stalls the survivors 5.06 s (its default 5 s heartbeat timeout); torchrun
#: relaunches a 2-rank job in 3.46 s; copying the state into preallocated buffers takes
#: 51 ms vs 667 ms for torch.save+fsync (7.6%); a warm torch.load takes 704 ms vs 51 ms
#: to copy back (13.8x, the order of Gemini's >13x, SOSP 2023).
DEFAULT_FIGURES = RuntimeFigures(
    source=f"{DEFAULTS_LABEL}: no runtime results file given",
    live_resume_s=5.06, relaunch_s=3.46,
    steps_lost=1.0,   # the in-flight step is cancelled, never committed (torchft model)
    wall_ratio=1.0,   # no failure-free overhead measured for the defaults; a file's replaces it
    snapshot_stall_ratio=51.0 / 667.0, restore_speedup=704.0 / 51.0, measured_ranks=2,
)


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key) if isinstance(d, Mapping) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse_runtime_figures(data: Mapping[str, Any], source: str) -> RuntimeFigures:
    """Build figures from a results document; missing figures fall back to the defaults.

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
    the built-in defaults.
    """
    systems = data.get("systems", data)
    if not isinstance(systems, Mapping):
        systems = {}
    ref = DEFAULT_FIGURES
    notes: list[str] = []
    used_file = False

    def pick(value: float | None, fallback: float, what: str) -> float:
        nonlocal used_file
        if value is None:
            notes.append(f"{what}: {DEFAULTS_LABEL}")
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
    label = source if all_file else (f"{source} + {DEFAULTS_LABEL} for what it lacks" if used_file
                                     else ref.source)
    return RuntimeFigures(**{**figs.__dict__, "source": label})


def describe_defaults(figs: RuntimeFigures = DEFAULT_FIGURES) -> str:
    """One line naming the figures the defaults stand for (for people reading output)."""
    return (f"live resume {figs.live_resume_s:g} s, relaunch {figs.relaunch_s:g} s, "
            f"{figs.steps_lost:g} step lost, save {figs.save_s_per_gib * 1000:.0f} ms/GiB, "
            f"snapshot stall {figs.snapshot_stall_ratio:.1%} of a save, restore "
            f"{figs.restore_speedup:.1f}x faster than a load, measured on "
            f"{figs.measured_ranks} ranks")


def _gpu_file(data: Mapping[str, Any]) -> bool:
    return data.get("benchmark") == "gpu_runtime"


def with_gpu_figures(base: RuntimeFigures, data: Mapping[str, Any], source: str) -> RuntimeFigures:
    """``base`` with the figures a GPU results document measured (see the module
    docstring); a figure it lacks (or measured as null) stays ``base``'s. CPU runs of the
    GPU benchmark (``gpu_figures`` false) are refused: they are no GPU figures."""
    if not _gpu_file(data):
        raise ValueError(f"{source}: not a benchmarks/gpu_runtime.py result (no \"benchmark\": \"gpu_runtime\")")
    if data.get("gpu_figures") is not True:
        raise ValueError(f"{source}: measured on {data.get('device', 'an unknown device')!r}, "
                         "not a GPU (gpu_figures is not true)")
    micro = data.get("micro") if isinstance(data.get("micro"), Mapping) else {}
    stalls = micro.get("stall_used_s") if isinstance(micro.get("stall_used_s"), Mapping) else {}
    restores = micro.get("restore_s") if isinstance(micro.get("restore_s"), Mapping) else {}
    gib = (_num(micro, "state_bytes") or 0.0) / 2**30
    rec = data.get("recovery") if isinstance(data.get("recovery"), Mapping) else {}
    warm = rec.get("warm_spare") if isinstance(rec.get("warm_spare"), Mapping) else {}
    runs = [r for r in warm.get("runs", []) if isinstance(r, Mapping)]
    step_s = max((_num(r, "step_s") or 0.0 for r in runs), default=0.0)
    recovery = _num(data, "recovery_s")
    save, blocking = _num(stalls, "torch_save"), _num(stalls, "sg_blocking")
    sg_restore = _num(restores.get("sg_restore", {}), "median")
    device = data.get("device", "GPU")
    found = {
        "snapshot_stall_ratio": _num(data, "snapshot_stall_ratio_vs_save"),
        "restore_speedup": _num(data, "restore_speedup_vs_torch_load"),
        "save_s_per_gib": save / gib if save and gib else None,
        "restore_s_per_gib": sg_restore / gib if sg_restore and gib else None,
        "blocking_stall_ratio": blocking / save if blocking and save else None,
        # kill of the only rank to its first step after a hot spare restored its state
        # from host memory: the job-wide restart, less that step's own compute
        "relaunch_s": max(recovery - step_s, 0.0) if recovery is not None else None,
        "wall_ratio": _num(data, "failure_free_wall_ratio"),
    }
    fields = {k: v for k, v in found.items() if v is not None}
    if "restore_speedup" in fields:
        fields["restore_speedup"] = max(1.0, fields["restore_speedup"])
    if "wall_ratio" in fields:
        fields["wall_ratio"] = max(1.0, fields["wall_ratio"])
    label = f"{source} ({device})"
    notes = [n for n in base.notes if n.split(":", 1)[0] not in fields]
    notes += [f"{k}: {label}" for k in fields]
    used = ", ".join(fields) or "nothing"
    return replace(base, **fields, notes=tuple(notes),
                   source=f"{base.source}; GPU figures ({used}) from {label}")


def _read_json(p: Path) -> Mapping[str, Any]:
    if not p.is_file():
        raise ValueError(f"runtime results file {p} does not exist")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read runtime results {p}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ValueError(f"runtime results {p} must hold a JSON object")
    return data


def load_runtime_figures(path: Path | str | None = None,
                         gpu_path: Path | str | None = None) -> RuntimeFigures:
    """Read a runtime results file (edge I/O); without one, the built-in defaults. With
    ``gpu_path`` (a benchmarks/gpu_runtime.py result), its GPU figures replace those.

    Paths are explicit: ``None`` means "no file", never a guess relative to the current
    working directory. A path that does not exist is an error, not a silent fallback. A
    GPU result given as ``path`` is read as ``gpu_path`` over the defaults.
    """
    figs = DEFAULT_FIGURES
    if path is not None:
        data = _read_json(Path(path))
        figs = (with_gpu_figures(DEFAULT_FIGURES, data, str(path)) if _gpu_file(data)
                else parse_runtime_figures(data, str(path)))
    return figs if gpu_path is None else load_gpu_figures(figs, gpu_path)


def load_gpu_figures(base: RuntimeFigures, gpu_path: Path | str) -> RuntimeFigures:
    """``base`` with the GPU figures of the benchmarks/gpu_runtime.py result at ``gpu_path``."""
    return with_gpu_figures(base, _read_json(Path(gpu_path)), str(gpu_path))
