"""`seamguard testbed up|down|clean|demo`: the namespaced multi-rail cluster from the shell.

A thin shell over `seamguard.testbed.net` and `seamguard.testbed.demo`; needs root.
Same conventions as every `seamguard` command (seamguard.clikit): ``-o table|json``,
``error: ...`` and exit status 2 for a user error.
"""

from __future__ import annotations

from pathlib import Path

import typer

from seamguard.clikit import HELP_STYLE, JSON_OPTION, OUTPUT_OPTION, Output, emit, fail, wants_json
from seamguard.testbed.job import EXAMPLE_JOB

app = typer.Typer(help="Namespaced multi-rail test cluster: build, tear down, clean, demo.",
                  no_args_is_help=True, rich_markup_mode=HELP_STYLE)


@app.command("up", short_help="Build a testbed and leave it running.")
def up(hosts: int = typer.Option(4, "--hosts", min=1, max=60, help="Hosts (network namespaces)."),
       rails: int = typer.Option(2, "--rails", min=1, max=8, help="Rails (one bridge and NIC per host each)."),
       output: Output = OUTPUT_OPTION, json_flag: bool = JSON_OPTION) -> None:
    """Build a testbed and leave it running; prints its prefix (remove with `down` or `clean`)."""
    from seamguard.testbed.net import _LIVE, Testbed, TestbedSpec

    tb = Testbed(TestbedSpec(hosts=hosts, rails=rails)).up()
    _LIVE.discard(tb)  # outlive this command on purpose
    emit({"prefix": tb.prefix, "namespaces": tb.namespaces(),
          "rails": [f"{tb.addr(0, r).rsplit('.', 1)[0]}.0/24" for r in range(rails)],
          "mgmt": f"{tb.addr(0, None).rsplit('.', 1)[0]}.0/24"}, wants_json(output, json_flag), _lists)


@app.command("down", short_help="Delete one testbed.")
def down(prefix: str = typer.Argument(..., help="The prefix `up` printed, e.g. sg1234t1."),
         output: Output = OUTPUT_OPTION, json_flag: bool = JSON_OPTION) -> None:
    """Delete one testbed's namespaces (and with them every link, bridge and qdisc)."""
    from seamguard.testbed.net import NAME_RE, _ip, ours

    gone = [ns for ns in ours() if ns.startswith(prefix + "-") and NAME_RE.match(ns)]
    for ns in gone:
        _ip("netns", "delete", ns, check=False)
    emit({"removed": gone}, wants_json(output, json_flag), _lists)


@app.command("clean", short_help="Remove leftover testbeds.")
def clean(all_: bool = typer.Option(False, "--all", help="Also testbeds whose creator still runs."),
          output: Output = OUTPUT_OPTION, json_flag: bool = JSON_OPTION) -> None:
    """Remove leftover testbeds (by default those whose creating process is gone)."""
    from seamguard.testbed.net import clean as do_clean

    emit({"removed": do_clean(all_testbeds=all_)}, wants_json(output, json_flag), _lists)


@app.command("demo", short_help="Train while rail links flap; write PNG + JSON.")
def demo(out: Path = typer.Option(Path("rail_demo"), "--out", help="Directory for the PNG and JSON."),
         hosts: int = typer.Option(4, "--hosts", min=2, max=16, help="Hosts (network namespaces)."),
         rails: int = typer.Option(2, "--rails", min=2, max=4, help="Rails per host."),
         steps: int = typer.Option(420, "--steps", min=50, help="Training steps."),
         script: Path = typer.Option(EXAMPLE_JOB, "--script", help="The training process started on every host."),
         output: Output = OUTPUT_OPTION, json_flag: bool = JSON_OPTION) -> None:
    """Train across hosts x rails while links flap on a schedule; write PNG + JSON."""
    from seamguard.testbed.demo import run_demo

    if not script.is_file():
        fail(f"--script: {script} not found")
    if out.exists() and not out.is_dir():
        fail(f"--out: {out} exists and is not a directory")
    s = run_demo(out, hosts=hosts, rails=rails, steps=steps, script=script)
    brief = {k: s[k] for k in ("ok", "steps", "wall_s", "retried_steps", "checksum")}
    brief["faults"] = s["faults"]
    brief["png"] = str(out / "rail_failover.png")
    emit(brief, wants_json(output, json_flag), _lists)


def _lists(d: dict) -> None:
    """key: value lines; a list one item a line under its key."""
    for k, v in d.items():
        if isinstance(v, list):
            typer.echo(f"{k}:" + ("" if v else " (none)"))
            for item in v:
                typer.echo("  " + ("  ".join(f"{a}={b}" for a, b in item.items()) if isinstance(item, dict)
                                   else str(item)))
        else:
            typer.echo(f"{k}: {v}")
