"""Live goodput of a real `seamguard launch` job with injected kills, scraped by a real Prometheus.

Two ranks and a hot spare on CPU train `examples/train_ddp.py`; `--chaos` takes rank 1's
node at step 90 and rank 0's at step 170 (`nodeloss`: the process and its host-memory
snapshots; the runtime replaces each from the spares and restores the lost state). Prometheus scrapes the launcher's `/metrics` every 0.5 s;
`seamguard goodput` then reads the job's series back. Checked: the causes add up to the
job's wall time within 1 %, the kills' cost is charged to restart or rollback (a recovery
quicker than the scrapes leaves no gap to charge, and nothing else is charged near it),
and restart or rollback appears nowhere else but the job's start-up and the kills.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamguard.ports import free_port
from seamguard.testbed.prom import PrometheusServer
from tests.conftest import subprocess_env

REPO = Path(__file__).resolve().parents[2]
KILLS = "nodeloss:rank=1,step=90; nodeloss:rank=0,step=170"
RECOVERY_S = 20.0  # a kill's cost lies within this after it (heartbeat timeout, restore, recompute)


@pytest.mark.timeout(300)
def test_launch_with_kills_adds_up_and_charges_the_kills_to_restart_and_rollback(tmp_path: Path) -> None:
    port = free_port()
    with PrometheusServer(tmp_path / "prom", targets=[f"127.0.0.1:{port}"], scrape_interval="500ms") as prom:
        t0 = time.time()
        p = subprocess.run(
            [sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--spares", "1", "--run-id", "gp-live",
             "--metrics-port", str(port), "--checkpoint-dir", str(tmp_path / "ckpt"), "--persist-every", "40",
             "--chaos", KILLS, "--chaos-dir", str(tmp_path / "chaos"), "--",
             str(REPO / "examples" / "train_ddp.py"), "--steps", "240", "--out", str(tmp_path / "run"),
             "--step-sleep-s", "0.05"],
            env=subprocess_env(), capture_output=True, text=True, timeout=240)
        t1 = time.time()
        assert p.returncode == 0, p.stderr[-3000:]
        time.sleep(1.5)  # the last scrape lands
        r = subprocess.run([sys.executable, "-m", "seamguard", "goodput", "--job", "gp-live", "--prometheus", prom.url,
                            "--since", f"{t0:.3f}", "--until", f"{t1:.3f}", "--step", "0.5", "-o", "json"],
                           env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout.splitlines()[-1])["jobs"][0]
    kills = [json.loads(x)["time_s"] for x in (tmp_path / "chaos" / "kills.jsonl").read_text().splitlines()]
    assert len(kills) == 2
    wall, by = g["wall_s"], g["by_cause_s"]
    assert 0 < wall <= t1 - t0
    assert abs(sum(by.values()) - wall) <= 0.01 * wall
    first_step = g["spans"][0]["start_s"]
    lost = [s for s in g["spans"] if s["cause"] in ("restart", "rollback")]
    for k in kills:
        near = [s for s in g["spans"] if s["start_s"] <= k + RECOVERY_S and s["end_s"] >= k - 1
                and s["start_s"] > first_step]
        # a kill's cost is restart or rollback; a recovery faster than the scrapes (a hot spare restores
        # from peers) leaves no gap at all, and then nothing near it is left unexplained or charged elsewhere
        assert all(s["cause"] in ("productive", "checkpoint_stall", "restart", "rollback") for s in near), (
            k, [(s["cause"], s["seam"], round(s["start_s"] - k, 2), round(s["end_s"] - k, 2)) for s in near])
    stray = [s for s in lost if s["start_s"] > first_step + 1e-6
             and not any(k - 1 <= s["start_s"] <= k + RECOVERY_S for k in kills)]
    assert not stray, stray
    assert by["productive"] > 0.5 * wall
    assert by["unattributed"] <= 0.1 * wall, by  # the kills' cost is explained, not left over
