"""Detection on independent scenarios (issue 15): the current detector beside the previous one.

For each scenario (seamguard.scenarios: a fleet history whose physics and noise share
nothing with the detector, with labelled faults and everyday decoys):

  1. write it as OpenMetrics and backfill a TSDB with `promtool tsdb create-blocks-from`;
  2. start a real Prometheus on it (lookback 45 s, 1.5 scrapes: a missed scrape reads as
     missing, as staleness markers make it on a live-scraped server);
  3. run `python -m seamguard replay` over the window, once with the current source tree
     and once with the previous detector (a `git archive` of --baseline-ref, default
     715ae99, the detector on main when issue 15 was filed), interleaved per scenario;
  4. score both timelines with seamguard.app.eval against the labels.

Prints a side-by-side table, then (last line) one JSON object: per detector, overall and
per fault class, `precision`, `recall`, `median_delay_s`, `p90_delay_s`, `healthy_drains`,
`actions_per_fault`, `checkpoint_requests_per_fault`, and the issue's goals.

    python benchmarks/detection.py --quick      # 4 scenarios of 256 GPUs, ~1-2 min
    python benchmarks/detection.py              # 20 scenarios, 256-4,096 GPUs
    python benchmarks/detection.py --keep DIR   # ... and keep scenarios and timelines in DIR
    python benchmarks/detection.py --rescore DIR  # score DIR's timelines again (scoring rules changed)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from seamguard.app.eval import Relations, load_labels, read_timeline, score  # noqa: E402
from seamguard.app.config import load_topology  # noqa: E402
from seamguard.scenarios import FAULT_CLASS_NAMES, ScenarioSpec, generate_files  # noqa: E402
from seamguard.scenarios.backfill import backfill_file  # noqa: E402
from seamguard.testbed.prom import PrometheusServer  # noqa: E402

SCRAPE_S = 30.0
GOALS = {"recall": 0.95, "precision": 0.95, "healthy_drains": 0, "median_delay_scrapes": 3.0,
         "cooling_lead_s": 60.0, "max_checkpoint_requests_per_fault_and_job": 1}


def plan(quick: bool, n: int | None) -> list[ScenarioSpec]:
    """(gpus, minutes, faults per scenario) per scenario; seeds 0.. in order."""
    if quick:
        shapes = [(256, 45.0, 6)] * 4
    else:
        shapes = ([(256, 60.0, 6)] * 10 + [(512, 60.0, 7)] * 5 + [(1024, 60.0, 8)] * 2 + [(2048, 45.0, 8)] * 2
                  + [(4096, 40.0, 8)])
    if n is not None:
        shapes = (shapes * (n // len(shapes) + 1))[:n]
    base = float(int(time.time() // 3600 * 3600) - 6 * 3600)  # inside retention, outside the head block
    specs, k = [], 0
    for i, (g, m, nf) in enumerate(shapes):
        specs.append(ScenarioSpec(gpus=g, minutes=m, seed=i, scrape_s=SCRAPE_S, start_unix=base,
                                  faults=tuple(FAULT_CLASS_NAMES[(k + j) % len(FAULT_CLASS_NAMES)] for j in range(nf))))
        k += nf
    return specs


def baseline_tree(ref: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return dest / "src"


def run_replay(src: Path, prom_url: str, topo: Path, start: float, end: float, out: Path) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "seamguard", "replay", "--prometheus", prom_url, "--topology", str(topo),
                        "--start", repr(start), "--end", repr(end), "--step", repr(SCRAPE_S), "--out", str(out)],
                       env=env, cwd=str(out.parent), capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"replay with {src} failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return time.monotonic() - t0


def _decoy_of(entity: str, kind: str, truth: dict) -> str:
    """Which everyday event a false flag sits on (from the scenario's truth), else 'unexplained'."""
    node = entity.split("/", 1)[0] if kind in ("gpu", "nic", "link") else entity if kind == "node" else None
    if kind == "gpu" and entity in truth["warm_but_healthy"]:
        return "warm_but_healthy"
    for e in truth["events"]:
        ent = e.get("entity")
        if ent is None:
            continue
        if ent == entity or (node is not None and e.get("kind") == "node" and ent == node) or \
                (kind == "gpu" and e.get("xid_gpu") == entity) or (node and e.get("kind") == "gpu"
                                                                   and ent.split("/", 1)[0] == node):
            return e["what"]
    if node is not None and any(w.split("/", 1)[0] == node for w in truth["warm_but_healthy"]):
        return "warm_but_healthy (node)"
    # Nothing happened to the entity itself: peer effects (checkpoint pauses and restarts of other jobs,
    # load changes, diurnal swings) or plain noise.
    return "no event on the entity" if kind != "job" else "job (no labelled fault)"


def aggregate(results: list[dict], truths: list[dict]) -> dict:
    """Overall and per-class figures over every scenario's scorecard."""
    incs = [i for r in results for i in r["incidents"]]
    ov = [r["overall"] for r in results]

    def figs(rows: list[dict]) -> dict:
        det = [i for i in rows if i["detected"]]
        d = [i["delay_s"] for i in det]
        leads = [i["lead_s"] for i in det if i["lead_s"] is not None]
        n = len(rows)
        return {"incidents": n, "recall": round(len(det) / n, 3) if n else None,
                "median_delay_s": round(float(np.median(d)), 1) if d else None,
                "p90_delay_s": round(float(np.percentile(d, 90)), 1) if d else None,
                "median_lead_s": round(float(np.median(leads)), 1) if leads else None,
                "min_lead_s": round(min(leads), 1) if leads else None,
                "hard_failures": sum(i["hard_failure"] is not None for i in rows),
                "hard_failures_unwarned": sum(i["missed_hard_failure"] for i in rows),
                "actions_per_fault": round(sum(i["actions"] for i in rows) / n, 3) if n else None,
                "checkpoint_requests_per_fault": round(sum(i["checkpoint_requests"] for i in rows) / n, 3) if n else None,
                "max_checkpoint_requests_per_fault": max((i["checkpoint_requests"] for i in rows), default=0),
                "max_checkpoint_requests_per_fault_and_job": max(
                    (i["max_checkpoint_requests_per_job"] for i in rows), default=0)}

    overall = figs(incs)
    flagged = sum(o["flagged_entities"] for o in ov)
    false = sum(o["false_flags"] for o in ov)
    by_cause: dict[str, int] = {}
    for r, tr in zip(results, truths):
        for key in r["false_flags"]:
            kind, ent = key.split(":", 1)
            c = _decoy_of(ent, kind, tr)
            by_cause[c] = by_cause.get(c, 0) + 1
    overall.update({
        "precision": round((flagged - false) / flagged, 3) if flagged else None,
        "flagged_entities": flagged, "false_flags": false,
        "false_flags_by_cause": dict(sorted(by_cause.items(), key=lambda kv: -kv[1])),
        "healthy_drains": sum(o["healthy_drains"] for o in ov),
        "actions": sum(o["actions"] for o in ov), "false_actions": sum(o["false_actions"] for o in ov),
        "actions_per_fault": round(sum(o["actions"] for o in ov) / len(incs), 3) if incs else None,
        "checkpoint_requests_per_fault": round(sum(o["checkpoint_requests"] for o in ov) / len(incs), 3) if incs else None,
        "controller_errors": sum(o["controller_errors"] for o in ov)})
    per_class = {c: figs([i for i in incs if i["fault"] == c]) for c in FAULT_CLASS_NAMES
                 if any(i["fault"] == c for i in incs)}
    for c in per_class:
        per_class[c]["precision"] = None  # a false flag belongs to no fault class: see false_flags_by_cause
    return {"overall": overall, "per_class": per_class}


def goals(agg: dict) -> dict:
    o = agg["overall"]
    cool = agg["per_class"].get("cooling_loop_flow", {})
    md = o["median_delay_s"]
    return {
        "recall>=0.95": o["recall"] is not None and o["recall"] >= GOALS["recall"],
        "precision>=0.95": o["precision"] is not None and o["precision"] >= GOALS["precision"],
        "healthy_drains==0": o["healthy_drains"] == 0,
        "median_delay<=3_scrapes": md is not None and md <= GOALS["median_delay_scrapes"] * SCRAPE_S,
        "cooling_lead>=60s": cool.get("min_lead_s") is not None and cool["min_lead_s"] >= GOALS["cooling_lead_s"]
        and cool.get("hard_failures_unwarned", 1) == 0,
        # A fault episode is a job's: a failing loop exposes every job it cools, each asked once.
        "checkpoint_now<=1_per_fault_episode_of_a_job": o["max_checkpoint_requests_per_fault_and_job"]
        <= GOALS["max_checkpoint_requests_per_fault_and_job"],
    }


def _f(v: object) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def print_table(cur: dict, base: dict, ref: str) -> None:
    keys = ("recall", "median_delay_s", "p90_delay_s", "median_lead_s", "min_lead_s", "actions_per_fault",
            "checkpoint_requests_per_fault", "max_checkpoint_requests_per_fault",
            "max_checkpoint_requests_per_fault_and_job")
    print("\noverall                          current      " + ref)
    for k in ("precision", "flagged_entities", "false_flags", "healthy_drains", "actions", "false_actions",
              *keys, "controller_errors"):
        print(f"  {k:<32}{_f(cur['overall'].get(k)):>10}  {_f(base['overall'].get(k)):>10}")
    print("  false flags by cause (current):  " + json.dumps(cur["overall"]["false_flags_by_cause"]))
    print(f"  false flags by cause ({ref}):  " + json.dumps(base["overall"]["false_flags_by_cause"]))
    print("\nper class (current | previous): n  recall  median delay s  p90 delay s  median lead s  actions/f  ckpt/f")
    for c, f in cur["per_class"].items():
        b = base["per_class"].get(c, {})
        cells = [f"{_f(f.get(k))}|{_f(b.get(k))}" for k in ("recall", "median_delay_s", "p90_delay_s",
                                                                   "median_lead_s", "actions_per_fault",
                                                                   "checkpoint_requests_per_fault")]
        print(f"  {c:<20}{f['incidents']:>3}  " + "  ".join(f"{x:>13}" for x in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 scenarios of 256 GPUs (about 1-2 minutes)")
    ap.add_argument("--scenarios", type=int, default=None, help="run only this many (the plan repeats)")
    ap.add_argument("--baseline-ref", default="715ae99", help="git revision of the previous detector")
    ap.add_argument("--current-src", type=Path, default=ROOT / "src",
                    help="source tree of the current detector (default: this checkout's src)")
    ap.add_argument("--keep", type=Path, default=None, help="keep scenario files and timelines here")
    ap.add_argument("--rescore", type=Path, default=None,
                    help="score the timelines a --keep run left in this folder again (after a change to the "
                         "scoring rules), without generating or replaying anything")
    args = ap.parse_args()
    if args.rescore is not None:
        return rescore(args.rescore, args.baseline_ref)

    t_all = time.monotonic()
    specs = plan(args.quick, args.scenarios)
    work = Path(tempfile.mkdtemp(prefix="seamguard-detection-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    base_src = baseline_tree(args.baseline_ref, work / "baseline")
    cur_src = args.current_src.resolve()
    res: dict[str, list[dict]] = {"current": [], "baseline": []}
    truths: list[dict] = []
    timing = {"generate_s": 0.0, "backfill_s": 0.0, "replay_current_s": 0.0, "replay_baseline_s": 0.0}
    for k, spec in enumerate(specs):
        d = work / f"s{k:02d}-{spec.gpus}"
        t0 = time.monotonic()
        gen = generate_files(spec, d)
        timing["generate_s"] += time.monotonic() - t0
        timing["backfill_s"] += backfill_file(gen.openmetrics, d / "tsdb")
        gen.openmetrics.unlink()
        fleet = load_topology(gen.topology)
        rel = Relations(fleet)
        incidents = load_labels(gen.labels)
        truth = json.loads(gen.truth.read_text())
        truths.append(truth)
        with PrometheusServer(d / "prom", tsdb_dir=d / "tsdb", lookback_delta="45s") as prom:
            order = [("current", cur_src), ("baseline", base_src)]
            if k % 2:
                order.reverse()  # interleaved: neither detector always runs on a warm server
            for name, src in order:
                out = d / f"{name}.jsonl"
                timing[f"replay_{name}_s"] += run_replay(src, prom.url, gen.topology, gen.start, gen.end, out)
                # Generated labels are exact, so no tolerance before the start (operators' labels need one).
                res[name].append(score(incidents, read_timeline(out), rel, tolerance_s=0.0))
        c, b = res["current"][-1]["overall"], res["baseline"][-1]["overall"]
        print(f"[{k + 1}/{len(specs)}] {spec.gpus} GPUs, {spec.minutes:g} min, seed {spec.seed}, "
              f"{sum(i.fault != 'maintenance' for i in incidents)} faults: current recall {_f(c['recall'])} precision {_f(c['precision'])} "
              f"drains {c['healthy_drains']} | {args.baseline_ref} recall {_f(b['recall'])} "
              f"precision {_f(b['precision'])} drains {b['healthy_drains']}", file=sys.stderr, flush=True)
        if args.keep is None:
            import shutil

            shutil.rmtree(d / "tsdb", ignore_errors=True)
    cur = aggregate(res["current"], truths)
    base = aggregate(res["baseline"], truths)
    print_table(cur, base, args.baseline_ref)
    out = {"benchmark": "detection", "quick": args.quick, "scenarios": len(specs),
           "gpus": sorted({s.gpus for s in specs}), "faults": sum(len(s.faults) for s in specs),
           "scrape_s": SCRAPE_S, "baseline_ref": args.baseline_ref,
           "wall_s": round(time.monotonic() - t_all, 1), "timing_s": {k: round(v, 1) for k, v in timing.items()},
           "current": cur, "baseline": base, "goals_current": goals(cur), "goals_baseline": goals(base)}
    print(json.dumps(out))


def rescore(folder: Path, ref: str) -> None:
    """Score kept timelines again: same scenarios, same replays, the current scoring rules."""
    t0 = time.monotonic()
    res: dict[str, list[dict]] = {"current": [], "baseline": []}
    truths, dirs = [], sorted(d for d in folder.iterdir() if d.is_dir() and d.name[:1] == "s")
    if not dirs:
        raise SystemExit(f"error: --rescore {folder}: no scenario folders (s00-…) from a --keep run")
    for d in dirs:
        rel = Relations(load_topology(d / "topology.yaml"))
        incidents = load_labels(d / "labels.yaml")
        truths.append(json.loads((d / "truth.json").read_text()))
        for name in res:
            res[name].append(score(incidents, read_timeline(d / f"{name}.jsonl"), rel, tolerance_s=0.0))
    cur, base = aggregate(res["current"], truths), aggregate(res["baseline"], truths)
    print_table(cur, base, ref)
    print(json.dumps({"benchmark": "detection", "rescored_from": str(folder), "scenarios": len(dirs),
                      "faults": sum(r["overall"]["incidents"] for r in res["current"]), "scrape_s": SCRAPE_S,
                      "baseline_ref": ref, "wall_s": round(time.monotonic() - t0, 1), "current": cur,
                      "baseline": base, "goals_current": goals(cur), "goals_baseline": goals(base)}))


if __name__ == "__main__":
    main()
