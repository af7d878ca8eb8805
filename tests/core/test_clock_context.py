"""A GPU's clock is judged only against its own context: at load, beside the GPUs of its job.

Found by the seam drill under Slurm: once the controller moved the job (requeued, pending, no
node held), every GPU fell into the "no job" peer group, and the idle spare's parked clock
(a few hundred MHz, as idle GPUs run) read as an 80 % deficit against the median of the two
GPUs the dcgm series still showed at load; the spare was labelled degraded and drained.
Decision table over gpu_evidence's clock_deficit channel on the drill's own topology.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from seamguard.app.config import load_topology
from seamguard.assess.evidence import EvidenceConfig, gpu_evidence
from seamguard.observe import History
from seamguard.observe.frame import make_frame
from seamguard.testbed.drill import Layout, topology_yaml

BOOST, IDLE = 1980.0, 345.0


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    path.write_text(topology_yaml(Layout()))
    return load_topology(path)


def _placed(fleet, job_nodes: list[str]):
    """The fleet with its one job on ``job_nodes`` (as the Slurm placement rebuilds it)."""
    gpu_job = np.full(fleet.gpu_job.shape[0], -1, dtype=np.int64)
    for n in job_nodes:
        gpu_job[fleet.gpu_node == fleet.node_names.index(n)] = 0
    return replace(fleet, gpu_job=gpu_job, _index={})


def _clock_scores(fleet, clock_mhz: list[float], util_pct: list[float] | None) -> dict[str, float]:
    values = {"DCGM_FI_DEV_SM_CLOCK": np.array(clock_mhz), "DCGM_FI_DEV_GPU_TEMP": np.full(3, 60.0),
              "DCGM_FI_DEV_POWER_USAGE": np.full(3, 500.0)}
    if util_pct is not None:
        values["DCGM_FI_DEV_GPU_UTIL"] = np.array(util_pct)
    frame = make_frame(fleet, 100.0, values)
    ev, *_ = gpu_evidence(fleet, frame, History(1.0), EvidenceConfig(), np.zeros(2))
    col = ev.channels.index("clock_deficit")
    return {fleet.node_names[int(fleet.gpu_node[g])]: float(ev.score[g, col]) for g in range(3)}


# (job's nodes, SM clocks h0 h1 h2, utilisation h0 h1 h2 or None, nodes whose clock must score, must not)
CASES = [
    # the drill's regression: job requeued and pending (no node), the spare idles at its parked clock
    ([], [BOOST, BOOST, IDLE], [97, 97, 0], set(), {"h0", "h1", "h2"}),
    # the same without a utilisation series: out of a job is out of any peer group
    ([], [BOOST, BOOST, IDLE], None, set(), {"h0", "h1", "h2"}),
    # the job restarted on h1 and h2 but h2's GPU has not ramped up yet: idle, no verdict
    (["h1", "h2"], [BOOST, BOOST, IDLE], [97, 97, 0], set(), {"h0", "h1", "h2"}),
    # a spare idling beside a running job: no verdict on it
    (["h0", "h1"], [BOOST, BOOST, IDLE], [97, 97, 0], set(), {"h0", "h1", "h2"}),
    # a job of two GPUs: each has one peer, too few to say what normal is (issue 37: a group
    # smaller than 3 falls back to the GPU's own clock history, which this single frame lacks)
    (["h0", "h1"], [BOOST, 1500.0, IDLE], [97, 97, 0], set(), {"h0", "h1", "h2"}),
    (["h1", "h2"], [IDLE, BOOST, 1500.0], [0, 97, 97], set(), {"h0", "h1"}),
]


@pytest.mark.parametrize("job_nodes,clock,util,flagged,clean", CASES)
def test_clock_deficit_is_judged_at_load_against_job_peers(topology, job_nodes, clock, util, flagged, clean):
    scores = _clock_scores(_placed(topology, job_nodes), clock, util)
    for n in flagged:
        assert scores[n] > 0.5, f"{n}: {scores}"
    for n in clean:
        assert scores[n] == 0.0, f"{n}: {scores}"
