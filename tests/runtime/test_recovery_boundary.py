"""End to end: a rank killed at the step boundary, after the gradient all-reduce.

The survivors commit a step as soon as the all-reduce returns, so a rank lost right
after it (before its optimizer step, with the next step's snapshot and replica push
about to start) leaves them one step further on. The holder must then have that rank's
private bytes (RNG states, buffers) of the next step, or no rank-1 state of it exists
anywhere and the job falls back to the newest full snapshot, up to ``--snapshot-every``
steps back: 9 steps redone here before the fix (runtime/schedule.py, ``send_rank_part``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from .conftest import launch

pytestmark = pytest.mark.timeout(240)

STEPS = 20
KILL_STEP = 9   # no snapshot of it (--snapshot-every 10: steps 1 and 10 are snapshotted)


def _commits(out: Path) -> dict[int, Counter]:
    """rank -> how many times each step was committed, over every worker's log
    (example/train_ddp.py writes 'step time rank world gen' after each optimizer step)."""
    per_rank: dict[int, Counter] = {}
    for log in out.glob("worker_*.log"):
        for line in log.read_text().splitlines():
            step, _, rank, _, _ = line.split()
            per_rank.setdefault(int(rank), Counter())[int(step)] += 1
    return per_rank


def test_a_rank_killed_after_the_all_reduce_resumes_at_the_next_step(tmp_path, clean_checksums):
    r = launch(tmp_path, "reduced", spares=1, steps=STEPS, extra=("--snapshot-every", "10"),
               chaos=f"kill:rank=1,step={KILL_STEP},phase=reduced")
    assert r.code == 0, r.stderr
    assert (r.out / "chaos" / "fired_0").exists(), "the kill did not fire"
    resumed = [e for e in r.kinds("resumed") if e["gen"] > 0]
    # the survivor committed the kill step; the spare continues rank 1 at the next one
    assert [(e["step"], e["steps_redone"]) for e in resumed] == [(KILL_STEP + 1, 0)], resumed
    chosen = [e for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert chosen[0]["source"] == "memory", chosen
    # no step trained twice, none skipped: rank 0 committed every step once; rank 1 every
    # step at most once, missing only the kill step, whose gradient entered the all-reduce
    # rank 0 committed before rank 1's optimizer step logged it
    commits = _commits(r.out)
    assert commits[0] == Counter(range(STEPS)), commits[0]
    assert commits[1] == Counter(s for s in range(STEPS) if s != KILL_STEP), commits[1]
    # same samples in the same order as a run without the kill: bit-identical weights
    assert r.checksum == clean_checksums(STEPS)
