"""The labels file a scenario writes: the same format operators write for their own incidents.

docs/evaluation.md describes it; ``seamguard.app.eval.load_labels`` reads it. Times are
written as RFC 3339 (UTC) so a person can read them; Unix seconds are accepted too.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import yaml

LABELS_VERSION = 1


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def labels_document(incidents: list[dict], source: str = "") -> dict:
    out = []
    for inc in incidents:
        d = dict(inc)
        for k in ("start", "hard_failure", "end"):
            if d.get(k) is not None:
                d[k] = rfc3339(float(d[k]))
        out.append(d)
    doc: dict = {"version": LABELS_VERSION}
    if source:
        doc["source"] = source
    doc["incidents"] = out
    return doc


def write_labels(path: Path, incidents: list[dict], source: str = "") -> Path:
    """YAML unless ``path`` ends in .json."""
    doc = labels_document(incidents, source)
    path = Path(path)
    if path.suffix == ".json":
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path
