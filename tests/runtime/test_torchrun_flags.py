"""runtime/torchrun_flags.py: torchrun's launch flags -> the launcher's nodes, store and run
id, as a decision table (pure: no launch)."""

from __future__ import annotations

import re

import pytest

from seamguard.runtime.torchrun_flags import Given, Rendezvous, resolve


def _devices(gpus: int, cpus: int = 16):
    return lambda kind: gpus if kind == "gpu" else cpus


@pytest.mark.parametrize("given, gpus, want", [
    (Given(), 0, Rendezvous(1, 1, 0, "127.0.0.1", 0, "seamguard", "tcp", None)),
    (Given(nproc_per_node="4"), 0, Rendezvous(4, 1, 0, "127.0.0.1", 0, "seamguard", "tcp", None)),
    (Given(nproc_per_node="gpu"), 8, Rendezvous(8, 1, 0, "127.0.0.1", 0, "seamguard", "tcp", None)),
    (Given(nproc_per_node="auto"), 0, Rendezvous(16, 1, 0, "127.0.0.1", 0, "seamguard", "tcp", None)),
    (Given(nproc_per_node="auto"), 2, Rendezvous(2, 1, 0, "127.0.0.1", 0, "seamguard", "tcp", None)),
    (Given(nproc_per_node="cpu"), 8, Rendezvous(16, 1, 0, "127.0.0.1", 0, "seamguard", "tcp", None)),
    # torchrun's c10d rendezvous: the endpoint is node 0's store, its port 29400 unless given
    (Given(nnodes="2", node_rank=1, rdzv_backend="c10d", rdzv_endpoint="h0"), 0,
     Rendezvous(1, 2, 1, "h0", 29400, "seamguard", "tcp", None)),
    (Given(nnodes="2:2", node_rank=0, rdzv_endpoint="10.0.0.5:1234", rdzv_id="job9"), 0,
     Rendezvous(1, 2, 0, "10.0.0.5", 1234, "job9", "tcp", None)),
    (Given(rdzv_endpoint="[fd00::1]:29500"), 0, Rendezvous(1, 1, 0, "fd00::1", 29500, "seamguard", "tcp", None)),
    # the same address twice is no contradiction
    (Given(rdzv_endpoint="h0:7000", master_addr="h0", master_port=7000, run_id="a", rdzv_id="a"), 0,
     Rendezvous(1, 1, 0, "h0", 7000, "a", "tcp", None)),
    # an etcd rendezvous is the job's etcd store
    (Given(nnodes="3", node_rank=2, rdzv_backend="etcd", rdzv_endpoint="etcd-0"), 0,
     Rendezvous(1, 3, 2, "127.0.0.1", 0, "seamguard", "etcd://etcd-0:2379", None)),
    (Given(standalone=True, max_restarts=0), 0, Rendezvous(1, 1, 0, "127.0.0.1", 0, "seamguard", "tcp", 0)),
    (Given(max_restarts=3, store="etcd://e:2379"), 0, Rendezvous(1, 1, 0, "127.0.0.1", 0, "seamguard",
                                                                 "etcd://e:2379", 3)),
])
def test_torchruns_flags_mean_what_they_mean_to_torchrun(given, gpus, want):
    assert resolve(given, _devices(gpus)) == want


@pytest.mark.parametrize("given, message", [
    (Given(nproc_per_node="0"), "--nproc-per-node: expected a count >= 1"),
    (Given(nproc_per_node="many"), "--nproc-per-node: expected a count >= 1"),
    (Given(nproc_per_node="gpu"), "--nproc-per-node gpu: no CUDA device"),
    (Given(nnodes="1:4"), "--nnodes 1:4: seamguard launch starts a fixed set of nodes"),
    (Given(nnodes="two"), "--nnodes: expected N or N:N"),
    (Given(nnodes="0"), "--nnodes: expected N or N:N"),
    (Given(nnodes="2"), "--node-rank: required with --nnodes 2"),
    (Given(standalone=True, nnodes="2", node_rank=0), "--standalone runs one node"),
    (Given(standalone=True, rdzv_endpoint="h0:29400"), "cannot go with --rdzv-endpoint"),
    (Given(rdzv_backend="zookeeper"), "--rdzv-backend: expected one of"),
    (Given(rdzv_backend="etcd"), "--rdzv-backend etcd: needs --rdzv-endpoint"),
    (Given(rdzv_endpoint="h0:port"), "--rdzv-endpoint: expected host[:port]"),
    (Given(rdzv_endpoint="h0:29400", master_addr="h1"), "and --master-addr h1 another"),
    (Given(rdzv_endpoint="h0", master_port=5000), "and --master-port 5000 another"),
    (Given(rdzv_endpoint="h0", store="etcd://e:2379"), "give --rdzv-backend etcd"),
    (Given(rdzv_backend="etcd", rdzv_endpoint="e1", store="etcd://e2:2379"), "cannot go with --store"),
    (Given(rdzv_id="a", run_id="b"), "--rdzv-id 'a' and --run-id 'b'"),
    (Given(max_restarts=-1), "--max-restarts: expected a count >= 0"),
])
def test_contradicting_or_impossible_flags_are_one_line_naming_the_flag(given, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        resolve(given, _devices(0))
    assert "\n" not in str(err.value)
