"""`GET /api/v1/goodput` and the goodput gauges of `/metrics`: live goodput in the service.

One `GoodputService` per app measures every job of the fleet over a window with
seamguard.goodput and renders the `Goodput` records three ways: the API's JSON (per job,
the fleet, the fleet's ETTR per bucket), per-job gauges for `/metrics` (over the trailing
`METRICS_WINDOW_S`, cached for `METRICS_TTL_S` so a scrape never waits on a query), and
what the dashboard draws from the API. Inputs: the job series from Prometheus range
queries when the service runs against a live source at real time (its config's
``prometheus:``), else from the signal ring (the ticks in memory); the ledger through the
service's reader, bounded by the snapshot's tick. Slurm's accounting is the CLI's
(`seamguard goodput --slurm`): here a job's wall time is the time it reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Annotated

import numpy as np
from fastapi import APIRouter, HTTPException, Query
from prometheus_client.core import GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field

from seamguard.app.service import timerange
from seamguard.goodput import CAUSES, LOST_CAUSES, Goodput, JobSeries, ettr_over_time, fleet
from seamguard.goodput.evidence import goodput_of, job_entities
from seamguard.goodput.sources import SourceError, read_ledger, read_series

METRICS_WINDOW_S = 3600.0
METRICS_TTL_S = 60.0
LEDGER_LOOKBACK_S = 86400.0
MAX_POINTS = 2000  # samples per job series in one request: the step grows with the window


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GoodputSpanOut(_M):
    start_s: float
    end_s: float
    seconds: float
    cause: str
    entity: str
    seam: str
    why: str


class GoodputJobOut(_M):
    job: str
    since_s: float
    until_s: float
    wall_s: float = Field(description="the job's wall time in the window: from when it first reported to when "
                                      "it last did")
    ettr: float | None = Field(description="productive seconds / wall seconds")
    by_cause_s: dict[str, float] = Field(description="seconds per cause; they add up to wall_s")
    steps_new: int
    steps_redone: int
    step_clean_s: float | None
    notes: list[str]
    spans: list[GoodputSpanOut] | None = None


class GoodputBucketOut(_M):
    t0_s: float
    t1_s: float
    wall_s: float
    ettr: float | None
    by_cause_s: dict[str, float]


class GoodputOut(_M):
    source: str = Field(description="where the job series came from: prometheus (range queries) or ring "
                                    "(the ticks the service holds in memory)")
    since_s: float
    until_s: float
    causes: list[str]
    jobs: list[GoodputJobOut]
    fleet: GoodputJobOut
    ettr_over_time: list[GoodputBucketOut]


class GoodputService:
    """Measures the fleet's jobs for the API and `/metrics` (one per app)."""

    def __init__(self, runner, reader) -> None:
        self.runner = runner
        self.reader = reader
        cfg = getattr(runner.source, "cfg", None)
        self._prom_cfg = getattr(cfg, "prometheus", None) if getattr(cfg, "time_scale", 1.0) == 1.0 else None
        self._prom = None
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Goodput]] | None = None  # (monotonic s, reports), swapped whole
        self._refreshing: threading.Thread | None = None

    @property
    def source(self) -> str:
        return "prometheus" if self._prom_cfg is not None else "ring"

    def _series(self, fleet_, jobs: list[str], since_s: float, until_s: float, upto: int) -> dict[str, JobSeries]:
        if self._prom_cfg is not None:
            from seamguard.observe.prometheus import PrometheusSource

            with self._lock:
                if self._prom is None:
                    self._prom = PrometheusSource(fleet_, self._prom_cfg)
            step = max(float(self.runner.tick_s), (until_s - since_s) / MAX_POINTS)
            return read_series(self._prom, jobs, since_s - 60 * step, until_s, step)
        cols = np.array([fleet_.job_names.index(j) for j in jobs], dtype=np.int64)
        t, step = self.runner.ring.matrix("seamguard_job_step", cols, upto)
        _, step_s = self.runner.ring.matrix("seamguard_job_step_seconds", cols, upto)
        keep = t <= until_s
        out = {}
        for k, j in enumerate(jobs):
            ss = step_s[keep, k] if step_s.shape[0] == t.shape[0] else None
            out[j] = JobSeries.of(t[keep], step[keep, k] if step.size else np.full(int(keep.sum()), np.nan), ss)
        return out

    def measure(self, since_s: float, until_s: float, jobs: list[str] | None = None) -> list[Goodput]:
        s = self.runner.snapshot()
        fl = s.fleet
        names = list(fl.job_names) if jobs is None else jobs
        series = self._series(fl, names, since_s, until_s, s.ring_upto)
        rows = read_ledger(_Upto(self.reader, s.tick), since_s - LEDGER_LOOKBACK_S, until_s, onsets_from_s=since_s)
        return [goodput_of(j, since_s, until_s, series[j], (), *rows, job_entities(fl, j)) for j in names]

    def trailing(self) -> list[Goodput]:
        """Every job over the last `METRICS_WINDOW_S` of controller time, at most `METRICS_TTL_S` old.

        From the ring it is computed in place (memory only); from Prometheus a scrape never
        waits on the queries: it gets the last result while a background thread refreshes it."""
        cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < METRICS_TTL_S:
            return cached[1]
        if self._prom_cfg is None:
            self._refresh()
        elif self._lock.acquire(blocking=False):
            try:
                if self._refreshing is None or not self._refreshing.is_alive():
                    self._refreshing = threading.Thread(target=self._refresh, name="goodput-metrics", daemon=True)
                    self._refreshing.start()
            finally:
                self._lock.release()
        return self._cached[1] if self._cached is not None else []

    def _refresh(self) -> None:
        t1 = self.runner.snapshot().t_s
        try:
            reports = self.measure(t1 - METRICS_WINDOW_S, t1)
        except SourceError:
            reports = self._cached[1] if self._cached is not None else []
        self._cached = (time.monotonic(), reports)

    def close(self) -> None:
        if self._prom is not None:
            self._prom.close()


class _Upto:
    """The ledger reader bounded to a snapshot's tick (a response never outruns its snapshot)."""

    def __init__(self, reader, tick: int) -> None:
        self._r, self._tick = reader, tick

    def transitions(self, **kw):
        return self._r.transitions(upto_tick=self._tick, **kw)

    def actions(self, **kw):
        return self._r.actions(upto_tick=self._tick, **kw)

    def fleet_series(self, *a):  # persisted per tick as it happened: nothing newer than the transitions read
        return self._r.fleet_series(*a)

    def entity_series(self, *a):
        return self._r.entity_series(*a)


def _job_out(g: Goodput, spans: bool) -> GoodputJobOut:
    return GoodputJobOut(**g.to_dict(spans=spans))


def router(svc: GoodputService, prefix: str) -> APIRouter:
    r = APIRouter()

    @r.get(f"{prefix}/goodput", response_model=GoodputOut, tags=["jobs"],
           responses={400: {"description": "since/until not a time in seconds, or not in order; unknown job"},
                      502: {"description": "Prometheus or the ledger could not be read"}})
    def goodput(since: Annotated[str | None, Query(description="window start, controller seconds (default: "
                                                               "an hour before until)")] = None,
                until: Annotated[str | None, Query(description="window end (default: the snapshot's time)")] = None,
                job: Annotated[list[str] | None, Query(max_length=256, description="only these jobs")] = None,
                buckets: Annotated[int, Query(ge=1, le=500, description="points of the fleet's ETTR")] = 48,
                spans: Annotated[bool, Query(description="each job's spans (cause, entity, seam, why)")] = False,
                ) -> GoodputOut:
        try:
            rng = timerange.parse(since, until)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        t1 = rng.until_t_s if rng.until_t_s is not None else svc.runner.snapshot().t_s
        t0 = rng.since_t_s if rng.since_t_s is not None else t1 - 3600.0
        if not t0 < t1:
            raise HTTPException(400, f"since ({t0:g}) must be before until ({t1:g})")
        known = set(svc.runner.snapshot().fleet.job_names)
        unknown = [j for j in job or [] if j not in known]
        if unknown:
            raise HTTPException(400, f"job {unknown[0]!r} is not in the topology")
        try:
            reports = svc.measure(t0, t1, job)
        except SourceError as e:
            raise HTTPException(502, str(e)) from None
        edges = np.linspace(t0, t1, buckets + 1)
        return GoodputOut(source=svc.source, since_s=t0, until_s=t1, causes=list(CAUSES),
                          jobs=[_job_out(g, spans) for g in reports], fleet=_job_out(fleet(reports, t0, t1), False),
                          ettr_over_time=[GoodputBucketOut(**b) for b in ettr_over_time(reports, edges)])

    return r


class GoodputCollector:
    """Per-job ETTR and lost seconds by cause over the trailing hour, for `/metrics`."""

    def __init__(self, svc: GoodputService) -> None:
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        reports = self.svc.trailing()
        ratio = GaugeMetricFamily("seamguard_goodput_ratio", "ETTR of the job over the last hour: productive "
                                  "seconds / wall seconds", labels=["job_name"])
        lost = GaugeMetricFamily("seamguard_goodput_lost_seconds", "Seconds of the job's last hour lost, by cause",
                                 labels=["job_name", "cause"])
        wall = GaugeMetricFamily("seamguard_goodput_wall_seconds", "The job's wall time in the last hour",
                                 labels=["job_name"])
        for g in reports:
            wall.add_metric([g.job], g.wall_s)
            if g.ettr is not None:
                ratio.add_metric([g.job], g.ettr)
            for c in LOST_CAUSES:
                lost.add_metric([g.job, c], g.by_cause_s[c])
        f = fleet(reports, 0, 1)
        yield ratio
        yield lost
        yield wall
        if f.ettr is not None:
            yield GaugeMetricFamily("seamguard_goodput_fleet_ratio", "ETTR of all jobs together over the last "
                                    "hour (job-seconds)", value=f.ettr)
