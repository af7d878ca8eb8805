"""One controller tick (assess + decide) on a generated 100k-GPU (or ``--gpus``) fleet, on one core, warm.

The timed ticks run after enough ticks for every per-entity baseline to be warm
(``assess.baselines.warm_samples`` plus a few), so the figure includes baseline learning
and the drift channels, as a controller that has been running does.

Prints the same tick on a fleet a tenth the size beside it to show how cost grows, and, on
that fleet, the baseline a user would otherwise write — a per-entity Python loop of health
checks with peer medians — for the GPU evidence alone, with the ratio.

    python benchmarks/tick.py            # 100k and 10k GPUs
    python benchmarks/tick.py --quick    # 20k and 2k GPUs, fewer repeats
    python benchmarks/tick.py --gpus 1000000   # 1M and 100k GPUs (about 3.5 GiB)
    python benchmarks/tick.py --series 16      # each GPU also reports 16 series nobody named

Last line: one JSON object with gpus, tick_s, tick_s_10k, peak_rss_mib, baseline figures;
the same object, with the commit and machine load, goes to benchmarks/results/tick.json
(tick_quick.json with --quick, tick_<gpus>.json with ``--gpus``, ``_series<S>`` before ``.json``
with ``--series``, ``_fresh`` with ``--fresh-memory``; ``--out`` names another file). ``--series S``: every frame also carries S
series per GPU that no channel names (half gauges at a per-GPU level with noise, half
counters), so the tick includes judging them (assess/unnamed.py) as it would behind a
dcgm-exporter with S more fields enabled.
Beside the wall time, ``tick_cpu_s`` is the process's CPU time for the same tick (less
moved by other work on a shared machine than the wall time, never less than it on one core).
The process's allocator is set as the controller sets it (``control.retain_freed_memory``:
large blocks reused from tick to tick); ``--fresh-memory`` leaves it as glibc starts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from _record import RESULTS_DIR, provenance, write_result  # noqa: E402

from seamguard.assess import assess, initial_states  # noqa: E402
from seamguard.assess.propagation import all_dependents  # noqa: E402
from seamguard.control import retain_freed_memory  # noqa: E402
from seamguard.decide import DecideState, decide, default_policy  # noqa: E402
from seamguard.fleet import FleetShape, Kind, generate_fleet  # noqa: E402
from seamguard.observe import History  # noqa: E402
from seamguard.observe.unnamed import SeriesBlock  # noqa: E402
from seamguard.twin.faults import default_scenario  # noqa: E402
from seamguard.twin.telemetry import Twin, TwinConfig  # noqa: E402


class UnnamedSeries:
    """``s`` series per GPU that no channel names, one block per tick: gauges at a level of
    their own per GPU with noise, counters that rise at a rate of their own per GPU."""

    def __init__(self, gpus: int, s: int, seed: int = 2) -> None:
        self.rng = np.random.default_rng(seed)
        self.names = tuple(f"DCGM_FI_PROF_EXTRA_{i}" + ("_total" if i % 2 else "") for i in range(s))
        self.counter = np.array([i % 2 == 1 for i in range(s)])
        self.level = self.rng.normal(50.0, 2.0, (gpus, s))
        self.acc = np.zeros((gpus, s))

    def block(self) -> SeriesBlock:
        self.acc += self.rng.random(self.acc.shape) * self.level / 50.0
        x = np.where(self.counter, self.acc, self.level + self.rng.normal(0.0, 0.2, self.level.shape))
        return SeriesBlock(Kind.GPU, self.names, self.counter, x)


def measure(gpus: int, warm_ticks: int, timed_ticks: int, series: int = 0) -> dict:
    fleet = generate_fleet(FleetShape(gpus=gpus), seed=1)
    extra = UnnamedSeries(fleet.count(Kind.GPU), series) if series else None
    unnamed = None
    tick_s = 15.0
    twin = Twin(fleet, default_scenario(fleet, 3600.0, seed=1), TwinConfig(tick_s=tick_s), seed=1)
    policy = default_policy()
    hist = History(tick_s, 2, policy.assess.history_depths(tick_s))
    states = initial_states(fleet)
    base = None
    node_state = np.zeros(fleet.count(Kind.NODE), dtype=np.int8)
    dstate = DecideState()
    deps = all_dependents(fleet)
    times, a_times, cpu_times = [], [], []
    for i in range(warm_ticks + timed_ticks):
        frame = twin.step()
        if extra is not None:
            frame = replace(frame, series=(extra.block(),))
        t0, c0 = time.perf_counter(), time.process_time()
        a = assess(fleet, frame, hist, states, policy.assess, deps, node_state, base=base, unnamed=unnamed)
        t1 = time.perf_counter()
        _, dstate = decide(fleet, a, policy, dstate, set())
        t2, c2 = time.perf_counter(), time.process_time()
        hist.push(frame)
        states = {k: a.kinds[k].states for k in a.kinds}
        base = a.baselines
        unnamed = a.unnamed
        node_state = a.node_state
        if i >= warm_ticks:
            times.append(t2 - t0)
            a_times.append(t1 - t0)
            cpu_times.append(c2 - c0)
    warm = base.warm_counts(policy.assess.baselines)
    return {"gpus": fleet.count(Kind.GPU), "tick_s": statistics.median(times),
            "warm_gpus": warm["gpu"], "baseline_mib": sum(v.nbytes for v in base.to_arrays().values()) / 2**20,
            "assess_s": statistics.median(a_times), "tick_cpu_s": statistics.median(cpu_times),
            "tick_cpu_s_range": [round(min(cpu_times), 4), round(max(cpu_times), 4)], "entities": sum(fleet.summary().values()),
            "fleet": fleet, "frame": frame}


def baseline_gpu_checks(fleet, frame) -> float:
    """What a hand-written checker does: a Python loop per GPU with a per-job median."""
    t0 = time.perf_counter()
    temp = frame.values["DCGM_FI_DEV_GPU_TEMP"].tolist()
    clock = frame.values["DCGM_FI_DEV_SM_CLOCK"].tolist()
    comp = frame.values["seamguard_rank_compute_seconds"].tolist()
    jobs = fleet.gpu_job.tolist()
    by_job: dict[int, list[int]] = {}
    for g, j in enumerate(jobs):
        by_job.setdefault(j, []).append(g)
    med_clock = {j: statistics.median(clock[g] for g in gs) for j, gs in by_job.items()}
    med_comp = {j: statistics.median(comp[g] for g in gs) for j, gs in by_job.items()}
    flagged = 0
    for g, j in enumerate(jobs):
        score = 0.0
        if fleet.gpu_throttle_temp_c[g] - temp[g] < 8:
            score = max(score, 0.5)
        if clock[g] < 0.94 * med_clock[j]:
            score = max(score, 0.5)
        if comp[g] == comp[g] and comp[g] > 1.08 * med_comp[j]:
            score = max(score, 0.5)
        flagged += score >= 0.5
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller fleets, about a minute")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs of the large fleet (default 100000, 20000 with --quick); the small one is a tenth")
    ap.add_argument("--out", type=Path, default=None,
                    help="result file (default: benchmarks/results/tick.json, tick_quick.json with --quick)")
    ap.add_argument("--series", type=int, default=0,
                    help="series per GPU that no channel names, judged each tick (default 0)")
    ap.add_argument("--fresh-memory", action="store_true",
                    help="leave glibc's allocator as it starts (each large block mapped fresh and returned), "
                         "not as the controller sets it (control.retain_freed_memory)")
    args = ap.parse_args()
    if args.gpus is not None and args.gpus < 1000:
        ap.error(f"--gpus must be at least 1000, got {args.gpus}")
    if not 0 <= args.series <= 1024:
        ap.error(f"--series must be 0..1024, got {args.series}")
    default_name = "tick_quick.json" if args.quick else "tick.json"
    out = args.out or RESULTS_DIR / (default_name if args.gpus is None else f"tick_{args.gpus}.json")
    if args.series and args.out is None:
        out = out.with_name(f"{out.stem}_series{args.series}.json")
    if args.fresh_memory and args.out is None:
        out = out.with_name(f"{out.stem}_fresh.json")
    started = provenance()
    retained = False if args.fresh_memory else retain_freed_memory()
    big = args.gpus or (20_000 if args.quick else 100_000)
    small = big // 10
    w = default_policy().assess.baselines.warm_samples
    warm, timed = (w + 2, 5) if args.quick else (w + 3, 8)
    s = measure(small, warm, timed, args.series)
    base_s = statistics.median(baseline_gpu_checks(s["fleet"], s["frame"]) for _ in range(3))
    # GPU evidence alone inside seamguard's assess, for a like-for-like ratio.
    from seamguard.assess.evidence import EvidenceConfig, gpu_evidence
    hist = History(15.0)
    loop_gfs = np.zeros(s["fleet"].count(Kind.COOLING_LOOP))
    t0 = time.perf_counter()
    for _ in range(5):
        gpu_evidence(s["fleet"], s["frame"], hist, EvidenceConfig(), loop_gfs)
    ours_gpu_s = (time.perf_counter() - t0) / 5
    b = measure(big, warm, timed, args.series)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{'gpus':>8} {'entities':>9} {'tick_s':>8} {'assess_s':>9} {'cpu_s':>8}")
    for r in (s, b):
        print(f"{r['gpus']:>8} {r['entities']:>9} {r['tick_s']:>8.3f} {r['assess_s']:>9.3f} {r['tick_cpu_s']:>8.3f}")
    print(f"GPU checks on {s['gpus']} GPUs: per-entity Python loop {base_s * 1000:.1f} ms, "
          f"seamguard vectorized (more evidence) {ours_gpu_s * 1000:.1f} ms, ratio {base_s / ours_gpu_s:.1f}x")
    print(f"warm baselines: {b['warm_gpus']} of {b['gpus']} GPUs, {b['baseline_mib']:.1f} MiB of baseline state")
    print(f"peak RSS {peak_mib:.0f} MiB; growth {b['tick_s'] / s['tick_s']:.1f}x for {b['gpus'] / s['gpus']:.0f}x GPUs")
    result = {"gpus": b["gpus"], "tick_s": round(b["tick_s"], 4), "tick_cpu_s": round(b["tick_cpu_s"], 4),
                      "tick_cpu_s_range": b["tick_cpu_s_range"], "timed_ticks": timed,
                      "tick_s_10k" if small == 10_000 else "tick_s_small": round(s["tick_s"], 4),
                      "tick_cpu_s_small": round(s["tick_cpu_s"], 4),
                      "small_gpus": s["gpus"], "peak_rss_mib": round(peak_mib, 1), "warm_gpus": b["warm_gpus"],
                      "baseline_mib": round(b["baseline_mib"], 2),
                      "baseline_gpu_loop_s": round(base_s, 4), "seamguard_gpu_evidence_s": round(ours_gpu_s, 4),
                      "baseline_ratio": round(base_s / ours_gpu_s, 2), "quick": args.quick,
                      "unnamed_series_per_gpu": args.series, "retain_freed_memory": retained}
    write_result(out, result, started)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
