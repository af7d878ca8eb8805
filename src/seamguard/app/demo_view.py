"""The terminal view of `seamguard demo`: progress on stderr, then the scorecard on stdout.

A renderer only: the run and its scoring live in seamguard.twin.closedloop.

Every cell is printed whole at any width: the fault table is a table only when all of
its columns fit the console (a wide terminal); otherwise each fault is a short record of
``label value`` fields packed into the width, a field never split. A live progress bar
is drawn on stderr only when stderr is a terminal; otherwise there is no progress output.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from seamguard.fleet.model import Kind
from seamguard.ledger.sqlite import Ledger
from seamguard.twin import closedloop as demo

FAULT_COLUMNS = ("fault", "entity", "start", "detected", "delay", "first state", "evidence", "lead time",
                 "action")


def _fmt_s(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f} s"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" if k == 1 else f"{k} {noun}s"


def _cells(r: dict[str, Any]) -> dict[str, str]:
    return {"fault": r["fault"], "entity": r["entity"], "start": _fmt_s(r["start_s"]),
            "detected": "yes" if r["detected"] else "no", "delay": _fmt_s(r["delay_s"]),
            "first state": r["state"] or "—", "evidence": ", ".join(r["evidence"]) or "—",
            "lead time": _fmt_s(r["lead_time_s"]), "action": r["action"] or "—"}


def _detected_style(v: str) -> str:
    return "green" if v == "yes" else "red"


def run_demo(gpus: int, minutes: float, seed: int, ledger_path: Path | None, *, live: bool,
             out: Console | None) -> dict:
    """Run with and without control and score it.

    ``out``: the console for the human view (header before, scorecard after), None for
    ``-o json``. ``live``: draw a progress bar on stderr (only when it is a terminal).
    """
    fleet, faults, cfg = demo.build(gpus, minutes, seed)
    if out is not None:
        out.print(f"[bold]seamguard demo[/] — {_n(fleet.count(Kind.GPU), 'GPU')}, "
                  f"{_n(fleet.count(Kind.NODE), 'node')}, {_n(fleet.count(Kind.COOLING_LOOP), 'cooling loop')}, "
                  f"{_n(len(fleet.job_names), 'job')}; {minutes:g} simulated minutes, seed {seed}, "
                  f"{_n(len(faults), 'injected fault')}")
        out.file.flush()
    n_ticks = int(round(minutes * 60 / cfg.tick_s))
    actions = 0

    def status(twin, rep) -> str | None:
        nonlocal actions
        if rep is not None:
            actions += sum(1 for c in rep.changes if c.op == "apply" and c.status == "done")
        if rep is not None and rep.assessment is not None and int(twin.t_s / cfg.tick_s) % 6 == 0:
            ns = rep.assessment.counts_by_state(Kind.NODE)
            return (f"t={twin.t_s / 60:.1f} min  nodes: {ns['degraded']} degraded, "
                    f"{ns['quarantine'] + ns['harmful']} quarantined, {ns['failed']} failed  actions: {actions}")
        return None

    ledger = Ledger(ledger_path) if ledger_path else None
    try:
        with _progress(live) as phase:
            with_ctl = demo.run(fleet, faults, cfg, minutes, seed, control=True, ledger=ledger,
                                on_tick=phase("with control", n_ticks, status))
            without = demo.run(fleet, faults, cfg, minutes, seed, control=False,
                               on_tick=phase("without control (same seed)", n_ticks, None))
    finally:
        if ledger is not None:
            ledger.close()
    result = demo.evaluate(with_ctl, without)
    if out is not None:
        render(result, out)
    return result


class _progress:
    """``phase(name, ticks, status)`` returns an on_tick callback driving a live bar on stderr (or None)."""

    def __init__(self, live: bool) -> None:
        self.live = live
        self.bar = None

    def __enter__(self) -> Callable[..., Callable[[Any, Any], None]]:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            class _Bar(Progress):  # one bar per phase, then the controller's status as a wrapped line
                status = ""

                def get_renderables(self):
                    yield self.make_tasks_table(self.tasks)
                    if self.status:
                        yield Text(self.status, style="dim")

            # stdout is left alone (it may be a pipe); the bar is cleared when the run ends.
            self.bar = _Bar(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                            redirect_stdout=False, redirect_stderr=False)
            self.bar.__enter__()
        return self.phase

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def phase(self, name: str, ticks: int, status: Callable[[Any, Any], str | None] | None):
        if self.bar is None:  # stderr is not a terminal: no progress output
            return None
        bar, task = self.bar, self.bar.add_task(name, total=ticks)

        def on_tick(twin, rep) -> None:
            line = status(twin, rep) if status is not None else None
            if line is not None:
                bar.status = f"with control: {line}"
            bar.advance(task)

        return on_tick


def render(result: dict, console: Console) -> None:
    """The scorecard: the injected faults (a table when it fits, else one record each), then the outcome."""
    rows = [_cells(r) for r in result["fault_table"]]
    table = _wide_table(rows)
    console.print()
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    if natural <= console.width:
        console.print(table)
    else:
        _records(rows, console)
    console.print()
    _outcome(result, console)
    for a in result["false_action_list"]:
        _wrapped(console, f"false action t={a['t_s']:.0f}s {a['key']}: {a['reason']}", "  ", style="yellow")


def _wide_table(rows: list[dict[str, str]]) -> Table:
    table = Table(*(Column(c, no_wrap=True) for c in FAULT_COLUMNS), title="Injected faults")
    for r in rows:
        table.add_row(*(Text(r[c], style=_detected_style(r[c])) if c == "detected" else r[c]
                        for c in FAULT_COLUMNS))
    return table


def _records(rows: list[dict[str, str]], console: Console) -> None:
    """One record per fault: ``label value`` fields packed into the width (a field is never split),
    then its evidence and action, wrapped at spaces."""
    width = console.width
    console.print(Text("Injected faults", style="bold"))
    for i, r in enumerate(rows, 1):
        if i > 1:
            console.print()
        lead = " " * len(f"{i}. ")
        for g, group in enumerate((("fault", "entity"), ("start", "detected", "delay", "first state", "lead time"))):
            line = Text(f"{i}. " if g == 0 else lead)
            for j, c in enumerate(group):
                f = Text.assemble((c, "dim"), " ", (r[c], ("bold" if c == "fault" else
                                                           _detected_style(r[c]) if c == "detected" else "")))
                if j > 0 and len(line) + 3 + len(f) <= width:
                    line.append("   ")
                elif j > 0:
                    console.print(line, soft_wrap=True)
                    line = Text(lead)
                line.append_text(f)
            console.print(line, soft_wrap=True)
        for c in ("evidence", "action"):
            _wrapped(console, r[c], lead + f"{c:<10}", label_style="dim")


def _wrapped(console: Console, value: str, lead: str, *, style: str = "", label_style: str = "") -> None:
    """``lead`` then ``value`` wrapped at spaces into the console width (a word is never split)."""
    body = textwrap.wrap(value, width=max(20, console.width - len(lead)), break_long_words=False,
                         break_on_hyphens=False) or [""]
    for j, part in enumerate(body):
        head = lead if j == 0 else " " * len(lead)
        console.print(Text.assemble((head, label_style), (part, style)), soft_wrap=True)


def _outcome(result: dict, console: Console) -> None:
    rows = [
        ("detected / faults", f"{result['detected']} / {result['faults']}"),
        ("false actions (on entities no fault touched)", str(result["false_actions"])),
        ("median detection delay", _fmt_s(result["median_detection_delay_s"])),
        ("cooling flagged before clocks dropped by", _fmt_s(result["thermal_lead_time_s"])),
        ("job failures with / without control",
         f"{result['job_failures_with_control']} / {result['job_failures_without_control']}"),
        ("useful throughput with control", f"{result['useful_throughput_with_control']:.1%}"),
        ("useful throughput without control", f"{result['useful_throughput_without_control']:.1%}"),
        ("controller tick (p50)", f"{result['tick_s_p50'] * 1000:.1f} ms"),
    ]
    console.print(Text("Outcome", style="bold"))
    label_w = max(len(k) for k, _ in rows)
    side_by_side = 2 + label_w + 2 + max(len(v) for _, v in rows) <= console.width
    for k, v in rows:
        if side_by_side:
            console.print(Text.assemble("  ", (f"{k:<{label_w}}", "dim"), "  ", v), soft_wrap=True)
        else:  # too narrow for label and value side by side: each value under its label
            _wrapped(console, k, "  ", style="dim")
            console.print(Text("      " + v), soft_wrap=True)
