"""Settings of one event-mode simulation: cluster, workload and policy, validated.

Why this file exists: every knob of the twin is a documented field of a frozen
dataclass, validated once, with units in its name; the CLI only fills these in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from seamguard.decide.economics import Criticality, JobClass
from seamguard.decide.policy import BreakerConfig
from seamguard.twin.events.calibration import FailureModel, llama3_failure_model
from seamguard.twin.events.detection import DetectionModel
from seamguard.twin.events.measured import DEFAULT_FIGURES, RuntimeFigures

__all__ = ["JobSpec", "ClusterConfig", "CostModel", "ControllerSettings", "PolicyParams", "default_costs",
           "workload", "POLICIES", "WORKLOADS", "NVRX_SOFT_TIMEOUT_S", "MODES"]

#: The policies the twin runs side by side (docs/twin-events.md, "Policies").
POLICIES = ("baseline_fixed", "baseline_daly_async", "in_job_restart", "seamguard")
#: Older name of ``baseline_fixed``, still accepted.
_ALIASES = {"baseline": "baseline_fixed"}
WORKLOADS = ("single", "mix")

#: NVIDIA Resiliency Extension's in-process restart declares a rank hung after
#: ``soft_timeout`` without progress: 60 s by default (``inprocess.Wrapper``).
NVRX_SOFT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class JobSpec:
    """One job, placed on a contiguous range of nodes."""

    name: str
    """Job name."""
    first_node: int
    """Index of its first node."""
    nodes: int
    """Number of nodes."""
    job_class: JobClass
    """Workload class."""
    criticality: Criticality
    """Criticality."""

    @property
    def training(self) -> bool:
        """Training jobs checkpoint and roll back; inference replicas fail alone."""
        return self.job_class in (JobClass.HIGH_SYNC_TRAINING, JobClass.PIPELINE_TRAINING)


@dataclass(frozen=True)
class ClusterConfig:
    """The simulated cluster and horizon."""

    gpus: int
    """GPUs in the cluster (spares included)."""
    days: float
    """Simulated horizon in days."""
    gpus_per_node: int = 8
    """GPUs per node (H100 HGX)."""
    spare_fraction: float = 0.02
    """Share of nodes held as spares (both policies use the same pool)."""
    nodes_per_loop: int = 64
    """Nodes cooled by one cooling loop (16 racks of 4 nodes; assumed)."""
    workload: str = "mix"
    """``single`` (one release-critical synchronous job on all non-spare nodes) or
    ``mix`` (jobs of several sizes, classes and criticalities)."""
    planned_ettr: float = 0.9
    """ETTR a job's schedule assumed (Llama 3: effective training time > 90%); a job
    whose productive time falls short has slipped."""
    failures: FailureModel = field(default_factory=llama3_failure_model)
    """Failure processes."""

    def __post_init__(self) -> None:
        if not (isinstance(self.gpus, int) and self.gpus > 0):
            raise ValueError(f"--gpus must be a positive integer, got {self.gpus!r}")
        if self.gpus % self.gpus_per_node:
            raise ValueError(f"--gpus ({self.gpus}) must be a multiple of {self.gpus_per_node}")
        if not (self.days > 0 and math.isfinite(self.days)):
            raise ValueError(f"--days must be > 0, got {self.days!r}")
        if not 0.0 <= self.spare_fraction < 0.5:
            raise ValueError("--spare-fraction must be in [0, 0.5)")
        if self.workload not in WORKLOADS:
            raise ValueError(f"--workload must be one of {WORKLOADS}, got {self.workload!r}")
        if not 0.0 < self.planned_ettr <= 1.0:
            raise ValueError("planned ETTR must be in (0, 1]")
        if self.nodes_per_loop <= 0:
            raise ValueError("nodes per cooling loop must be > 0")

    @property
    def nodes(self) -> int:
        """Nodes in the cluster."""
        return self.gpus // self.gpus_per_node

    @property
    def spare_nodes(self) -> int:
        """Nodes in the spare pool."""
        return int(round(self.nodes * self.spare_fraction))

    @property
    def horizon_s(self) -> float:
        """Horizon in seconds."""
        return self.days * 86_400.0


@dataclass(frozen=True)
class CostModel:
    """Every cost a policy pays, each a named option in seconds (docs/twin-events.md,
    "Policies", gives the public source of each default).

    A published model's setup is reproduced by filling these in (``twin simulate
    --policy-config FILE``); a field a policy does not use is ignored by it.
    """

    interval_s: float | None
    """Compute time between checkpoints; ``None``: the policy's interval rule decides
    (Young/Daly from the failure rate, or the checkpoint planner)."""
    write_blocking_s: float
    """Part of a checkpoint write training waits for (the whole write when it is blocking;
    the device-to-host snapshot when the write is asynchronous)."""
    write_async_s: float
    """Part of the write that runs in the background after it: a checkpoint counts only
    once this has finished, so a failure inside it loses the previous interval too."""
    restart_s: float
    """A job-wide stop to every process running again (for ``requeue`` policies Meta's u0,
    which includes requeue, init and reload; else the measured relaunch at the measured
    ranks, scaled by log2 of the job's ranks)."""
    requeue_s: float
    """The scheduler requeueing the job and allocating its nodes, on top of ``restart_s``."""
    load_s: float
    """Reading the checkpoint back after a restart, on top of ``restart_s``."""
    hang_detect_s: float
    """A hung collective (no process exits) noticed by a timeout."""
    swap_s: float
    """Live replacement of one lost rank while the others keep their state (measured
    resume at the measured ranks, scaled to the replica group); unused by policies that
    restart every rank."""
    backstop_interval_s: float
    """Interval of the storage copy that silent corruption goes back to, where the
    frequent checkpoints are in memory."""

    def __post_init__(self) -> None:
        for name in ("write_blocking_s", "write_async_s", "restart_s", "requeue_s", "load_s",
                     "hang_detect_s", "swap_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"cost {name} must be a finite number >= 0, got {v!r}")
        if self.interval_s is not None and not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            raise ValueError(f"cost interval_s must be > 0 or null, got {self.interval_s!r}")
        if not self.backstop_interval_s > 0:
            raise ValueError("cost backstop_interval_s must be > 0")


#: What the live controller does with its decisions (decide/policy.py ``mode``).
MODES = ("enforce", "dry_run")
_BREAKER = {k: f.default for k, f in BreakerConfig.model_fields.items()}


@dataclass(frozen=True)
class ControllerSettings:
    """What seamguard's controller may do in the twin: the knobs a policy what-if varies
    (twin/whatif.py). Defaults: enforcing, with the live breaker's default bounds
    (decide/policy.py ``BreakerConfig``) and no slowdown floor on drains.

    The twin's breaker is the live one's fleet-wide part: nodes newly restricted by the
    controller (a degraded node drained, a cooling loop's nodes evacuated, a node drained on
    pre-failure evidence) within ``breaker_window_s``, and nodes so restricted at once, each
    bounded by ``max(share x nodes, breaker_min_nodes)``; the first restriction past a bound
    trips it, and tripped it holds every later restriction for the rest of the run (nobody
    resets it inside a simulated window). Hard failures are the runtime's to recover and
    never pass through it."""

    mode: str = "enforce"
    """``enforce``: the controller's drains, evacuations and checkpoint-now calls happen;
    ``dry_run``: it decides and records only (the runtime still recovers on its own)."""
    breaker_window_s: float = _BREAKER["window_s"]
    """Rate window of the breaker (s)."""
    breaker_max_fleet_fraction: float = _BREAKER["max_fleet_fraction"]
    """Nodes newly restricted within the window, as a share of the fleet (1: no bound)."""
    breaker_max_in_effect_fleet_fraction: float = _BREAKER["max_in_effect_fleet_fraction"]
    """Nodes restricted at once, as a share of the fleet (1: no bound)."""
    breaker_min_nodes: int = _BREAKER["min_nodes"]
    """The fewest nodes either bound allows."""
    drain_min_slowdown: float = 0.0
    """A detected degraded node (or a throttled loop's nodes) is drained only when it lost at
    least this share of its throughput, whatever the economics say (0: the economics alone)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not (math.isfinite(self.breaker_window_s) and self.breaker_window_s >= 60.0):
            raise ValueError(f"breaker_window_s must be >= 60 s, got {self.breaker_window_s!r}")
        for name in ("breaker_max_fleet_fraction", "breaker_max_in_effect_fleet_fraction"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {v!r}")
        if not (isinstance(self.breaker_min_nodes, int) and self.breaker_min_nodes >= 1):
            raise ValueError(f"breaker_min_nodes must be an integer >= 1, got {self.breaker_min_nodes!r}")
        if not 0.0 <= self.drain_min_slowdown <= 1.0:
            raise ValueError(f"drain_min_slowdown must be in [0, 1], got {self.drain_min_slowdown!r}")


@dataclass(frozen=True)
class PolicyParams:
    """A policy and the costs it runs with."""

    name: str
    """One of :data:`POLICIES` (``baseline`` is read as ``baseline_fixed``)."""
    checkpoint_interval_min: float = 60.0
    """Interval of the storage copies behind an in-memory tier (``baseline_daly_async``,
    ``in_job_restart``: where silent corruption goes back to). ``baseline_fixed`` runs
    Daly's interval for its own write and the job's failure rate, as a team tuning it
    would; a fixed interval only through an explicit cost ``interval_s``."""
    fixed_interval_min: float | None = None
    """A fixed compute interval between ``baseline_fixed``'s checkpoints (e.g. hourly);
    ``None`` (default): Daly's interval for its write and the job's failure rate."""
    checkpoint_write_min: float = 5.0
    """Stall of a full checkpoint to storage (Meta RSC w_cp ~ 5 min)."""
    restart_cost_min: float = 10.0
    """Baseline's full-restart overhead (Meta RSC u0 5-20 min: requeue, init, reload)."""
    detection_delay_s: float = 31.0
    """Gray-failure detection delay: the telemetry twin's measured median detection delay
    (`seamguard demo --json --seed S`, seeds 0/1/2: 31.2 s, 30.1 s, 32.1 s). Meta's 5-min
    health-check cadence would be 300."""
    detection_precision: float = 0.9
    """Share of gray-failure alarms that are true; each true alarm comes with (1-p)/p
    false ones on average, which the policy also acts on. The telemetry twin measured 0
    false actions over three seeds (precision 1.0 there); 0.9 keeps a margin for fleets
    noisier than the twin."""
    detection: DetectionModel | None = None
    """The detector's measured per-class recall, delays and precision
    (benchmarks/detection.py's result); when given, the seamguard policy samples its
    misses and delays from it and ``detection_delay_s`` / ``detection_precision`` are
    unused."""
    straggler_threshold: float = 0.7
    """``in_job_restart``'s straggler detector: relative performance score below which a
    rank is flagged (NVRx's ``gpu_relative_perf_threshold``; 0.7 is the default of Megatron
    Bridge's ``NVRxStragglerDetectionConfig`` and of NeMo's recipes, docs/benchmarks.md)."""
    straggler_report_s: float = 300.0
    """Its reporting window (``report_time_interval``: 300 s, the same default)."""
    replica_group_gpus: int = 64
    """GPUs in one replica group: the failure domain live recovery re-forms (torchft)."""
    step_time_s: float = 5.0
    """Training step time, to turn ``steps_lost`` into seconds (assumed)."""
    state_gib_per_gpu: float = 28.0
    """Checkpoint state per GPU (Alibaba HPN: 30 GB/GPU = 28 GiB)."""
    quarantine_hold_h: float = 4.0
    """How long a quarantined node stays out for investigation (assumed)."""
    job_wide_crash_fraction: float = 0.25
    """Share of process crashes (software bug, NCCL timeout, dependency) that take down
    every rank at once, so that even the seamguard runtime must relaunch the job (from the
    snapshots the dead processes left in host memory). The rest kill one rank's process,
    which the runtime replaces exactly like a lost node (the kill its benchmark measures).
    Assumed: no public source splits Llama 3's counts this way."""
    crash_capture_fraction: float = 0.5
    """Share of job-wide crashes that end every process through an exception the training
    script does not catch (a Python-level bug, a failed dependency, an error the framework
    raises), with the process and its device context still usable, so the runtime's
    exception hook leaves the start of the failed step in host memory (runtime
    ``--crash-capture``, tested in tests/runtime/test_recovery.py) and the relaunch resumes
    there: only the step in flight is redone. The rest die by signal (segfault, OOM kill,
    a watchdog's abort) or with a broken device context, and go back to the newest
    periodic snapshot. Assumed: no public source splits crashes this way."""
    sdc_caught_at_step_fraction: float = 0.5
    """Share of interruption-causing silent data corruptions that show at the step they
    happen as a gradient-norm anomaly the runtime's step guard rejects before the
    optimizer applies it (runtime/guard.py). Those cost the step's recompute and, charged
    always, a recompute that fails again and the rank's live replacement; the rest surface
    later (e.g. as loss divergence) and go back to the storage backstop. Assumed:
    Altenbernd et al. 2026 (arXiv 2604.00726) observe harmful GEMM faults as spikes in
    gradient norm and update size that recomputing the step mitigates, but also as
    slow parameter divergence; no public source gives the fleet share."""
    hang_detect_s: float = 30.0
    """Time for the seamguard runtime to notice a hung collective
    (``--collective-timeout-s`` default, docs/runtime.md)."""
    baseline_hang_detect_s: float = 600.0
    """Time for a plain PyTorch job to notice a hung collective: the NCCL watchdog's
    default collective timeout (10 min)."""
    runtime: RuntimeFigures = DEFAULT_FIGURES
    """Measured runtime figures (seamguard policy)."""
    runtime_overhead: str = "snapshot_stall"
    """How the runtime's steady cost enters: ``snapshot_stall`` (default) charges each
    in-memory snapshot its measured stall (the part that cannot overlap compute on a GPU
    node, where the device-to-host copy runs on a side stream); ``measured_wall`` slows
    every step by the benchmark's failure-free wall ratio, measured on a 2-core CPU VM
    where copy and hashing compete with compute for the same cores (a pessimistic bound)."""
    costs: CostModel | None = None
    """Every cost component of the policy; ``None``: :func:`default_costs` (the documented
    defaults, derived from the fields above and the measured runtime figures)."""
    controller: ControllerSettings = ControllerSettings()
    """seamguard's controller: mode, breaker bounds, drain floor (unused by the baselines,
    which have no controller)."""
    links: str | None = None
    """What a link flap costs: ``stall`` (a single rail: HPN's > 9 s) or ``rail_failover``
    (traffic moves to the other rail: seamguard's runtime, or kernel bonding in
    active-backup mode under a baseline); ``None``: the policy's default (failover for
    seamguard only)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _ALIASES.get(self.name, self.name))
        if self.name not in POLICIES:
            raise ValueError(f"--compare must be one of {POLICIES + ('both', 'all')}, got {self.name!r}")
        for opt, v in (("--checkpoint-interval-min", self.checkpoint_interval_min),
                       ("--checkpoint-write-min", self.checkpoint_write_min),
                       ("--restart-cost-min", self.restart_cost_min),
                       ("--step-time-s", self.step_time_s),
                       ("--state-gib-per-gpu", self.state_gib_per_gpu)):
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{opt} must be > 0, got {v!r}")
        if self.links not in (None, "stall", "rail_failover"):
            raise ValueError(f"links must be 'stall' or 'rail_failover', got {self.links!r}")
        if self.runtime_overhead not in ("snapshot_stall", "measured_wall"):
            raise ValueError("runtime_overhead must be 'snapshot_stall' or 'measured_wall', "
                             f"got {self.runtime_overhead!r}")
        if not 0.0 <= self.job_wide_crash_fraction <= 1.0:
            raise ValueError("--job-wide-crash-fraction must be in [0, 1], "
                             f"got {self.job_wide_crash_fraction!r}")
        if not 0.0 <= self.crash_capture_fraction <= 1.0:
            raise ValueError("--crash-capture-fraction must be in [0, 1], "
                             f"got {self.crash_capture_fraction!r}")
        if not 0.0 <= self.sdc_caught_at_step_fraction <= 1.0:
            raise ValueError("--sdc-caught-fraction must be in [0, 1], "
                             f"got {self.sdc_caught_at_step_fraction!r}")
        if not (self.hang_detect_s >= 0 and self.baseline_hang_detect_s >= 0):
            raise ValueError("hang detection times must be >= 0 s")
        if not self.detection_delay_s >= 0:
            raise ValueError("--detection-delay-s must be >= 0")
        if not 0.0 < self.detection_precision <= 1.0:
            raise ValueError("--detection-precision must be in (0, 1]")
        if self.fixed_interval_min is not None and not (
                self.fixed_interval_min > 0 and math.isfinite(self.fixed_interval_min)):
            raise ValueError(f"fixed interval must be > 0 min, got {self.fixed_interval_min!r}")
        if not (0.0 < self.straggler_threshold <= 1.0 and self.straggler_report_s > 0):
            raise ValueError("straggler threshold must be in (0, 1] and its report window > 0 s")
        if self.replica_group_gpus < 1:
            raise ValueError("--replica-group-gpus must be >= 1")
        if self.quarantine_hold_h < 0:
            raise ValueError("quarantine hold must be >= 0 h")

    # ---- the documented scaling model (docs/twin-events.md, "Recovery model") ----

    def _rank_scale(self, ranks: int) -> float:
        """Communicator re-formation grows with log2 of the ranks involved."""
        m = max(self.runtime.measured_ranks, 2)
        return max(1.0, math.log2(max(ranks, 2)) / math.log2(m))

    @property
    def full_write_s(self) -> float:
        """Full checkpoint stall to storage."""
        return self.checkpoint_write_min * 60.0

    @property
    def in_memory_stall_s(self) -> float:
        """Snapshot stall: a copy of this GPU's state into host memory, at the measured
        rate (save time per GiB x snapshot_stall_ratio); it scales with bytes per GPU,
        not with the cluster's storage bandwidth."""
        r = self.runtime
        return self.state_gib_per_gpu * r.save_s_per_gib * r.snapshot_stall_ratio

    @property
    def in_memory_restore_s(self) -> float:
        """Restore of this GPU's state from host memory: measured copy-back time per GiB
        times bytes per GPU."""
        return self.state_gib_per_gpu * self.runtime.restore_s_per_gib

    @property
    def live_recovery_s(self) -> float:
        """Node loss under live recovery: measured resume, scaled to the replica group,
        plus the spare loading its shard from a peer's memory."""
        return (self.runtime.live_resume_s * self._rank_scale(self.replica_group_gpus)
                + self.in_memory_restore_s)

    def relaunch_from_memory_s(self, job_gpus: int, captured: bool = False) -> float:
        """Crash of every rank: measured relaunch scaled to the job's ranks, then each new
        process restores the snapshot its predecessor left in host memory. ``captured``:
        the crash was an exception every process caught on its way out (measured
        separately when the results hold it)."""
        r = self.runtime
        base = r.relaunch_captured_s if captured and r.relaunch_captured_s > 0 else r.relaunch_s
        return base * self._rank_scale(job_gpus) + self.in_memory_restore_s

    def rollback_in_place_s(self, job_gpus: int) -> float:
        """Corruption found after it was persisted: a rollback generation (runtime
        ``rollback`` hint; every process stays up and restores the newest persisted step
        from the copy it kept in host memory): the measured live resume scaled to the
        job's ranks (the whole job agrees on the step) + memory restore."""
        return self.runtime.live_resume_s * self._rank_scale(job_gpus) + self.in_memory_restore_s

    @property
    def restart_s(self) -> float:
        """Baseline restart overhead."""
        return self.restart_cost_min * 60.0

    @property
    def cost_model(self) -> CostModel:
        """The costs this policy runs with: the explicit ones, else the defaults."""
        return self.costs if self.costs is not None else default_costs(self)

    def rank_scale(self, ranks: int) -> float:
        """How a relaunch or resume measured at the benchmark's ranks grows with ranks."""
        return self._rank_scale(ranks)


def default_costs(pp: PolicyParams) -> CostModel:
    """The documented defaults of each policy's costs (docs/twin-events.md, "Policies").

    * ``baseline_fixed``: Daly's interval for the job's failure rate and its own write
      (a fixed one only when ``fixed_interval_min`` is given), a blocking write (Meta RSC w_cp ~5 min),
      a full restart (Meta RSC u0 5-20 min, 10 min; requeue and reload are inside u0),
      hangs found by NCCL's default 10-min collective timeout.
    * ``baseline_daly_async``: the same restart and timeout; asynchronous writes
      (PyTorch DCP ``async_save``): only the device-to-host snapshot blocks, at the
      runtime's measured snapshot stall; the write to storage (5 min) runs behind it;
      the interval is Young/Daly's for the job's failure rate.
    * ``in_job_restart`` (NVRx in-job / in-process restart, torchft-style peers): every
      rank restarts in place at the measured relaunch (no requeue), loads its state from a
      peer's host memory at the measured copy-back rate, checkpoints to a peer at the
      measured snapshot stall plus replication, hangs found by NVRx's 60-s soft timeout;
      silent corruption goes back to an hourly storage copy.
    * ``seamguard``: the checkpoint planner's interval and tier; live replacement of a
      lost rank at the measured resume; relaunch from host memory when every rank died;
      hangs found by the runtime's 30-s collective timeout.
    """
    r = pp.runtime
    peer_stall = 1.25 * pp.in_memory_stall_s   # replication charged as a quarter more (tier_costs)
    if pp.name == "baseline_fixed":
        fixed = pp.fixed_interval_min
        return CostModel(interval_s=None if fixed is None else fixed * 60.0,
                         write_blocking_s=pp.full_write_s, write_async_s=0.0,
                         restart_s=pp.restart_s, requeue_s=0.0, load_s=0.0,
                         hang_detect_s=pp.baseline_hang_detect_s, swap_s=0.0,
                         backstop_interval_s=pp.checkpoint_interval_min * 60.0)
    if pp.name == "baseline_daly_async":
        return CostModel(interval_s=None, write_blocking_s=pp.in_memory_stall_s,
                         write_async_s=pp.full_write_s, restart_s=pp.restart_s, requeue_s=0.0,
                         load_s=0.0, hang_detect_s=pp.baseline_hang_detect_s, swap_s=0.0,
                         backstop_interval_s=pp.checkpoint_interval_min * 60.0)
    if pp.name == "in_job_restart":
        return CostModel(interval_s=None, write_blocking_s=peer_stall, write_async_s=0.0,
                         restart_s=r.relaunch_s, requeue_s=0.0, load_s=pp.in_memory_restore_s,
                         hang_detect_s=NVRX_SOFT_TIMEOUT_S, swap_s=0.0,
                         backstop_interval_s=pp.checkpoint_interval_min * 60.0)
    return CostModel(interval_s=None, write_blocking_s=pp.in_memory_stall_s,
                     write_async_s=pp.full_write_s, restart_s=r.relaunch_s, requeue_s=0.0,
                     load_s=pp.in_memory_restore_s, hang_detect_s=pp.hang_detect_s,
                     swap_s=r.live_resume_s, backstop_interval_s=4 * 3600.0)


def workload(cfg: ClusterConfig) -> tuple[JobSpec, ...]:
    """Place the workload on contiguous node ranges; spares take the last nodes."""
    usable = cfg.nodes - cfg.spare_nodes
    if usable <= 0:
        raise ValueError("no nodes left for jobs after spares")
    J, C = JobClass, Criticality
    if cfg.workload == "single":
        return (JobSpec("pretrain", 0, usable, J.HIGH_SYNC_TRAINING, C.RELEASE_CRITICAL),)
    # A mix of sizes: one big release-critical pretraining run, pipeline fine-tunes,
    # batch inference and latency-critical serving (shares of the usable nodes).
    plan = [("pretrain", 0.50, J.HIGH_SYNC_TRAINING, C.RELEASE_CRITICAL),
            ("pipeline-a", 0.10, J.PIPELINE_TRAINING, C.HIGH),
            ("pipeline-b", 0.10, J.PIPELINE_TRAINING, C.NORMAL),
            ("research-a", 0.03, J.HIGH_SYNC_TRAINING, C.NORMAL),
            ("research-b", 0.02, J.HIGH_SYNC_TRAINING, C.LOW),
            ("batch-a", 0.08, J.ASYNC_BATCH_INFERENCE, C.LOW),
            ("batch-b", 0.07, J.ASYNC_BATCH_INFERENCE, C.LOW),
            ("serve-a", 0.05, J.LATENCY_INFERENCE, C.HIGH),
            ("serve-b", 0.05, J.LATENCY_INFERENCE, C.HIGH)]
    jobs: list[JobSpec] = []
    start = 0
    for name, share, jc, crit in plan:
        n = int(usable * share)
        if n < 1:
            continue
        jobs.append(JobSpec(name, start, n, jc, crit))
        start += n
    if not jobs:
        return (JobSpec("pretrain", 0, usable, J.HIGH_SYNC_TRAINING, C.RELEASE_CRITICAL),)
    return tuple(jobs)
