"""Every attack in tests/security, run against local instances, as one table.

    python benchmarks/adversary.py            # all attacks
    python benchmarks/adversary.py --quick    # leaves out the ones marked slow
    python benchmarks/adversary.py -k budget  # a subset (pytest's -k expression)

Each attack is one test in tests/security/ (its docstring names the attack and the
refusal seamguard owes; the test records what it observed). This script runs them with
pytest, reads the JUnit XML back and prints: attack, expected refusal, observed, verdict.
A test that fails is a bypass; one that errors is an attack that could not be judged.
Exits 1 on any bypass or error, 0 when every attack was refused. The last line is one
JSON object, also written to benchmarks/results/adversary[_quick].json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_attacks(quick: bool, select: str | None, junit: Path) -> int:
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "security"), "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if quick:
        cmd += ["-m", "not slow"]
    if select:
        cmd += ["-k", select]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=sys.stderr, stderr=sys.stderr, check=False).returncode


def verdicts(junit: Path) -> list[dict[str, str]]:
    """One row per test case: attack, refused, observed, verdict, where (file::test)."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value", "") for p in case.iter("property")}
        if case.find("failure") is not None:
            verdict, detail = "BYPASS", case.find("failure").get("message", "")
        elif case.find("error") is not None:
            verdict, detail = "ERROR", case.find("error").get("message", "")
        elif case.find("skipped") is not None:
            verdict, detail = "skipped", case.find("skipped").get("message", "")
        else:
            verdict, detail = "refused", ""
        first_line = detail.strip().splitlines()[0][:200] if detail.strip() else ""
        rows.append({"attack": props.get("attack") or case.get("name", "?"),
                     "refused": props.get("refused", ""),
                     "observed": props.get("observed") or first_line,
                     "verdict": verdict,
                     "where": f"{case.get('file') or case.get('classname', '')}::{case.get('name', '')}"})
    return rows


def table(rows: list[dict[str, str]], width: int = 38) -> str:
    def cell(s: str) -> list[str]:
        return textwrap.wrap(s, width) or [""]
    out = [f"{'attack':<{width}} | {'expected refusal':<{width}} | {'observed':<{width}} | verdict",
           "-" * (3 * width + 16)]
    for r in rows:
        cols = [cell(r["attack"]), cell(r["refused"]), cell(r["observed"])]
        for i in range(max(map(len, cols))):
            parts = [c[i] if i < len(c) else "" for c in cols]
            out.append(" | ".join(f"{p:<{width}}" for p in parts) + (f" | {r['verdict']}" if i == 0 else " |"))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="leave out attacks marked slow")
    ap.add_argument("-k", dest="select", help="pytest -k expression: run a subset")
    ap.add_argument("--out", type=Path, help="results file (default benchmarks/results/adversary[_quick].json)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "attacks.xml"
        rc = run_attacks(args.quick, args.select, junit)
        if not junit.exists():
            print(f"adversary: pytest wrote no report (exit {rc})", file=sys.stderr)
            return 2
        rows = verdicts(junit)
    print(table(rows))
    count = {v: sum(r["verdict"] == v for r in rows) for v in ("refused", "BYPASS", "ERROR", "skipped")}
    result = {"benchmark": "adversary", "quick": args.quick, "attacks": len(rows), "refused": count["refused"],
              "bypassed": count["BYPASS"], "errors": count["ERROR"], "skipped": count["skipped"],
              "bypasses": [r["where"] for r in rows if r["verdict"] in ("BYPASS", "ERROR")],
              "wall_s": round(time.monotonic() - t0, 1)}
    if args.select is None:
        out = args.out or ROOT / "benchmarks" / "results" / f"adversary{'_quick' if args.quick else ''}.json"
        out.write_text(json.dumps({**result, "rows": rows}, indent=1) + "\n")
    print(json.dumps(result))
    return 0 if rows and not (count["BYPASS"] or count["ERROR"]) else 1


if __name__ == "__main__":
    sys.exit(main())
