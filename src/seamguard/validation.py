"""One way to report a configuration file that does not validate: file, field, what was expected.

Shared by every file seamguard reads (topology, policy, run config), because the person
reading these messages is editing that file by hand.
"""

from __future__ import annotations

from typing import Any

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
