"""A real Prometheus (Debian package) scrapes the service's /metrics every second and a
PromQL query over the scraped series returns what the snapshot says."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest

from seamguard.fleet.model import Kind
from seamguard.ports import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DEADLINE_S = 60.0


@pytest.fixture()
def prometheus(server, tmp_path):
    assert shutil.which("prometheus"), "prometheus not installed: apt-get install -y prometheus"
    port = free_port()
    target = server.url.removeprefix("http://")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: seamguard
    static_configs:
      - targets: ['{target}']
""")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    try:
        yield f"http://127.0.0.1:{port}", tmp_path / "prometheus.log"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _query(client: httpx.Client, base: str, q: str) -> list[dict]:
    r = client.get(f"{base}/api/v1/query", params={"query": q})
    r.raise_for_status()
    return r.json()["data"]["result"]


def test_prometheus_scrapes_metrics_and_promql_agrees(prometheus, runner):
    base, log = prometheus
    snap = runner.snapshot()
    n_gpu = snap.fleet.count(Kind.GPU)
    bad_gpu = int((snap.kinds[Kind.GPU].state != 0).sum())
    deadline = time.monotonic() + DEADLINE_S
    got = None
    with httpx.Client(timeout=5.0) as c:
        while time.monotonic() < deadline:
            try:
                got = _query(c, base, 'sum(seamguard_entities{kind="gpu"})')
            except (httpx.HTTPError, KeyError):
                got = None
            if got:
                break
            time.sleep(0.5)
        assert got, f"Prometheus scraped nothing within {DEADLINE_S:.0f} s; log: {log.read_text()[-2000:]}"
        assert float(got[0]["value"][1]) == n_gpu
        up = _query(c, base, 'up{job="seamguard"}')
        assert up and float(up[0]["value"][1]) == 1.0
        # Nothing ticks this module's runner, so the scraped snapshot is the one read above.
        assert runner.snapshot().tick == snap.tick
        r = _query(c, base, 'sum(seamguard_entities{kind="gpu", state!="healthy"})')
        assert float(r[0]["value"][1]) == bad_gpu
        r = _query(c, base, "seamguard_tick_duration_seconds_count")
        assert float(r[0]["value"][1]) >= 70
        r = _query(c, base, 'sum by (verb) (seamguard_actions_total{op="apply", status="done"})')
        assert {x["metric"]["verb"] for x in r} >= {"drain"}
