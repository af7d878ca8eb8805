"""The opponents as a competent operator tunes them, and seamguard on its measured detector.

* ``baseline_fixed`` checkpoints at Daly's interval for its own write and the job's MTTF;
* ``in_job_restart`` flags a slowed rank the NVRx way (relative score below a threshold
  over a reporting window) and restarts without it, at its planned restart's cost;
* the seamguard policy samples misses and delays from a detection result, not a constant.
"""

import json
from dataclasses import replace

import numpy as np
import pytest

from seamguard.reliability import daly_interval_s
from seamguard.twin.events.config import ClusterConfig, PolicyParams, workload
from seamguard.twin.events.detection import (TWIN_EVENT_CLASSES, load_detection_results,
                                             parse_detection_results)
from seamguard.twin.events.policies import all_scope_hazards
from seamguard.twin.events.processes import empty_streams
from seamguard.twin.events.simulator import simulate_streams


def _cfg(model):
    return ClusterConfig(gpus=1024, days=1.0, workload="single", failures=model)


def _one_slow(comm: bool, sev: float, t_s: float = 3600.0, dur_s: float = 3 * 3600.0):
    return replace(empty_streams(), slow_t=np.array([t_s]), slow_node=np.array([0]),
                   slow_comm=np.array([comm]), slow_dur_s=np.array([dur_s]),
                   slow_sev=np.array([sev]))


def _lost_s(r, cause, gpus):
    return r.gpu_hours_lost_by_cause.get(cause, 0.0) * 3600 / gpus


@pytest.mark.parametrize("rf, write_min", [(0.01, 5.0), (0.05, 2.0)])
def test_baseline_fixed_runs_dalys_interval_for_its_write_and_the_jobs_mttf(quiet_model, rf,
                                                                           write_min):
    cfg = _cfg(quiet_model.with_rf(rf))
    pp = PolicyParams("baseline_fixed", checkpoint_write_min=write_min)
    job_nodes = workload(cfg)[0].nodes
    mttf_s = 1.0 / (sum(all_scope_hazards(cfg).values()) * job_nodes)
    r = simulate_streams(cfg, pp, empty_streams())   # no failure strikes: the cycle alone
    assert r.checkpoint_interval_min == pytest.approx(
        daly_interval_s(write_min * 60.0, mttf_s) / 60.0, rel=1e-9)
    # an hourly interval stays available when asked for
    hourly = simulate_streams(cfg, replace(pp, fixed_interval_min=60.0), empty_streams())
    assert hourly.checkpoint_interval_min == pytest.approx(60.0)


def test_in_job_restart_flags_a_slowed_rank_and_pays_its_planned_restart(quiet_model):
    cfg = _cfg(quiet_model)
    pp = PolicyParams("in_job_restart")
    gpus = workload(cfg)[0].nodes * cfg.gpus_per_node
    c = pp.cost_model
    restart = c.write_blocking_s + c.requeue_s + c.restart_s * pp.rank_scale(gpus) + c.load_s
    sev = 1.0 - 0.5 * pp.straggler_threshold   # relative score well below the threshold
    r = simulate_streams(cfg, pp, _one_slow(False, sev))
    assert r.quarantines == 1
    lost = _lost_s(r, "fail_slow_compute", gpus)
    # slow from onset to the end of the first full report window, then the restart
    lo, hi = sev * pp.straggler_report_s, sev * 2 * pp.straggler_report_s
    assert lo + restart <= lost + 1e-6 and lost <= hi + restart + 1e-6
    # a rank whose score stays above the threshold, and a slow link, are not flagged
    mild = 0.5 * (1.0 - pp.straggler_threshold)
    for comm, s in ((False, mild), (True, sev)):
        k = simulate_streams(cfg, pp, _one_slow(comm, s))
        assert k.quarantines == 0
        cause = "fail_slow_comm" if comm else "fail_slow_compute"
        assert _lost_s(k, cause, gpus) == pytest.approx(s * 3 * 3600.0, rel=1e-6)
    # without a spare the flag changes nothing
    none = simulate_streams(replace(cfg, spare_fraction=0.0), pp, _one_slow(False, sev))
    assert none.quarantines == 0


def _detection_doc(recall: float, p50: float, p90: float, precision: float = 0.95) -> dict:
    names = {n for ns in TWIN_EVENT_CLASSES.values() for n in ns}
    return {"current": {"overall": {"precision": precision},
                        "per_class": {n: {"incidents": 10, "recall": recall,
                                          "median_delay_s": p50, "p90_delay_s": p90}
                                      for n in names}}}


def test_detection_model_samples_misses_and_delays_from_the_measured_distribution():
    doc = _detection_doc(0.7, 60.0, 240.0)
    doc["current"]["per_class"]["power_brake"] = {"incidents": 30, "recall": 1.0,
                                                  "median_delay_s": 0.0, "p90_delay_s": 0.0}
    m = parse_detection_results(doc, "d.json")
    rng = np.random.default_rng(1)
    draws = [m.sample_delay_s("fail_slow_compute", rng) for _ in range(40_000)]
    # power_brake: 30 incidents, always found at once; every other class 10, 70 % found
    others = 10 * (len(TWIN_EVENT_CLASSES["fail_slow_compute"]) - 1)
    found = np.array([d for d in draws if d is not None])
    miss = others / (30 + others) * 0.3
    assert sum(d is None for d in draws) / len(draws) == pytest.approx(miss, abs=0.01)
    assert m.recall("fail_slow_compute") == pytest.approx(1.0 - miss)
    zero = np.count_nonzero(found == 0.0) / len(draws)
    assert zero == pytest.approx(30 / (30 + others), abs=0.01)
    late = found[found > 0]
    assert np.median(late) == pytest.approx(60.0, rel=0.05)
    assert np.percentile(late, 90) == pytest.approx(240.0, rel=0.06)
    assert m.precision == 0.95
    lower = m.at_recall_bound()
    assert all(c.recall < 0.7 for c in lower.classes["fail_slow_comm"])


def test_detection_results_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^d.json: not a benchmarks/detection.py result"):
        parse_detection_results({"overall": {}}, "d.json")
    bad = _detection_doc(1.0, 30.0, 30.0)
    bad["current"]["per_class"]["ecc_sbe"]["recall"] = 1.5
    with pytest.raises(ValueError, match=r"^d.json: per_class.ecc_sbe needs a recall in \[0, 1\]"):
        parse_detection_results(bad, "d.json")
    # the arms layout: the held-out arm's seamguard block, precision per alarm
    held = _detection_doc(0.5, 30.0, 30.0, precision=0.9)["current"]
    held["overall"]["precision_per_alarm"] = 0.8
    dev = _detection_doc(1.0, 30.0, 30.0)["current"]
    arms = {"arms": {"dev": {"seamguard": dev}, "heldout": {"seamguard": held}}}
    m = parse_detection_results(arms, "a.json")
    assert m.source == "a.json (arm heldout)" and m.precision == 0.8
    assert m.recall("cooling") == pytest.approx(0.5)
    f = tmp_path / "det.json"
    f.write_text("{")
    with pytest.raises(ValueError, match="cannot read detection results"):
        load_detection_results(f)
    f.write_text(json.dumps(_detection_doc(1.0, 30.0, 30.0)))
    assert load_detection_results(f).source == str(f)


def test_seamguard_acts_after_the_sampled_delay_and_not_on_a_miss(quiet_model):
    cfg = _cfg(quiet_model)
    gpus = workload(cfg)[0].nodes * cfg.gpus_per_node
    sev = 0.4
    found = PolicyParams("seamguard", detection=parse_detection_results(
        _detection_doc(1.0, 120.0, 120.0, precision=1.0), "d.json"))
    r = simulate_streams(cfg, found, _one_slow(False, sev))
    assert r.quarantines == 1
    assert _lost_s(r, "fail_slow_compute", gpus) == pytest.approx(
        sev * 120.0 + found.live_recovery_s, rel=1e-6)
    missed = replace(found, detection=parse_detection_results(
        _detection_doc(0.0, 120.0, 120.0, precision=1.0), "d.json"))
    m = simulate_streams(cfg, missed, _one_slow(False, sev))
    assert m.quarantines == 0
    assert _lost_s(m, "fail_slow_compute", gpus) == pytest.approx(sev * 3 * 3600.0, rel=1e-6)
