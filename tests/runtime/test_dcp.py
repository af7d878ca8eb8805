"""Checkpoints seamguard persists for an FSDP2 job are `torch.distributed.checkpoint`
(DCP) checkpoints too: a job saved at 4 ranks loads with plain `dcp.load` at 2 ranks,
with no seamguard in the loading processes, and gives back the same weights."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from seamguard.runtime.manifest import step_dir

from .conftest import REPO, launch

pytestmark = pytest.mark.timeout(240)

# A user's own loader: torch only (torchrun's environment variables, gloo), the model
# built by the example's function and sharded over 2 ranks, then DCP's load.
LOADER = r'''
import os, runpy, sys
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

example, ckpt, out = sys.argv[1:4]
dist.init_process_group("gloo")
build_model = runpy.run_path(example)["build_model"]
model = build_model(32, 64, 2, 0.1, seed=123)   # another init: everything must come from the checkpoint
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model_sd, optim_sd = get_state_dict(model, opt)
state = {"model": model_sd, "optim": optim_sd}
dcp.load(state, checkpoint_id=ckpt)
set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
full = {k: v.full_tensor() for k, v in model.state_dict().items()}
steps = {float(s["step"]) for s in opt.state_dict()["state"].values()}
exp_avg = {k: v.full_tensor() for k, v in opt.state_dict()["state"][0].items() if k == "exp_avg"}
if dist.get_rank() == 0:
    torch.save({"model": full, "steps": steps, "exp_avg": exp_avg}, out)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)   # skip interpreter teardown: gloo's threads can abort it ("terminate called ...")
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_at(world_size: int, ckpt, tmp_path) -> dict:
    script = tmp_path / "load.py"
    script.write_text(LOADER)
    out = tmp_path / f"loaded_{world_size}.pt"
    port = _free_port()
    procs = []
    for rank in range(world_size):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank)}
        env.pop("PYTHONPATH", None)   # no seamguard on the loading side
        procs.append(subprocess.Popen([sys.executable, str(script), str(REPO / "examples" / "train_fsdp.py"),
                                       str(ckpt), str(out)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
    return torch.load(out)


def test_a_checkpoint_saved_at_4_ranks_loads_with_dcp_at_2(tmp_path):
    ckpt = tmp_path / "ckpt"
    # a rank is lost at step 5 too: what the job persists after a recovery is as good
    r = launch(tmp_path, "fsdp4", nproc=4, spares=1, steps=12, chaos="kill:rank=2,step=5",
               extra=("--checkpoint-dir", str(ckpt), "--persist-every", "4"),
               script="train_fsdp.py", script_args=("--full-out",), timeout_s=150)
    assert r.code == 0, r.stderr
    assert [e for e in r.kinds("resumed") if e["gen"] > 0]
    final = torch.load(r.out / "final_model.pt")   # the job's own full weights at step 12
    dcp_dir = step_dir(ckpt, 12) / "dcp"
    assert (dcp_dir / ".metadata").exists() and len(list(dcp_dir.glob("*.distcp"))) == 4
    loaded = _load_at(2, dcp_dir, tmp_path)
    assert loaded["model"].keys() == final.keys()
    for k, v in final.items():
        assert torch.equal(loaded["model"][k], v), k
    assert loaded["steps"] == {12.0}   # AdamW's step count came back with the moments
    assert all(torch.isfinite(t).all() and t.abs().sum() > 0 for t in loaded["exp_avg"].values())
    # the step-8 checkpoint is older: it must differ (the test would catch a stale load)
    (tmp_path / "older").mkdir()
    older = _load_at(2, step_dir(ckpt, 8) / "dcp", tmp_path / "older")
    assert older["steps"] == {8.0}
    assert any(not torch.equal(older["model"][k], v) for k, v in final.items())
