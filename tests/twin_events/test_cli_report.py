"""CLI (`seamguard twin simulate|report`) and the measured-figures source."""

import json

import pytest
from typer.testing import CliRunner

from seamguard.app.cli import app
from seamguard.twin.events.measured import DEFAULT_FIGURES, parse_runtime_figures

runner = CliRunner()
REQUIRED = {"ettr", "goodput", "interruptions", "interruptions_by_cause",
            "gpu_hours_lost_by_cause", "mttf_hours", "checkpoint_interval_min"}


def _run(*args):
    return runner.invoke(app, ["twin", "simulate", *args])


def test_simulate_json_has_required_keys():
    res = _run("--gpus", "2048", "--days", "3", "--compare", "seamguard", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert REQUIRED <= doc.keys()
    assert doc["policy"] == "seamguard"
    # no --measured FILE: the built-in defaults, named as such (not a file found in the cwd)
    assert doc["measured_source"] == DEFAULT_FIGURES.source
    assert "built-in defaults" in doc["measured_source"]


def test_simulate_both_side_by_side_and_options():
    res = _run("--gpus", "2048", "--days", "2", "--compare", "both", "--json", "--runs", "2",
               "--checkpoint-interval-min", "30", "--checkpoint-write-min", "2",
               "--restart-cost-min", "15", "--node-failure-rate", "0.005",
               "--seed", "3")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert REQUIRED <= doc["baseline"].keys() and REQUIRED <= doc["seamguard"].keys()
    assert doc["baseline"]["checkpoint_interval_min"] == pytest.approx(30.0)
    assert doc["node_failure_rate_per_node_day"] == pytest.approx(0.005, rel=0.05)
    assert doc["ettr_gain"] == pytest.approx(doc["seamguard"]["ettr"] - doc["baseline"]["ettr"])


def test_link_mttf_option_replaces_the_network_cause():
    base = json.loads(_run("--gpus", "1024", "--days", "1", "--json",
                           "--compare", "baseline").stdout)
    res = _run("--gpus", "1024", "--days", "1", "--json", "--compare", "baseline",
               "--link-mttf-years", "5")
    assert res.exit_code == 0, res.output
    rf = json.loads(res.stdout)["node_failure_rate_per_node_day"]
    llama_link = 35 / (16_384 * 54) * 8          # Llama 3 switch/cable, per node-day
    assert rf == pytest.approx(base["node_failure_rate_per_node_day"] - llama_link
                               + 8 / (5 * 365))


@pytest.mark.parametrize("args,option", [
    (["--gpus", "-8"], "--gpus"),
    (["--days", "-1"], "--days"),
    (["--compare", "magic"], "--compare"),
    (["--node-failure-rate", "0"], "--node-failure-rate"),
    (["--detection-precision", "1.5"], "--detection-precision"),
    (["--link-mttf-years", "-5"], "--link-mttf-years"),
])
def test_bad_input_names_the_option(args, option):
    res = _run("--gpus", "64", "--days", "1", *args) if args[0] != "--gpus" else _run(*args)
    assert res.exit_code == 2
    assert option in res.output


def test_measured_file_is_used_and_named(tmp_path):
    f = tmp_path / "failover_training.json"
    f.write_text(json.dumps({
        "seamguard": {"resume_s_max": 2.0, "steps_lost_max": 0, "wall_ratio": 1.01},
        "torchrun": {"resume_s_max": 4.0, "steps_lost_max": 20, "wall_ratio": 1.0},
        "snapshot_stall_ratio": 0.05, "restore_speedup": 10.0, "seamguard_no_failure_wall_ratio": 1.01}))
    res = _run("--gpus", "1024", "--days", "1", "--compare", "seamguard", "--json",
               "--measured", str(f))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert str(f) in doc["measured_source"] and "built-in defaults" in doc["measured_source"]
    # The default model charges each snapshot its measured stall, not the CPU wall ratio.
    assert "runtime_overhead" not in doc["gpu_hours_lost_by_cause"]
    assert "checkpoint_overhead" in doc["gpu_hours_lost_by_cause"]


def test_parse_runtime_figures_fallbacks():
    full = parse_runtime_figures({"systems": {
        "seamguard": {"resume_s_max": 2.0, "steps_lost_max": 0, "wall_ratio": 1.02},
        "torchrun": {"resume_s_max": 4.0}}, "snapshot_stall_ratio": 0.05,
        "restore_speedup": 10.0, "save_s_per_gib": 0.5, "seamguard_no_failure_wall_ratio": 1.02}, "r.json")
    assert full.source == "r.json"
    assert (full.live_resume_s, full.relaunch_s, full.steps_lost, full.wall_ratio) == \
        (2.0, 4.0, 0.0, 1.02)
    # the runtime's own restart after every rank crashed wins over torchrun's relaunch
    own = parse_runtime_figures({"systems": {"torchrun": {"resume_s_max": 4.0},
                                             "seamguard_job_wide": {"resume_s_max": 3.0}},
                                 "snapshot_stall_ratio": 0.01,
                                 "snapshot_stall_ratio_blocking": 0.1}, "r.json")
    assert own.relaunch_s == 3.0
    # a measured resume holds one step of compute, which the twin charges itself
    stepped = parse_runtime_figures({"systems": {"seamguard": {"resume_s_max": 2.5},
                                                 "seamguard_job_wide": {"resume_s_max": 3.0}},
                                     "config": {"step_s": 0.5}}, "r.json")
    assert (stepped.live_resume_s, stepped.relaunch_s) == (2.0, 2.5)
    assert stepped.relaunch_captured_s == 0.0    # not measured: relaunch_s stands in
    caught = parse_runtime_figures({"systems": {
        "seamguard_job_wide": {"resume_s_max": 3.0},
        "seamguard_job_wide_exception": {"resume_s_max": 2.0}}, "config": {"step_s": 0.5}}, "r.json")
    assert (caught.relaunch_s, caught.relaunch_captured_s) == (2.5, 1.5)
    assert (own.snapshot_stall_ratio, own.blocking_stall_ratio) == (0.01, 0.1)
    assert full.blocking_stall_ratio == 0.0   # not measured
    empty = parse_runtime_figures({}, "r.json")
    assert empty.source == DEFAULT_FIGURES.source
    assert empty.live_resume_s == DEFAULT_FIGURES.live_resume_s == 5.06


def test_report_writes_plots_and_summary(tmp_path):
    out = tmp_path / "rep"
    res = runner.invoke(app, ["twin", "report", "--out", str(out), "--sizes", "1024,4096",
                              "--days", "2", "--runs", "1"])
    assert res.exit_code == 0, res.output
    for name in ("ettr_vs_size.png", "gpu_hours_lost_by_cause.png", "interval_vs_hazard.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "summary.md").read_text()
    assert "ETTR vs cluster size" in md and "| 4,096 |" in md


def test_report_rejects_bad_sizes(tmp_path):
    res = runner.invoke(app, ["twin", "report", "--out", str(tmp_path), "--sizes", "1k,2k"])
    assert res.exit_code == 2 and "--sizes" in res.output


def test_ray_executor_is_optional_and_guarded():
    from seamguard.twin.events.montecarlo import ray_available
    if ray_available():
        pytest.skip("ray installed: the guard is not exercised")
    res = _run("--gpus", "1024", "--days", "1", "--executor", "ray")
    assert res.exit_code == 2 and "seamguard[ray]" in res.output


def test_measured_wall_model_slows_every_step():
    from dataclasses import replace as dc_replace

    from seamguard.twin.events.config import ClusterConfig, PolicyParams
    from seamguard.twin.events.measured import DEFAULT_FIGURES
    from seamguard.twin.events.montecarlo import run_monte_carlo

    figs = dc_replace(DEFAULT_FIGURES, wall_ratio=1.5)
    cfg = ClusterConfig(gpus=2048, days=2, workload="single")
    stall = PolicyParams("seamguard", runtime=figs)
    wall = PolicyParams("seamguard", runtime=figs, runtime_overhead="measured_wall")
    a, b = run_monte_carlo(cfg, [stall, wall], 1, 0)
    assert "runtime_overhead" in b.mean_dict("gpu_hours_lost_by_cause")
    assert b.metric("ettr")[0] < a.metric("ettr")[0]
