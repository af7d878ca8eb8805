"""Where the topology's jobs run now, and how much each matters, read from Slurm.

A topology file names the jobs seamguard looks after (class, criticality); on a Slurm
cluster those jobs move: requeued, restarted elsewhere, shrunk. With ``slurm_placement``
in a run config the live source asks ``squeue`` every ``refresh_s`` which nodes each of
them holds (matched by the Slurm job name) and, where the job says so, how critical it is:
a ``criticality=<x>`` token in its comment (``sbatch --comment``), else its QOS through
``qos_criticality``, else the topology's value. A topology job that is not running holds
no node. A job's nodes come from ``scontrol show hostnames`` (Slurm's own hostlist
expansion). If squeue cannot be read the last placement stays (one warning per outage):
seamguard then acts on what it knew, and never on a guess.

Pure: :func:`parse_squeue`, :func:`criticality_of`, :func:`place`; side effects only in
:class:`SlurmPlacement`.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.fleet.model import Fleet

log = logging.getLogger("seamguard.app.slurm_placement")

SQUEUE_FORMAT = "%i|%j|%T|%q|%Q|%k|%N"  # id, name, state, QOS, priority, comment, nodes
_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED"}


class SlurmPlacementConfig(BaseModel):
    """The ``slurm_placement`` section of a run config."""

    model_config = ConfigDict(extra="forbid")
    squeue: str = Field("squeue", description="squeue binary")
    scontrol: str = Field("scontrol", description="scontrol binary (hostlist expansion)")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for the calls (default: Slurm's own)")
    timeout_s: float = Field(15.0, gt=0, description="timeout of every squeue/scontrol call")
    refresh_s: float = Field(30.0, gt=0, description="seconds between squeue reads")
    comment_key: str = Field("criticality", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                             description="a '<key>=<number>' token in the job's comment sets its criticality")
    qos_criticality: dict[str, float] = Field(
        default_factory=dict, description="QOS name -> criticality, for jobs whose comment does not set one")


@dataclass(frozen=True)
class SqueueJob:
    job_id: str
    name: str
    state: str
    qos: str
    priority: float
    comment: str
    nodes: str  # a Slurm hostlist expression, e.g. gpu[001-004]


def parse_squeue(text: str) -> tuple[list[SqueueJob], list[str]]:
    """Rows of ``squeue -h -o SQUEUE_FORMAT``; rows that do not parse are returned as problems."""
    jobs, problems = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 7:
            problems.append(f"squeue line {n}: expected 7 '|'-separated fields, got {len(parts)}")
            continue
        job_id, name, state, qos, prio, nodes = parts[0], parts[1], parts[2], parts[3], parts[4], parts[-1]
        comment = "|".join(parts[5:-1])  # a comment may contain the separator
        try:
            priority = float(prio)
        except ValueError:
            problems.append(f"squeue line {n}: priority {prio!r} is not a number")
            continue
        jobs.append(SqueueJob(job_id.strip(), name.strip(), state.strip().upper(), qos.strip(), priority,
                              comment.strip(), nodes.strip()))
    return jobs, problems


def criticality_of(job: SqueueJob, cfg: SlurmPlacementConfig, default: float) -> float:
    """The comment's ``<key>=<x>``, else the QOS's, else ``default``."""
    m = re.search(rf"(?:^|[\s,;]){re.escape(cfg.comment_key)}=([0-9]*\.?[0-9]+)(?:$|[\s,;])", job.comment)
    if m:
        return float(m.group(1))
    return float(cfg.qos_criticality.get(job.qos, default))


def place(topology: Fleet, jobs: list[SqueueJob], nodes_of: dict[str, list[str]],
          cfg: SlurmPlacementConfig) -> tuple[Fleet, list[str]]:
    """The fleet with each topology job on the nodes Slurm gives it (all their GPUs) and its
    criticality; ``nodes_of`` maps a hostlist expression to node names. Returns what was
    ignored and why (a node the topology does not know, a name used by two running jobs)."""
    problems: list[str] = []
    job_index = {n: j for j, n in enumerate(topology.job_names)}
    node_index = {n: i for i, n in enumerate(topology.node_names)}
    gpu_job = np.full(topology.gpu_job.shape[0], -1, dtype=np.int64)
    crit = topology.job_criticality.astype(float).copy()
    seen: dict[str, str] = {}
    for job in jobs:
        j = job_index.get(job.name)
        if j is None or job.state not in _RUNNING:
            continue
        if job.name in seen:
            problems.append(f"job name {job.name!r} is used by Slurm jobs {seen[job.name]} and {job.job_id}: "
                            f"{job.job_id} ignored")
            continue
        seen[job.name] = job.job_id
        crit[j] = criticality_of(job, cfg, float(topology.job_criticality[j]))
        for node in nodes_of.get(job.nodes, []):
            i = node_index.get(node)
            if i is None:
                problems.append(f"job {job.name} ({job.job_id}): node {node!r} is not in the topology")
                continue
            gpu_job[topology.gpu_node == i] = j
    return replace(topology, gpu_job=gpu_job, job_criticality=crit, _index={}), problems


class SlurmPlacement:
    """``fleet(topology)``: the topology with its jobs where Slurm runs them now (refreshed every ``refresh_s``)."""

    def __init__(self, cfg: SlurmPlacementConfig, clock=time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self._env = {**os.environ, **({"SLURM_CONF": str(cfg.slurm_conf)} if cfg.slurm_conf else {})}
        self._last: Fleet | None = None
        self._next_s = 0.0
        self._failing = False
        self._hostlists: dict[str, list[str]] = {}
        self._told: set[str] = set()  # problems already logged (each once while it lasts)

    def _run(self, args: list[str]) -> str:
        p = subprocess.run(args, env=self._env, capture_output=True, text=True, timeout=self.cfg.timeout_s,
                           check=False)
        if p.returncode != 0:
            raise OSError(f"{' '.join(args[:2])}: exit {p.returncode}: {p.stderr.strip()[:200]}")
        return p.stdout

    def _expand(self, hostlist: str) -> list[str]:
        if hostlist not in self._hostlists:
            self._hostlists[hostlist] = self._run([self.cfg.scontrol, "show", "hostnames", hostlist]).split() \
                if hostlist and hostlist != "(null)" else []
        return self._hostlists[hostlist]

    def fleet(self, topology: Fleet) -> Fleet:
        now = self.clock()
        if self._last is not None and now < self._next_s:
            return self._last
        self._next_s = now + self.cfg.refresh_s
        try:
            text = self._run([self.cfg.squeue, "-h", "-a", "-t", "RUNNING,COMPLETING,SUSPENDED",
                              "-o", SQUEUE_FORMAT])
            jobs, problems = parse_squeue(text)
            wanted = {j.nodes for j in jobs if j.name in set(topology.job_names)}
            placed, more = place(topology, jobs, {h: self._expand(h) for h in wanted}, self.cfg)
        except (OSError, subprocess.SubprocessError) as exc:
            if not self._failing:
                log.warning("slurm placement: %s; keeping the last placement until squeue answers", exc)
            self._failing = True
            return self._last if self._last is not None else topology
        if self._failing:
            log.warning("slurm placement: squeue answers again")
        self._failing = False
        for p in sorted(set(problems + more) - self._told):
            log.warning("slurm placement: %s", p)
        self._told = set(problems + more)
        self._last = placed
        return placed
