"""benchmarks/gpu_runtime.py on a machine without a GPU: its arithmetic (stalls, ratios,
the planned interval, the failure-free window) and one tiny end-to-end run of part 1 on
the CPU (figures from it are CPU figures and say so)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_runtime as bench


def _m(step, stall, restore):
    return {"step_s": {k: {"median": v} for k, v in step.items()},
            "stall_s": {k: {"median": v} for k, v in stall.items()},
            "restore_s": {k: {"median": v} for k, v in restore.items()}}


def test_stall_is_the_larger_of_the_paired_and_the_median_slowdown():
    m = _m({"plain": 0.03, "sg_overlap": 0.09, "sg_blocking": 0.12, "torch_save": 9.0, "dcp_async": 3.0},
           {"sg_overlap": -0.01, "sg_blocking": 0.095, "torch_save": 8.98, "dcp_async": 2.9},
           {"sg_restore": 0.1, "torch_load": 4.0, "dcp_load": 3.0})
    r = bench.micro_ratios(m)
    assert r["stall_used_s"]["sg_overlap"] == pytest.approx(0.06)   # paired pairing was noise
    assert r["stall_used_s"]["sg_blocking"] == pytest.approx(0.095)
    assert r["stall_ratio_vs_save"] == pytest.approx(0.06 / 8.98, abs=1e-4)
    assert r["restore_speedup_vs_torch_load"] == pytest.approx(40.0)


def test_planned_interval_is_youngs_rule_in_steps_capped():
    planned, used = bench.young_every(0.06, 0.034, 3.0, cap=50)
    assert planned == round((2 * 0.06 * 3.0 * 3600) ** 0.5 / 0.034)
    assert used == 50
    assert bench.young_every(0.06, 0.034, 3.0, cap=10**9)[1] == planned


def test_window_leaves_out_the_warm_up_and_needs_enough_steps():
    rows = [(s, 100.0 + s * 0.5, 0) for s in range(40)]
    win = bench.window(rows, warm_s=5.0)
    assert win["first_step"] == 10 and win["per_step_s"] == pytest.approx(0.5)
    with pytest.raises(RuntimeError, match="run more steps"):
        bench.window(rows, warm_s=19.0)


def test_part_one_runs_on_the_cpu(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_runtime.py"), "--device", "cpu",
                        "--quick", "--hidden", "64", "--layers", "2", "--batch", "16", "--dataset", "32",
                        "--parts", "micro", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, check=False,
                       env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc == json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["gpu_figures"] is False
    assert all(doc["micro"]["restore_bit_identical"].values())
    assert doc["snapshot_stall_ratio_vs_save"] is not None and doc["recovery_s"] is None
