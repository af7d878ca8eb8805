"""Self-consistency of the failure model: its generators reproduce its own rates.

These are not validation (they compare the model with its own parameters, computed, never
with a published figure); tests in test_validation.py compare with figures that were not
inputs.
"""

from dataclasses import replace

import numpy as np
import pytest

from seamguard.twin.events.calibration import (COMPONENTS_PER_NODE, HPN_LINK_FAIL_PER_MONTH,
                                               HPN_TOR_FAIL_PER_MONTH, LLAMA3_DAYS, LLAMA3_GPUS,
                                               LLAMA3_UNEXPECTED, first_failure_mean_min,
                                               link_profile, llama3_failure_model)
from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.montecarlo import run_monte_carlo
from seamguard.twin.events.processes import poisson_times


def test_generated_interruptions_follow_the_models_own_rates():
    cfg = ClusterConfig(gpus=16_384, days=54, workload="single", spare_fraction=0.0)
    fm = cfg.failures
    [s] = run_monte_carlo(cfg, [PolicyParams("baseline_fixed")], runs=12, seed=7)
    by = s.mean_dict("interruptions_by_cause")
    expected_total = fm.rf_per_node_day() * cfg.nodes * cfg.days
    assert s.metric("interruptions")[0] == pytest.approx(expected_total, rel=0.10)
    for c in fm.causes:
        exp = c.rate_per_node_day() * cfg.nodes * cfg.days
        if exp >= 30:
            assert abs(by.get(c.name, 0.0) - exp) <= 4 * np.sqrt(exp / 12), c.name


def test_per_component_rates_are_counts_over_components_and_days():
    fm = llama3_failure_model()
    nodes = LLAMA3_GPUS // 8
    for name, (count, comp, _) in LLAMA3_UNEXPECTED.items():
        per_comp = count / (nodes * COMPONENTS_PER_NODE[comp] * LLAMA3_DAYS)
        assert fm.cause(name).rate_per_component_day == pytest.approx(per_comp), name


@pytest.mark.parametrize("gpus", [8_192, 65_536])
def test_job_mttf_is_one_over_nodes_times_rf(gpus):
    rf = 5e-3
    cfg = ClusterConfig(gpus=gpus, days=10, workload="single", spare_fraction=0.02,
                        failures=replace(llama3_failure_model().with_rf(rf),
                                         cooling_event_per_loop_day=0.0))
    [s] = run_monte_carlo(cfg, [PolicyParams("baseline_fixed")], runs=6, seed=3)
    n_nodes = cfg.nodes - cfg.spare_nodes
    assert s.to_json()["mttf_hours"] == pytest.approx(24.0 / (n_nodes * rf), rel=0.08)


def test_first_link_failure_follows_mttf_over_n():
    fm = link_profile(llama3_failure_model(), "mttf", mttf_years=5.0)
    link = fm.cause("network_switch_cable")
    n_links = 100_000
    analytic = first_failure_mean_min(n_links, link.rate_per_component_day)
    assert analytic == pytest.approx(5 * 365 * 1440 / n_links, rel=1e-3)
    rng = np.random.default_rng(11)
    firsts = [poisson_times(link.rate_per_component_day, n_links, 86_400.0, rng)[0]
              for _ in range(3000)]
    assert np.mean(firsts) / 60.0 == pytest.approx(analytic, rel=0.05)


def test_hpn_link_profile_converts_monthly_shares_to_daily_rates():
    fm = link_profile(llama3_failure_model(), "hpn")
    per_month = 365.25 / 12
    assert fm.cause("network_switch_cable").rate_per_component_day * per_month == \
        pytest.approx(HPN_LINK_FAIL_PER_MONTH)
    assert fm.cause("tor_switch").rate_per_component_day * per_month == \
        pytest.approx(HPN_TOR_FAIL_PER_MONTH)


def test_node_failure_rate_option_keeps_the_mix():
    base = llama3_failure_model()
    fm = base.with_rf(5e-3)
    assert fm.rf_per_node_day() == pytest.approx(5e-3)
    ratio = fm.cause("gpu_hbm3").rate_per_node_day() / base.cause("gpu_hbm3").rate_per_node_day()
    assert ratio == pytest.approx(5e-3 / base.rf_per_node_day())
