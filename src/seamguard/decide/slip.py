"""Schedule-slip risk per job: will it finish by its deadline, and what would an action change? Pure.

A job with a deadline (run config ``jobs.<name>.deadline``, or Slurm's ``--deadline`` /
a ``deadline=`` comment token, app/slurm_placement.py) has work left: steps left x the
time of one step (the runtime's measured ``seamguard_job_step_seconds`` where it reports,
else the configured ``step_s``; steps done from the runtime's ``seamguard_job_step``).
Between now and its finish it fails hard at the hazard its exposed nodes put on it
(decide/checkpoints.py ``exposure``); each failure costs the work since the last
checkpoint plus a restart. The model:

- failures are a Poisson process at ``hazard_per_h`` over the remaining run (the
  assumption Young 1974 and Daly 2006 make for the checkpoint interval: J. T. Daly, "A
  higher order estimate of the optimum checkpoint interval for restart dumps", Future
  Generation Computer Systems 22(3), 2006, https://doi.org/10.1016/j.future.2004.11.016);
- each failure costs ``loss_per_failure_s`` of wall time (rollback + restart; Daly's
  expected rollback is half an interval when the job's own exposure is not reported);
- the finish is ``now + work_left + N x loss`` with ``N ~ Poisson(hazard x work_left)``
  (first order: failures during the lost time itself are not counted).

So ``P(miss) = P(N x loss > slack)`` with ``slack = deadline - now - work_left``, and the
expected slip is ``E[max(0, N x loss - slack)]``, summed over N up to ``MAX_FAILURES`` (the
Poisson tail beyond it counts as a miss). An action's value to the schedule is the slip it
saves: the same forecast with the action's effect (a faster step, a smaller hazard, a stall
added to the work) subtracted from the forecast without it (:func:`slip_saved_s`).

A job without a deadline, or whose progress or step time is unknown, has no forecast
(NaN): the slip term then adds nothing to its decisions. Arrays in, arrays out; no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_FAILURES = 64  # Poisson terms summed; beyond them a job is counted as missing its deadline


@dataclass(frozen=True, eq=False)
class SlipForecast:
    """Per job: the forecast of its finish against its deadline (NaN where it has none)."""

    work_left_s: np.ndarray  # wall time the remaining steps take without failures
    expected_finish_s: np.ndarray  # now + work left + expected failure losses (Unix s)
    p_miss: np.ndarray  # probability the job finishes after its deadline
    expected_slip_s: np.ndarray  # E[max(0, finish - deadline)]
    slack_s: np.ndarray  # deadline - now - work left (negative: late even without failures)


def work_left_s(total_steps: np.ndarray, steps_done: np.ndarray, measured_step_s: np.ndarray,
                configured_step_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(work left in wall seconds, the step time used) per job: steps left x step time.

    The runtime's measured step time wins over the configured one; NaN where the total,
    the steps done (the runtime's progress: a job that does not report it has no forecast,
    rather than one that assumes it has not started) or any step time is unknown."""
    total = np.asarray(total_steps, dtype=float)
    done = np.asarray(steps_done, dtype=float)
    measured = np.asarray(measured_step_s, dtype=float)
    step = np.where(np.isfinite(measured) & (measured > 0), measured, np.asarray(configured_step_s, dtype=float))
    left = np.maximum(total - done, 0.0)
    return left * step, step


def slip_forecast(now_s: float, deadline_s: np.ndarray, work_left: np.ndarray, hazard_per_h: np.ndarray,
                  loss_per_failure_s: np.ndarray) -> SlipForecast:
    """The finish, P(miss) and expected slip of each job (the module docstring's model)."""
    deadline = np.asarray(deadline_s, dtype=float)
    work = np.asarray(work_left, dtype=float)
    loss = np.maximum(np.asarray(loss_per_failure_s, dtype=float), 0.0)
    mean_failures = np.maximum(np.asarray(hazard_per_h, dtype=float), 0.0) * np.maximum(work, 0.0) / 3600.0
    known = np.isfinite(deadline) & np.isfinite(work) & np.isfinite(mean_failures) & np.isfinite(loss)
    m = np.where(known, mean_failures, 0.0)
    slack = deadline - now_s - work
    s = np.where(known, slack, 0.0)
    n = np.arange(MAX_FAILURES + 1, dtype=float)[:, None]  # failures, down the first axis
    # Poisson pmf by its recurrence p(n) = p(n-1) x m / n (no factorials to overflow)
    ratio = np.where(n == 0, 1.0, m[None, :] / np.maximum(n, 1.0))
    pmf = np.exp(-m)[None, :] * np.cumprod(ratio, axis=0)
    late = np.maximum(n * np.where(known, loss, 0.0)[None, :] - s[None, :], 0.0)
    tail = np.clip(1.0 - pmf.sum(axis=0), 0.0, 1.0)  # more failures than summed: late
    p_miss = (pmf * (late > 0)).sum(axis=0) + tail
    expected_slip = (pmf * late).sum(axis=0) + tail * np.maximum(MAX_FAILURES * loss - s, 0.0)
    nan = np.full(deadline.shape, np.nan)
    return SlipForecast(
        work_left_s=np.where(np.isfinite(work), work, np.nan),
        expected_finish_s=np.where(known, now_s + work + m * loss, nan),
        p_miss=np.where(known, np.clip(p_miss, 0.0, 1.0), nan),
        expected_slip_s=np.where(known, expected_slip, nan),
        slack_s=np.where(known, slack, nan))


def slip_saved_s(now_s: float, deadline_s: float, work_left: float, hazard_per_h: float, loss_s: float, *,
                 speedup: float = 1.0, hazard_removed_per_h: float = 0.0, stall_s: float = 0.0,
                 loss_after_s: float | None = None) -> tuple[float, float, float]:
    """(slip saved, slip without, slip with) for one job and one action, seconds; 0s where it has no forecast.

    The action makes the remaining steps ``speedup`` times faster (a slow node swapped),
    removes ``hazard_removed_per_h`` of failure hazard (the risky node or loop left behind),
    costs ``stall_s`` of wall time once (a swap, a move, a checkpoint write) and may change
    the loss per failure (``loss_after_s``: a checkpoint just written)."""
    keep = slip_forecast(now_s, np.array([deadline_s]), np.array([work_left]), np.array([hazard_per_h]),
                         np.array([loss_s]))
    act = slip_forecast(now_s, np.array([deadline_s]), np.array([work_left / max(speedup, 1e-9) + stall_s]),
                        np.array([max(hazard_per_h - hazard_removed_per_h, 0.0)]),
                        np.array([loss_s if loss_after_s is None else loss_after_s]))
    before, after = float(keep.expected_slip_s[0]), float(act.expected_slip_s[0])
    if not (np.isfinite(before) and np.isfinite(after)):
        return 0.0, 0.0, 0.0
    return before - after, before, after


def checkpoint_slip_saved_s(now_s: float, deadline_s: float, work_left: float, hazard_per_h: float, loss_s: float,
                            p_fail: float, uncommitted_s: float, write_s: float) -> tuple[float, float, float]:
    """(slip saved, without, with) by a checkpoint written now, seconds; 0s where the job has no forecast.

    Without it, a failure before the next scheduled checkpoint (probability ``p_fail``) also
    throws away the ``uncommitted_s`` a checkpoint now would keep: the finish moves by that
    much with that probability. With it, the job pays the ``write_s`` stall for sure. Later
    failures cost the same either way (the forecast's ``loss_s``)."""
    def slip(extra_s: float) -> float:
        return float(slip_forecast(now_s, np.array([deadline_s]), np.array([work_left + extra_s]),
                                   np.array([hazard_per_h]), np.array([loss_s])).expected_slip_s[0])
    p = min(max(p_fail, 0.0), 1.0)
    before = p * slip(max(uncommitted_s, 0.0)) + (1.0 - p) * slip(0.0)
    after = slip(max(write_s, 0.0))
    if not (np.isfinite(before) and np.isfinite(after)):
        return 0.0, 0.0, 0.0
    return before - after, before, after
