"""The step transaction's collectives, each one cancellable by a new generation.

A collective issued on the generation's gloo group (the gradient all-reduce, a recovery's
broadcast and checksum exchange, the final barrier, FSDP2's collectives forwarded by
runtime/fsdp.py) or over the rails (runtime/rail_sync.py) is waited for here, on the
training thread, so that a new generation announced by the membership follower (its
``Controls`` record) or the collective timeout ends the wait: the step fails instead of
hanging on a peer that is gone. A failure never raises into model code; it latches the
step transaction's failed flag (runtime/worker.py) and the next ``steps()`` iteration
recovers. The training thread's only: it reads the follower's threads through
``Controls``, never their attributes.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import torch
import torch.distributed as dist

from seamguard.runtime.rail_sync import RailSync

# how often a wait for a collective looks for a new generation or its timeout; completion
# itself ends gloo's wait(timeout) at once, so this only bounds cancelling
_WAKE_S = 0.05
_WAKE_TD = datetime.timedelta(seconds=_WAKE_S)


class Collectives:
    """The collectives of one worker's step transaction (module docstring)."""

    def __init__(self, rt) -> None:
        """``rt``: the worker's step transaction (runtime/worker.py): its group, step,
        phase and failed flag, on the training thread."""
        self.rt = rt
        self._time = rt.time
        self.rails: RailSync | None = None  # the gradient all-reduce over rails (--rails), per generation

    def run(self, issue: Callable[[], dist.Work]) -> bool:
        """Run one collective, polling so a new generation or a timeout cancels it."""
        try:
            work = issue()
        except RuntimeError as exc:
            self.rt._note("collective_error", error=str(exc)[:200])
            return False
        return self.await_work(work)

    def rail_allreduce(self, flat: torch.Tensor) -> bool:
        """The gradient all-reduce over the rails: a rail flap is handled inside (chunks
        re-run elsewhere); a new generation or the timeout ends it as a failed step."""
        rt = self.rt
        rt._set_phase("collective")
        try:
            why = self.rails.allreduce(flat, rt.step, rt._overtaken_gen,
                                       rt.settings.collective_timeout_s, rt._mode.avoid)
        finally:
            rt._set_phase("idle")
        for e in self.rails.new_events():
            rt._note(f"rail_{e['event']}", step=e["step"], rail=e["rail"], reason=e.get("reason", ""),
                     **({"rails_used": e["rails_used"]} if "rails_used" in e else {}))
        if why:
            rt._note("collective_error", error=f"rails: {why}"[:200])
        return not why

    def await_work(self, work: dist.Work) -> bool:
        """Wait for a collective issued on the step transaction's group; False (and the
        step failed) if it errs, times out, or a new generation overtakes it.

        Woken by the collective's completion, not by polling: polling with naps lagged a
        finished collective by 2.3 ms on average, ~27 ms of a 0.28 s FSDP2 step with its
        12 collectives (docs/benchmarks.md). The training thread waits in gloo's own
        ``wait(timeout)`` (C++, no GIL held), _WAKE_S at a time so that a new generation
        can cancel it; a future callback did this before, but it ran Python on gloo's
        thread, which then waited for the GIL before it went on with the next collective."""
        rt = self.rt
        phase = rt.progress.current.phase
        rt._set_phase("collective")
        deadline = self._time.monotonic() + rt.settings.collective_timeout_s
        t0 = self._time.perf_counter()
        try:
            if not self._wait_in_gloo(work, deadline):
                rt._note("collective_cancelled", reason="new generation"
                         if rt._overtaken_gen() else "timeout")
                rt._failed = True
                return False
            rt.clock.add("collective_wait", self._time.perf_counter() - t0)
            return True
        except RuntimeError as exc:
            rt._note("collective_error", error=str(exc)[:200])
            rt._failed = True
            return False
        finally:
            # FSDP2's collectives run inside the forward and backward: back to computing
            rt._set_phase(phase if rt.sharded and phase != "collective" else "idle")

    def _overtaken(self, deadline: float) -> bool:
        return self.rt._overtaken_gen() or self._time.monotonic() > deadline

    def _wait_in_gloo(self, work: dist.Work, deadline: float) -> bool:
        """Wait for ``work`` in its own ``wait(timeout)``; False if overtaken. A failed
        collective raises."""
        while True:
            try:
                work.wait(_WAKE_TD)
                return True
            except RuntimeError:
                if work.is_completed():   # failed, or completed just after this wait timed out:
                    work.wait()           # returns, or raises the collective's own error
                    return True
            if self._overtaken(deadline):
                return False

    def allowed(self) -> bool:
        """May a collective of FSDP2's run now? Not once this step failed or a new
        generation exists (it would only wait for a peer that is gone)."""
        rt = self.rt
        if rt._failed or rt._overtaken_gen() or rt.group is None:
            rt._failed = True
            return False
        return True

    def fail(self, why: str) -> None:
        """A collective could not be issued: the step fails."""
        self.rt._note("collective_error", error=why[:200])
        self.rt._failed = True

    def final_barrier(self) -> bool:
        """Every rank reached the last step (False: the step failed; recover and retry)."""
        rt = self.rt
        flag = torch.ones(1)
        ok = self.run(lambda: rt.group.allreduce([flag]))
        rt._failed = not ok
        return ok

    def close_rails(self, graveyard: list) -> None:
        """Stop this generation's rails; their gloo groups may still wait on a dead peer,
        so they are kept in ``graveyard`` rather than destroyed."""
        if self.rails is not None:
            self.rails.close()
            graveyard.append(self.rails)
            self.rails = None
