"""What every `seamguard` command shares: one error style, one output switch, one progress line.

It sits below every layer (beside config.py) because commands live in more than the shell:
``seamguard launch`` (runtime/cli.py) and ``seamguard testbed`` (testbed/cli.py) use it as
the shell's own commands (app/) do, and neither may import the shell.

- Errors: ``error: <what was wrong, and where>`` on stderr, exit status 2 — for every user
  error (a bad flag value, file, field), including the ones click finds while parsing
  flags (``Group`` renders those). No tracebacks for user errors.
- Output: ``-o table`` (default, for people) or ``-o json`` (one JSON object on the last
  line, for scripts). ``--json`` stays as a shorthand for ``-o json``.
- Progress: long work reports progress on stderr, and only when stderr is a terminal (a
  live line, then how long each step took); a piped or captured run gets no progress
  output at all, so its stderr holds only warnings and the ``error:`` line.
- Help: plain click help (no boxes), so it reads the same at 80 columns and in a pipe;
  flags show no value, choices are listed (``<table|json>``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

HELP_STYLE = None  # rich_markup_mode for every Typer: plain click help


class Output(str, Enum):
    table = "table"
    json = "json"


OUTPUT_OPTION = typer.Option(Output.table, "--output", "-o", help="table (for people) or json (one object).",
                             case_sensitive=False)
JSON_OPTION = typer.Option(False, "--json", help="Shorthand for -o json.")


def fail(msg: str, code: int = 2) -> NoReturn:
    """The one error style: ``error: ...`` on stderr, exit status 2 (a user error) unless told."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def wants_json(output: Output, json_flag: bool) -> bool:
    return json_flag or output == Output.json


def emit(obj: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Print a command's result: one JSON object, or the human view (``table``; else key: value lines)."""
    if as_json:
        typer.echo(json.dumps(obj))
    elif table is not None:
        table(obj)
    else:
        width = max((len(k) for k in obj), default=0)
        for k, v in obj.items():
            typer.echo(f"{k:<{width}}  {('yes' if v else 'no') if isinstance(v, bool) else v}")


def interactive() -> bool:
    """True when a person watches stderr (a live progress line is welcome)."""
    return sys.stderr.isatty()


@contextmanager
def phase(what: str) -> Iterator[None]:
    """One step of long work: on a terminal's stderr a live spinner with elapsed seconds, then
    ``<what>: done in N s``; nothing when stderr is not a terminal.

    ``what`` reads as a present participle: ``phase("reading topo.yaml (8.6 MB)")``.
    """
    t0 = time.monotonic()
    if not interactive():
        yield
        return
    from rich.console import Console
    from rich.live import Live
    from rich.spinner import Spinner
    from rich.text import Text

    spinner = Spinner("dots")

    class _Line:  # re-rendered by Live a few times a second: spinner, step, elapsed seconds
        def __rich__(self) -> Any:
            spinner.update(text=Text(f"{what}  {time.monotonic() - t0:.0f} s"))
            return spinner

    console = Console(stderr=True, highlight=False)
    # stdout is left alone: it may be a pipe, and what a command prints there is its result.
    with Live(_Line(), console=console, transient=True, refresh_per_second=8,
              redirect_stdout=False, redirect_stderr=False):
        yield
    console.print(f"{what}: done in {time.monotonic() - t0:.1f} s", markup=False)


def _sentence(msg: str) -> str:
    """click's "Invalid value for ..." reads as our "invalid value for ..." after ``error:``."""
    return msg[:1].lower() + msg[1:] if msg[:1].isupper() and msg[1:2].islower() else msg


# click's exception classes as this typer raises them (recent typer versions carry their own
# copy of click, older ones use the click package): found from typer's public BadParameter.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class Group(TyperGroup):
    """The root command: click's own usage errors (bad flag, bad choice, missing option) come out
    as one ``error: ...`` line and exit status 2, like every error a command reports itself."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as click does
                typer.echo(e.ctx.get_help(), err=True)
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            typer.echo(f"error: {_sentence(e.format_message())}{hint}", err=True)
            sys.exit(2)
        except _ClickException as e:
            typer.echo(f"error: {_sentence(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)
