"""A throwaway Slurm cluster: munged + slurmctld, with fake nodes or with real slurmd nodes.

Everything lives in a temporary directory (munge socket and key, slurm.conf, state,
spool, logs), so concurrent test runs do not collide with each other or with a system
Slurm. Two shapes:

- ``SlurmCluster(workdir, names)``: slurmctld on loopback, nodes `NodeHostname=localhost`
  that never register. Enough for drain/resume/features (slurm.conf(5); docs/sources.md §2).
- ``SlurmCluster(workdir, names, slurmd=True)``: a real cluster. A `seamguard.testbed.net`
  testbed gives every node its own network namespace (host 0 is the controller, host
  i+1 is ``names[i]``, on the management bridge); slurmctld runs in host 0's namespace
  and one `slurmd -N <name>` in each node's, all on Slurm's usual ports. Jobs really run
  (as root, through slurmstepd), really get requeued and really restart on another node.
  Client commands (`scontrol`, `sinfo`, `squeue`, `sbatch`, `scancel`) run in the
  controller's namespace through small wrapper scripts under ``workdir/bin``
  (``cluster.bin("scontrol")``), so an actuator configured with them talks to this cluster.

Why `nsenter --net` and not `ip netns exec` (observed with Slurm 22.05.8 here): `ip netns
exec` also unshares the mount namespace and mounts a fresh sysfs on /sys, which hides the
cgroup file systems under /sys/fs/cgroup; slurmd initialises its cgroup plugin at start
whatever ProctrackType/TaskPlugin say and exits with "No filesystem mounted on
/sys/fs/cgroup / Unable to initialize cgroup plugin / slurmd initialization failed".
`nsenter --net=/run/netns/<ns>` enters only the network namespace, so slurmd sees the
host's cgroup mounts and starts. No cgroup plugin is used for jobs: proctrack/linuxproc,
task/none, jobacct_gather/none. (Debian's Slurm is built with --enable-multiple-slurmd,
so several slurmd on loopback would also run; a namespace per node gives each node its own
address, and the test bed's link faults apply per node.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

from seamguard.ports import free_port
from seamguard.testbed.net import Testbed, TestbedSpec
from seamguard.testbed.prom import need

CLIENTS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel")


class SlurmCluster:
    """``with SlurmCluster(workdir, ["gpu000", ...]) as sc: sc.env`` (SLURM_CONF set)."""

    def __init__(self, workdir: Path, nodes: list[str], start_timeout_s: float = 60.0, slurmd: bool = False,
                 kill_wait_s: int = 2, cred_expire_s: int = 5, testbed: Testbed | None = None,
                 controller_host: int = 0, node_hosts: list[int] | None = None,
                 controller_is_node: bool = False, node_options: dict[str, str] | None = None,
                 topology_conf: str | None = None) -> None:
        """With ``slurmd``: ``testbed`` (already up, left up) hosts the cluster, slurmctld in
        ``controller_host``'s namespace and ``nodes[i]`` in ``node_hosts[i]``'s; without one, a
        one-rail test bed of len(nodes) + 1 hosts is made (and deleted) here. With
        ``controller_is_node`` the controller's host may also run a slurmd (slurmctld and
        slurmd listen on different ports), for a small test bed whose control host is also
        where a moved job can go. ``node_options``: extra ``NodeName`` options per node
        (``Gres=gpu:8 Features=rack_r0``); ``topology_conf``: a topology/tree topology.conf."""
        self.workdir = Path(workdir)
        self.nodes = nodes
        self.start_timeout_s = start_timeout_s
        self.with_slurmd = slurmd
        self.kill_wait_s = kill_wait_s  # SIGTERM -> SIGKILL of a job being requeued or cancelled
        self.cred_expire_s = cred_expire_s  # how long a requeued job waits before it may start again
        self.munged: subprocess.Popen | None = None
        self.ctld: subprocess.Popen | None = None
        self.slurmds: dict[str, subprocess.Popen] = {}
        self.testbed: Testbed | None = testbed
        self._own_testbed = testbed is None
        self.controller_host = controller_host
        self.node_hosts = node_hosts if node_hosts is not None else list(range(1, len(nodes) + 1))
        self.node_options = node_options or {}
        self.topology_conf = topology_conf
        if slurmd and (len(self.node_hosts) != len(nodes) or
                       (controller_host in self.node_hosts and not controller_is_node)):
            raise ValueError(f"node_hosts {self.node_hosts}: expected one host per node ({len(nodes)}), "
                             f"none of them the controller's ({controller_host})")
        self.conf = self.workdir / "slurm.conf"
        self.socket = self.workdir / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _netns(self, host: int) -> list[str]:
        assert self.testbed is not None
        return ["nsenter", f"--net=/run/netns/{self.testbed.host_ns(host)}"]

    def bin(self, client: str) -> str:
        """The command that runs Slurm client ``client`` against this cluster."""
        return str(self.workdir / "bin" / client) if self.with_slurmd else client

    def __enter__(self) -> Self:
        munged = need("munged", "munge")
        slurmctld = need("slurmctld", "slurmctld")
        slurmd = need("slurmd", "slurmd") if self.with_slurmd else ""
        for c in CLIENTS:
            need(c, "slurm-client")
        try:
            self._start_munge(munged)
            if self.with_slurmd:
                if self.testbed is None:
                    self.testbed = Testbed(TestbedSpec(hosts=len(self.nodes) + 1, rails=1)).up()
                self._write_wrappers()
            self._write_conf()
            prefix = self._netns(self.controller_host) if self.with_slurmd else []
            self.ctld = self._daemon([*prefix, slurmctld, "-D", "-c", "-f", str(self.conf)], "slurmctld.out")
            for name, host in zip(self.nodes if self.with_slurmd else [], self.node_hosts, strict=False):
                (self.workdir / "spool" / name).mkdir(parents=True, exist_ok=True)
                self.slurmds[name] = self._daemon([*self._netns(host), slurmd, "-D", "-N", name, "-f", str(self.conf)],
                                                  f"slurmd.{name}.out")
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _daemon(self, cmd: list[str], out: str) -> subprocess.Popen:
        with open(self.workdir / out, "w") as log:
            return subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def _start_munge(self, munged: str) -> None:
        d = self.workdir / "munge"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        with open(d / "munged.err", "w") as err:
            self.munged = subprocess.Popen(
                [munged, "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
                 f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'seed'}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 15
        while not self.socket.exists():
            if self.munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(d / 'munged.err').read_text()[-1000:]}")
            time.sleep(0.05)

    def _write_wrappers(self) -> None:
        d = self.workdir / "bin"
        d.mkdir(exist_ok=True)
        prefix = " ".join(self._netns(self.controller_host))
        for c in CLIENTS:
            p = d / c
            p.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {prefix} {need(c, "slurm-client")} "$@"\n')
            os.chmod(p, 0o755)

    def _node_lines(self) -> list[str]:
        if not self.with_slurmd and not self.node_options:
            return [f"NodeName={','.join(self.nodes)} NodeHostname=localhost CPUs=1 RealMemory=1000 State=UNKNOWN"]
        if not self.with_slurmd:
            return [f"NodeName={n} NodeHostname=localhost CPUs=1 RealMemory=1000 State=UNKNOWN "
                    f"{self.node_options.get(n, '')}".rstrip() for n in self.nodes]
        assert self.testbed is not None
        return [f"NodeName={n} NodeAddr={self.testbed.addr(h, None)} NodeHostname={n} CPUs=1 RealMemory=100 "
                "State=UNKNOWN" for n, h in zip(self.nodes, self.node_hosts, strict=True)]

    def _write_conf(self) -> None:
        if self.topology_conf is not None:  # slurmctld reads it beside slurm.conf
            (self.workdir / "topology.conf").write_text(self.topology_conf)
        state = self.workdir / "state"
        state.mkdir(exist_ok=True)
        w = self.workdir
        if self.with_slurmd:
            assert self.testbed is not None
            # slurmctld checks that it runs on SlurmctldHost by hostname; the namespaces share the UTS one
            ctl = f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.testbed.addr(self.controller_host, None)})"
            ports = ["SlurmctldPort=6817", "SlurmdPort=6818"]  # each daemon has its own network namespace
        else:
            ctl, ports = "SlurmctldHost=localhost", [f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}"]
        self.conf.write_text("\n".join([
            "ClusterName=sgtest",
            ctl,
            *ports,
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            # cred_expire: a requeued job waits this long before it may start again (default 120 s)
            f"AuthInfo=socket={self.socket},cred_expire={self.cred_expire_s}",
            "CredType=cred/munge",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={w / 'spool' / '%n'}",
            f"SlurmctldPidFile={w / 'slurmctld.pid'}",
            f"SlurmdPidFile={w / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={w / 'slurmctld.log'}",
            f"SlurmdLogFile={w / 'slurmd.%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SlurmdParameters=config_overrides",  # nodes say CPUs=1 whatever the machine has
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=1",
            f"KillWait={self.kill_wait_s}",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",  # pending jobs whose BeginTime passed start within a second
            "SelectType=select/linear",
            *(["GresTypes=gpu"] if any("Gres=" in o for o in self.node_options.values()) else []),
            *(["TopologyPlugin=topology/tree"] if self.topology_conf is not None else []),
            *self._node_lines(),
            "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def _wait_ready(self) -> None:
        """Until sinfo lists every node (and, with slurmd, every node has registered: idle)."""
        deadline = time.monotonic() + self.start_timeout_s
        err = ""
        while time.monotonic() < deadline:
            for what, proc in [("slurmctld", self.ctld), *((f"slurmd {n}", p) for n, p in self.slurmds.items())]:
                if proc is not None and proc.poll() is not None:
                    log = "slurmctld.log" if what == "slurmctld" else f"slurmd.{what.split()[1]}.log"
                    path = self.workdir / log
                    raise RuntimeError(f"{what} exited {proc.returncode}: "
                                       f"{path.read_text()[-2000:] if path.exists() else ''}")
            r = subprocess.run([self.bin("sinfo"), "-N", "-h", "-o", "%N %T"], env=self.env, capture_output=True,
                               text=True, timeout=20, check=False)
            rows = dict(line.split()[:2] for line in r.stdout.splitlines() if len(line.split()) >= 2)
            if r.returncode == 0 and set(rows) == set(self.nodes) and (
                    not self.with_slurmd or all(s == "idle" for s in rows.values())):
                return
            err = r.stderr or str(rows)
            time.sleep(0.3)
        raise TimeoutError(f"slurm cluster not ready after {self.start_timeout_s}s: {err}")

    def run(self, client: str, *args: str, timeout_s: float = 20.0) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster."""
        return subprocess.run([self.bin(client), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("scontrol", *args)

    def sbatch(self, script: Path, *args: str) -> int:
        """Submit a batch script; its job id."""
        r = self.run("sbatch", "--parsable", *args, str(script))
        if r.returncode != 0:
            raise RuntimeError(f"sbatch {script}: {r.stderr.strip()}")
        return int(r.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (empty once Slurm forgot the job)."""
        r = self.scontrol("show", "job", "-o", str(job_id))
        out: dict[str, str] = {}
        for tok in r.stdout.split():
            k, sep, v = tok.partition("=")
            if sep and k not in out:
                out[k] = v
        return out

    def stop(self) -> None:
        """Cancel every job, stop every daemon and whatever runs in the namespaces, delete them."""
        if self.ctld is not None and self.ctld.poll() is None and self.slurmds:
            try:
                self.run("scancel", "--full", "--signal=KILL", "--user=root", timeout_s=10)
            except (OSError, subprocess.SubprocessError):
                pass
        for proc in [*self.slurmds.values(), self.ctld, self.munged]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        if self.testbed is not None and self.slurmds:
            self._kill_namespace_processes()
        if self.testbed is not None and self._own_testbed:
            self.testbed.down()
            self.testbed = None
        self.ctld = self.munged = None
        self.slurmds = {}

    def _kill_namespace_processes(self) -> None:
        """slurmstepd and job processes outlive slurmd: kill them by pid.

        In a test bed made here, everything still running in its namespaces; in one the
        caller lent, only slurmstepd processes and their descendants (the caller's own
        processes in those hosts are left alone)."""
        assert self.testbed is not None
        pids: set[int] = set()
        for ns in [self.testbed.host_ns(h) for h in [self.controller_host, *self.node_hosts]]:
            r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10, check=False)
            pids |= {int(p) for p in r.stdout.split() if p.isdigit()}
        if not self._own_testbed:
            pids = _with_descendants({p for p in pids if _comm(p) == "slurmstepd"})
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _with_descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (parent links read from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, []))
    return out
