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

__all__ = ["write_report", "fig_ettr_vs_size", "fig_lost_by_cause", "fig_interval_vs_hazard",
           "si"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def si(x: float, _pos: object = None) -> str:
    """Plain tick label: 0.5, 3, 40, 1k, 16k, 131k, 2.5M (no ``10^n`` mathtext).

    Thousands are floored (65,536 GPUs reads ``65k``), as people say cluster sizes.
    """
    a = abs(x)
    if a >= 1e9:
        return f"{x / 1e9:.3g}G"
    if a >= 1e6:
        return f"{x / 1e6:.3g}M"
    if a >= 1e3:
        k = x / 1e3
        return f"{int(k)}k" if k >= 10 or float(k).is_integer() or a % 1024 == 0 else f"{k:.3g}k"
    if a == 0:
        return "0"
    return f"{x:.3g}"


def _plain_axis(axis) -> None:
    """Plain major and minor tick labels on a (log) axis."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(si))
    axis.set_minor_formatter(NullFormatter())


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def _others(names) -> list[str]:
    """The policies seamguard is compared with (every one run beside it)."""
    return [n for n in names if n != "seamguard"] if "seamguard" in names else []


def strongest_baseline(summaries: Sequence[Summary]) -> str | None:
    """The policy other than seamguard with the highest mean ETTR (``None`` if none ran)."""
    others = [s for s in summaries if s.policy in _others([x.policy for x in summaries])]
    return max(others, key=lambda s: s.metric("ettr")[0]).policy if others else None


def fig_ettr_vs_size(sweep: dict[int, list[Summary]], goal: float = 0.97):
    """ETTR against cluster size for every policy, and how much less time seamguard loses than
    the strongest other policy at each size (the one a skeptic would pick)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    plt = _plt()
    sizes = sorted(sweep)
    names = [s.policy for s in sweep[sizes[0]]]
    others = _others(names)
    two = bool(others)
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(11.5 if two else 7, 4.4),
                             squeeze=False)
    ax = axes[0][0]
    means: dict[str, list[float]] = {}
    for k, name in enumerate(names):
        ms, lo, hi = [], [], []
        for n in sizes:
            m, a, b = sweep[n][k].metric("ettr")   # bootstrap interval, inside [0, 1]
            ms.append(m); lo.append(max(m - a, 0.0)); hi.append(max(b - m, 0.0))
        means[name] = ms
        ax.errorbar(sizes, ms, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.axhline(goal, color="grey", lw=1.0, ls="--", label=f"goal: ETTR {goal:g}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(si))
    ax.set_xlabel("cluster size (GPUs, one job on every non-spare node)")
    ax.set_ylabel("ETTR = productive time / wall-clock")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    runs = len(sweep[sizes[0]][0].runs)
    ax.set_title("ETTR vs cluster size " + (f"(mean of {runs} runs, 95% CI)" if runs > 1
                                            else "(1 run: no interval)"), fontsize=11)
    if two:
        rx = axes[0][1]
        best = [max(others, key=lambda o, i=i: means[o][i]) for i in range(len(sizes))]
        lost_b = [1.0 - means[o][i] for i, o in enumerate(best)]
        lost_s = [1.0 - m for m in means["seamguard"]]
        ratio = [_ratio(b, s) for b, s in zip(lost_b, lost_s)]
        finite = [r for r in ratio if r != float("inf")]
        top = max(finite, default=1.0)
        shown = [r if r != float("inf") else top for r in ratio]
        rx.bar(range(len(sizes)), shown, color="tab:green", alpha=0.8)
        for i, (r, b, s_) in enumerate(zip(ratio, lost_b, lost_s)):
            txt = "no loss" if r == float("inf") else f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"
            vs = f"\nvs {best[i]}" if len(others) > 1 else ""
            rx.annotate(f"{txt}{vs}\n{b:.0%} vs {s_:.1%}", (i, shown[i]), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        rx.axhline(1.0, color="grey", lw=1.0, ls=":", label="1x: no difference")
        rx.set_xticks(range(len(sizes)), [si(n) for n in sizes])
        rx.set_ylim(0, top * 1.25 + 0.5)
        rx.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}x"))
        rx.set_xlabel("cluster size (GPUs)")
        ref = others[0] if len(others) == 1 else "strongest other policy"
        rx.set_ylabel(f"lost time: {ref} / seamguard")
        rx.legend(loc="upper left")
        rx.grid(alpha=0.3, axis="y")
        rx.set_title(f"How many times less time seamguard loses than the {ref}\n"
                     "(labels: share of wall-clock lost, that policy vs seamguard)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_ettr_vs_size(sweep: dict[int, list[Summary]], path: Path) -> None:
    fig = fig_ettr_vs_size(sweep)
    fig.savefig(path, dpi=120)
    _plt().close(fig)


def fig_lost_by_cause(summaries: Sequence[Summary], top: int | None = None):
    """GPU-hours lost per cause (linear, every cause unless ``top``), and the ratio."""
    from matplotlib.ticker import FuncFormatter

    plt = _plt()
    data = {s.policy: s.mean_dict("gpu_hours_lost_by_cause") for s in summaries}
    totals: dict[str, float] = {}
    for d in data.values():
        for k, v in d.items():
            totals[k] = totals.get(k, 0.0) + v
    ranked = sorted(totals, key=lambda k: (-totals[k], k))
    causes = (ranked[:top] if top else ranked)[::-1]
    others = _others(list(data))
    two = bool(others)
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(12 if two else 8,
                                                          0.32 * len(causes) + 2.2),
                             sharey=True, squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]} if two else None)
    ax = axes[0][0]
    h = 0.8 / max(len(data), 1)
    for k, (pol, d) in enumerate(data.items()):
        ax.barh([i + k * h for i in range(len(causes))], [d.get(c, 0.0) for c in causes],
                height=h, label=pol)
    ax.set_yticks([i + h * (len(data) - 1) / 2 for i in range(len(causes))], causes)
    ax.xaxis.set_major_formatter(FuncFormatter(si))
    ax.set_xlabel("GPU-hours lost (mean per run, linear scale)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(loc="lower right")
    r0 = summaries[0].runs[0]
    shown = (f"top {len(causes)} of {len(ranked)} causes" if len(causes) < len(ranked)
             else f"all {len(ranked)} causes")
    sums = {pol: sum(d.values()) for pol, d in data.items()}
    total = ", ".join(f"{pol} {si(v)}" for pol, v in sums.items())
    ax.set_title(f"GPU-hours lost by cause, {r0.gpus:,} GPUs, {r0.days:g} days ({shown})\n"
                 f"total lost: {total} GPU-h", fontsize=11, loc="left")
    if two:
        rx = axes[0][1]
        ref = min(others, key=lambda o: sums[o])   # the other policy that loses least overall
        b, s = data[ref], data["seamguard"]
        ratios = [_ratio(b.get(c, 0.0), s.get(c, 0.0)) for c in causes]
        finite = [r for r in ratios if r != float("inf")]
        cap = max(finite, default=1.0)
        y = [i + h * (len(data) - 1) / 2 for i in range(len(causes))]
        rx.barh(y, [r if r != float("inf") else cap for r in ratios], height=0.6,
                color=["tab:green" if r >= 1 else "tab:red" for r in ratios], alpha=0.8)
        for yi, r, c in zip(y, ratios, causes):
            if r == float("inf"):
                txt = f"{ref} only"
            elif b.get(c, 0.0) == 0:
                txt = "seamguard only"
            else:
                txt = f"{r:.0f}x" if r >= 10 else f"{r:.1f}x" if r >= 1 else f"{r:.2f}x"
            rx.annotate(txt, (min(r, cap), yi), va="center", fontsize=8, xytext=(3, 0),
                        textcoords="offset points")
        rx.axvline(1.0, color="grey", lw=1.0, ls=":", label="1x: same loss")
        rx.set_xlim(0, cap * 1.2 + 1)
        rx.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}x"))
        rx.set_xlabel(f"{ref} / seamguard (red: seamguard loses more)")
        rx.legend(loc="lower right")
        rx.grid(alpha=0.3, axis="x")
        rx.set_title(f"times less lost with seamguard than {ref}\n(the other policy that loses least; "
                     f"all causes: {_ratio(sums[ref], sums['seamguard']):.1f}x)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_lost_by_cause(summaries: Sequence[Summary], path: Path, top: int | None = None) -> None:
    fig = fig_lost_by_cause(summaries, top)
    fig.savefig(path, dpi=120)
    _plt().close(fig)


def fig_interval_vs_hazard(points: Sequence[tuple[float, float, str]]):
    """The planner's checkpoint interval as the job's rollback hazard rises (log-log)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    ax.plot([p[0] for p in points], [p[1] for p in points], color="grey", lw=1, zorder=1)
    for mode in dict.fromkeys(p[2] for p in points):
        pts = [p for p in points if p[2] == mode]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, zorder=2,
                   label=f"checkpoint mode: {mode}")
    if points:
        hz0, ivl0, _ = points[0]
        arrow = {"arrowstyle": "->", "color": "0.4", "lw": 0.8}
        ax.annotate(f"healthy footprint: every {ivl0:.3g} min\n(hazard {hz0:.2g} per hour)",
                    (hz0, ivl0), xytext=(10, -120), textcoords="offset points", fontsize=8,
                    va="top", arrowprops=arrow)
        hz1, ivl1, _ = points[-1]
        ax.annotate(f"footprint {hz1 / hz0:.0f}x as risky:\nevery {ivl1:.2g} min",
                    (hz1, ivl1), xytext=(-30, 120), textcoords="offset points", fontsize=8,
                    ha="right", arrowprops=arrow)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_axis(ax.xaxis)
    _plain_axis(ax.yaxis)
    from matplotlib.ticker import FuncFormatter, LogLocator

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(si))
    ax.set_xlabel("job's hazard of failures that roll work back (per hour, log scale)")
    ax.set_ylabel("checkpoint interval chosen (min, log scale)")
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="lower left")
    ax.set_title("Planner: interval (Daly's formula) shortens as the hazard rises", fontsize=11)
    fig.tight_layout()
    return fig


def plot_interval_vs_hazard(points: Sequence[tuple[float, float, str]], path: Path) -> None:
    fig = fig_interval_vs_hazard(points)
    fig.savefig(path, dpi=120)
    _plt().close(fig)


def _strongest_lines(sweep: dict[int, list[Summary]]) -> list[str]:
    """Which baseline seamguard is charted against at each size, and the ratios."""
    out = []
    for n in sorted(sweep):
        best = strongest_baseline(sweep[n])
        if best is None:
            continue
        b = next(s for s in sweep[n] if s.policy == best).metric("ettr")[0]
        sg = next(s for s in sweep[n] if s.policy == "seamguard").metric("ettr")[0]
        out.append(f"- {n:,} GPUs: seamguard {sg:.3f} against the strongest baseline, {best} "
                   f"{b:.3f}: ETTR {_ratio(sg, b):.3f}x, lost time {best} / seamguard "
                   f"{_ratio(1.0 - b, 1.0 - sg):.2f}x")
    return (["seamguard is compared with the strongest baseline at each size (the highest "
             "mean ETTR of the others run beside it):", ""] + out) if out else []


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
             "ETTR intervals: 95% percentile bootstrap over the runs, within [0, 1] "
             "(one run gives no interval).", "",
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
    lines += [""] + _strongest_lines(sweep) + ["", "![ETTR vs size](ettr_vs_size.png)", "",
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
