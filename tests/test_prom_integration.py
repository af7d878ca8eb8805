"""Real Prometheus in the loop: twin serve -> scrape -> live controller; backfill -> replay.

Starts real servers (Debian `prometheus` package); a missing binary fails loudly.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import subprocess_env
from seamguard.app.replay import detected_faults, replay
from seamguard.control import Controller
from seamguard.decide.policy import default_policy
from seamguard.twin.closedloop import build
from seamguard.fleet import fleet_to_topology
from seamguard.observe.exposition import label_strings, render_openmetrics
from seamguard.ports import free_port
from seamguard.testbed.prom import PrometheusServer, backfill
from seamguard.app.twin_exporter import truth_json
from seamguard.twin.telemetry import Twin

TICK_S = 5.0


def in_process(gpus: int, minutes: float, seed: int):
    """The twin path: frames straight into a dry-run controller (no Prometheus)."""
    fleet, specs, cfg = build(gpus, minutes, seed, tick_s=TICK_S)
    twin = Twin(fleet, specs, cfg, seed)
    frames = [twin.step() for _ in range(int(minutes * 60 / TICK_S))]
    ctl = Controller(fleet, default_policy(), [], None, tick_s=TICK_S, mode="dry_run")
    buf = io.StringIO()
    for _ in replay(ctl, frames, buf):
        pass
    events = [json.loads(x) for x in buf.getvalue().splitlines()]
    return fleet, frames, truth_json(twin, 0.0, 1.0)["faults"], events


@pytest.mark.slow
def test_live_controller_detects_twin_faults_through_prometheus(tmp_path: Path) -> None:
    gpus, minutes, seed, speed = 256, 10.0, 1, 10.0
    port = free_port()
    truth_file, topo = tmp_path / "truth.json", tmp_path / "topology.yaml"
    twin = subprocess.Popen(
        [sys.executable, "-m", "seamguard", "twin", "serve", "--gpus", str(gpus), "--seed", str(seed),
         "--minutes", str(minutes), "--tick-s", str(TICK_S), "--speed", str(speed), "--port", str(port),
         "--truth-out", str(truth_file), "--topology-out", str(topo)],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runner = None
    try:
        period = TICK_S / speed
        with PrometheusServer(tmp_path / "prom", targets=[f"127.0.0.1:{port}"],
                              scrape_interval=f"{int(period * 1000)}ms") as prom:
            prom.wait_targets_up()
            truth = json.loads(truth_file.read_text())
            end_wall = truth["wall_start"] + minutes * 60 / speed
            max_ticks = int((end_wall - time.time()) / period)
            assert max_ticks > 60, "startup took too long to leave a useful window"
            cfg = {"version": 1, "topology": str(topo), "mode": "dry_run", "tick_s": TICK_S,
                   "time_scale": speed, "ledger": str(tmp_path / "ledger.db"),
                   "events_out": str(tmp_path / "events.jsonl"), "max_ticks": max_ticks + 20,
                   "prometheus": {"url": prom.url, "timeout_s": 5},
                   "actuators": [{"type": "log", "path": str(tmp_path / "actions.jsonl")}]}
            (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
            runner = subprocess.Popen([sys.executable, "-m", "seamguard", "run", "-o", "json", "--config",
                                       str(tmp_path / "run.yaml")], env=subprocess_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            t_run0 = time.time()
            # Let it run to the end of the scenario, then stop it the way an operator would.
            while time.time() < end_wall and runner.poll() is None:
                time.sleep(0.5)
            runner.send_signal(signal.SIGTERM)
            out, err = runner.communicate(timeout=60)
            assert runner.returncode == 0, err[-3000:]
            assert "ledger closed" in err  # graceful shutdown finished the tick and closed it
            summary = json.loads(out.strip().splitlines()[-1])
            assert summary["ticks"] > 60
    finally:
        for p in (runner, twin):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=20)
    truth = json.loads(truth_file.read_text())
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert all(ev.get("kind") != "controller" for ev in events), "controller ticks failed"
    live = detected_faults(events, truth["faults"],
                           lambda ev: (ev["wall"] - truth["wall_start"]) * truth["speed"])
    # Which faults are detectable inside the window: the twin path on the same scenario.
    _, _, faults, ref_events = in_process(gpus, minutes, seed)
    ref = detected_faults(ref_events, faults)
    live_start_sim = (t_run0 - truth["wall_start"]) * speed
    window = [e for e, d in ref.items() if d["detected_s"] is not None and d["detected_s"] >= live_start_sim + 30
              and d["detected_s"] <= minutes * 60 - 60]
    assert len(window) >= 3, (ref, live_start_sim)
    missed = [e for e in window if live[e]["detected_s"] is None]
    assert not missed, {"missed": missed, "live": live, "ref": ref, "live_start_sim": live_start_sim}


@pytest.mark.slow
def test_replay_over_backfilled_history_matches_twin_recall(tmp_path: Path) -> None:
    gpus, minutes, seed = 256, 10.0, 1
    fleet, frames, faults, ref_events = in_process(gpus, minutes, seed)
    # Anchor simulated t=0 three hours ago on a whole minute (inside retention, outside the head).
    base = float(int(time.time() // 60 * 60) - 3 * 3600)
    labels = label_strings(fleet)
    backfill(render_openmetrics([(base + f.t_s, f) for f in frames], labels), tmp_path / "tsdb")
    topo = tmp_path / "topology.yaml"
    topo.write_text(yaml.safe_dump(fleet_to_topology(fleet), sort_keys=False))
    out = tmp_path / "replay.jsonl"
    with PrometheusServer(tmp_path / "prom", tsdb_dir=tmp_path / "tsdb", lookback_delta="10s") as prom:
        r = subprocess.run(
            [sys.executable, "-m", "seamguard", "replay", "--prometheus", prom.url, "--topology", str(topo),
             "--start", str(base + frames[0].t_s), "--end", str(base + frames[-1].t_s),
             "--step", str(TICK_S), "--out", str(out), "-o", "json"],
            env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary == {"out": str(out), "ticks": len(frames), "tick_errors": 0,
                       "ticks_with_source_problems": 0, "ticks_with_data": len(frames)}
    events = [json.loads(x) for x in out.read_text().splitlines()]
    for ev in events:
        assert set(ev) >= {"t", "entity", "kind", "from", "to", "gfs", "prs", "fae", "reasons", "action"}
    got = detected_faults(events, faults, lambda ev: ev["t"] - base)
    ref = detected_faults(ref_events, faults)
    recall = sum(d["detected_s"] is not None for d in got.values()) / len(faults)
    ref_recall = sum(d["detected_s"] is not None for d in ref.values()) / len(faults)
    assert ref_recall >= 0.5
    assert recall == ref_recall, (got, ref)
    # Same data, same controller: the same faults at the same ticks.
    assert {e: d["detected_s"] for e, d in got.items()} == {e: d["detected_s"] for e, d in ref.items()}
    assert any(ev["action"] and ev["action"]["op"] == "apply" for ev in events)
