"""What the gateway adds per request: latency (p50/p99) and requests/s on one core, beside a direct connection.

The fake OpenAI backend (seamguard.testbed.openai_backend, no model time) and the gateway
each run in their own process, each pinned to one CPU; the gateway does everything it does
in production on every request (key lookup, admission reserve + reconcile in its SQLite
store, zombie observation, routing, usage accounting, metrics). The same client sends the
same requests to the backend directly and through the gateway, interleaved:

- latency: sequential requests on one keep-alive connection, alternating direct/gateway in
  blocks, for whole (non-streamed) and streamed chat completions of 16 tokens;
- throughput: a fixed number of concurrent requests for a fixed time, alternating
  direct/gateway per repetition; median over repetitions, with the spread (min-max).

    PYTHONPATH=src python benchmarks/gateway_overhead.py --quick   # about a minute
    PYTHONPATH=src python benchmarks/gateway_overhead.py

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from seamguard.ports import free_port

KEY = "sk-bench-overhead-0001"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hello " * 20}], "max_tokens": 16}


def serve(kind: str, port: int, config: str | None, cpu: int | None) -> None:
    """The child process: one server on one CPU."""
    import uvicorn

    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    if kind == "backend":
        from seamguard.testbed.openai_backend import FakeBackend

        app = FakeBackend().app()
    else:
        from seamguard.gateway.app import build_gateway, create_app
        from seamguard.gateway.config import load_gateway_config

        app = create_app(build_gateway(load_gateway_config(config)), "bench-admin")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start(kind: str, port: int, config: str | None, cpu: int | None) -> subprocess.Popen:
    args = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    if config:
        args += ["--config", config]
    if cpu is not None:
        args += ["--cpu", str(cpu)]
    p = subprocess.Popen(args)
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1.0, headers={"Authorization": f"Bearer {KEY}"})
            return p
        except httpx.HTTPError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise SystemExit(f"{kind} did not start on port {port}")
            time.sleep(0.1)


def one(c: httpx.Client, base: str, stream: bool) -> float:
    t0 = time.perf_counter()
    if stream:
        with c.stream("POST", base + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            for _ in r.iter_bytes():
                pass
            ok = r.status_code == 200
    else:
        r = c.post(base + "/v1/chat/completions", json=BODY)
        ok = r.status_code == 200
    dt = time.perf_counter() - t0
    if not ok:
        raise SystemExit(f"{base}: HTTP {r.status_code}")
    return dt * 1000.0


def latency(direct: str, gw: str, n: int, block: int, stream: bool) -> tuple[list[float], list[float]]:
    a: list[float] = []
    b: list[float] = []
    with httpx.Client(timeout=30.0, headers={"Authorization": f"Bearer {KEY}"}) as c:
        for base in (direct, gw):
            for _ in range(20):
                one(c, base, stream)  # warm connections and code paths
        for i in range(0, n, block):
            order = ((direct, a), (gw, b)) if (i // block) % 2 == 0 else ((gw, b), (direct, a))
            for base, out in order:
                out.extend(one(c, base, stream) for _ in range(block))
    return a, b


async def _load(base: str, concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30.0, limits=limits, headers={"Authorization": f"Bearer {KEY}"}) as c:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                r = await c.post(base + "/v1/chat/completions", json=BODY)
                if r.status_code != 200:
                    raise SystemExit(f"{base}: HTTP {r.status_code}: {r.text[:200]}")
                done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def spread(xs: list[float]) -> list[float]:
    return [round(min(xs), 1), round(max(xs), 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--serve", choices=["backend", "gateway"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.config, args.cpu)
        return
    n, block, reps, secs, conc = (600, 50, 3, 4.0, 32) if args.quick else (3000, 100, 5, 10.0, 32)
    ncpu = os.cpu_count() or 1
    cpu_backend, cpu_gw = (0, 1) if ncpu >= 2 else (None, None)
    tmp = Path(tempfile.mkdtemp(prefix="gw-overhead-"))
    bport, gport = free_port(), free_port()
    cfg = {"version": 1, "instances": [{"name": "b0", "url": f"http://127.0.0.1:{bport}"}],
           "store": {"type": "sqlite", "path": str(tmp / "gw.db")}, "models": ["fake-model"],
           "tenants": [{"name": "bench", "tpm": 10**12, "tpd": 10**14, "concurrency": 10_000,
                        "keys": [{"name": "k", "key": KEY, "tpm": 10**12}]}]}
    (tmp / "gw.yaml").write_text(yaml.safe_dump(cfg))
    procs = [start("backend", bport, None, cpu_backend), start("gateway", gport, str(tmp / "gw.yaml"), cpu_gw)]
    direct, gw = f"http://127.0.0.1:{bport}", f"http://127.0.0.1:{gport}"
    try:
        lat = {name: latency(direct, gw, n, block, stream) for name, stream in (("whole", False), ("stream", True))}
        rps_d: list[float] = []
        rps_g: list[float] = []
        for r in range(reps):
            for base, out in (((direct, rps_d), (gw, rps_g)) if r % 2 == 0 else ((gw, rps_g), (direct, rps_d))):
                out.append(asyncio.run(_load(base, conc, secs)))
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    out: dict = {"cpus": ncpu, "gateway_cpu": cpu_gw, "backend_cpu": cpu_backend, "requests_per_side": n,
                 "concurrency": conc, "quick": args.quick}
    print(f"{'':8} {'direct p50':>11} {'p99':>8} {'gateway p50':>12} {'p99':>8} {'added p50':>10} {'p99':>8}")
    for name, (a, b) in lat.items():
        row = {"direct_p50_ms": pct(a, 50), "direct_p99_ms": pct(a, 99), "gateway_p50_ms": pct(b, 50),
               "gateway_p99_ms": pct(b, 99)}
        row["added_p50_ms"] = row["gateway_p50_ms"] - row["direct_p50_ms"]
        row["added_p99_ms"] = row["gateway_p99_ms"] - row["direct_p99_ms"]
        print(f"{name:8} {row['direct_p50_ms']:11.2f} {row['direct_p99_ms']:8.2f} {row['gateway_p50_ms']:12.2f} "
              f"{row['gateway_p99_ms']:8.2f} {row['added_p50_ms']:10.2f} {row['added_p99_ms']:8.2f}")
        out.update({f"{name}_{k}": round(v, 3) for k, v in row.items()})
    md, mg = float(np.median(rps_d)), float(np.median(rps_g))
    print(f"requests/s ({conc} concurrent, {reps} x {secs:g} s each, median [min-max]): direct {md:.0f} "
          f"{spread(rps_d)}, through the gateway {mg:.0f} {spread(rps_g)} ({mg / md:.2f}x)")
    out.update({"direct_rps": round(md, 1), "direct_rps_spread": spread(rps_d), "gateway_rps": round(mg, 1),
                "gateway_rps_spread": spread(rps_g), "rps_ratio": round(mg / md, 3)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
