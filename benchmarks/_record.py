"""What a benchmark result was measured on, written beside its figures.

A committed result is only evidence when it says which code produced it and how busy the
machine was: `benchmarks/claims.py` reads these fields into the headline table and prints
"not recorded" where an older result lacks them. Benchmarks take `provenance()` when
they start and pass it to `write_result` with their figures at the end. A benchmark that
only prints its last line is recorded by running it through this file:

    python benchmarks/_record.py --out benchmarks/results/api_latency_quick.json -- \
        python benchmarks/api_latency.py --quick
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

#: The committed results folder, found from this file's path (not the cwd).
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _git(*args: str, repo: Path = RESULTS_DIR.parent) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True,
                             text=True, timeout=10.0, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def provenance(repo: Path = RESULTS_DIR.parent) -> dict:
    """The code's commit (``+dirty`` when src/ or benchmarks/ differ from it), the 1-minute
    load average, the CPU count and the UTC time."""
    commit = _git("rev-parse", "--short", "HEAD", repo=repo)
    # ":/" roots the paths at the checkout's top: git runs in benchmarks/, where "src" named
    # benchmarks/src, which does not exist, so a changed src/ went unnoticed
    if commit and _git("status", "--porcelain", "--untracked-files=no", "--", ":/src", ":/benchmarks", repo=repo):
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


def main(argv: list[str] | None = None) -> int:
    """Run a benchmark command (in the current directory's checkout) and record its last
    line, one JSON object, with the command and provenance."""
    import argparse
    import shlex
    import sys
    ap = argparse.ArgumentParser(description="record a benchmark's last JSON line as a result file")
    ap.add_argument("--out", type=Path, required=True, help="result file to write")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="the most the command may take")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given after --")
    started = provenance(Path.cwd())
    try:
        run = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"error: {shlex.join(cmd)}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(run.stdout)
    lines = run.stdout.strip().splitlines()
    try:
        last = json.loads(lines[-1]) if lines else None
    except ValueError:
        last = None
    if run.returncode != 0 or not isinstance(last, dict):
        print(f"error: {shlex.join(cmd)} exited {run.returncode} without a JSON last line; "
              f"{args.out} not written", file=sys.stderr)
        return 2
    write_result(args.out, dict(last, command=shlex.join(cmd)), started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
