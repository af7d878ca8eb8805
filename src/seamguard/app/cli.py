"""The `seamguard` command line: the edge where files, environment and flags are read.

Every subcommand is a thin shell over library code; nothing here holds logic that a
test of the core would need. Conventions (seamguard.clikit): a user error is one
``error: ...`` line and exit status 2; every command that reports takes ``-o table|json``
(``--json`` for short); output files are ``--out``, a policy file is ``--policy``; long
work shows progress on stderr, live only on a terminal.
"""

from __future__ import annotations

import sys
from enum import Enum
from importlib.metadata import PackageNotFoundError, version as package_version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from seamguard.app import agent_cli, eval_cli, fleet_cli, gateway_cli, goodput_cli
from seamguard.app import twin_cli as twin_events_cli
from seamguard.clikit import (HELP_STYLE, JSON_OPTION, OUTPUT_OPTION, Group, Output, emit, fail, interactive,
                                  phase, wants_json)
from seamguard.decide.policy import Mode
from seamguard.runtime import cli as runtime_cli
from seamguard.testbed import cli as testbed_cli

if TYPE_CHECKING:
    from pydantic import ValidationError

    from seamguard.observe.frame import Frame

app = typer.Typer(
    name="seamguard",
    help="Gray-failure control plane, resilient runtime and digital twin for GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    cls=Group,
    rich_markup_mode=HELP_STYLE,
)
twin_app = typer.Typer(help="The digital twin: simulated telemetry and discrete-event planning.",
                       no_args_is_help=True, rich_markup_mode=HELP_STYLE)
fleet_app = typer.Typer(help="Topology files: generate, import, validate.", no_args_is_help=True,
                        rich_markup_mode=HELP_STYLE)
policy_app = typer.Typer(help="Decision policy: show the default, validate a file.", no_args_is_help=True,
                         rich_markup_mode=HELP_STYLE)
# short_help: one line each in `seamguard --help` at 80 columns (click cuts longer ones with "...")
app.add_typer(twin_app, name="twin", short_help="Simulated telemetry and discrete-event planning.")
app.add_typer(fleet_app, name="fleet", short_help="Topology files: generate, import, validate.")
fleet_app.command("import", short_help="Write the topology from Slurm, Kubernetes and ibnetdiscover.")(
    fleet_cli.fleet_import)
app.add_typer(policy_app, name="policy", short_help="Decision policy: show the default, validate a file.")
twin_app.command("simulate", short_help="Discrete-event simulation: seamguard beside three baselines.")(
    twin_events_cli.simulate)
twin_app.command("report", short_help="ETTR-vs-size and cost plots plus a summary.")(twin_events_cli.report)
twin_app.command("calibrate", short_help="Measure the twin's rates on your ledger and Slurm history.")(
    twin_events_cli.calibrate)


class Scenario(str, Enum):
    default = "default"
    none = "none"


def _version() -> str:
    try:
        return package_version("seamguard")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"seamguard {_version()}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print the version and exit.")) -> None:
    """Gray-failure control plane, resilient runtime and digital twin for GPU clusters."""


def _seed_option(what: str = "the fleet, the faults and the noise") -> Any:
    return typer.Option(0, "--seed", help=f"Seed for {what}.")


def _out_file(path: Path | None, flag: str = "--out") -> None:
    """An output file's directory must exist and the path must not be a directory (checked before work)."""
    if path is None:
        return
    if path.is_dir():
        fail(f"{flag}: {path} is a directory; give a file path")
    if not path.parent.is_dir():
        fail(f"{flag}: directory {path.parent} does not exist")


def _size(path: Path) -> str:
    try:
        n = path.stat().st_size
    except OSError:
        return ""
    return f" ({n / 1e6:.1f} MB)" if n >= 1e5 else f" ({n} bytes)"


def _write_topology(fleet, path: Path) -> None:
    """Topology YAML, dumped by libyaml when PyYAML has it (a 100k-GPU fleet is ~9 MB)."""
    import yaml

    from seamguard.fleet import fleet_to_topology

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(fleet_to_topology(fleet), Dumper=dumper, sort_keys=False, width=120)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{path}: cannot write: {e.strerror or e}")


@app.command(short_help="Score the control plane on the twin, with and without.")
def demo(
    gpus: int = typer.Option(2048, "--gpus", min=8, help="GPUs in the simulated fleet."),
    minutes: float = typer.Option(30.0, "--minutes", min=2.0, help="Simulated minutes."),
    seed: int = _seed_option(),
    ledger: Path | None = typer.Option(None, "--ledger", help="Keep the controller's SQLite ledger here."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Run the control plane against the twin, with and without control, and score it."""
    from rich.console import Console

    from seamguard.app.demo_view import run_demo
    from seamguard.ledger.sqlite import LedgerError

    as_json = wants_json(output, json_flag)
    _out_file(ledger, "--ledger")
    try:
        result = run_demo(gpus=gpus, minutes=minutes, seed=seed, ledger_path=ledger, live=interactive(),
                          out=None if as_json else Console(highlight=False))
    except LedgerError as e:
        fail(f"--ledger: {e}")
    if as_json:
        result.pop("false_action_list", None)
        emit(result, True)


@fleet_app.command("generate", short_help="Write a synthetic topology of any size.")
def fleet_generate(
    gpus: int = typer.Option(2048, "--gpus", min=8, help="GPUs in the fleet (rounded down to whole nodes)."),
    out: Path = typer.Option(..., "--out", help="Where to write the topology YAML."),
    seed: int = _seed_option("the fleet's layout"),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Write a synthetic topology of any size (e.g. --gpus 100000)."""
    from seamguard.fleet import FleetShape, generate_fleet

    _out_file(out)
    with phase(f"generating a fleet of {gpus} GPUs"):
        fleet = generate_fleet(FleetShape(gpus=gpus), seed=seed)
    with phase(f"writing {out}"):
        _write_topology(fleet, out)
    emit({"out": str(out), **fleet.summary()}, wants_json(output, json_flag))


@fleet_app.command("validate", short_help="Check a topology file; print its counts.")
def fleet_validate(
    path: Path = typer.Argument(..., help="Topology YAML to check."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Check a topology file; print its entity counts or what is wrong and where."""
    from seamguard.app.config import load_topology

    with phase(f"reading and checking {path}{_size(path)}"):
        fleet = _or_fail(lambda: load_topology(path))
    emit({"file": str(path), "valid": True, **fleet.summary()}, wants_json(output, json_flag))


@policy_app.command("show")
def policy_show() -> None:
    """Print the shipped default policy (YAML)."""
    from importlib import resources

    sys.stdout.write(resources.files("seamguard.decide").joinpath("default_policy.yaml").read_text())


@policy_app.command("validate")
def policy_validate(
    path: Path = typer.Argument(..., help="Policy YAML to check."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Check a policy file (merged over the default)."""
    from seamguard.app.config import load_policy

    pol = _or_fail(lambda: load_policy(path))
    emit({"file": str(path), "valid": True, "mode": pol.mode}, wants_json(output, json_flag))


# ---- training runtime (torch is imported inside these commands, never here) -----------------
app.command("launch", context_settings=runtime_cli.LAUNCH_CONTEXT,
            short_help="Train with hot spares, snapshots and recovery.")(runtime_cli.launch)
app.add_typer(testbed_cli.app, name="testbed", short_help="Namespaced multi-rail test cluster.")


# ---- telemetry in / actions out (issue 3): twin serve, replay, run -------------------------
@twin_app.command("serve", short_help="The twin's telemetry as a /metrics exporter.")
def twin_serve(
    gpus: int = typer.Option(256, "--gpus", min=8, help="GPUs in the simulated fleet."),
    seed: int = _seed_option(),
    tick_s: float = typer.Option(5.0, "--tick-s", min=0.01, help="Simulated seconds per twin tick."),
    speed: float = typer.Option(1.0, "--speed", min=0.01, help="Simulated seconds per wall second."),
    minutes: float = typer.Option(30.0, "--minutes", min=1.0,
                                  help="Scenario length in simulated minutes (fault timing)."),
    scenario: Scenario = typer.Option(Scenario.default, "--scenario", case_sensitive=False,
                                      help="default: one fault of each kind; none: a healthy fleet."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(9400, "--port", min=0, max=65535, help="Port to listen on (0 = any free port)."),
    truth_out: Path | None = typer.Option(None, "--truth-out",
                                          help="Write the injected faults' ground truth (JSON) here."),
    topology_out: Path | None = typer.Option(None, "--topology-out",
                                             help="Write the simulated fleet's topology YAML here."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Expose the twin's telemetry on /metrics under the real exporter names and labels."""
    import signal

    from seamguard.app.twin_exporter import ServeOptions, TwinExporter
    from seamguard.twin.closedloop import build

    _out_file(truth_out, "--truth-out")
    _out_file(topology_out, "--topology-out")
    fleet, specs, cfg = build(gpus, minutes, seed, tick_s=tick_s)
    if scenario == Scenario.none:
        specs = []
    if topology_out is not None:
        _write_topology(fleet, topology_out)
    try:
        exp = TwinExporter(fleet, specs, cfg, seed, ServeOptions(host, port, speed, truth_out))
    except OSError as e:
        fail(f"--host/--port: cannot listen on {host}:{port}: {e.strerror or e}")
    signal.signal(signal.SIGTERM, lambda *_: exp.stop())
    signal.signal(signal.SIGINT, lambda *_: exp.stop())
    info = {"url": f"http://{host}:{exp.port}/metrics", "gpus": len(fleet.gpu_names), "faults": len(specs),
            "period_s": tick_s / speed}
    emit(info, wants_json(output, json_flag),
         lambda d: typer.echo(f"seamguard twin serve: {d['url']}  ({d['gpus']} GPUs, {d['faults']} injected "
                              f"faults, a new frame every {d['period_s']:g} s)"))
    sys.stdout.flush()
    exp.run()


def _parse_time(v: str, flag: str) -> float:
    """Unix seconds or RFC 3339 (e.g. 2025-01-31T12:00:00Z)."""
    from datetime import datetime

    try:
        return float(v)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        fail(f"{flag}: cannot read time {v!r}: give Unix seconds or RFC 3339 (e.g. 2025-01-31T12:00:00Z)")


@app.command(short_help="Backtest the controller over Prometheus history.")
def replay(
    prometheus: str = typer.Option(..., "--prometheus", help="Base URL of a Prometheus-compatible API."),
    topology: Path = typer.Option(..., "--topology", help="Fleet topology YAML."),
    start: str = typer.Option(..., "--start", help="Start (Unix seconds or RFC 3339)."),
    end: str = typer.Option(..., "--end", help="End (Unix seconds or RFC 3339)."),
    step: float = typer.Option(15.0, "--step", min=0.001, help="Seconds between frames; the controller's tick."),
    out: Path = typer.Option(..., "--out", help="JSON lines: one per state change or decision."),
    policy: Path | None = typer.Option(None, "--policy", help="Policy YAML file (merged over the default)."),
    config: Path | None = typer.Option(None, "--config",
                                       help="Run config whose prometheus: section (auth, mapping) to use."),
    path_prefix: str = typer.Option("", "--path-prefix", help="API path prefix ('/prometheus' for Mimir)."),
    tenant: str | None = typer.Option(None, "--tenant", help="X-Scope-OrgID tenant header."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Backtest: run the controller (dry run) over history and write what it would have done."""
    import itertools
    import logging

    from pydantic import ValidationError

    from seamguard.app.config import load_policy, load_topology
    from seamguard.app.replay import replay as run_replay
    from seamguard.control import Controller
    from seamguard.observe.prometheus import PromConfig, PrometheusSource

    # A backtest's breaker trips and freezes are in its timeline; the log keeps to errors.
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Everything is validated before the output file is opened: a bad argument never truncates it.
    t0, t1 = _parse_time(start, "--start"), _parse_time(end, "--end")
    if t1 <= t0:
        fail(f"--end ({end}) must be after --start ({start})")
    _out_file(out)
    fleet = _or_fail(lambda: load_topology(topology))
    pol = _or_fail(lambda: load_policy(policy))
    try:
        pcfg = (_run_config(config).prometheus.model_copy(update={"url": prometheus}) if config is not None
                else PromConfig(url=prometheus, path_prefix=path_prefix, tenant=tenant))
    except ValidationError as e:
        fail(f"--prometheus: {_first_problem(e)}")
    ctl = Controller(fleet, pol, [], None, tick_s=step, mode="dry_run")
    tally = {"ticks": 0, "tick_errors": 0, "ticks_with_source_problems": 0, "ticks_with_data": 0}
    total = int((t1 - t0) // step) + 1
    with PrometheusSource(fleet, pcfg) as src:
        frames = src.frames(t0, t1, step)
        first = _first_frame(frames, prometheus)   # the first block's queries run before --out is opened
        with open(out, "w", encoding="utf-8") as fh, \
                phase(f"replaying {total} ticks from {prometheus} into {out}"):
            for frame, rep in run_replay(ctl, itertools.chain([first], frames), fh):
                tally["ticks"] += 1
                tally["tick_errors"] += bool(rep.error)
                tally["ticks_with_source_problems"] += bool(frame.flags)
                tally["ticks_with_data"] += _has_data(frame)
    emit({"out": str(out), **tally}, wants_json(output, json_flag))
    if tally["ticks_with_data"] == 0:
        fail(f"--start/--end: {prometheus} has no sample of any signal the topology maps between {start} and "
             f"{end}: the timeline holds no verdicts (check the window and the exporters' metric names)", code=1)


def _first_problem(e: ValidationError) -> str:
    """A pydantic error as one clause: ``url must start with http:// ...``."""
    err = e.errors()[0]
    return str(err["msg"]).removeprefix("Value error, ")


def _first_frame(frames, url: str):
    """The replay's first frame; every query of it failing (nothing listens, wrong path, auth) is
    one `error:` line before anything is written."""
    import logging

    prom_log = logging.getLogger("seamguard.observe.prometheus")
    level = prom_log.level
    prom_log.setLevel(logging.CRITICAL)   # the one line below says it; not one line per signal
    try:
        first = next(frames)
    finally:
        prom_log.setLevel(level)
    if not first.values and first.flags:
        fail(f"--prometheus: {url}: every query failed, e.g. {first.flags[0]}")
    return first


def _has_data(frame: Frame) -> bool:
    import numpy as np

    return any(bool(np.isfinite(v).any()) for v in frame.values.values())


@app.command(short_help="What the controller expected against what happened afterwards.")
def review(
    ledger: Path = typer.Option(..., "--ledger", help="A controller's SQLite ledger (seamguard run/serve/demo)."),
    horizon_h: float = typer.Option(6.0, "--horizon-h", min=0.001, help="Hours after a decision to judge its cause."),
    policy: Path | None = typer.Option(None, "--policy", help="Policy YAML whose hazard model to check (default: the default)."),
    job_end: list[str] = typer.Option([], "--job-end", help="JOB=TIME (ISO 8601 with timezone): when a job ended, "
                                                            "or its last step; repeatable. Checks its deadline forecasts."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """For each verb: decisions whose cause failed, recovered or stayed unhealthy within the horizon;
    the hazard model's predicted failure probability against the observed share; and each job's
    deadline forecasts against when it ended."""
    import sqlite3

    from seamguard.app import review as rv
    from seamguard.app.config import load_policy
    from seamguard.assess.states import State
    from seamguard.fleet.model import Kind
    from seamguard.ledger.sqlite import LedgerError, LedgerReader

    if not ledger.is_file():
        fail(f"--ledger: {ledger}: no such file")
    pol = _or_fail(lambda: load_policy(policy))
    ended = _or_fail(lambda: rv.parse_job_ends(job_end))
    hg = pol.assess.hysteresis_for(Kind.GPU)
    floors = {s.label: (hg.quarantine_enter if s >= State.CHECKPOINT_UNSAFE else hg.degrade_enter)
              for s in State if State.HEALTHY < s < State.FAILED}
    reader = LedgerReader(ledger)
    try:
        decisions, transitions = rv.read_all(reader.decisions), rv.read_all(reader.transitions)
    except (LedgerError, OSError, sqlite3.Error) as e:
        fail(f"--ledger: {ledger}: cannot read it as a seamguard ledger: {e}")
    finally:
        reader.close()
    end_s = max([float(r["t_s"]) for r in decisions + transitions], default=0.0)
    horizon_s = horizon_h * 3600.0
    verbs = rv.by_verb(rv.decision_outcomes(decisions, transitions, end_s, horizon_s))
    calib = rv.calibration(transitions, end_s, horizon_s, pol.assess.propagation.hazard_per_h_at_gfs1, floors)
    slip = rv.slip_review(decisions, ended)
    emit({"horizon_h": horizon_h, "by_verb": verbs, "calibration": calib, "deadlines": slip},
         wants_json(output, json_flag),
         lambda d: typer.echo("\n".join([rv.render(d["by_verb"], d["calibration"], horizon_s),
                                         *rv.render_slip(d["deadlines"])])))


app.command("goodput", short_help="Each job's wall time by cause: live goodput and ETTR.")(
    goodput_cli.goodput)


# ---- evaluation (issue 15): score a timeline against labels; scenario histories ---------------
app.command("eval", short_help="Score a replay timeline against labelled incidents.")(eval_cli.eval_command)
app.add_typer(eval_cli.scenarios_app, name="scenarios", short_help="Fleet histories with labelled faults.")
eval_cli.scenarios_app.command("generate", short_help="Write a history (OpenMetrics) and its labels.")(
    eval_cli.scenarios_generate)


@app.command(short_help="Live controller against Prometheus.")
def run(
    config: Path = typer.Option(..., "--config", help="Run config YAML (docs/prometheus-slurm.md)."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Live controller against Prometheus on a schedule (dry run unless the config says enforce)."""
    import logging
    import signal

    from seamguard.app.runner import Runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = _run_config(config)
    runner = _or_fail(lambda: Runner.from_config(cfg))
    fleet = runner.controller.fleet
    logging.getLogger("seamguard.runner").info(
        "controller started: %s, every %g s from %s, mode %s, ledger %s; state changes and actions are logged "
        "as they happen, SIGTERM or Ctrl-C stops after the tick in progress", _fleet_size(fleet), runner.tick_s,
        runner.source.name, runner.controller.mode, runner.ledger.where)
    # Finish the tick in progress, then close the ledger (Runner.run's finally).
    signal.signal(signal.SIGTERM, lambda *_: runner.request_stop())
    signal.signal(signal.SIGINT, lambda *_: runner.request_stop())
    try:
        ticks = runner.run()
    except RuntimeError as e:
        fail(f"the controller loop died: {e}", code=1)
    emit({"ticks": ticks, "mode": runner.controller.mode, "ledger": runner.ledger.where}, wants_json(output, json_flag))


def _fleet_size(fleet) -> str:
    from seamguard.fleet.model import Kind

    return f"{fleet.count(Kind.GPU)} GPUs on {fleet.count(Kind.NODE)} nodes"


def _run_config(path: Path):
    from seamguard.app.config import load_run_config

    return _or_fail(lambda: load_run_config(path))


def _or_fail(build):
    """Run a builder; a user error (bad file, field, value, ledger) is one `error:` line and exit 2."""
    from seamguard.app.config import ConfigError
    from seamguard.decide import PolicyError
    from seamguard.fleet import TopologyError
    from seamguard.ledger.sqlite import LedgerError

    try:
        return build()
    except (ConfigError, TopologyError, PolicyError, LedgerError) as e:
        fail(str(e))


# ---- seamguard serve (service, API and dashboard) -------------------------------------------------
@app.command(short_help="Controller with HTTP API, /metrics and dashboard.")
def serve(
    config: Path | None = typer.Option(None, "--config",
                                       help="Run against a live source (Prometheus) from this config "
                                            "instead of the twin: its policy, mode and ledger are used."),
    gpus: int = typer.Option(2048, "--gpus", min=8, help="GPUs in the simulated fleet (twin)."),
    minutes: float = typer.Option(30.0, "--minutes", min=2.0,
                                  help="Length of the twin's fault scenario, simulated minutes."),
    seed: int = _seed_option("the twin's fleet, faults and noise"),
    speed: float = typer.Option(10.0, "--speed", min=0.0,
                                help="Simulated seconds per wall second (twin); 0 = paused."),
    mode: Mode = typer.Option(Mode.enforce, "--mode", case_sensitive=False,
                              help="dry_run records only; enforce acts (against the twin, enforce is safe)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8642, "--port", min=0, max=65535, help="Port to listen on (0 = any free port)."),
    token: str | None = typer.Option(None, "--token", envvar="SEAMGUARD_TOKEN",
                                     help="Bearer token for mutating calls, acting as 'operator' (default: "
                                          "generated and printed; a given one is never printed)."),
    tokens_file: Path | None = typer.Option(None, "--tokens-file", envvar="SEAMGUARD_TOKENS_FILE",
                                            help="YAML mapping each operator's name to their bearer token; the "
                                                 "audit trail records the name."),
    allowed_host: list[str] = typer.Option([], "--allowed-host",
                                           help="A name clients use in Host (repeatable; '*.example.com' a "
                                                "suffix, '*' turns the DNS-rebinding check off). localhost and "
                                                "addresses always work."),
    ledger: Path | None = typer.Option(None, "--ledger",
                                       help="Keep the controller's SQLite ledger here (twin; default: "
                                            "temporary). With --config the config's ledger is used."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Run the controller (on the twin by default) with the HTTP API, /metrics and the dashboard."""
    import signal

    try:
        from seamguard.app.runner import Runner
        from seamguard.app.service.server import Server
        from seamguard.app.sources import TwinSource
    except ImportError as e:
        fail(f"`seamguard serve` needs the service extra ({e.name} is missing): pip install 'seamguard[service]'")
    tokens, shown = _serve_tokens(token, tokens_file)  # before anything is built: a bad file costs nothing
    from seamguard.http_access import HostRule
    for pattern in allowed_host:
        if (why := HostRule.pattern_problem(pattern)) is not None:
            fail(f"--allowed-host: {why}")
    if config is not None:  # a real cluster: the config decides policy, mode, ledger and time
        cfg = _run_config(config)
        runner = _or_fail(lambda: Runner.from_config(cfg, max_ticks=None))
    else:
        _out_file(ledger, "--ledger")
        runner = _or_fail(lambda: Runner(TwinSource(gpus, minutes, seed), mode=mode.value, speed=speed,
                                         ledger_path=ledger))
    server = Server(runner, tokens, host=host, port=port, log_level="warning", extra_hosts=allowed_host)
    sizes = runner.snapshot().fleet.summary()
    info = {"source": runner.source.name, "gpus": sizes["gpu"], "cooling_loops": sizes["cooling_loop"],
            "mode": runner.controller.mode, "speed": runner.speed, "ledger": runner.ledger.where,
            "dashboard": f"{server.url}/", "api_docs": f"{server.url}/docs", "metrics": f"{server.url}/metrics",
            "token": shown, "operators": sorted(tokens)}
    emit(info, wants_json(output, json_flag), _serve_banner)
    sys.stdout.flush()
    # uvicorn stops on SIGTERM/SIGINT, then raises the signal again under the handler it found:
    # the default one would end the process there, before the ledger is closed and a
    # temporary ledger folder removed. This one lets serve_forever return instead, and a
    # signal that comes before uvicorn has taken over stops it as soon as it starts.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.request_stop())
    runner.start()
    try:
        server.serve_forever()
    finally:
        runner.stop()


def _serve_tokens(token: str | None, tokens_file: Path | None) -> tuple[dict[str, str], str | None]:
    """{operator name: token} for `serve`, and the token to print: only one generated here —
    a token someone gave (flag, environment, file) is never printed or logged."""
    import secrets

    from seamguard.app.config import read_yaml
    from seamguard.app.service.access import AccessConfigError, named_tokens, tokens_from

    try:
        named = None
        if tokens_file is not None:
            named = tokens_from(read_yaml(tokens_file, "tokens file", AccessConfigError), str(tokens_file))
        generated = None if token or named else secrets.token_urlsafe(24)
        return named_tokens(token or generated, named), generated
    except AccessConfigError as e:
        fail(str(e))


def _serve_banner(d: dict[str, Any]) -> None:
    typer.echo(f"seamguard serve: {d['source']}, {d['gpus']} GPUs on {d['cooling_loops']} cooling loops, "
               f"mode {d['mode']}, speed {d['speed']:g}x, ledger {d['ledger']}")
    typer.echo(f"  dashboard  {d['dashboard']}")
    typer.echo(f"  API docs   {d['api_docs']}   metrics {d['metrics']}")
    shown = d["token"] or f"given, not shown ({', '.join(d['operators'])})"
    typer.echo(f"  token      {shown}   (Authorization: Bearer <token> for mode, breaker reset, pins)")


# after the controller's commands in --help: the node agent and the inference gateway
app.add_typer(agent_cli.agent_app, name="agent", short_help="Per-node exporter: XIDs, NICs, storage/fabric probes.")
app.command("gateway", short_help="OpenAI-compatible gateway: token budgets, zombie keys.")(gateway_cli.gateway)


def main() -> None:
    app()
