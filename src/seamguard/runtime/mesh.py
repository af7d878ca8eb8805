"""FSDP2 and HSDP: the device mesh whose process groups the runtime re-forms.

`Runtime.device_mesh()` (runtime/worker.py) hands a training script the `DeviceMesh` to
pass to ``fully_shard``; this part builds it and owns what it is made of: the
`fsdp.ResilientGroup` installed as the default process group (forwarding to the
generation's gloo group), and for HSDP one `ResilientGroup` per mesh dimension with the
gloo subgroup of the current generation behind it. Recovery (runtime/recovery.py) asks it
to abandon the old subgroups and to form and bind the new ones at every generation. It
runs on the training thread only.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from seamguard.runtime import fsdp, keys
from seamguard.runtime.recovery import JobFinished


class Mesh:
    """One worker's FSDP2 mesh (module docstring); empty until `build` is called."""

    def __init__(self, rt) -> None:
        """``rt``: the worker's step transaction (runtime/worker.py): its store, settings,
        replica server and recovery, on the training thread."""
        self.rt = rt
        self.mesh = None          # the DeviceMesh over fsdp.ResilientGroups
        self.rank = -1            # the rank this process's shards were laid out for
        self.replicas = 1         # HSDP: replica groups of the mesh (1: plain FSDP2)
        self._resilient: fsdp.ResilientGroup | None = None   # the default group
        self._dims: list[tuple[str, list[int]]] = []   # HSDP: (name, global ranks) per mesh dim
        self._subgroups: dict[str, dist.ProcessGroupGloo] = {}   # HSDP: this generation's, by name
        self._groups: dict[str, fsdp.ResilientGroup] = {}   # HSDP: the mesh's group per dimension

    @property
    def built(self) -> bool:
        return self.mesh is not None

    def build(self, replicate: int):
        """The mesh of `Runtime.device_mesh` (see its docstring)."""
        if self.mesh is not None:
            if replicate != self.replicas:
                raise ValueError(f"device_mesh(replicate={replicate}): the mesh was already "
                                 f"built with replicate={self.replicas}")
            return self.mesh
        from torch.distributed.device_mesh import DeviceMesh

        if not isinstance(replicate, int) or replicate < 1:
            raise ValueError(f"device_mesh(replicate={replicate!r}): replicate must be an int >= 1")
        rt = self.rt
        try:
            rank, world_size = rt.recovery.await_rank()
        except JobFinished:   # a spare the job never needed: nothing to build or train
            rt.finish()
            os._exit(0)
        if world_size % replicate:
            raise ValueError(f"device_mesh(replicate={replicate}): the world size {world_size} "
                             f"is not a multiple of it")
        dedup = rt.settings.dedup_replicas and replicate > 1
        rt.settings = dataclasses.replace(rt.settings, dedup_replicas=dedup, step_guard=False)
        rt.server.dedup = dedup
        if replicate > 1:
            rt.store.set(keys.MESH_REPLICAS, str(replicate))
        self._resilient = fsdp.install_default_group(
            rt, rank, world_size, dist.PrefixStore("sg/pg/default/", rt.store))
        self.rank = rank
        self.replicas = replicate
        if replicate == 1:
            self.mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
            return self.mesh
        layout = torch.arange(world_size, dtype=torch.int).view(replicate, world_size // replicate)
        self._dims = fsdp.hsdp_subgroups(layout, rank)
        self._groups = {name: fsdp.install_subgroup(rt, name, ranks, rank,
                                                    lambda name=name: self._subgroups.get(name))
                        for name, ranks in self._dims}
        self.mesh = DeviceMesh.from_group(list(self._groups.values()), "cpu", mesh=layout,
                                          mesh_dim_names=("replicate", "shard"))
        return self.mesh

    def bind(self, gen: int, rank: int, group: dist.ProcessGroupGloo) -> None:
        """A recovery formed generation ``gen``'s world ``group``: point the mesh's groups
        at it and (HSDP) at this generation's subgroup of each mesh dimension, each formed
        under its own store prefix."""
        rt = self.rt
        self._resilient.rebind(group)
        timeout = datetime.timedelta(seconds=rt.settings.collective_timeout_s)
        for name, ranks in self._dims:
            sub = dist.ProcessGroupGloo(
                dist.PrefixStore(f"{keys.group_prefix(gen)}sub/{name}/", rt.store),
                ranks.index(rank), len(ranks), timeout)
            self._subgroups[name] = sub
            self._groups[name].rebind(sub)

    def abandon(self, graveyard: list) -> None:
        """The subgroups of a generation that failed: aborted and kept in ``graveyard``
        (destroying one can block on a dead peer)."""
        for sub in self._subgroups.values():
            try:
                sub.abort()
            except RuntimeError:
                pass
            graveyard.append(sub)
        self._subgroups = {}
