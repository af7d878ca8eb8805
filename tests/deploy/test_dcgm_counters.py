"""deploy/dcgm-exporter/seamguard-counters.csv switches on every DCGM field seamguard reads.

The fields seamguard reads are its signal registry's (observe/signals.py: what the
Prometheus source queries and the assessment uses) plus any DCGM field named in the code
that reads live data (observe/, assess/, agent/). Each must be an enabled line of the CSV
(dcgm-exporter's format: field, type, help), each after a comment line saying why.
"""

import re
from pathlib import Path

from seamguard.observe.signals import SIGNALS

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "deploy" / "dcgm-exporter" / "seamguard-counters.csv"
READERS = ("observe", "assess", "agent")
FIELD = re.compile(r"\bDCGM_FI_[A-Z0-9_]*[A-Z0-9]\b")


def enabled(text: str) -> dict[str, tuple[str, str, str]]:
    """field -> (type, help, the comment line just above it), for every line that is not a comment."""
    out: dict[str, tuple[str, str, str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        field, kind, help_ = (x.strip() for x in line.split(",", 2))
        assert field not in out, f"{field} listed twice"
        out[field] = (kind, help_, lines[i - 1] if i else "")
    return out


def read_by_seamguard() -> set[str]:
    names = {s.name for s in SIGNALS if s.name.startswith("DCGM_FI_")}
    for sub in READERS:
        for p in (ROOT / "src" / "seamguard" / sub).rglob("*.py"):
            names |= set(FIELD.findall(p.read_text()))
    return names - {"DCGM_FI_DEV"}  # a prefix in a docstring, not a field


def test_every_field_seamguard_reads_is_switched_on():
    on = enabled(CSV.read_text())
    missing = read_by_seamguard() - set(on)
    assert not missing, f"switch these on in {CSV.name}: {sorted(missing)}"


def test_every_line_is_a_field_with_a_type_and_a_reason():
    on = enabled(CSV.read_text())
    assert on
    for field, (kind, help_, above) in on.items():
        assert FIELD.fullmatch(field), field
        assert kind in ("gauge", "counter", "label"), (field, kind)
        assert help_, field
        assert above.startswith("# ") and len(above) > 12, f"{field}: no comment line saying why"


def test_the_check_finds_a_field_switched_off():
    text = CSV.read_text().replace("\nDCGM_FI_DEV_THERMAL_VIOLATION,", "\n# DCGM_FI_DEV_THERMAL_VIOLATION,")
    assert "DCGM_FI_DEV_THERMAL_VIOLATION" in read_by_seamguard() - set(enabled(text))
