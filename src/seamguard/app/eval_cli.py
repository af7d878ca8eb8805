"""`seamguard eval` and `seamguard scenarios generate`: the shell over seamguard.app.eval and
seamguard.scenarios (registered in seamguard.app.cli). Conventions: seamguard.clikit."""

from __future__ import annotations

from pathlib import Path

import typer

from seamguard.clikit import HELP_STYLE, JSON_OPTION, OUTPUT_OPTION, Output, emit, fail, phase, wants_json

scenarios_app = typer.Typer(help="Fleet histories with labelled faults, for `seamguard replay` and `seamguard eval`.",
                            no_args_is_help=True, rich_markup_mode=HELP_STYLE)


def _fmt(v: object, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}{unit}"
    return f"{v}{unit}"


def _table(res: dict) -> None:
    o = res["overall"]
    lines = [
        ("incidents", f"{o['incidents']} ({o['detected']} detected, recall {_fmt(o['recall'])})"),
        ("precision", f"{_fmt(o['precision'])} ({o['false_flags']} of {o['flagged_entities']} flagged "
                      f"entities not covered by any incident)"),
        ("delay", f"median {_fmt(o['median_delay_s'], ' s')}, p90 {_fmt(o['p90_delay_s'], ' s')}"),
        ("lead", f"median {_fmt(o['median_lead_s'], ' s')}, min {_fmt(o['min_lead_s'], ' s')} "
                 f"({o['hard_failures_unwarned']} of {o['with_hard_failure']} hard failures not flagged before)"),
        ("actions", f"{o['actions']} ({_fmt(o['actions_per_fault'])} per incident), {o['false_actions']} false, "
                    f"{o['healthy_drains']} drains of healthy nodes"),
        ("checkpoints", f"{o['checkpoint_requests']} requested ({_fmt(o['checkpoint_requests_per_fault'])} per "
                        f"incident, at most {o['max_checkpoint_requests_per_fault']} for one)"),
    ]
    w = max(len(k) for k, _ in lines)
    for k, v in lines:
        typer.echo(f"{k:<{w}}  {v}")
    if res["per_class"]:
        typer.echo("")
        hdr = ("fault", "n", "recall", "median delay", "p90 delay", "median lead", "actions/f", "ckpt/f")
        rows = [(c, str(f["incidents"]), _fmt(f["recall"]), _fmt(f["median_delay_s"], " s"),
                 _fmt(f["p90_delay_s"], " s"), _fmt(f["median_lead_s"], " s"), _fmt(f["actions_per_fault"]),
                 _fmt(f["checkpoint_requests_per_fault"])) for c, f in res["per_class"].items()]
        widths = [max(len(r[i]) for r in [hdr, *rows]) for i in range(len(hdr))]
        for r in [hdr, *rows]:
            typer.echo("  ".join(x.ljust(widths[i]) if i == 0 else x.rjust(widths[i]) for i, x in enumerate(r)))
    missed = [i for i in res["incidents"] if not i["detected"]]
    if missed:
        typer.echo("\nmissed: " + ", ".join(f"{i['id']} {i['fault']} {i['kind']}:{i['entity']}" for i in missed))
    for title, d in (("false flags", res["false_flags"]), ("false actions", res["false_actions"])):
        if d:
            items = sorted(d.items(), key=lambda kv: -kv[1])
            more = f" (+{len(items) - 10} more; -o json lists all)" if len(items) > 10 else ""
            typer.echo(f"{title}: " + ", ".join(f"{k} ×{v}" for k, v in items[:10]) + more)


def eval_command(
    labels: Path = typer.Argument(..., help="Labelled incidents, YAML or JSON (docs/evaluation.md)."),
    timeline: Path = typer.Argument(..., help="JSON lines written by `seamguard replay --out` or `seamguard run`."),
    topology: Path | None = typer.Option(None, "--topology",
                                         help="Fleet topology YAML: containment (GPU in node, node on loop) and "
                                              "jobs for matching. Without it only names relate entities."),
    tolerance_s: float = typer.Option(60.0, "--tolerance-s", min=0.0,
                                      help="A detection up to this long before the labelled start counts."),
    grace_s: float = typer.Option(600.0, "--grace-s", min=0.0,
                                  help="Flags and actions this long after a labelled end are still covered."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Score a replay timeline against labelled incidents: detection, delay, lead, false flags and actions."""
    from seamguard.app.eval import EvalInputError, Relations, check_labels, load_labels, read_timeline, score

    try:
        incidents = load_labels(labels)
        events = read_timeline(timeline)
    except EvalInputError as e:
        fail(str(e))
    rel = Relations()
    if topology is not None:
        from seamguard.app.config import ConfigError, load_topology
        from seamguard.fleet import TopologyError

        try:
            rel = Relations(load_topology(topology))
        except (ConfigError, TopologyError) as e:
            fail(str(e))
    errors, warnings = check_labels(incidents, events, rel, tolerance_s)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        fail(f"{labels}: {errors[0]}{more}")
    for w in warnings:
        typer.echo(f"warning: {timeline}: {w}", err=True)
    res = score(incidents, events, rel, tolerance_s=tolerance_s, grace_s=grace_s)
    emit(res, wants_json(output, json_flag), _table)


def scenarios_generate(
    out_dir: Path = typer.Option(..., "--out-dir", help="Directory for history.om, topology.yaml, labels.yaml, "
                                                         "truth.json (created)."),
    gpus: int = typer.Option(256, "--gpus", min=64, help="GPUs in the fleet."),
    minutes: float = typer.Option(60.0, "--minutes", min=20.0, help="Length of the history."),
    seed: int = typer.Option(0, "--seed", help="Seed for the fleet, the hardware spread, events and faults."),
    scrape_s: float = typer.Option(30.0, "--scrape-s", min=1.0, help="Scrape interval in seconds."),
    faults: str = typer.Option("", "--faults",
                               help="Comma-separated fault classes (default: 6, rotating with the seed through the "
                                    "physics' classes); 'none' for a healthy fleet. Classes: see docs/evaluation.md."),
    physics: str = typer.Option("dev", "--physics",
                                help="'dev': the development physics and its 13 classes; 'shifted': the held-out "
                                     "physics (gradual onsets, healthy error backgrounds, stale exporters, the node "
                                     "agent) and its classes (docs/evaluation.md, 'Held-out histories')."),
    start: str | None = typer.Option(None, "--start", help="First scrape (Unix seconds or RFC 3339); default: "
                                                            "the window ends an hour ago."),
    tsdb: Path | None = typer.Option(None, "--tsdb", help="Also backfill a Prometheus TSDB here (promtool)."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Write a fleet history (OpenMetrics) with labelled faults, independent of the detector."""
    import time

    from seamguard.scenarios import FAULT_CLASS_NAMES, ScenarioSpec, generate_files, rotating_classes
    from seamguard.scenarios.faults import HELDOUT_CLASS_NAMES
    from seamguard.scenarios.shifted import GENERATOR_VERSION, PHYSICS

    if physics not in PHYSICS:
        fail(f"--physics: expected one of {', '.join(PHYSICS)}, got {physics!r}")
    known = HELDOUT_CLASS_NAMES if physics == "shifted" else FAULT_CLASS_NAMES
    if faults.strip() == "none":
        classes: tuple[str, ...] = ()
    elif faults.strip():
        classes = tuple(c.strip() for c in faults.split(",") if c.strip())
        bad = [c for c in classes if c not in known]
        if bad:
            fail(f"--faults: unknown fault class(es) for --physics {physics}: {', '.join(bad)}; "
                 f"known: {', '.join(known)}")
    else:
        classes = rotating_classes(seed, 6, known)
    if start is None:
        t0 = float(int(time.time() // 60 * 60) - 3600 - int(minutes * 60))
    else:
        from seamguard.app.eval import EvalInputError, parse_time

        try:
            t0 = parse_time(start, "--start")
        except EvalInputError as e:
            fail(str(e))
    if out_dir.exists() and not out_dir.is_dir():
        fail(f"--out-dir: {out_dir} exists and is not a directory")
    try:
        spec = ScenarioSpec(gpus=gpus, minutes=minutes, seed=seed, scrape_s=scrape_s, start_unix=t0, faults=classes,
                            physics=physics)
        with phase(f"generating {minutes:g} min of a {gpus}-GPU fleet into {out_dir}"):
            gen = generate_files(spec, out_dir)
    except ValueError as e:
        fail(str(e))
    except OSError as e:
        fail(f"--out-dir: cannot write {out_dir}: {e.strerror or e}")
    if tsdb is not None:
        from seamguard.scenarios.backfill import BackfillError, backfill_file

        try:
            with phase(f"backfilling {tsdb} with promtool"):
                backfill_file(gen.openmetrics, tsdb)
        except BackfillError as e:
            fail(f"--tsdb: {e}")
    emit({"out_dir": str(out_dir), "openmetrics": str(gen.openmetrics), "topology": str(gen.topology),
          "labels": str(gen.labels), "truth": str(gen.truth), "start": gen.start, "end": gen.end,
          "scrape_s": gen.scrape_s, "samples": gen.samples, "incidents": len(gen.incidents),
          "tsdb": str(tsdb) if tsdb is not None else None, "physics": physics,
          "generator_version": GENERATOR_VERSION}, wants_json(output, json_flag))
