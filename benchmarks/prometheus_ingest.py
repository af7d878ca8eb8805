"""Ingest one tick of a large fleet from a real Prometheus: query + parse + frame build.

Backfills a TSDB with a few twin frames of the fleet (promtool, OpenMetrics), starts a
real Prometheus on it, then times, at the same evaluation time:
  * seamguard: PrometheusSource.frame_at (concurrent instant queries, label tuples
    cached to entity indices, numpy fill), with the share of query / parse / build;
  * baseline: what a user would otherwise write — one instant query per metric in turn
    (prometheus-api-client's custom_query shape), response.json(), then a per-series
    loop that formats the entity name and looks it up (fleet.index_of) into a list.
Both send the same request headers (``PromConfig.headers()``: the same Accept-Encoding,
identity by default, gzip with ``--encoding gzip``), so neither pays a decompression the
other does not. Repetitions are interleaved (seamguard, baseline, then baseline,
seamguard, ...) so drift on a shared machine hits both alike; the report gives medians,
min-max spread and the ratio of medians with the spread of the per-pair ratios. Both
produce the same arrays (checked). Last line: one JSON object.

    python benchmarks/prometheus_ingest.py [--gpus 10000] [--repeat 7] [--quick] [--encoding gzip]
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


def naive_tick(url: str, fleet, queries: dict[str, str], t: float,
               headers: dict[str, str]) -> dict[str, np.ndarray]:
    out = {}
    with httpx.Client(timeout=60, headers=headers) as client:
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


def spread(xs: list[float]) -> dict[str, float]:
    """Median and min-max of repeated timings."""
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
            "max": round(max(xs), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (about a minute in all)")
    ap.add_argument("--concurrency", type=int, default=2, help="queries in flight (seamguard path)")
    ap.add_argument("--encoding", choices=("identity", "gzip"), default="identity",
                    help="Accept-Encoding of both sides (identity: no compression on loopback)")
    args = ap.parse_args()
    repeat = 3 if args.quick else args.repeat

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
            cfg = PromConfig(url=prom.url, timeout_s=60, max_concurrency=args.concurrency,
                             compression=args.encoding == "gzip")
            headers = cfg.headers()   # the very same request headers on both sides
            ours, base_s, shares, series = [], [], [], 0
            with PrometheusSource(fleet, cfg) as src:
                queries = src.queries

                def run_ours():
                    nonlocal series
                    w = time.perf_counter()
                    f = src.frame_at(t_eval)
                    ours.append(time.perf_counter() - w)
                    tm = src.timing
                    tot = tm.query_s + tm.parse_s + tm.build_s
                    shares.append((tm.query_s / tot, tm.parse_s / tot, tm.build_s / tot))
                    series = tm.series
                    return f

                def run_base():
                    w = time.perf_counter()
                    r = naive_tick(prom.url, fleet, queries, t_eval, headers)
                    base_s.append(time.perf_counter() - w)
                    return r

                src.frame_at(t_eval)  # warm: connections, Prometheus' caches, our label cache
                naive_tick(prom.url, fleet, queries, t_eval, headers)  # warm
                for k in range(repeat):   # interleaved, order alternating (ABBA)
                    if k % 2 == 0:
                        frame = run_ours()
                        ref = run_base()
                    else:
                        ref = run_base()
                        frame = run_ours()
    for sig, arr in ref.items():
        got = frame.values.get(sig)
        assert got is not None and np.allclose(arr, got, equal_nan=True), f"results differ for {sig}"
    ingest, naive = statistics.median(ours), statistics.median(base_s)
    pair = [b / a for a, b in zip(ours, base_s)]
    q, p, b = (statistics.median(x[i] for x in shares) for i in range(3))
    print(f"fleet: {fleet.count(Kind.GPU)} GPUs, {fleet.count(Kind.NIC)} NICs, {series} series per tick; "
          f"backfill {backfill_s:.1f}s; Accept-Encoding {headers.get('Accept-Encoding', 'httpx default')} "
          f"both sides; {repeat} interleaved repetitions", file=sys.stderr)
    print(f"seamguard ingest: median {ingest:.3f}s [{min(ours):.3f}, {max(ours):.3f}] "
          f"(query {q:.0%}, parse {p:.0%}, build {b:.0%})", file=sys.stderr)
    print(f"baseline (sequential per-metric queries, per-series name lookup): median {naive:.3f}s "
          f"[{min(base_s):.3f}, {max(base_s):.3f}]; ratio of medians {naive / ingest:.2f}x, "
          f"per-pair ratios [{min(pair):.2f}, {max(pair):.2f}]", file=sys.stderr)
    print(json.dumps({"gpus": fleet.count(Kind.GPU), "series": series, "repeat": repeat,
                      "interleaved": True, "accept_encoding": headers.get("Accept-Encoding", "httpx default"),
                      "ingest_s": spread(ours), "baseline_s": spread(base_s),
                      "ratio": round(naive / ingest, 2),
                      "ratio_per_pair": {"median": round(statistics.median(pair), 2),
                                         "min": round(min(pair), 2), "max": round(max(pair), 2)},
                      "query_share": round(q, 3), "parse_share": round(p, 3), "build_share": round(b, 3)}))


if __name__ == "__main__":
    main()
