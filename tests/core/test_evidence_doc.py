"""docs/evidence.md names every series the node agent and dcgm-exporter export (issue 37).

The agent's series are the metric names its exporter writes (agent/exporter.py) and the
DCGM names its NVML reader fills (observe/nvml.py); dcgm-exporter's are the fields
deploy/dcgm-exporter/seamguard-counters.csv switches on. Each must appear in the doc's
"Every series" table, where it says how it is judged or why it is not.
"""

import re
from pathlib import Path

from seamguard.observe import nvml

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r'"((?:seamguard|node|DCGM)_[A-Za-z0-9_]+)"')


def _section() -> str:
    doc = (ROOT / "docs" / "evidence.md").read_text()
    start = doc.index("## Every series the agent and dcgm-exporter export")
    return doc[start:doc.index("\n## ", start + 1)]


def exported() -> set[str]:
    names = set(NAME.findall((ROOT / "src" / "seamguard" / "agent" / "exporter.py").read_text()))
    names |= set(nvml._SIGNALS)
    for line in (ROOT / "deploy" / "dcgm-exporter" / "seamguard-counters.csv").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            names.add(line.split(",", 1)[0].strip())
    return names


def missing(table: str) -> list[str]:
    return sorted(n for n in exported() if not any(f"`{n}{end}" in table for end in ("`", "{", "_total`", "_total{")))


def test_every_exported_series_is_in_the_table():
    left = missing(_section())
    assert not left, f"docs/evidence.md, 'Every series': add {left}"


def test_the_check_sees_a_series_left_out():
    table = _section()
    assert missing(table.replace("`node_vmstat_oom_kill`", "")) == ["node_vmstat_oom_kill"]
    assert missing(table.replace("`DCGM_FI_DEV_PCIE_LINK_WIDTH`", "")) == ["DCGM_FI_DEV_PCIE_LINK_WIDTH"]
