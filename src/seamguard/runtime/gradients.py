"""The step transaction's gradient average and its step guard.

`GradientSync` averages a data-parallel step's gradients over the generation's ranks:
weighted by each rank's share of the global batch (a shrunk group with uneven shards still
computes the mean over the whole batch), in one flat buffer all-reduced on the gloo group
or over the rails (runtime/collectives.py), with one guard lane per rank carrying that
rank's gradient norm. `StepGuard` turns those norms into the step's verdict
(runtime/guard.py's pure `judge_gradients`) and owns what follows from it: the history of
accepted norms, a rejected step recomputed from its start, a suspect rank leaving for a
spare. Both run on the training thread, called by `Runtime.sync_gradients`
(runtime/worker.py).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from seamguard.runtime import keys
from seamguard.runtime.guard import GuardSettings, judge_gradients

EXIT_SUSPECT = 75
"""Exit status of a rank that left because its gradient stayed anomalous on recompute."""


class StepGuard:
    """The step guard's state on one rank: the same on every rank, since every rank holds
    every rank's norm (docs/runtime.md, "Step guard")."""

    def __init__(self, rt, settings: GuardSettings = GuardSettings()) -> None:
        """``rt``: the worker's step transaction (runtime/worker.py): its step, generation,
        rank, store and event log."""
        self.rt = rt
        self.settings = settings
        self.history: list[float] = []  # median gradient norm of recent accepted steps
        self._rejected: tuple[int, np.ndarray] | None = None  # (step, norms) awaiting recompute
        self.redo = False   # the step was rejected: compute it again from its start

    def reset(self) -> None:
        """After a recovery every member starts the history afresh, so verdicts stay equal."""
        self.history, self._rejected, self.redo = [], None, False

    def accepts(self, norms: np.ndarray) -> bool:
        """The verdict on this step. A rejected step is computed again from its start; a
        transient fault does not come back. If the anomaly survives the recompute (a defect
        can reproduce bit for bit), the suspect ranks leave and spares compute the step on
        other hardware; an anomaly that survives that too is the data's and is applied, as
        plain DDP would have."""
        rt = self.rt
        verdict = judge_gradients(norms, np.asarray(self.history), self.settings)
        first = self._rejected is None or self._rejected[0] != rt.step
        if not verdict.reject:
            if not first:
                rt._note("step_recomputed_clean", step=rt.step, norms=norms.tolist())
            self._rejected = None
            self.history = (self.history + [float(np.median(norms))])[-self.settings.history_steps:]
            return True
        if first:
            self._rejected = (rt.step, norms.copy())
            rt.stats["steps_rejected"] += 1
            rt._note("step_rejected", step=rt.step, reason=verdict.reason,
                     suspects=list(verdict.suspects), norms=norms.tolist())
            self.redo = True
            return False
        key = keys.guard_replaced(rt.step)
        if rt.store.check([key]) and int(rt.store.get(key)) < rt.gen:
            # other hardware computed it again and got the same anomaly: the data's
            rt._note("gradient_spike_kept", step=rt.step, reason=verdict.reason, norms=norms.tolist())
            self._rejected = None
            return True
        rt._note("gradient_anomaly_persists", step=rt.step, reason=verdict.reason,
                 suspects=list(verdict.suspects), norms=norms.tolist(),
                 reproduced=bool(np.array_equal(self._rejected[1], norms, equal_nan=True)))
        if rt.rank in verdict.suspects:
            rt.store.set(key, str(rt.gen))
            rt.finish()
            os._exit(EXIT_SUSPECT)   # the coordinator replaces this rank with a spare
        rt._failed = True          # the others wait for the new generation
        return False


class GradientSync:
    """The gradient average of a data-parallel step (module docstring)."""

    def __init__(self, rt, guard: StepGuard) -> None:
        """``rt``: the worker's step transaction: its plan, rank, settings, chaos injector
        and collectives, on the training thread; ``guard``: the step's verdict."""
        self.rt = rt
        self.guard = guard
        self._time = rt.time
        self._params: list[torch.Tensor] = []
        self._n_grad = 0
        self._flat: torch.Tensor | None = None   # sized per generation: gradients + one guard lane per rank
        self.comm_s = 0.0   # the last step's gradient collective

    def register(self, model: torch.nn.Module) -> None:
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._n_grad = sum(p.numel() for p in self._params)
        self._flat = None

    def average(self, scale: float) -> bool:
        """Replace each gradient by the group's weighted mean (``scale``: this rank's share
        of the global batch); False: the collective failed or the guard rejected the step."""
        rt = self.rt
        if rt.plan.world_size == 1:
            return self._single_rank(scale)
        n_grad = self._n_grad
        lanes = rt.plan.world_size if rt.settings.step_guard else 0
        flat = self._flat_buffer(n_grad + lanes)
        self._gather(flat, scale)
        if lanes:
            grad = flat[:n_grad]
            rt.injector.maybe_corrupt(rt.rank, rt.step, grad)
            flat[n_grad:].zero_()
            flat[n_grad + rt.rank] = torch.linalg.vector_norm(grad) / max(scale, 1e-12)
        t_comm = self._time.perf_counter()
        ok = rt.collectives.rail_allreduce(flat) if rt.collectives.rails is not None else \
            rt.collectives.run(lambda: rt.group.allreduce([flat]))
        self.comm_s = self._time.perf_counter() - t_comm
        if not ok:
            rt._failed = True
            return False
        if lanes and not self.guard.accepts(flat[n_grad:].double().cpu().numpy()):
            return False
        self._scatter(flat)
        return True

    def _flat_buffer(self, numel: int) -> torch.Tensor:
        if self._flat is None or self._flat.numel() != numel:
            p0 = self._params[0]
            self._flat = torch.zeros(numel, dtype=p0.dtype, device=p0.device)
        return self._flat

    def _gather(self, flat: torch.Tensor, scale: float) -> None:
        """Each gradient, scaled, into its span of ``flat`` (a missing one as zeros)."""
        off = 0
        for p in self._params:
            n = p.numel()
            view = flat[off:off + n]
            if p.grad is None:
                view.zero_()
            else:
                torch.mul(p.grad.reshape(-1), scale, out=view)
            off += n

    def _scatter(self, flat: torch.Tensor) -> None:
        """The averaged spans of ``flat`` back into the gradients."""
        off = 0
        for p in self._params:
            n = p.numel()
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(flat[off:off + n].view_as(p))
            off += n

    def _single_rank(self, scale: float) -> bool:
        """World size 1: the mean over one rank is its own gradient, scaled in place (the
        same values the flat buffer gives); the guard's norm is taken per tensor. No flat
        copy there and back and no collective: on an H100 gloo's all-reduce of a group of
        one copied the 1.6 GB gradient to the host and back (126 ms of a 197 ms step), and
        the flat copies alone moved four times the gradient's bytes every step."""
        rt = self.rt
        self.comm_s = 0.0
        for p in self._params:
            if p.grad is None:   # as the flat path leaves it: a zero gradient, not none
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self._params]
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)
        if not rt.settings.step_guard or not grads:
            return True
        rt.injector.maybe_corrupt(rt.rank, rt.step, grads[0].view(-1))
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) / max(scale, 1e-12)
        return self.guard.accepts(norm.double().cpu().numpy().reshape(1))
