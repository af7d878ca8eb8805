"""Rail failover: seamguard's rails vs what a user would run without it, flap-free and flapped.

Systems, all the same model, data and update on the same namespaced testbed (4 hosts x
2 rails), the flaps on the primary rail (rail0):

* ``seamguard``: `seamguard/testbed/rails_job.py` over `RailGroup` (both rails, agreed failover),
  each all-reduce striped over both rails (the default).
* ``seamguard_standby``: the same job with ``RailSettings(chunks=1)`` (`seamguard launch
  --rail-mode standby`): one rail carries the all-reduce, the other takes over when it fails,
  the bond's own mode. Run by ``--steady`` always, by a flapped run with ``--standby``.
* ``bond_active_backup``: the user's first try, no code change — every host's rails
  bonded in active-backup mode, miimon 100 ms (`TestbedSpec(bond=True)`: the kernel's
  bond where the kernel has one, else the testbed's stand-in), plain DDP over gloo on
  ``bond0`` under `torch.distributed.run`, torch's default collective timeout.
* ``default_timeout``: plain DDP over gloo on rail0 under torchrun (elastic restarts,
  checkpoint every 20 steps), torch's default collective timeout (30 min).
* ``single_rail_restart``: the same with a 5 s collective timeout, so a long flap ends
  the collective and torchrun restarts the job from its last checkpoint.

Each repetition draws one flap schedule (seeded: distinct hosts, random start and
length) and runs every system on it, and every system flap-free, in an order rotated
from one repetition to the next (each system's flap-free run right before its flapped
one). A flapped run is sized to last 1.5x until the last flap ended plus a margin at the
fastest flap-free rate seen for that system, so every flap lands mid-training (a run that
ended before its last flap did is flagged ``outlasted``). ``--quick`` shares one flap-free
run between default_timeout and single_rail_restart: they are the same processes and
settings but for a collective timeout that no flap-free step comes near.

Figures per system: steady-state steps/s (flap-free run, first to last commit); failover
cost per flap = (flapped run's first-to-last-commit time - its steps at the flap-free
rate) / flaps, and the same measured inside the flapped run against the rate just before
each flap (immune to load drift between runs); the longest commit gap per flap;
restarts (failed worker groups). A run cut off at its deadline counts until then: its
figures are lower bounds. Medians over repetitions with min-max; seamguard vs each
baseline within a repetition. The last stdout line is one JSON object.

    PYTHONPATH=src python benchmarks/rail_failover.py --quick --out DIR
    PYTHONPATH=src python benchmarks/rail_failover.py --recompute DIR   # figures again, no runs
    PYTHONPATH=src python benchmarks/rail_failover.py --steady 5 --out DIR  # flap-free rounds only

``--steady N`` runs only flap-free runs of both seamguard modes and the bond, N rounds back
to back (the order rotating), so each round's steps/s ratios compare runs under the same
load: the steady-state cost of the rails, which a flapped repetition's rotated order
measures minutes apart.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from _record import provenance, write_result  # beside this file
from seamguard.testbed.job import SRC, Fault, FaultPlayer, FaultRecord, JobSpec, _env, run_rail_job
from seamguard.testbed.metrics import flap_figures
from seamguard.testbed.net import BOND_IF, Testbed, TestbedSpec

HERE = Path(__file__).resolve().parent
HOSTS, RAILS = 4, 2


@dataclass(frozen=True)
class Baseline:
    """A torchrun-launched DDP job: which testbed, which interface, which timeout."""

    bond: bool
    ifname: str
    timeout_s: float | None  # None: torch's default


BASELINES = {"bond_active_backup": Baseline(True, BOND_IF, None),
             "default_timeout": Baseline(False, "rail0", None),
             "single_rail_restart": Baseline(False, "rail0", 5.0)}
SEAMGUARD = {"seamguard": {}, "seamguard_standby": {"chunks": 1}}  # name -> RailSettings overrides
SYSTEMS = ["seamguard", *BASELINES]  # --standby adds seamguard_standby


@dataclass
class Run:
    commits: list[float]  # wall time each step (finally) committed, sorted
    rails: list[list[int]] | None  # rails each step used (seamguard only)
    records: list[FaultRecord]
    restarts: int
    completed: bool
    steps: int
    t_end: float  # when the run ended: its last commit, or when it was cut off
    wall_s: float = field(init=False)

    def __post_init__(self) -> None:
        # an unfinished run counts until it was cut off: its figures are lower bounds
        end = self.commits[-1] if self.completed else self.t_end
        self.wall_s = end - self.commits[0] if self.commits else float("nan")


def flap_schedule(seed: int, flaps: int, min_s: float, max_s: float) -> list[Fault]:
    """Flaps on rail0 of distinct hosts (never host 0, which holds the stores), each with a
    random length in [min_s, max_s], 2-3 s into training and 4-6 s apart. Distinct hosts:
    a bond that failed over stays on rail1 (no fail-back), so a second flap of the same
    host's rail0 would not touch it."""
    rng = np.random.default_rng(seed)
    hosts = rng.permutation(np.arange(1, HOSTS))[:flaps]
    out, t = [], float(rng.uniform(2.0, 3.0))
    for h in hosts:
        d = round(float(rng.uniform(min_s, max_s)), 2)
        out.append(Fault(round(t, 2), "flap", host=int(h), rail=0, duration_s=d))
        t += d + float(rng.uniform(4.0, 6.0))
    return out


def run_seamguard(steps: int, faults: list[Fault], out: Path, settings: dict) -> Run:
    with Testbed(TestbedSpec(hosts=HOSTS, rails=RAILS)) as tb:
        res = run_rail_job(tb, JobSpec(steps=steps, timeout_s=300, settings=settings), faults, out)
    if not res.ok:
        raise SystemExit(f"seamguard run failed: {res.returncodes}\n{res.stderr_tail}")
    return Run([s["t_wall"] for s in res.steps], [s["rails"] for s in res.steps], res.faults, 0, True, steps,
               res.steps[-1]["t_wall"])


def stop_agents(procs: list[subprocess.Popen], out: Path) -> None:
    """Stop torchrun agents and their workers (each worker is its own session, so a
    killed agent would orphan it): SIGTERM lets an agent stop its workers; whatever still
    runs after 10 s — agents, or workers of this run (found by their unique --out) — is killed."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 10.0
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    mark = f"--out\0{out}\0".encode()
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            if mark in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def restart_attempts(out: Path) -> int:
    """Worker groups torchrun saw fail (and so restarted), most seen by any host's agent:
    a restarted group that never forms its process group logs no step, so count here."""
    logs = [f.read_text(errors="replace") for f in out.glob("agent.*.txt")]
    return max((t.count("failed (exitcode") for t in logs), default=0)


def run_baseline(b: Baseline, steps: int, faults: list[Fault], out: Path, deadline_s: float) -> Run:
    out.mkdir(parents=True, exist_ok=True)
    env = {**_env(), "GLOO_SOCKET_IFNAME": b.ifname, "PYTHONPATH": SRC}
    extra = [] if b.timeout_s is None else ["--timeout-s", str(b.timeout_s)]
    with Testbed(TestbedSpec(hosts=HOSTS, rails=RAILS, bond=b.bond)) as tb:
        procs = []
        for h in range(HOSTS):
            cmd = [*tb.exec_prefix(h), sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS),
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "bench",
                   "--rdzv-endpoint", f"{tb.addr(0, None)}:29700", "--rdzv-conf", f"is_host={int(h == 0)}",
                   "--max-restarts", "30", "--monitor-interval", "0.1", "--local-addr", tb.addr(h, None),
                   str(HERE / "rail_failover_baseline_train.py"), "--steps", str(steps), "--out", str(out),
                   "--ckpt-every", "20", *extra]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True,
                                          stderr=(out / f"agent.{h}.txt").open("w")))
        player = FaultPlayer(tb, faults)
        log = out / "steps.0.jsonl"
        deadline = time.time() + deadline_s
        try:
            while time.time() < deadline and not (log.exists() and '"step": 0,' in log.read_text()):
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.05)
            player.start(time.time())
            while time.time() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            t_end = time.time()
        finally:
            player.stop()
            stop_agents(procs, out)
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    done = {}
    for r in rows:  # a step re-done after a restart counts when it finally committed
        if "event" not in r:
            done[r["step"]] = r["t_wall"]
    restarts = max([r["restart"] for r in rows if r.get("event") == "start"] + [restart_attempts(out)])
    ok = len(done) == steps and all(p.returncode == 0 for p in procs)
    return Run(sorted(done.values()), None, player.records, restarts, ok, steps, t_end)


def run_system(name: str, steps: int, faults: list[Fault], out: Path, deadline_s: float) -> Run:
    r = run_seamguard(steps, faults, out, SEAMGUARD[name]) if name in SEAMGUARD else \
        run_baseline(BASELINES[name], steps, faults, out, deadline_s)
    (out / "run.json").write_text(json.dumps({  # what the figures are computed from, to recompute them
        "commits": r.commits, "restarts": r.restarts, "completed": r.completed, "steps": r.steps, "t_end": r.t_end,
        "faults": [{**rec.fault.__dict__, "applied_t": rec.applied_t, "reverted_t": rec.reverted_t}
                   for rec in r.records]}))
    return r


def steady_rate(r: Run) -> float:
    """Steps per second between the first and the last commit."""
    return (len(r.commits) - 1) / r.wall_s


def lost_local(commits: list[float], applied_t: float, reverted_t: float, regain_s: float,
               pre_s: float = 3.0) -> float:
    """Seconds one flap cost measured inside its own run, immune to load drift between runs:
    from the flap's start until it ended and the rate was regained (+1 s), the time taken
    minus the time its commits took at the rate of the pre_s seconds before the flap."""
    t = np.asarray(commits)
    start = max(applied_t - pre_s, float(t[0]))  # training may have begun less than pre_s before
    pre = ((t >= start) & (t < applied_t)).sum() / max(applied_t - start, 1e-9)
    end = applied_t + max(reverted_t - applied_t, 0.0 if math.isnan(regain_s) else regain_s) + 1.0
    end = min(end, float(t[-1])) if not math.isnan(regain_s) else float(t[-1])
    if pre <= 0 or end <= applied_t:
        return float("nan")
    return float((end - applied_t) - ((t >= applied_t) & (t < end)).sum() / pre)


def flapped_figures(r: Run, rate_ff: float) -> dict:
    """Failover cost of a flapped run: against the same system's flap-free rate, and locally."""
    flaps = [rec for rec in r.records if rec.applied_t]
    commits = r.commits if r.completed else [*r.commits, r.t_end]  # cut off: the gap lasts until then
    figs = [flap_figures(commits, r.rails, RAILS, rec.applied_t, rec.reverted_t) for rec in flaps]
    local = [lost_local(commits, rec.applied_t, rec.reverted_t, f.regain_95_s) for rec, f in zip(flaps, figs)]
    extra = (r.wall_s - (len(r.commits) - 1) / rate_ff) / max(len(flaps), 1)
    outlasted = r.completed and (len(flaps) < len(r.records) or max(x.reverted_t for x in flaps) > r.commits[-1])
    return {"extra_s_per_flap": extra, "lost_s_local": local, "stall_s": [f.stall_s for f in figs],
            "outlasted": outlasted,
            "regain_95_s": [f.regain_95_s for f in figs], "restarts": r.restarts, "completed": r.completed,
            "steps": r.steps, "wall_s": r.wall_s, "flaps": len(flaps)}


def _json(o: object) -> object:
    return o.item() if hasattr(o, "item") else str(o)  # numpy scalars


def spread(xs: list[float]) -> dict:
    a = np.asarray([x for x in xs if not math.isnan(x)], dtype=float)
    if a.size == 0:
        return {"median": None, "min": None, "max": None, "n": 0}  # JSON has no NaN
    return {"median": round(float(np.median(a)), 4), "min": round(float(a.min()), 4),
            "max": round(float(a.max()), 4), "n": int(a.size)}


def summarize(reps: list[dict]) -> dict:
    """Per system: medians (min-max) over repetitions; ratios seamguard vs each baseline."""
    out: dict = {}
    for s in SYSTEMS:
        ff = [r[s]["steps_per_s"] for r in reps]
        fl = [r[s]["flapped"] for r in reps]
        out[s] = {"steps_per_s": spread(ff),
                  "extra_s_per_flap": spread([f["extra_s_per_flap"] for f in fl]),
                  "lost_s_local_per_flap": spread([x for f in fl for x in f["lost_s_local"]]),
                  "max_stall_s_per_flap": spread([x for f in fl for x in f["stall_s"]]),
                  "regain_95_s_per_flap": spread([x for f in fl for x in f["regain_95_s"]]),
                  "restarts": spread([f["restarts"] for f in fl]),
                  "completed": sum(f["completed"] for f in fl), "outlasted": sum(f["outlasted"] for f in fl),
                  "runs": len(fl)}
    sg = reps  # ratios within a repetition: same load, same flaps
    out["ratios_vs_seamguard"] = {
        b: {"steps_per_s_seamguard_over": spread([r["seamguard"]["steps_per_s"] / r[b]["steps_per_s"] for r in sg]),
            "extra_s_per_flap_over_seamguard": spread(
                [r[b]["flapped"]["extra_s_per_flap"] / r["seamguard"]["flapped"]["extra_s_per_flap"]
                 if r["seamguard"]["flapped"]["extra_s_per_flap"] > 0 else float("nan") for r in sg]),
            "extra_s_per_flap_minus_seamguard": spread(
                [r[b]["flapped"]["extra_s_per_flap"] - r["seamguard"]["flapped"]["extra_s_per_flap"] for r in sg]),
            "lost_s_local_minus_seamguard": spread(
                [float(np.mean(r[b]["flapped"]["lost_s_local"]) - np.mean(r["seamguard"]["flapped"]["lost_s_local"]))
                 for r in sg])}
        for b in BASELINES}
    return out


def load_run(d: Path) -> Run:
    j = json.loads((d / "run.json").read_text())
    recs = [FaultRecord(Fault(**{k: v for k, v in f.items() if k not in ("applied_t", "reverted_t")}),
                        f["applied_t"], f["reverted_t"]) for f in j["faults"]]
    return Run(j["commits"], None, recs, max(j["restarts"], restart_attempts(d)), j["completed"], j["steps"],
               j["t_end"])


def recompute(root: Path) -> list[dict]:
    """The repetitions' figures again from the runs an earlier `--out` kept."""
    reps = []
    for rd in sorted((d for d in root.glob("r*") if d.name[1:].isdigit()), key=lambda x: int(x.name[1:])):
        res: dict = {}
        for name in SYSTEMS:
            ff_dir = rd / name / "ff"
            if not (ff_dir / "run.json").exists():  # --quick: shared with its twin
                ff_dir = next(rd / n / "ff" for n in ("default_timeout", "single_rail_restart")
                              if (rd / n / "ff" / "run.json").exists())
            rate = steady_rate(load_run(ff_dir))
            fl = load_run(rd / name / "flap")
            res[name] = {"steps_per_s": rate, "flapped": flapped_figures(fl, rate)}
        reps.append({"faults": [r.fault.__dict__ for r in fl.records], **res})
    return reps


def run_repetition(rep: int, faults: list[Fault], quick: bool, ff_steps: int, horizon: float,
                   best_rate: dict[str, float], root: Path) -> dict:
    """Every system flap-free, then on this repetition's flaps, in a rotated order."""
    order = SYSTEMS[rep % len(SYSTEMS):] + SYSTEMS[:rep % len(SYSTEMS)]
    print(f"rep {rep}: order {order}; flaps {[f'{f.describe()} at {f.at_s:g}s' for f in faults]}", flush=True)
    res: dict = {}
    shared: list[float] = []
    for name in order:
        twin = quick and name in ("default_timeout", "single_rail_restart")
        if twin and shared:
            rate = shared[0]
        else:
            rate = steady_rate(run_system(name, ff_steps, [], root / f"r{rep}" / name / "ff", 120))
            if twin:
                shared.append(rate)
        best_rate[name] = max(best_rate.get(name, 0.0), rate)
        steps = max(ff_steps, math.ceil(1.5 * best_rate[name] * horizon))
        # bounded: a baseline that keeps failing to re-form its group is cut off (completed: false)
        fl = run_system(name, steps, faults, root / f"r{rep}" / name / "flap", 30 + 3 * horizon)
        res[name] = {"steps_per_s": rate, "flapped": flapped_figures(fl, rate)}
        f = res[name]["flapped"]
        print(f"  {name:20s} flap-free {rate:6.1f} steps/s | flapped {steps} steps: "
              f"extra {f['extra_s_per_flap']:6.2f} s/flap (local {[round(x, 2) for x in f['lost_s_local']]}), "
              f"stalls {[round(x, 2) for x in f['stall_s']]} s, restarts {f['restarts']}, "
              f"completed {f['completed']}" + (", OUTLASTED" if f["outlasted"] else ""), flush=True)
    return {"faults": [f.__dict__ for f in faults], **res}


def steady_pairs(rounds: int, steps: int, root: Path) -> dict:
    """Flap-free runs of both seamguard modes and the bond back to back, the order rotating
    per round; per round each mode's steps/s over the bond's (see ``--steady``)."""
    names = [*SEAMGUARD, "bond_active_backup"]
    reps = []
    for i in range(rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        rate = {n: steady_rate(run_system(n, steps, [], root / f"s{i}" / n, 120)) for n in order}
        ratios = {f"ratio_{n}": rate[n] / rate["bond_active_backup"] for n in SEAMGUARD}
        reps.append({**{n: {"steps_per_s": rate[n]} for n in order}, **ratios,
                     "ratio": ratios["ratio_seamguard"], "loadavg_1m": round(os.getloadavg()[0], 2)})
        print(f"round {i}: {' then '.join(f'{n} {rate[n]:.1f} steps/s' for n in order)}: over the bond "
              + ", ".join(f"{k[6:]} {v:.3f}" for k, v in ratios.items())
              + f" (load {reps[-1]['loadavg_1m']})", flush=True)
    return {"reps": reps, "summary": {n: {"steps_per_s": spread([r[n]["steps_per_s"] for r in reps])} for n in names}
            | {f"ratio_{n}_over_bond": spread([r[f"ratio_{n}"] for r in reps]) for n in SEAMGUARD}}


def print_summary(summary: dict, reps: int) -> None:
    print(f"\n{reps} repetitions, medians [min-max]")
    print(f"{'system':20s} {'steps/s':>22s} {'extra s/flap':>22s} {'lost s/flap (local)':>22s} "
          f"{'max stall s/flap':>22s} {'restarts':>18s}")
    fmt = lambda x: "n/a" if x["n"] == 0 else f"{x['median']:.2f} [{x['min']:.2f}-{x['max']:.2f}]"  # noqa: E731
    for s in SYSTEMS:
        x = summary[s]
        print(f"{s:20s} {fmt(x['steps_per_s']):>22s} {fmt(x['extra_s_per_flap']):>22s} "
              f"{fmt(x['lost_s_local_per_flap']):>22s} {fmt(x['max_stall_s_per_flap']):>22s} "
              f"{fmt(x['restarts']):>18s}")
    for b, r in summary["ratios_vs_seamguard"].items():
        print(f"seamguard vs {b}: steady steps/s x{fmt(r['steps_per_s_seamguard_over'])}, "
              f"failover cost per flap {b}/seamguard x{fmt(r['extra_s_per_flap_over_seamguard'])}, "
              f"{b} - seamguard {fmt(r['extra_s_per_flap_minus_seamguard'])} s "
              f"(local: {fmt(r['lost_s_local_minus_seamguard'])} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one flap of 2-6 s per run, shorter flap-free runs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--out", type=Path, default=None, help="keep the runs' logs and a JSON of every figure here")
    ap.add_argument("--recompute", type=Path, default=None, help="no runs: figures from an earlier --out")
    ap.add_argument("--steady", type=int, default=0, metavar="N",
                    help="only N flap-free rounds of both seamguard modes and the bond, back to back")
    ap.add_argument("--standby", action="store_true",
                    help="flapped repetitions run seamguard_standby (one rail carries, one waits) too")
    a = ap.parse_args()
    if a.standby:
        SYSTEMS.insert(1, "seamguard_standby")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: testbeds and jobs are removed
    if a.steady:
        started = provenance()
        with tempfile.TemporaryDirectory(prefix="rail_bench") as d:
            res = {"quick": a.quick, "rounds": a.steady, **steady_pairs(a.steady, 150, a.out or Path(d))}
        if a.out:
            write_result(a.out / "rail_failover_steady.json", res, started)
        print(json.dumps(res["summary"]))
        return
    flaps, ff_steps, margin_s, flap_s = (1, 150, 3.0, (2.0, 6.0)) if a.quick else (3, 300, 5.0, (2.0, 8.0))
    t_bench = time.time()
    started = provenance()
    best_rate: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rail_bench") as d:
        root = a.out or Path(d)
        reps = recompute(a.recompute) if a.recompute else []
        for rep in range(0 if a.recompute else a.reps):
            faults = flap_schedule(a.seed + rep, flaps, *flap_s)
            horizon = max(f.at_s + f.duration_s for f in faults) + margin_s
            reps.append(run_repetition(rep, faults, a.quick, ff_steps, horizon, best_rate, root))
        summary = summarize(reps)
        if a.out:  # with the commit and the load at start and end (`_record.provenance`)
            write_result(a.out / "rail_failover.json", json.loads(json.dumps(
                {"quick": a.quick, "reps": reps, "summary": summary}, default=_json)), started)
    print_summary(summary, len(reps))
    wall = time.time() - t_bench
    print(f"benchmark wall {wall:.0f} s")
    print(json.dumps({"quick": a.quick, "reps": len(reps), "seed": a.seed, "flaps_per_run": flaps,
                      "flap_s_range": flap_s, "flap_free_steps": ff_steps, "benchmark_wall_s": round(wall, 1),
                      **summary}, default=_json))


if __name__ == "__main__":
    main()
