"""Failure processes of a GPU cluster, calibrated from published figures.

Why this file exists: every rate the event-mode twin draws from is defined here, next to
the public source it comes from (all listed in docs/sources.md), so that a reader can check the arithmetic and the
validation tests can check the twin against the same sources.

Calibration of hard failures (Llama 3, arXiv 2407.21783, Table 5; docs/sources.md §3):
16,384 H100 GPUs (2,048 nodes of 8) ran 54 days with 419 unexpected interruptions. Each
cause is assigned to the component type that carries it, and its count is turned into a
per-component rate ``count / (components in the Llama 3 cluster * 54 days)``. A cluster
of any size then has ``rate * its components`` failures per day of that cause, which is
exactly how a superposition of independent exponential lifetimes scales.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from seamguard.reliability import LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_PLANNED, LLAMA3_UNEXPECTED, Scope

__all__ = [
    "COMPONENTS_PER_NODE",
    "LLAMA3_GPUS",
    "LLAMA3_DAYS",
    "LLAMA3_UNEXPECTED",
    "LLAMA3_PLANNED",
    "CauseSpec",
    "FailureModel",
    "llama3_failure_model",
    "META_RSC_RF_PER_NODE_DAY",
    "META_RSC1_RF_PER_NODE_DAY",
    "META_RSC2_RF_PER_NODE_DAY",
    "HPN_LINK_FAIL_PER_MONTH",
    "HPN_TOR_FAIL_PER_MONTH",
    "link_rate_per_day_from_mttf_years",
    "first_failure_mean_min",
    "link_profile",
    "PRECURSOR_FRACTION",
    "HANG_CAUSES",
]

DAYS_PER_MONTH = 365.25 / 12.0
GPUS_PER_NODE = 8

#: Components of one 8-GPU node (Meta's RoCE and Alibaba's HPN: one NIC and one
#: NIC-ToR link per GPU). ``switch`` is the node's share of a ToR switch (HPN: 16 hosts
#: per ToR pair). ``node`` is the host itself (PSU, CPU, DRAM, SSD, boards, software).
COMPONENTS_PER_NODE: dict[str, float] = {
    "gpu": 8.0, "nic": 8.0, "link": 8.0, "node": 1.0, "switch": 1.0 / 16.0,
}

# Llama 3 (arXiv 2407.21783, docs/sources.md §3): LLAMA3_GPUS, LLAMA3_DAYS, LLAMA3_PLANNED and
# the Table 5 counts LLAMA3_UNEXPECTED live in seamguard/reliability.py (the runtime uses them too).

#: Causes that surface as a hang (every rank blocked in a collective, no process exits):
#: they cost a detection timeout before any recovery can start.
HANG_CAUSES = frozenset({"nccl_watchdog_timeout"})

#: Share of each cause that shows usable pre-failure evidence (an assumption, documented
#: in docs/twin-events.md): HBM failures are often preceded by rising correctable ECC and
#: row remaps (XID 92/63), thermal-interface failures by temperature trends, PSUs by
#: power telemetry; most other causes give no warning.
PRECURSOR_FRACTION: dict[str, float] = {
    "gpu_hbm3": 0.3, "gpu_thermal_interface_sensor": 0.5, "psu": 0.2, "faulty_gpu": 0.1,
    "system_memory": 0.3, "ssd": 0.3,
}

# Meta RSC (Kokolis et al., HPCA 2025; docs/sources.md §3): r_f ~ 5e-3 per node-day
# (8-GPU nodes); 6.50 and 2.34 failures per 1,000 node-days on its two clusters.
META_RSC_RF_PER_NODE_DAY = 5e-3
#: RSC-1, the higher of Meta's two measured rates: the twin's headline rate.
META_RSC1_RF_PER_NODE_DAY = 6.5e-3
#: RSC-2, the lower one: the other end of the range the benchmark shows.
META_RSC2_RF_PER_NODE_DAY = 2.34e-3
# Alibaba HPN (Qian et al., SIGCOMM 2024; docs/sources.md §3): per-month failure shares.
HPN_LINK_FAIL_PER_MONTH = 0.057e-2
HPN_TOR_FAIL_PER_MONTH = 0.051e-2


def link_rate_per_day_from_mttf_years(mttf_years: float) -> float:
    """Per-link failure rate per day for an exponential lifetime with the given MTTF.

    Years of 365 days, as the worked example's 26.28 min implies (5 * 365 * 1440 / 100,000);
    365.25-day years would give 26.30 min.
    """
    if mttf_years <= 0:
        raise ValueError("link MTTF must be > 0 years")
    return 1.0 / (mttf_years * 365.0)


def first_failure_mean_min(n_components: int, rate_per_day: float) -> float:
    """Mean time to the first failure among n exponential components (MTTF / n), minutes."""
    return 1.0 / (n_components * rate_per_day) * 24.0 * 60.0


@dataclass(frozen=True)
class CauseSpec:
    """One independent failure process."""

    name: str
    """Cause name as reported in outputs."""
    component: str
    """Component type carrying it (key of COMPONENTS_PER_NODE)."""
    rate_per_component_day: float
    """Failures per component per day."""
    scope: Scope
    """What it destroys (decides which checkpoint tier survives)."""
    precursor_fraction: float = 0.0
    """Share of failures with usable pre-failure evidence."""

    def rate_per_node_day(self) -> float:
        """Contribution to the per-node failure rate r_f."""
        return self.rate_per_component_day * COMPONENTS_PER_NODE[self.component]


@dataclass(frozen=True)
class FailureModel:
    """All stochastic processes the twin draws from; every field has its source."""

    causes: tuple[CauseSpec, ...]
    """Unexpected hard-failure causes (Llama 3 calibration by default)."""
    planned_per_node_day: float = LLAMA3_PLANNED / (LLAMA3_GPUS / GPUS_PER_NODE * LLAMA3_DAYS)
    """Planned maintenance interruptions (Llama 3: 47 in 54 days on 2,048 nodes)."""
    fail_slow_per_node_day: float = 2e-3
    """Fail-slow episodes per node-day. Calibrated to FALCON (ATC'25): 16 of 27 >=512-GPU
    jobs hit; for a 64-node job running a week, 1-exp(-64*7*r) = 16/27 gives r ~ 2e-3."""
    fail_slow_comm_share: float = 0.5
    """Share of fail-slows that are communication (link) rather than compute (assumed)."""
    fail_slow_compute_mean_min: float = 10.0
    """FALCON: compute fail-slows (CPU contention, thermal throttling) last ~10 min."""
    fail_slow_comm_mean_min: float = 24.0
    """FALCON: communication fail-slows last ~24 min."""
    fail_slow_severity_range: tuple[float, float] = (0.1, 0.5)
    """Throughput lost while slowed, uniform in this range (MegaScale stragglers ~10%
    slower; FALCON reports JCT +34.6% for affected jobs)."""
    flap_per_link_day: float = 5e-3
    """Link flaps per link-day. HPN sees 5K-60K flaps/day fleet-wide; with the low end
    over an assumed ~1M links this is 5e-3 (the fleet size is our assumption)."""
    flap_down_s: float = 5.0
    """Down/up time of a flap (MegaScale: several seconds)."""
    flap_stall_s: float = 9.0
    """Training stall per flap without failover (HPN: single-ToR flap stalls > 9 s)."""
    failover_throughput_loss: float = 0.0625
    """Throughput lost while one link is failed over (HPN dual-ToR: 6.25%)."""
    cooling_event_per_loop_day: float = 1.0 / 180.0
    """Cooling-loop degradations per loop-day (assumed: about twice a year per loop)."""
    cooling_event_mean_h: float = 2.0
    """Mean duration of a cooling degradation (assumed)."""
    cooling_throttle: float = 0.2
    """Throughput lost by throttled GPUs during a cooling degradation (assumed; DVFS
    thermal slowdown, far deeper than Llama 3's diurnal 1-2% swing)."""
    cooling_trip_probability: float = 0.02
    """Probability a degradation ends in a thermal trip of every node it cools (assumed)."""
    repair_mean_h: float = 24.0
    """Mean time to repair/replace a failed node (assumed; spares cover the gap)."""
    maintenance_mean_h: float = 4.0
    """Mean time a node spends in planned maintenance (assumed)."""
    precursor_lead_mean_min: float = 30.0
    """Mean lead time of pre-failure evidence before the failure (assumed)."""

    def rf_per_node_day(self) -> float:
        """Total unexpected hard-failure rate per node-day (Meta's r_f)."""
        return sum(c.rate_per_node_day() for c in self.causes)

    def with_rf(self, rf_per_node_day: float) -> "FailureModel":
        """Scale every cause so that r_f equals the given value, keeping the mix."""
        if rf_per_node_day <= 0:
            raise ValueError("node failure rate must be > 0 per node-day")
        k = rf_per_node_day / self.rf_per_node_day()
        return replace(self, causes=tuple(
            replace(c, rate_per_component_day=c.rate_per_component_day * k)
            for c in self.causes))

    def with_link_rate(self, rate_per_link_day: float,
                       switch_rate_per_switch_day: float | None = None) -> "FailureModel":
        """Replace the network cause by a per-link rate (and optionally a ToR process)."""
        if rate_per_link_day < 0:
            raise ValueError("link failure rate must be >= 0")
        causes = [replace(c, rate_per_component_day=rate_per_link_day)
                  if c.component == "link" else c for c in self.causes]
        causes = [c for c in causes if c.component != "switch"]
        if switch_rate_per_switch_day is not None:
            causes.append(CauseSpec("tor_switch", "switch", switch_rate_per_switch_day,
                                    Scope.DOMAIN))
        return replace(self, causes=tuple(causes))

    def cause(self, name: str) -> CauseSpec:
        """Look up a cause by name."""
        for c in self.causes:
            if c.name == name:
                return c
        raise KeyError(name)


def llama3_failure_model(**overrides: object) -> FailureModel:
    """The default model: Llama 3's per-cause counts turned into per-component rates."""
    nodes = LLAMA3_GPUS / GPUS_PER_NODE
    causes = tuple(
        CauseSpec(name, comp,
                  count / (nodes * COMPONENTS_PER_NODE[comp] * LLAMA3_DAYS), scope,
                  PRECURSOR_FRACTION.get(name, 0.0))
        for name, (count, comp, scope) in LLAMA3_UNEXPECTED.items())
    return FailureModel(causes=causes, **overrides)  # type: ignore[arg-type]


def link_profile(model: FailureModel, profile: str,
                 mttf_years: float | None = None) -> FailureModel:
    """Apply a named link-failure profile.

    ``llama3``: keep the Llama 3 switch/cable calibration. ``hpn``: Alibaba HPN's
    0.057%/month per NIC-ToR link plus 0.051%/month per ToR switch. ``mttf``: every link
    an exponential lifetime with ``mttf_years`` (the worked example in docs/sources.md
    uses 5 years).
    """
    if profile == "llama3":
        return model
    if profile == "hpn":
        return model.with_link_rate(HPN_LINK_FAIL_PER_MONTH / DAYS_PER_MONTH,
                                    HPN_TOR_FAIL_PER_MONTH / DAYS_PER_MONTH)
    if profile == "mttf":
        if mttf_years is None:
            raise ValueError("link profile 'mttf' needs a link MTTF in years")
        return model.with_link_rate(link_rate_per_day_from_mttf_years(mttf_years))
    raise ValueError(f"unknown link profile {profile!r} (llama3, hpn, mttf)")

