"""``seamguard twin simulate`` and ``seamguard twin report``: the event twin's CLI edge.

Why this file exists: it is the only place of the event twin that reads files (the
runtime's measured results) and flags; it validates them with messages that name the
option, builds the frozen settings, and hands over to the library. Registered in
``seamguard.app.cli`` as ``twin_app.command("simulate")(simulate)`` and ``...("report")``.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from seamguard.twin.events.calibration import link_profile, llama3_failure_model
from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.measured import DEFAULT_RESULTS_PATH, load_runtime_figures
from seamguard.twin.events.montecarlo import run_monte_carlo, summarise

__all__ = ["simulate", "report", "build_settings"]


def _fail(msg: str) -> None:
    typer.echo(f"Error: {msg}", err=True)
    raise typer.Exit(code=2)


def build_settings(*, gpus: int, days: float, policy: str, workload: str,
                   spare_fraction: float, node_failure_rate: Optional[float],
                   link_profile_name: str, link_mttf_years: Optional[float],
                   checkpoint_interval_min: float, checkpoint_write_min: float,
                   restart_cost_min: float, detection_delay_s: float,
                   detection_precision: float, state_gib_per_gpu: float,
                   measured: Optional[Path],
                   job_wide_crash_fraction: float = PolicyParams.job_wide_crash_fraction,
                   sdc_caught_fraction: float = PolicyParams.sdc_caught_at_step_fraction,
                   crash_capture_fraction: float = PolicyParams.crash_capture_fraction,
                   ) -> tuple[ClusterConfig, list[PolicyParams], str]:
    """Validate flags and build the cluster config and the policies to run."""
    if gpus <= 0:
        raise ValueError(f"--gpus must be a positive number of GPUs, got {gpus}")
    if node_failure_rate is not None and not node_failure_rate > 0:
        raise ValueError(f"--node-failure-rate must be > 0 per node-day, got {node_failure_rate}")
    if link_mttf_years is not None:
        if not link_mttf_years > 0:
            raise ValueError(f"--link-mttf-years must be > 0, got {link_mttf_years}")
        link_profile_name = "mttf"
    if link_profile_name not in ("llama3", "hpn", "mttf"):
        raise ValueError(f"--link-profile must be llama3, hpn or mttf, got {link_profile_name!r}")
    if policy not in ("baseline", "seamguard", "both"):
        raise ValueError(f"--policy must be baseline, seamguard or both, got {policy!r}")
    if measured is not None and not Path(measured).is_file():
        raise ValueError(f"--measured: no such file {measured}")
    fm = llama3_failure_model()
    if node_failure_rate is not None:
        fm = fm.with_rf(node_failure_rate)
    fm = link_profile(fm, link_profile_name, link_mttf_years)
    cfg = ClusterConfig(gpus=gpus, days=days, workload=workload,
                        spare_fraction=spare_fraction, failures=fm)
    figs = load_runtime_figures(measured if measured is not None else DEFAULT_RESULTS_PATH)
    names = ["baseline", "seamguard"] if policy == "both" else [policy]
    pols = [PolicyParams(n, checkpoint_interval_min=checkpoint_interval_min,
                         checkpoint_write_min=checkpoint_write_min,
                         restart_cost_min=restart_cost_min,
                         detection_delay_s=detection_delay_s,
                         detection_precision=detection_precision,
                         state_gib_per_gpu=state_gib_per_gpu,
                         job_wide_crash_fraction=job_wide_crash_fraction,
                         sdc_caught_at_step_fraction=sdc_caught_fraction,
                         crash_capture_fraction=crash_capture_fraction, runtime=figs)
            for n in names]
    return cfg, pols, figs.source


_GPUS = typer.Option(16_384, "--gpus", help="GPUs in the cluster (multiple of 8).")
_DAYS = typer.Option(30.0, "--days", help="Simulated days.")
_WORKLOAD = typer.Option("single", "--workload",
                         help="single: one release-critical job on every non-spare node; "
                              "mix: jobs of several sizes, classes and criticalities.")
_SPARE = typer.Option(0.02, "--spare-fraction", help="Share of nodes kept as spares.")
_RF = typer.Option(None, "--node-failure-rate",
                   help="Unexpected failures per node-day (Meta RSC r_f ~ 0.005); keeps "
                        "Llama 3's cause mix. Default: Llama 3 calibration (~0.0038).")
_LINKP = typer.Option("llama3", "--link-profile", help="llama3, hpn or mttf.")
_LINKM = typer.Option(None, "--link-mttf-years",
                      help="Per-link exponential MTTF in years (implies --link-profile mttf).")
_CI = typer.Option(60.0, "--checkpoint-interval-min",
                   help="Baseline's fixed checkpoint interval (compute minutes).")
_CW = typer.Option(5.0, "--checkpoint-write-min",
                   help="Full checkpoint write stall to storage (Meta: ~5 min).")
_RC = typer.Option(10.0, "--restart-cost-min", help="Baseline restart overhead (Meta: 5-20 min).")
_DD = typer.Option(PolicyParams.__dataclass_fields__["detection_delay_s"].default, "--detection-delay-s",
                   help="Gray-failure detection delay (default: the telemetry twin's measured median).")
_DP = typer.Option(0.9, "--detection-precision", help="Share of gray alarms that are true.")
_SG = typer.Option(28.0, "--state-gib-per-gpu", help="Checkpoint state per GPU (HPN: 30 GB).")
_JW = typer.Option(PolicyParams.job_wide_crash_fraction, "--job-wide-crash-fraction",
                   help="Share of process crashes that kill every rank at once (seamguard "
                        "relaunches those; it replaces a single crashed rank live).")
_SDC = typer.Option(PolicyParams.sdc_caught_at_step_fraction, "--sdc-caught-fraction",
                    help="Share of silent data corruptions the runtime's step guard catches "
                         "at the step (the rest go back to the storage backstop).")
_CAP = typer.Option(PolicyParams.crash_capture_fraction, "--crash-capture-fraction",
                    help="Share of job-wide crashes that end by an uncaught exception, so the "
                         "runtime leaves the failed step's start in host memory (the rest "
                         "go back to the newest periodic snapshot).")
_MEAS = typer.Option(None, "--measured",
                     help=f"Runtime results file (default {DEFAULT_RESULTS_PATH}, "
                          "falls back to REFERENCE.md figures when absent).")
_RUNS = typer.Option(1, "--runs", help="Monte-Carlo runs (seeds).")
_SEED = typer.Option(0, "--seed", help="Master seed; the same seed reproduces every run.")
_EXEC = typer.Option("local", "--executor", help="local, process (process pool) or ray.")
_WORK = typer.Option(None, "--workers", help="Worker processes for --executor process.")


def simulate(
    gpus: int = _GPUS, days: float = _DAYS,
    policy: str = typer.Option("both", "--policy", help="baseline, seamguard or both."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    workload: str = _WORKLOAD, spare_fraction: float = _SPARE,
    node_failure_rate: Optional[float] = _RF, link_profile_name: str = _LINKP,
    link_mttf_years: Optional[float] = _LINKM, checkpoint_interval_min: float = _CI,
    checkpoint_write_min: float = _CW, restart_cost_min: float = _RC,
    detection_delay_s: float = _DD, detection_precision: float = _DP,
    state_gib_per_gpu: float = _SG, measured: Optional[Path] = _MEAS,
    job_wide_crash_fraction: float = _JW, sdc_caught_fraction: float = _SDC,
    crash_capture_fraction: float = _CAP,
    runs: int = _RUNS, seed: int = _SEED, executor: str = _EXEC,
    workers: Optional[int] = _WORK,
) -> None:
    """Discrete-event simulation of a GPU cluster under baseline and/or seamguard."""
    try:
        cfg, pols, source = build_settings(
            gpus=gpus, days=days, policy=policy, workload=workload,
            spare_fraction=spare_fraction, node_failure_rate=node_failure_rate,
            link_profile_name=link_profile_name, link_mttf_years=link_mttf_years,
            checkpoint_interval_min=checkpoint_interval_min,
            checkpoint_write_min=checkpoint_write_min, restart_cost_min=restart_cost_min,
            detection_delay_s=detection_delay_s, detection_precision=detection_precision,
            state_gib_per_gpu=state_gib_per_gpu, measured=measured,
            job_wide_crash_fraction=job_wide_crash_fraction, sdc_caught_fraction=sdc_caught_fraction,
            crash_capture_fraction=crash_capture_fraction)
        sums = run_monte_carlo(cfg, pols, runs, seed, executor, workers)
    except ValueError as exc:
        _fail(str(exc))
        return
    doc = summarise(sums, source, {"seed": seed, "workload": workload,
                                   "node_failure_rate_per_node_day": cfg.failures.rf_per_node_day(),
                                   "detection_delay_s": detection_delay_s,
                                   "detection_precision": detection_precision})
    if json_out:
        typer.echo(json.dumps(doc, default=_jsonable))
        return
    _print_table(sums, source)


def _jsonable(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def _print_table(sums, source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{sums[0].runs[0].gpus:,} GPUs, {sums[0].runs[0].days:g} days, "
                    f"{len(sums[0].runs)} run(s)")
    t.add_column("metric")
    for s in sums:
        t.add_column(s.policy, justify="right")
    docs = [s.to_json() for s in sums]
    for key, fmt in (("ettr", "{:.4f}"), ("goodput", "{:.4f}"), ("interruptions", "{:.1f}"),
                     ("mttf_hours", "{:.2f}"), ("checkpoint_interval_min", "{:.2f}"),
                     ("checkpoint_mode", "{}"), ("failure_amplification", "{:.1f}"),
                     ("rollback_lost_gpu_hours", "{:,.0f}"),
                     ("rollback_exposure_min", "{:.2f}"),
                     ("schedule_slip_probability", "{:.2f}"), ("quarantines", "{:.0f}")):
        t.add_row(key, *[fmt.format(d[key]) for d in docs])
    for d, s in zip(docs, sums):
        m, lo, hi = s.metric("ettr")
        t.caption = (t.caption or "") + f"{s.policy} ETTR 95% CI [{lo:.4f}, {hi:.4f}]  "
    c = Console()
    c.print(t)
    c.print(f"recovery figures: {source}")


def report(
    out: Path = typer.Option(..., "--out", help="Directory for PNGs and summary.md."),
    days: float = _DAYS, runs: int = typer.Option(2, "--runs", help="Runs per point."),
    seed: int = _SEED,
    sizes: str = typer.Option("1024,4096,16384,32768,65536,131072", "--sizes",
                              help="Comma-separated cluster sizes (GPUs)."),
    node_failure_rate: Optional[float] = typer.Option(
        0.005, "--node-failure-rate", help="Failures per node-day (Meta RSC r_f)."),
    workload: str = _WORKLOAD, checkpoint_interval_min: float = _CI,
    checkpoint_write_min: float = _CW, restart_cost_min: float = _RC,
    detection_delay_s: float = _DD, detection_precision: float = _DP,
    measured: Optional[Path] = _MEAS, executor: str = _EXEC,
    workers: Optional[int] = _WORK,
) -> None:
    """Write ETTR-vs-size, lost-by-cause and interval-vs-hazard plots and a summary."""
    from seamguard.twin.events.report import write_report
    from seamguard.twin.events.sweep import interval_vs_hazard, size_sweep

    try:
        size_list = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        _fail(f"--sizes must be comma-separated integers, got {sizes!r}")
        return
    try:
        if not size_list or min(size_list) <= 0:
            raise ValueError("--sizes must list positive GPU counts")
        cfg, pols, source = build_settings(
            gpus=max(size_list), days=days, policy="both", workload=workload,
            spare_fraction=0.02, node_failure_rate=node_failure_rate,
            link_profile_name="llama3", link_mttf_years=None,
            checkpoint_interval_min=checkpoint_interval_min,
            checkpoint_write_min=checkpoint_write_min, restart_cost_min=restart_cost_min,
            detection_delay_s=detection_delay_s, detection_precision=detection_precision,
            state_gib_per_gpu=28.0, measured=measured)
        for n in size_list:
            replace(cfg, gpus=n)   # validates every size before the sweep starts
        sweep = size_sweep(cfg, pols, size_list, runs, seed, executor, workers)
    except ValueError as exc:
        _fail(str(exc))
        return
    hazard = interval_vs_hazard(cfg, pols[1], job_nodes=cfg.nodes - cfg.spare_nodes)
    settings = {"days": days, "runs": runs, "seed": seed, "workload": workload,
                "node_failure_rate": node_failure_rate, "measured_source": source,
                "detection_delay_s": detection_delay_s}
    files = write_report(out, sweep, sweep[max(size_list)], hazard, settings)
    for f in files:
        typer.echo(str(f))
