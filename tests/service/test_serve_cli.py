"""`seamguard serve` as a user runs it: a subprocess that serves a working dashboard."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from seamguard.ports import free_port

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "SEAMGUARD_TOKEN": "cli-token"}


def test_serve_defaults_open_a_working_dashboard(tmp_path):
    port = free_port()
    # Only --port differs from the defaults (a fixed default port may be taken on a CI host).
    proc = subprocess.Popen([sys.executable, "-m", "seamguard", "serve", "--port", str(port)], env=_env(),
                            stdout=open(tmp_path / "out", "wb"), stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        tick = -1
        with httpx.Client(timeout=5.0) as c:
            while time.monotonic() < deadline:
                try:
                    tick = c.get(f"{base}/healthz").json()["tick"]
                except httpx.HTTPError:
                    tick = -1
                if tick >= 2:
                    break
                time.sleep(0.3)
            assert tick >= 2, (tmp_path / "out").read_text()
            s = c.get(f"{base}/api/v1/summary").json()
            assert s["sizes"]["gpu"] == 2048 and s["source"] == "twin" and s["mode"] == "enforce" and s["speed"] == 10
            assert "fleetmap" in c.get(f"{base}/").text
            assert c.get(f"{base}/static/app.js").status_code == 200
            assert c.put(f"{base}/api/v1/mode", json={"mode": "dry_run"},
                         headers={"Authorization": "Bearer cli-token"}).json()["mode"] == "dry_run"
        out = (tmp_path / "out").read_text()
        # a token given by environment is never printed; the banner says whose tokens are loaded
        assert f"dashboard  http://127.0.0.1:{port}/" in out and "token      given, not shown (operator)" in out
        assert "cli-token" not in out
        # SIGTERM: the controller stops and its temporary ledger folder goes with it (uvicorn
        # re-raised the signal under the default handler, which ended the process first).
        ledger = Path(out.split("ledger ", 1)[1].split()[0])
        assert ledger.parent.name.startswith("seamguard-serve-") and ledger.exists()
        proc.terminate()
        assert proc.wait(15) == 0
        assert not ledger.parent.exists(), "serve left its temporary ledger behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(15)


def test_serve_with_a_bad_config_names_the_file_and_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("source: prometheus\n")
    r = subprocess.run([sys.executable, "-m", "seamguard", "serve", "--config", str(cfg)], env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert str(cfg) in r.stderr and "version" in r.stderr
