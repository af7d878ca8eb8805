"""The state machine: hysteresis, dwell, hard failures — no flapping under noise."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seamguard.assess.states import Hysteresis, State, StateVector, step_states

H = Hysteresis()


def run(gfs_series, prs=0.0, hard_series=None, h=H):
    n = gfs_series.shape[1]
    sv = StateVector.initial(n)
    out = []
    for t, g in enumerate(gfs_series):
        hard = np.zeros(n, bool) if hard_series is None else hard_series[t]
        sv = step_states(sv, g, np.full(n, prs), hard, h, float(t))
        out.append(sv.state.copy())
    return np.array(out)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.32, 0.6))
def test_noise_around_the_entry_threshold_changes_state_at_most_once(seed, centre):
    rng = np.random.default_rng(seed)
    # noise straddling degrade_enter but never reaching below degrade_exit or to quarantine
    g = np.clip(centre + rng.normal(0, 0.08, (300, 20)), H.degrade_exit + 0.005, H.quarantine_enter - 0.01)
    states = run(g)
    changes = (np.diff(states, axis=0) != 0).sum(axis=0)
    assert changes.max() <= 1


def test_noise_around_exit_threshold_does_not_flap():
    rng = np.random.default_rng(1)
    g = np.concatenate([np.full((10, 50), 0.7), np.clip(0.3 + rng.normal(0, 0.05, (300, 50)), 0, 0.49)])
    states = run(g)
    changes = (np.diff(states, axis=0) != 0).sum(axis=0)
    # enters degraded once; may recover once after a long enough quiet run; never oscillates
    assert changes.max() <= 2
    assert (changes >= 1).all()


def test_entry_needs_consecutive_ticks_and_recovery_needs_dwell():
    g = np.array([[0.6], [0.2], [0.6], [0.6]] + [[0.0]] * 20)
    s = run(g)[:, 0]
    assert s[0] == State.HEALTHY and s[2] == State.HEALTHY  # a single tick above is not enough
    assert s[3] == State.DEGRADED
    first_healthy = 4 + np.argmax(s[4:] == State.HEALTHY)
    assert first_healthy - 3 >= H.recover_ticks


def test_severe_and_harmful_by_propagation_risk():
    g = np.full((5, 1), 0.95)
    assert run(g, prs=0.1)[-1, 0] == State.QUARANTINE
    assert run(g, prs=0.9)[-1, 0] == State.HARMFUL


def test_storage_goes_checkpoint_unsafe():
    h = Hysteresis(severe_state="checkpoint_unsafe")
    assert run(np.full((5, 1), 0.95), h=h)[-1, 0] == State.CHECKPOINT_UNSAFE


def test_hard_failure_is_immediate_and_sticky_while_present():
    n = 30
    g = np.zeros((n, 1))
    hard = np.zeros((n, 1), bool)
    hard[3:] = True  # e.g. a fatal XID still the last value
    s = run(g, hard_series=hard)[:, 0]
    assert s[2] == State.HEALTHY and s[3] == State.FAILED and (s[3:] == State.FAILED).all()
    hard[10:] = False  # repaired
    s = run(g, hard_series=hard)[:, 0]
    assert s[10 + H.recover_ticks - 1] == State.HEALTHY or s[-1] == State.HEALTHY


def test_invalid_hysteresis_is_rejected():
    import pytest
    with pytest.raises(ValueError, match="degrade_exit"):
        Hysteresis(degrade_enter=0.4, degrade_exit=0.5)
