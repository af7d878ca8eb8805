"""`seamguard launch` takes a torchrun user's command line: torchrun's flags with torchrun's
meaning, options ending at the training command, an unknown option refused in one line,
and a chaos fault that fires once per job without --chaos-dir (docs/runtime.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
SCRIPT = str(REPO / "examples" / "train_ddp.py")

pytestmark = pytest.mark.timeout(240)


def _launch(*args: str, out: Path, timeout_s: float = 180) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``seamguard launch <args>`` as a torchrun user writes it (no ``--``), with its events."""
    cmd = [sys.executable, "-m", "seamguard", "launch", "--events-file", str(out / "events.jsonl"), *args]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout_s)
    ev = out / "events.jsonl"
    return p, [json.loads(line) for line in ev.read_text().splitlines()] if ev.exists() else []


def test_nproc_per_node_runs_that_many_ranks_and_the_scripts_options_stay_the_scripts(tmp_path):
    out = tmp_path / "run"
    p, events = _launch("--nproc-per-node", "2", SCRIPT, "--steps", "6", "--out", str(out), out=out)
    assert p.returncode == 0, p.stderr[-3000:]
    plans = [e for e in events if e["event"] == "plan"]
    assert plans and len(plans[0]["ranks"]) == 2, plans
    assert (out / "final_checksum.txt").exists()


def test_an_option_after_the_training_command_is_the_scripts():
    """Parsed as the CLI parses it, without starting anything: the launcher's own option
    name after the script goes to the script, torchrun's spelling before it to the launcher."""
    import typer

    from seamguard.app.cli import app

    launch = typer.main.get_command(app).commands["launch"]
    ctx = launch.make_context("launch", ["--nproc_per_node", "2", "--rdzv-id", "job7", "train.py",
                                         "--nproc", "9", "--spares", "3"])
    assert ctx.params["nproc"] == "2" and ctx.params["rdzv_id"] == "job7" and ctx.params["spares"] == 0
    assert ctx.args == ["train.py", "--nproc", "9", "--spares", "3"]


@pytest.mark.parametrize("args, message", [
    (["--frobnicate", "2", SCRIPT], "error: no such option: --frobnicate"),
    (["--nproc-per-node", "2", "--tee", "3", SCRIPT], "error: no such option: --tee"),
    (["--nnodes", "1:4", SCRIPT], "error: --nnodes 1:4: seamguard launch starts a fixed set of nodes"),
    (["--standalone", "--nnodes", "2", "--node-rank", "0", SCRIPT], "error: --standalone runs one node"),
])
def test_an_unknown_or_impossible_option_before_the_script_is_one_line_exit_2(args, message):
    p = subprocess.run([sys.executable, "-m", "seamguard", "launch", *args], env=ENV, capture_output=True,
                       text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), p.stderr[-2000:]
    assert "launch --help" in lines[0]


def test_help_says_a_fault_fires_once_per_job():
    p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--help"], env={**ENV, "COLUMNS": "200"},
                       capture_output=True, text=True, timeout=60)
    text = " ".join(p.stdout.split())
    assert p.returncode == 0 and "fires once per job" in text and "--nproc-per-node" in text, p.stdout


def test_a_chaos_kill_without_a_chaos_dir_fires_once_and_the_job_completes(tmp_path, clean_checksums):
    """torchrun spellings throughout; --max_restarts bounds the job, so a fault that fired
    again at every replay of its step would end it in a failure instead of a long loop."""
    out = tmp_path / "chaos"
    run_id = f"chaos-once-{os.getpid()}"
    p, events = _launch("--nproc_per_node", "2", "--spares", "1", "--rdzv-id", run_id, "--max_restarts", "3",
                        "--chaos", "kill:rank=1,step=8", SCRIPT, "--steps", "20", "--out", str(out), out=out)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = [e for e in events if e["event"] == "summary"]
    assert summary and summary[-1]["recoveries"] == 1 and summary[-1]["lost"] == 1, summary
    assert (out / "final_checksum.txt").read_text() == clean_checksums(20)
    left = [d for d in Path(tempfile.gettempdir()).iterdir() if d.name.startswith(f"seamguard-chaos-{run_id}-")]
    assert left == [], "the launcher removes the claims it kept for the job"


def test_a_launch_that_cannot_start_is_one_line_in_the_shells_style():
    """The launcher's own refusals (here: --master-port taken by another process) reach the
    user through the same one-line error as the flags' (runtime/launcher.py LaunchFailed)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--nproc-per-node", "1", "--master-port",
                            str(port), SCRIPT, "--steps", "1"], env=ENV, capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port} for the job's store"), lines
