"""`seamguard launch [options] train.py args…`: the runtime's command-line edge.

Reads flags, turns them into LaunchSettings/RuntimeSettings and hands over to the
launcher. torch is imported only when a launch actually starts. Options end at the
training command (or at ``--``): what follows belongs to the script, and an option the
launcher does not know before it is one ``error:`` line, exit 2 (never taken for the
script). torchrun's flags are taken with torchrun's meaning (runtime/torchrun_flags.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import typer

from seamguard.clikit import fail
from seamguard.reliability import GPU_MTTF_H
from seamguard.runtime import torchrun_flags
from seamguard.runtime.cadence import AUTO_START_EVERY
from seamguard.runtime.settings import DEFAULT_PRELOAD, LaunchSettings, RuntimeSettings, path_error

LAUNCH_CONTEXT = {"allow_extra_args": True, "allow_interspersed_args": False}
"""Options stop at the first argument that is not one (the training command), which takes
everything after it; an unknown option before it is click's usage error (one line, exit 2)."""


def launch(
    ctx: typer.Context,
    nproc: str = typer.Option("1", "--nproc-per-node", "--nproc_per_node", "--nproc", metavar="<N|gpu|cpu|auto>",
                              help="Training ranks per node (torchrun's: gpu = the visible GPUs, cpu = the CPUs, "
                                   "auto = GPUs if any, else CPUs)."),
    spares: int = typer.Option(0, "--spares", help="Hot spare processes per node."),
    nnodes: str = typer.Option("1", "--nnodes", metavar="<N|N:N>",
                               help="Nodes in the job. torchrun's MIN:MAX only as N:N: the job starts a fixed set of "
                                    "nodes, and hot spares cover a node lost later."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", "--node_rank",
                                            help="This node's rank (0 .. nnodes-1; required with several nodes)."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", "--master_addr",
                                              help="Address of node rank 0 (default 127.0.0.1)."),
    master_port: Optional[int] = typer.Option(None, "--master-port", "--master_port",
                                              help="Port on node rank 0 (default 0 = any free port; one node)."),
    rdzv_backend: Optional[str] = typer.Option(
        None, "--rdzv-backend", "--rdzv_backend", metavar="<static|c10d|etcd|etcd-v2>",
        help="torchrun's: static and c10d meet at node 0's store, etcd at the etcd cluster (--store etcd://)."),
    rdzv_endpoint: Optional[str] = typer.Option(
        None, "--rdzv-endpoint", "--rdzv_endpoint", metavar="<host[:port]>",
        help="torchrun's: node 0's store (as --master-addr/--master-port; port 29400 if none), or with "
             "--rdzv-backend etcd the etcd endpoint (port 2379 if none)."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", "--rdzv_id", help="torchrun's job id: --run-id."),
    standalone: bool = typer.Option(False, "--standalone",
                                    help="torchrun's: one node, its store on a free port of 127.0.0.1 (the default)."),
    max_restarts: Optional[int] = typer.Option(
        None, "--max-restarts", "--max_restarts",
        help="Recoveries before the job fails (torchrun's restarts; default 100): the (N+1)-th ends it."),
    run_id: Optional[str] = typer.Option(None, "--run-id",
                                         help="Names this run's rendezvous and files (default seamguard)."),
    store: Optional[str] = typer.Option(
        None, "--store", metavar="<tcp|etcd://host:port[,host:port]>",
        help="The job-wide store: node 0's TCPStore (default), or an etcd cluster (survives any node). With "
             "etcd and several nodes the coordinator fails over: when its node is lost another node's launcher "
             "is elected and the surviving ranks train on; with the TCPStore (on node 0) node 0's loss ends "
             "the other nodes' part (exit 1)."),
    coordinator_timeout_s: float = typer.Option(
        10.0, "--coordinator-timeout-s",
        help="With several nodes: seconds without the coordinator before the other nodes act (etcd: its "
             "lease, after which another launcher takes over; TCPStore: they end their part)."),
    node_beat_s: float = typer.Option(0.25, "--node-beat-s",
                                      help="With etcd or several nodes: seconds between a node's aggregated heartbeat records."),
    checkpoint_dir: Optional[Path] = typer.Option(None, "--checkpoint-dir",
                                                  help="Where persisted checkpoints go (none when unset)."),
    checkpoint_roots: str = typer.Option(
        "", "--checkpoint-roots", metavar="<dir,dir,…>",
        help="Absolute directories every checkpoint directory must be under, including one a "
             "checkpoint_dir hint moves to (default: the parent of --checkpoint-dir)."),
    snapshot_every: str = typer.Option(
        "1", "--snapshot-every", metavar="<steps|auto>",
        help="Steps between in-memory snapshots, or auto: Daly's interval for the measured "
             "snapshot cost and the job's failure rate (--rank-mttf-hours)."),
    rank_mttf_hours: float = typer.Option(
        GPU_MTTF_H, "--rank-mttf-hours",
        help="With --snapshot-every auto: hours between failures of one rank (default: Llama 3's "
             "unexpected interruptions per GPU)."),
    persist_every: int = typer.Option(50, "--persist-every", help="Steps between persisted checkpoints."),
    keep_checkpoints: int = typer.Option(2, "--keep-checkpoints",
                                         help="Complete persisted checkpoints kept per rank."),
    collective_timeout_s: float = typer.Option(30.0, "--collective-timeout-s",
                                               help="Upper bound on one gradient collective before the rank reports a suspect group."),
    hang_timeout_s: float = typer.Option(1.0, "--hang-timeout-s",
                                         help="Seconds a worker's heartbeat may stand still before it counts as hung."),
    stall_timeout_s: float = typer.Option(10.0, "--stall-timeout-s",
                                          help="Seconds one worker may compute while its peers wait before it counts as stalled."),
    evacuate_stragglers: bool = typer.Option(False, "--evacuate-stragglers",
                                             help="Replace a persistently slow rank with a spare."),
    replenish_spares: bool = typer.Option(True, "--replenish-spares/--no-replenish-spares",
                                          help="Start a fresh spare after every loss."),
    fork_server: bool = typer.Option(
        True, "--fork-server/--no-fork-server",
        help="Fork workers from a process that imported torch once (a .py script)."),
    preload: str = typer.Option(
        ",".join(DEFAULT_PRELOAD), "--preload",
        help="Comma-separated modules the fork server imports once for every worker."),
    rails: str = typer.Option("", "--rails", metavar="<if0,if1,…>",
                              help="Rail interfaces for the gradient all-reduce, with rail failover "
                                   "(a flap costs chunks re-run on another rail, not a recovery)."),
    rail_mode: str = typer.Option("stripe", "--rail-mode", metavar="stripe|standby",
                                  help="stripe: every rail carries a share of each all-reduce; standby: "
                                       "one rail carries it, the others take over when it fails."),
    no_dedup: bool = typer.Option(False, "--no-dedup", help="Send full replicas."),
    step_guard: bool = typer.Option(
        True, "--step-guard/--no-step-guard",
        help="Recompute a step whose gradient norms look silently corrupted."),
    overlap_snapshots: bool = typer.Option(
        True, "--overlap-snapshots/--blocking-snapshots",
        help="Copy parameters and optimizer state while the step computes."),
    crash_capture: bool = typer.Option(
        True, "--crash-capture/--no-crash-capture",
        help="On an uncaught exception, keep the failed step's start in host memory."),
    hint_dir: Optional[Path] = typer.Option(None, "--hint-dir", help="Watched for hint files."),
    hint_key_file: Optional[Path] = typer.Option(
        None, "--hint-key-file", envvar="SEAMGUARD_HINT_KEY_FILE",
        help="The job's key for signed hints: used if it exists (mode 600), else created "
             "there (default: <hint-dir>/.hint-key, fresh each launch)."),
    store_bind: str = typer.Option(
        "", "--store-bind", metavar="<address>",
        help="Address node 0's store listens on (default: 127.0.0.1 for one node, else "
             "--master-addr's)."),
    events_file: Optional[Path] = typer.Option(None, "--events-file",
                                               help="Append every event, the launcher's and the workers', as JSON lines here."),
    log_format: str = typer.Option("text", "--log-format", metavar="<text|json>",
                                   help="stderr: lines a person reads, or the JSON event records."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port",
                                               help="Node 0 serves the job's progress as Prometheus /metrics here."),
    chaos: str = typer.Option(
        "", "--chaos", metavar="<plan>",
        help="Fault plan, e.g. 'kill:rank=1,step=60' (see seamguard.runtime.chaos). Each trigger fires once per "
             "job, not again when a spare replays its step: the launcher keeps what fired in --chaos-dir, or "
             "without one in a directory of its own for the job's life (one per node: several nodes share "
             "a --chaos-dir for once per job across them)."),
    chaos_dir: Optional[Path] = typer.Option(
        None, "--chaos-dir", help="Directory for the fault plan's once-per-job claims and kills.jsonl (kept)."),
) -> None:
    """Run a training script with hot spares, in-memory snapshots and recovery.

    Options end at the training command (or at --); what follows it is the script's.
    torchrun's flags mean what they mean to torchrun (docs/runtime.md, "torchrun's flags").
    """
    if importlib.util.find_spec("torch") is None:
        fail("torch is not installed: pip install torch, then pip install 'seamguard[runtime]'")
    from seamguard.runtime import chaos as chaos_plan
    from seamguard.runtime.launcher import LaunchFailed, launch as run

    script = list(ctx.args)
    if script and script[0] == "--":
        script = script[1:]
    if script and script[0].endswith(".py") and not Path(script[0]).is_file():
        fail(f"training script not found: {script[0]} (see 'seamguard launch --help')")
    try:
        rdzv = torchrun_flags.resolve(torchrun_flags.Given(
            nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
            master_port=master_port, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
            run_id=run_id, store=store, standalone=standalone, max_restarts=max_restarts), _devices)
        chaos_plan.parse_plan(chaos)   # a bad plan is refused here, not in every worker
        auto = snapshot_every.strip().lower() == "auto"
        if not auto and not snapshot_every.strip().isdigit():
            raise ValueError(f"--snapshot-every: expected a number of steps or auto, got {snapshot_every!r}")
        if (why := path_error("--chaos-dir", chaos_dir)) is not None:
            raise ValueError(why)
        rt = RuntimeSettings(snapshot_every_steps=AUTO_START_EVERY if auto else int(snapshot_every),
                             snapshot_auto=auto, rank_mttf_h=rank_mttf_hours, persist_every_steps=persist_every,
                             checkpoint_dir=checkpoint_dir, keep_checkpoints=keep_checkpoints,
                             collective_timeout_s=collective_timeout_s,
                             dedup_replicas=not no_dedup, overlap_snapshots=overlap_snapshots,
                             step_guard=step_guard, crash_capture=crash_capture,
                             rails=tuple(filter(None, rails.split(","))), rail_mode=rail_mode,
                             checkpoint_roots=tuple(r.strip() for r in checkpoint_roots.split(",") if r.strip()))
        env = rt.to_env()
        if chaos:
            env["SEAMGUARD_CHAOS"] = chaos
        if chaos_dir:
            env["SEAMGUARD_CHAOS_DIR"] = str(chaos_dir)
        limits = {} if rdzv.max_recoveries is None else {"max_recoveries": rdzv.max_recoveries}
        settings = LaunchSettings(script=script, nproc=rdzv.nproc, spares=spares, nnodes=rdzv.nnodes,
                                  node_rank=rdzv.node_rank, master_addr=rdzv.master_addr,
                                  master_port=rdzv.master_port, run_id=rdzv.run_id, store=rdzv.store,
                                  node_beat_s=node_beat_s, coordinator_timeout_s=coordinator_timeout_s, **limits,
                                  hang_timeout_s=hang_timeout_s, stall_timeout_s=stall_timeout_s,
                                  evacuate_stragglers=evacuate_stragglers, hint_dir=hint_dir,
                                  replenish_spares=replenish_spares, fork_server=fork_server,
                                  preload=tuple(m.strip() for m in preload.split(",") if m.strip()),
                                  events_file=events_file, log_format=log_format, metrics_port=metrics_port,
                                  store_bind=store_bind.strip(), hint_key_file=hint_key_file, env=env)
    except ValueError as exc:
        fail(f"{exc} (see 'seamguard launch --help')")
    with _chaos_claims(settings) as settings:
        try:
            code = run(settings)
        except LaunchFailed as exc:
            fail(str(exc), exc.code)
    raise typer.Exit(code)


def _devices(kind: str) -> int:
    """This node's GPUs or CPUs, for torchrun's ``--nproc-per-node gpu|cpu|auto``."""
    if kind == "cpu":
        return len(os.sched_getaffinity(0))
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@contextmanager
def _chaos_claims(s: LaunchSettings) -> Iterator[LaunchSettings]:
    """A fault plan without --chaos-dir still fires each trigger once per job: the launcher
    keeps the claims (runtime/chaos.py) in a directory of its own, which lives as long as the
    launch does (every rank restart and spare sees it) and is removed after."""
    if "SEAMGUARD_CHAOS" not in s.env or "SEAMGUARD_CHAOS_DIR" in s.env:
        yield s
        return
    with tempfile.TemporaryDirectory(prefix=f"seamguard-chaos-{s.run_id}-") as claims:
        yield dataclasses.replace(s, env={**s.env, "SEAMGUARD_CHAOS_DIR": claims})
