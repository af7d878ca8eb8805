"""Architecture contracts: imports point one way, and the control plane never imports torch."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is a test dependency (pip install '.[test]')"
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "broken" in r.stdout and " 0 broken" in r.stdout


def test_control_plane_and_twin_do_not_load_torch():
    code = ("import sys, seamguard.app.cli, seamguard.twin.closedloop, seamguard.control, seamguard.twin.telemetry;"
            "seamguard.app.cli.app; assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_importing_the_runtime_loads_neither_the_twin_nor_the_decide_layer():
    """The runtime shares Daly's formula and the failure figures through seamguard/reliability.py,
    not by importing the planner or the twin's calibration (48 modules, the simulator among them)."""
    code = ("import sys, seamguard.runtime, seamguard.runtime.cadence, seamguard.runtime.settings;"
            "bad = sorted(m for m in sys.modules if m.split('.')[:2] in (['seamguard', 'twin'], ['seamguard', 'decide']));"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
