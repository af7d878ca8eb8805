"""The scheduler's accounting from a real slurmctld: a job requeued once, read back by sacct.

slurmctld and one slurmd per node (`SlurmCluster(slurmd=True)`), with the job-completion
log on (``JobCompType=jobcomp/filetxt``: what `sacct -c` reads where there is no slurmdbd).
A batch job is requeued while it runs, starts again after cred_expire and completes. The
reader must see two allocations, the running one from scontrol while it runs, and the
attribution must count the time between them as restart, named after how the run ended.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from seamguard.goodput import JobSeries, attribute
from seamguard.goodput.evidence import parse_sacct
from seamguard.goodput.sources import SourceError, read_runs
from seamguard.testbed.slurm import SlurmCluster
from tests.test_slurm_jobs import wait


class AccountedCluster(SlurmCluster):
    """The test bed's cluster with the job-completion log on."""

    def _write_conf(self) -> None:
        super()._write_conf()
        with open(self.conf, "a") as f:
            f.write(f"JobCompType=jobcomp/filetxt\nJobCompLoc={self.workdir / 'jobcomp.txt'}\n")


def test_requeued_job_reads_back_as_two_runs_and_the_gap_is_restart(tmp_path: Path) -> None:
    with AccountedCluster(tmp_path / "slurm", ["g1", "g2"], slurmd=True) as sc:
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/sh\nsleep 6\n")
        t_submit = time.time() - 1
        jid = sc.sbatch(script, "--job-name=gp-train", "--requeue", "--output=/dev/null")
        wait(lambda: sc.job(jid).get("JobState") == "RUNNING", 30, "the job to start")
        time.sleep(2)
        assert sc.scontrol("requeue", str(jid)).returncode == 0
        wait(lambda: sc.job(jid).get("JobState") == "RUNNING" and sc.job(jid).get("Restarts") == "1", 60,
             "the requeued job to run again")
        kw = dict(sacct="sacct", scontrol=sc.bin("scontrol"), completion=True, env=sc.env)
        live = read_runs("gp-train", t_submit, time.time() + 60, **kw)
        assert [r.state for r in live] == ["PENDING", "RUNNING"] and live[-1].end_s == math.inf
        wait(lambda: sc.job(jid).get("JobState") == "COMPLETED", 60, "the job to complete")
        text = (tmp_path / "slurm" / "jobcomp.txt").read_text()
        runs = read_runs("gp-train", t_submit, time.time() + 60, **kw)
        info = sc.job(jid)
    assert text.count(f"JobId={jid} ") == 2
    assert [r.state for r in runs] == ["PENDING", "COMPLETED"]
    assert runs[0].end_s <= runs[1].start_s
    assert runs[1].end_s - runs[1].start_s == pytest.approx(6, abs=1.5)  # sleep 6 (whole seconds)
    assert runs[1].nodes in ("g1", "g2")
    # scontrol agrees on the last allocation
    last = parse_sacct(f"{jid}|gp-train|COMPLETED|{info['StartTime']}|{info['EndTime']}|{info['NodeList']}")
    assert (last[0].start_s, last[0].end_s) == (runs[1].start_s, runs[1].end_s)
    # the attribution: the gap between the runs is restart, named after the run's end
    since, until = runs[0].start_s, runs[1].end_s
    t = np.arange(since, until + 1e-9, 1.0)
    g = attribute("gp-train", since, until, JobSeries.of(t, np.where(t < runs[0].end_s, t - since, np.nan)), runs)
    gap = runs[1].start_s - runs[0].end_s
    assert gap >= 1 and g.wall_s == until - since
    assert g.by_cause_s["restart"] >= gap
    assert [(s.seam, s.why) for s in g.spans if s.cause == "restart" and s.start_s == runs[0].end_s] == \
        [("scheduler", "Slurm: run ended PENDING")]
    assert sum(g.by_cause_s.values()) == pytest.approx(g.wall_s, abs=1e-6)


@pytest.mark.parametrize("text, msg", [
    ("1|j|COMPLETED|2026-01-01T00:00:00", "fields"),
    ("1|j|COMPLETED|yesterday|2026-01-01T00:00:00|n1", "Start: 'yesterday' is not a time"),
    ("1|j|COMPLETED|2026-01-01T00:00:10|2026-01-01T00:00:00|n1", "End 2026-01-01T00:00:00 is before Start"),
])
def test_malformed_sacct_is_one_line_naming_the_line(text, msg) -> None:
    from seamguard.goodput.evidence import SacctError
    with pytest.raises(SacctError, match=msg):
        parse_sacct(text)


def test_sacct_missing_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="is not on PATH"):
        read_runs("j", 0, 1, sacct=str(tmp_path / "no-sacct"))
