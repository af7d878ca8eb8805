"""Architecture contracts: imports point one way, and the control plane never imports torch."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS_TREE = {**os.environ, "PYTHONPATH": str(ROOT / "src")}   # a subprocess imports this tree's seamguard


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
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=THIS_TREE)


def _stack() -> list[set[str]]:
    """The first layers contract in pyproject.toml: the one stack, each layer a set of modules."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    return [{m.strip() for m in layer.split("|")} for layer in layers]


def test_every_package_is_in_the_one_stack():
    """A new package gets a layer (and so a direction) before it gets code: the contract covers all."""
    src = ROOT / "src" / "seamguard"
    found = {f"seamguard.{p.name}" for p in src.iterdir() if (p / "__init__.py").exists()} | \
        {f"seamguard.{p.stem}" for p in src.glob("*.py") if p.stem not in ("__init__", "__main__")}
    named = set().union(*_stack())
    assert found - named == set(), f"not in the import stack of pyproject.toml: {sorted(found - named)}"


def test_no_cycle_between_packages():
    import grimp

    graph = grimp.build_graph("seamguard")
    top = {m: ".".join(m.split(".")[:2]) for m in graph.modules}
    edges = {(top[m], top[i]) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)
             if top[m] != top[i] and top[m] != "seamguard.__main__"}
    cycles = sorted((a, b) for a, b in edges if (b, a) in edges)
    assert not cycles, f"packages importing each other: {cycles}"
