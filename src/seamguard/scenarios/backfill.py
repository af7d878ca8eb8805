"""Backfill a scenario's OpenMetrics file into TSDB blocks with promtool (the supported path)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class BackfillError(RuntimeError):
    pass


def backfill_file(openmetrics: Path, tsdb_dir: Path, timeout_s: float = 1800.0) -> float:
    """``promtool tsdb create-blocks-from openmetrics FILE DIR``; returns the seconds it took."""
    import time

    promtool = shutil.which("promtool") or ("/usr/sbin/promtool" if Path("/usr/sbin/promtool").exists() else None)
    if promtool is None:
        raise BackfillError("promtool not found: install Prometheus (Debian/Ubuntu: apt-get install -y prometheus)")
    Path(tsdb_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb_dir)],
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BackfillError(f"promtool did not finish within {timeout_s:.0f} s") from None
    if r.returncode != 0:
        raise BackfillError(f"promtool failed (exit {r.returncode}): {r.stderr.strip()[-1500:]}")
    return time.monotonic() - t0
