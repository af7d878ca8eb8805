"""Helpers for the agent tests: start `seamguard agent` (optionally in a network namespace), scrape it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import subprocess_env


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} from an exposition, via prometheus_client's parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(smp: dict, name: str, **labels: str) -> float | None:
    """The one sample named ``name`` whose labels include ``labels``; None when absent."""
    hits = [v for (n, lab), v in smp.items() if n == name and labels.items() <= dict(lab).items()]
    assert len(hits) <= 1, f"{name} {labels}: {len(hits)} samples"
    return hits[0] if hits else None


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_agent(config: Path, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-m", "seamguard", "agent", "--config", str(config)],
                            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.stderr.read() if proc.stderr else ""


def scrape(port: int, prefix: tuple[str, ...] = (), timeout_s: float = 15.0, proc: subprocess.Popen | None = None
           ) -> str:
    """GET /metrics on 127.0.0.1:port (inside the namespace of ``prefix``), retrying while it starts."""
    code = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
            f"'http://127.0.0.1:{port}/metrics', timeout=5).read().decode())")
    deadline = time.monotonic() + timeout_s
    while True:
        if prefix:
            p = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
            if p.returncode == 0:
                return p.stdout
        else:
            import urllib.request
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"agent exited {proc.returncode}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no /metrics on port {port} after {timeout_s} s")
        time.sleep(0.2)
