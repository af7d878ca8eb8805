"""`failover_training.py --fsdp --hosts 2`: sharded failover across 2 namespaced hosts.

FSDP2 on 4 ranks, 2 per host, hosts being network namespaces of a
`seamguard.testbed.net.Testbed` with real TCP between them (a third namespace runs etcd
and torchft's Lighthouse). A faulty run of every system suffers two failures: one rank
SIGKILLed (rank 1, on host 0, by the chaos injector at a drawn step), then host 1 killed
whole (SIGKILL to every process in its namespace: launcher/agent, workers, spares, and
the host memory they held) once the job reached a later drawn step. Systems:

- plain: torchrun + FSDP2 over both hosts, no checkpoints, no failures (the reference).
- seamguard: `seamguard launch` per host over etcd, examples/train_fsdp.py, a snapshot
  every step replicated to the same slot on the other host, 2 spares per host (so a
  whole host's 2 ranks can be replaced without shrinking).
- torchrun: one torchrun agent per host, c10d rendezvous hosted by host 0's agent,
  `--nnodes 1:2` (elastic: it continues on one host when the other is gone, as a user
  without a replacement node runs it), FSDP2 + DCP async_save on storage both hosts
  share, at the same Young/Daly interval as the single-host mode; after either failure
  every surviving worker restarts and loads the newest complete checkpoint (host loss:
  on 2 ranks, DCP resharding 4 -> 2).
- torchft (0.2.0, when installed): HSDP, one replica group per host (FSDP2 inside the
  host, torchft's fault-tolerant all-reduce across hosts), each group under its own
  torchrun that restarts the group when one of its ranks dies; the Lighthouse in the
  third namespace. On host loss the surviving group carries on alone (nothing replaces
  the host), dropping the lost group's share of each global batch.

`--hsdp`: every system in the same HSDP layout, like for like: a 2-D mesh ("replicate",
"shard") of shape (2, 2), row 0 = ranks 0, 1 on host 0, row 1 = ranks 2, 3 on host 1;
FSDP2 shards within a host, the rows replicate across the hosts. plain and torchrun run
torchrun_fsdp_train.py --replicate 2 (plain HSDP is the reference), seamguard
examples/train_fsdp.py --replicate 2 (every shard's replica holder is its replicate peer),
torchft as above (it is HSDP either way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from seamguard.ports import free_port
from seamguard.testbed.multinode import EtcdServer, MultiNodeJob, kill_host
from seamguard.testbed.net import SRC, Testbed, TestbedSpec

REPO = Path(__file__).resolve().parents[1]
HOSTS = (0, 1)            # job hosts; host 2 runs etcd and the Lighthouse
SERVICE_HOST = 2
PER_HOST = 2
VICTIM_RANK = 1           # the rank kill: rank 1 (host 0), not the coordinator's rank 0
LOST_HOST = 1             # the host kill: the non-coordinator host
LIGHTHOUSE_PORT = 29510
# torch 2.13's shared rendezvous TCPStore keeps round 0's MASTER_ADDR/PORT: a node that
# joins in a later round waits forever for the round's MASTER_ADDR key (seen here);
# unshared, rank 0 of every round serves a fresh store
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass
class Cluster:
    tb: Testbed
    etcd: EtcdServer
    lighthouse: subprocess.Popen | None = None

    @property
    def lighthouse_url(self) -> str:
        return f"http://{self.tb.addr(SERVICE_HOST, None)}:{LIGHTHOUSE_PORT}"


@contextmanager
def cluster(work: Path, torchft: bool):
    """Three namespaced hosts, etcd (and torchft's Lighthouse) on the third; always torn down."""
    tb = Testbed(TestbedSpec(hosts=3, rails=1))
    etcd = EtcdServer.in_host(tb, SERVICE_HOST, work / "etcd")
    c = Cluster(tb, etcd)
    try:
        tb.up()
        etcd.start()
        if torchft:
            # torchft 0.2.0's binary; join timeout as in the single-host DDP mode, heartbeat default
            exe = shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent / "torchft_lighthouse")
            c.lighthouse = subprocess.Popen(
                [*tb.exec_prefix(SERVICE_HOST), "env", "RUST_LOG=error", exe, "--bind",
                 f"0.0.0.0:{LIGHTHOUSE_PORT}", "--min_replicas", "1", "--join_timeout_ms", "100"],
                stdout=open(work / "lighthouse.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
        yield c
    finally:
        if c.lighthouse is not None:
            c.lighthouse.kill()
            c.lighthouse.wait(10)
        etcd.stop()
        for h in (*HOSTS, SERVICE_HOST):
            kill_host(tb, h)
        tb.down()


# ---------------------------------------------------------------- driving one run
def furthest_step(out: Path) -> int:
    """The furthest committed step in any worker log (the hosts share this filesystem)."""
    best = -1
    for f in out.glob("worker_*.log"):
        lines = f.read_text().splitlines()
        if lines and lines[-1].strip():
            best = max(best, int(lines[-1].split()[0]))
    return best


def kill_host_at(c: Cluster, out: Path, at: tuple[int, float], procs: list[subprocess.Popen],
                 timeout_s: float) -> dict | None:
    """``at`` = (step, phase): kill LOST_HOST whole ``phase`` (0-1) of a step after some
    rank committed ``step`` (the step's length taken from when ``step - 1`` and ``step``
    were first seen); the kill record per_failure reads. A failure strikes at any moment
    of a step: a kill right after a committed step would always land in the same part of
    the next one."""
    step, phase = at
    deadline = time.monotonic() + timeout_s
    seen: dict[int, float] = {}
    while (furthest := furthest_step(out)) < step and time.monotonic() < deadline:
        if all(p.poll() is not None for p in procs):
            return None
        seen.setdefault(furthest, time.monotonic())
        time.sleep(0.02)
    now = time.monotonic()
    step_s = now - seen[step - 1] if step - 1 in seen else 0.0
    time.sleep(phase * step_s)
    reached = furthest_step(out)
    t = time.time()
    kill_host(c.tb, LOST_HOST)
    return {"time_s": t, "step": reached + 1, "action": "host", "host": LOST_HOST,
            "phase": round(phase, 3), "delay_s": round(phase * step_s, 3)}


def wait_all(procs: dict[str, subprocess.Popen], timeout_s: float, grace_s: float = 20.0) -> dict[str, int | None]:
    """Wait for every process; once one finished cleanly the rest get ``grace_s`` (a
    restarted torchft group whose peers are done has nobody left to heal from)."""
    deadline = time.monotonic() + timeout_s
    done_at = None
    while time.monotonic() < deadline:
        codes = {k: p.poll() for k, p in procs.items()}
        if all(v is not None for v in codes.values()):
            break
        if done_at is None and 0 in codes.values():
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > grace_s:
            break
        time.sleep(0.1)
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait(10)
    return {k: p.poll() for k, p in procs.items()}


def _env(c: Cluster, host: int, extra: dict[str, str], own_hostname: bool = False) -> list[str]:
    """The prefix that runs a command on testbed host ``host``. ``own_hostname``: in a UTS
    namespace whose hostname is the host's address (namespaced hosts otherwise share this
    machine's hostname, and torchft's HTTP checkpoint transport advertises
    socket.gethostname(), so a healing group would fetch from itself)."""
    addr = c.tb.addr(host, None)
    pairs = {"PYTHONPATH": SRC, "GLOO_SOCKET_IFNAME": "mgmt", "RUST_LOG": "error",
             "SEAMGUARD_ADVERTISE_HOST": addr, **extra}
    uts = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', addr] if own_hostname else []
    return [*c.tb.exec_prefix(host), *uts, "env", *(f"{k}={v}" for k, v in pairs.items())]


def _chaos_env(chaos_dir: Path, chaos: str | None) -> dict[str, str]:
    return {"SEAMGUARD_CHAOS_DIR": str(chaos_dir), **({"SEAMGUARD_CHAOS": chaos} if chaos else {})}


# ---------------------------------------------------------------- systems
def torchrun_agents(c: Cluster, script: str, name: str, out: Path, args: list[str],
                    env: dict[str, str], restarts: int) -> dict[str, subprocess.Popen]:
    """One torchrun agent per host, c10d rendezvous on host 0's agent, elastic 1..2 nodes."""
    port = free_port()
    master = c.tb.addr(HOSTS[0], None)
    procs = {}
    for node, host in enumerate(HOSTS):
        conf = "join_timeout=60,last_call_timeout=3,close_timeout=5" + (",is_host=true" if node == 0 else ",is_host=false")
        cmd = [*_env(c, host, env), sys.executable, "-m", "torch.distributed.run",
               "--nnodes", f"1:{len(HOSTS)}", "--nproc-per-node", str(PER_HOST),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master}:{port}", "--rdzv-id", name,
               "--rdzv-conf", conf, "--local-addr", c.tb.addr(host, None),
               "--max-restarts", str(restarts), "--monitor-interval", "0.1",
               str(REPO / "benchmarks" / script), *args, "--out", str(out)]
        procs[f"node{node}"] = subprocess.Popen(cmd, stdout=open(out.parent / f"{name}_node{node}.log", "wb"),  # noqa: SIM115
                                                stderr=subprocess.STDOUT)
        if node == 0:
            time.sleep(0.3)   # the rendezvous host's store first
    return procs


def run_torchrun_hosts(c: Cluster, cfg, work: Path, name: str, faults: bool, host_step: tuple[int, float] | None,
                       ckpt_every: int) -> dict:
    out, chaos_dir = work / name, work / f"{name}_chaos"
    out.mkdir(parents=True, exist_ok=True)
    chaos = f"kill:rank={VICTIM_RANK},step={cfg.kills[0][0]},phase=step" if faults else None
    args = ["--steps", str(cfg.steps), "--ckpt-every", str(ckpt_every), *cfg.model_args(), *cfg.mesh_args()]
    t0 = time.perf_counter()
    procs = torchrun_agents(c, "torchrun_fsdp_train.py", name, out, args,
                            {**_chaos_env(chaos_dir, chaos), **NO_SHARED_STORE}, 3)
    host_kill = kill_host_at(c, out, host_step, list(procs.values()), 300) if faults and host_step else None
    codes = wait_all(procs, 400)
    return _result(out, chaos_dir, host_kill, codes, time.perf_counter() - t0, same_generation_ok=False)


def run_seamguard_hosts(c: Cluster, cfg, work: Path, name: str, faults: bool, host_step: tuple[int, float] | None) -> dict:
    out = work / name
    chaos = ("--chaos", f"kill:rank={VICTIM_RANK},step={cfg.kills[0][0]},phase=step") if faults else ()
    job = MultiNodeJob(c.tb, list(HOSTS), c.etcd.url, out, run_id=f"{name}-{os.getpid()}",
                       nproc=PER_HOST, spares=2,
                       launch_args=("--snapshot-every", str(cfg.snapshot_every), *cfg.mttf_args(), *chaos),
                       script=REPO / "examples" / "train_fsdp.py",
                       script_args=("--steps", str(cfg.steps), "--dropout", "0", *cfg.model_args(),
                                    *cfg.mesh_args()))
    t0 = time.perf_counter()
    try:
        job.start()
        procs = list(job.procs.values())
        host_kill = kill_host_at(c, out, host_step, procs, 300) if faults and host_step else None
        codes = job.wait(400)
    finally:
        job.stop()
    r = _result(out, out / "chaos", host_kill, {f"node{n}": v for n, v in codes.items()},
                time.perf_counter() - t0, same_generation_ok=False)
    events = job.events()
    r["recovery_s"] = [round(e["recovery_s"], 3) for e in events if e["event"] == "resumed" and e["gen"] > 0]
    r["resume_sources"] = [e.get("source") for e in events if e["event"] == "resume_chosen" and e["gen"] > 0]
    r["node_lost"] = [e.get("node") for e in events if e["event"] == "node_lost"]
    kills = read_kills(out / "chaos") + ([host_kill] if host_kill else [])
    r["phases"] = kill_phases(events, _rows(out), kills)
    r["profile"] = rank_profile(events)
    return r


def rank_profile(events: list[dict]) -> dict | None:
    """With SEAMGUARD_PROFILE=1 (--profile): the training ranks' `profile` events (one per
    rank that finished), per phase the mean over ranks of wall and thread-CPU ms per step,
    and the mean process CPU seconds; None without them."""
    from fsdp_overhead import mean_over_ranks

    profiles = [e for e in events if e.get("kind") == "profile" and e.get("rank", -1) >= 0]
    if not profiles:
        return None
    return {"ranks": len(profiles), "phases": mean_over_ranks(profiles),
            "process_cpu_s": round(sum(p["process_cpu_s"] for p in profiles) / len(profiles), 3)}


def kill_phases(events: list[dict], rows, kills: list[dict]) -> list[dict | None]:
    """`recovery_phases` of every injected kill, each for the generation that resumed
    after it: the first one planned after the kill that committed a step. Not simply the
    kill's ordinal: a loss the runtime judged on its own (a node or rank wrongly taken
    for lost under load) adds generations, and a recovery another loss overtook commits
    nothing. ``generations`` lists every generation planned between the kill and the
    resume (more than one: the recovery was superseded)."""
    done = {g for _, _, g in rows}
    out = []
    for k in sorted(kills, key=lambda k: k["time_s"]):
        planned = sorted(e["gen"] for e in events if e["event"] == "plan" and e["t"] > k["time_s"])
        gen = next((g for g in planned if g in done), None)
        phases = recovery_phases(events, rows, k["time_s"], gen) if gen is not None else None
        out.append(phases and {**phases, "generations": [g for g in planned if g <= gen]})
    return out


def recovery_phases(events: list[dict], rows, t_kill: float, gen: int) -> dict | None:
    """Where kill -> next step went for generation ``gen``, in seconds, from the runtime's
    events: noticing the loss (the coordinator's verdict, with its evidence), the
    decision (the plan), the members getting there (a spare building its model once it
    knows its rank; a survivor finishing its cancelled step), the resume choice, the
    state restored and the group re-formed (the last member's "recovered" note), and the
    first step committed after it (the step in flight at the kill, redone)."""
    plan = next((e for e in events if e["event"] == "plan" and e["gen"] == gen), None)
    chosen = next((e for e in events if e["event"] == "resume_chosen" and e["gen"] == gen), None)
    notes = [e for e in events if e["event"] == "worker" and e.get("kind") == "recovered" and e.get("gen") == gen]
    firsts = [t for _, t, g in rows if g == gen]
    if plan is None or chosen is None or not notes or not firsts:
        return None
    verdict = [e for e in events if e["event"] in ("detected", "node_lost") and e["t"] <= plan["t"]][-1]
    started = max(e["t"] - e["seconds"] for e in notes)
    recovered = max(e["t"] for e in notes)
    first = min(firsts)
    return {"evidence": verdict.get("evidence") or verdict.get("kind"),
            "detect_s": round(verdict["t"] - t_kill, 3), "plan_s": round(plan["t"] - verdict["t"], 3),
            "members_ready_s": round(started - plan["t"], 3), "resume_chosen_s": round(chosen["t"] - started, 3),
            "restored_and_regrouped_s": round(recovered - chosen["t"], 3),
            "first_step_s": round(first - recovered, 3), "kill_to_next_step_s": round(first - t_kill, 3),
            "slowest_member_phases_s": max(notes, key=lambda e: e["t"])["phases_s"]}


def run_torchft_hosts(c: Cluster, cfg, work: Path, name: str, faults: bool, host_step: tuple[int, float] | None) -> dict:
    """One replica group per host, each under a one-node torchrun that restarts it."""
    out, chaos_dir = work / name, work / f"{name}_chaos"
    out.mkdir(parents=True, exist_ok=True)
    chaos = f"kill:rank={VICTIM_RANK},step={cfg.kills[0][0]},phase=step" if faults else None
    t0 = time.perf_counter()
    procs = {}
    for g, host in enumerate(HOSTS):
        addr = c.tb.addr(host, None)
        cmd = [*_env(c, host, {**_chaos_env(chaos_dir, chaos), **NO_SHARED_STORE}, own_hostname=True),
               sys.executable, "-m",
               "torch.distributed.run",
               "--nnodes", "1", "--nproc-per-node", str(PER_HOST), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"{addr}:{free_port()}", "--rdzv-conf", "is_host=true",
               "--local-addr", addr, "--max-restarts", "3", "--monitor-interval", "0.1",
               str(REPO / "benchmarks" / "torchft_fsdp_train.py"), "--group", str(g),
               "--groups", str(len(HOSTS)), "--lighthouse", c.lighthouse_url,
               "--steps", str(cfg.steps), "--out", str(out), *cfg.model_args()]
        procs[f"group{g}"] = subprocess.Popen(cmd, stdout=open(work / f"{name}_group{g}.log", "wb"),  # noqa: SIM115
                                              stderr=subprocess.STDOUT)
    host_kill = kill_host_at(c, out, host_step, list(procs.values()), 300) if faults and host_step else None
    codes = wait_all(procs, 400)
    r = _result(out, chaos_dir, host_kill, codes, time.perf_counter() - t0, same_generation_ok=True)
    per_step: dict[int, int] = {}
    for s, _, _ in _rows(out):
        per_step[s] = per_step.get(s, 0) + 1
    world = PER_HOST * len(HOSTS)
    r["samples_dropped"] = sum(world - min(world, per_step.get(s, 0)) for s in range(cfg.steps)) \
        * cfg.global_batch // world
    return r


def _rows(out: Path):
    from failover_training import read_logs

    return read_logs(out)


def read_kills(chaos_dir: Path) -> list[dict]:
    from failover_training import read_kills as read

    return read(chaos_dir)


def _result(out: Path, chaos_dir: Path, host_kill: dict | None, codes: dict, wall_s: float,
            same_generation_ok: bool) -> dict:
    from failover_training import per_failure

    rows = _rows(out)
    kills = read_kills(chaos_dir)
    if host_kill is not None:
        kills.append(host_kill)
    kinds = ["rank"] * (len(kills) - (host_kill is not None)) + (["host"] if host_kill else [])
    failures = [{**f, "kind": k} for f, k in zip(per_failure(rows, kills, same_generation_ok), kinds)]
    finished = max((r[0] for r in rows), default=-1)
    return {"wall_s": wall_s, "window_s": rows[-1][1] - rows[0][1] if rows else 0.0,
            "failures": failures, "exit_codes": codes, "last_step": finished,
            "shards": sorted(f.name + ":" + f.read_text() for f in out.glob("final_shard_*.txt"))}


def replicas_agree(shards: list[str], replicate: int) -> bool | None:
    """HSDP: whether every replicate peer ended with the same shard (rank r and r + world/R
    hold the same shard), from ``final_shard_<rank>.txt:<checksum>`` entries; None when a
    rank of the layout wrote none (a host killed for good) or there is nothing to compare."""
    sums = {int(e.split(":")[0].removeprefix("final_shard_").removesuffix(".txt")): e.split(":", 1)[1]
            for e in shards}
    world = PER_HOST * len(HOSTS)
    if replicate < 2 or sorted(sums) != list(range(world)):
        return None
    row = world // replicate
    return all(sums[r] == sums[r % row] for r in range(world))


def run_plain_hosts(c: Cluster, cfg, work: Path, name: str) -> dict:
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    args = ["--steps", str(cfg.steps), "--ckpt-every", "0", *cfg.model_args(), *cfg.mesh_args()]
    t0 = time.perf_counter()
    codes = wait_all(torchrun_agents(c, "torchrun_fsdp_train.py", name, out, args, NO_SHARED_STORE, 0), 400)
    return _result(out, work / f"{name}_chaos", None, codes, time.perf_counter() - t0, False)


# ---------------------------------------------------------------- the mode
def kill_steps(rng, steps: int) -> tuple[int, int]:
    """The rank kill in the second sixth..third of the run, the host kill in the second
    half's first third: far enough apart that the first recovery is over."""
    return rng.randrange(steps // 6, steps // 3 + 1), rng.randrange(steps // 2, 2 * steps // 3 + 1)


def torchft_available() -> str | None:
    """None when torchft imports, else the one-line reason it is left out."""
    try:
        import torchft  # noqa: F401
    except ImportError as e:
        return f"torchft not installed ({e}); pip install torchft==0.2.0 to include it"
    return None


def run_one(c: Cluster, system: str, cfg, work: Path, name: str, faults: bool,
            host_step: tuple[int, float]) -> dict:
    hs = host_step if faults else None
    if system == "plain":
        return run_plain_hosts(c, cfg, work, name)
    if system == "seamguard":
        return run_seamguard_hosts(c, cfg, work, name, faults, hs)
    if system == "torchrun":
        return run_torchrun_hosts(c, cfg, work, name, faults, hs, cfg.ckpt_every)
    return run_torchft_hosts(c, cfg, work, name, faults, hs)


def run_reps(c: Cluster, systems: list[str], base, work: Path, reps: int, seed: int) -> list[dict]:
    """Every system failure-free and faulted per repetition, order rotated, interleaved."""
    import random
    from dataclasses import replace

    from failover_training import rotated

    rng = random.Random(seed)
    out = []
    for rep in range(reps):
        rank_step, host_step = kill_steps(rng, base.steps)
        host_phase = rng.random()   # where in its step the host dies (kill_host_at)
        cfg = replace(base, kills=((rank_step, VICTIM_RANK),))
        order = rotated(systems, rep)
        print(f"rep {rep + 1}/{reps}: {cfg.steps} steps on 2 hosts x {PER_HOST}; rank {VICTIM_RANK} "
              f"killed at step {rank_step}, host {LOST_HOST} killed {host_phase:.2f} of a step after step "
              f"{host_step}; "
              f"order {' '.join(order)}", flush=True)
        runs: dict[str, dict] = {}
        for system in order:
            runs[system] = {}
            modes = [False] if system == "plain" else ([False, True] if rep % 2 == 0 else [True, False])
            for faults in modes:
                name = f"r{rep}_{system}_{'faults' if faults else 'clean'}"
                r = run_one(c, system, cfg, work, name, faults, (host_step, host_phase))
                shutil.rmtree(work / name / "ckpt", ignore_errors=True)
                runs[system]["faults" if faults else "clean"] = r
                fails = ", ".join(f"{f['kind']} kill@{f['step']}: next step {f['resume_s']}s, lost "
                                  f"{f['steps_lost']}" for f in r["failures"])
                print(f"  {system:9s} {'faults' if faults else 'clean ':6s} training {r['window_s']:6.1f}s "
                      f"(process {r['wall_s']:5.1f}s, last step {r['last_step']}) {fails}", flush=True)
        out.append({"kills": [[rank_step, VICTIM_RANK], [host_step, f"host{LOST_HOST}", round(host_phase, 3)]],
                    "order": order, "runs": runs})
    return out


def summarize_hosts(reps: list[dict], systems: list[str], steps: int, replicate: int = 1) -> dict:
    """Per system: the twin's keys over all failures (failover_training.summarize), the
    worst resume and loss per kind of failure, and whether every faulted run finished;
    HSDP (``replicate`` > 1): whether each run's replicate peers ended on the same shard."""
    from failover_training import summarize

    summary: dict = {}
    for s in systems:
        summary[s] = summarize(s, reps)
        for kind in ("rank", "host"):
            fs = [f for r in reps for f in r["runs"][s]["faults"]["failures"] if f["kind"] == kind]
            ok = [f for f in fs if f["resume_s"] is not None]
            summary[s][f"{kind}_kill"] = {"resume_s_max": max((f["resume_s"] for f in ok), default=None),
                                          "steps_lost_max": max((f["steps_lost"] for f in ok), default=None),
                                          "unrecovered": len(fs) - len(ok)}
        summary[s]["finished_all_steps"] = [r["runs"][s]["faults"]["last_step"] == steps - 1 for r in reps]
        if replicate > 1 and any(m["shards"] for r in reps for m in r["runs"][s].values()):
            summary[s]["replicas_agree"] = [{m: replicas_agree(run["shards"], replicate)
                                             for m, run in r["runs"][s].items()} for r in reps]
    sg = [r["runs"]["seamguard"] for r in reps]
    summary["seamguard"]["bit_identical"] = [bool(x["clean"]["shards"]) and x["clean"]["shards"] == x["faults"]["shards"]
                                             for x in sg]
    summary["seamguard"]["resume_sources"] = [x["faults"].get("resume_sources") for x in sg]
    summary["seamguard"]["recovery_s"] = [x["faults"].get("recovery_s") for x in sg]
    summary["seamguard"]["recovery_phases"] = [x["faults"].get("phases") for x in sg]
    clean_profiles = [x["clean"]["profile"] for x in sg if x["clean"].get("profile")]
    if clean_profiles:
        summary["seamguard"]["failure_free_profile"] = median_profile(clean_profiles)
    if "torchft" in summary:
        summary["torchft"]["samples_dropped"] = [r["runs"]["torchft"]["faults"]["samples_dropped"] for r in reps]
    return summary


def median_profile(profiles: list[dict]) -> dict:
    """Per phase, the median over runs of each run's mean-over-ranks figures."""
    import statistics

    names = sorted({k for p in profiles for k in p["phases"]})
    return {"runs": len(profiles),
            "process_cpu_s": round(statistics.median(p["process_cpu_s"] for p in profiles), 3),
            "phases": {k: {m: round(statistics.median(p["phases"][k][m] for p in profiles if k in p["phases"]), 3)
                           for m in ("wall_ms_per_step", "cpu_ms_per_step", "count")} for k in names}}


def print_profile(profile: dict, steps: int) -> None:
    print(f"seamguard failure-free, phase by phase (SEAMGUARD_PROFILE=1; mean over ranks, median over "
          f"{profile['runs']} run(s); process CPU {profile['process_cpu_s']} s a rank for {steps} steps):")
    print(f"  {'phase':24s} {'wall ms/step':>13s} {'cpu ms/step':>12s} {'count/run':>10s}")
    for k, v in profile["phases"].items():
        print(f"  {k:24s} {v['wall_ms_per_step']:13.2f} {v['cpu_ms_per_step']:12.2f} {v['count']:10.0f}")


def print_table(summary: dict, systems: list[str], plain_window: str, reps: int, layout: str) -> None:
    print(f"\nmedian [min-max] over {reps} rep(s); plain {layout} on 2 hosts failure-free training {plain_window}")
    print(f"{'system':10s} {'rank kill: next step':>21s} {'lost':>5s} {'host kill: next step':>21s} {'lost':>5s} "
          f"{'wall vs plain':>14s} {'failure-free vs plain':>22s}")
    for s in systems:
        x = summary[s]
        print(f"{s:10s} {x['rank_kill']['resume_s_max']!s:>21s} {x['rank_kill']['steps_lost_max']!s:>5s} "
              f"{x['host_kill']['resume_s_max']!s:>21s} {x['host_kill']['steps_lost_max']!s:>5s} "
              f"{x['wall_ratio']:>13g}x {x['failure_free_wall_ratio']:>21g}x")
    print(f"seamguard bit-identical: {summary['seamguard']['bit_identical']}", flush=True)
    for s in systems:
        if "replicas_agree" in summary[s]:
            print(f"{s} replicate peers on the same final shard (per rep; None: a rank wrote none): "
                  f"{summary[s]['replicas_agree']}", flush=True)
    print("seamguard kill -> next step, phase by phase (s): detect | plan | members ready | resume chosen | "
          "restored + regrouped | first step")
    for rep, phases in enumerate(summary["seamguard"]["recovery_phases"]):
        for p in phases or []:
            if p is not None:
                gens = p.get("generations", [])
                extra = f"; generations {gens}: recoveries superseded" if len(gens) > 1 else ""
                print(f"  rep {rep + 1}: {p['detect_s']} | {p['plan_s']} | {p['members_ready_s']} | "
                      f"{p['resume_chosen_s']} | {p['restored_and_regrouped_s']} | {p['first_step_s']} "
                      f"= {p['kill_to_next_step_s']} ({p['evidence']}{extra})", flush=True)


def main_hosts(args) -> None:
    """The mode's entry (failover_training.main): probe, cluster, runs, summary, JSON."""
    import json
    import tempfile

    from failover_training import (
        Config,
        daly_interval_s,
        fmt,
        probe_checkpointing,
        run_torchrun_fsdp,
        spread,
    )

    t_start = time.perf_counter()
    if args.quick:
        args.reps = 1   # quick keeps every system and both faults, drops repetitions
    work = Path(tempfile.mkdtemp(prefix="sg-failover-hosts-"))
    ft_note = None if args.skip_torchft else torchft_available()
    systems = ["plain", "seamguard", "torchrun"] + ([] if args.skip_torchft or ft_note else ["torchft"])
    replicate = len(HOSTS) if args.hsdp else 1
    if args.profile:   # inherited by every launcher and worker; only seamguard's runtime reads it
        os.environ["SEAMGUARD_PROFILE"] = "1"
    layout = f"HSDP (replicate {replicate} x shard {PER_HOST})" if args.hsdp else "FSDP2"
    try:
        small = {"hidden": 1024, "layers": 3} if args.quick else {}
        steps = 36 if args.quick else 60
        base = Config(steps=16, kills=(), ckpt_every=0, replicate=replicate, **small)
        probe = probe_checkpointing(base, work, run_torchrun_fsdp)
        step_s = probe["step_s"]
        mttf_s = steps * step_s / 2   # two failures per faulty run
        interval_s = max(daly_interval_s(probe["save_stall_s"], mttf_s), probe["write_s"])
        every = max(1, round(interval_s / step_s))
        print(f"layout: {layout}; hosts probe (one host): step {step_s:.3f}s; DCP async_save stall "
              f"{probe['save_stall_s']:.3f}s, write {probe['write_s']:.3f}s -> checkpoint every {every} steps",
              flush=True)
        if ft_note:
            print(f"torchft: {ft_note}", flush=True)
        # --sharded-snapshot-every auto: seamguard's interval from the failure rate the
        # torchrun interval assumes (this run's), per rank, like for like
        cfg = Config(steps=steps, kills=(), ckpt_every=every, replicate=replicate,
                     snapshot_every=args.sharded_snapshot_every, rank_mttf_h=mttf_s * len(HOSTS) * PER_HOST / 3600, **small)
        with cluster(work, "torchft" in systems) as c:
            reps = run_reps(c, systems, cfg, work, args.reps, args.seed)
        summary = summarize_hosts(reps, systems[1:], steps, replicate)
        plain = [r["runs"]["plain"]["clean"]["window_s"] for r in reps]
        print_table(summary, systems[1:], fmt(spread(plain, 1), "s"), args.reps, layout)
        if "failure_free_profile" in summary["seamguard"]:
            print_profile(summary["seamguard"]["failure_free_profile"], steps)
        summary.update({
            "mode": ("fsdp-hosts-hsdp" if args.hsdp else "fsdp-hosts") + ("-quick" if args.quick else ""),
            "layout": layout,
            "seamguard_profiled": bool(args.profile),
            "torchft_note": ft_note or ("HSDP: FSDP2 inside each host's replica group, torchft Manager "
                                        "all-reduce across groups via FSDPModule.set_all_reduce_hook"
                                        if "torchft" in systems else "skipped (--skip-torchft)"),
            "config": {"hosts": len(HOSTS), "ranks_per_host": PER_HOST, "replicate": replicate,
                       "seamguard_spares_per_host": 2,
                       "snapshot_every": args.sharded_snapshot_every, "rank_mttf_h": round(cfg.rank_mttf_h, 5), "steps": steps, "reps": args.reps, "seed": args.seed,
                       "step_s": round(step_s, 3), "torchrun_ckpt_every": every, "hidden": base.hidden,
                       "layers": base.layers, "dim": base.dim, "victim_rank": VICTIM_RANK, "lost_host": LOST_HOST},
            "torchrun_checkpoint": {"save_stall_s": round(probe["save_stall_s"], 4),
                                    "write_s": round(probe["write_s"], 4), "interval_s": round(interval_s, 3),
                                    "every_steps": every},
            "plain_window_s": spread(plain, 2),
            "reps": [{"kills": r["kills"], "order": r["order"],
                      "failures": {s: ms["faults"]["failures"] for s, ms in r["runs"].items() if "faults" in ms},
                      "exit_codes": {f"{s}_{m}": v["exit_codes"] for s, ms in r["runs"].items() for m, v in ms.items()},
                      "window_s": {f"{s}_{m}": round(v["window_s"], 2) for s, ms in r["runs"].items()
                                   for m, v in ms.items()}} for r in reps],
            "benchmark_wall_s": round(time.perf_counter() - t_start, 1),
        })
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    except BaseException:
        print(f"run logs kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)
