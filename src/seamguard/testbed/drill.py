"""The seam drill's test bed: a small cluster in namespaces with every real seam wired up.

Why this exists: issue 16's acceptance drill (benchmarks/seam_drill.py) runs the whole
loop on real components — one `seamguard agent` per host, a real Prometheus scraping the
agents, the twin exporter (the facilities series: there is no real CDU here) and the
training job's `--metrics-port`, `seamguard run` acting through the log and runtime
actuators (and, with the job under Slurm, the Slurm actuator and the Slurm placement), and
a `seamguard launch` job across two hosts with a spare on each, submitted with `sbatch` to
a Slurm cluster of the three hosts (`seamguard.testbed.slurm`). This module holds the
pieces: the files (topology, agent configs, Prometheus and run configs, the job's batch
script, all pure text from a `Layout`), processes started inside a host's namespace, the
slow checkpoint device. The twin exporter with the drill's cooling-loop fault is the shell's
(`python -m seamguard.app.fault_twin cooling ...`): the test bed never imports the shell.

Hosts (`seamguard.testbed.net.Testbed`, 3 hosts, 2 rails), each a Slurm node:

    h0, h1   job nodes: one rank and one hot spare each; h0 in rack r0 on loop cdu-a,
             h1 in rack r1 on loop cdu-b
    h2       control node (rack r1): slurmctld, Prometheus, etcd, the twin exporter,
             `seamguard run`; a spare node in the topology, where Slurm restarts the job
             when it is moved off cdu-a

Every host checkpoints to one path, ``ckpt``: an ext4 image on a loop device mounted in
the work directory (`SlowDisk`), which the drill makes really slow by keeping it frozen
but for a few milliseconds every 500 ms, without touching the machine's other file systems.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from seamguard.decide.actions import ActionKey
from seamguard.testbed.net import SRC, Testbed

AGENT_PORT = 9475
ECHO_PORT = 9476
JOB_METRICS_PORT = 9477
TWIN_PORT = 9400
PROM_PORT = 9090
ETCD_PORT = 2379
JOB_MASTER_PORT = 29511  # node rank 0's TCPStore when the job runs under Slurm
CLONE_NEWNS = 0x00020000  # <sched.h>


@dataclass(frozen=True)
class Layout:
    """Who is where in the drill's cluster; every file below is derived from it."""

    job: str = "drill"
    job_hosts: tuple[int, ...] = (0, 1)
    control_host: int = 2
    rails: int = 2
    storage: str = "ckpt"
    loop_of_host: tuple[str, ...] = ("cdu-a", "cdu-b", "cdu-b")
    rack_of_host: tuple[str, ...] = ("r0", "r1", "r1")
    criticality: float = 2.0

    @property
    def hosts(self) -> int:
        return len(self.loop_of_host)

    @staticmethod
    def node(host: int) -> str:
        return f"h{host}"

    @staticmethod
    def nic(host: int, rail: int) -> str:
        return f"h{host}/mlx5_{rail}"

    @staticmethod
    def leaf(rail: int) -> str:
        return f"leaf-r{rail}"

    def link(self, host: int, rail: int) -> str:
        return f"{self.nic(host, rail)}~{self.leaf(rail)}"

    @staticmethod
    def gpu(host: int) -> str:
        return f"h{host}/gpu0"


TWIN_SERIES = ("seamguard_coolant_.*|seamguard_rack_inlet_temp_c|DCGM_FI_DEV_(GPU_TEMP|SM_CLOCK|POWER_USAGE|"
               "GPU_UTIL|ECC_SBE_VOL_TOTAL|CORRECTABLE_REMAPPED_ROWS|THERMAL_VIOLATION)")


# ---- files (pure) ------------------------------------------------------------------------------------
def topology_yaml(lay: Layout) -> str:
    loops = sorted(set(lay.loop_of_host))
    racks = sorted(set(zip(lay.rack_of_host, lay.loop_of_host)))
    lines = ["version: 1", "name: seam-drill", "cooling_loops:"]
    lines += [f"  - {{name: {lp}, rated_flow_lpm: 480}}" for lp in loops]
    lines += ["racks:"] + [f"  - {{name: {r}, cooling_loop: {lp}}}" for r, lp in racks]
    lines += ["switches:"] + [f"  - {{name: {lay.leaf(r)}, tier: leaf}}" for r in range(lay.rails)]
    lines += ["  - {name: spine-0, tier: spine}", "uplinks:"]
    lines += [f"  - {{leaf: {lay.leaf(r)}, spine: spine-0}}" for r in range(lay.rails)]
    lines += [f"storage_paths: [{lay.storage}]", "nodes:"]
    for h in range(lay.hosts):
        spare = "true" if h not in lay.job_hosts else "false"
        lines += [f"  - name: {lay.node(h)}", f"    rack: {lay.rack_of_host[h]}", f"    storage: {lay.storage}",
                  "    gpus: 1", f"    spare: {spare}", "    nics:"]
        lines += [f"      - {{rail: {r}, leaf: {lay.leaf(r)}}}" for r in range(lay.rails)]
    nodes = ", ".join(lay.node(h) for h in lay.job_hosts)
    lines += ["jobs:", f"  - name: {lay.job}", "    class: high_sync_training",
              f"    criticality: {lay.criticality}", f"    nodes: [{nodes}]"]
    return "\n".join(lines) + "\n"


def agent_yaml(tb: Testbed, lay: Layout, host: int, kmsg: Path, ckpt: Path, quick_probes: bool = True) -> str:
    """One host's agent: kernel log from ``kmsg`` (a file the drill appends XID lines to),
    the storage probe on ``ckpt``, the fabric probe to every other host over each rail."""
    interval = 0.5 if quick_probes else 5
    rails = [{"nic": lay.nic(host, r), "address": tb.addr(host, r), "rail": r, "link": lay.link(host, r)}
             for r in range(lay.rails)]
    peers = [{"nic": lay.nic(p, r), "address": tb.addr(p, r), "rail": r, "port": ECHO_PORT}
             for r in range(lay.rails) for p in range(lay.hosts) if p != host]
    doc = {
        "version": 1, "node": lay.node(host),
        "listen": {"host": tb.addr(host, None), "port": AGENT_PORT},
        "gpus": {"enabled": False},
        "kernel_log": {"source": "kmsg", "path": str(kmsg), "gpus": {"0000:18:00.0": 0}},
        "nics": {"devices": {f"mlx5_{r}": tb.rail_if(r) for r in range(lay.rails)}},
        "storage": {"paths": [{"name": lay.storage, "path": str(ckpt)}], "interval_s": interval,
                    "timeout_s": 5, "window": 4},
        # 16 kB echoes: a tbf-starved link queues them behind each other (docs/agent.md)
        "fabric": {"port": ECHO_PORT, "listen": "0.0.0.0", "interval_s": interval, "timeout_s": 1,
                   "payload_bytes": 16384, "rails": rails, "peers": peers},
    }
    return json.dumps(doc, indent=1) + "\n"  # JSON is YAML


def prometheus_yaml(agents: list[str], job_metrics: str | list[str], twin: str, scrape_s: float) -> str:
    """Agents and the job as they are (the job's node rank 0 serves its metrics: under Slurm
    every host is a target, since the job may restart anywhere); from the twin the facilities series (there is no real
    CDU) and the GPU series only NVML/dcgm-exporter would give (there are no GPUs here; the
    controller's failsafe counts a node without GPU temperatures as dark). The GPUs' XID
    gauge, NICs, links and storage come from the agents only."""
    doc = {
        "global": {"scrape_interval": f"{round(scrape_s * 1000)}ms", "scrape_timeout": f"{round(scrape_s * 1000)}ms"},
        "scrape_configs": [
            {"job_name": "seamguard-agent", "static_configs": [{"targets": agents}]},
            {"job_name": "seamguard-job", "static_configs": [{"targets": [job_metrics] if isinstance(
                job_metrics, str) else list(job_metrics)}]},
            {"job_name": "seamguard-twin", "honor_labels": True, "static_configs": [{"targets": [twin]}],
             "metric_relabel_configs": [{"source_labels": ["__name__"], "action": "keep",
                                         "regex": TWIN_SERIES}]},
        ],
    }
    return json.dumps(doc, indent=1) + "\n"


def link_latency_query(lay: Layout) -> str:
    """A NIC-to-leaf link's latency as the fastest path through its NIC: each probed pair's
    mean RTT over the last 4 s, and per NIC the minimum over every pair it is the source or
    the destination of. A gray link slows every path through it; a slow peer or a busy
    host slows only some. (The agent's own `seamguard_fabric_link_latency_us` is the fastest
    pair over one round of the source's peers: the same idea from one end only, over one
    round; this query also reads each pair from its destination's side, over 4 s.)"""
    pair = ("(sum by (src_nic, dst_nic) (rate(seamguard_fabric_probe_rtt_seconds_sum[4s]))"
            " / sum by (src_nic, dst_nic) (rate(seamguard_fabric_probe_rtt_seconds_count[4s])))")
    by_nic = (f'label_replace({pair}, "nic", "$1", "src_nic", "(.*)")'
              f' or label_replace({pair}, "nic", "$1", "dst_nic", "(.*)")')
    leaf = lay.leaf(0)[:-1]  # leaves are named <prefix><rail>
    return (f'1e6 * min by (link) (label_replace({by_nic}, "link", "$1~{leaf}$2", "nic", "(.*_([0-9]+))"))')


def policy_yaml() -> str:
    """The shipped policy with two changes for this bed. The breaker's bounds are opened for a
    three-node fleet: one node is a third of it, and the default bounds (20 % of the fleet,
    30 % of a loop in effect) would trip on the first drain and hold every later action.
    Links and storage must stay slow a few seconds before they change state: the drill ticks
    every second, not every 15 s, and the shipped counts (2 ticks for a link, 4 for a path)
    would then react to 2-4 s of a loaded 2-core machine's scheduling noise. And the
    checkpoint path's own-floor ratio starts at 10x (shipped: 2x, saturating at 4x): the
    loop device's floor is ~2 ms, and 4x that (8 ms) is what a job's recovery or a
    neighbour's I/O costs it for seconds at a time; the stalled path is ~250x."""
    return json.dumps({"assess": {"evidence": {"storage_latency_ratio": [10.0, 40.0]},
                                  "hysteresis": {
                           "link": {"enter_ticks": 4, "quarantine_ticks": 5},
                           "storage": {"severe_state": "checkpoint_unsafe", "enter_ticks": 6}}},
                       "breaker": {"max_fleet_fraction": 0.7, "max_loop_fraction": 1.0,
                                   "max_in_effect_fleet_fraction": 0.7, "max_in_effect_loop_fraction": 1.0,
                                   "max_in_effect_rack_fraction": 1.0, "max_in_effect_leaf_fraction": 1.0,
                                   "max_domain_fraction": 1.0, "max_link_fraction": 1.0,
                                   "max_storage_fraction": 1.0}}, indent=1) + "\n"


@dataclass(frozen=True)
class SlurmBins:
    """The Slurm client commands the controller calls (the test bed's wrappers)."""

    scontrol: str
    sinfo: str
    squeue: str
    scancel: str


def run_yaml(lay: Layout, topology: Path, prom_url: str, mode: str, work: Path, hint_dir: Path,
             tick_s: float, policy: Path, slurm: SlurmBins | None = None) -> str:
    """`seamguard run`: enforce or dry_run, the log actuator and the runtime actuator; with
    ``slurm``, the runtime actuator and the Slurm actuator (drain, features, no-new-work reservations, job moves:
    `checkpoint_grace_s` 3 s after the runtime's checkpoint_now, then requeue with the domain
    excluded) and the job's placement and criticality read from squeue every second. Probe
    gauges are read over the last 4 s (8 probe rounds): one round's RTT or fsync on a loaded
    2-core machine is scheduling noise; a gray link or a slow path holds. The storage latency
    is the slowest host's median; a link's latency comes from `link_latency_query`."""
    doc = {
        "version": 1, "topology": str(topology), "policy": str(policy), "mode": mode, "tick_s": tick_s,
        "ledger": str(work / "seamguard.db"), "events_out": str(work / "events.jsonl"),
        "prometheus": {"url": prom_url, "timeout_s": 2, "deadline_s": max(0.5, tick_s * 0.8),
                       "mapping": {"signals": {
                           "seamguard_storage_write_latency_ms":
                               {"query": "max by (storage) (quantile_over_time(0.5, "
                                         "seamguard_storage_write_latency_ms[4s]))"},
                           "seamguard_fabric_link_latency_us": {"query": link_latency_query(lay)}}}},
        "actuators": [{"type": "log", "path": str(work / "actions.jsonl")},
                      {"type": "runtime", "hint_dirs": {lay.job: str(hint_dir)}}],
    }
    if slurm is not None:
        # No log actuator beside Slurm's: the reconciler takes a key any actuator holds as in
        # effect, and the log actuator holds every key it wrote, so a job move (two phases, one
        # per tick: checkpoint asked, then requeued) would never get its second tick.
        doc["actuators"] = [a for a in doc["actuators"] if a["type"] != "log"]
        doc["actuators"].append({"type": "slurm", "scontrol": slurm.scontrol, "sinfo": slurm.sinfo,
                                 "squeue": slurm.squeue, "scancel": slurm.scancel, "timeout_s": 10,
                                 "checkpoint_grace_s": 3.0})
        doc["slurm_placement"] = {"squeue": slurm.squeue, "scontrol": slurm.scontrol, "refresh_s": 1.0,
                                  "timeout_s": 5}
    return json.dumps(doc, indent=1) + "\n"


def job_scripts(tb: Testbed, lay: Layout, python: str, launch_args: list[str], script: list[str],
                pythonpath: str, node_script: Path) -> tuple[str, str]:
    """(batch script, per-node script) for running the drill's job under Slurm: ``sbatch`` runs
    the batch script on the first node, which starts one `seamguard launch` per node with
    ``srun --ntasks-per-node=1``. Each node finds its own rail-0 address and node rank 0's
    (the first node of the allocation, `scontrol show hostnames`) from the node name; the
    job-wide store is node rank 0's TCPStore, fresh for every start of the job, so a job
    Slurm requeues starts a new run (from its last persisted checkpoint) under the same
    name. ``launch_args``: the `seamguard launch` options besides the node's own;
    ``node_script``: where the per-node script is written (Slurm runs a copy of the batch
    script from its spool directory, so the batch script names it by its full path).

    The launcher runs as the per-node shell's child, not in its place: with `exec`, a
    requeue left the job COMPLETING for minutes (Slurm 22.05, proctrack/linuxproc, the test
    bed's setting): slurmstepd logged the step cancelled, but the launcher — whose process
    name seamguard sets — never got the SIGTERM (nothing pending, still in its main loop)
    nor a SIGKILL after KillWait. The shell gets the signal and passes SIGTERM on, and the
    launcher stops its workers and exits."""
    cases = "\n".join(f"    {lay.node(h)}) echo {tb.addr(h, 0)} ;;" for h in range(lay.hosts))
    node = "\n".join([
        "#!/bin/sh",
        "# one `seamguard launch` per Slurm node of the drill's job (started by srun)",
        "addr() {",
        '  case "$1" in',
        cases,
        '    *) echo "drill job: no rail-0 address for node $1" >&2; return 2 ;;',
        "  esac",
        "}",
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'master=$(addr "$first") || exit 2',
        'me=$(addr "$SLURMD_NODENAME") || exit 2',
        ('export SEAMGUARD_ADVERTISE_HOST="$me" SEAMGUARD_NODE_NAME="$SLURMD_NODENAME" '
         f'GLOO_SOCKET_IFNAME={tb.rail_if(0)} OMP_NUM_THREADS=1 PYTHONPATH={pythonpath}'),
        # not exec: Slurm's signals (SIGTERM on requeue or cancel) reach this shell, which passes
        # them on; sent straight to the launcher they were lost (see job_scripts' docstring)
        "signalled=0",
        "trap 'signalled=1; kill -TERM \"$launcher\" 2>/dev/null' TERM INT",
        (f'{python} -m seamguard launch --nnodes "$SLURM_JOB_NUM_NODES" --node-rank "$SLURM_NODEID" '
         f'--master-addr "$master" --master-port {JOB_MASTER_PORT} --store tcp {" ".join(launch_args)} '
         f'-- {" ".join(script)} &'),
        "launcher=$!",
        # a trapped signal ends `wait` early (128 + signal); the next `wait` gives the launcher's own status
        'wait "$launcher"; rc=$?',
        '[ "$signalled" = 1 ] && { wait "$launcher"; rc=$?; }',
        'exit "$rc"',
        "",
    ])
    batch = "\n".join([
        "#!/bin/sh",
        "# the drill's job: one task per node, each a `seamguard launch` with its spare",
        'echo "drill job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST"',
        f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 {node_script}",
        "",
    ])
    return batch, node


# ---- figures (pure) ------------------------------------------------------------------------------------
FAULTS = ("gray_link", "slow_storage", "cooling", "node_failure")


def covered(lay: Layout) -> dict[str, set[str]]:
    """The entities each fault puts at risk: an action on one of them covers the fault. A
    slow checkpoint path is covered only by an action on the path: asking the job for a
    checkpoint (or a shorter interval) while its path stalls is no remedy."""
    job, h0, h1 = lay.job, lay.node(0), lay.node(1)
    return {
        "gray_link": {lay.link(0, 0), lay.nic(0, 0), lay.leaf(0), f"{lay.leaf(0)}~spine-0", h0, lay.gpu(0), job},
        "slow_storage": {lay.storage},
        "cooling": {lay.loop_of_host[0], lay.rack_of_host[0], h0, lay.gpu(0), job},
        "node_failure": {h1, lay.gpu(1), lay.nic(1, 0), lay.nic(1, 1), job},
    }


def decisions(events: list[dict]) -> list[dict]:
    """The controller's `apply` decisions, in time order (both modes record them)."""
    out = [e for e in events if isinstance(e.get("action"), dict) and e["action"].get("op") == "apply"]
    return sorted(out, key=lambda e: e["t"])


def key_of(e: dict) -> str:
    return str(e["action"].get("key"))


def entity_of(e: dict) -> str:
    try:
        return ActionKey.parse(key_of(e)).entity
    except ValueError:
        return str(e.get("entity"))


def fault_figures(starts: dict[str, float], ends: dict[str, float], cover: dict[str, set[str]], events: list[dict],
                  job_events: list[dict], delivered: list[dict],
                  steps: list[tuple[float, float]] | None = None) -> dict[str, dict]:
    """Per fault: the first decision covering it and when, every decision and delivery in its
    window, and the steps the job lost there: the larger of the runtime's own `steps_redone`
    and the drops of its step counter (``steps``: (time, step) samples), since a restart from
    storage is not a `resumed` event with steps redone."""
    dec = decisions(events)
    out = {}
    order = sorted(starts, key=starts.get)
    for i, f in enumerate(order):
        t0 = starts[f]
        window_end = starts[order[i + 1]] if i + 1 < len(order) else ends[f]
        mine = [e for e in dec if e["t"] >= t0 and entity_of(e) in cover[f]]
        first = next((e for e in mine if e["t"] < window_end), None)
        lost = sum(int(e.get("steps_redone") or 0) for e in job_events
                   if e.get("event") == "resumed" and t0 <= e.get("t", 0) < window_end)
        lost = max(lost, steps_rolled_back(steps or [], t0, window_end))
        keys = sorted({key_of(e) for e in mine if e["t"] < window_end})
        out[f] = {
            "time_to_action_s": round(first["t"] - t0, 2) if first else None,
            "action": key_of(first) if first else None,
            "actions": keys,
            "delivered": sorted({r["key"] for r in delivered if r.get("key") in keys}),
            "job_steps_lost": lost,
            "recoveries": sum(1 for e in job_events if e.get("event") == "resumed" and e.get("gen")
                              and t0 <= e.get("t", 0) < window_end),
        }
    return out


def phase_rates(steps: list[tuple[float, float]], t0: float, starts: dict[str, float], fault_s: float,
                end: float) -> dict[str, float | None]:
    """Training steps per second in each phase of the drill, from (time, step) samples: the calm
    start, each fault while it is on, and each fault's calm after it (`<fault>_after`)."""
    order = sorted(starts, key=starts.get)
    spans = [("calm", t0, starts[order[0]])]
    for i, f in enumerate(order):
        nxt = starts[order[i + 1]] if i + 1 < len(order) else end
        spans += [(f, starts[f], starts[f] + fault_s), (f"{f}_after", starts[f] + fault_s, nxt)]
    out: dict[str, float | None] = {}
    live = resumed_steps(steps)
    for name, a, b in spans:
        inside = [v for t, v in live if a <= t <= b]
        out[name] = round((inside[-1] - inside[0]) / (b - a), 2) if len(inside) > 1 and b > a else None
    return out


def steps_rolled_back(steps: list[tuple[float, float]], a: float, b: float) -> int:
    """Steps the job went back in [a, b): the sum of every drop of its step counter from one
    sample to the next (a job Slurm requeued restarts from its last persisted checkpoint,
    which the runtime's own `steps_redone` does not count: the new run starts afresh),
    counted where the higher sample falls: the steps are lost when the run is killed, not when
    its successor resumes, which after a requeue can be tens of seconds, and a fault, later."""
    return int(sum(max(0.0, p - q) for (t, p), (_, q) in pairwise(resumed_steps(steps)) if a <= t < b))


def resumed_steps(steps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(time, step) samples in time order without the zeros a restarted job reports before it
    has resumed from storage (a requeued run's counter reads 0 for a few seconds, then its
    checkpoint's step): they are neither steps lost nor steps made."""
    out, seen = [], False
    for t, v in sorted(steps):
        if v > 0 or not seen:
            out.append((t, v))
        seen = seen or v > 0
    return out


def healthy_actions(starts: dict[str, float], cover: dict[str, set[str]], events: list[dict]) -> list[str]:
    """Decisions on entities that no fault started before them covers."""
    bad = []
    for e in decisions(events):
        at_risk = set().union(*(cover[f] for f, t0 in starts.items() if t0 <= e["t"]))
        if entity_of(e) not in at_risk:
            bad.append(key_of(e))
    return bad


# ---- processes inside a host ---------------------------------------------------------------------------
@dataclass
class NsProcs:
    """Processes the drill started in the testbed's hosts; each in its own session so that
    stopping one stops whatever it forked."""

    tb: Testbed
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, host: int, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        extra = [f"{k}={v}" for k, v in {"PYTHONPATH": SRC, **(env or {})}.items()]
        with open(log, "wb") as fh:
            self.procs[name] = subprocess.Popen([*self.tb.exec_prefix(host), "env", *extra, *argv], stdout=fh,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def stop(self, name: str, grace_s: float = 10.0) -> int | None:
        p = self.procs.pop(name, None)
        if p is None:
            return None
        if p.poll() is None:
            _signal_group(p.pid, signal.SIGTERM)
            try:
                p.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(p.pid, signal.SIGKILL)
                p.wait(10)
        return p.returncode

    def stop_all(self, grace_s: float = 10.0) -> None:
        for name in list(self.procs)[::-1]:
            self.stop(name, grace_s)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def gray_link(tb: Testbed, host: int, rail: int, rate_mbit: float | None) -> None:
    """A gray (slow, not dead) link: tbf on both ends of (host, rail) with a bucket of 64 kB,
    larger than the test bed's 9000-byte frames, so every packet still passes at ``rate_mbit``
    (`Testbed.set_gray`'s 4 kB bucket starves jumbo frames: a dead link, not a gray one).
    None restores the link."""
    from seamguard.testbed.net import _tc

    for ns, dev in ((tb.host_ns(host), tb.rail_if(rail)), (tb.fabric_ns, tb.port(host, rail))):
        _tc(ns, "qdisc", "del", "dev", dev, "root", check=False)
        if rate_mbit is not None:
            _tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "64kb",
                "latency", "400ms")


def ns_pids(tb: Testbed, host: int) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", tb.host_ns(host)], capture_output=True, text=True,
                         check=False).stdout
    return [int(p) for p in out.split()]


def kill_workers(tb: Testbed, host: int, record: Path | None = None) -> list[int]:
    """What a GPU falling off the bus does to the job: the processes on that host that hold
    the GPU die (SIGKILL to every `seamguard: worker` and `seamguard: spare` there; the
    launcher, the fork server and the checkpoint writers live).
    ``record`` gets every process of the host and whether it was killed."""
    killed, seen = [], []
    for pid in ns_pids(tb, host):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        seen.append(f"{pid} {cmd[:120]}")
        if cmd.startswith(("seamguard: worker", "seamguard: spare")):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    if record is not None:
        record.write_text("\n".join(f"{line} {'KILLED' if int(line.split()[0]) in killed else ''}"
                                     for line in seen) + "\n")
    return killed


def kill_namespace(tb: Testbed, host: int) -> None:
    """Last-resort cleanup: SIGKILL whatever still runs in one of the drill's hosts."""
    for pid in ns_pids(tb, host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def ns_get(tb: Testbed, host: int, url: str, timeout_s: float = 3.0) -> str | None:
    """GET ``url`` from inside a host (the testbed's addresses are not routed to the caller)."""
    code = ("import sys, urllib.request\n"
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())")
    try:
        p = subprocess.run([*tb.exec_prefix(host), sys.executable, "-c", code, url, str(timeout_s)],
                           capture_output=True, text=True, timeout=timeout_s + 10, check=False)
    except subprocess.TimeoutExpired:
        return None
    return p.stdout if p.returncode == 0 else None


def wait_http(tb: Testbed, host: int, url: str, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ns_get(tb, host, url) is not None:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what} did not answer {url} within {timeout_s:.0f} s")


def prom_query(tb: Testbed, host: int, prom: str, expr: str, at: float | None = None) -> list[dict]:
    from urllib.parse import urlencode

    q = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    text = ns_get(tb, host, f"{prom}/api/v1/query?{urlencode(q)}")
    if text is None:
        return []
    try:
        return json.loads(text)["data"]["result"]
    except (ValueError, KeyError):
        return []


# ---- the slow checkpoint device ---------------------------------------------------------------------------
@dataclass
class SlowDisk:
    """An ext4 image on a loop device, mounted at ``mount``. `slow()` makes the path slow the
    way a stalling storage server is: the file system is frozen (`fsfreeze`, the FIFREEZE
    ioctl) for ``frozen_ms``, thawed for ``thawed_ms`` plus the few ms the next `fsfreeze`
    takes to start, so every write and fsync on it — the agents' probes and the job's
    checkpoints alike — waits in the kernel for the next thaw, and a file created in one thaw
    is written in a later one (the agent's probe times the write and fsync, not the create). Only this path is affected (no device-mapper delay target, no io cgroup
    controller and no libfuse on this machine; see docs/seam-drill.md)."""

    image: Path
    mount: Path
    size_mb: int = 256
    frozen_ms: float = 500.0
    thawed_ms: float = 0.0  # thawed only while the next fsfreeze starts (a few ms)
    freezes: int = 0
    errors: list[str] = field(default_factory=list)
    _dev: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def up(self) -> SlowDisk:
        self.mount.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as fh:
            fh.truncate(self.size_mb << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True, capture_output=True)
        self._dev = subprocess.run(["losetup", "-f", "--show", str(self.image)], check=True, capture_output=True,
                                   text=True).stdout.strip()
        subprocess.run(["mount", self._dev, str(self.mount)], check=True, capture_output=True)
        return self

    def slow(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._cycle, name="fsfreeze", daemon=True)
        self._thread.start()

    def _cycle(self) -> None:
        while not self._stop.is_set():
            p = subprocess.run(["fsfreeze", "-f", str(self.mount)], check=False, capture_output=True, text=True,
                               timeout=10)
            self.freezes += 1
            if p.returncode != 0:
                self.errors.append(p.stderr.strip())
            self._stop.wait(self.frozen_ms / 1000.0)
            self._thaw()
            self._stop.wait(self.thawed_ms / 1000.0)

    def _thaw(self) -> None:
        subprocess.run(["fsfreeze", "-u", str(self.mount)], check=False, capture_output=True, timeout=10)

    def calm(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if self._dev:
            self._thaw()  # whatever the cycle was doing when told to stop

    def down(self) -> None:
        self.calm()
        if self._dev:
            if subprocess.run(["umount", str(self.mount)], check=False, capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(self.mount)], check=False, capture_output=True)
            subprocess.run(["losetup", "-d", self._dev], check=False, capture_output=True)
            self._dev = ""
        self.image.unlink(missing_ok=True)


def private_mounts() -> None:
    """Give this process (and what it starts) a mount namespace of its own, private from `/`
    down, before mounting anything: `ip netns exec` copies the caller's mounts into every
    process it starts, so a mount made in the machine's namespace would stay pinned (and its
    loop device attached) by any namespaced process anyone starts meanwhile. Here the mount,
    the loop device and the testbed's netns files go away with this process."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed (root is needed)")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True, capture_output=True)


def fsync_ms(path: Path, size_bytes: int = 4096) -> float:
    """One probe like the agent's: write + fsync of a small file, in milliseconds."""
    f = path / f".probe{os.getpid()}"
    t0 = time.perf_counter()
    with open(f, "wb") as fh:
        fh.write(b"\0" * size_bytes)
        fh.flush()
        os.fsync(fh.fileno())
    dt = (time.perf_counter() - t0) * 1000.0
    f.unlink(missing_ok=True)
    return dt
