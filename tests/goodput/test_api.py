"""`GET /api/v1/goodput` and the goodput gauges of `/metrics` on a served controller.

The twin (256 GPUs) with every job reporting ``seamguard_job_step`` as the runtime would:
one step per simulated second, except the first job, which makes no step for 100 s.
The service measures from the signal ring and the ledger the controller writes.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.sources import TwinSource
from seamguard.observe.frame import Frame

STALL = (100.0, 200.0)  # controller seconds without a step, first job only


class SteppingTwin(TwinSource):
    """The twin, with each job's furthest step as the runtime exports it."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._steps = np.zeros(len(self.fleet.job_names))
        self._last_t: float | None = None

    def next_frame(self, wall_s: float) -> Frame:
        f = super().next_frame(wall_s)
        if self._last_t is not None:
            dt = f.t_s - self._last_t
            go = np.ones_like(self._steps)
            go[0] = 0.0 if STALL[0] <= self._last_t < STALL[1] else 1.0
            self._steps += go * dt
        self._last_t = f.t_s
        return Frame(f.t_s, {**f.values, "seamguard_job_step": self._steps.copy()}, f.sizes, f.flags)


@pytest.fixture(scope="module")
def served():
    src = SteppingTwin(gpus=256, minutes=6.0, seed=0, counterfactual=False)
    r = Runner(src, speed=0)
    r.advance(70)  # 350 simulated seconds at 5 s per tick
    s = Server(r, "test-token-0123456789").start()
    try:
        with httpx.Client(base_url=s.url, timeout=60.0) as c:
            yield c, src
    finally:
        s.stop()
        r.stop()


def test_goodput_adds_up_per_job_and_names_the_idle_job(served) -> None:
    c, src = served
    r = c.get("/api/v1/goodput", params={"since": "0", "until": "345", "spans": "true", "buckets": "5"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["source"] == "ring" and len(d["jobs"]) == len(src.fleet.job_names)
    for g in d["jobs"]:
        assert sum(g["by_cause_s"].values()) == pytest.approx(g["wall_s"], abs=0.01)
        assert g["wall_s"] == pytest.approx(345, abs=5)
    first = d["jobs"][0]
    idle = first["by_cause_s"]["straggler"] + first["by_cause_s"]["unattributed"] + first["by_cause_s"]["degraded"]
    assert idle == pytest.approx(100, abs=5)
    assert all(s["cause"] in ("straggler", "unattributed", "degraded")
               for s in first["spans"] if STALL[0] + 5 <= s["start_s"] < STALL[1] - 5)
    assert d["jobs"][1]["by_cause_s"]["productive"] >= d["jobs"][1]["wall_s"] - 150  # the twin's faults may slow it
    f = d["fleet"]
    assert f["wall_s"] == pytest.approx(sum(g["wall_s"] for g in d["jobs"]), abs=0.01)
    assert len(d["ettr_over_time"]) == 5 and d["ettr_over_time"][0]["ettr"] is not None


def test_metrics_carry_goodput_per_job(served) -> None:
    c, src = served
    text = c.get("/metrics").text
    job = src.fleet.job_names[0]
    vals = {}
    for line in text.splitlines():
        if line.startswith("seamguard_goodput_") and f'job_name="{job}"' in line:
            vals[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    wall = vals[f'seamguard_goodput_wall_seconds{{job_name="{job}"}}']
    idle = sum(vals[f'seamguard_goodput_lost_seconds{{cause="{c}",job_name="{job}"}}']
               for c in ("straggler", "unattributed", "degraded"))
    assert wall == pytest.approx(345, abs=10) and idle == pytest.approx(100, abs=5)
    lost = sum(v for k, v in vals.items() if k.startswith("seamguard_goodput_lost_seconds"))
    assert vals[f'seamguard_goodput_ratio{{job_name="{job}"}}'] == pytest.approx(1 - lost / wall, abs=1e-6)
    assert "seamguard_goodput_fleet_ratio " in text


@pytest.mark.parametrize("params, msg", [
    ({"since": "x"}, "since: 'x' is not a number of seconds"),
    ({"since": "300", "until": "100"}, "must be before until"),
    ({"job": "no-such-job"}, "job 'no-such-job' is not in the topology"),
])
def test_bad_parameters_are_one_line_400(served, params, msg) -> None:
    c, _ = served
    r = c.get("/api/v1/goodput", params=params)
    assert r.status_code == 400 and msg in r.json()["detail"]
