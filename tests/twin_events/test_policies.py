"""The four policies: their parts, and single injected failures with hand-computed costs."""

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from seamguard.app.cli import app
from seamguard.twin.events.config import ClusterConfig, CostModel, PolicyParams, default_costs
from seamguard.twin.events.policies import (ControlPlane, FixedInterval, InJobRestart,
                                            LiveRecovery, PlannerInterval, RequeueRestart,
                                            YoungDalyInterval, build_policy)
from seamguard.twin.events.processes import empty_streams, inject_failure
from seamguard.twin.events.simulator import simulate_streams

GPUS = 1000   # job GPUs of a 1,024-GPU cluster after 2% spares


def _cfg(model, spare_fraction=0.02):
    return ClusterConfig(gpus=1024, days=1.0, workload="single", failures=model,
                         spare_fraction=spare_fraction)


def _cause(model, name):
    return [c.name for c in model.causes].index(name)


def _lost_s(r, cause):
    return r.gpu_hours_lost_by_cause[cause] * 3600 / GPUS


def _costs(**kw):
    base = dict(interval_s=600.0, write_blocking_s=10.0, write_async_s=300.0, restart_s=600.0,
                requeue_s=0.0, load_s=0.0, hang_detect_s=600.0, swap_s=0.0,
                backstop_interval_s=3600.0)
    return CostModel(**{**base, **kw})


def test_each_policy_is_built_from_named_parts():
    parts = {n: build_policy(PolicyParams(n)) for n in
             ("baseline_fixed", "baseline_daly_async", "in_job_restart", "seamguard")}
    assert isinstance(parts["baseline_fixed"].interval, YoungDalyInterval)
    assert isinstance(build_policy(PolicyParams("baseline_fixed", costs=_costs())).interval,
                      FixedInterval)   # a fixed interval only when one is given
    assert isinstance(parts["baseline_daly_async"].interval, YoungDalyInterval)
    assert isinstance(parts["in_job_restart"].interval, YoungDalyInterval)
    assert isinstance(parts["seamguard"].interval, PlannerInterval)
    assert isinstance(parts["baseline_fixed"].recovery, RequeueRestart)
    assert isinstance(parts["baseline_daly_async"].recovery, RequeueRestart)
    assert isinstance(parts["in_job_restart"].recovery, InJobRestart)
    assert isinstance(parts["seamguard"].recovery, LiveRecovery)
    assert isinstance(parts["seamguard"].control_plane, ControlPlane)
    assert all(parts[n].control_plane is None for n in parts if n != "seamguard")
    assert PolicyParams("baseline").name == "baseline_fixed"


def test_async_write_failure_inside_the_drain_loses_the_interval_before(quiet_model):
    pp = PolicyParams("baseline_daly_async", costs=_costs())
    i = _cause(quiet_model, "faulty_gpu")
    # cycle 600 s compute + 10 s snapshot; the write drains 300 s into the next cycle
    inside = simulate_streams(_cfg(quiet_model), pp, inject_failure(empty_streams(), 710.0, i, 0))
    after = simulate_streams(_cfg(quiet_model), pp, inject_failure(empty_streams(), 1010.0, i, 0))
    assert _lost_s(inside, "faulty_gpu") == pytest.approx(100 + 600 + 600)
    assert _lost_s(after, "faulty_gpu") == pytest.approx(400 + 600)


def test_in_job_restart_rolls_back_to_memory_and_restarts_in_place(quiet_model):
    costs = replace(default_costs(PolicyParams("in_job_restart")), interval_s=600.0,
                    write_blocking_s=0.0)
    pp = PolicyParams("in_job_restart", costs=costs)
    rec = costs.restart_s * pp.rank_scale(GPUS) + costs.load_s
    i = _cause(quiet_model, "faulty_gpu")
    r = simulate_streams(_cfg(quiet_model), pp, inject_failure(empty_streams(), 5500.0, i, 0))
    assert _lost_s(r, "faulty_gpu") == pytest.approx(100 + rec)
    hang = _cause(quiet_model, "nccl_watchdog_timeout")
    h = simulate_streams(_cfg(quiet_model), pp, inject_failure(empty_streams(), 5500.0, hang, 0))
    assert _lost_s(h, "nccl_watchdog_timeout") == pytest.approx(100 + 60.0 + rec)   # NVRx timeout


def test_young_daly_interval_follows_the_jobs_failure_rate(quiet_model):
    model = quiet_model.with_rf(5e-3)
    r = simulate_streams(_cfg(model), PolicyParams("in_job_restart"), empty_streams())
    pp = PolicyParams("in_job_restart")
    hz_s = model.rf_per_node_day() / 86_400.0 * 125   # 125 job nodes
    from seamguard.decide.tiers import daly_interval_s
    expected = daly_interval_s(pp.cost_model.write_blocking_s, 1.0 / hz_s)
    # cooling trips add a little to the hazard the interval is planned for
    assert r.checkpoint_interval_min * 60 == pytest.approx(expected, rel=0.05)


def test_precursor_drain_is_the_controllers_call(quiet_model):
    hbm = _cause(quiet_model, "gpu_hbm3")
    s = inject_failure(empty_streams(), 5400.0, hbm, 0, precursor_lead_s=1800.0)
    with_spare = simulate_streams(_cfg(quiet_model), PolicyParams("seamguard"), s)
    assert with_spare.precursor_prevented == 1
    # no spare: quarantine_decision keeps the node, the failure is recovered live
    no_spare = simulate_streams(_cfg(quiet_model, 0.0), PolicyParams("seamguard"), s)
    assert no_spare.precursor_prevented == 0


def test_policy_config_file_replaces_named_costs(tmp_path):
    runner = CliRunner()
    args = ["twin", "simulate", "--gpus", "1024", "--days", "2", "--json", "--compare",
            "baseline_fixed", "--node-failure-rate", "0.05"]
    base = json.loads(runner.invoke(app, args).stdout)
    f = tmp_path / "policies.json"
    f.write_text(json.dumps({"baseline_fixed": {"restart_s": 60.0, "interval_s": 1800.0}}))
    res = runner.invoke(app, [*args, "--policy-config", str(f)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["checkpoint_interval_min"] == pytest.approx(30.0)
    assert doc["ettr"] > base["ettr"]
    f.write_text(json.dumps({"baseline_fixed": {"restart_minutes": 1}}))
    bad = runner.invoke(app, [*args, "--policy-config", str(f)])
    assert bad.exit_code == 2 and "--policy-config" in bad.output


def test_single_run_has_no_interval():
    res = CliRunner().invoke(app, ["twin", "simulate", "--gpus", "1024", "--days", "1", "--json",
                                   "--compare", "seamguard"])
    assert json.loads(res.stdout)["ettr_ci95"] == "n/a"
    assert not math.isnan(json.loads(res.stdout)["ettr"])


def test_the_simulator_never_asks_which_policy_it_runs():
    # Policies differ only through their parts (policies.build_policy looks at the name).
    import inspect

    from seamguard.twin.events import simulator
    src = inspect.getsource(simulator)
    assert "name ==" not in src and '"seamguard"' not in src and "self.sg" not in src


def test_links_are_a_named_part_any_policy_can_take(quiet_model):
    from seamguard.twin.events.config import ClusterConfig as CC
    model = replace(quiet_model, flap_per_link_day=0.05)
    cfg = CC(gpus=4096, days=2, workload="single", failures=model)
    from seamguard.twin.events.simulator import simulate_run
    stall = simulate_run(cfg, PolicyParams("in_job_restart", links="stall"), 5).gpu_hours_lost_by_cause["link_flap"]
    bond = simulate_run(cfg, PolicyParams("in_job_restart"), 5)   # bonded by default
    assert bond.gpu_hours_lost_by_cause["link_flap"] == pytest.approx(stall * 0.0625 * 5 / 9, rel=0.02)
    with pytest.raises(ValueError, match="links"):
        PolicyParams("baseline_fixed", links="bonded")
