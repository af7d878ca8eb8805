"""What decides the training-failover benchmark's per-kill figures (benchmarks/_kill_points.py,
benchmarks/_killer.py): kill points spread over the whole step, where a kill landed read back
from the step log, the seconds of progress it cost, and goodput with hot spares charged as
provisioned capacity. The benchmark's runs take many minutes and live in the benchmark."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import _kill_points as kp  # noqa: E402
from _killer import Killer, LogTail, pid_from_rows  # noqa: E402

Row = kp.Row


def _steady(steps: int, step_s: float = 1.0, ranks: int = 4, gen: int = 0, t0: float = 0.0):
    return [Row(s, t0 + (s + 1) * step_s + r * 1e-3, r, gen) for s in range(steps) for r in range(ranks)]


def test_kill_phases_cover_every_tenth_of_the_step_boundary_included():
    rng = random.Random(7)
    plan = [k for _ in range(300) for k in kp.draw_kill_points(rng, 12, 5, 4)]
    cov = kp.phase_coverage([k.phase for k in plan])
    assert cov["n"] == 1500
    assert min(cov["bins"]) > 0.06 * 1500 and max(cov["bins"]) < 0.14 * 1500
    assert 0.15 * 1500 < cov["boundary"] < 0.25 * 1500   # a fifth of the step is the window
    for i in range(5):   # kill i inside its own segment, clear of its ends; rank 0 spared
        steps = [k.step for k in plan[i::5]]
        assert min(steps) >= int((i + 0.5) * 12) + 1 and max(steps) <= int((i + 1.5) * 12) - 1
    assert {k.rank for k in plan} == {1, 2, 3}


def test_the_same_seed_gives_every_system_the_same_kills():
    a = kp.draw_kill_points(random.Random(3), 20, 4, 4)
    b = kp.draw_kill_points(random.Random(3), 20, 4, 4)
    assert a == b and len({k.step for k in a}) == 4


def test_a_plan_that_cannot_be_drawn_is_refused_in_one_line():
    with pytest.raises(ValueError, match="segment >= 4"):
        kp.draw_kill_points(random.Random(0), 2, 3, 4)


def test_where_a_kill_landed_is_read_from_the_log():
    rows = _steady(6)                       # step s committed at s + 1 (+ rank skew)
    early = kp.landed(rows, 6.05, 1.0)      # just after step 5's commit: step 6 in flight
    assert early["step"] == 6 and early["phase"] == pytest.approx(0.05) and early["boundary"]
    mid = kp.landed(rows, 6.5, 1.0)         # timed from the first rank to log step 5
    assert mid["step"] == 6 and mid["phase"] == pytest.approx(0.5) and not mid["boundary"]
    late = kp.landed(rows, 7.4, 1.0)        # the step ran slower than the ones before it
    assert late["phase"] > 1 and late["boundary"]


def test_progress_lost_counts_the_stall_and_every_step_redone():
    before = _steady(6)
    # a live recovery into generation 1: step 6 (in flight at the kill) committed 3 s late
    live = before + [Row(6, 10.0, r, 1) for r in range(4)]
    assert kp.lost_s(live, 6.3, 1.0, True) == pytest.approx(10.0 - (6.0 + 1.0))
    # a restart from a checkpoint at step 4: steps 4 and 5 redone first, then step 6
    restart = before + [Row(s, 12.0 + i, r, 1) for i, s in enumerate((4, 5, 6)) for r in range(4)]
    assert kp.lost_s(restart, 6.3, 1.0, True) == pytest.approx(14.0 - 7.0)
    assert kp.lost_s(before, 6.3, 1.0, True) is None   # never committed afterwards: not made up


def test_a_step_logged_by_survivors_and_then_redone_is_not_progress():
    # the kill lands after step 6's all-reduce: the survivors log step 6 at once, then the
    # job restarts (generation 1) from step 4 and commits step 6 again at 14 s
    rows = _steady(6) + [Row(6, 6.95, r, 0) for r in (0, 1, 3)] \
        + [Row(s, 12.0 + i, r, 1) for i, s in enumerate((4, 5, 6, 7)) for r in range(4)]
    assert kp.lost_s(rows, 6.9, 1.0, True) == pytest.approx(14.0 - 7.0)
    # a system that stays in one generation (torchft): the survivors' commit is progress
    assert kp.lost_s(rows, 6.9, 1.0, False) == pytest.approx(6.95 - 7.0)


def test_progress_resuming_past_the_step_in_flight_is_timed_against_that_step():
    rows = _steady(6) + [Row(7, 11.0, r, 1) for r in range(4)]   # step 6 taken over, 7 is next
    assert kp.lost_s(rows, 6.3, 1.0, True) == pytest.approx(11.0 - (6.0 + 2.0))


def test_the_jobs_own_step_time_ignores_a_recovery_gap():
    rows = _steady(5) + [Row(5, 20.0, 0, 1), Row(6, 21.0, 0, 1), Row(7, 22.0, 0, 1)]
    assert kp.step_time_s(rows, 22.5) == pytest.approx(1.0, abs=0.01)
    assert kp.step_time_s(rows[:4], 10.0) is None   # one step seen: no step time


def test_phase_coverage_puts_an_overrun_in_the_last_tenth():
    cov = kp.phase_coverage([0.0, 0.05, 0.55, 0.95, 1.3, None])
    assert cov["bins"] == [2, 0, 0, 0, 0, 1, 0, 0, 0, 2] and cov["boundary"] == 4 and cov["n"] == 5


def test_describe_reports_every_value_with_its_spread():
    d = kp.describe(list(range(1, 12)) + [None])
    assert d == {"median": 6, "p10": 2, "p90": 10, "min": 1, "max": 11, "n": 11}
    assert kp.describe([None]) is None


def test_a_hot_spare_is_charged_as_capacity():
    four = kp.goodput_per_rank_s(6400, 4, 100.0)
    five = kp.goodput_per_rank_s(6400, 5, 100.0)   # same work, one more rank held idle
    assert five == pytest.approx(0.8 * four)
    with pytest.raises(ValueError, match="ranks >= 1"):
        kp.goodput_per_rank_s(6400, 0, 100.0)


def test_steps_taken_without_a_replica_drop_its_samples():
    rows = [r for r in _steady(4) if not (r.step in (1, 2) and r.rank == 3)]
    assert kp.samples_dropped(rows, 4, 4, 64) == 2 * 16
    redone = _steady(4) + _steady(4, gen=1, t0=10)   # a step redone is not a step dropped
    assert kp.samples_dropped(redone, 4, 4, 64) == 0


def test_log_tail_waits_for_a_line_to_be_finished(tmp_path):
    f = tmp_path / "worker_2.log"
    f.write_text("0 1.000000 1 4 0 4242\n1 2.0")
    tail = LogTail(tmp_path)
    assert [r.step for r in tail.poll()] == [0]
    with open(f, "a") as fh:
        fh.write("00000 1 4 0 4242\n")
    (row,) = tail.poll()
    assert row == Row(1, 2.0, 1, 0) and tail.source_of_row[row] == "worker_2"
    assert pid_from_rows(tail, 1, 0.0) == 4242 and pid_from_rows(tail, 3, 0.0) is None


FAKE_JOB = textwrap.dedent("""
    import os, sys, time
    out, rank = sys.argv[1], int(sys.argv[2])
    with open(f"{out}/worker_{rank}.log", "a") as log:
        for step in range(400):
            time.sleep(0.02)
            log.write(f"{step} {time.time():.6f} {rank} 2 0 {os.getpid()}\\n")
            log.flush()
""")


def test_the_killer_kills_the_planned_rank_after_its_planned_step(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", FAKE_JOB, str(tmp_path), str(r)]) for r in range(2)]
    killer = Killer(tmp_path, (kp.KillPoint(step=10, rank=1, phase=0.5),), pid_from_rows,
                    step_s_hint=0.02, deadline_s=30).start()
    try:
        assert procs[1].wait(timeout=30) == -9
        assert procs[0].poll() is None          # the other rank untouched
    finally:
        (rec,) = killer.stop()
        for p in procs:
            p.kill()
            p.wait(timeout=10)
    assert rec["rank"] == 1 and rec["pid"] == procs[1].pid and rec["step"] == 10
    first8 = min(r.time_s for r in killer.tail.rows if r.step == 8)
    assert rec["time_s"] > first8           # aimed from step 8's first commit, never before it


def test_rescore_recomputes_every_kill_from_the_kept_logs(tmp_path):
    import json

    import failover_training as ft

    work = tmp_path / "work"

    def write(name: str, rows) -> None:
        (work / name).mkdir(parents=True)
        for rank in range(4):
            (work / name / f"worker_{rank}.log").write_text(
                "".join(f"{r.step} {r.time_s:.6f} {r.rank} 4 {r.gen}\n" for r in rows if r.rank == rank))

    # the same kill (6.3 s, step 6 in flight): seamguard resumes step 6 at 8 s, torchrun
    # restarts from step 4 at 20 s, torchft's survivors go on at once without rank 2
    logs = {"seamguard": _steady(6) + [Row(6 + i, 8.0 + i, r, 1) for i in range(4) for r in range(4)],
            "torchrun": _steady(6) + [Row(4 + i, 20.0 + i, r, 1) for i in range(6) for r in range(4)],
            "torchft": _steady(6) + [Row(6 + i, 6.8 + i, r, 0) for i in range(4) for r in (0, 1, 3)]}
    killed = [{"time_s": 6.3, "step": 6, "rank": 2, "aim_phase": 0.3, "aim_step_s": 1.0}]
    for s, rows in logs.items():
        write(f"r0_{s}_faults", rows)

    def run(ranks, fails=()):
        return {"window_s": 10.0, "wall_s": 10.0, "ranks_provisioned": ranks, "samples": 640, "failures": list(fails)}

    # recorded as before kills carried their time: rescore must find it again from the logs
    old = {s: [{k: v for k, v in f.items() if k not in ("time_s", "aim_step_s", "lost_s")}
               for f in ft.outcomes(ft.read_rows(work / f"r0_{s}_faults"), killed, s == "torchft")]
           for s in logs}
    reps = [{"kills": [[6, 2, 0.3]], "order": ["plain", *logs], "runs": {
        "plain": {"clean": run(4)},
        **{s: {"clean": run(5 if s == "seamguard" else 4), "faults": run(5 if s == "seamguard" else 4, old[s])}
           for s in logs}}}]
    (work / "reps.json").write_text(json.dumps(reps))
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"config": {"steps": 10}}))
    doc = ft.rescore(result, work)
    lost = {s: doc["reps"][0]["failures"][s][0]["lost_s"] for s in logs}
    assert lost == {"seamguard": pytest.approx(1.0), "torchrun": pytest.approx(15.0),
                    "torchft": pytest.approx(-0.2)}
    assert doc["reps"][0]["failures"]["torchrun"][0]["time_s"] == pytest.approx(6.3)
    assert doc["config"] == {"steps": 10} and doc["seamguard_vs"]["torchft"]["lost_s_median_difference_s"] == 1.2
    assert doc["seamguard"]["capacity"]["spare_ranks"] == 1
