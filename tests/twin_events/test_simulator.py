"""Simulator: accounting identities, injected failures with hand-computed losses, seeds."""

import math
from dataclasses import replace

import numpy as np
import pytest

from seamguard.twin.events.calibration import llama3_failure_model
from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.kernel import EventQueue
from seamguard.twin.events.measured import DEFAULT_FIGURES
from seamguard.twin.events.montecarlo import mean_ci95, run_monte_carlo
from seamguard.twin.events.processes import empty_streams, inject_failure
from seamguard.twin.events.simulator import simulate_run, simulate_streams


def _cfg(model, gpus=1024, days=1.0, workload="single"):
    return ClusterConfig(gpus=gpus, days=days, workload=workload, failures=model)


def _cause_index(model, name):
    return [c.name for c in model.causes].index(name)


def test_kernel_orders_by_time_then_priority_then_sequence():
    q = EventQueue()
    q.push(5.0, 2, 0, "late-fail")
    q.extend([(1.0, 3, 0, "a"), (1.0, 1, 0, "b"), (1.0, 3, 0, "c")])
    q.push(1.0, 1, 0, "d")
    assert [q.pop()[4] for _ in range(len(q))] == ["b", "d", "a", "c", "late-fail"]


def test_baseline_without_failures_matches_checkpoint_cycle(quiet_model):
    # 1440 min = 22 cycles of (60 compute + 5 write) + 10 min compute
    r = simulate_streams(_cfg(quiet_model), PolicyParams("baseline", fixed_interval_min=60.0), empty_streams())
    assert r.ettr == pytest.approx((22 * 60 + 10) / 1440, abs=1e-12)
    assert r.gpu_hours_lost_by_cause == pytest.approx({"checkpoint_overhead": 22 * 5 / 60 * 1000})


def test_injected_failure_baseline_rolls_back_and_restarts(quiet_model):
    i = _cause_index(quiet_model, "faulty_gpu")
    s = inject_failure(empty_streams(), 90 * 60.0, i, node=0)
    r = simulate_streams(_cfg(quiet_model), PolicyParams("baseline", fixed_interval_min=60.0), s)
    # committed at 65 min; 25 min of work rolled back; 10 min restart (1000 job GPUs)
    assert r.interruptions_by_cause == {"faulty_gpu": 1}
    assert r.gpu_hours_lost_by_cause["faulty_gpu"] == pytest.approx((25 + 10) / 60 * 1000)
    assert r.rollback_lost_gpu_hours == pytest.approx(25 / 60 * 1000)


def _lost_s(r, cause: str, gpus: int = 1000) -> float:
    return r.gpu_hours_lost_by_cause[cause] * 3600 / gpus


def test_injected_failure_seamguard_recovers_live(quiet_model):
    i = _cause_index(quiet_model, "faulty_gpu")
    pp = PolicyParams("seamguard")
    s = inject_failure(empty_streams(), 90 * 60.0, i, node=0)
    r = simulate_streams(_cfg(quiet_model), pp, s)
    # measured resume scaled to a 64-GPU replica group + the spare's shard restore
    live = 5.06 * math.log2(64) + 28.0 * 0.051
    assert pp.live_recovery_s == pytest.approx(live)
    # survivors keep their live state: only the step in flight is redone
    assert _lost_s(r, "faulty_gpu") == pytest.approx(5.0 + live)
    assert r.rollback_lost_gpu_hours * 3600 / 1000 == pytest.approx(5.0)
    # with usable pre-failure evidence the node is swapped before it fails: nothing redone
    s2 = inject_failure(empty_streams(), 90 * 60.0, i, node=0, precursor_lead_s=3600.0)
    r2 = simulate_streams(_cfg(quiet_model), pp, s2)
    assert r2.precursor_prevented == 1
    assert _lost_s(r2, "faulty_gpu") == pytest.approx(live)


@pytest.mark.parametrize("job_wide, captured", [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0)])
def test_injected_software_bug_seamguard(quiet_model, job_wide, captured):
    i = _cause_index(quiet_model, "software_bug")
    # the restart after every rank raised is measured apart from the one after a kill
    runtime = replace(DEFAULT_FIGURES, relaunch_captured_s=2.0)
    pp = PolicyParams("seamguard", job_wide_crash_fraction=job_wide,
                      crash_capture_fraction=captured, runtime=runtime)
    r = simulate_streams(_cfg(quiet_model), pp, inject_failure(empty_streams(), 5000.0, i, 0))
    lost = _lost_s(r, "software_bug")
    relaunch = pp.relaunch_from_memory_s(1000)
    assert relaunch == pytest.approx(3.46 * math.log2(1000) + 28.0 * 0.051)
    if job_wide and captured:
        # every rank raised: each left the failed step's start in host memory, so the
        # relaunch (the one measured after exceptions) redoes only the step in flight
        assert pp.relaunch_from_memory_s(1000, captured=True) == \
            pytest.approx(2.0 * math.log2(1000) + 28.0 * 0.051)
        assert lost == pytest.approx(0.5 * pp.step_time_s
                                     + pp.relaunch_from_memory_s(1000, captured=True))
        # and nothing is left for periodic snapshots to cover (quiet model: no other cause)
        assert not math.isfinite(r.checkpoint_interval_min)
    elif job_wide:
        # every rank crashed by signal: relaunch, restore the snapshots left in host
        # memory, redo the work since the newest one
        assert relaunch + 0.5 * pp.step_time_s < lost
        assert lost <= relaunch + r.checkpoint_interval_min * 60 + 1e-6
    else:
        # one rank's crash is replaced live like a lost node, with no spare node needed
        assert lost == pytest.approx(5.0 + pp.live_recovery_s)
        assert r.waiting_events == 0


@pytest.mark.parametrize("caught", [0.0, 1.0])
def test_injected_silent_corruption_seamguard(quiet_model, caught):
    i = _cause_index(quiet_model, "silent_data_corruption")
    pp = PolicyParams("seamguard", sdc_caught_at_step_fraction=caught)
    r = simulate_streams(_cfg(quiet_model), pp, inject_failure(empty_streams(), 5000.0, i, 0))
    lost = _lost_s(r, "silent_data_corruption")
    if caught:
        # rejected by the step guard: the step and a failed recompute redone, the rank
        # replaced live, its node sent to repair (a spare taken), nothing rolled back further
        assert lost == pytest.approx(2 * pp.step_time_s + pp.live_recovery_s)
        assert r.rollback_lost_gpu_hours * 3600 / 1000 == pytest.approx(2 * pp.step_time_s)
    else:
        # surfaced later: back to the newest storage backstop, older than the memory
        # tier, in place from the copy every rank kept in host memory (no relaunch)
        in_place = pp.rollback_in_place_s(1000)
        assert in_place == pytest.approx(5.06 * math.log2(1000) + 28.0 * 0.051)
        assert in_place < lost


def test_hung_collective_costs_the_detection_timeout(quiet_model):
    i = _cause_index(quiet_model, "nccl_watchdog_timeout")
    s = inject_failure(empty_streams(), 90 * 60.0, i, node=0)
    base = simulate_streams(_cfg(quiet_model), PolicyParams("baseline", fixed_interval_min=60.0), s)
    # 25 min rolled back, 10 min NCCL watchdog timeout, 10 min restart
    assert _lost_s(base, "nccl_watchdog_timeout") == pytest.approx((25 + 10 + 10) * 60)
    pp = PolicyParams("seamguard", job_wide_crash_fraction=0.0)
    sg = simulate_streams(_cfg(quiet_model), pp, s)
    assert _lost_s(sg, "nccl_watchdog_timeout") == pytest.approx(
        5.0 + pp.hang_detect_s + pp.live_recovery_s)


def test_waiting_for_spares_when_pool_is_empty(quiet_model):
    cfg = ClusterConfig(gpus=1024, days=2, workload="single", spare_fraction=0.0,
                        failures=quiet_model)
    i = _cause_index(quiet_model, "psu")
    r = simulate_streams(cfg, PolicyParams("baseline", fixed_interval_min=60.0),
                         inject_failure(empty_streams(), 3600.0, i, node=3), seed=1)
    assert r.waiting_events == 1
    assert r.gpu_hours_lost_by_cause["psu"] > 10 / 60 * 1024   # waited for the repair


@pytest.mark.parametrize("policy", ["baseline", "seamguard"])
@pytest.mark.parametrize("workload", ["single", "mix"])
def test_every_gpu_second_is_accounted_for(policy, workload):
    model = llama3_failure_model().with_rf(5e-3)
    r = simulate_run(_cfg(model, gpus=16_384, days=5, workload=workload), PolicyParams(policy), 4)
    total = r.productive_gpu_hours + sum(r.gpu_hours_lost_by_cause.values())
    assert total == pytest.approx(r.allocated_gpu_hours, rel=1e-9)
    assert 0.0 < r.ettr <= 1.0 and r.goodput <= r.ettr


def test_seed_reproduces_a_run_exactly_and_policies_share_streams():
    cfg = _cfg(replace(llama3_failure_model(), cooling_trip_probability=0.0), gpus=8192, days=7,
               workload="mix")
    a = simulate_run(cfg, PolicyParams("seamguard"), 42)
    b = simulate_run(cfg, PolicyParams("seamguard"), 42)
    c = simulate_run(cfg, PolicyParams("seamguard"), 43)
    strip = lambda r: replace(r, wall_s=0.0)  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)
    base = simulate_run(cfg, PolicyParams("baseline"), 42)
    assert base.interruptions_by_cause == a.interruptions_by_cause


def test_seamguard_beats_baseline_at_scale_with_meta_rate():
    cfg = _cfg(llama3_failure_model().with_rf(5e-3), gpus=32_768, days=10)
    b, s = run_monte_carlo(cfg, [PolicyParams("baseline"), PolicyParams("seamguard")], 2, 0)
    assert s.metric("ettr")[0] > b.metric("ettr")[0] + 0.2
    assert s.metric("checkpoint_interval_min")[0] < 60.0


def test_link_failover_absorbs_flaps():
    model = replace(llama3_failure_model().with_rf(1e-12), planned_per_node_day=0.0,
                    fail_slow_per_node_day=0.0, cooling_event_per_loop_day=0.0,
                    flap_per_link_day=0.05)
    cfg = _cfg(model, gpus=4096, days=2)
    b = simulate_run(cfg, PolicyParams("baseline"), 5).gpu_hours_lost_by_cause["link_flap"]
    s = simulate_run(cfg, PolicyParams("seamguard"), 5).gpu_hours_lost_by_cause["link_flap"]
    # 9 s stall per flap vs 6.25% of a 5 s flap (both streams identical)
    assert s == pytest.approx(b * 0.0625 * 5 / 9, rel=0.02)


def test_process_pool_gives_the_same_results_as_local():
    cfg = _cfg(llama3_failure_model(), gpus=2048, days=3, workload="mix")
    pols = [PolicyParams("baseline"), PolicyParams("seamguard")]
    local = run_monte_carlo(cfg, pols, 2, 9, "local")
    pool = run_monte_carlo(cfg, pols, 2, 9, "process", workers=2)
    for x, y in zip(local, pool):
        assert [r.ettr for r in x.runs] == [r.ettr for r in y.runs]


def test_mean_ci95():
    m, lo, hi = mean_ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and lo == pytest.approx(2 - 4.303 / math.sqrt(3)) and hi > m
    assert mean_ci95([5.0]) == (5.0, 5.0, 5.0)


def test_bad_settings_name_the_option():
    with pytest.raises(ValueError, match="--gpus"):
        ClusterConfig(gpus=-8, days=1)
    with pytest.raises(ValueError, match="--days"):
        ClusterConfig(gpus=8, days=0)
    with pytest.raises(ValueError, match="--detection-precision"):
        PolicyParams("seamguard", detection_precision=0.0)
    with pytest.raises(ValueError, match="--runs"):
        run_monte_carlo(ClusterConfig(gpus=8, days=1), [PolicyParams("baseline")], 0, 0)
    with pytest.raises(ValueError, match="--executor"):
        run_monte_carlo(ClusterConfig(gpus=64, days=1), [PolicyParams("baseline")], 1, 0, "slurm")


def test_streams_cost_grows_linearly():
    from seamguard.twin.events.processes import generate_streams
    small = generate_streams(ClusterConfig(gpus=10_000, days=30), np.random.default_rng(0))
    big = generate_streams(ClusterConfig(gpus=100_000, days=30), np.random.default_rng(0))
    assert big.n_events / small.n_events == pytest.approx(10.0, rel=0.1)


def _one_fail_slow(t_s: float, comm: bool, dur_s: float, sev: float):
    return replace(empty_streams(), slow_t=np.array([t_s]), slow_node=np.array([0]),
                   slow_comm=np.array([comm]), slow_dur_s=np.array([dur_s]),
                   slow_sev=np.array([sev]))


def test_comm_fail_slow_fails_over_then_the_economics_decides(quiet_model):
    pp = PolicyParams("seamguard", detection_precision=1.0)
    cfg = _cfg(quiet_model)
    # a long episode: failing over leaves 6.25% on the whole synchronous job for the
    # remaining minutes, which costs more than a live swap -> the node is swapped out
    r = simulate_streams(cfg, pp, _one_fail_slow(3600.0, True, 3 * 3600.0, 0.4))
    assert r.quarantines == 1
    lost = _lost_s(r, "fail_slow_comm")
    assert lost == pytest.approx(0.4 * pp.detection_delay_s + pp.live_recovery_s, rel=1e-6)
    # the baseline carries the slowdown through every compute second of the episode
    # (60 of every 65 minutes; the checkpoint writes are charged to the checkpoint)
    b = simulate_streams(cfg, PolicyParams("baseline"), _one_fail_slow(3600.0, True, 3 * 3600.0, 0.4))
    assert 0.4 * 3 * 3600.0 * 60 / 65 - 0.4 * 300 <= _lost_s(b, "fail_slow_comm") <= 0.4 * 3 * 3600.0
