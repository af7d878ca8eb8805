"""Deterministic, resumable assignment of samples to (step, rank): the data position.

The runtime rolls every rank back to a step; the data position must roll back with it,
and a membership change must neither skip nor repeat a sample. This sampler makes the
global order a pure function of (seed, epoch) and each step's global batch a fixed slice
of it, so the position is just the step number, and a shrink only changes which rank
reads which part of the same global batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GlobalBatchSampler:
    """Global batch `global_batch` per step, samples in a seeded per-epoch permutation.

    Rank r of W reads the r-th contiguous shard of the step's global batch; when
    `global_batch` is not divisible by W the first `global_batch % W` ranks read one more
    sample (callers weight gradients by shard size, as `Runtime.sync_gradients` does).
    The last partial batch of an epoch is dropped so every step has the same global batch.
    """

    dataset_len: int
    global_batch: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.dataset_len < self.global_batch:
            raise ValueError(f"need 1 <= global_batch ({self.global_batch}) <= "
                             f"dataset_len ({self.dataset_len})")

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_len // self.global_batch

    def global_indices(self, step: int) -> np.ndarray:
        """Sample indices of the whole global batch of `step`."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.dataset_len)
        start = within * self.global_batch
        return order[start:start + self.global_batch]

    def shard_bounds(self, rank: int, world_size: int) -> tuple[int, int]:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        base, extra = divmod(self.global_batch, world_size)
        start = rank * base + min(rank, extra)
        return start, start + base + (1 if rank < extra else 0)

    def indices(self, step: int, rank: int, world_size: int) -> np.ndarray:
        """Sample indices rank `rank` of `world_size` trains on at `step`."""
        lo, hi = self.shard_bounds(rank, world_size)
        return self.global_indices(step)[lo:hi]

    def state_dict(self, step: int) -> dict[str, int]:
        """The data position: everything needed to continue at `step`."""
        return {"step": step, "seed": self.seed, "global_batch": self.global_batch,
                "dataset_len": self.dataset_len}

    def check_state(self, state: dict[str, int]) -> int:
        """Validate a saved position against this sampler and return its step."""
        for key in ("seed", "global_batch", "dataset_len"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"saved data position has {key}={state.get(key)}, "
                                 f"sampler has {getattr(self, key)}")
        return int(state["step"])
