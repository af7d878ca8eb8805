"""The service: `seamguard serve` — the controller in a background thread, an HTTP API,
`/metrics` for Prometheus and the web dashboard, all thin renderers of one Snapshot.

Layering: service depends on the core (fleet, observe, assess, decide, act, ledger,
twin); nothing in the core imports it.
"""

from seamguard.app.runner import Runner
from seamguard.app.snapshot import Snapshot

__all__ = ["Runner", "Snapshot"]
