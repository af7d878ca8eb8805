"""A throwaway Prometheus on 127.0.0.1: scrape targets, or serve a backfilled TSDB.

Used by the integration tests and `benchmarks/prometheus_ingest.py`. Backfill goes
through `promtool tsdb create-blocks-from openmetrics`, the supported path.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from seamguard.ports import free_port


class MissingBinary(RuntimeError):
    pass


def need(binary: str, package: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if path is None:
        raise MissingBinary(f"{binary} not found: apt-get install -y {package}")
    return path



def backfill(lines: Iterable[str], tsdb_dir: Path, timeout_s: float = 300.0) -> None:
    """Write OpenMetrics text (ending '# EOF') into TSDB blocks under ``tsdb_dir``."""
    promtool = need("promtool", "prometheus")
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".om", delete=False) as fh:
        for chunk in lines:
            fh.write(chunk)
        src = fh.name
    try:
        r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", src, str(tsdb_dir)],
                           capture_output=True, text=True, timeout=timeout_s)
        if r.returncode != 0:
            raise RuntimeError(f"promtool backfill failed (rc {r.returncode}): {r.stderr[-2000:]}")
    finally:
        Path(src).unlink(missing_ok=True)


class PrometheusServer:
    """``with PrometheusServer(workdir, targets=[...]) as prom: prom.url``"""

    def __init__(self, workdir: Path, targets: list[str] | None = None, scrape_interval: str = "1s",
                 tsdb_dir: Path | None = None, lookback_delta: str | None = None,
                 start_timeout_s: float = 60.0) -> None:
        self.workdir = Path(workdir)
        self.targets = targets or []
        self.scrape_interval = scrape_interval
        self.tsdb_dir = tsdb_dir or self.workdir / "tsdb"
        self.lookback_delta = lookback_delta
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        binary = need("prometheus", "prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        lines = ["global:", f"  scrape_interval: {self.scrape_interval}",
                 f"  scrape_timeout: {self.scrape_interval}", "scrape_configs:"]
        if self.targets:
            lines += ["  - job_name: seamguard-twin", "    honor_labels: true", "    static_configs:",
                      "      - targets: [" + ", ".join(f'"{t}"' for t in self.targets) + "]"]
        else:
            lines[-1] = "scrape_configs: []"
        cfg.write_text("\n".join(lines) + "\n")
        self.port = free_port()
        args = [binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.tsdb_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=3650d",
                "--log.level=warn"]
        if self.lookback_delta:
            args.append(f"--query.lookback-delta={self.lookback_delta}")
        self._log = open(self.workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: "
                                   f"{(self.workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready after {self.start_timeout_s}s")

    def wait_targets_up(self, timeout_s: float = 30.0) -> None:
        """Block until every target has been scraped successfully (discovery takes ~5 s)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                data = httpx.get(f"{self.url}/api/v1/targets", timeout=2.0).json()["data"]["activeTargets"]
                if len(data) == len(self.targets) and all(t.get("health") == "up" for t in data):
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"targets {self.targets} not up after {timeout_s}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        if getattr(self, "_log", None):
            self._log.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()
