"""Inference routing under a degrading KV path, across offered load: round_robin vs
least_outstanding vs seamguard at stated fractions of the pool's capacity.

2 prefill and 3 decode emulated instances (seamguard.testbed.inference_pool) on the namespaced
testbed (seamguard.testbed.inference_bed): every prefill->decode path has its own link. The
same seeded request mix (interactive chat 70 %, batch 30 %, log-normal prompt and output
lengths, a burst of 12 every 15 s) is replayed for each router, repetitions interleaved; part-way
through, the path p0->d1 is shaped with tc tbf (low rate, small burst) and later restored —
real KV bytes crawl through it. Every host has an address on every rail, so the seamguard
router may keep the pair p0->d1 and move its KV to another rail. By default every request goes
through `seamguard gateway` (one per router run); --direct drives the routers from
seamguard.testbed.inference_load's own loop, which performs the gateway's disaggregated flow
(prefill, KV pull by the decode instance, SSE stream) and calls the same router hooks.

Offered load. The pool's nominal capacity — requests/s it sustains within the mix's SLO with
nothing degraded — comes from the emulator's model (seamguard.testbed.inference_capacity):
prefill instances at --prefill-tokens-per-s (10k), decode instances stepping in
--decode-base-s + --decode-per-seq-s x (batch - 1) (50 ms + 3 ms), the largest batch whose step
stays within the 0.1 s interactive TPOT target (17 sequences, 98 ms), the mix's mean prompt and
output tokens (334, 69): decode-bound at 7.54 req/s. The decode speed is slower than the
emulator's default (15 ms + 0.4 ms, 64 slots: 46 req/s, prefill-bound) so that the pool, not
the shared 2-core machine driving every token through Python, is what saturates. The grid of
levels 0.3, 0.5, 0.7, 0.85, 1.0 and 1.15 of that capacity (mean offered rate, bursts included)
was fixed before any run of the sweep and every level is reported; --rps X runs one level at
Poisson rate X instead (no sweep). --quick keeps the design and cuts its size: the headline
level 0.85 only, 2 repetitions of 16 s runs (p0->d1 slowed from 5 s to 14 s); the result's
``quick_cuts`` says so. Each run also pays the gateway's start and the drain of the requests
still in flight at its end (batch outputs up to 256 tokens): ~20 s a run on a loaded machine.

Per level, router and window (nothing degraded = arrivals before the degradation; degraded =
arrivals while it lasts): SLO attainment (share of requests meeting their class's TTFT and
TPOT targets; errors and shed requests miss), per class, p50/p99 TTFT and TPOT, goodput
(requests within SLO per second), errors, shed and deferred requests; medians over repetitions
with [min-max]; seamguard's goodput over the best baseline's (ratio of medians, and per
repetition against the best baseline of that repetition). What the routers did in the degraded
window (from the gateway's /metrics at the window's ends): routes per decode instance, routes
over the slowed link, and seamguard's decisions (KV moved to another rail, batch caps,
deferred batch work).

Goodput, two definitions, both reported. At equal load: requests/s meeting the SLO per level
(above; its ratio is the attainment ratio). As DistServe defines it (Zhong et al., OSDI 2024,
https://arxiv.org/abs/2401.09670): the maximum rate served while the SLO attainment stays at or
above a target, here the degraded window's median attainment against 0.99 (the issue's goal)
and 0.90 (DistServe's), read off the grid (seamguard.testbed.inference_goodput): per router the
highest level that, with every lower level, met the target, and the highest level that met it at
all; "below" the lowest level or "at least" the highest where the grid cannot tell, and then the
ratio is a bound. The ratio is seamguard's rate over the best baseline's, both read the first
way, and seamguard's first reading over the baselines' second (least favourable to seamguard).
Last line: one JSON object.

    PYTHONPATH=src python benchmarks/inference_routing.py --quick

Competent opponents (--opponents). Beside round robin and least-outstanding, two routers an
operator would run (benchmarks/routing_opponents.py, its docstring gives their settings and
sources): power-of-two-choices least-outstanding with Envoy-default outlier ejection
(``p2c_eject``) and an llm-d-style weighted scorer of prefix-cache hit, queue depth and KV use
(``prefix_kv``). Two arms, interleaved in one run, every router driven directly by the load
generator (no gateway for anyone): ``rails`` — every host's rails visible, so the opponents
choose among (prefill, decode, rail) paths exactly as seamguard's router does; ``home`` — rails
hidden from every router, seamguard included, so every KV pull takes the decode instance's home
rail. Request mixes from seeds OPPONENT_SEED + repetition (7301, 7302, ...: never used while
developing; --opponent-seed picks another first seed); levels 0.5 and 0.9 of capacity (--utilization
narrows them; --quick: 0.9, the loaded arm, 2 repetitions of 6 s runs, p0->d1 slowed from 2 s to
5.5 s: a smoke test of every router in both arms, too few requests per window for a figure; its
16 runs pay ~10 s each of start and drain). Every repetition is reported per router (median, min, max) with seamguard's
ratio to the best opponent of its arm, and each repetition where seamguard is the worst router of
its arm is listed.

    PYTHONPATH=src python benchmarks/inference_routing.py --opponents --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from seamguard.testbed.inference_bed import BENCH_ADMIN_TOKEN, BENCH_KEYS, GATEWAY_PORT, PoolBed
from seamguard.testbed.inference_capacity import poisson_rate_for, pool_capacity
from seamguard.testbed.inference_goodput import (
    MaxRate,
    Point,
    max_rate_at_target,
    rate_ratio,
)
from seamguard.testbed.inference_load import LoadSpec, spec_dict
from seamguard.testbed.inference_pool import PoolTiming

OPPONENT_SEED = 7301  # first request-mix seed of --opponents; chosen after development, never run before
OPPONENT_ARMS = {"rails": ("p2c_eject", "prefix_kv", "seamguard"),
                 "home": ("round_robin", "least_outstanding", "p2c_eject", "prefix_kv", "seamguard")}
OPPONENT_UTILIZATIONS, OPPONENT_QUICK_UTILIZATIONS = (0.5, 0.9), (0.9,)
OPPONENT_WINDOWS_S = {"full": (60.0, (20.0, 55.0)), "quick": (6.0, (2.0, 5.5))}  # run length, degraded window
OPPONENTS_SCRIPT = Path(__file__).resolve().parent / "routing_opponents.py"

ROUTERS = ("round_robin", "least_outstanding", "seamguard")
UTILIZATIONS = (0.3, 0.5, 0.7, 0.85, 1.0, 1.15)  # the sweep's grid, fixed before its first run; every level is reported
QUICK_UTILIZATIONS = (0.85,)  # the headline level
WINDOWS_S = {"full": (60.0, (20.0, 55.0)), "quick": (16.0, (5.0, 14.0))}  # run length, degraded window
REPS = {"full": 3, "quick": 2}  # the median of 3 survives one repetition disturbed by the shared machine
TARGETS = (0.99, 0.90)  # degraded-window attainment: the goal, and DistServe's goodput target
SLOW_AT = (0, 1)  # the degraded path: prefill 0 -> decode 1 (PoolBed indices), over rail 1 (d1's home rail)
SLOW = ("p0", "d1", 1)  # ... as the router names it: prefill, decode, rail
PREFILL, DECODE = 2, 3


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
        out[f"{cls}_tpot_p99_s"] = q([r["tpot_s"] for r in c if r["tpot_s"] is not None], 99)
    return out


def window_actions(res: dict, deg: tuple[float, float]) -> dict:
    """What the router did with the arrivals of the degraded window: the share of each decode
    instance, requests over the slowed link (the slow pair on its home rail, or on the
    connector's choice), the slow pair's requests placed on another rail — from each request's
    route (the gateway's x-seamguard-route header) — and the router's decisions between the
    degradation's start and its end (its counters just after the two events, differenced)."""
    rs = [r for r in res["records"] if deg[0] <= r["t_s"] < deg[1] and r["decode"]]
    n = len(rs) or 1
    on_slow = [r for r in rs if (r["prefill"], r["decode"]) == SLOW[:2] and r["rail"] in (None, SLOW[2])]
    at = {e.get("planned_s"): e.get("decisions") or {} for e in res["events"]}  # the last command of a time wins
    kinds = {k: v - at[deg[0]].get(k, 0) for k, v in at.get(deg[1], {}).items()
             if not k.startswith("routes ") and deg[0] in at and v - at[deg[0]].get(k, 0)}
    return {"decode_share": {f"d{j}": round(sum(1 for r in rs if r["decode"] == f"d{j}") / n, 3)
                             for j in range(DECODE)},
            "routes_on_slow_link": len(on_slow),
            "interactive_on_slow_link": sum(1 for r in on_slow if r["cls"] == "interactive"),
            "slow_pair_on_other_rails": sum(1 for r in rs if (r["prefill"], r["decode"]) == SLOW[:2]
                                            and r["rail"] not in (None, SLOW[2])),
            "decisions": kinds}


def run(router: str, bed: PoolBed, load: LoadSpec, deg: tuple[float, float], rate_mbit: float, seed: int,
        direct: bool) -> dict:
    load = LoadSpec(**{**load.__dict__, "seed": seed})
    events = [{"at_s": deg[0], "argv": a} for a in bed.shape_argv(*SLOW_AT, rate_mbit)]
    events += [{"at_s": deg[1], "argv": a} for a in bed.shape_argv(*SLOW_AT, None)]
    budgets = {"ttft_budget_s": {c.name: c.ttft_slo_s for c in load.classes},
               "tpot_budget_s": {c.name: c.tpot_slo_s for c in load.classes}}
    if direct:
        return bed.run_load(spec_dict(bed.instances(), router, load, events), timeout_s=load.duration_s + 120)
    with tempfile.TemporaryDirectory(prefix="sg-gw-") as d:
        gw = bed.start_gateway(router, budgets if router == "seamguard" else {}, Path(d))
        try:
            spec = spec_dict(bed.instances(), router, load, events,
                             gateway={"url": f"http://127.0.0.1:{GATEWAY_PORT}", "keys": BENCH_KEYS,
                                      "admin_token": BENCH_ADMIN_TOKEN})
            return bed.run_load(spec, timeout_s=load.duration_s + 120)
        except RuntimeError:
            print((Path(d) / "gateway.log").read_text()[-2000:])
            raise
        finally:
            bed.stop_gateway(gw)


def _stat(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def summarize_level(rows: dict[str, list[dict]], routers: list[str]) -> dict:
    """Medians (and spread of attainment and goodput) per router and window; goodput ratios and
    the issue's goals for one level."""
    out: dict = {"routers": {}}
    for r in routers:
        out["routers"][r] = {}
        for w in ("healthy", "degraded"):
            got = [x[w] for x in rows[r] if x[w].get("requests")]
            keys = [k for k in got[0] if isinstance(got[0][k], (int, float))] if got else []
            med = {k: round(statistics.median(v), 4) for k in keys
                   if (v := [g[k] for g in got if g.get(k) is not None])}
            for k in ("slo_attainment", "goodput_rps"):
                if got:
                    med[k + "_range"] = [_stat([g[k] for g in got])["min"], _stat([g[k] for g in got])["max"]]
            out["routers"][r][w] = med
    base = [r for r in routers if r != "seamguard"]
    if "seamguard" not in routers or not base:
        return out
    sg = out["routers"]["seamguard"]
    best = max(out["routers"][r]["degraded"]["goodput_rps"] for r in base)
    per_rep = [rows["seamguard"][i]["degraded"]["goodput_rps"]
               / max(1e-9, max(rows[r][i]["degraded"]["goodput_rps"] for r in base))
               for i in range(len(rows["seamguard"]))]
    out["goodput_ratio"] = {"of_medians": round(sg["degraded"]["goodput_rps"] / max(best, 1e-9), 3),
                            "per_rep": _stat(per_rep)}
    best_ok = max(out["routers"][r]["healthy"]["slo_attainment"] for r in base)
    goals = {"degraded_attainment": sg["degraded"]["slo_attainment"],
             "degraded_goodput_vs_best_baseline": out["goodput_ratio"]["of_medians"],
             "healthy_attainment_minus_best_baseline": round(sg["healthy"]["slo_attainment"] - best_ok, 4)}
    goals["attainment_met"] = goals["degraded_attainment"] >= 0.99
    goals["goodput_met"] = goals["degraded_goodput_vs_best_baseline"] >= 1.3
    goals["healthy_met"] = goals["healthy_attainment_minus_best_baseline"] >= -0.01
    goals["met"] = goals["attainment_met"] and goals["goodput_met"] and goals["healthy_met"]
    out["goals"] = goals
    return out


def summarize_sweep(out_levels: dict, routers: list[str], window: str) -> dict:
    """Goodput as DistServe defines it, from the grid of levels: per target, each router's highest
    level (and req/s) whose median attainment in `window`, and every lower level's, met the target
    ("contiguous"), and the highest level that met it at all ("any"); seamguard's over the best
    baseline's, both routers read contiguously, and seamguard contiguously against the baselines
    read generously (the reading least favourable to seamguard); the same from each repetition's
    own curve."""
    lv = sorted(out_levels.values(), key=lambda v: v["utilization"])
    reps = min(len(v["per_rep"][r]) for v in lv for r in routers)

    def points(r: str, rep: int | None) -> list[Point]:
        return [Point(v["utilization"], v["offered_rps"],
                      v["routers"][r][window]["slo_attainment"] if rep is None
                      else v["per_rep"][r][rep][window]["slo_attainment"]) for v in lv]

    def ratios(sg: MaxRate, base_c: list[MaxRate], base_any: list[MaxRate]) -> dict:
        return {"contiguous": rate_ratio(sg, base_c), "least_favourable": rate_ratio(sg, base_any)}

    base = [r for r in routers if r != "seamguard"]
    out = {}
    for target in TARGETS:
        rates = {i: {r: (max_rate_at_target(points(r, i), target), max_rate_at_target(points(r, i), target, False))
                     for r in routers} for i in [None, *range(reps)]}
        t = {"routers": {r: {"bound": c.bound, "level": c.level, "rate_rps": c.rate_rps, "text": str(c),
                             "met_again_at": list(c.met_again_at), "any_level": str(g),
                             "per_rep": [str(rates[i][r][0]) for i in range(reps)]}
                         for r, (c, g) in rates[None].items()}}
        if "seamguard" in routers and base:
            got = {i: ratios(rates[i]["seamguard"][0], [rates[i][r][0] for r in base], [rates[i][r][1] for r in base])
                   for i in rates}
            t["ratio"] = {k: {"bound": x.bound, "value": x.value, "text": str(x),
                              "per_rep": [str(got[i][k]) for i in range(reps)],
                              "goal_1_3x_met": x.bound in ("=", ">=") and x.value >= 1.3}
                          for k, x in got[None].items()}
        out[f"{target:g}"] = t
    return out


def print_sweep(sweep: dict, out_levels: dict, routers: list[str], window: str) -> None:
    lv = sorted(out_levels.values(), key=lambda v: v["utilization"])
    print(f"\n{window} window: SLO attainment per level (median over repetitions)")
    print(f"{'router':18s} " + " ".join(f"{v['utilization']:>6g} ({v['offered_rps']:.2f}/s)" for v in lv))
    for r in routers:
        print(f"{r:18s} " + " ".join(f"{v['routers'][r][window]['slo_attainment']:>16}" for v in lv))
    for target, t in sweep.items():
        print(f"max rate at {window} attainment >= {target}:")
        for r, m in t["routers"].items():
            print(f"  {r:18s} {m['text']:>26s}  (highest level met at all: {m['any_level']}; per repetition "
                  f"{', '.join(m['per_rep'])})")
        for k, x in t.get("ratio", {}).items():
            print(f"  seamguard / best baseline, {k}: {x['text']} (per repetition {', '.join(x['per_rep'])})")


COLS = ("slo_attainment", "goodput_rps", "interactive_attainment", "batch_attainment", "ttft_p50_s", "ttft_p99_s",
        "tpot_p50_s", "tpot_p99_s", "errors", "shed", "deferred")


def print_level(name: str, summary: dict, actions: dict[str, list[dict]], routers: list[str]) -> None:
    print(f"\n{name}")
    print(f"{'router':18s} {'window':9s} " + " ".join(f"{c[:14]:>14s}" for c in COLS))
    for r in routers:
        for w in ("healthy", "degraded"):
            row = summary["routers"][r][w]
            print(f"{r:18s} {w:9s} " + " ".join(f"{row.get(c, float('nan')):>14}" for c in COLS))
    for r in routers:
        for i, a in enumerate(actions[r]):
            print(f"  {r} rep {i} degraded window: decode share {a['decode_share']}, on slow link "
                  f"{a['routes_on_slow_link']} ({a['interactive_on_slow_link']} interactive), p0->d1 on other rails "
                  f"{a['slow_pair_on_other_rails']}, decisions {a['decisions']}")
    if "goals" in summary:
        print(f"  goodput ratio {summary['goodput_ratio']}; goals {summary['goals']}")


def reread(path: Path) -> None:
    """The sweep's reading of a saved result (one written before the sweep existed included)."""
    try:
        got = json.loads(path.read_text().strip().splitlines()[-1])
        levels, routers = got["levels"], list(next(iter(got["levels"].values()))["routers"])
    except (OSError, ValueError, KeyError, IndexError, StopIteration) as e:
        raise SystemExit(f"inference_routing: --reread {path}: not a result of this script ({e!r})") from None
    sweep = {w: summarize_sweep(levels, routers, w) for w in ("degraded", "healthy")}
    for w, sw in sweep.items():
        print_sweep(sw, levels, routers, w)
    print(json.dumps({"reread": str(path), "max_rate_at_target": sweep}))


def run_opponent_arm(router: str, arm: str, bed: PoolBed, load: LoadSpec, deg: tuple[float, float],
                     rate_mbit: float, seed: int) -> dict:
    """One direct run of the load generator with the opponents registered (routing_opponents.py as
    its entry point, for every router alike); arm "home" hides every host's rails from the router."""
    load = LoadSpec(**{**load.__dict__, "seed": seed})
    events = [{"at_s": deg[0], "argv": a} for a in bed.shape_argv(*SLOW_AT, rate_mbit)]
    events += [{"at_s": deg[1], "argv": a} for a in bed.shape_argv(*SLOW_AT, None)]
    insts = [replace(i, rails=()) if arm == "home" else i for i in bed.instances()]
    assert bed.tb is not None
    with tempfile.TemporaryDirectory(prefix="sg-opp-") as d:
        sp, out = Path(d) / "spec.json", Path(d) / "out.json"
        sp.write_text(json.dumps(spec_dict(insts, router, load, events)))
        p = subprocess.run([*bed.tb.exec_prefix(bed.client_host), sys.executable, str(OPPONENTS_SCRIPT),
                            "--spec", str(sp), "--out", str(out)],
                           capture_output=True, text=True, timeout=load.duration_s + 120)
        if p.returncode != 0:
            raise SystemExit(f"inference_routing: {router} ({arm} arm): load generator failed ({p.returncode}): "
                             f"{p.stderr[-1500:]}")
        return json.loads(out.read_text())


def summarize_opponents(rows: dict[str, dict[str, list[dict]]], seeds: list[int]) -> dict:
    """Per arm and router, every repetition's figures and their median, min, max; seamguard's
    degraded goodput over the best other router of its arm (per repetition and of medians); the
    repetitions where seamguard was the worst of its arm, and the arm's strongest opponent."""
    keys = (("degraded", "goodput_rps"), ("degraded", "slo_attainment"), ("healthy", "slo_attainment"),
            ("degraded", "interactive_attainment"))
    out: dict = {}
    for arm, by_router in rows.items():
        a: dict = {"routers": {}}
        for r, reps in by_router.items():
            a["routers"][r] = {f"{w}_{k}": {**_stat(v := [x[w].get(k) or 0.0 for x in reps]),
                                            "spread": round(max(v) - min(v), 4), "per_rep": v}
                               for w, k in keys}
        good = {r: v["degraded_goodput_rps"] for r, v in a["routers"].items()}
        others = [r for r in good if r != "seamguard"]
        best = max(others, key=lambda r: good[r]["median"])
        per_rep = [round(good["seamguard"]["per_rep"][i] / max(1e-9, max(good[r]["per_rep"][i] for r in others)), 3)
                   for i in range(len(seeds))]
        a["strongest_opponent"] = best
        a["seamguard_over_strongest_of_medians"] = round(good["seamguard"]["median"] / max(good[best]["median"], 1e-9), 3)
        a["seamguard_over_best_per_rep"] = {**_stat(per_rep), "per_rep": per_rep}
        a["seamguard_worst_reps"] = [{"rep": i, "seed": seeds[i]} for i in range(len(seeds))
                                     if good["seamguard"]["per_rep"][i] <= min(good[r]["per_rep"][i] for r in others)]
        a["goal_1_3x_met"] = a["seamguard_over_strongest_of_medians"] >= 1.3
        out[arm] = a
    return out


def parse_utilizations(text: str | None, default: tuple[float, ...]) -> list[float]:
    """--utilization's comma list (fractions of capacity), or the mode's default grid."""
    try:
        utils = [float(u) for u in text.split(",") if u] if text else list(default)
    except ValueError as e:
        raise SystemExit(f"inference_routing: --utilization {text}: {e}") from None
    if not utils or any(u <= 0 for u in utils):
        raise SystemExit(f"inference_routing: --utilization {text}: need positive fractions of capacity")
    return utils


def quick_cuts(full_levels: tuple[float, ...], windows: dict) -> dict:
    """What --quick left out of the full design, for the result JSON."""
    return {"full_levels": list(full_levels), "full_reps": REPS["full"], "full_duration_s": windows["full"][0],
            "full_degraded_window_s": list(windows["full"][1])}


def opponents_main(a: argparse.Namespace) -> None:
    """--opponents: both arms, every router, interleaved per repetition and level; one JSON line."""
    mode = "quick" if a.quick else "full"
    reps = a.reps or REPS[mode]
    duration, deg = OPPONENT_WINDOWS_S[mode]
    timing = PoolTiming(prefill_per_token_s=1.0 / a.prefill_tokens_per_s, decode_base_s=a.decode_base_s,
                        decode_per_seq_s=a.decode_per_seq_s)
    shape = LoadSpec(duration_s=duration)
    cap = pool_capacity(timing, PREFILL, DECODE, shape.classes)
    utils = parse_utilizations(a.utilization, OPPONENT_QUICK_UTILIZATIONS if a.quick else OPPONENT_UTILIZATIONS)
    slo = {c.name: (c.ttft_slo_s, c.tpot_slo_s) for c in shape.classes}
    seeds = [a.opponent_seed + i for i in range(reps)]
    rows = {u: {arm: {r: [] for r in rs} for arm, rs in OPPONENT_ARMS.items()} for u in utils}
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    inst_args = ["--prefill-per-token-s", f"{timing.prefill_per_token_s:.9f}", "--decode-base-s",
                 str(timing.decode_base_s), "--decode-per-seq-s", str(timing.decode_per_seq_s)]
    with PoolBed(prefill=PREFILL, decode=DECODE, instance_args=inst_args) as bed:
        for rep, seed in enumerate(seeds):
            for u in utils:
                rps = poisson_rate_for(u, cap.pool_rps, shape.burst_size, shape.burst_every_s)
                for arm, routers in OPPONENT_ARMS.items():
                    for router in routers:
                        t_run = time.monotonic()
                        res = run_opponent_arm(router, arm, bed, LoadSpec(rate_rps=rps, duration_s=duration), deg,
                                               a.rate_mbit, seed)
                        failed = [e for e in res["events"] if e["rc"] != 0]
                        if failed:
                            raise SystemExit(f"inference_routing: {router}: event {failed[0]['argv']} failed")
                        row = {"healthy": window_figures(res["records"], 0.0, deg[0], slo),
                               "degraded": window_figures(res["records"], deg[0], deg[1], slo),
                               "actions": window_actions(res, deg)}
                        rows[u][arm][router].append(row)
                        print(f"rep {rep} (seed {seed}) level {u:g} {arm:5s} {router:18s} healthy "
                              f"{row['healthy'].get('slo_attainment')} degraded {row['degraded'].get('slo_attainment')}"
                              f" goodput {row['degraded'].get('goodput_rps')} decisions {row['actions']['decisions']} "
                              f"load {os.getloadavg()[0]:.1f} wall {time.monotonic() - t_run:.1f} s (arrivals and "
                              f"drain {res.get('wall_s')} s)", flush=True)
    levels = {f"{u:g}": {"offered_rps": round(poisson_rate_for(u, cap.pool_rps, shape.burst_size, shape.burst_every_s)
                                              + shape.burst_size / shape.burst_every_s, 3),
                         "arms": summarize_opponents(rows[u], seeds),
                         "actions": {arm: {r: [x["actions"] for x in v] for r, v in rs.items()}
                                     for arm, rs in rows[u].items()}} for u in utils}
    for lv, v in levels.items():
        for arm, s in v["arms"].items():
            print(f"\nlevel {lv} ({v['offered_rps']} req/s), arm {arm}: degraded goodput median [min-max] per router")
            for r, f in s["routers"].items():
                g = f["degraded_goodput_rps"]
                print(f"  {r:18s} {g['median']:7.3f} [{g['min']}-{g['max']}] attainment "
                      f"{f['degraded_slo_attainment']['median']}")
            print(f"  seamguard / strongest ({s['strongest_opponent']}): {s['seamguard_over_strongest_of_medians']}; "
                  f"per rep {s['seamguard_over_best_per_rep']['per_rep']}; seamguard worst in {s['seamguard_worst_reps']}")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    cuts = quick_cuts(OPPONENT_UTILIZATIONS, OPPONENT_WINDOWS_S) if a.quick else None
    print(json.dumps({"comparison": "opponents", "mode": mode, "quick": a.quick, "quick_cuts": cuts, "commit": head,
                      "seeds": seeds, "reps": reps, "levels": levels,
                      "duration_s": duration, "degraded_window_s": list(deg), "rate_mbit": a.rate_mbit,
                      "capacity_rps": round(cap.pool_rps, 4), "via": "direct", "arms": OPPONENT_ARMS,
                      "wall_s": round(time.monotonic() - t0), "cpus": os.cpu_count(),
                      "loadavg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="level 0.85 only, 2 repetitions of 16 s per router (--opponents: 0.9, 2 repetitions of "
                         "6 s); measured times in docs/benchmarks.md")
    ap.add_argument("--reps", type=int, default=None,
                    help="repetitions per level and router (default 2 quick, 3 full: the median of 3 survives one "
                         "repetition disturbed by the shared machine)")
    ap.add_argument("--utilization", default=None,
                    help="comma list of offered load as fractions of the pool's capacity (default "
                         f"{','.join(map(str, UTILIZATIONS))}; quick {','.join(map(str, QUICK_UTILIZATIONS))})")
    ap.add_argument("--rps", type=float, default=None,
                    help="override: one level at this Poisson rate (bursts on top) instead of --utilization")
    ap.add_argument("--rate-mbit", type=float, default=20.0, help="the degraded path's tbf rate")
    ap.add_argument("--direct", action="store_true",
                    help="drive the routers from the load generator's own loop instead of `seamguard gateway`")
    ap.add_argument("--routers", default=",".join(ROUTERS), help="comma list (default: all three)")
    ap.add_argument("--records", default=None, help="directory to write every run's per-request records to")
    ap.add_argument("--kv-blocking", action="store_true",
                    help="decode steps wait while a KV pull is in flight (see inference_pool)")
    ap.add_argument("--prefill-tokens-per-s", type=float, default=10000.0, help="each prefill instance's speed")
    ap.add_argument("--decode-base-s", type=float, default=0.05, help="a decode step with one sequence")
    ap.add_argument("--decode-per-seq-s", type=float, default=0.003, help="each more sequence in a step adds this")
    ap.add_argument("--reread", default=None, metavar="RESULT_JSON",
                    help="run nothing: read a result this script wrote (the JSON object of its last line) and "
                         "print its attainment per level and the max rate at each target")
    ap.add_argument("--opponents", action="store_true",
                    help="the competent-opponent comparison: both arms (rails, home), seeds from "
                         f"{OPPONENT_SEED}, direct (see the module docstring)")
    ap.add_argument("--opponent-seed", type=int, default=OPPONENT_SEED,
                    help=f"--opponents: the first repetition's request-mix seed (default {OPPONENT_SEED}; repetition i "
                         "uses it + i)")
    a = ap.parse_args()
    if a.opponents:
        opponents_main(a)
        return
    if a.reread:
        reread(Path(a.reread))
        return
    mode = "quick" if a.quick else "full"
    reps = a.reps or REPS[mode]
    duration, deg = WINDOWS_S[mode]
    timing = PoolTiming(prefill_per_token_s=1.0 / a.prefill_tokens_per_s, decode_base_s=a.decode_base_s,
                        decode_per_seq_s=a.decode_per_seq_s, kv_blocking=a.kv_blocking)
    shape = LoadSpec(duration_s=duration)
    cap = pool_capacity(timing, PREFILL, DECODE, shape.classes)
    bursts_rps = shape.burst_size / shape.burst_every_s
    if a.rps is not None:
        levels = {f"rps={a.rps:g}": a.rps}
    else:
        utils = parse_utilizations(a.utilization, QUICK_UTILIZATIONS if a.quick else UTILIZATIONS)
        levels = {f"{u:g}": poisson_rate_for(u, cap.pool_rps, shape.burst_size, shape.burst_every_s) for u in utils}
    slo = {c.name: (c.ttft_slo_s, c.tpot_slo_s) for c in shape.classes}
    t_start = time.monotonic()
    load_start = os.getloadavg()[0]  # the machine is shared: say how busy it was
    routers = [r for r in a.routers.split(",") if r]
    per = {lv: {r: [] for r in routers} for lv in levels}
    acts = {lv: {r: [] for r in routers} for lv in levels}
    print(f"pool capacity {cap.pool_rps:.2f} req/s ({cap.bottleneck}-bound: prefill {cap.prefill_rps:.1f}, decode "
          f"{cap.decode_rps:.2f}; batch {cap.decode_batch} by {cap.decode_batch_limit}, step {cap.decode_step_s:.3f} s;"
          f" mean prompt {cap.mean_prompt_tokens:.0f}, output {cap.mean_output_tokens:.0f} tokens)", flush=True)
    inst_args = ["--prefill-per-token-s", f"{timing.prefill_per_token_s:.9f}", "--decode-base-s",
                 str(timing.decode_base_s), "--decode-per-seq-s", str(timing.decode_per_seq_s)]
    with PoolBed(prefill=PREFILL, decode=DECODE,
                 instance_args=inst_args + (["--kv-blocking"] if a.kv_blocking else [])) as bed:
        for rep in range(reps):
            for lv, rps in levels.items():
                load = LoadSpec(rate_rps=rps, duration_s=duration)
                for router in routers:  # interleaved: every router sees every repetition's seed and machine state
                    t_run = time.monotonic()
                    res = run(router, bed, load, deg, a.rate_mbit, seed=rep, direct=a.direct)
                    if a.records:
                        Path(a.records).mkdir(parents=True, exist_ok=True)
                        (Path(a.records) / f"{router}.{lv}.{rep}.json").write_text(json.dumps(res))
                    failed = [e for e in res["events"] if e["rc"] != 0]
                    if failed:  # a degradation that did not happen makes every figure of the run meaningless
                        raise SystemExit(f"inference_routing: {router}: event {failed[0]['argv']} failed "
                                         f"({failed[0]['rc']}): {failed[0]['stderr'].strip()}")
                    healthy = window_figures(res["records"], 0.0, deg[0], slo)
                    degraded = window_figures(res["records"], deg[0], deg[1], slo)
                    per[lv][router].append({"healthy": healthy, "degraded": degraded,
                                            "events_rc": [e["rc"] for e in res["events"]]})
                    acts[lv][router].append(window_actions(res, deg))
                    print(f"rep {rep} level {lv} {router:18s} healthy {healthy.get('slo_attainment')} "
                          f"degraded {degraded.get('slo_attainment')} goodput {degraded.get('goodput_rps')} "
                          f"errors {degraded.get('errors')} actions {acts[lv][router][-1]} "
                          f"load {os.getloadavg()[0]:.1f} wall {time.monotonic() - t_run:.1f} s (arrivals and drain "
                          f"{res.get('wall_s')} s)", flush=True)

    print(f"\nwindows: nothing degraded 0-{deg[0]:.0f} s, p0->d1 at {a.rate_mbit} mbit {deg[0]:.0f}-{deg[1]:.0f} s "
          f"(of {duration:.0f} s); {reps} repetition(s), medians"
          + ("; decode steps wait for KV pulls" if a.kv_blocking else "")
          + ("; routers driven directly" if a.direct else "; through `seamguard gateway`"))
    out_levels = {}
    for lv, rps in levels.items():
        s = summarize_level(per[lv], routers)
        offered = rps + bursts_rps
        name = (f"level {lv}: {offered:.2f} req/s offered ({rps:.2f} Poisson + {bursts_rps:.2f} bursts) = "
                f"{offered / cap.pool_rps:.2f} of capacity")
        print_level(name, s, acts[lv], routers)
        out_levels[lv] = {"utilization": round(offered / cap.pool_rps, 3), "offered_rps": round(offered, 3),
                          "poisson_rps": round(rps, 3), **s, "actions": acts[lv],
                          "per_rep": {r: [{w: {k: x[w].get(k) for k in ("slo_attainment", "goodput_rps", "errors",
                                                                          "interactive_attainment", "batch_attainment")}
                                           for w in ("healthy", "degraded")} for x in per[lv][r]] for r in routers}}
    sweep = ({w: summarize_sweep(out_levels, routers, w) for w in ("degraded", "healthy")}
             if a.rps is None else {})
    for w, sw in sweep.items():
        print_sweep(sw, out_levels, routers, w)
    wall = time.monotonic() - t_start
    load_end = os.getloadavg()[0]
    print(f"\nwall {wall:.0f} s; load average (1 min) {load_start:.1f} at start, {load_end:.1f} at end on "
          f"{os.cpu_count()} CPUs")
    print(json.dumps({"capacity": {k: round(v, 4) if isinstance(v, float) else v for k, v in cap.__dict__.items()},
                      "levels": out_levels,
                      "goals": {lv: v.get("goals") for lv, v in out_levels.items()},
                      "max_rate_at_target": sweep,
                      "goodput_definitions": {
                          "goodput_rps (per level)": "requests/s meeting the SLO at the same offered load",
                          "max_rate_at_target": "the highest grid level (fraction of capacity, req/s) at which the "
                                                "window's median SLO attainment, and every lower level's, is >= the "
                                                "target (DistServe, arXiv 2401.09670)"},
                      "mode": mode, "quick_cuts": quick_cuts(UTILIZATIONS, WINDOWS_S) if a.quick else None,
                      "reps": reps, "duration_s": duration, "degraded_window_s": list(deg), "rate_mbit": a.rate_mbit,
                      "timing": {"prefill_per_token_s": timing.prefill_per_token_s,
                                 "decode_base_s": timing.decode_base_s, "decode_per_seq_s": timing.decode_per_seq_s,
                                 "max_batch": timing.max_batch},
                      "kv_blocking": a.kv_blocking, "via": "direct" if a.direct else "gateway",
                      "wall_s": round(wall), "loadavg_1m": [round(load_start, 1), round(load_end, 1)],
                      "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
