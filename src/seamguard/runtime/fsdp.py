"""FSDP2 under the runtime: a process group the runtime can re-form behind FSDP's back.

FSDP2 (`torch.distributed.fsdp.fully_shard`) issues its all-gathers (forward) and
reduce-scatters (backward) on the process group of its `DeviceMesh`, from inside the
model's forward and backward, where the runtime cannot cancel them and an error would
raise into model code. `ResilientGroup` is the group the mesh holds. It is a
`torch.distributed.ProcessGroup` with a fixed rank and size that owns no connections: each
collective is forwarded to the runtime's current gloo group (`Runtime.group`, re-formed
under a new store prefix at every recovery), and it is waited for like the runtime's own
collectives (woken by its completion; a new generation or the timeout cancels it). A collective that fails, times out or is overtaken by a new
generation marks the step failed and reports itself complete with its output left as it
was: the forward and backward run on to their end with garbage, `rt.sync_gradients()`
returns False, the optimizer step is skipped, and the next `rt.steps()` iteration
recovers (the step is the transaction, as for data parallelism).

The group is registered with c10d as the default process group (backend "seamguard"), so
`init_device_mesh`, `DeviceMesh.from_group`, `dist.get_rank()` and user collectives all
find it. The rank is fixed for the life of the process: a replacement spare takes over the
lost rank's index, and its shard of parameters and optimizer state, so the layout FSDP2
chose at `fully_shard` time stays valid. A spare therefore shards its model only once it
knows its rank (`Runtime.device_mesh` blocks a spare until then; a model built before it
is built while the spare waits).

The idea of a wrapper that forwards to a replaceable inner group and swallows errors until
it is reconfigured is torchft's (`torchft/process_group.py`:
ProcessGroupWrapper, ErrorSwallowingProcessGroupWrapper; https://github.com/pytorch/torchft).
torchft applies it to the replicate dimension of HSDP only and restarts a whole replica
group on a loss; here it is the shard dimension, and only the lost rank is replaced.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

BACKEND = "seamguard"

# the collectives a ProcessGroup offers and the gloo backend's method that does each
_FORWARDS = {
    "all_gather_single": "_allgather_base",
    "_allgather_base": "_allgather_base",
    "reduce_scatter_single": "_reduce_scatter_base",
    "_reduce_scatter_base": "_reduce_scatter_base",
    "allreduce": "allreduce",
    "allreduce_coalesced": "allreduce_coalesced",
    "broadcast": "broadcast",
    "allgather": "allgather",
    "allgather_coalesced": "allgather_coalesced",
    "gather": "gather",
    "scatter": "scatter",
    "reduce": "reduce",
    "reduce_scatter": "reduce_scatter",
    "alltoall_base": "alltoall_base",
    "barrier": "barrier",
}

# gloo's reduce-scatters finish inside `wait()`, which ignores its timeout (is_completed()
# stays False even after; measured with torch 2.13), so they could not be waited for with
# a deadline. They run as gloo does them internally instead: an all-reduce of a copy of
# the input, waited for like any other collective, then this rank's chunk copied out.
_REDUCE_SCATTERS = {"reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter"}


class _Done(dist.Work):
    """A collective that will not run (its step already failed): complete at once."""

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut


class _Polled(_Done):
    """A collective in flight on the runtime's gloo group; `wait` returns when it completes
    or a new generation or the collective timeout cancels it, and never raises.
    ``finish`` (if any) runs once, after the collective succeeded."""

    def __init__(self, runtime, work: dist.Work, finish=None) -> None:
        super().__init__()
        self._rt, self._work, self._finish = runtime, work, finish

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        ok = self._rt.collectives.await_work(self._work)
        if ok and self._finish is not None:
            self._finish()
        self._finish = None
        return True


def _reduce_scatter_as_allreduce(inner, rank: int, output, input, opts=None):
    """(work, finish): the input's copy all-reduced on ``inner``; ``finish`` copies this
    rank's chunk of it into the output. The tensor form: ``input`` holds one chunk the size
    of ``output`` per rank, one after another; the list form: ``[output]`` and
    ``[[each rank's chunk]]``."""
    if isinstance(output, list):
        (output,), (chunks,) = output, input
        flat = torch.cat([c.reshape(-1) for c in chunks])
        start = sum(c.numel() for c in chunks[:rank])
    else:
        flat = input.clone(memory_format=torch.contiguous_format).view(-1)
        start = rank * output.numel()
    options = dist.AllreduceOptions()
    if opts is not None:
        options.reduceOp, options.timeout = opts.reduceOp, opts.timeout
    work = inner.allreduce([flat], options)

    def finish() -> None:
        output.copy_(flat.narrow(0, start, output.numel()).view(output.shape))
    return work, finish


class ResilientGroup(dist.ProcessGroup):
    """The process group FSDP2's mesh holds; forwards to `runtime.group` (module docstring)."""

    def __init__(self, runtime, rank: int, world_size: int, inner=None) -> None:
        super().__init__(rank, world_size)
        self._rt = runtime
        # the gloo group collectives go to: the runtime's world group, or (HSDP) one of
        # its mesh-dimension subgroups of the current generation
        self._inner = inner or (lambda: runtime.group)
        self._name = ""
        self._plain: list[dist.ProcessGroup] = []

    def getBackendName(self) -> str:
        return BACKEND

    # c10d keeps a group's name in its backends, and this group has none of its own
    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def rebind(self, gloo: dist.ProcessGroupGloo) -> None:
        """After the runtime formed a new gloo group: point c10d's registry entry of this
        group's name at a plain ProcessGroup over it. Functional collectives (DTensor's
        ``full_tensor()``, ``redistribute``, ``clip_grad_norm_`` over DTensors) look the
        group up by name in C++ and need a real backend there; they therefore run on the
        current gloo group directly and, unlike FSDP2's own collectives, raise on a
        failure (see docs/runtime.md, FSDP2, limits)."""
        plain = dist.ProcessGroup(self.rank(), self.size())
        backend = dist.ProcessGroup.BackendType.GLOO
        plain._register_backend(torch.device("cpu"), backend, gloo)
        plain._set_default_backend(backend)
        c10d = dist.distributed_c10d
        c10d._unregister_process_group(self._name)
        c10d._register_process_group(self._name, plain)
        self._plain.append(plain)   # the registry holds it weakly; abandoned ones stay alive

    def _forward(self, name: str, args: tuple) -> dist.Work:
        rt = self._rt
        if not rt.collectives.allowed():
            return _Done()
        inner = self._inner()
        if inner is None:
            rt.collectives.fail(f"{name}: group {self._name} is not formed in this generation")
            return _Done()
        finish = None
        try:
            with rt.clock.phase("collective_issue"):
                if name in _REDUCE_SCATTERS:
                    work, finish = _reduce_scatter_as_allreduce(inner, self.rank(), *args)
                else:
                    work = getattr(inner, _FORWARDS[name])(*args)
        except RuntimeError as exc:
            rt.collectives.fail(f"{name}: {exc}")
            return _Done()
        return _Polled(rt, work, finish)


def _forwarder(name: str):
    def method(self, *args):
        return self._forward(name, args)
    method.__name__ = name
    return method


for _name in _FORWARDS:
    setattr(ResilientGroup, _name, _forwarder(_name))

_current: list[ResilientGroup] = []


def _create(store, rank: int, world_size: int, timeout) -> ResilientGroup:
    """c10d's backend factory: hands back the group the runtime made (the store is unused:
    the runtime forms its gloo groups itself)."""
    group = _current[-1]
    if (group.rank(), group.size()) != (rank, world_size):
        raise ValueError(f"seamguard process group is rank {group.rank()} of {group.size()}, "
                         f"c10d asked for rank {rank} of {world_size}")
    return group


def install_default_group(runtime, rank: int, world_size: int, store: dist.Store) -> ResilientGroup:
    """Make a `ResilientGroup` the default process group of this process (call
    `ResilientGroup.rebind` with each gloo group the runtime forms)."""
    if dist.is_initialized():
        raise RuntimeError("seamguard: the default process group is already initialised; "
                           "call rt.device_mesh() instead of dist.init_process_group()")
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    group = ResilientGroup(runtime, rank, world_size)
    _current.append(group)
    dist.init_process_group(BACKEND, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=runtime.settings.collective_timeout_s))
    return group


def hsdp_subgroups(layout: torch.Tensor, rank: int) -> list[tuple[str, list[int]]]:
    """HSDP: the (name, global ranks) of the two mesh-dimension subgroups ``rank`` belongs
    to in the 2-D ``layout`` (replicas x shards): its column (the ranks holding the same
    shard, "replicate") and its row (one whole copy of the model, "shard")."""
    row, col = [int(i) for i in (layout == rank).nonzero()[0]]
    return [(f"seamguard/replicate/{col}", layout[:, col].tolist()),
            (f"seamguard/shard/{row}", layout[row, :].tolist())]


def install_subgroup(runtime, name: str, ranks: list[int], rank: int, inner) -> ResilientGroup:
    """HSDP: a `ResilientGroup` over ``ranks`` (global ranks of one mesh-dimension
    subgroup that holds ``rank``), registered with c10d under ``name`` so that
    `DeviceMesh.from_group` and FSDP2 find it; ``inner()`` gives the gloo subgroup of the
    current generation (call `rebind` with each new one)."""
    if rank not in ranks:
        raise ValueError(f"seamguard subgroup {name}: rank {rank} is not one of its ranks {ranks}")
    group = ResilientGroup(runtime, ranks.index(rank), len(ranks), inner)
    group._set_group_name(name)
    c10d = dist.distributed_c10d
    c10d._register_process_group(name, group)
    c10d._world.pg_group_ranks[group] = {g: i for i, g in enumerate(ranks)}
    c10d._world.pg_names[group] = name
    return group


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, any other tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def like(param: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """``shard`` (this rank's bytes) as a tensor shaped like ``param``: a DTensor with the
    parameter's mesh and placements when the parameter is one (optimizer state a spare
    creates for FSDP2-sharded parameters), else ``shard`` itself."""
    if not hasattr(param, "_local_tensor") or shard.dim() == 0:
        return shard
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(shard, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())
