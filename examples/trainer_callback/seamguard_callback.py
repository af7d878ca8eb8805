"""The job hook as a trainer callback: the shape of Hugging Face's ``TrainerCallback``.

A high-level trainer owns the loop and the saving, so the hook (seamguard.runtime.jobhook)
is driven from the callbacks the trainer calls and asks the trainer to save the way the
trainer's own API lets a callback ask: ``control.should_save = True`` at the end of the
step the ranks agreed on; a ``checkpoint_dir`` move points ``args.output_dir`` at the new
directory for that save and the next ones; ``on_save`` reports the save (its stall is the
time from the step's end to ``on_save``). ``degraded`` is a property the job may read
(e.g. to save twice as often).

This file is tested with the stand-in trainer in ``train.py`` beside it, which calls the
callbacks in the order Hugging Face's Trainer does; it has not been run under the real
``transformers.Trainer`` (nor under Lightning, whose ``Callback`` has the same moments:
``on_train_batch_end``, ``on_save_checkpoint``). It imports neither.
"""

from __future__ import annotations

import time
from typing import Any

from seamguard.runtime.jobhook import HookSettings, JobHook


class SeamguardCallback:
    """``Trainer(..., callbacks=[SeamguardCallback(HookSettings.from_env())])``; build it on every rank."""

    def __init__(self, settings: HookSettings, group: Any = None) -> None:
        self.settings, self.group = settings, group
        self.hook: JobHook | None = None
        self._asked_t: float | None = None
        self._why = "own"

    @property
    def degraded(self) -> bool:
        return self.hook is not None and self.hook.degraded

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.hook = JobHook(self.settings, group=self.group)   # after the trainer set up torch.distributed

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.hook.step_begin()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        c = self.hook.step_end(state.global_step)
        args.output_dir = str(c.checkpoint_dir)
        if c.save:
            control.should_save = True
            self._asked_t, self._why = time.perf_counter(), c.why
        elif control.should_save:   # the trainer's own save_steps
            self._asked_t, self._why = time.perf_counter(), "own"

    def on_save(self, args, state, control, **kwargs) -> None:
        stall_s = time.perf_counter() - self._asked_t if self._asked_t is not None else 0.0
        self.hook.saved(state.global_step, stall_s, why=self._why)
        self._asked_t, self._why = None, "own"

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.hook.close()
