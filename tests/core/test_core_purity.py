"""The core stages read no configuration and no wall clock: time comes from frames, files from the shell.

Configuration (flags, environment, files) is read only in `seamguard.app`; the pure
stages (fleet, assess, decide, the controller, the Frame and its history) take data and
return data. This test reads their source and fails on any call that would let the
environment, a file or the wall clock in.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "seamguard"
CORE = [*sorted((PKG / "fleet").glob("*.py")), *sorted((PKG / "assess").glob("*.py")),
        *sorted((PKG / "decide").glob("*.py")), PKG / "control.py", PKG / "config.py",
        PKG / "observe" / "frame.py", PKG / "observe" / "history.py", PKG / "observe" / "signals.py"]

# (module, attribute) calls that read the environment, files or the wall clock.
FORBIDDEN_CALLS = {("time", "time"), ("time", "time_ns"), ("time", "monotonic"), ("time", "localtime"),
                   ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
                   ("os", "getenv"), ("os", "getcwd"), ("os", "listdir"), ("sys", "argv")}
FORBIDDEN_NAMES = {"open", "input"}
FORBIDDEN_ATTRS = {"environ", "argv", "read_text", "read_bytes", "write_text", "write_bytes", "open"}


def offences(path: Path) -> list[tuple[str, int, str]]:
    """(file name, line, what) for every forbidden read in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_NAMES:
            out.append((path.name, node.lineno, node.func.id))
        if isinstance(node, ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else ""
            if (base, node.attr) in FORBIDDEN_CALLS or node.attr in FORBIDDEN_ATTRS:
                out.append((path.name, node.lineno, node.attr))
    return out


# The shipped default policy is package data, not configuration: read through importlib.resources.
ALLOWED = {("policy.py", "read_text")}


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PKG)))
def test_core_stage_reads_no_environment_file_or_wall_clock(path):
    bad = [f"{f}:{line}: {what}" for f, line, what in offences(path) if (f, what) not in ALLOWED]
    assert not bad, "configuration or wall clock read in a core stage:\n" + "\n".join(bad)


def test_the_check_catches_what_it_should(tmp_path):
    p = tmp_path / "bad.py"
    p.write_text("import os, time\nx = os.environ['A']\ny = time.time()\nz = open('f').read()\n")
    assert len(offences(p)) == 3
