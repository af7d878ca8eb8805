"""`seamguard launch [options] -- train.py args…`: the runtime's command-line edge.

Reads flags, turns them into LaunchSettings/RuntimeSettings and hands over to the
launcher. torch is imported only when a launch actually starts.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn, Optional

import typer

from seamguard.runtime.cadence import AUTO_START_EVERY, GPU_MTTF_H
from seamguard.runtime.settings import DEFAULT_PRELOAD, LaunchSettings, RuntimeSettings, path_error

LAUNCH_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def launch(
    ctx: typer.Context,
    nproc: int = typer.Option(1, "--nproc", help="Training ranks per node."),
    spares: int = typer.Option(0, "--spares", help="Hot spare processes per node."),
    nnodes: int = typer.Option(1, "--nnodes", help="Nodes in the job."),
    node_rank: int = typer.Option(0, "--node-rank", help="This node's rank (0 .. nnodes-1)."),
    master_addr: str = typer.Option("127.0.0.1", "--master-addr", help="Address of node rank 0."),
    master_port: int = typer.Option(0, "--master-port", help="Port on node rank 0 (0 = any free port; one node)."),
    run_id: str = typer.Option("seamguard", "--run-id", help="Names this run's rendezvous and files."),
    store: str = typer.Option("tcp", "--store", metavar="<tcp|etcd://host:port[,host:port]>",
                              help="The job-wide store: node 0's TCPStore, or an etcd cluster (survives any node)."),
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
    chaos: str = typer.Option("", "--chaos", help="Fault plan (see seamguard.runtime.chaos)."),
    chaos_dir: Optional[Path] = typer.Option(None, "--chaos-dir", help="Directory for the fault plan's once-per-job claims and kills.jsonl."),
) -> None:
    """Run a training script with hot spares, in-memory snapshots and recovery."""
    if importlib.util.find_spec("torch") is None:
        _fail("torch is not installed: pip install torch, then pip install 'seamguard[runtime]'")
    from seamguard.runtime.launcher import launch as run

    script = list(ctx.args)
    if script and script[0] == "--":
        script = script[1:]
    if script and script[0].endswith(".py") and not Path(script[0]).is_file():
        _fail(f"training script not found: {script[0]} (see 'seamguard launch --help')")
    try:
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
                             rails=tuple(filter(None, rails.split(","))),
                             checkpoint_roots=tuple(r.strip() for r in checkpoint_roots.split(",") if r.strip()))
        env = {"SEAMGUARD_SETTINGS": json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                                 for k, v in asdict(rt).items()})}
        if chaos:
            env["SEAMGUARD_CHAOS"] = chaos
        if chaos_dir:
            env["SEAMGUARD_CHAOS_DIR"] = str(chaos_dir)
        settings = LaunchSettings(script=script, nproc=nproc, spares=spares, nnodes=nnodes,
                                  node_rank=node_rank, master_addr=master_addr,
                                  master_port=master_port, run_id=run_id, store=store, node_beat_s=node_beat_s,
                                  hang_timeout_s=hang_timeout_s, stall_timeout_s=stall_timeout_s,
                                  evacuate_stragglers=evacuate_stragglers, hint_dir=hint_dir,
                                  replenish_spares=replenish_spares, fork_server=fork_server,
                                  preload=tuple(m.strip() for m in preload.split(",") if m.strip()),
                                  events_file=events_file, log_format=log_format, metrics_port=metrics_port,
                                  store_bind=store_bind.strip(), hint_key_file=hint_key_file, env=env)
    except ValueError as exc:
        _fail(f"{exc} (see 'seamguard launch --help')")
    raise typer.Exit(run(settings))


def _fail(message: str) -> NoReturn:
    """The CLI's one error style (seamguard.app.clikit.fail): one line, exit 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
