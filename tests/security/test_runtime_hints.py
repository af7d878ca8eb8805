"""Attacks through a job's hint directory (`--hint-dir`, the control plane's documented
channel): files dropped by someone who may write there but does not hold the job's key,
and a key holder steering checkpoints outside the configured roots. Each launches the
tiny CPU example job for real."""

from __future__ import annotations

import time
import urllib.request

import pytest

from seamguard.ports import free_port
from seamguard.runtime.manifest import committed_steps

from .runtime_job import files_under, signed_hint, start

pytestmark = pytest.mark.timeout(300)


def test_runtime_hint_file_without_signature(tmp_path, observed):
    """Someone who can write into the hint directory drops a plain `rollback` file: the job throws away progress.
    Refused: the unsigned file is refused (hint_refused, reason unsigned) and removed; the job never goes back."""
    job = start(tmp_path / "job", steps=50)
    try:
        job.wait_step(25)
        job.wait_for(lambda: 20 in committed_steps(job.ckpt))
        (job.hints / "rollback").write_text("")
        code = job.finish()
    finally:
        job.proc.kill()
    rolled = job.kinds("rollback_requested")
    refused = [e for e in job.kinds("hint_refused") if e.get("hint") == "rollback"]
    observed(f"exit {code}; rollback_requested {rolled}; hint_refused {[e['reason'] for e in refused]}; "
             f"file left: {(job.hints / 'rollback').exists()}")
    assert not rolled and len(job.kinds("plan")) == 1
    assert refused and refused[0]["reason"] == "unsigned" and not (job.hints / "rollback").exists()
    assert code == 0


def test_runtime_hint_file_with_forged_signature(tmp_path, observed):
    """A hint file that looks signed (the envelope's format, a made-up HMAC) asks to evacuate a healthy rank.
    Refused: the signature does not verify with the job's key: refused (reason forged), no rank is touched."""
    job = start(tmp_path / "job", steps=40, spares=1)
    try:
        job.wait_step(5)
        (job.hints / "evacuate_rank_0").write_text(f"sg-hint-v1 {time.time_ns()} {'ab' * 32}\n")
        code = job.finish()
    finally:
        job.proc.kill()
    evacuated = [e for e in job.events() if e.get("kind") == "evacuate_hint"]
    refused = [e for e in job.kinds("hint_refused") if e.get("hint") == "evacuate_rank_0"]
    observed(f"exit {code}; evacuated {[e.get('rank') for e in evacuated]}; "
             f"hint_refused {[e['reason'] for e in refused]}")
    assert not evacuated and len(job.kinds("plan")) == 1
    assert refused and refused[0]["reason"] == "forged"
    assert code == 0


def test_runtime_signed_target_outside_the_checkpoint_roots(tmp_path, tmp_path_factory, observed):
    """A key holder (a misconfigured or compromised controller) moves the job's checkpoints outside its storage.
    Refused: a checkpoint_dir not under --checkpoint-roots is refused (hint_refused, reason outside_roots), counted in /metrics; checkpoints stay put."""
    evil = tmp_path_factory.mktemp("not-a-root")
    metrics_port = free_port()
    job = start(tmp_path / "job", steps=40, extra=("--checkpoint-roots", str(tmp_path / "job"),
                                                   "--metrics-port", str(metrics_port)))
    scraped = ""
    try:
        job.wait_step(5)
        signed_hint(job.hints, "checkpoint_dir", f"{evil}\n")
        job.wait_for(lambda: job.kinds("hint_refused") or job.kinds("checkpoint_dir"), timeout_s=60)
        time.sleep(1.0)   # the exporter publishes twice a second
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
                scraped = resp.read().decode()
        except OSError as exc:
            scraped = f"unreachable: {exc}"
        code = job.finish()
    finally:
        job.proc.kill()
    refused = [e for e in job.kinds("hint_refused") if e.get("reason") == "outside_roots"]
    counted = [ln for ln in scraped.splitlines() if ln.startswith("seamguard_job_hints_refused_total")
               and 'reason="outside_roots"' in ln]
    observed(f"exit {code}; files in {evil.name}: {files_under(evil)[:6]}; checkpoint_dir events "
             f"{job.kinds('checkpoint_dir')}; refused {[e['detail'][:60] for e in refused]}; metrics {counted}")
    assert not files_under(evil) and not job.kinds("checkpoint_dir")
    assert refused and counted and counted[0].endswith(" 1")
    assert code == 0 and 40 in committed_steps(job.ckpt)
