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
    assert REQUIRED <= doc["baseline_fixed"].keys() and REQUIRED <= doc["seamguard"].keys()
    # baseline_fixed runs Daly's interval for its own write, not --checkpoint-interval-min
    # (which sets the storage backstop); test_baselines_tuned.py checks the interval itself.
    assert doc["baseline_fixed"]["checkpoint_interval_min"] != pytest.approx(30.0)
    assert doc["node_failure_rate_per_node_day"] == pytest.approx(0.005, rel=0.05)
    assert doc["ettr_gain"] == pytest.approx(doc["seamguard"]["ettr"] - doc["baseline_fixed"]["ettr"])


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
    # every policy runs; seamguard is set against whichever baseline did best, named
    sweep = json.loads((out / "summary.json").read_text())["sweep"]["4096"]
    assert set(sweep) == {"baseline_fixed", "baseline_daly_async", "in_job_restart", "seamguard"}
    best = max((p for p in sweep if p != "seamguard"), key=lambda p: sweep[p]["ettr"])
    assert f"4,096 GPUs: seamguard {sweep['seamguard']['ettr']:.3f} against the strongest " \
           f"baseline, {best} {sweep[best]['ettr']:.3f}" in md


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


# --- plots a reader understands without help (issue 13, point 5) ---------------------------

def _sweep_and_hazard():
    from seamguard.twin.events.config import ClusterConfig, PolicyParams
    from seamguard.twin.events.sweep import interval_vs_hazard, size_sweep

    cfg = ClusterConfig(gpus=4096, days=2, workload="single")
    pols = [PolicyParams("baseline"), PolicyParams("seamguard")]
    sweep = size_sweep(cfg, pols, [1024, 4096], runs=2, seed=0)
    return sweep, interval_vs_hazard(cfg, pols[1], job_nodes=cfg.nodes - cfg.spare_nodes)


@pytest.fixture(scope="module")
def figures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seamguard.twin.events.report import (fig_ettr_vs_size, fig_interval_vs_hazard,
                                              fig_lost_by_cause)
    sweep, hazard = _sweep_and_hazard()
    figs = {"ettr": fig_ettr_vs_size(sweep), "cause": fig_lost_by_cause(sweep[4096]),
            "cause_top": fig_lost_by_cause(sweep[4096], top=5),
            "hazard": fig_interval_vs_hazard(hazard)}
    for f in figs.values():
        f.canvas.draw()
    yield figs, sweep
    for f in figs.values():
        plt.close(f)


def _tick_texts(fig):
    return [t.get_text() for ax in fig.axes
            for axis in (ax.xaxis, ax.yaxis)
            for t in axis.get_ticklabels(which="both") if t.get_text()]


def test_tick_labels_are_plain_numbers(figures):
    figs, _ = figures
    for name, fig in figs.items():
        texts = _tick_texts(fig)
        assert texts, name
        for t in texts:
            assert "10^" not in t and "\\times" not in t and "×10" not in t and "$" not in t, (name, t)
    # cluster sizes read as 1k and 4k, not 2^10 and 2^12
    assert {"1k", "4k"} <= set(_tick_texts(figs["ettr"]))


def test_si_labels():
    from seamguard.twin.events.report import si
    assert [si(n) for n in (1024, 4096, 16384, 65536, 131072)] == ["1k", "4k", "16k", "65k", "131k"]
    assert (si(0.5), si(3), si(2_500_000), si(0)) == ("0.5", "3", "2.5M", "0")


def test_reference_lines_are_in_the_legend(figures):
    from matplotlib.lines import Line2D

    figs, _ = figures
    for name, fig in figs.items():
        for ax in fig.axes:
            legend = ax.get_legend()
            labels = {t.get_text() for t in legend.get_texts()} if legend else set()
            refs = [ln for ln in ax.get_lines() if isinstance(ln, Line2D)
                    and ln.get_linestyle() in ("--", ":", "-.")]
            for ln in refs:
                assert not ln.get_label().startswith("_"), (name, "unlabelled reference line")
                assert ln.get_label() in labels, (name, ln.get_label())
    ettr_labels = {t.get_text() for t in figs["ettr"].axes[0].get_legend().get_texts()}
    assert "goal: ETTR 0.97" in ettr_labels


def test_ettr_intervals_stay_within_0_1(figures):
    from seamguard.twin.events.montecarlo import share_ci95

    figs, sweep = figures
    for n, sums in sweep.items():
        for s in sums:
            m, lo, hi = s.metric("ettr")
            assert 0.0 <= lo <= m <= hi <= 1.0
    # the drawn error bars too
    for coll in figs["ettr"].axes[0].collections:
        for seg in coll.get_segments():
            assert all(0.0 <= y <= 1.0 for y in seg[:, 1])
    # two runs near 1 gave an upper bound above 1 with Student-t (12.7 standard errors)
    m, lo, hi = share_ci95([0.999, 0.97])
    assert 0.97 <= lo <= m <= hi <= 0.999
    assert share_ci95([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)


def test_cause_plot_says_top_n_of_m_or_shows_all(figures):
    figs, sweep = figures
    n_causes = len({k for s in sweep[4096] for k in s.mean_dict("gpu_hours_lost_by_cause")})
    full = figs["cause"].axes[0]
    assert f"all {n_causes} causes" in full.get_title(loc="left")
    assert len(full.get_yticklabels()) == n_causes
    top = figs["cause_top"].axes[0]
    assert f"top 5 of {n_causes} causes" in top.get_title(loc="left")
    assert len(top.get_yticklabels()) == 5


def test_cause_plot_has_a_linear_view(figures):
    figs, _ = figures
    assert figs["cause"].axes[0].get_xscale() == "linear"
    assert "baseline_fixed / seamguard" in figs["cause"].axes[1].get_xlabel()
    assert "baseline_fixed / seamguard" in figs["ettr"].axes[1].get_ylabel()


def test_simulate_without_measured_says_which_defaults():
    res = _run("--gpus", "1024", "--days", "1", "--compare", "seamguard")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # the note is wrapped to the terminal's width
    assert "built-in defaults, no --measured FILE given" in text
    assert "live resume 5.06 s" in text and "docs/twin-events.md" in text
    assert "benchmarks/results" not in text   # no file a pip-installed user does not have
    assert max(len(line) for line in res.output.splitlines()) <= 80


def test_simulate_measured_missing_file_is_an_error(tmp_path):
    res = _run("--gpus", "1024", "--days", "1", "--measured", str(tmp_path / "nope.json"))
    assert res.exit_code == 2
    assert "error: --measured" in res.output


def test_simulate_output_switch_and_help_lists_choices():
    res = _run("--gpus", "1024", "--days", "1", "--compare", "baseline", "-o", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policy"] == "baseline_fixed"
    help_text = runner.invoke(app, ["twin", "simulate", "--help"], terminal_width=200).output
    for choice in ("baseline_fixed", "baseline_daly_async", "in_job_restart", "seamguard", "both",
                   "all", "llama3", "hpn", "mttf", "local", "process", "ray", "single", "mix",
                   "table", "json"):
        assert choice in help_text, choice
    assert "--policy " not in help_text   # the policies are chosen with --compare


def test_ratio_panels_compare_seamguard_with_the_strongest_other_policy():
    """With several policies run beside seamguard, the 'times less lost' panels name and use the
    one that loses least (they used baseline_fixed, the weakest, whatever else was run)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seamguard.twin.events.config import ClusterConfig, PolicyParams
    from seamguard.twin.events.report import fig_lost_by_cause
    from seamguard.twin.events.sweep import size_sweep

    cfg = ClusterConfig(gpus=1024, days=1, workload="single")
    pols = [PolicyParams(p) for p in ("baseline_fixed", "in_job_restart", "seamguard")]
    summaries = size_sweep(cfg, pols, [1024], runs=1, seed=0)[1024]
    lost = {s.policy: sum(s.mean_dict("gpu_hours_lost_by_cause").values()) for s in summaries}
    strongest = min(("baseline_fixed", "in_job_restart"), key=lambda p: lost[p])
    fig = fig_lost_by_cause(summaries)
    try:
        assert fig.axes[1].get_xlabel().startswith(f"{strongest} / seamguard")
        title = fig.axes[1].get_title()
        assert f"{lost[strongest] / lost['seamguard']:.1f}x" in title and strongest in title
    finally:
        plt.close(fig)


def test_simulate_table_piped_shows_every_cell_whole():
    """CliRunner's stdout is not a terminal, like `seamguard twin simulate | less`: with four
    policies rich assumed 80 columns and cut names (`checkpoint_in…`, `baseline_daly…`)."""
    res = _run("--gpus", "1024", "--days", "1", "--compare", "all")
    assert res.exit_code == 0, res.output
    assert "…" not in res.stdout
    for word in ("checkpoint_interval_min", "schedule_slip_probability", "baseline_daly_async", "in_job_restart"):
        assert word in res.stdout, word
