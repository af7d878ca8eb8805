"""Event-mode digital twin: months of a 1k-131k+ GPU cluster in seconds.

Calibrated failure processes (:mod:`.calibration`, :mod:`.processes`), a deterministic
event kernel (:mod:`.kernel`), the job-level simulator under the ``baseline`` and
``seamguard`` policies (:mod:`.simulator`), Monte-Carlo runs with confidence intervals
and parallel executors (:mod:`.montecarlo`), size sweeps (:mod:`.sweep`), plots and a
Markdown report (:mod:`.report`), and the ``seamguard twin simulate|report`` commands
(:mod:`.cli`). The policy decisions come from :mod:`seamguard.decide.tiers` and
:mod:`seamguard.decide.economics`; this package never imports torch.
"""

from seamguard.twin.events.config import ClusterConfig, JobSpec, PolicyParams
from seamguard.twin.events.montecarlo import Summary, run_monte_carlo
from seamguard.twin.events.simulator import RunResult, simulate_run

__all__ = ["ClusterConfig", "JobSpec", "PolicyParams", "RunResult", "Summary",
           "run_monte_carlo", "simulate_run"]
