"""`/metrics`: seamguard's own scores, states, actions and tick latency for Prometheus.

A collector that renders the current Snapshot on each scrape into its own
CollectorRegistry (never the process-global one). Cardinality stays bounded at any
fleet size: counts per kind and state, score histograms per kind, sums of FAE — no
per-entity series, so 100k GPUs cost the same as 2k.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.assess.states import State
from seamguard.app.snapshot import ENTITY_KINDS, TICK_BUCKETS, Snapshot
from seamguard.ledger.series import SeriesWriter

SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0)


def _hist(values: np.ndarray, bounds: tuple[float, ...]) -> tuple[list[tuple[str, float]], float]:
    v = np.nan_to_num(values)
    counts = np.searchsorted(np.sort(v), np.asarray(bounds), side="right")
    buckets = [(repr(b), float(c)) for b, c in zip(bounds, counts)] + [("+Inf", float(v.size))]
    return buckets, float(v.sum())


class SnapshotCollector:
    def __init__(self, get: Callable[[], Snapshot], leading: Callable[[], bool] | None = None) -> None:
        self._get = get
        self._leading = leading

    def collect(self) -> Iterator[Metric]:
        s = self._get()
        if self._leading is not None:
            yield GaugeMetricFamily("seamguard_leader", "1 while this replica acts (it leads, or runs without ha:)",
                                    value=float(self._leading()))
        info = GaugeMetricFamily("seamguard_info", "Which source the controller runs against and its mode",
                                 labels=["source", "mode"])
        info.add_metric([s.source, s.mode], 1.0)
        yield info
        yield GaugeMetricFamily("seamguard_tick", "Controller tick of the published snapshot", value=s.tick)
        yield GaugeMetricFamily("seamguard_controller_time_seconds", "Controller clock at the last tick "
                                "(simulated seconds for the twin)", value=s.t_s)
        yield GaugeMetricFamily("seamguard_enforce", "1 when enforcing, 0 in dry run", value=float(s.mode == "enforce"))

        ent = GaugeMetricFamily("seamguard_entities", "Entities per kind and state", labels=["kind", "state"])
        gfs_h = HistogramMetricFamily("seamguard_gfs", "Gray-failure score distribution per kind", labels=["kind"])
        prs_h = HistogramMetricFamily("seamguard_prs", "Propagation risk distribution per kind", labels=["kind"])
        gfs_max = GaugeMetricFamily("seamguard_gfs_max", "Highest gray-failure score per kind", labels=["kind"])
        fae = GaugeMetricFamily("seamguard_fae_gpu_hours_per_hour",
                                "Failure amplification of non-healthy entities, summed per kind", labels=["kind"])
        for k in ENTITY_KINDS:
            v = s.kinds[k]
            c = np.bincount(v.state, minlength=len(State))
            for st in State:
                ent.add_metric([k.label, st.label], float(c[st]))
            b, total = _hist(v.gfs, SCORE_BUCKETS)
            gfs_h.add_metric([k.label], b, total)
            b, total = _hist(v.prs, SCORE_BUCKETS)
            prs_h.add_metric([k.label], b, total)
            gfs_max.add_metric([k.label], float(np.nan_to_num(v.gfs).max()) if v.count else 0.0)
            fae.add_metric([k.label], float(np.nan_to_num(v.fae[v.state != State.HEALTHY]).sum()))
        yield from (ent, gfs_h, prs_h, gfs_max, fae)

        if s.assessment is not None:
            adm = GaugeMetricFamily("seamguard_admissible_nodes", "Nodes admissible per job class", labels=["job_class"])
            counts = s.assessment.admissible.sum(axis=0)
            for j, col in enumerate(ADMISSIBILITY_COLUMNS):
                adm.add_metric([col], float(counts[j]))
            yield adm

        c = s.counters
        ticks = CounterMetricFamily("seamguard_ticks", "Controller ticks since start")
        ticks.add_metric([], float(c.ticks))
        yield ticks
        errs = CounterMetricFamily("seamguard_tick_errors", "Controller ticks that failed since start")
        errs.add_metric([], float(c.tick_errors))
        yield errs
        th = HistogramMetricFamily("seamguard_tick_duration_seconds", "Wall time of controller ticks")
        th.add_metric([], [(repr(b), float(n)) for b, n in zip(TICK_BUCKETS, c.tick_buckets)] +
                      [("+Inf", float(c.ticks))], c.tick_seconds_sum)
        yield th
        last = GaugeMetricFamily("seamguard_tick_last_seconds", "Wall time of the last controller tick by stage",
                                 labels=["stage"])
        for stage, val in (("assess", s.assess_s), ("decide", s.decide_s), ("act", s.act_s), ("total", s.tick_s)):
            last.add_metric([stage], val)
        yield last
        acts = CounterMetricFamily("seamguard_actions", "Actuator changes since start",
                                   labels=["verb", "op", "status"])
        for verb, op, status, n in c.actions:
            acts.add_metric([verb, op, status], float(n))
        yield acts
        trs = CounterMetricFamily("seamguard_transitions", "State transitions since start",
                                  labels=["kind", "to_state"])
        for kind, st, n in c.transitions:
            trs.add_metric([kind, st], float(n))
        yield trs
        yield GaugeMetricFamily("seamguard_actions_in_effect", "Actions currently held in effect", value=len(s.in_effect))
        yield GaugeMetricFamily("seamguard_pins", "Entities pinned by an operator", value=len(s.pins))
        frozen = GaugeMetricFamily("seamguard_failsafe_frozen", "1 per scope where no new action is taken "
                                   "because its input failed", labels=["scope"])
        for f in s.failsafe:
            frozen.add_metric([f.scope], 1.0)
        yield frozen
        yield GaugeMetricFamily("seamguard_failsafe_frozen_scopes", "Scopes frozen for want of data",
                                value=len(s.failsafe))
        yield GaugeMetricFamily("seamguard_breaker_tripped", "1 when the safety breaker is tripped",
                                value=float(s.breaker.tripped))
        yield GaugeMetricFamily("seamguard_breaker_disrupted_nodes", "Unique nodes disrupted within the breaker window",
                                value=len({n for _, n in s.breaker.drained}))
        if s.progress is not None:
            ut = GaugeMetricFamily("seamguard_useful_throughput_ratio", "Useful work as a share of ideal",
                                   labels=["run"])
            ut.add_metric(["control"], s.progress.useful_with)
            if s.progress.useful_without is not None:
                ut.add_metric(["counterfactual"], s.progress.useful_without)
            yield ut


class SeriesWriterCollector:
    """The dashboard-series writer's own counts (ledger/series.py): a full queue or a failing
    ledger loses history without failing a tick, so operators see it here."""

    def __init__(self, writer: SeriesWriter) -> None:
        self._w = writer

    def collect(self) -> Iterator[Metric]:
        w = self._w
        for name, doc, value in (
                ("seamguard_series_ticks_written", "Ticks of dashboard series written to the ledger", w.written),
                ("seamguard_series_ticks_dropped", "Ticks of dashboard series dropped (the writer's queue was full)",
                 w.dropped),
                ("seamguard_series_write_failures", "Dashboard-series writes that failed (the ledger refused them)",
                 w.failed)):
            yield CounterMetricFamily(name, doc, value=value)


def make_registry(get: Callable[[], Snapshot], leading: Callable[[], bool] | None = None,
                  series: SeriesWriter | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(get, leading))
    if series is not None:
        reg.register(SeriesWriterCollector(series))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
