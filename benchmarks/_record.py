"""What a benchmark result was measured on, written beside its figures.

A committed result is only evidence when it says which code produced it and how busy the
machine was: `benchmarks/claims.py` reads these fields into the headline table and prints
"not recorded" where an older result lacks them. Benchmarks take `provenance()` when
they start and pass it to `write_result` with their figures at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

#: The committed results folder, found from this file's path (not the cwd).
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=RESULTS_DIR.parent, capture_output=True,
                             text=True, timeout=10.0, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def provenance() -> dict:
    """The code's commit (``+dirty`` when src/ or benchmarks/ differ from it), the 1-minute
    load average, the CPU count and the UTC time."""
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks"):
        commit += "+dirty"
    return {"commit": commit, "loadavg_1m": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(), "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_result(path: Path, result: dict, started: dict) -> Path:
    """Write ``result`` plus ``started`` (`provenance()` taken when the run began: the code
    it ran is the code of that moment) and the load average at the end as JSON to ``path``;
    returns the path."""
    rec = dict(result, provenance=dict(started, loadavg_1m_end=round(os.getloadavg()[0], 2)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path
