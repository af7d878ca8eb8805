"""`failover_training.py --quick` runs each system's faulted run only (about two minutes
instead of eight on 2 loaded cores): its summary is every kill's figures and seamguard's
per-kill ratios to each baseline, and it claims nothing that needs a failure-free run."""

from __future__ import annotations

import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import failover_training as ft  # noqa: E402


def _kill(lost_s: float, resume_s: float | None, redone: int | None, phase: float) -> dict:
    return {"lost_s": lost_s, "resume_s": resume_s, "steps_lost": redone, "phase": phase,
            "boundary": phase < 0.1 or phase >= 0.9}


def _faulted(*kills: dict, ranks: int = 4) -> dict:
    return {"faults": {"window_s": 10.0, "wall_s": 20.0, "ranks_provisioned": ranks, "samples": 640,
                       "failures": list(kills)}}


def test_quick_summary_is_per_kill_only_with_ratios_to_every_baseline():
    reps = [{"kills": [[12, 2, 0.1], [24, 1, 0.5]], "order": ["seamguard", "torchrun", "torchft"], "runs": {
        "seamguard": _faulted(_kill(0.4, 0.6, 0, 0.15), _kill(0.2, 0.3, 0, 0.95), ranks=5),
        "torchrun": _faulted(_kill(11.0, 10.0, 4, 0.2), _kill(9.0, 10.0, 0, 0.9)),
        "torchft": _faulted(_kill(0.1, 0.2, 0, 0.2), _kill(0.3, None, None, 0.3))}}]
    out = ft.quick_summary(reps, ["seamguard", "torchrun", "torchft"])
    sg = out["seamguard"]
    assert sg["per_kill"]["lost_s"]["median"] == pytest.approx(0.3) and sg["per_kill"]["kills"] == 2
    assert sg["per_kill"]["lost_s_boundary"]["n"] == 1
    assert "spread" not in sg and "capacity" not in sg      # no failure-free run: nothing whole-run
    assert out["torchft"]["unrecovered_failures"] == 1 and out["torchft"]["resume_s_max"] == 0.2
    assert out["torchrun"]["steps_lost_max"] == 4
    assert out["seamguard_vs"]["torchrun"] == {"lost_s_ratio_of_medians": pytest.approx(0.03),
                                               "lost_s_median_difference_s": pytest.approx(-9.7),
                                               "resume_s_ratio_of_medians": pytest.approx(0.045),
                                               "steps_lost_median_difference": pytest.approx(-2.0)}
    assert out["seamguard_vs"]["torchft"]["lost_s_median_difference_s"] == pytest.approx(0.1)


def test_quick_plan_needs_no_probe_run():
    step_s, segment, every, info = ft.quick_plan({"train_cycle_s": 0.2})
    assert (step_s, segment, every) == (pytest.approx(0.1), ft.QUICK_SEGMENT, ft.QUICK_CKPT_EVERY)
    assert "no probe" in info["interval_rule"]
