"""The control-plane hint channel (files in --hint-dir) and the torch-free CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from seamguard.runtime.manifest import committed_steps, latest_verified

from .conftest import REPO


def test_cli_help_does_not_import_torch():
    code = ("import sys; from typer.testing import CliRunner; import seamguard.cli as c; "
            "r = CliRunner().invoke(c.app, ['launch', '--help']); "
            "assert r.exit_code == 0 and '--spares' in r.output, r.output; "
            "import seamguard.runtime; assert 'torch' not in sys.modules; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr


def test_launch_rejects_missing_script():
    p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--nproc", "2"],
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no training command" in p.stdout + p.stderr


@pytest.mark.timeout(180)
def test_evacuate_and_checkpoint_hints(tmp_path, clean_checksums):
    hints, ckpt, out = tmp_path / "hints", tmp_path / "ckpt", tmp_path / "run"
    hints.mkdir()
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--spares", "1",
           "--hint-dir", str(hints), "--checkpoint-dir", str(ckpt), "--persist-every", "0",
           "--events-file", str(out / "events.jsonl"), "--",
           str(REPO / "examples" / "train_ddp.py"), "--steps", "30", "--out", str(out),
           "--step-sleep-s", "0.1"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        log = out / "worker_0.log"
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 5):
            time.sleep(0.1)
        (hints / "checkpoint_now").touch()
        (hints / "evacuate_rank_1").touch()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "detected" and e["kind"] == "evacuate_hint" for e in events)
    target = next(e["persist_at"] for e in events if e["event"] == "checkpoint_hint")
    assert target in committed_steps(ckpt)
    assert latest_verified(ckpt) is not None
    assert (out / "final_checksum.txt").read_text() == clean_checksums(30)
    assert not list(hints.iterdir())
