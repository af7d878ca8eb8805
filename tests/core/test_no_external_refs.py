"""Nothing in the product points at files users do not have.

Every fact the code relies on is documented with its public source in docs/sources.md;
no source file, doc, benchmark, example or test may send a reader to a file outside the
repository (internal notes, a sibling checkout).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "docs", "README.md", "benchmarks", "examples", "tests")
# Built from pieces so that this file does not match itself.
FORBIDDEN = tuple("".join(p) for p in (("REFERENCE", ".md"), ("DESIGN", ".md"),
                                       ("STYLE", ".md"), ("../", "shared")))
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".yaml", ".yml", ".json", ".cfg", ".ini",
                 ".sh", ".js", ".html", ".css", ".csv", ".rst", ""}


def _files():
    me = Path(__file__).resolve()
    for top in SCANNED:
        base = ROOT / top
        paths = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for p in paths:
            if not p.is_file() or p.resolve() == me or p.suffix not in TEXT_SUFFIXES:
                continue
            if any(part in {"__pycache__", ".pytest_cache", "node_modules"} for part in p.parts):
                continue
            yield p


def test_no_reference_to_files_outside_the_project():
    hits = []
    for p in _files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for word in FORBIDDEN:
                if word in line:
                    hits.append(f"{p.relative_to(ROOT)}:{n}: {word}")
    assert not hits, "references to files users do not have:\n" + "\n".join(hits)


def test_sources_page_exists_and_names_public_sources():
    text = (ROOT / "docs" / "sources.md").read_text(encoding="utf-8")
    for needle in ("arXiv:2407.21783", "HPCA 2025", "SIGCOMM 2024", "xid-errors",
                   "dcgm-exporter", "node_exporter", "Daly", "Runtime recovery defaults"):
        assert needle in text, needle
