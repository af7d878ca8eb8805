"""Fault drill (issue 14): does the controller fail safe at its edges and under storms?

Against a 2,048-GPU fleet in enforce mode with the log actuator:

1. outage      — the real shell path (`Runner.from_config`: PrometheusLiveSource ->
                 Controller -> LogActuator) reads a real Prometheus scraping
                 `seamguard twin serve` through `seamguard.testbed.faults.PromFaultProxy`;
                 Prometheus becomes unreachable for several ticks (connection refused,
                 then 503): `actions_during_outage` counts new actions (goal 0).
2. loop deaths — the same runner through every proxy fault (malformed kinds, huge,
                 drip, slow, partial, truncated): `loop_deaths` counts exceptions that
                 escape a tick (goal 0); tick seconds per fault against the deadline.
3. storms      — the Controller fed twin frames where every GPU reports XID 79 at once,
                 and where a few more nodes fail every window (creeping):
                 `max_capacity_removed_share` (nodes drained / nodes, fleet and worst
                 cooling loop) against the policy's breaker bounds.
4. crash       — a child process ticks a Controller on a persistent ledger and log file
                 and is killed with SIGKILL at random moments, then restarted; the log
                 file and the ledger are checked: no action applied twice, none lost.
5. bad input   — the CLI (`fleet validate`, `policy validate`, `run --config`,
                 `replay`) on bad files (alias bomb, non-UTF-8, missing, directory,
                 corrupt ledger, hypothesis-generated YAML): `tracebacks_on_user_error`.

The last line of stdout is one JSON object. `--quick` runs fewer ticks and trials
(said in the JSON) and finishes in about two minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from seamguard.act.log import LogActuator  # noqa: E402
from seamguard.control import Controller  # noqa: E402
from seamguard.decide.policy import default_policy  # noqa: E402
from seamguard.fleet import fleet_to_topology  # noqa: E402
from seamguard.fleet.model import Kind  # noqa: E402
from seamguard.observe.frame import make_frame  # noqa: E402
from seamguard.twin.closedloop import build  # noqa: E402
from seamguard.twin.telemetry import Twin  # noqa: E402

TICK_S = 5.0


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "n": len(xs)}


def log(msg: str) -> None:
    print(f"[fault_drill {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- 1 + 2: outage and loop deaths through the real shell path ------------------------------------
def drill_prometheus(work: Path, gpus: int, quick: bool) -> dict:
    from seamguard.app.config import load_run_config
    from seamguard.app.runner import Runner
    from seamguard.testbed.faults import MALFORMED, PromFaultProxy
    from seamguard.testbed.prom import PrometheusServer, free_port

    port = free_port()
    topo = work / "topology.yaml"
    speed = 5.0  # one twin tick (5 s) per wall second
    twin = subprocess.Popen(
        [sys.executable, "-m", "seamguard", "twin", "serve", "--gpus", str(gpus), "--seed", "1", "--minutes", "60",
         "--tick-s", str(TICK_S), "--speed", str(speed), "--port", str(port), "--topology-out", str(topo)],
        env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: dict = {}
    try:
        assert twin.stdout is not None
        twin.stdout.readline()  # the URL line: serving
        with PrometheusServer(work / "prom", targets=[f"127.0.0.1:{port}"], scrape_interval="1s") as prom, \
                PromFaultProxy(upstream=prom.url) as proxy:
            prom.wait_targets_up(60)
            time.sleep(2.0)
            deadline_s = 2.0
            cfg = {"version": 1, "topology": str(topo), "mode": "enforce", "tick_s": TICK_S, "time_scale": speed,
                   "ledger": str(work / "ledger.db"),
                   "prometheus": {"url": proxy.url, "timeout_s": 1.5, "deadline_s": deadline_s, "retries": 1,
                                  "max_concurrency": 4, "max_response_bytes": 32 << 20},
                   "actuators": [{"type": "log", "path": str(work / "actions.jsonl")}]}
            (work / "run.yaml").write_text(yaml.safe_dump(cfg))
            runner = Runner.from_config(load_run_config(work / "run.yaml"), speed=0)
            act = LogActuator(work / "actions.jsonl")
            deaths: list[str] = []
            tick_s: dict[str, list[float]] = {}

            def tick(label: str) -> None:
                t = time.monotonic()
                try:
                    rep = runner.tick_once()
                    if rep.error:
                        tick_s.setdefault("tick_errors", []).append(1.0)
                except Exception as e:  # this is what kills `seamguard run`
                    deaths.append(f"{label}: {type(e).__name__}: {e}")
                tick_s.setdefault(label, []).append(time.monotonic() - t)
                time.sleep(max(0.0, TICK_S / speed - (time.monotonic() - t)))

            for _ in range(4 if quick else 10):
                tick("healthy")
            before = len(act.records())
            outage_ticks = 5 if quick else 12
            proxy.set("refuse")
            for _ in range(outage_ticks):
                tick("outage_refused")
            proxy.set("status", status_code=503)
            for _ in range(outage_ticks):
                tick("outage_503")
            during = act.records()[before:]
            proxy.clear()
            for _ in range(2):
                tick("healthy")
            out["actions_during_outage"] = len(during)
            out["outage_ticks"] = 2 * outage_ticks
            out["outage_actions_by_verb"] = dict(Counter(f"{r['op']}:{r.get('verb')}" for r in during))
            modes = [("slow", {"delay_s": 5.0}), ("drip", {"chunk": 64, "interval_s": 0.05}),
                     ("huge", {"size_bytes": 64 << 20}), ("huge", {"size_bytes": 64 << 20, "declare_length": False}),
                     ("partial", {"keep": 0.5}), ("truncate", {"keep": 0.5})]
            modes += [("malformed", {"kind": k}) for k in sorted(MALFORMED)]
            reps = 1 if quick else 3
            for mode, kw in modes * reps:
                proxy.set(mode, **kw)
                tick(f"{mode}:{kw.get('kind', '') or kw.get('declare_length', '')}".rstrip(":"))
            proxy.clear()
            tick("healthy")
            runner.stop()
            out["loop_deaths"] = len(deaths)
            out["loop_death_examples"] = deaths[:3]
            out["fault_ticks"] = len(modes) * reps
            out["tick_errors"] = len(tick_s.pop("tick_errors", []))
            out["deadline_s"] = deadline_s
            out["tick_seconds"] = {k: stats(v) for k, v in tick_s.items()}
    finally:
        twin.terminate()
        try:
            twin.wait(20)
        except subprocess.TimeoutExpired:
            twin.kill()
    return out


# ---- 3: storms ------------------------------------------------------------------------------------
def xid_frames(fleet, cfg, n: int, failing_at) -> list:
    """Twin frames (no twin faults) where GPUs of ``failing_at(k)`` nodes report XID 79 at tick k."""
    tw = Twin(fleet, [], cfg, 0)
    node_of_gpu = np.asarray(fleet.gpu_node)
    frames = []
    for k in range(n):
        f = tw.step()
        v = dict(f.values)
        x = np.zeros(len(fleet.gpu_names))
        bad = failing_at(k)
        if len(bad):
            x[np.isin(node_of_gpu, bad)] = 79.0
        v["DCGM_FI_DEV_XID_ERRORS"] = x
        frames.append(make_frame(fleet, f.t_s, v))
    return frames


def removed_share(fleet, held: set[str]) -> tuple[float, float]:
    drained = [k.split(":", 1)[1] for k in held if k.startswith("drain:")]
    if not drained:
        return 0.0, 0.0
    idx = [fleet.index_of(Kind.NODE, n) for n in drained if n in fleet.node_names]
    loops = np.bincount(np.asarray(fleet.node_loop)[idx], minlength=len(fleet.loop_names))
    size = np.bincount(np.asarray(fleet.node_loop), minlength=len(fleet.loop_names))
    return len(idx) / len(fleet.node_names), float((loops / np.maximum(size, 1)).max())


def drill_storms(work: Path, gpus: int, quick: bool) -> dict:
    fleet, _, cfg = build(gpus, 60.0, 0, tick_s=TICK_S)
    pol = default_policy(mode="enforce")
    n_nodes = len(fleet.node_names)
    rng = np.random.default_rng(0)
    order = rng.permutation(n_nodes)
    n = 30 if quick else 90
    per_window = 6  # creeping: six more nodes fail every window of 3 ticks (past every bound by the end)
    storms = {
        "xid79_all_at_once": lambda k: np.arange(n_nodes) if k >= 5 else np.array([], dtype=int),
        "creeping": lambda k: order[: per_window * max(0, (k - 5) // 3 + 1)] if k >= 5 else np.array([], dtype=int),
    }
    b = pol.breaker
    # The rate bounds (newly restricted per window) and, where the policy has them, the totals
    # (restricted at once; hard failures such as XID 79 bypass the rate, never the total).
    bound = {"fleet": b.max_fleet_fraction, "loop": b.max_loop_fraction,
             "in_effect_fleet": getattr(b, "max_in_effect_fleet_fraction", None),
             "in_effect_loop": getattr(b, "max_in_effect_loop_fraction", None)}
    out: dict = {"breaker_bound": bound, "ticks": n}
    for name, failing in storms.items():
        act = LogActuator(work / f"storm_{name}.jsonl")
        ctl = Controller(fleet, pol, [act], None, tick_s=TICK_S, mode="enforce")
        worst_fleet = worst_loop = 0.0
        errors = 0
        t_ticks = []
        for f in xid_frames(fleet, cfg, n, failing):
            t = time.monotonic()
            rep = ctl.tick(f)
            t_ticks.append(time.monotonic() - t)
            errors += bool(rep.error)
            fs, ls = removed_share(fleet, act.observe())
            worst_fleet, worst_loop = max(worst_fleet, fs), max(worst_loop, ls)
        out[name] = {"fleet": round(worst_fleet, 4), "worst_loop": round(worst_loop, 4),
                     "within_rate_bound": worst_fleet <= bound["fleet"] + 1e-9 and worst_loop <= bound["loop"] + 1e-9,
                     "within_in_effect_bound": None if bound["in_effect_fleet"] is None else
                     worst_fleet <= bound["in_effect_fleet"] + 1e-9 and worst_loop <= bound["in_effect_loop"] + 1e-9,
                     "failing_nodes_at_end": int(len(failing(n - 1))), "tick_errors": errors,
                     "breaker_tripped": ctl.breaker.tripped, "tick_seconds": stats(t_ticks)}
    return out


# ---- 4: crash trials ------------------------------------------------------------------------------
def crash_frames(path: Path, gpus: int, n: int) -> None:
    """A cycling scenario with many applies and reverts: nodes fail (XID 79) and come back."""
    fleet, _, cfg = build(gpus, 60.0, 0, tick_s=TICK_S)
    rng = np.random.default_rng(1)
    n_nodes = len(fleet.node_names)
    sets = [rng.choice(n_nodes, 6, replace=False) for _ in range(n // 6 + 1)]
    frames = xid_frames(fleet, cfg, n, lambda k: sets[k // 6] if (k // 3) % 2 == 0 else np.array([], dtype=int))
    arrays = {"t_s": np.array([f.t_s for f in frames])}
    for name in frames[0].values:
        arrays[name] = np.stack([f.values[name] for f in frames])
    np.savez(path, **arrays)


def child(work: Path, gpus: int, max_ticks: int) -> None:
    """Tick a Controller on the persistent ledger and log file until killed (or max_ticks)."""
    from seamguard.ledger.sqlite import Ledger

    fleet, _, _ = build(gpus, 60.0, 0, tick_s=TICK_S)
    z = np.load(work / "frames.npz")
    data = {k: z[k] for k in z.files}
    pol = default_policy(mode="enforce", breaker={"max_fleet_fraction": 1.0, "max_loop_fraction": 1.0})
    ledger = Ledger(work / "crash_ledger.db")
    ctl = Controller(fleet, pol, [LogActuator(work / "crash_actions.jsonl")], ledger, tick_s=TICK_S,
                     mode="enforce")
    print("ready", flush=True)
    n = len(data["t_s"])
    for _ in range(max_ticks):
        k = ctl.tick_no
        i = k % n
        f = make_frame(fleet, k * TICK_S, {s: data[s][i] for s in data if s != "t_s"})
        ctl.tick(f)
    ledger.close()


def drill_crash(work: Path, gpus: int, trials: int) -> dict:
    import sqlite3

    crash_frames(work / "frames.npz", gpus, 60)
    rng = random.Random(7)
    restart_s: list[float] = []
    kills_at: list[float] = []
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(work), "--gpus", str(gpus)]
    for _ in range(trials):
        t0 = time.monotonic()
        p = subprocess.Popen(cmd + ["--child-ticks", "100000"], env=env(), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        assert p.stdout is not None
        p.stdout.readline()  # ready: imports done, ledger restored
        restart_s.append(time.monotonic() - t0)
        wait = rng.uniform(0.0, 1.5)
        kills_at.append(wait)
        time.sleep(wait)
        p.send_signal(signal.SIGKILL)
        p.wait()
    # A last clean run settles what the last kill left pending.
    subprocess.run(cmd + ["--child-ticks", "3"], env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, timeout=120)
    recs = LogActuator(work / "crash_actions.jsonl").records()
    held: set[str] = set()
    dup = 0
    for r in recs:
        if r["op"] == "apply":
            dup += r["key"] in held
            held.add(r["key"])
        else:
            dup += r["key"] not in held
            held.discard(r["key"])
    db = sqlite3.connect(work / "crash_ledger.db")
    rows = Counter((op, key) for op, key in db.execute(
        "SELECT op, key FROM actions WHERE status='done'"))
    pend = db.execute("SELECT COUNT(*) FROM actions WHERE status='pending'").fetchone()[0]
    ticks = db.execute("SELECT COUNT(*) FROM ticks WHERE wall_finished IS NOT NULL").fetchone()[0]
    db.close()
    logged = Counter((r["op"], r["key"]) for r in recs)
    lost = sum(max(rows[k] - logged[k], 0) for k in rows)  # ledger says done, the world never saw it
    unrecorded = sum(max(logged[k] - rows[k], 0) for k in logged)  # the world saw it, the ledger lost it
    return {"crash_trials": trials, "duplicate_or_lost_actions": dup + lost + unrecorded,
            "duplicates": dup, "lost": lost, "unrecorded": unrecorded, "pending_after_settle": pend,
            "actions_logged": len(recs), "ticks_completed": ticks, "kill_after_ready_s": stats(kills_at),
            "restart_to_ready_s": stats(restart_s)}


# ---- 5: bad input ---------------------------------------------------------------------------------
def drill_inputs(work: Path, quick: bool) -> dict:
    from typer.testing import CliRunner

    from seamguard.app.cli import app
    from seamguard.fleet.generate import FleetShape, generate_fleet

    d = work / "inputs"
    d.mkdir()
    topo = d / "topology.yaml"
    topo.write_text(yaml.safe_dump(fleet_to_topology(generate_fleet(FleetShape(gpus=16), seed=0))))
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = "\n".join(lines) + "\n"
    while len(bomb) < 27_000:
        bomb += "\n".join(x.replace("a", f"b{len(bomb)}_") for x in lines) + "\n"
    files = {"bomb.yaml": bomb.encode(), "latin1.yaml": b"version: 1\ntopology: caf\xe9.yaml\n",
             "binary.yaml": os.urandom(2048), "empty.yaml": b"", "list.yaml": b"- 1\n- 2\n",
             "deep.yaml": b"[" * 5000 + b"]" * 5000, "tab.yaml": b"a:\n\t- b\n"}
    for name, data in files.items():
        (d / name).write_bytes(data)
    garbage_db = d / "garbage.db"
    garbage_db.write_bytes(b"\x00not sqlite\xff" * 500)
    good_cfg = {"version": 1, "topology": str(topo), "mode": "enforce", "tick_s": 0.5, "max_ticks": 1,
                "prometheus": {"url": "http://127.0.0.1:9", "deadline_s": 0.5, "retries": 0},
                "actuators": [{"type": "log", "path": str(d / "a.jsonl")}]}
    (d / "corrupt_ledger.yaml").write_text(yaml.safe_dump({**good_cfg, "ledger": str(garbage_db)}))
    (d / "ledger_is_dir.yaml").write_text(yaml.safe_dump({**good_cfg, "ledger": str(d)}))
    (d / "ledger_bad_path.yaml").write_text(yaml.safe_dump({**good_cfg, "ledger": "/proc/nope/l.db"}))
    bad = [d / n for n in files] + [d / "missing.yaml", d]
    cases = []
    for p in bad:
        cases += [["fleet", "validate", str(p)], ["policy", "validate", str(p)], ["run", "--config", str(p)]]
        cases.append(["replay", "--prometheus", "http://127.0.0.1:9", "--topology", str(p), "--start", "0",
                      "--end", "10", "--out", str(d / "o.jsonl")])
    for n in ("corrupt_ledger.yaml", "ledger_is_dir.yaml", "ledger_bad_path.yaml"):
        cases.append(["run", "--config", str(d / n)])
    cases += [["replay", "--prometheus", "ftp://x", "--topology", str(topo), "--start", "0", "--end", "10",
               "--out", str(d / "o.jsonl")],
              ["replay", "--prometheus", "http://127.0.0.1:9", "--topology", str(topo), "--start", "soon",
               "--end", "10", "--out", str(d / "o.jsonl")],
              ["replay", "--prometheus", "http://127.0.0.1:9", "--topology", str(topo), "--start", "0",
               "--end", "10", "--out", str(d)]]
    tracebacks: list[str] = []
    slowest = 0.0
    # Whole processes for the fixed set: what a person running the command sees.
    for args in cases:
        t = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-m", "seamguard", *args], env=env(), capture_output=True,
                               text=True, timeout=60)
            text = r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            text = "TIMEOUT"
        slowest = max(slowest, time.monotonic() - t)
        if "Traceback" in text or text == "TIMEOUT":
            tracebacks.append(" ".join(args[:2] + [Path(args[-1]).name if len(args) < 5 else ""]) + " -> " +
                              (text.strip().splitlines() or [""])[-1][:160])
    # Hypothesis-generated config files, in process (CliRunner: an escaped exception = a traceback).
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                        st.text(max_size=20))
    keys = st.sampled_from(["version", "topology", "policy", "mode", "tick_s", "time_scale", "ledger",
                            "prometheus", "actuators", "url", "timeout_s", "deadline_s", "type", "path",
                            "breaker", "max_fleet_fraction", "assess", "window_s", "racks", "nodes", "x"])
    docs = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(keys, c, max_size=5)),
                        max_leaves=20)
    cli = CliRunner()
    generated = [0]

    @settings(max_examples=25 if quick else 150, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(doc=docs, which=st.sampled_from(["fleet validate", "policy validate", "run --config"]))
    def one(doc, which) -> None:
        p = d / "gen.yaml"
        if isinstance(doc, dict) and which == "run --config":
            doc = {**doc, "max_ticks": 1, "tick_s": 0.5}
        p.write_text(yaml.safe_dump(doc))
        r = cli.invoke(app, [*which.split(), str(p)])
        generated[0] += 1
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            tracebacks.append(f"{which} <generated> -> {type(r.exception).__name__}: {r.exception}"[:200])

    one()
    return {"inputs_tried": len(cases) + generated[0], "inputs_fixed": len(cases), "inputs_generated": generated[0],
            "tracebacks_on_user_error": len(tracebacks), "traceback_examples": tracebacks[:5],
            "slowest_input_s": round(slowest, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--trials", type=int, default=None, help="crash trials (default 60, --quick 12)")
    ap.add_argument("--skip", default="", help="comma list of drills to skip: prometheus,storms,crash,inputs")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-ticks", type=int, default=100000, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        child(a.child, a.gpus, a.child_ticks)
        return
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    skip = set(filter(None, a.skip.split(",")))
    trials = a.trials if a.trials is not None else (12 if a.quick else 60)
    t0 = time.monotonic()
    res: dict = {"bench": "fault_drill", "gpus": a.gpus, "quick": a.quick, "mode": "enforce", "actuator": "log"}
    with tempfile.TemporaryDirectory(prefix="fault-drill-") as tmp:
        work = Path(tmp)
        for name, fn in (("prometheus", lambda w: drill_prometheus(w, a.gpus, a.quick)),
                         ("storms", lambda w: drill_storms(w, a.gpus, a.quick)),
                         ("crash", lambda w: drill_crash(w, a.gpus, trials)),
                         ("inputs", lambda w: drill_inputs(w, a.quick))):
            if name in skip:
                continue
            w = work / name
            w.mkdir()
            t = time.monotonic()
            log(f"{name} ...")
            try:
                res[name] = fn(w)
            except Exception as e:  # one drill that cannot run (no prometheus binary) does not hide the rest
                res[name] = {"error": f"{type(e).__name__}: {e}"}
            res[name]["wall_s"] = round(time.monotonic() - t, 1)
            log(f"{name} done in {res[name]['wall_s']} s")
    p, s, c, i = (res.get(k, {}) for k in ("prometheus", "storms", "crash", "inputs"))
    bound = s.get("breaker_bound", {})
    res["summary"] = {
        "actions_during_outage": {"value": p.get("actions_during_outage"), "goal": 0},
        "loop_deaths": {"value": p.get("loop_deaths"), "goal": 0},
        "max_capacity_removed_share": {
            k: {"fleet": s.get(k, {}).get("fleet"), "worst_loop": s.get(k, {}).get("worst_loop"),
                "goal_fleet": bound.get("fleet"), "goal_loop": bound.get("loop"),
                "goal_in_effect_fleet": bound.get("in_effect_fleet"), "goal_in_effect_loop": bound.get("in_effect_loop")}
            for k in ("xid79_all_at_once", "creeping")},
        "crash_trials": {"value": c.get("crash_trials"), "goal": ">= 50" + (" (quick: fewer)" if a.quick else "")},
        "duplicate_or_lost_actions": {"value": c.get("duplicate_or_lost_actions"), "goal": 0},
        "tracebacks_on_user_error": {"value": i.get("tracebacks_on_user_error"), "inputs_tried": i.get("inputs_tried"),
                                     "goal": 0},
    }
    res["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
