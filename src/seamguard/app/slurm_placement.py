"""Where the topology's jobs run now, and how much each matters, read from Slurm.

A topology file names the jobs seamguard looks after (class, criticality); on a Slurm
cluster those jobs move: requeued, restarted elsewhere, shrunk. With ``slurm_placement``
in a run config the live source asks ``squeue`` every ``refresh_s`` which nodes each of
them holds (matched by the Slurm job name) and, where the job says so, how critical it is:
a ``criticality=<x>`` token in its comment (``sbatch --comment``), else its QOS through
``qos_criticality``, else the topology's value. A topology job that is not running holds
no node. A job's nodes come from ``scontrol show hostnames`` (Slurm's own hostlist
expansion). Its deadline (decide/slip.py): a ``deadline=<ISO 8601 with timezone>`` token in
its comment, else Slurm's own ``Deadline`` (``sbatch --deadline``; squeue prints it only
through ``--Format=Deadline``, so it is a second squeue call), else, with
``time_limit_as_deadline``, the end of its time limit (``EndTime``: when Slurm kills it),
else the run config's. If squeue cannot be read the last placement stays (one warning per outage):
seamguard then acts on what it knew, and never on a guess.

Pure: :func:`parse_squeue`, :func:`parse_times`, :func:`criticality_of`, :func:`deadline_of`,
:func:`place`; side effects only in
:class:`SlurmPlacement`.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from seamguard.fleet.model import Fleet

log = logging.getLogger("seamguard.app.slurm_placement")

SQUEUE_FORMAT = "%i|%j|%T|%q|%Q|%k|%N"  # id, name, state, QOS, priority, comment, nodes
# id, sbatch --deadline, end of the time limit: fixed-width columns (no letter of -o prints a deadline)
SQUEUE_TIMES = "JobID:40,Deadline:40,EndTime:40"
_UNSET_TIMES = {"N/A", "NONE", "UNKNOWN", "(NULL)", "0"}
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
    deadline_key: str = Field("deadline", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                              description="a '<key>=<ISO 8601 time with timezone>' token in the job's comment "
                                          "sets its deadline (over sbatch --deadline)")
    time_limit_as_deadline: bool = Field(
        False, description="a job with no other deadline must finish by the end of its time limit (EndTime)")


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


def parse_times(text: str) -> dict[str, tuple[float, float]]:
    """``squeue -h -O SQUEUE_TIMES`` rows -> job id -> (Deadline, EndTime) as Unix seconds (NaN: unset).

    Slurm prints these times without a zone, in the local time of the squeue process (the
    same TZ as this one: the calls share its environment). Rows that do not parse are skipped."""
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or not parts[0].replace("_", "").isdigit():
            continue
        out[parts[0]] = (_slurm_time(parts[1]), _slurm_time(parts[2]))
    return out


def _slurm_time(s: str) -> float:
    if s.upper() in _UNSET_TIMES:
        return float("nan")
    try:
        return datetime.fromisoformat(s).timestamp()  # naive: local time, as Slurm printed it
    except ValueError:
        return float("nan")


def parse_deadline(text: str, where: str) -> float:
    """An ISO 8601 time with a timezone as Unix seconds; ValueError naming ``where`` otherwise."""
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not an ISO 8601 time (e.g. 2026-12-01T18:00:00+00:00)") from None
    if t.tzinfo is None:
        raise ValueError(f"{where}: {text!r} has no timezone (add Z or +hh:mm)")
    return t.timestamp()


def deadline_of(job: SqueueJob, times: tuple[float, float] | None, cfg: SlurmPlacementConfig,
                default: float) -> tuple[float, str]:
    """(deadline Unix s, a problem or ""): the comment's ``<deadline_key>=<ISO time>``, else Slurm's
    ``Deadline``, else with ``time_limit_as_deadline`` its ``EndTime``, else ``default``."""
    m = re.search(rf"(?:^|[\s,;]){re.escape(cfg.deadline_key)}=([^\s,;]+)", job.comment)
    if m:
        try:
            return parse_deadline(m.group(1), f"job {job.name} ({job.job_id}): comment {cfg.deadline_key}"), ""
        except ValueError as e:
            problem = str(e)
    else:
        problem = ""
    deadline, end = times if times is not None else (float("nan"), float("nan"))
    if np.isfinite(deadline):
        return deadline, problem
    if cfg.time_limit_as_deadline and np.isfinite(end):
        return end, problem
    return default, problem


def criticality_of(job: SqueueJob, cfg: SlurmPlacementConfig, default: float) -> float:
    """The comment's ``<key>=<x>``, else the QOS's, else ``default``."""
    m = re.search(rf"(?:^|[\s,;]){re.escape(cfg.comment_key)}=([0-9]*\.?[0-9]+)(?:$|[\s,;])", job.comment)
    if m:
        return float(m.group(1))
    return float(cfg.qos_criticality.get(job.qos, default))


def place(topology: Fleet, jobs: list[SqueueJob], nodes_of: dict[str, list[str]],
          cfg: SlurmPlacementConfig, times: dict[str, tuple[float, float]] | None = None) -> tuple[Fleet, list[str]]:
    """The fleet with each topology job on the nodes Slurm gives it (all their GPUs), its
    criticality and its deadline (``times``: job id -> (Deadline, EndTime), :func:`parse_times`);
    ``nodes_of`` maps a hostlist expression to node names. Returns what was ignored and why (a
    node the topology does not know, a name used by two running jobs, a deadline that does not parse)."""
    problems: list[str] = []
    job_index = {n: j for j, n in enumerate(topology.job_names)}
    node_index = {n: i for i, n in enumerate(topology.node_names)}
    gpu_job = np.full(topology.gpu_job.shape[0], -1, dtype=np.int64)
    crit = topology.job_criticality.astype(float).copy()
    deadline0, _, _ = topology.job_schedule()
    deadline = deadline0.copy()
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
        deadline[j], bad = deadline_of(job, (times or {}).get(job.job_id), cfg, float(deadline0[j]))
        if bad:
            problems.append(f"{bad}; its deadline ignored")
        for node in nodes_of.get(job.nodes, []):
            i = node_index.get(node)
            if i is None:
                problems.append(f"job {job.name} ({job.job_id}): node {node!r} is not in the topology")
                continue
            gpu_job[topology.gpu_node == i] = j
    return replace(topology, gpu_job=gpu_job, job_criticality=crit, job_deadline_s=deadline, _index={}), problems


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

    def _times(self) -> tuple[dict[str, tuple[float, float]], str]:
        """(job id -> (Deadline, EndTime), a problem or ""): a squeue that cannot print them costs the
        deadlines from Slurm (logged), never the placement."""
        try:
            return parse_times(self._run([self.cfg.squeue, "-h", "-a", "-t", "RUNNING,COMPLETING,SUSPENDED",
                                          "-O", SQUEUE_TIMES])), ""
        except (OSError, subprocess.SubprocessError) as exc:
            return {}, f"deadlines not read from Slurm ({exc}); the run config's stand"

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
            times, why = self._times() if wanted else ({}, "")
            placed, more = place(topology, jobs, {h: self._expand(h) for h in wanted}, self.cfg, times)
            more += [why] if why else []
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
