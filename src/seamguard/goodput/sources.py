"""The edge of live goodput: read the job's series, the scheduler's runs and the ledger.

Side effects live here only, each bounded: Prometheus range queries go through
`PrometheusSource.range_series` (its deadline, size cap and schema checks); ``sacct`` and
``scontrol`` run with a timeout; the ledger is read through its reader, page by page up to
`MAX_LEDGER_ROWS`; when asked, each flag's evidence onset from the ledger's series, at most
`MAX_ONSET_LOOKUPS` flags. Each returns the records `seamguard.goodput.attribution` takes. A source
that fails raises `SourceError` with one line saying which and why.
"""

from __future__ import annotations

import math
import re
import subprocess
from datetime import datetime
from collections.abc import Callable

import numpy as np

from seamguard.fleet.model import Kind
from seamguard.goodput.attribution import JobSeries, Run
from seamguard.goodput.evidence import (EVIDENCE_LOOKBACK_S, SACCT_FORMAT, SacctError, evidence_onset, merge_runs,
                                        parse_sacct, run_from_scontrol)
from seamguard.ledger.series import LEVELS
from seamguard.observe.prometheus import MAX_POINTS_PER_SERIES, PromError, PrometheusSource

MAX_LEDGER_ROWS = 200_000  # per table and window: a week of a large fleet's transitions fits
PAGE_ROWS = 5_000
MAX_ONSET_LOOKUPS = 2_000  # flags per read whose evidence onset is looked up (two series reads each)
# The job series the attribution reads, and how several series of one job fold into one.
JOB_QUERIES = (("step", "max", "seamguard_job_step"), ("step_s", "max", "seamguard_job_step_seconds"),
               ("stall_s", "max", "seamguard_rank_checkpoint_stall_seconds"),
               ("generation", "max", "seamguard_job_generation"))


class SourceError(RuntimeError):
    """A source could not be read; the message names it."""


def _selector(src: PrometheusSource, jobs: list[str] | None) -> tuple[str, str]:
    """(job label, label matchers): the jobs named (all when None) plus the mapping's selector."""
    label = src.cfg.mapping.key_for(Kind.JOB).labels[0]
    parts = [src.cfg.mapping.selector] if src.cfg.mapping.selector else []
    if jobs is not None:
        alt = "|".join(re.escape(j) for j in jobs).replace("\\", "\\\\").replace('"', '\\"')
        parts.insert(0, f'{label}=~"{alt}"')
    else:
        parts.insert(0, f'{label}!=""')
    return label, ",".join(parts)


def read_series(src: PrometheusSource, jobs: list[str] | None, start_s: float, end_s: float,
                step_s: float) -> dict[str, JobSeries]:
    """Each job's step, seconds per step and snapshot stall at ``start_s``, +``step_s``, ... ``end_s``
    (every job that reported when ``jobs`` is None; a named job that never reported gets NaNs).

    One query per series for all jobs, in blocks under Prometheus' points-per-series limit.
    The stall and generation series are optional (NaN when absent); a failed step query raises SourceError."""
    n = int(math.floor((end_s - start_s) / step_s + 1e-9)) + 1
    t = start_s + step_s * np.arange(n)
    cols: dict[str, dict[str, np.ndarray]] = {j: {} for j in jobs or []}
    block = MAX_POINTS_PER_SERIES - 1
    label, sel = _selector(src, jobs)
    for name, fold, metric in JOB_QUERIES:
        for k0 in range(0, n, block):
            k1 = min(n, k0 + block) - 1
            try:
                found = src.range_series(f"{fold} by ({label}) ({metric}{{{sel}}})", float(t[k0]), float(t[k1]),
                                         step_s)
            except PromError as e:
                if name == "step":
                    raise SourceError(f"prometheus: {metric}: {e}") from None
                continue
            for labels, pts in found:
                job = labels.get(label)
                if not isinstance(job, str) or (jobs is not None and job not in cols):
                    continue
                arr = cols.setdefault(job, {}).setdefault(name, np.full(n, np.nan))
                rows = np.rint((pts[:, 0] - start_s) / step_s).astype(np.int64)
                ok = (rows >= 0) & (rows < n) & np.isfinite(pts[:, 1])
                arr[rows[ok]] = pts[ok, 1]
    return {j: JobSeries.of(t, c.get("step"), c.get("step_s"), c.get("stall_s"), c.get("generation"))
            for j, c in cols.items()}


def _call(cmd: list[str], timeout_s: float, env: dict[str, str] | None) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    except FileNotFoundError:
        raise SourceError(f"slurm: {cmd[0]} is not on PATH (install slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"slurm: `{' '.join(cmd)}` gave no answer in {timeout_s:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SourceError(f"slurm: `{' '.join(cmd)}` failed (exit {done.returncode}): {last}")
    return done.stdout


def _local(t_s: float) -> str:
    return datetime.fromtimestamp(t_s).strftime("%Y-%m-%dT%H:%M:%S")


def read_runs(job: str, since_s: float, until_s: float, *, sacct: str = "sacct", scontrol: str = "scontrol",
              completion: bool = False, timeout_s: float = 30.0, env: dict[str, str] | None = None) -> list[Run]:
    """Every allocation of the jobs named ``job`` overlapping the window: finished ones from
    sacct (``completion``: from the job-completion log, ``sacct -c``, where there is no
    slurmdbd), the running one from ``scontrol show job``."""
    cmd = [sacct, *(["-c"] if completion else ["-X", "-D"]), "-P", "-n", f"--format={SACCT_FORMAT}",
           f"--name={job}", "-S", _local(since_s), "-E", _local(until_s)]
    try:
        done = parse_sacct(_call(cmd, timeout_s, env), job)
    except SacctError as e:
        raise SourceError(f"slurm: {e}") from None
    now = [r for line in _call([scontrol, "show", "job", "-o"], timeout_s, env).splitlines()
           if f" JobName={job} " in f" {line} " and (r := run_from_scontrol(line)) is not None]
    return merge_runs(done, max(now, key=lambda r: r.start_s) if now else None)


def _paged(read: Callable[..., list[dict]], what: str, **kw) -> list[dict]:
    rows: list[dict] = []
    while True:
        page = read(limit=PAGE_ROWS, offset=len(rows), **kw)
        rows += page
        if len(page) < PAGE_ROWS:
            return rows
        if len(rows) >= MAX_LEDGER_ROWS:
            raise SourceError(f"ledger: more than {MAX_LEDGER_ROWS} {what} in the window; ask for a shorter one")


def read_ledger(reader, since_s: float, until_s: float,
                onsets_from_s: float | None = None) -> tuple[list[dict], list[dict]]:
    """(transitions, actions) recorded in [since_s, until_s]; ``reader`` a ledger reader.

    ``onsets_from_s``: each transition out of healthy from then on also gets ``evidence_since_s``,
    when its evidence began (`evidence_onset` over the ledger's persisted series; the newest
    `MAX_ONSET_LOOKUPS` flags; a reader without series leaves it out)."""
    try:
        trs = _paged(reader.transitions, "transitions", since_t_s=since_s, until_t_s=until_s)
        acts = _paged(reader.actions, "actions", since_t_s=since_s, until_t_s=until_s)
        if onsets_from_s is not None and hasattr(reader, "entity_series"):
            trs = _with_onsets(reader, trs, onsets_from_s)
        return trs, acts
    except SourceError:
        raise
    except Exception as e:  # sqlite3 / psycopg errors: a file that is not a ledger, a server gone
        raise SourceError(f"ledger: cannot read it: {type(e).__name__}: {e}") from None


def _newest_for(read: Callable[..., dict], since_s: float, until_s: float) -> tuple[float, np.ndarray]:
    """(the ``newest_t_s`` that picks it, row times) of one persisted series in [since_s, until_s]
    at the finest level that still holds any (finer levels are pruned sooner), finest first."""
    for lv in LEVELS:
        newest = since_s + lv.keep_s - 1.0
        got = read(since_s, until_s, newest)
        if got["t_s"].size:
            return newest, got["t_s"]
    return math.nan, np.empty(0)


def _with_onsets(reader, transitions: list[dict], from_s: float) -> list[dict]:
    """The transitions, those leaving healthy at or after ``from_s`` with ``evidence_since_s``."""
    flags = sorted((i for i, r in enumerate(transitions) if r["t_s"] >= from_s and r.get("from_state") == "healthy"
                    and r.get("to_state") != "healthy"), key=lambda i: -transitions[i]["t_s"])
    out = list(transitions)
    for i in flags[:MAX_ONSET_LOOKUPS]:
        tr = transitions[i]
        flag, lo = float(tr["t_s"]), float(tr["t_s"]) - EVIDENCE_LOOKBACK_S
        newest, ticks = _newest_for(reader.fleet_series, lo, flag)
        if not ticks.size:
            continue
        rows = reader.entity_series(tr["kind"], tr["entity"], lo, flag, newest)["t_s"]  # at the ticks' level
        out[i] = {**tr, "evidence_since_s": evidence_onset(flag, ticks, rows)}
    return out
