"""The headline figures in README.md and docs/benchmarks.md are the table that
benchmarks/claims.py builds from the committed results, and that table is built right:
the strongest opponent in a result, ratios per paired run, goals missed written as
missed, fields a result lacks written as "not recorded", one headline line per capability,
and no figure written by hand beside the table's in a README paragraph that quotes it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _claims():
    spec = importlib.util.spec_from_file_location("claims", ROOT / "benchmarks" / "claims.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["claims"] = mod
    spec.loader.exec_module(mod)
    return mod


claims = _claims()


def test_docs_agree_with_the_committed_results():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "claims.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last["ok"] and last["missing"] == 0 and last["disagreements"] == 0


def test_every_claim_reads_its_result_and_every_tag_is_explained():
    rows = claims.build_table()
    assert [r.claim.key for r in rows if r.problem] == []
    assert len({c.key for c in claims.CLAIMS}) == len(claims.CLAIMS)
    assert {t for c in claims.CLAIMS for t in c.simulated} <= set(claims.TAGS)


def test_one_headline_line_per_capability_in_the_docs():
    caps = {c.capability for c in claims.CLAIMS}
    by_key = {c.key: c for c in claims.CLAIMS}
    assert set(claims.HEADLINES) == caps
    assert all(by_key[k].capability == cap for cap, k in claims.HEADLINES.items())
    lines = claims.render_lines(claims.build_table(), headlines_only=True).splitlines()
    assert sorted(line.split("**")[1] for line in lines) == sorted(caps)
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    block = doc.split("<!-- claims:capabilities begin -->\n")[1].split("<!-- claims:capabilities end -->")[0]
    assert block.splitlines() == lines


def test_a_figure_written_by_hand_beside_a_marker_is_flagged():
    text = ("seamguard <!-- claim:k:value -->1.2<!-- /claim --> s, fsync 9.4 s, 0.825× torchft's;\n"
            "goal ≤ 1.10, the goal of 1.3× and a 4.8 GB state at 0.9 of capacity\n\n"
            "no marker in this paragraph: 7.5 s\n\n```\n<!-- claim:k:value -->1<!-- /claim --> 3 s\n```\n")
    flagged = claims.unmarked_figures(text, "doc.md")
    assert len(flagged) == 2
    assert flagged[0].startswith("doc.md:1: ") and "'9.4 s'" in flagged[0] and "'0.825×'" in flagged[1]
    assert claims.unmarked_figures(text.replace("9.4 s, 0.825× torchft's", "no more"), "doc.md") == []
    assert claims.unmarked_figures(text, "doc.md", lead="One line") == []    # only headline paragraphs
    assert len(claims.unmarked_figures("One line: " + text, "doc.md", lead="One line")) == 2


def _write(d: Path, name: str, obj: dict) -> None:
    (d / name).write_text(json.dumps(obj))


def test_strongest_opponent_paired_ratio_and_missed_goal(tmp_path):
    _write(tmp_path, "r1.json", {"quick": False, "reps": [
        {"sg": 2.0, "weak": 9.0, "strong": 4.0}, {"sg": 3.0, "weak": 8.0, "strong": 2.0}]})
    _write(tmp_path, "r2.json", {"quick": False, "reps": [{"sg": 1.0, "weak": 7.0, "strong": 1.0}]})
    c = claims.Claim("k", "cap", "time, s", "r*.json", "reps/*/sg",
                     {"weak": "reps/*/weak", "strong": "reps/*/strong"}, goal=("<=", 1.5))
    r = claims.build_row(c, tmp_path)
    assert r.problem is None and r.opponent == "strong"
    assert (r.value.median, r.value.lo, r.value.hi, r.value.n) == (2.0, 1.0, 3.0, 3)
    assert (r.ratio.median, r.ratio.lo, r.ratio.hi) == (1.0, 0.5, 1.5)   # 2/4, 3/2, 1/1
    assert r.goal == "≤ 1.5: missed" and r.run == "full"
    higher = claims.build_row(claims.Claim("h", "cap", "rate", "r*.json", "reps/*/sg",
                                           c.opponents, better="higher"), tmp_path)
    assert higher.opponent == "weak"


def test_fields_a_result_lacks_are_not_recorded_and_missing_paths_say_so(tmp_path):
    _write(tmp_path, "a.json", {"x": {"median": 0.5, "min": 0.4, "max": 0.9, "n": 4}})
    r = claims.build_row(claims.Claim("a", "cap", "x", "a.json", "x"), tmp_path)
    assert (r.commit, r.run, r.load, r.n) == ("not recorded",) * 3 + (4,)
    assert claims.fields(r)["spread"] == "0.400-0.900"
    gone = claims.build_row(claims.Claim("b", "cap", "y", "a.json", "y"), tmp_path)
    assert gone.problem and "'y'" in gone.problem
    assert set(claims.fields(gone)) == set(claims.fields(r))   # a doc quoting it reads "missing"
    none = claims.build_row(claims.Claim("c", "cap", "y", "absent.json", "y"), tmp_path)
    assert "absent.json" in none.problem
    _write(tmp_path, "p.json", {"v": 1.0, "provenance": {"commit": "abc1234", "loadavg_1m": 2.0,
                                                           "loadavg_1m_end": 3.5}})
    p = claims.build_row(claims.Claim("p", "cap", "v", "p.json", "v"), tmp_path)
    assert (p.commit, p.load) == ("abc1234", "2.0-3.5")


def test_a_changed_figure_in_a_doc_is_a_disagreement(tmp_path):
    rows = claims.build_table()
    key = rows[0].claim.key
    value = claims.fields(rows[0])["value"]
    doc = tmp_path / "doc.md"
    good = claims.render_doc(f"x <!-- claim:{key}:value -->?<!-- /claim --> s\n"
                             "<!-- claims:table begin -->\n<!-- claims:table end -->\n", rows, "doc.md")
    doc.write_text(good)
    assert claims.check_doc(doc, rows) == []
    doc.write_text(good.replace(f"-->{value}<", "-->99.9<", 1))
    [diff] = claims.check_doc(doc, rows)
    assert "99.9" in diff and value in diff
    doc.write_text(good.replace("| tick |", "| tock |", 1))
    assert claims.check_doc(doc, rows)


def test_bad_markers_are_one_line_errors_naming_the_doc():
    rows = claims.build_table()
    with pytest.raises(claims.ClaimError, match="doc.md: a claims block marker"):
        claims.render_doc("<!-- claims:table begin -->\nno end\n", rows, "doc.md")
    with pytest.raises(claims.ClaimError, match="doc.md: inline marker names unknown claim field nope:value"):
        claims.render_doc("<!-- claim:nope:value -->1<!-- /claim -->", rows, "doc.md")


def _record():
    spec = importlib.util.spec_from_file_location("_record", ROOT / "benchmarks" / "_record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_record_writes_a_commands_last_line_with_provenance_and_nothing_on_failure(tmp_path):
    rec = _record()
    out = tmp_path / "r.json"
    code = "print('progress'); print('{\"x\": 2}')"
    assert rec.main(["--out", str(out), "--", sys.executable, "-c", code]) == 0
    got = json.loads(out.read_text())
    assert got["x"] == 2 and "-c" in got["command"]
    assert {"commit", "loadavg_1m", "loadavg_1m_end", "cpus", "utc"} <= set(got["provenance"])
    bad = tmp_path / "bad.json"
    assert rec.main(["--out", str(bad), "--", sys.executable, "-c", "print('no json')"]) == 2
    assert rec.main(["--out", str(bad), "--", sys.executable, "-c", "raise SystemExit(3)"]) == 2
    assert not bad.exists()


def test_provenance_marks_a_changed_src_or_benchmarks_as_dirty(tmp_path):
    rec = _record()
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "src").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "b.py").write_text("y = 1\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    bench = tmp_path / "benchmarks"  # provenance runs git from the benchmarks folder
    assert not rec.provenance(bench)["commit"].endswith("+dirty")
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert rec.provenance(bench)["commit"].endswith("+dirty")
    subprocess.run([*git, "checkout", "-q", "--", "src"], check=True)
    (bench / "b.py").write_text("y = 2\n")
    assert rec.provenance(bench)["commit"].endswith("+dirty")
