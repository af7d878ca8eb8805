"""Fault drill (issue 14): does the controller fail safe at its edges and under storms?

Every drill runs twice, side by side, on the same inputs and fault schedules: against the
controller before this round's fail-safe work (baseline, a `git archive` of --baseline-ref,
default 715ae99) and against the current one (a `git archive` of HEAD, or --current-src).
Each side runs in its own processes with PYTHONPATH set to its tree, through its own entry
points (the baseline keeps its run loop in `seamguard.live`, the current one in
`seamguard.app.runner`). The harness (twin, Prometheus, fault proxy, frame generation) is
the current tree's. A 2,048-GPU fleet in enforce mode with the log actuator:

1. outage      — the shell path (current: `Runner.from_config(...).tick_once`; baseline: the
                 body of `LiveRunner.run`: `source.frame_at` then `controller.tick`) reads a
                 real Prometheus scraping `seamguard twin serve` through
                 `seamguard.testbed.faults.PromFaultProxy`. Both sides tick in turn (order
                 alternating) against the same proxy. Prometheus becomes unreachable for
                 several ticks (connection refused, then 503): `actions_during_outage` counts
                 new actions in each side's log file (goal 0).
2. loop deaths — the same two runners through every proxy fault (malformed kinds, huge,
                 drip, slow, partial, truncated): `loop_deaths` counts exceptions that escape
                 a tick (what ends `seamguard run`; goal 0). A tick still running after
                 --hang-cap-s is counted in `ticks_hung` (goal 0), its process killed and
                 restarted on the same ledger and log file. Config fields a side does not
                 know (the baseline has no `deadline_s`, `max_response_bytes`) are left out
                 of its config and listed in the output.
3. storms      — each side's Controller fed the same twin frames where every GPU reports
                 XID 79 at once, and where six more nodes fail every window (creeping):
                 `max_capacity_removed_share` (nodes drained / nodes, fleet and worst cooling
                 loop; also any restriction) against the current policy's breaker bounds.
4. crash       — a child process ticks a Controller on a persistent ledger and log file
                 and is killed with SIGKILL after the same random delays on both sides, then
                 restarted; the log file and the ledger are checked: no action applied twice,
                 none lost (`duplicate_or_lost_actions`, goal 0, over >= 50 trials per side).
5. bad input   — the CLI (`fleet validate`, `policy validate`, `run --config`, `replay`) on
                 bad files (alias bomb, non-UTF-8, missing, directory, corrupt ledger) as
                 whole processes, and hypothesis-generated YAML (generated once by the harness:
                 the same documents for both sides) in process: `tracebacks_on_user_error` (goal 0).

Prints a side-by-side table (goal, baseline, current; tick seconds as median [min-max]
and the ratio current/baseline), then, last line, one JSON object.

    python benchmarks/fault_drill.py --quick    # fewer ticks and inputs, 6 kill trials a side, ~2 min
    python benchmarks/fault_drill.py            # 60 kill trials a side
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
TICK_S = 5.0
SIDES = ("baseline", "current")
NODE_VERBS = ("drain", "label_degraded")  # the verbs that take a node's capacity away


def src_env(src: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(src)
    return e


def stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "n": len(xs)}


def log(msg: str) -> None:
    print(f"[fault_drill {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def order(k: int) -> tuple[str, ...]:
    """Interleaved: baseline first on even rounds, current first on odd ones."""
    return SIDES if k % 2 == 0 else SIDES[::-1]


def read_log(path: Path) -> list[dict]:
    """A log actuator's records (torn or foreign lines skipped), read without either side's code."""
    out = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "op" in r and "key" in r:
            out.append(r)
    return out


def key_verb_entity(key: str) -> tuple[str, str]:
    verb, _, rest = key.partition(":")
    return verb, rest.partition("@")[0].partition("=")[0]


# ---- trees -------------------------------------------------------------------------------------------
def export_tree(ref: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return dest / "src"


def src_dir(d: Path) -> Path:
    """A tree given as its root (with src/) or as its src/ directory."""
    d = d.resolve()
    if (d / "src" / "seamguard").is_dir():
        return d / "src"
    if (d / "seamguard").is_dir():
        return d
    raise SystemExit(f"error: {d} holds no seamguard package (neither {d}/src/seamguard nor {d}/seamguard)")


def rev(ref: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True,
                          check=True).stdout.strip()


# ---- frames: generated once by the harness, read by each side with its own make_frame ------------------
def save_frames(path: Path, fleet, frames: list) -> None:
    from seamguard.observe.signals import REGISTRY

    arrays = {"t_s": np.array([f.t_s for f in frames])}
    for name in frames[0].values:
        arrays[name] = np.stack([f.values[name] for f in frames])
    np.savez(path, **arrays)
    kinds = {REGISTRY[n].kind for n in frames[0].values}
    names = {k.name: fleet.names(k) for k in kinds}
    path.with_suffix(".names.json").write_text(json.dumps(names))


def load_frames(path: Path, fleet) -> tuple[list[tuple[float, dict]], list[str]]:
    """(t_s, values) per frame for this tree's fleet; signals this tree does not know are dropped (listed)."""
    from seamguard.fleet.model import Kind
    from seamguard.observe.signals import REGISTRY

    z = np.load(path)
    names = json.loads(path.with_suffix(".names.json").read_text())
    for k, ns in names.items():
        if fleet.names(Kind[k]) != ns:
            raise RuntimeError(f"this tree's fleet orders its {k} entities differently from the harness's")
    sigs = [s for s in z.files if s != "t_s" and s in REGISTRY]
    dropped = [s for s in z.files if s != "t_s" and s not in REGISTRY]
    data = {s: z[s] for s in sigs}
    return [(float(t), {s: data[s][i] for s in sigs}) for i, t in enumerate(z["t_s"])], dropped


def load_topology_any(path: Path):
    try:
        from seamguard.app.config import load_topology
    except ImportError:  # before the app/ split (715ae99)
        from seamguard.fleet import load_topology
    return load_topology(path)


def xid_frames(fleet, cfg, n: int, failing_at) -> list:
    """Twin frames (no twin faults) where GPUs of ``failing_at(k)`` nodes report XID 79 at tick k."""
    from seamguard.observe.frame import make_frame
    from seamguard.twin.telemetry import Twin

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


# ---- workers: run with PYTHONPATH = the tree under test ---------------------------------------------
def say(obj: dict) -> None:
    sys.stdout.write("@@" + json.dumps(obj) + "\n")
    sys.stdout.flush()


def worker_prom(work: Path, cfg_in: Path, wall0: float | None) -> None:
    """One side's live runner, ticked on request over stdin ("tick LABEL" / "stop")."""
    import logging

    import seamguard

    logging.disable(logging.CRITICAL)
    raw = yaml.safe_load(cfg_in.read_text())
    try:
        from seamguard.app.config import RunConfig, load_run_config
        style = "seamguard.app.runner.Runner.tick_once"
    except ImportError:  # before the app/ split (715ae99)
        from seamguard.live import RunConfig, load_run_config  # type: ignore[no-redef]
        style = "seamguard.live.LiveRunner.run (loop body: source.frame_at, controller.tick)"
    from seamguard.observe.prometheus import PromConfig

    dropped = [k for k in raw if k not in RunConfig.model_fields]
    dropped += [f"prometheus.{k}" for k in raw["prometheus"] if k not in PromConfig.model_fields]
    raw = {k: v for k, v in raw.items() if k in RunConfig.model_fields}
    raw["prometheus"] = {k: v for k, v in raw["prometheus"].items() if k in PromConfig.model_fields}
    (work / "run.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_run_config(work / "run.yaml")
    t0 = [wall0]
    if style.startswith("seamguard.app"):
        from seamguard.app.runner import Runner

        runner = Runner.from_config(cfg, speed=0)
        if wall0 is not None and hasattr(runner.source, "_wall0"):
            runner.source._wall0 = wall0  # a restart keeps the frame clock of the first run

        def tick():
            rep = runner.tick_once()
            t0[0] = getattr(runner.source, "_wall0", None)
            return rep

        def close() -> None:
            runner.stop()
    else:
        from seamguard.live import LiveRunner

        lr = LiveRunner(cfg)

        def tick():  # LiveRunner.run's loop body, one iteration (frame time: wall0 + elapsed * time_scale)
            wall = time.time()
            if t0[0] is None:
                t0[0] = wall
            frame = lr.source.frame_at(wall, t0[0] + (wall - t0[0]) * cfg.time_scale)
            return lr.controller.tick(frame)

        def close() -> None:
            lr.source.close()
            lr.ledger.close()
    say({"ready": True, "style": style, "config_fields_unknown": dropped, "seamguard": seamguard.__file__})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "stop":
            close()
            say({"stopped": True})
            return
        t = time.monotonic()
        err = death = None
        try:
            rep = tick()
            err = rep.error or None
        except Exception as e:  # noqa: BLE001 -- this is what ends `seamguard run`
            death = f"{type(e).__name__}: {e}"[:300]
        say({"dt": time.monotonic() - t, "error": err, "death": death, "wall0": t0[0]})


def worker_storms(work: Path, frames_list: list[Path]) -> None:
    """Each storm through this tree's Controller (default policy, enforce, log actuator)."""
    import logging

    from seamguard.act.log import LogActuator
    from seamguard.control import Controller
    from seamguard.decide.policy import default_policy
    from seamguard.observe.frame import make_frame

    logging.disable(logging.CRITICAL)
    fleet = load_topology_any(work.parent / "topology.yaml")
    nodes = set(fleet.node_names)
    out: dict = {}
    for fp in frames_list:
        frames, dropped = load_frames(fp, fleet)
        pol = default_policy(mode="enforce")
        logf = work / f"{fp.stem}.jsonl"
        logf.unlink(missing_ok=True)
        act = LogActuator(logf)
        ctl = Controller(fleet, pol, [act], None, tick_s=TICK_S, mode="enforce")
        per_tick, t_ticks, errors = [], [], 0
        for t_s, vals in frames:
            f = make_frame(fleet, t_s, vals)
            t = time.monotonic()
            rep = ctl.tick(f)
            t_ticks.append(time.monotonic() - t)
            errors += bool(rep.error)
            held = [key_verb_entity(k) for k in act.observe()]
            per_tick.append({"drained": sorted({e for v, e in held if v == "drain" and e in nodes}),
                             "restricted": sorted({e for v, e in held if v in NODE_VERBS and e in nodes})})
        out[fp.stem] = {"per_tick": per_tick, "tick_s": t_ticks, "tick_errors": errors,
                        "breaker_tripped": bool(ctl.breaker.tripped), "signals_unknown": dropped,
                        "breaker_policy": {k: v for k, v in pol.breaker.model_dump().items()
                                           if isinstance(v, (int, float)) and not isinstance(v, bool)}}
    (work / "storms.json").write_text(json.dumps(out))


def worker_crash_child(work: Path, frames: Path, max_ticks: int) -> None:
    """Tick a Controller on the persistent ledger and log file until killed (or max_ticks)."""
    import logging

    from seamguard.act.log import LogActuator
    from seamguard.control import Controller
    from seamguard.decide.policy import default_policy
    from seamguard.ledger.sqlite import Ledger
    from seamguard.observe.frame import make_frame

    logging.disable(logging.CRITICAL)
    fleet = load_topology_any(work.parent / "topology.yaml")
    data, _ = load_frames(frames, fleet)
    pol = default_policy(mode="enforce", breaker={"max_fleet_fraction": 1.0, "max_loop_fraction": 1.0})
    ledger = Ledger(work / "crash_ledger.db")
    ctl = Controller(fleet, pol, [LogActuator(work / "crash_actions.jsonl")], ledger, tick_s=TICK_S,
                     mode="enforce")
    print("ready", flush=True)
    n = len(data)
    errors: list[str] = []
    for _ in range(max_ticks):
        k = ctl.tick_no
        rep = ctl.tick(make_frame(fleet, k * TICK_S, data[k % n][1]))
        if rep.error:
            errors.append(str(rep.error)[:200])
    ledger.close()
    print(json.dumps({"tick_errors": len(errors), "first_error": errors[0] if errors else None}), flush=True)


def generate_inputs(path: Path, examples: int) -> str:
    """Hypothesis-generated YAML documents (derandomized), written once for both sides; their digest."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                        st.text(max_size=20))
    keys = st.sampled_from(["version", "topology", "policy", "mode", "tick_s", "time_scale", "ledger",
                            "prometheus", "actuators", "url", "timeout_s", "deadline_s", "type", "path",
                            "breaker", "max_fleet_fraction", "assess", "window_s", "racks", "nodes", "x"])
    docs = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(keys, c, max_size=5)),
                        max_leaves=20)
    out: list[dict] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(doc=docs, which=st.sampled_from(["fleet validate", "policy validate", "run --config"]))
    def one(doc, which) -> None:
        if isinstance(doc, dict) and which == "run --config":
            doc = {**doc, "max_ticks": 1, "tick_s": 0.5}
        out.append({"which": which, "text": yaml.safe_dump(doc)})

    one()
    text = json.dumps(out)
    path.write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def worker_inputs(work: Path, docs_file: Path) -> None:
    """The generated files through this tree's CLI in process (an escaped exception = a traceback)."""
    import logging

    from typer.testing import CliRunner

    try:
        from seamguard.app.cli import app
    except ImportError:  # before the app/ split (715ae99)
        from seamguard.cli import app  # type: ignore[no-redef]

    logging.disable(logging.CRITICAL)
    cli = CliRunner()
    tracebacks: list[str] = []
    slowest = 0.0
    docs = json.loads(docs_file.read_text())
    for d in docs:
        p = work / "gen.yaml"
        p.write_text(d["text"])
        t = time.monotonic()
        r = cli.invoke(app, [*d["which"].split(), str(p)])
        slowest = max(slowest, time.monotonic() - t)
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            tracebacks.append(f"{d['which']} <generated> -> {type(r.exception).__name__}: {r.exception}"[:200])
    (work / "inputs.json").write_text(json.dumps({"generated": len(docs), "tracebacks": tracebacks,
                                                  "slowest_s": round(slowest, 2)}))


# ---- 1 + 2: outage and loop deaths through each side's shell path -----------------------------------
class Worker:
    """A side's runner process, spoken to over stdin/stdout (lines starting '@@')."""

    def __init__(self, side: str, src: Path, work: Path, cfg: Path, wall0: float | None = None) -> None:
        self.side = side
        args = [sys.executable, str(THIS), "--worker", "prom", "--work", str(work), "--config", str(cfg)]
        if wall0 is not None:
            args += ["--wall0", repr(wall0)]
        self.err = open(work / "worker.stderr", "ab")  # noqa: SIM115 -- lives as long as the process
        self.proc = subprocess.Popen(args, env=src_env(src), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, bufsize=1)
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self.q.put(json.loads(line[2:]))
        self.q.put(None)

    def get(self, timeout: float) -> dict | None:
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def ask(self, cmd: str, timeout: float) -> dict | None:
        """The answer; None when the process died or did not answer within ``timeout``."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self.get(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.err.close()


def drill_prometheus(work: Path, srcs: dict[str, Path], harness: Path, gpus: int, quick: bool,
                     cap_s: float) -> dict:
    from http.server import ThreadingHTTPServer

    from seamguard.testbed.faults import MALFORMED, PromFaultProxy
    from seamguard.ports import free_port
    from seamguard.testbed.prom import PrometheusServer

    def quiet(self, request, client_address, _orig=ThreadingHTTPServer.handle_error) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            _orig(self, request, client_address)  # a killed (hung) runner's connection reset is expected

    ThreadingHTTPServer.handle_error = quiet  # type: ignore[method-assign]  # in this harness process only
    port = free_port()
    topo = work / "topology.yaml"
    speed = 5.0  # one twin tick (5 s) per wall second
    twin = subprocess.Popen(
        [sys.executable, "-m", "seamguard", "twin", "serve", "--gpus", str(gpus), "--seed", "1", "--minutes", "60",
         "--tick-s", str(TICK_S), "--speed", str(speed), "--port", str(port), "--topology-out", str(topo)],
        env=src_env(harness), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out: dict = {s: {} for s in SIDES}
    workers: dict[str, Worker] = {}
    try:
        assert twin.stdout is not None
        twin.stdout.readline()  # the URL line: serving
        with PrometheusServer(work / "prom", targets=[f"127.0.0.1:{port}"], scrape_interval="1s") as prom, \
                PromFaultProxy(upstream=prom.url) as proxy:
            prom.wait_targets_up(60)
            time.sleep(2.0)
            deadline_s = 2.0
            cfgs: dict[str, Path] = {}
            for s in SIDES:
                d = work / s
                d.mkdir()
                cfg = {"version": 1, "topology": str(topo), "mode": "enforce", "tick_s": TICK_S,
                       "time_scale": speed, "ledger": str(d / "ledger.db"),
                       "prometheus": {"url": proxy.url, "timeout_s": 1.5, "deadline_s": deadline_s, "retries": 1,
                                      "max_concurrency": 4, "max_response_bytes": 32 << 20},
                       "actuators": [{"type": "log", "path": str(d / "actions.jsonl")}]}
                cfgs[s] = d / "run.in.yaml"
                cfgs[s].write_text(yaml.safe_dump(cfg))
            deaths: dict[str, list[str]] = {s: [] for s in SIDES}
            hung: dict[str, list[str]] = {s: [] for s in SIDES}
            errors: dict[str, int] = {s: 0 for s in SIDES}
            tick_s: dict[str, dict[str, list[float]]] = {s: {} for s in SIDES}
            wall0: dict[str, float | None] = {s: None for s in SIDES}
            restarts: dict[str, int] = {s: 0 for s in SIDES}
            hung_labels: dict[str, Counter] = {s: Counter() for s in SIDES}

            pending: set[str] = set()

            def start(s: str) -> None:
                """Start a side's runner; it is waited for (ready) at its next tick, so a restart
                overlaps the other side's tick."""
                workers[s] = Worker(s, srcs[s], work / s, cfgs[s], wall0[s])
                pending.add(s)

            def ready(s: str) -> None:
                if s not in pending:
                    return
                pending.discard(s)
                r = workers[s].get(120)
                if not r or not r.get("ready"):
                    workers[s].kill()
                    tail = (work / s / "worker.stderr").read_text(errors="replace").strip().splitlines()[-1:]
                    raise RuntimeError(f"{s} runner did not start: {' '.join(tail)[:400]}")
                out[s].update(style=r["style"], config_fields_unknown=r["config_fields_unknown"])

            for s in SIDES:
                start(s)
            k_round = [0]

            def tick(label: str) -> None:
                t_round = time.monotonic()
                for s in order(k_round[0]):
                    ready(s)
                    r = workers[s].ask(f"tick {label}", cap_s)
                    if r is None:  # hung past the cap, or the process died: restart it on its ledger
                        alive = workers[s].proc.poll() is None
                        workers[s].kill()
                        (hung[s] if alive else deaths[s]).append(
                            f"{label}: " + (f"still in the tick after {cap_s:g} s" if alive else "process died"))
                        tick_s[s].setdefault(label, []).append(cap_s)
                        hung_labels[s][label] += 1
                        restarts[s] += 1
                        start(s)
                        continue
                    wall0[s] = r.get("wall0", wall0[s])
                    errors[s] += bool(r["error"])
                    if r["death"]:
                        deaths[s].append(f"{label}: {r['death']}")
                    tick_s[s].setdefault(label, []).append(r["dt"])
                k_round[0] += 1
                time.sleep(max(0.0, TICK_S / speed - (time.monotonic() - t_round)))

            for _ in range(2 if quick else 10):
                tick("healthy")
            before = {s: len(read_log(work / s / "actions.jsonl")) for s in SIDES}
            outage_ticks = 2 if quick else 12
            proxy.set("refuse")
            for _ in range(outage_ticks):
                tick("outage_refused")
            proxy.set("status", status_code=503)
            for _ in range(outage_ticks):
                tick("outage_503")
            during = {s: read_log(work / s / "actions.jsonl")[before[s]:] for s in SIDES}
            proxy.clear()
            for _ in range(2):
                tick("healthy")
            log("prometheus: outage done; proxy faults ...")
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
            for s in SIDES:
                ready(s)
                workers[s].ask("stop", 30)
                workers[s].kill()
            for s in SIDES:
                out[s].update({
                    "actions_during_outage": len(during[s]),
                    "outage_actions_by_verb": dict(Counter(f"{r['op']}:{r.get('verb')}" for r in during[s])),
                    "loop_deaths": len(deaths[s]), "loop_death_examples": deaths[s][:4],
                    "ticks_hung": len(hung[s]), "ticks_hung_examples": hung[s][:4], "restarts": restarts[s],
                    "hung_ticks_by_fault": dict(hung_labels[s]),
                    "tick_errors": errors[s],
                    "tick_seconds": {k: stats(v) for k, v in tick_s[s].items()}})
            out["outage_ticks"] = 2 * outage_ticks
            out["fault_ticks"] = len(modes) * reps
            out["deadline_s"] = deadline_s
            out["hang_cap_s"] = cap_s
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.kill()
        twin.terminate()
        try:
            twin.wait(20)
        except subprocess.TimeoutExpired:
            twin.kill()
    return out


# ---- 3: storms ------------------------------------------------------------------------------------
def shares(fleet, nodes: list[str]) -> tuple[float, float, float]:
    """Share of the fleet, of the worst cooling loop and of the worst rack taken by these nodes."""
    if not nodes:
        return 0.0, 0.0, 0.0
    from seamguard.fleet.model import Kind

    idx = [fleet.index_of(Kind.NODE, n) for n in nodes]
    res = [len(idx) / len(fleet.node_names)]
    for dom, count in ((np.asarray(fleet.node_loop), len(fleet.loop_names)),
                       (np.asarray(fleet.node_rack), len(fleet.rack_names))):
        hit = np.bincount(dom[idx], minlength=count)
        size = np.bincount(dom, minlength=count)
        res.append(float((hit / np.maximum(size, 1)).max()))
    return res[0], res[1], res[2]


def drill_storms(work: Path, srcs: dict[str, Path], gpus: int, quick: bool, fleet, cfg) -> dict:
    from seamguard.decide.policy import default_policy

    n_nodes = len(fleet.node_names)
    rng = np.random.default_rng(0)
    perm = rng.permutation(n_nodes)
    n = 30 if quick else 90
    per_window = 6  # creeping: six more nodes fail every window of 3 ticks (past every bound by the end)
    storms = {
        "xid79_all_at_once": lambda k: np.arange(n_nodes) if k >= 5 else np.array([], dtype=int),
        "creeping": lambda k: perm[: per_window * max(0, (k - 5) // 3 + 1)] if k >= 5 else np.array([], dtype=int),
    }
    files = []
    for name, failing in storms.items():
        p = work / f"{name}.npz"
        save_frames(p, fleet, xid_frames(fleet, cfg, n, failing))
        files.append(p)
    b = default_policy(mode="enforce").breaker
    # The rate bounds (newly restricted per window) and the totals (restricted at once; hard failures
    # such as XID 79 bypass the rate, never the total) of the current policy: the goals.
    bound = {"fleet": b.max_fleet_fraction, "loop": b.max_loop_fraction,
             "in_effect_fleet": getattr(b, "max_in_effect_fleet_fraction", None),
             "in_effect_loop": getattr(b, "max_in_effect_loop_fraction", None),
             "in_effect_rack": getattr(b, "max_in_effect_rack_fraction", None)}
    reps = 1 if quick else 3
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for r in range(reps):
        for s in order(r):
            d = work / f"{s}-{r}"
            d.mkdir()
            p = subprocess.run([sys.executable, str(THIS), "--worker", "storms", "--work", str(d),
                                "--frames", *map(str, files)], env=src_env(srcs[s]), capture_output=True, text=True,
                               timeout=900, check=False)
            if p.returncode != 0:
                raise RuntimeError(f"{s} storms failed: {p.stderr.strip().splitlines()[-1:]}")
            runs[s].append(json.loads((d / "storms.json").read_text()))
    out: dict = {"breaker_bound_goal": bound, "ticks": n, "repeats": reps}
    for s in SIDES:
        out[s] = {}
        for name, failing in storms.items():
            figs = []
            for run in runs[s]:
                st = run[name]
                worst = {"fleet": 0.0, "worst_loop": 0.0, "worst_rack": 0.0, "restricted_fleet": 0.0,
                         "restricted_worst_loop": 0.0}
                for t in st["per_tick"]:
                    f, lp, rk = shares(fleet, t["drained"])
                    rf, rl, _ = shares(fleet, t["restricted"])
                    for k, v in (("fleet", f), ("worst_loop", lp), ("worst_rack", rk), ("restricted_fleet", rf),
                                 ("restricted_worst_loop", rl)):
                        worst[k] = max(worst[k], v)
                figs.append(worst)
            st0 = runs[s][0][name]
            worst = {k: round(max(f[k] for f in figs), 4) for k in figs[0]}
            out[s][name] = {
                **worst,
                "same_every_repeat": all(f == figs[0] for f in figs),
                "within_rate_bound": worst["fleet"] <= bound["fleet"] + 1e-9
                and worst["worst_loop"] <= bound["loop"] + 1e-9,
                "within_in_effect_bound": None if bound["in_effect_fleet"] is None else
                worst["fleet"] <= bound["in_effect_fleet"] + 1e-9 and worst["worst_loop"] <= bound["in_effect_loop"] + 1e-9,
                "failing_nodes_at_end": len(failing(n - 1)),
                "tick_errors": sum(run[name]["tick_errors"] for run in runs[s]),
                "breaker_tripped": st0["breaker_tripped"],
                "tick_seconds": stats([x for run in runs[s] for x in run[name]["tick_s"]])}
        out[s]["breaker_policy"] = runs[s][0]["xid79_all_at_once"]["breaker_policy"]
        out[s]["signals_unknown"] = runs[s][0]["creeping"]["signals_unknown"]
    return out


# ---- 4: crash trials ------------------------------------------------------------------------------
def crash_frames(path: Path, fleet, cfg, n: int) -> None:
    """A cycling scenario with many applies and reverts: nodes fail (XID 79) and come back."""
    rng = np.random.default_rng(1)
    n_nodes = len(fleet.node_names)
    sets = [rng.choice(n_nodes, 6, replace=False) for _ in range(n // 6 + 1)]
    save_frames(path, fleet, xid_frames(fleet, cfg, n, lambda k: sets[k // 6] if (k // 3) % 2 == 0
                                        else np.array([], dtype=int)))


def check_crash(d: Path) -> dict:
    import sqlite3

    recs = read_log(d / "crash_actions.jsonl")
    held: set[str] = set()
    dup = 0
    for r in recs:
        if r["op"] == "apply":
            dup += r["key"] in held
            held.add(r["key"])
        else:
            dup += r["key"] not in held
            held.discard(r["key"])
    db = sqlite3.connect(d / "crash_ledger.db")
    rows = Counter((op, key) for op, key in db.execute("SELECT op, key FROM actions WHERE status='done'"))
    pend = db.execute("SELECT COUNT(*) FROM actions WHERE status='pending'").fetchone()[0]
    ticks = db.execute("SELECT COUNT(*) FROM ticks WHERE wall_finished IS NOT NULL").fetchone()[0]
    db.close()
    logged = Counter((r["op"], r["key"]) for r in recs)
    lost = sum(max(rows[k] - logged[k], 0) for k in rows)  # ledger says done, the world never saw it
    unrecorded = sum(max(logged[k] - rows[k], 0) for k in logged)  # the world saw it, the ledger lost it
    return {"duplicate_or_lost_actions": dup + lost + unrecorded, "duplicates": dup, "lost": lost,
            "unrecorded": unrecorded, "pending_after_settle": pend, "actions_logged": len(recs),
            "ticks_completed": ticks}


def drill_crash(work: Path, srcs: dict[str, Path], trials: int, fleet, cfg) -> dict:
    frames = work / "frames.npz"
    crash_frames(frames, fleet, cfg, 60)
    rng = random.Random(7)
    restart_s: dict[str, list[float]] = {s: [] for s in SIDES}
    kills_at: list[float] = []
    cmd = [sys.executable, str(THIS), "--worker", "crash-child", "--frames", str(frames), "--work"]
    for s in SIDES:
        (work / s).mkdir()
    for k in range(trials):
        wait = rng.uniform(0.0, 1.5)  # the same kill schedule for both sides
        kills_at.append(wait)
        for s in order(k):
            t0 = time.monotonic()
            p = subprocess.Popen(cmd + [str(work / s), "--child-ticks", "100000"], env=src_env(srcs[s]),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            assert p.stdout is not None
            p.stdout.readline()  # ready: imports done, ledger restored
            restart_s[s].append(time.monotonic() - t0)
            time.sleep(wait)
            p.send_signal(signal.SIGKILL)
            p.wait()
    out: dict = {"crash_trials": trials, "kill_after_ready_s": stats(kills_at)}
    for s in SIDES:
        # A last clean run settles what the last kill left pending.
        r = subprocess.run(cmd + [str(work / s), "--child-ticks", "3"], env=src_env(srcs[s]), capture_output=True,
                           text=True, timeout=120, check=False)
        try:
            settle = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            settle = {"tick_errors": None, "first_error": f"settle run exit {r.returncode}: {r.stderr[-200:]}"}
        out[s] = {**check_crash(work / s), "restart_to_ready_s": stats(restart_s[s]),
                  "settle_run_rc": r.returncode, "settle_tick_errors": settle["tick_errors"],
                  **({"settle_first_error": settle["first_error"]} if settle["first_error"] else {})}
    return out


# ---- 5: bad input ---------------------------------------------------------------------------------
def drill_inputs(work: Path, srcs: dict[str, Path], quick: bool) -> dict:
    from seamguard.fleet import fleet_to_topology
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
             "binary.yaml": random.Random(3).randbytes(2048), "empty.yaml": b"", "list.yaml": b"- 1\n- 2\n",
             "deep.yaml": b"[" * 5000 + b"]" * 5000, "tab.yaml": b"a:\n\t- b\n"}
    for name, data in files.items():
        (d / name).write_bytes(data)
    garbage_db = d / "garbage.db"
    garbage_db.write_bytes(b"\x00not sqlite\xff" * 500)
    good_cfg = {"version": 1, "topology": str(topo), "mode": "enforce", "tick_s": 0.5, "max_ticks": 1,
                "prometheus": {"url": "http://127.0.0.1:9", "retries": 0},
                "actuators": [{"type": "log", "path": str(d / "a.jsonl")}]}
    (d / "corrupt_ledger.yaml").write_text(yaml.safe_dump({**good_cfg, "ledger": str(garbage_db)}))
    (d / "ledger_is_dir.yaml").write_text(yaml.safe_dump({**good_cfg, "ledger": str(d)}))
    (d / "ledger_bad_path.yaml").write_text(yaml.safe_dump({**good_cfg, "ledger": "/proc/nope/l.db"}))
    bad = [d / n for n in files] + [d / "missing.yaml", d]
    cases = []
    for j, p in enumerate(bad):
        per_file = [["fleet", "validate", str(p)], ["policy", "validate", str(p)], ["run", "--config", str(p)],
                    ["replay", "--prometheus", "http://127.0.0.1:9", "--topology", str(p), "--start", "0",
                     "--end", "10", "--out", str(d / "o.jsonl")]]
        # --quick: half of the file x command matrix (every file, every command, alternating)
        cases += [c for m, c in enumerate(per_file) if not quick or m % 2 == j % 2]
    for n in ("corrupt_ledger.yaml", "ledger_is_dir.yaml", "ledger_bad_path.yaml"):
        cases.append(["run", "--config", str(d / n)])
    cases += [["replay", "--prometheus", "ftp://x", "--topology", str(topo), "--start", "0", "--end", "10",
               "--out", str(d / "o.jsonl")],
              ["replay", "--prometheus", "http://127.0.0.1:9", "--topology", str(topo), "--start", "soon",
               "--end", "10", "--out", str(d / "o.jsonl")],
              ["replay", "--prometheus", "http://127.0.0.1:9", "--topology", str(topo), "--start", "0",
               "--end", "10", "--out", str(d)]]
    out: dict = {s: {"tracebacks": [], "case_s": []} for s in SIDES}

    def one(s: str, args: list[str]) -> None:
        t = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-m", "seamguard", *args], env=src_env(srcs[s]), capture_output=True,
                               text=True, timeout=60, cwd=str(d), check=False)
            text = r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            text = "TIMEOUT"
        out[s]["case_s"].append(time.monotonic() - t)
        if "Traceback" in text or text == "TIMEOUT":
            f = args[args.index("--topology") + 1] if "--topology" in args else args[-1]
            what = " ".join(args[:2] if args[0] != "replay" else args[:1]) + " " + Path(f).name
            if args[0] == "replay" and Path(f).name == "topology.yaml":
                what += " " + " ".join(a for a in args[1:] if a.startswith(("ftp", "soon")) or a == str(d))
            out[s]["tracebacks"].append(what + " -> " + (text.strip().splitlines() or [""])[-1][:160])

    # Whole processes for the fixed set: what a person running the command sees. The two sides run the
    # same case at the same time (one process each, two cores), which side starts first alternating.
    for k, args in enumerate(cases):
        th = [threading.Thread(target=one, args=(s, args)) for s in order(k)]
        for t in th:
            t.start()
        for t in th:
            t.join()
    # Hypothesis-generated config files (generated once: the same documents for both), in process,
    # one worker per side.
    gen_file = work / "generated.json"
    digest = generate_inputs(gen_file, 20 if quick else 150)
    for s in order(1):
        w = work / f"gen-{s}"
        w.mkdir()
        p = subprocess.run([sys.executable, str(THIS), "--worker", "inputs", "--work", str(w), "--docs",
                            str(gen_file)], env=src_env(srcs[s]), capture_output=True, text=True, timeout=900,
                           check=False)
        if p.returncode != 0:
            out[s]["generated_error"] = (p.stderr.strip().splitlines() or ["?"])[-1][:300]
            out[s]["gen"] = {"generated": 0, "tracebacks": [], "slowest_s": None}
        else:
            out[s]["gen"] = json.loads((w / "inputs.json").read_text())
    res: dict = {"inputs_fixed": len(cases), "fixed_matrix": "half (quick)" if quick else "full",
                 "generated_inputs_sha256": digest}
    for s in SIDES:
        o, g = out[s], out[s]["gen"]
        tb = o["tracebacks"] + g["tracebacks"]
        res[s] = {"inputs_tried": len(cases) + g["generated"], "inputs_generated": g["generated"],
                  "tracebacks_on_user_error": len(tb), "tracebacks_fixed": len(o["tracebacks"]),
                  "tracebacks_generated": len(g["tracebacks"]), "traceback_examples": tb[:20],
                  "fixed_case_s": stats(o["case_s"]), "slowest_generated_s": g["slowest_s"],
                  **({"generated_error": o["generated_error"]} if "generated_error" in o else {})}
    return res


# ---- report ---------------------------------------------------------------------------------------
def _f(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _spread(st: dict) -> str:
    return f"{st['median']:.3g} [{st['min']:.3g}-{st['max']:.3g}]" if st else "-"


def _ratio(a: dict, b: dict) -> str:
    return f"{b['median'] / a['median']:.2f}" if a and b and a["median"] > 0 else "-"


def print_report(res: dict, ref: str) -> None:
    p, s, c, i = (res.get(k, {}) for k in ("prometheus", "storms", "crash", "inputs"))
    w = 34
    print(f"\n{'figure':<{w}}{'goal':>12}{ref:>14}{'current':>14}")

    def row(name: str, goal: object, b: object, cur: object) -> None:
        print(f"{name:<{w}}{_f(goal):>12}{_f(b):>14}{_f(cur):>14}")

    for k in ("actions_during_outage", "loop_deaths", "ticks_hung", "tick_errors"):
        if p and "error" not in p:
            row(k, 0 if k != "tick_errors" else "-", p.get("baseline", {}).get(k), p.get("current", {}).get(k))
    bound = s.get("breaker_bound_goal", {})
    for storm in ("xid79_all_at_once", "creeping"):
        for k, g in (("fleet", f"{_f(bound.get('fleet'))}/{_f(bound.get('in_effect_fleet'))}"),
                     ("worst_loop", f"{_f(bound.get('loop'))}/{_f(bound.get('in_effect_loop'))}"),
                     ("worst_rack", f"-/{_f(bound.get('in_effect_rack'))}"), ("restricted_fleet", "-"),
                     ("restricted_worst_loop", "-"), ("breaker_tripped", "-")):
            if s and "error" not in s:
                row(f"{storm[:9]} drained {k}" if "restricted" not in k and k != "breaker_tripped"
                    else f"{storm[:9]} {k}", g, s.get("baseline", {}).get(storm, {}).get(k),
                    s.get("current", {}).get(storm, {}).get(k))
    if c and "error" not in c:
        row("crash_trials (per side)", ">=50", c.get("crash_trials"), c.get("crash_trials"))
        for k in ("duplicate_or_lost_actions", "duplicates", "lost", "unrecorded", "pending_after_settle",
                  "actions_logged", "ticks_completed", "settle_tick_errors"):
            row(k, 0 if k not in ("actions_logged", "ticks_completed") else "-", c.get("baseline", {}).get(k),
                c.get("current", {}).get(k))
    if i and "error" not in i:
        for k in ("inputs_tried", "tracebacks_on_user_error", "tracebacks_fixed", "tracebacks_generated"):
            row(k, 0 if k != "inputs_tried" else "-", i.get("baseline", {}).get(k), i.get("current", {}).get(k))
    for name, d in (("prometheus", p), ("storms", s), ("crash", c), ("inputs", i)):
        if "error" in d:
            print(f"{name}: could not run: {d['error']}")
    if "error" not in p and p:
        b, cur = p["baseline"], p["current"]
        print(f"\ntick seconds by proxy fault, median [min-max]  (deadline {p['deadline_s']} s current only; "
              f"hung ticks, marked h, counted at the cap {p['hang_cap_s']:g} s: a lower bound)")
        print(f"{'fault':<30}{ref:>24}{'current':>24}{'cur/base':>10}")
        for k in cur["tick_seconds"]:
            bs, cs = b["tick_seconds"].get(k, {}), cur["tick_seconds"][k]
            cells = []
            for side, st in (("baseline", bs), ("current", cs)):
                h = p[side].get("hung_ticks_by_fault", {}).get(k, 0)
                cells.append(_spread(st) + (f" {h}h" if h else ""))
            hb = p["baseline"].get("hung_ticks_by_fault", {}).get(k, 0)
            ratio = ("<" if hb and hb == bs.get("n") else "") + _ratio(bs, cs)
            print(f"{k:<30}{cells[0]:>24}{cells[1]:>24}{ratio:>10}")
        for side in SIDES:
            if p[side].get("config_fields_unknown"):
                print(f"{side} runner does not know {', '.join(p[side]['config_fields_unknown'])}: "
                      "left out of its config")
            for e in p[side].get("loop_death_examples", []) + p[side].get("ticks_hung_examples", []):
                print(f"  {side}: {e}")
    if "error" not in c and c:
        bs, cs = c["baseline"]["restart_to_ready_s"], c["current"]["restart_to_ready_s"]
        print(f"\ncrash restart to ready s: {ref} {_spread(bs)}  current {_spread(cs)}  ratio {_ratio(bs, cs)}")
    if "error" not in s and s:
        for storm in ("xid79_all_at_once", "creeping"):
            bs, cs = s["baseline"][storm]["tick_seconds"], s["current"][storm]["tick_seconds"]
            print(f"storm {storm} tick s: {ref} {_spread(bs)}  current {_spread(cs)}  ratio {_ratio(bs, cs)}")
    if "error" not in i and i:
        for side in SIDES:
            for e in i[side]["traceback_examples"][:8]:
                print(f"  {side}: {e}")


def summary(res: dict, quick: bool) -> dict:
    p, s, c, i = (res.get(k, {}) for k in ("prometheus", "storms", "crash", "inputs"))

    def both(d: dict, k: str) -> dict:
        return {side: d.get(side, {}).get(k) for side in SIDES}

    bound = s.get("breaker_bound_goal", {})
    return {
        "actions_during_outage": {"goal": 0, **both(p, "actions_during_outage")},
        "loop_deaths": {"goal": 0, **both(p, "loop_deaths")},
        "ticks_hung": {"goal": 0, "cap_s": p.get("hang_cap_s"), **both(p, "ticks_hung")},
        "max_capacity_removed_share": {
            k: {"goal_fleet": bound.get("fleet"), "goal_loop": bound.get("loop"),
                "goal_in_effect_fleet": bound.get("in_effect_fleet"), "goal_in_effect_loop": bound.get("in_effect_loop"),
                **{side: {m: s.get(side, {}).get(k, {}).get(m) for m in ("fleet", "worst_loop")} for side in SIDES}}
            for k in ("xid79_all_at_once", "creeping")},
        "crash_trials": {"goal": ">= 50" + (" (quick: fewer)" if quick else ""),
                         **{side: c.get("crash_trials") if side in c else None for side in SIDES}},
        "duplicate_or_lost_actions": {"goal": 0, **both(c, "duplicate_or_lost_actions")},
        "tracebacks_on_user_error": {"goal": 0, **both(i, "tracebacks_on_user_error"),
                                     "inputs_tried": both(i, "inputs_tried")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer ticks and trials (about two minutes)")
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--trials", type=int, default=None, help="crash trials per side (default 60, --quick 6)")
    ap.add_argument("--skip", default="", help="comma list of drills to skip: prometheus,storms,crash,inputs")
    ap.add_argument("--baseline-ref", default="715ae99", help="git revision of the baseline (default 715ae99)")
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="baseline tree (root or src/); default: git archive of --baseline-ref into a temp dir")
    ap.add_argument("--current-src", type=Path, default=None,
                    help="current tree (root or src/), also the harness; default: git archive of HEAD into a temp dir")
    ap.add_argument("--hang-cap-s", type=float, default=None,
                    help="a tick still running after this long is hung (default 30, --quick 5: the tick period)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--config", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--wall0", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--frames", type=Path, nargs="*", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--docs", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-ticks", type=int, default=100000, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker == "prom":
        return worker_prom(a.work, a.config, a.wall0)
    if a.worker == "storms":
        return worker_storms(a.work, a.frames)
    if a.worker == "crash-child":
        return worker_crash_child(a.work, a.frames[0], a.child_ticks)
    if a.worker == "inputs":
        return worker_inputs(a.work, a.docs)
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    skip = set(filter(None, a.skip.split(",")))
    trials = a.trials if a.trials is not None else (6 if a.quick else 60)
    cap_s = a.hang_cap_s if a.hang_cap_s is not None else (5.0 if a.quick else 30.0)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fault-drill-") as tmp:
        work = Path(tmp)
        trees: dict[str, str] = {}
        if a.baseline_src is None:
            base = export_tree(a.baseline_ref, work / "tree-baseline")
            trees["baseline"] = f"git archive {rev(a.baseline_ref)}"
        else:
            base = src_dir(a.baseline_src)
            trees["baseline"] = f"given ({a.baseline_ref} expected)"
        if a.current_src is None:
            cur = export_tree("HEAD", work / "tree-current")
            trees["current"] = f"git archive {rev('HEAD')} (HEAD)"
        else:
            cur = src_dir(a.current_src)
            trees["current"] = "given"
        srcs = {"baseline": base, "current": cur}
        # The harness (twin, fleet, Prometheus, fault proxy) is the current tree.
        sys.path.insert(0, str(cur))
        from seamguard.fleet import fleet_to_topology
        from seamguard.twin.closedloop import build

        res: dict = {"bench": "fault_drill", "gpus": a.gpus, "quick": a.quick, "mode": "enforce", "actuator": "log",
                     "baseline_ref": a.baseline_ref, "trees": trees, "cpus": os.cpu_count()}
        fleet, _, cfg = build(a.gpus, 60.0, 0, tick_s=TICK_S)
        for name, fn in (("prometheus", lambda w: drill_prometheus(w, srcs, cur, a.gpus, a.quick, cap_s)),
                         ("storms", lambda w: drill_storms(w, srcs, a.gpus, a.quick, fleet, cfg)),
                         ("crash", lambda w: drill_crash(w, srcs, trials, fleet, cfg)),
                         ("inputs", lambda w: drill_inputs(w, srcs, a.quick))):
            if name in skip:
                continue
            w = work / name
            w.mkdir()
            (w / "topology.yaml").write_text(yaml.safe_dump(fleet_to_topology(fleet)))
            t = time.monotonic()
            log(f"{name} ...")
            try:
                res[name] = fn(w)
            except Exception as e:  # noqa: BLE001 -- one drill that cannot run (no prometheus binary) does not hide the rest
                res[name] = {"error": f"{type(e).__name__}: {e}"}
            res[name]["wall_s"] = round(time.monotonic() - t, 1)
            log(f"{name} done in {res[name]['wall_s']} s")
    res["summary"] = summary(res, a.quick)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    print_report(res, a.baseline_ref)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
