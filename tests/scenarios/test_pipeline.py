"""A scenario all the way through: OpenMetrics -> promtool backfill -> real Prometheus ->
`seamguard replay` -> `seamguard eval`, as benchmarks/detection.py runs it (needs the
Debian `prometheus` package; a missing binary fails loudly)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from seamguard.app.eval import Relations, load_labels, read_timeline, score
from seamguard.fleet import parse_topology
from seamguard.scenarios import ScenarioSpec, generate_files
from seamguard.scenarios.backfill import backfill_file
from seamguard.testbed.prom import PrometheusServer


def _cli(*args: str) -> subprocess.CompletedProcess:
    src = str(Path(__file__).resolve().parents[2] / "src")  # this worktree's package first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "seamguard", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_generated_history_replays_through_prometheus_and_scores(tmp_path: Path) -> None:
    import yaml

    base = float(int(time.time() // 3600 * 3600) - 5 * 3600)
    spec = ScenarioSpec(gpus=256, minutes=30, seed=11, start_unix=base,
                        faults=("power_brake", "fail_slow_gpu", "ecc_sbe"))
    gen = generate_files(spec, tmp_path / "sc")
    text = gen.openmetrics.read_text()
    assert text.endswith("# EOF\n")
    # Real exporter labels: dcgm-exporter's Hostname/gpu/UUID, node_exporter's instance host:port.
    assert 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{DCGM_FI_DRIVER_VERSION="' in text
    assert 'node_infiniband_symbol_error_total{device="mlx5_0",instance="' in text
    backfill_file(gen.openmetrics, tmp_path / "tsdb")
    out = tmp_path / "timeline.jsonl"
    with PrometheusServer(tmp_path / "prom", tsdb_dir=tmp_path / "tsdb", lookback_delta="45s") as prom:
        r = _cli("replay", "--prometheus", prom.url, "--topology", str(gen.topology), "--start", repr(gen.start),
                 "--end", repr(gen.end), "--step", "30", "--out", str(out), "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["ticks"] == int(spec.minutes * 2) + 1 and summary["tick_errors"] == 0
    events = read_timeline(out)
    assert events, "the controller saw nothing at all in a history with faults"

    r = _cli("eval", str(gen.labels), str(out), "--topology", str(gen.topology), "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    fleet = parse_topology(yaml.safe_load(gen.topology.read_text()))
    assert res == json.loads(json.dumps(score(load_labels(gen.labels), events, Relations(fleet))))
    o = res["overall"]
    assert o["incidents"] == 3 and {i["fault"] for i in res["incidents"]} == set(spec.faults)
    assert o["controller_errors"] == 0
    # Some fault is found through Prometheus; whatever is flagged, the figures add up.
    assert o["detected"] >= 1
    assert o["flagged_entities"] >= o["false_flags"] >= 0
    assert 0.0 <= o["precision"] <= 1.0
    for i in res["incidents"]:
        if i["detected"]:
            assert i["delay_s"] >= -60 and i["detected_at"] >= i["start"] - 60

    table = _cli("eval", str(gen.labels), str(out), "--topology", str(gen.topology))
    assert table.returncode == 0 and "recall" in table.stdout and "power_brake" in table.stdout


def test_scenarios_generate_cli_and_errors(tmp_path: Path) -> None:
    r = _cli("scenarios", "generate", "--out-dir", str(tmp_path / "g"), "--gpus", "128", "--minutes", "20",
             "--faults", "row_remap,nic_link_flap", "--start", "2025-01-31T00:00:00Z", "-o", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["start"] == 1738281600.0 and d["end"] == d["start"] + 1200 and d["incidents"] >= 2
    labels = load_labels(Path(d["labels"]))
    assert {i.fault for i in labels if i.fault != "maintenance"} == {"row_remap", "nic_link_flap"}
    for args, msg in ((["--faults", "melted"], "unknown fault class"), (["--start", "noon"], "cannot read time"),
                      (["--gpus", "64", "--faults", "cooling_loop_flow"], "no free cooling loop")):
        r = _cli("scenarios", "generate", "--out-dir", str(tmp_path / "x"), *args)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and msg in r.stderr, r.stderr
    r = _cli("eval", str(tmp_path / "missing.yaml"), str(tmp_path / "t.jsonl"))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "cannot read" in r.stderr
