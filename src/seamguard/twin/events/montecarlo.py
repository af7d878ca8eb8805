"""Monte-Carlo runs of the event twin, their confidence intervals, and where they run.

Why this file exists: one run is one draw; operators need a mean with an interval. Runs
are independent, so they are farmed out to an executor: in-process (default, and what
tests use), a local ``ProcessPoolExecutor``, or Ray when the optional ``ray`` extra is
installed (``pip install seamguard[ray]``) for sweeps larger than one machine. Seeds are
spawned from one ``SeedSequence``: run *i* gets the same child seed under every policy
(common random numbers), and the same master seed reproduces every run exactly,
whichever executor ran it.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from seamguard.twin.events.config import ClusterConfig, PolicyParams
from seamguard.twin.events.simulator import RunResult, simulate_run

__all__ = ["Summary", "run_monte_carlo", "summarise", "mean_ci95", "share_ci95", "SHARES",
           "ray_available", "EXECUTORS"]

EXECUTORS = ("local", "process", "ray")

# Two-sided 97.5% Student-t quantiles for small run counts (df = runs - 1).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365,
         8: 2.306, 9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def _t975(df: int) -> float:
    if df <= 0:
        return math.nan
    keys = [k for k in _T975 if k <= df]
    return _T975[max(keys)] if df <= 30 else 1.96


def mean_ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and Student-t 95% interval of independent run values."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size == 1:
        return m, m, m
    h = _t975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, m - h, m + h


#: Run fields that are shares bounded to [0, 1]; their interval must stay in range.
SHARES = frozenset({"ettr", "goodput", "ettr_largest_job", "schedule_slip_fraction",
                    "release_critical_slipped"})


def share_ci95(values: Sequence[float], resamples: int = 4000
               ) -> tuple[float, float, float]:
    """Mean and 95% percentile-bootstrap interval of a share in [0, 1].

    A Student-t interval on few runs (12.7 standard errors at two runs) can leave [0, 1]
    (an ETTR above 1); the bootstrap interval of the mean lies between the smallest and
    largest run by construction, so it stays in range. Fixed resampling seed: the same
    runs always give the same interval. Clipped to [0, 1] as a last guard.
    """
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size == 1:
        return m, m, m
    idx = np.random.default_rng(0).integers(0, x.size, size=(resamples, x.size))
    lo, hi = np.quantile(x[idx].mean(axis=1), [0.025, 0.975])
    lo, hi = min(float(lo), m), max(float(hi), m)
    return m, min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)


@dataclass(frozen=True)
class Summary:
    """Monte-Carlo summary of one policy on one cluster."""

    policy: str
    """Policy name."""
    runs: tuple[RunResult, ...]
    """Every run, in seed order."""

    def metric(self, name: str) -> tuple[float, float, float]:
        """Mean and 95% CI of a scalar RunResult field (bootstrap, in [0, 1], for shares)."""
        values = [float(getattr(r, name)) for r in self.runs]
        return share_ci95(values) if name in SHARES else mean_ci95(values)

    def mean_dict(self, name: str) -> dict[str, float]:
        """Per-key mean over runs of a dict-valued field (missing keys count as 0)."""
        keys = sorted({k for r in self.runs for k in getattr(r, name)})
        n = len(self.runs)
        return {k: sum(getattr(r, name).get(k, 0) for r in self.runs) / n for k in keys}

    def to_json(self) -> dict:
        """The ``--json`` object of one policy."""
        r0 = self.runs[0]
        out: dict = {"policy": self.policy, "gpus": r0.gpus, "days": r0.days,
                     "runs": len(self.runs)}
        for name in ("ettr", "goodput", "ettr_largest_job", "interruptions",
                     "planned_interruptions", "failure_amplification",
                     "rollback_lost_gpu_hours", "rollback_exposure_min",
                     "schedule_slip_fraction", "checkpoint_interval_min", "quarantines",
                     "false_positive_quarantines", "precursor_prevented"):
            m, lo, hi = self.metric(name)
            out[name] = m
            # one run is one draw: no interval to give
            out[name + "_ci95"] = [lo, hi] if len(self.runs) > 1 else "n/a"
        out["schedule_slip_probability"] = out.pop("schedule_slip_fraction")
        out["schedule_slip_probability_ci95"] = out.pop("schedule_slip_fraction_ci95")
        out["release_critical_slip_probability"] = self.metric("release_critical_slipped")[0]
        out["interruptions_by_cause"] = self.mean_dict("interruptions_by_cause")
        out["gpu_hours_lost_by_cause"] = self.mean_dict("gpu_hours_lost_by_cause")
        hours = r0.days * 24.0
        li = self.metric("largest_job_interruptions")[0]
        out["mttf_hours"] = hours / li if li > 0 else math.inf
        out["largest_job_nodes"] = r0.largest_job_nodes
        out["checkpoint_mode"] = r0.checkpoint_mode
        out["events_per_run"] = self.metric("events")[0]
        out["wall_s_per_run"] = self.metric("wall_s")[0]
        return out


def _one(args: tuple[ClusterConfig, PolicyParams, np.random.SeedSequence]) -> RunResult:
    return simulate_run(*args)


def ray_available() -> bool:
    """Whether the optional Ray executor can be used."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _map_ray(fn: Callable, items: list) -> list:
    import ray  # optional extra; imported only when asked for

    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(fn)
    return ray.get([remote.remote(it) for it in items])


def run_monte_carlo(cfg: ClusterConfig, policies: Sequence[PolicyParams], runs: int,
                    seed: int, executor: str = "local",
                    workers: int | None = None) -> list[Summary]:
    """Run ``runs`` seeds of every policy; run *i* shares its streams across policies."""
    if runs < 1:
        raise ValueError(f"--runs must be >= 1, got {runs}")
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    if executor not in EXECUTORS:
        raise ValueError(f"--executor must be one of {EXECUTORS}, got {executor!r}")
    children = np.random.SeedSequence(seed).spawn(runs)
    items = [(cfg, pp, ch) for pp in policies for ch in children]
    if executor == "ray":
        if not ray_available():
            raise ValueError("--executor ray needs the optional extra: pip install 'seamguard[ray]'")
        results = _map_ray(_one, items)
    elif executor == "process" and len(items) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_one, items))
    else:
        results = [_one(it) for it in items]
    return [Summary(pp.name, tuple(results[i * runs:(i + 1) * runs]))
            for i, pp in enumerate(policies)]


def summarise(summaries: Sequence[Summary], measured_source: str,
              extra: dict | None = None) -> dict:
    """The CLI's JSON document for one or several policies."""
    if len(summaries) == 1:
        doc = summaries[0].to_json()
    else:
        doc = {s.policy: s.to_json() for s in summaries}
        by = {s.policy: s.metric("ettr")[0] for s in summaries}
        if "seamguard" in by:
            gains = {p: by["seamguard"] - v for p, v in by.items() if p != "seamguard"}
            if gains:
                doc["ettr_gain_vs"] = gains
                doc["ettr_gain"] = min(gains.values())   # over the strongest baseline run
    doc["measured_source"] = measured_source
    if extra:
        doc.update(extra)
    return doc
