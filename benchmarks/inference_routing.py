"""Inference routing under a degrading KV path: round_robin vs least_outstanding vs seamguard.

2 prefill and 3 decode emulated instances (seamguard.testbed.inference_pool) on the namespaced
testbed (seamguard.testbed.inference_bed): every prefill->decode path has its own link. The
same seeded request mix (interactive chat 70 %, batch 30 %, log-normal prompt and output
lengths, a burst every 15 s) is replayed for each router, repetitions interleaved; part-way
through, the path p0->d1 is shaped with tc tbf (low rate, small burst) and later restored —
real KV bytes crawl through it. Every host has an address on every rail, so the seamguard
router may keep the pair p0->d1 and move its KV to another rail. By default every request goes
through `seamguard gateway` (one per router run); --direct drives the routers from
seamguard.testbed.inference_load's own loop, which performs the gateway's disaggregated flow
(prefill, KV pull by the decode instance, SSE stream) and calls the same router hooks.
Operating point: 6 req/s of 342-token mean prompts on two prefill instances at 10k tokens/s
(--prefill-tokens-per-s) is about 14 % prefill utilization on average, sized so that the
bursts (12 requests within 1 s) still meet the 1 s TTFT target on a healthy pool.

Per router and window (nothing degraded = arrivals before the degradation; degraded =
arrivals while it lasts): SLO attainment (share of requests meeting their class's TTFT and
TPOT targets; errors and shed requests miss), p50/p99 TTFT and TPOT, goodput (requests within
SLO per second) and errors. Last line: one JSON object.

    PYTHONPATH=src python benchmarks/inference_routing.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from seamguard.testbed.inference_bed import BENCH_KEYS, GATEWAY_PORT, PoolBed
from seamguard.testbed.inference_load import LoadSpec, spec_dict

ROUTERS = ("round_robin", "least_outstanding", "seamguard")


def window_figures(records: list[dict], t0: float, t1: float, slo: dict[str, tuple[float, float]]) -> dict:
    rs = [r for r in records if t0 <= r["t_s"] < t1]
    if not rs:
        return {"requests": 0}

    def meets(r: dict) -> bool:
        ttft, tpot = slo[r["cls"]]
        return r["ok"] and r["ttft_s"] is not None and r["ttft_s"] <= ttft and (r["tpot_s"] or 0.0) <= tpot

    good = [r for r in rs if meets(r)]
    ttft = [r["ttft_s"] for r in rs if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in rs if r["tpot_s"] is not None]
    q = lambda xs, p: round(float(np.percentile(xs, p)), 4) if xs else None  # noqa: E731
    out = {"requests": len(rs), "slo_attainment": round(len(good) / len(rs), 4),
           "goodput_rps": round(len(good) / (t1 - t0), 3),
           "ttft_p50_s": q(ttft, 50), "ttft_p99_s": q(ttft, 99), "tpot_p50_s": q(tpot, 50), "tpot_p99_s": q(tpot, 99),
           "errors": sum(1 for r in rs if not r["ok"] and not r["shed"]), "shed": sum(1 for r in rs if r["shed"]),
           "deferred": sum(1 for r in rs if r["deferred"])}
    for cls in sorted({r["cls"] for r in rs}):
        c = [r for r in rs if r["cls"] == cls]
        out[f"{cls}_attainment"] = round(sum(1 for r in c if meets(r)) / len(c), 4)
    return out


def run(router: str, bed: PoolBed, load: LoadSpec, deg: tuple[float, float], rate_mbit: float, seed: int,
        direct: bool) -> dict:
    load = LoadSpec(**{**load.__dict__, "seed": seed})
    events = [{"at_s": deg[0], "argv": a} for a in bed.shape_argv(0, 1, rate_mbit)]
    events += [{"at_s": deg[1], "argv": a} for a in bed.shape_argv(0, 1, None)]
    budgets = {"ttft_budget_s": {c.name: c.ttft_slo_s for c in load.classes},
               "tpot_budget_s": {c.name: c.tpot_slo_s for c in load.classes}}
    if direct:
        return bed.run_load(spec_dict(bed.instances(), router, load, events), timeout_s=load.duration_s + 120)
    with tempfile.TemporaryDirectory(prefix="sg-gw-") as d:
        gw = bed.start_gateway(router, budgets if router == "seamguard" else {}, Path(d))
        try:
            spec = spec_dict(bed.instances(), router, load, events,
                             gateway={"url": f"http://127.0.0.1:{GATEWAY_PORT}", "keys": BENCH_KEYS})
            return bed.run_load(spec, timeout_s=load.duration_s + 120)
        except RuntimeError:
            print((Path(d) / "gateway.log").read_text()[-2000:])
            raise
        finally:
            bed.stop_gateway(gw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one repetition of 36 s per router (about 2 min)")
    ap.add_argument("--reps", type=int, default=None,
                    help="repetitions per router (default 1 quick, 3 full: the median of 3 survives one repetition "
                         "disturbed by the shared machine)")
    ap.add_argument("--rate-mbit", type=float, default=20.0, help="the degraded path's tbf rate")
    ap.add_argument("--rps", type=float, default=6.0, help="mean arrival rate besides bursts")
    ap.add_argument("--direct", action="store_true",
                    help="drive the routers from the load generator's own loop instead of `seamguard gateway`")
    ap.add_argument("--routers", default=",".join(ROUTERS), help="comma list (default: all three)")
    ap.add_argument("--records", default=None, help="directory to write every run's per-request records to")
    ap.add_argument("--kv-blocking", action="store_true",
                    help="decode steps wait while a KV pull is in flight (see inference_pool)")
    ap.add_argument("--prefill-tokens-per-s", type=float, default=10000.0,
                    help="emulated prefill speed of each prefill instance (sets its utilization under the mix)")
    a = ap.parse_args()
    reps = a.reps or (1 if a.quick else 3)
    duration, deg = (36.0, (12.0, 32.0)) if a.quick else (90.0, (30.0, 80.0))
    load = LoadSpec(rate_rps=a.rps, duration_s=duration)
    slo = {c.name: (c.ttft_slo_s, c.tpot_slo_s) for c in load.classes}
    t_start = time.monotonic()
    load_start = os.getloadavg()[0]  # the machine is shared: say how busy it was
    routers = [r for r in a.routers.split(",") if r]
    per: dict[str, list[dict]] = {r: [] for r in routers}
    inst_args = ["--prefill-per-token-s", f"{1.0 / a.prefill_tokens_per_s:.9f}"]
    with PoolBed(prefill=2, decode=3, instance_args=inst_args + (["--kv-blocking"] if a.kv_blocking else [])) as bed:
        for rep in range(reps):
            for router in routers:  # interleaved: every router sees every repetition's seed and machine state
                res = run(router, bed, load, deg, a.rate_mbit, seed=rep, direct=a.direct)
                if a.records:
                    Path(a.records).mkdir(parents=True, exist_ok=True)
                    (Path(a.records) / f"{router}.{rep}.json").write_text(json.dumps(res))
                healthy = window_figures(res["records"], 0.0, deg[0], slo)
                degraded = window_figures(res["records"], deg[0], deg[1], slo)
                per[router].append({"healthy": healthy, "degraded": degraded, "decisions": res["decisions"],
                                    "events_rc": [e["rc"] for e in res["events"]]})
                print(f"rep {rep} {router:18s} healthy {healthy.get('slo_attainment')} "
                      f"degraded {degraded.get('slo_attainment')} goodput {degraded.get('goodput_rps')} "
                      f"errors {degraded.get('errors')} decisions {res['decisions']}", flush=True)

    def agg(router: str, window: str) -> dict:
        rows = [r[window] for r in per[router] if r[window].get("requests")]
        keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
        return {k: round(statistics.median(r[k] for r in rows if r.get(k) is not None), 4) for k in keys}

    summary = {r: {"healthy": agg(r, "healthy"), "degraded": agg(r, "degraded")} for r in routers}
    cols = ("slo_attainment", "goodput_rps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "errors",
            "shed")
    print(f"\nwindows: nothing degraded 0-{deg[0]:.0f} s, p0->d1 at {a.rate_mbit} mbit {deg[0]:.0f}-{deg[1]:.0f} s "
          f"(of {duration:.0f} s); {a.rps} req/s + bursts; {reps} repetition(s), medians"
          + ("; decode steps wait for KV pulls" if a.kv_blocking else "")
          + ("; routers driven directly" if a.direct else "; through `seamguard gateway`"))
    print(f"{'router':18s} {'window':9s} " + " ".join(f"{c:>14s}" for c in cols))
    for r in routers:
        for w in ("healthy", "degraded"):
            print(f"{r:18s} {w:9s} " + " ".join(f"{summary[r][w].get(c, float('nan')):>14}" for c in cols))
    base = [r for r in routers if r != "seamguard"]
    if "seamguard" not in summary or not base:
        print(json.dumps({"routers": summary}))
        return
    best_deg = max(summary[r]["degraded"]["goodput_rps"] for r in base)
    best_ok = max(summary[r]["healthy"]["slo_attainment"] for r in base)
    goals = {"degraded_attainment": summary["seamguard"]["degraded"]["slo_attainment"],
             "degraded_goodput_vs_best_baseline": round(summary["seamguard"]["degraded"]["goodput_rps"]
                                                        / max(best_deg, 1e-9), 3),
             "healthy_attainment_minus_best_baseline": round(summary["seamguard"]["healthy"]["slo_attainment"]
                                                             - best_ok, 4)}
    goals["met"] = (goals["degraded_attainment"] >= 0.99 and goals["degraded_goodput_vs_best_baseline"] >= 1.3
                    and goals["healthy_attainment_minus_best_baseline"] >= -0.01)
    print(f"goals: {goals}; wall {time.monotonic() - t_start:.0f} s; load average (1 min) "
          f"{load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end on {os.cpu_count()} CPUs")
    print(json.dumps({"routers": summary, "goals": goals, "reps": reps, "duration_s": duration,
                      "degraded_window_s": list(deg), "rate_mbit": a.rate_mbit, "rps": a.rps,
                      "kv_blocking": a.kv_blocking, "via": "direct" if a.direct else "gateway",
                      "loadavg_1m": [round(load_start, 1), round(os.getloadavg()[0], 1)], "cpus": os.cpu_count(),
                      "per_rep": {r: [{w: {k: x[w].get(k) for k in ("slo_attainment", "goodput_rps", "errors")}
                                       for w in ("healthy", "degraded")} for x in per[r]] for r in routers},
                      "decisions": {r: [x["decisions"] for x in per[r]] for r in routers}}))


if __name__ == "__main__":
    main()
