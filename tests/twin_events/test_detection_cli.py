"""`twin simulate|report --detection FILE`: seamguard's policy runs on a detector's measured result.

A detector that misses every gray event leaves seamguard nothing to drain; one that finds every
event drains; the same fleet and seeds otherwise. The committed held-out result is read as
benchmarks/twin_scale.py reads it (twin/events/detection.py), and the output names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seamguard.app.cli import app
from tests.twin_events.test_baselines_tuned import _detection_doc

HELDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "detection_heldout.json"
runner = CliRunner()
ARGS = ["--gpus", "16384", "--days", "3", "--compare", "seamguard", "--runs", "2", "--json"]


def _simulate(*extra: str) -> dict:
    r = runner.invoke(app, ["twin", "simulate", *ARGS, *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_the_detectors_measured_recall_decides_what_seamguard_drains(tmp_path):
    blind, sharp = tmp_path / "blind.json", tmp_path / "sharp.json"
    blind.write_text(json.dumps(_detection_doc(0.0, 30.0, 60.0, precision=1.0)))
    sharp.write_text(json.dumps(_detection_doc(1.0, 30.0, 60.0, precision=1.0)))
    b, s = _simulate("--detection", str(blind)), _simulate("--detection", str(sharp))
    assert b["quarantines"] == 0 and b["precursor_prevented"] == 0
    assert s["quarantines"] > 0 and s["ettr"] > b["ettr"]
    assert b["detection"] == str(blind) and "detection_delay_s" not in b
    fixed = _simulate()
    assert (fixed["detection"], fixed["detection_delay_s"], fixed["detection_precision"]) == ("fixed", 31.0, 0.9)


def test_the_committed_heldout_result_feeds_simulate_and_report(tmp_path):
    doc = _simulate("--detection", str(HELDOUT))
    assert doc["detection"] == str(HELDOUT) and 0 < doc["ettr"] <= 1
    r = runner.invoke(app, ["twin", "simulate", "--gpus", "2048", "--days", "2", "--compare", "seamguard",
                            "--detection", str(HELDOUT)])
    assert r.exit_code == 0 and "measured per-class recall and delays" in r.output, r.output
    out = tmp_path / "rep"
    r = runner.invoke(app, ["twin", "report", "--out", str(out), "--sizes", "1024", "--days", "2", "--runs", "1",
                            "--detection", str(HELDOUT)])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["detection"] == str(HELDOUT)
    assert "against the strongest baseline" in (out / "summary.md").read_text()


def test_a_bad_detection_file_is_one_line_and_runs_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"overall": {}}))
    for argv, msg in ((["--detection", str(tmp_path / "none.json")], "--detection: no such file"),
                      (["--detection", str(bad)], "--detection: " + str(bad) + ": not a benchmarks/detection.py")):
        r = runner.invoke(app, ["twin", "simulate", *ARGS, *argv])
        assert r.exit_code == 2 and msg in r.output and r.output.count("error:") == 1, r.output
    r = runner.invoke(app, ["twin", "report", "--out", str(tmp_path / "rep"), "--sizes", "1024",
                            "--detection", str(bad)])
    assert r.exit_code == 2 and "--detection: " in r.output and not (tmp_path / "rep").exists(), r.output


def test_a_non_finite_figure_in_a_detection_file_is_refused():
    from seamguard.twin.events.detection import TWIN_EVENT_CLASSES, parse_detection_results

    per = {names[0]: {"recall": 1.0, "incidents": 3, "median_delay_s": 30.0, "p90_delay_s": 60.0}
           for names in TWIN_EVENT_CLASSES.values()}
    first = next(iter(per))
    per[first]["median_delay_s"] = float("nan")  # json.loads reads a bare NaN
    with pytest.raises(ValueError, match=f"per_class.{first} needs median_delay_s"):
        parse_detection_results({"current": {"overall": {"precision": 0.9}, "per_class": per}}, "f.json")
