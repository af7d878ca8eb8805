"""The event twin takes the GPU runtime figures (benchmarks/gpu_runtime.py) when given
them, and says which figures came from where."""

import json

import pytest
from typer.testing import CliRunner

from seamguard.app.cli import app
from seamguard.twin.events.measured import (
    DEFAULT_FIGURES,
    load_runtime_figures,
    parse_runtime_figures,
    with_gpu_figures,
)

GIB = 2**30


def _gpu_doc(**top):
    """A small gpu_runtime result: 2 GiB of state, a save that stalls 4 s, a restore of 0.1 s."""
    doc = {"benchmark": "gpu_runtime", "device": "NVIDIA H100 80GB HBM3", "gpu_figures": True,
           "micro": {"state_bytes": 2 * GIB,
                     "stall_used_s": {"sg_overlap": 0.04, "sg_blocking": 0.08, "torch_save": 4.0,
                                      "dcp_async": 1.0},
                     "restore_s": {"sg_restore": {"median": 0.1}, "torch_load": {"median": 2.0}}},
           "recovery": {"warm_spare": {"runs": [{"kill_to_step_s": 3.0, "step_s": 0.2},
                                                {"kill_to_step_s": 3.4, "step_s": 0.25}]}},
           "snapshot_stall_ratio_vs_save": 0.01, "restore_speedup_vs_torch_load": 20.0,
           "recovery_s": 3.2, "failure_free_wall_ratio": None}
    doc.update(top)
    return doc


def test_gpu_figures_replace_what_they_measured_and_say_so():
    base = parse_runtime_figures({"systems": {"seamguard": {"resume_s_max": 2.0, "steps_lost_max": 0},
                                              "seamguard_job_wide": {"resume_s_max": 3.0}},
                                  "snapshot_stall_ratio": 0.2, "restore_speedup": 5.0,
                                  "seamguard_no_failure_wall_ratio": 1.3}, "cpu.json")
    figs = with_gpu_figures(base, _gpu_doc(), "gpu.json")
    assert figs.snapshot_stall_ratio == 0.01 and figs.restore_speedup == 20.0
    assert figs.save_s_per_gib == pytest.approx(2.0) and figs.restore_s_per_gib == pytest.approx(0.05)
    assert figs.blocking_stall_ratio == pytest.approx(0.02)
    # the restart from host memory: the recovery less one step's compute (the slowest run's step)
    assert figs.relaunch_s == pytest.approx(3.2 - 0.25)
    # not measured on the GPU (null, or not in the file): the CPU file's figures stay
    assert (figs.wall_ratio, figs.live_resume_s, figs.steps_lost) == (1.3, 2.0, 0.0)
    assert "gpu.json (NVIDIA H100 80GB HBM3)" in figs.source and figs.source.startswith("cpu.json")
    notes = dict(n.split(": ", 1) for n in figs.notes)
    assert notes["relaunch_s"].startswith("gpu.json") and notes["snapshot_stall_ratio"].startswith("gpu.json")
    assert notes["live_resume_s"] == "cpu.json" and notes["wall_ratio"] == "cpu.json"


def test_a_measured_failure_free_ratio_is_taken():
    figs = with_gpu_figures(DEFAULT_FIGURES, _gpu_doc(failure_free_wall_ratio=1.02), "gpu.json")
    assert figs.wall_ratio == 1.02


@pytest.mark.parametrize("doc, error", [
    (_gpu_doc(gpu_figures=False, device="cpu"), "not a GPU"),
    ({"systems": {}}, "not a benchmarks/gpu_runtime.py result"),
])
def test_cpu_runs_and_other_files_are_refused(doc, error):
    with pytest.raises(ValueError, match=error):
        with_gpu_figures(DEFAULT_FIGURES, doc, "x.json")


def test_loading_a_gpu_file_alone_or_beside_a_cpu_file(tmp_path):
    gpu, cpu = tmp_path / "gpu.json", tmp_path / "cpu.json"
    gpu.write_text(json.dumps(_gpu_doc()))
    cpu.write_text(json.dumps({"systems": {"seamguard": {"resume_s_max": 2.0}}}))
    alone = load_runtime_figures(gpu)            # given as the results file: read as GPU figures
    assert alone.restore_speedup == 20.0 and DEFAULT_FIGURES.source in alone.source
    both = load_runtime_figures(cpu, gpu)
    assert both.live_resume_s == 2.0 and both.restore_speedup == 20.0


def test_simulate_names_the_gpu_file(tmp_path):
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(_gpu_doc()))
    res = CliRunner().invoke(app, ["twin", "simulate", "--gpus", "2048", "--days", "2", "--compare",
                                   "seamguard", "--json", "--measured-gpu", str(gpu)])
    assert res.exit_code == 0, res.output
    assert str(gpu) in json.loads(res.stdout)["measured_source"]
    bad = tmp_path / "cpu_run.json"
    bad.write_text(json.dumps(_gpu_doc(gpu_figures=False, device="cpu")))
    res = CliRunner().invoke(app, ["twin", "simulate", "--gpus", "2048", "--days", "2", "--compare",
                                   "seamguard", "--json", "--measured-gpu", str(bad)])
    assert res.exit_code != 0 and "--measured-gpu" in res.output and "not a GPU" in res.output
