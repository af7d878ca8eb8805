"""Detection on independent scenarios: seamguard beside the rules operators deploy today,
on the development seeds and on held-out ones.

Two arms of scenario histories (seamguard.scenarios; the generator's physics and noise
share nothing with the detector, and its version is recorded in the result):

  dev      seeds 0.., the development physics and the 13 classes each of which has a channel;
  heldout  seeds 1000.., never used while developing, SHIFTED physics (gradual and intermittent
           onsets, ±2 % flow noise, healthy error backgrounds on every counter, checkpoints up
           to 5 min, stale exporters, PCIe links idling at Gen1) and four more classes: three
           written with no channel of their own (PCIe downtrain, host memory errors to an
           uncorrectable one, HBM heat seen only in an unmapped series) and NVSwitch SXids
           (non-fatal climbing, then a fatal one that stops the node's NVLink domain).

For each scenario:

  1. write it as OpenMetrics and backfill a TSDB with `promtool tsdb create-blocks-from`;
     the same scrapes feed the operator rules (benchmarks/_operator_rules.py: fatal XID and
     DCGM health-watch drain, link-down drain, NVSentinel-style checks), which write a timeline;
  2. start a real Prometheus on it (lookback 45 s, 1.5 scrapes);
  3. run `python -m seamguard replay` over the window with the current source tree (and,
     with --previous REF, a `git archive` of an older detector too);
  4. score every timeline with seamguard.app.eval against the labels, identically.

Scores: recall, per-class p50/p90 delay, healthy drains, precision per flagged entity and
per ALARM (one alarm per detected incident however many entities it flagged; false flags
on one node, or on one cooling loop within 5 min, are one false alarm).

Prints tables, then (last line) one JSON object.

    python benchmarks/detection.py --quick      # 2 + 2 scenarios of 256 GPUs, ~1-2 min
    python benchmarks/detection.py              # 20 dev + 20 held-out scenarios, 256-4,096 GPUs
    python benchmarks/detection.py --arms heldout --scenarios 8
    python benchmarks/detection.py --keep DIR   # ... and keep scenarios and timelines in DIR
    python benchmarks/detection.py --rescore DIR  # score DIR's timelines again (scoring rules changed)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "src", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from _operator_rules import OperatorRules  # noqa: E402
from _record import provenance  # noqa: E402
from seamguard.app.eval import Relations, load_labels, read_timeline, score  # noqa: E402
from seamguard.app.config import load_topology  # noqa: E402
from seamguard.scenarios import ScenarioSpec, generate_files, scenario_fleet  # noqa: E402
from seamguard.scenarios.backfill import backfill_file  # noqa: E402
from seamguard.scenarios.faults import FAULT_CLASS_NAMES, HELDOUT_CLASS_NAMES, HELDOUT_ONLY  # noqa: E402
from seamguard.scenarios.shifted import GENERATOR_VERSION  # noqa: E402
from seamguard.testbed.prom import PrometheusServer  # noqa: E402

SCRAPE_S = 30.0
ALARM_MERGE_S = 300.0
GOALS = {"recall": 0.95, "precision": 0.95, "healthy_drains": 0, "median_delay_scrapes": 3.0,
         "cooling_lead_s": 60.0, "max_checkpoint_requests_per_fault_and_job": 1}


# The named channels written for each held-out class (docs/evaluation.md). A class with none is
# seen, if at all, through the series nobody named (hbm_heat: DCGM_FI_DEV_MEMORY_TEMP); a class
# not listed here counts as having none.
HELDOUT_CHANNELS: dict[str, tuple[str, ...]] = {
    "pcie_downtrain": ("pcie_link",), "host_memory_ue": ("host_memory",), "hbm_heat": (),
    "nvswitch_sxid": ("nvswitch", "nvswitch_fatal")}


ARMS = {"dev": (0, "dev", FAULT_CLASS_NAMES), "heldout": (1000, "shifted", HELDOUT_CLASS_NAMES)}
DETECTORS = ("seamguard", "operator_rules")


def plan(arm: str, quick: bool, n: int | None, seed_offset: int = 0) -> list[ScenarioSpec]:
    """(gpus, minutes, faults per scenario) per scenario; the arm's seeds in order, its classes in turn."""
    seed0, physics, classes = ARMS[arm]
    seed0 += seed_offset
    if quick:
        shapes = [(256, 45.0, 6)] * 2
    else:
        shapes = ([(256, 60.0, 6)] * 10 + [(512, 60.0, 7)] * 5 + [(1024, 60.0, 8)] * 2 + [(2048, 45.0, 8)] * 2
                  + [(4096, 40.0, 8)])
    if n is not None:
        shapes = (shapes * (n // len(shapes) + 1))[:n]
    base = float(int(time.time() // 3600 * 3600) - 6 * 3600)  # inside retention, outside the head block
    specs, k = [], 0
    for i, (g, m, nf) in enumerate(shapes):
        specs.append(ScenarioSpec(gpus=g, minutes=m, seed=seed0 + i, scrape_s=SCRAPE_S, start_unix=base,
                                  physics=physics,
                                  faults=tuple(classes[(k + j) % len(classes)] for j in range(nf))))
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


def _parents(fleet) -> dict[tuple[str, str], tuple[int, int]]:
    """(kind, entity) -> (node, cooling loop) for everything that sits on a node; -1 where none."""
    f = fleet
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for n, name in enumerate(f.node_names):
        out["node", name] = (n, int(f.node_loop[n]))
    for g, name in enumerate(f.gpu_names):
        n = int(f.gpu_node[g])
        out["gpu", name] = (n, int(f.node_loop[n]))
    for i, name in enumerate(f.nic_names):
        n = int(f.nic_node[i])
        out["nic", name] = (n, int(f.node_loop[n]))
    for i, name in enumerate(f.link_names):
        nic = int(f.link_nic[i])
        n = int(f.nic_node[nic]) if nic >= 0 else -1
        out["link", name] = (n, int(f.node_loop[n]) if n >= 0 else -1)
    return out


def alarms(result: dict, events: list[dict], fleet, truth: dict | None = None) -> dict:
    """Alarms, not entities: a detected incident is one correct alarm however many entities it flagged
    (a loop fault flags every GPU on the loop); false flags on one node are one false alarm, and
    false flags on one cooling loop starting within ``ALARM_MERGE_S`` of each other are one too.
    With the scenario's ``truth``, each false alarm is put down to what sits on its first entity."""
    correct = sum(i["detected"] for i in result["incidents"])
    first: dict[tuple[str, str], float] = {}
    for ev in events:
        if ev.get("entity") is not None and ev.get("to") not in (None, "healthy") and not ev.get("action"):
            first.setdefault((str(ev["kind"]), str(ev["entity"])), float(ev["t"]))
    parents = _parents(fleet)
    groups: list[tuple[set[int], int, float, float]] = []  # (nodes, loop, first t, last t)
    false_keys = [tuple(k.split(":", 1)) for k in result["false_flags"]]
    loose = 0
    causes: list[tuple[str, str]] = []  # the first entity of each false alarm
    for key in sorted(false_keys, key=lambda k: first.get(k, 0.0)):
        node, loop = parents.get(key, (-1, -1))
        t = first.get(key, 0.0)
        if node < 0:
            loose += 1  # a job, a storage path, a loop, a link with no NIC: an alarm of its own
            causes.append(key)
            continue
        for nodes, lp, t0, t1 in groups:
            if node in nodes or (lp == loop and loop >= 0 and t - t1 <= ALARM_MERGE_S):
                nodes.add(node)
                groups[groups.index((nodes, lp, t0, t1))] = (nodes, lp, t0, max(t1, t))
                break
        else:
            groups.append(({node}, loop, t, t))
            causes.append(key)
    false = loose + len(groups)
    out = {"alarms": correct + false, "correct_alarms": correct, "false_alarms": false}
    if truth is not None:
        by: dict[str, int] = {}
        for kind, ent in causes:
            c = f"{kind}: " + _decoy_of(ent, kind, truth)
            by[c] = by.get(c, 0) + 1
        out["false_alarms_by_cause"] = by
    return out


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
    al = [r["alarms"] for r in results if "alarms" in r]
    if al:
        n_al, n_ok = sum(a["alarms"] for a in al), sum(a["correct_alarms"] for a in al)
        overall.update({"alarms": n_al, "false_alarms": n_al - n_ok,
                        "precision_per_alarm": round(n_ok / n_al, 3) if n_al else None})
        by_alarm: dict[str, int] = {}
        for a in al:
            for c, k in a.get("false_alarms_by_cause", {}).items():
                by_alarm[c] = by_alarm.get(c, 0) + k
        overall["false_alarms_by_cause"] = dict(sorted(by_alarm.items(), key=lambda kv: -kv[1]))
    per_class = {c: figs([i for i in incs if i["fault"] == c]) for c in HELDOUT_CLASS_NAMES
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
        "precision_per_alarm>=0.95": o.get("precision_per_alarm") is not None
        and o["precision_per_alarm"] >= GOALS["precision"],
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


def print_table(arm: str, aggs: dict[str, dict]) -> None:
    names = list(aggs)
    print(f"\n== {arm}: overall" + "".join(f"{n:>16}" for n in names))
    for k in ("recall", "precision_per_alarm", "alarms", "false_alarms", "precision", "flagged_entities",
              "false_flags", "healthy_drains", "actions", "false_actions", "median_delay_s", "p90_delay_s",
              "median_lead_s", "min_lead_s", "hard_failures_unwarned", "actions_per_fault",
              "checkpoint_requests_per_fault", "max_checkpoint_requests_per_fault_and_job", "controller_errors"):
        print(f"  {k:<42}" + "".join(f"{_f(aggs[n]['overall'].get(k)):>16}" for n in names))
    for n in names:
        print(f"  false flags by cause ({n}): " + json.dumps(aggs[n]["overall"]["false_flags_by_cause"]))
        print(f"  false alarms by cause ({n}): " + json.dumps(aggs[n]["overall"].get("false_alarms_by_cause", {})))
    print(f"\n== {arm}: per class, " + " | ".join(names) + ": n  recall  p50 delay s  p90 delay s")
    for c, f in aggs[names[0]]["per_class"].items():
        cells = ["|".join(_f(aggs[n]["per_class"].get(c, {}).get(k)) for n in names)
                 for k in ("recall", "median_delay_s", "p90_delay_s")]
        print(f"  {c:<20}{f['incidents']:>3}  " + "  ".join(f"{x:>13}" for x in cells))


def run_scenario(spec: ScenarioSpec, d: Path, sources: dict[str, Path], flip: bool, timing: dict) -> tuple[dict, dict]:
    """Generate, backfill, replay every source tree, run the operator rules; (scorecards, truth)."""
    rules = OperatorRules(scenario_fleet(spec.gpus, spec.seed))
    t0 = time.monotonic()
    gen = generate_files(spec, d, also=rules)
    timing["generate_s"] += time.monotonic() - t0
    timing["backfill_s"] += backfill_file(gen.openmetrics, d / "tsdb")
    gen.openmetrics.unlink()
    fleet = load_topology(gen.topology)
    rel = Relations(fleet)
    incidents = load_labels(gen.labels)
    with open(d / "operator_rules.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in rules.events)
    with PrometheusServer(d / "prom", tsdb_dir=d / "tsdb", lookback_delta="45s") as prom:
        order = list(sources.items())
        if flip:
            order.reverse()  # interleaved: no detector always runs on a warm server
        for name, src in order:
            timing[f"replay_{name}_s"] = timing.get(f"replay_{name}_s", 0.0) + run_replay(
                src, prom.url, gen.topology, gen.start, gen.end, d / f"{name}.jsonl")
    shutil.rmtree(d / "tsdb", ignore_errors=True)
    return score_dir(d, [*sources, "operator_rules"], fleet, rel, incidents), json.loads(gen.truth.read_text())


def score_dir(d: Path, names: list[str], fleet, rel: Relations, incidents: list) -> dict:
    """Every timeline in ``d`` scored identically (generated labels are exact: no tolerance before a start)."""
    out = {}
    truth = json.loads((d / "truth.json").read_text()) if (d / "truth.json").exists() else None
    for name in names:
        events = read_timeline(d / f"{name}.jsonl")
        r = score(incidents, events, rel, tolerance_s=0.0)
        r["alarms"] = alarms(r, events, fleet, truth)
        out[name] = r
    return out


def arm_result(arm: str, specs: list[ScenarioSpec], per: dict[str, list[dict]], truths: list[dict]) -> dict:
    aggs = {n: aggregate(rows, truths) for n, rows in per.items()}
    print_table(arm, aggs)
    return {"seeds": [s.seed for s in specs], "physics": specs[0].physics if specs else None,
            "scenarios": len(specs), "gpus": sorted({s.gpus for s in specs}),
            "faults": sum(len(s.faults) for s in specs),
            "classes_without_channel": [c for c in HELDOUT_ONLY if not HELDOUT_CHANNELS.get(c)
                                        and any(c in s.faults for s in specs)],
            **aggs, "goals_seamguard": goals(aggs["seamguard"]), "goals_operator_rules": goals(aggs["operator_rules"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 scenarios of 256 GPUs per arm (about 1-2 minutes)")
    ap.add_argument("--arms", default="dev,heldout", help="comma-separated: dev, heldout (default both)")
    ap.add_argument("--scenarios", type=int, default=None, help="run only this many per arm (the plan repeats)")
    ap.add_argument("--previous", default=None, metavar="REF",
                    help="also replay the detector of this git revision (the previous detector), interleaved")
    ap.add_argument("--current-src", type=Path, default=ROOT / "src",
                    help="source tree of the current detector (default: this checkout's src)")
    ap.add_argument("--keep", type=Path, default=None, help="keep scenario files and timelines here")
    ap.add_argument("--rescore", type=Path, default=None,
                    help="score the timelines a --keep run left in this folder again (after a change to the "
                         "scoring rules), without generating or replaying anything")
    ap.add_argument("--seed-offset", type=int, default=0,
                    help="add this to every arm's seeds: develop on seeds far from the held-out ones "
                         "(e.g. 2000 puts the held-out arm on 3000..) and report the held-out arm at offset 0")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise SystemExit(f"error: --arms {args.arms!r}: expected a comma-separated subset of {', '.join(ARMS)}")
    if args.rescore is not None:
        return rescore(args.rescore)

    t_all, started = time.monotonic(), provenance()
    work = Path(tempfile.mkdtemp(prefix="seamguard-detection-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    sources = {"seamguard": args.current_src.resolve()}
    if args.previous:
        sources["previous"] = baseline_tree(args.previous, work / "previous")
    timing = {"generate_s": 0.0, "backfill_s": 0.0}
    out_arms = {}
    for arm in arms:
        specs = plan(arm, args.quick, args.scenarios, args.seed_offset)
        per: dict[str, list[dict]] = {n: [] for n in [*sources, "operator_rules"]}
        truths = []
        for k, spec in enumerate(specs):
            d = work / arm / f"s{k:02d}-{spec.gpus}"
            cards, truth = run_scenario(spec, d, sources, bool(k % 2), timing)
            truths.append(truth)
            for n, r in cards.items():
                per[n].append(r)
            print(f"[{arm} {k + 1}/{len(specs)}] {spec.gpus} GPUs, {spec.minutes:g} min, seed {spec.seed}, "
                  f"{len(spec.faults)} faults: " + " | ".join(
                      f"{n} recall {_f(r['overall']['recall'])} alarms {r['alarms']['alarms']} "
                      f"(false {r['alarms']['false_alarms']}) drains {r['overall']['healthy_drains']}"
                      for n, r in cards.items()), file=sys.stderr, flush=True)
        out_arms[arm] = arm_result(arm, specs, per, truths)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    run = "quick" if args.quick else "full" if args.scenarios is None else f"first {args.scenarios} of the full plan"
    print(json.dumps({"benchmark": "detection", "generator_version": GENERATOR_VERSION, "quick": args.quick,
                      "run": run, "seed_offset": args.seed_offset, "provenance": dict(started, loadavg_1m_end=round(os.getloadavg()[0], 2)),
                      "scrape_s": SCRAPE_S, "previous_ref": args.previous, "wall_s": round(time.monotonic() - t_all, 1),
                      "timing_s": {k: round(v, 1) for k, v in timing.items()}, "arms": out_arms}))


def rescore(folder: Path) -> None:
    """Score kept timelines again: same scenarios, same replays, the current scoring rules."""
    t0 = time.monotonic()
    out_arms = {}
    for arm_dir in sorted(p for p in folder.iterdir() if p.is_dir() and p.name in ARMS):
        # Only scenarios whose every timeline was written (a run stopped at a deadline leaves one half-done).
        dirs = sorted(d for d in arm_dir.iterdir() if d.is_dir() and d.name[:1] == "s" and (d / "truth.json").exists()
                      and (d / "seamguard.jsonl").exists() and (d / "operator_rules.jsonl").exists()
                      and not (d / "tsdb").exists())
        per: dict[str, list[dict]] = {}
        truths, specs = [], []
        for d in dirs:
            fleet = load_topology(d / "topology.yaml")
            names = sorted(p.stem for p in d.glob("*.jsonl"))
            cards = score_dir(d, names, fleet, Relations(fleet), load_labels(d / "labels.yaml"))
            truth = json.loads((d / "truth.json").read_text())
            truths.append(truth)
            sp = truth["spec"]
            specs.append(ScenarioSpec(gpus=sp["gpus"], minutes=sp["minutes"], seed=sp["seed"], scrape_s=sp["scrape_s"],
                                      faults=tuple(sp["faults"]), physics=sp.get("physics", "dev")))
            for n, r in cards.items():
                per.setdefault(n, []).append(r)
        if dirs:
            out_arms[arm_dir.name] = arm_result(arm_dir.name, specs, per, truths)
    if not out_arms:
        raise SystemExit(f"error: --rescore {folder}: no dev/ or heldout/ scenario folders from a --keep run")
    print(json.dumps({"benchmark": "detection", "rescored_from": str(folder), "generator_version": GENERATOR_VERSION,
                      "provenance": provenance(), "scrape_s": SCRAPE_S, "wall_s": round(time.monotonic() - t0, 1),
                      "arms": out_arms}))


if __name__ == "__main__":
    main()
