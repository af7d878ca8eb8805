"""Step guard: catch a silently corrupted gradient before the optimizer applies it.

Every rank adds its local gradient norm to the gradient all-reduce (one lane per rank),
so after the collective every rank holds every rank's norm and reaches the same verdict
without another message. A step is rejected when a rank's norm is not finite, or is far
above its peers' this step (>= 3 ranks), or far above the recent history of norms. The
worker then recomputes the step from its start (RNG and buffers put back): a transient
fault does not come back; a result that comes back bit for bit is the data's and is
applied; a result that changes but stays anomalous marks the rank's hardware as erratic
and the rank leaves, so a spare takes its place (docs/runtime.md, "Step guard").

Pure functions over numpy arrays; the worker owns the history and the recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GuardSettings", "Verdict", "judge_gradients"]


@dataclass(frozen=True)
class GuardSettings:
    peer_factor: float = 10.0
    """A rank whose norm exceeds this multiple of the median of the others is suspect."""
    history_factor: float = 10.0
    """A rank whose norm exceeds this multiple of the recent median norm is suspect."""
    history_steps: int = 50
    """Accepted steps whose median norms form the history."""
    warmup_steps: int = 10
    """No history judgement before this many accepted steps (early norms move fast)."""

    def __post_init__(self) -> None:
        if not (self.peer_factor > 1 and self.history_factor > 1):
            raise ValueError("guard factors must be > 1")
        if not 1 <= self.warmup_steps <= self.history_steps:
            raise ValueError("need 1 <= warmup_steps <= history_steps")


@dataclass(frozen=True)
class Verdict:
    reject: bool
    suspects: tuple[int, ...] = ()
    reason: str = ""


def judge_gradients(norms: np.ndarray, history: np.ndarray, s: GuardSettings) -> Verdict:
    """Judge one step from every rank's local gradient norm (index = rank).

    `history` holds the median norm of recent accepted steps, oldest first.
    """
    norms = np.asarray(norms, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(norms))
    if bad.size:
        return Verdict(True, tuple(int(r) for r in bad), "non-finite gradient norm on rank "
                       + ", ".join(str(int(r)) for r in bad))
    if norms.size >= 3:
        for r in range(norms.size):
            others = float(np.median(np.delete(norms, r)))
            if others > 0 and norms[r] > s.peer_factor * others:
                return Verdict(True, (r,), f"rank {r} gradient norm {norms[r]:.3g} is "
                               f"{norms[r] / others:.0f}x its peers' median {others:.3g}")
    h = np.asarray(history, dtype=np.float64)[-s.history_steps:]
    if h.size >= s.warmup_steps:
        ref = float(np.median(h))
        over = np.flatnonzero(norms > s.history_factor * ref) if ref > 0 else np.array([], int)
        if over.size:
            r = int(over[np.argmax(norms[over])])
            return Verdict(True, tuple(int(x) for x in over),
                           f"rank {r} gradient norm {norms[r]:.3g} is {norms[r] / ref:.0f}x "
                           f"the median of the last {h.size} steps ({ref:.3g})")
    return Verdict(False)
