"""`seamguard twin calibrate` on a real ledger and topology, then `twin simulate --calibrated`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from seamguard.app.cli import app
from seamguard.assess.assessment import Transition
from seamguard.assess.states import State
from seamguard.fleet.model import Kind
from seamguard.ledger import Ledger
from seamguard.twin.calibrated import JobAsk, recommend

T0 = 1_760_000_000.0
TOPOLOGY = {
    "version": 1,
    "cooling_loops": [{"name": "cdu-a", "rated_flow_lpm": 480}],
    "racks": [{"name": "r1", "cooling_loop": "cdu-a"}],
    "switches": [{"name": "leaf-a", "tier": "leaf"}],
    "storage_paths": ["nfs"],
    "nodes": [{"name": f"n{i}", "rack": "r1", "storage": "nfs", "gpus": 8, "nics": [{"rail": 0, "leaf": "leaf-a"}]}
              for i in range(8)],
    "jobs": [{"name": "train", "class": "high_sync_training", "nodes": ["n0", "n1", "n2", "n3"]}],
}
REPAIR_H = (2.0, 5.0, 9.0, 3.0, 12.0)  # five node failures, repaired after these hours


def _tr(t, kind, ent, a, b):
    return Transition(t, kind, 0, ent, a, b, 0.9, 0.1, 0.5, ())


@pytest.fixture()
def inputs(tmp_path):
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(TOPOLOGY))
    led = Ledger(tmp_path / "ledger.db")
    try:
        for k, h in enumerate(REPAIR_H):
            t = T0 + k * 86400.0
            led.record_transitions(2 * k, [_tr(t, Kind.NODE, f"n{k}", State.HEALTHY, State.FAILED)])
            led.record_transitions(2 * k + 1, [_tr(t + h * 3600, Kind.NODE, f"n{k}", State.FAILED, State.HEALTHY)])
            if k != 2:  # the controller never acted on the third one: a miss
                key = f"drain:n{k}"
                led.begin_action(2 * k, t + 60.0 * (k + 1), "apply", key, "drain", "slurm")
                led.finish_action(key, "apply", "done", "drained")
    finally:
        led.close()
    return tmp_path


def _calibrate(d, *extra):
    return CliRunner().invoke(app, ["twin", "calibrate", "--topology", str(d / "topology.yaml"), "--ledger",
                                    str(d / "ledger.db"), "--since", str(T0 - 3600), "--until",
                                    str(T0 + 7 * 86400), "-o", str(d / "cal.yaml"), *extra])


def test_calibrate_writes_traceable_estimates_and_priors(inputs):
    r = _calibrate(inputs)
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load((inputs / "cal.yaml").read_text())
    node = next(h for h in doc["hazards"] if (h["domain"], h["class"]) == ("node", "hard"))
    days = (7 * 86400 + 3600) / 86400
    assert node["source"] == "measured" and node["count"] == 5 and node["entities"] == 8
    assert node["rate_per_entity_day"] == pytest.approx(5 / (8 * days))
    assert node["ci95_per_entity_day"][0] < node["rate_per_entity_day"] < node["ci95_per_entity_day"][1]
    assert [r[0] for r in node["records"]["incidents"]] == [f"n{k}" for k in range(5)]
    gpu = next(h for h in doc["hazards"] if (h["domain"], h["class"]) == ("gpu", "hard"))
    assert gpu["source"] == "prior" and gpu["count"] == 0 and "Llama 3" in gpu["prior"]["from"]
    rep = next(d for d in doc["durations"] if (d["domain"], d["class"]) == ("node", "hard"))
    assert rep["n"] == 5 and rep["p50_s"] == pytest.approx(5 * 3600)
    assert rep["mean_s"] == pytest.approx(np.mean(REPAIR_H) * 3600)
    det = doc["detection"]
    assert (det["acted"], det["missed"]) == (4, 1)
    assert det["delay"]["p50_s"] == pytest.approx(np.median([60, 120, 240, 300]))
    assert doc["jobs"]["train"]["gpus_in_topology"] == 32
    assert doc["checkpoint"]["source"] == "prior"


@pytest.mark.parametrize("args,msg", [
    (["--ledger", "/nonexistent/ledger.db"], "--ledger: /nonexistent/ledger.db: no such file"),
    (["--since", "1d", "--until", "banana"], "--until: cannot read 'banana'"),
])
def test_bad_input_is_one_line_and_writes_nothing(inputs, args, msg):
    argv = ["twin", "calibrate", "--topology", str(inputs / "topology.yaml"), "--ledger", str(inputs / "ledger.db"),
            "-o", str(inputs / "cal.yaml")]
    for i in range(0, len(args), 2):
        if args[i] in argv:
            argv[argv.index(args[i]) + 1] = args[i + 1]
        else:
            argv += args[i:i + 2]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2
    assert msg in r.output and r.output.count("error:") == 1
    assert not (inputs / "cal.yaml").exists()


def test_simulate_calibrated_answers_per_job_with_intervals(inputs):
    assert _calibrate(inputs).exit_code == 0
    r = CliRunner().invoke(app, ["twin", "simulate", "--calibrated", str(inputs / "cal.yaml"), "--runs", "2",
                                 "--draws", "3", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    (job,) = out["jobs"]
    assert job["job"] == "train" and job["samples"] == {"draws": 3, "seeds": 2}
    for key in ("interval_s", "ettr", "hot_spares"):
        lo, mid, hi = job[key]
        assert lo <= mid <= hi
    assert 0 < job["ettr"][0] <= job["ettr"][2] <= 1
    assert "gpu/hard" in out["priors_used"] and "node/hard" not in out["priors_used"]
    bad = inputs / "bad.yaml"
    bad.write_text("schema: something-else\n")
    r = CliRunner().invoke(app, ["twin", "simulate", "--calibrated", str(bad)])
    assert r.exit_code == 2 and "not a calibrated twin config" in r.output


def test_slip_and_spares_follow_the_hazard(inputs):
    assert _calibrate(inputs).exit_code == 0
    doc = yaml.safe_load((inputs / "cal.yaml").read_text())
    tiers = {"storage": (300.0, 300.0)}
    asks = [JobAsk("tight", 32, work_left_s=5 * 86400, deadline_in_s=5.05 * 86400),
            JobAsk("loose", 32, work_left_s=5 * 86400, deadline_in_s=8 * 86400)]
    got = recommend(doc, asks, tiers, 7 * 86400, 4, 2, np.random.default_rng(0))
    assert got[0]["p_slip"][1] > got[1]["p_slip"][1]
    hot = {h["domain"]: h for h in doc["hazards"]}["node"]
    hot["count"] *= 20  # twenty times the failures: more spares
    more = recommend(doc, asks[:1], tiers, 7 * 86400, 4, 2, np.random.default_rng(0))
    assert more[0]["hot_spares"][1] > got[0]["hot_spares"][1]
    assert math.isfinite(got[0]["interval_s"][1])


def _local(t_s: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(t_s).strftime("%Y-%m-%dT%H:%M:%S")


def test_slurm_allocations_give_interruptions_recovery_and_slip(inputs):
    """sacct's rows (a stand-in binary printing what sacct prints) -> interruptions and recovery times;
    the run config's deadline -> a release-slip forecast."""
    gaps_s = (300.0, 600.0, 900.0)
    t, rows = T0, []
    for k, gap in enumerate(gaps_s):
        rows.append(f"{100 + k}|train|NODE_FAIL|{_local(t)}|{_local(t + 86400)}|n[0-3]")
        t += 86400 + gap
    rows.append(f"150|train|CANCELLED by 1000|{_local(t)}|{_local(t + 3600)}|n[0-3]")  # a person's, not a failure
    t += 7200
    rows.append(f"200|train|COMPLETED|{_local(t)}|{_local(t + 3 * 86400)}|n[0-3]")
    sacct, scontrol = inputs / "sacct", inputs / "scontrol"
    sacct.write_text("#!/bin/sh\ncat <<'X'\n" + "\n".join(rows) + "\nX\n")
    scontrol.write_text("#!/bin/sh\nexit 0\n")
    sacct.chmod(0o755), scontrol.chmod(0o755)
    run_cfg = {"version": 1, "topology": str(inputs / "topology.yaml"), "prometheus": {"url": "http://127.0.0.1:9"},
               "jobs": {"train": {"deadline": "2030-01-01T00:00:00Z", "total_steps": 10_000_000, "step_s": 1.0}}}
    (inputs / "run.yaml").write_text(yaml.safe_dump(run_cfg))
    r = _calibrate(inputs, "--slurm", "--sacct", str(sacct), "--scontrol", str(scontrol),
                   "--config", str(inputs / "run.yaml"))
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load((inputs / "cal.yaml").read_text())
    job = doc["jobs"]["train"]
    assert (job["allocations"], job["interruptions"]) == (5, 3)
    assert doc["recovery"]["n"] == 3 and doc["recovery"]["p50_s"] == pytest.approx(600.0)
    assert doc["recovery"]["source"] == "measured"
    assert job["total_steps"] == 10_000_000 and job["deadline_in_s"] > 0
    r = CliRunner().invoke(app, ["twin", "simulate", "--calibrated", str(inputs / "cal.yaml"), "--runs", "2",
                                 "--draws", "2", "--json"])
    assert r.exit_code == 0, r.output
    (out,) = json.loads(r.output.strip().splitlines()[-1])["jobs"]
    lo, mid, hi = out["p_slip"]
    assert 0.0 <= lo <= mid <= hi <= 1.0


def test_a_file_that_is_not_a_ledger_is_one_line_and_writes_nothing(inputs):
    (inputs / "ledger.db").write_text("not a database\n" * 100)
    r = _calibrate(inputs)
    assert r.exit_code == 1 and r.output.count("error:") == 1 and "ledger" in r.output, r.output
    assert not (inputs / "cal.yaml").exists()


def test_snapshot_stall_comes_from_the_jobs_own_series(inputs):
    """A real Prometheus holding the runtime's series: the job's measured snapshot stall (0.4 s on the
    steps that took one) becomes its peer-memory tier's write stall."""
    import time

    from seamguard.testbed.prom import PrometheusServer, backfill

    T = float(int(time.time() // 60 * 60) - 3 * 3600)  # inside retention, outside the head block
    t = T + 15.0 * np.arange(121)
    stall = np.where(np.arange(t.size) % 4 == 0, 0.4, 0.0)
    lines = ["# TYPE seamguard_job_step gauge\n"]
    lines += [f'seamguard_job_step{{job_name="train"}} {k} {x:.0f}\n' for k, x in enumerate(t)]
    lines += ["# TYPE seamguard_rank_checkpoint_stall_seconds gauge\n"]
    lines += [f'seamguard_rank_checkpoint_stall_seconds{{job_name="train",rank="0"}} {v:g} {x:.0f}\n'
              for x, v in zip(t, stall)]
    backfill([*lines, "# EOF\n"], inputs / "tsdb")
    with PrometheusServer(inputs / "prom", tsdb_dir=inputs / "tsdb", lookback_delta="10s") as prom:
        r = CliRunner().invoke(app, ["twin", "calibrate", "--topology", str(inputs / "topology.yaml"), "--ledger",
                                     str(inputs / "ledger.db"), "--since", str(T), "--until", str(T + 1800),
                                     "--prometheus", prom.url, "-o", str(inputs / "cal.yaml")])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load((inputs / "cal.yaml").read_text())
    st = doc["jobs"]["train"]["snapshot_stall"]
    assert st["source"] == "measured" and st["p50_s"] == pytest.approx(0.4) and st["n"] >= 20
    r = CliRunner().invoke(app, ["twin", "simulate", "--calibrated", str(inputs / "cal.yaml"), "--runs", "1",
                                 "--draws", "2", "--json"])
    assert r.exit_code == 0, r.output
    (job,) = json.loads(r.output.strip().splitlines()[-1])["jobs"]
    assert job["tiers_s"]["peer_memory"]["write_stall"] == pytest.approx(0.4)


def test_an_unreachable_prometheus_is_one_line_and_writes_nothing(inputs):
    r = _calibrate(inputs, "--prometheus", "http://127.0.0.1:9")
    assert r.exit_code == 1 and r.output.startswith("error: prometheus:") and r.output.count("\n") == 1, r.output
    assert not (inputs / "cal.yaml").exists()


def test_hot_spares_never_exceed_the_jobs_nodes_and_match_poisson_when_failures_are_rare():
    from scipy import stats

    from seamguard.twin.calibrated import SPARE_QUANTILE, _spares

    repair = {("node", "hard"): 3600.0}
    # a storm (a short window's measured rate): every one of the 4 nodes down at once, never more
    assert _spares(1000.0, 4, repair, 86400.0) == 4.0
    # rare failures on 128 nodes: the finite-source count is the M/G/inf Poisson's
    lam_per_h = 0.05
    assert _spares(lam_per_h, 128, repair, 86400.0) == stats.poisson.ppf(SPARE_QUANTILE, lam_per_h * 1.0)
