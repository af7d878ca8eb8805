"""Ingest one tick of a large fleet from a real Prometheus: query + parse + frame build.

Backfills a TSDB with a few twin frames of the fleet (promtool, OpenMetrics), starts a
real Prometheus on it, then times, at the same evaluation time:
  * seamguard: PrometheusSource.frame_at (concurrent instant queries, label tuples
    cached to entity indices, numpy fill), with the share of query / parse / build;
  * baseline: what a user would otherwise write — one instant query per metric in turn
    (prometheus-api-client's custom_query shape), response.json(), then a per-series
    loop that formats the entity name and looks it up (fleet.index_of) into a list.
Both produce the same arrays (checked). Last line: one JSON object.

    PYTHONPATH=src python benchmarks/prometheus_ingest.py [--gpus 10000] [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.fleet.model import Kind
from seamguard.observe.exposition import label_strings, render_openmetrics
from seamguard.observe.prometheus import PromConfig, PrometheusSource
from seamguard.observe.signals import REGISTRY
from seamguard.testbed.prom import PrometheusServer, backfill
from seamguard.twin.telemetry import Twin, TwinConfig


def naive_tick(url: str, fleet, queries: dict[str, str], t: float) -> dict[str, np.ndarray]:
    out = {}
    with httpx.Client(timeout=60) as client:
        for sig, q in queries.items():
            data = client.get(f"{url}/api/v1/query", params={"query": q, "time": t}).json()
            kind = REGISTRY[sig].kind
            vals = [np.nan] * fleet.count(kind)
            for s in data["data"]["result"]:
                m = s["metric"]
                if kind == Kind.GPU:
                    name = f"{m.get('Hostname') or m.get('hostname')}/gpu{m['gpu']}"
                elif kind == Kind.NIC:
                    name = f"{m.get('node') or m['instance'].split(':')[0]}/{m['device']}"
                else:
                    name = m.get("job_name" if kind == Kind.JOB else kind.label, "")
                try:
                    vals[fleet.index_of(kind, name)] = float(s["value"][1])
                except KeyError:
                    pass
            out[sig] = np.array(vals)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (about a minute in all)")
    ap.add_argument("--concurrency", type=int, default=2, help="queries in flight (seamguard path)")
    args = ap.parse_args()
    repeat = 2 if args.quick else args.repeat

    fleet = generate_fleet(FleetShape(gpus=args.gpus), seed=0)
    twin = Twin(fleet, [], TwinConfig(tick_s=15.0), 0)
    frames = [twin.step() for _ in range(3)]
    base = float(int(time.time() // 60 * 60) - 3 * 3600)
    with tempfile.TemporaryDirectory() as d:
        wd = Path(d)
        t0 = time.perf_counter()
        backfill(render_openmetrics([(base + f.t_s, f) for f in frames], label_strings(fleet)), wd / "tsdb")
        backfill_s = time.perf_counter() - t0
        with PrometheusServer(wd / "prom", tsdb_dir=wd / "tsdb") as prom:
            t_eval = base + frames[-1].t_s
            cfg = PromConfig(url=prom.url, timeout_s=60, max_concurrency=args.concurrency)
            ours, shares, series = [], [], 0
            with PrometheusSource(fleet, cfg) as src:
                src.frame_at(t_eval)  # warm: connections, Prometheus' caches, our label cache
                for _ in range(repeat):
                    w = time.perf_counter()
                    frame = src.frame_at(t_eval)
                    ours.append(time.perf_counter() - w)
                    tm = src.timing
                    tot = tm.query_s + tm.parse_s + tm.build_s
                    shares.append((tm.query_s / tot, tm.parse_s / tot, tm.build_s / tot))
                    series = tm.series
                queries = src.queries
            naive_tick(prom.url, fleet, queries, t_eval)  # warm
            base_s = []
            for _ in range(repeat):
                w = time.perf_counter()
                ref = naive_tick(prom.url, fleet, queries, t_eval)
                base_s.append(time.perf_counter() - w)
    for sig, arr in ref.items():
        got = frame.values.get(sig)
        assert got is not None and np.allclose(arr, got, equal_nan=True), f"results differ for {sig}"
    ingest = statistics.median(ours)
    naive = statistics.median(base_s)
    q, p, b = (statistics.median(x[i] for x in shares) for i in range(3))
    print(f"fleet: {fleet.count(Kind.GPU)} GPUs, {fleet.count(Kind.NIC)} NICs, {series} series per tick; "
          f"backfill {backfill_s:.1f}s", file=sys.stderr)
    print(f"seamguard ingest: {ingest:.3f}s (query {q:.0%}, parse {p:.0%}, build {b:.0%})", file=sys.stderr)
    print(f"baseline (sequential per-metric queries, per-series name lookup): {naive:.3f}s; "
          f"ratio {naive / ingest:.2f}x", file=sys.stderr)
    print(json.dumps({"gpus": fleet.count(Kind.GPU), "series": series, "ingest_s": round(ingest, 4),
                      "query_share": round(q, 3), "parse_share": round(p, 3), "build_share": round(b, 3),
                      "baseline_s": round(naive, 4), "ratio": round(naive / ingest, 2), "repeat": repeat}))


if __name__ == "__main__":
    main()
