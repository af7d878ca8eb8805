"""What a rank's training state is, as a snapshot holds it, and how it is put back.

`TrainingState` names every tensor of the model and optimizer (for FSDP2-sharded ones,
this rank's local shard) and packs the rest into one small pickled meta blob: optimizer
hyper-parameters and scalars, RNG states, the data position. It restores a snapshot into
the live model and optimizer (a spare's fresh optimizer included), and takes and puts
back the bytes private to a step (buffers, RNG) that the step guard's recompute and a
spare's takeover at the very step need. The snapshot slots (runtime/snapshot.py), the
replica holder (runtime/replica.py) and recovery (runtime/recovery.py) use it; it knows
nothing of where the bytes go.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import torch

from seamguard.runtime.fsdp import like, local

META = "__meta__"
"""The name of a snapshot's meta blob among its tensors."""


class TrainingState:
    """The model, optimizer and data position of one rank, as named tensors plus meta."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 data_state: Any = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.data_state = data_state  # callable step -> dict, or None
        self._params = [p for g in optimizer.param_groups for p in g["params"]]

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor of the state as this rank holds it: for FSDP2-sharded parameters
        and their optimizer state (DTensors), this rank's local shard."""
        out = [(f"model/{k}", local(v.detach())) for k, v in self.model.state_dict(keep_vars=True).items()]
        for pid, p in enumerate(self._params):
            for k, v in sorted(self.optimizer.state.get(p, {}).items()):
                if isinstance(v, torch.Tensor):
                    out.append((f"optim/{pid}/{k}", local(v.detach())))
        return out

    def buffer_names(self) -> list[str]:
        """Snapshot names of model tensors that are not parameters (e.g. BatchNorm running
        statistics): the forward pass changes them, so they are private to a step and,
        unlike parameters, may differ between data-parallel ranks."""
        params = {id(p) for p in self.model.parameters()}
        return [f"model/{k}" for k, v in self.model.state_dict(keep_vars=True).items()
                if id(v) not in params]

    def step_private(self, step: int) -> dict[str, bytes]:
        """What changes during a step before the optimizer runs: the meta blob and the
        model buffers, as bytes (small; taken at the start of every step)."""
        out = self._buffers()
        out[META] = self.meta(step)
        return out

    def rank_private(self, taken: dict[str, bytes] | None = None) -> dict[str, bytes]:
        """The part of the next step's private bytes that only this rank has: its model
        buffers and RNG states (the meta blob holding only ``rng``). Its data-parallel
        replicas share the rest (optimizer settings and scalars, and the data position,
        which is the global batch sampler's step), so
        a holder completes it from its own (`with_rank_private`). Taken once a step's
        collectives are done, it equals what the next step's start will hold unless the
        training loop draws random numbers or changes buffers after ``sync_gradients()``.
        ``taken``: this moment's `step_private`, whose buffers are used, not copied again."""
        out = self._buffers() if taken is None else {k: v for k, v in taken.items() if k != META}
        out[META] = pickle.dumps({"rng": _rng_state()}, protocol=pickle.HIGHEST_PROTOCOL)
        return out

    def _buffers(self) -> dict[str, bytes]:
        sd = self.model.state_dict(keep_vars=True)
        return {name: bytes_of(sd[name[len("model/"):]]) for name in self.buffer_names()}

    def meta(self, step: int) -> bytes:
        opt_scalars = {pid: {k: v for k, v in self.optimizer.state.get(p, {}).items()
                             if not isinstance(v, torch.Tensor)}
                       for pid, p in enumerate(self._params)}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        data = self.data_state(step) if callable(self.data_state) else {"step": step}
        return pickle.dumps({"step": step, "groups": groups, "opt_scalars": opt_scalars,
                             "rng": _rng_state(), "data": data}, protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, tensors: dict[str, torch.Tensor], meta_bytes: bytes) -> dict[str, Any]:
        """Put a snapshot back (bytes are copied, never aliased). Returns the meta dict."""
        meta = pickle.loads(meta_bytes)
        msd = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for k, v in msd.items():
                src = tensors.get(f"model/{k}")
                if src is None:
                    raise KeyError(f"snapshot has no tensor 'model/{k}'")
                v = local(v)
                v.copy_(src.view(v.shape), non_blocking=True)
        self._restore_optimizer(tensors, meta)
        if any(local(v).is_cuda for v in msd.values()):
            # non_blocking copies from page-locked slots run async: done before the
            # caller may reuse the slot (from pageable memory they were synchronous)
            torch.cuda.synchronize()
        _restore_rng(meta["rng"])
        return meta

    def restore_private(self, private: dict[str, bytes]) -> None:
        """Put back what `step_private` took at a step's start (buffers, RNG), so the
        step can be computed again from its start; parameters and optimizer state are
        untouched (no optimizer step ran)."""
        sd = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, data in private.items():
                if name == META:
                    continue
                t = sd[name[len("model/"):]]
                if t.numel():
                    t.copy_(torch.frombuffer(bytearray(data), dtype=t.dtype).view(t.shape))
        _restore_rng(pickle.loads(private[META])["rng"])

    def _restore_optimizer(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        wanted: dict[int, dict[str, torch.Tensor]] = {}
        for name, arr in tensors.items():
            if name.startswith("optim/"):
                _, pid, k = name.split("/", 2)
                wanted.setdefault(int(pid), {})[k] = arr
        for g, saved in zip(self.optimizer.param_groups, meta["groups"]):
            g.update(saved)
        in_place = all(set(k for k, v in self.optimizer.state.get(p, {}).items()
                           if isinstance(v, torch.Tensor)) == set(wanted.get(pid, {}))
                       for pid, p in enumerate(self._params))
        group_of = {pid: g for pid, g in enumerate(g for g in self.optimizer.param_groups
                                                   for _ in g["params"])}
        with torch.no_grad():
            for pid, p in enumerate(self._params):
                if not in_place:
                    self.optimizer.state.pop(p, None)
                saved = wanted.get(pid, {})
                if not saved and not meta["opt_scalars"].get(pid):
                    continue
                st = self.optimizer.state[p] if in_place else {}
                for k, arr in saved.items():
                    if in_place:
                        t = local(st[k])
                        t.copy_(arr.view(t.shape), non_blocking=True)
                    else:
                        # fresh optimizer (a spare): own copies, straight to the parameter's
                        # device; state of an FSDP2-sharded parameter is a DTensor like it
                        dev = local(p).device if arr.dim() > 0 or _scalar_on_device(group_of[pid]) \
                            else torch.device("cpu")
                        st[k] = like(p, arr.to(dev, copy=True))
                st.update(meta["opt_scalars"].get(pid, {}))
                if not in_place:
                    self.optimizer.state[p] = st


def _scalar_on_device(group: dict) -> bool:
    """Whether an optimizer keeps its 0-d state (Adam's ``step``) on the parameter's
    device: the fused and capturable implementations do, and refuse a CPU one."""
    return bool(group.get("fused") or group.get("capturable"))


def with_rank_private(own_meta: bytes, rank: dict[str, bytes]) -> dict[str, bytes]:
    """A rank's whole step-private bytes from its replica holder's own meta blob of the
    same step and the rank's part (`TrainingState.rank_private`): the holder's optimizer
    settings, scalars and data position, which data-parallel replicas share, with the
    rank's RNG states and buffers."""
    meta = pickle.loads(own_meta)
    meta["rng"] = pickle.loads(rank[META])["rng"]
    return {**rank, META: pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)}


def _rng_state() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state().numpy().tobytes(),
                           "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return rng


def _restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(rng["torch"]), dtype=torch.uint8))
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(b), dtype=torch.uint8)
                                      for b in rng["cuda"]])


def raw_bytes(t: torch.Tensor) -> np.ndarray:
    """A tensor's raw bytes as a uint8 array, without a copy for a contiguous CPU tensor
    (0-d tensors such as BatchNorm's step counter included)."""
    t = local(t.detach()).cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else np.empty(0, dtype=np.uint8)


def bytes_of(t: torch.Tensor) -> bytes:
    """A tensor's raw bytes, copied (what outlives the tensor's next change)."""
    return raw_bytes(t).tobytes()

