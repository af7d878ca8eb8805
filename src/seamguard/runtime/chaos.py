"""Fault injection as product code: kill or freeze a rank at a chosen step and phase.

Used by the tests, the chaos suite, the failover benchmark and demos. A plan is a
string (usually the SEAMGUARD_CHAOS environment variable, set through
`seamguard launch --chaos ...`):

    kill:rank=1,step=40,phase=step; stop:rank=2,step=90; kill:rank=0,step=120,phase=persist

actions: `kill` (SIGKILL), `stop` (SIGSTOP: alive but frozen, the coordinator must notice
and evacuate it), `nodeloss` (SIGKILL after deleting the process's host-memory snapshots,
as losing its whole node would; in phases other than `step` it acts like `kill`), `raise`
(a software bug: `ChaosError`, a RuntimeError, raised in the training thread, which the
process does not catch; phases `step` and `optimizer`), `sdc`
(silent data corruption: a few elements of the rank's local gradient get a high exponent
bit flipped, as a faulty multiply would; phase `grad` only), `delay` (the rank's training
thread pauses for `seconds=` (default 2) and goes on, as after a long garbage-collection
pause or a noisy neighbour; phases `step` and `optimizer`). phases: `step` (before the
step's compute), `snapshot` (half-way through copying state into the host buffers),
`replicate` (half-way through pushing the replica to the peer), `persist` (in the
persister, after the data file and before the commit marker; it kills the worker and
itself, like a node dying mid-write), `reduced` (right after the step's gradient
all-reduce returned on this rank, before its optimizer step: the survivors may commit the
step without it), `optimizer` (right after the optimizer applied the step, before the
next step's private bytes reach the holder), `grad` (the local gradient, before the
all-reduce).
Two `sdc` triggers at the same rank and step corrupt the step and its recompute.

Each trigger fires once per job, not once per process: a spare that replays the step
after a rollback must not die again. The claim is an O_EXCL file in SEAMGUARD_CHAOS_DIR
(shared by all processes of a node; a shared directory for multi-node chaos), which the
launcher always sets: `--chaos-dir`, or without one a directory it keeps for the launch's
life (runtime/cli.py). Every firing appends a line with the wall time to `kills.jsonl` in
that directory, so a benchmark can measure from the moment of the fault. (An `Injector`
built without a directory, as unit tests do, claims nothing and fires every time.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PROCESS_ACTIONS = ("kill", "stop", "nodeloss")
PROCESS_PHASES = ("step", "snapshot", "replicate", "persist", "optimizer")
ACTIONS = PROCESS_ACTIONS + ("raise", "sdc", "delay")
THREAD_PHASES = ("step", "optimizer")   # the training thread's phases: `raise`, `delay`
PHASES = PROCESS_PHASES + ("reduced", "grad")   # `reduced`: not drawn by random_plan (seeded plans keep their draws)
SDC_SCALE = 2.0 ** 40  # a flipped high exponent bit


@dataclass(frozen=True)
class Trigger:
    action: str
    rank: int
    step: int
    phase: str = "step"
    seconds: float = 0.0
    """Pause of a `delay` (s)."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"chaos action {self.action!r} not in {ACTIONS}")
        if self.phase not in PHASES:
            raise ValueError(f"chaos phase {self.phase!r} not in {PHASES}")
        if self.action in ("raise", "delay") and self.phase not in THREAD_PHASES:
            raise ValueError(f"chaos action {self.action!r} goes with a phase in {THREAD_PHASES}, "
                             f"got {self.phase!r}")
        if self.action == "delay" and not 0 < self.seconds < 3600:
            raise ValueError(f"chaos action 'delay' needs 0 < seconds < 3600, got {self.seconds!r}")
        if (self.action == "sdc") != (self.phase == "grad"):
            raise ValueError("chaos action 'sdc' goes with phase 'grad' and only with it, "
                             f"got {self.action}:{self.phase}")

    def render(self) -> str:
        extra = f",seconds={self.seconds:g}" if self.action == "delay" else ""
        return f"{self.action}:rank={self.rank},step={self.step},phase={self.phase}{extra}"


def parse_plan(text: str) -> list[Trigger]:
    """Parse 'kill:rank=1,step=40,phase=step; stop:rank=2,step=9' (see module doc)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        action, _, args = part.partition(":")
        fields = dict(kv.split("=", 1) for kv in args.split(",") if kv)
        action = action.strip()
        try:
            out.append(Trigger(action, int(fields["rank"]), int(fields["step"]),
                               fields.get("phase", "grad" if action == "sdc" else "step").strip(),
                               float(fields.get("seconds", 2.0 if action == "delay" else 0.0))))
        except KeyError as exc:
            raise ValueError(f"--chaos: bad chaos trigger {part!r}: it needs rank= and step=, has no {exc.args[0]}=") \
                from None
        except ValueError as exc:
            raise ValueError(f"--chaos: bad chaos trigger {part!r}: {exc}") from exc
    return out


def render_plan(triggers: list[Trigger]) -> str:
    return "; ".join(t.render() for t in triggers)


def random_plan(seed: int, world_size: int, first_step: int, last_step: int, n: int,
                phases: tuple[str, ...] = PROCESS_PHASES,
                actions: tuple[str, ...] = PROCESS_ACTIONS,
                min_gap_steps: int = 3, persist_every: int = 0) -> list[Trigger]:
    """n triggers at distinct random steps at least `min_gap_steps` apart (seeded).

    With `persist_every`, a persist-phase trigger is moved to a step that persists.
    """
    rng = random.Random(seed)
    steps: list[int] = []
    candidates = list(range(first_step, last_step))
    rng.shuffle(candidates)
    for s in candidates:
        if all(abs(s - t) >= min_gap_steps for t in steps):
            steps.append(s)
        if len(steps) == n:
            break
    out = []
    for s in sorted(steps):
        phase = rng.choice(phases)
        if phase == "persist" and persist_every:
            s = max(persist_every, s - s % persist_every)
        out.append(Trigger(rng.choice(actions), rng.randrange(world_size), s, phase))
    return out


class ChaosError(RuntimeError):
    """The software bug chaos action `raise` injects."""


@dataclass
class Injector:
    """Fires the triggers of a plan at the matching (rank, step, phase)."""

    triggers: list[Trigger]
    state_dir: Path | None

    def _claim(self, index: int) -> bool:
        if self.state_dir is None:
            return True
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.state_dir / f"fired_{index}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def _record(self, trigger: Trigger, pid: int) -> None:
        if self.state_dir is None:
            return
        line = json.dumps({"time_s": time.time(), "pid": pid, **trigger.__dict__})
        with open(self.state_dir / "kills.jsonl", "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def maybe_fire(self, phase: str, rank: int, step: int, pid: int | None = None,
                   forget_memory=None) -> None:
        """Called by the runtime at each phase; kills/stops `pid` (default: this process)
        or raises ChaosError (action `raise`) or pauses (action `delay`). `forget_memory` deletes the process's
        host-memory snapshots (action `nodeloss`)."""
        for i, t in enumerate(self.triggers):
            if t.phase == phase and t.rank == rank and t.step == step and self._claim(i):
                target = os.getpid() if pid is None else pid
                self._record(t, target)
                if t.action == "delay":
                    time.sleep(t.seconds)
                    continue
                if t.action == "raise":
                    raise ChaosError(f"chaos: injected software bug at rank {rank}, step {step}, "
                                     f"phase {phase}")
                if t.action == "nodeloss" and forget_memory is not None:
                    forget_memory()
                os.kill(target, signal.SIGSTOP if t.action == "stop" else signal.SIGKILL)

    def maybe_corrupt(self, rank: int, step: int, grad) -> bool:
        """Phase `grad`: corrupt this rank's local gradient (a flat tensor) in place, as a
        faulty multiply would. One trigger per call, so a second one hits the recompute."""
        for i, t in enumerate(self.triggers):
            if t.action == "sdc" and t.rank == rank and t.step == step and self._claim(i):
                self._record(t, os.getpid())
                stride = max(1, grad.numel() // 8)
                grad[::stride] *= SDC_SCALE
                return True
        return False

    def maybe_fire_persist(self, rank: int, step: int) -> None:
        """Persist phase: take the worker (our parent) and this persister down mid-write."""
        for i, t in enumerate(self.triggers):
            if t.phase == "persist" and t.rank == rank and t.step == step and self._claim(i):
                self._record(t, os.getppid())
                os.kill(os.getppid(), signal.SIGSTOP if t.action == "stop" else signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)


def from_env_without_store(environ: dict[str, str] | None = None) -> Injector:
    env = os.environ if environ is None else environ
    state = env.get("SEAMGUARD_CHAOS_DIR")
    return Injector(parse_plan(env.get("SEAMGUARD_CHAOS", "")), Path(state) if state else None)


def kill_process(pid: int, action: str = "kill") -> None:
    """External injection (benchmarks, demos): SIGKILL or SIGSTOP a process by id."""
    os.kill(pid, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
