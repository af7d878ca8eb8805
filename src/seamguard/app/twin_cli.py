"""``seamguard twin simulate`` and ``seamguard twin report``: the event twin's CLI edge.

Why this file exists: it is the only place of the event twin that reads files (the
runtime's measured results, named with ``--measured FILE``) and flags; it validates them
with messages that name the option (``error: ...``, exit status 2, as every seamguard
command, see :mod:`seamguard.clikit`), builds the frozen settings, and hands over to
the library. Registered in ``seamguard.app.cli`` as ``twin_app.command("simulate")(simulate)``,
``...("report")`` and ``...("calibrate")`` (app/twin_calibrate.py, which also answers
``simulate --calibrated``).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from seamguard.clikit import JSON_OPTION, OUTPUT_OPTION, Output, emit, fail, phase, wants_json
from seamguard.twin.events.calibration import link_profile, llama3_failure_model
from seamguard.twin.events.config import POLICIES, ClusterConfig, CostModel, PolicyParams
from seamguard.twin.events.detection import DetectionModel, load_detection_results
from seamguard.twin.events.measured import (DEFAULT_FIGURES, RuntimeFigures, describe_defaults,
                                            load_gpu_figures, load_runtime_figures)
from seamguard.twin.events.montecarlo import run_monte_carlo, summarise
from seamguard.app.twin_calibrate import calibrate

__all__ = ["simulate", "report", "calibrate", "build_settings", "Compare", "Workload", "LinkProfile",
           "Executor"]


class Compare(str, Enum):
    """Which policies ``twin simulate`` runs: one, ``both`` (baseline_fixed and
    seamguard) or ``all`` four side by side (``baseline`` is baseline_fixed)."""

    baseline = "baseline"
    baseline_fixed = "baseline_fixed"
    baseline_daly_async = "baseline_daly_async"
    in_job_restart = "in_job_restart"
    seamguard = "seamguard"
    both = "both"
    all = "all"


#: The policies each ``--compare`` choice runs.
_COMPARE = {"both": ("baseline_fixed", "seamguard"), "all": POLICIES,
            "baseline": ("baseline_fixed",)}


class Workload(str, Enum):
    single = "single"
    mix = "mix"


class LinkProfile(str, Enum):
    llama3 = "llama3"
    hpn = "hpn"
    mttf = "mttf"


class Executor(str, Enum):
    local = "local"
    process = "process"
    ray = "ray"


def _value(x: object) -> str:
    return x.value if isinstance(x, Enum) else str(x)


def build_settings(*, gpus: int, days: float, compare: str, workload: str,
                   spare_fraction: float, node_failure_rate: Optional[float],
                   link_profile_name: str, link_mttf_years: Optional[float],
                   checkpoint_interval_min: float, checkpoint_write_min: float,
                   restart_cost_min: float, detection_delay_s: float,
                   detection_precision: float, state_gib_per_gpu: float,
                   measured: Optional[Path],
                   job_wide_crash_fraction: float = PolicyParams.job_wide_crash_fraction,
                   sdc_caught_fraction: float = PolicyParams.sdc_caught_at_step_fraction,
                   crash_capture_fraction: float = PolicyParams.crash_capture_fraction,
                   policy_config: Optional[Path] = None,
                   measured_gpu: Optional[Path] = None,
                   detection: Optional[Path] = None,
                   ) -> tuple[ClusterConfig, list[PolicyParams], RuntimeFigures]:
    """Validate flags and build the cluster config, the policies to run and their figures.

    ``measured`` is the runtime results file the user named, or ``None`` for the built-in
    defaults (never a path guessed from the current directory); ``measured_gpu`` a
    benchmarks/gpu_runtime.py result whose GPU figures replace those. ``policy_config`` is a
    JSON file ``{"<policy>": {"<cost>": seconds, ...}}`` replacing named cost components
    (:class:`~seamguard.twin.events.config.CostModel`) of the policies it names.
    ``detection`` is a benchmarks/detection.py result: the seamguard policy then samples the
    detector's measured per-class misses and delays from it (``detection_delay_s`` and
    ``detection_precision`` are unused).
    """
    compare, workload = _value(compare), _value(workload)
    link_profile_name = _value(link_profile_name)
    if gpus <= 0:
        raise ValueError(f"--gpus must be a positive number of GPUs, got {gpus}")
    if node_failure_rate is not None and not node_failure_rate > 0:
        raise ValueError(f"--node-failure-rate must be > 0 per node-day, got {node_failure_rate}")
    if link_mttf_years is not None:
        if not link_mttf_years > 0:
            raise ValueError(f"--link-mttf-years must be > 0, got {link_mttf_years}")
        link_profile_name = "mttf"
    if link_profile_name not in {e.value for e in LinkProfile}:
        raise ValueError(f"--link-profile must be llama3, hpn or mttf, got {link_profile_name!r}")
    if compare not in {e.value for e in Compare}:
        raise ValueError(f"--compare must be one of {', '.join(e.value for e in Compare)}, "
                         f"got {compare!r}")
    if measured is not None and not Path(measured).is_file():
        raise ValueError(f"--measured: no such file {measured}")
    if measured_gpu is not None and not Path(measured_gpu).is_file():
        raise ValueError(f"--measured-gpu: no such file {measured_gpu}")
    fm = llama3_failure_model()
    if node_failure_rate is not None:
        fm = fm.with_rf(node_failure_rate)
    fm = link_profile(fm, link_profile_name, link_mttf_years)
    cfg = ClusterConfig(gpus=gpus, days=days, workload=workload,
                        spare_fraction=spare_fraction, failures=fm)
    try:
        figs = load_runtime_figures(measured)
    except ValueError as exc:
        raise ValueError(f"--measured: {exc}") from exc
    try:
        figs = load_gpu_figures(figs, measured_gpu) if measured_gpu is not None else figs
    except ValueError as exc:
        raise ValueError(f"--measured-gpu: {exc}") from exc
    overrides = read_policy_config(policy_config)
    det = read_detection(detection)
    names = list(_COMPARE.get(compare, (compare,)))
    pols = [PolicyParams(n, checkpoint_interval_min=checkpoint_interval_min,
                         checkpoint_write_min=checkpoint_write_min,
                         restart_cost_min=restart_cost_min,
                         detection_delay_s=detection_delay_s,
                         detection_precision=detection_precision,
                         state_gib_per_gpu=state_gib_per_gpu,
                         job_wide_crash_fraction=job_wide_crash_fraction,
                         sdc_caught_at_step_fraction=sdc_caught_fraction,
                         crash_capture_fraction=crash_capture_fraction, runtime=figs, detection=det)
            for n in names]
    pols = [with_costs(pp, overrides.get(pp.name, {})) for pp in pols]
    return cfg, pols, figs


_COST_FIELDS = tuple(CostModel.__dataclass_fields__)


def read_detection(path: Optional[Path]) -> DetectionModel | None:
    """Read ``--detection FILE`` (edge I/O): the detector's measured recall, delays and precision."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise ValueError(f"--detection: no such file {path}")
    try:
        return load_detection_results(path)
    except ValueError as exc:
        raise ValueError(f"--detection: {exc}") from exc


def detection_settings(det_path: Optional[Path], delay_s: float, precision: float) -> dict:
    """What the seamguard policy's detection ran on, for the JSON and the report's settings."""
    if det_path is None:
        return {"detection": "fixed", "detection_delay_s": delay_s, "detection_precision": precision}
    return {"detection": str(det_path)}


def read_policy_config(path: Optional[Path]) -> dict[str, dict[str, float | None]]:
    """Read ``--policy-config FILE`` (edge I/O): per policy, the costs it replaces."""
    if path is None:
        return {}
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--policy-config: cannot read {p}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"--policy-config: {p} must hold a JSON object of policies")
    out: dict[str, dict[str, float | None]] = {}
    for name, costs in doc.items():
        name = {"baseline": "baseline_fixed"}.get(name, name)
        if name not in POLICIES:
            raise ValueError(f"--policy-config: unknown policy {name!r} (one of {', '.join(POLICIES)})")
        if not isinstance(costs, dict) or set(costs) - set(_COST_FIELDS) - {"links"}:
            raise ValueError(f"--policy-config: {name} takes an object with costs among "
                             f"{', '.join(_COST_FIELDS)} and optionally links")
        out[name] = costs
    return out


def with_costs(pp: PolicyParams, overrides: dict[str, float | None]) -> PolicyParams:
    """The policy with some of its documented default costs replaced."""
    if not overrides:
        return pp
    overrides = dict(overrides)
    links = overrides.pop("links", pp.links)
    try:
        return replace(pp, links=links, costs=replace(pp.cost_model, **overrides))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--policy-config: {pp.name}: {exc}") from exc


def figures_line(figs: RuntimeFigures) -> str:
    """Where the seamguard policy's recovery figures came from, for people."""
    if figs.source == DEFAULT_FIGURES.source:
        return (f"recovery figures: built-in defaults, no --measured FILE given "
                f"({describe_defaults(figs)}; listed in docs/twin-events.md, \"Shipped "
                f"defaults\"). --measured FILE takes the results of a runtime benchmark run "
                f"instead.")
    return f"recovery figures: {figs.source}"


_GPUS = typer.Option(16_384, "--gpus", help="GPUs in the cluster (multiple of 8).")
_DAYS = typer.Option(30.0, "--days", help="Simulated days.")
_WORKLOAD = typer.Option(Workload.single, "--workload", case_sensitive=False,
                         help="single: one release-critical job on every non-spare node; "
                              "mix: jobs of several sizes, classes and criticalities.")
_SPARE = typer.Option(0.02, "--spare-fraction", help="Share of nodes kept as spares.")
_RF = typer.Option(None, "--node-failure-rate",
                   help="Unexpected failures per node-day (Meta RSC r_f ~ 0.005); keeps "
                        "Llama 3's cause mix. Default: Llama 3 calibration (~0.0038).")
_LINKP = typer.Option(LinkProfile.llama3, "--link-profile", case_sensitive=False,
                      help="Link failure rates: llama3 (Llama 3 switch/cable count), hpn "
                           "(Alibaba HPN per-month rates) or mttf (see --link-mttf-years).")
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
_DET = typer.Option(None, "--detection", metavar="FILE",
                    help="A detection result JSON written by benchmarks/detection.py (e.g. "
                         "benchmarks/results/detection_heldout.json): seamguard's policy samples the "
                         "detector's measured per-class recall (misses included) and delay distribution "
                         "and its precision per alarm, instead of --detection-delay-s and "
                         "--detection-precision.")
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
_MEAS = typer.Option(None, "--measured", metavar="FILE",
                     help="Runtime results JSON written by benchmarks/failover_training.py "
                          "(e.g. benchmarks/results/failover_training.json). Without it the "
                          "built-in defaults are used (listed in docs/sources.md) and the "
                          "output says so.")
_MGPU = typer.Option(None, "--measured-gpu", metavar="FILE",
                     help="GPU results JSON written by benchmarks/gpu_runtime.py (e.g. "
                          "benchmarks/results/gpu_runtime_h100.json): its snapshot stall, restore "
                          "and host-memory restart figures replace the --measured file's or the "
                          "defaults; the output names which figures came from it.")
_PCFG = typer.Option(None, "--policy-config", metavar="FILE",
                     help="JSON {policy: {cost: seconds}} replacing named cost components "
                          "(interval_s, write_blocking_s, write_async_s, restart_s, requeue_s, "
                          "load_s, hang_detect_s, swap_s, backstop_interval_s) and links "
                          "(stall or rail_failover); see "
                          "docs/twin-events.md, \"Policies\".")
_RUNS = typer.Option(1, "--runs", help="Monte-Carlo runs (seeds).")
_SEED = typer.Option(0, "--seed", help="Master seed; the same seed reproduces every run.")
_EXEC = typer.Option(Executor.local, "--executor", case_sensitive=False,
                     help="local (in process), process (process pool) or ray "
                          "(needs the optional ray extra).")
_WORK = typer.Option(None, "--workers", help="Worker processes for --executor process.")


def simulate(
    gpus: int = _GPUS, days: float = _DAYS,
    compare: Compare = typer.Option(Compare.all, "--compare", case_sensitive=False, metavar="<policy|both|all>",
                                    help="Which policies to run: one of baseline_fixed, "
                                         "baseline_daly_async, in_job_restart, seamguard; "
                                         "both (baseline_fixed and seamguard); all four."),
    output: Output = OUTPUT_OPTION, json_flag: bool = JSON_OPTION,
    workload: Workload = _WORKLOAD, spare_fraction: float = _SPARE,
    node_failure_rate: Optional[float] = _RF, link_profile_name: LinkProfile = _LINKP,
    link_mttf_years: Optional[float] = _LINKM, checkpoint_interval_min: float = _CI,
    checkpoint_write_min: float = _CW, restart_cost_min: float = _RC,
    detection_delay_s: float = _DD, detection_precision: float = _DP, detection: Optional[Path] = _DET,
    state_gib_per_gpu: float = _SG, measured: Optional[Path] = _MEAS,
    measured_gpu: Optional[Path] = _MGPU,
    job_wide_crash_fraction: float = _JW, sdc_caught_fraction: float = _SDC,
    crash_capture_fraction: float = _CAP, policy_config: Optional[Path] = _PCFG,
    runs: int = _RUNS, seed: int = _SEED, executor: Executor = _EXEC,
    workers: Optional[int] = _WORK,
    calibrated: Optional[Path] = typer.Option(
        None, "--calibrated", metavar="FILE",
        help="A config written by `seamguard twin calibrate`: the twin draws from your fleet's measured "
             "rates and repair times (priors where it says so) and answers per job: checkpoint interval "
             "and tier, hot spares, release-slip probability, with intervals over seeds and over the "
             "estimates' uncertainty (--runs seeds per draw, --draws draws). The fleet's GPUs and the "
             "window's days come from the config (--gpus, --days and the failure flags are not used)."),
    draws: int = typer.Option(8, "--draws", min=1, help="With --calibrated: parameter draws."),
    whatif: Optional[list[str]] = typer.Option(
        None, "--whatif", metavar="KNOB=V[,V...]",
        help="With --calibrated: replay the window's faults under the controller with KNOB set to each value "
             "(mode=enforce|dry_run, breaker=<share of the fleet restricted per window>|off, breaker_in_effect, "
             "breaker_window_s, breaker_min_nodes, drain_min_slowdown=<share of throughput>) and report what each "
             "would have bought over --base; repeatable."),
    base: Optional[list[str]] = typer.Option(
        None, "--base", metavar="KNOB=V",
        help="With --whatif: what your controller runs today (default: --controller-policy FILE's mode and "
             "breaker, else enforce with the breaker's default bounds; no drain floor); repeatable, applied after "
             "--controller-policy."),
    policy: Optional[Path] = typer.Option(
        None, "--controller-policy", metavar="FILE",
        help="With --whatif: the policy file your controller runs; its mode and breaker bounds are the base."),
) -> None:
    """Discrete-event simulation of a GPU cluster under the baselines and seamguard."""
    if calibrated is not None:
        from seamguard.app.twin_calibrate import simulate_calibrated

        try:
            det = read_detection(detection)
        except ValueError as exc:
            fail(str(exc))
        simulate_calibrated(calibrated, draws=draws, seeds=runs, seed=seed, state_gib_per_gpu=state_gib_per_gpu,
                            checkpoint_write_min=checkpoint_write_min, as_json=wants_json(output, json_flag),
                            detection=det, whatifs=whatif or [], base=base or [], policy=policy)
        return
    if whatif or base or policy:
        fail("--whatif, --base and --controller-policy need --calibrated FILE (the window whose faults are replayed)")
    try:
        cfg, pols, figs = build_settings(
            gpus=gpus, days=days, compare=compare, workload=workload,
            spare_fraction=spare_fraction, node_failure_rate=node_failure_rate,
            link_profile_name=link_profile_name, link_mttf_years=link_mttf_years,
            checkpoint_interval_min=checkpoint_interval_min,
            checkpoint_write_min=checkpoint_write_min, restart_cost_min=restart_cost_min,
            detection_delay_s=detection_delay_s, detection_precision=detection_precision,
            state_gib_per_gpu=state_gib_per_gpu, measured=measured, measured_gpu=measured_gpu,
            job_wide_crash_fraction=job_wide_crash_fraction, sdc_caught_fraction=sdc_caught_fraction,
            crash_capture_fraction=crash_capture_fraction, policy_config=policy_config, detection=detection)
        sums = run_monte_carlo(cfg, pols, runs, seed, _value(executor), workers)
    except ValueError as exc:
        fail(str(exc))
    doc = summarise(sums, figs.source, {"seed": seed, "workload": _value(workload),
                                        "node_failure_rate_per_node_day": cfg.failures.rf_per_node_day(),
                                        **detection_settings(detection, detection_delay_s, detection_precision)})
    if wants_json(output, json_flag):
        typer.echo(json.dumps(doc, default=_jsonable))
        return
    _print_table(sums, figs)
    if "seamguard" in {pp.name for pp in pols}:
        det = pols[[pp.name for pp in pols].index("seamguard")].detection
        _echo_wrapped(f"seamguard's detection: {det.source} (measured per-class recall and delays, precision "
                      f"{det.precision:.3f} per alarm)" if det is not None else
                      f"seamguard's detection: every gray event found after {detection_delay_s:g} s, precision "
                      f"{detection_precision:g} (--detection FILE takes a detector's measured result instead)")


def _jsonable(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def _print_table(sums, figs: RuntimeFigures) -> None:
    from rich.console import Console
    from rich.table import Table

    days = sums[0].runs[0].days
    t = Table(title=f"{sums[0].runs[0].gpus:,} GPUs, {days:g} day{'' if days == 1 else 's'}, "
                    f"{len(sums[0].runs)} run{'' if len(sums[0].runs) == 1 else 's'}")
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
    # Piped or redirected there is no width to fit: every cell whole (rich assumed 80 columns
    # and cut `checkpoint_interval_min` and the policy names with the four policies).
    Console(**({} if sys.stdout.isatty() else {"width": 1000})).print(t)
    for s in sums:  # one plain line per policy: a caption would wrap mid-phrase at 80 columns
        _, lo, hi = s.metric("ettr")
        typer.echo(f"{s.policy} ETTR 95% CI [{lo:.4f}, {hi:.4f}]" if len(s.runs) > 1 else
                   f"{s.policy} ETTR 95% CI n/a: 1 run (--runs N for one)")
    _echo_wrapped(figures_line(figs))


def _echo_wrapped(text: str) -> None:
    """A long note wrapped at spaces to the terminal's width (80 when not a terminal)."""
    import shutil
    import textwrap

    typer.echo(textwrap.fill(text, width=max(40, shutil.get_terminal_size((80, 24)).columns),
                             break_on_hyphens=False))


def report(
    out: Path = typer.Option(..., "--out", help="Directory for PNGs and summary.md."),
    days: float = _DAYS, runs: int = typer.Option(2, "--runs", help="Runs per point."),
    seed: int = _SEED,
    sizes: str = typer.Option("1024,4096,16384,32768,65536,131072", "--sizes",
                              help="Comma-separated cluster sizes (GPUs)."),
    node_failure_rate: Optional[float] = typer.Option(
        0.005, "--node-failure-rate", help="Failures per node-day (Meta RSC r_f)."),
    workload: Workload = _WORKLOAD, checkpoint_interval_min: float = _CI,
    checkpoint_write_min: float = _CW, restart_cost_min: float = _RC,
    detection_delay_s: float = _DD, detection_precision: float = _DP, detection: Optional[Path] = _DET,
    measured: Optional[Path] = _MEAS, measured_gpu: Optional[Path] = _MGPU,
    executor: Executor = _EXEC, workers: Optional[int] = _WORK,
    output: Output = OUTPUT_OPTION, json_flag: bool = JSON_OPTION,
) -> None:
    """Write ETTR-vs-size, lost-by-cause and interval-vs-hazard plots and a summary."""
    from seamguard.twin.events.report import write_report
    from seamguard.twin.events.sweep import interval_vs_hazard, size_sweep

    try:
        size_list = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        fail(f"--sizes must be comma-separated integers, got {sizes!r}")
    try:
        if not size_list or min(size_list) <= 0:
            raise ValueError("--sizes must list positive GPU counts")
        if runs < 1:
            raise ValueError(f"--runs must be at least 1, got {runs}")
        cfg, pols, figs = build_settings(
            gpus=max(size_list), days=days, compare="all", workload=workload,
            spare_fraction=0.02, node_failure_rate=node_failure_rate,
            link_profile_name="llama3", link_mttf_years=None,
            checkpoint_interval_min=checkpoint_interval_min,
            checkpoint_write_min=checkpoint_write_min, restart_cost_min=restart_cost_min,
            detection_delay_s=detection_delay_s, detection_precision=detection_precision,
            state_gib_per_gpu=28.0, measured=measured, measured_gpu=measured_gpu, detection=detection)
        for n in size_list:
            replace(cfg, gpus=n)   # validates every size before the sweep starts
        with phase(f"simulating {len(size_list)} sizes x {runs} run{'' if runs == 1 else 's'} x {len(pols)} policies"):
            sweep = size_sweep(cfg, pols, size_list, runs, seed, _value(executor), workers)
    except ValueError as exc:
        fail(str(exc))
    sg = next(p for p in pols if p.name == "seamguard")
    hazard = interval_vs_hazard(cfg, sg, job_nodes=cfg.nodes - cfg.spare_nodes)
    settings = {"days": days, "runs": runs, "seed": seed, "workload": _value(workload),
                "node_failure_rate": node_failure_rate, "measured_source": figs.source,
                **detection_settings(detection, detection_delay_s, detection_precision)}
    files = write_report(out, sweep, sweep[max(size_list)], hazard, settings)
    if wants_json(output, json_flag):
        emit({"out": str(out), "files": [str(f) for f in files], "measured_source": figs.source}, True)
        return
    for f in files:
        typer.echo(str(f))
    _echo_wrapped(figures_line(figs))
