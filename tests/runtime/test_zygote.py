"""The fork server: workers forked from a process that imported torch once behave like
`python script.py` started fresh (argv, environment, exit status, signals, output)."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from seamguard.runtime.zygote import ForkServer

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys, time
import numpy as np
mode = sys.argv[1]
print("argv", sys.argv[1:], "var", os.environ.get("SG_TEST_VAR"), "main", __name__,
      "seed", int(np.random.randint(1 << 30)), flush=True)
if mode == "raise":
    raise ValueError("boom from the script")
if mode == "sleep":
    time.sleep(60)
sys.exit(int(mode))
"""


@contextmanager
def fork_server():
    # started inside the test body: only then are its standard streams capfd's
    fs = ForkServer()
    try:
        yield fs
    finally:
        fs.close(timeout_s=60.0)  # a loaded machine may still be importing torch in the server


@pytest.fixture(autouse=True)
def _src_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))


def _env(**extra):
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), **extra}


def test_forked_worker_runs_the_script_like_a_fresh_interpreter(tmp_path, capfd):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    with fork_server() as server:
        a = server.spawn([str(script), "3"], _env(SG_TEST_VAR="a"), timeout_s=60)
        b = server.spawn([str(script), "0"], _env(SG_TEST_VAR="b"), timeout_s=60)
        assert a.wait(timeout=30) == 3 and b.wait(timeout=30) == 0
    out = capfd.readouterr().out
    assert "argv ['3'] var a main __main__" in out and "argv ['0'] var b main __main__" in out
    # numpy's global generator is seeded afresh in every child, as in a new interpreter
    seeds = {line.rsplit(" ", 1)[1] for line in out.splitlines() if line.startswith("argv")}
    assert len(seeds) == 2


def test_uncaught_exception_and_signals_give_popen_exit_codes(tmp_path, capfd):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    with fork_server() as server:
        bad = server.spawn([str(script), "raise"], _env(), timeout_s=60)
        assert bad.wait(timeout=30) == 1
        assert "ValueError: boom from the script" in capfd.readouterr().err
        slow = server.spawn([str(script), "sleep"], _env(), timeout_s=60)
        with pytest.raises(subprocess.TimeoutExpired):
            slow.wait(timeout=0.5)
        slow.send_signal(signal.SIGKILL)
        assert slow.wait(timeout=30) == -signal.SIGKILL
        slow.kill()   # already gone: a no-op, as for Popen


def test_fork_server_leaves_with_the_launcher():
    with fork_server() as fs:
        pass
    assert fs.proc.returncode == 0


def test_launch_without_fork_server_still_runs(tmp_path):
    from .conftest import launch
    r = launch(tmp_path, "nofork", steps=4, extra=("--no-fork-server",))
    assert r.code == 0, r.stderr
    assert r.checksum is not None


def test_preloaded_modules_are_imported_once_in_the_zygote(tmp_path, capfd):
    # what a worker would import lazily (here: json.tool, which nothing else imports) is
    # already in sys.modules of every forked worker
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint('preloaded', 'json.tool' in sys.modules, flush=True)\n")
    server = ForkServer(preload=("json.tool",))
    try:
        assert server.spawn([str(script)], _env(), timeout_s=60).wait(timeout=30) == 0
    finally:
        server.close()
    assert "preloaded True" in capfd.readouterr().out


def test_unknown_preload_module_is_refused_at_launch():
    from seamguard.runtime.settings import LaunchSettings

    with pytest.raises(ValueError, match="--preload: no importable module 'no_such_mod'"):
        LaunchSettings(script=["x.py"], nproc=1, preload=("json", "no_such_mod"))
    LaunchSettings(script=["x.py"], nproc=1)   # the defaults import
