"""A trainer-callback job under torchrun: the seamguard callback in a stand-in trainer.

``StandInTrainer`` is NOT Hugging Face's Trainer: it is the few lines of its training loop
that matter to a callback — ``TrainerState.global_step``, ``TrainerControl.should_save``,
``args.output_dir``, and the order ``on_train_begin``, ``on_step_begin``, (step),
``on_step_end``, (save to ``<output_dir>/checkpoint-<step>`` if ``should_save``),
``on_save``, ``on_train_end`` — so the callback (seamguard_callback.py) is tested without
installing transformers. Its saves are synchronous DCP saves, as a trainer's are. Run it with

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/trainer_callback/train.py \\
        --output-dir /ckpt/fast/job8 --hint-dir /run/seamguard/job8 --metrics-port 9401 --job job8
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seamguard_callback import SeamguardCallback  # noqa: E402

from seamguard.runtime.jobhook import HookSettings  # noqa: E402


@dataclass
class TrainerState:
    global_step: int = 0


@dataclass
class TrainerControl:
    should_save: bool = False


class StandInTrainer:
    """The callback-facing part of a Trainer's loop (see the module docstring)."""

    def __init__(self, model, opt, args, callbacks) -> None:
        self.model, self.opt, self.args, self.callbacks = model, opt, args, callbacks
        self.state, self.control = TrainerState(), TrainerControl()
        self.gen = torch.Generator().manual_seed(dist.get_rank())

    def _call(self, event: str) -> None:
        for cb in self.callbacks:
            getattr(cb, event)(self.args, self.state, self.control, model=self.model)

    def train(self) -> None:
        self._call("on_train_begin")
        for _ in range(self.args.max_steps):
            self._call("on_step_begin")
            self.opt.zero_grad()
            self.model(torch.randn(16, 32, generator=self.gen)).pow(2).mean().backward()
            self.opt.step()
            time.sleep(self.args.step_sleep_s)
            self.state.global_step += 1
            own = self.args.save_steps and self.state.global_step % self.args.save_steps == 0
            self.control.should_save = bool(own)
            self._call("on_step_end")
            if self.control.should_save:
                self._save()
                self._call("on_save")
        self._call("on_train_end")

    def _save(self) -> None:
        state = {"model": self.model.state_dict(), "optim": self.opt.state_dict(),
                 "step": torch.tensor(self.state.global_step)}
        dcp.save(state, checkpoint_id=str(Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--output-dir", type=Path, required=True)
    ap.add_argument("--save-steps", type=int, default=0)
    ap.add_argument("--step-sleep-s", type=float, default=0.0)
    ap.add_argument("--hint-dir", type=Path)
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--job", default="job")
    ap.add_argument("--sync-every", type=int, default=10)
    ap.add_argument("--events-file", type=Path)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    settings = HookSettings.from_env(job=args.job, checkpoint_dir=args.output_dir.absolute(), hint_dir=args.hint_dir,
                                     metrics_port=args.metrics_port, sync_every_steps=args.sync_every,
                                     events_file=args.events_file)
    trainer = StandInTrainer(model, torch.optim.SGD(model.parameters(), lr=0.01), args, [SeamguardCallback(settings)])
    trainer.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
