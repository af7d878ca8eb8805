"""A few lines that give a job `seamguard launch` did not start the control loop.

A plain torchrun + DCP job (or a Lightning / Hugging Face Trainer one, through a
callback) builds one :class:`JobHook` after ``init_process_group`` and ends each step
with it::

    hook = JobHook(HookSettings.from_env(), save=dcp_saver(lambda: {"model": ..., "optim": ...}))
    for step in range(start, steps):
        with hook.step(step):
            ...                         # forward, backward, optimizer step
    hook.close()

and gets what a launched job gets from the controller: ``checkpoint_now`` (a save, here
the job's own DCP ``async_save``), ``checkpoint_interval_s``, ``checkpoint_dir`` moves
(the next save goes to the new directory) and ``degraded`` (a flag and a callback the job
reads), and the step metrics the controller and live goodput read, served by rank 0
under the launcher's names (runtime/metrics.py renders both).

Every ``sync_every_steps`` steps the ranks agree in one ``all_gather`` on the job's process
group: each sends its step, compute and stall seconds and newest persisted step, rank 0
adds the hints it read (runtime/hintclient.py: the same signed files `seamguard launch`
reads), so every rank acts on the same step. A changed directory follows in one
``broadcast_object_list``. torch is imported only when a hook is built: the settings and
the records below import without it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seamguard.hintauth import KEY_FILE_ENV
from seamguard.runtime.clock import SYSTEM_CLOCK, Clock
from seamguard.runtime.eventlog import EVENTS_FILE_ENV, EventLog
from seamguard.runtime.hintclient import HintReader, JobHints
from seamguard.runtime.metrics import JobView, MetricsServer, RankView, StepClock, render
from seamguard.runtime.settings import path_error, port_error, run_id_error

SaveFn = Callable[[int, Path], "Future | None"]
"""``save(step, directory)``: start a checkpoint of ``step`` under ``directory`` on this rank;
return its Future (an async save) or None (done when it returns)."""

_ROW = ("step", "compute_s", "stall_s", "persisted_step", "local")   # what every rank sends
_CTL = ("checkpoint_seq", "dir_seq", "interval_s", "degraded", "save")  # what rank 0 adds
_WHY = ("", "checkpoint_now", "interval")


@dataclass(frozen=True)
class HookSettings:
    """One job's hook settings; :meth:`from_env` is the edge that reads the environment."""

    job: str
    """The job's name: the ``job_name`` label of its metrics and the actuator's name for it."""
    checkpoint_dir: Path
    """The job's own checkpoint directory (a ``checkpoint_dir`` hint of ``default`` goes back to it)."""
    hint_dir: Path | None = None
    """The directory the controller's runtime actuator writes this job's hints into (rank 0 reads it)."""
    hint_key_file: Path | None = None
    """An operator's key file; else a fresh key is written to ``<hint_dir>/.hint-key``."""
    checkpoint_roots: tuple[str, ...] = ()
    """Where a ``checkpoint_dir`` hint may point; default: the parent of ``checkpoint_dir``."""
    metrics_port: int | None = None
    """Rank 0 serves ``/metrics`` on this port (every interface, as the launcher does); None: no exporter."""
    sync_every_steps: int = 10
    """Steps between two agreements (one small all_gather each)."""
    save_wait_s: float = 600.0
    """The longest a save waits for the previous one to finish before it is skipped."""
    events_file: Path | None = None
    """JSON lines of the hook's events (saves, hints taken, refused or ignored)."""
    generation: int = 0
    """The job's restart count (torchrun's ``TORCHELASTIC_RESTART_COUNT``)."""
    local_rank: int = 0
    """This process's GPU slot on its node (the ``gpu`` label)."""

    def __post_init__(self) -> None:
        errors = [run_id_error(self.job) and f"job name: {run_id_error(self.job).partition(': ')[2]}",
                  path_error("checkpoint_dir", self.checkpoint_dir, absolute=True),
                  path_error("hint_dir", self.hint_dir), path_error("hint_key_file", self.hint_key_file),
                  self.metrics_port is not None and port_error("metrics_port", self.metrics_port, False),
                  self.sync_every_steps < 1 and f"sync_every_steps: expected >= 1, got {self.sync_every_steps}",
                  not self.save_wait_s > 0 and f"save_wait_s: expected > 0, got {self.save_wait_s}"]
        errors += [path_error("checkpoint_roots", Path(r), absolute=True) for r in self.checkpoint_roots]
        bad = [e for e in errors if e]
        if bad:
            raise ValueError(f"seamguard job hook: {bad[0]}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **given: Any) -> HookSettings:
        """Settings from ``SEAMGUARD_JOB_NAME`` (else torchrun's ``TORCHELASTIC_RUN_ID``),
        ``SEAMGUARD_CHECKPOINT_DIR``, ``SEAMGUARD_HINT_DIR``, ``SEAMGUARD_HINT_KEY_FILE``,
        ``SEAMGUARD_CHECKPOINT_ROOTS`` (comma-separated), ``SEAMGUARD_METRICS_PORT``,
        ``SEAMGUARD_SYNC_EVERY_STEPS``, ``SEAMGUARD_EVENTS_FILE``, ``TORCHELASTIC_RESTART_COUNT``
        and ``LOCAL_RANK``; keyword arguments win. ValueError names a bad value."""
        def get(name: str, conv: Callable = str, default: Any = None) -> Any:
            raw = env.get(name, "")
            try:
                return conv(raw) if raw else default
            except ValueError:
                raise ValueError(f"seamguard job hook: {name}={raw[:60]!r} is not a valid value") from None

        run_id = get("TORCHELASTIC_RUN_ID", default="none")   # torchrun's --rdzv-id ("none" unless given)
        read = {"job": get("SEAMGUARD_JOB_NAME", default=run_id if run_id != "none" else "job"),
                "checkpoint_dir": get("SEAMGUARD_CHECKPOINT_DIR", Path),
                "hint_dir": get("SEAMGUARD_HINT_DIR", Path), "hint_key_file": get(KEY_FILE_ENV, Path),
                "checkpoint_roots": tuple(r for r in get("SEAMGUARD_CHECKPOINT_ROOTS", default="").split(",") if r),
                "metrics_port": get("SEAMGUARD_METRICS_PORT", int),
                "sync_every_steps": get("SEAMGUARD_SYNC_EVERY_STEPS", int, 10),
                "events_file": get(EVENTS_FILE_ENV, Path),
                "generation": get("TORCHELASTIC_RESTART_COUNT", int, 0), "local_rank": get("LOCAL_RANK", int, 0)}
        read.update(given)
        if read["checkpoint_dir"] is None:
            raise ValueError("seamguard job hook: no checkpoint directory (SEAMGUARD_CHECKPOINT_DIR or checkpoint_dir=)")
        return cls(**{**read, "checkpoint_dir": Path(read["checkpoint_dir"]).absolute()})


@dataclass(frozen=True)
class StepControls:
    """What every rank does after a step; the same on every rank (agreed)."""

    step: int
    save: bool
    """The hook asks for a save of this step (it did it itself when it has a save callback)."""
    why: str
    """``checkpoint_now`` or ``interval`` when ``save``; else empty."""
    checkpoint_dir: Path
    """Where saves go now."""
    degraded: bool


class JobHook:
    """The control loop's client inside one rank of a job started without `seamguard launch`.

    Build it on every rank at the same point after ``init_process_group`` (it gathers the
    ranks' host names once). ``save``: how this job checkpoints (:func:`dcp_saver`, or your
    own); without it, a ``StepControls.save`` is the caller's to carry out, and it reports
    the save with :meth:`saved` (the trainer-callback shape). ``on_degraded(on)`` is called
    on every rank, at the same step, when degraded mode changes."""

    def __init__(self, settings: HookSettings, save: SaveFn | None = None, group: Any = None,
                 on_degraded: Callable[[bool], None] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        import torch.distributed as dist

        self.s, self._save_fn, self._on_degraded, self._clock = settings, save, on_degraded, clock
        self._dist = dist if dist.is_available() and dist.is_initialized() else None
        self._group = group
        self.rank = self._dist.get_rank(group) if self._dist else 0
        self.world = self._dist.get_world_size(group) if self._dist else 1
        self._log = EventLog("text", settings.events_file)   # a line per event on stderr, JSON in the file
        self._reader = HintReader.for_job(settings.hint_dir, settings.checkpoint_dir, settings.hint_key_file,
                                          settings.checkpoint_roots, self._event) \
            if self.rank == 0 and settings.hint_dir is not None else None
        self._server = MetricsServer(settings.metrics_port) if self.rank == 0 and settings.metrics_port is not None \
            else None
        self._hosts = self._gather_hosts()
        self._rows = [[-1.0, 0.0, 0.0, -1.0, 0.0] for _ in range(self.world)]
        self._hints, self._seq_done, self._dir_seq = JobHints(), 0, 0
        self._dir, self._degraded = settings.checkpoint_dir, False
        self._calls, self._pace = 0, StepClock()
        self._t_last, self._t_begin, self._t_compute_end = clock.perf_counter(), None, None
        self._last_save_t = clock.monotonic()
        self._stall_s, self._persisted, self._in_flight = 0.0, -1, None
        self.controls = StepControls(-1, False, "", self._dir, False)

    # ---------------------------------------------------------------- the job's calls
    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """``with hook.step(step): ...``: times the body as the rank's compute and ends the
        step (:meth:`step_end`) when the body returns; read :attr:`controls` after it."""
        self.step_begin()
        yield
        self.controls = self.step_end(step)

    def step_begin(self) -> None:
        """Start the step's compute clock (a trainer callback's ``on_step_begin``; without it
        a step's compute is the time since the previous step ended)."""
        self._t_begin, self._t_compute_end = self._clock.perf_counter(), None

    def compute_done(self) -> None:
        """Optional: mark the end of this step's own compute (before a gradient collective
        every rank waits in), so ``seamguard_rank_compute_seconds`` shows a straggler."""
        self._t_compute_end = self._clock.perf_counter()

    def step_end(self, step: int, compute_s: float | None = None) -> StepControls:
        """End ``step`` on this rank: agree with the other ranks when due, save when agreed
        (with the save callback), export. Every rank calls it once per step."""
        now = self._clock.perf_counter()
        if compute_s is None:
            start = self._t_begin if self._t_begin is not None else self._t_last
            compute_s = (self._t_compute_end or now) - start
        self._reap()
        self._rows[self.rank] = [float(step), compute_s, self._stall_s, float(self._persisted), float(self.s.local_rank)]
        self._stall_s, self._calls = 0.0, self._calls + 1
        why = self._agree() if self._calls % self.s.sync_every_steps == 0 else ""
        if why and self._save_fn is not None:
            self.save(step, why)
        self._export(step)
        self._t_last, self._t_begin = self._clock.perf_counter(), None
        self.controls = StepControls(step, bool(why), why, self._dir, self._degraded)
        return self.controls

    def save(self, step: int, why: str = "own") -> Future | None:
        """Checkpoint ``step`` now through the save callback, into the current directory
        (every rank, at the same step: call it where the job saves on its own too). The
        previous save is waited for first (at most ``save_wait_s``; past that this save is
        skipped, noted ``checkpoint_skipped``). The time it holds the step is its stall."""
        if self._save_fn is None:
            raise RuntimeError("seamguard job hook: no save callback (JobHook(save=...)); report your own saves "
                               "with hook.saved(step)")
        t0 = self._clock.perf_counter()
        if not self._wait_in_flight():
            self._event({"event": "checkpoint_skipped", "step": step, "why": why,
                         "detail": f"the previous save is still running after {self.s.save_wait_s:.0f} s"})
            return None
        fut = self._save_fn(step, self._dir)
        self.saved(step, self._clock.perf_counter() - t0, fut, why)
        return fut

    def saved(self, step: int, stall_s: float, future: Future | None = None, why: str = "own") -> None:
        """Report a save the job made itself (``future``: its async completion; None: done):
        its stall goes into this rank's metrics, its step becomes the persisted one when done."""
        self._stall_s, self._last_save_t = self._stall_s + stall_s, self._clock.monotonic()
        self._in_flight = (step, future) if future is not None else None
        if future is None:
            self._persisted = max(self._persisted, step)
        self._event({"event": "checkpoint_saved", "step": step, "dir": str(self._dir), "why": why,
                     "stall_s": round(stall_s, 6)})

    @property
    def degraded(self) -> bool:
        return self._degraded

    @property
    def checkpoint_dir(self) -> Path:
        """Where the next save goes (the job's own, or where a hint moved it)."""
        return self._dir

    def metrics_text(self) -> str:
        """The job's metrics as rank 0 serves them (on any rank: what it knows)."""
        return render(self._view())

    def close(self) -> None:
        """Wait for the last save (bounded), serve the final figures once more, stop serving."""
        self._wait_in_flight()
        self._reap()
        if self._server is not None:
            self._server.close()
        self._log.close()

    # ---------------------------------------------------------------- agreement
    def _gather_hosts(self) -> list[str]:
        if self._dist is None:
            return [socket.gethostname()]
        hosts: list[Any] = [None] * self.world
        self._dist.all_gather_object(hosts, socket.gethostname(), group=self._group)
        return [str(h) for h in hosts]

    def _proposal(self) -> list[float]:
        """Rank 0's hints and whether to save now (other ranks send zeros)."""
        if self.rank != 0:
            return [0.0] * len(_CTL)
        h = self._hints = self._reader.poll() if self._reader is not None else self._hints
        save = 1 if h.checkpoint_seq > self._seq_done else \
            2 if h.interval_s is not None and self._clock.monotonic() - self._last_save_t >= h.interval_s else 0
        self._seq_done = h.checkpoint_seq
        return [float(h.checkpoint_seq), float(h.dir_seq), h.interval_s or -1.0, float(h.degraded), float(save)]

    def _agree(self) -> str:
        """One all_gather: every rank's row to everyone, rank 0's hints with it; act on them."""
        rows = self._all_gather(self._rows[self.rank] + self._proposal())
        self._rows = [r[:len(_ROW)] for r in rows]
        ctl = dict(zip(_CTL, rows[0][len(_ROW):]))
        if int(ctl["dir_seq"]) != self._dir_seq:
            self._dir_seq = int(ctl["dir_seq"])
            where = self._broadcast(self._hints.checkpoint_dir)
            self._dir = Path(where) if where else self.s.checkpoint_dir
            self._event({"event": "checkpoint_dir", "dir": str(self._dir)}, rank0_only=True)
        if bool(ctl["degraded"]) != self._degraded:
            self._degraded = bool(ctl["degraded"])
            self._event({"event": "degraded", "on": self._degraded})
            if self._on_degraded is not None:
                self._on_degraded(self._degraded)
        return _WHY[int(ctl["save"])]

    def _all_gather(self, row: list[float]) -> list[list[float]]:
        if self._dist is None:
            return [row]
        import torch

        backend = str(self._dist.get_backend(self._group))
        device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend and "gloo" not in backend \
            else torch.device("cpu")
        mine = torch.tensor(row, dtype=torch.float64, device=device)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        self._dist.all_gather(out, mine, group=self._group)
        return torch.stack(out).cpu().tolist()

    def _broadcast(self, value: str | None) -> str | None:
        if self._dist is None:
            return value
        box = [value if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, group=self._group, group_src=0)
        return box[0]

    # ---------------------------------------------------------------- saves, metrics, events
    def _wait_in_flight(self) -> bool:
        """Wait for the save in flight (at most save_wait_s); False if it is still running."""
        if self._in_flight is None:
            return True
        try:
            self._in_flight[1].result(timeout=self.s.save_wait_s)
        except FutureTimeout:
            return False
        except Exception:  # noqa: BLE001 (reported by _reap as checkpoint_failed)
            pass
        return True

    def _reap(self) -> None:
        """Note the save in flight once it is done: persisted, or failed (the job goes on)."""
        if self._in_flight is None or not self._in_flight[1].done():
            return
        (step, fut), self._in_flight = self._in_flight, None
        err = fut.exception()
        if err is None:
            self._persisted = max(self._persisted, step)
            self._event({"event": "checkpoint_persisted", "step": step})
        else:
            self._event({"event": "checkpoint_failed", "step": step, "detail": str(err).splitlines()[0][:200]
                         if str(err) else type(err).__name__})

    def _view(self) -> JobView:
        ranks = tuple(RankView(rank=r, wid=r, host=self._hosts[r], local=int(row[4]), step=int(row[0]),
                               compute_s=row[1], phase="train", stall_s=row[2], persisted_step=int(row[3]))
                      for r, row in enumerate(self._rows))
        refused = self._reader.refusals() if self._reader is not None else {}
        return JobView(self.s.job, ranks, self.s.generation, max(r.step for r in ranks),
                       self._pace.seconds_per_step(), 0, 0, tuple(sorted(refused.items())))

    def _export(self, step: int) -> None:
        if self.rank == 0:
            self._pace.advance(step, self._clock.monotonic())
            if self._server is not None:
                self._server.publish(lambda: render(self._view()))

    def _event(self, event: dict, rank0_only: bool = False) -> None:
        if self.rank == 0 or not rank0_only:
            self._log.emit({**event, "rank": self.rank}, f"rank {self.rank}")


def dcp_saver(state_dict: Callable[[], dict], process_group: Any = None) -> SaveFn:
    """A save callback that checkpoints with ``torch.distributed.checkpoint.async_save`` into
    ``<directory>/step_<n>``. ``state_dict()`` is called at each save. DCP's background
    save runs collectives of its own: by default it gets a gloo group made here (build the
    saver on every rank at the same point), so they never interleave with the training
    thread's collectives on the job's group."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    pg = process_group
    if pg is None and dist.is_available() and dist.is_initialized():
        pg = dist.new_group(backend="gloo")

    def save(step: int, directory: Path) -> Future:
        return dcp.async_save(state_dict(), checkpoint_id=str(Path(directory) / f"step_{step}"), process_group=pg)

    return save
