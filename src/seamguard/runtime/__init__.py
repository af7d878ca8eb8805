"""seamguard.runtime: keeps a data-parallel PyTorch job training through rank and node loss.

Training scripts call :func:`init` (inside a process started by ``seamguard launch``),
register their model, optimizer and sampler, and iterate :meth:`Runtime.steps`. The
launcher hosts the rendezvous store and the coordinator that detects failures and plans
recoveries. torch is imported lazily so the control plane and the CLI can import this
package on machines without torch (install the ``runtime`` extra to train).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.settings import LaunchSettings, RuntimeSettings

if TYPE_CHECKING:  # pragma: no cover
    from seamguard.runtime.worker import Runtime

__all__ = ["GlobalBatchSampler", "LaunchSettings", "Runtime", "RuntimeSettings", "init"]


def init(settings: RuntimeSettings | None = None) -> "Runtime":
    """Join the job started by ``seamguard launch`` (reads the torchrun-style environment)."""
    from seamguard.runtime.worker import Runtime

    return Runtime.from_environment(settings)


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from seamguard.runtime.worker import Runtime

        return Runtime
    raise AttributeError(name)
