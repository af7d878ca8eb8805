"""Attacks on a running job's store: a local process connects to node 0's TCPStore with
torch's own client and writes the keys that steer the job (docs/runtime.md, "Threat
model: who may talk to a job"). Each launches the tiny CPU example job for real."""

from __future__ import annotations

import ipaddress
import json

import pytest

from seamguard.runtime.manifest import committed_steps

from .runtime_job import attacker, files_under, listening_addresses, start

pytestmark = pytest.mark.timeout(300)


def test_runtime_store_listens_on_every_interface(tmp_path, observed):
    """A one-node job's store port is reachable from other hosts (it listens on every interface).
    Refused: a one-node job's TCPStore listens on loopback only."""
    job = start(tmp_path / "job", steps=20)
    try:
        job.wait_step(2)
        addresses = listening_addresses(job.port)
    finally:
        code = job.finish()
    observed(f"store port {job.port} listening on {addresses}; job exit {code}")
    assert addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses), addresses
    assert code == 0


def test_runtime_store_unsigned_target_hint_moves_checkpoints(tmp_path, observed):
    """Any process reaching the store sets sg/hint/target: the job writes its checkpoints into the attacker's directory.
    Refused: the unsigned hint is refused and logged (hint_refused, reason unsigned); checkpoints stay in the job's directory."""
    evil = tmp_path / "attacker-owned"
    job = start(tmp_path / "job", steps=40)
    try:
        job.wait_step(5)
        st = attacker(job.port)
        st.set("sg/hint/target", str(evil))
        st.add("sg/hint/target_n", 1)
        code = job.finish()
    finally:
        job.proc.kill()
    refused = [e for e in job.kinds("hint_refused") if e.get("hint") == "sg/hint/target"]
    moved = job.kinds("checkpoint_dir")
    observed(f"exit {code}; files in attacker dir: {files_under(evil)[:6]}; checkpoint_dir events {moved}; "
             f"hint_refused {[(e['hint'], e['reason']) for e in refused]}")
    assert not files_under(evil) and not moved
    assert refused and refused[0]["reason"] == "unsigned"
    assert code == 0 and 40 in committed_steps(job.ckpt)


def test_runtime_store_unsigned_evacuation(tmp_path, observed):
    """Any process reaching the store writes sg/hint/evacuate and the job kills a healthy rank.
    Refused: the unsigned evacuation is refused and logged; no rank is killed, no recovery runs."""
    job = start(tmp_path / "job", steps=40, spares=1)
    try:
        job.wait_step(5)
        attacker(job.port).set("sg/hint/evacuate", "0")
        code = job.finish()
    finally:
        job.proc.kill()
    evacuated = [e for e in job.events() if e.get("kind") == "evacuate_hint"]
    refused = [e for e in job.kinds("hint_refused") if e.get("hint") == "sg/hint/evacuate"]
    plans = job.kinds("plan")
    observed(f"exit {code}; evacuated {[e.get('rank') for e in evacuated]}; generations {len(plans)}; "
             f"hint_refused {[e['reason'] for e in refused]}")
    assert not evacuated and len(plans) == 1
    assert refused and refused[0]["reason"] == "unsigned"
    assert code == 0


def test_runtime_store_unsigned_rollback(tmp_path, observed):
    """Any process reaching the store forces a rollback (sg/hint/rollback_to, rollback_n): the job throws away progress.
    Refused: the unsigned rollback is refused and logged; the job never goes back."""
    job = start(tmp_path / "job", steps=50)
    try:
        job.wait_step(25)
        job.wait_for(lambda: 20 in committed_steps(job.ckpt))
        st = attacker(job.port)
        st.set("sg/hint/rollback_to", "-1")
        st.add("sg/hint/rollback_n", 1)
        code = job.finish()
    finally:
        job.proc.kill()
    rolled = job.kinds("rollback_requested")
    refused = [e for e in job.kinds("hint_refused") if e.get("hint") == "sg/hint/rollback_to"]
    observed(f"exit {code}; rollback_requested {rolled}; hint_refused {[e['reason'] for e in refused]}")
    assert not rolled and len(job.kinds("plan")) == 1
    assert refused and refused[0]["reason"] == "unsigned"
    assert code == 0


def test_runtime_store_replayed_rollback(tmp_path, observed):
    """An attacker reads the operator's signed rollback from the store and writes it again later: a second rollback.
    Refused: the replayed hint (nonce not newer than the last taken) is refused and logged; one rollback only."""
    from .runtime_job import signed_hint

    job = start(tmp_path / "job", steps=70)
    try:
        job.wait_step(25)
        job.wait_for(lambda: 20 in committed_steps(job.ckpt))
        signed_hint(job.hints, "rollback")   # the operator's, genuine
        job.wait_for(lambda: any(e.get("gen", 0) > 0 for e in job.kinds("resumed")), timeout_s=90)
        job.wait_step(45)
        st = attacker(job.port)
        captured = st.get("sg/hint/rollback_to")   # the store is readable by whoever reaches it
        st.set("sg/hint/rollback_to", captured)
        st.add("sg/hint/rollback_n", 1)
        code = job.finish()
    finally:
        job.proc.kill()
    rolled = job.kinds("rollback_requested")
    refused = [e for e in job.kinds("hint_refused") if e.get("hint") == "sg/hint/rollback_to"]
    observed(f"exit {code}; rollbacks {[e['to_step'] for e in rolled]}; "
             f"hint_refused {[e['reason'] for e in refused]}")
    assert len(rolled) == 1, rolled
    assert refused and refused[0]["reason"] == "replayed"
    assert code == 0


def test_runtime_store_forged_persist_targets_bypass_the_coordinator(tmp_path, tmp_path_factory, observed):
    """An attacker skips the hint and writes the coordinator's own answer (sg/hint/persist_targets, control counter): ranks persist to its directory.
    Refused: ranks persist only under the job's checkpoint roots; a target elsewhere is refused (checkpoint_target_refused) and the job's own directory used."""
    evil = tmp_path_factory.mktemp("outside-the-roots")   # not under the parent of the job's --checkpoint-dir
    job = start(tmp_path / "job", steps=40)
    try:
        job.wait_step(5)
        st = attacker(job.port)
        st.set("sg/hint/persist_targets", json.dumps([[0, str(evil)]]))
        st.add("sg/control/n", 1)
        code = job.finish()
    finally:
        job.proc.kill()
    notes = [e for e in job.events() if e.get("kind") == "checkpoint_target_refused"]
    observed(f"exit {code}; files in attacker dir: {files_under(evil)[:6]}; "
             f"checkpoint_target_refused notes: {len(notes)}; own dir steps {committed_steps(job.ckpt)}")
    assert not files_under(evil)
    assert notes
    assert code == 0 and 40 in committed_steps(job.ckpt)


def test_runtime_hint_key_is_world_readable_or_logged(tmp_path, observed):
    """An attacker reads the job's hint key (a world-readable key file, or the launcher's log) and signs its own hints.
    Refused: the launcher writes a fresh random key with mode 0600 and never prints it."""
    job = start(tmp_path / "job", steps=15)
    try:
        job.wait_step(2)
        key_file = job.hints / ".hint-key"
        mode = oct(key_file.stat().st_mode & 0o777) if key_file.exists() else None
        key = key_file.read_text().strip() if key_file.exists() else ""
        code = job.finish()
    finally:
        job.proc.kill()
    logged = bool(key) and (key in job.stderr() or key in (job.out / "events.jsonl").read_text())
    observed(f"key file mode {mode}; key in logs: {logged}; job exit {code}")
    assert mode == "0o600" and len(key) >= 32
    assert not logged
    assert code == 0
