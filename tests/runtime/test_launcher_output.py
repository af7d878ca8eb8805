"""The launcher people can read: fail fast, lines in words by default, JSON on request, titles in ps."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamguard.runtime.eventlog import EventLog, describe, render_text

from .conftest import REPO, launch

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


@pytest.mark.parametrize("event, words", [
    ({"event": "plan", "gen": 0, "ranks": [0, 1], "spares": [2], "reason": "start"},
     "starting 2 ranks on workers w0, w1; spares w2"),
    ({"event": "plan", "gen": 1, "ranks": [2, 1], "spares": [], "reason": "lost w0", "force_disk": False},
     "generation 1: lost w0; ranks on workers w2, w1; spares none"),
    ({"event": "waiting_for_spares", "lost": [0, 3], "deficit": 2},
     "waiting for a replacement of w0, w3 (2 ranks short, no spare ready; bounded by spare_wait_s)"),
    ({"event": "job_done", "gen": 1}, "every rank finished (generation 1)"),
    ({"event": "resumed", "gen": 0, "step": 0, "recovery_s": 0.3}, "all ranks running from step 0"),
    ({"event": "resumed", "gen": 1, "step": 7, "recovery_s": 0.52, "since_detection_s": 0.61, "steps_redone": 1},
     "recovered: generation 1 resumed at step 7, 0.52 s (0.61 s since the loss was detected), 1 step redone"),
    ({"event": "detected", "wid": 3, "kind": "exited", "code": -9}, "worker w3 exited with code -9"),
    ({"event": "detected", "wid": 1, "kind": "unresponsive", "evidence": "no beat for 1.2 s"},
     "worker w1 unresponsive (heartbeat stopped) (no beat for 1.2 s)"),
    ({"event": "job_failed", "reason": "worker w0 exited with code 2 before it registered"},
     "JOB FAILED: worker w0 exited with code 2 before it registered"),
    ({"event": "worker", "kind": "started", "wid": 0, "rank": 0, "gen": 0, "step": 0, "seconds": 0.25},
     "started as rank 0 at step 0 (0.25 s)"),
    ({"event": "worker", "kind": "recovered", "wid": 2, "rank": 0, "gen": 1, "step": 7, "seconds": 0.4},
     "joined generation 1 as rank 0 at step 7 (0.40 s)"),
    ({"event": "summary", "outcome": "job done", "wall_s": 12.34, "recoveries": 1, "lost": 1},
     "job done: 12.3 s, 1 recovery, 1 worker(s) lost"),
    ({"event": "checkpoint_hint", "persist_at": 12}, "checkpoint hint: persist_at=12"),
])
def test_events_in_words(event, words):
    assert describe(event) == words


def test_event_log_writes_words_on_stderr_and_json_lines_to_the_file(tmp_path):
    out = io.StringIO()
    log = EventLog("text", tmp_path / "ev" / "events.jsonl", out)
    log.emit({"event": "detected", "wid": 3, "kind": "exited", "code": -9}, "launcher")
    log.emit({"event": "worker", "kind": "started", "wid": 0, "rank": 0, "gen": 0, "step": 0, "seconds": 0.2},
             "worker w0 rank 0 pid 1")
    log.close()
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(" seamguard launcher: worker w3 exited with code -9")
    assert lines[1].endswith(" seamguard worker w0 rank 0 pid 1: started as rank 0 at step 0 (0.20 s)")
    records = [json.loads(x) for x in (tmp_path / "ev" / "events.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["detected", "worker"] and all("t" in r for r in records)
    js = io.StringIO()
    EventLog("json", None, js).emit({"event": "job_done", "gen": 0}, "launcher")
    assert json.loads(js.getvalue())["event"] == "job_done"
    with pytest.raises(ValueError, match="text or json"):
        EventLog("yaml")
    assert render_text({"t": 0.5, "event": "job_done", "gen": 0}, "x").split(" ", 1)[1] == \
        "seamguard x: every rank finished (generation 0)"


def test_process_title_names_the_process():
    code = ("from seamguard.runtime.eventlog import set_title; set_title('seamguard: rank 1/4 gen 2 (w1)'); "
            "print(open('/proc/self/cmdline').read().replace(chr(0), ' '))")
    p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "seamguard: rank 1/4 gen 2 (w1)" in p.stdout, p.stderr


def test_threads_carry_their_python_names_in_the_os():
    code = ("import threading; from pathlib import Path; from seamguard.runtime.eventlog import name_threads_in_os; "
            "name_threads_in_os(); name_threads_in_os(); out = []; "
            "t = threading.Thread(target=lambda: out.append(Path(f'/proc/self/task/{threading.get_native_id()}/comm')"
            ".read_text().strip()), name='sg-heartbeat-and-more'); t.start(); t.join(); print(out[0])")
    p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "sg-heartbeat-an", p.stderr   # the kernel keeps 15 bytes


def test_a_missing_script_or_bad_format_is_one_line_at_once(tmp_path):
    for args, msg in ((["--", str(tmp_path / "nope.py")], f"error: training script not found: {tmp_path / 'nope.py'}"),
                      (["--log-format", "xml", "--", str(REPO / "examples" / "train_ddp.py")],
                       "error: --log-format must be text or json, got 'xml'")):
        p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--nproc", "2", *args], env=ENV,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [msg + " (see 'seamguard launch --help')"]


@pytest.mark.timeout(120)
def test_a_worker_dying_before_it_registers_ends_the_launch_with_its_error(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import no_such_module_for_seamguard\n")
    p = subprocess.run([sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--events-file",
                        str(tmp_path / "events.jsonl"), "--", str(script)], env=ENV, capture_output=True,
                       text=True, timeout=100)  # the start-up bound is 120 s: well before it
    assert p.returncode == 1
    assert "ModuleNotFoundError: No module named 'no_such_module_for_seamguard'" in p.stderr
    assert "JOB FAILED: worker w" in p.stderr and "before it registered" in p.stderr
    failed = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in failed][-2:] == ["job_failed", "summary"]


@pytest.mark.timeout(180)
def test_a_run_reads_as_words_names_its_workers_and_ends_with_a_summary(tmp_path):
    r = launch(tmp_path, "run", nproc=2, spares=1, steps=30, chaos="kill:rank=1,step=10")
    assert r.code == 0, r.stderr
    log = r.log
    assert "seamguard launcher: starting 2 ranks on workers" in log
    assert "seamguard launcher: all ranks running from step 0" in log
    assert "started as rank 0 at step 0" in log and "recovered: generation 1 resumed at step" in log
    assert "[seamguard" not in log and '{"t":' not in log  # no JSON on stderr by default
    summary = r.kinds("summary")[-1]
    assert summary["outcome"] == "job done" and summary["recoveries"] == 1
    assert "seamguard launcher: job done: " in log
    assert r.notes("started") and not [n for n in r.notes("recovered") if n["gen"] == 0]
    assert r.kinds("resumed")[-1]["steps_redone"] is not None


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, title) of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        state, ppid = stat.rsplit(") ", 1)[1].split()[:2]
        out[int(d.name)] = (int(ppid), state, cmd)
    return out


def _descendants(root: int) -> dict[int, str]:
    procs, found, todo = _processes(), {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, state, cmd) in procs.items():
            if ppid == parent and pid not in found:
                found[pid] = cmd
                todo.append(pid)
    return found


def _alive(pids) -> set[int]:
    procs = _processes()
    return {p for p in pids if p in procs and procs[p][1] != "Z"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_ps_shows_rank_and_generation_and_workers_die_with_their_launcher(tmp_path, stop):
    p = subprocess.Popen([sys.executable, "-m", "seamguard", "launch", "--nproc", "2", "--spares", "1", "--",
                          str(REPO / "examples" / "train_ddp.py"), "--steps", "400", "--out", str(tmp_path / "run"),
                          "--step-sleep-s", "0.05"],   # outlasts the look (the test stops the job)
                         env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: set[str] = set()
    family: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None and len(seen) < 3:
            family = _descendants(p.pid)
            for cmd in family.values():
                if cmd.startswith(("seamguard: rank 0/2 gen 0", "seamguard: rank 1/2 gen 0", "seamguard: spare")):
                    seen.add(cmd.split(" (")[0].split(" gen")[0])
            time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGKILL if stop == "SIGKILL" else signal.SIGTERM)
        p.wait(timeout=60)
    assert seen == {"seamguard: rank 0/2", "seamguard: rank 1/2", "seamguard: spare w2"}, seen
    assert "seamguard: fork server" in family.values()
    deadline = time.monotonic() + 30
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(family), {p: family[p] for p in _alive(family)}  # none left training into a dead store
