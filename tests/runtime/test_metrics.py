"""The runtime reports itself: the job's progress as Prometheus text, rendered and served."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from seamguard.ports import free_port
from seamguard.runtime.metrics import JobView, RankView, StepClock, render

from .conftest import REPO


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_step_clock():
    c = StepClock()
    assert c.seconds_per_step() is None
    for step, t in ((3, 10.0), (3, 11.0), (4, 12.0), (7, 18.0)):  # a repeated step is not an advance
        c.advance(step, t)
    assert c.seconds_per_step() == pytest.approx((18.0 - 10.0) / (7 - 3))
    for k in range(40):  # only the recent advances count
        c.advance(8 + k, 100.0 + 0.5 * k)
    assert c.seconds_per_step() == pytest.approx(0.5)


def test_render_names_ranks_by_host_and_gpu_and_the_job_by_job_name():
    v = JobView("llm-7b", (RankView(1, 5, "node07", 3, 41, 0.21, "step"), RankView(0, 0, "node01", 0, 42, 0.2, "step")),
                generation=2, furthest_step=42, step_seconds=0.25, recoveries=2, lost=3)
    s = _samples(render(v))
    comp = {(x.labels["Hostname"], x.labels["gpu"], x.labels["rank"]): x.value for x in s["seamguard_rank_compute_seconds"]}
    assert comp == {("node01", "0", "0"): 0.2, ("node07", "3", "1"): 0.21}
    assert all(x.labels["job_name"] == "llm-7b" for x in s["seamguard_rank_compute_seconds"])
    assert s["seamguard_job_step_seconds"][0].value == 0.25 and s["seamguard_job_step"][0].value == 42
    assert s["seamguard_job_recoveries_total"][0].value == 2 and s["seamguard_job_workers_lost_total"][0].value == 3
    assert "seamguard_job_step_seconds" not in _samples(render(JobView("j", (), 0, 0, None, 0, 0)))


def _rank(rank: int, persisted: int, snap: int = 40) -> RankView:
    return RankView(rank, rank, "n", rank, 42, 0.2, "compute", comm_s=0.05, stall_s=0.01,
                    snapshot_step=snap, persisted_step=persisted)


def test_rollback_exposure_counts_the_steps_after_the_newest_step_every_rank_persisted():
    v = JobView("j", (_rank(0, 30), _rank(1, 20, snap=41), _rank(2, -1)), 3, 50, 0.5, 1, 1)
    # rank 2 replaced a lost rank and has not persisted: the others' oldest commit is the checkpoint
    assert v.persisted_step == 20 and v.snapshot_step == 40
    assert v.uncommitted_s == (50 - 20) * 0.5
    s = _samples(render(v))
    assert s["seamguard_job_persisted_step"][0].value == 20 and s["seamguard_job_snapshot_step"][0].value == 40
    assert s["seamguard_job_uncommitted_seconds"][0].value == 15.0
    assert {x.labels["rank"]: x.value for x in s["seamguard_rank_comm_seconds"]} == {"0": 0.05, "1": 0.05, "2": 0.05}
    assert len(s["seamguard_rank_checkpoint_stall_seconds"]) == 3
    never = JobView("j", (_rank(0, -1), _rank(1, -1)), 0, 8, 2.0, 0, 0)  # nothing persisted: all of it
    assert never.persisted_step == -1 and never.uncommitted_s == 16.0


@pytest.mark.timeout(180)
def test_launch_serves_the_jobs_progress(tmp_path):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--run-id", "metrics-test",
                          "--metrics-port", str(port), "--checkpoint-dir", str(tmp_path / "ckpt"),
                          "--persist-every", "2", "--", str(REPO / "examples" / "train_ddp.py"),
                          "--steps", "400", "--out", str(tmp_path / "run"), "--step-sleep-s", "0.05"],
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s: dict = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            try:
                s = _samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text)
            except httpx.HTTPError:
                s = {}
            if len(s.get("seamguard_rank_compute_seconds", [])) == 2 and s.get("seamguard_job_step_seconds") \
                    and s["seamguard_job_step"][0].value >= 3 and s["seamguard_job_persisted_step"][0].value >= 0:
                break
            time.sleep(0.3)
    finally:
        p.terminate()  # SIGTERM: the launcher takes its workers down
        p.wait(timeout=60)
    host = socket.gethostname().split(".")[0]
    ranks = {(x.labels["Hostname"], x.labels["gpu"], x.labels["job_name"]) for x in s["seamguard_rank_compute_seconds"]}
    assert ranks == {(host, "0", "metrics-test"), (host, "1", "metrics-test")}, s
    assert s["seamguard_job_step_seconds"][0].value > 0 and s["seamguard_job_generation"][0].value == 0
    # the step's split and the rollback exposure come from the workers' own timings and commits
    assert all(x.value > 0 for x in s["seamguard_rank_comm_seconds"]), s["seamguard_rank_comm_seconds"]
    persisted = s["seamguard_job_persisted_step"][0].value
    assert 0 <= persisted <= s["seamguard_job_step"][0].value and persisted % 2 == 0
    assert s["seamguard_job_snapshot_step"][0].value >= persisted
    assert s["seamguard_job_uncommitted_seconds"][0].value >= 0
