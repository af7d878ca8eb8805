"""The data position: every sample exactly once per epoch, for any world size."""

import numpy as np
from hypothesis import given, settings, strategies as st

from seamguard.runtime.data import GlobalBatchSampler


@settings(max_examples=50, deadline=None)
@given(n=st.integers(8, 300), gb=st.integers(1, 8), world=st.integers(1, 8), step=st.integers(0, 100))
def test_shards_partition_the_global_batch(n, gb, world, step):
    s = GlobalBatchSampler(n, gb, seed=3)
    parts = [s.indices(step, r, world) for r in range(world)]
    assert np.array_equal(np.concatenate(parts), s.global_indices(step))


def test_epoch_covers_each_sample_once_and_shrink_keeps_order():
    s = GlobalBatchSampler(96, 12, seed=1)
    seen = []
    for step in range(s.steps_per_epoch):
        world = 4 if step < 3 else 3  # a rank lost at step 3: the group shrinks
        seen += [i for r in range(world) for i in s.indices(step, r, world)]
    assert sorted(seen) == list(range(96))
    assert seen == list(np.concatenate([s.global_indices(k) for k in range(8)]))


def test_state_round_trip_and_mismatch():
    s = GlobalBatchSampler(96, 12, seed=1)
    assert s.check_state(s.state_dict(7)) == 7
    import pytest
    with pytest.raises(ValueError, match="global_batch"):
        GlobalBatchSampler(96, 24, seed=1).check_state(s.state_dict(7))
