"""The step guard's verdict: pure function of every rank's gradient norm and the history."""

import numpy as np
import pytest

from seamguard.runtime.guard import GuardSettings, judge_gradients

S = GuardSettings()
HIST = np.full(30, 1.0)


def test_healthy_steps_pass_including_ordinary_variation():
    rng = np.random.default_rng(0)
    for _ in range(200):
        norms = rng.lognormal(0.0, 0.5, size=8)   # ranks differ by micro-batch
        assert not judge_gradients(norms, HIST, S).reject


def test_a_non_finite_norm_names_its_rank():
    v = judge_gradients(np.array([1.0, np.nan, 1.1, np.inf]), HIST, S)
    assert v.reject and v.suspects == (1, 3) and "non-finite" in v.reason


def test_a_rank_far_above_its_peers_is_suspect_even_without_history():
    v = judge_gradients(np.array([1.0, 1.2, 30.0, 0.9]), np.array([]), S)
    assert v.reject and v.suspects == (2,) and "peers" in v.reason


def test_two_ranks_rely_on_history_after_warm_up():
    spike = np.array([0.7, 2e10])
    assert not judge_gradients(spike, np.full(S.warmup_steps - 1, 0.6), S).reject  # warming up
    v = judge_gradients(spike, np.full(S.warmup_steps, 0.6), S)
    assert v.reject and v.suspects == (1,) and "median of the last" in v.reason


def test_a_global_rise_below_the_factor_is_training_not_corruption():
    assert not judge_gradients(np.array([5.0, 6.0, 7.0]), HIST, S).reject
    assert judge_gradients(np.array([50.0, 60.0, 70.0]), HIST, S).suspects == (0, 1, 2)


def test_settings_are_validated():
    with pytest.raises(ValueError):
        GuardSettings(peer_factor=1.0)
    with pytest.raises(ValueError):
        GuardSettings(warmup_steps=0)
