"""Plots and a Markdown summary of the event twin, for ``seamguard twin report``.

Why this file exists: presentation only. It renders the results of
:mod:`seamguard.twin.events.sweep` (ETTR vs cluster size for both policies, GPU-hours
lost by cause, checkpoint interval chosen vs hazard) into PNG files (matplotlib, Agg
backend, no display needed) and one ``summary.md``; it computes nothing itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from seamguard.twin.events.montecarlo import Summary

__all__ = ["write_report"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ettr_vs_size(sweep: dict[int, list[Summary]], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes = sorted(sweep)
    for k, name in enumerate(s.policy for s in sweep[sizes[0]]):
        ms, lo, hi = [], [], []
        for n in sizes:
            m, a, b = sweep[n][k].metric("ettr")
            ms.append(m); lo.append(m - a); hi.append(b - m)
        ax.errorbar(sizes, ms, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cluster GPUs")
    ax.set_ylabel("ETTR (productive / available)")
    ax.set_ylim(0, 1.02)
    ax.axhline(0.97, color="grey", lw=0.8, ls="--")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("ETTR vs cluster size (mean, 95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_lost_by_cause(summaries: Sequence[Summary], path: Path, top: int = 12) -> None:
    plt = _plt()
    data = {s.policy: s.mean_dict("gpu_hours_lost_by_cause") for s in summaries}
    totals: dict[str, float] = {}
    for d in data.values():
        for k, v in d.items():
            totals[k] = totals.get(k, 0.0) + v
    causes = sorted(totals, key=totals.get, reverse=True)[:top][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(causes) + 1.5))
    h = 0.8 / max(len(data), 1)
    for k, (pol, d) in enumerate(data.items()):
        ax.barh([i + k * h for i in range(len(causes))], [d.get(c, 0.0) for c in causes],
                height=h, label=pol)
    ax.set_yticks([i + h * (len(data) - 1) / 2 for i in range(len(causes))])
    ax.set_yticklabels(causes)
    ax.set_xscale("log")
    ax.set_xlabel("GPU-hours lost (mean per run)")
    ax.legend()
    ax.set_title(f"GPU-hours lost by cause, {summaries[0].runs[0].gpus:,} GPUs, "
                 f"{summaries[0].runs[0].days:g} days")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_interval_vs_hazard(points: Sequence[tuple[float, float, str]], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([p[0] for p in points], [p[1] for p in points], marker=".")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("job hazard of rollback-causing failures (per hour)")
    ax.set_ylabel("checkpoint interval chosen (min)")
    ax.grid(alpha=0.3, which="both")
    ax.set_title("Planner: Daly interval vs footprint hazard")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out: Path, sweep: dict[int, list[Summary]],
                 cause_summaries: Sequence[Summary],
                 hazard_points: Sequence[tuple[float, float, str]],
                 settings: dict) -> list[Path]:
    """Write the three PNGs, ``summary.md`` and ``summary.json``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "ettr_vs_size.png", out / "gpu_hours_lost_by_cause.png",
             out / "interval_vs_hazard.png", out / "summary.md", out / "summary.json"]
    plot_ettr_vs_size(sweep, files[0])
    plot_lost_by_cause(cause_summaries, files[1])
    plot_interval_vs_hazard(hazard_points, files[2])

    lines = ["# seamguard event-twin report", "",
             "Settings: " + ", ".join(f"`{k}={v}`" for k, v in settings.items()), "",
             "## ETTR vs cluster size", "",
             "| GPUs | " + " | ".join(f"{s.policy} ETTR (95% CI)" for s in
                                     sweep[min(sweep)]) + " | interruptions | MTTF (h) |",
             "|---:|" + "---:|" * (len(sweep[min(sweep)]) + 2)]
    for n in sorted(sweep):
        cells = []
        for s in sweep[n]:
            m, lo, hi = s.metric("ettr")
            cells.append(f"{m:.3f} ({lo:.3f}-{hi:.3f})")
        j = sweep[n][0].to_json()
        lines.append(f"| {n:,} | " + " | ".join(cells)
                     + f" | {j['interruptions']:.0f} | {j['mttf_hours']:.2f} |")
    lines += ["", "![ETTR vs size](ettr_vs_size.png)", "",
              f"## GPU-hours lost by cause ({cause_summaries[0].runs[0].gpus:,} GPUs)", "",
              "| cause | " + " | ".join(s.policy for s in cause_summaries) + " |",
              "|---|" + "---:|" * len(cause_summaries)]
    dicts = [s.mean_dict("gpu_hours_lost_by_cause") for s in cause_summaries]
    keys = sorted({k for d in dicts for k in d}, key=lambda k: -max(d.get(k, 0) for d in dicts))
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(f"{d.get(k, 0):,.0f}" for d in dicts) + " |")
    lines += ["", "![lost by cause](gpu_hours_lost_by_cause.png)", "",
              "## Checkpoint interval chosen vs hazard", "",
              "| hazard (/h) | interval (min) | mode |", "|---:|---:|---|"]
    for hz, ivl, mode in hazard_points[:: max(1, len(hazard_points) // 8)]:
        lines.append(f"| {hz:.4g} | {ivl:.2f} | {mode} |")
    lines += ["", "![interval vs hazard](interval_vs_hazard.png)", ""]
    files[3].write_text("\n".join(lines))
    files[4].write_text(json.dumps({
        "settings": settings,
        "sweep": {str(n): {s.policy: s.to_json() for s in v} for n, v in sweep.items()},
        "interval_vs_hazard": [list(p) for p in hazard_points]}, indent=1, default=str))
    return files
