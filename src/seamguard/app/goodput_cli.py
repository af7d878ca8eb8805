"""`seamguard goodput`: where each job's wall time went over a window, from the live cluster.

The edge of seamguard.goodput: reads the flags and the run config, asks Prometheus for the
job's own series, Slurm for its allocations (``--slurm``) and the ledger for what the
controller saw and did, then renders the one `Goodput` record per job (and the fleet's) as
a table or one JSON object. Every input is checked before any source is asked; a bad one
is one ``error:`` line (seamguard.clikit).
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import typer

from seamguard.clikit import JSON_OPTION, OUTPUT_OPTION, Output, emit, fail, phase, wants_json

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_WINDOW_S = 31 * 86400.0
LOOKBACK_S = 6 * 3600.0  # series before the window: the highest step reached, the clean step time
LEDGER_LOOKBACK_S = 86400.0  # transitions before the window: states already open at its start


def parse_when(text: str, flag: str, now_s: float) -> float:
    """``7d``/``12h``/``30m`` before ``now_s``, Unix seconds, or RFC 3339."""
    m = _AGO.match(text.strip())
    if m:
        return now_s - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        d = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail(f"{flag}: cannot read {text!r}: give a span back from now (7d, 12h, 30m), Unix seconds or RFC 3339")
    if d.tzinfo is None:
        fail(f"{flag}: {text!r} has no timezone (add Z or +00:00)")
    return d.timestamp()


def parse_window(since: str, until: str | None) -> tuple[float, float]:
    """(start, end) Unix seconds of ``--since``/``--until`` (end: now), at most `MAX_WINDOW_S` long."""
    now = time.time()
    t1 = parse_when(until, "--until", now) if until is not None else now
    t0 = parse_when(since, "--since", t1)
    if not t0 < t1:
        fail(f"--since ({since}) must be before --until ({until or 'now'})")
    if t1 - t0 > MAX_WINDOW_S:
        fail(f"--since/--until: {(t1 - t0) / 86400:.1f} days; at most {MAX_WINDOW_S / 86400:.0f} days at once")
    return t0, t1


def _table(d: dict) -> None:
    """Per job: wall time and ETTR, seconds and share per cause, then the lost time by cause,
    entity and seam; the fleet last."""
    for r in [*d["jobs"], d["fleet"]]:
        w = r["wall_s"]
        ettr = f"{r['ettr']:.3f}" if r["ettr"] is not None else "-"
        typer.echo(f"{r['job']}  wall {_dur(w)}  ETTR {ettr}")
        for c, sec in r["by_cause_s"].items():
            if sec > 0 or c == "productive":
                typer.echo(f"  {c:<17} {_dur(sec):>10} {sec / w if w else 0:>7.1%}")
        lost = _lost_by_entity(r)
        if lost:
            typer.echo("  lost by cause, entity and seam:")
        for (cause, ent, seam), sec in lost[:10]:
            typer.echo(f"    {_dur(sec):>10}  {cause:<16} {ent} [{seam}]")
        for n in r["notes"]:
            typer.echo(f"  note: {n}")
        typer.echo("")


def _lost_by_entity(r: dict) -> list[tuple[tuple[str, str, str], float]]:
    acc: dict[tuple[str, str, str], float] = {}
    for s in r.get("spans", []):
        if s["cause"] != "productive":
            k = (s["cause"], s["entity"], s["seam"])
            acc[k] = acc.get(k, 0.0) + s["seconds"]
    return sorted(acc.items(), key=lambda kv: -kv[1])


def _dur(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def _sources(config: Path | None, prometheus: str | None, topology: Path | None, ledger: str | None):
    """(PromConfig, fleet or None, ledger target or None, slurm binaries) from flags over the config."""
    from pydantic import ValidationError

    from seamguard.app.config import ConfigError, load_run_config, load_topology
    from seamguard.fleet import TopologyError
    from seamguard.observe.prometheus import PromConfig

    try:
        cfg = load_run_config(config) if config is not None else None
        pcfg = cfg.prometheus if cfg is not None else None
        if prometheus is not None:
            pcfg = pcfg.model_copy(update={"url": prometheus}) if pcfg is not None else PromConfig(url=prometheus)
        if pcfg is None:
            fail("--prometheus: give the Prometheus URL (or --config with a prometheus: section)")
        topo = topology if topology is not None else (cfg.topology if cfg is not None else None)
        fleet = load_topology(topo) if topo is not None else None
    except (ConfigError, TopologyError) as e:
        fail(str(e))
    except ValidationError as e:
        fail(f"--prometheus: {str(e.errors()[0]['msg']).removeprefix('Value error, ')}")
    led = ledger if ledger is not None else (str(cfg.ledger) if cfg is not None else None)
    slurm = next((a for a in (cfg.actuators if cfg is not None else []) if a.type == "slurm"), None)
    bins = (slurm.scontrol if slurm is not None else "scontrol",
            str(Path(slurm.scontrol).with_name("sacct")) if slurm is not None and "/" in slurm.scontrol else "sacct")
    return pcfg, fleet, led, bins


def goodput(
    job: list[str] = typer.Option(..., "--job", help="Job name (the runtime's job_name label, Slurm's JobName); "
                                                     "repeatable."),
    since: str = typer.Option("7d", "--since", help="Window start: a span back from --until (7d, 12h, 30m), "
                                                    "Unix seconds or RFC 3339."),
    until: str | None = typer.Option(None, "--until", help="Window end (default: now)."),
    config: Path | None = typer.Option(None, "--config", help="Run config: its prometheus:, topology, ledger "
                                                              "and Slurm actuator are used."),
    prometheus: str | None = typer.Option(None, "--prometheus", help="Base URL of a Prometheus-compatible API."),
    topology: Path | None = typer.Option(None, "--topology", help="Fleet topology: which entities each job "
                                                                  "runs on (else only actions on the job count)."),
    ledger: str | None = typer.Option(None, "--ledger", help="The controller's ledger (SQLite path or "
                                                             "postgresql:// URL)."),
    slurm: bool = typer.Option(False, "--slurm", help="Ask Slurm (sacct, scontrol) for the job's allocations."),
    completion: bool = typer.Option(False, "--sacct-completion", help="sacct -c: read the job-completion log "
                                                                      "(no slurmdbd)."),
    step: float = typer.Option(15.0, "--step", min=0.5, help="Seconds between samples of the job's series."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Each job's wall time split into productive, checkpoint stall, rollback, restart, straggler or
    gray link, degraded mode and unattributed, with the entity and seam behind each lost minute."""
    from seamguard.goodput import fleet as fleet_of
    from seamguard.goodput.evidence import goodput_of, job_entities
    from seamguard.goodput.sources import SourceError, read_ledger, read_runs, read_series
    from seamguard.ledger import open_reader
    from seamguard.observe.prometheus import PrometheusSource

    t0, t1 = parse_window(since, until)
    job = list(dict.fromkeys(job))
    if any(not j.strip() or len(j) > 256 for j in job):
        fail("--job: a job name is 1 to 256 characters")
    pcfg, fleet, led, (scontrol, sacct) = _sources(config, prometheus, topology, ledger)
    if led is not None and "://" not in led and not Path(led).is_file():
        fail(f"--ledger: {led}: no such file")
    reports = []
    reader = open_reader(led) if led is not None else None
    try:
        with PrometheusSource(_empty_fleet(fleet), pcfg) as src, phase(f"reading {len(job)} job(s)"):
            trs, acts = read_ledger(reader, t0 - LEDGER_LOOKBACK_S, t1, onsets_from_s=t0) if reader else ([], [])
            series = read_series(src, job, t0 - LOOKBACK_S, t1, step)
            for j in job:
                runs = read_runs(j, t0, t1, sacct=sacct, scontrol=scontrol, completion=completion) if slurm else []
                ents = job_entities(fleet, j) if fleet is not None and j in fleet.job_names else set()
                reports.append(goodput_of(j, t0, t1, series[j], runs, trs, acts, ents))
    except SourceError as e:
        fail(str(e), code=1)
    finally:
        if reader is not None:
            reader.close()
    emit({"since_s": t0, "until_s": t1, "jobs": [r.to_dict() for r in reports],
          "fleet": fleet_of(reports, t0, t1).to_dict(spans=False)}, wants_json(output, json_flag), _table)


def _empty_fleet(fleet):
    """PrometheusSource wants a fleet to map series to; range_series does not use it."""
    if fleet is not None:
        return fleet
    from seamguard.fleet.topology import parse_topology

    return parse_topology({"version": 1, "name": "goodput", "cooling_loops": [{"name": "-", "rated_flow_lpm": 1}],
                           "racks": [{"name": "-", "cooling_loop": "-"}], "storage_paths": ["-"],
                           "nodes": [{"name": "-", "rack": "-", "storage": "-", "gpus": 1}]})
