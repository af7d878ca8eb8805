"""Hostile YAML against every config loader, through the CLI a person runs.

Each loader is driven by its own `python -m seamguard ...` entry point; what counts is
the exit code and that stderr is one line naming the file, the line and the field — a
traceback or a silently accepted value is the bypass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import subprocess_env

BIG_INT = "9" * 5000

# (loader, CLI arguments with {f} for the file, a valid-looking head, the field the attack targets)
LOADERS = [
    ("topology", ["fleet", "validate", "{f}"], "version: 1\n", "racks"),
    ("policy", ["policy", "validate", "{f}"], "", "mode"),
    ("controller config", ["run", "--config", "{f}"], "version: 1\ntopology: t.yaml\n", "tick_s"),
    ("serve config", ["serve", "--config", "{f}"], "version: 1\ntopology: t.yaml\n", "tick_s"),
    ("agent config", ["agent", "--config", "{f}", "--check"], "version: 1\nnode: n0\n", "listen"),
    ("gateway config", ["gateway", "--config", "{f}"], "version: 1\n", "host"),
    ("labels", ["eval", "{f}", "{f}"], "", "incidents"),
    ("serve tokens file", ["serve", "--tokens-file", "{f}"], "", "alice"),
]


def _run(args: list[str], f: Path) -> subprocess.CompletedProcess:
    argv = [a.replace("{f}", str(f)) for a in args]
    return subprocess.run([sys.executable, "-m", "seamguard", *argv], capture_output=True, text=True,
                          timeout=300, env=subprocess_env(), cwd=f.parent)  # a loaded CI host is slow to import


def _stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


@pytest.mark.parametrize(("loader", "args", "head", "field"), LOADERS, ids=[x[0] for x in LOADERS])
def test_config_5000_digit_integer(tmp_path, observed, loader, args, head, field):
    """A 5,000-digit integer in a config file crashes the loader with a traceback.

    Refused: exit 2 with one line naming the file, the line and the field; no traceback.
    """
    f = tmp_path / "cfg.yaml"
    f.write_text(f"{head}{field}: {BIG_INT}\n")
    proc = _run(args, f)
    lines = _stderr_lines(proc)
    observed(f"{loader}: exit {proc.returncode}, {len(lines)} stderr line(s): {(lines or [''])[-1][:160]}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = head.count("\n") + 1
    assert str(f) in lines[0] and f"line {line}" in lines[0] and f"{field}:" in lines[0], lines[0]
    assert "out of range" in lines[0]


@pytest.mark.parametrize(("loader", "args", "head", "field"), LOADERS, ids=[x[0] for x in LOADERS])
def test_config_duplicate_key_takes_the_last_value(tmp_path, observed, loader, args, head, field):
    """A key given twice (`mode: dry_run` ... `mode: enforce`) silently takes the last value.

    Refused: exit 2 with one line naming the file, the second key's line and the key.
    """
    f = tmp_path / "cfg.yaml"
    f.write_text(f"{head}{field}: 1\n# a later edit, far down the file\n{field}: 2\n")
    proc = _run(args, f)
    lines = _stderr_lines(proc)
    observed(f"{loader}: exit {proc.returncode}: {(lines or [''])[-1][:160]}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    second = head.count("\n") + 3
    assert str(f) in lines[0] and f"line {second}" in lines[0] and "duplicate key" in lines[0] \
        and repr(field) in lines[0], lines[0]


def test_config_dry_run_then_enforce(tmp_path, observed):
    """A controller config saying `mode: dry_run`, then `mode: enforce` further down, starts enforcing.

    Refused: the controller does not start; one line names the file, line 4 and `mode`.
    """
    f = tmp_path / "run.yaml"
    f.write_text("version: 1\nmode: dry_run\ntopology: t.yaml\nmode: enforce\nprometheus: {url: 'http://127.0.0.1:1'}\n")
    proc = _run(["run", "--config", "{f}"], f)
    lines = _stderr_lines(proc)
    observed(f"exit {proc.returncode}: {(lines or [''])[-1][:160]}")
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "line 4" in lines[0] and "duplicate key 'mode'" in lines[0] and "first given at line 2" in lines[0]


@pytest.mark.parametrize("scalar", ["1.0e+999", ".nan", "2026-13-45"], ids=["float-overflow", "nan", "bad-date"])
def test_config_absurd_scalar(tmp_path, observed, scalar):
    """An absurd scalar (a float literal overflowing to infinity, NaN, a 13th month) in a policy file.

    Refused: exit 2 with one line naming the file, the line and the field; no traceback.
    """
    f = tmp_path / "policy.yaml"
    f.write_text(f"mode: dry_run\nbreaker:\n  max_fraction: {scalar}\n")
    proc = _run(["policy", "validate", "{f}"], f)
    lines = _stderr_lines(proc)
    observed(f"exit {proc.returncode}: {(lines or [''])[-1][:160]}")
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "line 3" in lines[0] and "breaker.max_fraction:" in lines[0], lines[0]
