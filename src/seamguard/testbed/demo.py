"""`seamguard testbed demo`: a data-parallel job across 4 hosts x 2 rails under link flaps.

Why this exists: the picture an operator needs — per-host inbound throughput per rail
over time with the faults marked — shows that traffic moves to the healthy rail within
a step and returns to both rails once the link is back, with no restart. Writes a PNG
(matplotlib, Agg) and the numbers as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from seamguard.testbed.job import EXAMPLE_JOB, Fault, JobResult, JobSpec, run_rail_job
from seamguard.testbed.metrics import flap_figures
from seamguard.testbed.net import Testbed, TestbedSpec

DEMO_FAULTS = [
    Fault(3.0, "flap", host=1, rail=0, duration_s=3.0),
    Fault(9.0, "flap", host=2, rail=1, duration_s=3.0),
    Fault(15.0, "switch", rail=0, duration_s=3.0),
    Fault(21.0, "gray", host=3, rail=1, duration_s=3.0, rate_mbit=50),
]


def throughput_series(res: JobResult, hosts: int, rails: int) -> dict:
    """Inbound MB/s per (host, rail) between consecutive switch-port samples."""
    t = np.array([s[0] for s in res.samples])
    out: dict = {"t_s": (0.5 * (t[1:] + t[:-1]) - res.t_start).round(3).tolist(), "mb_per_s": {}}
    dt = np.diff(t)
    for h in range(hosts):
        for r in range(rails):
            b = np.array([s[1].get((h, r), np.nan) for s in res.samples])
            out["mb_per_s"][f"h{h}/rail{r}"] = (np.diff(b) / dt / 1e6).round(3).tolist()
    return out


def run_demo(out_dir: Path, hosts: int = 4, rails: int = 2, steps: int = 420,
             faults: list[Fault] | None = None, script: Path = EXAMPLE_JOB) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = DEMO_FAULTS if faults is None else faults
    out_dir.mkdir(parents=True, exist_ok=True)
    with Testbed(TestbedSpec(hosts=hosts, rails=rails)) as tb:
        res = run_rail_job(tb, JobSpec(script=script, steps=steps, timeout_s=300), faults, out_dir / "job")
    series = throughput_series(res, hosts, rails)
    commit = [s["t_wall"] for s in res.steps]
    per_fault = []
    for rec in res.faults:
        if rec.applied_t:
            f = flap_figures(commit, [s["rails"] for s in res.steps], rails, rec.applied_t, rec.reverted_t)
            per_fault.append({"fault": rec.fault.describe(), "at_s": round(rec.applied_t - res.t_start, 3),
                              "until_s": round(rec.reverted_t - res.t_start, 3), **f.__dict__})
    summary = {"ok": res.ok, "returncodes": res.returncodes, "checksum": res.checksums[0],
               "steps": len(res.steps), "wall_s": round(res.t_end - res.t_start, 3),
               "retried_steps": sum(s["attempts"] > 1 for s in res.steps), "faults": per_fault,
               "rail_events": res.rail_events, "throughput": series}
    fig, axes = plt.subplots(hosts, 1, figsize=(11, 2.1 * hosts + 0.6), sharex=True)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple"]
    for h, ax in enumerate(np.atleast_1d(axes)):
        for r in range(rails):
            ax.plot(series["t_s"], series["mb_per_s"][f"h{h}/rail{r}"], color=colors[r % 4], lw=1.2,
                    label=f"rail{r}")
        total = np.nansum([series["mb_per_s"][f"h{h}/rail{r}"] for r in range(rails)], axis=0)
        ax.plot(series["t_s"], total, color="black", lw=0.8, ls="--", label="total")
        for pf, rec in zip(per_fault, [r for r in res.faults if r.applied_t]):
            hit = rec.fault.kind == "switch" or rec.fault.host == h
            ax.axvspan(pf["at_s"], pf["until_s"], color="red" if hit else "grey", alpha=0.18 if hit else 0.07)
            if h == 0:
                ax.text(pf["at_s"], 1.02, pf["fault"], transform=ax.get_xaxis_transform(), fontsize=7)
        ax.set_ylabel(f"h{h} in MB/s")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(loc="upper right", fontsize=7, ncol=rails + 1)
    np.atleast_1d(axes)[-1].set_xlabel("seconds since training started (red: fault on this host/rail)")
    fig.suptitle(f"seamguard rail failover: {hosts} hosts x {rails} rails, {len(res.steps)} steps, "
                 f"0 restarts, checksum {str(res.checksums[0])[:12]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_dir / "rail_failover.png", dpi=110)
    plt.close(fig)
    (out_dir / "rail_failover.json").write_text(json.dumps(summary, indent=1))
    return summary
