"""The gateway's routing dashboard: one HTML page rendered from the router's snapshot.

Why this exists: a routing decision that departs from the default must be visible to an operator
with its evidence, not only as counters in /metrics. ``GET /dashboard`` (seamguard.gateway.app)
renders `render_dashboard(snapshot)`; ``GET /admin/routing`` serves the same snapshot as
JSON (`plain`). Both are reads, open like the other admin reads. Pure functions: no I/O, no
clock (ages are taken against the snapshot's own ``now``, the router's clock).
"""

from __future__ import annotations

import html
import math
from typing import Any


def plain(x: Any) -> Any:
    """The snapshot as strict JSON data: tuples as lists, NaN and infinities as None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    return x


def _num(v: Any, fmt: str = "{:.3f}") -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int | float):
        return fmt.format(v) if math.isfinite(v) else ""
    return html.escape(str(v))


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>" if rows else "<p>none</p>"


def render_dashboard(snapshot: dict | None, title: str = "seamguard gateway: routing", refresh_s: int = 2) -> str:
    """The page: paths (per rail) with latency, pending transfers, admissibility and why; instances
    with load and batch caps; fabric states; decision counts; the latest departures, newest first."""
    if not snapshot:
        return (f"<!doctype html><title>{html.escape(title)}</title><h1>{html.escape(title)}</h1>"
                "<p>This router keeps no evidence (round_robin, least_outstanding): every choice is its default.</p>")
    classes = sorted({c for p in snapshot.get("paths", ()) for c in (p.get("admissible") or {})})
    paths = [[html.escape(p["prefill"]), html.escape(p["decode"]),
              "" if p.get("rail") is None else f"{p['rail']}{' (home)' if p.get('home') else ''}",
              _num(p.get("latency_s")), _num(p.get("median_s")), _num(p.get("samples"), "{}"),
              _num(p.get("pending"), "{}"),
              *[("yes" if (p.get("admissible") or {}).get(c) else
                 f"<b>no</b>: {html.escape((p.get('why') or {}).get(c, ''))}") for c in classes]]
             for p in snapshot.get("paths", ())]
    inst = [[html.escape(n), _num(d.get("outstanding"), "{}"), _num(d.get("waiting"), "{:.0f}"),
             _num(d.get("kv_usage"), "{:.2f}"), _num(d.get("batch_cap"), "{}")]
            for n, d in (snapshot.get("instances") or {}).items()]
    fabric = [[html.escape(k), html.escape(v)] for k, v in sorted((snapshot.get("fabric") or {}).items())]
    dec = [[html.escape(k), str(v)] for k, v in sorted((snapshot.get("decisions") or {}).items())]
    now = snapshot.get("now", 0.0)
    recent = [[_num(now - r["t"], "{:.1f}"), html.escape(r.get("request_class") or ""), html.escape(r["kind"]),
               html.escape(r.get("path") or ""), html.escape(r["reason"]),
               html.escape(", ".join(f"{k}={_num(v)}" for k, v in (r.get("evidence") or {}).items()))]
              for r in reversed(snapshot.get("recent") or [])]
    style = ("body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin-bottom:1em}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%;text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='{refresh_s}'>"
            f"<title>{html.escape(title)}</title><style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
            "<h2>Paths (prefill &rarr; decode, rail)</h2>"
            + _table(["prefill", "decode", "rail", "latency s", "median s", "samples", "pending",
                      *[f"admissible: {c}" for c in classes]], paths)
            + "<h2>Instances</h2>" + _table(["instance", "outstanding", "waiting", "KV usage", "batch cap"], inst)
            + "<h2>Control plane (non-healthy NICs and links)</h2>" + _table(["name", "state"], fabric)
            + "<h2>Decisions that departed from the default</h2>" + _table(["kind", "count"], dec)
            + "<h2>Latest departures, newest first</h2>"
            + _table(["age s", "class", "kind", "path", "reason", "evidence"], recent)
            + "</body></html>")
