"""The `seamguard` command line: the edge where files, environment and flags are read.

Every subcommand is a thin shell over library code; nothing here holds logic that a
test of the core would need.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from seamguard.twin.events import cli as twin_events_cli

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


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


@app.command()
def demo(
    gpus: int = typer.Option(2048, min=8, help="GPUs in the simulated fleet."),
    minutes: float = typer.Option(30.0, min=2.0, help="Simulated minutes."),
    seed: int = typer.Option(0, help="Seed for the fleet, the faults and the noise."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the live view."),
    ledger: Path | None = typer.Option(None, help="Keep the controller's SQLite ledger here."),
) -> None:
    """Run the control plane against the twin, with and without control, and score it."""
    from seamguard.demo_view import run_demo

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
    from seamguard.fleet import TopologyError, load_topology

    try:
        fleet = load_topology(path)
    except TopologyError as e:
        _fail(str(e))
    typer.echo(json.dumps({"file": str(path), **fleet.summary()}))


@policy_app.command("show")
def policy_show() -> None:
    """Print the shipped default policy."""
    from importlib import resources

    sys.stdout.write(resources.files("seamguard.decide").joinpath("default_policy.yaml").read_text())


@policy_app.command("validate")
def policy_validate(path: Path = typer.Argument(..., help="Policy YAML to check.")) -> None:
    """Check a policy file (merged over the default)."""
    from seamguard.decide import PolicyError, load_policy

    try:
        pol = load_policy(path)
    except PolicyError as e:
        _fail(str(e))
    typer.echo(json.dumps({"file": str(path), "mode": pol.mode, "valid": True}))

from seamguard.runtime.cli import LAUNCH_CONTEXT, launch  # noqa: E402

from seamguard.testbed.cli import app as testbed_app  # noqa: E402  (rails: namespaced testbed)
app.add_typer(testbed_app, name="testbed")

app.command("launch", context_settings=LAUNCH_CONTEXT)(launch)


def main() -> None:
    app()
