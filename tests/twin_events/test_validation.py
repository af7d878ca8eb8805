"""The twin against published figures (docs/sources.md §3-4)."""

from dataclasses import replace

import numpy as np
import pytest

from seamguard.twin.events.calibration import (COMPONENTS_PER_NODE, LLAMA3_UNEXPECTED,
                                               META_RSC_RF_PER_NODE_DAY,
                                               first_failure_mean_min, link_profile,
                                               llama3_failure_model)
from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.montecarlo import run_monte_carlo
from seamguard.twin.events.processes import poisson_times


def test_llama3_419_unexpected_interruptions_with_cause_mix():
    # 16,384 GPUs x 54 days, every node in the one job (Llama 3 had no idle spares in it).
    cfg = ClusterConfig(gpus=16_384, days=54, workload="single", spare_fraction=0.0)
    [s] = run_monte_carlo(cfg, [PolicyParams("baseline")], runs=12, seed=7)
    by = s.mean_dict("interruptions_by_cause")
    llama_total = sum(by.get(c, 0.0) for c in LLAMA3_UNEXPECTED)
    assert abs(s.metric("interruptions")[0] - 419) <= 0.10 * 419
    assert abs(llama_total - 419) <= 0.10 * 419
    # cause mix: each cause with >= 30 published events within 4 standard errors
    for cause, (count, _, _) in LLAMA3_UNEXPECTED.items():
        if count >= 30:
            se = np.sqrt(count / 12)
            assert abs(by.get(cause, 0.0) - count) <= 4 * se, cause
    # the mix overall: hardware-dominated like the paper (~78% hardware)
    software = sum(by.get(c, 0.0) for c in ("software_bug", "nccl_watchdog_timeout",
                                             "dependency"))
    assert 0.75 <= 1 - software / llama_total <= 0.9


def test_llama3_rates_are_counts_over_components_and_days():
    fm = llama3_failure_model()
    assert fm.rf_per_node_day() * 2048 * 54 == pytest.approx(419)
    c = fm.cause("faulty_gpu")
    assert c.rate_per_component_day == pytest.approx(148 / (16_384 * 54))


@pytest.mark.parametrize("gpus", [8_192, 65_536])
def test_job_mttf_is_one_over_nodes_times_rf(gpus):
    cfg = ClusterConfig(gpus=gpus, days=10, workload="single", spare_fraction=0.02,
                        failures=replace(llama3_failure_model().with_rf(META_RSC_RF_PER_NODE_DAY),
                                         cooling_event_per_loop_day=0.0))
    [s] = run_monte_carlo(cfg, [PolicyParams("baseline")], runs=6, seed=3)
    n_nodes = cfg.nodes - cfg.spare_nodes
    expected_h = 24.0 / (n_nodes * META_RSC_RF_PER_NODE_DAY)
    assert s.to_json()["mttf_hours"] == pytest.approx(expected_h, rel=0.08)


def test_seed_claim_26_28_minutes_for_100k_links_at_5_years():
    fm = link_profile(llama3_failure_model(), "mttf", mttf_years=5.0)
    link = fm.cause("network_switch_cable")
    n_links = 12_500 * COMPONENTS_PER_NODE["link"]          # 100,000 links
    assert n_links == 100_000
    assert first_failure_mean_min(int(n_links), link.rate_per_component_day) == \
        pytest.approx(26.28, abs=0.01)
    # and the twin's own stream generator reproduces it empirically
    rng = np.random.default_rng(11)
    firsts = [poisson_times(link.rate_per_component_day, n_links, 86_400.0, rng)[0]
              for _ in range(3000)]
    assert np.mean(firsts) / 60.0 == pytest.approx(26.28, rel=0.05)


def test_hpn_link_profile_rates():
    fm = link_profile(llama3_failure_model(), "hpn")
    link = fm.cause("network_switch_cable")
    assert link.rate_per_component_day * (365.25 / 12) == pytest.approx(0.057e-2)
    assert fm.cause("tor_switch").rate_per_component_day * (365.25 / 12) == \
        pytest.approx(0.051e-2)


def test_node_failure_rate_option_keeps_the_mix():
    fm = llama3_failure_model().with_rf(5e-3)
    assert fm.rf_per_node_day() == pytest.approx(5e-3)
    base = llama3_failure_model()
    ratio = fm.cause("gpu_hbm3").rate_per_node_day() / base.cause("gpu_hbm3").rate_per_node_day()
    assert ratio == pytest.approx(5e-3 / base.rf_per_node_day())
