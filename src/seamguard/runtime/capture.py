"""Copying a training state's tensors into a snapshot slot's host memory.

`SlotStore.begin` (runtime/snapshot.py) picks the slot and writes the meta blob; this
module copies the tensors into it. What the next forward pass changes (model buffers) is
copied before `start_copy` returns; parameters and optimizer state are copied then too,
or, when the capture overlaps the step, in the background: a thread on CPU, a side stream
on CUDA (non_blocking copies into host memory registered as pinned, runtime/hostmem.py).
A :class:`Capture` is such a copy, possibly still running: its `wait` must return before
the optimizer step changes what it copies (the worker waits after the gradient
all-reduce), and hands the finished slot back to the store that picked it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch


class Capture:
    """A snapshot whose copy may still be running (`SlotStore.begin`); `wait` finishes it."""

    def __init__(self, slot: Any, step: int, meta_len: int, settle: Callable[["Capture"], None]) -> None:
        """``slot``: a snapshot.Slot; ``settle(capture)``: called once the copy is over
        (error or not), by the first `wait`: the store makes the slot its latest snapshot."""
        self.slot, self.step, self.meta_len = slot, step, meta_len
        self._settle = settle
        self.copier: threading.Thread | None = None
        self.event: Any = None   # CUDA: recorded on the side stream after the last copy
        self.error: BaseException | None = None   # set by the copier thread, read after its join
        self.done = False
        self._lock = threading.Lock()   # FSDP2: the pipeline and the training thread both wait

    def wait(self) -> Any:
        """Block until every byte is in the slot, then make it the latest snapshot (once,
        whichever thread waits first)."""
        with self._lock:
            if not self.done:
                if self.copier is not None:
                    self.copier.join()
                if self.event is not None:
                    self.event.synchronize()
                self.done = True
                self._settle(self)
        if self.error is not None:
            raise RuntimeError(f"snapshot copy of step {self.step} failed: {self.error}") from self.error
        return self.slot


def start_copy(cap: Capture, jobs: list[tuple[tuple[str, torch.Tensor], tuple]], mutable: set[str],
               host: torch.Tensor, stream: Any, overlap: bool, midway: Callable[[], None] | None = None,
               clock: Any = None) -> None:
    """Copy ``jobs`` ((name, tensor) with its layout item (name, dtype, shape, offset,
    bytes)) into ``host`` (the slot's bytes). Tensors named in ``mutable`` first, and done
    when this returns; the rest too, or with ``overlap`` in the background (``cap.wait``
    finishes them). ``stream``: the CUDA side stream (None: the state is on the CPU);
    ``midway``: called half-way through the tensors (chaos phase `snapshot`); ``clock``: a
    profile.PhaseClock timing the background copy on CPU."""
    cuda = stream is not None
    first = [j for j in jobs if j[0][0] in mutable]
    rest = [j for j in jobs if j[0][0] not in mutable]
    half = len(jobs) // 2

    def copy(part, start: int) -> None:
        ctx = torch.cuda.stream(stream) if cuda else contextlib.nullcontext()
        with ctx, torch.no_grad():
            for i, ((_, t), (_, _, _, off, nbytes)) in enumerate(part, start):
                if i == half and midway is not None:
                    midway()
                dst = host[off:off + nbytes].view(t.dtype).view(t.shape)
                dst.copy_(t, non_blocking=t.is_cuda)

    if cuda:
        stream.wait_stream(torch.cuda.current_stream())
    copy(first, 0)
    if cuda:
        stream.synchronize()   # buffers change in the next forward pass
    if not overlap:
        copy(rest, len(first))
        if cuda:
            stream.synchronize()
    elif cuda:
        copy(rest, len(first))
        cap.event = torch.cuda.Event()
        cap.event.record(stream)
    else:
        def run() -> None:
            with clock.phase("bg_copy") if clock is not None else contextlib.nullcontext():
                try:
                    copy(rest, len(first))
                except BaseException as exc:  # noqa: BLE001 - handed to wait()
                    cap.error = exc
        cap.copier = threading.Thread(target=run, name=f"snapshot-{cap.step}", daemon=True)
        cap.copier.start()
