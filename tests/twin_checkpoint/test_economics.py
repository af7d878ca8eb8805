"""Economic model: decision tables for keep vs quarantine, and the throughput arithmetic."""

import pytest

from seamguard.decide.economics import (Criticality, DegradedNodeContext, JobClass,
                                        failure_adjusted_throughput, impact_fraction,
                                        quarantine_decision, rollback_exposure_gpu_h,
                                        schedule_slip_probability, useful_throughput)

C, J = Criticality, JobClass


def ctx(job_class, criticality, job_gpus, **kw):
    base = dict(job_class=job_class, criticality=criticality, job_gpus=job_gpus,
                node_gpus=8, slowdown=0.3, hazard_multiplier=1.0, node_hazard_per_h=2e-4,
                loss_per_failure_h=0.01, horizon_h=1.0, swap_cost_s=30.0,
                spare_available=True, hold_h=4.0)
    base.update(kw)
    return DegradedNodeContext(**base)


@pytest.mark.parametrize("job_class,crit,gpus,expected", [
    # the same degraded node...
    (J.ASYNC_BATCH_INFERENCE, C.LOW, 1024, "keep"),          # ...may stay under batch
    (J.HIGH_SYNC_TRAINING, C.RELEASE_CRITICAL, 1024, "quarantine"),  # ...must go here
    (J.HIGH_SYNC_TRAINING, C.RELEASE_CRITICAL, 64, "quarantine"),
    (J.HIGH_SYNC_TRAINING, C.NORMAL, 64, "keep"),            # 19 GPU-h < 32 GPU-h removed
    (J.PIPELINE_TRAINING, C.NORMAL, 4096, "quarantine"),
    (J.LATENCY_INFERENCE, C.HIGH, 512, "keep"),
    (J.LATENCY_INFERENCE, C.RELEASE_CRITICAL, 64, "quarantine"),
])
def test_quarantine_decision_table(job_class, crit, gpus, expected):
    assert quarantine_decision(ctx(job_class, crit, gpus)).action == expected


def test_quarantine_must_buy_more_than_it_removes():
    # benefit = 64 * 0.3 * h; capacity removed = 8 GPUs * 4 h = 32 GPU-h (+ tiny stall)
    just_below = ctx(J.HIGH_SYNC_TRAINING, C.NORMAL, 64, horizon_h=1.6)   # 30.7 GPU-h
    just_above = ctx(J.HIGH_SYNC_TRAINING, C.NORMAL, 64, horizon_h=1.8)   # 34.6 GPU-h
    d1, d2 = quarantine_decision(just_below), quarantine_decision(just_above)
    assert d1.action == "keep" and d1.benefit_gpu_h < d1.cost_gpu_h
    assert d2.action == "quarantine" and d2.benefit_gpu_h > d2.cost_gpu_h


def test_no_spare_means_keep():
    d = quarantine_decision(ctx(J.HIGH_SYNC_TRAINING, C.RELEASE_CRITICAL, 4096,
                                spare_available=False))
    assert d.action == "keep" and "no spare" in d.reasons[-1]


def test_failure_hazard_alone_can_justify_quarantine():
    healthy_speed = ctx(J.HIGH_SYNC_TRAINING, C.NORMAL, 8192, slowdown=0.0)
    lemon = ctx(J.HIGH_SYNC_TRAINING, C.NORMAL, 8192, slowdown=0.0, hazard_multiplier=200.0,
                loss_per_failure_h=0.5)
    assert quarantine_decision(healthy_speed).action == "keep"
    assert quarantine_decision(lemon).action == "quarantine"


def test_impact_fraction_by_class():
    assert impact_fraction(J.HIGH_SYNC_TRAINING, 1024, 8, 0.3) == pytest.approx(0.3)
    assert impact_fraction(J.ASYNC_BATCH_INFERENCE, 1024, 8, 0.3) == pytest.approx(0.3 * 8 / 1024)
    assert impact_fraction(J.LATENCY_INFERENCE, 1024, 8, 0.3) == pytest.approx(8 / 1024)
    assert impact_fraction(J.LATENCY_INFERENCE, 1024, 8, 0.0) == 0.0


def test_throughput_arithmetic():
    assert useful_throughput(1000, 0.9) == pytest.approx(900)
    assert failure_adjusted_throughput(1000, 0.9, hazard_per_h=2.0, loss_per_failure_h=0.1) \
        == pytest.approx(900 * 0.8)
    assert rollback_exposure_gpu_h(1000, 1800) == pytest.approx(500)


@pytest.mark.parametrize("work,deadline,ettr,sd,expected", [
    (90.0, 100.0, 0.9, 0.05, 0.5),      # needs exactly what is expected
    (50.0, 100.0, 0.9, 0.05, 0.0),      # far ahead
    (99.0, 100.0, 0.9, 0.01, 1.0),      # hopeless
    (10.0, 0.0, 0.9, 0.05, 1.0),        # deadline passed with work left
])
def test_schedule_slip_probability(work, deadline, ettr, sd, expected):
    assert schedule_slip_probability(work, deadline, ettr, sd) == pytest.approx(expected, abs=1e-6)
