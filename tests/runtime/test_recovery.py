"""End to end: real processes, a real TCPStore and gloo groups, injected failures.

Final weights after failures must be bit-identical to a failure-free run (spares keep the
world size), checksums agree after every recovery (verified by the runtime; a mismatch
would fail the recovery), and corrupted checkpoints are skipped for the previous good one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seamguard.runtime.manifest import step_dir

from .conftest import launch

pytestmark = pytest.mark.timeout(240)


def test_kill_with_spare_is_bit_identical(tmp_path, clean_checksums):
    r = launch(tmp_path, "kill", spares=1, steps=20, chaos="kill:rank=1,step=8")
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(20)
    resumed = [e for e in r.kinds("resumed") if e["gen"] > 0]
    # The victim delivered step 8's private bytes before the step began and the survivor
    # offers its live state: everyone resumes at the kill step, even while the newest full
    # replica is still in flight.
    assert len(resumed) == 1 and resumed[0]["step"] == 8, resumed
    chosen = [e for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert chosen[0]["source"] == "memory"


@pytest.mark.parametrize("bn", [False, True], ids=["dropout", "dropout+batchnorm"])
def test_live_state_recovery_redoes_only_the_step_in_flight(tmp_path, bn):
    # Full snapshots every 10 steps only; the kill lands at step 17. Survivors offer their
    # live state, the spare takes the lost rank's start-of-step RNG and buffers from its
    # holder: everyone resumes at 17, not at 10, and the result stays bit-identical.
    args = ("--batchnorm",) if bn else ()
    clean = launch(tmp_path, "clean", steps=24, extra=("--snapshot-every", "10"),
                   script_args=args)
    r = launch(tmp_path, "live", spares=1, steps=24, chaos="kill:rank=1,step=17",
               extra=("--snapshot-every", "10"), script_args=args)
    assert clean.code == 0 and r.code == 0, r.stderr
    assert r.checksum == clean.checksum
    resumed = [e for e in r.kinds("resumed") if e["gen"] > 0]
    assert len(resumed) == 1 and resumed[0]["step"] == 17, resumed
    # each member explains where its recovery's time went
    spare = [n for n in r.notes("recovered") if n["gen"] == 1 and n["wid"] == 2][0]
    assert {"wait_plan", "wait_resume_decision", "restore_state", "form_group",
            "verify_checksums"} <= set(spare["phases_s"])
    assert sum(spare["phases_s"].values()) <= spare["seconds"] + 1e-3


def test_every_rank_crashing_restarts_from_host_memory(tmp_path, clean_checksums):
    # Both ranks die at step 12 (a crash every rank hits). Their snapshots outlive them in
    # /dev/shm: the spares replacing them adopt those (hash-verified) and the job goes on
    # from the newest full snapshot both left, with no checkpoint directory at all.
    r = launch(tmp_path, "allcrash", spares=2, steps=20,
               chaos="kill:rank=0,step=12; kill:rank=1,step=12",
               extra=("--snapshot-every", "5", "--run-id", "allcrash"))
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(20)
    chosen = [e for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert chosen[-1]["source"] == "memory" and chosen[-1]["step"] == 10, chosen
    assert any(h.get("orphans") for h in chosen[-1]["holdings"].values())
    assert not list(Path("/dev/shm").glob("seamguard-allcrash-*")), "slots left behind"


@pytest.mark.parametrize("phase, extra, resume_at", [
    ("step", (), 12),                          # captured at the exception: nothing redone
    ("optimizer", (), 10),                     # the optimizer had begun: not the step's start
    ("step", ("--no-crash-capture",), 10),     # switched off: the last periodic snapshot
])
def test_every_rank_raising_resumes_at_the_failed_step(tmp_path, clean_checksums, phase,
                                                       extra, resume_at):
    # A software bug every rank hits at step 12: an uncaught exception, not a kill. Each
    # process leaves the start of step 12 in shared memory on its way out (unless the
    # optimizer had already begun the step), and the replacements resume there.
    r = launch(tmp_path, f"raise-{phase}-{len(extra)}", spares=2, steps=20,
               chaos=f"raise:rank=0,step=12,phase={phase}; raise:rank=1,step=12,phase={phase}",
               extra=("--snapshot-every", "5", "--run-id", f"raise{len(extra)}{phase[0]}", *extra))
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(20)
    chosen = [e for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert chosen[-1]["source"] == "memory" and chosen[-1]["step"] == resume_at, chosen
    assert "ChaosError" in r.log   # the exception is still reported as usual
    captured = r.notes("crash_captured")
    if resume_at == 12:
        assert sorted(n["wid"] for n in captured) == [0, 1] and captured[0]["step"] == 12
    else:
        assert not captured


def test_sigstop_and_kill_in_snapshot_and_replication(tmp_path, clean_checksums):
    # Faults spaced so that each recovery finishes before the next fault even on a loaded
    # 2-core machine (overlapping losses of a state and its replica are test_missing_replica's).
    plan = "kill:rank=0,step=5,phase=snapshot; stop:rank=1,step=14; kill:rank=0,step=24,phase=replicate"
    r = launch(tmp_path, "mixed", spares=3, steps=30, chaos=plan)
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(30)
    kinds = [e["kind"] for e in r.kinds("detected")]
    assert kinds.count("exited") == 2 and "unresponsive" in kinds
    assert len([e for e in r.kinds("resumed") if e["gen"] > 0]) == 3


def test_shrink_without_spare_keeps_global_batch_and_order(tmp_path):
    # dropout off: its masks come from per-rank RNG streams, which a reshard reassigns
    args = ("--dropout", "0")
    clean = launch(tmp_path, "clean3", nproc=3, steps=16, script_args=args)
    r = launch(tmp_path, "shrink", nproc=3, spares=0, steps=16, chaos="kill:rank=1,step=6",
               extra=("--no-replenish-spares",),
               script_args=args)
    assert clean.code == 0 and r.code == 0, r.stderr
    plans = r.kinds("plan")
    assert len(plans[-1]["ranks"]) == 2
    a = torch.load(clean.out / "final_model.pt")
    b = torch.load(r.out / "final_model.pt")
    # same samples in the same order, only the float summation order changed
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=0, atol=1e-4)
    # every committed step after the rollback ran with 2 ranks on the 3-way global batch
    assert (r.out / "worker_0.log").read_text().splitlines()[-1].split()[3] == "2"


def test_corrupt_checkpoint_falls_back_to_previous_good(tmp_path, clean_checksums):
    ckpt = tmp_path / "ckpt"
    flags = ("--checkpoint-dir", str(ckpt), "--persist-every", "5")
    first = launch(tmp_path, "first", steps=12, extra=flags)
    assert first.code == 0, first.stderr
    assert (step_dir(ckpt, 12) / "rank_00001.commit").exists()
    f = step_dir(ckpt, 12) / "rank_00001.bin"
    raw = bytearray(f.read_bytes())
    raw[100] ^= 0x10
    f.write_bytes(raw)
    second = launch(tmp_path, "second", steps=20, extra=flags)
    assert second.code == 0, second.stderr
    rejected = [e["detail"] for e in second.kinds("checkpoint_rejected")]
    assert rejected and "rank_00001.bin: tensor 'model/" in rejected[0]
    chosen = second.kinds("resume_chosen")[0]
    assert chosen["source"] == "disk" and chosen["step"] == 10
    assert second.checksum == clean_checksums(20)


def test_missing_replica_falls_back_to_disk(tmp_path, clean_checksums):
    # both ranks lost in the same step together with their host memory (as when their
    # nodes die): no replica and no snapshot survives, so the runtime must use the last
    # verified checkpoint
    flags = ("--checkpoint-dir", str(tmp_path / "ckpt"), "--persist-every", "5")
    r = launch(tmp_path, "both", spares=2, steps=16, extra=flags,
               chaos="nodeloss:rank=0,step=13,phase=step; nodeloss:rank=1,step=13,phase=step",
               script_args=("--step-sleep-s", "0.05"))
    assert r.code == 0, r.stderr
    sources = [e["source"] for e in r.kinds("resume_chosen") if e["gen"] > 0]
    assert sources[-1] == "disk"
    assert r.checksum == clean_checksums(16)


def test_replenished_spare_keeps_world_size_through_repeated_failures(tmp_path, clean_checksums):
    # one spare, three failures several seconds apart: every lost process is replaced by
    # a freshly started spare, so the world size and bit-identity hold throughout
    r = launch(tmp_path, "replenish", spares=1, steps=40, script_args=("--step-sleep-s", "0.3"),
               chaos="kill:rank=1,step=5; kill:rank=0,step=20; kill:rank=1,step=35", timeout_s=150)
    assert r.code == 0, r.stderr
    assert all(len(p["ranks"]) == 2 for p in r.kinds("plan"))
    assert len([e for e in r.kinds("resumed") if e["gen"] > 0]) == 3
    assert r.checksum == clean_checksums(40)


def test_a_corrupted_gradient_is_recomputed_not_applied(tmp_path, clean_checksums):
    # A faulty multiply on rank 1 at step 14 (high exponent bits flipped in its local
    # gradient): the step guard rejects the step before the optimizer runs, the step is
    # computed again from its start, and the result is bit-identical to a clean run.
    r = launch(tmp_path, "sdc", steps=20, chaos="sdc:rank=1,step=14")
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(20)
    rejected = r.notes("step_rejected")
    assert [n["step"] for n in rejected] == [14, 14] and all(n["suspects"] == [1] for n in rejected)
    assert len(r.notes("step_recomputed_clean")) == 2   # both ranks agree
    assert not [e for e in r.kinds("resumed") if e["gen"] > 0]   # no recovery needed


def test_a_rank_whose_gradient_stays_corrupt_is_replaced(tmp_path, clean_checksums):
    # The recompute is corrupted again, bit for bit as a defect would: rank 1 leaves, the
    # spare takes its place from live state and computes the step on other hardware, and
    # the result is still bit-identical.
    r = launch(tmp_path, "sdc2", spares=1, steps=20,
               chaos="sdc:rank=1,step=14; sdc:rank=1,step=14")
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(20)
    kept = r.notes("gradient_anomaly_persists")
    assert kept and all(n["suspects"] == [1] and n["step"] == 14 and n["reproduced"] for n in kept)
    assert not r.notes("gradient_spike_kept")
    resumed = [e for e in r.kinds("resumed") if e["gen"] > 0]
    assert len(resumed) == 1 and resumed[0]["step"] == 14, resumed


def test_a_rank_lost_right_after_its_optimizer_step_resumes_at_the_next_step(tmp_path, clean_checksums):
    # Rank 1 dies after applying step 9, before step 10's start pushes its private bytes:
    # its own part of them (RNG states, buffers) reached the holder when step 9's
    # all-reduce finished, so the spare takes the start of step 10 from the holder's live
    # state. Before, the job went back to the newest full snapshot (step 1 here).
    r = launch(tmp_path, "optimizer", spares=1, steps=20, chaos="kill:rank=1,step=9,phase=optimizer",
               extra=("--snapshot-every", "10"))
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(20)
    resumed = [e for e in r.kinds("resumed") if e["gen"] > 0]
    assert resumed and resumed[-1]["step"] == 10 and resumed[-1]["steps_redone"] == 0, resumed


def test_a_survivor_that_finished_the_previous_step_late_offers_the_current_one(tmp_path, clean_checksums):
    # Rank 0 pauses for 5 s right after applying step 11 (a GC pause, a noisy neighbour);
    # meanwhile rank 1 starts step 12, hands its step-12 private bytes to its holder
    # (rank 0) and dies. Rank 0 learns of the new generation between steps 11 and 12,
    # before taking its own start-of-step bytes for 12: it takes them then (nothing of 12
    # has run), so the job resumes at 12, not at the snapshot of step 10.
    r = launch(tmp_path, "late", spares=1, steps=20,
               chaos="delay:rank=0,step=11,phase=optimizer,seconds=5; kill:rank=1,step=12",
               extra=("--snapshot-every", "10"))
    assert r.code == 0, r.stderr
    assert r.checksum == clean_checksums(20)
    resumed = [e for e in r.kinds("resumed") if e["gen"] > 0]
    assert resumed and resumed[-1]["step"] == 12, resumed


def test_a_single_rank_job_recovers_bit_identically_without_a_collective(tmp_path):
    """World size 1: the gradient all-reduce is skipped (a sum over one rank is the identity;
    on a GPU gloo copied the whole gradient to host and back every step). The only rank
    killed, its spare continues from the snapshot bit-identically."""
    clean = launch(tmp_path, "clean1", nproc=1, steps=16)
    assert clean.code == 0, clean.stderr
    r = launch(tmp_path, "kill1", nproc=1, spares=1, steps=16, chaos="kill:rank=0,step=7")
    assert r.code == 0, r.stderr
    assert [e["event"] for e in r.events].count("resumed") == 2
    assert r.checksum == clean.checksum
