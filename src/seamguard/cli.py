"""The `seamguard` command line: the edge where files, environment and flags are read.

Every subcommand is a thin shell over library code; nothing here holds logic that a
test of the core would need.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="seamguard",
    help="Gray-failure control plane, resilient runtime and digital twin for GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
)
twin_app = typer.Typer(help="The digital twin: simulated telemetry and discrete-event planning.",
                       no_args_is_help=True)
app.add_typer(twin_app, name="twin")

from seamguard.runtime.cli import LAUNCH_CONTEXT, launch  # noqa: E402

app.command("launch", context_settings=LAUNCH_CONTEXT)(launch)


def main() -> None:
    app()
