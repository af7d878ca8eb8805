"""One way to report a configuration file that does not validate: file, field, what was expected.

Shared by every file seamguard reads (topology, policy, run config), because the person
reading these messages is editing that file by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


def field_path(loc: tuple[Any, ...]) -> str:
    """`('racks', 3, 'cooling_loop')` -> `racks[3].cooling_loop`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def format_validation_error(source: str, what: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid {what} ({err.error_count()} problem(s))"]
    for e in err.errors():
        got = e.get("input")
        got_s = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"  {field_path(e['loc'])}: {e['msg']}{got_s}")
    return "\n".join(lines)


def read_yaml(path: str | Path, what: str, error: type[Exception] = ValueError) -> Any:
    """Parse a YAML file; a missing file or bad syntax raises ``error`` naming file and line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{p}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
