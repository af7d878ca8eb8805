"""The seam drill's test bed: a small cluster in namespaces with every real seam wired up.

Why this exists: issue 16's acceptance drill (benchmarks/seam_drill.py) runs the whole
loop on real components — one `seamguard agent` per host, a real Prometheus scraping the
agents, the twin exporter (the facilities series: there is no real CDU here) and the
training job's `--metrics-port`, `seamguard run` acting through the log and runtime
actuators, and a `seamguard launch` job across two hosts with a spare on each. This module
holds the pieces: the files (topology, agent configs, Prometheus and run configs, all pure
text from a `Layout`), processes started inside a host's namespace, the slow checkpoint
device, and the twin driver (`python -m seamguard.testbed.drill twin ...`).

Hosts (`seamguard.testbed.net.Testbed`, 3 hosts, 2 rails):

    h0, h1   job nodes: one rank and one hot spare each; h0 in rack r0 on loop cdu-a,
             h1 in rack r1 on loop cdu-b
    h2       control node (rack r1): Prometheus, etcd, the twin exporter, `seamguard run`;
             a spare node in the topology (it holds no job)

Every host checkpoints to one path, ``ckpt``: an ext4 image on a loop device mounted in
the work directory (`SlowDisk`), so a writer that floods that device makes every fsync on
the path really slow without touching the machine's other file systems.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from seamguard.testbed.net import SRC, Testbed

AGENT_PORT = 9475
ECHO_PORT = 9476
JOB_METRICS_PORT = 9477
TWIN_PORT = 9400
PROM_PORT = 9090
ETCD_PORT = 2379


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


def prometheus_yaml(agents: list[str], job_metrics: str, twin: str, scrape_s: float) -> str:
    """Agents and the job as they are; from the twin only the facilities series (the agents
    are the GPU, NIC, link and storage exporters here)."""
    doc = {
        "global": {"scrape_interval": f"{scrape_s}s", "scrape_timeout": f"{scrape_s}s"},
        "scrape_configs": [
            {"job_name": "seamguard-agent", "static_configs": [{"targets": agents}]},
            {"job_name": "seamguard-job", "static_configs": [{"targets": [job_metrics]}]},
            {"job_name": "seamguard-twin", "honor_labels": True, "static_configs": [{"targets": [twin]}],
             "metric_relabel_configs": [{"source_labels": ["__name__"], "action": "keep",
                                         "regex": "seamguard_coolant_.*|seamguard_rack_inlet_temp_c"}]},
        ],
    }
    return json.dumps(doc, indent=1) + "\n"


def run_yaml(lay: Layout, topology: Path, prom_url: str, mode: str, work: Path, hint_dir: Path,
             tick_s: float) -> str:
    """`seamguard run`: enforce or dry_run, the log actuator and the runtime actuator. GPU
    series that only NVML or dcgm-exporter give are switched off (no driver here): the
    controller reads the agents' XID gauge and the runtime's compute seconds for GPUs."""
    off = {"enabled": False}
    doc = {
        "version": 1, "topology": str(topology), "mode": mode, "tick_s": tick_s,
        "ledger": str(work / "seamguard.db"), "events_out": str(work / "events.jsonl"),
        "prometheus": {"url": prom_url, "timeout_s": 2, "deadline_s": max(0.5, tick_s * 0.8),
                       "mapping": {"signals": {
                           "seamguard_storage_write_latency_ms":
                               {"query": "max by (storage) (seamguard_storage_write_latency_ms)"},
                           **{s: off for s in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK",
                                               "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL",
                                               "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                                               "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                                               "DCGM_FI_DEV_THERMAL_VIOLATION")}}}},
        "actuators": [{"type": "log", "path": str(work / "actions.jsonl")},
                      {"type": "runtime", "hint_dirs": {lay.job: str(hint_dir)}}],
    }
    return json.dumps(doc, indent=1) + "\n"


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


def ns_pids(tb: Testbed, host: int) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", tb.host_ns(host)], capture_output=True, text=True,
                         check=False).stdout
    return [int(p) for p in out.split()]


def kill_workers(tb: Testbed, host: int) -> list[int]:
    """What a GPU falling off the bus does to the job: the rank processes on that host die
    (SIGKILL to every `seamguard: worker` process there; the launcher and fork server live)."""
    killed = []
    for pid in ns_pids(tb, host):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("seamguard: worker"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
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
    """An ext4 image on a loop device, mounted at ``mount``; `flood()` starts writers that
    keep the loop device's queue full of synchronous writes, so every fsync on the mount
    waits behind them — real slowness on this path only (no device-mapper delay target or
    io cgroup controller exists on this machine; see docs/seam-drill.md)."""

    image: Path
    mount: Path
    size_mb: int = 256
    writers: int = 2
    chunk_mb: int = 8
    _dev: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def up(self) -> SlowDisk:
        self.mount.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as fh:
            fh.truncate(self.size_mb << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-J", "size=4", str(self.image)], check=True, capture_output=True)
        self._dev = subprocess.run(["losetup", "-f", "--show", str(self.image)], check=True, capture_output=True,
                                   text=True).stdout.strip()
        subprocess.run(["mount", "-o", "data=journal", self._dev, str(self.mount)], check=True, capture_output=True)
        return self

    def flood(self) -> None:
        self._stop.clear()
        for i in range(self.writers):
            t = threading.Thread(target=self._write_loop, args=(self.mount / f".flood{i}",), daemon=True)
            t.start()
            self._threads.append(t)

    def _write_loop(self, path: Path) -> None:
        block = os.urandom(1 << 20)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while not self._stop.is_set():
                os.lseek(fd, 0, os.SEEK_SET)
                for _ in range(self.chunk_mb):
                    os.write(fd, block)
                os.fsync(fd)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)

    def calm(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        self._threads.clear()

    def down(self) -> None:
        self.calm()
        if self._dev:
            if subprocess.run(["umount", str(self.mount)], check=False, capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(self.mount)], check=False, capture_output=True)
            subprocess.run(["losetup", "-d", self._dev], check=False, capture_output=True)
            self._dev = ""
        self.image.unlink(missing_ok=True)


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


# ---- the twin driver (facilities series) ---------------------------------------------------------------------
def twin_main(argv: list[str]) -> None:
    """Serve the twin for the drill's topology with one cooling-loop flow loss starting at a
    wall-clock time (the drill's schedule), until SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m seamguard.testbed.drill twin")
    ap.add_argument("--topology", type=Path, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=TWIN_PORT)
    ap.add_argument("--loop", required=True)
    ap.add_argument("--start-epoch", type=float, required=True, help="wall time (s since epoch) the flow loss starts")
    ap.add_argument("--duration-s", type=float, required=True)
    ap.add_argument("--flow-fraction", type=float, default=0.5)
    ap.add_argument("--ramp-s", type=float, default=4.0)
    ap.add_argument("--tick-s", type=float, default=1.0)
    a = ap.parse_args(argv)

    from seamguard.app.config import load_topology
    from seamguard.app.twin_exporter import ServeOptions, TwinExporter
    from seamguard.fleet.model import Kind
    from seamguard.twin.faults import FaultKind, FaultSpec
    from seamguard.twin.telemetry import TwinConfig

    fleet = load_topology(a.topology)
    loop = fleet.index_of(Kind.COOLING_LOOP, a.loop)
    if loop < 0:
        raise SystemExit(f"error: --loop {a.loop!r}: not a cooling loop of {a.topology}")
    start_s = max(0.0, a.start_epoch - time.time())  # simulated t=0 is now (speed 1)
    fault = FaultSpec(FaultKind.COOLING_FLOW_LOSS, loop, start_s, a.duration_s, a.flow_fraction, a.ramp_s)
    exp = TwinExporter(fleet, [fault], TwinConfig(tick_s=a.tick_s), 0, ServeOptions(host=a.host, port=a.port))
    signal.signal(signal.SIGTERM, lambda *_: exp.stop())
    exp.run()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "twin":
        twin_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m seamguard.testbed.drill twin --topology F --loop L --start-epoch E "
                         "--duration-s D")
