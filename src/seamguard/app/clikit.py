"""What every `seamguard` command shares: one error style, one output switch, one progress line.

- Errors: ``error: <what was wrong, and where>`` on stderr, exit status 2 — for every user
  error (a bad flag value, file, field). No tracebacks for user errors.
- Output: ``-o table`` (default, for people) or ``-o json`` (one JSON object on the last
  line, for scripts). ``--json`` stays as a shorthand for ``-o json``.
- Progress: long work reports progress on stderr only when stderr is a terminal, so a
  piped or captured run is never garbled by a live bar.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import Enum
from typing import Any, NoReturn

import typer


class Output(str, Enum):
    table = "table"
    json = "json"


OUTPUT_OPTION = typer.Option(Output.table, "--output", "-o", help="table (for people) or json (one object).",
                             case_sensitive=False)
JSON_OPTION = typer.Option(False, "--json", help="Shorthand for -o json.")


def fail(msg: str) -> NoReturn:
    """The one error style: ``error: ...`` on stderr, exit status 2."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


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
            typer.echo(f"{k:<{width}}  {v}")


def interactive() -> bool:
    """True when a person watches stderr (a live progress line is welcome)."""
    return sys.stderr.isatty()
