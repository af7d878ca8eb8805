"""`seamguard testbed up|down|clean|demo`: the namespaced multi-rail cluster from the shell.

A thin shell over `seamguard.testbed.net` and `seamguard.testbed.demo`; needs root.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from seamguard.testbed.job import EXAMPLE_JOB

app = typer.Typer(help="Namespaced multi-rail test cluster: build, tear down, clean, demo.",
                  no_args_is_help=True)


@app.command("up")
def up(hosts: int = typer.Option(4, min=1, max=60), rails: int = typer.Option(2, min=1, max=8)) -> None:
    """Build a testbed and leave it running; prints its prefix (remove with `down` or `clean`)."""
    from seamguard.testbed.net import _LIVE, Testbed, TestbedSpec

    tb = Testbed(TestbedSpec(hosts=hosts, rails=rails)).up()
    _LIVE.discard(tb)  # outlive this command on purpose
    typer.echo(json.dumps({"prefix": tb.prefix, "namespaces": tb.namespaces(),
                           "rails": [f"{tb.addr(0, r).rsplit('.', 1)[0]}.0/24" for r in range(rails)],
                           "mgmt": f"{tb.addr(0, None).rsplit('.', 1)[0]}.0/24"}))


@app.command("down")
def down(prefix: str = typer.Argument(..., help="The prefix `up` printed, e.g. sg1234t1.")) -> None:
    """Delete one testbed's namespaces (and with them every link, bridge and qdisc)."""
    from seamguard.testbed.net import NAME_RE, _ip, ours

    gone = [ns for ns in ours() if ns.startswith(prefix + "-") and NAME_RE.match(ns)]
    for ns in gone:
        _ip("netns", "delete", ns, check=False)
    typer.echo(json.dumps({"removed": gone}))


@app.command("clean")
def clean(all_: bool = typer.Option(False, "--all", help="Also testbeds whose creator still runs.")) -> None:
    """Remove leftover testbeds (by default those whose creating process is gone)."""
    from seamguard.testbed.net import clean as do_clean

    typer.echo(json.dumps({"removed": do_clean(all_testbeds=all_)}))


@app.command("demo")
def demo(out: Path = typer.Option(Path("rail_demo"), help="Directory for the PNG and JSON."),
         hosts: int = typer.Option(4, min=2, max=16), rails: int = typer.Option(2, min=2, max=4),
         steps: int = typer.Option(420, min=50),
         script: Path = typer.Option(EXAMPLE_JOB, help="The training process started on every host.")) -> None:
    """Train across hosts x rails while links flap on a schedule; write PNG + JSON."""
    from seamguard.testbed.demo import run_demo

    if not script.is_file():
        typer.echo(f"error: --script: {script} not found (examples/rails_job.py of a source checkout)", err=True)
        raise typer.Exit(2)
    s = run_demo(out, hosts=hosts, rails=rails, steps=steps, script=script)
    brief = {k: s[k] for k in ("ok", "steps", "wall_s", "retried_steps", "checksum")}
    brief["faults"] = s["faults"]
    brief["png"] = str(out / "rail_failover.png")
    typer.echo(json.dumps(brief, indent=1))
