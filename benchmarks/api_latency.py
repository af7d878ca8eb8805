"""API latency at fleet scale: fleet summary and entity list, over real loopback HTTP.

Serves a 100k-GPU twin (controller ticking on its wall-clock schedule in the same
process, as `seamguard serve` does) and measures p50/p99 of the fleet summary and the
entity list with a bounded number of requests and a time cap per query. Beside it, in
the same run and on the same server: the baseline a user would otherwise write — a
handler that builds a JSON row per entity from the same snapshot and then filters,
counts and pages in Python — and the controller's own tick time.

    PYTHONPATH=src python benchmarks/api_latency.py --quick   # about a minute
    PYTHONPATH=src python benchmarks/api_latency.py           # more requests

The last line printed is one JSON object (p50_ms, p99_ms, tick_s, ...).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import httpx
import numpy as np

from seamguard.assess.states import State
from seamguard.fleet.model import Kind
from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.snapshot import ENTITY_KINDS
from seamguard.app.sources import TwinSource

STATES = [s.label for s in State]


def add_naive_routes(app, runner: Runner) -> None:
    """The per-entity baseline: one dict per entity, then filter/count/page in Python."""

    def rows(kind: Kind) -> list[dict]:
        s = runner.snapshot()
        v = s.kinds[kind]
        f = s.fleet
        return [{"kind": kind.label, "name": v.names[i], "state": STATES[int(v.state[i])], "gfs": float(v.gfs[i]),
                 "prs": float(v.prs[i]), "fae": float(v.fae[i]),
                 "loop": f.loop_names[int(v.loop[i])] if v.loop[i] >= 0 else None} for i in range(v.count)]

    def naive_summary() -> dict:
        out: dict[str, dict[str, int]] = {}
        for k in ENTITY_KINDS:
            counts = dict.fromkeys(STATES, 0)
            for r in rows(k):
                counts[r["state"]] += 1
            out[k.label] = counts
        return out

    def naive_entities(kind: str = "gpu", state: list[str] | None = None, limit: int = 100, offset: int = 0) -> dict:
        all_rows = rows(Kind[kind.upper()])
        if state:
            all_rows = [r for r in all_rows if r["state"] in state]
        return {"total": len(all_rows), "items": all_rows[offset:offset + limit]}

    from fastapi import Query
    app.add_api_route("/naive/summary", naive_summary, methods=["GET"])

    def naive_entities_route(kind: str = "gpu", state: list[str] | None = Query(None), limit: int = 100,
                             offset: int = 0) -> dict:
        return naive_entities(kind, state, limit, offset)
    app.add_api_route("/naive/entities", naive_entities_route, methods=["GET"])
    # Routes added after the dashboard mount still resolve: the mount only matches /static.


def measure(client: httpx.Client, make_url, n: int, cap_s: float) -> list[float]:
    out: list[float] = []
    t_end = time.monotonic() + cap_s
    for i in range(n):
        if time.monotonic() > t_end:
            break
        url = make_url(i)
        t0 = time.perf_counter()
        r = client.get(url)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            raise SystemExit(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
        out.append(dt * 1000.0)
    return out


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="fewer requests (about a minute in all)")
    ap.add_argument("--speed", type=float, default=2.5, help="twin speed: a 5 s tick every 5/speed wall seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_ours, n_naive, cap = (200, 15, 15.0) if args.quick else (1000, 50, 60.0)

    t0 = time.perf_counter()
    src = TwinSource(args.gpus, minutes=30.0, seed=args.seed, counterfactual=False)
    runner = Runner(src, speed=args.speed)
    # Into the fault scenario so some entities are gray: 40 ticks = 200 simulated seconds.
    warm = 40 if not args.quick else 25
    runner.advance(warm)
    build_s = time.perf_counter() - t0
    runner.start()
    server = Server(runner, "bench-token")
    add_naive_routes(server.app, runner)
    server.start()
    n_gpu = runner.snapshot().fleet.count(Kind.GPU)
    print(f"api_latency: {n_gpu} GPUs, twin warmed {warm} ticks in {build_s:.1f} s; controller ticking every "
          f"{runner.tick_interval_s:.1f} s wall during the measurement", file=sys.stderr)
    bad = "&".join(f"state={s}" for s in STATES[1:])
    rnd = random.Random(args.seed)
    queries = {
        "summary": (lambda i: "/api/v1/summary", lambda i: "/naive/summary"),
        "entities_page": (lambda i: f"/api/v1/entities?kind=gpu&limit=100&offset={rnd.randrange(0, n_gpu - 100)}",
                          lambda i: f"/naive/entities?kind=gpu&limit=100&offset={rnd.randrange(0, n_gpu - 100)}"),
        "entities_gray": (lambda i: f"/api/v1/entities?kind=gpu&{bad}&sort=gfs&limit=100",
                          lambda i: f"/naive/entities?kind=gpu&{bad}&limit=100"),
    }
    results: dict[str, dict] = {}
    ticks_before = runner.snapshot().counters.ticks
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        for name, (ours, naive) in queries.items():
            for u in (ours(0), naive(0)):
                c.get(u)  # warm
            a = measure(c, ours, n_ours, cap)
            b = measure(c, naive, n_naive, cap)
            results[name] = {"n": len(a), "p50_ms": pct(a, 50), "p99_ms": pct(a, 99),
                             "baseline_n": len(b), "baseline_p50_ms": pct(b, 50), "baseline_p99_ms": pct(b, 99),
                             "ratio_p50": pct(b, 50) / pct(a, 50)}
    snap = runner.snapshot()
    ticks = snap.counters.ticks
    tick_s = snap.counters.tick_seconds_sum / max(ticks, 1)
    server.stop()
    runner.stop()

    print(f"{'query':16} {'n':>5} {'p50 ms':>9} {'p99 ms':>9}   {'baseline n':>10} {'p50 ms':>9} {'p99 ms':>9} "
          f"{'ratio':>7}")
    for name, r in results.items():
        print(f"{name:16} {r['n']:5d} {r['p50_ms']:9.2f} {r['p99_ms']:9.2f}   {r['baseline_n']:10d} "
              f"{r['baseline_p50_ms']:9.1f} {r['baseline_p99_ms']:9.1f} {r['ratio_p50']:6.0f}x")
    print(f"controller tick: mean {tick_s * 1000:.0f} ms over {ticks} ticks "
          f"({ticks - ticks_before} during the measurement, same process)")
    all_ours = [results[k] for k in ("summary", "entities_page")]
    out = {
        "gpus": n_gpu,
        "p50_ms": round(max(r["p50_ms"] for r in all_ours), 3),
        "p99_ms": round(max(r["p99_ms"] for r in all_ours), 3),
        "tick_s": round(tick_s, 4),
        "summary_p50_ms": round(results["summary"]["p50_ms"], 3),
        "summary_p99_ms": round(results["summary"]["p99_ms"], 3),
        "entities_p50_ms": round(results["entities_page"]["p50_ms"], 3),
        "entities_p99_ms": round(results["entities_page"]["p99_ms"], 3),
        "entities_gray_p50_ms": round(results["entities_gray"]["p50_ms"], 3),
        "baseline_summary_p50_ms": round(results["summary"]["baseline_p50_ms"], 1),
        "baseline_entities_p50_ms": round(results["entities_page"]["baseline_p50_ms"], 1),
        "ratio_summary_p50": round(results["summary"]["ratio_p50"], 1),
        "ratio_entities_p50": round(results["entities_page"]["ratio_p50"], 1),
        "quick": args.quick,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
