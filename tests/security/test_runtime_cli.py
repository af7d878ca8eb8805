"""Attacks through `seamguard launch`'s own arguments and its store's availability: bad
input is one line naming the option, before any worker starts; a store that is gone is
one line, not a traceback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamguard.ports import free_port

from .runtime_job import ENV, REPO

pytestmark = pytest.mark.timeout(240)


def _launch(*args: str, steps: int = 3, out: Path | None = None, timeout_s: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", "1", *args, "--",
           str(REPO / "examples" / "train_ddp.py"), "--steps", str(steps)]
    if out is not None:
        cmd += ["--out", str(out)]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout_s)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.strip().splitlines() if ln.strip()]


def test_runtime_run_id_escapes_the_snapshot_directory(tmp_path, observed):
    """`--run-id ../../x` names snapshot files outside /dev/shm: every snapshot fails while the job "finishes" unprotected.
    Refused: exit 2 with one line naming --run-id, before any worker starts."""
    out = tmp_path / "run"
    r = _launch("--run-id", "../../x", "--checkpoint-dir", str(tmp_path / "ckpt"), out=out)
    observed(f"exit {r.returncode}; stderr lines {len(_lines(r.stderr))}: {r.stderr.strip()[-300:]!r}; "
             f"worker ran: {(out / 'worker_0.log').exists()}")
    assert r.returncode == 2 and len(_lines(r.stderr)) == 1 and "--run-id" in r.stderr
    assert not (out / "worker_0.log").exists()


def test_runtime_master_port_out_of_range(tmp_path, observed):
    """`launch --master-port 99999` gives a traceback.
    Refused: exit 2 with one line naming --master-port."""
    r = _launch("--master-port", "99999", out=tmp_path / "run")
    observed(f"exit {r.returncode}; stderr: {r.stderr.strip()[-300:]!r}")
    assert r.returncode == 2 and len(_lines(r.stderr)) == 1 and "--master-port" in r.stderr
    assert "Traceback" not in r.stderr


def test_runtime_etcd_unreachable_at_start(tmp_path, observed):
    """etcd unreachable when the job starts: a traceback.
    Refused: exit 2 with one line naming the etcd endpoint, before any worker starts."""
    port = free_port()   # nothing listens there
    r = _launch("--store", f"etcd://127.0.0.1:{port}", "--run-id", "etcd-down", out=tmp_path / "run")
    observed(f"exit {r.returncode}; stderr: {r.stderr.strip()[-300:]!r}")
    assert r.returncode == 2 and len(_lines(r.stderr)) == 1
    assert f"127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_runtime_etcd_lost_mid_run(tmp_path, observed):
    """etcd goes away while the job trains: the launcher dies with a traceback.
    Refused: the launcher ends with one 'error:' line naming the store, no traceback; persisted checkpoints are kept."""
    from seamguard.testbed.multinode import EtcdServer

    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    etcd = EtcdServer.loopback(tmp_path / "etcd").start()
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--store", etcd.url,
           "--run-id", f"etcd-lost-{os.getpid()}", "--checkpoint-dir", str(ckpt), "--persist-every", "5",
           "--", str(REPO / "examples" / "train_ddp.py"), "--steps", "400", "--out", str(out),
           "--step-sleep-s", "0.1"]
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(ckpt.glob("step_*")):
            time.sleep(0.1)
        persisted = sorted(p.name for p in ckpt.glob("step_*"))
        etcd.stop()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
        etcd.stop()
    stderr = (tmp_path / "stderr.txt").read_text()
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    observed(f"exit {code}; error lines {errors[:2]}; traceback: {'Traceback' in stderr}; "
             f"checkpoints before {persisted[:3]}, after {sorted(p.name for p in ckpt.glob('step_*'))[:3]}")
    assert code != 0 and len(errors) == 1 and "store" in errors[0]
    assert "Traceback" not in stderr
    # kept: the resume point is not lost (ranks may persist a few more steps before they see the
    # loss, and retention keeps the newest keep_checkpoints=2, so step 5 itself may be pruned)
    after = sorted(p.name for p in ckpt.glob("step_*"))
    assert persisted and after and after[-1] >= persisted[-1]


def test_runtime_hint_key_file_readable_by_others(tmp_path, observed):
    """The operator's --hint-key-file is world-readable: anyone on the host could sign hints with it.
    Refused: exit 2 with one line naming the key file and its mode, before any worker starts."""
    key = tmp_path / "job.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o644)
    out = tmp_path / "run"
    r = _launch("--hint-key-file", str(key), "--hint-dir", str(tmp_path / "hints"), out=out)
    observed(f"exit {r.returncode}; stderr: {r.stderr.strip()[-300:]!r}")
    assert r.returncode == 2 and len(_lines(r.stderr)) == 1 and str(key) in r.stderr and "644" in r.stderr
    assert "ab" * 32 not in r.stderr and not (out / "worker_0.log").exists()
    assert stat.S_IMODE(key.stat().st_mode) == 0o644   # the operator's file is left as it was


def test_runtime_checkpoint_dir_outside_the_roots(tmp_path, observed):
    """A job is launched with --checkpoint-dir outside the --checkpoint-roots it is given.
    Refused: exit 2 with one line naming both options, before any worker starts."""
    roots = tmp_path / "storage"
    out = tmp_path / "run"
    r = _launch("--checkpoint-roots", str(roots), "--checkpoint-dir", str(tmp_path / "elsewhere" / "ckpt"), out=out)
    observed(f"exit {r.returncode}; stderr: {r.stderr.strip()[-300:]!r}")
    assert r.returncode == 2 and len(_lines(r.stderr)) == 1
    assert "--checkpoint-roots" in r.stderr and "--checkpoint-dir" in r.stderr
    assert not (out / "worker_0.log").exists()
