"""The `seamguard` command line: the edge where files, environment and flags are read.

Every subcommand is a thin shell over library code; nothing here holds logic that a
test of the core would need.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from seamguard.app.clikit import fail
from seamguard.runtime import cli as runtime_cli
from seamguard.testbed import cli as testbed_cli
from seamguard.app import twin_cli as twin_events_cli

app = typer.Typer(
    name="seamguard",
    help="Gray-failure control plane, resilient runtime and digital twin for GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
)
twin_app = typer.Typer(help="The digital twin: simulated telemetry and discrete-event planning.",
                       no_args_is_help=True)
fleet_app = typer.Typer(help="Topology files: generate, validate.", no_args_is_help=True)
policy_app = typer.Typer(help="Decision policy: show the default, validate a file.", no_args_is_help=True)
app.add_typer(twin_app, name="twin")
app.add_typer(fleet_app, name="fleet")
app.add_typer(policy_app, name="policy")
twin_app.command("simulate")(twin_events_cli.simulate)
twin_app.command("report")(twin_events_cli.report)


_fail = fail


@app.command()
def demo(
    gpus: int = typer.Option(2048, min=8, help="GPUs in the simulated fleet."),
    minutes: float = typer.Option(30.0, min=2.0, help="Simulated minutes."),
    seed: int = typer.Option(0, help="Seed for the fleet, the faults and the noise."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the live view."),
    ledger: Path | None = typer.Option(None, help="Keep the controller's SQLite ledger here."),
) -> None:
    """Run the control plane against the twin, with and without control, and score it."""
    from seamguard.app.demo_view import run_demo

    result = run_demo(gpus=gpus, minutes=minutes, seed=seed, quiet=json_out, ledger_path=ledger)
    if json_out:
        result.pop("false_action_list", None)
        typer.echo(json.dumps(result))


@fleet_app.command("generate")
def fleet_generate(
    gpus: int = typer.Option(2048, min=8, help="GPUs in the fleet (rounded down to whole nodes)."),
    out: Path = typer.Option(..., help="Where to write the topology YAML."),
    seed: int = typer.Option(0),
) -> None:
    """Write a synthetic topology of any size (e.g. --gpus 100000)."""
    import yaml

    from seamguard.fleet import FleetShape, fleet_to_topology, generate_fleet

    fleet = generate_fleet(FleetShape(gpus=gpus), seed=seed)
    out.write_text(yaml.safe_dump(fleet_to_topology(fleet), sort_keys=False, width=120))
    typer.echo(json.dumps({"out": str(out), **fleet.summary()}))


@fleet_app.command("validate")
def fleet_validate(path: Path = typer.Argument(..., help="Topology YAML to check.")) -> None:
    """Check a topology file; print its entity counts or what is wrong and where."""
    from seamguard.app.config import load_topology

    fleet = _or_fail(lambda: load_topology(path))
    typer.echo(json.dumps({"file": str(path), **fleet.summary()}))


@policy_app.command("show")
def policy_show() -> None:
    """Print the shipped default policy."""
    from importlib import resources

    sys.stdout.write(resources.files("seamguard.decide").joinpath("default_policy.yaml").read_text())


@policy_app.command("validate")
def policy_validate(path: Path = typer.Argument(..., help="Policy YAML to check.")) -> None:
    """Check a policy file (merged over the default)."""
    from seamguard.app.config import load_policy

    pol = _or_fail(lambda: load_policy(path))
    typer.echo(json.dumps({"file": str(path), "mode": pol.mode, "valid": True}))


# ---- training runtime (torch is imported inside these commands, never here) -----------------
app.command("launch", context_settings=runtime_cli.LAUNCH_CONTEXT)(runtime_cli.launch)
app.add_typer(testbed_cli.app, name="testbed")


# ---- telemetry in / actions out (issue 3): twin serve, replay, run -------------------------
@twin_app.command("serve")
def twin_serve(
    gpus: int = typer.Option(256, min=8, help="GPUs in the simulated fleet."),
    seed: int = typer.Option(0, help="Seed for the fleet, the faults and the noise."),
    tick_s: float = typer.Option(5.0, min=0.01, help="Simulated seconds per twin tick."),
    speed: float = typer.Option(1.0, min=0.01, help="Simulated seconds per wall second."),
    minutes: float = typer.Option(30.0, min=1.0, help="Scenario length in simulated minutes (fault timing)."),
    scenario: str = typer.Option("default", help="'default' (one fault of each kind) or 'none'."),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(9400, min=0, max=65535, help="0 picks a free port (printed)."),
    truth_out: Path | None = typer.Option(None, help="Write the injected faults' ground truth (JSON) here."),
    topology_out: Path | None = typer.Option(None, help="Write the simulated fleet's topology YAML here."),
) -> None:
    """Expose the twin's telemetry on /metrics under the real exporter names and labels."""
    import signal

    from seamguard.app.twin_exporter import ServeOptions, TwinExporter

    if scenario not in ("default", "none"):
        _fail(f"--scenario must be 'default' or 'none', got {scenario!r}")
    from seamguard.twin.closedloop import build

    fleet, specs, cfg = build(gpus, minutes, seed, tick_s=tick_s)
    if scenario == "none":
        specs = []
    if topology_out is not None:
        import yaml

        from seamguard.fleet import fleet_to_topology

        topology_out.write_text(yaml.safe_dump(fleet_to_topology(fleet), sort_keys=False, width=120))
    exp = TwinExporter(fleet, specs, cfg, seed, ServeOptions(host, port, speed, truth_out))
    signal.signal(signal.SIGTERM, lambda *_: exp.stop())
    signal.signal(signal.SIGINT, lambda *_: exp.stop())
    typer.echo(json.dumps({"url": f"http://{host}:{exp.port}/metrics", "gpus": len(fleet.gpu_names),
                           "faults": len(specs), "period_s": tick_s / speed}))
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
        _fail(f"{flag}: cannot read time {v!r}: give Unix seconds or RFC 3339")
        raise


@app.command()
def replay(
    prometheus: str = typer.Option(..., help="Base URL of a Prometheus-compatible API."),
    topology: Path = typer.Option(..., help="Fleet topology YAML."),
    start: str = typer.Option(..., help="Start (Unix seconds or RFC 3339)."),
    end: str = typer.Option(..., help="End (Unix seconds or RFC 3339)."),
    step: float = typer.Option(15.0, min=0.001, help="Seconds between frames; the controller's tick."),
    out: Path = typer.Option(..., help="JSON lines: one per state change or decision."),
    policy: Path | None = typer.Option(None, help="Policy YAML (merged over the default)."),
    config: Path | None = typer.Option(None, help="Run config whose prometheus: section (auth, mapping) to use."),
    path_prefix: str = typer.Option("", help="API path prefix ('/prometheus' for Mimir)."),
    tenant: str | None = typer.Option(None, help="X-Scope-OrgID tenant header."),
) -> None:
    """Backtest: run the controller (dry run) over history and write what it would have done."""
    import logging

    from seamguard.app.config import load_policy, load_topology
    from seamguard.app.replay import replay as run_replay
    from seamguard.control import Controller
    from seamguard.observe.prometheus import PromConfig, PrometheusSource

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Everything is validated before the output file is opened: a bad argument never truncates it.
    t0, t1 = _parse_time(start, "--start"), _parse_time(end, "--end")
    if t1 <= t0:
        _fail(f"--end ({end}) must be after --start ({start})")
    if out.is_dir():
        _fail(f"--out: {out} is a directory; give a file path")
    if not out.parent.is_dir():
        _fail(f"--out: directory {out.parent} does not exist")
    fleet = _or_fail(lambda: load_topology(topology))
    pol = _or_fail(lambda: load_policy(policy))
    try:
        pcfg = (_run_config(config).prometheus.model_copy(update={"url": prometheus}) if config is not None
                else PromConfig(url=prometheus, path_prefix=path_prefix, tenant=tenant))
    except ValueError as e:
        _fail(f"--prometheus: {e}")
    ctl = Controller(fleet, pol, [], None, tick_s=step, mode="dry_run")
    ticks = errors = 0
    with PrometheusSource(fleet, pcfg) as src, open(out, "w", encoding="utf-8") as fh:
        for rep in run_replay(ctl, src.frames(t0, t1, step), fh):
            ticks += 1
            errors += bool(rep.error)
    typer.echo(json.dumps({"out": str(out), "ticks": ticks, "tick_errors": errors}))


@app.command()
def run(config: Path = typer.Option(..., help="Run config YAML (docs/prometheus-slurm.md).")) -> None:
    """Live controller against Prometheus on a schedule (dry run unless the config says enforce)."""
    import logging
    import signal

    from seamguard.app.runner import Runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = _run_config(config)
    runner = _or_fail(lambda: Runner.from_config(cfg))
    # Finish the tick in progress, then close the ledger (Runner.run's finally).
    signal.signal(signal.SIGTERM, lambda *_: runner.request_stop())
    signal.signal(signal.SIGINT, lambda *_: runner.request_stop())
    try:
        ticks = runner.run()
    except RuntimeError as e:
        typer.echo(f"error: the controller loop died: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"ticks": ticks, "mode": runner.controller.mode, "ledger": str(cfg.ledger)}))


def _run_config(path: Path):
    from seamguard.app.config import load_run_config

    return _or_fail(lambda: load_run_config(path))


def _or_fail(build):
    """Run a builder; a user error (bad file, field, value) is one `error:` line and exit 2."""
    from seamguard.app.config import ConfigError
    from seamguard.decide import PolicyError
    from seamguard.fleet import TopologyError

    try:
        return build()
    except (ConfigError, TopologyError, PolicyError) as e:
        _fail(str(e))


# ---- seamguard serve (service, API and dashboard) -------------------------------------------------
@app.command()
def serve(
    config: Path | None = typer.Option(None, help="Run against a live source (Prometheus) from this config "
                                       "instead of the twin: its policy, mode and ledger are used."),
    gpus: int = typer.Option(2048, min=8, help="GPUs in the simulated fleet (twin)."),
    minutes: float = typer.Option(30.0, min=2.0, help="Length of the twin's fault scenario, simulated minutes."),
    seed: int = typer.Option(0, help="Seed for the twin's fleet, faults and noise."),
    speed: float = typer.Option(10.0, min=0.0, help="Simulated seconds per wall second (twin); 0 = paused."),
    mode: str = typer.Option("enforce", help="dry_run or enforce (against the twin, enforce is safe)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8642, min=0, max=65535, help="Port to listen on (0 = any free port)."),
    token: str | None = typer.Option(None, envvar="SEAMGUARD_TOKEN",
                                     help="Bearer token for mutating calls (default: generated and printed)."),
    ledger: Path | None = typer.Option(None, help="Keep the controller's SQLite ledger here (twin; default: "
                                       "temporary). With --config the config's ledger is used."),
) -> None:
    """Run the controller (on the twin by default) with the HTTP API, /metrics and the dashboard."""
    import secrets

    try:
        from seamguard.app.runner import Runner
        from seamguard.app.service.server import Server
        from seamguard.app.sources import TwinSource
    except ImportError as e:
        _fail(f"`seamguard serve` needs the service extra ({e.name} is missing): pip install 'seamguard[service]'")
    if mode not in ("dry_run", "enforce"):
        _fail(f"--mode must be dry_run or enforce, got {mode!r}")
    if config is not None:  # a real cluster: the config decides policy, mode, ledger and time
        cfg = _run_config(config)
        runner = _or_fail(lambda: Runner.from_config(cfg, max_ticks=None))
    else:
        runner = Runner(TwinSource(gpus, minutes, seed), mode=mode, speed=speed, ledger_path=ledger)
    token = token or secrets.token_urlsafe(24)
    server = Server(runner, token, host=host, port=port, log_level="warning")
    sizes = runner.snapshot().fleet.summary()
    typer.echo(f"seamguard serve: {runner.source.name}, {sizes['gpu']} GPUs on {sizes['cooling_loop']} cooling "
               f"loops, mode {runner.controller.mode}, speed {runner.speed:g}x, ledger {runner.ledger_path}")
    typer.echo(f"  dashboard  {server.url}/")
    typer.echo(f"  API docs   {server.url}/docs   metrics {server.url}/metrics")
    typer.echo(f"  token      {token}   (Authorization: Bearer <token> for mode, breaker reset, pins)")
    runner.start()
    try:
        server.serve_forever()
    finally:
        runner.stop()


def main() -> None:
    app()
