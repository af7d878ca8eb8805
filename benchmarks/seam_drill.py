"""Seam drill (issue 16's acceptance): four real faults, the whole control loop on real parts.

In a namespaced test bed (seamguard.testbed.drill: 3 hosts, 2 rails) every repetition
starts: a `seamguard agent` per host (kernel log from a file the drill appends XID lines to,
a storage probe on the checkpoint path, a fabric probe to the other hosts over each rail),
the twin exporter for the facilities series (there is no real CDU; the flow loss is in the
twin's fault schedule), one real Prometheus scraping agents, twin and the job's
`--metrics-port`, a Slurm cluster of the three hosts (slurmctld on h2, a slurmd in each
host's namespace: seamguard.testbed.slurm) and the training job submitted to it with
`sbatch` (two nodes; `srun` starts one `seamguard launch` per node, one rank and one hot
spare each, node rank 0's TCPStore as the job-wide store) running examples/train_ddp.py with
--hint-dir, --checkpoint-dir on the slow-able path, --metrics-port and --events-file, and
`seamguard run` with the log, runtime and Slurm actuators and the job's placement and
criticality read from squeue. `--launch direct` starts the two launchers without Slurm
(etcd as the store), as the drill did before; the default needs Slurm installed.

Then, one after another with calm time between:

1. gray_link     tc tbf on h0's rail 0 (the rail the job's gradients use)
2. slow_storage  the checkpoint path's file system is frozen but for a few ms every 500 ms (fsfreeze)
3. cooling       the twin's loop cdu-a (h0's) loses half its flow
4. node_failure  an XID 79 line in h1's kernel log, then h1's rank processes are killed

Each repetition runs twice, interleaved: `seamguard run` in enforce mode and in dry_run
(the same decisions recorded, nothing delivered). Figures per fault: time_to_action_s
(fault start -> first decision on an entity the fault covers, from the controller's
events), action, delivered (what the runtime actuator wrote for the job), job_steps_lost
(steps redone by the job's recoveries in that fault's window); overall useful throughput
(net steps per second of the job over the drill) with and without control, and
healthy_actions (decisions on entities no fault started so far covers; must be 0).

    python benchmarks/seam_drill.py --quick     # 1 repetition per mode, shorter faults
    python benchmarks/seam_drill.py --reps 3    # full run
    python benchmarks/seam_drill.py --quick --launch direct   # without Slurm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from seamguard.testbed.drill import (
    AGENT_PORT,
    FAULTS,
    JOB_METRICS_PORT,
    PROM_PORT,
    TWIN_PORT,
    Layout,
    NsProcs,
    SlowDisk,
    SlurmBins,
    agent_yaml,
    covered,
    fault_figures,
    fsync_ms,
    gray_link,
    healthy_actions,
    job_scripts,
    kill_namespace,
    kill_workers,
    ns_get,
    phase_rates,
    policy_yaml,
    private_mounts,
    prom_query,
    prometheus_yaml,
    run_yaml,
    topology_yaml,
    wait_http,
)
from seamguard.testbed.hw_slowdown import PLAN_FILE
from seamguard.testbed.multinode import EtcdServer
from seamguard.testbed.net import Testbed, TestbedSpec
from seamguard.testbed.prom import need
from seamguard.testbed.slurm import SlurmCluster

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")

MODES = ("enforce", "dry_run")
# The controller starts once the agents have probed for this long, as in a fleet, where agents
# run long before a controller starts: a freshly started agent on the host that is also starting
# Prometheus and the twin answered its first probes 4-7x slower for several seconds, which a 1 s
# tick with a 4-tick link hysteresis (15 s and 2 ticks shipped) takes for a gray link
# (docs/seam-drill.md).
AGENT_WARMUP_S = 15.0
GRAY_MBIT = 20.0  # h0's rail 0: a gradient of ~1 MB takes ~0.4 s instead of a few ms
TRACE = ("seamguard_fabric_link_latency_us", "seamguard_storage_write_latency_ms", "seamguard_coolant_flow_lpm",
         "DCGM_FI_DEV_XID_ERRORS", "seamguard_job_step", "seamguard_job_step_seconds",
         "seamguard_job_uncommitted_seconds", "max(seamguard_job_step)")


class AccountedSlurm(SlurmCluster):
    """The test bed's Slurm cluster with the job-completion log on (``sacct -c`` reads it; there is no
    slurmdbd), so `seamguard goodput --slurm` counts the time a requeued job is down as its own."""

    def _write_conf(self) -> None:
        super()._write_conf()
        with open(self.conf, "a") as f:
            f.write(f"JobCompType=jobcomp/filetxt\nJobCompLoc={self.workdir / 'jobcomp.txt'}\n")


def log(msg: str) -> None:
    print(f"[seam_drill {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def stats(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "n": len(xs)}


@dataclass(frozen=True)
class Timing:
    calm_s: float
    fault_s: float
    gap_s: float
    kill_after_s: float  # node failure: XID line first, rank processes killed this much later
    tick_s: float = 1.0
    faults: tuple[str, ...] = FAULTS  # the fault-duration sweep runs the cooling fault alone

    def starts(self, t0: float) -> dict[str, float]:
        return {f: t0 + self.calm_s + i * (self.fault_s + self.gap_s) for i, f in enumerate(self.faults)}

    def end(self, t0: float) -> float:
        return t0 + self.calm_s + len(self.faults) * (self.fault_s + self.gap_s)


def read_jsonl(path: Path) -> list[dict]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


# ---- one repetition ---------------------------------------------------------------------------------------
class Rep:
    """Everything one repetition starts, stopped in reverse order whatever happens."""

    def __init__(self, tb: Testbed, lay: Layout, disk: SlowDisk, work: Path, mode: str, timing: Timing,
                 steps_s: float, launch: str = "slurm", fault_durations: list[dict] | None = None) -> None:
        self.tb, self.lay, self.disk, self.work, self.mode, self.timing = tb, lay, disk, work, mode, timing
        self.launch = launch
        self.fault_durations = fault_durations  # the controller's duration history (None: the priors)
        self.slurm: SlurmCluster | None = None
        self.slurm_job: int | None = None
        self.procs = NsProcs(tb)
        self.etcd: EtcdServer | None = None
        self.ctl = lay.control_host
        self.prom = f"http://127.0.0.1:{PROM_PORT}"
        self.step_sleep_s = steps_s

    # files
    def write_files(self) -> None:
        w, lay, tb = self.work, self.lay, self.tb
        (w / "hints").mkdir(parents=True, exist_ok=True)
        (w / "job").mkdir(exist_ok=True)
        self.ckpt = self.disk.mount / f"job-{w.name}"
        self.ckpt.mkdir(parents=True, exist_ok=True)
        (w / "fleet.yaml").write_text(topology_yaml(lay))
        for h in range(lay.hosts):
            (w / f"kmsg-h{h}").write_text("")
            (w / f"agent-h{h}.yaml").write_text(agent_yaml(tb, lay, h, w / f"kmsg-h{h}", self.disk.mount))
        agents = [f"{tb.addr(h, None)}:{AGENT_PORT}" for h in range(lay.hosts)]
        job_hosts = range(lay.hosts) if self.launch == "slurm" else lay.job_hosts[:1]
        (w / "prometheus.yml").write_text(prometheus_yaml(
            agents, [f"{tb.addr(h, None)}:{JOB_METRICS_PORT}" for h in job_hosts], f"127.0.0.1:{TWIN_PORT}",
            self.timing.tick_s))
        policy = json.loads(policy_yaml())
        if self.fault_durations is not None:
            policy.setdefault("objective", {})["fault_durations"] = self.fault_durations
        (w / "policy.yaml").write_text(json.dumps(policy, indent=1) + "\n")
        bins = None
        if self.launch == "slurm":
            self.slurm = AccountedSlurm(w / "slurm", [lay.node(h) for h in range(lay.hosts)], slurmd=True, testbed=tb,
                                      controller_host=self.ctl, node_hosts=list(range(lay.hosts)),
                                      controller_is_node=True, cred_expire_s=5, kill_wait_s=2)
            bins = SlurmBins(*(self.slurm.bin(c) for c in ("scontrol", "sinfo", "squeue", "scancel")))
        (w / "run.yaml").write_text(run_yaml(lay, w / "fleet.yaml", self.prom, self.mode, w / "ctl", w / "hints",
                                             self.timing.tick_s, w / "policy.yaml", bins))
        (w / "ctl").mkdir(exist_ok=True)

    def launch_args(self) -> list[str]:
        """`seamguard launch` options every node of the job gets, then the training script's argv."""
        w = self.work
        return ["--nproc", "1", "--spares", "1", "--run-id", self.lay.job, "--events-file",
                str(w / "job" / "events.jsonl"), "--checkpoint-dir", str(self.ckpt), "--persist-every", "200",
                "--hint-dir", str(w / "hints"), "--metrics-port", str(JOB_METRICS_PORT),
                "--collective-timeout-s", "10", "--hang-timeout-s", "5"]

    def train_argv(self) -> list[str]:
        w = self.work
        return [str(ROOT / "examples" / "train_ddp.py"), "--out", str(w / "job"), "--steps", "1000000",
                "--hidden", "256", "--layers", "3", "--dataset", "8192", "--step-sleep-s", str(self.step_sleep_s),
                "--gpu-clock-file", str(w / "gpu-clock" / "{node}")]

    def start_job(self) -> None:
        if self.launch == "slurm":
            self.start_slurm_job()
        else:
            self.start_direct_job()

    def start_slurm_job(self) -> None:
        """sbatch the job onto h0 and h1 (``--nodelist``: where the drill's faults are aimed);
        its criticality is in its comment, which the controller's Slurm placement reads."""
        lay, w = self.lay, self.work
        assert self.slurm is not None
        self.slurm.__enter__()
        batch, node = job_scripts(self.tb, lay, sys.executable, self.launch_args(), self.train_argv(),
                                  str(ROOT / "src"), w / "node.sh")
        for name, text in (("job.sbatch", batch), ("node.sh", node)):
            (w / name).write_text(text)
            (w / name).chmod(0o755)
        nodes = ",".join(lay.node(h) for h in lay.job_hosts)
        self.slurm_job = self.slurm.sbatch(w / "job.sbatch", f"--job-name={lay.job}", f"--nodes={len(lay.job_hosts)}",
                                           f"--nodelist={nodes}", f"--comment=criticality={lay.criticality:g}",
                                           "--requeue", f"--output={w / 'slurm-job.out'}", "--open-mode=append")
        log(f"{self.mode}: sbatch job {self.slurm_job} on {nodes}")

    def slurm_job_state(self) -> dict[str, str]:
        return self.slurm.job(self.slurm_job) if self.slurm is not None and self.slurm_job is not None else {}

    def start_direct_job(self) -> None:
        lay, tb, w = self.lay, self.tb, self.work
        self.etcd = EtcdServer.in_host(tb, self.ctl, w / "etcd").start()
        master = tb.addr(lay.job_hosts[0], 0)
        for i, h in enumerate(lay.job_hosts):
            argv = [sys.executable, "-m", "seamguard", "launch", "--nnodes", str(len(lay.job_hosts)), "--node-rank",
                    str(i), "--master-addr", master, "--store", self.etcd.url, *self.launch_args(), "--",
                    *self.train_argv()]
            env = {"SEAMGUARD_ADVERTISE_HOST": tb.addr(h, 0), "GLOO_SOCKET_IFNAME": tb.rail_if(0),
                   "SEAMGUARD_NODE_NAME": lay.node(h), "OMP_NUM_THREADS": "1"}
            self.procs.start(f"launch{h}", h, argv, w / f"launcher-h{h}.log", env)

    def start_observers(self, cooling_at: float) -> None:
        lay, tb, w = self.lay, self.tb, self.work
        for h in range(lay.hosts):
            self.procs.start(f"agent{h}", h, [sys.executable, "-m", "seamguard", "agent", "--config",
                                              str(w / f"agent-h{h}.yaml")], w / f"agent-h{h}.log")
        self.procs.start("twin", self.ctl, [sys.executable, "-m", "seamguard.app.fault_twin", "cooling", "--topology",
                                            str(w / "fleet.yaml"), "--port", str(TWIN_PORT), "--loop",
                                            lay.loop_of_host[0], "--start-epoch", f"{cooling_at:.3f}",
                                            "--duration-s", str(self.timing.fault_s), "--tick-s",
                                            str(self.timing.tick_s), "--slowdown-clock-dir",
                                            str(w / "gpu-clock")], w / "twin.log")
        self.procs.start("prometheus", self.ctl, [need("prometheus", "prometheus"),
                                                  f"--config.file={w / 'prometheus.yml'}",
                                                  f"--storage.tsdb.path={w / 'tsdb'}",
                                                  f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--log.level=warn"],
                         w / "prometheus.log")
        wait_http(tb, self.ctl, f"{self.prom}/-/ready", 60, "prometheus")
        for h in range(lay.hosts):
            wait_http(tb, self.ctl, f"http://{tb.addr(h, None)}:{AGENT_PORT}/metrics", 60, f"agent h{h}")
        wait_http(tb, self.ctl, f"http://127.0.0.1:{TWIN_PORT}/metrics", 60, "twin exporter")

    def start_controller(self) -> None:
        self.procs.start("controller", self.ctl, [sys.executable, "-m", "seamguard", "run", "--config",
                                                  str(self.work / "run.yaml")], self.work / "controller.log")

    def job_step(self, at: float | None = None) -> float | None:
        r = prom_query(self.tb, self.ctl, self.prom, f'max(seamguard_job_step{{job_name="{self.lay.job}"}})', at)
        return float(r[0]["value"][1]) if r else None

    def resumed_step(self, after: float, timeout_s: float) -> float | None:
        """The step a job that was not stepping at ``after`` (requeued, its new run not resumed yet: it
        reports 0 or nothing) resumed from: its first nonzero step after ``after``, waited for up to
        ``timeout_s``. The job is credited with what it kept, not with steps it will redo."""
        from urllib.parse import urlencode

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            q = urlencode({"query": f'max(seamguard_job_step{{job_name="{self.lay.job}"}})', "start": f"{after:.3f}",
                           "end": f"{time.time():.3f}", "step": "0.5"})
            text = ns_get(self.tb, self.ctl, f"{self.prom}/api/v1/query_range?{q}")
            try:
                values = json.loads(text)["data"]["result"][0]["values"] if text else []
            except (ValueError, KeyError, IndexError):
                values = []
            hit = next((float(v) for _, v in values if float(v) > 0), None)
            if hit is not None:
                return hit
            time.sleep(2)
        return None

    def wait_job_training(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in ("launch0", "launch1"):
                if name in self.procs.procs and not self.procs.alive(name):
                    raise RuntimeError(f"{name} exited early; see {self.work}/launcher-*.log")
            state = self.slurm_job_state().get("JobState", "")
            if self.launch == "slurm" and state not in ("PENDING", "CONFIGURING", "RUNNING"):
                raise RuntimeError(f"slurm job {self.slurm_job} is {state or 'gone'}; see {self.work}/slurm-job.out")
            ev = read_jsonl(self.work / "job" / "events.jsonl")
            steps = [e.get("step", -1) for e in ev if e.get("event") == "worker"]
            if any(e.get("event") == "resumed" for e in ev) and (not steps or max(steps) >= 0):
                return
            time.sleep(1)
        raise TimeoutError(f"the job did not start training within {timeout_s:.0f} s; see {self.work}")

    # faults
    def inject(self, fault: str, on: bool) -> None:
        lay, tb = self.lay, self.tb
        if fault == "gray_link":
            gray_link(tb, lay.job_hosts[0], 0, GRAY_MBIT if on else None)
        elif fault == "slow_storage":
            if on:
                self.disk.slow()
            else:
                self.disk.calm()
        elif fault == "cooling":
            pass  # in the twin's fault schedule (start and duration given at its start)
        elif fault == "node_failure" and on:
            h = lay.job_hosts[1]
            with open(self.work / f"kmsg-h{h}", "a") as fh:
                fh.write("NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n")

    def run(self) -> dict:
        t = self.timing
        self.write_files()
        self.start_job()
        self.wait_job_training(240)
        t0 = time.time() + 25 + AGENT_WARMUP_S  # observers, their warm-up, the controller, then the calm period
        starts = t.starts(t0)
        self.start_observers(starts.get("cooling", t.end(t0) + 3600))  # no cooling fault: its flow loss after the end
        _sleep_until(time.time() + AGENT_WARMUP_S)
        self.start_controller()
        log(f"{self.mode}: observers and controller up; drill starts in {t0 - time.time():.0f} s")
        while time.time() < t0:
            time.sleep(0.2)
        step0, probe_before = self.job_step(t0), fsync_ms(self.disk.mount)
        probe_during = None
        ends = {}
        for f in t.faults:
            _sleep_until(starts[f])
            log(f"{self.mode}: {f} on")
            self.inject(f, True)
            if f == "node_failure":
                _sleep_until(starts[f] + t.kill_after_s)
                killed = kill_workers(self.tb, self.lay.job_hosts[1], self.work / "killed.txt")
                log(f"{self.mode}: killed {len(killed)} worker process(es) on h{self.lay.job_hosts[1]}")
            if f == "slow_storage":
                time.sleep(2)
                probe_during = fsync_ms(self.disk.mount)
            _sleep_until(starts[f] + t.fault_s)
            self.inject(f, False)
            ends[f] = starts[f] + t.fault_s + t.gap_s
            log(f"{self.mode}: {f} off")
        t_end = t.end(t0)
        _sleep_until(t_end + 2)
        step1 = self.job_step(t_end) or self.resumed_step(t_end, 120)
        trace = self.save_trace(t0 - 5, t_end)
        series = (trace.get("max(seamguard_job_step)") or [{}])[0].get("values", [])  # whichever host serves it
        steps = [(float(ts), float(v)) for ts, v in series]
        rates = phase_rates(steps, t0, starts, t.fault_s, t_end)
        slurm = self.slurm_summary()
        events = read_jsonl(self.work / "ctl" / "events.jsonl")
        job_events = read_jsonl(self.work / "job" / "events.jsonl")
        delivered = read_jsonl(self.work / "hints" / ".seamguard-hints.jsonl")
        cover = covered(self.lay)
        throughput = (step1 - step0) / (t_end - t0) if step0 is not None and step1 is not None else None
        four = "gray_link" in t.faults
        goodput = self.goodput(t0, t_end, starts, cover) if four else None
        goodput_slurm = self.goodput(t0, t_end, starts, cover, accounting=True) if four and self.slurm else None
        return {
            "mode": self.mode,
            "faults": fault_figures(starts, ends, cover, events, job_events, delivered, steps),
            "healthy_actions": healthy_actions(starts, cover, events),
            "useful_steps_per_s": round(throughput, 4) if throughput is not None else None,
            "steps_per_s_by_phase": rates,
            "steps": [step0, step1], "drill_s": round(t_end - t0, 1), "fault_starts": starts,
            "storage_probe_ms": {"before": round(probe_before, 1),
                                 "during": round(probe_during, 1) if probe_during else None},
            "freezes": self.disk.freezes, "freeze_errors": self.disk.errors[:3],
            "controller_errors": sum(1 for e in events if e.get("kind") == "controller"),
            "controller_alive": self.procs.alive("controller"),
            "cooling_slowdown": self.slowdown_plan(),
            "moves": self.moves(starts),
            "goodput": goodput, "goodput_with_slurm_accounting": goodput_slurm,
            "launch": self.launch,
            **({"slurm": slurm} if slurm else {}),
        }

    def moves(self, starts: dict[str, float]) -> list[dict]:
        """Every move_job the planner decided, when (s after the cooling fault began), and what it priced
        it over: the fault's age and expected remaining time, benefit and cost (the ledger's decision rows)."""
        import sqlite3

        db = self.work / "ctl" / "seamguard.db"
        if not db.exists():
            return []
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as con:
            rows = con.execute("SELECT t_s, key, reason, evidence, benefit, cost FROM decisions "
                               "WHERE verb = 'move_job' AND event = 'decided' ORDER BY t_s").fetchall()
        t_cool = starts.get("cooling")
        out = []
        for t_s, key, reason, evidence, benefit, cost in rows:
            ev = {e[0].partition(":")[0]: e for e in json.loads(evidence or "[]") if isinstance(e, list) and e}
            rem = ev.get("fault_remaining")
            out.append({"key": key, "after_fault_start_s": round(t_s - t_cool, 1) if t_cool else None,
                        "fault_age_s": rem[1] if rem else None, "expected_remaining_s": rem[2] if rem else None,
                        "benefit_gpu_h_per_h": benefit, "cost_gpu_h_per_h": cost, "reason": reason})
        return out

    def goodput(self, t0: float, t_end: float, starts: dict[str, float], cover: dict[str, set[str]],
                accounting: bool = False) -> dict | None:
        """Live goodput of the job over the drill (`seamguard goodput` on this repetition's Prometheus,
        topology and ledger; ``accounting``: and Slurm's, `--slurm --sacct-completion`, so a requeued
        job's time down counts): the causes, how far their sum is from the wall time, and each fault's
        lost seconds by cause and entity over the fault and its gap (docs/goodput.md)."""
        w = self.work
        conf, extra = [], []
        if accounting and self.slurm is not None:
            conf, extra = [f"SLURM_CONF={self.slurm.conf}"], ["--slurm", "--sacct-completion"]
        argv = [*self.tb.exec_prefix(self.ctl), "env", f"PYTHONPATH={ROOT / 'src'}", *conf, sys.executable, "-m",
                "seamguard", "goodput", "--job", self.lay.job, "--since", f"{t0:.3f}", "--until", f"{t_end:.3f}",
                "--step", "1", "--prometheus", self.prom, "--topology", str(w / "fleet.yaml"), "--ledger",
                str(w / "ctl" / "seamguard.db"), *extra, "-o", "json"]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        except subprocess.TimeoutExpired:
            return {"error": "seamguard goodput took over 180 s"}
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["exit " + str(p.returncode)])[-1]}
        g = json.loads(p.stdout.splitlines()[-1])["jobs"][0]
        (w / f"goodput{'-slurm' if accounting else ''}.json").write_text(json.dumps(g))  # every span, kept with --keep
        return goodput_check(g, starts, self.timing, cover)

    def slowdown_plan(self) -> dict | None:
        """The HW slowdown the twin planned for the cooling fault (testbed/hw_slowdown.py): per node
        the delay after the flow loss began, the clock fraction, until when; None if it made none."""
        try:
            return json.loads((self.work / "gpu-clock" / PLAN_FILE).read_text())
        except (OSError, ValueError):
            return None

    def slurm_summary(self) -> dict:
        """The job as Slurm saw it at the end: state, nodes, restarts (requeues), and what the
        Slurm actuator did (its results in the controller's action log)."""
        if self.slurm is None or self.slurm_job is None:
            return {}
        j = self.slurm_job_state()
        starts = [line for line in (self.work / "slurm-job.out").read_text(errors="replace").splitlines()
                  if line.startswith("drill job ")] if (self.work / "slurm-job.out").exists() else []
        nodes = self.slurm.run("sinfo", "-N", "-h", "-o", "%N %T")
        return {"job_id": self.slurm_job, "state": j.get("JobState"), "nodes": j.get("NodeList"),
                "restarts": int(j.get("Restarts", "0") or 0), "excluded": j.get("ExcNodeList"),
                "starts": starts, "node_states": nodes.stdout.split("\n")[:-1] if nodes.returncode == 0 else []}

    def save_trace(self, t_from: float, t_to: float) -> dict:
        """The drill's main series as Prometheus stored them (trace.json, kept with --keep)."""
        from urllib.parse import urlencode

        out = {}
        for name in TRACE:
            q = urlencode({"query": name, "start": f"{t_from:.0f}", "end": f"{t_to:.0f}", "step": "1"})
            text = ns_get(self.tb, self.ctl, f"{self.prom}/api/v1/query_range?{q}")
            out[name] = json.loads(text)["data"]["result"] if text else None
        (self.work / "trace.json").write_text(json.dumps(out))
        return out

    def stop(self) -> None:
        self.disk.calm()
        gray_link(self.tb, self.lay.job_hosts[0], 0, None)
        self.procs.stop("controller", grace_s=10)  # first: it must not act on the job's end
        if self.slurm is not None:
            self.slurm.stop()
        self.procs.stop_all(grace_s=10)
        if self.etcd is not None:
            self.etcd.stop()
        for h in range(self.lay.hosts):
            kill_namespace(self.tb, h)


def goodput_check(g: dict, starts: dict[str, float], timing: Timing, cover: dict[str, set[str]]) -> dict:
    """What the drill checks of a job's goodput record: its causes add up to its wall time, and the
    time each fault cost (over the fault and its gap) is charged to causes and entities it covers:
    per fault, lost seconds by cause, the share on entities the fault covers, and the rest."""
    total = sum(g["by_cause_s"].values())
    out = {"wall_s": g["wall_s"], "by_cause_s": g["by_cause_s"], "ettr": g["ettr"],
           "sum_error_fraction": round(abs(total - g["wall_s"]) / g["wall_s"], 6) if g["wall_s"] else None,
           "faults": {}}
    for f, t_f in starts.items():
        a, b = t_f, t_f + timing.fault_s + timing.gap_s
        lost: dict[str, float] = {}
        by_entity: dict[str, float] = {}
        for s in g.get("spans", []):
            x = max(0.0, min(b, s["end_s"]) - max(a, s["start_s"]))
            if x <= 0 or s["cause"] == "productive":
                continue
            lost[s["cause"]] = lost.get(s["cause"], 0.0) + x
            k = f"{s['cause']} {s['entity']} ({s['seam']})"
            by_entity[k] = by_entity.get(k, 0.0) + x
        out["faults"][f] = {
            "lost_s": {c: round(v, 2) for c, v in sorted(lost.items())},
            "lost_by_cause_entity_s": {k: round(v, 2) for k, v in sorted(by_entity.items(), key=lambda kv: -kv[1])},
            "lost_on_covered_entities_s": round(sum(v for k, v in by_entity.items()
                                                    if k.split(" ")[1] in cover[f]), 2),
            "spans": [[round(s["start_s"] - t_f, 2), round(s["end_s"] - t_f, 2), s["cause"], s["entity"], s["why"][:120]]
                      for s in g.get("spans", []) if s["end_s"] > a and s["start_s"] < b]}
    return out


def _sleep_until(t: float) -> None:
    while (d := t - time.time()) > 0:
        time.sleep(min(d, 0.2))


# ---- the run --------------------------------------------------------------------------------------------------
def summarize(reps: list[dict]) -> dict:
    by = {m: [r for r in reps if r["mode"] == m] for m in MODES}
    tput = {m: stats([r["useful_steps_per_s"] for r in by[m]]) for m in MODES}
    per_fault = {}
    for f in FAULTS:
        per_fault[f] = {}
        for m in MODES:
            rs = [r["faults"][f] for r in by[m]]
            per_fault[f][m] = {
                "time_to_action_s": stats([x["time_to_action_s"] for x in rs]),
                "action": sorted({x["action"] for x in rs}, key=str) if rs else [],
                "delivered": sorted({k for x in rs for k in x["delivered"]}),
                "job_steps_lost": stats([x["job_steps_lost"] for x in rs]),
            }
    phases = {m: {p: stats([r["steps_per_s_by_phase"].get(p) for r in by[m]])["median"]
                  for p in (by[m][0]["steps_per_s_by_phase"] if by[m] else {})} for m in MODES}
    w, wo = tput["enforce"]["median"], tput["dry_run"]["median"]
    return {
        "per_fault": per_fault,
        "useful_throughput_with_control": tput["enforce"],
        "useful_throughput_without_control": tput["dry_run"],
        "throughput_ratio": round(w / wo, 3) if w and wo else None,
        "steps_per_s_by_phase": phases,
        "healthy_actions": sum(len(r["healthy_actions"]) for r in reps),
    }


# ---- the fault-duration sweep ---------------------------------------------------------------------------
# Per fault duration D, the cooling fault alone, three arms interleaved: no control (dry_run); control
# with the published prior for how long a loop's flow loss lasts (2 h, exponential: today's planner,
# which moves at first sight); control with a calibrated history of this loop's flow losses, which
# last about D (`HISTORY_N` past incidents, lognormal around D, fitted by twin/calibrate.py's
# `lognormal_fit` and handed to the planner as `objective.fault_durations`, as `seamguard twin
# calibrate` would). The prior arm measures what acting costs or buys at D; the history arm whether
# the planner acts there.
ARMS = (("no_control", "dry_run", False), ("control_prior", "enforce", False), ("control_history", "enforce", True))
HISTORY_N, HISTORY_SIGMA, HISTORY_SEED = 20, 0.25, 40


def history_rows(duration_s: float) -> list[dict]:
    """The calibrated ``durations`` row of a loop whose flow losses last about ``duration_s``."""
    import numpy as np

    from seamguard.twin.calibrate import lognormal_fit

    past = np.random.default_rng(HISTORY_SEED).lognormal(np.log(duration_s), HISTORY_SIGMA, HISTORY_N)
    return [{"domain": "cooling_loop", "class": "gray", "source": "measured", **lognormal_fit(past.tolist()),
             "from": f"{HISTORY_N} past flow losses of this loop, lognormal around {duration_s:g} s "
                     f"(sigma {HISTORY_SIGMA}, seed {HISTORY_SEED})"}]


def summarize_sweep(reps: list[dict], durations: list[float]) -> dict:
    """Per duration: each arm's useful throughput and moves; the ratios to no control; where acting
    (the prior arm's move) starts to pay, and whether the history arm moved only there."""
    per = {}
    ctl = [a for a, _, _ in ARMS if a != "no_control"]
    for d in durations:
        arms = {a: [r for r in reps if r["fault_duration_s"] == d and r["arm"] == a] for a, _, _ in ARMS}
        tput = {a: stats([r["useful_steps_per_s"] for r in rs])["median"] for a, rs in arms.items()}
        base = tput["no_control"]
        ratio = {a: round(tput[a] / base, 3) if tput[a] and base else None for a in ctl}
        moved = {a: sum(bool(r["moves"]) for r in arms[a]) / len(arms[a]) if arms[a] else None for a in ctl}
        calm = {a: stats([r["steps_per_s_by_phase"].get("calm") for r in rs])["median"] for a, rs in arms.items()}
        per[f"{d:g}"] = {
            "useful_steps_per_s": tput, "ratio_to_no_control": ratio, "moved_share": moved,
            "calm_steps_per_s": calm,  # before the fault: how much of a difference the machine's load makes
            "relative_to_own_calm": {a: round(tput[a] / calm[a], 3) if tput[a] is not None and calm[a] else None
                                     for a in tput},
            "moved": {a: bool(moved[a]) for a in ctl},
            "first_move": {a: next((r["moves"][0] for r in arms[a] if r["moves"]), None) for a in ctl},
            "acting_pays": (ratio["control_prior"] > 1.0) if ratio["control_prior"] is not None and moved[
                "control_prior"] else None}
    paid = [float(d) for d, x in per.items() if x["acting_pays"]]
    acted = [float(d) for d, x in per.items() if x["moved"]["control_history"]]
    return {"per_duration": per,
            "acting_pays_from_s": min(paid) if paid else None,
            "history_planner_moved_at_s": acted,
            "history_planner_acted_only_where_acting_paid": all(per[k]["acting_pays"] for k in per
                                                                 if per[k]["moved"]["control_history"]),
            "history_planner_acted_wherever_acting_paid": all(per[k]["moved"]["control_history"] for k in per
                                                              if per[k]["acting_pays"])}


def print_sweep(out: dict) -> None:
    print(f"{'fault_s':>8} {'no control':>11} {'prior':>7} {'history':>8}  prior/none  history/none  moved prior/history")
    for d, x in out["per_duration"].items():
        t, r, m = x["useful_steps_per_s"], x["ratio_to_no_control"], x["moved"]
        print(f"{d:>8} {t['no_control']!s:>11} {t['control_prior']!s:>7} {t['control_history']!s:>8}  "
              f"{r['control_prior']!s:>10}  {r['control_history']!s:>12}  {m['control_prior']}/{m['control_history']}")
    print(f"acting pays from {out['acting_pays_from_s']} s; the planner with history moved at {out['history_planner_moved_at_s']}"
          f"; only where it paid: {out['history_planner_acted_only_where_acting_paid']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition per mode, 15 s faults")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per mode (full run)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--launch", choices=("slurm", "direct"), default="slurm",
                    help="slurm: sbatch the job on the test bed's Slurm cluster (default); direct: start "
                         "`seamguard launch` on each node without Slurm")
    ap.add_argument("--fault-duration-s", default=None, metavar="S[,S...]",
                    help="sweep the cooling fault's duration instead of the four-fault drill: per duration, no "
                         "control, control on the published prior, control on a history of faults that long "
                         "(e.g. 15,60,240,900)")
    a = ap.parse_args()
    durations = parse_durations(a.fault_duration_s) if a.fault_duration_s else None
    if os.geteuid() != 0:
        sys.exit("error: seam_drill needs root (ip netns, tc, mount, losetup)")
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if a.launch == "slurm" and missing:
        sys.exit(f"error: --launch slurm needs Slurm installed ({', '.join(missing)} not on PATH; apt packages "
                 "slurmctld slurmd slurm-client munge); --launch direct runs the drill without it")
    reps = 1 if a.quick else a.reps
    timing = Timing(calm_s=15, fault_s=15, gap_s=10, kill_after_s=5) if a.quick else \
        Timing(calm_s=30, fault_s=30, gap_s=20, kill_after_s=8)
    plan = sweep_plan(durations, reps) if durations else drill_plan(reps, timing)
    private_mounts()
    load0 = os.getloadavg()
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="seam_drill."))
    lay = Layout()
    tb = Testbed(TestbedSpec(hosts=lay.hosts, rails=lay.rails))
    disk = SlowDisk(work / "ckpt.img", work / "ckpt")
    results: list[dict] = []
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        tb.up()
        disk.up()
        for name, mode, tm, hist, tags in plan:
            rep = Rep(tb, lay, disk, work / name, mode, tm, steps_s=0.05, launch=a.launch, fault_durations=hist)
            rep.work.mkdir(parents=True)
            try:
                log(f"{name}: starting")
                results.append({**tags, **rep.run()})
                log(f"{name}: {json.dumps(results[-1])}")
            finally:
                rep.stop()
    finally:
        disk.down()
        tb.down()
        if not a.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    out = {
        "benchmark": "seam_drill", "quick": a.quick, "reps_per_mode": reps,
        "launch": ("sbatch on the test bed's Slurm cluster (slurmctld + a slurmd per host namespace); srun starts "
                   "seamguard launch on 2 nodes (TCPStore)" if a.launch == "slurm" else
                   "seamguard launch across 2 testbed hosts (etcd store), not through Slurm"),
        **(summarize_sweep(results, durations) if durations else summarize(results)),
        **({"history": {"n": HISTORY_N, "sigma": HISTORY_SIGMA, "seed": HISTORY_SEED}} if durations else {}),
        "reps": results,
        "wall_s": round(time.monotonic() - t_start, 1),
        "loadavg_start": [round(x, 2) for x in load0], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    (print_sweep if durations else print_table)(out)
    print(json.dumps(out))


def parse_durations(text: str) -> list[float]:
    """``--fault-duration-s``: comma-separated seconds, each > 0; one-line error otherwise."""
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"error: --fault-duration-s: expected seconds like 15,60,240, got {text!r}")
    if not out or any(not (0 < d <= 7200) for d in out):
        sys.exit(f"error: --fault-duration-s: each duration must be in (0, 7200] s, got {text!r}")
    return out


def drill_plan(reps: int, timing: Timing) -> list[tuple]:
    """The four-fault drill: each repetition in both modes, interleaved (name, mode, timing, history, tags)."""
    return [(f"rep{k}-{mode}", mode, timing, None, {})
            for k in range(reps) for mode in (MODES if k % 2 == 0 else MODES[::-1])]


def sweep_plan(durations: list[float], reps: int) -> list[tuple]:
    """The sweep: per duration and repetition the three arms, rotated so no arm always runs first."""
    plan = []
    for k in range(reps):
        for i, d in enumerate(durations):
            # a gap long enough for a requeued job to be stepping again when the window ends
            tm = Timing(calm_s=10, fault_s=d, gap_s=45, kill_after_s=0, faults=("cooling",))
            arms = ARMS[(i + k) % 3:] + ARMS[:(i + k) % 3]
            for arm, mode, hist in arms:
                plan.append((f"d{d:g}-rep{k}-{arm}", mode, tm, history_rows(d) if hist else None,
                             {"arm": arm, "fault_duration_s": d}))
    return plan


def print_table(out: dict) -> None:
    print(f"{'fault':<14} {'mode':<8} {'time_to_action_s':<28} {'steps_lost':<12} action")
    for f, by in out["per_fault"].items():
        for m, x in by.items():
            tta = x["time_to_action_s"]
            print(f"{f:<14} {m:<8} {str(tta['median']) + ' [' + str(tta['min']) + '-' + str(tta['max']) + ']':<28} "
                  f"{x['job_steps_lost']['median']!s:<12} {x['action']} delivered={x['delivered']}")
    w, wo = out["useful_throughput_with_control"], out["useful_throughput_without_control"]
    print(f"useful steps/s with control {w['median']} [{w['min']}-{w['max']}], without {wo['median']} "
          f"[{wo['min']}-{wo['max']}], ratio {out['throughput_ratio']}; healthy_actions {out['healthy_actions']}")
    for m, ph in out["steps_per_s_by_phase"].items():
        print(f"steps/s by phase ({m}): " + " ".join(f"{p} {v}" for p, v in ph.items()))


if __name__ == "__main__":
    main()
