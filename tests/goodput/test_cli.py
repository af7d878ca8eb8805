"""`seamguard goodput` end to end: a real Prometheus holding a job's series, a real ledger.

The history (backfilled with promtool, 15 s samples, 1 step/s): a checkpoint-stall
stretch (a fifth of each step waits on the snapshot copy for 300 s), a gray link of the
job's node for 150 s (half speed), then the controller moves the job off cooling loop
cdu-a: 120 s without a step, and the job comes back 90 steps behind. The command must
split the 1,800 s window into those causes, name the link and the loop with their seams,
and add up to wall time. Bad input is one `error:` line.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from seamguard.assess.assessment import Reason, Transition
from seamguard.assess.states import State
from seamguard.decide.actions import Action, Verb
from seamguard.fleet.model import Kind
from seamguard.fleet.topology import parse_topology
from seamguard.ledger import Ledger
from seamguard.testbed.prom import PrometheusServer, backfill
from tests.conftest import subprocess_env

TOPOLOGY = {
    "version": 1,
    "cooling_loops": [{"name": "cdu-a", "rated_flow_lpm": 480}, {"name": "cdu-b", "rated_flow_lpm": 480}],
    "racks": [{"name": "r1", "cooling_loop": "cdu-a"}, {"name": "r2", "cooling_loop": "cdu-b"}],
    "switches": [{"name": "leaf-a", "tier": "leaf"}, {"name": "leaf-b", "tier": "leaf"},
                 {"name": "spine", "tier": "spine"}],
    "uplinks": [{"leaf": "leaf-a", "spine": "spine"}, {"leaf": "leaf-b", "spine": "spine"}],
    "storage_paths": ["nfs"],
    "nodes": [{"name": n, "rack": r, "storage": "nfs", "gpus": 8, "nics": [{"rail": 0, "leaf": lf}]}
              for n, r, lf in (("n1", "r1", "leaf-a"), ("n2", "r2", "leaf-b"))],
    "jobs": [{"name": "train", "class": "high_sync_training", "nodes": ["n1"]}],
}
DT = 15.0


def history(T: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(t, step, step_s, stall_s) from T-600 to T+1830 as the runtime would report them."""
    t = np.arange(T - 600, T + 1830 + 1e-9, DT)  # promtool leaves out the last sample: one past the window
    step, step_s, stall = np.zeros_like(t), np.ones_like(t), np.zeros_like(t)
    s = 1000.0
    for i, x in enumerate(t):
        r = x - T
        if i:
            s += DT * (0.5 if 900 < r <= 1050 else 1.0)
        if 1200 < r < 1320:
            step[i] = step_s[i] = stall[i] = np.nan
            continue
        if r == 1320:
            s = step[i - 9] - 90 + DT  # the last sample before the gap, 90 steps back, one interval on
        step[i] = s
        step_s[i] = 2.0 if 900 < r <= 1050 else 1.0
        stall[i] = 0.2 if 600 <= r < 900 else 0.0
    return t, step, step_s, stall


def openmetrics(T: float) -> list[str]:
    t, step, step_s, stall = history(T)
    out = []
    for name, vals, labels in (("seamguard_job_step", step, 'job_name="train"'),
                               ("seamguard_job_step_seconds", step_s, 'job_name="train"'),
                               ("seamguard_rank_checkpoint_stall_seconds", stall, 'job_name="train",rank="0"')):
        out.append(f"# TYPE {name} gauge\n")
        out += [f"{name}{{{labels}}} {v:g} {x:.0f}\n" for x, v in zip(t, vals) if math.isfinite(v)]
    return out + ["# EOF\n"]


def write_ledger(path: Path, T: float, link: str) -> None:
    led = Ledger(path)
    try:
        def tr(t, kind, ent, a, b, reasons):
            return Transition(t, kind, 0, ent, a, b, 0.6, 0.1, 0.5, tuple(Reason(*r) for r in reasons))
        led.record_transitions(1, [tr(T + 900, Kind.LINK, link, State.HEALTHY, State.DEGRADED,
                                      [("link_latency", 0.9, 80.0, "us"), ("link_errors", 0.2, 1.0, "/s")])])
        led.record_transitions(2, [tr(T + 1050, Kind.LINK, link, State.DEGRADED, State.HEALTHY, [])])
        led.record_transitions(3, [tr(T + 1100, Kind.COOLING_LOOP, "cdu-a", State.HEALTHY, State.QUARANTINE,
                                      [("coolant_flow", 0.95, 120.0, "lpm")])])
        key = "move_job:train@cdu-a"
        led.record_decisions(4, T + 1185, {key: Action(key, Verb.MOVE_JOB, "train", "job", reason="cdu-a flow low",
                                                       cause="cdu-a")}, [])
        led.begin_action(4, T + 1185, "apply", key, "move_job", "slurm")
        led.finish_action(key, "apply", "done", "requeued")
        # an unrelated node's trouble must not be charged to this job
        led.record_transitions(5, [tr(T + 200, Kind.NODE, "n2", State.HEALTHY, State.FAILED, [("xid", 1.0, 79, "")])])
    finally:
        led.close()


def seamguard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seamguard", "goodput", *args], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("goodput")
    T = float(int(time.time() // 60 * 60) - 3 * 3600)  # inside retention, outside the head block
    backfill(openmetrics(T), d / "tsdb")
    fleet = parse_topology(TOPOLOGY)
    link = fleet.link_names[int(fleet.nic_link[fleet.index_of(Kind.NIC, "n1/mlx5_0")])]
    (d / "topology.yaml").write_text(yaml.safe_dump(TOPOLOGY))
    write_ledger(d / "ledger.db", T, link)
    with PrometheusServer(d / "prom", tsdb_dir=d / "tsdb", lookback_delta="10s") as prom:
        yield d, T, prom.url, link


def test_goodput_splits_wall_time_by_cause_and_names_what_cost_it(cluster) -> None:
    d, T, url, link = cluster
    r = seamguard("--job", "train", "--since", str(T), "--until", str(T + 1800), "--prometheus", url,
                  "--topology", str(d / "topology.yaml"), "--ledger", str(d / "ledger.db"), "-o", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    g = out["jobs"][0]
    by = g["by_cause_s"]
    assert g["wall_s"] == 1800 and sum(by.values()) == pytest.approx(1800, abs=0.01)
    assert by["restart"] == pytest.approx(120, abs=0.1)
    assert by["rollback"] == pytest.approx(90, abs=DT)
    assert by["straggler"] == pytest.approx(75, abs=DT)
    assert by["checkpoint_stall"] == pytest.approx(60, abs=DT * 0.2)
    assert by["degraded"] == 0 and by["unattributed"] == 0
    lost = {(s["cause"], s["entity"], s["seam"]) for s in g["spans"] if s["cause"] != "productive"}
    assert lost == {("restart", "cdu-a", "coolant_flow"), ("rollback", "cdu-a", "coolant_flow"),
                    ("straggler", link, "link_latency"), ("checkpoint_stall", "train", "checkpoint")}
    assert g["ettr"] == pytest.approx(by["productive"] / 1800, abs=1e-4)
    assert out["fleet"]["wall_s"] == 1800
    table = seamguard("--job", "train", "--since", str(T), "--until", str(T + 1800), "--prometheus", url,
                      "--topology", str(d / "topology.yaml"), "--ledger", str(d / "ledger.db"))
    assert table.returncode == 0 and f"straggler        {link} [link_latency]" in table.stdout


@pytest.mark.parametrize("args, msg", [
    (["--since", "yesterday"], "--since: cannot read 'yesterday'"),
    (["--since", "1800000000", "--until", "1700000000"], "must be before --until"),
    (["--since", "40d"], "at most 31 days"),
    (["--until", "2026-01-01T00:00:00"], "has no timezone"),
    (["--ledger", "/nonexistent/ledger.db"], "--ledger: /nonexistent/ledger.db: no such file"),
    (["--prometheus", "ftp://x"], "--prometheus: url must start with http://"),
    (["--prometheus", "http://127.0.0.1:9"], "prometheus: seamguard_job_step:"),
])
def test_bad_input_is_one_error_line(args, msg, cluster) -> None:
    d, T, url, _ = cluster
    base = {"--job": "train", "--prometheus": url, "--since": "1h"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    r = seamguard(*[x for kv in base.items() for x in kv])
    assert r.returncode in (1, 2)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.stderr


def test_the_service_reads_the_same_figures_from_prometheus(cluster) -> None:
    """`GoodputService` on a live source (its run config's prometheus:) gives what the CLI gives."""
    from types import SimpleNamespace

    from seamguard.app.service.goodput import GoodputService
    from seamguard.ledger import open_reader
    from seamguard.observe.prometheus import PromConfig

    d, T, url, link = cluster
    fleet = parse_topology(TOPOLOGY)
    snap = SimpleNamespace(fleet=fleet, tick=10, ring_upto=0, t_s=T + 1800)
    runner = SimpleNamespace(source=SimpleNamespace(cfg=SimpleNamespace(prometheus=PromConfig(url=url),
                                                                        time_scale=1.0)),
                             snapshot=lambda: snap, tick_s=15.0, ring=None)
    reader = open_reader(d / "ledger.db")
    svc = GoodputService(runner, reader)
    try:
        (g,) = svc.measure(T, T + 1800)
        assert svc.trailing() == []  # /metrics never waits on Prometheus: the first scrape starts a refresh
        svc._refreshing.join(timeout=60)
        (h,) = svc.trailing()  # the last hour: from the first sample (T - 600) to T + 1800
        assert h.wall_s == 2400 and sum(h.by_cause_s.values()) == pytest.approx(2400, abs=1e-6)
    finally:
        svc.close()
        reader.close()
    assert svc.source == "prometheus" and g.wall_s == 1800
    assert {c: round(v) for c, v in g.by_cause_s.items()} == {
        "productive": 1455, "checkpoint_stall": 60, "rollback": 90, "restart": 120, "straggler": 75, "degraded": 0,
        "unattributed": 0}
