"""A throwaway Slurm controller: munged + slurmctld with fake nodes, no slurmd.

Everything lives in a temporary directory (munge socket and key, slurm.conf, state,
logs) on free loopback ports, so concurrent test runs do not collide with each other
or with a system Slurm. Nodes are `NodeHostname=localhost` and never register, which
is enough for drain/resume/features (slurm.conf(5); docs/sources.md §2).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from seamguard.ports import free_port
from seamguard.testbed.prom import need


class SlurmCluster:
    """``with SlurmCluster(workdir, ["gpu000", ...]) as sc: sc.env`` (SLURM_CONF set)."""

    def __init__(self, workdir: Path, nodes: list[str], start_timeout_s: float = 60.0) -> None:
        self.workdir = Path(workdir)
        self.nodes = nodes
        self.start_timeout_s = start_timeout_s
        self.munged: subprocess.Popen | None = None
        self.ctld: subprocess.Popen | None = None
        self.conf = self.workdir / "slurm.conf"
        self.socket = self.workdir / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        munged = need("munged", "munge")
        slurmctld = need("slurmctld", "slurmctld")
        need("scontrol", "slurm-client")
        need("sinfo", "slurm-client")
        try:
            self._start_munge(munged)
            self._write_conf()
            log = open(self.workdir / "slurmctld.out", "w")
            self.ctld = subprocess.Popen([slurmctld, "-D", "-c", "-f", str(self.conf)], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT)
            log.close()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self, munged: str) -> None:
        d = self.workdir / "munge"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munged = subprocess.Popen(
            [munged, "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'seed'}"],
            stdout=subprocess.DEVNULL, stderr=open(d / "munged.err", "w"))
        deadline = time.monotonic() + 15
        while not self.socket.exists():
            if self.munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(d / 'munged.err').read_text()[-1000:]}")
            time.sleep(0.05)

    def _write_conf(self) -> None:
        state = self.workdir / "state"
        state.mkdir(exist_ok=True)
        w = self.workdir
        names = ",".join(self.nodes)
        self.conf.write_text("\n".join([
            "ClusterName=sgtest",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={w / 'spool'}",
            f"SlurmctldPidFile={w / 'slurmctld.pid'}",
            f"SlurmctldLogFile={w / 'slurmctld.log'}",
            "SlurmctldDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/builtin",
            "SelectType=select/linear",
            f"NodeName={names} NodeHostname=localhost CPUs=1 RealMemory=1000 State=UNKNOWN",
            "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        err = ""
        while time.monotonic() < deadline:
            if self.ctld is not None and self.ctld.poll() is not None:
                raise RuntimeError(f"slurmctld exited {self.ctld.returncode}: "
                                   f"{(self.workdir / 'slurmctld.log').read_text()[-2000:]}")
            r = subprocess.run(["sinfo", "-N", "-h", "-o", "%N"], env=self.env, capture_output=True,
                               text=True, timeout=20)
            if r.returncode == 0 and len(set(r.stdout.split())) == len(self.nodes):
                return
            err = r.stderr
            time.sleep(0.3)
        raise TimeoutError(f"slurmctld not answering after {self.start_timeout_s}s: {err}")

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=20)

    def stop(self) -> None:
        for proc in (self.ctld, self.munged):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self.ctld = self.munged = None

    def __exit__(self, *exc: object) -> None:
        self.stop()
