"""The terminal view of `seamguard demo` (rich): live progress, then the scorecard.

A renderer only: the run and its scoring live in seamguard.twin.closedloop.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from seamguard.twin import closedloop as demo
from seamguard.fleet.model import Kind
from seamguard.ledger.sqlite import Ledger


def _fmt_s(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f} s"


def run_demo(gpus: int, minutes: float, seed: int, quiet: bool, ledger_path: Path | None) -> dict:
    console = Console(stderr=quiet, quiet=quiet)
    fleet, faults, cfg = demo.build(gpus, minutes, seed)
    console.print(f"[bold]seamguard demo[/] — {fleet.count(Kind.GPU)} GPUs, {fleet.count(Kind.NODE)} nodes, "
                  f"{fleet.count(Kind.COOLING_LOOP)} cooling loops, {len(fleet.job_names)} jobs; "
                  f"{minutes:g} simulated minutes, seed {seed}, {len(faults)} injected faults")
    ledger = Ledger(ledger_path) if ledger_path else None
    n_ticks = int(round(minutes * 60 / cfg.tick_s))
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task("with control", total=n_ticks)
        actions = 0

        def on_tick(twin, rep) -> None:
            nonlocal actions
            if rep is not None:
                actions += sum(1 for c in rep.changes if c.op == "apply" and c.status == "done")
            if rep is not None and rep.assessment is not None and int(twin.t_s / cfg.tick_s) % 6 == 0:
                ns = rep.assessment.counts_by_state(Kind.NODE)
                progress.update(task, description=(
                    f"with control  t={twin.t_s / 60:5.1f} min  nodes: {ns['degraded']} degraded, "
                    f"{ns['quarantine'] + ns['harmful']} quarantined, {ns['failed']} failed  actions: {actions}"))
            progress.advance(task)

        with_ctl = demo.run(fleet, faults, cfg, minutes, seed, control=True, ledger=ledger, on_tick=on_tick)
        task2 = progress.add_task("without control (same seed)", total=n_ticks)
        without = demo.run(fleet, faults, cfg, minutes, seed, control=False,
                           on_tick=lambda tw, rep: progress.advance(task2))
    result = demo.evaluate(with_ctl, without)
    if ledger is not None:
        ledger.close()

    table = Table(title="Injected faults")
    for col in ("fault", "entity", "start", "detected", "delay", "first state", "evidence", "lead time",
                "action"):
        table.add_column(col)
    for r in result["fault_table"]:
        table.add_row(r["fault"], r["entity"], _fmt_s(r["start_s"]),
                      "[green]yes[/]" if r["detected"] else "[red]no[/]", _fmt_s(r["delay_s"]),
                      r["state"] or "—", ", ".join(r["evidence"]) or "—", _fmt_s(r["lead_time_s"]),
                      r["action"] or "—")
    console.print(table)
    summary = Table(title="Outcome", show_header=False)
    summary.add_row("detected / faults", f"{result['detected']} / {result['faults']}")
    summary.add_row("false actions (on entities no fault touched)", str(result["false_actions"]))
    summary.add_row("median detection delay", _fmt_s(result["median_detection_delay_s"]))
    summary.add_row("cooling flagged before clocks dropped by", _fmt_s(result["thermal_lead_time_s"]))
    summary.add_row("job failures with / without control",
                    f"{result['job_failures_with_control']} / {result['job_failures_without_control']}")
    summary.add_row("useful throughput with control", f"{result['useful_throughput_with_control']:.1%}")
    summary.add_row("useful throughput without control", f"{result['useful_throughput_without_control']:.1%}")
    summary.add_row("controller tick (p50)", f"{result['tick_s_p50'] * 1000:.1f} ms")
    console.print(summary)
    for a in result["false_action_list"]:
        console.print(f"[yellow]false action[/] t={a['t_s']:.0f}s {a['key']}: {a['reason']}")
    return result
