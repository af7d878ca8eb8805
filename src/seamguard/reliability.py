"""What the control plane and the training runtime both know about failures: one place.

Why this file exists: the checkpoint planner (decide/tiers.py), the event twin
(twin/events/) and the runtime's snapshot cadence (runtime/cadence.py) use the same
checkpoint-interval formulas (Young's, Daly's), the same published failure figures
(Llama 3's interruptions, and the per-GPU MTTF they give) and the same failure scopes.
Kept below every layer, beside hintfiles.py (the hint names both sides speak) and
hintauth.py, so the runtime reaches them without loading the decide layer or the twin:
pure constants and functions, standard library only.
"""

from __future__ import annotations

import math
from enum import Enum

__all__ = [
    "Scope",
    "young_interval_s",
    "daly_interval_s",
    "LLAMA3_GPUS",
    "LLAMA3_DAYS",
    "LLAMA3_PLANNED",
    "LLAMA3_UNEXPECTED",
    "GPU_MTTF_H",
]


class Scope(str, Enum):
    """What a failure destroys, which decides which checkpoint tiers survive it."""

    PROCESS = "process"   # a crash of the training processes (software bug, NCCL timeout)
    NODE = "node"         # one node and its host RAM lost (GPU, HBM, PSU, NIC ...)
    DOMAIN = "domain"     # several nodes sharing a rack / cooling loop / power feed
    PERSISTED = "persisted"  # in-memory state is wrong or gone (silent data corruption)


# ---- checkpoint intervals ------------------------------------------------------------------
def young_interval_s(delta_s: float, mttf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 d M)`` (Young, CACM 1974; docs/sources.md §4)."""
    _check_positive(delta_s=delta_s, mttf_s=mttf_s)
    return math.sqrt(2.0 * delta_s * mttf_s)


def daly_interval_s(delta_s: float, mttf_s: float) -> float:
    """Daly's higher-order optimum (Daly, FGCS 2006; docs/sources.md §4).

    ``sqrt(2dM) [1 + (1/3) sqrt(d/2M) + (1/9)(d/2M)] - d`` for ``d < 2M``, else ``M``.
    """
    _check_positive(delta_s=delta_s, mttf_s=mttf_s)
    if math.isinf(mttf_s):
        return math.inf
    if delta_s >= 2.0 * mttf_s:
        return mttf_s
    x = delta_s / (2.0 * mttf_s)
    return math.sqrt(2.0 * delta_s * mttf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def _check_positive(**values: float) -> None:
    for name, v in values.items():
        if not (v > 0):
            raise ValueError(f"{name} must be > 0, got {v!r}")


# ---- published failure figures -------------------------------------------------------------
# Llama 3 (arXiv 2407.21783, docs/sources.md §3): 16,384 GPUs, 54 days, 419 unexpected + 47 planned interruptions.
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0
LLAMA3_PLANNED = 47

#: Llama 3 Table 5 counts (use the counts, not the printed percentages), with the
#: component that carries each cause and the scope of what it destroys.
LLAMA3_UNEXPECTED: dict[str, tuple[int, str, Scope]] = {
    "faulty_gpu": (148, "gpu", Scope.NODE),
    "gpu_hbm3": (72, "gpu", Scope.NODE),
    "software_bug": (54, "node", Scope.PROCESS),
    "network_switch_cable": (35, "link", Scope.NODE),
    "host_maintenance": (32, "node", Scope.NODE),
    "gpu_sram": (19, "gpu", Scope.NODE),
    "gpu_system_processor": (17, "gpu", Scope.NODE),
    "nic": (7, "nic", Scope.NODE),
    "nccl_watchdog_timeout": (7, "node", Scope.PROCESS),
    "silent_data_corruption": (6, "gpu", Scope.PERSISTED),
    "gpu_thermal_interface_sensor": (6, "gpu", Scope.NODE),
    "ssd": (3, "node", Scope.NODE),
    "psu": (3, "node", Scope.NODE),
    "server_chassis": (2, "node", Scope.NODE),
    "io_expansion_board": (2, "node", Scope.NODE),
    "dependency": (2, "node", Scope.PROCESS),
    "cpu": (2, "node", Scope.NODE),
    "system_memory": (2, "node", Scope.NODE),
}

GPU_MTTF_H = LLAMA3_GPUS * LLAMA3_DAYS * 24 / sum(n for n, _, _ in LLAMA3_UNEXPECTED.values())
"""Hours between unexpected interruptions per GPU, from Llama 3's pre-training: 419 on
16,384 H100s in 54 days (about 50,700 GPU-hours; docs/sources.md). The runtime's default
rank failure rate for ``--snapshot-every auto`` (``--rank-mttf-hours``)."""
