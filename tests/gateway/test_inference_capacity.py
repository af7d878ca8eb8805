"""The emulated pool's nominal capacity (seamguard.testbed.inference_capacity): the mix's token
means against the load generator's own draws, and which stage and which batch limit bind."""

from __future__ import annotations

import statistics

import pytest

from seamguard.testbed.inference_capacity import (
    clipped_lognormal_mean,
    mix_means,
    poisson_rate_for,
    pool_capacity,
)
from seamguard.testbed.inference_load import (
    BATCH,
    INTERACTIVE,
    ClassMix,
    LoadSpec,
    arrivals,
)
from seamguard.testbed.inference_pool import PoolTiming

FLAT = ClassMix("interactive", 1.0, 100, 0.0, 1000, 50, 0.0, 1000, ttft_slo_s=1.0, tpot_slo_s=0.1)


def test_mix_means_match_the_load_generators_draws():
    draws = arrivals(LoadSpec(rate_rps=50.0, duration_s=400.0, burst_every_s=0, seed=7))
    prompt, output = mix_means((INTERACTIVE, BATCH))
    assert prompt == pytest.approx(statistics.mean(a.prompt_tokens for a in draws), rel=0.03)
    assert output == pytest.approx(statistics.mean(a.output_tokens for a in draws), rel=0.03)


def test_clipping_lowers_the_mean_and_no_spread_gives_the_median():
    assert clipped_lognormal_mean(100, 0.0, 1000) == 100
    assert clipped_lognormal_mean(100, 0.0, 60) == 60
    unclipped = clipped_lognormal_mean(100, 0.5, 1e9)
    assert unclipped == pytest.approx(100 * 1.1331, rel=1e-3)  # exp(0.5^2 / 2)
    assert clipped_lognormal_mean(100, 0.5, 150) < unclipped
    with pytest.raises(ValueError, match="median 0"):
        clipped_lognormal_mean(0, 0.5, 10)


def test_decode_bound_pool_takes_the_largest_batch_within_the_tpot_target():
    # step(B) = 0.05 + 0.003 (B - 1) <= 0.1  ->  B = 17, step 0.098; 3 x 17 / (0.098 x 50) req/s
    t = PoolTiming(prefill_base_s=0.01, prefill_per_token_s=0.0001, decode_base_s=0.05, decode_per_seq_s=0.003)
    c = pool_capacity(t, 2, 3, (FLAT,))
    assert (c.decode_batch, c.decode_batch_limit, c.bottleneck) == (17, "tpot", "decode")
    assert c.decode_rps == pytest.approx(3 * 17 / (0.098 * 50))
    assert c.prefill_rps == pytest.approx(2 / 0.02)
    assert c.pool_rps == c.decode_rps


def test_max_batch_and_kv_cache_limit_the_batch_and_a_slow_prefill_binds():
    t = PoolTiming(prefill_base_s=0.01, prefill_per_token_s=0.001, decode_base_s=0.015, decode_per_seq_s=0.0004,
                   max_batch=8)
    c = pool_capacity(t, 1, 2, (FLAT,))
    assert (c.decode_batch, c.decode_batch_limit) == (8, "max_batch")
    assert (c.bottleneck, c.pool_rps) == ("prefill", pytest.approx(1 / 0.11))
    small_kv = PoolTiming(decode_base_s=0.015, decode_per_seq_s=0.0004, max_batch=64, kv_capacity_tokens=600)
    assert pool_capacity(small_kv, 1, 1, (FLAT,)).decode_batch_limit == "kv_cache"
    assert pool_capacity(small_kv, 1, 1, (FLAT,)).decode_batch == 4  # 600 // (100 + 50)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="over the mix's tightest TPOT"):
        pool_capacity(PoolTiming(decode_base_s=0.2), 1, 1, (FLAT,))
    with pytest.raises(ValueError, match="0 prefill"):
        pool_capacity(PoolTiming(), 0, 1, (FLAT,))
    with pytest.raises(ValueError, match="not more than the bursts"):
        poisson_rate_for(0.1, 5.0, 12, 15.0)


def test_poisson_rate_leaves_room_for_the_bursts():
    assert poisson_rate_for(0.5, 10.0, 12, 15.0) == pytest.approx(5.0 - 0.8)
    assert poisson_rate_for(0.5, 10.0, 12, 0.0) == pytest.approx(5.0)
