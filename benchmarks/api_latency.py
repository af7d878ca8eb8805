"""API latency at fleet scale: fleet summary and entity list, over real loopback HTTP.

Serves a 100k-GPU twin (controller ticking on its wall-clock schedule in the same
process, as `seamguard serve` does) and measures p50/p99 of the fleet summary and the
entity list with a bounded number of requests and a time cap per query. Beside it, in
the same run, on the same server and interleaved request by request (the order
alternating): the baseline a user would write — a plain FastAPI handler over the same
numpy snapshot that counts states with ``np.bincount``, filters with ``np.isin``, sorts
with ``np.argsort`` and builds dict rows only for the page it returns (no response
models) — and the controller's own tick time.

    python benchmarks/api_latency.py --quick   # about a minute
    python benchmarks/api_latency.py           # more requests

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


def add_baseline_routes(app, runner: Runner) -> None:
    """The baseline: vectorized handlers on the same snapshot, plain dicts out."""
    from fastapi import Query

    def baseline_summary() -> dict:
        s = runner.snapshot()
        out = {}
        for k in ENTITY_KINDS:
            counts = np.bincount(s.kinds[k].state, minlength=len(STATES))
            out[k.label] = dict(zip(STATES, counts.tolist()))
        return {"tick": s.tick, "t_s": s.t_s, "states": out}

    def baseline_entities(kind: str = "gpu", state: list[str] | None = Query(None), sort: str | None = None,
                          limit: int = 100, offset: int = 0) -> dict:
        s = runner.snapshot()
        v = s.kinds[Kind[kind.upper()]]
        idx = np.arange(v.count)
        if state:
            idx = idx[np.isin(v.state, [STATES.index(x) for x in state])]
        if sort == "gfs" and idx.size:
            idx = idx[np.argsort(-np.nan_to_num(v.gfs[idx]), kind="stable")]
        page = idx[offset:offset + limit]
        loops = s.fleet.loop_names
        items = [{"kind": kind, "name": v.names[i], "state": STATES[int(v.state[i])], "gfs": float(v.gfs[i]),
                  "prs": float(v.prs[i]), "fae": float(v.fae[i]),
                  "loop": loops[int(v.loop[i])] if v.loop[i] >= 0 else None} for i in page.tolist()]
        return {"total": int(idx.size), "limit": limit, "offset": offset, "items": items}

    app.add_api_route("/baseline/summary", baseline_summary, methods=["GET"])
    app.add_api_route("/baseline/entities", baseline_entities, methods=["GET"])
    # Routes added after the dashboard mount still resolve: the mount only matches /static.


def measure_interleaved(client: httpx.Client, ours, base, n: int, cap_s: float) -> tuple[list[float], list[float]]:
    """n requests of each, alternating which goes first, until the time cap."""
    a: list[float] = []
    b: list[float] = []
    t_end = time.monotonic() + cap_s
    for i in range(n):
        if time.monotonic() > t_end:
            break
        first, second = ((ours, a), (base, b)) if i % 2 == 0 else ((base, b), (ours, a))
        for make_url, out in (first, second):
            out.extend(measure(client, make_url, 1, cap_s, i))
    return a, b


def measure(client: httpx.Client, make_url, n: int, cap_s: float, first: int = 0) -> list[float]:
    out: list[float] = []
    t_end = time.monotonic() + cap_s
    for i in range(first, first + n):
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
    n_pairs, cap = (200, 20.0) if args.quick else (1000, 60.0)

    t0 = time.perf_counter()
    src = TwinSource(args.gpus, minutes=30.0, seed=args.seed, counterfactual=False)
    runner = Runner(src, speed=args.speed)
    # Into the fault scenario so some entities are gray: 40 ticks = 200 simulated seconds.
    warm = 40 if not args.quick else 25
    runner.advance(warm)
    build_s = time.perf_counter() - t0
    runner.start()
    server = Server(runner, "bench-token")
    add_baseline_routes(server.app, runner)
    server.start()
    n_gpu = runner.snapshot().fleet.count(Kind.GPU)
    print(f"api_latency: {n_gpu} GPUs, twin warmed {warm} ticks in {build_s:.1f} s; controller ticking every "
          f"{runner.tick_interval_s:.1f} s wall during the measurement", file=sys.stderr)
    bad = "&".join(f"state={s}" for s in STATES[1:])
    rnd = random.Random(args.seed)
    offsets = [rnd.randrange(0, n_gpu - 100) for _ in range(n_pairs + 1)]
    queries = {
        "summary": (lambda i: "/api/v1/summary", lambda i: "/baseline/summary"),
        # the same random page for both sides of a pair
        "entities_page": (lambda i: f"/api/v1/entities?kind=gpu&limit=100&offset={offsets[i]}",
                          lambda i: f"/baseline/entities?kind=gpu&limit=100&offset={offsets[i]}"),
        "entities_gray": (lambda i: f"/api/v1/entities?kind=gpu&{bad}&sort=gfs&limit=100",
                          lambda i: f"/baseline/entities?kind=gpu&{bad}&sort=gfs&limit=100"),
    }
    results: dict[str, dict] = {}
    ticks_before = runner.snapshot().counters.ticks
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        for name, (ours, base) in queries.items():
            for u in (ours(0), base(0)):
                c.get(u)  # warm
            a, b = measure_interleaved(c, ours, base, n_pairs, cap)
            results[name] = {"n": len(a), "p50_ms": pct(a, 50), "p99_ms": pct(a, 99),
                             "p25_ms": pct(a, 25), "p75_ms": pct(a, 75),
                             "baseline_n": len(b), "baseline_p50_ms": pct(b, 50), "baseline_p99_ms": pct(b, 99),
                             "baseline_p25_ms": pct(b, 25), "baseline_p75_ms": pct(b, 75),
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
              f"{r['baseline_p50_ms']:9.2f} {r['baseline_p99_ms']:9.2f} {r['ratio_p50']:6.2f}x")
    print("(interleaved request by request; baseline: vectorized numpy handler on the same snapshot, plain dicts)")
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
        "summary_iqr_ms": [round(results["summary"]["p25_ms"], 3), round(results["summary"]["p75_ms"], 3)],
        "entities_iqr_ms": [round(results["entities_page"]["p25_ms"], 3), round(results["entities_page"]["p75_ms"], 3)],
        "baseline": "vectorized numpy handler on the same snapshot, interleaved",
        "baseline_summary_p50_ms": round(results["summary"]["baseline_p50_ms"], 3),
        "baseline_summary_iqr_ms": [round(results["summary"]["baseline_p25_ms"], 3),
                                    round(results["summary"]["baseline_p75_ms"], 3)],
        "baseline_entities_p50_ms": round(results["entities_page"]["baseline_p50_ms"], 3),
        "baseline_entities_iqr_ms": [round(results["entities_page"]["baseline_p25_ms"], 3),
                                     round(results["entities_page"]["baseline_p75_ms"], 3)],
        "baseline_entities_gray_p50_ms": round(results["entities_gray"]["baseline_p50_ms"], 3),
        "ratio_summary_p50": round(results["summary"]["ratio_p50"], 2),
        "ratio_entities_p50": round(results["entities_page"]["ratio_p50"], 2),
        "ratio_entities_gray_p50": round(results["entities_gray"]["ratio_p50"], 2),
        "quick": args.quick,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
