"""`seamguard twin calibrate` and `twin simulate --calibrated`: the edge that reads your fleet's history.

Why this file exists: the twin (seamguard.twin) may not import the goodput package's readers
(they share a layer), so the reading happens here, in the shell: the topology (app/config.py),
the ledger's transitions and actions and Slurm's allocations (goodput/sources.py, the readers
live goodput uses), the runtime's measured checkpoint figures (twin/events/measured.py). Every
input is checked before any is read and the output file is written only once everything
validated; a bad input is one ``error:`` line (seamguard.clikit). The estimation is
twin/calibrate.py, its use twin/calibrated.py; see docs/twin-events.md, "Calibrated on your fleet".
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer
import yaml

from seamguard.clikit import emit, fail, phase

__all__ = ["calibrate", "simulate_calibrated"]

def _checkpoint(measured: Optional[Path]) -> dict | None:
    if measured is None:
        return None
    from seamguard.twin.events.measured import load_runtime_figures

    if not measured.is_file():
        fail(f"--measured: no such file {measured}")
    try:
        f = load_runtime_figures(measured)
    except ValueError as e:
        fail(f"--measured: {e}")
    return {"source": "measured", "from": f.source, "save_s_per_gib": f.save_s_per_gib,
            "restore_s_per_gib": f.restore_s_per_gib, "snapshot_stall_ratio": f.snapshot_stall_ratio,
            "relaunch_s": f.relaunch_s}


def calibrate(
    topology: Path = typer.Option(..., "--topology", help="Fleet topology: the entities each rate is per."),
    ledger: str = typer.Option(..., "--ledger", help="The controller's ledger (SQLite path or postgresql:// URL)."),
    out: Path = typer.Option(..., "--out", "-o", help="The calibrated config to write (YAML)."),
    since: str = typer.Option("7d", "--since", help="Window start: a span back from --until (7d, 12h), Unix s or "
                                                    "RFC 3339."),
    until: Optional[str] = typer.Option(None, "--until", help="Window end (default: now)."),
    slurm: bool = typer.Option(False, "--slurm", help="Ask Slurm (sacct, scontrol) for each job's allocations: "
                                                      "interruptions and recovery times."),
    completion: bool = typer.Option(False, "--sacct-completion", help="sacct -c: the job-completion log (no "
                                                                      "slurmdbd); implies --slurm."),
    sacct: str = typer.Option("sacct", "--sacct", help="sacct binary."),
    scontrol: str = typer.Option("scontrol", "--scontrol", help="scontrol binary."),
    measured: Optional[Path] = typer.Option(None, "--measured", metavar="FILE",
                                            help="The runtime's measured checkpoint figures (results JSON of "
                                                 "benchmarks/failover_training.py)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Run config: its jobs' deadline, total_steps "
                                                                 "and step_s (for the release-slip forecast); "
                                                                 "its prometheus: section maps --prometheus' "
                                                                 "labels."),
    prometheus: Optional[str] = typer.Option(None, "--prometheus", help="Base URL of a Prometheus-compatible API "
                                                                        "holding the jobs' series: each job's "
                                                                        "measured snapshot stall."),
) -> None:
    """Measure the twin's failure rates, repair, recovery and detection times on your fleet's history."""
    from seamguard.app.config import ConfigError, load_run_config, load_topology, with_job_schedule
    from seamguard.app.goodput_cli import parse_window
    from seamguard.fleet import TopologyError
    from seamguard.ledger.postgres import redact
    from seamguard.twin.answer import fleet_exposure, fleet_jobs
    from seamguard.twin.calibrate import calibrate as estimate, published_priors
    from seamguard.twin.events.calibration import llama3_failure_model

    t0, t1 = parse_window(since, until)
    pcfg = None
    try:
        fleet = load_topology(topology)
        if config is not None:
            run_cfg = load_run_config(config)
            fleet, pcfg = with_job_schedule(fleet, run_cfg.jobs, f"--config {config}"), run_cfg.prometheus
    except (ConfigError, TopologyError) as e:
        fail(str(e))
    pcfg = _prom_config(pcfg, prometheus)
    if "://" not in ledger and not Path(ledger).is_file():
        fail(f"--ledger: {ledger}: no such file")
    if out.is_dir() or not out.parent.is_dir():
        fail(f"--out: {out}: not a file in an existing directory")
    checkpoint = _checkpoint(measured)
    exposure = fleet_exposure(fleet)
    scheduler = (sacct, scontrol, completion) if (slurm or completion) else None
    trs, acts, runs = _read_history(ledger, fleet, t0, t1, scheduler)
    rates, durations = published_priors(llama3_failure_model())
    doc = estimate(trs, acts, runs, exposure, t0, t1, rates, durations, checkpoint)
    stalls = _stalls(fleet, pcfg, t0, t1) if prometheus is not None else {}
    for name, spec in fleet_jobs(fleet, t1).items():
        doc["jobs"].setdefault(name, {}).update(spec)
        if name in stalls:
            doc["jobs"][name]["snapshot_stall"] = stalls[name]
    doc["sources"] = {"topology": str(topology), "ledger": redact(ledger) if "://" in ledger else ledger,
                      "scheduler": ("sacct -c" if completion else "sacct") if (slurm or completion) else None,
                      "transitions": len(trs), "actions": len(acts), "allocations": len(runs)}
    _write(out, doc)
    typer.echo(f"{out}: {sum(h['source'] == 'measured' and h['count'] > 0 for h in doc['hazards'])} hazards measured, "
               f"{sum(h['source'] == 'prior' for h in doc['hazards'])} from priors, "
               f"{len(doc['jobs'])} jobs, window {doc['window']['days']:.2f} days")


def _prom_config(pcfg, url: Optional[str]):
    """The run config's prometheus: section (its label mapping) with ``--prometheus`` as its URL."""
    if url is None:
        return pcfg
    from pydantic import ValidationError

    from seamguard.observe.prometheus import PromConfig

    try:
        return pcfg.model_copy(update={"url": url}) if pcfg is not None else PromConfig(url=url)
    except ValidationError as e:
        fail(f"--prometheus: {str(e.errors()[0]['msg']).removeprefix('Value error, ')}")


SERIES_STEP_S = 60.0  # one sample a minute: a week is 10,080 points per job


def _stalls(fleet, pcfg, t0: float, t1: float) -> dict[str, dict]:
    """Each topology job's snapshot stall from its own series (jobs that never reported are left out)."""
    from seamguard.goodput.sources import SourceError, read_series
    from seamguard.observe.prometheus import PrometheusSource
    from seamguard.twin.calibrate import snapshot_stall

    step = min(SERIES_STEP_S, max((t1 - t0) / 100.0, 1.0))
    try:
        with PrometheusSource(fleet, pcfg) as src, phase("reading the jobs' series"):
            series = read_series(src, list(fleet.job_names), t0, t1, step)
    except SourceError as e:
        fail(str(e), code=1)
    return {j: snapshot_stall(s.t_s, s.stall_s) for j, s in series.items() if np.isfinite(s.stall_s).any()}


def _read_history(ledger: str, fleet, t0: float, t1: float,
                  scheduler: tuple[str, str, bool] | None) -> tuple[list[dict], list[dict], list]:
    """(transitions, actions, JobRuns) of the window: the ledger's rows and, with ``scheduler``
    ((sacct, scontrol, completion log)), every topology job's allocations."""
    from seamguard.goodput.sources import SourceError, read_ledger, read_runs
    from seamguard.ledger import open_reader
    from seamguard.twin.calibrate import JobRun

    try:
        reader = open_reader(ledger)
    except Exception as e:  # not a ledger, a server gone: sqlite3 / psycopg errors
        fail(f"--ledger: cannot open {ledger}: {type(e).__name__}: {e}", code=1)
    runs: list[JobRun] = []
    try:
        with phase("reading the ledger and the scheduler"):
            trs, acts = read_ledger(reader, t0, t1)
            if scheduler is not None:
                sacct, scontrol, completion = scheduler
                for j, gpus in zip(fleet.job_names, fleet.job_gpu_count):
                    runs += [JobRun(j, r.start_s, r.end_s, r.state, int(gpus))
                             for r in read_runs(j, t0, t1, sacct=sacct, scontrol=scontrol, completion=completion)]
    except SourceError as e:
        fail(str(e), code=1)
    finally:
        reader.close()
    return trs, acts, runs


def _write(out: Path, doc: dict) -> None:
    """Write whole or not at all (a temporary file renamed over the target)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(_plain(doc), f, sort_keys=False, width=120)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(x):
    """Numbers and containers YAML writes plainly (numpy scalars, tuples, inf)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _load(path: Path) -> dict:
    from seamguard.twin.calibrated import check

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        fail(f"--calibrated: cannot read {path}: {str(e).splitlines()[0]}")
    try:
        return check(doc, f"--calibrated {path}")
    except ValueError as e:
        fail(str(e))


def simulate_calibrated(path: Path, *, draws: int, seeds: int, seed: int, state_gib_per_gpu: float,
                        checkpoint_write_min: float, as_json: bool, detection=None, whatifs: list[str] = (),
                        base: list[str] = (), policy: Optional[Path] = None) -> None:
    """The event twin on the calibrated rates (fleet ETTR), the per-job answers and, with ``whatifs``, the
    window's faults replayed under each controller variant (twin/answer.py), with intervals."""
    from seamguard.twin.answer import answer
    from seamguard.twin.calibrated import seamguard_params
    from seamguard.twin.whatif import base_settings, variants

    if seeds < 1 or seed < 0:
        fail(f"--runs must be >= 1 and --seed >= 0, got {seeds} and {seed}")
    if (base or policy) and not whatifs:
        fail("--base and --controller-policy describe what the --whatif variants are compared with: "
             "give at least one --whatif")
    runs_today: list[str] = []
    if policy is not None:
        from seamguard.app.config import ConfigError, load_policy
        from seamguard.decide.policy import PolicyError

        try:
            pol = load_policy(policy)
        except (ConfigError, PolicyError, OSError) as e:
            fail(f"--controller-policy: {str(e).splitlines()[0]}")
        runs_today = base_settings(pol.mode, pol.breaker)
    try:
        asked = variants([*runs_today, *base], whatifs) if whatifs else None
    except ValueError as e:
        fail(f"--whatif/--base: {e}")
    doc = _load(path)
    started = time.perf_counter()
    try:
        with phase(f"{draws} draws x {seeds} seeds"):
            result = answer(doc, draws=draws, seeds=seeds, seed=seed, policy=seamguard_params(doc, detection),
                            state_gib_per_gpu=state_gib_per_gpu, checkpoint_write_min=checkpoint_write_min,
                            variants=asked)
    except ValueError as e:
        fail(f"--calibrated {path}: {e}")
    emit(_plain({"calibrated": str(path), **result, "wall_s": time.perf_counter() - started}), as_json, _table)


def _table(d: dict) -> None:
    def ci(x, fmt="{:.3g}"):
        return "-" if x is None else f"{fmt.format(x[1])} [{fmt.format(x[0])}, {fmt.format(x[2])}]"
    typer.echo(f"{d['gpus']:,} GPUs, {d['days']:.2f} days, {d['draws']} draws x {d['seeds']} seeds "
               f"(median [2.5 %, 97.5 %])")
    typer.echo(f"fleet ETTR (seamguard policy) {ci(d['fleet_ettr'], '{:.4f}')}; detection: "
               + (f"{d['detection']} (measured)" if isinstance(d["detection"], str)
                  else f"every event after {d['detection']['delay_s']:g} s"))
    for j in d["jobs"]:
        iv = [x / 60.0 for x in j["interval_s"]]
        typer.echo(f"{j['job']} ({j['gpus']} GPUs): checkpoint every {ci(iv, '{:.0f}')} min to {j['tier']}, "
                   f"ETTR {ci(j['ettr'], '{:.4f}')}, hot spares {ci(j['hot_spares'], '{:.0f}')}, "
                   f"P(slip) {ci(j['p_slip'], '{:.2f}')}")
    if d.get("whatif"):
        _whatif_table(d["whatif"], ci)
    if d["priors_used"]:
        typer.echo(f"published priors used for: {', '.join(d['priors_used'])}")


def _whatif_table(w: dict, ci) -> None:
    s = w["samples"]
    typer.echo(f"what-if: the window's {w['incidents_in_window']['hard']} hard and {w['incidents_in_window']['gray']} "
               f"gray incidents replayed, {s['done']} of {s['asked']} samples; change against base "
               f"(median [2.5 %, 97.5 %])")
    for v in w["variants"]:
        if v["variant"] == "base":
            typer.echo(f"  base: ETTR {ci(v['ettr'], '{:.4f}')}, drained {ci(v['drained_nodes'], '{:.0f}')} nodes, "
                       f"held by breaker {ci(v['held_by_breaker'], '{:.0f}')}")
            continue
        typer.echo(f"  {v['variant']}: ETTR {ci(v['delta_ettr'], '{:+.4f}')}, GPU-hours "
                   f"{ci(v['delta_gpu_hours'], '{:+,.0f}')}, better in {v['better_share']:.0%} of samples, drained "
                   f"{ci(v['drained_nodes'], '{:.0f}')} nodes, held by breaker {ci(v['held_by_breaker'], '{:.0f}')}")
    if w["not_replayed"]:
        typer.echo("  not replayed (no twin process): " + ", ".join(f"{k} {n}" for k, n in w["not_replayed"].items()))
