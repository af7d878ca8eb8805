"""Chaos: random kills and freezes in every phase, zero lost or corrupted states.

Each trial draws a seeded plan (kill or SIGSTOP, at a random rank and step, in the step,
snapshot, replicate or persist phase), runs it with enough spares to keep the world size,
and requires the final weights to be bit-identical to the failure-free run. Faults are
spaced (min 6 steps, steps of >= 50 ms) so that each recovery can finish before the next
fault: two overlapping faults that destroy both copies of a state (rank and its replica
holder) are unrecoverable in memory by construction; test_recovery covers that case
with the fallback to the last verified checkpoint. CI runs
12 trials (4 + 8); SEAMGUARD_CHAOS_TRIALS=N widens the second set to N seeds.
"""

from __future__ import annotations

import os
import time

import pytest

from seamguard.runtime.chaos import ChaosError, Injector, parse_plan, random_plan, render_plan

from .conftest import launch

STEPS = 18
PERSIST_EVERY = 5


def _trial(tmp_path, seed, clean_checksums):
    plan = random_plan(seed, world_size=2, first_step=2, last_step=STEPS - 1, n=2,
                       persist_every=PERSIST_EVERY, min_gap_steps=6)
    flags = ("--checkpoint-dir", str(tmp_path / f"ckpt{seed}"), "--persist-every",
             str(PERSIST_EVERY))
    r = launch(tmp_path, f"trial{seed}", spares=2, steps=STEPS, chaos=render_plan(plan),
               extra=flags, timeout_s=120, script_args=("--step-sleep-s", "0.05"))
    assert r.code == 0, (render_plan(plan), r.stderr)
    assert r.checksum == clean_checksums(STEPS), render_plan(plan)
    fired = (r.out / "chaos" / "kills.jsonl")
    assert fired.exists(), "no fault fired"
    return plan


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_chaos_trial(tmp_path, seed, clean_checksums):
    _trial(tmp_path, seed, clean_checksums)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", range(100, 100 + int(os.environ.get("SEAMGUARD_CHAOS_TRIALS", "8"))))
def test_chaos_trial_many(tmp_path, seed, clean_checksums):
    _trial(tmp_path, seed, clean_checksums)


@pytest.mark.parametrize("text, message", [
    ("raise:rank=0,step=3,phase=grad", "'raise' goes with a phase in"),
    ("sdc:rank=0,step=3,phase=step", "'sdc' goes with phase 'grad'"),
    ("kill:rank=0,step=3,phase=lunch", "chaos phase 'lunch'"),
    ("kill:rank=0", "bad chaos trigger"),
    ("delay:rank=0,step=3,phase=snapshot", "'delay' goes with a phase in"),
    ("delay:rank=0,step=3,seconds=0", "needs 0 < seconds"),
    ("delay:rank=0,step=3,seconds=soon", "bad chaos trigger"),
])
def test_bad_chaos_plans_name_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_plan(text)


def test_raise_action_raises_in_the_calling_thread(tmp_path):
    inj = Injector(parse_plan("raise:rank=1,step=4,phase=step"), tmp_path)
    inj.maybe_fire("step", rank=0, step=4)          # another rank: nothing
    with pytest.raises(ChaosError, match="rank 1, step 4"):
        inj.maybe_fire("step", rank=1, step=4)
    inj.maybe_fire("step", rank=1, step=4)          # fires once per job
    assert (tmp_path / "kills.jsonl").read_text().count('"raise"') == 1


def test_delay_action_pauses_and_goes_on(tmp_path):
    plan = parse_plan("delay:rank=0,step=2,phase=optimizer,seconds=0.3")
    assert render_plan(plan) == "delay:rank=0,step=2,phase=optimizer,seconds=0.3"
    inj = Injector(plan, tmp_path)
    t = time.monotonic()
    inj.maybe_fire("optimizer", rank=0, step=2)     # returns: the process lives on
    assert time.monotonic() - t >= 0.3
    inj.maybe_fire("optimizer", rank=0, step=2)     # once per job
    assert (tmp_path / "kills.jsonl").read_text().count('"delay"') == 1
