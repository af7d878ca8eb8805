"""Live goodput: each job's wall time split by what it went to, with the cause of every lost minute.

`attribution` is the pure core (records in, one `Goodput` out); `evidence` turns what the
scheduler and the ledger wrote into its records; `sources` is the edge that reads them
(Prometheus range queries, sacct/scontrol, the ledger). The CLI (`seamguard goodput`), the
API (`/api/v1/goodput`), `/metrics` and the dashboard render the same `Goodput`.
See docs/goodput.md.
"""

from seamguard.goodput.attribution import (CAUSES, LOST_CAUSES, Cause, Episode, Goodput, JobSeries, Run, Span,
                                           attribute, ettr_over_time, fleet)

__all__ = ["CAUSES", "LOST_CAUSES", "Cause", "Episode", "Goodput", "JobSeries", "Run", "Span", "attribute",
           "ettr_over_time", "fleet"]
