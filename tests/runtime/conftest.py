"""Runs the example training script under `seamguard launch` for integration tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """An etcd server on loopback for one test module (Debian's etcd, started and stopped here)."""
    from seamguard.testbed.multinode import EtcdServer
    with EtcdServer.loopback(tmp_path_factory.mktemp("etcd")) as server:
        yield server


def etcd_store(etcd, prefix: str, timeout_s: float = 5.0):
    """A job store client on ``etcd`` under ``prefix``."""
    import datetime
    from seamguard.runtime.store import EtcdStore
    host, port = etcd.address.rsplit(":", 1)
    return EtcdStore(((host, int(port)),), prefix, datetime.timedelta(seconds=timeout_s))


@dataclass
class Run:
    code: int
    out: Path
    events: list[dict]
    stderr: str
    log: str = ""  # the whole stderr: what a person reads

    @property
    def checksum(self) -> str | None:
        f = self.out / "final_checksum.txt"
        return f.read_text() if f.exists() else None

    def kinds(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]

    def notes(self, kind: str) -> list[dict]:
        """Worker-side events of one kind (the workers append them to the events file)."""
        return [e for e in self.events if e["event"] == "worker" and e["kind"] == kind]


def launch(tmp: Path, name: str, *, nproc=2, spares=0, steps=20, chaos="", extra=(),
           script_args=(), timeout_s=90, script="train_ddp.py") -> Run:
    out = tmp / name
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", str(nproc), "--spares",
           str(spares), "--events-file", str(out / "events.jsonl"), "--chaos-dir",
           str(out / "chaos"), *extra]
    if chaos:
        cmd += ["--chaos", chaos]
    cmd += ["--", str(REPO / "examples" / script), "--steps", str(steps),
            "--out", str(out), *script_args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    ev = out / "events.jsonl"
    events = [json.loads(line) for line in ev.read_text().splitlines()] if ev.exists() else []
    return Run(p.returncode, out, events, p.stderr[-4000:], p.stderr)


@pytest.fixture(scope="session")
def clean_checksums(tmp_path_factory):
    """Failure-free reference runs, computed once per session: {steps: checksum}."""
    cache: dict[int, str] = {}

    def get(steps: int) -> str:
        if steps not in cache:
            r = launch(tmp_path_factory.mktemp("clean"), f"clean{steps}", nproc=2, steps=steps)
            assert r.code == 0, r.stderr
            cache[steps] = r.checksum
        return cache[steps]
    return get
