"""Bulk generation of every stochastic stream of one run, vectorized with numpy.

Why this file exists: at 100k GPUs there are millions of components but only thousands
of events in a month. Each process is a superposition of independent exponential
lifetimes, i.e. a Poisson process with rate ``per-component rate x components``; we draw
its event count and then its event times (uniform order statistics, the same law as
summing exponential gaps) and the struck component uniformly, all in one numpy call per
cause. Cost is linear in events, i.e. in GPUs x days. Streams depend only on the
cluster and the seed, never on the policy, so both policies see the same failures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seamguard.twin.events.calibration import COMPONENTS_PER_NODE
from seamguard.twin.events.config import ClusterConfig

__all__ = ["Streams", "poisson_times", "generate_streams", "empty_streams", "inject_failure"]


@dataclass(frozen=True)
class Streams:
    """Every exogenous event of one run, as aligned arrays sorted by time per stream."""

    fail_t: np.ndarray
    """Hard-failure times (s)."""
    fail_cause: np.ndarray
    """Index into ``FailureModel.causes``."""
    fail_node: np.ndarray
    """First node struck."""
    fail_nnodes: np.ndarray
    """Nodes struck (1, or a ToR switch's 16)."""
    fail_has_precursor: np.ndarray
    """Whether the failure shows pre-failure evidence."""
    fail_lead_s: np.ndarray
    """Lead time of that evidence (s)."""
    planned_t: np.ndarray
    """Planned maintenance times (s)."""
    planned_node: np.ndarray
    """Node taken for maintenance."""
    slow_t: np.ndarray
    """Fail-slow onset times (s)."""
    slow_node: np.ndarray
    """Node slowed."""
    slow_comm: np.ndarray
    """True for communication (link) fail-slows, False for compute."""
    slow_dur_s: np.ndarray
    """Episode durations (s)."""
    slow_sev: np.ndarray
    """Throughput lost by the node while slowed."""
    flap_t: np.ndarray
    """Link flap times (s)."""
    flap_node: np.ndarray
    """Node whose link flapped."""
    cool_t: np.ndarray
    """Cooling-loop degradation onsets (s)."""
    cool_loop: np.ndarray
    """Loop index."""
    cool_dur_s: np.ndarray
    """Degradation durations (s)."""
    cool_trip: np.ndarray
    """Whether the degradation ends in a thermal trip of the loop's nodes."""

    @property
    def n_events(self) -> int:
        """Exogenous events in the run."""
        return int(self.fail_t.size + self.planned_t.size + self.slow_t.size
                   + self.flap_t.size + self.cool_t.size)


def poisson_times(rate_per_unit_day: float, units: float, horizon_s: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Sorted event times of a Poisson process with rate ``rate x units`` per day."""
    mean = rate_per_unit_day * units * horizon_s / 86_400.0
    n = int(rng.poisson(mean)) if mean > 0 else 0
    return np.sort(rng.random(n) * horizon_s)


def generate_streams(cfg: ClusterConfig, rng: np.random.Generator) -> Streams:
    """Draw every stream of one run."""
    fm = cfg.failures
    nodes, horizon = cfg.nodes, cfg.horizon_s
    ts, cs, ns, ks = [], [], [], []
    for ci, cause in enumerate(fm.causes):
        per_node = COMPONENTS_PER_NODE[cause.component]
        n_comp = nodes * per_node
        t = poisson_times(cause.rate_per_component_day, n_comp, horizon, rng)
        comp = rng.integers(0, max(int(round(n_comp)), 1), t.size)
        if per_node >= 1:
            node = comp // int(per_node)
            k = np.ones(t.size, dtype=np.int64)
        else:  # a switch serves 1/per_node nodes
            span = int(round(1.0 / per_node))
            node = np.minimum(comp * span, nodes - 1)
            k = np.minimum(span, nodes - node)
        ts.append(t); cs.append(np.full(t.size, ci)); ns.append(node); ks.append(k)
    fail_t = np.concatenate(ts) if ts else np.zeros(0)
    order = np.argsort(fail_t, kind="stable")
    fail_cause = np.concatenate(cs).astype(np.int64)[order]
    pre_frac = np.array([c.precursor_fraction for c in fm.causes])[fail_cause]
    fail_has_pre = rng.random(order.size) < pre_frac
    fail_lead = rng.exponential(fm.precursor_lead_mean_min * 60.0, order.size)

    planned_t = poisson_times(fm.planned_per_node_day, nodes, horizon, rng)
    planned_node = rng.integers(0, nodes, planned_t.size)

    slow_t = poisson_times(fm.fail_slow_per_node_day, nodes, horizon, rng)
    slow_node = rng.integers(0, nodes, slow_t.size)
    slow_comm = rng.random(slow_t.size) < fm.fail_slow_comm_share
    mean_s = np.where(slow_comm, fm.fail_slow_comm_mean_min, fm.fail_slow_compute_mean_min) * 60
    slow_dur = rng.exponential(1.0, slow_t.size) * mean_s
    lo, hi = fm.fail_slow_severity_range
    slow_sev = rng.uniform(lo, hi, slow_t.size)

    links = nodes * COMPONENTS_PER_NODE["link"]
    flap_t = poisson_times(fm.flap_per_link_day, links, horizon, rng)
    flap_node = rng.integers(0, nodes, flap_t.size)

    loops = max(1, -(-nodes // cfg.nodes_per_loop))
    cool_t = poisson_times(fm.cooling_event_per_loop_day, loops, horizon, rng)
    cool_loop = rng.integers(0, loops, cool_t.size)
    cool_dur = rng.exponential(fm.cooling_event_mean_h * 3600.0, cool_t.size)
    cool_trip = rng.random(cool_t.size) < fm.cooling_trip_probability

    return Streams(
        fail_t=fail_t[order], fail_cause=fail_cause,
        fail_node=np.concatenate(ns).astype(np.int64)[order],
        fail_nnodes=np.concatenate(ks).astype(np.int64)[order],
        fail_has_precursor=fail_has_pre, fail_lead_s=fail_lead,
        planned_t=planned_t, planned_node=planned_node,
        slow_t=slow_t, slow_node=slow_node, slow_comm=slow_comm, slow_dur_s=slow_dur,
        slow_sev=slow_sev, flap_t=flap_t, flap_node=flap_node,
        cool_t=cool_t, cool_loop=cool_loop, cool_dur_s=cool_dur, cool_trip=cool_trip)


def empty_streams() -> Streams:
    """A run with no exogenous events (base for fault injection in tests and demos)."""
    f, i, b = np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    return Streams(fail_t=f, fail_cause=i, fail_node=i, fail_nnodes=i,
                   fail_has_precursor=b, fail_lead_s=f, planned_t=f, planned_node=i,
                   slow_t=f, slow_node=i, slow_comm=b, slow_dur_s=f, slow_sev=f,
                   flap_t=f, flap_node=i, cool_t=f, cool_loop=i, cool_dur_s=f, cool_trip=b)


def inject_failure(s: Streams, t_s: float, cause_index: int, node: int, nnodes: int = 1,
                   precursor_lead_s: float | None = None) -> Streams:
    """Return ``s`` with one more hard failure at ``t_s`` (streams stay time-sorted)."""
    from dataclasses import replace

    t = np.append(s.fail_t, t_s)
    order = np.argsort(t, kind="stable")
    pre = precursor_lead_s is not None
    return replace(
        s, fail_t=t[order],
        fail_cause=np.append(s.fail_cause, cause_index)[order],
        fail_node=np.append(s.fail_node, node)[order],
        fail_nnodes=np.append(s.fail_nnodes, nnodes)[order],
        fail_has_precursor=np.append(s.fail_has_precursor, pre)[order],
        fail_lead_s=np.append(s.fail_lead_s, precursor_lead_s or 0.0)[order])
